/* The async client on a Redis Cluster: a pipe per master node, made as the
 * seeds, CLUSTER SLOTS and redirects name them; a request goes to the pipe
 * of its key's slot (one lock's keys share the slot: the names are checked
 * when a handle is made). The slot map is read with CLUSTER SLOTS on a
 * pipe, asynchronously, when a request finds its slot unknown or a MOVED
 * made the map stale; until then a request goes to a node connected
 * already (else the seeds in turn, a failed refresh moving on to the
 * next), whose MOVED sends it on.
 *
 * Redirects are followed under the owners' feet: a cluster pipe keeps each
 * request's bytes (dl_areq.raw), and an error reply MOVED (the map's slot
 * set, the request sent to the named node), ASK (ASKING, then the request,
 * on the named node) or TRYAGAIN (the request sent again on the same node
 * after DL_ATRYAGAIN_MS, with ASKING again if it went so: a multi-key
 * request in a slot being migrated, whose keys are not all on one side,
 * meets it until the migration ends) never reaches the request's done; after
 * DL_AREDIRECTS_MAX of them the request ends as a connection failure
 * (DLOCK_EIO: its owner treats the outcome as unknown, which is safe: a
 * redirected request did not run). The same bytes are right on any node:
 * a script sent by its SHA1 that the new node lacks answers NOSCRIPT, and
 * its owner sends its text (through the map, now updated).
 *
 * The first CLUSTER SLOTS goes with INFO server before it: a node older
 * than Redis 7 (no SPUBLISH, which the scripts call in cluster mode) gates
 * every pipe with DLOCK_ENOTSUP (dl_cluster_version_check's message). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "async.h"

#define DL_AREDIRECTS_MAX 5
#define DL_ATRYAGAIN_MS 25

typedef struct dl_anode {
    dl_endpoint ep;
    dl_apipe pipe;             /* its requests */
    dl_apipe sub;              /* its subscribed connection (subs.c) */
} dl_anode;

struct dl_acluster {
    dl_aclient *c;
    dl_endpoint seed;          /* the first seed: credentials for new nodes */
    dl_anode **nodes;          /* every node met, never removed */
    size_t nnodes;
    uint32_t *map;             /* DL_SLOTS: node index + 1, 0 unknown */
    int stale;                 /* a refresh is wanted (start, MOVED) */
    int refreshing;            /* CLUSTER SLOTS is out (slots_q) */
    int checked, checking;     /* INFO server answered / out (info_q) */
    dl_err gate;               /* the version refused: every pipe's gate */
    dl_areq info_q, slots_q;
    size_t turn;               /* the node a refresh tries when none is open */
    void (*up)(dl_apipe *p);   /* every node pipe's */
    void (*sub_init)(dl_apipe *p); /* every node's subscribed pipe's hooks */
    dl_areq *later;            /* TRYAGAIN: sent again at their deadline */
    dl_atimer later_t;
};

static int redirect(dl_apipe *p, dl_areq *q, const redisReply *r);
static void later_timer(dl_atimer *t);

/* The node of host:port (port 0 with host NULL: a copy of ep), made if new
 * with its pipe; NULL for want of memory. */
