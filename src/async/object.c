/* The semaphore, the permit semaphore and the countdown latch from an
 * event loop, on the blocking objects' keys, scripts and channels
 * (semaphore.c, permits_redis.c, latch.c), so that async and blocking
 * clients share one name and wake each other's waiters.
 *
 * A waiting operation (a semaphore or permit acquire, a latch await) joins
 * the client's subscription table on the object's channel and attempts at
 * once, in parallel. As in the blocking wait, a change between an attempt
 * and the subscription must not be missed: an attempt sent before the
 * channel was confirmed is followed, once it is, by another. The waiter
 * then attempts again at a message on its channel, when the earliest lease
 * runs out (permit semaphore), and at least every DL_WAIT_RECHECK_MS; the
 * attempt at the deadline is a try-once. Every other operation is one
 * request.
 *
 * A request carries what it needs to be sent again (a NOSCRIPT answer, a
 * lost reply of an operation that may be repeated) and a reference to its
 * handle, so it outlives a handle freed meanwhile. Each operation ends
 * once: the handle's op.gen counts operations, and the reply of an attempt
 * whose operation ended already is an orphan: permits it took are given
 * back. What is owed after a failure (a permit to release, a change to
 * send again) waits on the client's osettle list for the next command
 * connection. What a failure leaves unknown: dlock_async.h, "Outcomes". */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "async.h"

#define CHG_HEX (2 * DL_SEM_CHANGE_ID_BYTES)

typedef struct dl_aoreq {
    dl_areq q;
    struct dl_aoreq *next;     /* the client's osettle list */
    dlock_async_object *o;     /* a reference */
    unsigned gen;              /* the operation it answers (owed: none) */
    int what;                  /* DL_AOR_* */
    int owed;                  /* a give back: no operation waits for it */
    int by_text, resent, after_sub;
    int64_t n;                 /* its number: permits, delta, count, lease */
    int64_t sent_at;           /* when its first copy went out (0: not yet) */
    char raw[DL_PERMIT_RAW];   /* a permit's id */
    char chg[];                /* DL_AOR_SEM_ADD: its change id's key */
} oreq;

/* A permit taken with DLOCK_WATCHDOG, renewed by the client's watchdog
 * (renew.c) with the blocking watchdog's script for permits, until it is
 * released, renewed with an explicit lease, found lost, or its handle
 * freed. */
typedef struct wdpermit {
    struct wdpermit *next;     /* the handle's */
    dlock_async_object *o;
    char raw[DL_PERMIT_RAW];   /* the ZSET member: the lease's owner */
    char id[DLOCK_PERMIT_ID_LEN + 1];
    dl_alease lease;
} wdpermit;

typedef struct oop {
    int type;                  /* DL_AOP_*, NONE: none pending */
    int watchdog;              /* a permit acquire with DLOCK_WATCHDOG */
    unsigned gen;
    dlock_async_object_fn cb;
    void *ud;
    int waiting;               /* a wait_ms != 0 */
    int64_t deadline, n;       /* n: permits (semaphore), the lease (permits) */
    char raw[DL_PERMIT_RAW];   /* the permit the acquire asks for */
    dl_awaiter w;              /* in the subscription table while waiting */
    dl_atimer timer;           /* the next attempt */
    oreq *inflight;            /* the attempt whose reply is awaited */
    int woken;                 /* a message came while an attempt was out */
} oop;

struct dlock_async_object {
    dl_aclient *c;
    dlock_async_object *prev, *next; /* the client's handles */
    dlock_kind kind;
    /* chan: the blocking object's channel; zkey: the permits' leases
     * ({name}:timeout); chg: the semaphore's change ids' prefix */
    char *name, *chan, *zkey, *chg;
    size_t name_len, chan_len, zkey_len, chg_len;
    int refs;                  /* 1 for the handle, 1 per request */
    oop op;
    char id[DLOCK_PERMIT_ID_LEN + 1]; /* the last permit acquire's */
    char *errmsg;              /* made on the first failure */
    int msg_lost;
    wdpermit *wd;              /* its watchdog permits */
    dlock_async_permit_lost_fn lost_fn;
    void *lost_ud;
};

static void req_done(dl_areq *q, redisReply *r, const dl_err *err);
static void attempt(dlock_async_object *o);

static void unref(dlock_async_object *o) {
    if (--o->refs > 0) return;
    free(o->name);
    free(o->chan);
    free(o->zkey);
    free(o->chg);
    free(o->errmsg);
    free(o);
}

