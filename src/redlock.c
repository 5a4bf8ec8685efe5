/* RedLock over independent masters (the Redis documentation's algorithm):
 * the same key and owner on every node, all contacted at once with a
 * per-node timeout much smaller than the lease; acquired when a majority
 * accepted and time is left: validity = lease - elapsed - drift, with
 * drift = lease / 100 + 2 ms. Otherwise what the attempt did is undone,
 * node by node, and it is tried again after a random delay. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "kinds.h"

#define DL_RL_RETRY_MIN_MS 10
#define DL_RL_RETRY_MAX_MS 100
#define DL_RL_PROBE_MS 100


/* One connection to node n for a fan-out: an idle one, else a new one whose
 * connect is only started (dl_conn_open_start: the fan-out finishes it,
 * *opened = 1), else (TLS, a name with several addresses) one opened
 * before deadline. 1 if there is one. */
static int take_or_start(dl_node *n, int64_t deadline, int backoff, dl_conn **conn,
                         unsigned char *opened) {
    dl_err err;
    *conn = NULL;
    if (dl_node_take_idle(n, deadline, conn)) return 1;
    int rc = dl_conn_open_start(&n->ep, conn, &err);
    if (rc == DLOCK_OK) {
        (*conn)->node = n;
        *opened = 1;
        return 1;
    }
    if (rc == DLOCK_ENOTSUP) {
        rc = backoff ? dl_node_get(n, deadline, conn, &err) : dl_node_get_now(n, deadline, conn, &err);
        if (rc == DLOCK_OK) return 1;
        *conn = NULL;
        return 0;
    }
    dl_node_opened(n, rc);
    return 0;
}

/* Borrows one connection per node (NULL where the node cannot be reached),
 * opening the missing ones all at once (finished by the fan-out, each
 * request sent as soon as its connection is up: a node slow to connect or
 * authenticate costs the others nothing, where connections opened one after
 * another under the request's deadline would let a frozen master's AUTH use
 * it all up). A node whose reconnect backoff runs (it failed to connect
 * lately: 50 ms doubling to 2 s) is left out, unless the others are short
 * of a majority: then it is tried again if its last attempt is
 * DL_RL_PROBE_MS old. Before, a master restarted after an outage counted as
 * down for up to the whole 2 s, and every acquire of that time failed with
 * DLOCK_ENOQUORUM; a dead master now costs at most one connect attempt per
 * DL_RL_PROBE_MS, and only while the quorum needs it. */
static void get_all(dlock_client *c, int64_t deadline, dl_conn **conns, unsigned char *opened) {
    int later[DL_MAX_NODES];
    size_t got = 0;
    for (size_t i = 0; i < c->nnodes; i++) {
        int probe = 0;
        conns[i] = NULL;
        opened[i] = 0;
        later[i] = 0;
        if (dl_node_backoff(c->nodes[i], DL_RL_PROBE_MS, &probe)) {
            later[i] = probe;
            continue;
        }
        got += (size_t)take_or_start(c->nodes[i], deadline, 1, &conns[i], &opened[i]);
    }
    for (size_t i = 0; i < c->nnodes && got < c->quorum; i++)
        if (later[i]) got += (size_t)take_or_start(c->nodes[i], deadline, 0, &conns[i], &opened[i]);
}

static void put_all(dlock_client *c, dl_conn **conns, redisReply **replies) {
    for (size_t i = 0; i < c->nnodes; i++) {
        dl_node_put(conns[i]);
        conns[i] = NULL;
        if (replies && replies[i]) {
            freeReplyObject(replies[i]);
            replies[i] = NULL;
        }
    }
}

/* Runs op's call on every node; returns the number of answers. unanswered
 * (may be NULL) as dl_fanout_eval's. */
static size_t run_all(dlock_lock *l, int op, int64_t lease_ms, redisReply **replies,
                      dl_conn **conns, unsigned char *unanswered) {
    dlock_client *c = l->h.c;
    int64_t deadline = dl_deadline(c->node_timeout_ms);
    dl_call call;
    l->ops->call(l, op, lease_ms, &call);
    unsigned char opened[DL_MAX_NODES];
    get_all(c, deadline, conns, opened);
    dl_fanout_refused.code = DLOCK_OK;
    size_t answered = dl_fanout_eval(conns, c->nnodes, deadline, call.script, call.nkeys,
                                     call.keys, call.keylens, call.nargs, call.args,
                                     call.arglens, replies, unanswered);
    /* a new connection that did not get through its connect and AUTH in
     * time counts as a failed connect (the node's backoff) */
    for (size_t i = 0; i < c->nnodes; i++)
        if (opened[i])
            dl_node_opened(c->nodes[i], conns[i]->connecting || conns[i]->handshake > 0 ? DLOCK_EIO
                                                                                        : DLOCK_OK);
    return answered;
}

