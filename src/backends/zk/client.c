/* The ZooKeeper client: open, close, ping, server facts, and the backend table. (The design: zk.h.) */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <zookeeper/zookeeper_version.h>

#include "zk.h"

/* ---- client ---- */

static void zk_close(dlock_client *c) {
    zk_client *zc = c->backend_client;
    if (!zc) return;
    dl_zk_sess_unref(zc->sess);
    pthread_mutex_destroy(&zc->mu);
    free(zc->hosts);
    free(zc->root);
    free(zc->sems);
    free(zc);
    c->backend_client = NULL;
}

/* Connects to each host of the list in turn (TCP only) until one accepts,
 * within the connect timeout: the C client itself retries refused hosts
 * forever, so without this a wrong address would only show as a timeout. */
static int probe_hosts(zk_client *zc, dl_err *err) {
    char *list = strdup(zc->hosts);
    if (!list) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int64_t deadline = dl_deadline(zc->connect_timeout_ms);
    int rc = DLOCK_EIO;
    dl_err last = {0};
    char *save = NULL;
    for (char *h = strtok_r(list, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(h, ':');
        char *host = h;
        long port = 2181;
        if (colon && (h[0] != '[' || colon > strchr(h, ']'))) {
            char *end = NULL;
            port = strtol(colon + 1, &end, 10);
            if (!colon[1] || *end || port <= 0 || port > 65535) {
                rc = dl_seterr(err, DLOCK_EINVAL, "bad zookeeper host list '%s' (host:port,...)",
                               zc->hosts);
                break;
            }
            *colon = '\0';
        }
        if (host[0] == '[') {
            host++;
            char *rb = strchr(host, ']');
            if (rb) *rb = '\0';
        }
        if (!*host) {
            rc = dl_seterr(err, DLOCK_EINVAL, "bad zookeeper host list '%s' (host:port,...)",
                           zc->hosts);
            break;
        }
        dl_endpoint ep;
        memset(&ep, 0, sizeof ep);
        ep.host = host;
        ep.port = (int)port;
        int fd = -1;
        rc = dl_transport_connect(&ep, deadline, &fd, &last);
        if (!rc) {
            close(fd);
            break;
        }
    }
    free(list);
    if (rc == DLOCK_EIO || rc == DLOCK_ENOMEM)
        return dl_seterr(err, rc, "zookeeper: no server of %s reachable: %s", zc->hosts,
                         last.msg[0] ? last.msg : "connect failed");
    return rc;
}

static int zk_open(dlock_client *c, const char *url, const dlock_options *o, dl_err *err) {
    (void)o;
    zk_client *zc = calloc(1, sizeof *zc);
    if (!zc) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&zc->mu, NULL);
    c->backend_client = zc;
    zc->cmd_timeout_ms = c->command_timeout_ms;
    zc->connect_timeout_ms = c->connect_timeout_ms;
    int64_t sm = c->watchdog_lease_ms;
    zc->session_ms = sm > INT_MAX ? INT_MAX : (int)sm;

    const char *p = url + strlen("zk://");
    size_t hl = strcspn(p, "/");
    if (hl == 0) return dl_seterr(err, DLOCK_EINVAL, "zookeeper URL without hosts (zk://host:2181[/chroot])");
    if (memchr(p, '@', hl) || strpbrk(p, "?#"))
        return dl_seterr(err, DLOCK_EINVAL,
                         "zookeeper URL: credentials and options are not supported "
                         "(zk://host:2181,host:2181[/chroot])");
    zc->hosts = strndup(p, hl);
    if (!zc->hosts) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    /* the chroot: "/a/b" (no trailing slash); "" or "/" is the root */
    char chroot[512];
    size_t cl = strlen(p + hl);
    if (cl >= sizeof chroot) return dl_seterr(err, DLOCK_EINVAL, "zookeeper URL: chroot too long");
    memcpy(chroot, p + hl, cl + 1);
    while (cl > 0 && chroot[cl - 1] == '/') chroot[--cl] = '\0';
    if (strstr(chroot, "//") || strstr(chroot, "/./") || strstr(chroot, "/../") ||
        (cl >= 2 && !strcmp(chroot + cl - 2, "/.")) || (cl >= 3 && !strcmp(chroot + cl - 3, "/..")))
        return dl_seterr(err, DLOCK_EINVAL, "zookeeper URL: bad chroot path '%s'", p + hl);
    zc->root = dl_zk_join3(chroot, "/dlock", "/locks");
    zc->sems = dl_zk_join3(chroot, "/dlock", "/sems");
    if (!zc->root || !zc->sems) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int rc = probe_hosts(zc, err);
    if (rc) return rc;
    zk_sess *s = NULL;
    rc = dl_zk_sess_get(zc, &s, err); /* connect now: a bad address is reported here */
    dl_zk_sess_unref(s);
    return rc;
}

static int zk_ping(dlock_client *c, int64_t *rtt_us, dl_err *err) {
    zk_client *zc = c->backend_client;
    zk_sess *s = NULL;
    int rc = dl_zk_sess_get(zc, &s, err);
    if (rc) return rc;
    int64_t t0 = dl_now_us();
    int zrc = dl_zk_req(zc, s, OP_EXISTS, "/", 0, NULL);
    dl_zk_sess_unref(s);
    if (zrc != ZOK) return dl_zk_fail(zrc, "ping", err);
    if (rtt_us) *rtt_us = dl_now_us() - t0;
    return DLOCK_OK;
}

/* ---- server facts ---- */

/* Sends the `srvr` four-letter word to the connected server; the first line
 * ("Zookeeper version: ...") into buf. */
