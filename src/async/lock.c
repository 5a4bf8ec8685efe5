/* The locks from an event loop, on the blocking locks' keys and scripts
 * (each kind's requests are built by its entry in kinds.c), so that async
 * and blocking clients exclude each other on one name and wake each other's
 * waiters.
 *
 * An acquire that may wait joins the client's subscription table on its
 * kind's channel and attempts at once, in parallel: a plain waiter on its
 * own channel (redisson_lock__channel:{N}:<token>), registering its token in
 * dlock_waiters:{N} at each failed waiting attempt; a fair waiter on its own
 * (redisson_lock__channel:{N}:<owner>), joining the queue; a reentrant one
 * on Redisson's unlock channel (redisson_lock__channel:{N}) and the read
 * and write sides on redisson_rwlock:{N}, shared by every waiter of the
 * name, a writer entering {N}:write_waiters. Every kind but the plain lock
 * has the handle's own token for its owner (kinds.c). As in wait.c, a
 * release between an attempt and the subscription must not be missed: an
 * attempt sent before the channel was confirmed is followed, once it is,
 * by another (a fair one sent before is "joining": a release does not take
 * it for dead). The waiter then attempts again at a message on its channel
 * (the fair lock's "next:<ms>" says when instead), when the holder's lease
 * runs out (the attempt's PTTL + 1 ms; a fair or write waiter's attempt
 * answers its keep-alive at most, so that its queue entry is refreshed
 * before it expires), and at least every DL_WAIT_RECHECK_MS; the attempt at
 * the deadline is a try-once, as the blocking wait's. A waiter that gives
 * up (deadline, cancel, failure, its handle or client freed) runs its
 * kind's abandon: the plain one passes on a wake it may have been sent, the
 * fair one leaves the queue (and gives back a grant that came meanwhile),
 * the write one leaves the waiting writers.
 *
 * Each operation ends once: its handle's op.gen counts operations, and a
 * reply for an operation that ended already (cancelled, failed) is an
 * orphan: an acquire it won is given back, a registration it made is
 * abandoned. An acquire whose reply was lost with the connection may have
 * won: its token is kept (the client's settle list) and given back by the
 * owner-checked release once the command connection is up again, with the
 * abandon if it waited (a counted kind's release expecting the count it
 * would have made: a lower count means it never ran, and the release
 * changes nothing). A wait that meets a connection failure with time left
 * waits on (ride_out), as wait.c's does: what is owed goes first on the
 * next connection, then the next attempt. A DLOCK_WATCHDOG hold is renewed
 * by renew.c with its kind's blocking renewal script. */
#include <stdlib.h>
#include <string.h>

#include "async.h"

#define NOTTL_MIN_MS 10
#define NOTTL_MAX_MS 1000
/* the pause before trying again after a connection failure in a wait
 * (doubling), as wait.c's */
#define OUTAGE_PAUSE_MIN_MS 50
#define OUTAGE_PAUSE_MAX_MS 1000

enum { OP_NONE = 0, OP_ACQUIRE, OP_RELEASE, OP_EXTEND };
/* a request: kinds.c's DL_AR_*, and the give back (a release owed) */
enum { R_ATTEMPT = DL_AR_ATTEMPT, R_RELEASE = DL_AR_RELEASE, R_EXTEND = DL_AR_EXTEND,
       R_ABANDON = DL_AR_ABANDON, R_GIVEBACK, R_WAIT };

typedef struct lreq lreq;

typedef struct aop {
    int type;                  /* OP_*, OP_NONE: none pending */
    unsigned gen;              /* counts operations: a request of an earlier one is an orphan */
    dlock_async_fn cb;
    void *ud;
    int64_t lease_ms, deadline;
    int waiting;               /* an acquire with wait_ms != 0 */
    int watchdog;              /* an acquire with DLOCK_WATCHDOG */
    char token[DLOCK_TOKEN_LEN + 1];
    dl_awaiter w;              /* in the subscription table while waiting */
    dl_atimer timer;           /* the next attempt */
    lreq *inflight;            /* the attempt whose reply is awaited */
    int woken;                 /* a message came while an attempt was out */
    int registered;            /* an attempt of this acquire registered it */
    int64_t nottl;             /* backoff for a key without expiry */
    int64_t outage;            /* the next pause after a connection failure */
} aop;

struct dlock_async_lock {
    dl_aclient *c;
    dlock_async_lock *prev, *next; /* the client's handles */
    dl_akeys *k;               /* its kind, keys, owner and channel */
    int refs;                  /* 1 for the handle, 1 per request out */
    int64_t holds;             /* the hold count (plain: 0 or 1) */
    char token[DLOCK_TOKEN_LEN + 1];
    int64_t expires_at;
    aop op;
    dl_alease *lease;          /* the watchdog's (made for the handle's first
                                * DLOCK_WATCHDOG hold: most handles have none) */
    int lost;                  /* the watchdog found the hold lost */
    dlock_async_lost_fn lost_fn;
    void *lost_ud;
    char *errmsg;              /* the last failure's message (made on the
                                * first failure: most handles never fail) */
    int msg_lost;              /* a failure whose message memory refused */
};

/* A request of a live handle's operation. */
struct lreq {
    dl_areq q;
    dlock_async_lock *l;
    unsigned gen;
    int what;                  /* R_ATTEMPT, R_RELEASE, R_EXTEND, R_WAIT */
    int recheck;               /* an attempt that registers (waiting) */
    int reg;                   /* sent with "registered by an earlier attempt" */
    int after_sub;             /* sent once the waiter's channel was confirmed */
    int by_text;               /* sent as EVAL (after NOSCRIPT) */
    int64_t lease_ms, t0;
    int64_t held;              /* the handle's holds when it was sent (R_WAIT
                                * after an acquire: the count it made) */
    uint64_t fence;            /* R_WAIT after an acquire: its fencing token */
    int ext;                   /* R_WAIT: after an extend (else an acquire) */
    char token[DLOCK_TOKEN_LEN + 1];
};

