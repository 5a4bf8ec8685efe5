/* TLS under a connection (rediss://), with OpenSSL over the same
 * non-blocking socket: the handshake and every read and write keep their
 * deadlines. The server's certificate is verified unless the caller asked
 * for tls_insecure (tests only). */
#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport.h"

static long tls_read(dl_conn *c, void *buf, size_t len) {
    int n = SSL_read(c->tls, buf, len > INT32_MAX ? INT32_MAX : (int)len);
    if (n > 0) return n;
    int e = SSL_get_error(c->tls, n);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        errno = EAGAIN;
        return -1;
    }
    if (e == SSL_ERROR_ZERO_RETURN) return 0;
    if (e != SSL_ERROR_SYSCALL || errno == 0) errno = EPROTO;
    ERR_clear_error();
    return -1;
}

static long tls_write(dl_conn *c, const void *buf, size_t len) {
    int n = SSL_write(c->tls, buf, len > INT32_MAX ? INT32_MAX : (int)len);
    if (n > 0) return n;
    int e = SSL_get_error(c->tls, n);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        errno = EAGAIN;
        return -1;
    }
    if (e != SSL_ERROR_SYSCALL || errno == 0) errno = EPIPE;
    ERR_clear_error();
    return -1;
}

static void tls_close(dl_conn *c) {
    if (c->tls) {
        SSL_free(c->tls);
        c->tls = NULL;
    }
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

static size_t tls_pending(dl_conn *c) { return c->tls ? (size_t)SSL_pending(c->tls) : 0; }

static const dl_transport_ops tls_transport = {tls_read, tls_write, tls_close, tls_pending};

int dl_conn_has_pending(dl_conn *c) { return c->ops && c->ops->pending && c->ops->pending(c) > 0; }

/* The first OpenSSL error as text (never contains secrets). */
static const char *ssl_reason(void) {
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "handshake failed";
}

int dl_tls_ctx_new(const dlock_options *o, void **ctx_out, dl_err *err) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) return dl_seterr(err, DLOCK_ENOMEM, "TLS: cannot create a context");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    int rc = DLOCK_OK;
    if (!o->tls_insecure) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        if (o->tls_ca_file || o->tls_ca_dir) {
            if (SSL_CTX_load_verify_locations(ctx, o->tls_ca_file, o->tls_ca_dir) != 1)
                rc = dl_seterr(err, DLOCK_ETLS, "TLS: cannot load the CA file or directory (%s)",
                               ssl_reason());
        } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
            rc = dl_seterr(err, DLOCK_ETLS, "TLS: cannot load the system's CAs (%s)", ssl_reason());
        }
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    if (!rc && (o->tls_cert_file || o->tls_key_file)) {
        if (!o->tls_cert_file || !o->tls_key_file)
            rc = dl_seterr(err, DLOCK_EINVAL, "TLS: a client certificate needs both cert and key");
        else if (SSL_CTX_use_certificate_chain_file(ctx, o->tls_cert_file) != 1 ||
                 SSL_CTX_use_PrivateKey_file(ctx, o->tls_key_file, SSL_FILETYPE_PEM) != 1 ||
                 SSL_CTX_check_private_key(ctx) != 1)
            rc = dl_seterr(err, DLOCK_ETLS, "TLS: cannot load the client certificate or key (%s)",
                           ssl_reason());
    }
    ERR_clear_error();
    if (rc) {
        SSL_CTX_free(ctx);
        return rc;
    }
    *ctx_out = ctx;
    return DLOCK_OK;
}

static void ctx_up(void *ctx) { SSL_CTX_up_ref(ctx); }
static void ctx_down(void *ctx) { SSL_CTX_free(ctx); }
const dl_ref_ops dl_tls_ctx_ref_ops = {ctx_up, ctx_down};

/* How long a handshake may stall before plaintext_redis() looks at the
 * server: a TLS server answers the ClientHello within a round trip, a
 * plaintext Redis never does (it waits for the end of an inline command the
 * ClientHello does not end). */
#define DL_TLS_PROBE_AFTER_MS 150

