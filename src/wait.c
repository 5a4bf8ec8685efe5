/* Acquire attempts and waiting. A waiter subscribes to its kind's channel,
 * retries when a release is announced (or when a release granted it the
 * lock, for kinds that hand over), and otherwise sleeps until the
 * holder's lease would run out, bounded by the wait deadline: releases by
 * clients that publish nothing (redis-py, redsync) are noticed too. As a
 * backstop it never sleeps longer than DL_WAIT_RECHECK_MS between attempts
 * (a wake-up swallowed by a hung waiter, a key deleted by hand). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kinds.h"

/* Keys held without any expiry (a peer's lock taken with no TTL) cannot be
 * waited out: re-check them with a backoff between these bounds. */
#define DL_NOTTL_RECHECK_MIN_MS 10
#define DL_NOTTL_RECHECK_MAX_MS 1000

/* A wait that meets a connection failure tries again after a pause between
 * these bounds (doubling), until its deadline (dlock_client_set_fail_fast). */
#define DL_OUTAGE_PAUSE_MIN_MS 50
#define DL_OUTAGE_PAUSE_MAX_MS 1000


/* Waits until the subscriber connection has a message, or until deadline,
 * or until the wait is cancelled (dlock_lock_cancel).
 * Returns DLOCK_OK (*granted -1: try again in t->pttl ms, not now; 0: now),
 * DLOCK_ETIMEDOUT, DLOCK_ECANCELED, or a failure. */
static int wait_message(dlock_lock *l, dl_conn *sub, int64_t until, dl_outcome *t, int *granted,
                        dl_err *err) {
    *granted = 0;
    redisReply *m = NULL;
    int rc = dl_sub_next(sub, &l->h.cancel, until, &m, err);
    if (rc == DLOCK_ECANCELED) return dl_cancel_err(l, err);
    if (rc) return rc;
    if (l->ops->message && m->type == REDIS_REPLY_ARRAY && m->elements == 3)
        *granted = l->ops->message(l, m->element[2], t);
    freeReplyObject(m);
    return DLOCK_OK;
}

static int subscribe(dlock_lock *l, dl_conn *sub, const char *cmd, dl_err *err) {
    return dl_subscribe_cmd(l->h.c, sub, cmd, l->h.channel, l->h.channel_len, err);
}

static int64_t wait_left(int64_t deadline) {
    if (deadline == DL_INF_DEADLINE) return -1;
    int64_t left = deadline - dl_now_ms();
    return left > 0 ? left : 0;
}


/* wait_replicas: WAIT until enough replicas have the acquire, or release it.
 * Acknowledged only after the lease ran out (WAIT may take longer than a
 * short lease): the lock is no longer held, maybe taken by another client
 * meanwhile, so that is a failure too (the release is owner-checked).
 * WAIT counts the replicas that acknowledged this connection's own latest
 * write. That covers a fair lock handed over by a release too: the grant is
 * written by the releaser's connection, but the new owner takes it up with
 * an attempt on this connection (lock_fair.c), a write that follows the
 * grant in the replication stream, so a replica that acknowledges it has
 * the grant (test_replicas). */
static int wait_acks(dlock_lock *l, dl_conn *conn, dl_err *err) {
    dlock_client *c = l->h.c;
    char nm[80];
    long long acks = 0;
    int rc = dl_conn_wait_replicas(c, conn, c->wait_replicas_timeout_ms, 0, &acks, err);
    int late = !rc && acks >= c->wait_replicas && dl_now_ms() >= l->expires_at;
    if (!rc && acks >= c->wait_replicas && !late) return DLOCK_OK;
    /* not safe across a failover, or no longer held: give it back */
    long long res;
    dl_err ignored;
    if (!conn->broken) l->ops->release(l, conn, &res, &ignored);
    if (rc) return rc;
    if (late)
        return dl_seterr(err, DLOCK_EREPLICAS,
                         "lock '%s' acquired, but its lease ran out before %d replicas "
                         "acknowledged it; released",
                         dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm), c->wait_replicas);
    return dl_seterr(err, DLOCK_EREPLICAS,
                     "lock '%s' acquired, but only %lld of %d replicas acknowledged within "
                     "%lld ms; released",
                     dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm), acks, c->wait_replicas,
                     (long long)c->wait_replicas_timeout_ms);
}