static dl_anode *node_for(dl_aclient *c, const char *host, int port, dl_err *err) {
    dl_acluster *k = c->cluster;
    for (size_t i = 0; i < k->nnodes; i++) {
        dl_anode *n = k->nodes[i];
        if (n->ep.port == port && n->ep.host && !strcmp(n->ep.host, host)) return n;
    }
    if (k->nnodes >= DL_SLOTS) {
        dl_seterr(err, DLOCK_EPROTO, "the cluster names too many nodes");
        return NULL;
    }
    dl_anode *n = calloc(1, sizeof *n);
    dl_anode **grown = realloc(k->nodes, (k->nnodes + 1) * sizeof *grown);
    if (grown) k->nodes = grown;
    /* a new master: the seeds' credentials, database and options */
    if (!n || !grown || dl_endpoint_copy(&n->ep, &k->seed)) {
        free(n);
        dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    char *h = strdup(host);
    int slot = h ? dl_aloop_slot_new(&c->loop, &n->pipe) : -1;
    int sub = slot >= 0 ? dl_aloop_slot_new(&c->loop, &n->sub) : -1;
    /* the pipes' timers' places in the heap beside the handles' */
    if (sub < 0 || dl_aloop_reserve(&c->loop, c->nlocks + c->nobjs + 2 + (size_t)c->loop.nslots)) {
        if (slot >= 0) dl_aloop_slot_free(&c->loop, slot);
        if (sub >= 0) dl_aloop_slot_free(&c->loop, sub);
        free(h);
        dl_endpoint_clear(&n->ep);
        free(n);
        dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    free(n->ep.host);
    n->ep.host = h;
    n->ep.port = port;
    dl_apipe_init(&n->pipe, c, slot);
    n->pipe.ep = &n->ep;
    n->pipe.sharded = 1;
    n->pipe.keep = 1;
    n->pipe.redirect = redirect;
    n->pipe.gate = &k->gate;
    n->pipe.up = k->up;
    dl_apipe_init(&n->sub, c, sub);
    n->sub.ep = &n->ep;
    n->sub.gate = &k->gate;
    k->sub_init(&n->sub);
    k->nodes[k->nnodes++] = n;
    return n;
}

int dl_acluster_new(dl_aclient *c, dl_target *t, void (*up)(dl_apipe *p),
                    void (*sub_init)(dl_apipe *p), dl_err *err) {
    dl_acluster *k = calloc(1, sizeof *k);
    if (!k) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    c->cluster = k;
    k->c = c;
    k->up = up;
    k->sub_init = sub_init;
    k->later_t.fn = later_timer;
    k->later_t.arg = c;
    k->map = calloc(DL_SLOTS, sizeof *k->map);
    if (!k->map) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    if (dl_endpoint_copy(&k->seed, &t->eps[0])) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < t->neps; i++) {
        if (!t->eps[i].host)
            return dl_seterr(err, DLOCK_ENOTSUP,
                             "the async API reaches Redis Cluster seeds by host:port only");
        if (!node_for(c, t->eps[i].host, t->eps[i].port, err)) return err->code;
    }
    k->stale = 1;
    return DLOCK_OK;
}

void dl_acluster_free(dl_aclient *c) {
    dl_acluster *k = c->cluster;
    if (!k) return;
    for (size_t i = 0; i < k->nnodes; i++) {
        dl_endpoint_clear(&k->nodes[i]->ep);
        free(k->nodes[i]);
    }
    free(k->nodes);
    free(k->map);
    dl_endpoint_clear(&k->seed);
    free(k);
    c->cluster = NULL;
}

size_t dl_apipe_count(const dl_aclient *c) { return c->cluster ? c->cluster->nnodes : 1; }

dl_apipe *dl_apipe_nth(dl_aclient *c, size_t i) {
    if (!c->cluster) return i ? NULL : &c->cmd;
    return i < c->cluster->nnodes ? &c->cluster->nodes[i]->pipe : NULL;
}

dl_apipe *dl_asubpipe_nth(dl_aclient *c, size_t i) {
    if (!c->cluster) return i ? NULL : &c->subs.pipe;
    return i < c->cluster->nnodes ? &c->cluster->nodes[i]->sub : NULL;
}

/* ---- the slot map ---- */

static void slots_done(dl_areq *q, redisReply *r, const dl_err *err);
static void info_done(dl_areq *q, redisReply *r, const dl_err *err);

/* A pipe open already, else the next node's in turn (a refresh that
 * failed moves on to the next). */
static dl_apipe *any_pipe(dl_acluster *k) {
    for (size_t i = 0; i < k->nnodes; i++)
        if (k->nodes[i]->pipe.conn && k->nodes[i]->pipe.ready) return &k->nodes[i]->pipe;
    return &k->nodes[k->turn % k->nnodes]->pipe;
}

/* CLUSTER SLOTS (INFO server before the first) on a pipe, unless one is
 * out; a failure leaves the map as it is, still stale. */
static void refresh(dl_aclient *c) {
    dl_acluster *k = c->cluster;
    if (k->refreshing || k->gate.code || c->freeing) return;
    dl_apipe *p = any_pipe(k);
    dl_err err;
    /* marked first: opening p runs its up hook, whose requests route */
    k->refreshing = 1;
    if (!k->checked && !k->checking) {
        const char *argv[2] = {"INFO", "server"};
        size_t lens[2] = {4, 6};
        k->info_q.done = info_done;
        k->checking = 1;
        if (dl_apipe_command(p, &k->info_q, 2, argv, lens, &err)) {
            k->checking = k->refreshing = 0;
            k->turn++;
            return;
        }
    }
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    size_t lens[2] = {7, 5};
    k->slots_q.done = slots_done;
    if (dl_apipe_command(p, &k->slots_q, 2, argv, lens, &err)) {
        k->refreshing = 0;
        k->turn++;
    }
}

static dl_aclient *client_of_q(dl_areq *q, size_t off) {
    dl_acluster *k = (dl_acluster *)((char *)q - off);
    return k->c;
}

static void info_done(dl_areq *q, redisReply *r, const dl_err *err) {
    (void)err;
    dl_aclient *c = client_of_q(q, offsetof(dl_acluster, info_q));
    dl_acluster *k = c->cluster;
    k->checking = 0;
    if (!r || r->type != REDIS_REPLY_STRING) return; /* asked again with the next refresh */
    k->checked = 1;
    dl_err e = {0};
    if (dl_cluster_version_check(r->str, &e)) {
        k->gate = e;
        snprintf(c->errmsg, sizeof c->errmsg, "%s", e.msg);
        /* what is queued behind ends with it (it may have run: a script
         * error at its SPUBLISH, nothing held by it) */
        for (size_t i = 0; i < k->nnodes; i++) dl_apipe_fail(&k->nodes[i]->pipe, &e);
    }
}

static void slots_done(dl_areq *q, redisReply *r, const dl_err *err) {
    (void)err;
    dl_aclient *c = client_of_q(q, offsetof(dl_acluster, slots_q));
    dl_acluster *k = c->cluster;
    k->refreshing = 0;
    if (!r || r->type != REDIS_REPLY_ARRAY) k->turn++; /* another node next time */
    if (!r || r->type != REDIS_REPLY_ARRAY || c->freeing) return;
    dl_apipe *from = q->pipe;
    const char *from_host = from && from->ep ? from->ep->host : NULL;
    memset(k->map, 0, DL_SLOTS * sizeof *k->map);
    for (size_t j = 0; j < r->elements; j++) {
        redisReply *e = r->element[j];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) continue;
        redisReply *m = e->element[2];
        long long lo, hi, port;
        if (dl_reply_int(e->element[0], &lo) || dl_reply_int(e->element[1], &hi) ||
            m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            m->element[0]->type != REDIS_REPLY_STRING || dl_reply_int(m->element[1], &port) ||
            lo < 0 || port <= 0 || port > 65535)
            continue;
        /* an empty host means "the address you reached me on" */
        const char *host = m->element[0]->len ? m->element[0]->str : from_host;
        dl_err ne;
        dl_anode *n = host ? node_for(c, host, (int)port, &ne) : NULL;
        if (!n) continue; /* its slots unknown: their requests go to a seed */
        size_t idx = 0;
        while (k->nodes[idx] != n) idx++;
        for (long long s = lo; s <= hi && s < DL_SLOTS; s++) k->map[s] = (uint32_t)(idx + 1);
    }
    k->stale = 0;
}

