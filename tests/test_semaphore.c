/* Semaphore (Redisson RSemaphore layout): N=3 and 12 processes, the holders
 * themselves count how many hold at once (never more than 3, and 3 reached);
 * acquire/release of k permits; a bounded wait times out on time and wakes on
 * release (not after the whole wait); a waiter for k permits is not woken
 * into taking fewer; available / try_set / add; the key's value and the
 * release message on "redisson_sc:{name}"; bad input. */
/* Children free what they made and end with _exit(): the handles they
 * inherit from the parent would otherwise show as leaks under LeakSanitizer. */
#include "harness.h"

#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>

#define MARGIN 800
#define RECHECK_MS 2000 /* DL_WAIT_RECHECK_MS */
#define NPROC 12
#define NPERMITS 3
#define ROUNDS 4

/* KEYS: current holders, max seen. -> the holders now (this one included) */
static const char *enter_lua =
    "local v = redis.call('incr', KEYS[1]) "
    "if v > tonumber(redis.call('get', KEYS[2]) or '0') then redis.call('set', KEYS[2], v) end "
    "return v";

static dlock_semaphore *sem(dlock_client *c, const char *name)
{
    dlock_semaphore *s = NULL;
    ASSERT_CCODE(c, dlock_semaphore_new(c, name, DLOCK_CSTR, &s), DLOCK_OK);
    ASSERT_NOT_NULL(s);
    return s;
}


static int64_t avail(dlock_semaphore *s)
{
    int64_t n = -999;
    ASSERT_SOK(s, dlock_semaphore_available(s, &n));
    return n;
}

