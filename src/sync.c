/* Waiting on pub/sub for objects that are not lock kinds (semaphores, the
 * latch): subscribe first, then try, then sleep until a message (or a time the
 * caller computes, or the deadline, or DL_WAIT_RECHECK_MS at most: the
 * backstop for changes nobody published), and try again; the one loop that
 * takes a wait's next message (dl_sub_next) serves the lock waiters in
 * wait.c too. The subscribed connections are the pub/sub service's
 * (pubsub.c). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "services.h"

int dl_sub_next(dl_conn *sub, dl_cancel *cx, int64_t until, redisReply **msg, dl_err *err) {
    *msg = NULL;
    for (;;) {
        int rc = dl_conn_take(sub, msg, err);
        if (rc || *msg) return rc;
        if (cx && dl_canceled(cx)) return DLOCK_ECANCELED;
        int64_t left = until - dl_now_ms();
        if (left <= 0) return DLOCK_ETIMEDOUT;
        int ready = 0;
        rc = dl_sub_poll(sub, cx, left, &ready, err);
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