dl_apipe *dl_aroute(dl_aclient *c, const char *key, size_t len) {
    dl_acluster *k = c->cluster;
    if (!k) return &c->cmd;
    unsigned s = dl_key_slot(key, len);
    if (k->stale || !k->map[s]) refresh(c);
    uint32_t n = k->map[s];
    return n && n <= k->nnodes ? &k->nodes[n - 1]->pipe : any_pipe(k);
}

dl_apipe *dl_asub_route(dl_aclient *c, const char *chan, size_t len) {
    dl_acluster *k = c->cluster;
    if (!k) return &c->subs.pipe;
    dl_apipe *p = dl_aroute(c, chan, len);
    return &((dl_anode *)((char *)p - offsetof(dl_anode, pipe)))->sub;
}

/* ---- redirects ---- */

/* Parses "MOVED 3999 127.0.0.1:6381" / "ASK ...": 1 on success. */
static int parse_redirect(const redisReply *r, const char *word, unsigned *slot, char *host,
                          size_t hostlen, int *port) {
    size_t wl = strlen(word);
    if (r->len <= wl || strncmp(r->str, word, wl) || r->str[wl] != ' ') return 0;
    char addr[300];
    unsigned s;
    if (sscanf(r->str + wl + 1, "%u %299s", &s, addr) != 2 || s >= DL_SLOTS) return 0;
    char *colon = strrchr(addr, ':');
    if (!colon) return 0;
    *colon = '\0';
    snprintf(host, hostlen, "%s", addr);
    *port = atoi(colon + 1);
    *slot = s;
    return *port > 0 && *port <= 65535;
}

