/* Redis Cluster: keys go to the master that owns their hash slot (CRC16 of
 * the key, or of its {hash tag}, mod 16384). The slot map comes from CLUSTER
 * SLOTS; MOVED updates it, ASK redirects one command (with ASKING), and
 * TRYAGAIN (a multi-key script during a migration) is retried shortly. Every
 * key of one lock carries the lock's braces, so one lock lives in one slot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topology.h"


struct dl_cluster {
    pthread_mutex_t mu;           /* guards slots, nodes and the refresh time */
    dl_node *slots[DL_SLOTS];     /* NULL: unknown */
    int64_t refreshed_ms;
    int stale;                    /* a MOVED was seen: refresh the whole map */
};

int dl_check_cluster_name(const dlock_client *c, const char *name, size_t len, dl_err *err) {
    if (!c->cluster) return DLOCK_OK;
    int one = dl_name_keys_one_slot(name, len);
    if (one < 0) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    if (one) return DLOCK_OK;
    char nm[80];
    return dl_seterr(err, DLOCK_EINVAL,
                     "lock name '%s' cannot be used on a Redis Cluster: its keys would hash to "
                     "different slots (with '{' or '}' in it, a name needs a non-empty hash tag "
                     "such as 'order{42}')",
                     dl_name_msg(name, len, nm, sizeof nm));
}

/* Redisson's latch scripts name the channel among their KEYS, so a cluster
 * answers CROSSSLOT to them as to dlock's: such a latch name works on
 * neither client there. */
int dl_check_cluster_latch(const dlock_client *c, const char *name, size_t len,
                           const char *channel, size_t channel_len, dl_err *err) {
    if (!c->cluster) return DLOCK_OK;
    unsigned ks = dl_key_slot(name, len), cs = dl_key_slot(channel, channel_len);
    if (ks == cs) return DLOCK_OK;
    char nm[80];
    return dl_seterr(err, DLOCK_EINVAL,
                     "latch name '%s' cannot be used on a Redis Cluster: its channel "
                     DL_LATCH_CHANNEL_PREFIX "{name} (braces for every name, as Redisson's) "
                     "hashes to slot %u, the key to slot %u; use a name without '{'",
                     dl_name_msg(name, len, nm, sizeof nm), cs, ks);
}

int dl_cluster_new(dl_cluster **out, dl_err *err) {
    dl_cluster *k = calloc(1, sizeof *k);
    if (!k) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&k->mu, NULL);
    *out = k;
    return DLOCK_OK;
}

void dl_cluster_free(dl_cluster *k) {
    if (!k) return;
    pthread_mutex_destroy(&k->mu);
    free(k);
}

/* The node for host:port, created if new. Called with k->mu held. */
static dl_node *node_for(dlock_client *c, const char *host, int port) {
    for (size_t i = 0; i < c->nnodes; i++) {
        dl_node *n = c->nodes[i];
        if (n->ep.port == port && n->ep.host && !strcmp(n->ep.host, host)) return n;
    }
    if (c->nnodes >= DL_MAX_NODES) return NULL;
    /* a new master: same credentials and db as the seeds */
    dl_endpoint ep;
    if (dl_endpoint_copy(&ep, &c->nodes[0]->ep) != DLOCK_OK) return NULL;
    free(ep.host);
    ep.host = strdup(host);
    ep.port = port;
    dl_node *n = ep.host ? dl_node_new(&ep, c) : NULL;
    dl_endpoint_clear(&ep);
    if (n) c->nodes[c->nnodes++] = n;
    return n;
}

/* Reads CLUSTER SLOTS from any node that answers and rebuilds the map. */
int dl_cluster_refresh(dlock_client *c, dl_err *err) {
    dl_cluster *k = c->cluster;
    dl_err last = {0};
    pthread_mutex_lock(&k->mu);
    size_t nn = c->nnodes;
    pthread_mutex_unlock(&k->mu);
    for (size_t i = 0; i < nn; i++) {
        dl_conn *conn = NULL;
        redisReply *r = NULL;
        int64_t deadline = dl_cmd_deadline(c);
        const char *argv[2] = {"CLUSTER", "SLOTS"};
        size_t lens[2] = {7, 5};
        if (dl_node_get(c->nodes[i], deadline, &conn, &last) != DLOCK_OK) continue;
        int rc = dl_conn_command(conn, deadline, 2, argv, lens, &r, &last);
        dl_node_put(conn);
        if (rc) continue;
        if (r->type != REDIS_REPLY_ARRAY) {
            if (r->type == REDIS_REPLY_ERROR) dl_reply_error(r, "CLUSTER SLOTS", &last);
            freeReplyObject(r);
            continue;
        }
        pthread_mutex_lock(&k->mu);
        memset(k->slots, 0, sizeof k->slots);
        for (size_t j = 0; j < r->elements; j++) {
            redisReply *e = r->element[j];
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) continue;
            redisReply *m = e->element[2];
            long long lo, hi, port;
            if (dl_reply_int(e->element[0], &lo) || dl_reply_int(e->element[1], &hi) ||
                m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
                m->element[0]->type != REDIS_REPLY_STRING || dl_reply_int(m->element[1], &port))
                continue;
            /* an empty host means "the address you reached me on" */
            const char *host = m->element[0]->len ? m->element[0]->str : c->nodes[i]->ep.host;
            dl_node *n = node_for(c, host, (int)port);
            for (long long s = lo; n && s <= hi && s < DL_SLOTS; s++) k->slots[s] = n;
        }
        k->refreshed_ms = dl_now_ms();
        k->stale = 0;
        pthread_mutex_unlock(&k->mu);
        freeReplyObject(r);
        return DLOCK_OK;
    }
    return dl_seterr(err, last.code == DLOCK_EAUTH ? DLOCK_EAUTH : DLOCK_EIO,
                     "no cluster node answered CLUSTER SLOTS (%s)",
                     last.msg[0] ? last.msg : "no node reachable");
}