int dl_aobj_fail(dlock_async_object *o, const dl_err *err) {
    if (!o->errmsg) o->errmsg = malloc(DL_ERRMSG_MAX);
    o->msg_lost = !o->errmsg;
    if (o->errmsg) snprintf(o->errmsg, DL_ERRMSG_MAX, "%s", err->msg);
    return err->code;
}

/* "semaphore 'name'" and the like, for messages */
static const char *who(const dlock_async_object *o, char *buf, size_t len) {
    char nm[80];
    const char *k = o->kind == DLOCK_KIND_SEMAPHORE   ? "semaphore"
                    : o->kind == DLOCK_KIND_LATCH     ? "latch"
                                                      : "permit semaphore";
    snprintf(buf, len, "%s '%s'", k, dl_name_msg(o->name, o->name_len, nm, sizeof nm));
    return buf;
}

/* ---- requests ---- */

static oreq *req_new(dlock_async_object *o, int what, int64_t n, const char *raw, dl_err *err) {
    size_t extra = what == DL_AOR_SEM_ADD ? o->chg_len + CHG_HEX + 1 : 0;
    oreq *rq = calloc(1, sizeof *rq + extra);
    if (!rq) {
        dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    rq->o = o;
    rq->what = what;
    rq->n = n;
    rq->gen = o->op.gen;
    if (raw) memcpy(rq->raw, raw, DL_PERMIT_RAW);
    if (what == DL_AOR_SEM_ADD) { /* a fresh change id: counted once however often sent */
        memcpy(rq->chg, o->chg, o->chg_len);
        if (dl_random_hex(rq->chg + o->chg_len, DL_SEM_CHANGE_ID_BYTES, err)) {
            free(rq);
            return NULL;
        }
    }
    o->refs++;
    return rq;
}

static void req_drop(oreq *rq) {
    dlock_async_object *o = rq->o;
    free(rq);
    unref(o);
}

/* Sends rq on the command connection (opened if closed). */
static int req_send(oreq *rq, dl_err *err) {
    dlock_async_object *o = rq->o;
    char num[24], ttl[24];
    size_t nl = dl_fmt_ll(num, rq->n);
    int pm = o->kind == DLOCK_KIND_PERMIT_SEMAPHORE;
    const char *keys[3] = {o->name, pm ? o->zkey : o->chan, o->chan};
    size_t kl[3] = {o->name_len, pm ? o->zkey_len : o->chan_len, o->chan_len};
    const char *args[2] = {num, NULL};
    size_t al[2] = {nl, 0};
    int nkeys = pm ? 3 : 2, nargs = 1;
    dl_script *s = NULL;
    switch (rq->what) {
    case DL_AOR_SEM_ACQ: s = &dl_script_semaphore_acquire; break;
    case DL_AOR_SEM_SET: s = &dl_script_semaphore_try_set; break;
    case DL_AOR_SEM_ADD: /* KEYS semaphore, channel, change id; ARGV delta, the id's life */
        s = &dl_script_semaphore_add_once;
        keys[2] = rq->chg, kl[2] = o->chg_len + CHG_HEX, nkeys = 3;
        args[1] = ttl, al[1] = dl_fmt_ll(ttl, DL_SEM_CHANGE_ID_MS), nargs = 2;
        break;
    case DL_AOR_PM_ACQ: /* ARGV id, lease */
        s = &dl_script_permits_acquire;
        args[0] = rq->raw, al[0] = DL_PERMIT_RAW;
        args[1] = num, al[1] = nl, nargs = 2;
        break;
    case DL_AOR_PM_REL:
        s = &dl_script_permits_release;
        args[0] = rq->raw, al[0] = DL_PERMIT_RAW;
        break;
    case DL_AOR_PM_RENEW: /* ARGV id, lease */
        s = &dl_script_permits_renew;
        args[0] = rq->raw, al[0] = DL_PERMIT_RAW;
        args[1] = num, al[1] = nl, nargs = 2;
        break;
    case DL_AOR_PM_AVAIL: s = &dl_script_permits_available, nargs = 0; break;
    case DL_AOR_PM_SET: s = &dl_script_permits_try_set; break;
    case DL_AOR_PM_ADD: s = &dl_script_permits_add; break;
    case DL_AOR_LA_CD: s = &dl_script_latch_count_down; break;
    case DL_AOR_LA_SET: s = &dl_script_latch_try_set; break;
    case DL_AOR_LA_FORCE: s = &dl_script_latch_set; break;
    default: break; /* DL_AOR_GET */
    }
    rq->q.done = req_done;
    rq->after_sub = dl_asubs_subscribed(&o->op.w);
    if (!rq->sent_at) rq->sent_at = dl_now_ms();
    if (!s) {
        const char *argv[2] = {"GET", o->name};
        size_t lens[2] = {3, o->name_len};
        return dl_apipe_command(dl_aroute(o->c, o->name, o->name_len), &rq->q, 2, argv, lens,
                                err);
    }
    return dl_apipe_eval(dl_aroute(o->c, o->name, o->name_len), &rq->q, s, rq->by_text, nkeys, keys, kl, nargs, args, al,
                         err);
}

/* A request of o's operation under way: sent, and its inflight. */
static int req_start(dlock_async_object *o, int what, int64_t n, const char *raw, dl_err *err) {
    oreq *rq = req_new(o, what, n, raw, err);
    if (!rq) return err->code;
    int rc = req_send(rq, err);
    if (rc) {
        req_drop(rq);
        return rc;
    }
    o->op.inflight = rq;
    return DLOCK_OK;
}

static void settle_later(oreq *rq) {
    rq->next = rq->o->c->osettle;
    rq->o->c->osettle = rq;
}

/* Sends a give back (a release of n permits counted once, or of the permit
 * raw) on the connection there is, or once a connection is up again.
 * Nothing while the client is being freed. */
static void owe(dlock_async_object *o, int what, int64_t n, const char *raw) {
    dl_err e;
    if (o->c->freeing) return;
    oreq *rq = req_new(o, what, n, raw, &e);
    if (!rq) return; /* a permit runs out with its lease; permits stay taken */
    rq->owed = 1;
    /* not a connection of its own: after a failure the server may be down */
    if (dl_apipe_opened(dl_aroute(o->c, o->name, o->name_len)) && !req_send(rq, &e)) return;
    settle_later(rq);
}

void dl_aobj_pipe_up(dl_apipe *p) {
    dl_aclient *c = p->cl;
    oreq *list = c->osettle;
    c->osettle = NULL;
    int64_t now = dl_now_ms();
    while (list) {
        oreq *rq = list;
        list = rq->next;
        rq->next = NULL;
        rq->by_text = 0;
        /* a change sent before is counted once only while its id lives on
         * the server: later, a copy could count it twice; its outcome stays
         * unknown */
        if (rq->what == DL_AOR_SEM_ADD && rq->resent &&
            now - rq->sent_at > DL_SEM_CHANGE_ID_MS - c->command_timeout_ms) {
            req_drop(rq);
            continue;
        }
        dl_err e;
        /* a cluster's other nodes: on their connection when it is open */
        dl_apipe *to = dl_aroute(c, rq->o->name, rq->o->name_len);
        if ((to != p && !dl_apipe_opened(to)) || req_send(rq, &e)) settle_later(rq);
    }
}

/* ---- watchdog permits ---- */

static wdpermit *wd_find(const dlock_async_object *o, const char *raw) {
    for (wdpermit *w = o->wd; w; w = w->next)
        if (!memcmp(w->raw, raw, DL_PERMIT_RAW)) return w;
    return NULL;
}

/* w renewed no more, out of the handle's list, freed. */
static void wd_drop(dlock_async_object *o, wdpermit *w) {
    dl_arenew_remove(&o->c->renew, &w->lease);
    for (wdpermit **pp = &o->wd; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    free(w);
}

/* The watchdog found the permit lost (unregistered already): the
 * handle's callback, with the permit's id. */
static void wd_lost(dl_alease *l, int reason) {
    wdpermit *w = l->arg;
    dlock_async_object *o = w->o;
    char id[DLOCK_PERMIT_ID_LEN + 1];
    memcpy(id, w->id, sizeof id);
    wd_drop(o, w);
    if (!o->lost_fn) return;
    o->refs++; /* the callback may free the handle */
    o->lost_fn(o, id, reason, o->lost_ud);
    unref(o);
}

static void hex_of(const char *raw, char *hex);

/* The permit rq took for a DLOCK_WATCHDOG acquire, registered with the
 * watchdog: its lease started after rq's first copy went out. DLOCK_OK or
 * DLOCK_ENOMEM (the permit must then be given back). */
static int wd_keep(dlock_async_object *o, const oreq *rq, dl_err *err) {
    wdpermit *w = calloc(1, sizeof *w);
    if (!w) return dl_seterr(err, DLOCK_ENOMEM, "out of memory registering a lease");
    w->o = o;
    memcpy(w->raw, rq->raw, DL_PERMIT_RAW);
    hex_of(rq->raw, w->id);
    w->lease.renew = &dl_script_permits_wd_renew;
    w->lease.key = o->zkey;
    w->lease.key_len = o->zkey_len;
    w->lease.owner = w->raw;
    w->lease.owner_len = DL_PERMIT_RAW;
    w->lease.lease_ms = rq->n;
    w->lease.last_ok = rq->sent_at;
    w->lease.lost = wd_lost;
    w->lease.arg = w;
    if (dl_arenew_add(&o->c->renew, &w->lease, err)) {
        free(w);
        return err->code;
    }
    w->next = o->wd;
    o->wd = w;
    return DLOCK_OK;
}

/* A release or renewal by id of one of o's watchdog permits went out: the
 * watchdog leaves it alone meanwhile (its "gone" is no loss then). */
static void wd_pause(dlock_async_object *o, const char *raw) {
    wdpermit *w = wd_find(o, raw);
    if (w) w->lease.releasing = 1;
}

/* The final outcome of such a release or renewal (r NULL: failed, the
 * outcome unknown): answered, the permit is released, gone, or renewed to
 * an explicit lease, and renewed no more (as dlock_permits_release and
 * dlock_permits_renew); unknown, it is renewed again, and a renewal that
 * finds it gone tells it lost. */
static void wd_settle(dlock_async_object *o, const oreq *rq, const redisReply *r) {
    wdpermit *w = wd_find(o, rq->raw);
    if (!w) return;
    if (r && r->type == REDIS_REPLY_INTEGER) wd_drop(o, w);
    else w->lease.releasing = 0;
}

/* ---- ending an operation ---- */

/* Ends o's operation with code: leaves the table, runs the callback (last:
 * it may free o). */
static void finish(dlock_async_object *o, int code, int64_t value, const dl_err *err) {
    oop *op = &o->op;
    dl_aclient *c = o->c;
    dlock_async_object_fn cb = op->cb;
    void *ud = op->ud;
    if (code && err) dl_aobj_fail(o, err);
    if (!code && o->errmsg) o->errmsg[0] = '\0';
    if (!code) o->msg_lost = 0;
    if (code && op->type == DL_AOP_PM_ACQ) o->id[0] = '\0';
    dl_atimer_stop(&c->loop, &op->timer);
    dl_asubs_leave(&c->subs, &op->w);
    op->type = DL_AOP_NONE;
    op->gen++;
    op->inflight = NULL;
    op->cb = NULL;
    o->refs++; /* the callback may free the handle */
    cb(o, code, code ? 0 : value, ud);
    unref(o);
}

/* finish with a message */
static void finish_fmt(dlock_async_object *o, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finish_fmt(dlock_async_object *o, int code, const char *fmt, ...) {
    dl_err err = {code, ""};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.msg, sizeof err.msg, fmt, ap);
    va_end(ap);
    finish(o, code, 0, &err);
}

/* A waiting operation that did not get what it waits for. */
static void refused(dlock_async_object *o, int timed_out, long long count) {
    char w[120];
    who(o, w, sizeof w);
    int code = timed_out ? DLOCK_ETIMEDOUT : DLOCK_EBUSY;
    if (o->kind == DLOCK_KIND_SEMAPHORE && timed_out)
        finish_fmt(o, code, "timed out waiting for %lld permit(s) of %s", (long long)o->op.n, w);
    else if (o->kind == DLOCK_KIND_SEMAPHORE)
        finish_fmt(o, code, "%s: %lld permit(s) not available", w, (long long)o->op.n);
    else if (o->kind == DLOCK_KIND_PERMIT_SEMAPHORE && timed_out)
        finish_fmt(o, code, "timed out waiting for a permit of %s", w);
    else if (o->kind == DLOCK_KIND_PERMIT_SEMAPHORE)
        finish_fmt(o, code, "%s: no permit available", w);
    else if (timed_out)
        finish_fmt(o, DLOCK_ETIMEDOUT, "timed out waiting for %s (count %lld)", w, count);
    else
        finish_fmt(o, DLOCK_ETIMEDOUT, "%s is not at zero (count %lld)", w, count);
}

/* ---- replies ---- */

/* The reply's value (*v; *left: a permit acquire's ms to the earliest
 * expiry), or its failure. */
static int parse(const dlock_async_object *o, const oreq *rq, redisReply *r, long long *v,
                 long long *left, dl_err *err) {
    char w[120];
    who(o, w, sizeof w);
    if (r->type == REDIS_REPLY_ERROR) return dl_sync_reply_error(r, w, err);
    if (r->type == REDIS_REPLY_NIL && (rq->what == DL_AOR_GET || rq->what == DL_AOR_SEM_ADD)) {
        *v = rq->what == DL_AOR_GET ? 0 : -1; /* absent: zero; a change counted before */
        return DLOCK_OK;
    }
    if (rq->what == DL_AOR_PM_ACQ) {
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && !dl_reply_int(r->element[0], v) &&
            !dl_reply_int(r->element[1], left))
            return DLOCK_OK;
    } else if (!dl_reply_int(r, v)) {
        return DLOCK_OK;
    }
    return dl_seterr(err, DLOCK_EPROTO, "%s: unexpected reply from the server", w);
}

static void hex_of(const char *raw, char *hex) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < DL_PERMIT_RAW; i++) {
        hex[2 * i] = digits[(unsigned char)raw[i] >> 4];
        hex[2 * i + 1] = digits[(unsigned char)raw[i] & 15];
    }
    hex[2 * DL_PERMIT_RAW] = '\0';
}

