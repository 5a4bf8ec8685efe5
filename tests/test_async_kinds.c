/* The async API's fair lock and read/write lock (include/dlock_async.h) on
 * real event loops (libuv, libevent, the bare interface: tests/async_loop.c)
 * and real servers, mixed with blocking clients on the same names.
 * argv[1] is "<case>_<loop>".
 *
 *   fair       FIFO grants across async handles and blocking threads queued
 *              in turn (the grant order checked, each handoff prompt); a
 *              hold's owner is its handle (re-entry counts, another handle
 *              of the same client is excluded)
 *   faircancel a fair waiter cancelled while queued, one cancelled with its
 *              first attempt still out (an orphan), one timing out and one
 *              whose handle is freed all leave the queue: the next waiter
 *              is served at the release, not after a queue entry's timeout;
 *              a handle freed while it holds gives the lock back
 *   fairlong   a fair waiter queued longer than its entry's first deadline
 *              (the holder extending its lease) is still in the queue, its
 *              deadline moved on by its attempts, and is served at the
 *              release
 *   fairwait   dlock_async_client_set_fair_wait: a waiter queued with W
 *              0.5 s behind a 1 s lease gets an entry deadline the lease
 *              left + W ahead; its loop stopped (its connections kept), a
 *              blocking acquirer gets the lock once that deadline passed,
 *              not after the default W (5 s); the waiter, its loop turning
 *              again, queues anew and is granted the lock at the release
 *   rw         read holds shared by async handles and blocking threads; a
 *              write hold excludes both and is excluded by them, and each
 *              side's release wakes the other's waiters; a waiting writer
 *              that gives up leaves the waiting writers
 *   rwcounter  exact-counter exclusion: async write handles and blocking
 *              write threads mixed on one name, each a non-atomic GET,
 *              pause, SET under the lock
 *   freeing    a fair and a write acquire pending when the client is freed:
 *              each callback once with DLOCK_ECANCELED, the fair queue and
 *              the waiting writers left
 *   fairkill   the connections lost under a pending fair wait (the server
 *              up): it waits on and is granted the lock at the release; one
 *              cancelled before it could reconnect leaves the queue by the
 *              next operation's connection (its abandon was kept); the
 *              server killed under a fair and a write wait: both wait on
 *              and are served after the restart; the client works */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "async_loop.h"

static dlock_async_lock *klock(dlock_async_client *c, const char *name, dlock_kind kind) {
    dlock_async_lock *l = NULL;
    int rc = dlock_async_lock_new(c, name, DLOCK_CSTR, kind, &l);
    ASSERT_MSG(rc == DLOCK_OK, "lock_new: %s", dlock_async_errmsg(c));
    return l;
}

static void release_now(dlock_async_lock *l) {
    res r = {0};
    START(dlock_async_release(l, on_done, &r));
    WAIT_DONE(r, 3000);
    ASSERT_MSG(r.code == DLOCK_OK, "release: %s", dlock_async_lock_errmsg(l));
}

/* ---- a blocking waiter in a thread of its own ---- */

static atomic_int grants; /* grants so far, in order */

typedef struct bwaiter {
    const th_server *s;
    const char *name;
    dlock_kind kind;
    int64_t wait_ms;
    atomic_int release;        /* hold until set */
    atomic_int state;          /* 1 acquiring, 2 holding, 3 done */
    int code, order;
    uint64_t fence;
    int64_t acquired_at;
    pthread_t th;
} bwaiter;

