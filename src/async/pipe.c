/* A non-blocking RESP connection and its pipeline: requests go out as they
 * are queued (one write for all that queued in one loop turn), their
 * replies come back in the same order, and RESP has no request ids, so the
 * n-th reply is the n-th request's. Each request has a deadline (the
 * command timeout, plus the connect timeout while connecting); the timer
 * watches the oldest's, and when it passes the connection is closed and
 * every request ended: a reply that comes late cannot be matched to a
 * later request. The connection is transport/conn.c's: its bounded reader
 * (DL_REPLY_MAX_ELEMENTS) and its handshake (AUTH, SELECT), driven without
 * waiting. With Sentinel, each new connection starts by asking the
 * sentinels for the master (sentinel.c) over the same slot, then checks
 * with ROLE that the server is one; the requests queued meanwhile are held
 * and go out behind ROLE's confirmation, in their order. A READONLY reply
 * (the master was made a replica) fails the connection, so that the next
 * one asks again. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "async.h"

static void on_timer(dl_atimer *t);

void dl_apipe_init(dl_apipe *p, dl_aclient *cl, int slot) {
    memset(p, 0, sizeof *p);
    p->cl = cl;
    p->slot = slot;
    p->timer.fn = on_timer;
    p->timer.arg = p;
}

static void arm(dl_apipe *p) {
    int64_t at = -1;
    if ((p->conn || p->held) && !p->ready) at = p->connect_deadline;
    if (p->probe.conn && (at < 0 || p->probe.deadline < at)) at = p->probe.deadline;
    if (p->head && (at < 0 || p->head->deadline < at)) at = p->head->deadline;
    if (at < 0) {
        dl_atimer_stop(&p->cl->loop, &p->timer);
    } else if (dl_atimer_arm(&p->cl->loop, &p->timer, at)) {
        /* no room for the timer: without it a request could wait forever */
        dl_err err;
        dl_seterr(&err, DLOCK_ENOMEM, "out of memory arming a timer");
        dl_apipe_fail(p, &err);
    }
}

int dl_apipe_fd(const dl_apipe *p) {
    if (p->probe.conn) return p->probe.conn->fd;
    return p->conn ? p->conn->fd : -1;
}

int dl_apipe_opened(const dl_apipe *p) { return p->conn || p->held; }

/* The connection requests are queued into now. */
static dl_conn *out_conn(dl_apipe *p) { return p->held ? p->held : p->conn; }

void dl_apipe_update(dl_apipe *p) {
    if (p->probe.conn) {
        dl_aloop_want(&p->cl->loop, p->slot, p->probe.conn->fd, dl_aprobe_events(&p->probe));
        return;
    }
    if (!p->conn) {
        dl_aloop_want(&p->cl->loop, p->slot, -1, 0);
        return;
    }
    int ev = DLOCK_ASYNC_READ;
    if (p->conn->connecting || p->conn->olen) ev |= DLOCK_ASYNC_WRITE;
    if (p->conn->connecting) ev = DLOCK_ASYNC_WRITE;
    dl_aloop_want(&p->cl->loop, p->slot, p->conn->fd, ev);
}

void dl_apipe_fail(dl_apipe *p, const dl_err *err) {
    if (!p->conn && !p->head && !p->held) return;
    dl_aloop_want(&p->cl->loop, p->slot, -1, 0);
    dl_aprobe_stop(&p->probe);
    dl_conn_close(p->held);
    p->held = NULL;
    p->role = 0;
    dl_conn_close(p->conn);
    p->conn = NULL;
    p->ready = 0;
    p->nloaded = 0;
    p->qbytes = 0;
    dl_atimer_stop(&p->cl->loop, &p->timer);
    dl_areq *q = p->head;
    p->head = p->tail = NULL;
    p->pending = 0;
    /* each request ended once; one that queues a new request opens a new
     * connection, which these no longer share */
    while (q) {
        dl_areq *next = q->next;
        q->next = NULL;
        free(q->raw);
        q->raw = NULL;
        q->done(q, NULL, err);
        q = next;
    }
    if (p->down) p->down(p, err);
}

void dl_apipe_forget_scripts(dl_apipe *p) { p->nloaded = 0; }

/* Sentinel: a new connection starts with the question to the sentinels;
 * requests queue into held meanwhile. */
