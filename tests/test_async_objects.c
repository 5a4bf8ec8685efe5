/* The async API's synchronizer objects (include/dlock_async.h: semaphore,
 * permit semaphore, countdown latch) on real event loops
 * (tests/async_loop.c) and real servers, mixed with the blocking API on
 * the same names. argv[1] is "<case>_<loop>".
 *
 *   sem      try_set, acquire, release, add, available; try-once busy, a
 *            timed wait's timeout; a wait served by a blocking release and
 *            a blocking wait served by an async release, by the message
 *            (well before the 2 s backstop); a SCRIPT FLUSH: a release is
 *            sent again by text and counted once; 20 waiters of one client
 *            on one subscription, each served once
 *   counter  exact-counter exclusion through a semaphore of 1 permit:
 *            async handles on the loop and blocking threads, each doing a
 *            non-atomic GET ... SET while holding the permit
 *   latch    await served by count-downs of the blocking API and of the
 *            async API, and a blocking await served by an async count-down;
 *            try-once and timed awaits, try_set, count; set (over a
 *            count, and to 0, which wakes an async await) seen by the
 *            blocking API, a blocking set seen by the async count
 *   permits  acquire with a lease, a waiter served by that lease's expiry
 *            (no message), release by id (twice: ENOTOWNER), renew, a blocking
 *            permit released by id through the async API and the reverse;
 *            add (up and down) seen by the blocking API and the reverse,
 *            an async waiter served by an async add
 *   cancel   cancel with a wait pending; cancel of an acquire whose request
 *            is out (the permits it took are given back); the client freed
 *            with operations of every kind pending, and from a callback:
 *            each callback once, with DLOCK_ECANCELED
 *   restart  the server killed with operations pending: each ends once
 *            with an error; a hung server's permit acquire, reported
 *            failed, is released by its id on the next connection; a hung
 *            server's release is sent again once, and its two copies are
 *            counted once */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "async_loop.h"

/* one operation's outcome */
typedef struct ores {
    int calls;
    int code;
    int64_t value;
    int64_t at;
} ores;

static void on_obj(dlock_async_object *o, int code, int64_t value, void *ud) {
    (void)o;
    ores *r = ud;
    r->calls++;
    r->code = code;
    r->value = value;
    r->at = th_now_ms();
}

#define OWAIT(r, ms) RUN_UNTIL((r).calls > 0, ms)
/* runs an operation started by expr to its end: its code */
#define RUN_OP(r, expr)                                                                       \
    do {                                                                                      \
        memset(&(r), 0, sizeof(r));                                                           \
        START(expr);                                                                          \
        ASSERT_EQ((r).calls, 0);                                                              \
        OWAIT(r, 5000);                                                                       \
        ASSERT_EQ((r).calls, 1);                                                              \
    } while (0)

static dlock_async_object *asem(dlock_async_client *c, const char *name) {
    dlock_async_object *o = NULL;
    ASSERT_MSG(dlock_async_semaphore_new(c, name, DLOCK_CSTR, &o) == DLOCK_OK, "%s",
               dlock_async_errmsg(c));
    return o;
}

static dlock_async_object *apermits(dlock_async_client *c, const char *name) {
    dlock_async_object *o = NULL;
    ASSERT_MSG(dlock_async_permits_new(c, name, DLOCK_CSTR, &o) == DLOCK_OK, "%s",
               dlock_async_errmsg(c));
    return o;
}

static dlock_async_object *alatch(dlock_async_client *c, const char *name) {
    dlock_async_object *o = NULL;
    ASSERT_MSG(dlock_async_latch_new(c, name, DLOCK_CSTR, &o) == DLOCK_OK, "%s",
               dlock_async_errmsg(c));
    return o;
}

/* the integer value of key (absent: 0) */
static long long get_int(redisContext *rc, const char *key) {
    char *v = th_cmd_str(rc, "GET %s", key);
    long long n = v ? atoll(v) : 0;
    free(v);
    return n;
}

/* the subscribers of channel reach 0 within 2 s (a closed connection is
 * seen by the server a moment later) */
static void no_subscribers(redisContext *rc, const char *channel) {
    int64_t dl = th_now_ms() + 2000;
    while (th_numsub(rc, channel) > 0) {
        ASSERT_LT(th_now_ms(), dl);
        th_sleep_ms(10);
    }
}

/* ---- sem ---- */

typedef struct bsem {
    const th_server *s;
    const char *name;
    int64_t permits;
    int rc;
    int64_t at;
    atomic_int started;
} bsem;

/* a blocking acquire of b->permits in a thread of its own (then released) */
static void *blocking_sem_acquire(void *arg) {
    bsem *b = arg;
    dlock_client *c = th_client(b->s, 0);
    dlock_semaphore *s = th_sem(c, b->name);
    atomic_store(&b->started, 1);
    b->rc = dlock_semaphore_acquire(s, b->permits, 10000);
    b->at = th_now_ms();
    if (b->rc == DLOCK_OK) ASSERT_OK(dlock_semaphore_release(s, b->permits));
    dlock_semaphore_free(s);
    dlock_client_free(c);
    return NULL;
}