static void *bwaiter_run(void *arg) {
    bwaiter *b = arg;
    dlock_client *c = th_client(b->s, 0);
    dlock_lock *l = th_lock(c, b->name, b->kind);
    atomic_store(&b->state, 1);
    b->code = dlock_acquire(l, b->wait_ms, 10000, &b->fence);
    if (b->code == DLOCK_OK) {
        b->order = atomic_fetch_add(&grants, 1);
        b->acquired_at = th_now_ms();
        atomic_store(&b->state, 2);
        while (!atomic_load(&b->release)) th_sleep_ms(1);
        ASSERT_LOK(l, dlock_release(l));
    }
    atomic_store(&b->state, 3);
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

static void bwaiter_start(bwaiter *b, const th_server *s, const char *name, dlock_kind kind,
                          int64_t wait_ms) {
    memset(b, 0, sizeof *b);
    b->s = s, b->name = name, b->kind = kind, b->wait_ms = wait_ms;
    ASSERT_EQ(pthread_create(&b->th, NULL, bwaiter_run, b), 0);
}

static void bwaiter_join(bwaiter *b) {
    atomic_store(&b->release, 1);
    pthread_join(b->th, NULL);
}

/* ---- fair ---- */

typedef struct agrant {
    dlock_async_lock *l;
    res r;
    int order;
} agrant;

static void on_grant(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    agrant *g = ud;
    on_done(l, code, fence, &g->r);
    if (code == DLOCK_OK) g->order = atomic_fetch_add(&grants, 1);
}

static long long qlen(redisContext *rc, const char *name) {
    return th_cmd_int(rc, "LLEN redisson_lock_queue:{%s}", name);
}

static void t_fair(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_lock *h = klock(c, "ff", DLOCK_KIND_FAIR);
    res hr = {0}, r2 = {0}, x = {0};
    hold(h, 10000, &hr);
    /* the owner is the handle: it re-enters, another handle of the same
     * client does not */
    START(dlock_async_acquire(h, DLOCK_NOWAIT, 10000, on_done, &r2));
    WAIT_DONE(r2, 3000);
    ASSERT_CODE(r2.code, DLOCK_OK);
    ASSERT_U64_GT(r2.fence, hr.fence);
    dlock_async_lock *other = klock(c, "ff", DLOCK_KIND_FAIR);
    START(dlock_async_acquire(other, DLOCK_NOWAIT, 10000, on_done, &x));
    WAIT_DONE(x, 3000);
    ASSERT_CODE(x.code, DLOCK_EBUSY);
    /* extend: the lease set from now, owner-checked */
    memset(&x, 0, sizeof x);
    START(dlock_async_extend(h, 20000, on_done, &x));
    WAIT_DONE(x, 3000);
    ASSERT_CODE(x.code, DLOCK_OK);
    ASSERT_GT(th_cmd_int(rc, "PTTL ff"), 15000);
    ASSERT_GT(dlock_async_lock_valid_ms(h), 15000);
    release_now(h); /* one of two */
    ASSERT_EQ(th_cmd_int(rc, "EXISTS ff"), 1);

    /* five waiters queued in turn, async and blocking alternating */
    enum { N = 5 };
    agrant ag[3];
    bwaiter bw[2];
    memset(ag, 0, sizeof ag);
    int slot_async[N] = {1, 0, 1, 0, 1};
    int ai = 0, bi = 0;
    for (int i = 0; i < N; i++) {
        if (slot_async[i]) {
            ag[ai].l = klock(c, "ff", DLOCK_KIND_FAIR);
            START(dlock_async_acquire(ag[ai].l, DLOCK_WAIT_FOREVER, 10000, on_grant, &ag[ai]));
            ai++;
        } else {
            bwaiter_start(&bw[bi++], s, "ff", DLOCK_KIND_FAIR, DLOCK_WAIT_FOREVER);
        }
        RUN_UNTIL(qlen(rc, "ff") == i + 1, 3000);
    }
    run_for(100);
    ASSERT_EQ(calls(&ag[0].r, 1) + calls(&ag[1].r, 1) + calls(&ag[2].r, 1), 0);
    atomic_store(&grants, 0);
    /* each holder releases 30 ms after its grant; each grant must follow
     * its predecessor's release promptly (the handoff, not a recheck) */
    int64_t prev = th_now_ms(); /* the holder's release starts */
    release_now(h);
    uint64_t last_fence = r2.fence;
    ai = bi = 0;
    for (int i = 0; i < N; i++) {
        int64_t at;
        uint64_t fence;
        int order;
        if (slot_async[i]) {
            agrant *g = &ag[ai++];
            RUN_UNTIL(g->r.calls == 1, 3000);
            ASSERT_MSG(g->r.code == DLOCK_OK, "async waiter %d: %s", i, dlock_async_lock_errmsg(g->l));
            at = g->r.at, fence = g->r.fence, order = g->order;
            ASSERT_GE(at, prev); /* not before its predecessor let go */
            run_for(30);
            prev = th_now_ms();
            release_now(g->l);
        } else {
            bwaiter *b = &bw[bi++];
            RUN_UNTIL(atomic_load(&b->state) >= 2, 3000);
            ASSERT_CODE(b->code, DLOCK_OK);
            at = b->acquired_at, fence = b->fence, order = b->order;
            ASSERT_GE(at, prev);
            run_for(30);
            prev = th_now_ms();
            bwaiter_join(b);
        }
        th_log("waiter %d (%s): grant #%d, fence %llu", i, slot_async[i] ? "async" : "blocking",
               order, (unsigned long long)fence);
        ASSERT_EQ(order, i);
        ASSERT_U64_GT(fence, last_fence);
        last_fence = fence;
        if (i + 1 < N) {
            /* the next one is served within 500 ms of this release */
            int nx = i + 1;
            if (slot_async[nx]) RUN_UNTIL(ag[ai].r.calls == 1, 500);
            else RUN_UNTIL(atomic_load(&bw[bi].state) >= 2, 500);
            th_log("handoff %d -> %d: %lld ms", i, nx, (long long)(th_now_ms() - prev));
        }
    }
    ASSERT_EQ(qlen(rc, "ff"), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS ff"), 0);
    redisFree(rc);
    client_free(c);
}

/* ---- faircancel ---- */

/* the server's connections subscribed to something */
static long long pubsub_conns(redisContext *rc) {
    redisReply *r = th_cmd(rc, "CLIENT LIST TYPE pubsub");
    long long n = 0;
    for (const char *p = r->str; p && (p = strchr(p, '\n')); p++) n++;
    freeReplyObject(r);
    return n;
}

static void t_faircancel(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s), *c2 = client(s);
    dlock_async_lock *h = klock(c, "fc", DLOCK_KIND_FAIR), *w1 = klock(c, "fc", DLOCK_KIND_FAIR),
                     *w2 = klock(c2, "fc", DLOCK_KIND_FAIR), *w3 = klock(c, "fc", DLOCK_KIND_FAIR),
                     *w4 = klock(c, "fc", DLOCK_KIND_FAIR);
    res hr = {0}, r1 = {0}, r2 = {0}, r3 = {0}, r4 = {0};
    hold(h, 20000, &hr);
    START(dlock_async_acquire(w1, DLOCK_WAIT_FOREVER, 10000, on_done, &r1));
    RUN_UNTIL(qlen(rc, "fc") == 1, 3000);
    START(dlock_async_acquire(w2, DLOCK_WAIT_FOREVER, 10000, on_done, &r2));
    RUN_UNTIL(qlen(rc, "fc") == 2, 3000);
    /* each client's waiters on its one subscribed connection */
    RUN_UNTIL(pubsub_conns(rc) == 2, 1000);
    /* w3 queues behind, cancelled before its first attempt's reply: the
     * orphan reply's abandon takes it out */
    START(dlock_async_acquire(w3, DLOCK_WAIT_FOREVER, 10000, on_done, &r3));
    ASSERT_OK(dlock_async_cancel(w3));
    ASSERT_EQ(r3.calls, 1);
    ASSERT_CODE(r3.code, DLOCK_ECANCELED);
    /* w4 times out in the queue; c's waiters still share one connection */
    START(dlock_async_acquire(w4, 300, 10000, on_done, &r4));
    RUN_UNTIL(qlen(rc, "fc") == 3, 1000);
    ASSERT_EQ(pubsub_conns(rc), 2);
    WAIT_DONE(r4, 3000);
    ASSERT_CODE(r4.code, DLOCK_ETIMEDOUT);
    /* w5 queued, its handle freed: its wait ends and it leaves */
    dlock_async_lock *w5 = klock(c, "fc", DLOCK_KIND_FAIR);
    res r5 = {0};
    START(dlock_async_acquire(w5, DLOCK_WAIT_FOREVER, 10000, on_done, &r5));
    RUN_UNTIL(qlen(rc, "fc") == 3, 1000);
    dlock_async_lock_free(w5);
    ASSERT_EQ(r5.calls, 1);
    ASSERT_CODE(r5.code, DLOCK_ECANCELED);
    RUN_UNTIL(qlen(rc, "fc") == 2, 1000);
    /* w1, at the head, cancelled */
    run_for(50);
    ASSERT_OK(dlock_async_cancel(w1));
    ASSERT_EQ(r1.calls, 1);
    ASSERT_CODE(r1.code, DLOCK_ECANCELED);
    RUN_UNTIL(qlen(rc, "fc") == 1, 1000);
    /* the one left is w2: served at the release */
    release_now(h);
    int64_t t0 = th_now_ms();
    RUN_UNTIL(r2.calls == 1, 1000);
    ASSERT_MSG(r2.code == DLOCK_OK, "w2: %s", dlock_async_lock_errmsg(w2));
    th_log("served %lld ms after the release", (long long)(r2.at - t0));
    ASSERT_LT(r2.at - t0, 500);
    ASSERT_EQ(qlen(rc, "fc"), 0);
    /* a handle freed while it holds gives its hold back */
    dlock_async_lock_free(w2);
    RUN_UNTIL(th_cmd_int(rc, "EXISTS fc") == 0, 1000);
    run_for(100);
    ASSERT_EQ(r1.calls + r3.calls + r4.calls, 3);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS fc"), 0);
    redisFree(rc);
    client_free(c2);
    client_free(c);
}

/* ---- fairlong ---- */

static dlock_async_lock *long_holder;
static int long_extends, long_stop;
static res long_ext;

static void long_extend(void *arg) {
    (void)arg;
    if (long_stop) return;
    if (long_ext.calls || !long_extends) {
        ASSERT_MSG(!long_extends || long_ext.code == DLOCK_OK, "extend: %s",
                   dlock_async_lock_errmsg(long_holder));
        memset(&long_ext, 0, sizeof long_ext);
        START(dlock_async_extend(long_holder, 2000, on_done, &long_ext));
        long_extends++;
    }
    after(700, long_extend, NULL);
}

/* the server's clock in ms */
static long long server_ms(redisContext *rc) {
    redisReply *r = th_cmd(rc, "TIME");
    long long ms = atoll(r->element[0]->str) * 1000 + atoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    return ms;
}

static void t_fairlong(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    long_holder = klock(c, "fl", DLOCK_KIND_FAIR);
    dlock_async_lock *w = klock(c, "fl", DLOCK_KIND_FAIR);
    res hr = {0}, wr = {0};
    hold(long_holder, 2000, &hr);
    long_extend(NULL); /* the 2 s lease extended every 0.7 s */
    START(dlock_async_acquire(w, DLOCK_WAIT_FOREVER, 10000, on_done, &wr));
    RUN_UNTIL(qlen(rc, "fl") == 1, 3000);
    redisReply *z = th_cmd(rc, "ZRANGE redisson_lock_timeout:{fl} 0 -1 WITHSCORES");
    ASSERT_EQ(z->elements, 2);
    long long first = atoll(z->element[1]->str);
    freeReplyObject(z);
    /* past the entry's first deadline (the lease left + W = 7 s): the
     * waiter's attempts (its keep-alive) moved it on */
    run_for(8000);
    ASSERT_EQ(wr.calls, 0);
    ASSERT_EQ(qlen(rc, "fl"), 1);
    z = th_cmd(rc, "ZRANGE redisson_lock_timeout:{fl} 0 -1 WITHSCORES");
    ASSERT_EQ(z->elements, 2);
    long long now = server_ms(rc), d = atoll(z->element[1]->str);
    freeReplyObject(z);
    th_log("entry deadline %lld ms ahead (first %lld ms behind now), %d extends", d - now,
           now - first, long_extends);
    ASSERT_GT(now, first);
    ASSERT_GT(d - now, 2000);
    long_stop = 1;
    RUN_UNTIL(long_ext.calls == 1, 3000);
    int64_t t0 = th_now_ms();
    release_now(long_holder);
    RUN_UNTIL(wr.calls == 1, 1000);
    ASSERT_MSG(wr.code == DLOCK_OK, "waiter: %s", dlock_async_lock_errmsg(w));
    ASSERT_LT(wr.at - t0, 500);
    release_now(w);
    redisFree(rc);
    client_free(c);
}

/* ---- fairwait ---- */

#define FW_LEASE 1000
#define FW_W 500

static void t_fairwait(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    ASSERT_CODE(dlock_async_client_set_fair_wait(c, 0), DLOCK_EINVAL);
    ASSERT(strstr(dlock_async_errmsg(c), "fair wait"));
    ASSERT_CODE(dlock_async_client_set_fair_wait(c, ((int64_t)1 << 40) + 1), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_client_set_fair_wait(NULL, FW_W), DLOCK_EINVAL);
    ASSERT_OK(dlock_async_client_set_fair_wait(c, FW_W));
    dlock_client *hc = th_client(s, 0);
    dlock_lock *h = th_lock(hc, "fw", DLOCK_KIND_FAIR);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, FW_LEASE, NULL));
    dlock_async_lock *w = klock(c, "fw", DLOCK_KIND_FAIR);
    res wr = {0};
    START(dlock_async_acquire(w, DLOCK_WAIT_FOREVER, 10000, on_done, &wr));
    RUN_UNTIL(qlen(rc, "fw") == 1, 3000);
    redisReply *z = th_cmd(rc, "ZRANGE redisson_lock_timeout:{fw} 0 -1 WITHSCORES");
    ASSERT_EQ(z->elements, 2);
    long long ahead = atoll(z->element[1]->str) - server_ms(rc);
    freeReplyObject(z);
    th_log("entry deadline %lld ms ahead (lease %d ms, W %d ms)", ahead, FW_LEASE, FW_W);
    ASSERT_LE(ahead, FW_LEASE + FW_W);
    ASSERT_GT(ahead, FW_W - 200);
    /* the waiter's loop stops: it keeps its connections and its place
     * until its deadline, then the blocking acquirer behind it gets the
     * lock (with the default W, 5 s, it would wait past its 4 s) */
    dlock_client *bc = th_client(s, 0);
    dlock_lock *b = th_lock(bc, "fw", DLOCK_KIND_FAIR);
    int64_t t0 = th_now_ms();
    ASSERT_LOK(b, dlock_acquire(b, 4000, 10000, NULL));
    int64_t took = th_now_ms() - t0;
    th_log("the blocking acquirer behind the stopped waiter got the lock in %lld ms",
           (long long)took);
    ASSERT_GT(took, ahead - 300);
    ASSERT_LT(took, 3000);
    ASSERT_EQ(wr.calls, 0);
    /* the loop turns again: the waiter queues anew and is served at the
     * release */
    run_for(300);
    ASSERT_EQ(wr.calls, 0);
    ASSERT_EQ(qlen(rc, "fw"), 1);
    int64_t t1 = th_now_ms();
    ASSERT_LOK(b, dlock_release(b));
    RUN_UNTIL(wr.calls == 1, 3000);
    ASSERT_MSG(wr.code == DLOCK_OK, "waiter: %s", dlock_async_lock_errmsg(w));
    ASSERT_LT(wr.at - t1, 500);
    release_now(w);
    dlock_lock_free(b);
    dlock_client_free(bc);
    dlock_lock_free(h);
    dlock_client_free(hc);
    redisFree(rc);
    client_free(c);
}

