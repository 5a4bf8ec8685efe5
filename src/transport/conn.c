/* One RESP connection: our own formatter and hiredis' reader over our own transport,
 * so that every read and write has a deadline and TLS or a multiplexed
 * fan-out can sit under the same code. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport.h"

void dl_conn_close(dl_conn *c) {
    if (!c) return;
    if (c->ops) c->ops->close(c);
    if (c->reader) redisReaderFree(c->reader);
    free(c->obuf);
    free(c);
}

int dl_conn_append_raw(dl_conn *c, const char *buf, size_t len, dl_err *err) {
    if (c->olen + len > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 256;
        while (cap < c->olen + len) cap *= 2;
        char *nb = realloc(c->obuf, cap);
        if (!nb) return dl_seterr(err, DLOCK_ENOMEM, "out of memory queueing a command");
        c->obuf = nb;
        c->ocap = cap;
    }
    memcpy(c->obuf + c->olen, buf, len);
    c->olen += len;
    return DLOCK_OK;
}

/* Queues one command in RESP, straight into the output buffer. hiredis'
 * redisFormatCommandArgv formats each length with sprintf and allocates: it
 * was most of the client's instructions per acquire+release pair. */
int dl_conn_append(dl_conn *c, int argc, const char **argv, const size_t *lens, dl_err *err) {
    /* "*argc\r\n" and "$len\r\n<arg>\r\n" per argument, each count <= 20 digits
     * (dl_fmt_ll's NUL lands where the "\r" goes next) */
    size_t need = c->olen + 23;
    for (int i = 0; i < argc; i++) need += 25 + lens[i];
    if (need > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 256;
        while (cap < need) cap *= 2;
        char *nb = realloc(c->obuf, cap);
        if (!nb) return dl_seterr(err, DLOCK_ENOMEM, "out of memory queueing a command");
        c->obuf = nb;
        c->ocap = cap;
    }
    char *p = c->obuf + c->olen;
    *p++ = '*';
    p += dl_fmt_ll(p, argc);
    *p++ = '\r', *p++ = '\n';
    for (int i = 0; i < argc; i++) {
        *p++ = '$';
        p += dl_fmt_ll(p, (long long)lens[i]);
        *p++ = '\r', *p++ = '\n';
        if (lens[i]) memcpy(p, argv[i], lens[i]);
        p += lens[i];
        *p++ = '\r', *p++ = '\n';
    }
    c->olen = (size_t)(p - c->obuf);
    return DLOCK_OK;
}

/* Waits until fd is ready for events before deadline. */
static int wait_fd(dl_conn *c, short events, int64_t deadline, const char *what, dl_err *err) {
    for (;;) {
        int64_t left = deadline == DL_INF_DEADLINE ? 1000000 : deadline - dl_now_ms();
        if (left <= 0) {
            c->broken = 1;
            return dl_seterr(err, DLOCK_EIO, "timed out %s", what);
        }
        struct pollfd p = {.fd = c->fd, .events = events};
        int n = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            c->broken = 1;
            return dl_seterr(err, DLOCK_EIO, "poll: %s", strerror(errno));
        }
        if (n > 0) return DLOCK_OK;
    }
}

int dl_conn_unread(const dl_conn *c) { return c->reader && c->reader->pos < c->reader->len; }

int dl_conn_flush(dl_conn *c, int64_t deadline, dl_err *err) {
    if (c->broken) return dl_seterr(err, DLOCK_EIO, "connection is broken");
    /* New requests go out only once every reply to the earlier ones was
     * read: bytes still unread then are a reply nobody asked for (a request
     * the network delivered twice, say). The stream is out of step with its
     * requests, and the next reply read would be taken for the new
     * request's answer: never use it again (a subscribed connection's
     * messages, and the replies to a handshake sent with the first request,
     * come unasked) */
    if (c->olen && !c->subscribed && !c->draining && c->handshake <= 0 && dl_conn_unread(c)) {
        c->broken = 1;
        return dl_seterr(err, DLOCK_EIO,
                         "the server sent a reply nobody asked for: connection out of step");
    }
    for (;;) {
        int rc = dl_conn_write_some(c, err);
        if (rc || !c->olen) return rc;
        rc = wait_fd(c, POLLOUT, deadline, "writing to the server", err);
        if (rc) return rc;
    }
}

int dl_conn_write_some(dl_conn *c, dl_err *err) {
    if (c->broken) return dl_seterr(err, DLOCK_EIO, "connection is broken");
    size_t off = 0;
    while (off < c->olen) {
        long n = c->ops->write(c, c->obuf + off, c->olen - off);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        c->broken = 1;
        return dl_seterr(err, DLOCK_EIO, "write to server failed: %s",
                         n < 0 ? strerror(errno) : "connection closed");
    }
    if (off == c->olen) {
        c->olen = 0;
        /* a burst's buffer is not kept: a pipelined burst of thousands of
         * requests grows it to megabytes, which the connection would hold
         * until it closes */
        if (c->ocap > DL_OBUF_KEEP) {
            free(c->obuf);
            c->obuf = NULL;
            c->ocap = 0;
        }
    } else if (off) {
        memmove(c->obuf, c->obuf + off, c->olen - off);
        c->olen -= off;
    }
    return DLOCK_OK;
}

