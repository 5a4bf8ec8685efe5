/* The protected resource and the TCP proxy (faultlib.h). */
#include "faultlib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* KEYS[1] = the max key; ARGV = worker, token, fenced, tag. */
static const char *WRITE_LUA =
    "local max = tonumber(redis.call('GET', KEYS[1]) or '0') "
    "local tok = tonumber(ARGV[2]) "
    "local tail = '' if ARGV[4] ~= '' then tail = ' ' .. ARGV[4] end "
    "if ARGV[3] == '1' and tok <= max then "
    "  redis.call('RPUSH', 'hist', 'W ' .. ARGV[1] .. ' ' .. ARGV[2] .. ' 0' .. tail) return 0 end "
    "if tok > max then redis.call('SET', KEYS[1], ARGV[2]) end "
    "redis.call('RPUSH', 'hist', 'W ' .. ARGV[1] .. ' ' .. ARGV[2] .. ' 1' .. tail) return 1";

redisContext *fl_res_connect(const char *sock)
{
    redisContext *rc = redisConnectUnix(sock);
    if (!rc || rc->err) {
        fprintf(stderr, "worker: cannot reach the resource at %s\n", sock);
        exit(2);
    }
    return rc;
}

void fl_ev(redisContext *rc, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (char *p = buf; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    redisReply *r = redisCommand(rc, "RPUSH hist %s", buf);
    if (!r) {
        fprintf(stderr, "worker: resource I/O error\n");
        exit(2);
    }
    freeReplyObject(r);
}

int fl_res_write(redisContext *rc, const char *max_key, int id, uint64_t tok, int fenced,
                 const char *tag)
{
    char w[16], t[32];
    snprintf(w, sizeof w, "%d", id);
    snprintf(t, sizeof t, "%llu", (unsigned long long)tok);
    redisReply *r = redisCommand(rc, "EVAL %s 1 %s %s %s %s %s", WRITE_LUA, max_key, w, t,
                                 fenced ? "1" : "0", tag ? tag : "");
    if (!r) {
        fprintf(stderr, "worker: resource I/O error\n");
        exit(2);
    }
    int ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* the proxy                                                                */

static ssize_t write_all(int fd, const char *p, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(fd, p + off, n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    return (ssize_t)n;
}

static int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

#define PROXY_MAX 64

/* the one-shot faults (faultlib.h) */
enum { OS_DROP_REQ, OS_DROP_REP, OS_DUP_REQ, OS_DELAY_REP, OS_N };

typedef struct proxy_log {
    const char *sock; /* NULL: no log */
    int id;
    redisContext *rc;
} proxy_log;

static void log_fired(proxy_log *lg, int kind, const char *buf, ssize_t len)
{
    if (!lg->sock) return;
    if (!lg->rc) lg->rc = fl_res_connect(lg->sock);
    char d[49];
    size_t n = 0;
    for (ssize_t i = 0; i < len && n + 1 < sizeof d; i++) {
        unsigned char ch = (unsigned char)buf[i];
        d[n++] = ch == '\r' || ch == '\n' ? '|' : ch >= 32 && ch < 127 ? (char)ch : '.';
    }
    d[n] = '\0';
    fl_ev(lg->rc, "M %d %lld %d %s", lg->id, (long long)th_now_ms(), kind, d);
}

static void proxy_loop(int lfd, int upstream, int alt, int cmd_r, int ack_w, proxy_log *lg)
{
    int cl[PROXY_MAX], up[PROXY_MAX];
    /* a reply chunk held back (OS_DELAY_REP) until held_until */
    char *held[PROXY_MAX];
    size_t hlen[PROXY_MAX];
    int64_t held_until[PROXY_MAX];
    int np = 0, frozen = 0;
    int armed[OS_N] = {0}; /* OS_DELAY_REP: the delay in ms */
    for (;;) {
        struct pollfd pf[2 + 2 * PROXY_MAX];
        int n = 0, timeout = -1;
        int64_t now = th_now_ms();
        pf[n++] = (struct pollfd){cmd_r, POLLIN, 0};
        if (!frozen) {
            pf[n++] = (struct pollfd){lfd, POLLIN, 0};
            for (int i = 0; i < np; i++) {
                pf[n++] = (struct pollfd){cl[i], POLLIN, 0};
                /* while a reply is held back, the later ones wait behind it */
                pf[n++] = (struct pollfd){held[i] ? -1 : up[i], POLLIN, 0};
                if (held[i]) {
                    int64_t left = held_until[i] - now;
                    if (left < 0) left = 0;
                    if (timeout < 0 || left < timeout) timeout = (int)left;
                }
            }
        }
        if (poll(pf, (nfds_t)n, timeout) < 0) {
            if (errno == EINTR) continue;
            _exit(3);
        }
        if (pf[0].revents) {
            char c;
            if (read(cmd_r, &c, 1) != 1 || c == 'Q') _exit(0);
            if (c == 'S') upstream = alt; /* then cut, as 'D' */
            if (c == 'D' || c == 'S') { /* cut: every connection reset */
                for (int i = 0; i < np; i++) {
                    struct linger lng = {1, 0};
                    setsockopt(cl[i], SOL_SOCKET, SO_LINGER, &lng, sizeof lng);
                    close(cl[i]);
                    close(up[i]);
                    free(held[i]);
                }
                np = 0;
            } else if (c == 'F') {
                frozen = 1;
            } else if (c == 'U') {
                frozen = 0;
            } else if (c == 'r') {
                armed[OS_DROP_REQ] = 1;
            } else if (c == 'p') {
                armed[OS_DROP_REP] = 1;
            } else if (c == '2') {
                armed[OS_DUP_REQ] = 1;
            } else if (c == 'L') {
                int ms = 0;
                if (read(cmd_r, &ms, sizeof ms) != (ssize_t)sizeof ms) _exit(3);
                armed[OS_DELAY_REP] = ms;
            }
            if (write(ack_w, &c, 1) != 1) _exit(3);
            continue;
        }
        if (frozen) continue;
        if (pf[1].revents & POLLIN) {
            int cfd = accept(lfd, NULL, NULL);
            if (cfd >= 0) {
                int ufd = np < PROXY_MAX ? tcp_connect(upstream) : -1;
                if (ufd < 0) {
                    close(cfd);
                } else {
                    cl[np] = cfd;
                    up[np] = ufd;
                    held[np] = NULL;
                    np++;
                }
            }
        }
        int dead[PROXY_MAX] = {0};
        now = th_now_ms();
        for (int i = 0, k = 2; k < n; i++, k += 2) {
            if (held[i] && now >= held_until[i]) {
                if (write_all(cl[i], held[i], hlen[i]) < 0) dead[i] = 1;
                free(held[i]);
                held[i] = NULL;
            }
            for (int side = 0; side < 2 && !dead[i]; side++) {
                if (!(pf[k + side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                int from = side ? up[i] : cl[i], to = side ? cl[i] : up[i];
                char buf[16384];
                ssize_t r = read(from, buf, sizeof buf);
                if (r <= 0) {
                    dead[i] = 1;
                    continue;
                }
                int copies = 1;
                if (!side && armed[OS_DROP_REQ]) {
                    armed[OS_DROP_REQ] = 0;
                    log_fired(lg, OS_DROP_REQ, buf, r);
                    copies = 0;
                } else if (!side && armed[OS_DUP_REQ]) {
                    armed[OS_DUP_REQ] = 0;
                    log_fired(lg, OS_DUP_REQ, buf, r);
                    copies = 2;
                } else if (side && armed[OS_DROP_REP]) {
                    armed[OS_DROP_REP] = 0;
                    log_fired(lg, OS_DROP_REP, buf, r);
                    copies = 0;
                } else if (side && armed[OS_DELAY_REP]) {
                    held[i] = malloc((size_t)r);
                    if (held[i]) {
                        memcpy(held[i], buf, (size_t)r);
                        hlen[i] = (size_t)r;
                        held_until[i] = th_now_ms() + armed[OS_DELAY_REP];
                        copies = 0;
                        log_fired(lg, OS_DELAY_REP, buf, r);
                    }
                    armed[OS_DELAY_REP] = 0;
                }
                if (copies == 2) {
                    /* in one write, as one retransmitted segment would
                     * come: the server reads both requests at once and
                     * its two replies leave together */
                    char two[2 * sizeof buf];
                    memcpy(two, buf, (size_t)r);
                    memcpy(two + r, buf, (size_t)r);
                    if (write_all(to, two, 2 * (size_t)r) < 0) dead[i] = 1;
                } else if (copies == 1 && write_all(to, buf, (size_t)r) < 0) {
                    dead[i] = 1;
                }
            }
        }
        int m = 0;
        for (int i = 0; i < np; i++) {
            if (dead[i]) {
                close(cl[i]);
                close(up[i]);
                free(held[i]);
            } else {
                cl[m] = cl[i];
                up[m] = up[i];
                held[m] = held[i];
                hlen[m] = hlen[i];
                held_until[m] = held_until[i];
                m++;
            }
        }
        np = m;
    }
}

fl_proxy fl_proxy_start(int upstream) { return fl_proxy_start_alt(upstream, upstream); }

fl_proxy fl_proxy_start_alt(int upstream, int alt)
{
    return fl_proxy_start_log(upstream, alt, NULL, 0);
}

fl_proxy fl_proxy_start_log(int upstream, int alt, const char *res_sock, int id)
{
    fl_proxy px;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(lfd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    ASSERT_EQ(listen(lfd, 64), 0);
    ASSERT_EQ(getsockname(lfd, (struct sockaddr *)&a, &len), 0);
    px.port = ntohs(a.sin_port);
    int cmd[2], ack[2];
    ASSERT_EQ(pipe(cmd), 0);
    ASSERT_EQ(pipe(ack), 0);
    px.pid = th_fork();
    if (px.pid == 0) {
        close(cmd[1]);
        close(ack[0]);
        proxy_log lg = {res_sock, id, NULL};
        proxy_loop(lfd, upstream, alt, cmd[0], ack[1], &lg);
        _exit(0);
    }
    close(lfd);
    close(cmd[0]);
    close(ack[1]);
    px.cmd_w = cmd[1];
    px.ack_r = ack[0];
    return px;
}

void fl_proxy_cmd(fl_proxy *px, char c)
{
    ASSERT_EQ(write(px->cmd_w, &c, 1), 1);
    struct pollfd pf = {px->ack_r, POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, 5000), 1);
    char a;
    ASSERT_EQ(read(px->ack_r, &a, 1), 1);
    ASSERT_EQ(a, c);
}

void fl_proxy_delay(fl_proxy *px, int ms)
{
    char m[1 + sizeof ms];
    m[0] = 'L';
    memcpy(m + 1, &ms, sizeof ms);
    ASSERT_EQ(write(px->cmd_w, m, sizeof m), (ssize_t)sizeof m);
    struct pollfd pf = {px->ack_r, POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, 5000), 1);
    char a;
    ASSERT_EQ(read(px->ack_r, &a, 1), 1);
    ASSERT_EQ(a, 'L');
}

void fl_proxy_stop(fl_proxy *px)
{
    char c = 'Q';
    ASSERT_EQ(write(px->cmd_w, &c, 1), 1);
    ASSERT_EQ(th_wait_child(px->pid, 5000), 0);
    close(px->cmd_w);
    close(px->ack_r);
}
