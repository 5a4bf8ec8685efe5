/* Scenarios "peer_pairs", "peer_handoff" and "peer_contention" (issue 7):
 * dlock beside the locks users would pick instead, in the same run.
 *
 *   redis-py          Debian's python3-redis Lock (/usr/bin/python3
 *                     bench/peers/redispy_worker.py): SET NX PX + release
 *                     script, blocking by polling every `sleep` s; at its
 *                     default sleep=0.1, and `redis-py-1ms` with sleep=0.001
 *   node-redlock      node-redlock 4 on ioredis (node bench/peers/node/worker.js,
 *                     modules from `bench/setup`), one server; at its defaults
 *                     (retry every 200 ms, jitter 100 ms), and
 *                     `node-redlock-5ms` (retryDelay 5, retryJitter 2)
 *
 * Every peer process is a worker driven through a line protocol on its
 * stdin/stdout (described in the scripts). A peer that cannot run (no
 * /usr/bin/python3 with redis, no node or no node_modules) is skipped with
 * the reason printed; the scenario still runs the others.
 *
 * Clocks. Handoff and contention compare timestamps across processes. The
 * C driver reads CLOCK_MONOTONIC; Python reads the same clock
 * (time.clock_gettime_ns(CLOCK_MONOTONIC)); node reads process.hrtime.bigint(),
 * which libuv takes from CLOCK_MONOTONIC on Linux, but that is an
 * implementation detail. So for every worker the driver measures the offset:
 * it reads its clock (a), asks the worker's (w), reads again (b), 15 times,
 * and keeps the exchange with the smallest b - a: offset = w - (a + b) / 2,
 * uncertain by +-(b - a) / 2. When |offset| is within that uncertainty the
 * clocks are the same and the offset is taken as 0 (the usual case); else the
 * offset converts each timestamp (and is printed).
 *
 * peer_pairs: uncontended acquire+release pairs per second, one connection:
 * raw (hiredis SET NX PX + release script), dlock (plain, DLOCK_NOWAIT) in
 * this process, and one worker per peer (its non-blocking acquire + release,
 * timed in the worker). Rounds order the series as pairs.c does; the
 * ratio to a series is the median of the per-round ratios.
 *
 * peer_handoff: two worker processes of the peer, A and B. A takes the lock;
 * B says "waiting" just before its blocking acquire; the driver sleeps 2 ms
 * plus a random part of up to one poll interval of that configuration (a
 * poller's latency depends on where in its sleep the release falls: a fixed
 * delay would always hit the same phase), then tells A to release; A reads
 * the clock just before its release call, B just after its acquire returns.
 * Latency = B's time - A's time (both converted to the driver's clock). The
 * configurations go round-robin. Then the idle-wait cost, for dlock and every
 * peer: B blocked for a whole second (quick: 0.3 s) while A holds; the
 * server's commands processed meanwhile (INFO stats, minus the driver's own
 * INFO) and B's CPU time while it waited. dlock's waiter is a forked child.
 *
 * peer_contention: K = 2, 8, 32 (quick: 2, 8) processes on one lock per
 * series, each acquiring (no time limit), GET+SET of a counter on its own
 * connection, releasing: dlock plain and fair and the raw token ring (the
 * floor of a handoff per acquisition; bench_procs children), and K workers
 * per peer (one set of K processes runs both of that peer's configurations). Rounds of 1 s (quick 0.5 s) order the series as pairs.c
 * does; figures as contention.c: acq/s (median of rounds, a round ending with
 * its last critical section), waits, per-process min/max/spread, exact
 * counter.
 *
 * Its parts: peers.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "peers.h"

#ifndef DLOCK_BENCH_PEERS_DIR
#define DLOCK_BENCH_PEERS_DIR "bench/peers"
#endif

/* ---- peer kinds and configurations (peers.h) ---- */

const char *const pr_kind_name[NKINDS] = {"redis-py", "node-redlock"};

const peer_cfg pr_cfgs[NCFG] = {
    {"redis-py", K_PY, "default", 100000},
    {"redis-py-1ms", K_PY, "0.001", 1000},
    {"node-redlock", K_NODE, "default", 200000},
    {"node-redlock-5ms", K_NODE, "5", 5000},
};

int pr_kind_ok[NKINDS];
char pr_kind_version[NKINDS][96];

int bench_peer_exec(bench_peer *p, char *const argv[]) {
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->wfd = p->rfd = -1;
    int fds[2];
    pid_t pid;
    if (bench_fork_piped(&pid, fds)) return -1;
    if (pid == 0) {
        dup2(fds[0], 0);
        dup2(fds[1], 1);
        close(fds[0]), close(fds[1]);
        execvp(argv[0], argv);
        printf("skip cannot run %s: %s\n", argv[0], strerror(errno));
        fflush(stdout);
        _exit(0);
    }
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    p->pid = pid;
    p->wfd = fds[0];
    p->rfd = fds[1];
    return 0;
}

const char *bench_peers_dir(void) {
    const char *d = getenv("DLOCK_BENCH_PEERS_DIR");
    return d && *d ? d : DLOCK_BENCH_PEERS_DIR;
}

static int peer_spawn(const bench_ctx *ctx, int kind, peer *p) {
    char script[1024], port[16];
    const char *prog = kind == K_PY ? "/usr/bin/python3" : "node";
    snprintf(script, sizeof script, "%s/%s", bench_peers_dir(),
             kind == K_PY ? "redispy_worker.py" : "node/worker.js");
    snprintf(port, sizeof port, "%d", ctx->port);
    char *const argv[] = {(char *)prog, script, "--host", (char *)ctx->host, "--port", port, NULL};
    return bench_peer_exec(p, argv);
}