/* A reply that is not RESP: from a server that never answered in RESP on
 * this connection, something else listens there (MariaDB, HTTP...), which
 * is the server being unavailable for locks; later, a protocol error. */
static int bad_reply(const dl_conn *c, dl_err *err) {
    if (c->reply_too_big)
        return dl_seterr(err, DLOCK_EPROTO,
                         "bad reply from server: its arrays hold over %d elements in all",
                         DL_REPLY_MAX_ELEMENTS);
    if (!c->answered)
        return dl_seterr(err, DLOCK_EIO, "not a Redis server? its first reply is not RESP: %s",
                         c->reader->errstr);
    return dl_seterr(err, DLOCK_EPROTO, "bad reply from server: %s", c->reader->errstr);
}

int dl_conn_take(dl_conn *c, redisReply **out, dl_err *err) {
    void *reply = NULL;
    *out = NULL;
    if (redisReaderGetReply(c->reader, &reply) != REDIS_OK) {
        c->broken = 1;
        if (c->reader->err == REDIS_ERR_OOM && !c->reply_too_big)
            return dl_seterr(err, DLOCK_ENOMEM, "out of memory reading a reply");
        return bad_reply(c, err);
    }
    if (reply) {
        c->answered = 1;
        *out = reply;
    }
    return DLOCK_OK;
}

/* One read of what the socket has into the reader: 1 read, 0 nothing there
 * yet (EAGAIN, EINTR), or a failure (the connection then broken). */
static int feed_once(dl_conn *c, dl_err *err) {
    char buf[16384];
    long n = c->ops->read(c, buf, sizeof buf);
    if (n > 0) {
        if (redisReaderFeed(c->reader, buf, (size_t)n) == REDIS_OK) return 1;
        c->broken = 1;
        return -dl_seterr(err, DLOCK_ENOMEM, "out of memory reading a reply");
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    c->broken = 1;
    return -dl_seterr(err, DLOCK_EIO, "connection to server lost: %s",
                      n < 0 ? strerror(errno) : "closed by the server");
}

int dl_conn_read(dl_conn *c, int64_t deadline, redisReply **out, dl_err *err) {
    *out = NULL;
    if (c->broken) return dl_seterr(err, DLOCK_EIO, "connection is broken");
    for (;;) {
        int rc = dl_conn_take(c, out, err);
        if (rc || *out) return rc;
        /* a reply is rarely there yet right after a request: wait first
         * rather than pay for a read that answers EAGAIN (unless TLS already
         * holds decrypted bytes the socket no longer shows) */
        if (!dl_conn_has_pending(c)) {
            rc = wait_fd(c, POLLIN, deadline, "waiting for the server's reply", err);
            if (rc) return rc;
        }
        int got = feed_once(c, err);
        if (got < 0) return -got;
    }
}

int dl_conn_poll_reply(dl_conn *c, redisReply **out, dl_err *err) {
    *out = NULL;
    if (c->broken) return dl_seterr(err, DLOCK_EIO, "connection is broken");
    for (;;) {
        int rc = dl_conn_take(c, out, err);
        if (rc || *out) return rc;
        int got = feed_once(c, err);
        if (got < 0) return -got;
        if (!got && errno != EINTR) return DLOCK_OK; /* nothing more there yet */
    }
}

int dl_conn_command(dl_conn *c, int64_t deadline, int argc, const char **argv,
                    const size_t *lens, redisReply **out, dl_err *err) {
    int rc = dl_conn_append(c, argc, argv, lens, err);
    if (!rc) rc = dl_conn_flush(c, deadline, err);
    if (!rc) rc = dl_conn_read(c, deadline, out, err);
    return rc;
}

int dl_conn_stale(dl_conn *c) {
    if (c->broken || c->fd < 0) return 1;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int n = poll(&p, 1, 0);
    /* an idle connection has nothing to read: readable means EOF, an error
     * or bytes we did not ask for */
    return n != 0;
}

int dl_reply_error(const redisReply *r, const char *what, dl_err *err) {
    const char *s = r && r->str ? r->str : "";
    int len = r ? (int)r->len : 0;
    if (len > 160) len = 160;
    int code = DLOCK_ESERVER;
    if (!strncmp(s, "NOAUTH", 6) || !strncmp(s, "WRONGPASS", 9) || !strncmp(s, "NOPERM", 6) ||
        strstr(s, "invalid password") || strstr(s, "invalid username-password"))
        code = DLOCK_EAUTH;
    return dl_seterr(err, code, "%s: server error: %.*s", what, len, s);
}

int dl_reply_int(const redisReply *r, long long *v) {
    if (!r) return -1;
    if (r->type == REDIS_REPLY_INTEGER) {
        *v = r->integer;
        return 0;
    }
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
        char *end;
        errno = 0;
        long long x = strtoll(r->str, &end, 10);
        if (errno || end == r->str || *end) return -1;
        *v = x;
        return 0;
    }
    return -1;
}

