/* Redis Sentinel for the async client: the master's address is asked of the
 * sentinels without waiting, over the connection slot of the pipe that
 * needs it (pipe.c asks before each new connection to the master, so a
 * failover is followed at the next reconnect). One sentinel at a time, the
 * one that answered last first, each within DL_ASENT_TIMEOUT_MS; the same
 * question and answer checks as the blocking client's (src/sentinel.c). */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "async.h"

/* How long one sentinel has to answer (the connect included). */
#define DL_ASENT_TIMEOUT_MS 500

struct dl_asent {
    dl_endpoint *eps;          /* the sentinels */
    size_t n;
    size_t good;               /* the sentinel that answered last */
    char *master_name;
};

int dl_asent_new(dl_target *t, dl_asent **out, dl_err *err) {
    dl_asent *s = calloc(1, sizeof *s);
    if (!s) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    s->eps = t->eps;
    s->n = t->neps;
    s->master_name = t->master_name;
    t->eps = NULL;
    t->neps = 0;
    t->master_name = NULL;
    *out = s;
    return DLOCK_OK;
}

void dl_asent_free(dl_asent *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) dl_endpoint_clear(&s->eps[i]);
    free(s->eps);
    free(s->master_name);
    free(s);
}

static int64_t one_timeout(int64_t connect_timeout_ms);

int64_t dl_asent_budget(const dl_asent *s, int64_t connect_timeout_ms) {
    return one_timeout(connect_timeout_ms) * (int64_t)s->n;
}

int dl_aprobe_events(const dl_aprobe *pr) {
    if (pr->conn->connecting) return DLOCK_ASYNC_WRITE;
    return DLOCK_ASYNC_READ | (pr->conn->olen ? DLOCK_ASYNC_WRITE : 0);
}

void dl_aprobe_stop(dl_aprobe *pr) {
    dl_conn_close(pr->conn);
    pr->conn = NULL;
}

static int64_t one_timeout(int64_t connect_timeout_ms) {
    return connect_timeout_ms < DL_ASENT_TIMEOUT_MS ? connect_timeout_ms : DL_ASENT_TIMEOUT_MS;
}

/* Queues the question on conn. */
static int question(dl_asent *s, dl_conn *conn, dl_err *err) {
    const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", s->master_name};
    size_t lens[3] = {8, 23, strlen(s->master_name)};
    return dl_conn_append(conn, 3, argv, lens, err);
}

int dl_aprobe_repeat(dl_asent *s, dl_aprobe *pr, int64_t connect_timeout_ms, dl_err *err) {
    int rc = question(s, pr->conn, err);
    if (!rc) pr->deadline = dl_deadline(one_timeout(connect_timeout_ms));
    return rc;
}

int dl_aprobe_start(dl_asent *s, dl_aprobe *pr, int64_t connect_timeout_ms, dl_err *err) {
    int64_t one = one_timeout(connect_timeout_ms);
    while (pr->tried < s->n) {
        size_t i = (s->good + pr->tried) % s->n;
        pr->tried++;
        dl_conn *conn = NULL;
        dl_err e = {0};
        int rc = dl_conn_open_start(&s->eps[i], &conn, &e);
        if (!rc && (rc = question(s, conn, &e)) != DLOCK_OK) dl_conn_close(conn);
        if (rc == DLOCK_ENOMEM) return dl_seterr(err, rc, "%s", e.msg);
        if (rc) {
            pr->last = e;
            continue;
        }
        pr->conn = conn;
        pr->i = i;
        pr->deadline = dl_deadline(one);
        return DLOCK_OK;
    }
    return dl_seterr(err, DLOCK_EIO, "no sentinel could name master '%.60s' (%s)",
                     s->master_name, pr->last.msg[0] ? pr->last.msg : "none answered");
}

int dl_aprobe_io(dl_asent *s, dl_aprobe *pr, int events, char **host, int *port, dl_err *err) {
    dl_conn *conn = pr->conn;
    dl_err e = {0};
    int rc = DLOCK_OK;
    if (!conn) return -1;
    if (conn->connecting) {
        if (!(events & (DLOCK_ASYNC_WRITE | DLOCK_ASYNC_READ))) return 0;
        /* an event of the socket this fd number had before (a bare loop's
         * poll result) must not pass for the end of the connect */
        struct pollfd pf = {.fd = conn->fd, .events = POLLOUT};
        if (poll(&pf, 1, 0) <= 0) return 0;
        rc = dl_conn_connected(conn, &e);
    }
    if (!rc && conn->olen) rc = dl_conn_write_some(conn, &e);
    while (!rc && (events & DLOCK_ASYNC_READ)) {
        redisReply *r = NULL;
        rc = dl_conn_poll_reply(conn, &r, &e);
        if (rc || !r) break;
        if (conn->handshake > 0) {
            /* AUTH / SELECT of the sentinel's URL */
            conn->handshake--;
            if (r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "AUTH/SELECT", &e);
            freeReplyObject(r);
            continue;
        }
        rc = dl_sentinel_answer(s->master_name, r, host, port, &e);
        freeReplyObject(r);
        if (rc == DLOCK_ENOMEM) {
            *err = e;
            return -2;
        }
        if (!rc) {
            s->good = pr->i;
            pr->tried = 0;
            pr->last.msg[0] = 0;
            return 1;
        }
        break;
    }
    if (!rc) return 0;
    char where[300];
    dl_endpoint_describe(&s->eps[pr->i], where, sizeof where);
    dl_seterr(&pr->last, e.code, "sentinel %s: %s", where, e.msg);
    return -1;
}

int dl_aprobe_timed_out(dl_asent *s, dl_aprobe *pr) {
    if (!pr->conn || dl_now_ms() < pr->deadline) return 0;
    char where[300];
    dl_endpoint_describe(&s->eps[pr->i], where, sizeof where);
    dl_seterr(&pr->last, DLOCK_EIO, "sentinel %s did not answer in time", where);
    return 1;
}