/* The reply of the operation under way. */
static void op_reply(dlock_async_object *o, oreq *rq, redisReply *r, const dl_err *err) {
    oop *op = &o->op;
    dl_err e = {0};
    char w[120];
    long long v = 0, left = -1;
    op->inflight = NULL;
    int rc = r ? parse(o, rq, r, &v, &left, &e) : (e = *err).code;
    if (rc) {
        /* a permit it may have taken is released by its id */
        if (rq->what == DL_AOR_PM_ACQ) owe(o, DL_AOR_PM_REL, 0, rq->raw);
        finish(o, rc, 0, &e);
        return;
    }
    if (op->type == DL_AOP_ONE) {
        char hex[2 * DL_PERMIT_RAW + 1];
        if ((rq->what == DL_AOR_PM_REL || rq->what == DL_AOR_PM_RENEW) && v != 1) {
            hex_of(rq->raw, hex);
            finish_fmt(o, DLOCK_ENOTOWNER, "permit %s: permit %s of %s is not out on lease "
                       "(expired, released or never issued)",
                       rq->what == DL_AOR_PM_REL ? "release" : "renew", hex,
                       who(o, w, sizeof w));
        } else {
            /* a latch set answers 1: the count it set is what it tells */
            finish(o, DLOCK_OK, rq->what == DL_AOR_LA_FORCE ? rq->n : v, NULL);
        }
        return;
    }
    int got = rq->what == DL_AOR_GET ? v <= 0 : v == 1;
    if (got && op->watchdog && wd_keep(o, rq, &e)) {
        owe(o, DL_AOR_PM_REL, 0, rq->raw); /* not renewed: not kept */
        finish(o, e.code, 0, &e);
        return;
    }
    if (got) {
        if (op->type == DL_AOP_PM_ACQ) hex_of(rq->raw, o->id);
        finish(o, DLOCK_OK, op->type == DL_AOP_SEM_ACQ ? op->n : op->type == DL_AOP_PM_ACQ, NULL);
        return;
    }
    int64_t now = dl_now_ms();
    if (!op->waiting || now >= op->deadline) {
        refused(o, op->waiting, v);
        return;
    }
    /* subscribed since this attempt went out, or told meanwhile: a change
     * after it may have been missed, or announced */
    if ((!rq->after_sub && dl_asubs_subscribed(&op->w)) || op->woken) {
        attempt(o);
        return;
    }
    int64_t until = op->deadline;
    if (now + DL_WAIT_RECHECK_MS < until) until = now + DL_WAIT_RECHECK_MS;
    /* an expiring lease gives a permit back without a message (+1: surely
     * expired on the server's clock) */
    if (rq->what == DL_AOR_PM_ACQ && left >= 0 && now + left + 1 < until) until = now + left + 1;
    if (dl_atimer_arm(&o->c->loop, &op->timer, until)) {
        dl_seterr(&e, DLOCK_ENOMEM, "out of memory arming a timer");
        finish(o, DLOCK_ENOMEM, 0, &e);
    }
}

