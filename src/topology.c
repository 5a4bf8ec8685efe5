/* How a Redis client reaches its servers: the URL's topology (one server,
 * a Sentinel-watched master, a Cluster, RedLock's independent masters)
 * opened and checked, a key routed to its node, and a command run there,
 * following a Cluster's redirections. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topology.h"

int dl_pool_get(dlock_client *c, int64_t deadline, dl_conn **out, dl_err *err) {
    if (c->unusable) return dl_seterr(err, DLOCK_EINVAL, "client failed to open; free it");
    return dl_node_get(c->nodes[0], deadline, out, err);
}

dl_node *dl_route(dlock_client *c, const char *key, size_t len) {
    if (c->cluster && key) return dl_cluster_route(c, dl_key_slot(key, len));
    return c->nodes[0];
}

int dl_pool_get_key(dlock_client *c, const char *key, size_t len, int64_t deadline,
                    dl_conn **out, dl_err *err) {
    if (c->unusable) return dl_seterr(err, DLOCK_EINVAL, "client failed to open; free it");
    return dl_node_get(dl_route(c, key, len), deadline, out, err);
}

void dl_pool_put(dlock_client *c, dl_conn *conn) {
    (void)c;
    dl_node_put(conn);
}

static int is_tryagain(const redisReply *r) {
    return r && r->type == REDIS_REPLY_ERROR && r->len >= 8 && !strncmp(r->str, "TRYAGAIN", 8);
}

int dl_follow_redirects(dlock_client *c, dl_node *from, int64_t deadline, dl_redirect_run run,
                        void *ctx, redisReply **out, dl_err *err) {
    int rc = DLOCK_OK;
    for (int hop = 0; c->cluster && *out && hop < 8; hop++) {
        int ask = 0;
        dl_node *to = NULL;
        if (is_tryagain(*out)) {
            dl_sleep_ms(5 << (hop < 4 ? hop : 4));
            to = from;
        } else if (!(to = dl_cluster_redirect(c, *out, &ask))) {
            break;
        }
        freeReplyObject(*out);
        *out = NULL;
        dl_conn *conn = NULL;
        if ((rc = dl_node_get(to, deadline, &conn, err)) != DLOCK_OK) break;
        rc = run(ctx, conn, ask, out, err);
        dl_node_put(conn);
        if (rc) break;
        from = to;
    }
    return rc;
}

typedef struct {
    int argc;
    const char **argv;
    const size_t *lens;
    int64_t deadline;
} command_ctx;

static int command_run(void *ctx, dl_conn *conn, int asking, redisReply **out, dl_err *err) {
    command_ctx *x = ctx;
    if (asking) {
        const char *a[1] = {"ASKING"};
        size_t al[1] = {6};
        redisReply *ok = NULL;
        int rc = dl_conn_command(conn, x->deadline, 1, a, al, &ok, err);
        if (ok) freeReplyObject(ok);
        if (rc) return rc;
    }
    return dl_conn_command(conn, x->deadline, x->argc, x->argv, x->lens, out, err);
}

int dl_client_command(dlock_client *c, int argc, const char **argv, const size_t *lens,
                      redisReply **out, dl_err *err) {
    command_ctx x = {argc, argv, lens, dl_cmd_deadline(c)};
    dl_conn *conn;
    /* the key, when there is one, is the first argument */
    int rc = argc > 1 ? dl_pool_get_key(c, argv[1], lens[1], x.deadline, &conn, err)
                      : dl_pool_get(c, x.deadline, &conn, err);
    if (rc) return rc;
    dl_node *from = conn->node;
    rc = command_run(&x, conn, 0, out, err);
    dl_pool_put(c, conn);
    if (!rc) rc = dl_follow_redirects(c, from, x.deadline, command_run, &x, out, err);
    return rc;
}

