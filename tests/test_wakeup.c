/* Waiting: a blocked waiter wakes on release without waiting out a poll or the
 * lease (holder lease 20 s, released after ~200 ms: the waiter must hold it
 * within 2 s of the release); a release that publishes nothing (raw DEL, or a
 * foreign SET NX PX lock expiring) is noticed within the remaining TTL +
 * margin; a wait bound gives DLOCK_ETIMEDOUT on time. Both kinds. */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define MARGIN 800

typedef struct waiter {
    dlock_client *c;
    const char *name;
    dlock_kind kind;
    int64_t wait_ms;
    int rc;
    int64_t t_start, t_got;
    atomic_int done;
    char msg[256];
    pthread_t th;
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;
    dlock_lock *l = th_lock(w->c, w->name, w->kind);
    w->t_start = th_now_ms();
    w->rc = dlock_acquire(l, w->wait_ms, 5000, NULL);
    w->t_got = th_now_ms();
    snprintf(w->msg, sizeof w->msg, "%s", dlock_lock_errmsg(l));
    if (w->rc == DLOCK_OK) dlock_release(l);
    dlock_lock_free(l);
    atomic_store(&w->done, 1);
    return NULL;
}

static void start_waiter(waiter *w, dlock_client *c, const char *name, dlock_kind kind,
                         int64_t wait_ms)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    w->name = name;
    w->kind = kind;
    w->wait_ms = wait_ms;
    w->rc = -1;
    ASSERT_EQ(pthread_create(&w->th, NULL, wait_thread, w), 0);
}

static void join_waiter(waiter *w)
{
    ASSERT_EQ(pthread_join(w->th, NULL), 0);
    if (w->rc != DLOCK_OK && w->rc != DLOCK_ETIMEDOUT)
        th_log("waiter on %s: %s: %s", w->name, dlock_strerror(w->rc), w->msg);
}

static void wait_subscribed(redisContext *rc, const char *name)
{
    th_wait_subscribers(rc, name, 1, 5000);
}

static void wake_on_release(dlock_client *hc, dlock_client *wc, redisContext *rc,
                            const char *name, dlock_kind kind, int64_t wait_ms)
{
    dlock_lock *h = th_lock(hc, name, kind);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    waiter w;
    start_waiter(&w, wc, name, kind, wait_ms);
    wait_subscribed(rc, name);
    th_sleep_ms(200);
    ASSERT_EQ(atomic_load(&w.done), 0);
    int64_t t_rel = th_now_ms();
    ASSERT_LOK(h, dlock_release(h));
    join_waiter(&w);
    ASSERT_CODE(w.rc, DLOCK_OK);
    th_log("%s: waiter had it %lld ms after the release (holder lease 20 s)", name,
           (long long)(w.t_got - t_rel));
    ASSERT_LT(w.t_got - t_rel, 2000);
    dlock_lock_free(h);
}

static void wake_on_silent_delete(dlock_client *hc, dlock_client *wc, redisContext *rc,
                                  const char *name, dlock_kind kind)
{
    dlock_lock *h = th_lock(hc, name, kind);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 1000, NULL));
    waiter w;
    start_waiter(&w, wc, name, kind, 10000);
    wait_subscribed(rc, name);
    long long ttl = th_cmd_int(rc, "PTTL %s", name);
    int64_t t_del = th_now_ms();
    ASSERT_EQ(th_cmd_int(rc, "DEL %s", name), 1); /* publishes nothing */
    join_waiter(&w);
    ASSERT_CODE(w.rc, DLOCK_OK);
    th_log("%s: raw DEL with %lld ms left; waiter had it %lld ms later", name, ttl,
           (long long)(w.t_got - t_del));
    ASSERT_LE(w.t_got - t_del, ttl + MARGIN);
    ASSERT_LCODE(h, dlock_release(h), DLOCK_ELOST);
    dlock_lock_free(h);
}

