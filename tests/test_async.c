/* The async API (include/dlock_async.h) on real event loops and real
 * servers. argv[1] is "<case>_<loop>": the loop is libuv ("uv"), libevent
 * ("event") or the bare interface driven by poll(2) ("bare"); a loop whose
 * library was not found at build time skips.
 *
 *   basic    try, timed and forever waits, release, extend, ELOST, fences
 *   handoff  a chain of async waiters on one name, one holder at a time;
 *            handoff from a blocking holder to an async waiter and back,
 *            by the release's wake-up (well before the 2 s backstop)
 *   counter  exact-counter exclusion: async handles on the loop and
 *            blocking clients in threads, mixed on one name, each doing a
 *            non-atomic GET ... SET under the lock across loop turns
 *   pipeline many acquires in flight on one connection, many waiters on
 *            one subscribed connection (the server's client count)
 *   cancel   cancel and free with operations pending: each callback once,
 *            nothing left in the waiter registry, a wake passed on
 *   restart  the server killed with operations pending: each ends once
 *            with an error; after its restart the client works again
 *   badinput distinct codes for bad arguments, URLs, kinds and leases;
 *            AUTH refused and accepted; unix:// */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock_async.h"
#include "harness.h"

#ifdef DLOCK_TEST_HAVE_UV
#include "dlock_async_libuv.h"
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
#include "dlock_async_libevent.h"
#endif

/* ---- the loop under test ---- */

enum { LOOP_UV, LOOP_EVENT, LOOP_BARE };
static int loop_kind;
static dlock_async_client *bare_clients[64];
static int nbare;
#ifdef DLOCK_TEST_HAVE_UV
static uv_loop_t uvl;
static uv_timer_t uv_guard;
static void uv_noop(uv_timer_t *t) { (void)t; }
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
static struct event_base *evb;
static struct event *ev_guard;
static void ev_noop(evutil_socket_t fd, short w, void *a) { (void)fd, (void)w, (void)a; }
#endif

/* the test's own timers: run after each loop turn */
typedef struct ttimer {
    int64_t at;
    void (*fn)(void *);
    void *arg;
} ttimer;
static ttimer timers[4096];
static int ntimers;

static void after(int64_t ms, void (*fn)(void *), void *arg) {
    ASSERT(ntimers < (int)(sizeof timers / sizeof timers[0]));
    timers[ntimers++] = (ttimer){th_now_ms() + ms, fn, arg};
}

static void loop_init(void) {
#ifdef DLOCK_TEST_HAVE_UV
    if (loop_kind == LOOP_UV) {
        ASSERT(uv_loop_init(&uvl) == 0);
        uv_timer_init(&uvl, &uv_guard);
        uv_timer_start(&uv_guard, uv_noop, 5, 5);
    }
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
    if (loop_kind == LOOP_EVENT) {
        evb = event_base_new();
        ASSERT(evb);
        ev_guard = event_new(evb, -1, EV_PERSIST, ev_noop, NULL);
        struct timeval tv = {0, 5000};
        event_add(ev_guard, &tv);
    }
#endif
}

