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

static void proxy_loop(int lfd, int upstream, int alt, int cmd_r, int ack_w)
{
    int cl[PROXY_MAX], up[PROXY_MAX];
    int np = 0, frozen = 0;
    for (;;) {
        struct pollfd pf[2 + 2 * PROXY_MAX];
        int n = 0;
        pf[n++] = (struct pollfd){cmd_r, POLLIN, 0};
        if (!frozen) {
            pf[n++] = (struct pollfd){lfd, POLLIN, 0};
            for (int i = 0; i < np; i++) {
                pf[n++] = (struct pollfd){cl[i], POLLIN, 0};
                pf[n++] = (struct pollfd){up[i], POLLIN, 0};
            }
        }
        if (poll(pf, (nfds_t)n, -1) < 0) {
            if (errno == EINTR) continue;
            _exit(3);
        }
        if (pf[0].revents) {
            char c;
            if (read(cmd_r, &c, 1) != 1 || c == 'Q') _exit(0);
            if (c == 'S') upstream = alt; /* then cut, as 'D' */
            if (c == 'D' || c == 'S') { /* cut: every connection reset */
                for (int i = 0; i < np; i++) {
                    struct linger lg = {1, 0};
                    setsockopt(cl[i], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
                    close(cl[i]);
                    close(up[i]);
                }
                np = 0;
            } else if (c == 'F') {
                frozen = 1;
            } else if (c == 'U') {
                frozen = 0;
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
                    np++;
                }
            }
        }
        int dead[PROXY_MAX] = {0};
        for (int i = 0, k = 2; k < n; i++, k += 2) {
            for (int side = 0; side < 2; side++) {
                if (!(pf[k + side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                int from = side ? up[i] : cl[i], to = side ? cl[i] : up[i];
                char buf[16384];
                ssize_t r = read(from, buf, sizeof buf);
                if (r <= 0 || write_all(to, buf, (size_t)r) < 0) dead[i] = 1;
            }
        }
        int m = 0;
        for (int i = 0; i < np; i++) {
            if (dead[i]) {
                close(cl[i]);
                close(up[i]);
            } else {
                cl[m] = cl[i];
                up[m] = up[i];
                m++;
            }
        }
        np = m;
    }
}

fl_proxy fl_proxy_start(int upstream) { return fl_proxy_start_alt(upstream, upstream); }

fl_proxy fl_proxy_start_alt(int upstream, int alt)
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
        proxy_loop(lfd, upstream, alt, cmd[0], ack[1]);
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

void fl_proxy_stop(fl_proxy *px)
{
    char c = 'Q';
    ASSERT_EQ(write(px->cmd_w, &c, 1), 1);
    ASSERT_EQ(th_wait_child(px->pid, 5000), 0);
    close(px->cmd_w);
    close(px->ack_r);
}