/* What a failed attempt left to undo on each node. */
enum { UNDO_NONE = 0, UNDO_NOW, UNDO_CHASE };

/* Undoes what a failed attempt did, node by node, and nothing else: the
 * release script (one hold less; the key deleted at none) on the nodes that
 * answered "acquired", and the same right behind the attempt's request, on
 * its connection, where no answer came (dl_fanout_chase: it runs there only
 * if the attempt's request did). A node that refused, answered an error, or
 * never got the request is left alone. Releasing on every node instead took
 * a reentrant hold's count down where a re-entry had not counted it up, and
 * deleted the hold there. */
static void undo_attempt(dlock_lock *l, int64_t lease_ms, dl_conn **conns,
                         const unsigned char *what) {
    dlock_client *c = l->h.c;
    dl_call call;
    /* a re-entry's undo leaves the hold with the lease it had */
    l->ops->call(l, DL_OP_RELEASE, l->holds > 0 ? l->lease_ms : lease_ms, &call);
    dl_conn *now[DL_MAX_NODES];
    redisReply *replies[DL_MAX_NODES];
    size_t nnow = 0;
    for (size_t i = 0; i < c->nnodes; i++) {
        now[i] = NULL;
        if (what[i] == UNDO_NOW) {
            now[i] = conns[i];
            nnow++;
        } else if (what[i] == UNDO_CHASE) {
            dl_fanout_chase(conns[i], call.script, call.nkeys, call.keys, call.keylens,
                            call.nargs, call.args, call.arglens);
        }
    }
    if (!nnow) return;
    dl_fanout_eval(now, c->nnodes, dl_deadline(c->node_timeout_ms), call.script, call.nkeys,
                   call.keys, call.keylens, call.nargs, call.args, call.arglens, replies, NULL);
    for (size_t i = 0; i < c->nnodes; i++)
        if (replies[i]) freeReplyObject(replies[i]);
}

static int no_quorum(dlock_client *c, size_t answered, dl_err *err) {
    if (dl_fanout_refused.code == DLOCK_EAUTH)
        return dl_seterr(err, DLOCK_EAUTH,
                         "no quorum: %zu of %zu nodes answered (%zu needed); a node refused "
                         "the credentials: %.200s",
                         answered, c->nnodes, c->quorum, dl_fanout_refused.msg);
    return dl_seterr(err, DLOCK_ENOQUORUM, "no quorum: %zu of %zu nodes answered (%zu needed)",
                     answered, c->nnodes, c->quorum);
}

/* The designated fencing counter: DL_LUA_FENCE on the lock's fence key there. */
static dl_script fence_script =
    DL_SCRIPT("fence", DL_LUA_FENCE("f", "KEYS[1]") "return f");

/* The token from the fence server, asked before deadline. */
static int fence_from_node(dlock_lock *l, uint64_t *fence, int64_t deadline, dl_err *err) {
    dlock_client *c = l->h.c;
    dl_conn *conn = NULL;
    int rc = dl_node_get(c->fence_node, deadline, &conn, err);
    if (rc) return rc;
    const char *keys[1] = {l->fence_key};
    size_t keylens[1] = {l->fence_key_len};
    redisReply *r = NULL;
    long long v = 0;
    rc = dl_eval(conn, deadline, &fence_script, 1, keys, keylens, 0, NULL, NULL, &r, err);
    if (!rc) rc = dl_reply_expect_int(r, "fence counter", &v, err);
    if (r) freeReplyObject(r);
    dl_node_put(conn);
    if (!rc) *fence = (uint64_t)v;
    return rc;
}