/* A request that owes nobody an answer (give back, abandon): it holds a
 * reference to its handle's keys, so it outlives its handle. Also the
 * client's settle list entry, before it is sent. */
typedef struct dl_asettle {
    dl_areq q;
    struct dl_asettle *next;
    dl_aclient *c;
    dl_akeys *k;
    int what;                  /* R_GIVEBACK, R_ABANDON */
    int by_text;
    char token[DLOCK_TOKEN_LEN + 1]; /* plain: the acquire's token */
    int64_t expect;            /* counted kinds: the count it expects to find */
} oreq;

static void lreq_done(dl_areq *q, redisReply *r, const dl_err *err);
static void oreq_done(dl_areq *q, redisReply *r, const dl_err *err);
static void attempt(dlock_async_lock *l);

/* The owner a request names: the plain acquire's token, else the handle's. */
static const char *owner_of(const dl_akeys *k, const char *token, size_t *len) {
    if (k->kind->fresh_owner) {
        *len = DLOCK_TOKEN_LEN;
        return token;
    }
    *len = k->owner_len;
    return k->owner;
}

static void unref(dlock_async_lock *l) {
    if (--l->refs > 0) return;
    dl_akeys_unref(l->k);
    free(l->lease);
    free(l->errmsg);
    free(l);
}

static int fail(dlock_async_lock *l, const dl_err *err) {
    if (!l->errmsg) l->errmsg = malloc(DL_ERRMSG_MAX);
    l->msg_lost = !l->errmsg;
    if (l->errmsg) snprintf(l->errmsg, DL_ERRMSG_MAX, "%s", err->msg);
    return err->code;
}

/* ---- requests without an owner to answer ---- */

static oreq *oreq_new(dlock_async_lock *l, int what, const char *token, int64_t expect) {
    oreq *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->c = l->c;
    o->k = l->k;
    o->k->refs++;
    o->what = what;
    o->expect = expect;
    memcpy(o->token, token, DLOCK_TOKEN_LEN);
    return o;
}

static void oreq_free(oreq *o) {
    dl_akeys_unref(o->k);
    free(o);
}

/* Sends o; DLOCK_OK or the failure (o not sent, still the caller's). */
static int oreq_send(oreq *o) {
    dl_err err;
    dl_aargs a = {.what = o->what == R_GIVEBACK ? DL_AR_RELEASE : DL_AR_ABANDON,
                  .expect = o->expect};
    a.token = owner_of(o->k, o->token, &a.token_len);
    dl_acall call;
    dl_akind_call(o->k, &a, &call);
    o->q.done = oreq_done;
    return dl_apipe_eval(dl_aroute(o->c, call.keys[0], call.keylens[0]), &o->q, call.s, o->by_text, call.nkeys, call.keys,
                         call.keylens, call.nargs, call.args, call.arglens, &err);
}

/* Keeps o to send once the command connection is up again. A plain give
 * back already kept for the same token is enough for both (one owner-checked
 * release undoes every attempt made with the token); a counted kind's is
 * not (each attempt may have counted one hold). */
static void settle_later(oreq *o) {
    if (o->k->kind->fresh_owner && o->what == R_GIVEBACK)
        for (oreq *k = o->c->settle; k; k = k->next)
            if (k->k == o->k && k->what == R_GIVEBACK &&
                !memcmp(k->token, o->token, DLOCK_TOKEN_LEN)) {
                oreq_free(o);
                return;
            }
    o->next = o->c->settle;
    o->c->settle = o;
}

/* Sends a give back or an abandon for l's token now, or once the
 * connection is up again. While the client is being freed, only an abandon
 * on a connection that is ready (written out before it closes: it leaves a
 * queue others wait behind). A counted kind's give back takes one hold of
 * a count expected at `expect` (one found lower was given back already, or
 * never taken: the script leaves it); kinds without an abandon
 * (reentrant, read) have nothing to leave. */
static void owe(dlock_async_lock *l, int what, const char *token, int64_t expect) {
    dl_aclient *c = l->c;
    if (what == R_ABANDON && !l->k->kind->abandons) return;
    dl_apipe *to = dl_aroute(c, l->k->s[0], l->k->len[0]);
    if (c->freeing && (what != R_ABANDON || !to->ready)) return;
    oreq *o = oreq_new(l, what, token, expect);
    if (!o) return; /* the lease runs out; the registry entry expires */
    /* on the connection there is, never a new one of its own: after a
     * failure the server may be down, and the next operation's connect
     * would find this one's refused */
    if (dl_apipe_opened(to) && !oreq_send(o)) return;
    if (!c->freeing) settle_later(o);
    else oreq_free(o);
}

static void oreq_done(dl_areq *q, redisReply *r, const dl_err *err) {
    (void)err;
    oreq *o = (oreq *)q;
    if (r && dl_is_noscript(r) && !o->by_text) {
        dl_apipe_forget_scripts(q->pipe);
        o->by_text = 1;
        if (!oreq_send(o)) return;
    }
    /* a request whose reply was lost may not have run: again later */
    if (!r && !o->c->freeing) {
        settle_later(o);
        return;
    }
    oreq_free(o);
}

