/* Two handles of one owner (one client, one thread) on one name share the
 * server's hold of a reentrant, fair, read or write lock: the server counts
 * holds per owner, not per handle. Each handle's dlock_lock_valid_ms must
 * stay within what the server keeps, whatever the other handle does:
 *   1. shorter: A holds with a 20 s lease; B re-enters with 300 ms and
 *      releases; 500 ms later the lock is still held for A (another client
 *      is refused) and the key outlives A's validity (before: B's re-entry
 *      and release set the shared key's expiry to 300 ms, and another client
 *      took the lock while A counted 19 s);
 *   2. read side, the other order: A reads with 300 ms, B with 20 s, A
 *      releases: B's share keeps its 20 s (before: A's release deleted the
 *      newest lease key, B's, leaving A's 300 ms, and a writer got in);
 *   3. renewals: A holds with an explicit 20 s lease, B with the watchdog
 *      (a 900 ms lease renewed every 300 ms): the renewals do not cut the
 *      key's expiry below A's validity (before: 900 ms);
 *   4. a sibling whose hold ran out: A's 300 ms hold expires on the server,
 *      B (same owner) takes a fresh hold and releases it: the lock is free
 *      at once (before: the release expected A's hold too, changed nothing,
 *      and the lock stayed held for B's lease). */
#include "harness.h"

#include <string.h>

static const dlock_kind kinds[] = {DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR, DLOCK_KIND_WRITE,
                                   DLOCK_KIND_READ};
static const char *const kind_names[] = {"reentrant", "fair", "write", "read"};

/* The kind another client tries: a writer against readers. */
static dlock_kind rival(dlock_kind k) { return k == DLOCK_KIND_READ ? DLOCK_KIND_WRITE : k; }

int main(void)
{
    th_init("shared_owner");
    th_server *s = th_server_start(NULL);
    redisContext *rc = th_redis(s);
    dlock_client *c = th_client(s, 900);
    dlock_client *other = th_client(s, 0);

    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        char nm[48];
        /* 1. a shorter re-entry and its release */
        snprintf(nm, sizeof nm, "so:short:%s", kind_names[k]);
        dlock_lock *a = th_lock(c, nm, kinds[k]);
        dlock_lock *b = th_lock(c, nm, kinds[k]);
        dlock_lock *o = th_lock(other, nm, rival(kinds[k]));
        ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 20000, NULL));
        ASSERT_LOK(b, dlock_acquire(b, DLOCK_NOWAIT, 300, NULL));
        ASSERT_LOK(b, dlock_release(b));
        th_sleep_ms(500);
        /* the server's expiry first: the validity read after it is smaller */
        long long pttl = th_cmd_int(rc, "PTTL %s", nm);
        int64_t av = dlock_lock_valid_ms(a);
        int orc = dlock_acquire(o, DLOCK_NOWAIT, 1000, NULL);
        th_log("%s: after a 300 ms sibling: A valid %lld ms, PTTL %lld, another client %d",
               kind_names[k], (long long)av, pttl, orc);
        ASSERT_GT(av, 15000);
        ASSERT_MSG(pttl + 2 >= av, "%s: PTTL %lld below A's validity %lld", kind_names[k], pttl,
                   (long long)av);
        ASSERT_EQ(orc, DLOCK_EBUSY);
        ASSERT_LOK(a, dlock_release(a));
        ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", nm), 0);

        /* 3. the sibling's watchdog renewals */
        snprintf(nm, sizeof nm, "so:renew:%s", kind_names[k]);
        dlock_lock *a3 = th_lock(c, nm, kinds[k]);
        dlock_lock *b3 = th_lock(c, nm, kinds[k]);
        ASSERT_LOK(a3, dlock_acquire(a3, DLOCK_NOWAIT, 20000, NULL));
        ASSERT_LOK(b3, dlock_acquire(b3, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
        th_sleep_ms(1000); /* three renewals of B's */
        pttl = th_cmd_int(rc, "PTTL %s", nm);
        av = dlock_lock_valid_ms(a3);
        th_log("%s: after the sibling's renewals: A valid %lld ms, PTTL %lld", kind_names[k],
               (long long)av, pttl);
        ASSERT_GT(av, 15000);
        ASSERT_MSG(pttl + 2 >= av, "%s: PTTL %lld below A's validity %lld", kind_names[k], pttl,
                   (long long)av);
        ASSERT_LOK(b3, dlock_release(b3));
        ASSERT_LOK(a3, dlock_release(a3));
        ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", nm), 0);

        /* 4. a sibling whose hold ran out */
        snprintf(nm, sizeof nm, "so:gone:%s", kind_names[k]);
        dlock_lock *a4 = th_lock(c, nm, kinds[k]);
        dlock_lock *b4 = th_lock(c, nm, kinds[k]);
        dlock_lock *o4 = th_lock(other, nm, rival(kinds[k]));
        ASSERT_LOK(a4, dlock_acquire(a4, DLOCK_NOWAIT, 300, NULL));
        ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS %s", nm) == 0, 3000);
        ASSERT_EQ(dlock_lock_valid_ms(a4), 0);
        ASSERT_LOK(b4, dlock_acquire(b4, DLOCK_NOWAIT, 30000, NULL));
        ASSERT_LOK(b4, dlock_release(b4));
        long long left = th_cmd_int(rc, "EXISTS %s", nm);
        orc = dlock_acquire(o4, DLOCK_NOWAIT, 1000, NULL);
        th_log("%s: after the release beside a sibling whose hold ran out: exists %lld, "
               "another client %d",
               kind_names[k], left, orc);
        ASSERT_EQ(left, 0);
        ASSERT_LOK(o4, orc);
        ASSERT_LOK(o4, dlock_release(o4));
        /* A's release finds nothing of its own left */
        ASSERT_LCODE(a4, dlock_release(a4), DLOCK_ELOST);

        dlock_lock_free(a);
        dlock_lock_free(b);
        dlock_lock_free(o);
        dlock_lock_free(a3);
        dlock_lock_free(b3);
        dlock_lock_free(a4);
        dlock_lock_free(b4);
        dlock_lock_free(o4);
    }

    /* 2. read side: the shorter lease released first */
    {
        const char *nm = "so:readorder";
        dlock_lock *a = th_lock(c, nm, DLOCK_KIND_READ);
        dlock_lock *b = th_lock(c, nm, DLOCK_KIND_READ);
        dlock_lock *w = th_lock(other, nm, DLOCK_KIND_WRITE);
        ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 300, NULL));
        ASSERT_LOK(b, dlock_acquire(b, DLOCK_NOWAIT, 20000, NULL));
        ASSERT_LOK(a, dlock_release(a));
        th_sleep_ms(500);
        long long pttl = th_cmd_int(rc, "PTTL %s", nm);
        int64_t bv = dlock_lock_valid_ms(b);
        int wrc = dlock_acquire(w, DLOCK_NOWAIT, 1000, NULL);
        th_log("read: B valid %lld ms after A's shorter share ended, PTTL %lld, a writer %d",
               (long long)bv, pttl, wrc);
        ASSERT_GT(bv, 15000);
        ASSERT_MSG(pttl + 2 >= bv, "PTTL %lld below B's validity %lld", pttl, (long long)bv);
        ASSERT_EQ(wrc, DLOCK_EBUSY);
        ASSERT_LOK(b, dlock_release(b));
        ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", nm), 0);
        dlock_lock_free(a);
        dlock_lock_free(b);
        dlock_lock_free(w);
    }

    dlock_client_free(c);
    dlock_client_free(other);
    redisFree(rc);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
