/* The async API (include/dlock_async.h) on real event loops (libuv,
 * libevent, the bare interface: tests/async_loop.c) and real servers.
 * argv[1] is "<case>_<loop>".
 *
 *   basic     try, timed and forever waits, release, extend, ELOST, fences,
 *             a SCRIPT FLUSH under a pipelined burst
 *   handoff   a chain of async waiters on one name, one holder at a time;
 *             handoff from a blocking holder to an async waiter and back,
 *             by the release's wake-up (well before the 2 s backstop)
 *   counter   exact-counter exclusion: async handles on the loop and
 *             blocking clients in threads, mixed on one name, each doing a
 *             non-atomic GET ... SET under the lock across loop turns
 *   pipeline  many acquires in flight on one connection, many waiters on
 *             one subscribed connection (the server's client count)
 *   reentrant the reentrant lock, its owner the handle; mixed exclusion
 *             with blocking reentrant holders
 * The failure cases are tests/test_async_faults.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "async_loop.h"

/* ---- basic ---- */

static void t_basic(th_server *s) {
    dlock_async_client *c = client(s);
    dlock_async_lock *a = alock(c, "basic"), *b = alock(c, "basic");
    res r1 = {0}, r2 = {0}, r3 = {0};
    hold(a, 5000, &r1);
    ASSERT_U64_GT(r1.fence, 0);
    ASSERT_GT(dlock_async_lock_valid_ms(a), 4000);
    /* the blocking API sees the same key */
    redisContext *rc = th_redis(s);
    ASSERT_GT(th_cmd_int(rc, "PTTL basic"), 4000);

    START(dlock_async_acquire(b, DLOCK_NOWAIT, 5000, on_done, &r2));
    WAIT_DONE(r2, 3000);
    ASSERT_CODE(r2.code, DLOCK_EBUSY);
    ASSERT(strstr(dlock_async_lock_errmsg(b), "held by another owner"));

    int64_t t0 = th_now_ms();
    memset(&r2, 0, sizeof r2);
    START(dlock_async_acquire(b, 300, 5000, on_done, &r2));
    WAIT_DONE(r2, 3000);
    ASSERT_CODE(r2.code, DLOCK_ETIMEDOUT);
    ASSERT_GE(r2.at - t0, 290);
    ASSERT_LT(r2.at - t0, 1500);
    /* the timed-out waiter left the registry */
    RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{basic}") == 0, 1000);

    /* a forever wait, served by the release's wake-up */
    memset(&r2, 0, sizeof r2);
    START(dlock_async_acquire(b, DLOCK_WAIT_FOREVER, 5000, on_done, &r2));
    run_for(100);
    ASSERT_EQ(r2.calls, 0);
    START(dlock_async_release(a, on_done, &r3));
    WAIT_DONE(r3, 3000);
    ASSERT_CODE(r3.code, DLOCK_OK);
    WAIT_DONE(r2, 1000);
    ASSERT_CODE(r2.code, DLOCK_OK);
    ASSERT_LT(r2.at - r3.at, 500);
    ASSERT_U64_GT(r2.fence, r1.fence);
    ASSERT_EQ(dlock_async_lock_valid_ms(a), 0);
    ASSERT_CODE(dlock_async_release(a, on_done, &r3), DLOCK_ENOTHELD);

    /* extend, then the lease runs out: release reports ELOST */
    memset(&r3, 0, sizeof r3);
    START(dlock_async_extend(b, 200, on_done, &r3));
    WAIT_DONE(r3, 3000);
    ASSERT_CODE(r3.code, DLOCK_OK);
    ASSERT_LE(th_cmd_int(rc, "PTTL basic"), 200);
    run_for(300);
    memset(&r3, 0, sizeof r3);
    START(dlock_async_release(b, on_done, &r3));
    WAIT_DONE(r3, 3000);
    ASSERT_CODE(r3.code, DLOCK_ELOST);
    ASSERT_EQ(dlock_async_lock_valid_ms(b), 0);
    memset(&r3, 0, sizeof r3);
    ASSERT_CODE(dlock_async_extend(b, 1000, on_done, &r3), DLOCK_ENOTHELD);

    /* a wait that outlives the holder's lease (no release: PTTL) */
    res h = {0}, w = {0};
    hold(a, 300, &h);
    START(dlock_async_acquire(b, 3000, 5000, on_done, &w));
    WAIT_DONE(w, 3000);
    ASSERT_CODE(w.code, DLOCK_OK);
    ASSERT_LT(w.at - h.at, 900);
    ASSERT_EQ(r1.calls + r2.calls + h.calls + w.calls, 4);

    /* the script cache flushed under a pipelined burst: NOSCRIPT answers are
     * sent again by text, in order */
    enum { B = 8 };
    dlock_async_lock *bl[B];
    res br[B], brel[B];
    memset(br, 0, sizeof br);
    memset(brel, 0, sizeof brel);
    th_cmd_ok(rc, "SCRIPT FLUSH");
    for (int i = 0; i < B; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "flush%d", i);
        bl[i] = alock(c, nm);
        START(dlock_async_acquire(bl[i], DLOCK_NOWAIT, 5000, on_done, &br[i]));
    }
    RUN_UNTIL(calls(br, B) == B, 3000);
    th_cmd_ok(rc, "SCRIPT FLUSH");
    for (int i = 0; i < B; i++) {
        ASSERT_CODE(br[i].code, DLOCK_OK);
        START(dlock_async_release(bl[i], on_done, &brel[i]));
    }
    RUN_UNTIL(calls(brel, B) == B, 3000);
    for (int i = 0; i < B; i++) {
        ASSERT_CODE(brel[i].code, DLOCK_OK);
        ASSERT_EQ(th_cmd_int(rc, "EXISTS flush%d", i), 0);
    }
    redisFree(rc);
    client_free(c);
}

