/* The async ID worker (dlock_async_idworker_*): the blocking worker's ids
 * (src/idworker.c's dl_idw_*: the same layout, key and checks) handed out
 * from the loop.
 *
 * A worker keeps a queue of the nexts asked for and at most one INCRBY out
 * on the client's command connection. The nexts are served in the order
 * they were asked for, from the block that INCRBY reserved: it reserves
 * the worker's batch, or as many values as nexts are waiting when that is
 * more, so a burst of nexts shares one round trip. A next that the block
 * can serve is served from the client's timer (never from the call that
 * asked), one that cannot waits for the INCRBY. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "async.h"

typedef struct anext {
    dlock_async_idworker_fn cb;
    void *ud;
} anext;

/* The INCRBY out: it outlives a worker freed meanwhile (w NULL then). */
typedef struct idreq {
    dl_areq q;
    dlock_async_idworker *w;
    int64_t t, n;              /* the Unix seconds whose day it reserves, how many */
    char *key;
    size_t key_len;
} idreq;

struct dlock_async_idworker {
    dl_aclient *c;
    dlock_async_idworker *prev, *next; /* the client's workers */
    dl_idw s;
    anext *q;                  /* a ring of the nexts waiting, in order */
    size_t head, len, cap;
    idreq *out;                /* the INCRBY out, or NULL */
    dl_atimer timer;           /* serves what the block can */
    int busy;                  /* serving: callbacks running */
    int freeing;               /* being freed: nexts refused */
    int doomed;                /* freed while busy: when serving ends */
    char errmsg[DL_ERRMSG_MAX];
};

static int wfail(dlock_async_idworker *w, const dl_err *err) {
    snprintf(w->errmsg, sizeof w->errmsg, "%s", err->msg[0] ? err->msg : dlock_strerror(err->code));
    return err->code;
}

static void really_free(dlock_async_idworker *w) {
    dl_idw_fini(&w->s);
    free(w->q);
    free(w);
}

static anext pop(dlock_async_idworker *w) {
    anext a = w->q[w->head];
    w->head = (w->head + 1) % w->cap;
    w->len--;
    return a;
}

static void idreq_done(dl_areq *q, redisReply *r, const dl_err *err);

/* Sends the INCRBY reserving the block of t's day for the nexts waiting. */
static int send_incr(dlock_async_idworker *w, int64_t t, dl_err *err) {
    idreq *rq = calloc(1, sizeof *rq);
    if (!rq) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int rc = dl_idw_key(&w->s, t, &rq->key, &rq->key_len, err);
    if (rc) {
        free(rq);
        return rc;
    }
    rq->w = w;
    rq->t = t;
    rq->n = (int64_t)w->len > w->s.batch ? (int64_t)w->len : w->s.batch;
    char nbuf[24];
    int nn = snprintf(nbuf, sizeof nbuf, "%" PRId64, rq->n);
    const char *argv[3] = {rq->n > 1 ? "INCRBY" : "INCR", rq->key, nbuf};
    size_t lens[3] = {strlen(argv[0]), rq->key_len, (size_t)nn};
    rq->q.done = idreq_done;
    /* the command pipe, or the master of the key's slot on a cluster */
    rc = dl_apipe_command(dl_aroute(w->c, rq->key, rq->key_len), &rq->q, rq->n > 1 ? 3 : 2,
                          argv, lens, err);
    if (rc) {
        free(rq->key);
        free(rq);
        return rc;
    }
    w->out = rq;
    return DLOCK_OK;
}

/* Ends the first k nexts waiting with code (its message err). */
static void fail_nexts(dlock_async_idworker *w, size_t k, const dl_err *err) {
    while (k-- > 0 && w->len && !w->doomed) {
        anext a = pop(w);
        wfail(w, err);
        a.cb(w, err->code, 0, a.ud);
    }
}

/* Serves the nexts waiting, in order, while the block lasts; sends the
 * INCRBY for the rest. From the loop (the timer, a reply). */
static void serve(dlock_async_idworker *w) {
    w->busy++;
    while (w->len && !w->doomed) {
        uint64_t id = 0;
        int64_t need = -1;
        dl_err e = {0};
        int rc = dl_idw_take(&w->s, &id, &need, &e);
        if (!rc && need >= 0) {
            if (w->out) break; /* the rest waits for the INCRBY out */
            rc = send_incr(w, need, &e);
            if (!rc) break;
            /* not sent: the nexts waiting fail with it */
            fail_nexts(w, w->len, &e);
            break;
        }
        anext a = pop(w);
        if (rc) wfail(w, &e);
        else w->errmsg[0] = '\0';
        a.cb(w, rc, rc ? 0 : id, a.ud);
    }
    w->busy--;
    if (w->doomed && !w->busy) really_free(w);
}

static void on_timer(dl_atimer *t) { serve(t->arg); }