static void t_sem(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_object *a = asem(c, "sem"), *b = asem(c, "sem");
    ores r, w;
    RUN_OP(r, dlock_async_semaphore_try_set(a, 2, on_obj, &r));
    ASSERT_OK(r.code);
    ASSERT_EQ(r.value, 1);
    RUN_OP(r, dlock_async_semaphore_try_set(a, 5, on_obj, &r));
    ASSERT_EQ(r.value, 0);
    ASSERT_EQ(get_int(rc, "sem"), 2); /* the blocking API's key */
    RUN_OP(r, dlock_async_semaphore_acquire(a, 1, DLOCK_NOWAIT, on_obj, &r));
    ASSERT_OK(r.code);
    ASSERT_EQ(r.value, 1);
    RUN_OP(r, dlock_async_semaphore_available(b, on_obj, &r));
    ASSERT_EQ(r.value, 1);
    /* try once: busy; a timed wait: times out, no sooner */
    RUN_OP(r, dlock_async_semaphore_acquire(b, 2, DLOCK_NOWAIT, on_obj, &r));
    ASSERT_CODE(r.code, DLOCK_EBUSY);
    ASSERT(strstr(dlock_async_object_errmsg(b), "not available"));
    int64_t t0 = th_now_ms();
    RUN_OP(r, dlock_async_semaphore_acquire(b, 2, 300, on_obj, &r));
    ASSERT_CODE(r.code, DLOCK_ETIMEDOUT);
    ASSERT_GE(r.at - t0, 290);
    ASSERT_LT(r.at - t0, 1500);
    ASSERT_EQ(get_int(rc, "sem"), 1);

    /* an async wait served by a blocking release */
    dlock_client *bc = th_client(s, 0);
    dlock_semaphore *bs = th_sem(bc, "sem");
    memset(&w, 0, sizeof w);
    START(dlock_async_semaphore_acquire(b, 2, DLOCK_WAIT_FOREVER, on_obj, &w));
    run_for(200);
    ASSERT_EQ(w.calls, 0);
    int64_t rel_at = th_now_ms();
    ASSERT_OK(dlock_semaphore_release(bs, 1));
    OWAIT(w, 3000);
    ASSERT_OK(w.code);
    ASSERT_EQ(w.value, 2);
    th_log("blocking release -> async waiter: %lld ms", (long long)(w.at - rel_at));
    ASSERT_LT(w.at - rel_at, 500); /* the message, not the backstop */
    ASSERT_EQ(th_sem_available(bs), 0);

    /* a blocking wait served by an async release */
    bsem bw = {.s = s, .name = "sem", .permits = 2};
    pthread_t th;
    pthread_create(&th, NULL, blocking_sem_acquire, &bw);
    while (!atomic_load(&bw.started)) th_sleep_ms(1);
    run_for(300);
    ASSERT_EQ(bw.at, 0);
    RUN_OP(r, dlock_async_semaphore_release(b, 2, on_obj, &r));
    ASSERT_OK(r.code);
    ASSERT_EQ(r.value, 2);
    pthread_join(th, NULL);
    ASSERT_OK(bw.rc);
    th_log("async release -> blocking waiter: %lld ms", (long long)(bw.at - r.at));
    ASSERT_LT(bw.at - r.at, 500);
    ASSERT_EQ(th_sem_available(bs), 2); /* it released them */

    /* add (negative too); a release after SCRIPT FLUSH is sent again by its
     * text and counted once */
    RUN_OP(r, dlock_async_semaphore_add(a, -1, on_obj, &r));
    ASSERT_OK(r.code);
    ASSERT_EQ(r.value, 1);
    th_cmd_ok(rc, "SCRIPT FLUSH");
    RUN_OP(r, dlock_async_semaphore_release(a, 3, on_obj, &r));
    ASSERT_OK(r.code);
    ASSERT_EQ(r.value, 4);
    ASSERT_EQ(th_sem_available(bs), 4);
    /* bad calls: refused at once, no callback */
    memset(&r, 0, sizeof r);
    ASSERT_CODE(dlock_async_semaphore_acquire(a, 0, 0, on_obj, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_semaphore_release(a, 1, NULL, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_latch_await(a, 0, on_obj, &r), DLOCK_EINVAL);
    ASSERT(strstr(dlock_async_object_errmsg(a), "kind"));
    ASSERT_CODE(dlock_async_semaphore_acquire(a, 1, -5, on_obj, &r), DLOCK_EINVAL);
    START(dlock_async_semaphore_available(a, on_obj, &r));
    ASSERT_CODE(dlock_async_semaphore_available(a, on_obj, &w), DLOCK_EINVAL); /* pending */
    OWAIT(r, 3000);
    run_for(50);
    ASSERT_EQ(r.calls, 1);
    dlock_async_object *x = NULL;
    ASSERT_CODE(dlock_async_semaphore_new(c, "", DLOCK_CSTR, &x), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_object_cancel(a), DLOCK_ENOTHELD);
    /* many waiters of one client on one semaphore: one subscription,
     * each served once by one blocking release of as many permits */
    enum { MANY = 20 };
    dlock_async_object *m[MANY];
    ores mr[MANY];
    memset(mr, 0, sizeof mr);
    for (int i = 0; i < MANY; i++) {
        m[i] = asem(c, "sem-many");
        START(dlock_async_semaphore_acquire(m[i], 1, 10000, on_obj, &mr[i]));
    }
    run_for(200);
    ASSERT_EQ(th_numsub(rc, "redisson_sc:{sem-many}"), 1);
    dlock_semaphore *bm = th_sem(bc, "sem-many");
    ASSERT_OK(dlock_semaphore_release(bm, MANY));
    int64_t dl = th_now_ms() + 3000;
    for (int done = 0; done < MANY; loop_once()) {
        ASSERT_LT(th_now_ms(), dl);
        done = 0;
        for (int i = 0; i < MANY; i++) done += mr[i].calls;
    }
    run_for(50);
    for (int i = 0; i < MANY; i++) {
        ASSERT_EQ(mr[i].calls, 1);
        ASSERT_OK(mr[i].code);
        dlock_async_object_free(m[i]);
    }
    ASSERT_EQ(get_int(rc, "sem-many"), 0);
    dlock_semaphore_free(bm);
    dlock_semaphore_free(bs);
    dlock_client_free(bc);
    dlock_async_object_free(a);
    dlock_async_object_free(b);
    redisFree(rc);
    client_free(c);
}

/* ---- counter ---- */

#define ASYNC_HANDLES 5
#define BLOCKING_THREADS 3
#define ROUNDS 20
typedef struct worker {
    dlock_async_object *o;
    int done;
    long long seen;
} worker;
static worker workers[ASYNC_HANDLES];
static redisContext *counter_rc;
static int async_in_cs;

static void counter_next(worker *w);

static void counter_released(dlock_async_object *o, int code, int64_t v, void *ud) {
    (void)v;
    ASSERT_MSG(code == DLOCK_OK, "release: %s", dlock_async_object_errmsg(o));
    worker *w = ud;
    if (++w->done < ROUNDS) counter_next(w);
}

static void counter_write(void *arg) {
    worker *w = arg;
    /* the write of a read made a loop turn ago, at least */
    th_cmd_ok(counter_rc, "SET counter %lld", w->seen + 1);
    async_in_cs--;
    START(dlock_async_semaphore_release(w->o, 1, counter_released, w));
}

static void counter_got(dlock_async_object *o, int code, int64_t v, void *ud) {
    (void)v;
    worker *w = ud;
    ASSERT_MSG(code == DLOCK_OK, "acquire: %s", dlock_async_object_errmsg(o));
    ASSERT_EQ(async_in_cs, 0);
    async_in_cs++;
    char *s = th_cmd_str(counter_rc, "GET counter");
    w->seen = s ? atoll(s) : 0;
    free(s);
    after(1, counter_write, w);
}

static void counter_next(worker *w) {
    START(dlock_async_semaphore_acquire(w->o, 1, DLOCK_WAIT_FOREVER, counter_got, w));
}

static void *counter_thread(void *arg) {
    const th_server *s = arg;
    dlock_client *c = th_client(s, 0);
    dlock_semaphore *sem = th_sem(c, "counter-sem");
    redisContext *rc = th_redis(s);
    for (int i = 0; i < ROUNDS; i++) {
        ASSERT_OK(dlock_semaphore_acquire(sem, 1, DLOCK_WAIT_FOREVER));
        char *v = th_cmd_str(rc, "GET counter");
        long long n = v ? atoll(v) : 0;
        free(v);
        usleep(1000);
        th_cmd_ok(rc, "SET counter %lld", n + 1);
        ASSERT_OK(dlock_semaphore_release(sem, 1));
    }
    redisFree(rc);
    dlock_semaphore_free(sem);
    dlock_client_free(c);
    return NULL;
}

static void t_counter(th_server *s) {
    counter_rc = th_redis(s);
    th_cmd_ok(counter_rc, "SET counter 0");
    th_cmd_ok(counter_rc, "SET counter-sem 1");
    dlock_async_client *c = client(s);
    pthread_t th[BLOCKING_THREADS];
    for (int i = 0; i < BLOCKING_THREADS; i++) pthread_create(&th[i], NULL, counter_thread, s);
    for (int i = 0; i < ASYNC_HANDLES; i++) {
        workers[i].o = asem(c, "counter-sem");
        counter_next(&workers[i]);
    }
    int all = 0;
    int64_t dl = th_now_ms() + 15000;
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
    ASSERT_EQ(get_int(counter_rc, "counter-sem"), 1); /* every permit back */
    redisFree(counter_rc);
    client_free(c);
}

/* ---- latch ---- */

typedef struct blatch {
    const th_server *s;
    int rc;
    int64_t at;
    atomic_int started;
} blatch;

static void *blocking_await(void *arg) {
    blatch *b = arg;
    dlock_client *c = th_client(b->s, 0);
    dlock_latch *l = NULL;
    ASSERT_OK(dlock_latch_new(c, "latch", DLOCK_CSTR, &l));
    atomic_store(&b->started, 1);
    b->rc = dlock_latch_await(l, 10000);
    b->at = th_now_ms();
    dlock_latch_free(l);
    dlock_client_free(c);
    return NULL;
}

static void t_latch(th_server *s) {
    dlock_async_client *c = client(s);
    dlock_async_object *a = alatch(c, "latch"), *w = alatch(c, "latch");
    ores r, wr;
    /* absent: at zero */
    RUN_OP(r, dlock_async_latch_await(w, DLOCK_NOWAIT, on_obj, &r));
    ASSERT_OK(r.code);
    RUN_OP(r, dlock_async_latch_try_set(a, 3, on_obj, &r));
    ASSERT_EQ(r.value, 1);
    RUN_OP(r, dlock_async_latch_try_set(a, 9, on_obj, &r));
    ASSERT_EQ(r.value, 0);
    RUN_OP(r, dlock_async_latch_count(a, on_obj, &r));
    ASSERT_EQ(r.value, 3);
    RUN_OP(r, dlock_async_latch_await(w, DLOCK_NOWAIT, on_obj, &r));
    ASSERT_CODE(r.code, DLOCK_ETIMEDOUT);
    ASSERT(strstr(dlock_async_object_errmsg(w), "count 3"));
    int64_t t0 = th_now_ms();
    RUN_OP(r, dlock_async_latch_await(w, 250, on_obj, &r));
    ASSERT_CODE(r.code, DLOCK_ETIMEDOUT);
    ASSERT_GE(r.at - t0, 240);
    ASSERT_LT(r.at - t0, 1500);

    /* an async await served by count-downs: blocking, then async */
    dlock_client *bc = th_client(s, 0);
    dlock_latch *bl = NULL;
    ASSERT_OK(dlock_latch_new(bc, "latch", DLOCK_CSTR, &bl));
    memset(&wr, 0, sizeof wr);
    START(dlock_async_latch_await(w, DLOCK_WAIT_FOREVER, on_obj, &wr));
    run_for(100);
    ASSERT_OK(dlock_latch_count_down(bl, 1));
    run_for(200);
    ASSERT_EQ(wr.calls, 0);
    RUN_OP(r, dlock_async_latch_count_down(a, 1, on_obj, &r));
    ASSERT_EQ(r.value, 1);
    run_for(200);
    ASSERT_EQ(wr.calls, 0);
    int64_t cd_at = th_now_ms();
    ASSERT_OK(dlock_latch_count_down(bl, 1)); /* the blocking one reaches zero */
    OWAIT(wr, 3000);
    ASSERT_OK(wr.code);
    ASSERT_LT(wr.at - cd_at, 500);
    /* again, the async count-down reaching zero */
    RUN_OP(r, dlock_async_latch_try_set(a, 2, on_obj, &r));
    ASSERT_EQ(r.value, 1);
    memset(&wr, 0, sizeof wr);
    START(dlock_async_latch_await(w, 10000, on_obj, &wr));
    run_for(200);
    ASSERT_EQ(wr.calls, 0);
    RUN_OP(r, dlock_async_latch_count_down(a, 5, on_obj, &r)); /* not below zero */
    ASSERT_EQ(r.value, 0);
    OWAIT(wr, 500);
    ASSERT_OK(wr.code);
    int64_t n = -1;
    ASSERT_OK(dlock_latch_count(bl, &n));
    ASSERT_EQ(n, 0);

    /* a blocking await served by an async count-down */
    RUN_OP(r, dlock_async_latch_try_set(a, 1, on_obj, &r));
    blatch b = {.s = s};
    pthread_t th;
    pthread_create(&th, NULL, blocking_await, &b);
    while (!atomic_load(&b.started)) th_sleep_ms(1);
    run_for(300);
    ASSERT_EQ(b.at, 0);
    RUN_OP(r, dlock_async_latch_count_down(a, 1, on_obj, &r));
    pthread_join(th, NULL);
    ASSERT_OK(b.rc);
    th_log("async count-down -> blocking await: %lld ms", (long long)(b.at - r.at));
    ASSERT_LT(b.at - r.at, 500);

    /* set: over a count (try_set would refuse), seen by the blocking API;
     * to 0, which wakes an async await at once */
    RUN_OP(r, dlock_async_latch_set(a, 4, on_obj, &r));
    ASSERT_OK(r.code);
    ASSERT_EQ(r.value, 4);
    ASSERT_OK(dlock_latch_count(bl, &n));
    ASSERT_EQ(n, 4);
    RUN_OP(r, dlock_async_latch_set(a, 7, on_obj, &r));
    ASSERT_OK(r.code);
    ASSERT_OK(dlock_latch_count(bl, &n));
    ASSERT_EQ(n, 7);
    memset(&wr, 0, sizeof wr);
    START(dlock_async_latch_await(w, 10000, on_obj, &wr));
    run_for(200);
    ASSERT_EQ(wr.calls, 0);
    RUN_OP(r, dlock_async_latch_set(a, 0, on_obj, &r));
    ASSERT_OK(r.code);
    ASSERT_EQ(r.value, 0);
    OWAIT(wr, 1000);
    ASSERT_OK(wr.code);
    ASSERT_LT(wr.at - r.at, 500);
    ASSERT_OK(dlock_latch_count(bl, &n));
    ASSERT_EQ(n, 0);
    ASSERT_OK(dlock_latch_set(bl, 2)); /* the blocking set, read by the async API */
    RUN_OP(r, dlock_async_latch_count(a, on_obj, &r));
    ASSERT_EQ(r.value, 2);
    memset(&r, 0, sizeof r);
    ASSERT_CODE(dlock_async_latch_set(a, -1, on_obj, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_permits_add(a, 1, on_obj, &r), DLOCK_EINVAL); /* not a permit one */
    ASSERT_EQ(r.calls, 0);
    dlock_latch_free(bl);
    dlock_client_free(bc);
    client_free(c); /* frees the handles */
}

/* ---- permits ---- */

static void t_permits(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_object *a = apermits(c, "pm"), *b = apermits(c, "pm");
    ores r, w;
    RUN_OP(r, dlock_async_permits_try_set(a, 1, on_obj, &r));
    ASSERT_EQ(r.value, 1);
    RUN_OP(r, dlock_async_permits_acquire(a, DLOCK_NOWAIT, 400, on_obj, &r));
    ASSERT_OK(r.code);
    char id1[DLOCK_PERMIT_ID_LEN + 1];
    snprintf(id1, sizeof id1, "%s", dlock_async_permits_id(a));
    ASSERT_EQ((long long)strlen(id1), DLOCK_PERMIT_ID_LEN);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {pm}:timeout"), 1);
    RUN_OP(r, dlock_async_permits_acquire(b, DLOCK_NOWAIT, 400, on_obj, &r));
    ASSERT_CODE(r.code, DLOCK_EBUSY);
    ASSERT_EQ(dlock_async_permits_id(b)[0], '\0');
    /* a waiter served by the lease's end: no message, the expiry's timer */
    RUN_OP(w, dlock_async_permits_acquire(b, 3000, 5000, on_obj, &w));
    ASSERT_OK(w.code);
    th_log("waiter served %lld ms after the first acquire (lease 400 ms)",
           (long long)(w.at - r.at));
    ASSERT_LT(w.at - r.at, 1200); /* not the 2 s backstop */
    char id2[DLOCK_PERMIT_ID_LEN + 1];
    snprintf(id2, sizeof id2, "%s", dlock_async_permits_id(b));
    ASSERT(strcmp(id1, id2) != 0);
    /* the expired permit is no longer out: ENOTOWNER; the live one released */
    RUN_OP(r, dlock_async_permits_release(a, id1, on_obj, &r));
    ASSERT_CODE(r.code, DLOCK_ENOTOWNER);
    ASSERT(strstr(dlock_async_object_errmsg(a), id1));
    RUN_OP(r, dlock_async_permits_release(a, id2, on_obj, &r)); /* any handle, by id */
    ASSERT_OK(r.code);
    RUN_OP(r, dlock_async_permits_release(a, id2, on_obj, &r));
    ASSERT_CODE(r.code, DLOCK_ENOTOWNER);
    RUN_OP(r, dlock_async_permits_available(b, on_obj, &r));
    ASSERT_EQ(r.value, 1);
    /* renew: a 300 ms lease made 5 s outlives its first end; an expired
     * permit's renewal is ENOTOWNER */
    RUN_OP(r, dlock_async_permits_acquire(a, DLOCK_NOWAIT, 300, on_obj, &r));
    ASSERT_OK(r.code);
    char id3[DLOCK_PERMIT_ID_LEN + 1];
    snprintf(id3, sizeof id3, "%s", dlock_async_permits_id(a));
    RUN_OP(r, dlock_async_permits_renew(b, id3, 5000, on_obj, &r));
    ASSERT_OK(r.code);
    run_for(500);
    RUN_OP(r, dlock_async_permits_available(b, on_obj, &r)); /* reclaims expired ones */
    ASSERT_EQ(r.value, 0);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {pm}:timeout"), 1);
    RUN_OP(r, dlock_async_permits_renew(b, id1, 5000, on_obj, &r));
    ASSERT_CODE(r.code, DLOCK_ENOTOWNER);
    RUN_OP(r, dlock_async_permits_release(b, id3, on_obj, &r));
    ASSERT_OK(r.code);
    memset(&r, 0, sizeof r);
    ASSERT_CODE(dlock_async_permits_renew(b, id3, 0, on_obj, &r), DLOCK_EINVAL);

    /* blocking acquire, async release by its id; an async waiter served by
     * a blocking release */
    dlock_client *bc = th_client(s, 0);
    dlock_permits *bp = NULL;
    ASSERT_OK(dlock_permits_new(bc, "pm", DLOCK_CSTR, &bp));
    char bid[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_OK(dlock_permits_acquire(bp, DLOCK_NOWAIT, 20000, bid));
    memset(&w, 0, sizeof w);
    START(dlock_async_permits_acquire(b, DLOCK_WAIT_FOREVER, 20000, on_obj, &w));
    run_for(200);
    ASSERT_EQ(w.calls, 0);
    int64_t t0 = th_now_ms();
    ASSERT_OK(dlock_permits_release(bp, bid));
    OWAIT(w, 3000);
    ASSERT_OK(w.code);
    ASSERT_LT(w.at - t0, 500);
    ASSERT_CODE(dlock_permits_release(bp, bid), DLOCK_ENOTOWNER);
    snprintf(id2, sizeof id2, "%s", dlock_async_permits_id(b));
    ASSERT_OK(dlock_permits_release(bp, id2)); /* the async permit, by the blocking API */
    ASSERT_OK(dlock_permits_acquire(bp, DLOCK_NOWAIT, 20000, bid));
    RUN_OP(r, dlock_async_permits_release(a, bid, on_obj, &r));
    ASSERT_OK(r.code);
    int64_t av = 0;
    ASSERT_OK(dlock_permits_available(bp, &av));
    ASSERT_EQ(av, 1);

    /* add: up and down, seen by the blocking API; the blocking add seen by
     * the async API; an async waiter served by an async add */
    RUN_OP(r, dlock_async_permits_add(a, 3, on_obj, &r));
    ASSERT_OK(r.code);
    ASSERT_EQ(r.value, 4);
    ASSERT_OK(dlock_permits_available(bp, &av));
    ASSERT_EQ(av, 4);
    RUN_OP(r, dlock_async_permits_add(a, -4, on_obj, &r));
    ASSERT_EQ(r.value, 0);
    ASSERT_OK(dlock_permits_available(bp, &av));
    ASSERT_EQ(av, 0);
    ASSERT_OK(dlock_permits_add(bp, 2));
    RUN_OP(r, dlock_async_permits_available(a, on_obj, &r));
    ASSERT_EQ(r.value, 2);
    RUN_OP(r, dlock_async_permits_add(a, -2, on_obj, &r));
    ASSERT_EQ(r.value, 0);
    memset(&w, 0, sizeof w);
    START(dlock_async_permits_acquire(b, 5000, 20000, on_obj, &w));
    run_for(200);
    ASSERT_EQ(w.calls, 0);
    RUN_OP(r, dlock_async_permits_add(a, 1, on_obj, &r));
    ASSERT_EQ(r.value, 1);
    OWAIT(w, 3000);
    ASSERT_OK(w.code);
    ASSERT_LT(w.at - r.at, 500);
    ASSERT_OK(dlock_permits_available(bp, &av));
    ASSERT_EQ(av, 0);

    memset(&r, 0, sizeof r);
    ASSERT_CODE(dlock_async_permits_release(a, "xyz", on_obj, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_permits_acquire(a, 0, -5, on_obj, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_permits_add(a, DLOCK_COUNT_MAX + 1, on_obj, &r), DLOCK_EINVAL);
    ASSERT_EQ(r.calls, 0);
    dlock_permits_free(bp);
    dlock_client_free(bc);
    redisFree(rc);
    client_free(c);
}

/* ---- cancel and free ---- */

static dlock_async_client *freeing;

/* a callback that frees its client */
static void free_client_cb(dlock_async_object *o, int code, int64_t v, void *ud) {
    on_obj(o, code, v, ud);
    forget(freeing);
    dlock_async_client_free(freeing);
}

static void t_cancel(th_server *s) {
    redisContext *rc = th_redis(s);
    th_cmd_ok(rc, "SET cs 0");
    dlock_async_client *c = client(s);
    dlock_async_object *a = asem(c, "cs");
    ores r;
    /* a wait, cancelled: its callback before cancel returns */
    memset(&r, 0, sizeof r);
    START(dlock_async_semaphore_acquire(a, 1, DLOCK_WAIT_FOREVER, on_obj, &r));
    run_for(200);
    ASSERT_OK(dlock_async_object_cancel(a));
    ASSERT_EQ(r.calls, 1);
    ASSERT_CODE(r.code, DLOCK_ECANCELED);
    ASSERT(strstr(dlock_async_object_errmsg(a), "cancelled"));
    ASSERT_CODE(dlock_async_object_cancel(a), DLOCK_ENOTHELD);
    run_for(100);
    ASSERT_EQ(r.calls, 1);
    ASSERT_EQ(th_numsub(rc, "redisson_sc:{cs}"), 0); /* it left the channel */

    /* cancelled while its request is out: the permits it took come back */
    th_cmd_ok(rc, "SET cs 2");
    RUN_OP(r, dlock_async_semaphore_available(a, on_obj, &r)); /* connection up */
    memset(&r, 0, sizeof r);
    START(dlock_async_semaphore_acquire(a, 2, DLOCK_NOWAIT, on_obj, &r));
    ASSERT_OK(dlock_async_object_cancel(a));
    ASSERT_CODE(r.code, DLOCK_ECANCELED);
    run_for(300);
    ASSERT_EQ(get_int(rc, "cs"), 2);
    /* the same for a permit: released by its id */
    dlock_async_object *p = apermits(c, "cp");
    RUN_OP(r, dlock_async_permits_try_set(p, 1, on_obj, &r));
    memset(&r, 0, sizeof r);
    START(dlock_async_permits_acquire(p, DLOCK_NOWAIT, 30000, on_obj, &r));
    ASSERT_OK(dlock_async_object_cancel(p));
    ASSERT_CODE(r.code, DLOCK_ECANCELED);
    run_for(300);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {cp}:timeout"), 0);
    ASSERT_EQ(get_int(rc, "cp"), 1);
    /* a freed handle's operation ends once too */
    dlock_async_object *f = asem(c, "cs");
    memset(&r, 0, sizeof r);
    START(dlock_async_semaphore_acquire(f, 5, 20000, on_obj, &r));
    dlock_async_object_free(f);
    ASSERT_EQ(r.calls, 1);
    ASSERT_CODE(r.code, DLOCK_ECANCELED);

    /* the client freed with operations of every kind pending */
    enum { N = 6 };
    dlock_async_object *o[N] = {asem(c, "cs"),      asem(c, "cs"),     apermits(c, "cp"),
                                alatch(c, "cl"),    alatch(c, "cl"),   asem(c, "cs")};
    ores rs[N];
    memset(rs, 0, sizeof rs);
    th_cmd_ok(rc, "SET cl 1");
    RUN_OP(r, dlock_async_permits_acquire(p, DLOCK_NOWAIT, 30000, on_obj, &r)); /* none left */
    START(dlock_async_semaphore_acquire(o[0], 3, DLOCK_WAIT_FOREVER, on_obj, &rs[0]));
    START(dlock_async_semaphore_acquire(o[1], 3, 20000, on_obj, &rs[1]));
    START(dlock_async_permits_acquire(o[2], DLOCK_WAIT_FOREVER, 1000, on_obj, &rs[2]));
    START(dlock_async_latch_await(o[3], DLOCK_WAIT_FOREVER, on_obj, &rs[3]));
    START(dlock_async_latch_await(o[4], 20000, on_obj, &rs[4]));
    run_for(200); /* every one waiting */
    for (int i = 0; i < N - 1; i++) ASSERT_EQ(rs[i].calls, 0);
    START(dlock_async_semaphore_release(o[5], 1, on_obj, &rs[5])); /* its request out */
    forget(c);
    dlock_async_client_free(c);
    for (int i = 0; i < 3; i++) loop_once();
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(rs[i].calls, 1);
        ASSERT_CODE(rs[i].code, DLOCK_ECANCELED);
    }
    no_subscribers(rc, "redisson_sc:{cs}");
    no_subscribers(rc, "redisson_countdownlatch__channel__{cl}");

    /* the client freed from an object's callback (a cancel's), with other
     * operations pending: each ends once. (The release above was out when
     * the client was freed: what the socket took of it may have been
     * applied; the count is set again.) */
    th_cmd_ok(rc, "SET cs 2");
    c = client(s);
    freeing = c;
    dlock_async_object *f1 = asem(c, "cs"), *f2 = alatch(c, "cl"), *f3 = asem(c, "cs");
    ores fr[3];
    memset(fr, 0, sizeof fr);
    START(dlock_async_semaphore_acquire(f1, 3, DLOCK_WAIT_FOREVER, free_client_cb, &fr[0]));
    START(dlock_async_latch_await(f2, DLOCK_WAIT_FOREVER, on_obj, &fr[1]));
    START(dlock_async_semaphore_acquire(f3, 3, 20000, on_obj, &fr[2]));
    run_for(200);
    ASSERT_EQ(fr[0].calls + fr[1].calls + fr[2].calls, 0);
    ASSERT_OK(dlock_async_object_cancel(f1));
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(fr[i].calls, 1);
        ASSERT_CODE(fr[i].code, DLOCK_ECANCELED);
    }
    for (int i = 0; i < 3; i++) loop_once(); /* the adapter's handles close */
    ASSERT_EQ(get_int(rc, "cs"), 2);
    redisFree(rc);
}

/* ---- restart ---- */

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

static void t_restart(th_server *s) {
    redisContext *rc = th_redis(s);
    th_cmd_ok(rc, "SET rs 0");
    th_cmd_ok(rc, "SET rl 1");
    dlock_async_client *c = client(s);
    dlock_async_object *sem = asem(c, "rs"), *sem2 = asem(c, "rs"), *pm = apermits(c, "rp"),
                       *la = alatch(c, "rl");
    ores r, rs[4];
    memset(rs, 0, sizeof rs);
    RUN_OP(r, dlock_async_permits_try_set(pm, 0, on_obj, &r));
    START(dlock_async_semaphore_acquire(sem, 1, DLOCK_WAIT_FOREVER, on_obj, &rs[0]));
    START(dlock_async_permits_acquire(pm, 30000, 5000, on_obj, &rs[1]));
    START(dlock_async_latch_await(la, DLOCK_WAIT_FOREVER, on_obj, &rs[2]));
    run_for(200);
    START(dlock_async_semaphore_available(sem2, on_obj, &rs[3]));
    redisFree(rc);
    th_server_halt(s, SIGKILL);
    RUN_UNTIL(rs[0].calls + rs[1].calls + rs[2].calls + rs[3].calls == 4, 5000);
    run_for(300);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(rs[i].calls, 1);
        ASSERT_MSG(rs[i].code == DLOCK_EIO, "op %d: %s", i, dlock_strerror(rs[i].code));
    }
    th_log("waiter's message: %s", dlock_async_object_errmsg(sem));
    /* while it is down: a release fails clearly (sent once more, refused) */
    memset(&r, 0, sizeof r);
    int rc2 = dlock_async_semaphore_release(sem, 1, on_obj, &r);
    if (rc2 == DLOCK_OK) {
        OWAIT(r, 3000);
        rc2 = r.code;
    }
    ASSERT_CODE(rc2, DLOCK_EIO);
    th_server_resume(s);
    rc = th_redis(s);
    /* it works again */
    th_cmd_ok(rc, "SET rs 1");
    RUN_OP(r, dlock_async_semaphore_acquire(sem, 1, 3000, on_obj, &r));
    ASSERT_MSG(r.code == DLOCK_OK, "after restart: %s", dlock_async_object_errmsg(sem));
    /* a hung server: the permit acquire it runs after its thaw, reported
     * failed, is released by its id once a connection is up again */
    RUN_OP(r, dlock_async_permits_try_set(pm, 1, on_obj, &r));
    RUN_OP(r, dlock_async_permits_available(pm, on_obj, &r)); /* the scripts loaded */
    th_server_pause(s);
    int64_t t1 = th_now_ms();
    ores hung;
    RUN_OP(hung, dlock_async_permits_acquire(pm, DLOCK_NOWAIT, 30000, on_obj, &hung));
    ASSERT_CODE(hung.code, DLOCK_EIO);
    ASSERT_GE(hung.at - t1, 1900);
    th_server_unpause(s);
    RUN_UNTIL(th_cmd_int(rc, "ZCARD {rp}:timeout") == 1, 2000); /* it ran */
    ASSERT_EQ(get_int(rc, "rp"), 0);
    RUN_OP(r, dlock_async_permits_available(pm, on_obj, &r)); /* the release went first */
    ASSERT_OK(r.code);
    ASSERT_EQ(r.value, 1);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {rp}:timeout"), 0);

    /* a release whose reply is lost (a hung server) is sent again once on a
     * new connection, with the same change id: when the thawed server runs
     * both copies, it counts one */
    RUN_OP(r, dlock_async_semaphore_release(sem, 1, on_obj, &r)); /* the script loaded */
    ASSERT_EQ(r.value, 1);
    th_cmd_ok(rc, "CONFIG RESETSTAT");
    th_server_pause(s);
    t1 = th_now_ms();
    memset(&hung, 0, sizeof hung);
    START(dlock_async_semaphore_release(sem, 1, on_obj, &hung));
    OWAIT(hung, 8000);
    ASSERT_CODE(hung.code, DLOCK_EIO);
    th_log("release on a hung server: %s after %lld ms", dlock_async_object_errmsg(sem),
           (long long)(hung.at - t1));
    ASSERT_GE(hung.at - t1, 3900); /* two copies, a deadline each */
    th_server_unpause(s);
    redisFree(rc);
    rc = th_redis(s);
    long long copies = 0;
    for (int64_t dl = th_now_ms() + 2000; copies < 2 && th_now_ms() < dl; th_sleep_ms(10))
        copies = cmd_calls(rc, "evalsha") + cmd_calls(rc, "eval");
    th_log("copies of the release run: %lld", copies);
    ASSERT_EQ(copies, 2);
    ASSERT_EQ(get_int(rc, "rs"), 2); /* 1 + 1, counted once */
    redisFree(rc);
    client_free(c);
}

int main(int argc, char **argv) {
    static const async_case cases[] = {
        {"sem", t_sem},       {"counter", t_counter}, {"latch", t_latch},
        {"permits", t_permits}, {"cancel", t_cancel}, {"restart", t_restart},
        {NULL, NULL},
    };
    return async_main(argc, argv, "async_objects", cases);
}
