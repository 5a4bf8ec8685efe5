/* Fencing tokens: strictly increasing across acquires of one handle, across
 * handles and kinds, and across processes (checked in lock-holding order
 * against the last token a protected resource saw); dlock_fence_current and
 * the counter key "redisson_lock_token:{name}" match. Every token is
 * max(counter + 1, the server's clock in microseconds) (DL_LUA_FENCE) and
 * the counter never expires: a restart from an older RDB snapshot (twice
 * from the same one), a counter set back to an older value under every kind
 * (the fair lock's handoff in its release script included), a lost counter,
 * one from before this scheme (a small number, or one with the expiry older
 * versions gave it) and Redisson's INCRs all give a token above every token
 * before; a counter ahead of the clock counts on by one. */
#include "harness.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#define NAME "fence:lock"
#define NPROC 4
#define ROUNDS 25
#define AHEAD 8000000000000000ULL /* 8e15 us: the year 2223 */

/* The server's clock in microseconds. */
static uint64_t server_us(redisContext *rc)
{
    redisReply *r = th_cmd(rc, "TIME");
    ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
    ASSERT_EQ(r->elements, 2);
    uint64_t us = strtoull(r->element[0]->str, NULL, 10) * 1000000 +
                  strtoull(r->element[1]->str, NULL, 10);
    freeReplyObject(r);
    return us;
}

static uint64_t current(dlock_client *c, const char *name)
{
    uint64_t f = 0;
    ASSERT_COK(c, dlock_fence_current(c, name, DLOCK_CSTR, &f));
    return f;
}

/* Each child acquires ROUNDS times; inside the lock it plays the protected
 * resource: the token must exceed the last one the resource accepted. */
static int child(const th_server *s)
{
    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, NAME, DLOCK_KIND_PLAIN);
    redisContext *rc = th_redis(s);
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t f = 0;
        ASSERT_LOK(l, dlock_acquire(l, 20000, 10000, &f));
        ASSERT_U64_EQ(dlock_lock_fence(l), f);
        char *last = th_cmd_str(rc, "GET fence:resource");
        uint64_t seen = last ? strtoull(last, NULL, 10) : 0;
        free(last);
        ASSERT_U64_GT(f, seen);
        ASSERT_U64_EQ(current(c, NAME), f);
        th_cmd_ok(rc, "SET fence:resource %llu", (unsigned long long)f);
        ASSERT_LOK(l, dlock_release(l));
        /* the handle remembers the latest token after release */
        ASSERT_U64_EQ(dlock_lock_fence(l), f);
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return 0;
}

/* The fair lock's handoff: the release script grants the lock to the queued
 * waiter and takes its token there; the counter set back to an older value
 * meanwhile still gives a token above the holder's. */
typedef struct {
    dlock_lock *l;
    uint64_t fence;
    int rc;
} waiter;

static void *wait_fair(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_acquire(w->l, 10000, 5000, &w->fence);
    return NULL;
}

static void fair_handoff(dlock_client *c, redisContext *rc)
{
    dlock_lock *a = th_lock(c, "fence:fair", DLOCK_KIND_FAIR);
    dlock_lock *b = th_lock(c, "fence:fair", DLOCK_KIND_FAIR);
    uint64_t fa = 0;
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 5000, &fa));
    waiter w = {b, 0, -1};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, wait_fair, &w), 0);
    /* queued and subscribed to its own channel */
    ASSERT_EVENTUALLY(th_cmd_int(rc, "LLEN redisson_lock_queue:{fence:fair}") == 1 &&
                          th_subscribers(rc, "fence:fair") >= 1,
                      5000);
    th_cmd_ok(rc, "SET redisson_lock_token:{fence:fair} %llu", (unsigned long long)fa - 50);
    ASSERT_LOK(a, dlock_release(a));
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_EQ(w.rc, DLOCK_OK);
    ASSERT_U64_GT(w.fence, fa);
    ASSERT_U64_EQ(current(c, "fence:fair"), w.fence);
    ASSERT_LOK(b, dlock_release(b));
    dlock_lock_free(a);
    dlock_lock_free(b);
}

