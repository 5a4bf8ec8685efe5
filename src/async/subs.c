/* The subscription service of an async client: one subscribed connection
 * for all of its waiters (on a Redis Cluster, one per master that owns a
 * waiter's channel: SSUBSCRIBE, sharded pub/sub, as the blocking client's
 * pubsub.c), and a table from channel to the waiters on it.
 * A channel's first waiter sends SUBSCRIBE, its last UNSUBSCRIBE (without
 * waiting for the confirmation: one that comes for a channel no longer in
 * the table, or a message, is dropped). Each SUBSCRIBE / UNSUBSCRIBE is a
 * request of the pipe, answered by its confirmation in order; messages are
 * the pipe's pushes. A waiter is told when its channel is confirmed (from
 * then on, a release is not missed: it attempts again) and at each message.
 * When a connection fails every waiter of its channels leaves the table
 * and is told.
 *
 * A cluster slot migrated under a channel: the old master drops the
 * subscription (a "sunsubscribe" push nobody asked for) or answers a new
 * SSUBSCRIBE with MOVED; either way the channel is subscribed again on the
 * master the map names then (a MOVED updates it), up to DL_ARESUB_MAX times
 * in a row. Meanwhile and beyond, its waiters are unconfirmed: they still
 * attempt at their backstop (DL_WAIT_RECHECK_MS), and once confirmed anew
 * attempt again, so a release is never missed for good. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "async.h"

#define DL_ARESUB_MAX 5

typedef struct dl_achan {
    struct dl_achan *next;     /* in its bucket */
    dl_awaiter *waiters;
    dl_apipe *on;              /* the subscribed pipe its subscription went on */
    int resubs;                /* subscribed again in a row (cluster) */
    int confirmed;
    size_t len;
    char name[];
} dl_achan;

/* A SUBSCRIBE or UNSUBSCRIBE in flight: its confirmation is read and
 * dropped here, the table is what counts. */
typedef struct sreq {
    dl_areq q;
    dl_asubs *s;
    int sub;                   /* a (S)SUBSCRIBE: its channel follows */
    size_t len;
    char name[];
} sreq;