/* hiredis' reader allocates an array's element pointers as soon as its
 * header arrives, before any element: "*1000000000" alone would cost 8 GB,
 * and a run of such headers nested one in the other as much again each.
 * The reader's functions are hiredis' own but for createArray, which counts
 * the elements of every array of a reply and refuses the reply once they
 * pass DL_REPLY_MAX_ELEMENTS (the reader then fails, and the connection is
 * dropped with a protocol error). The count starts again at each reply. */
#if HIREDIS_MAJOR >= 1
typedef size_t array_count; /* createArray's element count */
#else
typedef int array_count;
#endif
static redisReplyObjectFunctions bounded_fns;
static void *(*hiredis_create_array)(const redisReadTask *, array_count);
static pthread_once_t bounded_once = PTHREAD_ONCE_INIT;

static void *bounded_create_array(const redisReadTask *task, array_count elements) {
    dl_conn *c = task->privdata;
    if (!task->parent) c->reply_elements = 0;
    if (elements > 0) {
        if ((size_t)elements > DL_REPLY_MAX_ELEMENTS - c->reply_elements) {
            c->reply_too_big = 1;
            return NULL;
        }
        c->reply_elements += (size_t)elements;
    }
    return hiredis_create_array(task, elements);
}

static void bounded_init(void) {
    redisReader *r = redisReaderCreate();
    if (!r) return;
    bounded_fns = *r->fn;
    hiredis_create_array = bounded_fns.createArray;
    bounded_fns.createArray = bounded_create_array;
    redisReaderFree(r);
}

/* A connection with its reader and no socket yet. */
static dl_conn *conn_new(void) {
    pthread_once(&bounded_once, bounded_init);
    if (!hiredis_create_array) return NULL;
    dl_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = -1;
    c->redirect_acks = -1;
    c->reader = redisReaderCreateWithFunctions(&bounded_fns);
    if (!c->reader) {
        free(c);
        return NULL;
    }
    c->reader->privdata = c;
    return c;
}

/* Appends ep's AUTH and SELECT (each when it has one) to c's output, so that
 * they go out in one write with what follows; *count: how many replies they
 * will take. */
static int queue_handshake(dl_conn *c, const dl_endpoint *ep, int *count, dl_err *err) {
    int rc = DLOCK_OK;
    *count = 0;
    if (ep->password) {
        const char *argv[3] = {"AUTH", ep->user ? ep->user : ep->password, ep->password};
        size_t lens[3] = {4, strlen(argv[1]), strlen(ep->password)};
        rc = dl_conn_append(c, ep->user ? 3 : 2, argv, lens, err);
        (*count)++;
    }
    if (!rc && ep->db) {
        char db[16];
        int n = snprintf(db, sizeof db, "%d", ep->db);
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, (size_t)n};
        rc = dl_conn_append(c, 2, argv, lens, err);
        (*count)++;
    }
    return rc;
}

int dl_conn_open(const dl_endpoint *ep, int64_t deadline, dl_conn **out, dl_err *err) {
    *out = NULL;
    dl_conn *c = conn_new();
    if (!c) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int rc = dl_transport_connect(ep, deadline, &c->fd, err);
    if (rc) {
        dl_conn_close(c);
        return rc;
    }
    c->ops = &dl_plain_transport;
    if (ep->tls && (rc = dl_tls_handshake(c, ep, deadline, err)) != DLOCK_OK) {
        dl_conn_close(c);
        return rc;
    }

    /* AUTH and SELECT, pipelined: one round trip */
    int expect;
    rc = queue_handshake(c, ep, &expect, err);
    if (!rc && expect) rc = dl_conn_flush(c, deadline, err);
    for (int i = 0; !rc && i < expect; i++) {
        redisReply *r;
        rc = dl_conn_read(c, deadline, &r, err);
        if (rc) break;
        if (r->type == REDIS_REPLY_ERROR)
            rc = dl_reply_error(r, (i == 0 && ep->password) ? "AUTH" : "SELECT", err);
        freeReplyObject(r);
    }
    if (rc) {
        dl_conn_close(c);
        return rc;
    }
    *out = c;
    return DLOCK_OK;
}

int dl_conn_open_start(const dl_endpoint *ep, dl_conn **out, dl_err *err) {
    *out = NULL;
    if (ep->tls) return dl_seterr(err, DLOCK_ENOTSUP, "TLS connections are opened one by one");
    dl_conn *c = conn_new();
    if (!c) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int rc = dl_transport_connect_start(ep, &c->fd, &c->connecting, err);
    c->ops = &dl_plain_transport;
    if (rc) c->fd = -1;
    if (!rc) rc = queue_handshake(c, ep, &c->handshake, err);
    if (rc) {
        dl_conn_close(c);
        return rc;
    }
    *out = c;
    return DLOCK_OK;
}

int dl_conn_connected(dl_conn *c, dl_err *err) {
    int so = 0;
    socklen_t sl = sizeof so;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so, &sl) < 0) so = errno;
    if (so) {
        c->broken = 1;
        return dl_seterr(err, DLOCK_EIO, "connect: %s", strerror(so));
    }
    c->connecting = 0;
    return DLOCK_OK;
}