/* A restart from an older RDB snapshot (issue 19 item 4): tokens issued
 * after the SAVE are not in the snapshot; the first token after the restart
 * is above all of them. Twice from the same snapshot. */
static void rdb_restart(th_server *s)
{
    uint64_t highest = 0;
    for (int round = 0; round < 2; round++) {
        dlock_client *c = th_client(s, 0);
        dlock_lock *l = th_lock(c, "fence:rdb", DLOCK_KIND_PLAIN);
        redisContext *rc = th_redis(s);
        for (int i = 0; i < 6; i++) {
            uint64_t f = 0;
            ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &f));
            ASSERT_U64_GT(f, highest);
            highest = f;
            ASSERT_LOK(l, dlock_release(l));
            if (round == 0 && i == 2) th_cmd_ok(rc, "SAVE");
        }
        redisFree(rc);
        dlock_lock_free(l);
        dlock_client_free(c);
        /* a crash: the server comes back from the snapshot, with the
         * counter as it was after the third acquire of the first round */
        th_server_restart(s, SIGKILL);
        rc = th_redis(s);
        char *v = th_cmd_str(rc, "GET redisson_lock_token:{fence:rdb}");
        ASSERT_NOT_NULL(v);
        ASSERT_U64_GT(highest, strtoull(v, NULL, 10));
        free(v);
        redisFree(rc);
    }
    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, "fence:rdb", DLOCK_KIND_PLAIN);
    uint64_t f = 0;
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &f));
    th_log("highest token before the restart %llu, after %llu", (unsigned long long)highest,
           (unsigned long long)f);
    ASSERT_U64_GT(f, highest);
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_client_free(c);
}