void dl_alock_pipe_up(dl_apipe *p) {
    dl_aclient *c = p->cl;
    oreq *list = c->settle;
    c->settle = NULL;
    while (list) {
        oreq *o = list;
        list = o->next;
        o->next = NULL;
        o->by_text = 0;
        /* a cluster's other nodes: on their connection when it is open */
        dl_apipe *to = dl_aroute(c, o->k->s[0], o->k->len[0]);
        if ((to != p && !dl_apipe_opened(to)) || oreq_send(o)) settle_later(o);
    }
}

/* ---- ending an operation ---- */

/* Ends l's operation with code: leaves the table, owes what a waiter that
 * gives up owes, and runs the callback (last: it may free l). */
static void finish(dlock_async_lock *l, int code, uint64_t fence, const dl_err *err) {
    aop *op = &l->op;
    dl_aclient *c = l->c;
    dlock_async_fn cb = op->cb;
    void *ud = op->ud;
    if (code && err) fail(l, err);
    if (!code && l->errmsg) l->errmsg[0] = '\0';
    if (!code) l->msg_lost = 0;
    dl_atimer_stop(&c->loop, &op->timer);
    dl_asubs_leave(&c->subs, &op->w);
    /* an attempt still out is settled when its reply comes (an orphan),
     * unless the client is going: then the abandon goes behind it */
    if (op->type == OP_ACQUIRE && code && (op->inflight ? c->freeing : op->registered))
        owe(l, R_ABANDON, op->token, 0);
    op->type = OP_NONE;
    op->gen++;
    op->inflight = NULL;
    op->cb = NULL;
    l->refs++; /* the callback may free the handle */
    cb(l, code, fence, ud);
    unref(l);
}

/* finish with the message fmt, whose one %s is the lock's name */
static void finish_msg(dlock_async_lock *l, int code, const char *fmt) {
    dl_err err = {code, ""};
    char nm[80];
    snprintf(err.msg, sizeof err.msg, fmt, dl_name_msg(l->k->s[0], l->k->len[0], nm, sizeof nm));
    finish(l, code, 0, &err);
}

/* ---- sending ---- */

static int send_req(dlock_async_lock *l, int what, const char *token, int64_t lease_ms,
                    int recheck, int registered, int by_text, lreq **out, dl_err *err) {
    lreq *rq = calloc(1, sizeof *rq);
    if (!rq) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    rq->q.done = lreq_done;
    rq->l = l;
    rq->gen = l->op.gen;
    rq->what = what;
    rq->recheck = recheck;
    rq->reg = registered;
    rq->by_text = by_text;
    rq->lease_ms = lease_ms;
    rq->held = l->holds;
    rq->after_sub = dl_asubs_subscribed(&l->op.w);
    memcpy(rq->token, token, DLOCK_TOKEN_LEN);
    dl_aargs a = {.what = what, .lease_ms = lease_ms, .queue = recheck, .reg = registered,
                  .joining = !rq->after_sub, .held = l->holds, .expect = l->holds,
                  .fair_wait_ms = l->c->fair_wait_ms};
    a.token = owner_of(l->k, rq->token, &a.token_len);
    dl_acall call;
    dl_akind_call(l->k, &a, &call);
    rq->t0 = dl_now_ms();
    int rc = dl_apipe_eval(dl_aroute(l->c, call.keys[0], call.keylens[0]), &rq->q, call.s, by_text, call.nkeys, call.keys,
                           call.keylens, call.nargs, call.args, call.arglens, err);
    if (rc) {
        free(rq);
        return rc;
    }
    l->refs++;
    if (out) *out = rq;
    return DLOCK_OK;
}

/* A connection failure (err) in a wait with time left: the wait goes on,
 * as the blocking wait's does (wait.c), trying again after a pause that
 * doubles up to OUTAGE_PAUSE_MAX_MS; the outage may be over before the
 * caller's wait. 1 when it goes on (err kept as the message of the failure
 * it ends with if the deadline comes first), 0 when the acquire must end
 * with err. */
static int rides(dlock_async_lock *l, const dl_err *err) {
    aop *op = &l->op;
    if (op->type != OP_ACQUIRE || !op->waiting || err->code != DLOCK_EIO || l->c->freeing ||
        dl_now_ms() >= op->deadline)
        return 0;
    fail(l, err);
    return 1;
}

/* rides, and arms the next attempt after the pause */
static int ride_out(dlock_async_lock *l, const dl_err *err) {
    aop *op = &l->op;
    if (!rides(l, err)) return 0;
    int64_t at = dl_now_ms() + op->outage;
    if (at > op->deadline) at = op->deadline;
    op->outage = op->outage * 2 > OUTAGE_PAUSE_MAX_MS ? OUTAGE_PAUSE_MAX_MS : op->outage * 2;
    return !dl_atimer_arm(&l->c->loop, &op->timer, at);
}

/* The acquire's next attempt: a waiting one registers, the one at the
 * deadline tries once. A waiter whose subscribed connection failed joins
 * the table again first. */
static void attempt(dlock_async_lock *l) {
    aop *op = &l->op;
    dl_err err;
    dl_atimer_stop(&l->c->loop, &op->timer);
    int recheck = op->waiting && dl_now_ms() < op->deadline;
    op->woken = 0;
    int rc = DLOCK_OK;
    if (op->waiting && !op->w.chan)
        rc = dl_asubs_join(&l->c->subs, &op->w, l->k->chan, l->k->chan_len, &err);
    if (!rc) rc = send_req(l, R_ATTEMPT, op->token, op->lease_ms, recheck, op->registered, 0,
                           &op->inflight, &err);
    if (rc && !ride_out(l, &err)) finish(l, rc, 0, &err);
}

static void on_timer(dl_atimer *t) {
    dlock_async_lock *l = t->arg;
    if (l->op.type == OP_ACQUIRE && !l->op.inflight) attempt(l);
}