static uint64_t hash(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static dl_achan **slot_of(dl_asubs *s, const char *name, size_t len) {
    dl_achan **pp = &s->buckets[hash(name, len) & (s->nbuckets - 1)];
    while (*pp && !((*pp)->len == len && !memcmp((*pp)->name, name, len))) pp = &(*pp)->next;
    return pp;
}

static int grow(dl_asubs *s) {
    size_t nb = s->nbuckets ? s->nbuckets * 2 : 64;
    dl_achan **b = calloc(nb, sizeof *b);
    if (!b) return DLOCK_ENOMEM;
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (dl_achan *ch = s->buckets[i], *next; ch; ch = next) {
            next = ch->next;
            size_t k = hash(ch->name, ch->len) & (nb - 1);
            ch->next = b[k];
            b[k] = ch;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = nb;
    return DLOCK_OK;
}

static int send_cmd(dl_asubs *s, dl_apipe *p, int sub, const char *name, size_t len,
                    dl_err *err);

/* Subscribes ch again where the map says now (its slot moved), unless it
 * did so DL_ARESUB_MAX times in a row: its waiters then rely on their
 * backstop until they leave. */
static void resubscribe(dl_asubs *s, dl_achan *ch) {
    dl_aclient *c = s->pipe.cl;
    ch->confirmed = 0;
    if (ch->resubs++ >= DL_ARESUB_MAX || c->freeing) return;
    dl_err ignored;
    dl_apipe *to = dl_asub_route(c, ch->name, ch->len);
    if (!send_cmd(s, to, 1, ch->name, ch->len, &ignored)) ch->on = to;
}

static void confirmation(dl_areq *q, redisReply *r, const dl_err *err) {
    (void)err;
    sreq *sq = (sreq *)q;
    dl_asubs *s = sq->s;
    /* an SSUBSCRIBE answered MOVED (the slot moved): again, elsewhere */
    if (sq->sub && r && r->type == REDIS_REPLY_ERROR && s->nbuckets) {
        dl_acluster_moved(s->pipe.cl, r);
        dl_achan *ch = *slot_of(s, sq->name, sq->len);
        if (ch && !ch->confirmed && ch->on == q->pipe) resubscribe(s, ch);
    }
    free(q);
}

static int send_cmd(dl_asubs *s, dl_apipe *p, int sub, const char *name, size_t len,
                    dl_err *err) {
    int sharded = s->pipe.cl->cluster != NULL;
    sreq *q = calloc(1, sizeof *q + (sub ? len : 0));
    if (!q) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    q->q.done = confirmation;
    q->s = s;
    q->sub = sub;
    if (sub) {
        memcpy(q->name, name, len);
        q->len = len;
    }
    const char *cmd = sub ? (sharded ? "SSUBSCRIBE" : "SUBSCRIBE")
                          : (sharded ? "SUNSUBSCRIBE" : "UNSUBSCRIBE");
    const char *argv[2] = {cmd, name};
    size_t lens[2] = {strlen(cmd), len};
    int rc = dl_apipe_command(p, &q->q, 2, argv, lens, err);
    if (rc) free(q);
    return rc;
}

/* Tells w of a confirmation (subscribed) or of r, a message. */
static void tell(dl_awaiter *w, int subscribed, const redisReply *r) {
    if (!subscribed && w->message && r->elements >= 3) w->message(w, r->element[2]);
    else w->wake(w, subscribed);
}

/* A push: a message, or a confirmation. A subscribe confirmation is a
 * reply (the SUBSCRIBE request's) and also marks its channel confirmed. */
static int push(dl_apipe *p, redisReply *r) {
    dl_asubs *s = &p->cl->subs;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return 0;
    const char *kind = r->element[0]->str;
    int message = !strcasecmp(kind, "message") || !strcasecmp(kind, "smessage");
    int subscribed = !strcasecmp(kind, "subscribe") || !strcasecmp(kind, "ssubscribe");
    dl_achan *ch = s->nbuckets ? *slot_of(s, r->element[1]->str, r->element[1]->len) : NULL;
    if (!message && !subscribed) {
        /* an SUNSUBSCRIBE of a channel still in the table, confirmed on
         * this pipe, was not asked for (a left channel is out of the table,
         * one joined again is not confirmed yet): the slot moved away */
        if (ch && ch->on == p && ch->confirmed && !strcasecmp(kind, "sunsubscribe")) {
            resubscribe(s, ch);
            return 1;
        }
        return 0; /* the UNSUBSCRIBE request's reply */
    }
    /* a confirmation from a pipe the channel left (resubscribed) is not one */
    if (ch && subscribed && ch->on != p) ch = NULL;
    if (ch && subscribed) {
        ch->confirmed = 1;
        ch->resubs = 0;
    }
    if (ch) {
        /* a waiter told may leave (and free its channel) or join: walk a
         * snapshot of the list by waking from the head until each is told */
        size_t n = 0;
        for (dl_awaiter *w = ch->waiters; w; w = w->next) n++;
        dl_awaiter **ws = malloc(n * sizeof *ws + ch->len + 1);
        if (ws) {
            size_t i = 0;
            for (dl_awaiter *w = ch->waiters; w; w = w->next) ws[i++] = w;
            /* the channel may be freed by a wake: look it up by a copy */
            char *name = (char *)(ws + n);
            size_t len = ch->len;
            memcpy(name, ch->name, len);
            for (i = 0; i < n; i++) {
                dl_achan *now = *slot_of(s, name, len);
                if (!now) break;
                int on = 0;
                for (dl_awaiter *w = now->waiters; w; w = w->next) on |= w == ws[i];
                if (on) tell(ws[i], subscribed, r);
            }
            free(ws);
        } else if (ch->waiters) {
            tell(ch->waiters, subscribed, r);
        }
    }
    /* a subscribe confirmation is also its request's reply */
    return !subscribed;
}

/* The subscribed connection failed: every channel is gone from the
 * server's side, so every waiter leaves and is told. */
static void down(dl_apipe *p, const dl_err *err) {
    dl_asubs *s = &p->cl->subs;
    for (;;) {
        dl_achan *ch = NULL;
        for (size_t i = 0; i < s->nbuckets && !ch; i++)
            for (dl_achan *x = s->buckets[i]; x && !ch; x = x->next)
                if (x->on == p) ch = x;
        if (!ch) break;
        dl_awaiter *w = ch->waiters;
        dl_asubs_leave(s, w); /* frees ch with its last waiter */
        w->lost(w, err);
    }
}

void dl_asubs_pipe_init(dl_apipe *p) {
    p->push = push;
    p->down = down;
}

void dl_asubs_init(dl_asubs *s, dl_aclient *cl, int slot) {
    memset(s, 0, sizeof *s);
    dl_apipe_init(&s->pipe, cl, slot);
    dl_asubs_pipe_init(&s->pipe);
}

int dl_asubs_join(dl_asubs *s, dl_awaiter *w, const char *channel, size_t len, dl_err *err) {
    if (!s->nbuckets || s->nchans >= s->nbuckets) {
        if (grow(s)) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    }
    dl_achan **pp = slot_of(s, channel, len);
    dl_achan *ch = *pp;
    if (!ch) {
        ch = calloc(1, sizeof *ch + len + 1);
        if (!ch) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        memcpy(ch->name, channel, len);
        ch->len = len;
        ch->on = dl_asub_route(s->pipe.cl, channel, len);
        int rc = send_cmd(s, ch->on, 1, channel, len, err);
        if (rc) {
            free(ch);
            return rc;
        }
        *pp = ch;
        s->nchans++;
    }
    w->chan = ch;
    w->next = ch->waiters;
    ch->waiters = w;
    return DLOCK_OK;
}

int dl_asubs_subscribed(const dl_awaiter *w) { return w->chan && w->chan->confirmed; }

void dl_asubs_leave(dl_asubs *s, dl_awaiter *w) {
    dl_achan *ch = w->chan;
    if (!ch) return;
    for (dl_awaiter **pp = &ch->waiters; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    }
    w->chan = NULL;
    w->next = NULL;
    if (ch->waiters) return;
    dl_achan **pp = slot_of(s, ch->name, ch->len);
    *pp = ch->next;
    s->nchans--;
    if (dl_apipe_opened(ch->on)) {
        dl_err ignored;
        /* not sent (memory): the channel stays subscribed on the server
         * and its messages are dropped here; the waiter it was for has
         * left the registry or holds the lock */
        send_cmd(s, ch->on, 0, ch->name, ch->len, &ignored);
    }
    free(ch);
}

void dl_asubs_free(dl_asubs *s) {
    free(s->buckets);
    s->buckets = NULL;
    s->nbuckets = s->nchans = 0;
}
