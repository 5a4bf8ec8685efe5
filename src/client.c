/* The client: options, identity, and a pool of connections shared by threads,
 * re-established after failures with a bounded exponential backoff. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>


#include "internal.h"

#define DL_DEFAULT_URL "redis://127.0.0.1:6379"
#define DL_BACKOFF_MIN_MS 50
#define DL_BACKOFF_MAX_MS 2000
#define DL_FRESH_MS 50

void dlock_options_init(dlock_options *opts) {
    if (opts) memset(opts, 0, sizeof *opts);
}

const char *dlock_client_id(const dlock_client *c) { return c ? c->id : ""; }

int64_t dl_cmd_deadline(const dlock_client *c) { return dl_deadline(c->command_timeout_ms); }

/* Reads up to the confirmation of an UNSUBSCRIBE sent without waiting
 * (dl_unsubscribe_async): 1 when the connection is back to normal. */
static int drain(dl_conn *conn, int64_t deadline) {
    dl_err err;
    for (;;) {
        redisReply *r = NULL;
        if (dl_conn_read(conn, deadline, &r, &err) != DLOCK_OK) return 0;
        int done = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                   r->element[0]->type == REDIS_REPLY_STRING &&
                   (!strcasecmp(r->element[0]->str, "unsubscribe") ||
                    !strcasecmp(r->element[0]->str, "sunsubscribe")) &&
                   r->element[2]->type == REDIS_REPLY_INTEGER && r->element[2]->integer == 0;
        freeReplyObject(r);
        if (done) {
            conn->draining = 0;
            return 1;
        }
    }
}

/* Back in the pool for less than DL_FRESH_MS: taken without a check. */
static int fresh(const dl_conn *conn) { return dl_now_ms() - conn->idle_since_ms < DL_FRESH_MS; }

/* Takes the first idle connection of n that is lingering (linger 1) or not
 * (linger 0), and when lingering on channel if channel is not NULL. */
static dl_conn *take_first(dl_node *n, int linger, const char *channel, size_t channel_len) {
    pthread_mutex_lock(&n->mu);
    dl_conn *conn = NULL;
    for (dl_conn **pp = &n->idle; *pp; pp = &(*pp)->next) {
        dl_conn *x = *pp;
        if (!x->linger != !linger) continue;
        if (channel && (x->linger_len != channel_len || memcmp(x->linger, channel, channel_len)))
            continue;
        *pp = x->next;
        x->next = NULL;
        n->nidle--;
        conn = x;
        break;
    }
    pthread_mutex_unlock(&n->mu);
    return conn;
}

/* An idle connection of n, one that is not lingering if there is one (a
 * lingering one costs an UNSUBSCRIBE before other use). */
static dl_conn *take_idle(dl_node *n) {
    dl_conn *conn = take_first(n, 0, NULL, 0);
    return conn ? conn : take_first(n, 1, NULL, 0);
}

/* Queues the UNSUBSCRIBE a lingering connection owes, and sends it when
 * flush (its confirmation is then read by drain); unflushed, it goes out
 * with the caller's next command (a SUBSCRIBE, which reads past it). */
static int unlinger(dl_conn *conn, int flush, int64_t deadline) {
    int ok = dl_send_unsubscribe(conn, conn->linger, conn->linger_len, flush, deadline);
    free(conn->linger);
    conn->linger = NULL;
    conn->linger_len = 0;
    return ok;
}

/* Puts conn on n's idle list, or closes it when the list is full or it
 * was opened to an address the node has since left (a Sentinel failover:
 * a command in flight then must not bring the old master back). */
static void pool_push(dl_node *n, dl_conn *conn) {
    conn->idle_since_ms = dl_now_ms();
    pthread_mutex_lock(&n->mu);
    if (n->nidle < n->max_idle && conn->node_gen == n->gen) {
        conn->next = n->idle;
        n->idle = conn;
        n->nidle++;
        conn = NULL;
    }
    pthread_mutex_unlock(&n->mu);
    dl_conn_close(conn); /* a lingering one: closing unsubscribes too */
}

