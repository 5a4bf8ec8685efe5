/* Waiting on pub/sub for objects that are not lock kinds (semaphores, the
 * latch): subscribe first, then try, then sleep until a message (or a time the
 * caller computes, or the deadline, or DL_WAIT_RECHECK_MS at most: the
 * backstop for changes nobody published), and try again. dl_subscribe_cmd
 * also serves the lock waiters in wait.c. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "services.h"

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

int dl_sub_next(dl_conn *sub, dl_cancel *cx, int64_t until, redisReply **msg, dl_err *err) {
    *msg = NULL;
    for (;;) {
        void *reply = NULL;
        if (redisReaderGetReply(sub->reader, &reply) != REDIS_OK) {
            sub->broken = 1;
            return dl_seterr(err, DLOCK_EPROTO, "bad pub/sub message from server");
        }
        if (reply) {
            *msg = reply;
            return DLOCK_OK;
        }
        if (cx && dl_canceled(cx)) return DLOCK_ECANCELED;
        int64_t left = until - dl_now_ms();
        if (left <= 0) return DLOCK_ETIMEDOUT;
        int ready = 0;
        int rc = dl_sub_poll(sub, cx, left, &ready, err);
        if (rc) return rc;
        if (!ready) continue; /* a cancel is told at the top of the loop */
        /* readable: read what is there (no second poll); a message that
         * arrived in part is completed on the next round */
        redisReply *r = NULL;
        rc = dl_conn_poll_reply(sub, &r, err);
        if (rc) return rc;
        if (r) {
            *msg = r;
            return DLOCK_OK;
        }
    }
}

/* An error message on a subscription ends the wait, and the connection. */
static int sub_error(dl_conn *sub, redisReply *m, dl_err *err) {
    int rc = dl_reply_error(m, "pub/sub", err);
    freeReplyObject(m);
    sub->broken = 1;
    return rc;
}

int dl_sync_wait(dl_object *o, dl_conn *sub, int64_t until, dl_err *err) {
    int64_t cap = dl_now_ms() + DL_WAIT_RECHECK_MS;
    if (until == DL_INF_DEADLINE || until > cap) until = cap;
    redisReply *m = NULL;
    int rc = dl_sub_next(sub, &o->h.cancel, until, &m, err);
    if (rc == DLOCK_ECANCELED) {
        char nm[80];
        return dl_seterr(err, DLOCK_ECANCELED, "waiting for '%s' was cancelled",
                         dl_name_msg(o->h.name, o->h.name_len, nm, sizeof nm));
    }
    if (rc) return rc;
    /* the messages already buffered behind it say nothing more */
    do {
        if (m->type == REDIS_REPLY_ERROR) return sub_error(sub, m, err);
        freeReplyObject(m);
        rc = dl_sub_next(sub, NULL, 0, &m, err);
    } while (!rc);
    return rc == DLOCK_ETIMEDOUT ? DLOCK_OK : rc;
}

int dl_sync_check_wait(int64_t wait_ms, dl_err *err) {
    if (wait_ms < DLOCK_WAIT_FOREVER)
        return dl_seterr(err, DLOCK_EINVAL, "wait must be >= 0 ms, or DLOCK_WAIT_FOREVER");
    return DLOCK_OK;
}

/* dl_reply_error, but an INCRBY/DECRBY overflow is DLOCK_EOVERFLOW. */
int dl_sync_reply_error(const redisReply *r, const char *what, dl_err *err) {
    int rc = dl_reply_error(r, what, err);
    if (rc == DLOCK_ESERVER && r->str && strstr(r->str, "overflow")) err->code = rc = DLOCK_EOVERFLOW;
    return rc;
}

int dl_sub_poll(dl_conn *sub, dl_cancel *cx, int64_t left, int *ready, dl_err *err) {
    *ready = 0;
    if (dl_conn_has_pending(sub)) {
        *ready = 1;
        return DLOCK_OK;
    }
    int cfd = cx ? atomic_load(&cx->fd) : -1;
    struct pollfd p[2] = {{.fd = sub->fd, .events = POLLIN}, {.fd = cfd, .events = POLLIN}};
    int n = poll(p, cfd >= 0 ? 2 : 1, left > 1000000 ? 1000000 : (int)left);
    if (n < 0 && errno == EINTR) return DLOCK_OK;
    if (n < 0) {
        sub->broken = 1;
        return dl_seterr(err, DLOCK_EIO, "poll: %s", strerror(errno));
    }
    if (cfd >= 0 && p[1].revents) dl_cancel_drain(cx); /* told by dl_canceled */
    *ready = n > 0 && p[0].revents != 0;
    return DLOCK_OK;
}