static void basics(const th_server *srv, dlock_client *c, redisContext *rc)
{
    dlock_semaphore *s = sem(c, "sem:basic");
    ASSERT_EQ(avail(s), 0); /* absent: no permits */
    int set = -1;
    ASSERT_SOK(s, dlock_semaphore_try_set(s, 3, &set));
    ASSERT_EQ(set, 1);
    ASSERT_SOK(s, dlock_semaphore_try_set(s, 10, &set));
    ASSERT_EQ(set, 0);
    ASSERT_EQ(avail(s), 3);
    char *v = th_cmd_str(rc, "GET sem:basic");
    ASSERT_STR_EQ(v, "3"); /* Redisson layout: a STRING of the available permits */
    free(v);

    ASSERT_SOK(s, dlock_semaphore_acquire(s, 2, DLOCK_NOWAIT));
    ASSERT_EQ(avail(s), 1);
    ASSERT_SCODE(s, dlock_semaphore_acquire(s, 2, DLOCK_NOWAIT), DLOCK_EBUSY);
    ASSERT(strlen(dlock_semaphore_errmsg(s)) > 0);
    ASSERT_EQ(avail(s), 1); /* a failed try takes nothing */
    ASSERT_SOK(s, dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT));
    ASSERT_EQ(avail(s), 0);
    ASSERT_SOK(s, dlock_semaphore_release(s, 3));
    ASSERT_EQ(avail(s), 3);
    ASSERT_SOK(s, dlock_semaphore_acquire(s, 3, 1000));
    ASSERT_EQ(avail(s), 0);

    /* add: up and down, even below zero (as Redisson's reducePermits) */
    ASSERT_SOK(s, dlock_semaphore_add(s, 5));
    ASSERT_EQ(avail(s), 5);
    ASSERT_SOK(s, dlock_semaphore_add(s, -7));
    ASSERT_EQ(avail(s), -2);
    ASSERT_SCODE(s, dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT), DLOCK_EBUSY);
    ASSERT_SOK(s, dlock_semaphore_release(s, 3));
    ASSERT_EQ(avail(s), 1);
    ASSERT_SOK(s, dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT));
    /* try_set on an existing (even empty) semaphore does nothing */
    ASSERT_SOK(s, dlock_semaphore_try_set(s, 9, &set));
    ASSERT_EQ(set, 0);
    ASSERT_EQ(avail(s), 0);
    /* try_set 0: creates an exhausted semaphore */
    dlock_semaphore *z = sem(c, "sem:zero");
    ASSERT_SOK(z, dlock_semaphore_try_set(z, 0, &set));
    ASSERT_EQ(set, 1);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS sem:zero"), 1);
    dlock_semaphore_free(z);

    /* the release message: the new count on redisson_sc:{name} */
    redisContext *sub = th_redis(srv);
    struct timeval tv = {5, 0};
    redisSetTimeout(sub, tv);
    redisReply *r = th_cmd(sub, "SUBSCRIBE redisson_sc:{sem:basic}");
    freeReplyObject(r);
    ASSERT_SOK(s, dlock_semaphore_release(s, 2));
    void *m = NULL;
    ASSERT_EQ(redisGetReply(sub, &m), REDIS_OK);
    r = m;
    ASSERT(r->type == REDIS_REPLY_ARRAY && r->elements == 3);
    ASSERT_STR_EQ(r->element[0]->str, "message");
    ASSERT_STR_EQ(r->element[1]->str, "redisson_sc:{sem:basic}");
    ASSERT_STR_EQ(r->element[2]->str, "2");
    freeReplyObject(r);
    redisFree(sub);

    /* binary-safe names */
    dlock_semaphore *b = NULL;
    ASSERT_CCODE(c, dlock_semaphore_new(c, "sem\0bin", 7, &b), DLOCK_OK);
    ASSERT_SOK(b, dlock_semaphore_try_set(b, 1, &set));
    ASSERT_EQ(set, 1);
    r = th_cmd(rc, "GET %b", "sem\0bin", (size_t)7);
    ASSERT(r->type == REDIS_REPLY_STRING && !strcmp(r->str, "1"));
    freeReplyObject(r);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS sem"), 0);
    dlock_semaphore_free(b);

    /* the value of another type, or not a number: server errors, no change */
    th_cmd_ok(rc, "HSET sem:hash f 1");
    dlock_semaphore *h = sem(c, "sem:hash");
    ASSERT_SCODE(h, dlock_semaphore_acquire(h, 1, DLOCK_NOWAIT), DLOCK_ESERVER);
    ASSERT_SCODE(h, dlock_semaphore_release(h, 1), DLOCK_ESERVER);
    dlock_semaphore_free(h);
    th_cmd_ok(rc, "SET sem:text abc");
    h = sem(c, "sem:text");
    ASSERT_SCODE(h, dlock_semaphore_acquire(h, 1, DLOCK_NOWAIT), DLOCK_ESERVER);
    ASSERT(strstr(dlock_semaphore_errmsg(h), "not an integer") != NULL);
    int64_t n = 0;
    ASSERT_SCODE(h, dlock_semaphore_available(h, &n), DLOCK_EPROTO);
    dlock_semaphore_free(h);
    /* overflow */
    th_cmd_ok(rc, "SET sem:big 9223372036854775807");
    h = sem(c, "sem:big");
    ASSERT_SCODE(h, dlock_semaphore_release(h, 1), DLOCK_EOVERFLOW);
    dlock_semaphore_free(h);

    dlock_semaphore_free(s);
    th_log("basics ok");
}