/* An attempt whose operation ended already (cancelled, failed, freed). */
static void orphan(dlock_async_object *o, oreq *rq, redisReply *r) {
    long long v = 0;
    if (rq->what == DL_AOR_SEM_ACQ && r && r->type == REDIS_REPLY_INTEGER && !dl_reply_int(r, &v) &&
        v == 1)
        owe(o, DL_AOR_SEM_ADD, rq->n, NULL); /* took them: a release of as many */
    if (rq->what == DL_AOR_PM_ACQ) {
        long long a = 1;
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
            (void)dl_reply_int(r->element[0], &a);
        if (a != 0) owe(o, DL_AOR_PM_REL, 0, rq->raw); /* taken, or maybe */
    }
}

static void req_done(dl_areq *q, redisReply *r, const dl_err *err) {
    oreq *rq = (oreq *)q;
    dlock_async_object *o = rq->o;
    dl_aclient *c = o->c;
    oop *op = &o->op;
    int live = !rq->owed && op->type != DL_AOP_NONE && rq->gen == op->gen;
    dl_err e = {0};
    if (r && dl_is_noscript(r) && !rq->by_text && !c->freeing) {
        /* the script cache was flushed: the script did not run, send its text */
        dl_apipe_forget_scripts(q->pipe);
        rq->by_text = 1;
        if (!req_send(rq, &e)) return;
        r = NULL; /* not sent again: as a reply lost */
        err = &e;
    }
    if (!r && !c->freeing && !rq->resent && (live || rq->owed) &&
        (rq->what == DL_AOR_SEM_ADD || rq->what == DL_AOR_PM_REL ||
         rq->what == DL_AOR_PM_RENEW)) {
        /* a lost reply of a change counted once (its id), of a permit
         * release (an id released twice is released once) or renewal (one
         * renewed twice ends later by the copies' interval, never sooner):
         * the same again, once; an owed one waits for the next connection */
        rq->resent = 1;
        rq->by_text = 0;
        if (rq->owed) {
            settle_later(rq);
            return;
        }
        dl_err e2;
        if (!req_send(rq, &e2)) return;
    } else if (!r && rq->owed && rq->what == DL_AOR_PM_REL && !c->freeing) {
        settle_later(rq); /* until the server says */
        return;
    }
    if (!rq->owed && (rq->what == DL_AOR_PM_REL || rq->what == DL_AOR_PM_RENEW))
        wd_settle(o, rq, r);
    if (live) op_reply(o, rq, r, err);
    else if (!rq->owed) orphan(o, rq, r);
    req_drop(rq);
}

