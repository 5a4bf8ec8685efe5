/* The transport layer (src/transport/): a connection to one Redis server
 * and the RESP stream on it: sockets, TLS, pipelined commands and their
 * replies. It knows endpoints (base) and nothing above: no pool, no
 * topology, no script. Its files include base.h and this header alone
 * (scripts/check-layers). */
#ifndef DLOCK_TRANSPORT_H
#define DLOCK_TRANSPORT_H

#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include "base.h"

typedef struct dl_conn dl_conn;

/* The byte stream under a connection: plain sockets now; TLS fits here. */
typedef struct dl_transport_ops {
    /* like read(2)/write(2) on a non-blocking fd: >0 bytes, 0 EOF (read),
     * -1 with errno (EAGAIN: poll and retry) */
    long (*read)(dl_conn *c, void *buf, size_t len);
    long (*write)(dl_conn *c, const void *buf, size_t len);
    void (*close)(dl_conn *c);
    /* bytes already received and decrypted but not yet read (TLS) */
    size_t (*pending)(dl_conn *c);
} dl_transport_ops;

/* A script call (an upper layer's dl_call) can ride after the next script
 * call on a connection, in the same write, its reply read and dropped
 * (dl_conn.post: holder identity records). Opaque here. */
typedef struct dl_call dl_call;

/* The array elements one reply may hold in all (nested arrays included):
 * the reader allocates their pointers before they arrive (conn.c). */
#define DL_REPLY_MAX_ELEMENTS (1 << 22)
/* The most output buffer a connection keeps once it has written it all. */
#define DL_OBUF_KEEP 16384

struct dl_conn {
    int fd;
    const dl_transport_ops *ops;
    void *tls;                 /* transport state (unused by plain sockets) */
    redisReader *reader;
    char *obuf;                /* pending output (pipelined commands); a buffer
                                * over DL_OBUF_KEEP is freed once written */
    size_t olen, ocap;
    int broken;                /* I/O failed: never reuse */
    int connecting;            /* dl_conn_open_start: the connect goes on */
    int handshake;             /* replies to AUTH / SELECT still to come first */
    int answered;              /* a whole RESP reply was read on it */
    size_t reply_elements;     /* array elements of the reply being read */
    int reply_too_big;         /* a reply went past DL_REPLY_MAX_ELEMENTS */
    dl_call *post;             /* run after the next script call (dl_eval), then cleared */
    /* the last script call's reply came from another connection (a Redis
     * Cluster redirect) whose write was waited for there: the replicas
     * that acknowledged it, for the WAIT the caller asks of this one
     * (redirect_acks -1: none was waited for) */
    long long redirect_acks;
    int sharded;               /* a Redis Cluster node's without a pool (the
                                * async client's): scripts publish sharded */
    int subscribed;            /* in pub/sub mode */
    int draining;              /* UNSUBSCRIBE sent, confirmation not read yet */
    int64_t idle_since_ms;     /* monotonic ms it was returned to its pool
                                * (or kept lingering: pubsub.c) */
    struct dl_node *node;      /* the pool it returns to */
    unsigned node_gen;         /* the node's address generation it was opened to */
    dl_conn *next;             /* pool link */
};

/* ---- TLS (tls.c) ---- */
/* How endpoints take and drop references of a TLS context (SSL_CTX). */
extern const dl_ref_ops dl_tls_ctx_ref_ops;
/* An SSL_CTX from the client's TLS options (verification on unless insecure). */
int dl_tls_ctx_new(const dlock_options *o, void **ctx_out, dl_err *err);
/* TLS handshake over c's connected socket before deadline; on success c
 * uses the TLS transport. */
int dl_tls_handshake(dl_conn *c, const dl_endpoint *ep, int64_t deadline, dl_err *err);
/* 1 if c holds received bytes the socket no longer shows (TLS buffers). */
int dl_conn_has_pending(dl_conn *c);

/* Opens a non-blocking socket to ep and connects before deadline. */
int dl_transport_connect(const dl_endpoint *ep, int64_t deadline, int *fd_out, dl_err *err);
/* Starts a non-blocking connect to ep: *in_progress 1 while it goes on.
 * DLOCK_ENOTSUP when ep's name has several addresses (dl_transport_connect
 * tries them one by one). */
int dl_transport_connect_start(const dl_endpoint *ep, int *fd_out, int *in_progress,
                               dl_err *err);
extern const dl_transport_ops dl_plain_transport;

/* Connects, authenticates and selects the db before deadline. */
int dl_conn_open(const dl_endpoint *ep, int64_t deadline, dl_conn **out, dl_err *err);
void dl_conn_close(dl_conn *c);
/* Opens without waiting (not TLS, nor a name with several addresses:
 * DLOCK_ENOTSUP, open those with dl_conn_open): starts the connect and
 * queues AUTH and SELECT. While c->connecting, poll c->fd for POLLOUT, then
 * dl_conn_connected; the queued commands go out with the first flush, and
 * their c->handshake replies come before any other. dl_fanout_eval drives
 * such connections itself. */
int dl_conn_open_start(const dl_endpoint *ep, dl_conn **out, dl_err *err);
/* The connect of a c->connecting connection finished (POLLOUT): DLOCK_OK, or
 * DLOCK_EIO (c broken) when it failed. */
int dl_conn_connected(dl_conn *c, dl_err *err);
/* Queues len bytes of commands already in RESP (another connection's
 * queued output: the async client's requests held while Sentinel names the
 * master). */
int dl_conn_append_raw(dl_conn *c, const char *buf, size_t len, dl_err *err);
/* Queues one command (binary-safe argv). */
int dl_conn_append(dl_conn *c, int argc, const char **argv, const size_t *lens, dl_err *err);
/* Writes what the socket takes of the queued output now, never waiting
 * (an event loop's connection): DLOCK_OK with c->olen the bytes still
 * queued, or DLOCK_EIO (c broken). */
int dl_conn_write_some(dl_conn *c, dl_err *err);
/* Writes all queued output before deadline. */
int dl_conn_flush(dl_conn *c, int64_t deadline, dl_err *err);
/* A reply the reader already holds whole into *out (NULL: none yet),
 * reading nothing. A reply that is not RESP (or too big, or memory run out)
 * breaks the connection and is the failure. */
int dl_conn_take(dl_conn *c, redisReply **out, dl_err *err);
/* Reads the next reply before deadline. An error reply is returned as a
 * reply (type REDIS_REPLY_ERROR), not as a failure. */
int dl_conn_read(dl_conn *c, int64_t deadline, redisReply **out, dl_err *err);
/* Takes a reply if one is complete, reading only what is there (never
 * blocks): DLOCK_OK with *out NULL when none is complete yet. */
int dl_conn_poll_reply(dl_conn *c, redisReply **out, dl_err *err);
/* append + flush + read. */
int dl_conn_command(dl_conn *c, int64_t deadline, int argc, const char **argv,
                    const size_t *lens, redisReply **out, dl_err *err);
/* 1 if the idle connection shows EOF or unexpected data (so is stale). */
int dl_conn_stale(dl_conn *c);
/* 1 when c's reader holds bytes not read as a reply yet. */
int dl_conn_unread(const dl_conn *c);
/* Maps an error reply to a code and message (NOPERM/NOAUTH -> EAUTH...). */
int dl_reply_error(const redisReply *r, const char *what, dl_err *err);

/* Reply helpers (conn.c) */
int dl_reply_int(const redisReply *r, long long *v);

#endif