static void on_wake(dl_awaiter *w, int confirmed) {
    (void)confirmed;
    dlock_async_lock *l = (dlock_async_lock *)((char *)w - offsetof(dlock_async_lock, op.w));
    if (l->op.type != OP_ACQUIRE) return;
    if (l->op.inflight) l->op.woken = 1; /* attempt again after its reply */
    else attempt(l);
}

/* A message the kind reads (the fair lock's "next:<ms>": come back then,
 * not now, unless the next attempt is due sooner), else a wake. */
static void on_message(dl_awaiter *w, const redisReply *msg) {
    dlock_async_lock *l = (dlock_async_lock *)((char *)w - offsetof(dlock_async_lock, op.w));
    aop *op = &l->op;
    int64_t ms = 0;
    if (op->type != OP_ACQUIRE || !l->k->kind->message || !l->k->kind->message(msg, &ms)) {
        on_wake(w, 0);
        return;
    }
    if (op->inflight) return; /* its reply says when */
    int64_t at = dl_now_ms() + ms + 1;
    if (at > op->deadline) at = op->deadline;
    if (!op->timer.idx || at < op->timer.at) dl_atimer_arm(&l->c->loop, &op->timer, at);
}

/* The subscribed connection failed: the waiter is out of the table. It
 * joins again at its next attempt (never from here: the table is being
 * emptied), after a pause unless an attempt is out. */
static void on_lost(dl_awaiter *w, const dl_err *err) {
    dlock_async_lock *l = (dlock_async_lock *)((char *)w - offsetof(dlock_async_lock, op.w));
    if (l->op.type != OP_ACQUIRE) return;
    /* an attempt out: its reply (or failure) arms the next attempt */
    if (l->op.inflight ? rides(l, err) : ride_out(l, err)) return;
    finish(l, err->code, 0, err);
}

/* ---- the watchdog's holds (renew.c) ---- */

/* l's hold is renewed no more */
static void unwatch(dlock_async_lock *l) {
    if (l->lease) dl_arenew_remove(&l->c->renew, l->lease);
}

static void on_lease_lost(dl_alease *ls, int reason) {
    dlock_async_lock *l = ls->arg;
    l->lost = 1;
    if (!l->lost_fn) return;
    l->refs++; /* the callback may free the handle */
    l->lost_fn(l, reason, l->lost_ud);
    unref(l);
}

/* A won attempt: a DLOCK_WATCHDOG acquire's hold is registered with the
 * watchdog (a re-entry into a hold it keeps stays kept, and counts as a
 * renewal when it asked for the watchdog's lease). DLOCK_OK, or
 * DLOCK_ENOMEM (the hold must then be given back). */
static int keep_renewed(dlock_async_lock *l, const lreq *rq, dl_err *err) {
    dl_alease *ls = l->lease;
    if (ls && ls->slot) {
        if (l->op.watchdog && rq->t0 > ls->last_ok) ls->last_ok = rq->t0;
        return DLOCK_OK;
    }
    if (!l->op.watchdog) return DLOCK_OK;
    if (!ls && !(ls = l->lease = calloc(1, sizeof *ls)))
        return dl_seterr(err, DLOCK_ENOMEM, "out of memory registering a lease");
    ls->arg = l;
    ls->renew = l->k->kind->ops->renew;
    ls->key = l->k->s[0];
    ls->key_len = l->k->len[0];
    memcpy(l->token, rq->token, sizeof l->token);
    ls->owner = owner_of(l->k, l->token, &ls->owner_len);
    ls->lease_ms = l->op.lease_ms;
    ls->last_ok = rq->t0;
    ls->lost = on_lease_lost;
    return dl_arenew_add(&l->c->renew, ls, err);
}

/* The acquire under way holds the lock (rq: the attempt, or the WAIT
 * that followed it; n the count it made, fence its token): it ends OK. */
static void won(dlock_async_lock *l, const lreq *rq, long long n, uint64_t fence) {
    aop *op = &l->op;
    dl_err e;
    if (keep_renewed(l, rq, &e)) {
        owe(l, R_GIVEBACK, rq->token, n);
        finish(l, e.code, 0, &e);
        return;
    }
    /* a re-entry raises the lease, never shortens it (the script's RAISE_TTL) */
    int64_t until = rq->t0 + op->lease_ms;
    if (!l->holds || until > l->expires_at) l->expires_at = until;
    l->holds = n;
    l->lost = 0;
    memcpy(l->token, rq->token, sizeof l->token);
    finish(l, DLOCK_OK, fence, NULL);
}

/* wait_replicas: WAIT for the client's replicas after from (an acquire
 * that made count n with token fence, or an extend: ext), on the
 * connection from went on, so that it counts from's write (WAIT counts the
 * connection's latest write; a fair grant written by the releaser is
 * followed by this connection's take-up, as the blocking wait.c says).
 * Pipelined behind it, the requests after it wait for the WAIT too. */
static int send_wait(dlock_async_lock *l, const lreq *from, long long n, uint64_t fence, int ext,
                     lreq **out, dl_err *err) {
    dl_aclient *c = l->c;
    lreq *rq = calloc(1, sizeof *rq);
    if (!rq) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    rq->q.done = lreq_done;
    rq->l = l;
    rq->gen = l->op.gen;
    rq->what = R_WAIT;
    rq->ext = ext;
    rq->held = n;
    rq->fence = fence;
    rq->lease_ms = from->lease_ms;
    rq->t0 = from->t0;
    memcpy(rq->token, from->token, DLOCK_TOKEN_LEN);
    char nb[24], tb[24];
    const char *argv[3] = {"WAIT", nb, tb};
    size_t lens[3] = {4, dl_fmt_ll(nb, c->wait_replicas), dl_fmt_ll(tb, c->wait_replicas_timeout_ms)};
    int rc = dl_apipe_command(from->q.pipe, &rq->q, 3, argv, lens, err);
    if (rc) {
        free(rq);
        return rc;
    }
    l->refs++;
    if (out) *out = rq;
    return DLOCK_OK;
}