static int ask_sentinels(dl_apipe *p, dl_err *err) {
    dl_aclient *c = p->cl;
    dl_conn *held = calloc(1, sizeof *held);
    if (!held) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    held->fd = -1;
    memset(&p->probe, 0, sizeof p->probe);
    int rc = dl_aprobe_start(c->sent, &p->probe, c->connect_timeout_ms, err);
    if (rc) {
        dl_conn_close(held);
        return rc;
    }
    p->held = held;
    p->nloaded = 0;
    p->ready = 0;
    p->connect_deadline =
        dl_deadline(dl_asent_budget(c->sent, c->connect_timeout_ms) + c->connect_timeout_ms);
    arm(p);
    dl_apipe_update(p);
    if (p->up) p->up(p);
    return DLOCK_OK;
}

int dl_apipe_open(dl_apipe *p, dl_err *err) {
    if (p->conn || p->held) return DLOCK_OK;
    if (p->gate && p->gate->code) {
        *err = *p->gate;
        return err->code;
    }
    dl_aclient *c = p->cl;
    if (c->sent) return ask_sentinels(p, err);
    const dl_endpoint *ep = p->ep ? p->ep : &c->ep;
    dl_conn *conn = NULL;
    int rc = dl_conn_open_start(ep, &conn, err);
    if (rc == DLOCK_ENOTSUP) {
        /* a name with several addresses: connected the blocking way, each
         * address in turn (dlock_async.h says so) */
        rc = dl_conn_open(ep, dl_deadline(c->connect_timeout_ms), &conn, err);
        if (!rc) {
            conn->sharded = p->sharded;
            p->conn = conn;
            p->nloaded = 0;
            p->ready = 1;
            dl_apipe_update(p);
            if (p->up) p->up(p);
            return DLOCK_OK;
        }
    }
    if (rc) return rc;
    conn->sharded = p->sharded;
    p->conn = conn;
    p->nloaded = 0;
    p->ready = 0;
    p->connect_deadline = dl_deadline(c->connect_timeout_ms);
    if (!conn->connecting && !conn->handshake) p->ready = 1;
    arm(p);
    dl_apipe_update(p);
    /* what must go first on a new connection is queued before the request
     * that opened it (the handshake goes before both) */
    if (p->up) p->up(p);
    return DLOCK_OK;
}

/* before: out_conn(p)'s olen before the request was appended */
static int enqueue(dl_apipe *p, dl_areq *q, size_t before) {
    p->qbytes += out_conn(p)->olen - before;
    q->end = p->qbytes;
    int64_t base = p->ready ? dl_now_ms() : p->connect_deadline;
    q->deadline = base + p->cl->command_timeout_ms;
    q->next = NULL;
    q->pipe = p;
    if (p->tail) p->tail->next = q;
    else p->head = q;
    p->tail = q;
    p->pending++;
    arm(p);
    dl_apipe_update(p);
    return DLOCK_OK;
}

/* A cluster pipe keeps what q's request appended from `before` on (none
 * kept for want of memory: a redirect then reaches its done as an error). */
static int queued(dl_apipe *p, dl_areq *q, size_t before) {
    q->raw = NULL;
    q->rawlen = 0;
    q->redirects = 0;
    q->asked = 0;
    dl_conn *oc = out_conn(p);
    if (p->keep && oc->olen > before && (q->raw = malloc(oc->olen - before))) {
        q->rawlen = oc->olen - before;
        memcpy(q->raw, oc->obuf + before, q->rawlen);
    }
    return enqueue(p, q, before);
}

int dl_apipe_command(dl_apipe *p, dl_areq *q, int argc, const char **argv, const size_t *lens,
                     dl_err *err) {
    int rc = dl_apipe_open(p, err);
    size_t before = rc ? 0 : out_conn(p)->olen;
    if (!rc) rc = dl_conn_append(out_conn(p), argc, argv, lens, err);
    return rc ? rc : queued(p, q, before);
}

static void asking_done(dl_areq *q, redisReply *r, const dl_err *err) {
    (void)r, (void)err;
    free(q);
}

int dl_apipe_resend(dl_apipe *p, dl_areq *q, int asking, dl_err *err) {
    int rc = dl_apipe_open(p, err);
    q->asked = asking;
    if (!rc && asking) {
        dl_areq *a = calloc(1, sizeof *a);
        const char *argv[1] = {"ASKING"};
        size_t lens[1] = {6};
        size_t before = out_conn(p)->olen;
        if (!a) rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        else if ((rc = dl_conn_append(out_conn(p), 1, argv, lens, err))) free(a);
        else {
            a->done = asking_done;
            enqueue(p, a, before);
        }
    }
    size_t before = rc ? 0 : out_conn(p)->olen;
    if (!rc) rc = dl_conn_append_raw(out_conn(p), q->raw, q->rawlen, err);
    if (rc) {
        free(q->raw);
        q->raw = NULL;
        return rc;
    }
    if (!p->keep) {
        free(q->raw);
        q->raw = NULL;
    }
    return enqueue(p, q, before);
}

