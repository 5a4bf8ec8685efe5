/* dlock_lock_cancel: a waiter thread W blocked in dlock_acquire is cancelled
 * from another thread (or a signal handler). argv[1] picks the part:
 *   plain    W returns DLOCK_ECANCELED at once (the holder's lease is 20 s),
 *            its registration and subscription are gone, the holder still
 *            holds; W's next acquire waits as usual and gets the lock
 *   fair     W1 and W2 queue behind the holder; W1 is cancelled: it leaves
 *            the queue at once, so on the release W2 gets the lock at once
 *            (a waiter that just died would stall it until its queue entry's
 *            deadline, 5 s)
 *   stale    a cancel with no acquire under way is not for later ones: an
 *            acquire with a 300 ms wait then times out (DLOCK_ETIMEDOUT);
 *            waits leave no descriptor behind (each has its own eventfd)
 *   signal   the cancel comes from a SIGUSR1 handler
 *   multi    dlock_multi_acquire of {a, b}, b held elsewhere: cancelling both
 *            ends it with DLOCK_ECANCELED and a is given back
 *   redlock  RedLock over 3 servers: the retry sleep is cut short too
 *   contract th_check_lock_cancel, the check every backend's test runs
 *   objects  a semaphore acquire, a permit acquire and a latch await, each
 *            waiting in a thread, are cancelled the same way (and hold
 *            nothing afterwards) */
#include "harness.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME "cancel:lock"
#define FAST_MS 1500 /* "at once": far below every lease and deadline here */

typedef struct waiter {
    dlock_lock *l;
    dlock_lock *set[2]; /* multi: the set (l unused) */
    int64_t wait_ms;
    int rc;
    int64_t t_done;
    atomic_int done;
    pthread_t th;
} waiter;

static void *wait_main(void *arg)
{
    waiter *w = arg;
    if (w->set[0])
        w->rc = dlock_multi_acquire(w->set, 2, w->wait_ms, 10000, NULL);
    else
        w->rc = dlock_acquire(w->l, w->wait_ms, 10000, NULL);
    w->t_done = th_now_ms();
    atomic_store(&w->done, 1);
    return NULL;
}

static void start(waiter *w, dlock_lock *l, int64_t wait_ms)
{
    w->l = l;
    w->wait_ms = wait_ms;
    w->rc = -1;
    atomic_init(&w->done, 0);
    ASSERT_EQ(pthread_create(&w->th, NULL, wait_main, w), 0);
}

static void join(waiter *w)
{
    ASSERT_EQ(pthread_join(w->th, NULL), 0);
}

/* Cancels W (already seen waiting) and checks it returns DLOCK_ECANCELED
 * within FAST_MS. */
static void cancel_and_check(waiter *w, dlock_lock *l)
{
    th_sleep_ms(50); /* asleep in its wait */
    ASSERT(!atomic_load(&w->done));
    int64_t t0 = th_now_ms();
    ASSERT_EQ(dlock_lock_cancel(l), DLOCK_OK);
    join(w);
    th_log("cancelled: returned %s after %lld ms", dlock_strerror(w->rc),
           (long long)(w->t_done - t0));
    ASSERT_CODE(w->rc, DLOCK_ECANCELED);
    ASSERT_LT(w->t_done - t0, FAST_MS);
}

static void part_plain(th_server *s)
{
    redisContext *rc = th_redis(s);
    dlock_client *hc = th_client(s, 0), *wc = th_client(s, 0);
    dlock_lock *h = th_lock(hc, NAME, DLOCK_KIND_PLAIN);
    dlock_lock *l = th_lock(wc, NAME, DLOCK_KIND_PLAIN);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    waiter w = {0};
    start(&w, l, DLOCK_WAIT_FOREVER);
    th_wait_subscribers(rc, NAME, 1, 5000);
    cancel_and_check(&w, l);
    ASSERT(strstr(dlock_lock_errmsg(l), "cancel") != NULL);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD dlock_waiters:{%s}", NAME), 0);
    ASSERT_EQ(th_subscribers(rc, NAME), 0);
    ASSERT_EQ(dlock_lock_holding(l), 0);
    char *v = th_cmd_str(rc, "GET %s", NAME);
    ASSERT_STR_EQ(v, dlock_lock_token(h));
    free(v);
    /* the next acquire is not cancelled: it waits and gets the lock */
    memset(&w, 0, sizeof w);
    start(&w, l, 10000);
    th_wait_subscribers(rc, NAME, 1, 5000);
    ASSERT_LOK(h, dlock_release(h));
    join(&w);
    ASSERT_CODE(w.rc, DLOCK_OK);
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_lock_free(h);
    dlock_client_free(wc);
    dlock_client_free(hc);
    redisFree(rc);
}