/* ---- waiting ---- */

/* The waiting operation's next attempt. */
static void attempt(dlock_async_object *o) {
    oop *op = &o->op;
    dl_err err;
    dl_atimer_stop(&o->c->loop, &op->timer);
    op->woken = 0;
    int rc;
    if (op->type == DL_AOP_SEM_ACQ) rc = req_start(o, DL_AOR_SEM_ACQ, op->n, NULL, &err);
    else if (op->type == DL_AOP_PM_ACQ) rc = req_start(o, DL_AOR_PM_ACQ, op->n, op->raw, &err);
    else rc = req_start(o, DL_AOR_GET, 0, NULL, &err);
    if (rc) finish(o, rc, 0, &err);
}

static dlock_async_object *of_waiter(dl_awaiter *w) {
    return (dlock_async_object *)((char *)w - offsetof(dlock_async_object, op.w));
}

static void on_timer(dl_atimer *t) {
    dlock_async_object *o = t->arg;
    if (o->op.type != DL_AOP_NONE && o->op.type != DL_AOP_ONE && !o->op.inflight) attempt(o);
}

static void on_wake(dl_awaiter *w, int confirmed) {
    (void)confirmed;
    dlock_async_object *o = of_waiter(w);
    if (o->op.type == DL_AOP_NONE || o->op.type == DL_AOP_ONE) return;
    if (o->op.inflight) o->op.woken = 1; /* attempt again after its reply */
    else attempt(o);
}