/* One attempt; the holder identity goes in the same write when the client
 * records it (holder.c). */
static int attempt(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms, dl_outcome *t,
                   dl_err *err) {
    conn->post = dl_who_post(l, l->holds > 0 ? 'r' : 'a', lease_ms);
    int rc = l->ops->attempt(l, conn, lease_ms, wait_ms, t, err);
    conn->post = NULL;
    if (rc && t->unfenced && !conn->broken) {
        /* nothing is held on a failed acquire: give back what the script took */
        long long res;
        dl_err ignored;
        l->ops->release(l, conn, &res, &ignored);
    }
    return rc;
}

/* One wait for the lock until deadline (wait_ms 0: one attempt), on fresh
 * connections: attempt, subscribe, attempt again at each wake-up. */
static int wait_once(dlock_lock *l, int64_t wait_ms, int64_t deadline, int64_t lease_ms,
                     dl_outcome *t, dl_err *err) {
    dlock_client *c = l->h.c;
    dl_conn *conn = NULL, *sub = NULL;
    char nm[80];
    /* a re-entry given back for want of replicas leaves the handle's hold
     * as it was, with the validity it had */
    int64_t expires0 = l->expires_at;
    long long last_ok0 = atomic_load(&l->lease.last_ok);
    int rc = dl_pool_get_key(c, l->h.name, l->h.name_len, dl_cmd_deadline(c), &conn, err);
    if (rc) return rc;
    dl_node *node = conn->node;
    /* still subscribed to our own channel since an earlier wait of this
     * owner (a lingering subscription): this first attempt already comes
     * after subscribing */
    if (l->ops->own_channel && wait_ms != 0)
        sub = dl_sub_take_linger(node, l->h.channel, l->h.channel_len);
    l->listening = sub != NULL;
    rc = attempt(l, conn, lease_ms, wait_ms, t, err);
    if (rc || t->acquired) goto done;
    if (wait_ms == 0) {
        rc = dl_seterr(err, DLOCK_EBUSY, "lock '%s' is held by another owner",
                       dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm));
        goto done;
    }
    dl_cancel_begin(&l->h.cancel); /* from here on, a cancel wakes the wait below */
    int tried = sub != NULL; /* the attempt above counts */
    if (!sub) {
        int already = 0;
        rc = dl_sub_get(node, l->h.channel, l->h.channel_len, dl_cmd_deadline(c), &sub,
                             &already, err);
        if (!rc && !already) rc = subscribe(l, sub, "SUBSCRIBE", err);
    }
    int64_t recheck = DL_NOTTL_RECHECK_MIN_MS;
    l->listening = 1; /* every attempt from here on comes after subscribing */
    while (!rc) {
        /* subscribed before this attempt: a release after it is not missed */
        if (!tried) rc = attempt(l, conn, lease_ms, wait_left(deadline), t, err);
        tried = 0;
        if (rc || t->acquired) break;
        if (dl_canceled(&l->h.cancel)) {
            rc = dl_cancel_err(l, err);
            break;
        }
        int64_t now = dl_now_ms();
        if (now >= deadline) {
            rc = dl_seterr(err, DLOCK_ETIMEDOUT, "timed out waiting for lock '%s'",
                           dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm));
            break;
        }
        int64_t until = deadline;
        if (now + DL_WAIT_RECHECK_MS < until) until = now + DL_WAIT_RECHECK_MS;
        if (t->pttl >= 0) {
            /* +1: the key is surely gone on the server's clock by then */
            if (now + t->pttl + 1 < until) until = now + t->pttl + 1;
        } else if (t->pttl == -1) {
            if (now + recheck < until) until = now + recheck;
            recheck = recheck * 2 > DL_NOTTL_RECHECK_MAX_MS ? DL_NOTTL_RECHECK_MAX_MS : recheck * 2;
        } else {
            continue; /* gone between the attempt's two steps: try again */
        }
        /* the slot moved: follow it, then try again there (subscribed
         * first, so a release after that attempt is not missed) */
        int moved = 0;
        rc = dl_follow_slot(c, l->h.channel, l->h.channel_len, &conn, &sub, &moved, err);
        if (rc || moved) continue;
        int granted = 0;
        do {
            rc = wait_message(l, sub, until, t, &granted, err);
            /* "come back in t->pttl ms", not now */
            if (!rc && granted < 0 && dl_now_ms() + t->pttl + 1 < until)
                until = dl_now_ms() + t->pttl + 1;
        } while (!rc && granted < 0);
        if (rc == DLOCK_ETIMEDOUT) rc = DLOCK_OK;

    }
    if (rc && l->ops->abandon && conn && !conn->broken) l->ops->abandon(l, conn);