int dl_node_backoff(dl_node *n, int64_t probe_ms, int *may_probe) {
    pthread_mutex_lock(&n->mu);
    int64_t now = dl_now_ms();
    int in = n->next_attempt_ms > now && n->nidle == 0;
    /* the last connect failed at next_attempt_ms - backoff_ms */
    *may_probe = in && now - (n->next_attempt_ms - n->backoff_ms) >= probe_ms;
    pthread_mutex_unlock(&n->mu);
    return in;
}

static int node_get(dl_node *n, int64_t deadline, int backoff, dl_conn **out, dl_err *err);

int dl_node_take_idle(dl_node *n, int64_t deadline, dl_conn **out) {
    for (;;) {
        dl_conn *conn = take_idle(n);
        if (!conn) return 0;
        /* checked outside the mutex: draining reads from the network. A
         * connection back in the pool for less than DL_FRESH_MS is taken as
         * is: a server does not close and restart that fast, and a failure
         * would be reported anyway (never retried blindly). A lingering
         * subscription is ended first (its messages are dropped) */
        int ok = conn->linger ? unlinger(conn, 1, deadline) && drain(conn, deadline)
                              : (!conn->draining || drain(conn, deadline)) &&
                                    (fresh(conn) || !dl_conn_stale(conn));
        if (ok) {
            *out = conn;
            return 1;
        }
        dl_conn_close(conn); /* the server closed it (restart, timeout...) */
    }
}

void dl_node_opened(dl_node *n, int rc) {
    pthread_mutex_lock(&n->mu);
    if (rc == DLOCK_EIO) {
        n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : DL_BACKOFF_MIN_MS;
        if (n->backoff_ms > DL_BACKOFF_MAX_MS) n->backoff_ms = DL_BACKOFF_MAX_MS;
        n->next_attempt_ms = dl_now_ms() + n->backoff_ms;
    } else if (rc == DLOCK_OK) {
        n->backoff_ms = 0;
        n->next_attempt_ms = 0;
    }
    pthread_mutex_unlock(&n->mu);
}

int dl_node_get(dl_node *n, int64_t deadline, dl_conn **out, dl_err *err) {
    return node_get(n, deadline, 1, out, err);
}

int dl_node_get_now(dl_node *n, int64_t deadline, dl_conn **out, dl_err *err) {
    return node_get(n, deadline, 0, out, err);
}

/* backoff: 0 to connect even while the node's reconnect backoff runs. */
static int node_get(dl_node *n, int64_t deadline, int backoff, dl_conn **out, dl_err *err) {
    if (n->sentinel) {
        /* at most once a second: has the master moved? */
        dl_err ignored;
        dl_sentinel_refresh(n, 0, &ignored);
    }
    if (dl_node_take_idle(n, deadline, out)) return DLOCK_OK;
    pthread_mutex_lock(&n->mu);
    int64_t now = dl_now_ms();
    int64_t next = backoff ? n->next_attempt_ms : 0;
    pthread_mutex_unlock(&n->mu);
    if (now < next) {
        if (next >= deadline) {
            char where[300];
            dl_endpoint_describe(&n->ep, where, sizeof where);
            return dl_seterr(err, DLOCK_EIO,
                             "server %s unavailable; next reconnect attempt in %lld ms", where,
                             (long long)(next - now));
        }
        dl_sleep_ms(next - now);
    }
    int64_t cdl = dl_deadline(n->connect_timeout_ms);
    if (cdl > deadline) cdl = deadline;
    int rc;
    unsigned gen = 0;
    if (n->sentinel) {
        /* the address moves: connect to a copy */
        dl_endpoint ep;
        pthread_mutex_lock(&n->mu);
        rc = dl_endpoint_copy(&ep, &n->ep);
        gen = n->gen;
        pthread_mutex_unlock(&n->mu);
        if (rc) return dl_seterr(err, rc, "out of memory");
        rc = dl_conn_open(&ep, cdl, out, err);
        dl_endpoint_clear(&ep);
        if (!rc && (rc = dl_sentinel_check_role(*out, cdl, err)) != DLOCK_OK) {
            dl_conn_close(*out);
            *out = NULL;
        }
        if (rc) {
            dl_err ignored;
            dl_sentinel_refresh(n, 1, &ignored); /* ask again at once */
            return rc;
        }
    } else {
        rc = dl_conn_open(&n->ep, cdl, out, err);
    }
    dl_node_opened(n, rc);
    if (rc == DLOCK_OK) {
        (*out)->node = n;
        (*out)->node_gen = gen;
    }
    return rc;
}

