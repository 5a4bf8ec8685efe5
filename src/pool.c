/* A server's pool of connections, shared by threads: idle connections kept
 * up to the client's max_idle (the pub/sub service's lingering
 * subscriptions counted: dl_kept_ops), and a connect after failures only
 * after a bounded exponential backoff. A Sentinel-watched node asks the sentinels
 * for its master's address and checks the role of what it connects to. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "topology.h"

#define DL_BACKOFF_MIN_MS 50
#define DL_BACKOFF_MAX_MS 2000
#define DL_FRESH_MS 50

int64_t dl_cmd_deadline(const dlock_client *c) { return dl_deadline(c->command_timeout_ms); }

/* Reads up to the confirmation of an UNSUBSCRIBE sent without waiting
 * (dl_unsubscribe_async, or a lingering subscription given back to the
 * pool): 1 when the connection is back to normal. */
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

int dl_idle_alive(dl_conn *conn) {
    return dl_now_ms() - conn->idle_since_ms < DL_FRESH_MS || !dl_conn_stale(conn);
}

/* An idle connection of n: its own, else a lingering subscription the
 * pub/sub service gives back (UNSUBSCRIBE sent: draining); NULL if none. */
static dl_conn *take_idle(dl_node *n, int64_t deadline) {
    pthread_mutex_lock(&n->mu);
    dl_conn *conn = n->idle;
    if (conn) {
        n->idle = conn->next;
        conn->next = NULL;
        n->nidle--;
    }
    const dl_kept_ops *kept = n->kept_ops;
    pthread_mutex_unlock(&n->mu);
    if (!conn && kept) conn = kept->reclaim(n, deadline);
    return conn;
}

/* Puts conn on n's idle list, or closes it when the list is full or it
 * was opened to an address the node has since left (a Sentinel failover:
 * a command in flight then must not bring the old master back). */
static void pool_push(dl_node *n, dl_conn *conn) {
    conn->idle_since_ms = dl_now_ms();
    pthread_mutex_lock(&n->mu);
    if (n->nidle + n->nkept < n->max_idle && conn->node_gen == n->gen) {
        conn->next = n->idle;
        n->idle = conn;
        n->nidle++;
        conn = NULL;
    }
    pthread_mutex_unlock(&n->mu);
    dl_conn_close(conn);
}

int dl_node_backoff(dl_node *n, int64_t probe_ms, int *may_probe) {
    pthread_mutex_lock(&n->mu);
    int64_t now = dl_now_ms();
    int in = n->next_attempt_ms > now && n->nidle + n->nkept == 0;
    /* the last connect failed at next_attempt_ms - backoff_ms */
    *may_probe = in && now - (n->next_attempt_ms - n->backoff_ms) >= probe_ms;
    pthread_mutex_unlock(&n->mu);
    return in;
}

static int node_get(dl_node *n, int64_t deadline, int backoff, dl_conn **out, dl_err *err);

int dl_node_take_idle(dl_node *n, int64_t deadline, dl_conn **out) {
    for (;;) {
        dl_conn *conn = take_idle(n, deadline);
        if (!conn) return 0;
        /* checked outside the mutex: draining reads from the network */
        int ok = (!conn->draining || drain(conn, deadline)) && dl_idle_alive(conn);
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

int dl_sharded(const dl_conn *conn) {
    return conn && (conn->sharded ||
                    (conn->node && conn->node->client && conn->node->client->cluster));
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

void dl_node_free(dl_node *n) {
    if (!n) return;
    if (n->kept_ops) n->kept_ops->drop(n);
    while (n->idle) {
        dl_conn *next = n->idle->next;
        dl_conn_close(n->idle);
        n->idle = next;
    }
    dl_endpoint_clear(&n->ep);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

