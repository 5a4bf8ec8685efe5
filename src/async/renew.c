/* The async client's watchdog: the holds taken with DLOCK_WATCHDOG leases
 * are renewed from the loop, every third of their lease, by the kinds'
 * renewal scripts (the blocking watchdog's), up to AWD_BATCH holds per
 * script call and every call of a round pipelined on the command
 * connection. A hold the server no longer gives its owner is lost
 * (DLOCK_LOST_TAKEN).
 *
 * A hold with no renewal confirmed is lost (DLOCK_LOST_UNREACHABLE) at its
 * due time: the start of the request that last started its lease (last_ok)
 * plus the lease, less DLOCK_LOST_MARGIN_MS(lease), as in watchdog.c. The
 * server cannot expire the hold before last_ok + lease, so the loss is told
 * before the hold can pass to another client, with the margin left for the
 * holder to stop. The timer is armed at the earliest due time as well as at
 * the next round, so a round that hangs does not delay it; that bound holds
 * while the loop runs (a loop blocked past it tells late).
 *
 * Requests name their holds by slot and registration number, never by
 * pointer: a hold released or freed while its renewal is out is simply not
 * found when the reply comes. */
#include <stdlib.h>
#include <string.h>

#include "async.h"

#define AWD_BATCH 100

typedef struct rn_item {
    size_t slot;
    uint64_t seq;
} rn_item;

/* One script call of a round. */
typedef struct rnreq {
    dl_areq q;
    dl_arenew *r;
    int64_t t0;                /* dl_now_ms before it was queued */
    size_t n;
    rn_item items[];
} rnreq;

static void on_timer(dl_atimer *t);

void dl_arenew_init(dl_arenew *r, dl_aclient *cl) {
    memset(r, 0, sizeof *r);
    r->cl = cl;
    r->next_round = -1;
    r->timer.fn = on_timer;
    r->timer.arg = r;
}

int64_t dl_alease_due(const dl_alease *l) {
    return l->last_ok + l->lease_ms - DLOCK_LOST_MARGIN_MS(l->lease_ms);
}

/* The time between rounds: a third of the client's watchdog lease. */
static int64_t period(const dl_arenew *r) {
    int64_t p = r->cl->watchdog_lease_ms / 3;
    return p > 0 ? p : 1;
}

/* The next round sooner after a failure: the server may be back soon, and
 * a hold that is not renewed in time is lost. */
static int64_t retry(const dl_arenew *r) {
    int64_t p = period(r) / 4;
    return p < 50 ? (period(r) < 50 ? period(r) : 50) : p;
}

/* Arms the timer at the next round or the earliest due time. */
static void arm(dl_arenew *r) {
    dl_aloop *lp = &r->cl->loop;
    if (!r->count || r->cl->freeing) {
        dl_atimer_stop(lp, &r->timer);
        r->next_round = -1;
        return;
    }
    int64_t at = r->next_round;
    for (size_t i = 0; i < r->nslots; i++) {
        dl_alease *l = r->slots[i].l;
        if (l && dl_alease_due(l) < at) at = dl_alease_due(l);
    }
    /* the client reserved room for this timer: arming cannot fail */
    (void)dl_atimer_arm(lp, &r->timer, at);
}

int dl_arenew_add(dl_arenew *r, dl_alease *l, dl_err *err) {
    if (l->slot) return DLOCK_OK;
    /* a cluster's batch renews the holds of one hash slot */
    l->hslot = r->cl->cluster ? dl_key_slot(l->key, l->key_len) : 0;
    size_t i;
    if (r->nfree) {
        i = r->freelist[--r->nfree];
    } else {
        if (r->nslots == r->cap) {
            size_t cap = r->cap ? r->cap * 2 : 16;
            dl_arenew_slot *s = realloc(r->slots, cap * sizeof *s);
            if (!s) return dl_seterr(err, DLOCK_ENOMEM, "out of memory registering a lease");
            r->slots = s;
            size_t *f = realloc(r->freelist, cap * sizeof *f);
            if (!f) return dl_seterr(err, DLOCK_ENOMEM, "out of memory registering a lease");
            r->freelist = f;
            r->cap = cap;
        }
        i = r->nslots++;
    }
    r->slots[i].l = l;
    r->slots[i].seq = ++r->next_seq;
    l->slot = i + 1;
    l->seq = r->slots[i].seq;
    l->releasing = 0;
    if (!r->count++ || r->next_round < 0) r->next_round = dl_now_ms() + period(r);
    /* the timer moves only when this lease is due before it fires: a scan
     * of every lease per registration would make n holds cost n^2 */
    int64_t at = dl_alease_due(l) < r->next_round ? dl_alease_due(l) : r->next_round;
    if (!r->timer.idx || at < r->timer.at) (void)dl_atimer_arm(&r->cl->loop, &r->timer, at);
    return DLOCK_OK;
}

void dl_arenew_remove(dl_arenew *r, dl_alease *l) {
    if (!l->slot) return;
    size_t i = l->slot - 1;
    r->slots[i].l = NULL;
    r->freelist[r->nfree++] = i;
    l->slot = 0;
    r->count--;
    if (!r->count) arm(r);
}

/* l is lost for reason: unregistered, then told. */
static void lose(dl_arenew *r, dl_alease *l, int reason) {
    dl_arenew_remove(r, l);
    l->lost(l, reason);
}

/* Every hold past its due time is lost without asking: the server may
 * expire it now. Stops when a callback began freeing the client. */
