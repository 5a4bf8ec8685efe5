/* The client's watchdog: one background thread renews every registered
 * lease (held watchdog locks, expirable permits) every third of the client's
 * watchdog lease, up to 100 items per script call and all batches pipelined
 * in one round trip. An item the server no longer gives us is marked lost
 * (DLOCK_LOST_TAKEN) and its callback run.
 *
 * An item with no renewal confirmed is marked lost (DLOCK_LOST_UNREACHABLE)
 * at its due time: the last confirmed renewal's start (last_ok) plus the
 * lease, minus DLOCK_LOST_MARGIN_MS(lease). The server cannot expire the
 * hold before last_ok + lease (its lease starts after the request that
 * started it was sent), so the callback runs before the hold can pass to
 * another client, with the margin left for the holder to stop. To keep that
 * time, the thread wakes at the earliest due time even between renewals,
 * and a renewal round's I/O is cut off at it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kinds.h"

#define DL_WD_BATCH 100

typedef struct wd_entry {
    dl_lease *l;     /* NULL: free slot */
    uint64_t seq;    /* registration number; guards against slot reuse */
} wd_entry;

struct dl_watchdog {
    dlock_client *c;
    pthread_mutex_t mu;
    dl_renewer renewer;        /* the thread (renewer.c), under mu */
    int idle;                  /* nothing was registered at the last round */
    int64_t next;              /* when the next renewal round is due */
    wd_entry *slots;
    size_t nslots, cap, count;
    size_t *freelist;
    size_t nfree;
    uint64_t next_seq;
};

/* One lock's identity, copied so that renewal I/O runs without the mutex. */
typedef struct wd_snap {
    size_t slot;
    uint64_t seq;
    dl_script *renew;
    int64_t lease_ms;
    char *key;
    size_t key_len;
    char *owner;
    size_t owner_len;
    unsigned hslot; /* Redis Cluster: the key's hash slot (0 elsewhere) */
    int64_t due;    /* when it is lost unless renewed (lease_due) */
    int result;     /* 1 renewed, 0 lost, -1 no answer */
    int who;        /* its holder identity key is renewed with it */
    int yes, no;    /* per-node answers (RedLock: a majority decides) */
} wd_snap;

/* When l is lost unless a renewal is confirmed first (see the top). */
static int64_t lease_due(const dl_lease *l) {
    return (int64_t)atomic_load(&l->last_ok) + l->lease_ms - DLOCK_LOST_MARGIN_MS(l->lease_ms);
}

static void slot_remove(dl_watchdog *wd, dl_lease *l) {
    wd->slots[l->wd_slot].l = NULL;
    wd->slots[l->wd_slot].seq = 0;
    wd->freelist[wd->nfree++] = l->wd_slot;
    wd->count--;
    l->wd_seq = 0;
}

/* Batch boundaries: at most DL_WD_BATCH items, one script and one lease. */
static size_t batch_len(const wd_snap *snap, size_t first, size_t n) {
    size_t m = 1;
    while (first + m < n && m < DL_WD_BATCH && snap[first + m].renew == snap[first].renew &&
           snap[first + m].lease_ms == snap[first].lease_ms && snap[first + m].hslot == snap[first].hslot)
        m++;
    return m;
}

static void batch_args(wd_snap *snap, size_t m, const char **keys, size_t *keylens,
                       const char **args, size_t *arglens, char *lease) {
    args[0] = lease;
    arglens[0] = dl_fmt_ll(lease, snap[0].lease_ms);
    for (size_t i = 0; i < m; i++) {
        keys[i] = snap[i].key, keylens[i] = snap[i].key_len;
        args[1 + i] = snap[i].owner, arglens[1 + i] = snap[i].owner_len;
    }
}

/* In a cluster, a batch goes to the node owning its slot. */
static int batch_here(dl_node *node, const wd_snap *first) {
    dlock_client *c = node->client;
    return dl_topo_serves(c, node, first->hslot);
}