static void bad_input(dlock_client *c, redisContext *rc)
{
    dlock_semaphore *s = NULL;
    int set;
    int64_t n;
    ASSERT_CODE(dlock_semaphore_new(NULL, "x", DLOCK_CSTR, &s), DLOCK_EINVAL);
    ASSERT_NULL(s);
    ASSERT_CODE(dlock_semaphore_new(c, NULL, DLOCK_CSTR, &s), DLOCK_EINVAL);
    ASSERT(strlen(dlock_errmsg(c)) > 0);
    ASSERT_CODE(dlock_semaphore_new(c, "", DLOCK_CSTR, &s), DLOCK_EINVAL);
    ASSERT(strlen(dlock_errmsg(c)) > 0);
    ASSERT_CODE(dlock_semaphore_new(c, "x", DLOCK_CSTR, NULL), DLOCK_EINVAL);
    ASSERT(strlen(dlock_errmsg(c)) > 0);
    char big[DLOCK_NAME_MAX + 2];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ASSERT_CODE(dlock_semaphore_new(c, big, DLOCK_CSTR, &s), DLOCK_ENAMETOOLONG);

    ASSERT_CODE(dlock_semaphore_acquire(NULL, 1, 0), DLOCK_EINVAL);
    ASSERT_CODE(dlock_semaphore_release(NULL, 1), DLOCK_EINVAL);
    ASSERT_CODE(dlock_semaphore_available(NULL, &n), DLOCK_EINVAL);
    ASSERT_CODE(dlock_semaphore_try_set(NULL, 1, &set), DLOCK_EINVAL);
    ASSERT_CODE(dlock_semaphore_add(NULL, 1), DLOCK_EINVAL);
    ASSERT(strlen(dlock_semaphore_errmsg(NULL)) > 0);
    dlock_semaphore_free(NULL);

    s = sem(c, "sem:bad");
#define BAD(expr)                                                    \
    do {                                                             \
        ASSERT_SCODE(s, expr, DLOCK_EINVAL);                         \
        ASSERT_MSG(strlen(dlock_semaphore_errmsg(s)) > 0, "no message: %s", #expr); \
    } while (0)
    BAD(dlock_semaphore_acquire(s, 0, 0));
    BAD(dlock_semaphore_acquire(s, -1, 0));
    BAD(dlock_semaphore_acquire(s, 1, -2));
    BAD(dlock_semaphore_release(s, 0));
    BAD(dlock_semaphore_release(s, -5));
    BAD(dlock_semaphore_try_set(s, -1, &set));
    BAD(dlock_semaphore_try_set(s, 1, NULL));
    BAD(dlock_semaphore_available(s, NULL));
    /* counts past 2^53 - 1: the scripts' numbers are doubles */
    BAD(dlock_semaphore_acquire(s, DLOCK_COUNT_MAX + 1, 0));
    BAD(dlock_semaphore_release(s, DLOCK_COUNT_MAX + 1));
    BAD(dlock_semaphore_try_set(s, DLOCK_COUNT_MAX + 1, &set));
    BAD(dlock_semaphore_add(s, DLOCK_COUNT_MAX + 1));
    BAD(dlock_semaphore_add(s, -DLOCK_COUNT_MAX - 1));
#undef BAD
    /* nothing was created by the refused calls */
    ASSERT_EQ(avail(s), 0);
    dlock_semaphore_free(s);

    /* a count of 2^53 (set by another client): an acquire of 2^53 + 1
     * permits, which a double rounds to 2^53, is refused and takes nothing;
     * the largest acquire takes exactly its permits */
    th_cmd_ok(rc, "SET sem:big 9007199254740992");
    s = sem(c, "sem:big");
    ASSERT_SCODE(s, dlock_semaphore_acquire(s, DLOCK_COUNT_MAX + 2, 0), DLOCK_EINVAL);
    char *v = th_cmd_str(rc, "GET sem:big");
    ASSERT_STR_EQ(v, "9007199254740992");
    free(v);
    ASSERT_SCODE(s, dlock_semaphore_acquire(s, DLOCK_COUNT_MAX, 0), DLOCK_OK);
    v = th_cmd_str(rc, "GET sem:big");
    ASSERT_STR_EQ(v, "1");
    free(v);
    dlock_semaphore_free(s);
    th_cmd_ok(rc, "DEL sem:big");
    th_log("bad input ok");
}

/* The wait bound, and waking on release. */
static void waiting(const th_server *srv, dlock_client *c, redisContext *rc)
{
    dlock_semaphore *s = sem(c, "sem:wait");
    int set;
    ASSERT_SOK(s, dlock_semaphore_try_set(s, 0, &set));
    int64_t t0 = th_now_ms();
    ASSERT_SCODE(s, dlock_semaphore_acquire(s, 1, 300), DLOCK_ETIMEDOUT);
    int64_t took = th_now_ms() - t0;
    th_log("bounded wait of 300 ms gave up after %lld ms", (long long)took);
    ASSERT_GE(took, 290);
    ASSERT_LE(took, 300 + MARGIN);
    ASSERT_EQ(th_numsub(rc, "redisson_sc:{sem:wait}"), 0); /* unsubscribed */

    /* a waiter (another process) for 2 permits wakes on the release that
     * makes 2 available, not earlier, not at the end of its 10 s wait */
    th_cmd_ok(rc, "DEL sem:wait:got");
    pid_t pid = th_fork();
    if (pid == 0) {
        dlock_client *cc = th_client(srv, 0);
        dlock_semaphore *w = sem(cc, "sem:wait");
        int rc2 = dlock_semaphore_acquire(w, 2, 10000);
        if (rc2 != DLOCK_OK) {
            fprintf(stderr, "waiter: %s: %s\n", dlock_strerror(rc2), dlock_semaphore_errmsg(w));
            _exit(1);
        }
        redisContext *r2 = th_redis(srv);
        th_cmd_ok(r2, "SET sem:wait:got %lld", (long long)th_now_ms());
        redisFree(r2);
        dlock_semaphore_free(w);
        dlock_client_free(cc);
        _exit(0);
    }
    ASSERT_EVENTUALLY(th_numsub(rc, "redisson_sc:{sem:wait}") == 1, 5000);
    ASSERT_SOK(s, dlock_semaphore_release(s, 1)); /* 1 of 2: wakes it, it must wait on */
    th_sleep_ms(200);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS sem:wait:got"), 0);
    ASSERT_EQ(avail(s), 1);
    int64_t t_rel = th_now_ms();
    ASSERT_SOK(s, dlock_semaphore_release(s, 1));
    ASSERT_EQ(th_wait_child(pid, 10000), 0);
    char *v = th_cmd_str(rc, "GET sem:wait:got");
    ASSERT_NOT_NULL(v);
    int64_t t_got = atoll(v);
    free(v);
    th_log("waiter for 2 permits had them %lld ms after the release", (long long)(t_got - t_rel));
    ASSERT_LT(t_got - t_rel, 5000); /* woken: not at the end of its 10 s wait */
    ASSERT_EQ(avail(s), 0);

    /* DLOCK_WAIT_FOREVER, woken by add */
    pid = th_fork();
    if (pid == 0) {
        dlock_client *cc = th_client(srv, 0);
        dlock_semaphore *w = sem(cc, "sem:wait");
        int rc2 = dlock_semaphore_acquire(w, 1, DLOCK_WAIT_FOREVER);
        dlock_semaphore_free(w);
        dlock_client_free(cc);
        _exit(rc2 == DLOCK_OK ? 0 : 1);
    }
    ASSERT_EVENTUALLY(th_numsub(rc, "redisson_sc:{sem:wait}") == 1, 5000);
    ASSERT_SOK(s, dlock_semaphore_add(s, 1));
    ASSERT_EQ(th_wait_child(pid, 5000), 0);
    ASSERT_EQ(avail(s), 0);

    /* DLOCK_WAIT_FOREVER, permits added by a client that publishes nothing
     * (a manual INCRBY): the wait re-checks every DL_WAIT_RECHECK_MS, so it
     * has them within that of the INCRBY, not never */
    th_cmd_ok(rc, "DEL sem:wait:got");
    pid = th_fork();
    if (pid == 0) {
        dlock_client *cc = th_client(srv, 0);
        dlock_semaphore *w = sem(cc, "sem:wait");
        int rc2 = dlock_semaphore_acquire(w, 1, DLOCK_WAIT_FOREVER);
        redisContext *r2 = th_redis(srv);
        th_cmd_ok(r2, "SET sem:wait:got %lld", (long long)th_now_ms());
        redisFree(r2);
        dlock_semaphore_free(w);
        dlock_client_free(cc);
        _exit(rc2 == DLOCK_OK ? 0 : 1);
    }
    ASSERT_EVENTUALLY(th_numsub(rc, "redisson_sc:{sem:wait}") == 1, 5000);
    th_sleep_ms(100);
    int64_t t_add = th_now_ms();
    ASSERT_EQ(th_cmd_int(rc, "INCRBY sem:wait 1"), 1);
    ASSERT_EQ(th_wait_child(pid, RECHECK_MS + 5000), 0);
    v = th_cmd_str(rc, "GET sem:wait:got");
    ASSERT_NOT_NULL(v);
    t_got = atoll(v);
    free(v);
    th_log("a forever waiter had a permit added without a message %lld ms after the INCRBY",
           (long long)(t_got - t_add));
    ASSERT_LT(t_got - t_add, RECHECK_MS + MARGIN);
    ASSERT_EQ(avail(s), 0);
    dlock_semaphore_free(s);
    th_log("waiting ok");
}

/* N=3, 12 processes: never more than 3 holders at once, and 3 reached. */
static void concurrency(const th_server *srv, redisContext *rc)
{
    th_cmd_ok(rc, "DEL sem:conc sem:conc:cur sem:conc:max sem:conc:over");
    {
        dlock_client *c = th_client(srv, 0);
        dlock_semaphore *s = sem(c, "sem:conc");
        int set;
        ASSERT_SOK(s, dlock_semaphore_try_set(s, NPERMITS, &set));
        ASSERT_EQ(set, 1);
        dlock_semaphore_free(s);
        dlock_client_free(c);
    }
    pid_t pids[NPROC];
    for (int i = 0; i < NPROC; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) {
            dlock_client *c = th_client(srv, 0);
            dlock_semaphore *s = sem(c, "sem:conc");
            redisContext *r = th_redis(srv);
            for (int k = 0; k < ROUNDS; k++) {
                int code = dlock_semaphore_acquire(s, 1, 15000);
                if (code != DLOCK_OK) {
                    fprintf(stderr, "holder %d: %s: %s\n", i, dlock_strerror(code),
                            dlock_semaphore_errmsg(s));
                    _exit(1);
                }
                redisReply *e = th_cmd(r, "EVAL %s 2 sem:conc:cur sem:conc:max", enter_lua);
                if (e->type != REDIS_REPLY_INTEGER) _exit(2);
                if (e->integer > NPERMITS) th_cmd_int(r, "INCR sem:conc:over");
                freeReplyObject(e);
                th_sleep_ms(40);
                th_cmd_int(r, "DECR sem:conc:cur");
                if (dlock_semaphore_release(s, 1) != DLOCK_OK) _exit(3);
            }
            redisFree(r);
            dlock_semaphore_free(s);
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int i = 0; i < NPROC; i++) ASSERT_EQ(th_wait_child(pids[i], 20000), 0);
    char *mx = th_cmd_str(rc, "GET sem:conc:max");
    ASSERT_NOT_NULL(mx);
    long long maxseen = atoll(mx);
    free(mx);
    char *over = th_cmd_str(rc, "GET sem:conc:over");
    th_log("%d processes x %d rounds on %d permits: at most %lld holders at once", NPROC, ROUNDS,
           NPERMITS, maxseen);
    ASSERT_NULL(over);
    ASSERT_LE(maxseen, NPERMITS);
    ASSERT_EQ(maxseen, NPERMITS);
    char *v = th_cmd_str(rc, "GET sem:conc");
    ASSERT_STR_EQ(v, "3"); /* every permit came back */
    free(v);
}

int main(void)
{
    th_init("semaphore");
    th_server *srv = th_server_start(NULL);
    dlock_client *c = th_client(srv, 0);
    redisContext *rc = th_redis(srv);
    bad_input(c, rc);
    basics(srv, c, rc);
    waiting(srv, c, rc);
    concurrency(srv, rc);
    redisFree(rc);
    dlock_client_free(c);
    th_server_stop(srv);
    th_log("ok");
    return 0;
}