int main(void)
{
    th_init("fencing");
    th_server *s = th_server_start(NULL);

    /* processes first (no client, so no threads, in this process at fork) */
    redisContext *rc = th_redis(s);
    uint64_t t_before = server_us(rc);
    pid_t pids[NPROC];
    for (int i = 0; i < NPROC; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) exit(child(s));
    }
    for (int i = 0; i < NPROC; i++) ASSERT_EQ(th_wait_child(pids[i], 40000), 0);

    dlock_client *c = th_client(s, 0);
    uint64_t t_after = server_us(rc);
    uint64_t after_children = current(c, NAME);
    /* every token is the server's clock when it was issued (acquisitions are
     * more than a microsecond apart) */
    ASSERT_U64_GT(after_children, t_before + (uint64_t)NPROC * ROUNDS - 1);
    ASSERT_U64_GT(t_after + 1, after_children);
    /* the counter never expires (Redisson's RFencedLock counts on from it) */
    ASSERT_EQ(th_cmd_int(rc, "PTTL redisson_lock_token:{%s}", NAME), -1);

    /* the counter key is redisson_lock_token:{name} */
    char *raw = th_cmd_str(rc, "GET redisson_lock_token:{%s}", NAME);
    ASSERT_NOT_NULL(raw);
    ASSERT_U64_EQ(strtoull(raw, NULL, 10), after_children);
    free(raw);

    /* one handle: strictly increasing, dlock_lock_fence and current match */
    dlock_lock *l = th_lock(c, NAME, DLOCK_KIND_PLAIN);
    ASSERT_U64_EQ(dlock_lock_fence(l), 0);
    uint64_t prev = after_children;
    for (int i = 0; i < 20; i++) {
        uint64_t f = 0;
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &f));
        ASSERT_U64_GT(f, prev);
        ASSERT_U64_EQ(dlock_lock_fence(l), f);
        ASSERT_U64_EQ(current(c, NAME), f);
        prev = f;
        ASSERT_LOK(l, dlock_release(l));
    }

    /* a failed try does not hand out a token, and busy leaves the counter */
    dlock_lock *l2 = th_lock(c, NAME, DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &prev));
    uint64_t f_busy = 12345;
    ASSERT_LCODE(l2, dlock_acquire(l2, DLOCK_NOWAIT, 5000, &f_busy), DLOCK_EBUSY);
    ASSERT_U64_EQ(current(c, NAME), prev);
    ASSERT_LOK(l, dlock_release(l));
    uint64_t f = 0;
    ASSERT_LOK(l2, dlock_acquire(l2, DLOCK_NOWAIT, 5000, &f));
    ASSERT_U64_GT(f, prev);
    prev = f;
    ASSERT_LOK(l2, dlock_release(l2));
    dlock_lock_free(l2);
    dlock_lock_free(l);

    /* reentrant: every acquire, re-entry included, bumps the counter */
    dlock_lock *r = th_lock(c, "fence:re", DLOCK_KIND_REENTRANT);
    ASSERT_U64_EQ(current(c, "fence:re"), 0);
    uint64_t a = 0, b = 0, d = 0;
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 5000, &a));
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 5000, &b));
    ASSERT_U64_GT(b, a);
    ASSERT_U64_EQ(current(c, "fence:re"), b);
    ASSERT_LOK(r, dlock_release(r));
    ASSERT_LOK(r, dlock_release(r));
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 5000, &d));
    ASSERT_U64_GT(d, b);
    ASSERT_LOK(r, dlock_release(r));
    dlock_lock_free(r);

    /* token acquire hands out fences too */
    char token[DLOCK_TOKEN_LEN + 1];
    uint64_t ft = 0;
    ASSERT_COK(c, dlock_acquire_token(c, NAME, DLOCK_CSTR, DLOCK_NOWAIT, 5000, token, &ft));
    ASSERT_U64_GT(ft, prev);
    ASSERT_COK(c, dlock_release_token(c, NAME, DLOCK_CSTR, token));

    /* a name never locked has counter 0 */
    ASSERT_U64_EQ(current(c, "fence:never"), 0);

    /* the counter lost (expired, or gone with a restart without
     * persistence): the next token is still above every token before */
    l = th_lock(c, NAME, DLOCK_KIND_PLAIN);
    prev = ft;
    ASSERT_EQ(th_cmd_int(rc, "DEL redisson_lock_token:{%s}", NAME), 1);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &f));
    ASSERT_U64_GT(f, prev);
    ASSERT_LOK(l, dlock_release(l));
    prev = f;

    /* a counter from before (a small number; RFencedLock's own INCRs start
     * there too) is raised to the clock */
    th_cmd_ok(rc, "SET redisson_lock_token:{%s} 1000", NAME);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &f));
    ASSERT_U64_GT(f, prev);
    ASSERT_EQ(th_cmd_int(rc, "PTTL redisson_lock_token:{%s}", NAME), -1);
    ASSERT_LOK(l, dlock_release(l));
    /* the expiry older versions gave the counter goes at the next acquire */
    th_cmd_ok(rc, "PEXPIRE redisson_lock_token:{%s} 86400000", NAME);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &prev));
    ASSERT_U64_GT(prev, f);
    ASSERT_EQ(th_cmd_int(rc, "PTTL redisson_lock_token:{%s}", NAME), -1);
    ASSERT_LOK(l, dlock_release(l));
    f = prev;
    /* an INCR by another client (RFencedLock) keeps the order */
    ASSERT_EQ(th_cmd_int(rc, "INCR redisson_lock_token:{%s}", NAME), (long long)f + 1);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &prev));
    ASSERT_U64_GT(prev, f + 1);
    ASSERT_LOK(l, dlock_release(l));
    /* a counter ahead of the clock counts on by one */
    th_cmd_ok(rc, "SET redisson_lock_token:{%s} %llu", NAME, AHEAD);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &f));
    ASSERT_U64_EQ(f, AHEAD + 1);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "DEL redisson_lock_token:{%s}", NAME), 1);

    /* every kind's acquire script takes its token the same way: a fresh
     * counter starts at the clock, and a counter set back to an older value
     * (a restore from an older snapshot) still gives a token above the ones
     * before (RedLock's fence_url counter is in test_redlock) */
    static const int kinds[] = {DLOCK_KIND_PLAIN, DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR,
                                DLOCK_KIND_READ, DLOCK_KIND_WRITE};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        dlock_lock *k = th_lock(c, "fence:kind", kinds[i]);
        uint64_t t0 = server_us(rc), fk = 0, fk2 = 0;
        ASSERT_LOK(k, dlock_acquire(k, DLOCK_NOWAIT, 5000, &fk));
        ASSERT_U64_GT(fk, t0 - 1);
        ASSERT_U64_GT(server_us(rc) + 1, fk);
        ASSERT_LOK(k, dlock_release(k));
        th_cmd_ok(rc, "SET redisson_lock_token:{fence:kind} %llu", (unsigned long long)fk - 50);
        ASSERT_LOK(k, dlock_acquire(k, DLOCK_NOWAIT, 5000, &fk2));
        ASSERT_U64_GT(fk2, fk);
        if (kinds[i] == DLOCK_KIND_REENTRANT) { /* and a re-entry */
            uint64_t fk3 = 0;
            th_cmd_ok(rc, "SET redisson_lock_token:{fence:kind} %llu",
                      (unsigned long long)fk2 - 50);
            ASSERT_LOK(k, dlock_acquire(k, DLOCK_NOWAIT, 5000, &fk3));
            ASSERT_U64_GT(fk3, fk2);
            ASSERT_LOK(k, dlock_release(k));
        }
        ASSERT_LOK(k, dlock_release(k));
        ASSERT_EQ(th_cmd_int(rc, "DEL redisson_lock_token:{fence:kind}"), 1);
        dlock_lock_free(k);
    }
    dlock_lock_free(l);

    /* a counter INCR cannot count on (a word, another type, its largest
     * value, written by a foreign client): the token is the server's clock,
     * above the tokens before it, and the counter is set to it (before: the
     * acquire failed after its script had written the lock, which stayed
     * held by nobody for its lease, or a counter of another type was told as
     * "held as another kind of lock") */
    static const char *const bad[] = {"SET %s abc", "HSET %s f v", "SET %s 9223372036854775807"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        for (size_t bi = 0; bi < sizeof bad / sizeof bad[0]; bi++) {
            dlock_lock *k = th_lock(c, "fence:bad", kinds[i]);
            th_cmd_int(rc, "DEL redisson_lock_token:{fence:bad}");
            char cmd[64];
            snprintf(cmd, sizeof cmd, bad[bi], "redisson_lock_token:{fence:bad}");
            redisReply *br = redisCommand(rc, cmd);
            ASSERT_NOT_NULL(br);
            freeReplyObject(br);
            uint64_t t0 = server_us(rc), fk = 0;
            ASSERT_LOK(k, dlock_acquire(k, DLOCK_NOWAIT, 5000, &fk));
            ASSERT_U64_GT(fk, t0 - 1);
            ASSERT_U64_GT(server_us(rc) + 1, fk);
            char *v = th_cmd_str(rc, "GET redisson_lock_token:{fence:bad}");
            ASSERT_EQ(strtoull(v, NULL, 10), fk);
            free(v);
            ASSERT_LOK(k, dlock_release(k));
            ASSERT_EQ(th_cmd_int(rc, "EXISTS fence:bad"), 0);
            dlock_lock_free(k);
        }
    }
    th_cmd_int(rc, "DEL redisson_lock_token:{fence:bad}");

    fair_handoff(c, rc);
    redisFree(rc);
    dlock_client_free(c);
    rdb_restart(s);

    th_server_stop(s);
    th_log("ok");
    return 0;
}