done:
    dl_cancel_end(&l->h.cancel);
    if (sub && !rc && t->acquired && l->ops->own_channel) {
        /* the caller holds the lock now, not one write later: the
         * subscription lingers until the connection's next use */
        dl_sub_linger(sub, l->h.channel, l->h.channel_len);
    } else {
        /* leave without waiting for the UNSUBSCRIBE confirmation */
        dl_unsubscribe_async(sub, l->h.channel, l->h.channel_len);
    }
    sub = NULL;
    if (!rc && t->acquired && c->wait_replicas > 0) {
        rc = wait_acks(l, conn, err);
        if (rc) {
            t->acquired = 0;
            l->expires_at = expires0;
            atomic_store(&l->lease.last_ok, last_ok0);
        }
    }
    dl_pool_put(c, conn);
    return rc;
}

/* After a connection failure in a wait: an attempt whose reply was lost may
 * have taken the lock. A kind whose every acquire call has an owner of its
 * own (the plain lock's token) finds out for sure: a hold under this call's
 * owner is that attempt's, and is given back so that the wait goes on as
 * if it had failed. Other kinds cannot tell such a hold from another
 * handle's of the same owner (reentrancy is per client and thread): the
 * retried attempt re-enters it, and the count left over after the last
 * release runs out with the lease. 1 when it is known now (none, or given
 * back), 0 when the server could not be asked. */
static int settle_lost_attempt(dlock_lock *l) {
    if (!l->ops->unique_owner) return 1;
    dl_conn *conn = NULL;
    dl_err ignored = {0};
    if (dl_pool_get_key(l->h.c, l->h.name, l->h.name_len, dl_cmd_deadline(l->h.c), &conn, &ignored))
        return 0;
    int held = 0;
    int64_t count = 0;
    int rc = l->ops->check(l, conn, &held, &count, &ignored);
    long long res = 0;
    if (!rc && held) rc = l->ops->release(l, conn, &res, &ignored);
    dl_pool_put(l->h.c, conn);
    return rc == DLOCK_OK;
}

int dl_lock_wait(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t, dl_err *err) {
    dlock_client *c = l->h.c;
    int64_t deadline = dl_deadline(wait_ms);
    int64_t pause = DL_OUTAGE_PAUSE_MIN_MS;
    int unsettled = 0; /* an attempt's reply may have been lost */
    for (;;) {
        int rc = unsettled && !settle_lost_attempt(l) ? DLOCK_EIO : DLOCK_OK;
        if (!rc) {
            unsettled = 0;
            rc = wait_once(l, wait_ms, deadline, lease_ms, t, err);
        }
        /* a connection lost or a server that stopped answering, with time
         * left to wait: the outage may be over before the caller's wait */
        if (rc != DLOCK_EIO || wait_ms == 0 || atomic_load(&c->fail_fast)) return rc;
        unsettled = 1;
        int64_t left = deadline - dl_now_ms();
        if (left <= 0) return rc;
        dl_cancel_begin(&l->h.cancel);
        int cancelled = dl_cancel_nap(&l->h.cancel, pause < left ? pause : left);
        dl_cancel_end(&l->h.cancel);
        if (cancelled || dl_canceled(&l->h.cancel)) return dl_cancel_err(l, err);
        pause = pause * 2 > DL_OUTAGE_PAUSE_MAX_MS ? DL_OUTAGE_PAUSE_MAX_MS : pause * 2;
    }
}
