/* Read-write lock (DLOCK_KIND_READ / DLOCK_KIND_WRITE, Redisson's
 * RReadWriteLock layout), one variant per ctest test:
 *   basic      layout, reentrancy on both sides, shared readers, exclusion,
 *              downgrade allowed and upgrade refused, writer preference
 *              (queued writer holds back new readers, not re-entry), a
 *              writer that gives up leaves the queue, extend, lost holds
 *   overlap    readers in 6 processes really overlap (measured)
 *   exclusion  4 writer + 4 reader processes: a non-atomic counter, writers
 *              alone, readers see no change while they hold
 *   starvation 6 processes re-acquire the read side back to back; a writer
 *              still gets in within 3 s, round after round
 *   crash      a SIGKILLed reader frees its share after its own lease; a
 *              writer stopped (SIGSTOP) in its wait holds new readers back
 *              until its queue entry runs out, past the 2 s re-check, with
 *              no message (the explorer's liveness check relies on this)
 *   watchdog   both sides stay held across 3 lease periods (lease 600 ms) */
#include "harness.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static th_server *g_srv;

#define RECHECK_MS 2000 /* DL_WAIT_RECHECK_MS (src/services.h) */
#define WAITER_MS 5000  /* DL_RW_WAITER_MS (src/lock_rw.c): a queued writer's entry */

static void check_count(dlock_lock *l, int want_held, int64_t want_count)
{
    int held = -1;
    int64_t count = -1;
    ASSERT_LOK(l, dlock_lock_check(l, &held, &count));
    ASSERT_EQ(held, want_held);
    ASSERT_EQ(count, want_count);
}

static int str_is(char *got, const char *want)
{
    int ok = got && strcmp(got, want) == 0;
    free(got);
    return ok;
}

/* ---------------------------------------------------------------- basic */

/* Child: takes the write side of name on its own client, waiting up to wait_ms;
 * exits 0 if the result is want. */
static pid_t spawn_writer(const char *name, int64_t wait_ms, int want)
{
    pid_t pid = th_fork();
    if (pid == 0) {
        dlock_client *c = th_client(g_srv, 0);
        dlock_lock *w = th_lock(c, name, DLOCK_KIND_WRITE);
        int rc = dlock_acquire(w, wait_ms, 5000, NULL);
        ASSERT_LCODE(w, rc, want);
        if (rc == DLOCK_OK) ASSERT_LOK(w, dlock_release(w));
        dlock_lock_free(w);
        dlock_client_free(c);
        exit(0);
    }
    return pid;
}