/* ---- rw ---- */

static void t_rw(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_lock *r1 = klock(c, "rw", DLOCK_KIND_READ), *r2 = klock(c, "rw", DLOCK_KIND_READ),
                     *w = klock(c, "rw", DLOCK_KIND_WRITE), *w2 = klock(c, "rw", DLOCK_KIND_WRITE);
    res a = {0}, b = {0}, wr = {0}, x = {0};
    /* two async readers and a blocking one share it */
    hold(r1, 10000, &a);
    hold(r2, 10000, &b);
    bwaiter br;
    bwaiter_start(&br, s, "rw", DLOCK_KIND_READ, DLOCK_NOWAIT);
    RUN_UNTIL(atomic_load(&br.state) >= 2, 3000);
    ASSERT_CODE(br.code, DLOCK_OK);
    /* each hold's lease key named as the blocking reader's,
     * {N}:<owner>:rwlock_timeout:<k>, which the releases read */
    redisReply *keys = th_cmd(rc, "KEYS {rw}:*:rwlock_timeout:1");
    ASSERT_EQ(keys->elements, 3);
    for (size_t i = 0; i < keys->elements; i++)
        ASSERT_GT(th_cmd_int(rc, "PTTL %s", keys->element[i]->str), 5000);
    freeReplyObject(keys);
    /* a writer waits for all three; a blocking writer is refused */
    START(dlock_async_acquire(w, DLOCK_WAIT_FOREVER, 10000, on_done, &wr));
    run_for(100);
    ASSERT_EQ(wr.calls, 0);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {rw}:write_waiters"), 1);
    bwaiter bw;
    bwaiter_start(&bw, s, "rw", DLOCK_KIND_WRITE, DLOCK_NOWAIT);
    RUN_UNTIL(atomic_load(&bw.state) == 3, 3000);
    ASSERT_CODE(bw.code, DLOCK_EBUSY);
    pthread_join(bw.th, NULL);
    release_now(r1);
    release_now(r2);
    run_for(50);
    ASSERT_EQ(wr.calls, 0);
    /* the blocking reader's release frees it: the writer is woken */
    int64_t t0 = th_now_ms();
    bwaiter_join(&br);
    RUN_UNTIL(wr.calls == 1, 1000);
    ASSERT_MSG(wr.code == DLOCK_OK, "writer: %s", dlock_async_lock_errmsg(w));
    th_log("writer served %lld ms after the last read release", (long long)(wr.at - t0));
    ASSERT_LT(wr.at - t0, 500);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {rw}:write_waiters"), 0);
    res ex = {0};
    START(dlock_async_extend(w, 20000, on_done, &ex));
    WAIT_DONE(ex, 3000);
    ASSERT_CODE(ex.code, DLOCK_OK);
    ASSERT_GT(th_cmd_int(rc, "PTTL rw"), 15000);
    /* the write hold excludes: an async reader waits, a blocking reader is
     * refused, another async writer times out and leaves the waiters */
    memset(&a, 0, sizeof a);
    START(dlock_async_acquire(r1, DLOCK_WAIT_FOREVER, 10000, on_done, &a));
    bwaiter_start(&br, s, "rw", DLOCK_KIND_READ, DLOCK_NOWAIT);
    RUN_UNTIL(atomic_load(&br.state) == 3, 3000);
    ASSERT_CODE(br.code, DLOCK_EBUSY);
    pthread_join(br.th, NULL);
    START(dlock_async_acquire(w2, 300, 10000, on_done, &x));
    WAIT_DONE(x, 3000);
    ASSERT_CODE(x.code, DLOCK_ETIMEDOUT);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {rw}:write_waiters"), 0);
    ASSERT_EQ(a.calls, 0);
    /* a blocking writer waits too; the async write release wakes the async
     * reader (the reader was first: the blocking writer may follow it) */
    bwaiter_start(&bw, s, "rw", DLOCK_KIND_WRITE, 10000);
    RUN_UNTIL(th_cmd_int(rc, "ZCARD {rw}:write_waiters") == 1, 3000);
    t0 = th_now_ms();
    release_now(w);
    RUN_UNTIL(a.calls == 1 || atomic_load(&bw.state) >= 2, 1000);
    th_log("after the write release: reader %d, blocking writer %d", a.calls,
           atomic_load(&bw.state) >= 2);
    /* writer preference: the waiting blocking writer goes first, then
     * the reader */
    if (atomic_load(&bw.state) >= 2) {
        ASSERT_EQ(a.calls, 0);
        run_for(50);
        ASSERT_EQ(a.calls, 0);
        bwaiter_join(&bw);
        RUN_UNTIL(a.calls == 1, 1000);
    } else {
        bwaiter_join(&bw);
    }
    ASSERT_MSG(a.code == DLOCK_OK, "reader: %s", dlock_async_lock_errmsg(r1));
    ASSERT_CODE(bw.code, DLOCK_OK);
    /* read extend: the hold's timeout key and the hash */
    res ex2 = {0};
    START(dlock_async_extend(r1, 30000, on_done, &ex2));
    WAIT_DONE(ex2, 3000);
    ASSERT_CODE(ex2.code, DLOCK_OK);
    ASSERT_GT(th_cmd_int(rc, "PTTL rw"), 25000);
    /* read re-entry counts on the handle */
    memset(&b, 0, sizeof b);
    START(dlock_async_acquire(r1, DLOCK_NOWAIT, 10000, on_done, &b));
    WAIT_DONE(b, 3000);
    ASSERT_CODE(b.code, DLOCK_OK);
    release_now(r1);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS rw"), 1);
    release_now(r1);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS rw"), 0);
    redisFree(rc);
    client_free(c);
}