static void idreq_done(dl_areq *q, redisReply *r, const dl_err *err) {
    idreq *rq = (idreq *)q;
    dlock_async_idworker *w = rq->w;
    int rc = DLOCK_OK;
    dl_err e = {0};
    if (w) {
        long long hi = 0;
        w->out = NULL;
        if (!r) rc = (e = *err).code;
        else rc = dl_idw_reply(r, rq->key, rq->key_len, &hi, &e);
        if (!rc) rc = dl_idw_fill(&w->s, rq->t, rq->n, hi, rq->key, &e);
    }
    free(rq->key);
    free(rq);
    if (!w) return;
    if (rc) {
        /* the nexts that waited for it fail with it (its outcome may be
         * unknown: the values it reserved are a gap, as a worker freed with
         * part of a block left) */
        w->busy++;
        fail_nexts(w, w->len, &e);
        w->busy--;
        if (w->doomed && !w->busy) really_free(w);
        return;
    }
    serve(w);
}

/* The end of a public call that may have run callbacks (depth raised
 * before): a client freed by one of them goes now. */
static void leave(dl_aclient *c) {
    if (--c->depth > 0) return;
    if (c->doomed) c->destroy(c);
    else dl_aloop_sync(&c->loop);
}

int dlock_async_idworker_new(dlock_async_client *c, const char *prefix,
                             const dlock_idworker_options *opts, dlock_async_idworker **out) {
    if (out) *out = NULL;
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    int rc = DLOCK_OK;
    if (!prefix || !out)
        rc = dl_seterr(&err, DLOCK_EINVAL, "dlock_async_idworker_new: NULL %s",
                       !prefix ? "prefix" : "out");
    else if (c->freeing)
        rc = dl_seterr(&err, DLOCK_EINVAL, "the client is being freed, or could not be created");
    dl_idw s = {0};
    if (!rc) rc = dl_idw_init(&s, prefix, opts, &err);
    dlock_async_idworker *w = NULL;
    if (!rc && dl_aloop_reserve(&c->loop, c->nlocks + c->nobjs + c->nidws + 3 + (size_t)c->loop.nslots))
        rc = dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
    if (!rc && !(w = calloc(1, sizeof *w))) rc = dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
    if (rc) {
        dl_idw_fini(&s);
        snprintf(c->errmsg, sizeof c->errmsg, "%s", err.msg);
        return rc;
    }
    w->c = c;
    w->s = s;
    w->timer.fn = on_timer;
    w->timer.arg = w;
    w->next = c->idws;
    if (c->idws) c->idws->prev = w;
    c->idws = w;
    c->nidws++;
    *out = w;
    return DLOCK_OK;
}

int dlock_async_idworker_next(dlock_async_idworker *w, dlock_async_idworker_fn cb, void *udata) {
    if (!w) return DLOCK_EINVAL;
    dl_aclient *c = w->c;
    if (!cb) return wfail(w, &(dl_err){DLOCK_EINVAL, "NULL callback"});
    if (w->freeing || c->freeing)
        return wfail(w, &(dl_err){DLOCK_EINVAL, "the worker or its client is being freed"});
    if (w->len == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 8;
        anext *q = malloc(cap * sizeof *q);
        if (!q) return wfail(w, &(dl_err){DLOCK_ENOMEM, "out of memory"});
        for (size_t i = 0; i < w->len; i++) q[i] = w->q[(w->head + i) % w->cap];
        free(w->q);
        w->q = q;
        w->head = 0;
        w->cap = cap;
    }
    w->q[(w->head + w->len) % w->cap] = (anext){cb, udata};
    w->len++;
    /* served from the loop: at once when the block has values (the timer),
     * else when the INCRBY out (or sent now) answers */
    /* served from the loop's next turn: the nexts asked until then share
     * the INCRBY it may need (or wait for the one out) */
    if (!w->out && !w->timer.idx && dl_atimer_arm(&c->loop, &w->timer, dl_now_ms())) {
        w->len--;
        return wfail(w, &(dl_err){DLOCK_ENOMEM, "out of memory"});
    }
    if (!c->depth) dl_aloop_sync(&c->loop);
    return DLOCK_OK;
}

/* Frees w: its nexts end with DLOCK_ECANCELED (msg), its INCRBY out is
 * dropped when it comes. */
static void worker_free(dlock_async_idworker *w, const char *msg) {
    dl_aclient *c = w->c;
    if (w->freeing) return;
    w->freeing = 1;
    if (w->prev) w->prev->next = w->next;
    else if (c->idws == w) c->idws = w->next;
    if (w->next) w->next->prev = w->prev;
    c->nidws--;
    dl_atimer_stop(&c->loop, &w->timer);
    if (w->out) w->out->w = NULL;
    w->out = NULL;
    dl_err e = {DLOCK_ECANCELED, ""};
    snprintf(e.msg, sizeof e.msg, "%s", msg);
    w->busy++;
    fail_nexts(w, w->len, &e);
    w->busy--;
    if (w->busy) w->doomed = 1; /* freed from its own callback: when serving ends */
    else really_free(w);
}

void dlock_async_idworker_free(dlock_async_idworker *w) {
    if (!w || w->freeing) return;
    dl_aclient *c = w->c;
    c->depth++;
    worker_free(w, "the ID worker was freed");
    leave(c);
}

const char *dlock_async_idworker_errmsg(const dlock_async_idworker *w) {
    if (!w) return "no ID worker (NULL handle)";
    return w->errmsg;
}

void dl_aidw_free_all(dl_aclient *c) {
    while (c->idws) worker_free(c->idws, "the client was freed");
}