static int srvr_version(zk_client *zc, zk_sess *s, char *buf, size_t buflen, dl_err *err) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (!zookeeper_get_connected_host(s->zh, (struct sockaddr *)&ss, &sl))
        return dl_seterr(err, DLOCK_EIO, "zookeeper: not connected");
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return dl_seterr(err, DLOCK_ESYS, "socket: %s", strerror(errno));
    int64_t deadline = dl_deadline(zc->cmd_timeout_ms);
    char in[1024];
    size_t got = 0;
    int rc = DLOCK_OK, sent = 0;
    if (connect(fd, (struct sockaddr *)&ss, sl) < 0 && errno != EINPROGRESS)
        rc = dl_seterr(err, DLOCK_EIO, "zookeeper: srvr: connect: %s", strerror(errno));
    while (!rc) {
        int64_t left = deadline - dl_now_ms();
        if (left <= 0) {
            rc = dl_seterr(err, DLOCK_EIO, "zookeeper: srvr: no answer within %lld ms",
                           (long long)zc->cmd_timeout_ms);
            break;
        }
        struct pollfd pf = {.fd = fd, .events = sent ? POLLIN : POLLOUT};
        int pr = poll(&pf, 1, (int)(left > INT_MAX ? INT_MAX : left));
        if (pr <= 0) continue;
        if (!sent) {
            if (send(fd, "srvr", 4, MSG_NOSIGNAL) != 4) {
                rc = dl_seterr(err, DLOCK_EIO, "zookeeper: srvr: %s", strerror(errno));
                break;
            }
            sent = 1;
            continue;
        }
        ssize_t r = read(fd, in + got, sizeof in - 1 - got);
        if (r < 0) {
            rc = dl_seterr(err, DLOCK_EIO, "zookeeper: srvr: %s", strerror(errno));
            break;
        }
        got += (size_t)r;
        if (r == 0 || got == sizeof in - 1) break;
    }
    close(fd);
    if (rc) return rc;
    in[got] = '\0';
    const char *key = "Zookeeper version: ";
    char *v = strstr(in, key);
    if (!v) return dl_seterr(err, DLOCK_ESERVER, "zookeeper: srvr not answered (not in "
                                                 "4lw.commands.whitelist?)");
    v += strlen(key);
    v[strcspn(v, "\r\n")] = '\0';
    snprintf(buf, buflen, "%s", v);
    return DLOCK_OK;
}

static int zk_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                          dl_err *err) {
    zk_client *zc = c->backend_client;
    if (!strcmp(what, "client_version")) {
        snprintf(buf, buflen, "%s", ZOO_VERSION);
        return DLOCK_OK;
    }
    zk_sess *s = NULL;
    int rc = dl_zk_sess_get(zc, &s, err);
    if (rc) return rc;
    if (!strcmp(what, "version")) {
        rc = srvr_version(zc, s, buf, buflen, err);
    } else if (!strcmp(what, "session")) {
        snprintf(buf, buflen, "a ZooKeeper session with a %d ms timeout",
                 zoo_recv_timeout(s->zh));
    } else if (!strcmp(what, "session_timeout_ms")) {
        snprintf(buf, buflen, "%d", zoo_recv_timeout(s->zh));
    } else if (!strcmp(what, "session_id")) {
        const clientid_t *id = zoo_client_id(s->zh);
        snprintf(buf, buflen, "0x%llx", id ? (unsigned long long)id->client_id : 0ULL);
    } else if (!strcmp(what, "server")) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        char host[INET6_ADDRSTRLEN] = "";
        int port = 0;
        if (zookeeper_get_connected_host(s->zh, (struct sockaddr *)&ss, &sl)) {
            if (ss.ss_family == AF_INET) {
                struct sockaddr_in *a = (struct sockaddr_in *)&ss;
                inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
                port = ntohs(a->sin_port);
            } else if (ss.ss_family == AF_INET6) {
                struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
                inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
                port = ntohs(a->sin6_port);
            }
        }
        if (!host[0]) rc = dl_seterr(err, DLOCK_EIO, "zookeeper: not connected");
        else snprintf(buf, buflen, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host, port);
    } else {
        rc = dl_seterr(err, DLOCK_ESERVER, "no such fact '%s' (zookeeper: version, session, "
                                           "session_timeout_ms, session_id, server, "
                                           "client_version)", what);
    }
    dl_zk_sess_unref(s);
    return rc;
}

static const char *const zk_schemes[] = {"zk://", NULL};

const dl_backend dl_backend_zookeeper = {
    .name = "zookeeper",
    .schemes = zk_schemes,
    .kinds = (1u << DLOCK_KIND_PLAIN) | (1u << DLOCK_KIND_REENTRANT) | (1u << DLOCK_KIND_READ) |
             (1u << DLOCK_KIND_WRITE),
    .caps = DL_CAP_CANCEL,
    .open = zk_open,
    .close = zk_close,
    .ping = zk_ping,
    .lock_init = dl_zk_lock_init,
    .lock_destroy = dl_zk_lock_destroy,
    .acquire = dl_zk_acquire,
    .release = dl_zk_release,
    .extend = NULL,
    .check = dl_zk_check,
    .inspect = dl_zk_inspect,
    .fence_current = dl_zk_fence_current,
    .force_unlock = NULL,
    .server_fact = zk_server_fact,
    .sem_init = dl_zk_sem_init,
    .sem_destroy = dl_zk_sem_destroy,
    .sem_acquire = dl_zk_sem_acquire,
    .sem_release = dl_zk_sem_release,
    .sem_available = dl_zk_sem_available,
    .sem_try_set = dl_zk_sem_try_set,
    .sem_add = dl_zk_sem_add,
};
