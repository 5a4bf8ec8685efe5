/* Watchdog leases: a DLOCK_WATCHDOG lock (client watchdog_lease_ms = 600) is
 * kept for more than 4 lease periods (PTTL stays in (0, 600], another client
 * cannot take it), for both kinds; an explicit-lease lock expires on its own
 * and its release reports DLOCK_ELOST; dlock_extend turns a watchdog lock into
 * an explicit lease that then runs out. */
#include "harness.h"

#include <stdlib.h>

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

int main(void)
{
    th_init("watchdog");
    th_server *s = th_server_start(NULL);
    dlock_client *c = th_client(s, WD_LEASE);
    dlock_client *other = th_client(s, WD_LEASE);
    redisContext *rc = th_redis(s);

    hold_with_watchdog(s, c, other, rc, "wd:plain", DLOCK_KIND_PLAIN);
    hold_with_watchdog(s, c, other, rc, "wd:reentrant", DLOCK_KIND_REENTRANT);

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