/* ---- handoff ---- */

#define CHAIN 20
typedef struct chain {
    dlock_async_lock *l[CHAIN];
    res r[CHAIN];
    int holders, max_holders, served;
} chain;
static chain ch;

static void chain_release_done(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)l, (void)f, (void)ud;
    ASSERT_CODE(code, DLOCK_OK);
}

static void chain_release(void *arg) {
    int i = (int)(intptr_t)arg;
    ch.holders--;
    START(dlock_async_release(ch.l[i], chain_release_done, NULL));
}

static void chain_got(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    on_done(l, code, fence, ud);
    ASSERT_CODE(code, DLOCK_OK);
    ch.holders++;
    ch.served++;
    if (ch.holders > ch.max_holders) ch.max_holders = ch.holders;
    int i = (int)((res *)ud - ch.r);
    after(2, chain_release, (void *)(intptr_t)i);
}

static void t_handoff(th_server *s) {
    dlock_async_client *c = client(s);
    for (int i = 0; i < CHAIN; i++) {
        ch.l[i] = alock(c, "chain");
        START(dlock_async_acquire(ch.l[i], DLOCK_WAIT_FOREVER, 5000, chain_got, &ch.r[i]));
    }
    RUN_UNTIL(ch.served == CHAIN, 10000);
    RUN_UNTIL(ch.holders == 0, 2000);
    run_for(50);
    ASSERT_EQ(ch.max_holders, 1);
    for (int i = 0; i < CHAIN; i++) ASSERT_EQ(ch.r[i].calls, 1);

    /* blocking holder -> async waiter */
    blocker b = {.s = s, .name = "mixed", .hold_ms = 300};
    pthread_t th;
    pthread_create(&th, NULL, blocking_holder, &b);
    while (!atomic_load(&b.go)) th_sleep_ms(1);
    dlock_async_lock *a = alock(c, "mixed");
    res r = {0};
    START(dlock_async_acquire(a, DLOCK_WAIT_FOREVER, 5000, on_done, &r));
    WAIT_DONE(r, 5000);
    pthread_join(th, NULL);
    ASSERT_CODE(r.code, DLOCK_OK);
    th_log("blocking -> async handoff: %lld ms after the release",
           (long long)(r.at - b.released_at));
    ASSERT_LT(r.at - b.released_at, 500); /* the wake-up, not the 2 s backstop */

    /* async holder -> blocking waiter */
    blocker w = {.s = s, .name = "mixed", .hold_ms = 0};
    pthread_create(&th, NULL, blocking_holder, &w);
    run_for(300); /* the blocking waiter registers */
    ASSERT_EQ(atomic_load(&w.go), 0);
    res rr = {0};
    START(dlock_async_release(a, on_done, &rr));
    WAIT_DONE(rr, 3000);
    ASSERT_CODE(rr.code, DLOCK_OK);
    pthread_join(th, NULL);
    th_log("async -> blocking handoff: %lld ms after the release",
           (long long)(w.acquired_at - rr.at));
    ASSERT_LT(w.acquired_at - rr.at, 500);
    client_free(c);
}