/* A WAIT's reply (or failure) for the operation under way. */
static void wait_done(dlock_async_lock *l, lreq *rq, redisReply *r, const dl_err *err) {
    aop *op = &l->op;
    dl_err e;
    char nm[80];
    long long acks = -1;
    int rc = DLOCK_OK;
    if (!r) rc = (e = *err).code;
    else rc = dl_reply_expect_int(r, "WAIT", &acks, &e);
    dl_name_msg(l->k->s[0], l->k->len[0], nm, sizeof nm);
    int64_t until = rq->t0 + rq->lease_ms;
    if (rq->ext) {
        /* the new lease counts only once the replicas have it: a failover
         * to one with the old expiry would end the hold before the holder
         * thinks (src/backend_redis.c's extend) */
        if (!rc && acks >= l->c->wait_replicas) {
            l->expires_at = until;
            finish(l, DLOCK_OK, 0, NULL);
            return;
        }
        if (until < l->expires_at) l->expires_at = until;
        if (!rc)
            dl_seterr(&e, DLOCK_EREPLICAS,
                      "extend of lock '%s': only %lld of %d replicas acknowledged within %lld "
                      "ms; it is counted valid for the shorter of what it had and the new lease",
                      nm, acks, l->c->wait_replicas, (long long)l->c->wait_replicas_timeout_ms);
        finish(l, e.code, 0, &e);
        return;
    }
    op->inflight = NULL;
    int late = !rc && dl_now_ms() >= until;
    if (!rc && acks >= l->c->wait_replicas && !late) {
        won(l, rq, rq->held, rq->fence);
        return;
    }
    /* not safe across a failover, or no longer held: given back (owner-checked) */
    owe(l, R_GIVEBACK, rq->token, rq->held);
    if (!r) {
        if (!ride_out(l, err)) finish(l, err->code, 0, err);
        return;
    }
    if (!rc && late)
        dl_seterr(&e, DLOCK_EREPLICAS,
                  "lock '%s' acquired, but its lease ran out before %d replicas acknowledged "
                  "it; released",
                  nm, l->c->wait_replicas);
    else if (!rc)
        dl_seterr(&e, DLOCK_EREPLICAS,
                  "lock '%s' acquired, but only %lld of %d replicas acknowledged within %lld "
                  "ms; released",
                  nm, acks, l->c->wait_replicas, (long long)l->c->wait_replicas_timeout_ms);
    finish(l, e.code, 0, &e);
}

/* An attempt's reply for the acquire under way. */
static void attempt_done(dlock_async_lock *l, lreq *rq, redisReply *r, const dl_err *err) {
    aop *op = &l->op;
    dl_aclient *c = l->c;
    dl_err e;
    op->inflight = NULL;
    if (rq->recheck) op->registered = 1;
    if (!r) { /* lost with the connection: it may have won */
        owe(l, R_GIVEBACK, rq->token, rq->held + 1);
        /* given back first on the next connection, before the next attempt */
        if (!ride_out(l, err)) finish(l, err->code, 0, err);
        return;
    }
    long long a = 0, b = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        /* DL_FENCE_ERR: the script took the lock but has no token for it */
        if (r->str && !strncmp(r->str, DL_FENCE_ERR, sizeof DL_FENCE_ERR - 1))
            owe(l, R_GIVEBACK, rq->token, rq->held + 1);
        int code = dl_reply_error(r, "acquire", &e);
        finish(l, code, 0, &e);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || dl_reply_int(r->element[0], &a) ||
        dl_reply_int(r->element[1], &b)) {
        owe(l, R_GIVEBACK, rq->token, rq->held + 1);
        dl_seterr(&e, DLOCK_EPROTO, "acquire: unexpected reply from the script");
        finish(l, DLOCK_EPROTO, 0, &e);
        return;
    }
    if (a == 1) {
        long long n = 1;
        if (l->k->kind->counted && (r->elements < 3 || dl_reply_int(r->element[2], &n) || n < 1))
            n = l->holds + 1;
        if (c->wait_replicas > 0) {
            /* held once enough replicas have it (wait_done) */
            if (send_wait(l, rq, n, (uint64_t)b, 0, &op->inflight, &e)) {
                owe(l, R_GIVEBACK, rq->token, n);
                finish(l, e.code, 0, &e);
            }
            return;
        }
        won(l, rq, n, (uint64_t)b);
        return;
    }
    if (!op->waiting) {
        finish_msg(l, DLOCK_EBUSY, "lock '%s' is held by another owner");
        return;
    }
    int64_t now = dl_now_ms();
    if (!rq->recheck || now >= op->deadline) {
        finish_msg(l, DLOCK_ETIMEDOUT, "timed out waiting for lock '%s'");
        return;
    }
    /* subscribed since this attempt went out, or told meanwhile: a
     * release after it may have been missed, or announced */
    if ((!rq->after_sub && dl_asubs_subscribed(&op->w)) || op->woken) {
        attempt(l);
        return;
    }
    int64_t until = op->deadline;
    if (now + DL_WAIT_RECHECK_MS < until) until = now + DL_WAIT_RECHECK_MS;
    if (b >= 0) {
        if (now + b + 1 < until) until = now + b + 1;
    } else if (b == -1) {
        if (now + op->nottl < until) until = now + op->nottl;
        op->nottl = op->nottl * 2 > NOTTL_MAX_MS ? NOTTL_MAX_MS : op->nottl * 2;
    } else {
        until = now; /* gone between the script's two steps */
    }
    /* out of the table since its subscribed connection failed: it joins
     * again at its next attempt, soon */
    if (!op->w.chan && now + op->outage < until) until = now + op->outage;
    if (dl_atimer_arm(&c->loop, &op->timer, until)) {
        dl_seterr(&e, DLOCK_ENOMEM, "out of memory arming a timer");
        finish(l, DLOCK_ENOMEM, 0, &e);
    }
}