/* 1 when the server c is connected to answers a plaintext PING in RESP,
 * on a second connection to the same address before deadline: a Redis
 * without TLS there. A TLS server drops the probe; 0 then, and on any
 * doubt. */
static int plaintext_redis(const dl_conn *c, int64_t deadline) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (getpeername(c->fd, (struct sockaddr *)&sa, &sl) != 0) return 0;
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    int yes = 0;
    if (connect(fd, (struct sockaddr *)&sa, sl) == 0 || errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int64_t left = deadline - dl_now_ms();
        if (left > 0 && poll(&p, 1, left > 1000000 ? 1000000 : (int)left) == 1 &&
            send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6) {
            char buf[8];
            size_t got = 0;
            while (got < 1 && (left = deadline - dl_now_ms()) > 0) {
                p.events = POLLIN;
                if (poll(&p, 1, left > 1000000 ? 1000000 : (int)left) != 1) break;
                ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
                if (n <= 0) break;
                got += (size_t)n;
            }
            yes = got >= 1 && (buf[0] == '+' || buf[0] == '-');
        }
    }
    close(fd);
    return yes;
}

int dl_tls_handshake(dl_conn *c, const dl_endpoint *ep, int64_t deadline, dl_err *err) {
    char where[300];
    dl_endpoint_describe(ep, where, sizeof where);
    if (!ep->tls_ctx) return dl_seterr(err, DLOCK_ETLS, "TLS to %s: no TLS context", where);
    SSL *ssl = SSL_new(ep->tls_ctx);
    if (!ssl) return dl_seterr(err, DLOCK_ENOMEM, "TLS: out of memory");
    const char *name = ep->sni ? ep->sni : ep->host;
    unsigned char addr[16];
    int is_ip = name && (inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1);
    if (name && !is_ip) SSL_set_tlsext_host_name(ssl, name);
    if (name && SSL_CTX_get_verify_mode(ep->tls_ctx) != SSL_VERIFY_NONE) {
        /* the certificate must name the host we meant to reach */
        X509_VERIFY_PARAM *vp = SSL_get0_param(ssl);
        if (is_ip) X509_VERIFY_PARAM_set1_ip_asc(vp, name);
        else SSL_set1_host(ssl, name);
    }
    SSL_set_fd(ssl, c->fd);
    int64_t probe_at = dl_now_ms() + DL_TLS_PROBE_AFTER_MS;
    for (;;) {
        int r = SSL_connect(ssl);
        if (r == 1) break;
        int e = SSL_get_error(ssl, r);
        short ev = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
        int64_t now = dl_now_ms(), left = deadline - now;
        int plain = 0;
        if (ev == POLLIN && probe_at && now >= probe_at) {
            probe_at = 0; /* once */
            plain = plaintext_redis(c, deadline);
        }
        if (ev && left > 0 && !plain) {
            /* wake at the probe time while it is still to come */
            int64_t slice = probe_at && probe_at - now < left ? probe_at - now : left;
            if (slice < 1) slice = 1;
            struct pollfd p = {.fd = c->fd, .events = ev};
            if (poll(&p, 1, slice > 1000000 ? 1000000 : (int)slice) >= 0 || errno == EINTR)
                continue;
        }
        int rc;
        if (plain) {
            rc = dl_seterr(err, DLOCK_ETLS,
                           "TLS handshake with %s: the server speaks plaintext Redis, not TLS "
                           "(use redis://, or its TLS port)",
                           where);
        } else if (ev) {
            rc = dl_seterr(err, DLOCK_EIO, "TLS handshake with %s timed out", where);
        } else {
            long v = SSL_get_verify_result(ssl);
            if (v != X509_V_OK)
                rc = dl_seterr(err, DLOCK_ETLS, "TLS handshake with %s: certificate verify failed (%s)",
                               where, X509_verify_cert_error_string(v));
            else
                rc = dl_seterr(err, DLOCK_ETLS, "TLS handshake with %s failed: %s", where,
                               ssl_reason());
        }
        ERR_clear_error();
        SSL_free(ssl);
        return rc;
    }
    c->tls = ssl;
    c->ops = &tls_transport;
    return DLOCK_OK;
}