/* ---- counter ---- */

#define ASYNC_HANDLES 6
#define BLOCKING_THREADS 3
#define ROUNDS 25
typedef struct worker {
    dlock_async_lock *l;
    int done, in_cs;
    long long seen;
    res r;
} worker;
static worker workers[ASYNC_HANDLES];
static redisContext *counter_rc;
static int async_in_cs;

static void counter_next(worker *w);

/* An async holder's critical section, in two loop turns at least: enter
 * reads the counter, leave writes it + 1. No other async holder is in. */
static long long cs_enter(void) {
    ASSERT_EQ(async_in_cs, 0);
    async_in_cs++;
    char *v = th_cmd_str(counter_rc, "GET counter");
    long long n = v ? atoll(v) : 0;
    free(v);
    return n;
}

static void cs_leave(long long seen) {
    th_cmd_ok(counter_rc, "SET counter %lld", seen + 1);
    async_in_cs--;
}

static void counter_released(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)l, (void)f;
    ASSERT_CODE(code, DLOCK_OK);
    worker *w = ud;
    if (++w->done < ROUNDS) counter_next(w);
}

static void counter_write(void *arg) {
    worker *w = arg;
    cs_leave(w->seen); /* the write of a read made a loop turn ago, at least */
    START(dlock_async_release(w->l, counter_released, w));
}

static void counter_got(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)l, (void)f;
    worker *w = ud;
    ASSERT_MSG(code == DLOCK_OK, "acquire: %s", dlock_async_lock_errmsg(l));
    w->seen = cs_enter();
    after(1, counter_write, w);
}

static void counter_next(worker *w) {
    START(dlock_async_acquire(w->l, DLOCK_WAIT_FOREVER, 10000, counter_got, w));
}

/* the blocking side's deliberately non-atomic increment: GET, a pause, SET */
static void slow_increment(redisContext *rc) {
    char *v = th_cmd_str(rc, "GET counter");
    long long n = v ? atoll(v) : 0;
    free(v);
    usleep(1000);
    th_cmd_ok(rc, "SET counter %lld", n + 1);
}

static void *counter_thread(void *arg) {
    const th_server *s = arg;
    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, "counter-lock", DLOCK_KIND_PLAIN);
    redisContext *rc = th_redis(s);
    for (int i = 0; i < ROUNDS; i++) {
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, 10000, NULL));
        slow_increment(rc);
        ASSERT_LOK(l, dlock_release(l));
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

static void t_counter(th_server *s) {
    counter_rc = th_redis(s);
    th_cmd_ok(counter_rc, "SET counter 0");
    dlock_async_client *c = client(s);
    pthread_t th[BLOCKING_THREADS];
    for (int i = 0; i < BLOCKING_THREADS; i++) pthread_create(&th[i], NULL, counter_thread, s);
    for (int i = 0; i < ASYNC_HANDLES; i++) {
        workers[i].l = alock(c, "counter-lock");
        counter_next(&workers[i]);
    }
    int all = 0;
    int64_t dl = th_now_ms() + 50000;
    while (!all) {
        ASSERT_LT(th_now_ms(), dl);
        loop_once();
        all = 1;
        for (int i = 0; i < ASYNC_HANDLES; i++) all &= workers[i].done == ROUNDS;
    }
    for (int i = 0; i < BLOCKING_THREADS; i++) pthread_join(th[i], NULL);
    char *v = th_cmd_str(counter_rc, "GET counter");
    long long total = atoll(v);
    free(v);
    th_log("counter %lld, want %d", total, (ASYNC_HANDLES + BLOCKING_THREADS) * ROUNDS);
    ASSERT_EQ(total, (ASYNC_HANDLES + BLOCKING_THREADS) * ROUNDS);
    redisFree(counter_rc);
    client_free(c);
}