static void on_lost(dl_awaiter *w, const dl_err *err) {
    dlock_async_object *o = of_waiter(w);
    if (o->op.type != DL_AOP_NONE && o->op.type != DL_AOP_ONE) finish(o, err->code, 0, err);
}

/* ---- starting ---- */

/* The end of a call that ran callbacks (depth raised before). */
static void leave(dl_aclient *c) {
    if (--c->depth > 0) return;
    if (c->doomed) c->destroy(c);
    else dl_aloop_sync(&c->loop);
}

int dl_aobj_start(dlock_async_object *o, dlock_kind kind, int type, int what, int64_t n,
                 const char *raw, int64_t wait_ms, dlock_async_object_fn cb, void *ud) {
    dl_err err = {0};
    char w[120];
    if (!cb) return dl_aobj_fail(o, &(dl_err){DLOCK_EINVAL, "NULL callback"});
    if (o->kind != kind)
        return dl_aobj_fail(o, &(dl_err){DLOCK_EINVAL, "not an operation of this kind of object"});
    if (o->c->freeing)
        return dl_aobj_fail(o, &(dl_err){DLOCK_EINVAL, "the client is being freed, or could not be "
                                               "created"});
    if (o->op.type) {
        dl_seterr(&err, DLOCK_EINVAL, "an operation of %s's handle is pending",
                  who(o, w, sizeof w));
        return dl_aobj_fail(o, &err);
    }
    oop *op = &o->op;
    memset(&op->timer, 0, sizeof op->timer);
    op->timer.fn = on_timer;
    op->timer.arg = o;
    memset(&op->w, 0, sizeof op->w);
    op->w.wake = on_wake;
    op->w.lost = on_lost;
    op->cb = cb;
    op->ud = ud;
    op->type = type;
    /* a watchdog permit: the client's watchdog lease, renewed */
    op->watchdog = type == DL_AOP_PM_ACQ && n == DLOCK_WATCHDOG;
    if (op->watchdog) n = o->c->watchdog_lease_ms;
    op->n = n;
    op->woken = 0;
    op->inflight = NULL;
    op->waiting = type != DL_AOP_ONE && wait_ms != DLOCK_NOWAIT;
    op->deadline = dl_deadline(wait_ms);
    if (raw) memcpy(op->raw, raw, DL_PERMIT_RAW);
    int rc = DLOCK_OK;
    if (op->waiting) rc = dl_asubs_join(&o->c->subs, &op->w, o->chan, o->chan_len, &err);
    if (!rc) rc = req_start(o, what, n, raw, &err);
    if (rc) {
        dl_asubs_leave(&o->c->subs, &op->w);
        op->type = DL_AOP_NONE;
        op->gen++;
        return dl_aobj_fail(o, &err);
    }
    if (type == DL_AOP_PM_ACQ) o->id[0] = '\0';
    if (what == DL_AOR_PM_REL || what == DL_AOR_PM_RENEW) wd_pause(o, raw);
    dl_aloop_sync(&o->c->loop);
    return DLOCK_OK;
}

