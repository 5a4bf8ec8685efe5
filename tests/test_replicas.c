/* wait_replicas with a primary and one replica (no Sentinel): an acquisition
 * that returns DLOCK_OK is on the replica, whichever path granted it. The
 * fair lock's handoff is written by the releaser's connection, while WAIT
 * counts the acknowledgements of the new owner's own connection, whose last
 * write was its queue entry: the new owner must not return OK unless the
 * replica has the grant.
 *   1. replica live: the waiter handed the lock returns OK, and the replica
 *      has the lock the moment it does;
 *   2. replica paused (SIGSTOP) after it acknowledged the waiter's queue
 *      entry: the handoff is not on it, so the waiter gets DLOCK_EREPLICAS
 *      and the lock is given back (before the fix: DLOCK_OK);
 *   3. replica paused, and resumed after the lease ran out but within the
 *      WAIT timeout (explorer seed 227: a replication link frozen for less
 *      than wait_replicas_timeout_ms, an acquire with a 706 ms lease): the
 *      acknowledgement comes too late, the lock is no longer held, so the
 *      acquire fails with DLOCK_EREPLICAS (before the fix: DLOCK_OK with
 *      dlock_lock_valid_ms() 0, while another client could take it).
 *   4. replica paused under a watchdog hold and an explicit one: renewals
 *      unacknowledged leave the watchdog hold to run out (lost), an extend
 *      fails with DLOCK_EREPLICAS and keeps the validity it had.
 *   5. an extend to a shorter lease, unacknowledged: it may have reached the
 *      primary, so the hold is counted valid for the shorter lease (before:
 *      the longer validity it had, while the primary let another client in).
 *   6. an unacknowledged re-entry is given back without touching the hold it
 *      re-entered: another handle of the same owner keeps its hold and its
 *      lease (before: the give-back set the shared key's expiry to the new
 *      handle's lease, 0, deleting it), and a handle that re-entered its own
 *      hold keeps the validity it had (before: the failed re-entry's). */
#include "harness.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NAME "rep:fair"

typedef struct {
    dlock_lock *l;
    int rc;
    char msg[256];
} waiter;

static void *wait_fair(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_acquire(w->l, 15000, 10000, NULL);
    snprintf(w->msg, sizeof w->msg, "%s", dlock_lock_errmsg(w->l));
    return NULL;
}

static dlock_client *replicated_client(const th_server *s)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = th_server_url(s);
    o.wait_replicas = 1;
    o.wait_replicas_timeout_ms = 1000;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    return c;
}

static void *unpause_later(void *arg)
{
    th_sleep_ms(700);
    th_server_unpause(arg);
    return NULL;
}

static int link_up(redisContext *rc)
{
    char *info = th_cmd_str(rc, "INFO replication");
    int up = info && strstr(info, "master_link_status:up") != NULL;
    free(info);
    return up;
}

/* A holds; B waits in a thread until it is queued and subscribed (and its
 * attempt after subscribing has run). */
static void start_waiter(redisContext *rp, waiter *w, pthread_t *th)
{
    ASSERT_EQ(pthread_create(th, NULL, wait_fair, w), 0);
    ASSERT_EVENTUALLY(th_cmd_int(rp, "LLEN redisson_lock_queue:{" NAME "}") == 1 &&
                          th_subscribers(rp, NAME) >= 1,
                      5000);
    th_sleep_ms(100);
}

