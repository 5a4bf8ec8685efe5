/* Watchdog leases: a DLOCK_WATCHDOG lock (client watchdog_lease_ms = 600) is
 * kept for more than 4 lease periods (PTTL stays in (0, 600], another client
 * cannot take it), for both kinds; an explicit-lease lock expires on its own
 * and its release reports DLOCK_ELOST; dlock_extend turns a watchdog lock into
 * an explicit lease that then runs out. A holder cut off from the server
 * (its proxy killed, or frozen) gets the lost callback
 * (DLOCK_LOST_UNREACHABLE) before another client can acquire the lock. */
#include "harness.h"

#include <pthread.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define WD_LEASE 600
#define HOLD_MS 2500

static void hold_with_watchdog(const th_server *s, dlock_client *c, dlock_client *other,
                               redisContext *rc, const char *name, dlock_kind kind)
{
    dlock_lock *l = th_lock(c, name, kind);
    dlock_lock *lo = th_lock(other, name, kind);
    int64_t t0 = th_now_ms();
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    long long min_pttl = WD_LEASE;
    int tries = 0;
    int64_t next_try = t0;
    while (th_now_ms() - t0 < HOLD_MS) {
        long long pttl = th_cmd_int(rc, "PTTL %s", name);
        ASSERT_GT(pttl, 0);
        ASSERT_LE(pttl, WD_LEASE);
        if (pttl < min_pttl) min_pttl = pttl;
        if (th_now_ms() >= next_try) {
            ASSERT_LCODE(lo, dlock_acquire(lo, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
            tries++;
            next_try += 250;
        }
        th_sleep_ms(20);
    }
    int64_t ttl = 0;
    ASSERT_COK(c, dlock_remaining_ttl(c, name, DLOCK_CSTR, &ttl));
    ASSERT_GT(ttl, 0);
    int held = 0;
    ASSERT_LOK(l, dlock_lock_check(l, &held, NULL));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(dlock_lock_is_lost(l), 0);
    th_log("%s: held %d ms (%.1f leases), min PTTL seen %lld ms, %d foreign tries refused", name,
           (int)(th_now_ms() - t0), (double)(th_now_ms() - t0) / WD_LEASE, min_pttl, tries);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", name), 0);
    ASSERT_LOK(lo, dlock_acquire(lo, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(lo, dlock_release(lo));
    dlock_lock_free(lo);
    dlock_lock_free(l);
    (void)s;
}

#define CUT_LEASE 1000
static atomic_llong g_lost_at;
static atomic_int g_lost_reason;

static void on_cut_lost(dlock_lock *l, int reason, void *userdata)
{
    (void)l, (void)userdata;
    atomic_store(&g_lost_reason, reason);
    atomic_store(&g_lost_at, (long long)th_now_ms());
}

/* Tries w every millisecond for 3 leases from t_cut; when it got it (-1:
 * never). */
static int64_t take_soon(dlock_lock *w, int64_t t_cut)
{
    while (th_now_ms() - t_cut < 3 * CUT_LEASE) {
        int rc = dlock_acquire(w, DLOCK_NOWAIT, 5000, NULL);
        if (rc == DLOCK_OK) return th_now_ms();
        ASSERT_LCODE(w, rc, DLOCK_EBUSY);
        th_sleep_ms(1);
    }
    return -1;
}

/* A watchdog client (lease CUT_LEASE) reaching the server through the
 * proxy on pport; cmd_timeout_ms 0: the default. */
static dlock_client *proxied_client(int pport, int64_t cmd_timeout_ms)
{
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", pport);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.watchdog_lease_ms = CUT_LEASE;
    o.command_timeout_ms = cmd_timeout_ms;
    dlock_client *c = NULL;
    ASSERT_EQ(dlock_client_new(&o, &c), DLOCK_OK);
    return c;
}

/* A holder reaching the server through the proxy proxy (port pport) is cut
 * off by sig (SIGKILL: connections closed, then refused; SIGSTOP: no
 * answers). Another client tries the lock every millisecond: the holder's
 * lost callback (DLOCK_LOST_UNREACHABLE) must have run before it gets it. */
static void cut_off(const th_server *s, const char *name, pid_t proxy, int pport, int sig)
{
    dlock_client *hc = proxied_client(pport, 0);
    dlock_client *other = th_client(s, CUT_LEASE);
    dlock_lock *h = th_lock(hc, name, DLOCK_KIND_PLAIN);
    dlock_lock *w = th_lock(other, name, DLOCK_KIND_PLAIN);
    atomic_store(&g_lost_at, 0);
    atomic_store(&g_lost_reason, 0);
    dlock_lock_on_lost(h, on_cut_lost, NULL);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    th_sleep_ms(CUT_LEASE / 2); /* a renewal or so */
    ASSERT_EQ(kill(proxy, sig), 0);
    int64_t t_cut = th_now_ms(), got_at = take_soon(w, t_cut);
    long long lost_at = atomic_load(&g_lost_at);
    th_log("%s (proxy %s): lost callback %lld ms after the cut, another client acquired after "
           "%lld ms (%lld ms later)",
           name, sig == SIGKILL ? "killed" : "frozen", lost_at - (long long)t_cut,
           (long long)(got_at - t_cut), (long long)got_at - lost_at);
    ASSERT_GT(got_at, 0);
    ASSERT_GT(lost_at, 0);
    ASSERT_EQ(atomic_load(&g_lost_reason), DLOCK_LOST_UNREACHABLE);
    ASSERT_LT(lost_at, got_at);
    ASSERT_EQ(dlock_lock_valid_ms(h), 0);
    ASSERT_EQ(dlock_lock_is_lost(h), 1);
    ASSERT_LOK(w, dlock_release(w));
    if (sig == SIGSTOP) kill(proxy, SIGKILL);
    th_wait_child(proxy, 5000);
    dlock_lock_free(w);
    dlock_lock_free(h);
    dlock_client_free(other);
    dlock_client_free(hc);
}

/* The holder's link freezes while it releases (its command timeout longer
 * than the lease): the release is stuck, and the lease runs out meanwhile.
 * The lost callback must still come at the lease's due time, before another
 * client holds the lock, not after the stuck release gives up. */
typedef struct {
    dlock_lock *l;
    int rc;
    atomic_llong done_at;
} releaser;

static void *release_thread(void *arg)
{
    releaser *r = arg;
    r->rc = dlock_release(r->l);
    atomic_store(&r->done_at, (long long)th_now_ms());
    return NULL;
}

static void release_on_frozen_link(const th_server *s, pid_t proxy, int pport)
{
    dlock_client *hc = proxied_client(pport, 4 * CUT_LEASE);
    dlock_client *other = th_client(s, CUT_LEASE);
    dlock_lock *h = th_lock(hc, "wd:cut:releasing", DLOCK_KIND_PLAIN);
    dlock_lock *w = th_lock(other, "wd:cut:releasing", DLOCK_KIND_PLAIN);
    atomic_store(&g_lost_at, 0);
    atomic_store(&g_lost_reason, 0);
    dlock_lock_on_lost(h, on_cut_lost, NULL);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    th_sleep_ms(CUT_LEASE / 2);
    ASSERT_EQ(kill(proxy, SIGSTOP), 0);
    int64_t t_cut = th_now_ms();
    releaser r = {h, -1, 0};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, release_thread, &r), 0);
    int64_t got_at = take_soon(w, t_cut);
    long long lost_at = atomic_load(&g_lost_at);
    th_log("release on a frozen link: lost callback %lld ms after the cut, another client "
           "acquired after %lld ms",
           lost_at ? lost_at - (long long)t_cut : -1LL, (long long)(got_at - t_cut));
    ASSERT_GT(got_at, 0);
    ASSERT_GT(lost_at, 0);
    ASSERT_EQ(atomic_load(&g_lost_reason), DLOCK_LOST_UNREACHABLE);
    ASSERT_LT(lost_at, got_at);
    kill(proxy, SIGKILL); /* the stuck release fails now */
    ASSERT_EQ(pthread_join(t, NULL), 0);
    ASSERT_GT(atomic_load(&r.done_at), lost_at);
    ASSERT_LCODE(h, r.rc, DLOCK_EIO);
    ASSERT_EQ(dlock_lock_is_lost(h), 1);
    ASSERT_LOK(w, dlock_release(w));
    th_wait_child(proxy, 5000);
    dlock_lock_free(w);
    dlock_lock_free(h);
    dlock_client_free(other);
    dlock_client_free(hc);
}

int main(void)
{
    th_init("watchdog");
    th_server *s = th_server_start(NULL);
    int kport = 0, sport = 0, rport = 0;
    /* forked before any client thread exists */
    pid_t killed = th_proxy_start(th_server_port(s), &kport);
    pid_t frozen = th_proxy_start(th_server_port(s), &sport);
    pid_t releasing = th_proxy_start(th_server_port(s), &rport);
    cut_off(s, "wd:cut:killed", killed, kport, SIGKILL);
    cut_off(s, "wd:cut:frozen", frozen, sport, SIGSTOP);
    release_on_frozen_link(s, releasing, rport);
    dlock_client *c = th_client(s, WD_LEASE);
    dlock_client *other = th_client(s, WD_LEASE);
    redisContext *rc = th_redis(s);

    hold_with_watchdog(s, c, other, rc, "wd:plain", DLOCK_KIND_PLAIN);
    hold_with_watchdog(s, c, other, rc, "wd:reentrant", DLOCK_KIND_REENTRANT);

    /* a watchdog hold re-entered with an explicit lease stays kept: after
     * the inner hold's release the outer one is renewed on (before: the
     * re-entry turned the watchdog off, the key ran out with no lost
     * callback, and another client took the lock) */
    {
        dlock_lock *wl = th_lock(c, "wd:reenter", DLOCK_KIND_REENTRANT);
        dlock_lock *wo = th_lock(other, "wd:reenter", DLOCK_KIND_REENTRANT);
        ASSERT_LOK(wl, dlock_acquire(wl, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
        ASSERT_LOK(wl, dlock_acquire(wl, DLOCK_NOWAIT, WD_LEASE / 3, NULL));
        ASSERT_LOK(wl, dlock_release(wl));
        int64_t tr = th_now_ms();
        while (th_now_ms() - tr < 2 * WD_LEASE) {
            ASSERT_MSG(th_cmd_int(rc, "PTTL wd:reenter") > 0, "the outer hold ran out after %lld ms",
                       (long long)(th_now_ms() - tr));
            th_sleep_ms(25);
        }
        ASSERT_GT(dlock_lock_valid_ms(wl), 0);
        ASSERT_LCODE(wo, dlock_acquire(wo, DLOCK_NOWAIT, 1000, NULL), DLOCK_EBUSY);
        ASSERT_LOK(wl, dlock_release(wl));
        ASSERT_EQ(th_cmd_int(rc, "EXISTS wd:reenter"), 0);
        dlock_lock_free(wl);
        dlock_lock_free(wo);
    }

    /* several locks of one client renewed together */
    dlock_lock *many[5];
    char name[32];
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "wd:many:%d", i);
        many[i] = th_lock(c, name, i % 2 ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN);
        ASSERT_LOK(many[i], dlock_acquire(many[i], DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    }
    int64_t t0 = th_now_ms();
    while (th_now_ms() - t0 < 3 * WD_LEASE / 2) {
        for (int i = 0; i < 5; i++) {
            snprintf(name, sizeof name, "wd:many:%d", i);
            ASSERT_GT(th_cmd_int(rc, "PTTL %s", name), 0);
        }
        th_sleep_ms(25);
    }
    for (int i = 0; i < 5; i++) {
        ASSERT_LOK(many[i], dlock_release(many[i]));
        dlock_lock_free(many[i]);
    }

    /* an explicit lease is not renewed: it expires, and release says so */
    dlock_lock *e = th_lock(c, "wd:explicit", DLOCK_KIND_PLAIN);
    int64_t te = th_now_ms();
    ASSERT_LOK(e, dlock_acquire(e, DLOCK_NOWAIT, 500, NULL));
    long long pttl = th_cmd_int(rc, "PTTL wd:explicit");
    ASSERT_GT(pttl, 0);
    ASSERT_LE(pttl, 500);
    ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS wd:explicit") == 0, 500 + 1500);
    th_log("explicit 500 ms lease gone after %lld ms", (long long)(th_now_ms() - te));
    ASSERT_GE(th_now_ms() - te, 400);
    ASSERT_LCODE(e, dlock_release(e), DLOCK_ELOST);
    ASSERT_EQ(dlock_lock_holding(e), 0);
    ASSERT_EQ(dlock_lock_is_lost(e), 1);
    ASSERT_LCODE(e, dlock_release(e), DLOCK_ENOTHELD);
    /* a later acquire clears the lost flag */
    ASSERT_LOK(e, dlock_acquire(e, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_EQ(dlock_lock_is_lost(e), 0);
    ASSERT_LOK(e, dlock_release(e));
    dlock_lock_free(e);

    /* same for a reentrant lock */
    dlock_lock *er = th_lock(c, "wd:explicit:re", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(er, dlock_acquire(er, DLOCK_NOWAIT, 400, NULL));
    ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS wd:explicit:re") == 0, 400 + 1500);
    ASSERT_LCODE(er, dlock_release(er), DLOCK_ELOST);
    dlock_lock_free(er);

    /* extend: watchdog -> explicit lease, which then runs out */
    dlock_lock *x = th_lock(c, "wd:extend", DLOCK_KIND_PLAIN);
    ASSERT_LOK(x, dlock_acquire(x, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(x, dlock_extend(x, 5000));
    pttl = th_cmd_int(rc, "PTTL wd:extend");
    ASSERT_GT(pttl, WD_LEASE);
    ASSERT_LOK(x, dlock_extend(x, 300));
    ASSERT_LE(th_cmd_int(rc, "PTTL wd:extend"), 300);
    ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS wd:extend") == 0, 300 + 1500);
    ASSERT_LCODE(x, dlock_extend(x, 1000), DLOCK_ELOST);
    ASSERT_EQ(dlock_lock_holding(x), 0);
    ASSERT_LCODE(x, dlock_extend(x, 1000), DLOCK_ENOTHELD);
    dlock_lock_free(x);

    redisFree(rc);
    dlock_client_free(other);
    dlock_client_free(c);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