static void part_fair(th_server *s)
{
    redisContext *rc = th_redis(s);
    dlock_client *hc = th_client(s, 0), *c1 = th_client(s, 0), *c2 = th_client(s, 0);
    dlock_lock *h = th_lock(hc, NAME, DLOCK_KIND_FAIR);
    dlock_lock *l1 = th_lock(c1, NAME, DLOCK_KIND_FAIR);
    dlock_lock *l2 = th_lock(c2, NAME, DLOCK_KIND_FAIR);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    waiter w1 = {0}, w2 = {0};
    start(&w1, l1, DLOCK_WAIT_FOREVER);
    th_wait_subscribers(rc, NAME, 1, 5000);
    start(&w2, l2, 10000);
    th_wait_subscribers(rc, NAME, 2, 5000);
    cancel_and_check(&w1, l1);
    ASSERT_EQ(th_cmd_int(rc, "LLEN redisson_lock_queue:{%s}", NAME), 1);
    int64_t t0 = th_now_ms();
    ASSERT_LOK(h, dlock_release(h));
    join(&w2);
    ASSERT_CODE(w2.rc, DLOCK_OK);
    th_log("W2 had the lock %lld ms after the release", (long long)(w2.t_done - t0));
    ASSERT_LT(w2.t_done - t0, FAST_MS);
    ASSERT_LOK(l2, dlock_release(l2));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s redisson_lock_queue:{%s}", NAME, NAME), 0);
    dlock_lock_free(l1);
    dlock_lock_free(l2);
    dlock_lock_free(h);
    dlock_client_free(c1);
    dlock_client_free(c2);
    dlock_client_free(hc);
    redisFree(rc);
}

