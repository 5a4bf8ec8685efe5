/* A server's pool of connections, shared by threads: idle connections kept
 * up to the client's max_idle, subscribed ones left lingering on their
 * channel for the next waiter, and a connect after failures only after a
 * bounded exponential backoff. A Sentinel-watched node asks the sentinels
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

int dl_sharded(const dl_conn *conn) {
    return conn && conn->node && conn->node->client && conn->node->client->cluster;
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
    while (n->idle) {
        dl_conn *next = n->idle->next;
        dl_conn_close(n->idle);
        n->idle = next;
    }
    dl_endpoint_clear(&n->ep);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

int dl_send_unsubscribe(dl_conn *sub, const char *channel, size_t channel_len, int flush,
                        int64_t deadline) {
    int sh = dl_sharded(sub);
    const char *argv[2] = {sh ? "SUNSUBSCRIBE" : "UNSUBSCRIBE", channel};
    size_t lens[2] = {sh ? 12u : 11u, channel_len};
    dl_err err;
    if (dl_conn_append(sub, 2, argv, lens, &err) != DLOCK_OK) return 0;
    if (!flush) return 1;
    if (dl_conn_flush(sub, deadline, &err) != DLOCK_OK) return 0;
    sub->subscribed = 0;
    sub->draining = 1;
    return 1;
}

void dl_unsubscribe_async(dl_conn *sub, const char *channel, size_t channel_len) {
    if (!sub) return;
    if (!sub->broken && sub->subscribed)
        dl_send_unsubscribe(sub, channel, channel_len, 1, dl_deadline(1000));
    dl_node_put(sub);
}