/* An attempt whose acquire ended already (cancelled, failed, freed). */
static void orphan_attempt(dlock_async_lock *l, lreq *rq, redisReply *r) {
    long long a = 0, n = 0;
    int won = !r || r->type == REDIS_REPLY_ERROR || r->type != REDIS_REPLY_ARRAY ||
              r->elements < 2 || dl_reply_int(r->element[0], &a) || a == 1;
    /* the count it made, when the reply says (a re-entry's: above the holds) */
    if (won && r && r->type == REDIS_REPLY_ARRAY && r->elements > 2 &&
        !dl_reply_int(r->element[2], &n) && n > rq->held) {
        owe(l, R_GIVEBACK, rq->token, n);
        return;
    }
    /* registered by it or before it: the abandon also passes on a wake
     * this waiter may have been sent meanwhile (and leaves a queue); a
     * known win left no entry behind, a lost reply may have */
    if (won) owe(l, R_GIVEBACK, rq->token, rq->held + 1);
    if ((!won || !r) && (rq->recheck || rq->reg)) owe(l, R_ABANDON, rq->token, 0);
}

static void lreq_done(dl_areq *q, redisReply *r, const dl_err *err) {
    lreq *rq = (lreq *)q;
    dlock_async_lock *l = rq->l;
    aop *op = &l->op;
    int live = op->type != OP_NONE && rq->gen == op->gen;
    dl_err e = {0};
    if (r && dl_is_noscript(r) && !rq->by_text && !l->c->freeing) {
        /* the script cache was flushed: the script did not run, send its text */
        dl_apipe_forget_scripts(q->pipe);
        lreq *again = NULL;
        int rc = send_req(l, rq->what, rq->token, rq->lease_ms, rq->recheck, rq->reg, 1, &again,
                          &e);
        if (!rc) {
            again->gen = rq->gen;
            again->after_sub = rq->after_sub;
            if (live && op->inflight == rq) op->inflight = again;
        } else if (live) {
            if (op->inflight == rq) op->inflight = NULL;
            finish(l, rc, 0, &e);
        }
        free(rq);
        unref(l);
        return;
    }
    if (!live) {
        if (rq->what == R_ATTEMPT) orphan_attempt(l, rq, r);
        /* an acquire that won, then ended while it waited for replicas */
        if (rq->what == R_WAIT && !rq->ext) owe(l, R_GIVEBACK, rq->token, rq->held);
    } else if (rq->what == R_ATTEMPT) {
        attempt_done(l, rq, r, err);
    } else if (rq->what == R_WAIT) {
        wait_done(l, rq, r, err);
    } else {
        long long v = 0;
        int rc;
        if (!r) rc = (e = *err).code;
        else rc = dl_reply_expect_int(r, rq->what == R_RELEASE ? "release" : "extend", &v, &e);
        if (l->lease) l->lease->releasing = 0;
        if (!rc && l->k->kind->counted && rq->what == R_RELEASE && v == 0) {
            l->holds = l->holds > 1 ? l->holds - 1 : 0; /* still held: one hold less */
            finish(l, DLOCK_OK, 0, NULL);
        } else if (!rc && v != 1) {
            l->holds = 0;
            l->lost = 0;
            unwatch(l);
            finish_msg(l, DLOCK_ELOST, "lock '%s' was no longer held: its lease ran out or it "
                                       "was taken over");
        } else if (!rc) {
            /* released; or extended, which makes a watchdog hold an
             * explicit-lease one (as dlock_extend) */
            unwatch(l);
            l->lost = 0;
            if (rq->what == R_RELEASE) {
                l->holds = 0;
            } else if (l->c->wait_replicas > 0) {
                /* the new lease once the replicas have it (wait_done) */
                if (send_wait(l, rq, 0, 0, 1, NULL, &e)) {
                    int64_t until = rq->t0 + rq->lease_ms;
                    if (until < l->expires_at) l->expires_at = until;
                    finish(l, e.code, 0, &e);
                }
                free(rq);
                unref(l);
                return;
            } else {
                l->expires_at = rq->t0 + rq->lease_ms;
            }
            finish(l, DLOCK_OK, 0, NULL);
        } else {
            finish(l, rc, 0, &e);
        }
    }
    free(rq);
    unref(l);
}

/* ---- the public calls ---- */

/* The end of a call that ran callbacks (depth raised before): the client
 * freed by one of them goes now, else the loop is told what changed. */
static void leave(dl_aclient *c) {
    if (--c->depth > 0) return;
    if (c->doomed) c->destroy(c);
    else dl_aloop_sync(&c->loop);
}

static int begin(dlock_async_lock *l, dlock_async_fn cb, void *ud, int type, dl_err *err) {
    if (!cb) return dl_seterr(err, DLOCK_EINVAL, "NULL callback");
    if (l->c->freeing) return dl_seterr(err, DLOCK_EINVAL, "the client is being freed, or could not be created");
    if (l->op.type)
        return dl_seterr(err, DLOCK_EINVAL, "an operation of this handle is pending");
    memset(&l->op.timer, 0, sizeof l->op.timer);
    l->op.timer.fn = on_timer;
    l->op.timer.arg = l;
    l->op.cb = cb;
    l->op.ud = ud;
    l->op.type = type;
    l->op.inflight = NULL;
    l->op.woken = l->op.registered = 0;
    return DLOCK_OK;
}