static void test_basic(void)
{
    const char *N = "rw:basic";
    dlock_client *c1 = th_client(g_srv, 0);
    dlock_client *c2 = th_client(g_srv, 0);
    redisContext *rc = th_redis(g_srv);

    dlock_lock *r = th_lock(c1, N, DLOCK_KIND_READ);
    dlock_lock *w = th_lock(c1, N, DLOCK_KIND_WRITE);
    dlock_lock *r2 = th_lock(c2, N, DLOCK_KIND_READ);
    dlock_lock *w2 = th_lock(c2, N, DLOCK_KIND_WRITE);
    ASSERT_EQ(dlock_lock_kind(r), DLOCK_KIND_READ);
    ASSERT_EQ(dlock_lock_kind(w), DLOCK_KIND_WRITE);
    check_count(r, 0, 0);

    /* read side: the Redisson layout */
    uint64_t f1 = 0, f2 = 0, f3 = 0;
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 5000, &f1));
    char rtok[128];
    snprintf(rtok, sizeof rtok, "%s", dlock_lock_token(r));
    ASSERT_MSG(strncmp(rtok, dlock_client_id(c1), 36) == 0 && rtok[36] == ':',
               "reader token \"%s\"", rtok);
    ASSERT(str_is(th_cmd_str(rc, "HGET %s mode", N), "read"));
    ASSERT(str_is(th_cmd_str(rc, "HGET %s %s", N, rtok), "1"));
    long long p = th_cmd_int(rc, "PTTL {%s}:%s:rwlock_timeout:1", N, rtok);
    ASSERT_GT(p, 3000);
    ASSERT_LE(p, 5000);
    check_count(r, 1, 1);

    /* re-entry: count 2, a second timeout key with its own lease */
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 8000, &f2));
    ASSERT_U64_GT(f2, f1);
    check_count(r, 1, 2);
    p = th_cmd_int(rc, "PTTL {%s}:%s:rwlock_timeout:2", N, rtok);
    ASSERT_GT(p, 5000);
    ASSERT_GT(th_cmd_int(rc, "PTTL %s", N), 5000); /* the max of the leases */

    /* another reader shares it; writers are refused (another client, and this
     * thread's own write side: no upgrade) */
    ASSERT_LOK(r2, dlock_acquire(r2, DLOCK_NOWAIT, 5000, &f3));
    ASSERT_U64_GT(f3, f2);
    check_count(r2, 1, 1);
    ASSERT_LCODE(w2, dlock_acquire(w2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(w, dlock_acquire(w, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_EQ(dlock_lock_holding(w), 0);
    /* try-once does not queue */
    ASSERT_EQ(th_cmd_int(rc, "EXISTS {%s}:write_waiters", N), 0);
    /* a bounded wait times out and leaves the queue */
    int64_t t1 = th_now_ms();
    ASSERT_LCODE(w2, dlock_acquire(w2, 300, 5000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_GE(th_now_ms() - t1, 250);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {%s}:write_waiters", N), 0);

    /* partial read releases keep the lock; the last one deletes it */
    ASSERT_LOK(r, dlock_release(r));
    check_count(r, 1, 1);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS {%s}:%s:rwlock_timeout:2", N, rtok), 0);
    ASSERT_LOK(r2, dlock_release(r2));
    /* the only reader left still cannot upgrade */
    ASSERT_LCODE(w, dlock_acquire(w, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(r2, dlock_acquire(r2, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(r, dlock_release(r));
    check_count(r, 0, 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 1);
    ASSERT_LCODE(w2, dlock_acquire(w2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(r2, dlock_release(r2));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);
    ASSERT_LCODE(r, dlock_release(r), DLOCK_ENOTHELD);

    /* write side: layout, re-entry, exclusion of everyone else */
    ASSERT_LOK(w, dlock_acquire(w, DLOCK_NOWAIT, 5000, &f1));
    ASSERT_U64_GT(f1, f3);
    char wtok[128];
    snprintf(wtok, sizeof wtok, "%s", dlock_lock_token(w));
    ASSERT_EQ(strlen(wtok), strlen(rtok) + 6);
    ASSERT(strncmp(wtok, rtok, strlen(rtok)) == 0 && strcmp(wtok + strlen(rtok), ":write") == 0);
    ASSERT(str_is(th_cmd_str(rc, "HGET %s mode", N), "write"));
    ASSERT(str_is(th_cmd_str(rc, "HGET %s %s", N, wtok), "1"));
    ASSERT_LOK(w, dlock_acquire(w, DLOCK_NOWAIT, 5000, &f2));
    ASSERT_U64_GT(f2, f1);
    check_count(w, 1, 2);
    ASSERT_LCODE(r2, dlock_acquire(r2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(w2, dlock_acquire(w2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);

    /* downgrade: the writer's thread takes the read side; mode stays write */
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 6000, NULL));
    check_count(r, 1, 1);
    ASSERT(str_is(th_cmd_str(rc, "HGET %s mode", N), "write"));
    ASSERT_LCODE(r2, dlock_acquire(r2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(w, dlock_release(w));
    check_count(w, 1, 1);
    ASSERT(str_is(th_cmd_str(rc, "HGET %s mode", N), "write"));
    ASSERT_LCODE(r2, dlock_acquire(r2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    /* last write hold with a read hold left: mode becomes read */
    ASSERT_LOK(w, dlock_release(w));
    ASSERT_EQ(dlock_lock_holding(w), 0);
    ASSERT(str_is(th_cmd_str(rc, "HGET %s mode", N), "read"));
    ASSERT_EQ(th_cmd_int(rc, "HEXISTS %s %s", N, wtok), 0);
    ASSERT_LOK(r2, dlock_acquire(r2, DLOCK_NOWAIT, 5000, NULL)); /* shared now */
    ASSERT_LCODE(w2, dlock_acquire(w2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(r2, dlock_release(r2));
    ASSERT_LOK(r, dlock_release(r));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);

    /* extend (read): the reader's keys and the hash get the new lease */
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 1000, NULL));
    ASSERT_LOK(r, dlock_extend(r, 9000));
    ASSERT_GT(th_cmd_int(rc, "PTTL %s", N), 5000);
    ASSERT_GT(th_cmd_int(rc, "PTTL {%s}:%s:rwlock_timeout:1", N, rtok), 5000);
    /* a shorter lease cuts nothing on the server (another handle of the same
     * owner may count on the longer one); the handle counts the new lease */
    ASSERT_LOK(r, dlock_extend(r, 2000));
    ASSERT_GT(th_cmd_int(rc, "PTTL %s", N), 5000);
    ASSERT_GT(th_cmd_int(rc, "PTTL {%s}:%s:rwlock_timeout:1", N, rtok), 5000);
    ASSERT_LE(dlock_lock_valid_ms(r), 2000);
    ASSERT_LOK(r, dlock_release(r));

    /* extend (write) */
    ASSERT_LOK(w, dlock_acquire(w, DLOCK_NOWAIT, 1000, NULL));
    ASSERT_LOK(w, dlock_extend(w, 9000));
    ASSERT_GT(th_cmd_int(rc, "PTTL %s", N), 5000);
    ASSERT_LOK(w, dlock_release(w));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);

    /* holds that expired: release and extend say ELOST */
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 200, NULL));
    ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS %s", N) == 0, 3000);
    ASSERT_LCODE(r, dlock_release(r), DLOCK_ELOST);
    ASSERT_EQ(dlock_lock_holding(r), 0);
    ASSERT_EQ(dlock_lock_is_lost(r), 1);
    ASSERT_LOK(w, dlock_acquire(w, DLOCK_NOWAIT, 200, NULL));
    ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS %s", N) == 0, 3000);
    ASSERT_LCODE(w, dlock_extend(w, 1000), DLOCK_ELOST);
    ASSERT_LOK(w, dlock_acquire(w, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_EQ(dlock_lock_is_lost(w), 0);
    th_cmd_ok(rc, "DEL %s", N); /* force-unlocked behind its back */
    check_count(w, 0, 0);
    ASSERT_LCODE(w, dlock_release(w), DLOCK_ELOST);

    /* writer preference: a queued writer holds back new readers; re-entry of
     * a current reader stays allowed; the writer gets in once readers leave */
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 10000, NULL));
    int64_t t0;
    pid_t pid = spawn_writer(N, 10000, DLOCK_OK);
    ASSERT_EVENTUALLY(th_cmd_int(rc, "ZCARD {%s}:write_waiters", N) == 1, 5000);
    ASSERT_LCODE(r2, dlock_acquire(r2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 10000, NULL)); /* re-entry */
    check_count(r, 1, 2);
    ASSERT_LOK(r, dlock_release(r));
    t0 = th_now_ms();
    ASSERT_LOK(r, dlock_release(r));
    ASSERT_EQ(th_wait_child(pid, 10000), 0);
    /* woken by the release message, not by its 2 s re-check */
    ASSERT_LT(th_now_ms() - t0, 1500);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS {%s}:write_waiters", N), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);

    /* a waiting writer that gives up wakes the readers it held back */
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 10000, NULL));
    pid = spawn_writer(N, 800, DLOCK_ETIMEDOUT);
    ASSERT_EVENTUALLY(th_cmd_int(rc, "ZCARD {%s}:write_waiters", N) == 1, 5000);
    t0 = th_now_ms();
    ASSERT_LOK(r2, dlock_acquire(r2, 5000, 5000, NULL));
    int64_t took = th_now_ms() - t0;
    th_log("reader held back by a writer that gave up: in after %lld ms", (long long)took);
    ASSERT_LT(took, 2500); /* well before the queue entry's own 5 s deadline */
    ASSERT_EQ(th_wait_child(pid, 10000), 0);
    ASSERT_LOK(r2, dlock_release(r2));
    ASSERT_LOK(r, dlock_release(r));

    /* free releases every hold of both sides */
    ASSERT_LOK(w, dlock_acquire(w, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(w, dlock_acquire(w, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 5000, NULL));
    dlock_lock_free(w);
    ASSERT(str_is(th_cmd_str(rc, "HGET %s mode", N), "read"));
    dlock_lock_free(r);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);

    /* a name with braces keeps them (Redisson's rule) */
    dlock_lock *rb = th_lock(c1, "rw:{tag}:x", DLOCK_KIND_READ);
    ASSERT_LOK(rb, dlock_acquire(rb, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS rw:{tag}:x:%s:rwlock_timeout:1", dlock_lock_token(rb)), 1);
    ASSERT_LOK(rb, dlock_release(rb));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS rw:{tag}:x"), 0);
    dlock_lock_free(rb);

    dlock_lock_free(r2);
    dlock_lock_free(w2);
    redisFree(rc);
    dlock_client_free(c1);
    dlock_client_free(c2);
}

/* -------------------------------------------------------------- overlap */

/* KEYS: inside counter, max. Counts one more holder and keeps the max. */
#define ENTER_LUA                                                                        \
    "local c = redis.call('incr', KEYS[1]); "                                            \
    "if c > tonumber(redis.call('get', KEYS[2]) or '0') then "                           \
    "redis.call('set', KEYS[2], c) end return c"

static void test_overlap(void)
{
    const char *N = "rw:overlap";
    enum { PROCS = 6, ROUNDS = 15 };
    pid_t pids[PROCS];
    for (int i = 0; i < PROCS; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) {
            dlock_client *c = th_client(g_srv, 0);
            dlock_lock *r = th_lock(c, N, DLOCK_KIND_READ);
            redisContext *rc = th_redis(g_srv);
            for (int k = 0; k < ROUNDS; k++) {
                ASSERT_LOK(r, dlock_acquire(r, 10000, 5000, NULL));
                int64_t t_in = th_now_us();
                th_cmd_int(rc, "EVAL %s 2 rw:ov:inside rw:ov:max", ENTER_LUA);
                th_sleep_ms(20);
                th_cmd_int(rc, "DECR rw:ov:inside");
                int64_t t_out = th_now_us();
                ASSERT_LOK(r, dlock_release(r));
                th_cmd_int(rc, "RPUSH rw:ov:intervals %lld:%lld", (long long)t_in,
                           (long long)t_out);
            }
            redisFree(rc);
            dlock_lock_free(r);
            dlock_client_free(c);
            exit(0);
        }
    }
    for (int i = 0; i < PROCS; i++) ASSERT_EQ(th_wait_child(pids[i], 20000), 0);

    redisContext *rc = th_redis(g_srv);
    char *mx = th_cmd_str(rc, "GET rw:ov:max");
    long long max_inside = mx ? atoll(mx) : 0;
    free(mx);
    /* the recorded intervals: the largest number overlapping at one instant */
    redisReply *iv = th_cmd(rc, "LRANGE rw:ov:intervals 0 -1");
    ASSERT_EQ(iv->elements, PROCS * ROUNDS);
    long long maxover = 0;
    for (size_t i = 0; i < iv->elements; i++) {
        long long s = 0, e = 0;
        ASSERT_EQ(sscanf(iv->element[i]->str, "%lld:%lld", &s, &e), 2);
        long long n = 0;
        for (size_t j = 0; j < iv->elements; j++) {
            long long s2 = 0, e2 = 0;
            sscanf(iv->element[j]->str, "%lld:%lld", &s2, &e2);
            if (s2 <= s && s < e2) n++;
        }
        if (n > maxover) maxover = n;
    }
    freeReplyObject(iv);
    th_log("readers inside at once: %lld (counter), %lld (intervals)", max_inside, maxover);
    ASSERT_GE(max_inside, 2);
    ASSERT_GE(maxover, 2);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);
    redisFree(rc);
}

/* ------------------------------------------------------------ exclusion */

static void test_exclusion(void)
{
    const char *N = "rw:excl";
    enum { WRITERS = 4, READERS = 4, INCS = 25 };
    pid_t pids[WRITERS + READERS];
    for (int i = 0; i < WRITERS + READERS; i++) {
        int writer = i < WRITERS;
        pids[i] = th_fork();
        if (pids[i] != 0) continue;
        dlock_client *c = th_client(g_srv, 0);
        dlock_lock *l = th_lock(c, N, writer ? DLOCK_KIND_WRITE : DLOCK_KIND_READ);
        redisContext *rc = th_redis(g_srv);
        if (writer) {
            for (int k = 0; k < INCS; k++) {
                ASSERT_LOK(l, dlock_acquire(l, 15000, 5000, NULL));
                ASSERT_EQ(th_cmd_int(rc, "INCR rw:ex:writers"), 1);
                ASSERT_EQ(th_cmd_int(rc, "INCRBY rw:ex:readers 0"), 0);
                char *v = th_cmd_str(rc, "GET rw:ex:counter");
                long long n = v ? atoll(v) : 0;
                free(v);
                if (k % 3 == 0) th_sleep_ms(1);
                th_cmd_ok(rc, "SET rw:ex:counter %lld", n + 1);
                ASSERT_EQ(th_cmd_int(rc, "DECR rw:ex:writers"), 0);
                ASSERT_LOK(l, dlock_release(l));
            }
            th_cmd_int(rc, "INCR rw:ex:writers_done");
        } else {
            int rounds = 0;
            for (;;) {
                char *d = th_cmd_str(rc, "GET rw:ex:writers_done");
                int done = d && atoi(d) == WRITERS;
                free(d);
                if (done && rounds >= 25) break;
                ASSERT_LOK(l, dlock_acquire(l, 15000, 5000, NULL));
                th_cmd_int(rc, "INCR rw:ex:readers");
                ASSERT_EQ(th_cmd_int(rc, "INCRBY rw:ex:writers 0"), 0);
                char *v1 = th_cmd_str(rc, "GET rw:ex:counter");
                th_sleep_ms(2);
                char *v2 = th_cmd_str(rc, "GET rw:ex:counter");
                ASSERT_MSG((!v1 && !v2) || (v1 && v2 && !strcmp(v1, v2)),
                           "counter changed under a read hold: %s -> %s", v1 ? v1 : "nil",
                           v2 ? v2 : "nil");
                free(v1);
                free(v2);
                ASSERT_EQ(th_cmd_int(rc, "INCRBY rw:ex:writers 0"), 0);
                th_cmd_int(rc, "DECR rw:ex:readers");
                ASSERT_LOK(l, dlock_release(l));
                rounds++;
            }
            th_cmd_int(rc, "INCRBY rw:ex:reads %d", rounds);
        }
        redisFree(rc);
        dlock_lock_free(l);
        dlock_client_free(c);
        exit(0);
    }
    for (int i = 0; i < WRITERS + READERS; i++) ASSERT_EQ(th_wait_child(pids[i], 25000), 0);
    redisContext *rc = th_redis(g_srv);
    char *v = th_cmd_str(rc, "GET rw:ex:counter");
    ASSERT_STR_EQ(v, "100");
    free(v);
    char *reads = th_cmd_str(rc, "GET rw:ex:reads");
    th_log("4 writers x %d increments = 100; reader holds checked: %s", INCS, reads);
    free(reads);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);
    redisFree(rc);
}

/* ----------------------------------------------------------- starvation */

static void test_starvation(void)
{
    const char *N = "rw:starve";
    enum { READERS = 6, ROUNDS = 5 };
    const int64_t BOUND = 3000;
    pid_t pids[READERS];
    for (int i = 0; i < READERS; i++) {
        pids[i] = th_fork();
        if (pids[i] != 0) continue;
        dlock_client *c = th_client(g_srv, 0);
        dlock_lock *r = th_lock(c, N, DLOCK_KIND_READ);
        redisContext *rc = th_redis(g_srv);
        while (th_cmd_int(rc, "EXISTS rw:st:stop") == 0) {
            ASSERT_LOK(r, dlock_acquire(r, 15000, 5000, NULL));
            th_cmd_int(rc, "INCR rw:st:readers");
            ASSERT_EQ(th_cmd_int(rc, "INCRBY rw:st:writer 0"), 0);
            th_sleep_ms(5 + i);
            th_cmd_int(rc, "DECR rw:st:readers");
            th_cmd_int(rc, "INCR rw:st:reads");
            ASSERT_LOK(r, dlock_release(r));
        }
        redisFree(rc);
        dlock_lock_free(r);
        dlock_client_free(c);
        exit(0);
    }
    redisContext *rc = th_redis(g_srv);
    dlock_client *c = th_client(g_srv, 0);
    dlock_lock *w = th_lock(c, N, DLOCK_KIND_WRITE);
    /* the readers keep the lock read-held nearly all the time: without writer
     * preference there is hardly ever a moment with no reader */
    int64_t worst = 0;
    for (int k = 0; k < ROUNDS; k++) {
        long long base = th_cmd_int(rc, "INCRBY rw:st:reads 0");
        ASSERT_EVENTUALLY(th_cmd_int(rc, "INCRBY rw:st:reads 0") >= base + 3 * READERS, 10000);
        int64_t t0 = th_now_ms();
        ASSERT_LOK(w, dlock_acquire(w, BOUND, 5000, NULL));
        int64_t took = th_now_ms() - t0;
        ASSERT_EQ(th_cmd_int(rc, "INCR rw:st:writer"), 1);
        ASSERT_EQ(th_cmd_int(rc, "INCRBY rw:st:readers 0"), 0);
        th_sleep_ms(10);
        ASSERT_EQ(th_cmd_int(rc, "DECR rw:st:writer"), 0);
        ASSERT_LOK(w, dlock_release(w));
        th_log("round %d: writer in after %lld ms", k, (long long)took);
        if (took > worst) worst = took;
    }
    th_cmd_ok(rc, "SET rw:st:stop 1");
    for (int i = 0; i < READERS; i++) ASSERT_EQ(th_wait_child(pids[i], 20000), 0);
    th_log("worst writer wait under a stream of 6 readers: %lld ms (bound %lld)",
           (long long)worst, (long long)BOUND);
    ASSERT_LE(worst, BOUND);
    dlock_lock_free(w);
    dlock_client_free(c);
    redisFree(rc);
}

/* ---------------------------------------------------------------- crash */

static void test_crash(void)
{
    const char *N = "rw:crash";
    enum { LEASE = 1500, MARGIN = 1000 };
    redisContext *rc = th_redis(g_srv);
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = th_fork();
    if (pid == 0) {
        close(p[0]);
        dlock_client *c = th_client(g_srv, 0);
        dlock_lock *r = th_lock(c, N, DLOCK_KIND_READ);
        ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, LEASE, NULL));
        ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, LEASE, NULL));
        ASSERT_EQ(write(p[1], "H", 1), 1);
        for (;;) pause();
    }
    close(p[1]);
    struct pollfd pfd = {p[0], POLLIN, 0};
    ASSERT_EQ(poll(&pfd, 1, 10000), 1);
    char b = 0;
    ASSERT_EQ(read(p[0], &b, 1), 1);
    ASSERT_EQ(b, 'H');
    close(p[0]);
    int64_t t_kill = th_now_ms();
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(th_wait_child(pid, 5000), 128 + SIGKILL);

    /* a live reader with a much longer lease joins, then leaves: the lock
     * stays only for what is left of the dead reader's lease */
    dlock_client *c = th_client(g_srv, 0);
    dlock_lock *r = th_lock(c, N, DLOCK_KIND_READ);
    dlock_lock *w = th_lock(c, N, DLOCK_KIND_WRITE);
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_GT(th_cmd_int(rc, "PTTL %s", N), 15000);
    ASSERT_EQ(th_cmd_int(rc, "HLEN %s", N), 3); /* mode, dead reader, live reader */
    ASSERT_LOK(r, dlock_release(r));
    long long left = th_cmd_int(rc, "PTTL %s", N);
    th_log("after the live reader left: PTTL %lld ms (dead reader's lease %d ms)", left, LEASE);
    ASSERT_LE(left, LEASE);
    ASSERT_LCODE(w, dlock_acquire(w, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(w, dlock_acquire(w, 10000, 5000, NULL));
    int64_t took = th_now_ms() - t_kill;
    th_log("writer in %lld ms after the reader's SIGKILL (lease %d ms)", (long long)took, LEASE);
    ASSERT_LE(took, LEASE + MARGIN);
    ASSERT_LOK(w, dlock_release(w));

    /* the same with the live reader staying: the dead reader's share goes
     * after its lease and the live reader's release then frees the lock */
    ASSERT_EQ(pipe(p), 0);
    pid = th_fork();
    if (pid == 0) {
        close(p[0]);
        dlock_client *cc = th_client(g_srv, 0);
        dlock_lock *rr = th_lock(cc, N, DLOCK_KIND_READ);
        ASSERT_LOK(rr, dlock_acquire(rr, DLOCK_NOWAIT, 500, NULL));
        ASSERT_EQ(write(p[1], "H", 1), 1);
        for (;;) pause();
    }
    close(p[1]);
    pfd.fd = p[0];
    ASSERT_EQ(poll(&pfd, 1, 10000), 1);
    ASSERT_EQ(read(p[0], &b, 1), 1);
    close(p[0]);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(th_wait_child(pid, 5000), 128 + SIGKILL);
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 20000, NULL));
    /* wait (by polling the server) until the dead reader's timeout key is gone */
    redisReply *keys = NULL;
    int64_t until = th_now_ms() + 3000;
    for (;;) {
        keys = th_cmd(rc, "KEYS {%s}:*:rwlock_timeout:*", N);
        size_t n = keys->elements;
        freeReplyObject(keys);
        if (n == 1) break; /* only the live reader's */
        ASSERT_LT(th_now_ms(), until);
        th_sleep_ms(5);
    }
    ASSERT_LOK(r, dlock_release(r));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);
    ASSERT_LOK(w, dlock_acquire(w, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(w, dlock_release(w));

    /* a writer stopped in its wait neither takes the lock nor gives up: its
     * queue entry holds new readers back, the lock free, until the entry
     * runs out (WAITER_MS after its latest attempt), and that publishes
     * nothing; the reader comes back at the entry's deadline, not at a
     * message (the explorer does not count such a wait as a stall) */
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 20000, NULL));
    pid = spawn_writer(N, DLOCK_WAIT_FOREVER, DLOCK_OK);
    ASSERT_EVENTUALLY(th_cmd_int(rc, "ZCARD {%s}:write_waiters", N) == 1, 5000);
    ASSERT_EQ(kill(pid, SIGSTOP), 0);
    /* the entry's deadline, on the server's clock */
    redisReply *z = th_cmd(rc, "ZRANGE {%s}:write_waiters 0 0 WITHSCORES", N);
    ASSERT_EQ(z->type, REDIS_REPLY_ARRAY);
    ASSERT_EQ(z->elements, 2);
    long long dl = atoll(z->element[1]->str);
    freeReplyObject(z);
    redisReply *tm = th_cmd(rc, "TIME");
    long long now = atoll(tm->element[0]->str) * 1000 + atoll(tm->element[1]->str) / 1000;
    freeReplyObject(tm);
    int64_t t_stop = th_now_ms(), entry = dl - now;
    th_log("stopped writer's queue entry runs out in %lld ms", (long long)entry);
    ASSERT_GT(entry, RECHECK_MS + 500);
    ASSERT_LOK(r, dlock_release(r)); /* the lock is free now */
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);
    ASSERT_LOK(r, dlock_acquire(r, WAITER_MS + 5000, 5000, NULL));
    took = th_now_ms() - t_stop;
    th_log("reader behind the stopped writer: in after %lld ms (entry %lld ms)",
           (long long)took, (long long)entry);
    ASSERT_GT(took, RECHECK_MS); /* longer than the re-check: by the policy */
    ASSERT_GE(took, entry - 50);
    ASSERT_LE(took, entry + MARGIN);
    ASSERT_LOK(r, dlock_release(r));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(th_wait_child(pid, 5000), 128 + SIGKILL);

    dlock_lock_free(r);
    dlock_lock_free(w);
    dlock_client_free(c);
    redisFree(rc);
}

/* ------------------------------------------------------------- watchdog */

/* Polls for ms: the key must exist all along. */
static void stays_held(redisContext *rc, const char *name, int64_t ms)
{
    int64_t end = th_now_ms() + ms;
    while (th_now_ms() < end) {
        ASSERT_MSG(th_cmd_int(rc, "EXISTS %s", name) == 1, "'%s' expired under the watchdog",
                   name);
        th_sleep_ms(20);
    }
}

static int g_lost_calls;
static void on_lost(dlock_lock *l, int reason, void *ud)
{
    (void)l;
    (void)ud;
    if (reason == DLOCK_LOST_TAKEN) __atomic_add_fetch(&g_lost_calls, 1, __ATOMIC_SEQ_CST);
}

static void test_watchdog(void)
{
    const char *N = "rw:wd";
    /* renewals every 400 ms: a loaded host (CI, sanitizers) may delay a
     * thread a few hundred ms */
    enum { WD = 1200 };
    redisContext *rc = th_redis(g_srv);
    dlock_client *c1 = th_client(g_srv, WD);
    dlock_client *c2 = th_client(g_srv, WD);
    dlock_lock *r1 = th_lock(c1, N, DLOCK_KIND_READ);
    dlock_lock *r2 = th_lock(c2, N, DLOCK_KIND_READ);
    dlock_lock *w1 = th_lock(c1, N, DLOCK_KIND_WRITE);
    dlock_lock *w2 = th_lock(c2, N, DLOCK_KIND_WRITE);

    /* two readers on the watchdog: both shares stay for 3 leases */
    /* (the first hold has an explicit lease: re-entering a handle already
     * registered with the watchdog races with it in lock.c, see the report;
     * the renewal refreshes every hold's timeout key anyway) */
    ASSERT_LOK(r1, dlock_acquire(r1, DLOCK_NOWAIT, WD, NULL));
    ASSERT_LOK(r1, dlock_acquire(r1, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(r2, dlock_acquire(r2, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LE(th_cmd_int(rc, "PTTL %s", N), WD);
    stays_held(rc, N, 3 * WD + 200);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS {%s}:%s:rwlock_timeout:2", N, dlock_lock_token(r1)), 1);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS {%s}:%s:rwlock_timeout:1", N, dlock_lock_token(r2)), 1);
    ASSERT_EQ(dlock_lock_is_lost(r1) || dlock_lock_is_lost(r2), 0);
    check_count(r1, 1, 2);
    ASSERT_LCODE(w2, dlock_acquire(w2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    /* one reader leaves; the other keeps it alone */
    ASSERT_LOK(r2, dlock_release(r2));
    stays_held(rc, N, WD + 200);
    ASSERT_LOK(r1, dlock_release(r1));
    ASSERT_LOK(r1, dlock_release(r1));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);

    /* the writer on the watchdog, with a downgraded read hold on it too */
    ASSERT_LOK(w1, dlock_acquire(w1, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(r1, dlock_acquire(r1, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    stays_held(rc, N, 3 * WD + 200);
    ASSERT_EQ(dlock_lock_is_lost(w1) || dlock_lock_is_lost(r1), 0);
    check_count(w1, 1, 1);
    ASSERT_LCODE(r2, dlock_acquire(r2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(w1, dlock_release(w1));
    /* the read hold left over keeps being renewed */
    stays_held(rc, N, WD + 200);
    ASSERT(str_is(th_cmd_str(rc, "HGET %s mode", N), "read"));
    ASSERT_LOK(r2, dlock_acquire(r2, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(r2, dlock_release(r2));
    ASSERT_LOK(r1, dlock_release(r1));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", N), 0);

    /* the watchdog notices a write lock taken away */
    dlock_lock_on_lost(w1, on_lost, NULL);
    ASSERT_LOK(w1, dlock_acquire(w1, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    th_cmd_ok(rc, "DEL %s", N);
    ASSERT_EVENTUALLY(dlock_lock_is_lost(w1) == 1, 3 * WD);
    ASSERT_EQ(__atomic_load_n(&g_lost_calls, __ATOMIC_SEQ_CST), 1);
    ASSERT_LCODE(w1, dlock_release(w1), DLOCK_ELOST);

    dlock_lock_free(r1);
    dlock_lock_free(r2);
    dlock_lock_free(w1);
    dlock_lock_free(w2);
    dlock_client_free(c1);
    dlock_client_free(c2);
    redisFree(rc);
}

int main(int argc, char **argv)
{
    const char *v = argc > 1 ? argv[1] : "basic";
    char name[64];
    snprintf(name, sizeof name, "rwlock_%s", v);
    th_init(name);
    g_srv = th_server_start(NULL);
    if (!strcmp(v, "basic")) test_basic();
    else if (!strcmp(v, "overlap")) test_overlap();
    else if (!strcmp(v, "exclusion")) test_exclusion();
    else if (!strcmp(v, "starvation")) test_starvation();
    else if (!strcmp(v, "crash")) test_crash();
    else if (!strcmp(v, "watchdog")) test_watchdog();
    else th_fail(__FILE__, __LINE__, "unknown variant %s", v);
    th_server_stop(g_srv);
    th_log("ok");
    return 0;
}