/* Open descriptors of this process. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    ASSERT(d != NULL);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static void part_stale(th_server *s)
{
    dlock_client *hc = th_client(s, 0), *wc = th_client(s, 0);
    dlock_lock *h = th_lock(hc, NAME, DLOCK_KIND_PLAIN);
    dlock_lock *l = th_lock(wc, NAME, DLOCK_KIND_PLAIN);
    ASSERT_EQ(dlock_lock_cancel(l), DLOCK_OK); /* nothing under way */
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    int64_t t0 = th_now_ms();
    ASSERT_LCODE(l, dlock_acquire(l, 300, 10000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_GE(th_now_ms() - t0, 250);
    /* cancelled twice more between waits: still not for the next one */
    ASSERT_EQ(dlock_lock_cancel(l), DLOCK_OK);
    ASSERT_EQ(dlock_lock_cancel(l), DLOCK_OK);
    ASSERT_LCODE(l, dlock_acquire(l, 300, 10000, NULL), DLOCK_ETIMEDOUT);
    /* the handle's one eventfd serves every wait: no descriptor per wait,
     * and it is closed with the handle */
    int fds0 = open_fds();
    for (int i = 0; i < 20; i++)
        ASSERT_LCODE(l, dlock_acquire(l, 10, 10000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_EQ(open_fds(), fds0);
    ASSERT_LOK(h, dlock_release(h));
    ASSERT_LOK(l, dlock_acquire(l, 300, 10000, NULL));
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(dlock_lock_cancel(NULL), DLOCK_EINVAL);
    dlock_lock_free(l);
    ASSERT_EQ(open_fds(), fds0 - 1);
    dlock_lock_free(h);
    dlock_client_free(wc);
    dlock_client_free(hc);
}

static dlock_lock *volatile g_cancel;

static void on_usr1(int sig)
{
    (void)sig;
    dlock_lock_cancel(g_cancel);
}

static void part_signal(th_server *s)
{
    redisContext *rc = th_redis(s);
    dlock_client *hc = th_client(s, 0), *wc = th_client(s, 0);
    dlock_lock *h = th_lock(hc, NAME, DLOCK_KIND_FAIR);
    dlock_lock *l = th_lock(wc, NAME, DLOCK_KIND_FAIR);
    g_cancel = l;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    waiter w = {0};
    start(&w, l, DLOCK_WAIT_FOREVER);
    th_wait_subscribers(rc, NAME, 1, 5000);
    th_sleep_ms(50);
    int64_t t0 = th_now_ms();
    ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
    join(&w);
    ASSERT_CODE(w.rc, DLOCK_ECANCELED);
    ASSERT_LT(w.t_done - t0, FAST_MS);
    ASSERT_EQ(th_cmd_int(rc, "LLEN redisson_lock_queue:{%s}", NAME), 0);
    ASSERT_LOK(h, dlock_release(h));
    dlock_lock_free(l);
    dlock_lock_free(h);
    dlock_client_free(wc);
    dlock_client_free(hc);
    redisFree(rc);
}

static void part_multi(th_server *s)
{
    redisContext *rc = th_redis(s);
    dlock_client *hc = th_client(s, 0), *wc = th_client(s, 0);
    dlock_lock *hb = th_lock(hc, "cancel:b", DLOCK_KIND_PLAIN);
    dlock_lock *a = th_lock(wc, "cancel:a", DLOCK_KIND_PLAIN);
    dlock_lock *b = th_lock(wc, "cancel:b", DLOCK_KIND_PLAIN);
    ASSERT_LOK(hb, dlock_acquire(hb, DLOCK_NOWAIT, 20000, NULL));
    waiter w = {0};
    w.set[0] = a;
    w.set[1] = b;
    start(&w, NULL, DLOCK_WAIT_FOREVER);
    th_wait_subscribers(rc, "cancel:b", 1, 5000);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS cancel:a"), 1); /* a is had, b awaited */
    th_sleep_ms(50);
    int64_t t0 = th_now_ms();
    ASSERT_EQ(dlock_lock_cancel(a), DLOCK_OK);
    ASSERT_EQ(dlock_lock_cancel(b), DLOCK_OK);
    join(&w);
    ASSERT_CODE(w.rc, DLOCK_ECANCELED);
    ASSERT_LT(w.t_done - t0, FAST_MS);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS cancel:a"), 0);
    ASSERT_EQ(dlock_lock_holding(a) + dlock_lock_holding(b), 0);
    ASSERT_LOK(hb, dlock_release(hb));
    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_lock_free(hb);
    dlock_client_free(wc);
    dlock_client_free(hc);
    redisFree(rc);
}

static void part_redlock(void)
{
    enum { NODES = 3 };
    th_server *srv[NODES];
    char url[256];
    size_t off = (size_t)snprintf(url, sizeof url, "redlock://");
    for (int i = 0; i < NODES; i++) {
        srv[i] = th_server_start(NULL);
        off += (size_t)snprintf(url + off, sizeof url - off, "%s127.0.0.1:%d", i ? "," : "",
                                th_server_port(srv[i]));
    }
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *hc = NULL, *wc = NULL;
    ASSERT_EQ(dlock_client_new(&o, &hc), DLOCK_OK);
    ASSERT_EQ(dlock_client_new(&o, &wc), DLOCK_OK);
    dlock_lock *h = th_lock(hc, NAME, DLOCK_KIND_PLAIN);
    dlock_lock *l = th_lock(wc, NAME, DLOCK_KIND_PLAIN);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    waiter w = {0};
    start(&w, l, DLOCK_WAIT_FOREVER);
    th_sleep_ms(300); /* a few attempts and retry sleeps */
    cancel_and_check(&w, l);
    ASSERT_LOK(h, dlock_release(h));
    dlock_lock_free(l);
    dlock_lock_free(h);
    dlock_client_free(wc);
    dlock_client_free(hc);
    for (int i = 0; i < NODES; i++) th_server_stop(srv[i]);
}

/* ---- semaphores, permits, latch ---- */

typedef struct objwait {
    int which; /* 0 semaphore, 1 permits, 2 latch */
    dlock_semaphore *s;
    dlock_permits *p;
    dlock_latch *l;
    int rc;
    int64_t t_done;
    pthread_t th;
} objwait;

static void *obj_main(void *arg)
{
    objwait *o = arg;
    char id[DLOCK_PERMIT_ID_LEN + 1];
    o->rc = o->which == 0   ? dlock_semaphore_acquire(o->s, 1, DLOCK_WAIT_FOREVER)
            : o->which == 1 ? dlock_permits_acquire(o->p, DLOCK_WAIT_FOREVER, 10000, id)
                            : dlock_latch_await(o->l, DLOCK_WAIT_FOREVER);
    o->t_done = th_now_ms();
    return NULL;
}

static int obj_cancel(objwait *o)
{
    return o->which == 0   ? dlock_semaphore_cancel(o->s)
           : o->which == 1 ? dlock_permits_cancel(o->p)
                           : dlock_latch_cancel(o->l);
}

static void part_objects(th_server *s)
{
    redisContext *rc = th_redis(s);
    dlock_client *c = th_client(s, 0);
    static const char *const chans[3] = {"redisson_sc:{cancel:sem}", "redisson_sc:{cancel:pm}",
                                         "redisson_countdownlatch__channel__{cancel:la}"};
    objwait o[3];
    memset(o, 0, sizeof o);
    ASSERT_COK(c, dlock_semaphore_new(c, "cancel:sem", DLOCK_CSTR, &o[0].s));
    ASSERT_COK(c, dlock_permits_new(c, "cancel:pm", DLOCK_CSTR, &o[1].p));
    ASSERT_COK(c, dlock_latch_new(c, "cancel:la", DLOCK_CSTR, &o[2].l));
    int set = 0;
    ASSERT_EQ(dlock_semaphore_try_set(o[0].s, 0, &set), DLOCK_OK); /* no permit free */
    ASSERT_EQ(dlock_permits_try_set(o[1].p, 0, &set), DLOCK_OK);
    ASSERT_EQ(dlock_latch_set(o[2].l, 1), DLOCK_OK);
    for (int k = 0; k < 3; k++) {
        o[k].which = k;
        o[k].rc = -1;
        ASSERT_EQ(pthread_create(&o[k].th, NULL, obj_main, &o[k]), 0);
        ASSERT_EVENTUALLY(th_numsub(rc, chans[k]) == 1, 5000);
        th_sleep_ms(50);
        int64_t t0 = th_now_ms();
        ASSERT_EQ(obj_cancel(&o[k]), DLOCK_OK);
        ASSERT_EQ(pthread_join(o[k].th, NULL), 0);
        th_log("object %d: %s after %lld ms", k, dlock_strerror(o[k].rc),
               (long long)(o[k].t_done - t0));
        ASSERT_CODE(o[k].rc, DLOCK_ECANCELED);
        ASSERT_LT(o[k].t_done - t0, FAST_MS);
        ASSERT_EVENTUALLY(th_numsub(rc, chans[k]) == 0, 2000);
    }
    int64_t n = -1;
    ASSERT_EQ(dlock_semaphore_available(o[0].s, &n), DLOCK_OK);
    ASSERT_EQ(n, 0);
    ASSERT_EQ(dlock_permits_available(o[1].p, &n), DLOCK_OK);
    ASSERT_EQ(n, 0);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {cancel:pm}:timeout"), 0); /* no permit out */
    ASSERT_EQ(dlock_latch_cancel(NULL), DLOCK_EINVAL);
    dlock_semaphore_free(o[0].s);
    dlock_permits_free(o[1].p);
    dlock_latch_free(o[2].l);
    dlock_client_free(c);
    redisFree(rc);
}

int main(int argc, char **argv)
{
    const char *part = argc > 1 ? argv[1] : "plain";
    th_init("cancel");
    if (!strcmp(part, "redlock")) {
        part_redlock();
        return 0;
    }
    th_server *s = th_server_start(NULL);
    if (!strcmp(part, "plain")) part_plain(s);
    else if (!strcmp(part, "fair")) part_fair(s);
    else if (!strcmp(part, "stale")) part_stale(s);
    else if (!strcmp(part, "signal")) part_signal(s);
    else if (!strcmp(part, "multi")) part_multi(s);
    else if (!strcmp(part, "objects")) part_objects(s);
    else if (!strcmp(part, "contract")) {
        /* the contract every backend's test checks (tests/harness.c) */
        dlock_client *c = th_client(s, 0);
        th_check_lock_cancel(c, "cancel:contract", 20000);
        th_check_semaphore_cancel(c, "cancel:contract-sem");
        dlock_client_free(c);
    }
    else th_fail(__FILE__, __LINE__, "unknown part %s", part);
    th_server_stop(s);
    return 0;
}