int dl_cluster_version_check(const char *info, dl_err *err) {
    static const char field[] = "redis_version:";
    const char *v = info ? strstr(info, field) : NULL;
    if (!v) return DLOCK_OK;
    v += sizeof field - 1;
    size_t n = strcspn(v, "\r\n");
    unsigned long major = 0;
    size_t i = 0;
    for (; i < n && v[i] >= '0' && v[i] <= '9' && major < 1000; i++)
        major = major * 10 + (unsigned long)(v[i] - '0');
    if (i == 0) return DLOCK_OK; /* not a number: cannot be judged */
    if (major >= 7) return DLOCK_OK;
    return dl_seterr(err, DLOCK_ENOTSUP,
                     "Redis Cluster needs Redis 7 or later (sharded pub/sub: SSUBSCRIBE, "
                     "SPUBLISH); the server runs %.*s",
                     (int)(n > 40 ? 40 : n), v);
}

int dl_cluster_check_server(dlock_client *c, dl_err *err) {
    dl_err last = {0};
    size_t nn = dl_node_count(c);
    for (size_t i = 0; i < nn; i++) {
        dl_conn *conn = NULL;
        redisReply *r = NULL;
        int64_t deadline = dl_cmd_deadline(c);
        const char *argv[2] = {"INFO", "server"};
        size_t lens[2] = {4, 6};
        if (dl_node_get(c->nodes[i], deadline, &conn, &last) != DLOCK_OK) continue;
        int rc = dl_conn_command(conn, deadline, 2, argv, lens, &r, &last);
        dl_node_put(conn);
        if (rc) continue;
        if (r->type == REDIS_REPLY_ERROR) {
            rc = dl_reply_error(r, "INFO server", err);
            freeReplyObject(r);
            return rc;
        }
        rc = dl_cluster_version_check(r->type == REDIS_REPLY_STRING ? r->str : NULL, err);
        freeReplyObject(r);
        return rc;
    }
    return dl_seterr(err, last.code ? last.code : DLOCK_EIO,
                     "no cluster node answered INFO server (%s)",
                     last.msg[0] ? last.msg : "no node reachable");
}

size_t dl_node_count(dlock_client *c) {
    if (!c->cluster) return c->nnodes;
    pthread_mutex_lock(&c->cluster->mu);
    size_t n = c->nnodes;
    pthread_mutex_unlock(&c->cluster->mu);
    return n;
}

dl_node *dl_cluster_route(dlock_client *c, unsigned slot) {
    dl_cluster *k = c->cluster;
    pthread_mutex_lock(&k->mu);
    dl_node *n = k->slots[slot];
    int stale = k->stale;
    pthread_mutex_unlock(&k->mu);
    if (!n || stale) {
        dl_err ignored;
        dl_cluster_refresh(c, &ignored);
        pthread_mutex_lock(&k->mu);
        if (k->slots[slot]) n = k->slots[slot];
        pthread_mutex_unlock(&k->mu);
    }
    return n ? n : c->nodes[0];
}

/* Parses "MOVED 3999 127.0.0.1:6381" / "ASK ...": 1 on success. */
static int parse_redirect(const redisReply *r, const char *word, unsigned *slot, char *host,
                          size_t hostlen, int *port) {
    size_t wl = strlen(word);
    if (r->type != REDIS_REPLY_ERROR || r->len <= wl || strncmp(r->str, word, wl) ||
        r->str[wl] != ' ')
        return 0;
    char addr[300];
    unsigned s;
    if (sscanf(r->str + wl + 1, "%u %299s", &s, addr) != 2 || s >= DL_SLOTS) return 0;
    char *colon = strrchr(addr, ':');
    if (!colon) return 0;
    *colon = '\0';
    snprintf(host, hostlen, "%s", addr);
    *port = atoi(colon + 1);
    *slot = s;
    return *port > 0;
}

dl_node *dl_cluster_redirect(dlock_client *c, const redisReply *r, int *ask) {
    unsigned slot;
    char host[300];
    int port;
    *ask = 0;
    if (!c->cluster || !r || r->type != REDIS_REPLY_ERROR) return NULL;
    dl_cluster *k = c->cluster;
    if (parse_redirect(r, "MOVED", &slot, host, sizeof host, &port)) {
        pthread_mutex_lock(&k->mu);
        dl_node *n = node_for(c, host, port);
        if (n) k->slots[slot] = n;
        k->stale = 1; /* more slots have probably moved with it */
        pthread_mutex_unlock(&k->mu);
        return n;
    }
    if (parse_redirect(r, "ASK", &slot, host, sizeof host, &port)) {
        *ask = 1;
        pthread_mutex_lock(&k->mu);
        dl_node *n = node_for(c, host, port);
        pthread_mutex_unlock(&k->mu);
        return n;
    }
    return NULL;
}
