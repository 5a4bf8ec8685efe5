/* The pub/sub service's connections: subscribing one to a channel and
 * unsubscribing it, following a channel whose Cluster slot moved, and the
 * subscriptions that outlive their wait (lingering). A plain or fair waiter
 * that got the lock returns without writing UNSUBSCRIBE: its connection
 * stays subscribed to the waiter's own channel, kept here per node, for the
 * next wait of the same owner (no SUBSCRIBE then) or, unsubscribed first, for
 * any other use. The node's pool knows them only through dl_kept_ops: it
 * counts them against max_idle, takes one back when it has no idle
 * connection of its own, and has them closed when the node moves (a
 * Sentinel failover) or is freed. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "services.h"

/* One lingering subscription: its connection, idle, still subscribed to
 * channel alone, the UNSUBSCRIBE not sent yet. */
struct dl_kept {
    dl_conn *conn;
    struct dl_kept *next;
    size_t channel_len;
    char channel[];
};

/* Takes n's first lingering subscription, on channel when channel is not
 * NULL; NULL if none. */
static struct dl_kept *take(dl_node *n, const char *channel, size_t channel_len) {
    pthread_mutex_lock(&n->mu);
    struct dl_kept *k = NULL;
    for (struct dl_kept **pp = &n->kept; *pp; pp = &(*pp)->next) {
        struct dl_kept *x = *pp;
        if (channel && (x->channel_len != channel_len || memcmp(x->channel, channel, channel_len)))
            continue;
        *pp = x->next;
        n->nkept--;
        k = x;
        break;
    }
    pthread_mutex_unlock(&n->mu);
    return k;
}

/* The pool has no idle connection of its own: a lingering one, its
 * UNSUBSCRIBE sent (the pool reads up to the confirmation: draining). */
static dl_conn *reclaim(dl_node *n, int64_t deadline) {
    struct dl_kept *k;
    while ((k = take(n, NULL, 0))) {
        dl_conn *conn = k->conn;
        int ok = dl_send_unsubscribe(conn, k->channel, k->channel_len, 1, deadline);
        free(k);
        if (ok) return conn;
        dl_conn_close(conn);
    }
    return NULL;
}

/* Closes n's lingering subscriptions (the node moved, or is freed). */
static void drop(dl_node *n) {
    pthread_mutex_lock(&n->mu);
    struct dl_kept *k = n->kept;
    n->kept = NULL;
    n->nkept = 0;
    pthread_mutex_unlock(&n->mu);
    while (k) {
        struct dl_kept *next = k->next;
        dl_conn_close(k->conn); /* closing unsubscribes too */
        free(k);
        k = next;
    }
}

static const dl_kept_ops kept_ops = {.reclaim = reclaim, .drop = drop};

void dl_sub_linger(dl_conn *sub, const char *channel, size_t channel_len) {
    if (!sub) return;
    dl_node *n = sub->node;
    struct dl_kept *k = NULL;
    if (n && !sub->broken && sub->subscribed && !sub->olen && !sub->draining)
        k = malloc(sizeof *k + channel_len + 1);
    if (!k) {
        dl_unsubscribe_async(sub, channel, channel_len);
        return;
    }
    k->conn = sub;
    k->channel_len = channel_len;
    memcpy(k->channel, channel, channel_len);
    k->channel[channel_len] = '\0';
    sub->idle_since_ms = dl_now_ms();
    pthread_mutex_lock(&n->mu);
    /* within the node's max_idle, idle connections counted; not opened to
     * an address the node has since left (a Sentinel failover) */
    int keep = n->nidle + n->nkept < n->max_idle && sub->node_gen == n->gen;
    if (keep) {
        n->kept_ops = &kept_ops;
        k->next = n->kept;
        n->kept = k;
        n->nkept++;
    }
    pthread_mutex_unlock(&n->mu);
    if (!keep) {
        free(k);
        dl_conn_close(sub); /* closing unsubscribes too */
    }
}

dl_conn *dl_sub_take_linger(dl_node *n, const char *channel, size_t channel_len) {
    struct dl_kept *k = take(n, channel, channel_len);
    if (!k) return NULL;
    dl_conn *conn = k->conn;
    free(k);
    /* idle for a while: it may have died (a pending message, which nobody
     * sends on a channel whose waiter stopped waiting, looks the same; so
     * does the SUNSUBSCRIBE of a Cluster slot that moved away) */
    if (!dl_idle_alive(conn)) {
        dl_conn_close(conn);
        return NULL;
    }
    return conn;
}