/* ---- rwcounter ---- */

#define ROUNDS 40
#define ASYNC_HANDLES 4
#define BLOCKING_THREADS 2

typedef struct worker {
    dlock_async_lock *l;
    int done;
    long long seen;
} worker;
static worker workers[ASYNC_HANDLES];
static redisContext *counter_rc;
static int async_in_cs;

static void counter_next(worker *w);

static void counter_released(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)f;
    ASSERT_MSG(code == DLOCK_OK, "release: %s", dlock_async_lock_errmsg(l));
    worker *w = ud;
    if (++w->done < ROUNDS) counter_next(w);
}

static void counter_write(void *arg) {
    worker *w = arg;
    th_cmd_ok(counter_rc, "SET counter %lld", w->seen + 1);
    async_in_cs--;
    START(dlock_async_release(w->l, counter_released, w));
}

static void counter_got(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)f;
    worker *w = ud;
    ASSERT_MSG(code == DLOCK_OK, "acquire: %s", dlock_async_lock_errmsg(l));
    ASSERT_EQ(async_in_cs, 0);
    async_in_cs++;
    char *v = th_cmd_str(counter_rc, "GET counter");
    w->seen = v ? atoll(v) : 0;
    free(v);
    after(1, counter_write, w); /* the SET a loop turn later, at least */
}