int dlock_async_acquire(dlock_async_lock *l, int64_t wait_ms, int64_t lease_ms, dlock_async_fn cb,
                        void *udata) {
    if (!l) return DLOCK_EINVAL;
    dl_err err;
    if (wait_ms < DLOCK_WAIT_FOREVER)
        return fail(l, &(dl_err){DLOCK_EINVAL, "wait must be >= 0 ms, or DLOCK_WAIT_FOREVER"});
    if (lease_ms < 0) return fail(l, &(dl_err){DLOCK_EINVAL, "lease must be > 0 ms, or DLOCK_WATCHDOG"});
    if (l->holds && !l->k->kind->counted && !l->op.type)
        return fail(l, &(dl_err){DLOCK_EINVAL, "the handle holds the lock already (plain "
                                               "locks are not reentrant)"});
    int rc = begin(l, cb, udata, OP_ACQUIRE, &err);
    if (rc) return fail(l, &err);
    /* the plain lock's owner is a fresh token per acquire, the other
     * kinds' the handle's (kinds.c) */
    if (l->k->kind->fresh_owner) rc = dl_random_hex(l->op.token, DLOCK_TOKEN_LEN / 2, &err);
    if (rc) {
        l->op.type = OP_NONE;
        return fail(l, &err);
    }
    aop *op = &l->op;
    op->watchdog = lease_ms == DLOCK_WATCHDOG;
    op->lease_ms = op->watchdog ? l->c->watchdog_lease_ms : lease_ms;
    op->waiting = wait_ms != 0;
    op->deadline = dl_deadline(wait_ms);
    op->nottl = NOTTL_MIN_MS;
    op->outage = OUTAGE_PAUSE_MIN_MS;
    if (l->k->kind->fresh_owner) dl_akeys_token(l->k, op->token);
    memset(&op->w, 0, sizeof op->w);
    op->w.wake = on_wake;
    op->w.lost = on_lost;
    op->w.message = on_message;
    if (op->waiting) rc = dl_asubs_join(&l->c->subs, &op->w, l->k->chan, l->k->chan_len, &err);
    if (!rc) rc = send_req(l, R_ATTEMPT, op->token, op->lease_ms, op->waiting, 0, 0,
                           &op->inflight, &err);
    /* a wait whose connection cannot open now (refused at once) waits on
     * as after any connection failure: started, its callback comes later */
    if (rc && ride_out(l, &err)) rc = DLOCK_OK;
    if (rc) {
        dl_asubs_leave(&l->c->subs, &op->w);
        op->type = OP_NONE;
        op->gen++;
        return fail(l, &err);
    }
    dl_aloop_sync(&l->c->loop);
    return DLOCK_OK;
}

static int start_hold_op(dlock_async_lock *l, int type, int64_t lease_ms, dlock_async_fn cb,
                         void *udata) {
    if (!l) return DLOCK_EINVAL;
    dl_err err;
    if (type == OP_EXTEND && lease_ms <= 0)
        return fail(l, &(dl_err){DLOCK_EINVAL, "lease must be > 0 ms"});
    if (!l->holds && !l->op.type)
        return fail(l, &(dl_err){DLOCK_ENOTHELD, "the handle does not hold the lock"});
    int rc = begin(l, cb, udata, type, &err);
    if (rc) return fail(l, &err);
    rc = send_req(l, type == OP_RELEASE ? R_RELEASE : R_EXTEND, l->token, lease_ms, 0, 0,
                           0, NULL, &err);
    /* the final release is out: the watchdog's "not ours" is no loss now */
    if (!rc && type == OP_RELEASE && (!l->k->kind->counted || l->holds == 1))
        if (l->lease) l->lease->releasing = 1;
    if (rc) {
        l->op.type = OP_NONE;
        l->op.gen++;
        return fail(l, &err);
    }
    dl_aloop_sync(&l->c->loop);
    return DLOCK_OK;
}

int dlock_async_release(dlock_async_lock *l, dlock_async_fn cb, void *udata) {
    return start_hold_op(l, OP_RELEASE, 0, cb, udata);
}

int dlock_async_extend(dlock_async_lock *l, int64_t lease_ms, dlock_async_fn cb, void *udata) {
    return start_hold_op(l, OP_EXTEND, lease_ms, cb, udata);
}

int dlock_async_cancel(dlock_async_lock *l) {
    if (!l) return DLOCK_EINVAL;
    if (!l->op.type) return DLOCK_ENOTHELD;
    dl_aclient *c = l->c;
    c->depth++;
    if (l->op.type == OP_ACQUIRE) finish_msg(l, DLOCK_ECANCELED, "waiting for lock '%s' was cancelled");
    else finish_msg(l, DLOCK_ECANCELED, "the operation on lock '%s' was cancelled");
    leave(c);
    return DLOCK_OK;
}

void dlock_async_lock_on_lost(dlock_async_lock *l, dlock_async_lost_fn fn, void *udata) {
    if (!l) return;
    l->lost_fn = fn;
    l->lost_ud = udata;
}

int dlock_async_lock_is_lost(const dlock_async_lock *l) { return l ? l->lost : 0; }

dl_aclient *dl_alock_client(const dlock_async_lock *l) { return l->c; }
const dl_akeys *dl_alock_keys(const dlock_async_lock *l) { return l->k; }
int64_t dl_alock_holds(const dlock_async_lock *l) { return l->holds; }