static void loop_once(void) {
#ifdef DLOCK_TEST_HAVE_UV
    if (loop_kind == LOOP_UV) uv_run(&uvl, UV_RUN_ONCE);
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
    if (loop_kind == LOOP_EVENT) event_base_loop(evb, EVLOOP_ONCE);
#endif
    if (loop_kind == LOOP_BARE) {
        struct pollfd p[16];
        dlock_async_client *owner[16];
        int n = 0;
        int64_t wait = 5;
        for (int i = 0; i < nbare; i++) {
            if (!bare_clients[i]) continue;
            dlock_async_pollfd f[DLOCK_ASYNC_SLOTS];
            int k = dlock_async_fds(bare_clients[i], f);
            for (int j = 0; j < k; j++) {
                p[n].fd = f[j].fd;
                p[n].events = (short)(((f[j].events & DLOCK_ASYNC_READ) ? POLLIN : 0) |
                                      ((f[j].events & DLOCK_ASYNC_WRITE) ? POLLOUT : 0));
                p[n].revents = 0;
                owner[n++] = bare_clients[i];
            }
            int64_t t = dlock_async_timeout(bare_clients[i]);
            if (t >= 0 && t < wait) wait = t;
        }
        poll(p, (nfds_t)n, (int)wait);
        for (int i = 0; i < n; i++) {
            if (!p[i].revents) continue;
            /* a callback of an earlier fd may have freed its client */
            int live = 0;
            for (int j = 0; j < nbare; j++) live |= bare_clients[j] == owner[i];
            if (!live) continue;
            int ev = ((p[i].revents & (POLLIN | POLLERR | POLLHUP)) ? DLOCK_ASYNC_READ : 0) |
                     ((p[i].revents & POLLOUT) ? DLOCK_ASYNC_WRITE : 0);
            dlock_async_process(owner[i], p[i].fd, ev);
        }
        for (int i = 0; i < nbare; i++)
            if (bare_clients[i] && dlock_async_timeout(bare_clients[i]) == 0)
                dlock_async_process(bare_clients[i], -1, 0);
    }
    int64_t now = th_now_ms();
    for (int i = 0; i < ntimers;) {
        if (timers[i].at > now) {
            i++;
            continue;
        }
        ttimer t = timers[i];
        timers[i] = timers[--ntimers];
        t.fn(t.arg);
    }
}

#define RUN_UNTIL(cond, ms)                                                              \
    do {                                                                                 \
        int64_t ru_dl_ = th_now_ms() + (ms);                                             \
        while (!(cond)) {                                                                \
            if (th_now_ms() > ru_dl_)                                                    \
                th_fail(__FILE__, __LINE__, "not true within %d ms: %s", (int)(ms), #cond); \
            loop_once();                                                                 \
        }                                                                                \
    } while (0)

static void run_for(int64_t ms) {
    int64_t until = th_now_ms() + ms;
    while (th_now_ms() < until) loop_once();
}

static int client_new(const char *url, const char *password, dlock_async_client **out) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.password = password;
    o.command_timeout_ms = 2000;
    o.connect_timeout_ms = 1000;
    int rc = DLOCK_EINVAL;
#ifdef DLOCK_TEST_HAVE_UV
    if (loop_kind == LOOP_UV) rc = dlock_async_uv_client_new(&o, &uvl, out);
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
    if (loop_kind == LOOP_EVENT) rc = dlock_async_event_client_new(&o, evb, out);
#endif
    if (loop_kind == LOOP_BARE) {
        rc = dlock_async_client_new(&o, NULL, out);
        if (*out) {
            ASSERT(nbare < (int)(sizeof bare_clients / sizeof *bare_clients));
            bare_clients[nbare++] = *out;
        }
    }
    return rc;
}

static dlock_async_client *client(const th_server *s) {
    dlock_async_client *c = NULL;
    int rc = client_new(th_server_url(s), NULL, &c);
    ASSERT_MSG(rc == DLOCK_OK, "client: %s", dlock_async_errmsg(c));
    return c;
}

static void forget(dlock_async_client *c);

static void client_free(dlock_async_client *c) {
    forget(c);
    dlock_async_client_free(c);
    /* let the adapter's handles close */
    for (int i = 0; i < 3; i++) loop_once();
}

static dlock_async_lock *alock(dlock_async_client *c, const char *name) {
    dlock_async_lock *l = NULL;
    int rc = dlock_async_lock_new(c, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l);
    ASSERT_MSG(rc == DLOCK_OK, "lock_new: %s", dlock_async_errmsg(c));
    return l;
}

/* one operation's outcome */
typedef struct res {
    int calls;     /* how many times the callback ran */
    int code;
    uint64_t fence;
    int64_t at;    /* when (th_now_ms) */
} res;

static void on_done(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    (void)l;
    res *r = ud;
    r->calls++;
    r->code = code;
    r->fence = fence;
    r->at = th_now_ms();
}

static int calls(const res *r, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += r[i].calls;
    return k;
}

#define START(expr) ASSERT_CODE(expr, DLOCK_OK)
#define WAIT_DONE(r, ms) RUN_UNTIL((r).calls > 0, ms)

/* try-once acquire of l, which must succeed */
static void hold(dlock_async_lock *l, int64_t lease_ms, res *r) {
    START(dlock_async_acquire(l, DLOCK_NOWAIT, lease_ms, on_done, r));
    WAIT_DONE(*r, 3000);
    ASSERT_MSG(r->code == DLOCK_OK, "hold: %s", dlock_async_lock_errmsg(l));
}

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