int dl_redis_ping(dlock_client *c, int64_t *rtt_us, dl_err *err) {
    const char *argv[] = {"PING"};
    size_t lens[] = {4};
    redisReply *r = NULL;
    int64_t t0 = dl_now_us();
    int rc = dl_client_command(c, 1, argv, lens, &r, err);
    int64_t t1 = dl_now_us();
    if (!rc && r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "PING", err);
    else if (!rc && !(r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG")))
        rc = dl_seterr(err, DLOCK_EPROTO, "PING: unexpected reply");
    if (r) freeReplyObject(r);
    if (!rc && rtt_us) *rtt_us = t1 - t0;
    return rc;
}

static char *dup_or_null(const char *s, int *oom) {
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *oom = 1;
    return d;
}

int dl_apply_credentials(dl_endpoint *ep, const dlock_options *o, dl_err *err) {
    int oom = 0;
    const char *pw = o->password;
    if (!pw && !ep->password) pw = getenv("DLOCK_PASSWORD");
    if (pw && *pw) {
        dl_endpoint tmp = {0};
        tmp.password = ep->password;
        dl_endpoint_clear(&tmp); /* wipes and frees the URL's password */
        ep->password = dup_or_null(pw, &oom);
    }
    if (o->username) {
        free(ep->user);
        ep->user = dup_or_null(o->username, &oom);
    }
    if (oom) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    if (ep->user && !ep->password)
        return dl_seterr(err, DLOCK_EINVAL, "a user name needs a password");
    return DLOCK_OK;
}

/* PINGs every node (redlock: a majority must answer; a cluster was checked
 * by reading its slot map). */
static int check_nodes(dlock_client *c, dl_err *err) {
    if (c->mode == DL_MODE_CLUSTER) return DLOCK_OK;
    size_t ok = 0;
    int first_rc = DLOCK_OK;
    dl_err first = {0};
    for (size_t i = 0; i < c->nnodes; i++) {
        const char *argv[] = {"PING"};
        size_t lens[] = {4};
        redisReply *r = NULL;
        dl_conn *conn = NULL;
        dl_err e = {0};
        int64_t deadline = dl_cmd_deadline(c);
        int rc = dl_node_get(c->nodes[i], deadline, &conn, &e);
        if (!rc) rc = dl_conn_command(conn, deadline, 1, argv, lens, &r, &e);
        if (!rc && r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "connect", &e);
        if (r) freeReplyObject(r);
        dl_node_put(conn);
        if (!rc) ok++;
        else if (!first_rc) {
            first_rc = rc;
            first = e;
        }
        if (rc == DLOCK_EAUTH || rc == DLOCK_EINVAL) break;
    }
    if (c->mode != DL_MODE_REDLOCK) {
        if (first_rc) *err = first;
        return first_rc;
    }
    if (first_rc == DLOCK_EAUTH || first_rc == DLOCK_EINVAL) {
        *err = first;
        return first_rc;
    }
    if (ok < c->quorum)
        return dl_seterr(err, DLOCK_ENOQUORUM, "no quorum: %zu of %zu nodes answered (%s)", ok,
                         c->nnodes, first.msg);
    return DLOCK_OK;
}

/* Gives every TLS endpoint the client's TLS context. */
static int setup_tls(dlock_client *c, const dlock_options *o, dl_err *err) {
    void *ctx = NULL;
    for (size_t i = 0; i < c->nnodes; i++) {
        dl_endpoint *ep = &c->nodes[i]->ep;
        if (!ep->tls) continue;
        if (c->mode != DL_MODE_SINGLE)
            return dl_seterr(err, DLOCK_ENOTSUP, "TLS is supported for single-server URLs only");
        if (!ctx) {
            int rc = dl_tls_ctx_new(o, &ctx, err);
            if (rc) return rc;
        } else {
            dl_tls_ctx_ref_ops.up(ctx);
        }
        ep->tls_ctx = ctx;
        ep->tls_ctx_ops = &dl_tls_ctx_ref_ops;
        if (o->tls_server_name && !(ep->sni = strdup(o->tls_server_name)))
            return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    }
    return DLOCK_OK;
}

int dl_redis_open(dlock_client *c, const char *url, const dlock_options *o, dl_err *err) {
    dl_target t;
    int rc = dl_target_parse(url, &t, err);
    if (rc) return rc;
    c->mode = t.mode;
    if (t.mode == DL_MODE_SENTINEL) {
        /* one node, the master; its address comes from the sentinels */
        dl_endpoint master = {0};
        master.db = t.db;
        master.password = t.password;
        t.password = NULL;
        rc = dl_sentinel_new(&t, &c->sentinel, err);
        if (!rc) rc = dl_apply_credentials(&master, o, err);
        if (!rc) {
            c->nodes = calloc(1, sizeof *c->nodes);
            if (!c->nodes || !(c->nodes[0] = dl_node_new(&master, c)))
                rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
            else
                c->nnodes = 1;
        }
        dl_endpoint_clear(&master);
        dl_target_clear(&t);
        if (rc) return rc;
        c->nodes[0]->sentinel = c->sentinel;
        rc = dl_sentinel_refresh(c->nodes[0], 1, err);
        if (rc) return rc;
    }
    if (c->mode != DL_MODE_SENTINEL) {
        /* a cluster's node list grows with its slot map: room for all */
        c->nodes = calloc(c->mode == DL_MODE_CLUSTER ? DL_MAX_NODES : t.neps, sizeof *c->nodes);
        if (!c->nodes) rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        for (size_t i = 0; !rc && i < t.neps; i++) {
            rc = dl_apply_credentials(&t.eps[i], o, err);
            if (!rc && !(c->nodes[i] = dl_node_new(&t.eps[i], c)))
                rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
            if (!rc) c->nnodes++;
        }
        dl_target_clear(&t);
        if (rc) return rc;
    }
    c->quorum = c->nnodes / 2 + 1;
    rc = setup_tls(c, o, err);
    if (rc) return rc;
    if (c->mode == DL_MODE_CLUSTER) {
        rc = dl_cluster_new(&c->cluster, err);
        if (!rc) rc = dl_cluster_refresh(c, err);
        if (!rc) rc = dl_cluster_check_server(c, err);
        if (rc) return rc;
    }
    if (c->wait_replicas && c->mode == DL_MODE_REDLOCK)
        return dl_seterr(err, DLOCK_EINVAL, "wait_replicas is not for redlock:// clients");
    if (o->fence_url) {
        if (c->mode != DL_MODE_REDLOCK)
            return dl_seterr(err, DLOCK_EINVAL, "fence_url is for redlock:// clients");
        dl_endpoint ep;
        rc = dl_url_parse(o->fence_url, &ep, err);
        if (!rc) rc = dl_apply_credentials(&ep, o, err);
        if (!rc && !(c->fence_node = dl_node_new(&ep, c)))
            rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        dl_endpoint_clear(&ep);
        if (rc) return rc;
    }

    /* connect now so that a bad address or password is reported here */
    return check_nodes(c, err);
}

void dl_topology_clear(dlock_client *c) {
    for (size_t i = 0; i < c->nnodes; i++) dl_node_free(c->nodes[i]);
    free(c->nodes);
    c->nodes = NULL;
    c->nnodes = 0;
    dl_node_free(c->fence_node);
    c->fence_node = NULL;
    dl_sentinel_free(c->sentinel);
    c->sentinel = NULL;
    dl_cluster_free(c->cluster);
    c->cluster = NULL;
}

/* ---- the topology's answers: the one place that reads a client's mode ---- */

int64_t dl_topo_request_ms(const dlock_client *c, int64_t limit) {
    if (dl_topo_fanout(c) && limit > c->node_timeout_ms * 4) limit = c->node_timeout_ms * 4;
    return limit;
}

unsigned dl_topo_slot(const dlock_client *c, const char *key, size_t len) {
    return c->cluster ? dl_key_slot(key, len) : 0;
}

int dl_topo_serves(dlock_client *c, dl_node *node, unsigned slot) {
    return !c->cluster || dl_cluster_route(c, slot) == node;
}

size_t dl_topo_name_nodes(dlock_client *c, const char *name, size_t len, dl_node **nodes,
                          size_t cap) {
    if (!dl_topo_fanout(c)) {
        nodes[0] = dl_route(c, name, len);
        return 1;
    }
    size_t n = c->nnodes < cap ? c->nnodes : cap;
    for (size_t i = 0; i < n; i++) nodes[i] = c->nodes[i];
    return n;
}

size_t dl_topo_scan_nodes(dlock_client *c) { return c->cluster ? dl_node_count(c) : 1; }

void dl_topo_note_reply(dlock_client *c, const redisReply *r) {
    int ask;
    if (c->cluster) dl_cluster_redirect(c, r, &ask);
}