/* One RedLock attempt. *answered: nodes that answered. */
static int attempt(dlock_lock *l, int64_t lease_ms, dl_outcome *t, size_t *answered, dl_err *err) {
    dlock_client *c = l->h.c;
    redisReply *replies[DL_MAX_NODES];
    dl_conn *conns[DL_MAX_NODES];
    unsigned char unanswered[DL_MAX_NODES];
    unsigned char what[DL_MAX_NODES];
    memset(t, 0, sizeof *t);
    int64_t t0 = dl_now_ms();
    *answered = run_all(l, DL_OP_ACQUIRE, lease_ms, replies, conns, unanswered);
    size_t ok = 0, undo = 0;
    uint64_t fence = 0;
    int64_t count = 1, pttl = -2;
    int server_rc = DLOCK_OK;
    size_t errors = 0;
    dl_err server_err = {0};
    for (size_t i = 0; i < c->nnodes; i++) {
        what[i] = unanswered[i] ? UNDO_CHASE : UNDO_NONE;
        undo += unanswered[i];
        if (!replies[i]) continue;
        dl_outcome one;
        dl_err e = {0};
        int rc = dl_parse_attempt(l, replies[i], t0, lease_ms, &one, &e);
        if (rc) {
            /* a script that fails stops before its writes, but for one that
             * took the lock and could not fence it (given back here) */
            if (one.unfenced) what[i] = UNDO_NOW, undo++;
            if (!server_rc) server_rc = rc, server_err = e;
            errors++;
            continue;
        }
        if (one.acquired) {
            ok++;
            what[i] = UNDO_NOW;
            undo++;
            if (one.fence > fence) fence = one.fence;
            if (one.count > count) count = one.count;
        } else if (one.pttl >= 0 && (pttl < 0 || one.pttl < pttl)) {
            pttl = one.pttl;
        }
    }
    for (size_t i = 0; i < c->nnodes; i++) {
        if (replies[i]) freeReplyObject(replies[i]);
        replies[i] = NULL;
    }
    int64_t elapsed = dl_now_ms() - t0;
    int64_t validity = lease_ms - elapsed - dl_redlock_drift_ms(lease_ms);
    if (ok >= c->quorum && validity > 0) {
        /* the token must come while the hold is valid: one issued after it
         * ran out could follow the next holder's (a token higher than the
         * holder's, for a hold that is over) */
        int64_t valid_until = t0 + lease_ms - dl_redlock_drift_ms(lease_ms);
        int64_t deadline = dl_cmd_deadline(c);
        if (deadline > valid_until) deadline = valid_until;
        int rc = c->fence_node ? fence_from_node(l, &fence, deadline, err) : DLOCK_OK;
        int late = c->fence_node && dl_now_ms() >= valid_until;
        if (rc || late) {
            undo_attempt(l, lease_ms, conns, what);
            put_all(c, conns, NULL);
            if (rc == DLOCK_EIO && late)
                return dl_seterr(err, DLOCK_EIO,
                                 "the fence server did not answer within the lock's validity "
                                 "(%lld ms); not acquired",
                                 (long long)(lease_ms - dl_redlock_drift_ms(lease_ms)));
            if (rc) return rc;
            t->pttl = 0; /* not acquired: the wait goes on, or a try fails as busy */
            return DLOCK_OK;
        }
        put_all(c, conns, NULL);
        t->acquired = 1;
        t->fence = fence;
        t->count = count;
        l->expires_at = t0 + lease_ms - dl_redlock_drift_ms(lease_ms);
        atomic_store(&l->lease.last_ok, (long long)t0);
        return DLOCK_OK;
    }
    if (undo) undo_attempt(l, lease_ms, conns, what);
    put_all(c, conns, NULL);
    t->pttl = pttl;
    if (errors >= c->quorum) {
        /* a majority refused with an error (WRONGTYPE...): not worth waiting */
        *err = server_err;
        return server_rc;
    }
    return DLOCK_OK;
}

static int redlock_wait(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                        dl_err *err);

int dl_redlock_wait(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t, dl_err *err) {
    if (wait_ms != 0) dl_cancel_begin(&l->h.cancel);
    int rc = redlock_wait(l, wait_ms, lease_ms, t, err);
    dl_cancel_end(&l->h.cancel);
    return rc;
}