void dl_node_put(dl_conn *conn) {
    if (!conn) return;
    dl_node *n = conn->node;
    /* unread bytes on a connection that asked for nothing more: out of
     * step (dl_conn_flush) */
    if (!n || conn->broken || conn->subscribed || conn->olen ||
        (!conn->draining && conn->handshake <= 0 && dl_conn_unread(conn))) {
        dl_conn_close(conn);
        return;
    }
    pool_push(n, conn);
}

void dl_node_put_linger(dl_conn *sub, const char *channel, size_t channel_len) {
    if (!sub) return;
    dl_node *n = sub->node;
    char *copy = NULL;
    if (n && !sub->broken && sub->subscribed && !sub->olen && !sub->draining && !sub->linger)
        copy = malloc(channel_len + 1);
    if (!copy) {
        dl_unsubscribe_async(sub, channel, channel_len);
        return;
    }
    memcpy(copy, channel, channel_len);
    copy[channel_len] = '\0';
    sub->linger = copy;
    sub->linger_len = channel_len;
    pool_push(n, sub);
}

dl_conn *dl_node_take_linger(dl_node *n, const char *channel, size_t channel_len) {
    dl_conn *conn = take_first(n, 1, channel, channel_len);
    if (!conn) return NULL;
    /* idle for a while: it may have died (a pending message, which nobody
     * sends on a channel whose waiter stopped waiting, looks the same) */
    if (!fresh(conn) && dl_conn_stale(conn)) {
        dl_conn_close(conn);
        return NULL;
    }
    free(conn->linger);
    conn->linger = NULL;
    conn->linger_len = 0;
    return conn;
}

int dl_node_get_sub(dl_node *n, const char *channel, size_t channel_len, int64_t deadline,
                    dl_conn **out, int *subscribed, dl_err *err) {
    *subscribed = 0;
    dl_conn *conn = dl_node_take_linger(n, channel, channel_len);
    if (conn) {
        *subscribed = 1;
        *out = conn;
        return DLOCK_OK;
    }
    /* another channel's: its UNSUBSCRIBE goes out with the caller's SUBSCRIBE */
    conn = take_first(n, 1, NULL, 0);
    if (conn) {
        if ((fresh(conn) || !dl_conn_stale(conn)) && unlinger(conn, 0, 0)) {
            *out = conn;
            return DLOCK_OK;
        }
        dl_conn_close(conn);
    }
    return dl_node_get(n, deadline, out, err);
}

int dl_pool_get(dlock_client *c, int64_t deadline, dl_conn **out, dl_err *err) {
    if (c->unusable) return dl_seterr(err, DLOCK_EINVAL, "client failed to open; free it");
    return dl_node_get(c->nodes[0], deadline, out, err);
}

dl_node *dl_route(dlock_client *c, const char *key, size_t len) {
    if (c->cluster && key) return dl_cluster_route(c, dl_key_slot(key, len));
    return c->nodes[0];
}