typedef struct blocker {
    const th_server *s;
    const char *name;
    int64_t hold_ms;     /* acquire at once, hold this long, release */
    int64_t released_at, acquired_at;
    atomic_int go;         /* set once it holds (its times are read after the join) */
} blocker;

static void *blocking_holder(void *arg) {
    blocker *b = arg;
    dlock_client *c = th_client(b->s, 0);
    dlock_lock *l = th_lock(c, b->name, DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, 10000, NULL));
    b->acquired_at = th_now_ms();
    atomic_store(&b->go, 1);
    th_sleep_ms(b->hold_ms);
    b->released_at = th_now_ms();
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
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

static void counter_released(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)l, (void)f;
    ASSERT_CODE(code, DLOCK_OK);
    worker *w = ud;
    if (++w->done < ROUNDS) counter_next(w);
}

static void counter_write(void *arg) {
    worker *w = arg;
    /* the write of a read made a loop turn ago, at least */
    th_cmd_ok(counter_rc, "SET counter %lld", w->seen + 1);
    async_in_cs--;
    START(dlock_async_release(w->l, counter_released, w));
}

static void counter_got(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)l, (void)f;
    worker *w = ud;
    ASSERT_MSG(code == DLOCK_OK, "acquire: %s", dlock_async_lock_errmsg(l));
    ASSERT_EQ(async_in_cs, 0);
    async_in_cs++;
    char *v = th_cmd_str(counter_rc, "GET counter");
    w->seen = v ? atoll(v) : 0;
    free(v);
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
static void t_pipeline(th_server *s) {
    redisContext *rc = th_redis(s);
    long long before = connected_clients(rc);
    dlock_async_client *c = client(s);
    static dlock_async_lock *l[MANY], *w[MANY];
    static res r[MANY], wr[MANY];
    char name[32];
    for (int i = 0; i < MANY; i++) {
        snprintf(name, sizeof name, "p%d", i);
        l[i] = alock(c, name);
        START(dlock_async_acquire(l[i], DLOCK_NOWAIT, 20000, on_done, &r[i]));
    }
    RUN_UNTIL(calls(r, MANY) == MANY, 10000);
    for (int i = 0; i < MANY; i++) ASSERT_CODE(r[i].code, DLOCK_OK);
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

/* ---- cancel and free ---- */

static dlock_async_client *freeing;

static void forget(dlock_async_client *c) {
    for (int i = 0; i < nbare; i++)
        if (bare_clients[i] == c) bare_clients[i] = NULL;
}

/* a callback that frees its client */
static void free_client_cb(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    on_done(l, code, fence, ud);
    forget(freeing);
    dlock_async_client_free(freeing);
}

static void t_cancel(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_lock *h = alock(c, "cx");
    res hr = {0};
    hold(h, 20000, &hr);
    enum { N = 10 };
    dlock_async_lock *w[N];
    res wr[N];
    memset(wr, 0, sizeof wr);
    for (int i = 0; i < N; i++) {
        w[i] = alock(c, "cx");
        START(dlock_async_acquire(w[i], i % 2 ? 20000 : DLOCK_WAIT_FOREVER, 20000, on_done,
                                  &wr[i]));
    }
    /* cancel one at once (its attempt is still out), the others once registered */
    ASSERT_OK(dlock_async_cancel(w[0]));
    ASSERT_EQ(wr[0].calls, 1);
    ASSERT_CODE(wr[0].code, DLOCK_ECANCELED);
    ASSERT(strstr(dlock_async_lock_errmsg(w[0]), "cancelled"));
    ASSERT_CODE(dlock_async_cancel(w[0]), DLOCK_ENOTHELD);
    RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{cx}") == N - 1, 5000);
    for (int i = 1; i < N / 2; i++) ASSERT_OK(dlock_async_cancel(w[i]));
    run_for(200);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD dlock_waiters:{cx}"), N - N / 2);
    /* a freed handle's wait ends once too */
    dlock_async_lock_free(w[N / 2]);
    ASSERT_EQ(wr[N / 2].calls, 1);
    ASSERT_CODE(wr[N / 2].code, DLOCK_ECANCELED);

    /* a blocking waiter behind them; the async waiters are cancelled by
     * the client's free, the holder's lease stays: the blocking waiter
     * gets the lock at its end, or when the holder's key goes */
    res rel = {0};
    START(dlock_async_release(h, on_done, &rel)); /* pending at the free */
    forget(c);
    dlock_async_client_free(c);
    for (int i = 0; i < 3; i++) loop_once();
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(wr[i].calls, 1);
        ASSERT_CODE(wr[i].code, DLOCK_ECANCELED);
    }
    ASSERT_EQ(rel.calls, 1);
    ASSERT_CODE(rel.code, DLOCK_ECANCELED);
    ASSERT_EQ(hr.calls, 1);
    /* what the server has left: the registry expires 6 s after the last
     * attempt at most; entries of dead waiters are skipped by a release */
    ASSERT_LE(th_cmd_int(rc, "ZCARD dlock_waiters:{cx}"), N);

    /* a woken waiter that is cancelled passes the wake on: a blocking
     * waiter behind it gets the lock at the release, not at the backstop */
    th_cmd_ok(rc, "DEL cx dlock_waiters:{cx}");
    c = client(s);
    dlock_async_lock *h2 = alock(c, "cy"), *w2 = alock(c, "cy");
    res h2r = {0}, w2r = {0}, r2 = {0};
    START(dlock_async_acquire(h2, DLOCK_NOWAIT, 20000, on_done, &h2r));
    WAIT_DONE(h2r, 3000);
    START(dlock_async_acquire(w2, DLOCK_WAIT_FOREVER, 20000, on_done, &w2r));
    RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{cy}") == 1, 3000);
    blocker b = {.s = s, .name = "cy", .hold_ms = 0};
    pthread_t th;
    pthread_create(&th, NULL, blocking_holder, &b);
    RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{cy}") == 2, 3000);
    /* the release and the cancel in one turn: the wake is in flight */
    START(dlock_async_release(h2, on_done, &r2));
    WAIT_DONE(r2, 3000);
    ASSERT_OK(dlock_async_cancel(w2));
    ASSERT_CODE(w2r.code, DLOCK_ECANCELED);
    int64_t t0 = th_now_ms();
    while (!atomic_load(&b.go)) loop_once();
    pthread_join(th, NULL);
    th_log("wake passed on in %lld ms", (long long)(b.acquired_at - t0));
    ASSERT_LT(b.acquired_at - t0, 1000);
    client_free(c);

    /* the client freed from a callback (a release's, then a cancel's),
     * with operations pending: each ends once */
    for (int how = 0; how < 2; how++) {
        c = client(s);
        freeing = c;
        dlock_async_lock *fh = alock(c, "cz"), *fw[3];
        res fhr = {0}, fwr[3], frel = {0};
        memset(fwr, 0, sizeof fwr);
        hold(fh, 20000, &fhr);
        for (int i = 0; i < 3; i++) {
            fw[i] = alock(c, "cz");
            START(dlock_async_acquire(fw[i], DLOCK_WAIT_FOREVER, 20000,
                                      how == 1 && i == 0 ? free_client_cb : on_done, &fwr[i]));
        }
        RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{cz}") == 3, 3000);
        if (how == 0) {
            START(dlock_async_release(fh, free_client_cb, &frel));
            RUN_UNTIL(frel.calls == 1, 3000);
            ASSERT_CODE(frel.code, DLOCK_OK);
        } else {
            ASSERT_OK(dlock_async_cancel(fw[0]));
        }
        for (int i = 0; i < 3; i++) {
            ASSERT_EQ(fwr[i].calls, 1);
            ASSERT_CODE(fwr[i].code, DLOCK_ECANCELED);
        }
        for (int i = 0; i < 3; i++) loop_once(); /* the adapter's handles close */
        th_cmd_ok(rc, "DEL cz dlock_waiters:{cz}");
    }
    redisFree(rc);
}