int dl_apipe_eval(dl_apipe *p, dl_areq *q, dl_script *s, int by_text, int nkeys,
                  const char **keys, const size_t *keylens, int nargs, const char **args,
                  const size_t *arglens, dl_err *err) {
    int rc = dl_apipe_open(p, err);
    size_t before = rc ? 0 : out_conn(p)->olen;
    int known = 0;
    for (int i = 0; !rc && i < p->nloaded && !known; i++) known = p->loaded[i] == s;
    if (!rc) {
        dl_eval_req e = {.s = s, .nkeys = nkeys, .nargs = nargs, .keys = keys,
                         .keylens = keylens, .args = args, .arglens = arglens};
        rc = dl_eval_queue(out_conn(p), &e, by_text || !known, err);
    }
    if (!rc && !known && p->nloaded < DL_APIPE_LOADED) p->loaded[p->nloaded++] = s;
    return rc ? rc : queued(p, q, before);
}

/* Sentinel: r is ROLE's reply. A master: the requests held go out behind
 * it. Else the failure (a failover under way: the next connection asks
 * the sentinels again). r freed. */
static int confirm(dl_apipe *p, redisReply *r, dl_err *err) {
    p->role = 0;
    int rc = dl_sentinel_role(r, err);
    freeReplyObject(r);
    if (!rc && p->held->olen) rc = dl_conn_append_raw(p->conn, p->held->obuf, p->held->olen, err);
    if (rc) return rc;
    dl_conn_close(p->held);
    p->held = NULL;
    p->ready = 1;
    arm(p);
    return DLOCK_OK;
}

/* One reply read: the handshake's first, then the head request's, else a
 * push (pub/sub). 0, or a failure in err. */
static int take(dl_apipe *p, redisReply *r, dl_err *err) {
    if (p->conn->handshake > 0) {
        p->conn->handshake--;
        int bad = r->type == REDIS_REPLY_ERROR;
        if (bad) dl_reply_error(r, "AUTH/SELECT", err);
        freeReplyObject(r);
        if (bad) return err->code;
        if (!p->conn->handshake && !p->role) {
            p->ready = 1;
            arm(p);
        }
        return DLOCK_OK;
    }
    if (p->role) return confirm(p, r, err);
    if (p->cl->sent && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "READONLY", 8)) {
        freeReplyObject(r);
        return dl_seterr(err, DLOCK_EIO,
                         "the master the sentinels named became a replica (a failover)");
    }
    if (p->push && p->push(p, r)) {
        freeReplyObject(r);
        return DLOCK_OK;
    }
    dl_areq *q = p->head;
    /* no request, or the head's not sent in full yet (queued by a done of
     * this read: a reply of the same read that follows is an extra one) */
    if (!q || q->end > p->qbytes - p->conn->olen) {
        freeReplyObject(r);
        return dl_seterr(err, DLOCK_EIO,
                         "the server sent a reply nobody asked for: connection out of step");
    }
    p->head = q->next;
    if (!p->head) p->tail = NULL;
    p->pending--;
    q->next = NULL;
    arm(p);
    /* a cluster's redirect (MOVED, ASK, TRYAGAIN) takes the request away */
    if (q->raw && r->type == REDIS_REPLY_ERROR && p->redirect && p->redirect(p, q, r)) {
        freeReplyObject(r);
        return DLOCK_OK;
    }
    free(q->raw);
    q->raw = NULL;
    q->done(q, r, NULL);
    freeReplyObject(r);
    return DLOCK_OK;
}

/* Sentinel: closes the sentinel asked and asks the next one; when none is
 * left, fails p with the last failure. */
static void probe_next(dl_apipe *p) {
    dl_err err;
    dl_aloop_want(&p->cl->loop, p->slot, -1, 0);
    dl_aprobe_stop(&p->probe);
    if (dl_aprobe_start(p->cl->sent, &p->probe, p->cl->connect_timeout_ms, &err)) {
        dl_apipe_fail(p, &err);
        return;
    }
    arm(p);
    dl_apipe_update(p);
}

