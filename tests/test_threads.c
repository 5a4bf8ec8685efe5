/* Threads sharing one dlock_client: 4 threads, each with its own handle, do
 * acquire / non-atomic increment / release on one plain lock (exact count);
 * and one thread's blocked wait does not hold up another thread's commands
 * (PINGs complete while the waiter waits). */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define NTHREADS 4
#define ROUNDS 100

static th_server *g_srv;
static dlock_client *g_c;

static void *incr_thread(void *arg)
{
    (void)arg;
    dlock_lock *l = th_lock(g_c, "thr:lock", DLOCK_KIND_PLAIN);
    redisContext *rc = th_redis(g_srv);
    for (int i = 0; i < ROUNDS; i++) {
        ASSERT_LOK(l, dlock_acquire(l, 20000, (i % 2) ? DLOCK_WATCHDOG : 10000, NULL));
        ASSERT_EQ(th_cmd_int(rc, "INCR thr:inside"), 1);
        char *v = th_cmd_str(rc, "GET thr:counter");
        long long n = v ? atoll(v) : 0;
        free(v);
        if (i % 5 == 0) th_sleep_ms(1);
        th_cmd_ok(rc, "SET thr:counter %lld", n + 1);
        ASSERT_EQ(th_cmd_int(rc, "DECR thr:inside"), 0);
        ASSERT_LOK(l, dlock_release(l));
    }
    redisFree(rc);
    dlock_lock_free(l);
    return NULL;
}

typedef struct {
    int rc;
    atomic_int started;
    atomic_int done;
    atomic_llong t_done;
} waiter_state;

static void *waiter_thread(void *arg)
{
    waiter_state *w = arg;
    dlock_lock *l = th_lock(g_c, "thr:block", DLOCK_KIND_PLAIN);
    atomic_store(&w->started, 1);
    w->rc = dlock_acquire(l, 10000, 5000, NULL);
    atomic_store(&w->t_done, (long long)th_now_ms());
    atomic_store(&w->done, 1);
    if (w->rc == DLOCK_OK) dlock_release(l);
    dlock_lock_free(l);
    return NULL;
}

typedef struct {
    int n;
    int64_t max_rtt_us;
    int64_t t_end;
    int failures;
} pinger_state;

static void *pinger_thread(void *arg)
{
    pinger_state *p = arg;
    for (int i = 0; i < 50; i++) {
        int64_t rtt = -1;
        int64_t t0 = th_now_us();
        if (dlock_ping(g_c, &rtt) != DLOCK_OK) p->failures++;
        int64_t wall = th_now_us() - t0;
        if (wall > p->max_rtt_us) p->max_rtt_us = wall;
        if (rtt < 0 || rtt > wall + 1000) p->failures++;
        p->n++;
    }
    p->t_end = th_now_ms();
    return NULL;
}

static void *query_thread(void *arg)
{
    int *failures = arg;
    for (int i = 0; i < 30; i++) {
        int locked = -1;
        if (dlock_is_locked(g_c, "thr:block", DLOCK_CSTR, &locked) != DLOCK_OK || locked != 1)
            (*failures)++;
    }
    return NULL;
}

static void *errmsg_thread(void *arg)
{
    int *saw = arg;
    *saw = dlock_errmsg(g_c)[0] != '\0';
    return NULL;
}

int main(void)
{
    th_init("threads");
    g_srv = th_server_start(NULL);
    g_c = th_client(g_srv, 1500);
    redisContext *rc = th_redis(g_srv);

    /* 1. exact count with NTHREADS threads on one client */
    pthread_t th[NTHREADS];
    int64_t t0 = th_now_ms();
    for (int i = 0; i < NTHREADS; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, incr_thread, NULL), 0);
    for (int i = 0; i < NTHREADS; i++) ASSERT_EQ(pthread_join(th[i], NULL), 0);
    char *v = th_cmd_str(rc, "GET thr:counter");
    ASSERT_NOT_NULL(v);
    ASSERT_EQ(atoll(v), NTHREADS * ROUNDS);
    free(v);
    th_log("%d threads x %d rounds in %lld ms", NTHREADS, ROUNDS, (long long)(th_now_ms() - t0));

    /* 2. a blocked waiter does not hold up other threads of the client */
    dlock_lock *h = th_lock(g_c, "thr:block", DLOCK_KIND_PLAIN);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    waiter_state w;
    memset(&w, 0, sizeof w);
    w.rc = -1;
    pthread_t wt, pt, qt;
    ASSERT_EQ(pthread_create(&wt, NULL, waiter_thread, &w), 0);
    /* the waiter is blocked once it subscribed to the unlock channel */
    th_wait_subscribers(rc, "thr:block", 1, 5000);
    pinger_state p;
    memset(&p, 0, sizeof p);
    int qfail = 0;
    int64_t tp = th_now_ms();
    ASSERT_EQ(pthread_create(&pt, NULL, pinger_thread, &p), 0);
    ASSERT_EQ(pthread_create(&qt, NULL, query_thread, &qfail), 0);
    ASSERT_EQ(pthread_join(pt, NULL), 0);
    ASSERT_EQ(pthread_join(qt, NULL), 0);
    /* all pings were done while the waiter was still waiting */
    ASSERT_EQ(atomic_load(&w.done), 0);
    ASSERT_EQ(p.n, 50);
    ASSERT_EQ(p.failures, 0);
    ASSERT_EQ(qfail, 0);
    th_log("50 pings + 30 queries during a blocked wait: %lld ms, slowest ping %lld us",
           (long long)(p.t_end - tp), (long long)p.max_rtt_us);
    /* a ping or query held up by the waiter would last until its 10 s wait
     * ran out (the check of w.done above); the times stay well within it */
    ASSERT_LT(p.t_end - tp, 8000);
    ASSERT_LT(p.max_rtt_us, 5000000);
    int64_t t_rel = th_now_ms();
    ASSERT_LOK(h, dlock_release(h));
    ASSERT_EQ(pthread_join(wt, NULL), 0);
    ASSERT_CODE(w.rc, DLOCK_OK);
    /* woken: not at the end of the holder's 20 s lease */
    ASSERT_LT((int64_t)atomic_load(&w.t_done) - t_rel, 5000);
    dlock_lock_free(h);

    /* 3. client-level messages are per thread: a failure here is not seen there */
    int locked;
    ASSERT_CODE(dlock_is_locked(g_c, "", 0, &locked), DLOCK_EINVAL);
    ASSERT(dlock_errmsg(g_c)[0] != '\0');
    int other_saw = -1;
    ASSERT_EQ(pthread_create(&qt, NULL, errmsg_thread, &other_saw), 0);
    ASSERT_EQ(pthread_join(qt, NULL), 0);
    ASSERT_EQ(other_saw, 0);
    ASSERT(dlock_errmsg(g_c)[0] != '\0');

    redisFree(rc);
    dlock_client_free(g_c);
    th_server_stop(g_srv);
    th_log("ok");
    return 0;
}