int dlock_async_client_set_fair_wait(dlock_async_client *c, int64_t wait_ms) {
    if (!c) return DLOCK_EINVAL;
    if (c->freeing) {
        snprintf(c->errmsg, sizeof c->errmsg, "the client is being freed, or could not be created");
        return DLOCK_EINVAL;
    }
    if (wait_ms < 1 || wait_ms > ((int64_t)1 << 40)) {
        snprintf(c->errmsg, sizeof c->errmsg, "fair wait time must be 1 ms to 2^40 ms (got %lld)",
                 (long long)wait_ms);
        return DLOCK_EINVAL;
    }
    c->fair_wait_ms = wait_ms;
    return DLOCK_OK;
}

int64_t dlock_async_lock_valid_ms(const dlock_async_lock *l) {
    if (!l || !l->holds || l->lost) return 0;
    /* a watchdog hold: until it would be found lost (renew.c) */
    int64_t until = l->lease && l->lease->slot ? dl_alease_due(l->lease) : l->expires_at;
    int64_t left = until - dl_now_ms();
    return left > 0 ? left : 0;
}

const char *dlock_async_lock_errmsg(const dlock_async_lock *l) {
    if (!l) return "NULL lock handle";
    if (l->errmsg) return l->errmsg;
    return l->msg_lost ? "out of memory (the failure's message was lost)" : "";
}

int dlock_async_lock_new(dlock_async_client *c, const char *name, size_t name_len, dlock_kind kind,
                         dlock_async_lock **out) {
    if (out) *out = NULL;
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    int rc = DLOCK_OK;
    const dl_akind *ak = dl_akind_of(kind);
    if (!out) rc = dl_seterr(&err, DLOCK_EINVAL, "dlock_async_lock_new: NULL out");
    else if (c->freeing) rc = dl_seterr(&err, DLOCK_EINVAL, "the client is being freed, or could not be created");
    if (!rc) rc = dl_check_name(name, &name_len, &err);
    if (!rc && c->cluster) {
        /* as the blocking API's dl_check_cluster_name: one lock, one slot */
        int one = dl_name_keys_one_slot(name, name_len);
        char nm[80];
        if (one < 0) rc = dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
        else if (!one)
            rc = dl_seterr(&err, DLOCK_EINVAL,
                           "lock name '%s' cannot be used on a Redis Cluster: its keys would "
                           "hash to different slots (with '{' or '}' in it, a name needs a "
                           "non-empty hash tag such as 'order{42}')",
                           dl_name_msg(name, name_len, nm, sizeof nm));
    }
    if (!rc && !ak)
        rc = dl_seterr(&err, DLOCK_ENOTSUP, "the async API has no locks of this kind yet "
                                            "(plain, reentrant, fair, read and write)");
    dlock_async_lock *l = NULL;
    /* its timer's place in the heap, so that arming it cannot fail */
    if (!rc && dl_aloop_reserve(&c->loop, c->nlocks + c->nobjs + 2 + (size_t)c->loop.nslots))
        rc = dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
    if (!rc && !(l = calloc(1, sizeof *l))) rc = dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
    if (!rc && !(l->k = dl_akeys_new(ak, name, name_len, &err))) rc = err.code;
    if (rc) {
        free(l);
        snprintf(c->errmsg, sizeof c->errmsg, "%s", err.msg);
        return rc;
    }
    l->c = c;
    l->refs = 1;
    l->next = c->locks;
    if (c->locks) c->locks->prev = l;
    c->locks = l;
    c->nlocks++;
    *out = l;
    return DLOCK_OK;
}

/* Frees l: its operation cancelled, its hold given back unless the client
 * is being freed. */
static void lock_free(dlock_async_lock *l) {
    dl_aclient *c = l->c;
    if (l->op.type) finish_msg(l, DLOCK_ECANCELED, "the handle of lock '%s' was freed");
    /* every hold, in order: a counted kind's count expected from holds down to 1 */
    for (int64_t h = l->holds; h > 0; h--) owe(l, R_GIVEBACK, l->token, h);
    l->holds = 0;
    unwatch(l);
    if (l->prev) l->prev->next = l->next;
    else if (c->locks == l) c->locks = l->next;
    if (l->next) l->next->prev = l->prev;
    l->prev = l->next = NULL;
    c->nlocks--;
    unref(l);
}

void dlock_async_lock_free(dlock_async_lock *l) {
    if (!l) return;
    dl_aclient *c = l->c;
    c->depth++;
    lock_free(l);
    leave(c);
}

void dl_alock_free_all(dl_aclient *c) {
    /* every operation first (a callback may still use other handles, or
     * free them: look for the next one afresh each time) */
    for (;;) {
        dlock_async_lock *l = c->locks;
        while (l && !l->op.type) l = l->next;
        if (!l) break;
        finish_msg(l, DLOCK_ECANCELED, "the client was freed while waiting for lock '%s'");
    }
    dl_err err;
    /* the abandons owed go out with what the sockets take now */
    for (size_t i = 0; i < dl_apipe_count(c); i++) {
        dl_apipe *p = dl_apipe_nth(c, i);
        if (p->conn && p->ready && p->conn->olen) dl_conn_write_some(p->conn, &err);
    }
    dl_seterr(&err, DLOCK_ECANCELED, "the client was freed");
    dl_acluster_end(c, &err);
    for (size_t i = 0; i < dl_apipe_count(c); i++) dl_apipe_fail(dl_apipe_nth(c, i), &err);
    for (size_t i = 0; dl_asubpipe_nth(c, i); i++) dl_apipe_fail(dl_asubpipe_nth(c, i), &err);
    while (c->locks) lock_free(c->locks);
    while (c->settle) {
        oreq *o = c->settle;
        c->settle = o->next;
        oreq_free(o);
    }
}