int main(void)
{
    th_init("wakeup");
    th_server *s = th_server_start(NULL);
    dlock_client *hc = th_client(s, 0);
    dlock_client *wc = th_client(s, 0);
    redisContext *rc = th_redis(s);

    wake_on_release(hc, wc, rc, "wake:plain", DLOCK_KIND_PLAIN, 10000);
    wake_on_release(hc, wc, rc, "wake:re", DLOCK_KIND_REENTRANT, 10000);
    wake_on_release(hc, wc, rc, "wake:forever", DLOCK_KIND_PLAIN, DLOCK_WAIT_FOREVER);

    wake_on_silent_delete(hc, wc, rc, "silent:plain", DLOCK_KIND_PLAIN);
    wake_on_silent_delete(hc, wc, rc, "silent:re", DLOCK_KIND_REENTRANT);

    /* a foreign plain lock (redis-py style: SET NX PX, no pub/sub) expiring */
    int64_t t_set = th_now_ms();
    th_cmd_ok(rc, "SET silent:foreign 0123456789abcdef NX PX 800");
    waiter w;
    start_waiter(&w, wc, "silent:foreign", DLOCK_KIND_PLAIN, 10000);
    join_waiter(&w);
    ASSERT_CODE(w.rc, DLOCK_OK);
    th_log("foreign 800 ms lock: waiter had it %lld ms after the SET", (long long)(w.t_got - t_set));
    ASSERT_LE(w.t_got - t_set, 800 + MARGIN);

    /* a foreign holder without any expiry (PTTL -1) deleted silently: the
     * waiter rechecks on its own and gets it well before its bound */
    th_cmd_ok(rc, "SET silent:noexpiry foreign-token");
    start_waiter(&w, wc, "silent:noexpiry", DLOCK_KIND_PLAIN, 8000);
    th_wait_subscribers(rc, "silent:noexpiry", 1, 5000);
    th_sleep_ms(300);
    int64_t t_del = th_now_ms();
    ASSERT_EQ(th_cmd_int(rc, "DEL silent:noexpiry"), 1);
    join_waiter(&w);
    ASSERT_CODE(w.rc, DLOCK_OK);
    th_log("holder without expiry deleted silently: waiter had it %lld ms later (bound 8 s)",
           (long long)(w.t_got - t_del));
    ASSERT_LT(w.t_got - w.t_start, 8000 - 500);

    /* the wait bound: DLOCK_ETIMEDOUT, on time, nothing held */
    dlock_lock *h = th_lock(hc, "wake:bound", DLOCK_KIND_PLAIN);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    /* a reentrant handle on a plain lock's key never takes it (kind mismatch) */
    dlock_lock *b = th_lock(wc, "wake:bound", DLOCK_KIND_REENTRANT);
    int code = dlock_acquire(b, 300, 5000, NULL);
    ASSERT_MSG(code != DLOCK_OK, "a reentrant handle took a plain lock's key");
    ASSERT_EQ(dlock_lock_holding(b), 0);
    dlock_lock_free(b);
    b = th_lock(wc, "wake:bound", DLOCK_KIND_PLAIN);
    int64_t t0 = th_now_ms();
    ASSERT_LCODE(b, dlock_acquire(b, 300, 5000, NULL), DLOCK_ETIMEDOUT);
    int64_t took = th_now_ms() - t0;
    ASSERT_GE(took, 290);
    ASSERT_LE(took, 300 + MARGIN);
    dlock_lock_free(b);
    /* the same bound for a reentrant waiter on a reentrant holder */
    dlock_lock *hr = th_lock(hc, "wake:bound:re", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(hr, dlock_acquire(hr, DLOCK_NOWAIT, 20000, NULL));
    b = th_lock(wc, "wake:bound:re", DLOCK_KIND_REENTRANT);
    t0 = th_now_ms();
    ASSERT_LCODE(b, dlock_acquire(b, 300, 5000, NULL), DLOCK_ETIMEDOUT);
    took = th_now_ms() - t0;
    ASSERT_GE(took, 290);
    ASSERT_LE(took, 300 + MARGIN);
    ASSERT_EQ(dlock_lock_holding(b), 0);
    dlock_lock_free(b);
    ASSERT_LOK(hr, dlock_release(hr));
    dlock_lock_free(hr);
    /* the holder's 20 s lease is untouched */
    ASSERT_GT(th_cmd_int(rc, "PTTL wake:bound"), 15000);
    ASSERT_LOK(h, dlock_release(h));
    dlock_lock_free(h);

    /* several waiters: each release hands the lock to one of them, all get it */
    dlock_lock *hh = th_lock(hc, "wake:many", DLOCK_KIND_PLAIN);
    ASSERT_LOK(hh, dlock_acquire(hh, DLOCK_NOWAIT, 20000, NULL));
    waiter ws[3];
    for (int i = 0; i < 3; i++) start_waiter(&ws[i], wc, "wake:many", DLOCK_KIND_PLAIN, 10000);
    th_wait_subscribers(rc, "wake:many", 1, 5000);
    th_sleep_ms(200);
    int64_t t_rel = th_now_ms();
    ASSERT_LOK(hh, dlock_release(hh));
    for (int i = 0; i < 3; i++) {
        join_waiter(&ws[i]);
        ASSERT_CODE(ws[i].rc, DLOCK_OK);
    }
    int64_t last = 0;
    for (int i = 0; i < 3; i++)
        if (ws[i].t_got - t_rel > last) last = ws[i].t_got - t_rel;
    th_log("3 waiters all had it within %lld ms of the first release", (long long)last);
    ASSERT_LT(last, 3000);
    dlock_lock_free(hh);

    redisFree(rc);
    dlock_client_free(wc);
    dlock_client_free(hc);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