/* Sentinel: the master is at host:port (host taken): connects to it,
 * ROLE first. */
static void master_named(dl_apipe *p, char *host, int port) {
    dl_aclient *c = p->cl;
    dl_err err = {0};
    if (!c->ep.host || strcmp(c->ep.host, host) != 0 || c->ep.port != port) {
        free(c->ep.host);
        c->ep.host = host;
        c->ep.port = port;
        c->ep_gen++;
    } else {
        free(host);
    }
    dl_conn *conn = NULL;
    int rc = dl_conn_open_start(&c->ep, &conn, &err);
    if (rc == DLOCK_ENOTSUP) {
        /* a name with several addresses: the blocking way (dlock_async.h) */
        int64_t dl = dl_deadline(c->connect_timeout_ms);
        rc = dl_conn_open(&c->ep, dl < p->connect_deadline ? dl : p->connect_deadline, &conn, &err);
    }
    const char *argv[1] = {"ROLE"};
    size_t lens[1] = {4};
    if (!rc) rc = dl_conn_append(conn, 1, argv, lens, &err);
    if (rc) {
        dl_conn_close(conn);
        dl_apipe_fail(p, &err);
        return;
    }
    p->conn = conn;
    p->role = 1;
    p->gen = c->ep_gen;
    int64_t dl = dl_deadline(c->connect_timeout_ms);
    if (dl < p->connect_deadline) p->connect_deadline = dl;
    arm(p);
    dl_apipe_update(p);
    if (c->named) c->named(c);
}

static void probe_io(dl_apipe *p, int events) {
    char *host = NULL;
    int port = 0;
    dl_err err = {0};
    int r = dl_aprobe_io(p->cl->sent, &p->probe, events, &host, &port, &err);
    if (r == 0) {
        dl_apipe_update(p);
        return;
    }
    if (r == -1) {
        probe_next(p);
        return;
    }
    dl_aloop_want(&p->cl->loop, p->slot, -1, 0);
    dl_aprobe_stop(&p->probe);
    if (r == 1) master_named(p, host, port);
    else dl_apipe_fail(p, &err);
}

void dl_apipe_io(dl_apipe *p, int events) {
    dl_err err = {0};
    int rc = DLOCK_OK;
    if (p->probe.conn) {
        probe_io(p, events);
        return;
    }
    dl_conn *conn = p->conn;
    if (!conn) return;
    if (conn->connecting) {
        /* an event of the socket this fd number had before (a bare loop's
         * poll result) must not pass for the end of the connect */
        struct pollfd pf = {.fd = conn->fd, .events = POLLOUT};
        if (!(events & (DLOCK_ASYNC_WRITE | DLOCK_ASYNC_READ)) || poll(&pf, 1, 0) <= 0) return;
        rc = dl_conn_connected(conn, &err);
        if (!rc && !conn->handshake && !p->role) {
            p->ready = 1;
            arm(p);
        }
    }
    if (!rc && conn->olen) rc = dl_conn_write_some(conn, &err);
    if (!rc && (events & DLOCK_ASYNC_READ)) {
        /* every reply there is now; a done may queue requests (written
         * below) or fail this connection (then it is gone: stop) */
        for (;;) {
            redisReply *r = NULL;
            rc = dl_conn_poll_reply(conn, &r, &err);
            if (rc || !r) break;
            rc = take(p, r, &err);
            if (rc || p->conn != conn) break;
        }
    }
    if (p->conn != conn) return;
    if (!rc && conn->olen) rc = dl_conn_write_some(conn, &err);
    if (rc) {
        dl_apipe_fail(p, &err);
        return;
    }
    dl_apipe_update(p);
}

static void on_timer(dl_atimer *t) {
    dl_apipe *p = t->arg;
    dl_err err;
    int64_t now = dl_now_ms();
    if (p->probe.conn && dl_aprobe_timed_out(p->cl->sent, &p->probe)) {
        probe_next(p);
    } else if ((p->conn || p->held) && !p->ready && now >= p->connect_deadline) {
        char where[300];
        dl_endpoint_describe(p->ep ? p->ep : &p->cl->ep, where, sizeof where);
        dl_seterr(&err, DLOCK_EIO, "connect to %s timed out", where);
        dl_apipe_fail(p, &err);
    } else if (p->head && now >= p->head->deadline) {
        dl_seterr(&err, DLOCK_EIO, "timed out waiting for the server's reply");
        dl_apipe_fail(p, &err);
    } else {
        arm(p);
    }
}