/* 1 when an item of the batch snap[0..m) keeps a holder identity key. */
static int batch_who(const wd_snap *snap, size_t m) {
    for (size_t i = 0; i < m; i++)
        if (snap[i].who) return 1;
    return 0;
}

/* The renewal of the holder identity keys of the batch snap[0..m) (those
 * that keep one). */
static int who_make(dl_who_renewal *w, const wd_snap *snap, size_t m, dl_err *err) {
    const char *locks[DL_WD_BATCH], *owners[DL_WD_BATCH];
    size_t locklens[DL_WD_BATCH], ownerlens[DL_WD_BATCH], k = 0;
    for (size_t i = 0; i < m; i++) {
        if (!snap[i].who) continue;
        locks[k] = snap[i].key, locklens[k] = snap[i].key_len;
        owners[k] = snap[i].owner, ownerlens[k] = snap[i].owner_len;
        k++;
    }
    return dl_who_renewal_make(w, locks, locklens, owners, ownerlens, k, snap[0].lease_ms, err);
}

/* One batch's calls to its node: its renewal (the reply at q[at]), then,
 * when an item keeps a holder identity key, that key's (has_who). */
typedef struct wd_batch {
    size_t first, m, at;
    char lease[24];
    int has_who;
    dl_who_renewal who;
} wd_batch;

/* Sends the batches to one node and counts its answers in snap[i].yes/no.
 * A batch's holder identity keys are renewed in the same write, after it.
 * Every call is queued, the whole flushed once, then every reply read (a
 * script the server's cache lost goes again by text: dl_eval_read_all). */
static void renew_on(dl_node *node, int64_t deadline, wd_snap *snap, size_t n) {
    dl_err err = {0};
    size_t nb = 0;
    for (size_t first = 0; first < n; first += batch_len(snap, first, n))
        nb += (size_t)batch_here(node, &snap[first]);
    if (!nb) return;
    dl_conn *conn = NULL;
    wd_batch *b = calloc(nb, sizeof *b);
    dl_eval_req *q = calloc(2 * nb, sizeof *q);
    redisReply **r = calloc(2 * nb, sizeof *r);
    const char **keys = calloc(n, sizeof *keys), **args = calloc(n + nb, sizeof *args);
    size_t *keylens = calloc(n, sizeof *keylens), *arglens = calloc(n + nb, sizeof *arglens);
    size_t nq = 0;
    int rc = DLOCK_OK;
    if (!b || !q || !r || !keys || !args || !keylens || !arglens ||
        dl_node_get(node, deadline, &conn, &err) != DLOCK_OK)
        goto done;
    /* a batch's keys where its items are in snap, its arguments (the lease,
     * then the owners) one after the other */
    for (size_t first = 0, x = 0, a = 0; first < n && !rc; first += batch_len(snap, first, n)) {
        size_t m = batch_len(snap, first, n);
        if (!batch_here(node, &snap[first])) continue;
        wd_batch *bx = &b[x++];
        bx->first = first, bx->m = m, bx->at = nq;
        batch_args(snap + first, m, keys + first, keylens + first, args + a, arglens + a,
                   bx->lease);
        q[nq++] = (dl_eval_req){.s = snap[first].renew, .nkeys = (int)m, .nargs = (int)(1 + m),
                                .keys = keys + first, .keylens = keylens + first,
                                .args = args + a, .arglens = arglens + a};
        a += 1 + m;
        if (!batch_who(snap + first, m)) continue;
        rc = who_make(&bx->who, snap + first, m, &err);
        if (rc) break;
        bx->has_who = 1;
        q[nq] = bx->who.q;
        q[nq++].with_prev = 1;
    }
    for (size_t i = 0; i < nq && !rc; i++) rc = dl_eval_queue(conn, &q[i], 0, &err);
    if (!rc) rc = dl_conn_flush(conn, deadline, &err);
    if (rc) {
        conn->broken = 1; /* requests queued and not sent */
        goto done;
    }
    /* on a failure, the replies read before it count */
    rc = dl_eval_read_all(conn, deadline, q, nq, r, &err);
    for (size_t x = 0; x < nb; x++) {
        redisReply *rr = r[b[x].at];
        size_t first = b[x].first, m = b[x].m;
        if (!rr) continue;
        dl_topo_note_reply(node->client, rr); /* MOVED: new map */
        if (rr->type == REDIS_REPLY_ARRAY && rr->elements == m) {
            for (size_t i = 0; i < m; i++) {
                long long v;
                if (dl_reply_int(rr->element[i], &v)) continue;
                if (v == 1) snap[first + i].yes++;
                else snap[first + i].no++;
            }
        }
    }
    /* wait_replicas: a renewal counts once the replicas have it, or a
     * failover to one with the older expiry would end the hold while the
     * holder counts on the renewed lease; unacknowledged, the items stay
     * unconfirmed (retried soon, lost at their due time) */
    const dlock_client *cl = node->client;
    if (cl->wait_replicas > 0) { /* refused on RedLock at open */
        /* a read that failed partway leaves no WAIT to ask: the renewals
         * read before it are unacknowledged too */
        long long acks = 0;
        int wrc = rc;
        if (!wrc) {
            int64_t left = deadline - dl_now_ms();
            if (left > cl->wait_replicas_timeout_ms) left = cl->wait_replicas_timeout_ms;
            wrc = left > 0 ? dl_conn_wait_replicas(cl, conn, left, deadline, &acks, &err)
                           : DLOCK_ETIMEDOUT;
        }
        if (wrc || acks < cl->wait_replicas)
            for (size_t x = 0; x < nb; x++)
                for (size_t i = b[x].first; i < b[x].first + b[x].m; i++) snap[i].yes = 0;
    }
done:
    if (conn) dl_node_put(conn);
    for (size_t i = 0; r && i < nq; i++)
        if (r[i]) freeReplyObject(r[i]);
    for (size_t x = 0; b && x < nb; x++)
        if (b[x].has_who) dl_who_renewal_clear(&b[x].who);
    free(b);
    free(q);
    free(r);
    free(keys);
    free(args);
    free(keylens);
    free(arglens);
}