static void expire_due(dl_arenew *r, int64_t now) {
    for (size_t i = 0; i < r->nslots && r->count && !r->cl->freeing; i++) {
        dl_alease *l = r->slots[i].l;
        if (l && now >= dl_alease_due(l)) lose(r, l, DLOCK_LOST_UNREACHABLE);
    }
}

static void rn_done(dl_areq *q, redisReply *reply, const dl_err *err);

/* Orders holds by script, lease and hash slot (0 but in a cluster): a
 * batch has one of each. */
static int lease_cmp(const void *a, const void *b) {
    const dl_alease *x = *(dl_alease *const *)a, *y = *(dl_alease *const *)b;
    if (x->renew != y->renew) return (uintptr_t)x->renew < (uintptr_t)y->renew ? -1 : 1;
    if (x->lease_ms != y->lease_ms) return x->lease_ms < y->lease_ms ? -1 : 1;
    return (x->hslot > y->hslot) - (x->hslot < y->hslot);
}

/* Queues one script call renewing ls[0..n) (one script, one lease). */
static int send_batch(dl_arenew *r, dl_alease **ls, size_t n, int64_t t0, dl_err *err) {
    rnreq *q = calloc(1, sizeof *q + n * sizeof q->items[0]);
    const char **keys = malloc((2 * n + 1) * sizeof *keys);
    size_t *lens = malloc((2 * n + 1) * sizeof *lens);
    int rc = DLOCK_ENOMEM;
    if (!q || !keys || !lens) {
        dl_seterr(err, DLOCK_ENOMEM, "out of memory renewing leases");
        goto out;
    }
    q->q.done = rn_done;
    q->r = r;
    q->t0 = t0;
    q->n = n;
    char lease[24];
    const char **args = keys + n;
    size_t *arglens = lens + n;
    args[0] = lease;
    arglens[0] = dl_fmt_ll(lease, ls[0]->lease_ms);
    for (size_t i = 0; i < n; i++) {
        q->items[i].slot = ls[i]->slot - 1;
        q->items[i].seq = ls[i]->seq;
        keys[i] = ls[i]->key, lens[i] = ls[i]->key_len;
        args[1 + i] = ls[i]->owner, arglens[1 + i] = ls[i]->owner_len;
    }
    rc = dl_apipe_eval(dl_aroute(r->cl, ls[0]->key, ls[0]->key_len), &q->q, ls[0]->renew, 0, (int)n, keys, lens, (int)n + 1, args,
                       arglens, err);
    if (!rc) {
        r->out++;
        q = NULL;
    }
out:
    free(q);
    free(keys);
    free(lens);
    return rc;
}

/* Sends a round: every registered hold but those being released. */
static void start_round(dl_arenew *r, int64_t now) {
    r->failed = 0;
    r->next_round = now + period(r);
    dl_alease **ls = malloc(r->count * sizeof *ls);
    if (!ls) {
        r->next_round = now + retry(r);
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < r->nslots; i++) {
        dl_alease *l = r->slots[i].l;
        if (l && !l->releasing) ls[n++] = l;
    }
    qsort(ls, n, sizeof *ls, lease_cmp);
    dl_err err;
    for (size_t first = 0; first < n;) {
        size_t m = 1;
        while (first + m < n && m < AWD_BATCH && !lease_cmp(&ls[first], &ls[first + m])) m++;
        if (send_batch(r, ls + first, m, now, &err)) {
            /* not sent (no memory, no connection): the rest waits for the
             * next round, sooner; what is due meanwhile is lost in time */
            r->next_round = now + retry(r);
            break;
        }
        first += m;
    }
    free(ls);
}

static void on_timer(dl_atimer *t) {
    dl_arenew *r = t->arg;
    int64_t now = dl_now_ms();
    expire_due(r, now);
    if (r->cl->freeing) return;
    if (r->count && now >= r->next_round) {
        /* a round still out is ended by its requests' deadline; the due
         * times above do not wait for it */
        if (r->out) r->next_round = now + retry(r);
        else start_round(r, now);
    }
    arm(r);
}

static void rn_done(dl_areq *q, redisReply *reply, const dl_err *err) {
    (void)err;
    rnreq *rq = (rnreq *)q;
    dl_arenew *r = rq->r;
    dl_aclient *cl = r->cl;
    r->out--;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != rq->n) {
        /* the server's script cache was flushed: each script's next request
         * goes by its text */
        if (reply && dl_is_noscript(reply)) dl_apipe_forget_scripts(q->pipe);
        r->failed = 1;
    } else {
        for (size_t i = 0; i < rq->n && !cl->freeing; i++) {
            const rn_item *it = &rq->items[i];
            if (it->slot >= r->nslots || r->slots[it->slot].seq != it->seq) continue;
            dl_alease *l = r->slots[it->slot].l;
            if (!l) continue;
            const redisReply *e = reply->element[i];
            if (e->type != REDIS_REPLY_INTEGER) {
                r->failed = 1;
            } else if (e->integer == 1) {
                if (rq->t0 > l->last_ok) l->last_ok = rq->t0;
            } else if (!l->releasing) {
                lose(r, l, DLOCK_LOST_TAKEN);
            }
        }
    }
    free(rq);
    if (cl->freeing) return;
    if (r->failed && r->count) {
        int64_t soon = dl_now_ms() + retry(r);
        if (r->next_round < 0 || soon < r->next_round) r->next_round = soon;
    }
    arm(r);
}

void dl_arenew_free(dl_arenew *r) {
    dl_atimer_stop(&r->cl->loop, &r->timer);
    free(r->slots);
    free(r->freelist);
    r->slots = NULL;
    r->freelist = NULL;
    r->nslots = r->cap = r->count = r->nfree = 0;
}
