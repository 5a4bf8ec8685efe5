/* The async API's fair lock (include/dlock_async.h) on
 * real event loops (libuv, libevent, the bare interface: tests/async_loop.c)
 * and real servers, mixed with blocking clients on the same names.
 * argv[1] is "<case>_<loop>".
 *
 *   fair       FIFO grants across async handles and blocking threads queued
 *              in turn (the grant order checked, each handoff prompt); a
 *              hold's owner is its handle (re-entry counts, another handle
 *              of the same client is excluded)
 *   faircancel a fair waiter cancelled while queued, one cancelled with its
 *              first attempt still out (an orphan) and one timing out all
 *              leave the queue: the next waiter is served at the release,
 *              not after a queue entry's timeout
 *   fairkill   the server killed under a pending fair wait: it completes
 *              once with an error; the client works again after */
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
    /* w3 queues behind, cancelled before its first attempt's reply: the
     * orphan reply's abandon takes it out */
    START(dlock_async_acquire(w3, DLOCK_WAIT_FOREVER, 10000, on_done, &r3));
    ASSERT_OK(dlock_async_cancel(w3));
    ASSERT_EQ(r3.calls, 1);
    ASSERT_CODE(r3.code, DLOCK_ECANCELED);
    /* w4 times out in the queue */
    START(dlock_async_acquire(w4, 300, 10000, on_done, &r4));
    WAIT_DONE(r4, 3000);
    ASSERT_CODE(r4.code, DLOCK_ETIMEDOUT);
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
    release_now(w2);
    run_for(100);
    ASSERT_EQ(r1.calls + r3.calls + r4.calls, 3);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS fc"), 0);
    redisFree(rc);
    client_free(c2);
    client_free(c);
}

/* ---- fairkill ---- */

static void t_fairkill(th_server *s) {
    dlock_async_client *c = client(s);
    dlock_async_lock *h = klock(c, "fk", DLOCK_KIND_FAIR), *w = klock(c, "fk", DLOCK_KIND_FAIR);
    res hr = {0}, wr = {0};
    hold(h, 30000, &hr);
    START(dlock_async_acquire(w, DLOCK_WAIT_FOREVER, 10000, on_done, &wr));
    run_for(200);
    ASSERT_EQ(wr.calls, 0);
    th_server_halt(s, SIGKILL);
    WAIT_DONE(wr, 5000);
    run_for(300);
    ASSERT_EQ(wr.calls, 1);
    ASSERT_MSG(wr.code == DLOCK_EIO, "waiter: %s (%s)", dlock_strerror(wr.code),
               dlock_async_lock_errmsg(w));
    th_log("waiter's message: %s", dlock_async_lock_errmsg(w));
    ASSERT_EQ(hr.calls, 1);
    th_server_resume(s);
    /* the client works again: the restarted server is empty */
    res again = {0};
    START(dlock_async_acquire(w, 3000, 10000, on_done, &again));
    WAIT_DONE(again, 5000);
    ASSERT_MSG(again.code == DLOCK_OK, "after restart: %s", dlock_async_lock_errmsg(w));
    release_now(w);
    client_free(c);
}

int main(int argc, char **argv) {
    static const async_case cases[] = {
        {"fair", t_fair}, {"faircancel", t_faircancel}, {"fairkill", t_fairkill},
        {NULL, NULL},
    };
    return async_main(argc, argv, "async_kinds", cases);
}