int main(void)
{
    th_init("replicas");
    th_server *p = th_server_start(NULL);
    th_server *r = th_server_start(NULL);
    redisContext *rp = th_redis(p), *rr = th_redis(r);
    th_cmd_ok(rp, "CONFIG SET repl-diskless-sync-delay 0");
    th_cmd_ok(rr, "REPLICAOF 127.0.0.1 %d", th_server_port(p));
    ASSERT_EVENTUALLY(link_up(rr), 15000);
    /* the primary counts the replica for WAIT once it is online there */
    th_cmd_ok(rp, "SET rep:marker 0");
    ASSERT_EVENTUALLY(th_cmd_int(rp, "WAIT 1 100") == 1, 15000);

    dlock_client *ca = replicated_client(p), *cb = replicated_client(p);
    dlock_lock *a = th_lock(ca, NAME, DLOCK_KIND_FAIR);
    dlock_lock *b = th_lock(cb, NAME, DLOCK_KIND_FAIR);

    /* 1. replica live: B is handed the lock and returns OK; the replica has it */
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 10000, NULL));
    waiter w = {b, -1, ""};
    pthread_t th;
    start_waiter(rp, &w, &th);
    ASSERT_LOK(a, dlock_release(a));
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_MSG(w.rc == DLOCK_OK, "handed over with the replica live: %d (%s)", w.rc, w.msg);
    ASSERT_EQ(th_cmd_int(rr, "HLEN %s", NAME), 1);
    ASSERT_LOK(b, dlock_release(b));

    /* 2. the replica acknowledged everything up to B's queue entry, then
     * stops: the handoff never reaches it */
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 10000, NULL));
    w = (waiter){b, -1, ""};
    start_waiter(rp, &w, &th);
    th_cmd_ok(rp, "SET rep:marker 1");
    ASSERT_EQ(th_cmd_int(rp, "WAIT 1 5000"), 1);
    th_server_pause(r);
    ASSERT_LOK(a, dlock_release(a));
    ASSERT_EQ(pthread_join(th, NULL), 0);
    th_log("handed over with the replica paused: %s", w.rc ? w.msg : "OK");
    ASSERT_MSG(w.rc == DLOCK_EREPLICAS, "handed over with the replica paused: %d (%s)", w.rc,
               w.msg);
    ASSERT_EQ(dlock_lock_valid_ms(b), 0);
    /* given back: free on the primary */
    ASSERT_EQ(th_cmd_int(rp, "EXISTS %s", NAME), 0);
    th_server_unpause(r);
    ASSERT_EVENTUALLY(th_cmd_int(rr, "EXISTS %s", NAME) == 0, 5000);

    /* 3. the replica acknowledges only after the lease (300 ms) ran out,
     * within the WAIT timeout (1000 ms) */
    th_cmd_ok(rp, "SET rep:marker 2");
    ASSERT_EQ(th_cmd_int(rp, "WAIT 1 5000"), 1);
    dlock_lock *pl = th_lock(ca, "rep:plain", DLOCK_KIND_PLAIN);
    th_server_pause(r);
    pthread_t un;
    ASSERT_EQ(pthread_create(&un, NULL, unpause_later, r), 0);
    int64_t t0 = th_now_ms();
    int prc = dlock_acquire(pl, DLOCK_NOWAIT, 300, NULL);
    int64_t took = th_now_ms() - t0;
    ASSERT_EQ(pthread_join(un, NULL), 0);
    th_log("acknowledged after %lld ms, past a 300 ms lease: %s (valid %lld ms)",
           (long long)took, prc ? dlock_lock_errmsg(pl) : "OK",
           (long long)dlock_lock_valid_ms(pl));
    ASSERT_MSG(took >= 300, "the acknowledgement came before the lease ran out (%lld ms)",
               (long long)took);
    ASSERT_MSG(prc == DLOCK_EREPLICAS, "acknowledged after the lease ran out: %d (%s)", prc,
               dlock_lock_errmsg(pl));
    ASSERT_EQ(dlock_lock_holding(pl), 0);
    dlock_lock_free(pl);

    /* 4. renewals and extends count only once the replica has them: with the
     * replica paused, a watchdog hold's renewals go unacknowledged, so its
     * validity runs out (and the lost callback comes) as the replica's copy
     * does, and an extend fails with DLOCK_EREPLICAS keeping the validity it
     * had (before: renewed and extended on the primary alone, the holder
     * counted on leases a promoted replica would not have) */
    {
        dlock_options o;
        dlock_options_init(&o);
        o.url = th_server_url(p);
        o.wait_replicas = 1;
        o.wait_replicas_timeout_ms = 1000;
        o.watchdog_lease_ms = 900;
        dlock_client *cw = NULL;
        ASSERT_CCODE(cw, dlock_client_new(&o, &cw), DLOCK_OK);
        dlock_lock *wl = th_lock(cw, "rep:wd", DLOCK_KIND_PLAIN);
        dlock_lock *xl = th_lock(cw, "rep:ext", DLOCK_KIND_REENTRANT);
        ASSERT_LOK(wl, dlock_acquire(wl, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
        ASSERT_LOK(xl, dlock_acquire(xl, DLOCK_NOWAIT, 2000, NULL));
        th_cmd_ok(rp, "SET rep:marker 3");
        ASSERT_EQ(th_cmd_int(rp, "WAIT 1 5000"), 1);
        th_server_pause(r);
        int64_t tp = th_now_ms();
        int erc = dlock_extend(xl, 20000);
        int64_t xv = dlock_lock_valid_ms(xl);
        th_log("extend with the replica paused: %s (valid %lld ms)",
               erc ? dlock_lock_errmsg(xl) : "OK", (long long)xv);
        ASSERT_MSG(erc == DLOCK_EREPLICAS, "extend with the replica paused: %d (%s)", erc,
                   dlock_lock_errmsg(xl));
        ASSERT_LE(xv, 2000);
        th_sleep_ms(1500);
        int64_t wv = dlock_lock_valid_ms(wl);
        th_log("watchdog hold %lld ms after the replica paused: valid %lld ms, lost %d",
               (long long)(th_now_ms() - tp), (long long)wv, dlock_lock_is_lost(wl));
        ASSERT_EQ(wv, 0);
        ASSERT_EQ(dlock_lock_is_lost(wl), 1);
        th_server_unpause(r);
        dlock_release(wl);
        dlock_release(xl);
        dlock_lock_free(wl);
        dlock_lock_free(xl);
        dlock_client_free(cw);
    }

    /* 5. a shorter extend unacknowledged counts as applied */
    {
        dlock_client *cx = replicated_client(p);
        dlock_client *co = th_client(p, 0);
        dlock_lock *rl = th_lock(cx, "rep:short", DLOCK_KIND_REENTRANT);
        dlock_lock *pl2 = th_lock(cx, "rep:shortp", DLOCK_KIND_PLAIN);
        dlock_lock *ro = th_lock(co, "rep:short", DLOCK_KIND_REENTRANT);
        ASSERT_LOK(rl, dlock_acquire(rl, DLOCK_NOWAIT, 20000, NULL));
        ASSERT_LOK(pl2, dlock_acquire(pl2, DLOCK_NOWAIT, 20000, NULL));
        th_cmd_ok(rp, "SET rep:marker 5");
        ASSERT_EQ(th_cmd_int(rp, "WAIT 1 5000"), 1);
        th_server_pause(r);
        int erc = dlock_extend(rl, 300);
        int plrc = dlock_extend(pl2, 300);
        int64_t rv = dlock_lock_valid_ms(rl), pv = dlock_lock_valid_ms(pl2);
        th_log("extend to 300 ms with the replica paused: %d, %d (valid %lld, %lld ms)", erc, plrc,
               (long long)rv, (long long)pv);
        th_server_unpause(r);
        ASSERT_EQ(erc, DLOCK_EREPLICAS);
        ASSERT_EQ(plrc, DLOCK_EREPLICAS);
        ASSERT_LE(rv, 300);
        ASSERT_LE(pv, 300);
        /* the reentrant hold's shared key is never shortened (the lease of
         * an owner's other handles): only the handle's count goes down */
        ASSERT_MSG(th_cmd_int(rp, "PTTL rep:short") > 10000, "PTTL %lld",
                   th_cmd_int(rp, "PTTL rep:short"));
        ASSERT_LE(th_cmd_int(rp, "PTTL rep:shortp"), 300);
        dlock_release(rl);
        dlock_release(pl2);
        dlock_lock_free(rl);
        dlock_lock_free(pl2);
        dlock_lock_free(ro);
        dlock_client_free(cx);
        dlock_client_free(co);
    }

    /* 6. an unacknowledged re-entry given back leaves the hold it re-entered */
    for (int kind = 0; kind < 3; kind++) {
        static const dlock_kind kinds[3] = {DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR,
                                            DLOCK_KIND_WRITE};
        char nm[32];
        snprintf(nm, sizeof nm, "rep:reenter%d", kind);
        dlock_client *cx = replicated_client(p);
        dlock_client *co = th_client(p, 0);
        dlock_lock *ha = th_lock(cx, nm, kinds[kind]);
        dlock_lock *hb = th_lock(cx, nm, kinds[kind]);
        dlock_lock *ho = th_lock(co, nm, kinds[kind]);
        ASSERT_LOK(ha, dlock_acquire(ha, DLOCK_NOWAIT, 20000, NULL));
        th_cmd_ok(rp, "SET rep:marker 6");
        ASSERT_EQ(th_cmd_int(rp, "WAIT 1 5000"), 1);
        th_server_pause(r);
        int brc = dlock_acquire(hb, DLOCK_NOWAIT, 5000, NULL);  /* another handle, same owner */
        int arc = dlock_acquire(ha, DLOCK_NOWAIT, 60000, NULL); /* its own re-entry */
        th_server_unpause(r);
        long long pttl = th_cmd_int(rp, "PTTL %s", nm);
        int64_t av = dlock_lock_valid_ms(ha);
        int orc = dlock_acquire(ho, DLOCK_NOWAIT, 1000, NULL);
        th_log("%s: re-entries unacknowledged: %d, %d; the hold: valid %lld ms, PTTL %lld; "
               "another client: %d",
               nm, brc, arc, (long long)av, pttl, orc);
        ASSERT_EQ(brc, DLOCK_EREPLICAS);
        ASSERT_EQ(arc, DLOCK_EREPLICAS);
        ASSERT_EQ(dlock_lock_holding(hb), 0);
        ASSERT_EQ(dlock_lock_holding(ha), 1);
        ASSERT_MSG(av > 10000 && av <= 20000, "valid %lld", (long long)av);
        ASSERT_MSG(pttl + 2 >= av, "PTTL %lld below the validity %lld", pttl, (long long)av);
        ASSERT_EQ(orc, DLOCK_EBUSY);
        ASSERT_LOK(ha, dlock_release(ha));
        ASSERT_EQ(th_cmd_int(rp, "EXISTS %s", nm), 0);
        dlock_lock_free(ha);
        dlock_lock_free(hb);
        dlock_lock_free(ho);
        dlock_client_free(cx);
        dlock_client_free(co);
    }

    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_client_free(ca);
    dlock_client_free(cb);
    redisFree(rp);
    redisFree(rr);
    th_server_stop(r);
    th_server_stop(p);
    th_log("ok");
    return 0;
}