/* q ends as a connection failure would end it. */
static void end(dl_areq *q, const dl_err *err) {
    free(q->raw);
    q->raw = NULL;
    q->done(q, NULL, err);
}

static void later_timer(dl_atimer *t) {
    dl_aclient *c = t->arg;
    dl_acluster *k = c->cluster;
    int64_t now = dl_now_ms();
    dl_areq **pp = &k->later;
    while (*pp) {
        dl_areq *q = *pp;
        if (q->deadline > now) {
            pp = &q->next;
            continue;
        }
        *pp = q->next;
        q->next = NULL;
        dl_err err;
        if (dl_apipe_resend(q->pipe, q, q->asked, &err)) end(q, &err);
        pp = &k->later; /* a done may have changed the list */
    }
    int64_t at = -1;
    for (dl_areq *q = k->later; q; q = q->next)
        if (at < 0 || q->deadline < at) at = q->deadline;
    if (at >= 0 && dl_atimer_arm(&c->loop, &k->later_t, at)) {
        /* no room for the timer: end them rather than strand them */
        dl_err err;
        dl_seterr(&err, DLOCK_ENOMEM, "out of memory arming a timer");
        while (k->later) {
            dl_areq *q = k->later;
            k->later = q->next;
            q->next = NULL;
            end(q, &err);
        }
    }
}

static int redirect(dl_apipe *p, dl_areq *q, const redisReply *r) {
    dl_aclient *c = p->cl;
    dl_acluster *k = c->cluster;
    unsigned slot;
    char host[300];
    int port, ask = 0;
    int moved = parse_redirect(r, "MOVED", &slot, host, sizeof host, &port);
    if (!moved) ask = parse_redirect(r, "ASK", &slot, host, sizeof host, &port);
    int again = !moved && !ask && r->len >= 8 && !strncmp(r->str, "TRYAGAIN", 8);
    if (!moved && !ask && !again) return 0;
    dl_err err;
    if (c->freeing) {
        dl_seterr(&err, DLOCK_ECANCELED, "the client was freed");
        end(q, &err);
        return 1;
    }
    if (++q->redirects > DL_AREDIRECTS_MAX) {
        dl_seterr(&err, DLOCK_EIO, "Redis Cluster: still redirected after %d redirections (%.80s)",
                  DL_AREDIRECTS_MAX, r->str);
        end(q, &err);
        return 1;
    }
    if (again) {
        /* a multi-key request in a slot being migrated: the same node
         * again after a pause (its deadline field holds the time meanwhile) */
        q->pipe = p;
        q->deadline = dl_now_ms() + DL_ATRYAGAIN_MS;
        q->next = k->later;
        k->later = q;
        if ((!k->later_t.idx || q->deadline < k->later_t.at) &&
            dl_atimer_arm(&c->loop, &k->later_t, q->deadline)) {
            k->later = q->next;
            q->next = NULL;
            dl_seterr(&err, DLOCK_ENOMEM, "out of memory arming a timer");
            end(q, &err);
        }
        return 1;
    }
    dl_anode *n = node_for(c, host, port, &err);
    if (!n) {
        end(q, &err);
        return 1;
    }
    if (moved) {
        size_t idx = 0;
        while (k->nodes[idx] != n) idx++;
        k->map[slot] = (uint32_t)(idx + 1);
        k->stale = 1; /* more slots have probably moved with it */
    }
    if (dl_apipe_resend(&n->pipe, q, ask, &err)) end(q, &err);
    if (moved) refresh(c);
    return 1;
}

void dl_acluster_moved(dl_aclient *c, const redisReply *r) {
    dl_acluster *k = c->cluster;
    unsigned slot;
    char host[300];
    int port;
    if (!k || !r || r->type != REDIS_REPLY_ERROR ||
        !parse_redirect(r, "MOVED", &slot, host, sizeof host, &port))
        return;
    dl_err err;
    dl_anode *n = node_for(c, host, port, &err);
    if (!n) return;
    size_t idx = 0;
    while (k->nodes[idx] != n) idx++;
    k->map[slot] = (uint32_t)(idx + 1);
    k->stale = 1;
    refresh(c);
}

void dl_acluster_end(dl_aclient *c, const dl_err *err) {
    dl_acluster *k = c->cluster;
    if (!k) return;
    dl_atimer_stop(&c->loop, &k->later_t);
    while (k->later) {
        dl_areq *q = k->later;
        k->later = q->next;
        q->next = NULL;
        end(q, err);
    }
}