static void counter_next(worker *w) {
    START(dlock_async_acquire(w->l, DLOCK_WAIT_FOREVER, 10000, counter_got, w));
}

static void *counter_thread(void *arg) {
    const th_server *s = arg;
    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, "wcount", DLOCK_KIND_WRITE);
    redisContext *rc = th_redis(s);
    for (int i = 0; i < ROUNDS; i++) {
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, 10000, NULL));
        char *v = th_cmd_str(rc, "GET counter");
        long long n = v ? atoll(v) : 0;
        free(v);
        usleep(1000);
        th_cmd_ok(rc, "SET counter %lld", n + 1);
        ASSERT_LOK(l, dlock_release(l));
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

static void t_rwcounter(th_server *s) {
    counter_rc = th_redis(s);
    th_cmd_ok(counter_rc, "SET counter 0");
    dlock_async_client *c = client(s);
    pthread_t th[BLOCKING_THREADS];
    for (int i = 0; i < BLOCKING_THREADS; i++) pthread_create(&th[i], NULL, counter_thread, s);
    for (int i = 0; i < ASYNC_HANDLES; i++) {
        workers[i].l = klock(c, "wcount", DLOCK_KIND_WRITE);
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
    long long total = v ? atoll(v) : -1;
    free(v);
    th_log("counter %lld, want %d", total, (ASYNC_HANDLES + BLOCKING_THREADS) * ROUNDS);
    ASSERT_EQ(total, (ASYNC_HANDLES + BLOCKING_THREADS) * ROUNDS);
    ASSERT_EQ(th_cmd_int(counter_rc, "EXISTS wcount"), 0);
    ASSERT_EQ(th_cmd_int(counter_rc, "EXISTS {wcount}:write_waiters"), 0);
    redisFree(counter_rc);
    client_free(c);
}

/* ---- freeing ---- */

static void t_freeing(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_client *bc = th_client(s, 0);
    dlock_lock *fh = th_lock(bc, "fq", DLOCK_KIND_FAIR), *wh = th_lock(bc, "wq", DLOCK_KIND_READ);
    ASSERT_LOK(fh, dlock_acquire(fh, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_LOK(wh, dlock_acquire(wh, DLOCK_NOWAIT, 20000, NULL));
    dlock_async_client *c = client(s);
    dlock_async_lock *f = klock(c, "fq", DLOCK_KIND_FAIR), *w = klock(c, "wq", DLOCK_KIND_WRITE);
    res fr = {0}, wr = {0};
    START(dlock_async_acquire(f, DLOCK_WAIT_FOREVER, 10000, on_done, &fr));
    START(dlock_async_acquire(w, DLOCK_WAIT_FOREVER, 10000, on_done, &wr));
    RUN_UNTIL(qlen(rc, "fq") == 1, 3000);
    RUN_UNTIL(th_cmd_int(rc, "ZCARD {wq}:write_waiters") == 1, 3000);
    /* a blocking fair waiter queues behind the async one */
    bwaiter bf;
    bwaiter_start(&bf, s, "fq", DLOCK_KIND_FAIR, 10000);
    RUN_UNTIL(qlen(rc, "fq") == 2, 3000);
    run_for(50);
    ASSERT_EQ(fr.calls + wr.calls, 0);
    client_free(c);
    ASSERT_EQ(fr.calls, 1);
    ASSERT_EQ(wr.calls, 1);
    ASSERT_CODE(fr.code, DLOCK_ECANCELED);
    ASSERT_CODE(wr.code, DLOCK_ECANCELED);
    /* the queue has the blocking waiter only; no writer waits any more */
    int64_t t0 = th_now_ms();
    while (qlen(rc, "fq") != 1 || th_cmd_int(rc, "ZCARD {wq}:write_waiters") != 0) {
        ASSERT_LT(th_now_ms() - t0, 1000);
        th_sleep_ms(5);
    }
    ASSERT_EQ(th_cmd_int(rc, "LLEN redisson_lock_queue:{fq}"), 1);
    /* which the release serves */
    ASSERT_LOK(fh, dlock_release(fh));
    while (atomic_load(&bf.state) < 2) {
        ASSERT_LT(th_now_ms() - t0, 2000);
        th_sleep_ms(2);
    }
    ASSERT_CODE(bf.code, DLOCK_OK);
    bwaiter_join(&bf);
    ASSERT_LOK(wh, dlock_release(wh));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS fq"), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS wq"), 0);
    dlock_lock_free(fh);
    dlock_lock_free(wh);
    dlock_client_free(bc);
    redisFree(rc);
}

/* ---- fairkill ---- */

static void t_fairkill(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_lock *h = klock(c, "fk", DLOCK_KIND_FAIR), *w = klock(c, "fk", DLOCK_KIND_FAIR),
                     *rd = klock(c, "wk", DLOCK_KIND_READ), *wt = klock(c, "wk", DLOCK_KIND_WRITE);
    res hr = {0}, wr = {0}, rr = {0}, tr = {0};
    /* the connections lost under a fair wait, the server up: the wait goes
     * on over new connections and is granted the lock at the release */
    dlock_client *bc = th_client(s, 0);
    dlock_lock *bh = th_lock(bc, "fk", DLOCK_KIND_FAIR);
    ASSERT_LOK(bh, dlock_acquire(bh, DLOCK_NOWAIT, 30000, NULL));
    START(dlock_async_acquire(w, DLOCK_WAIT_FOREVER, 10000, on_done, &wr));
    RUN_UNTIL(qlen(rc, "fk") == 1, 3000);
    run_for(50);
    freeReplyObject(th_cmd(rc, "CLIENT KILL TYPE pubsub"));
    freeReplyObject(th_cmd(rc, "CLIENT KILL TYPE normal SKIPME yes"));
    run_for(500);
    ASSERT_EQ(wr.calls, 0);
    ASSERT_EQ(qlen(rc, "fk"), 1);
    ASSERT_LOK(bh, dlock_release(bh));
    int64_t t_rel = th_now_ms();
    WAIT_DONE(wr, 3000);
    ASSERT_MSG(wr.code == DLOCK_OK, "waiter: %s (%s)", dlock_strerror(wr.code),
               dlock_async_lock_errmsg(w));
    th_log("fair waiter after lost connections: granted %lld ms after the release",
           (long long)(wr.at - t_rel));
    ASSERT_LT(wr.at - t_rel, 1500);
    release_now(w);

    /* a waiter cancelled while its connections are down: the abandon is
     * kept, and the next operation's new connection takes it out of the
     * queue first */
    ASSERT_LOK(bh, dlock_acquire(bh, DLOCK_NOWAIT, 30000, NULL));
    memset(&wr, 0, sizeof wr);
    START(dlock_async_acquire(w, DLOCK_WAIT_FOREVER, 10000, on_done, &wr));
    RUN_UNTIL(qlen(rc, "fk") == 1, 3000);
    run_for(50);
    freeReplyObject(th_cmd(rc, "CLIENT KILL TYPE pubsub"));
    freeReplyObject(th_cmd(rc, "CLIENT KILL TYPE normal SKIPME yes"));
    /* the wait notes the failure (its message) and pauses before its next
     * attempt: cancelled then, nothing can be sent */
    RUN_UNTIL(dlock_async_lock_errmsg(w)[0] != '\0', 3000);
    ASSERT_OK(dlock_async_cancel(w));
    ASSERT_CODE(wr.code, DLOCK_ECANCELED);
    ASSERT_EQ(qlen(rc, "fk"), 1);
    res other = {0};
    START(dlock_async_acquire(rd, DLOCK_NOWAIT, 1000, on_done, &other));
    WAIT_DONE(other, 3000);
    ASSERT_CODE(other.code, DLOCK_OK);
    ASSERT_EQ(qlen(rc, "fk"), 0);
    release_now(rd);
    ASSERT_LOK(bh, dlock_release(bh));
    dlock_lock_free(bh);
    dlock_client_free(bc);

    /* the server killed under a fair wait and a write wait: both wait on,
     * and are served after the restart (the server comes back empty) */
    memset(&wr, 0, sizeof wr);
    hold(h, 30000, &hr);
    hold(rd, 30000, &rr);
    START(dlock_async_acquire(w, DLOCK_WAIT_FOREVER, 10000, on_done, &wr));
    START(dlock_async_acquire(wt, 20000, 10000, on_done, &tr));
    run_for(200);
    ASSERT_EQ(wr.calls + tr.calls, 0);
    th_server_halt(s, SIGKILL);
    run_for(1000);
    ASSERT_EQ(wr.calls + tr.calls, 0);
    th_log("waiter's message during the outage: %s", dlock_async_lock_errmsg(w));
    th_server_resume(s);
    int64_t t_up = th_now_ms();
    RUN_UNTIL(wr.calls + tr.calls == 2, 5000);
    th_log("after the restart: served in %lld and %lld ms", (long long)(wr.at - t_up),
           (long long)(tr.at - t_up));
    ASSERT_MSG(wr.code == DLOCK_OK, "waiter: %s (%s)", dlock_strerror(wr.code),
               dlock_async_lock_errmsg(w));
    ASSERT_MSG(tr.code == DLOCK_OK, "writer: %s (%s)", dlock_strerror(tr.code),
               dlock_async_lock_errmsg(wt));
    ASSERT_EQ(hr.calls, 1);
    ASSERT_EQ(rr.calls, 1);
    release_now(w);
    release_now(wt);
    /* the holds the restart erased: their releases find them gone */
    res gone = {0};
    START(dlock_async_release(h, on_done, &gone));
    WAIT_DONE(gone, 3000);
    ASSERT_CODE(gone.code, DLOCK_ELOST);
    /* the client works again */
    res again = {0};
    START(dlock_async_acquire(w, 3000, 10000, on_done, &again));
    WAIT_DONE(again, 5000);
    ASSERT_MSG(again.code == DLOCK_OK, "after restart: %s", dlock_async_lock_errmsg(w));
    release_now(w);
    redisFree(rc);
    client_free(c);
}

int main(int argc, char **argv) {
    static const async_case cases[] = {
        {"fair", t_fair},       {"faircancel", t_faircancel}, {"fairlong", t_fairlong},
        {"fairwait", t_fairwait},   {"rw", t_rw},
        {"rwcounter", t_rwcounter}, {"freeing", t_freeing}, {"fairkill", t_fairkill},
        {NULL, NULL},
    };
    return async_main(argc, argv, "async_kinds", cases);
}