static int redlock_wait(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                        dl_err *err) {
    dlock_client *c = l->h.c;
    char nm[80];
    if (!l->ops->call || l->ops->one_server)
        return dl_seterr(err, DLOCK_ENOTSUP, "%s locks are not supported on redlock://",
                         l->ops->name);
    if (lease_ms <= dl_redlock_drift_ms(lease_ms) + c->node_timeout_ms)
        return dl_seterr(err, DLOCK_EINVAL,
                         "lease %lld ms is too short for RedLock (node timeout %lld ms)",
                         (long long)lease_ms, (long long)c->node_timeout_ms);
    int64_t deadline = dl_deadline(wait_ms);
    for (;;) {
        size_t answered = 0;
        int rc = attempt(l, lease_ms, t, &answered, err);
        if (rc || t->acquired) return rc;
        if (wait_ms != 0 && dl_canceled(&l->h.cancel)) return dl_cancel_err(l, err);
        int64_t now = dl_now_ms();
        if (wait_ms == 0 || now >= deadline) {
            if (answered < c->quorum) return no_quorum(c, answered, err);
            if (wait_ms == 0)
                return dl_seterr(err, DLOCK_EBUSY, "lock '%s' is held by another owner",
                                 dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm));
            return dl_seterr(err, DLOCK_ETIMEDOUT, "timed out waiting for lock '%s'",
                             dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm));
        }
        /* random delay, so that competing clients do not collide again;
         * no longer than the holder's remaining lease or the deadline */
        int64_t delay =
            DL_RL_RETRY_MIN_MS + (int64_t)dl_random_below(DL_RL_RETRY_MAX_MS - DL_RL_RETRY_MIN_MS);
        if (t->pttl >= 0 && t->pttl + 1 < delay) delay = t->pttl + 1;
        if (now + delay > deadline) delay = deadline - now;
        /* the delay, cut short by a cancel */
        if (dl_cancel_nap(&l->h.cancel, delay)) return dl_cancel_err(l, err);
    }
}

int dl_redlock_release(dlock_lock *l, long long *res, dl_err *err) {
    dlock_client *c = l->h.c;
    redisReply *replies[DL_MAX_NODES];
    dl_conn *conns[DL_MAX_NODES];
    dl_call call;
    l->ops->call(l, DL_OP_RELEASE, l->lease_ms, &call);
    size_t answered = run_all(l, DL_OP_RELEASE, l->lease_ms, replies, conns, NULL);
    size_t released = 0, still = 0;
    for (size_t i = 0; i < c->nnodes; i++) {
        long long v;
        if (!replies[i] || dl_reply_int(replies[i], &v)) continue;
        v = dl_call_release_result(&call, v);
        if (v == 1) released++;
        else if (v == 0) still++;
    }
    put_all(c, conns, replies);
    /* too few answered to tell: what they had is deleted, the handle still
     * holds (a retry deletes the rest; the lease ends it otherwise) */
    if (answered < c->quorum) return no_quorum(c, answered, err);
    size_t unanswered = c->nnodes - answered;
    if (still >= c->quorum) {
        *res = 0; /* a re-entered hold, still a majority's */
    } else if (released + still + unanswered < c->quorum) {
        /* fewer than a majority had the hold, even counting the nodes that
         * did not answer: it was not a majority's until now (its keys left
         * are deleted all the same) */
        *res = -1;
    } else {
        /* a majority had it, and no majority has it any more: the hold is
         * over, even where a count is left (on a minority, until its lease
         * runs out): "still held" would keep a handle holding what another
         * owner can now take */
        *res = 1;
    }
    return DLOCK_OK;
}

int dl_redlock_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err) {
    dlock_client *c = l->h.c;
    redisReply *replies[DL_MAX_NODES];
    dl_conn *conns[DL_MAX_NODES];
    int64_t t0 = dl_now_ms();
    size_t answered = run_all(l, DL_OP_EXTEND, lease_ms, replies, conns, NULL);
    size_t ok = 0;
    for (size_t i = 0; i < c->nnodes; i++) {
        long long v;
        if (replies[i] && !dl_reply_int(replies[i], &v) && v == 1) ok++;
    }
    put_all(c, conns, replies);
    if (ok >= c->quorum && dl_now_ms() - t0 + dl_redlock_drift_ms(lease_ms) < lease_ms) {
        *res = 1;
        return DLOCK_OK;
    }
    if (answered < c->quorum) return no_quorum(c, answered, err);
    *res = 0;
    return DLOCK_OK;
}

int dl_redlock_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    dlock_client *c = l->h.c;
    size_t answered = 0, yes = 0;
    int64_t most = 0;
    for (size_t i = 0; i < c->nnodes; i++) {
        dl_conn *conn = NULL;
        dl_err e;
        int h = 0;
        int64_t n = 0;
        if (dl_node_get(c->nodes[i], dl_deadline(c->node_timeout_ms), &conn, &e)) continue;
        if (!l->ops->check(l, conn, &h, &n, &e)) {
            answered++;
            if (h) yes++;
            if (n > most) most = n;
        }
        dl_node_put(conn);
    }
    if (answered < c->quorum) return no_quorum(c, answered, err);
    *held = yes >= c->quorum;
    *count = *held ? most : 0;
    return DLOCK_OK;
}