/* ---- pipeline ---- */

static long long connected_clients(redisContext *rc) {
    redisReply *r = th_cmd(rc, "INFO clients");
    const char *p = strstr(r->str, "connected_clients:");
    long long n = p ? atoll(p + 18) : -1;
    freeReplyObject(r);
    return n;
}

#define MANY 300
/* calls of one command since the last CONFIG RESETSTAT (INFO commandstats) */
static long long cmd_calls(redisContext *rc, const char *cmd) {
    char *info = th_cmd_str(rc, "INFO commandstats");
    ASSERT_NOT_NULL(info);
    char key[64];
    snprintf(key, sizeof key, "cmdstat_%s:calls=", cmd);
    const char *p = strstr(info, key);
    long long n = p ? atoll(p + strlen(key)) : 0;
    free(info);
    return n;
}

static void t_pipeline(th_server *s) {
    redisContext *rc = th_redis(s);
    long long before = connected_clients(rc);
    dlock_async_client *c = client(s);
    static dlock_async_lock *l[MANY], *w[MANY];
    static res r[MANY], wr[MANY];
    char name[32];
    /* a cold script cache: the burst's first acquire goes by the script's
     * text and loads it for the rest, which go by SHA (not each answered
     * NOSCRIPT and sent again whole) */
    th_cmd_ok(rc, "SCRIPT FLUSH");
    th_cmd_ok(rc, "CONFIG RESETSTAT");
    for (int i = 0; i < MANY; i++) {
        snprintf(name, sizeof name, "p%d", i);
        l[i] = alock(c, name);
        START(dlock_async_acquire(l[i], DLOCK_NOWAIT, 20000, on_done, &r[i]));
    }
    RUN_UNTIL(calls(r, MANY) == MANY, 10000);
    for (int i = 0; i < MANY; i++) ASSERT_CODE(r[i].code, DLOCK_OK);
    th_log("a burst of %d acquires on a cold script cache: %lld EVAL, %lld EVALSHA", MANY,
           cmd_calls(rc, "eval"), cmd_calls(rc, "evalsha"));
    ASSERT_EQ(cmd_calls(rc, "eval"), 1);
    ASSERT_EQ(cmd_calls(rc, "evalsha"), MANY - 1);
    /* waiters on every name: one subscribed connection for all */
    for (int i = 0; i < MANY; i++) {
        snprintf(name, sizeof name, "p%d", i);
        w[i] = alock(c, name);
        START(dlock_async_acquire(w[i], DLOCK_WAIT_FOREVER, 20000, on_done, &wr[i]));
    }
    RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{p%d}", MANY - 1) == 1, 5000);
    run_for(100);
    ASSERT_EQ(connected_clients(rc) - before, 2);
    ASSERT_EQ(calls(wr, MANY), 0);
    /* release all: each waiter takes its lock by its wake-up */
    static res rel[MANY];
    int64_t t0 = th_now_ms();
    for (int i = 0; i < MANY; i++) START(dlock_async_release(l[i], on_done, &rel[i]));
    RUN_UNTIL(calls(wr, MANY) == MANY, 10000);
    th_log("%d waiters served in %lld ms", MANY, (long long)(th_now_ms() - t0));
    ASSERT_LT(th_now_ms() - t0, 1500);
    for (int i = 0; i < MANY; i++) {
        ASSERT_CODE(rel[i].code, DLOCK_OK);
        ASSERT_CODE(wr[i].code, DLOCK_OK);
        ASSERT_EQ(wr[i].calls, 1);
    }
    ASSERT_EQ(connected_clients(rc) - before, 2);
    redisFree(rc);
    client_free(c);
}

/* ---- reentrant ---- */

typedef struct rblocker {
    const th_server *s;
    int rounds;
    int64_t hold_ms;           /* rounds 0: hold once this long */
    atomic_int go;
    int64_t released_at;
} rblocker;