/* ---- restart ---- */

static void t_restart(th_server *s) {
    dlock_async_client *c = client(s);
    dlock_async_lock *h = alock(c, "rs"), *w[5];
    res hr = {0}, wr[5], ex = {0};
    memset(wr, 0, sizeof wr);
    hold(h, 60000, &hr);
    for (int i = 0; i < 5; i++) {
        w[i] = alock(c, "rs");
        START(dlock_async_acquire(w[i], i < 3 ? DLOCK_WAIT_FOREVER : 30000, 5000, on_done,
                                  &wr[i]));
    }
    run_for(200);
    START(dlock_async_extend(h, 60000, on_done, &ex));
    th_server_halt(s, SIGKILL);
    RUN_UNTIL(ex.calls + calls(wr, 5) == 6, 5000);
    run_for(300);
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(wr[i].calls, 1);
        ASSERT_MSG(wr[i].code == DLOCK_EIO, "waiter %d: %s (%s)", i, dlock_strerror(wr[i].code),
                   dlock_async_lock_errmsg(w[i]));
    }
    ASSERT_EQ(ex.calls, 1);
    ASSERT_CODE(ex.code, DLOCK_EIO);
    th_log("waiter's message: %s", dlock_async_lock_errmsg(w[0]));
    /* while it is down: a new operation fails clearly, at once or by callback */
    res down = {0};
    int rc = dlock_async_acquire(w[0], DLOCK_NOWAIT, 1000, on_done, &down);
    if (rc == DLOCK_OK) {
        WAIT_DONE(down, 3000);
        rc = down.code;
    }
    ASSERT_CODE(rc, DLOCK_EIO);
    th_server_resume(s);
    /* a server that stops answering: the request's deadline (the command
     * timeout, 2 s here) ends it, by the client's own timer */
    res up = {0};
    START(dlock_async_extend(h, 1000, on_done, &up)); /* reconnects: the server is empty */
    WAIT_DONE(up, 3000);
    ASSERT_CODE(up.code, DLOCK_ELOST);
    /* the restarted server's script cache has the acquire script again, so
     * that the thawed server below runs it (rather than answer NOSCRIPT) */
    dlock_async_lock *warm = alock(c, "warm");
    res wr1 = {0}, wr2 = {0};
    hold(warm, 1000, &wr1);
    START(dlock_async_release(warm, on_done, &wr2));
    WAIT_DONE(wr2, 3000);
    th_server_pause(s);
    int64_t t1 = th_now_ms();
    res hung2 = {0};
    START(dlock_async_acquire(w[3], 5000, 30000, on_done, &hung2));
    WAIT_DONE(hung2, 5000);
    th_server_unpause(s);
    /* the thawed server runs the attempt it had read (from a connection
     * closed meanwhile): the lock is taken for 30 s by an acquire that was
     * reported failed; the next connection gives it back first */
    redisContext *raw = th_redis(s);
    RUN_UNTIL(th_cmd_int(raw, "EXISTS rs") == 1, 2000);
    ASSERT_GT(th_cmd_int(raw, "PTTL rs"), 20000);
    ASSERT_CODE(hung2.code, DLOCK_EIO);
    th_log("hung server: %s after %lld ms", dlock_async_lock_errmsg(w[3]),
           (long long)(hung2.at - t1));
    ASSERT_GE(hung2.at - t1, 1900);
    ASSERT_LT(hung2.at - t1, 3500);
    /* the client works again, and the 30 s hold of the acquire reported
     * failed was given back first on the new connection (else: EBUSY) */
    res again = {0};
    START(dlock_async_acquire(w[1], DLOCK_NOWAIT, 5000, on_done, &again));
    WAIT_DONE(again, 3000);
    ASSERT_MSG(again.code == DLOCK_OK, "after restart: %s", dlock_async_lock_errmsg(w[1]));
    redisFree(raw);
    res rel = {0};
    START(dlock_async_release(w[1], on_done, &rel));
    WAIT_DONE(rel, 3000);
    ASSERT_CODE(rel.code, DLOCK_OK);
    ASSERT_EQ(hr.calls, 1);
    ASSERT_EQ(up.calls + hung2.calls + again.calls + rel.calls, 4);
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
    th_cmd_ok(counter_rc, "SET counter %lld", w->seen + 1);
    async_in_cs--;
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
    case 1: { /* held twice */
        ASSERT_EQ(async_in_cs, 0);
        async_in_cs++;
        char *v = th_cmd_str(counter_rc, "GET counter");
        w->seen = v ? atoll(v) : 0;
        free(v);
        after(1, rw_write, w);
        break;
    }
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