/* Renews on every node of the client; fills snap[i].result. One node: its
 * answer. RedLock: renewed on a majority, or lost when a majority says no.
 * No I/O goes on past cutoff (the earliest due time). */
static void renew_io(dl_watchdog *wd, wd_snap *snap, size_t n, int64_t cutoff) {
    dlock_client *c = wd->c;
    /* RedLock: each node gets its own short deadline, so a frozen node
     * cannot use up the others' time */
    size_t nn = dl_node_count(c);
    /* a renewal must not outlast the renewal period: past it, the next round
     * (sooner after a failure) and the lease check take over */
    int64_t limit = c->watchdog_lease_ms / 3;
    if (limit > c->command_timeout_ms) limit = c->command_timeout_ms;
    limit = dl_topo_request_ms(c, limit);
    for (size_t i = 0; i < nn; i++) {
        int64_t deadline = dl_deadline(limit);
        if (deadline > cutoff) deadline = cutoff;
        renew_on(c->nodes[i], deadline, snap, n);
    }
    size_t need = dl_topo_quorum(c);
    for (size_t i = 0; i < n; i++) {
        if ((size_t)snap[i].yes >= need) snap[i].result = 1;
        else if ((size_t)snap[i].no >= need) snap[i].result = 0;
    }
}

static int snap_cmp(const void *a, const void *b) {
    const wd_snap *x = a, *y = b;
    if (x->renew != y->renew) return (uintptr_t)x->renew < (uintptr_t)y->renew ? -1 : 1;
    if (x->lease_ms != y->lease_ms) return x->lease_ms < y->lease_ms ? -1 : 1;
    return (x->hslot > y->hslot) - (x->hslot < y->hslot);
}

/* Marks lost (DLOCK_LOST_UNREACHABLE) every item past its due time; under
 * the mutex. */
static void expire_due(dl_watchdog *wd, int64_t now) {
    for (size_t i = 0; i < wd->nslots && wd->count; i++) {
        dl_lease *l = wd->slots[i].l;
        if (!l || now < lease_due(l)) continue;
        atomic_store(&l->lost, 1);
        slot_remove(wd, l);
        if (l->on_lost) l->on_lost(l, DLOCK_LOST_UNREACHABLE);
    }
}