int dlock_async_object_cancel(dlock_async_object *o) {
    if (!o) return DLOCK_EINVAL;
    if (!o->op.type) return DLOCK_ENOTHELD;
    dl_aclient *c = o->c;
    char w[120];
    who(o, w, sizeof w);
    c->depth++;
    if (o->op.type == DL_AOP_ONE)
        finish_fmt(o, DLOCK_ECANCELED, "the operation on %s was cancelled", w);
    else
        finish_fmt(o, DLOCK_ECANCELED, "waiting for %s was cancelled", w);
    leave(c);
    return DLOCK_OK;
}

const char *dlock_async_permits_id(const dlock_async_object *o) { return o ? o->id : ""; }

void dlock_async_object_on_lost(dlock_async_object *o, dlock_async_permit_lost_fn fn,
                                void *udata) {
    if (!o) return;
    o->lost_fn = fn;
    o->lost_ud = udata;
}

const char *dlock_async_object_errmsg(const dlock_async_object *o) {
    if (!o) return "NULL object handle";
    if (o->errmsg) return o->errmsg;
    return o->msg_lost ? "out of memory (the failure's message was lost)" : "";
}

/* ---- handles ---- */

int dl_aobj_new(dlock_async_client *c, const char *name, size_t name_len, dlock_kind kind,
                      dlock_async_object **out) {
    if (out) *out = NULL;
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    int rc = DLOCK_OK;
    if (!out) rc = dl_seterr(&err, DLOCK_EINVAL, "NULL out");
    else if (c->freeing)
        rc = dl_seterr(&err, DLOCK_EINVAL, "the client is being freed, or could not be created");
    if (!rc) rc = dl_check_name(name, &name_len, &err);
    if (!rc && c->cluster) {
        /* as the blocking objects' checks (dl_check_cluster_name, and
         * dl_check_cluster_latch: the latch's scripts name its channel
         * among their KEYS) */
        int one = dl_name_keys_one_slot(name, name_len);
        char nm[80];
        size_t cl = 0;
        char *ch = kind == DLOCK_KIND_LATCH ? dl_latch_channel(name, name_len, &cl) : NULL;
        if (one < 0 || (kind == DLOCK_KIND_LATCH && !ch))
            rc = dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
        else if (!one)
            rc = dl_seterr(&err, DLOCK_EINVAL,
                           "name '%s' cannot be used on a Redis Cluster: its keys would hash to "
                           "different slots (with '{' or '}' in it, a name needs a non-empty "
                           "hash tag such as 'order{42}')",
                           dl_name_msg(name, name_len, nm, sizeof nm));
        else if (ch && dl_key_slot(ch, cl) != dl_key_slot(name, name_len))
            rc = dl_seterr(&err, DLOCK_EINVAL,
                           "latch name '%s' cannot be used on a Redis Cluster: its channel "
                           "hashes to another slot than its key; use a name without '{'",
                           dl_name_msg(name, name_len, nm, sizeof nm));
        free(ch);
    }
    if (rc) {
        snprintf(c->errmsg, sizeof c->errmsg, "%s", err.msg);
        return rc;
    }
    dlock_async_object *o = NULL;
    /* its timer's place in the heap, so that arming it cannot fail */
    if (!dl_aloop_reserve(&c->loop, c->nlocks + c->nobjs + 2 + (size_t)c->loop.nslots))
        o = calloc(1, sizeof *o);
    int ok = o != NULL;
    if (o) {
        o->c = c;
        o->refs = 1;
        o->kind = kind;
        o->name = malloc(name_len + 1);
        o->chan = kind == DLOCK_KIND_LATCH
                      ? dl_latch_channel(name, name_len, &o->chan_len)
                      : dl_derive_key("redisson_sc:", name, name_len, "", &o->chan_len);
        if (kind == DLOCK_KIND_PERMIT_SEMAPHORE)
            ok = (o->zkey = dl_derive_key("", name, name_len, ":timeout", &o->zkey_len)) != NULL;
        if (kind == DLOCK_KIND_SEMAPHORE)
            ok = (o->chg = dl_derive_key(DL_SEM_CHANGE_PREFIX, name, name_len, ":",
                                         &o->chg_len)) != NULL;
        ok = ok && o->name && o->chan;
    }
    if (!ok) {
        if (o) unref(o);
        snprintf(c->errmsg, sizeof c->errmsg, "out of memory");
        return DLOCK_ENOMEM;
    }
    memcpy(o->name, name, name_len);
    o->name[name_len] = '\0';
    o->name_len = name_len;
    o->next = c->objs;
    if (c->objs) c->objs->prev = o;
    c->objs = o;
    c->nobjs++;
    *out = o;
    return DLOCK_OK;
}