/* ---- bad input ---- */

/* A try-once acquire by a new client of url: its code. The message must
 * not contain secret (when not NULL). */
static int try_url(const char *url, const char *password, const char *secret) {
    dlock_async_client *c = NULL;
    ASSERT_OK(client_new(url, password, &c));
    dlock_async_lock *l = alock(c, "try-url");
    res r = {0};
    START(dlock_async_acquire(l, 0, 1000, on_done, &r));
    WAIT_DONE(r, 3000);
    th_log("%s: %s", dlock_strerror(r.code), dlock_async_lock_errmsg(l));
    ASSERT(!secret || !strstr(dlock_async_lock_errmsg(l), secret));
    client_free(c);
    return r.code;
}

static void t_badinput(th_server *s) {
    dlock_async_client *c = NULL;
    ASSERT_CODE(dlock_async_client_new(NULL, NULL, NULL), DLOCK_EINVAL);
    ASSERT_CODE(client_new("redis://127.0.0.1:notaport", NULL, &c), DLOCK_EINVAL);
    ASSERT(*dlock_async_errmsg(c));
    client_free(c);
    const char *unsupported[] = {"rediss://127.0.0.1:6379", "redis-sentinel://127.0.0.1:1/m",
                                 "redis-cluster://127.0.0.1:1", "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
                                 "zk://127.0.0.1:2181"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        c = NULL;
        ASSERT_CODE(client_new(unsupported[i], NULL, &c), DLOCK_ENOTSUP);
        th_log("%s: %s", unsupported[i], dlock_async_errmsg(c));
        /* an unusable client refuses its operations */
        dlock_async_lock *l = NULL;
        ASSERT_CODE(dlock_async_lock_new(c, "x", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
        client_free(c);
    }
    c = client(s);
    dlock_async_lock *l = NULL;
    ASSERT_CODE(dlock_async_lock_new(NULL, "x", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_lock_new(c, "x", DLOCK_CSTR, DLOCK_KIND_PLAIN, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_lock_new(c, "", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_lock_new(c, NULL, 3, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    static char big[DLOCK_NAME_MAX + 2];
    memset(big, 'n', sizeof big - 1);
    ASSERT_CODE(dlock_async_lock_new(c, big, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l),
                DLOCK_ENAMETOOLONG);
    ASSERT_CODE(dlock_async_lock_new(c, "x", DLOCK_CSTR, DLOCK_KIND_FAIR, &l), DLOCK_ENOTSUP);
    ASSERT_CODE(dlock_async_lock_new(c, "x", DLOCK_CSTR, (dlock_kind)99, &l), DLOCK_ENOTSUP);
    l = alock(c, "bad");
    res r = {0};
    ASSERT_CODE(dlock_async_acquire(NULL, 0, 1000, on_done, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_acquire(l, 0, 1000, NULL, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_acquire(l, -2, 1000, on_done, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_acquire(l, 0, -5, on_done, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_acquire(l, 0, DLOCK_WATCHDOG, on_done, &r), DLOCK_ENOTSUP);
    ASSERT(strstr(dlock_async_lock_errmsg(l), "WATCHDOG"));
    ASSERT_CODE(dlock_async_release(NULL, on_done, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_release(l, on_done, &r), DLOCK_ENOTHELD);
    ASSERT_CODE(dlock_async_extend(l, 1000, on_done, &r), DLOCK_ENOTHELD);
    ASSERT_CODE(dlock_async_cancel(NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_cancel(l), DLOCK_ENOTHELD);
    START(dlock_async_acquire(l, 0, 1000, on_done, &r));
    /* one operation per handle at a time */
    ASSERT_CODE(dlock_async_acquire(l, 0, 1000, on_done, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_release(l, on_done, &r), DLOCK_EINVAL);
    WAIT_DONE(r, 3000);
    ASSERT_CODE(r.code, DLOCK_OK);
    ASSERT_EQ(r.calls, 1);
    ASSERT_CODE(dlock_async_acquire(l, 0, 1000, on_done, &r), DLOCK_EINVAL); /* holds */
    ASSERT_CODE(dlock_async_extend(l, 0, on_done, &r), DLOCK_EINVAL);
    dlock_async_lock_free(l); /* releases its hold */
    redisContext *rc = th_redis(s);
    RUN_UNTIL(th_cmd_int(rc, "EXISTS bad") == 0, 3000);
    dlock_async_lock_free(NULL);
    dlock_async_client_free(NULL);
    dlock_async_process(NULL, -1, 0);
    ASSERT_EQ(dlock_async_timeout(NULL), -1);
    client_free(c);

    /* nothing listens: the callback tells */
    int port = th_free_port();
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    ASSERT_OK(client_new(url, NULL, &c));
    l = alock(c, "x");
    memset(&r, 0, sizeof r);
    int code = dlock_async_acquire(l, 0, 1000, on_done, &r);
    if (!code) {
        WAIT_DONE(r, 3000);
        code = r.code;
    }
    ASSERT_CODE(code, DLOCK_EIO);
    th_log("refused: %s", dlock_async_lock_errmsg(l));
    client_free(c);

    /* an ACL user and password from the URL */
    redisContext *arc = th_redis(s);
    th_cmd_ok(arc, "ACL SETUSER alice on >al1ce ~* &* +@all");
    char aurl[96];
    snprintf(aurl, sizeof aurl, "redis://alice:al1ce@127.0.0.1:%d", th_server_port(s));
    ASSERT_CODE(try_url(aurl, NULL, NULL), DLOCK_OK);
    snprintf(aurl, sizeof aurl, "redis://alice:nope@127.0.0.1:%d", th_server_port(s));
    ASSERT_CODE(try_url(aurl, NULL, NULL), DLOCK_EAUTH);
    redisFree(arc);

    /* AUTH: refused (never naming the password), then accepted; and a
     * unix socket */
    th_server_opts so = {.requirepass = "s3cret"};
    th_server *ps = th_server_start(&so);
    ASSERT_CODE(try_url(th_server_url(ps), "wrong", "wrong"), DLOCK_EAUTH);
    ASSERT_CODE(try_url(th_server_unix_url(ps), "s3cret", NULL), DLOCK_OK);
    th_server_stop(ps);
    redisFree(rc);
}

int main(int argc, char **argv) {
    th_init("async");
    if (argc < 2) th_fail(__FILE__, __LINE__, "usage: test_async CASE_LOOP");
    char what[64];
    snprintf(what, sizeof what, "%s", argv[1]);
    char *us = strrchr(what, '_');
    ASSERT(us);
    *us = '\0';
    const char *lp = us + 1;
    if (!strcmp(lp, "uv")) {
#ifndef DLOCK_TEST_HAVE_UV
        th_skip("libuv was not found at build time (install libuv1-dev)");
#endif
        loop_kind = LOOP_UV;
    } else if (!strcmp(lp, "event")) {
#ifndef DLOCK_TEST_HAVE_EVENT
        th_skip("libevent was not found at build time (install libevent-dev)");
#endif
        loop_kind = LOOP_EVENT;
    } else {
        loop_kind = LOOP_BARE;
    }
    th_server *s = th_server_start(NULL);
    loop_init();
    if (!strcmp(what, "basic")) t_basic(s);
    else if (!strcmp(what, "handoff")) t_handoff(s);
    else if (!strcmp(what, "counter")) t_counter(s);
    else if (!strcmp(what, "pipeline")) t_pipeline(s);
    else if (!strcmp(what, "cancel")) t_cancel(s);
    else if (!strcmp(what, "restart")) t_restart(s);
    else if (!strcmp(what, "badinput")) t_badinput(s);
    else if (!strcmp(what, "reentrant")) t_reentrant(s);
    else th_fail(__FILE__, __LINE__, "unknown case %s", what);
#ifdef DLOCK_TEST_HAVE_UV
    if (loop_kind == LOOP_UV) {
        uv_close((uv_handle_t *)&uv_guard, NULL);
        uv_run(&uvl, UV_RUN_NOWAIT);
        ASSERT_EQ(uv_loop_close(&uvl), 0); /* every handle of the adapter closed */
    }
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
    if (loop_kind == LOOP_EVENT) {
        event_free(ev_guard);
        event_base_free(evb);
    }
#endif
    th_server_stop(s);
    th_log("ok");
    return 0;
}