int bench_peer_send(bench_peer *p, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof line - 1) return -1;
    line[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = write(p->wfd, line + off, (size_t)(n - off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        off += (int)w;
    }
    return 0;
}

/* The next line (NUL-terminated, valid until the next call), or NULL on
 * timeout or end of file. */
char *bench_peer_line(bench_peer *p, int timeout_ms) {
    if (p->consumed) {
        memmove(p->buf, p->buf + p->consumed, p->len - p->consumed);
        p->len -= p->consumed;
        p->consumed = 0;
    }
    int64_t deadline = bench_now_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        char *nl = p->len ? memchr(p->buf, '\n', p->len) : NULL;
        if (nl) {
            *nl = '\0';
            p->consumed = (size_t)(nl - p->buf) + 1;
            return p->buf;
        }
        if (p->cap - p->len < 4096) {
            size_t cap = p->cap ? p->cap * 2 : 65536;
            char *nb = realloc(p->buf, cap);
            if (!nb) return NULL;
            p->buf = nb;
            p->cap = cap;
        }
        int left = (int)((deadline - bench_now_ns()) / 1000000);
        if (left <= 0) return NULL;
        struct pollfd pfd = {.fd = p->rfd, .events = POLLIN};
        int n = poll(&pfd, 1, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return NULL;
        ssize_t r = read(p->rfd, p->buf + p->len, p->cap - p->len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return NULL;
        p->len += (size_t)r;
    }
}

void bench_peer_stop(bench_peer *p) {
    if (p->pid > 0) {
        bench_peer_send(p, "quit");
        close(p->wfd);
        int status;
        /* up to 3 s to exit on its own, then SIGKILL */
        for (int i = 0; i < 300; i++) {
            pid_t r = waitpid(p->pid, &status, WNOHANG);
            if (r == p->pid || (r < 0 && errno != EINTR)) goto reaped;
            bench_sleep_us(10000);
        }
        kill(p->pid, SIGKILL);
        while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {
        }
    reaped:
        close(p->rfd);
    }
    free(p->buf);
    memset(p, 0, sizeof *p);
    p->pid = -1;
}

/* Reads the worker's hello and measures its clock offset. 0 ok, 1 skipped
 * (reason printed once per kind), -1 failed. */
static int peer_ready(peer *p, int kind) {
    char *l = bench_peer_line(p, PR_LINE_TIMEOUT_MS);
    if (!l || strncmp(l, "hello ", 6)) {
        if (pr_kind_ok[kind] >= 0) {
            printf("   SKIP %s: %s\n", pr_kind_name[kind],
                   !l ? "the worker did not start (no hello within 60 s)"
                   : !strncmp(l, "skip ", 5) ? l + 5
                                               : l);
            pr_kind_ok[kind] = -1;
        }
        return 1;
    }
    if (!pr_kind_ok[kind]) snprintf(pr_kind_version[kind], sizeof pr_kind_version[kind], "%s", l + 6);
    if (bench_peer_clock(p, pr_kind_name[kind])) return -1;
    pr_kind_ok[kind] = 1;
    return 0;
}

int bench_peer_clock(bench_peer *p, const char *what) {
    int64_t best = -1, off = 0;
    for (int i = 0; i < 15; i++) {
        int64_t a = bench_now_ns();
        if (bench_peer_send(p, "clock")) return -1;
        char *l = bench_peer_line(p, PR_LINE_TIMEOUT_MS);
        int64_t b = bench_now_ns();
        long long w;
        if (!l || sscanf(l, "clock %lld", &w) != 1) return -1;
        if (best < 0 || b - a < best) {
            best = b - a;
            off = (int64_t)w - (a + (b - a) / 2);
        }
    }
    p->offset = (off < best / 2 + 1 && off > -best / 2 - 1) ? 0 : off;
    if (p->offset)
        printf("   note: %s worker clock offset %lld ns (+-%lld), converted\n", what,
               (long long)p->offset, (long long)best / 2);
    return 0;
}

int pr_peers_start(const bench_ctx *ctx, int kind, peer *ps, int n) {
    if (pr_kind_ok[kind] < 0) return 1;
    int rc = 0;
    for (int i = 0; i < n; i++) ps[i].pid = -1;
    for (int i = 0; i < n && !rc; i++) rc = peer_spawn(ctx, kind, &ps[i]);
    for (int i = 0; i < n && !rc; i++) rc = peer_ready(&ps[i], kind);
    if (rc)
        for (int i = 0; i < n; i++) bench_peer_stop(&ps[i]);
    return rc;
}

char *pr_peer_reply(peer *p, int timeout_ms, const char *what) {
    char *l = bench_peer_line(p, timeout_ms);
    if (!l) fprintf(stderr, "dlock_bench: peer worker: no reply to %s\n", what);
    else if (!strncmp(l, "err", 3)) {
        fprintf(stderr, "dlock_bench: peer worker: %s: %s\n", what, l);
        return NULL;
    }
    return l;
}

int bench_peer_parse_ok(char *l, long long *a, long long *b, bench_samples *out) {
    char *e;
    if (!l || strncmp(l, "ok ", 3)) return -1;
    l += 3;
    *a = strtoll(l, &e, 10);
    if (e == l) return -1;
    l = e;
    *b = strtoll(l, &e, 10);
    if (e == l) return -1;
    l = e;
    for (;;) {
        long long v = strtoll(l, &e, 10);
        if (e == l) break;
        l = e;
        if (out && bench_samples_add(out, (int64_t)v * 1000)) return -1;
    }
    return 0;
}

int pr_make_client(const bench_ctx *ctx, dlock_client **c) {
    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    if (dlock_client_new(&o, c)) {
        fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(*c));
        return -1;
    }
    return 0;
}