static void object_free(dlock_async_object *o) {
    dl_aclient *c = o->c;
    char w[120];
    if (o->op.type)
        finish_fmt(o, DLOCK_ECANCELED, "the handle of %s was freed", who(o, w, sizeof w));
    if (o->prev) o->prev->next = o->next;
    else if (c->objs == o) c->objs = o->next;
    if (o->next) o->next->prev = o->prev;
    o->prev = o->next = NULL;
    c->nobjs--;
    /* its watchdog permits are renewed no more: they run out with their
     * lease (as dlock_permits_free's) */
    while (o->wd) wd_drop(o, o->wd);
    unref(o);
}

void dlock_async_object_free(dlock_async_object *o) {
    if (!o) return;
    dl_aclient *c = o->c;
    c->depth++;
    object_free(o);
    leave(c);
}

void dl_aobj_free_all(dl_aclient *c) {
    dl_aidw_free_all(c); /* the ID workers' nexts first, on the same terms */
    /* every operation first (a callback may free other handles: look for
     * the next one afresh each time) */
    for (;;) {
        dlock_async_object *o = c->objs;
        while (o && !o->op.type) o = o->next;
        if (!o) break;
        char w[120];
        finish_fmt(o, DLOCK_ECANCELED, "the client was freed while an operation on %s was pending",
                   who(o, w, sizeof w));
    }
    while (c->objs) object_free(c->objs);
    while (c->osettle) {
        oreq *rq = c->osettle;
        c->osettle = rq->next;
        req_drop(rq);
    }
}