/* The earliest due time of the registered items; under the mutex. */
static int64_t earliest_due(const dl_watchdog *wd) {
    int64_t due = DL_INF_DEADLINE;
    for (size_t i = 0; i < wd->nslots; i++) {
        const dl_lease *l = wd->slots[i].l;
        if (l && lease_due(l) < due) due = lease_due(l);
    }
    return due;
}

static void renew_round(dl_watchdog *wd, int64_t *retry_soon) {
    /* what is due is lost without asking: the server may expire it now */
    expire_due(wd, dl_now_ms());
    /* snapshot under the mutex */
    size_t n = wd->count, k = 0;
    int64_t cutoff = DL_INF_DEADLINE;
    wd_snap *snap = calloc(n ? n : 1, sizeof *snap);
    if (!snap) {
        *retry_soon = 1;
        return;
    }
    for (size_t i = 0; i < wd->nslots && k < n; i++) {
        dl_lease *l = wd->slots[i].l;
        if (!l) continue;
        if (atomic_load(&l->releasing)) {
            n--; /* not renewed; still lost at its due time (expire_due) */
            continue;
        }
        wd_snap *s = &snap[k];
        s->slot = i;
        s->seq = wd->slots[i].seq;
        s->renew = l->renew;
        s->lease_ms = l->lease_ms;
        s->who = l->who;
        s->key = malloc(l->key_len + 1);
        s->owner = malloc(l->owner_len + 1);
        if (!s->key || !s->owner) {
            free(s->key);
            free(s->owner);
            continue; /* renewed next round */
        }
        memcpy(s->key, l->key, l->key_len);
        s->key_len = l->key_len;
        s->hslot = dl_topo_slot(wd->c, s->key, s->key_len);
        memcpy(s->owner, l->owner, l->owner_len);
        s->owner_len = l->owner_len;
        s->result = -1;
        s->due = lease_due(l);
        if (s->due < cutoff) cutoff = s->due;
        k++;
    }
    pthread_mutex_unlock(&wd->mu);
    qsort(snap, k, sizeof *snap, snap_cmp);
    int64_t t0 = dl_now_ms();
    renew_io(wd, snap, k, cutoff);
    int64_t now = dl_now_ms();
    pthread_mutex_lock(&wd->mu);
    for (size_t i = 0; i < k; i++) {
        wd_snap *s = &snap[i];
        dl_lease *l = wd->slots[s->slot].l;
        if (l && wd->slots[s->slot].seq == s->seq) {
            int reason = 0;
            if (s->result == 1) {
                atomic_store(&l->last_ok, (long long)t0);
            } else if (s->result == 0) {
                /* a release that went out after the snapshot answers first */
                if (!atomic_load(&l->releasing)) reason = DLOCK_LOST_TAKEN;
            } else {
                *retry_soon = 1;
                if (now >= s->due) reason = DLOCK_LOST_UNREACHABLE;
            }
            if (reason) {
                atomic_store(&l->lost, 1);
                slot_remove(wd, l);
                if (l->on_lost) l->on_lost(l, reason);
            }
        }
        free(s->key);
        free(s->owner);
    }
    free(snap);
}

/* The renewer's round (under mu): every third of the watchdog lease a
 * renewal round, sooner after a failed one; between rounds, an item whose
 * due time came unconfirmed is lost. */
static int64_t wd_round(void *arg) {
    dl_watchdog *wd = arg;
    int64_t period = wd->c->watchdog_lease_ms / 3;
    if (wd->count == 0) {
        wd->idle = 1;
        return DL_INF_DEADLINE; /* until a registration wakes it */
    }
    int64_t now = dl_now_ms();
    if (wd->idle) {
        wd->idle = 0;
        wd->next = now + period;
    }
    int64_t due = earliest_due(wd);
    if (now >= due) {
        /* between renewals: an item unconfirmed for its due time */
        expire_due(wd, now);
        return now;
    }
    if (now < wd->next) return due < wd->next ? due : wd->next;
    int64_t retry_soon = 0;
    renew_round(wd, &retry_soon);
    /* after a failed round, try again sooner: a blip must not cost the lease */
    wd->next = dl_now_ms() + (retry_soon ? period / 4 + 1 : period);
    return dl_now_ms();
}

