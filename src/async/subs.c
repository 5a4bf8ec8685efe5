/* The subscription service of an async client: one subscribed connection
 * for all of its waiters, and a table from channel to the waiters on it.
 * A channel's first waiter sends SUBSCRIBE, its last UNSUBSCRIBE (without
 * waiting for the confirmation: one that comes for a channel no longer in
 * the table, or a message, is dropped). Each SUBSCRIBE / UNSUBSCRIBE is a
 * request of the pipe, answered by its confirmation in order; messages are
 * the pipe's pushes. A waiter is told when its channel is confirmed (from
 * then on, a release is not missed: it attempts again) and at each message.
 * When the connection fails every waiter leaves the table and is told. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "async.h"

typedef struct dl_achan {
    struct dl_achan *next;     /* in its bucket */
    dl_awaiter *waiters;
    int confirmed;
    size_t len;
    char name[];
} dl_achan;

/* A SUBSCRIBE or UNSUBSCRIBE in flight: its confirmation is read and
 * dropped here, the table is what counts. */
typedef struct sreq {
    dl_areq q;
    dl_asubs *s;
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

static void confirmation(dl_areq *q, redisReply *r, const dl_err *err) {
    (void)r, (void)err;
    free(q);
}

static int send_cmd(dl_asubs *s, const char *cmd, const char *name, size_t len, dl_err *err) {
    sreq *q = calloc(1, sizeof *q);
    if (!q) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    q->q.done = confirmation;
    q->s = s;
    const char *argv[2] = {cmd, name};
    size_t lens[2] = {strlen(cmd), len};
    int rc = dl_apipe_command(&s->pipe, &q->q, 2, argv, lens, err);
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
    dl_asubs *s = (dl_asubs *)((char *)p - offsetof(dl_asubs, pipe));
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return 0;
    const char *kind = r->element[0]->str;
    int message = !strcasecmp(kind, "message") || !strcasecmp(kind, "smessage");
    int subscribed = !strcasecmp(kind, "subscribe") || !strcasecmp(kind, "ssubscribe");
    if (!message && !subscribed) return 0; /* the UNSUBSCRIBE request's reply */
    dl_achan *ch = s->nbuckets ? *slot_of(s, r->element[1]->str, r->element[1]->len) : NULL;
    if (ch && subscribed) ch->confirmed = 1;
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
    dl_asubs *s = (dl_asubs *)((char *)p - offsetof(dl_asubs, pipe));
    for (;;) {
        dl_achan *ch = NULL;
        for (size_t i = 0; i < s->nbuckets && !ch; i++) ch = s->buckets[i];
        if (!ch) break;
        dl_awaiter *w = ch->waiters;
        dl_asubs_leave(s, w); /* frees ch with its last waiter */
        w->lost(w, err);
    }
}

void dl_asubs_init(dl_asubs *s, dl_aclient *cl) {
    memset(s, 0, sizeof *s);
    dl_apipe_init(&s->pipe, cl, 1);
    s->pipe.push = push;
    s->pipe.down = down;
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
        int rc = send_cmd(s, "SUBSCRIBE", channel, len, err);
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
    if (dl_apipe_opened(&s->pipe)) {
        dl_err ignored;
        /* not sent (memory): the channel stays subscribed on the server
         * and its messages are dropped here; the waiter it was for has
         * left the registry or holds the lock */
        send_cmd(s, "UNSUBSCRIBE", ch->name, ch->len, &ignored);
    }
    free(ch);
}

void dl_asubs_free(dl_asubs *s) {
    free(s->buckets);
    s->buckets = NULL;
    s->nbuckets = s->nchans = 0;
}