int dl_sub_get(dl_node *n, const char *channel, size_t channel_len, int64_t deadline,
               dl_conn **out, int *subscribed, dl_err *err) {
    *subscribed = 0;
    dl_conn *conn = dl_sub_take_linger(n, channel, channel_len);
    if (conn) {
        *subscribed = 1;
        *out = conn;
        return DLOCK_OK;
    }
    /* another channel's: its UNSUBSCRIBE goes out with the caller's SUBSCRIBE */
    struct dl_kept *k = take(n, NULL, 0);
    if (k) {
        conn = k->conn;
        int ok = dl_idle_alive(conn) &&
                 dl_send_unsubscribe(conn, k->channel, k->channel_len, 0, 0);
        free(k);
        if (ok) {
            *out = conn;
            return DLOCK_OK;
        }
        dl_conn_close(conn);
    }
    return dl_node_get(n, deadline, out, err);
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

/* Sends cmd (SUBSCRIBE / UNSUBSCRIBE) for channel and reads up to its
 * confirmation (messages that come first are dropped: the caller retries
 * after subscribing anyway). */
int dl_subscribe_cmd(dlock_client *c, dl_conn *sub, const char *cmd, const char *channel,
                   size_t channel_len, dl_err *err) {
    /* Redis Cluster: sharded pub/sub on the channel's slot owner */
    if (dl_sharded(sub)) cmd = !strcasecmp(cmd, "SUBSCRIBE") ? "SSUBSCRIBE" : "SUNSUBSCRIBE";
    const char *argv[2] = {cmd, channel};
    size_t lens[2] = {strlen(cmd), channel_len};
    int64_t deadline = dl_cmd_deadline(c);
    int rc = dl_conn_append(sub, 2, argv, lens, err);
    if (!rc) rc = dl_conn_flush(sub, deadline, err);
    if (rc) return rc;
    sub->subscribed = 1;
    for (;;) {
        redisReply *r = NULL;
        rc = dl_conn_read(sub, deadline, &r, err);
        if (rc) return rc;
        int done = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                   r->element[0]->type == REDIS_REPLY_STRING && !strcasecmp(r->element[0]->str, cmd);
        int bad = r->type == REDIS_REPLY_ERROR;
        if (bad) rc = dl_reply_error(r, cmd, err);
        if (done && (!strcasecmp(cmd, "UNSUBSCRIBE") || !strcasecmp(cmd, "SUNSUBSCRIBE")) && r->element[2]->type == REDIS_REPLY_INTEGER &&
            r->element[2]->integer == 0)
            sub->subscribed = 0;
        freeReplyObject(r);
        if (bad) {
            sub->broken = 1;
            return rc;
        }
        if (done) return DLOCK_OK;
    }
}

/* Borrows a connection and subscribes it to channel. */
int dl_sync_subscribe(dlock_client *c, const char *channel, size_t channel_len, dl_conn **out,
                      dl_err *err) {
    dl_conn *sub = NULL;
    *out = NULL;
    int rc = dl_pool_get_key(c, channel, channel_len, dl_cmd_deadline(c), &sub, err);
    if (rc) return rc;
    rc = dl_subscribe_cmd(c, sub, "SUBSCRIBE", channel, channel_len, err);
    if (rc) {
        sub->broken = 1;
        dl_pool_put(c, sub);
        return rc;
    }
    *out = sub;
    return DLOCK_OK;
}

int dl_follow_slot(dlock_client *c, const char *channel, size_t channel_len, dl_conn **conn,
                   dl_conn **sub, int *moved, dl_err *err) {
    *moved = 0;
    if (!*sub || !dl_sharded(*sub)) return DLOCK_OK;
    dl_node *at = dl_route(c, channel, channel_len);
    if (!at || at == (*sub)->node) return DLOCK_OK;
    *moved = 1;
    (*sub)->broken = 1; /* closed: the old master may have ended it already */
    dl_pool_put(c, *sub);
    *sub = NULL;
    dl_pool_put(c, *conn);
    *conn = NULL;
    int rc = dl_node_get(at, dl_cmd_deadline(c), conn, err);
    if (!rc) rc = dl_sync_subscribe(c, channel, channel_len, sub, err);
    return rc;
}

/* Unsubscribes (so the connection can go back to the pool) and returns it.
 * NULL is a no-op. */
void dl_sync_unsubscribe(dlock_client *c, dl_conn *sub, const char *channel, size_t channel_len) {
    if (!sub) return;
    if (!sub->broken && sub->subscribed) {
        dl_err ignored = {0};
        dl_subscribe_cmd(c, sub, "UNSUBSCRIBE", channel, channel_len, &ignored);
    }
    dl_pool_put(c, sub);
}