static int wd_create(dlock_client *c, dl_watchdog **out, dl_err *err) {
    dl_watchdog *wd = calloc(1, sizeof *wd);
    if (!wd) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    wd->c = c;
    wd->idle = 1;
    pthread_mutex_init(&wd->mu, NULL);
    dl_renewer_init(&wd->renewer, &wd->mu, wd_round, NULL, NULL, wd);
    pthread_mutex_lock(&wd->mu);
    int rc = dl_renewer_start(&wd->renewer, "the watchdog thread", err);
    pthread_mutex_unlock(&wd->mu);
    if (rc) {
        dl_renewer_stop(&wd->renewer);
        pthread_mutex_destroy(&wd->mu);
        free(wd);
        return rc;
    }
    *out = wd;
    return DLOCK_OK;
}

static dl_watchdog *wd_get(dlock_client *c) {
    pthread_mutex_lock(&c->wd_mu);
    dl_watchdog *wd = c->wd;
    pthread_mutex_unlock(&c->wd_mu);
    return wd;
}

int dl_watchdog_register(dlock_client *c, dl_lease *l, dl_err *err) {
    pthread_mutex_lock(&c->wd_mu);
    int rc = DLOCK_OK;
    if (!c->wd) rc = wd_create(c, &c->wd, err);
    dl_watchdog *wd = c->wd;
    pthread_mutex_unlock(&c->wd_mu);
    if (rc) return rc;
    pthread_mutex_lock(&wd->mu);
    size_t slot;
    if (wd->nfree) {
        slot = wd->freelist[--wd->nfree];
    } else {
        if (wd->nslots == wd->cap) {
            size_t cap = wd->cap ? wd->cap * 2 : 64;
            wd_entry *ns = realloc(wd->slots, cap * sizeof *ns);
            if (ns) wd->slots = ns;
            size_t *nf = ns ? realloc(wd->freelist, cap * sizeof *nf) : NULL;
            if (nf) wd->freelist = nf;
            if (!ns || !nf) {
                pthread_mutex_unlock(&wd->mu);
                return dl_seterr(err, DLOCK_ENOMEM, "out of memory registering with the watchdog");
            }
            wd->cap = cap;
        }
        slot = wd->nslots++;
    }
    wd->slots[slot].l = l;
    wd->slots[slot].seq = ++wd->next_seq;
    l->wd_slot = slot;
    l->wd_seq = wd->slots[slot].seq;
    wd->count++;
    dl_renewer_wake(&wd->renewer);
    pthread_mutex_unlock(&wd->mu);
    return DLOCK_OK;
}

void dl_watchdog_locked(dlock_client *c, void (*fn)(void *), void *arg) {
    dl_watchdog *wd = wd_get(c);
    if (wd) pthread_mutex_lock(&wd->mu);
    fn(arg);
    if (wd) pthread_mutex_unlock(&wd->mu);
}

void dl_watchdog_unregister(dlock_client *c, dl_lease *l) {
    dl_watchdog *wd = wd_get(c);
    if (!wd) return;
    pthread_mutex_lock(&wd->mu);
    if (l->wd_seq && l->wd_slot < wd->nslots && wd->slots[l->wd_slot].l == l &&
        wd->slots[l->wd_slot].seq == l->wd_seq)
        slot_remove(wd, l);
    l->wd_seq = 0;
    pthread_mutex_unlock(&wd->mu);
}

void dl_watchdog_free(dl_watchdog *wd) {
    if (!wd) return;
    dl_renewer_stop(&wd->renewer);
    pthread_mutex_destroy(&wd->mu);
    free(wd->slots);
    free(wd->freelist);
    free(wd);
}