/* a blocking reentrant holder: each round takes the lock twice (a
 * re-entry), does the counter's GET ... SET, and releases twice */
static void *reentrant_thread(void *arg) {
    rblocker *b = arg;
    dlock_client *c = th_client(b->s, 0);
    dlock_lock *l = th_lock(c, "rcount", DLOCK_KIND_REENTRANT);
    redisContext *rc = th_redis(b->s);
    for (int i = 0; i < (b->rounds ? b->rounds : 1); i++) {
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, 10000, NULL));
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, 10000, NULL));
        atomic_store(&b->go, 1);
        if (b->rounds) {
            slow_increment(rc);
        } else {
            th_sleep_ms(b->hold_ms);
            b->released_at = th_now_ms();
        }
        ASSERT_LOK(l, dlock_release(l));
        ASSERT_LOK(l, dlock_release(l));
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

typedef struct rworker {
    dlock_async_lock *l;
    int done, step;
    long long seen;
} rworker;
static rworker rworkers[4];

static void rw_step(dlock_async_lock *l, int code, uint64_t f, void *ud);

static void rw_write(void *arg) {
    rworker *w = arg;
    cs_leave(w->seen);
    START(dlock_async_release(w->l, rw_step, w));
}

/* acquire, re-enter, GET, (a loop turn) SET, release, release */
static void rw_step(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)f;
    rworker *w = ud;
    ASSERT_MSG(code == DLOCK_OK, "step %d: %s", w->step, dlock_async_lock_errmsg(l));
    switch (w->step++) {
    case 0: /* held once: re-enter */
        START(dlock_async_acquire(l, DLOCK_NOWAIT, 10000, rw_step, w));
        break;
    case 1: /* held twice */
        w->seen = cs_enter();
        after(1, rw_write, w);
        break;
    case 2: /* released once: still held */
        START(dlock_async_release(l, rw_step, w));
        break;
    default: /* released */
        w->step = 0;
        if (++w->done < ROUNDS) START(dlock_async_acquire(l, DLOCK_WAIT_FOREVER, 10000, rw_step, w));
    }
}