int dl_sharded(const dl_conn *conn) {
    return conn && conn->node && conn->node->client && conn->node->client->cluster;
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

dl_node *dl_node_new(dl_endpoint *ep, dlock_client *c) {
    dl_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->ep = *ep; /* takes ownership */
    memset(ep, 0, sizeof *ep);
    n->max_idle = c->max_idle;
    n->connect_timeout_ms = c->connect_timeout_ms;
    n->client = c;
    pthread_mutex_init(&n->mu, NULL);
    return n;
}

static void node_free(dl_node *n) {
    if (!n) return;
    while (n->idle) {
        dl_conn *next = n->idle->next;
        dl_conn_close(n->idle);
        n->idle = next;
    }
    dl_endpoint_clear(&n->ep);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

int dl_client_command(dlock_client *c, int argc, const char **argv, const size_t *lens,
                      redisReply **out, dl_err *err) {
    int64_t deadline = dl_cmd_deadline(c);
    dl_conn *conn;
    /* the key, when there is one, is the first argument */
    int rc = argc > 1 ? dl_pool_get_key(c, argv[1], lens[1], deadline, &conn, err)
                      : dl_pool_get(c, deadline, &conn, err);
    if (rc) return rc;
    rc = dl_conn_command(conn, deadline, argc, argv, lens, out, err);
    dl_pool_put(c, conn);
    /* Redis Cluster: follow MOVED and ASK */
    for (int hop = 0; !rc && c->cluster && hop < 8; hop++) {
        int ask = 0;
        dl_node *to = dl_cluster_redirect(c, *out, &ask);
        if (!to) break;
        freeReplyObject(*out);
        *out = NULL;
        if ((rc = dl_node_get(to, deadline, &conn, err)) != DLOCK_OK) break;
        if (ask) {
            const char *a[1] = {"ASKING"};
            size_t al[1] = {6};
            redisReply *ok = NULL;
            rc = dl_conn_command(conn, deadline, 1, a, al, &ok, err);
            if (ok) freeReplyObject(ok);
        }
        if (!rc) rc = dl_conn_command(conn, deadline, argc, argv, lens, out, err);
        dl_node_put(conn);
    }
    return rc;
}

int dlock_ping(dlock_client *c, int64_t *rtt_us) {
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    if (c->unusable)
        return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "client failed to open; free it"});
    if (!c->backend->ping) return dl_backend_unsupported(c, "ping");
    int rc = c->backend->ping(c, rtt_us, &err);
    if (rc) return dl_client_fail(c, &err);
    dl_client_ok(c);
    return DLOCK_OK;
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

/* Applies the options' credentials to one endpoint. */
static int apply_credentials(dl_endpoint *ep, const dlock_options *o, dl_err *err) {
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

static int client_init(dlock_client *c, const dlock_options *o, dl_err *err) {
    if (o->connect_timeout_ms < 0 || o->command_timeout_ms < 0 || o->watchdog_lease_ms < 0 ||
        o->max_idle_connections < 0 || o->node_timeout_ms < 0)
        return dl_seterr(err, DLOCK_EINVAL, "timeouts, lease and pool size must not be negative");
    c->connect_timeout_ms =
        o->connect_timeout_ms ? o->connect_timeout_ms : DLOCK_DEFAULT_CONNECT_TIMEOUT_MS;
    c->command_timeout_ms =
        o->command_timeout_ms ? o->command_timeout_ms : DLOCK_DEFAULT_COMMAND_TIMEOUT_MS;
    c->watchdog_lease_ms = o->watchdog_lease_ms ? o->watchdog_lease_ms : DLOCK_DEFAULT_WATCHDOG_MS;
    c->node_timeout_ms = o->node_timeout_ms ? o->node_timeout_ms : 50;
    atomic_init(&c->fair_wait_ms, DLOCK_DEFAULT_FAIR_WAIT_MS);
    if (o->wait_replicas < 0 || o->wait_replicas_timeout_ms < 0)
        return dl_seterr(err, DLOCK_EINVAL, "wait_replicas must not be negative");
    c->wait_replicas = o->wait_replicas;
    c->wait_replicas_timeout_ms =
        o->wait_replicas_timeout_ms ? o->wait_replicas_timeout_ms : 1000;
    if (c->watchdog_lease_ms < 30)
        return dl_seterr(err, DLOCK_EINVAL, "watchdog lease must be at least 30 ms");
    c->max_idle = o->max_idle_connections ? o->max_idle_connections : 8;

    const char *url = o->url ? o->url : getenv("DLOCK_URL");
    if (!url || !*url) url = DL_DEFAULT_URL;
    unsigned char raw[16];
    int rc = dl_random_bytes(raw, sizeof raw, err);
    if (rc) return rc;
    snprintf(c->id, sizeof c->id,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", raw[0],
             raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], raw[8], raw[9], raw[10],
             raw[11], raw[12], raw[13], raw[14], raw[15]);
    /* the backend the URL's scheme names does the rest */
    c->backend = dl_backend_for(url);
    return c->backend->open(c, url, o, err);
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
        if (!rc) rc = apply_credentials(&master, o, err);
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
        c->nodes = calloc(c->mode == DL_MODE_CLUSTER ? 64 : t.neps, sizeof *c->nodes);
        if (!c->nodes) rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        for (size_t i = 0; !rc && i < t.neps; i++) {
            rc = apply_credentials(&t.eps[i], o, err);
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
        if (!rc) rc = apply_credentials(&ep, o, err);
        if (!rc && !(c->fence_node = dl_node_new(&ep, c)))
            rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        dl_endpoint_clear(&ep);
        if (rc) return rc;
    }

    /* connect now so that a bad address or password is reported here */
    return check_nodes(c, err);
}

static void client_clear(dlock_client *c) {
    for (size_t i = 0; i < c->nnodes; i++) node_free(c->nodes[i]);
    free(c->nodes);
    c->nodes = NULL;
    c->nnodes = 0;
    node_free(c->fence_node);
    c->fence_node = NULL;
    dl_sentinel_free(c->sentinel);
    c->sentinel = NULL;
    dl_cluster_free(c->cluster);
    c->cluster = NULL;
}

int dlock_client_new(const dlock_options *opts, dlock_client **out) {
    if (!out) return DLOCK_EINVAL;
    *out = NULL;
    dlock_client *c = calloc(1, sizeof *c);
    if (!c) return DLOCK_ENOMEM;
    pthread_mutex_init(&c->wd_mu, NULL);
    pthread_mutex_init(&c->owned_mu, NULL);
    c->backend = &dl_backend_redis; /* until the URL names another */
    *out = c;
    dlock_options defaults;
    dlock_options_init(&defaults);
    dl_err err = {0};
    int rc = client_init(c, opts ? opts : &defaults, &err);
    if (rc) {
        /* keep the message on the handle; drop the connection state */
        if (c->backend->close && c->bctx) c->backend->close(c);
        c->bctx = NULL;
        client_clear(c);
        c->unusable = 1;
        return dl_client_fail(c, &err);
    }
    dl_client_ok(c);
    return DLOCK_OK;
}

int dlock_client_set_fail_fast(dlock_client *c, int fail_fast) {
    if (!c) return DLOCK_EINVAL;
    atomic_store(&c->fail_fast, fail_fast != 0);
    dl_client_ok(c);
    return DLOCK_OK;
}

void dlock_client_free(dlock_client *c) {
    if (!c) return;
    dl_watchdog_free(c->wd);
    c->wd = NULL;
    if (c->backend->close && c->bctx) c->backend->close(c);
    client_clear(c);
    pthread_mutex_destroy(&c->wd_mu);
    dl_owned_free(c);
    dl_client_ok(c);
    free(c->who);
    free(c);
}
