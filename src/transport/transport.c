/* The byte stream under a connection: non-blocking TCP and unix sockets with
 * a connect deadline. TLS would be another dl_transport_ops. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport.h"

static long plain_read(dl_conn *c, void *buf, size_t len) { return (long)read(c->fd, buf, len); }

static long plain_write(dl_conn *c, const void *buf, size_t len) {
    /* MSG_NOSIGNAL: a closed peer gives EPIPE, never SIGPIPE */
    return (long)send(c->fd, buf, len, MSG_NOSIGNAL);
}

static void plain_close(dl_conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

const dl_transport_ops dl_plain_transport = {plain_read, plain_write, plain_close, NULL};

/* Waits for a non-blocking connect on fd to finish before deadline. */
static int finish_connect(int fd, int64_t deadline, const char *where, dl_err *err) {
    for (;;) {
        int64_t left = deadline - dl_now_ms();
        if (left <= 0) return dl_seterr(err, DLOCK_EIO, "connect to %s timed out", where);
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (n < 0) {
            if (errno == EINTR) continue;
            return dl_seterr(err, DLOCK_EIO, "connect to %s: poll: %s", where, strerror(errno));
        }
        if (n == 0) continue;
        int so = 0;
        socklen_t sl = sizeof so;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) < 0) so = errno;
        if (so) return dl_seterr(err, DLOCK_EIO, "connect to %s: %s", where, strerror(so));
        return DLOCK_OK;
    }
}

/* A non-blocking stream socket for family in *fd_out (TCP: no Nagle,
 * keep-alives). */
static int new_socket(int family, int *fd_out, dl_err *err) {
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return dl_seterr(err, DLOCK_ESYS, "socket: %s", strerror(errno));
    if (family != AF_UNIX) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    }
    *fd_out = fd;
    return DLOCK_OK;
}

/* The addresses of ep: a unix socket in *sun (*res NULL), or the TCP
 * addresses getaddrinfo gives in *res (freed by the caller). */
static int resolve(const dl_endpoint *ep, const char *where, struct sockaddr_un *sun,
                   struct addrinfo **res, dl_err *err) {
    *res = NULL;
    if (ep->path) {
        memset(sun, 0, sizeof *sun);
        sun->sun_family = AF_UNIX;
        if (strlen(ep->path) >= sizeof sun->sun_path)
            return dl_seterr(err, DLOCK_EINVAL, "unix socket path too long");
        strcpy(sun->sun_path, ep->path);
        return DLOCK_OK;
    }
    char port[16];
    snprintf(port, sizeof port, "%d", ep->port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(ep->host, port, &hints, res);
    if (g != 0)
        return dl_seterr(err, g == EAI_MEMORY ? DLOCK_ENOMEM : DLOCK_EIO, "cannot resolve %s: %s",
                         where, gai_strerror(g));
    return DLOCK_OK;
}

static int connect_addr(int family, const struct sockaddr *sa, socklen_t salen, int64_t deadline,
                        const char *where, int *fd_out, dl_err *err) {
    int fd;
    int rc = new_socket(family, &fd, err);
    if (rc) return rc;
    if (connect(fd, sa, salen) < 0) {
        if (errno == EINPROGRESS || errno == EAGAIN) rc = finish_connect(fd, deadline, where, err);
        else rc = dl_seterr(err, DLOCK_EIO, "connect to %s: %s", where, strerror(errno));
    }
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return DLOCK_OK;
}

int dl_transport_connect(const dl_endpoint *ep, int64_t deadline, int *fd_out, dl_err *err) {
    char where[300];
    dl_endpoint_describe(ep, where, sizeof where);
    struct sockaddr_un sun;
    struct addrinfo *res;
    int rc = resolve(ep, where, &sun, &res, err);
    if (rc) return rc;
    if (!res)
        return connect_addr(AF_UNIX, (struct sockaddr *)&sun, sizeof sun, deadline, where, fd_out,
                            err);
    rc = DLOCK_EIO;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        rc = connect_addr(ai->ai_family, ai->ai_addr, ai->ai_addrlen, deadline, where, fd_out, err);
        if (rc == DLOCK_OK) break;
    }
    freeaddrinfo(res);
    return rc;
}

/* Starts a non-blocking connect to one address: DLOCK_OK with *fd_out set
 * and *in_progress 1 while it goes on (poll for POLLOUT, then SO_ERROR). */
static int start_addr(int family, const struct sockaddr *sa, socklen_t salen, const char *where,
                      int *fd_out, int *in_progress, dl_err *err) {
    int fd;
    int rc = new_socket(family, &fd, err);
    if (rc) return rc;
    *in_progress = 0;
    if (connect(fd, sa, salen) < 0) {
        if (errno != EINPROGRESS) {
            int e = errno;
            close(fd);
            return dl_seterr(err, DLOCK_EIO, "connect to %s: %s", where, strerror(e));
        }
        *in_progress = 1;
    }
    *fd_out = fd;
    return DLOCK_OK;
}

int dl_transport_connect_start(const dl_endpoint *ep, int *fd_out, int *in_progress,
                               dl_err *err) {
    char where[300];
    dl_endpoint_describe(ep, where, sizeof where);
    struct sockaddr_un sun;
    struct addrinfo *res;
    int rc = resolve(ep, where, &sun, &res, err);
    if (rc) return rc;
    if (!res)
        return start_addr(AF_UNIX, (struct sockaddr *)&sun, sizeof sun, where, fd_out,
                          in_progress, err);
    /* a connect that fails later cannot go on to the next address here:
     * a name with several is connected the blocking way, address by address */
    rc = res->ai_next ? dl_seterr(err, DLOCK_ENOTSUP, "%s has several addresses", where)
                        : start_addr(res->ai_family, res->ai_addr, res->ai_addrlen, where, fd_out,
                                     in_progress, err);
    freeaddrinfo(res);
    return rc;
}