static void t_reentrant(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_lock *a = NULL, *b = alock(c, "re");
    ASSERT_OK(dlock_async_lock_new(c, "re", DLOCK_CSTR, DLOCK_KIND_REENTRANT, &a));
    dlock_async_lock_free(b);
    ASSERT_OK(dlock_async_lock_new(c, "re", DLOCK_CSTR, DLOCK_KIND_REENTRANT, &b));
    res r[3];
    memset(r, 0, sizeof r);
    uint64_t last = 0;
    for (int i = 0; i < 3; i++) { /* a hold and two re-entries, each fenced */
        hold(a, 5000, &r[i]);
        ASSERT_U64_GT(r[i].fence, last);
        last = r[i].fence;
    }
    ASSERT_EQ(th_cmd_int(rc, "HLEN re"), 1);
    /* the owner is the handle: another handle of the same client waits */
    res rb = {0};
    START(dlock_async_acquire(b, DLOCK_NOWAIT, 5000, on_done, &rb));
    WAIT_DONE(rb, 3000);
    ASSERT_CODE(rb.code, DLOCK_EBUSY);
    memset(&rb, 0, sizeof rb);
    START(dlock_async_acquire(b, DLOCK_WAIT_FOREVER, 5000, on_done, &rb));
    for (int i = 0; i < 3; i++) {
        res rel = {0};
        START(dlock_async_release(a, on_done, &rel));
        WAIT_DONE(rel, 3000);
        ASSERT_CODE(rel.code, DLOCK_OK);
        /* still held after the first two; after the last, b may hold it */
        if (i < 2) ASSERT_EQ(th_cmd_int(rc, "EXISTS re"), 1);
        if (i < 2) ASSERT_GT(dlock_async_lock_valid_ms(a), 0);
    }
    ASSERT_EQ(dlock_async_lock_valid_ms(a), 0);
    WAIT_DONE(rb, 1000); /* woken by the unlock message */
    ASSERT_CODE(rb.code, DLOCK_OK);
    ASSERT_CODE(dlock_async_release(a, on_done, &rb), DLOCK_ENOTHELD);
    /* freed holding twice: both holds given back */
    res rb2 = {0};
    hold(b, 5000, &rb2);
    dlock_async_lock_free(b);
    RUN_UNTIL(th_cmd_int(rc, "EXISTS re") == 0, 2000);

    /* blocking reentrant holder -> async reentrant waiter, by the message */
    rblocker bh = {.s = s, .hold_ms = 300};
    pthread_t th;
    pthread_create(&th, NULL, reentrant_thread, &bh);
    while (!atomic_load(&bh.go)) th_sleep_ms(1);
    dlock_async_lock *w = NULL;
    ASSERT_OK(dlock_async_lock_new(c, "rcount", DLOCK_CSTR, DLOCK_KIND_REENTRANT, &w));
    res wr = {0};
    START(dlock_async_acquire(w, DLOCK_WAIT_FOREVER, 5000, on_done, &wr));
    WAIT_DONE(wr, 5000);
    pthread_join(th, NULL);
    ASSERT_CODE(wr.code, DLOCK_OK);
    th_log("blocking -> async reentrant handoff: %lld ms", (long long)(wr.at - bh.released_at));
    ASSERT_LT(wr.at - bh.released_at, 500);
    res wrel = {0};
    START(dlock_async_release(w, on_done, &wrel));
    WAIT_DONE(wrel, 3000);

    /* a cancelled reentrant waiter */
    res h1 = {0}, cw = {0};
    hold(w, 5000, &h1);
    dlock_async_lock *cx = NULL;
    ASSERT_OK(dlock_async_lock_new(c, "rcount", DLOCK_CSTR, DLOCK_KIND_REENTRANT, &cx));
    START(dlock_async_acquire(cx, DLOCK_WAIT_FOREVER, 5000, on_done, &cw));
    run_for(50);
    ASSERT_OK(dlock_async_cancel(cx));
    ASSERT_EQ(cw.calls, 1);
    ASSERT_CODE(cw.code, DLOCK_ECANCELED);
    memset(&wrel, 0, sizeof wrel);
    START(dlock_async_release(w, on_done, &wrel));
    WAIT_DONE(wrel, 3000);
    ASSERT_CODE(wrel.code, DLOCK_OK);
    run_for(50);
    ASSERT_EQ(cw.calls, 1);

    /* exact counter: async reentrant handles and blocking reentrant threads */
    counter_rc = rc;
    th_cmd_ok(rc, "SET counter 0");
    rblocker bt[2] = {{.s = s, .rounds = ROUNDS}, {.s = s, .rounds = ROUNDS}};
    pthread_t bth[2];
    for (int i = 0; i < 2; i++) pthread_create(&bth[i], NULL, reentrant_thread, &bt[i]);
    for (int i = 0; i < 4; i++) {
        ASSERT_OK(dlock_async_lock_new(c, "rcount", DLOCK_CSTR, DLOCK_KIND_REENTRANT,
                                       &rworkers[i].l));
        START(dlock_async_acquire(rworkers[i].l, DLOCK_WAIT_FOREVER, 10000, rw_step, &rworkers[i]));
    }
    int64_t dl = th_now_ms() + 60000;
    for (;;) {
        int all = 1;
        for (int i = 0; i < 4; i++) all &= rworkers[i].done == ROUNDS;
        if (all) break;
        ASSERT_LT(th_now_ms(), dl);
        loop_once();
    }
    for (int i = 0; i < 2; i++) pthread_join(bth[i], NULL);
    char *v = th_cmd_str(rc, "GET counter");
    th_log("reentrant counter %s, want %d", v, 6 * ROUNDS);
    ASSERT_EQ(atoll(v), 6 * ROUNDS);
    free(v);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS rcount"), 0);
    redisFree(rc);
    client_free(c);
}

int main(int argc, char **argv) {
    static const async_case cases[] = {
        {"basic", t_basic},       {"handoff", t_handoff}, {"counter", t_counter},
        {"pipeline", t_pipeline}, {"reentrant", t_reentrant}, {NULL, NULL},
    };
    return async_main(argc, argv, "async", cases);
}
