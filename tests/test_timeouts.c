/* A hung server (SIGSTOPped: connections stay open, nothing answers): every
 * call returns DLOCK_EIO within the command timeout instead of hanging; a
 * waiting acquire at the end of its wait (within the command timeout with
 * dlock_client_set_fail_fast); a watchdog lock whose renewals go unanswered for longer
 * than the lease is reported lost with DLOCK_LOST_UNREACHABLE (not before the
 * lease could have run out); after SIGCONT the client works again. */
#include "harness.h"

#include <stdatomic.h>

#define CMD_TIMEOUT 500
#define WD_LEASE 900

static atomic_int g_lost;
static atomic_int g_reason;
static atomic_llong g_lost_at;

static void on_lost(dlock_lock *l, int reason, void *ud)
{
    (void)l;
    (void)ud;
    atomic_store(&g_reason, reason);
    atomic_store(&g_lost_at, (long long)th_now_ms());
    atomic_fetch_add(&g_lost, 1);
}

int main(void)
{
    th_init("timeouts");
    th_server *s = th_server_start(NULL);
    dlock_options o;
    dlock_options_init(&o);
    o.url = th_server_url(s);
    o.connect_timeout_ms = CMD_TIMEOUT;
    o.command_timeout_ms = CMD_TIMEOUT;
    o.watchdog_lease_ms = WD_LEASE;
    dlock_client *c = NULL;
    int rc0 = dlock_client_new(&o, &c);
    ASSERT_CCODE(c, rc0, DLOCK_OK);

    dlock_lock *wd = th_lock(c, "hung:wd", DLOCK_KIND_PLAIN);
    dlock_lock_on_lost(wd, on_lost, NULL);
    ASSERT_LOK(wd, dlock_acquire(wd, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    dlock_lock *other = th_lock(c, "hung:other", DLOCK_KIND_REENTRANT);
    ASSERT_COK(c, dlock_ping(c, NULL));

    /* right after a renewal would be ideal; any moment works for the bounds */
    th_server_pause(s);
    int64_t t0 = th_now_ms();
    th_log("server paused");

    int64_t t = th_now_ms();
    ASSERT_CCODE(c, dlock_ping(c, NULL), DLOCK_EIO);
    int64_t took = th_now_ms() - t;
    th_log("ping on a hung server: EIO in %lld ms: %s", (long long)took, dlock_errmsg(c));
    ASSERT_LE(took, CMD_TIMEOUT + 700);

    /* a waiting acquire takes the hang for an outage that may end within
     * its wait: it tries again until the wait is over, then reports it */
    t = th_now_ms();
    int rc = dlock_acquire(other, 2000, 5000, NULL);
    took = th_now_ms() - t;
    th_log("waiting acquire on a hung server: %s in %lld ms", dlock_strerror(rc), (long long)took);
    ASSERT_LCODE(other, rc, DLOCK_EIO);
    ASSERT_GE(took, 2000);
    ASSERT_LE(took, 2000 + 2 * CMD_TIMEOUT + 1500);
    ASSERT_EQ(dlock_lock_holding(other), 0);
    /* failing fast: the first failure ends it */
    ASSERT_COK(c, dlock_client_set_fail_fast(c, 1));
    t = th_now_ms();
    rc = dlock_acquire(other, 10000, 5000, NULL);
    took = th_now_ms() - t;
    th_log("waiting acquire on a hung server, failing fast: %s in %lld ms", dlock_strerror(rc),
           (long long)took);
    ASSERT_LCODE(other, rc, DLOCK_EIO);
    ASSERT_LE(took, 2 * CMD_TIMEOUT + 1500);
    ASSERT_EQ(dlock_lock_holding(other), 0);
    ASSERT_COK(c, dlock_client_set_fail_fast(c, 0));

    int locked;
    t = th_now_ms();
    ASSERT_CCODE(c, dlock_is_locked(c, "hung:wd", DLOCK_CSTR, &locked), DLOCK_EIO);
    ASSERT_LE(th_now_ms() - t, CMD_TIMEOUT + 700);

    /* the watchdog cannot renew: lost as unreachable, but not too early */
    ASSERT_EVENTUALLY(atomic_load(&g_lost) > 0, WD_LEASE + 2 * CMD_TIMEOUT + 2000);
    int64_t lost_after = (int64_t)atomic_load(&g_lost_at) - t0;
    th_log("lost callback %lld ms after the pause (lease %d)", (long long)lost_after, WD_LEASE);
    ASSERT_EQ(atomic_load(&g_reason), DLOCK_LOST_UNREACHABLE);
    /* the last confirmed renewal was at most lease/3 before the pause */
    ASSERT_GE(lost_after, WD_LEASE - WD_LEASE / 3 - 100);
    ASSERT_EQ(dlock_lock_is_lost(wd), 1);

    th_server_unpause(s);
    th_log("server resumed");
    /* usable again (reconnect with backoff) */
    int64_t deadline = th_now_ms() + 5000;
    while ((rc = dlock_ping(c, NULL)) != DLOCK_OK) {
        ASSERT_MSG(rc == DLOCK_EIO, "ping after resume: %s", dlock_strerror(rc));
        ASSERT_MSG(th_now_ms() < deadline, "client still failing 5 s after the server resumed");
        th_sleep_ms(20);
    }
    /* the server's clock ran on: the lease has expired there */
    deadline = th_now_ms() + 5000;
    while ((rc = dlock_release(wd)) == DLOCK_EIO && th_now_ms() < deadline) th_sleep_ms(20);
    ASSERT_LCODE(wd, rc, DLOCK_ELOST);
    ASSERT_LOK(other, dlock_acquire(other, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(other, dlock_release(other));

    dlock_lock_free(other);
    dlock_lock_free(wd);
    dlock_client_free(c);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
