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

#include "bench.h"
#include "dlock.h"

#ifndef DLOCK_BENCH_PEERS_DIR
#define DLOCK_BENCH_PEERS_DIR "bench/peers"
#endif

#define LINE_TIMEOUT_MS 60000

/* ---- peer kinds and configurations ---- */

enum { K_PY, K_NODE, NKINDS };
static const char *const kind_name[NKINDS] = {"redis-py", "node-redlock"};

typedef struct peer_cfg {
    const char *series; /* "redis-py-1ms" */
    int kind;
    const char *arg;    /* cfg argument of the worker protocol */
    int64_t poll_us;    /* nominal poll / retry interval */
} peer_cfg;

#define NCFG 4
static const peer_cfg cfgs[NCFG] = {
    {"redis-py", K_PY, "default", 100000},
    {"redis-py-1ms", K_PY, "0.001", 1000},
    {"node-redlock", K_NODE, "default", 200000},
    {"node-redlock-5ms", K_NODE, "5", 5000},
};

/* availability of each kind: 0 unknown, 1 runs, -1 skipped (reason printed) */
static int kind_ok[NKINDS];
static char kind_version[NKINDS][96];

typedef bench_peer peer;

int bench_peer_exec(bench_peer *p, char *const argv[]) {
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->wfd = p->rfd = -1;
    int a2b[2], b2a[2];
    if (pipe(a2b)) return -1;
    if (pipe(b2a)) {
        close(a2b[0]), close(a2b[1]);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(a2b[0]), close(a2b[1]), close(b2a[0]), close(b2a[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(a2b[0], 0);
        dup2(b2a[1], 1);
        close(a2b[0]), close(a2b[1]), close(b2a[0]), close(b2a[1]);
        execvp(argv[0], argv);
        printf("skip cannot run %s: %s\n", argv[0], strerror(errno));
        fflush(stdout);
        _exit(0);
    }
    close(a2b[0]);
    close(b2a[1]);
    fcntl(a2b[1], F_SETFD, FD_CLOEXEC);
    fcntl(b2a[0], F_SETFD, FD_CLOEXEC);
    p->pid = pid;
    p->wfd = a2b[1];
    p->rfd = b2a[0];
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
    char *l = bench_peer_line(p, LINE_TIMEOUT_MS);
    if (!l || strncmp(l, "hello ", 6)) {
        if (kind_ok[kind] >= 0) {
            printf("   SKIP %s: %s\n", kind_name[kind],
                   !l ? "the worker did not start (no hello within 60 s)"
                   : !strncmp(l, "skip ", 5) ? l + 5
                                               : l);
            kind_ok[kind] = -1;
        }
        return 1;
    }
    if (!kind_ok[kind]) snprintf(kind_version[kind], sizeof kind_version[kind], "%s", l + 6);
    if (bench_peer_clock(p, kind_name[kind])) return -1;
    kind_ok[kind] = 1;
    return 0;
}

int bench_peer_clock(bench_peer *p, const char *what) {
    int64_t best = -1, off = 0;
    for (int i = 0; i < 15; i++) {
        int64_t a = bench_now_ns();
        if (bench_peer_send(p, "clock")) return -1;
        char *l = bench_peer_line(p, LINE_TIMEOUT_MS);
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

/* Starts n workers of kind (all spawned, then all awaited). 0 ok, 1 skipped,
 * -1 failed; on non-zero every worker is stopped. */
static int peers_start(const bench_ctx *ctx, int kind, peer *ps, int n) {
    if (kind_ok[kind] < 0) return 1;
    int rc = 0;
    for (int i = 0; i < n; i++) ps[i].pid = -1;
    for (int i = 0; i < n && !rc; i++) rc = peer_spawn(ctx, kind, &ps[i]);
    for (int i = 0; i < n && !rc; i++) rc = peer_ready(&ps[i], kind);
    if (rc)
        for (int i = 0; i < n; i++) bench_peer_stop(&ps[i]);
    return rc;
}

static char *peer_reply(peer *p, int timeout_ms, const char *what) {
    char *l = bench_peer_line(p, timeout_ms);
    if (!l) fprintf(stderr, "dlock_bench: peer worker: no reply to %s\n", what);
    else if (!strncmp(l, "err", 3)) {
        fprintf(stderr, "dlock_bench: peer worker: %s: %s\n", what, l);
        return NULL;
    }
    return l;
}

/* Parses "ok <a> <b> <v> <v> ...": the v (microseconds) go to out (ns). */
static int parse_ok(char *l, long long *a, long long *b, bench_samples *out) {
    char *e;
    if (strncmp(l, "ok ", 3)) return -1;
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

/* ======================= peer_pairs ======================= */

enum { P_RAW, P_DLOCK, P_PY, P_NODE, P_COUNT };
static const char *const pp_name[P_COUNT] = {"raw", "dlock", "redis-py", "node-redlock"};
static const char release_lua[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end";

static int raw_pair(redisContext *rc, const char *sha) {
    char token[33];
    bench_fast_hex(token, 16);
    redisReply *r = redisCommand(rc, "SET bench:peer_pairs:raw %s NX PX 10000", token);
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (r) freeReplyObject(r);
    if (!ok) return -1;
    r = redisCommand(rc, "EVALSHA %s 1 bench:peer_pairs:raw %s", sha, token);
    ok = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    if (r) freeReplyObject(r);
    return ok ? 0 : -1;
}

static int make_client(const bench_ctx *ctx, dlock_client **c) {
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

#define PEER_PAIRS_ROUNDS 20 /* as the pairs scenario: a steadier median on a VM that swings */
int bench_peer_pairs(bench_ctx *ctx) {
    const int rounds = ctx->quick ? 3 : PEER_PAIRS_ROUNDS;
    const int round_ms = ctx->quick ? 200 : 500;
    peer pw[P_COUNT];
    int have[P_COUNT] = {1, 1, 0, 0};
    double rate[P_COUNT][PEER_PAIRS_ROUNDS];
    bench_samples lat[P_COUNT];
    memset(lat, 0, sizeof lat);
    for (int s = 0; s < P_COUNT; s++) pw[s].pid = -1;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    char sha[48] = "";
    int failed = 0;
    redisContext *rc = bench_redis_connect(ctx);
    if (!rc) return -1;
    {
        const char *argv[] = {"SCRIPT", "LOAD", release_lua};
        redisReply *r = bench_redis_cmd(rc, 3, argv);
        if (!r) failed = 1;
        else snprintf(sha, sizeof sha, "%s", r->str ? r->str : "");
        if (r) freeReplyObject(r);
    }
    if (!failed) failed = make_client(ctx, &c);
    if (!failed && dlock_lock_new(c, "bench:peer_pairs:dlock", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l))
        failed = 1;
    printf("\n== peer_pairs: uncontended acquire+release, one connection, dlock vs peers "
           "(%d rounds x %.2f s per series, balanced order)\n",
           rounds, round_ms / 1e3);
    for (int s = P_PY; !failed && s < P_COUNT; s++) {
        int r = peers_start(ctx, s == P_PY ? K_PY : K_NODE, &pw[s], 1);
        if (r < 0) failed = 1;
        have[s] = r == 0;
    }
    for (int round = 0; !failed && round < rounds; round++) {
        for (int k = 0; !failed && k < P_COUNT; k++) {
            int s = bench_order(round, k, P_COUNT);
            if (!have[s] || !bench_series_on(ctx, pp_name[s])) continue;
            if (s >= P_PY) {
                if (bench_peer_send(&pw[s], "pairs bench:peer_pairs:%s %d", pp_name[s], round_ms)) {
                    failed = 1;
                    break;
                }
                char *line = peer_reply(&pw[s], round_ms + LINE_TIMEOUT_MS, "pairs");
                long long n, ns;
                if (!line || parse_ok(line, &n, &ns, &lat[s]) || ns <= 0) {
                    failed = 1;
                    break;
                }
                rate[s][round] = (double)n * 1e9 / (double)ns;
                continue;
            }
            for (int i = 0; i < 50 && !failed; i++) /* warm-up */
                failed = s == P_RAW ? raw_pair(rc, sha)
                                    : (dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL) ||
                                       dlock_release(l));
            long n = 0;
            int64_t start = bench_now_ns(), end = start + (int64_t)round_ms * 1000000, now = start;
            while (!failed && now < end) {
                int64_t t0 = now;
                failed = s == P_RAW ? raw_pair(rc, sha)
                                    : (dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL) ||
                                       dlock_release(l));
                now = bench_now_ns();
                if (!failed) failed = bench_samples_add(&lat[s], now - t0);
                n++;
            }
            if (failed) fprintf(stderr, "dlock_bench: peer_pairs %s pair failed\n", pp_name[s]);
            rate[s][round] = (double)n * 1e9 / (double)(now - start);
        }
    }
    if (!failed) {
        /* the faster peer: the larger median */
        int best = -1;
        double bestm = 0;
        for (int s = P_PY; s < P_COUNT; s++)
            if (have[s] && bench_series_on(ctx, pp_name[s])) {
                double m = bench_median_d(rate[s], (size_t)rounds);
                if (best < 0 || m > bestm) best = s, bestm = m;
            }
        printf("   %-14s %12s %10s %10s %10s %14s\n", "series", "pairs/s", "pair p50",
               "pair p99", "ratio raw", "ratio best peer");
        for (int s = 0; s < P_COUNT; s++) {
            if (!have[s] || !bench_series_on(ctx, pp_name[s])) continue;
            double ratio[PEER_PAIRS_ROUNDS];
            double med = bench_median_d(rate[s], (size_t)rounds);
            double p50 = (double)bench_samples_quantile(&lat[s], 0.5) / 1e3;
            double p99 = (double)bench_samples_quantile(&lat[s], 0.99) / 1e3;
            bench_metric("peer_pairs", pp_name[s], "pairs_per_s", med, "1/s");
            bench_metric("peer_pairs", pp_name[s], "pair_p50_us", p50, "us");
            bench_metric("peer_pairs", pp_name[s], "pair_p99_us", p99, "us");
            bench_metric("peer_pairs", pp_name[s], "samples", (double)lat[s].n, "");
            char rr[16] = "-", rb[16] = "-", num[32];
            if (s != P_RAW && bench_series_on(ctx, "raw")) {
                for (int r = 0; r < rounds; r++) ratio[r] = rate[s][r] / rate[P_RAW][r];
                double m = bench_median_d(ratio, (size_t)rounds);
                bench_metric("peer_pairs", pp_name[s], "ratio_to_raw", m, "x");
                snprintf(rr, sizeof rr, "%.2fx", m);
            }
            if (best >= 0 && s != best) {
                for (int r = 0; r < rounds; r++) ratio[r] = rate[s][r] / rate[best][r];
                double m = bench_median_d(ratio, (size_t)rounds);
                bench_metric("peer_pairs", pp_name[s], "ratio_to_best_peer", m, "x");
                snprintf(rb, sizeof rb, "%.2fx", m);
            }
            bench_fmt_num(num, sizeof num, med);
            printf("   %-14s %12s %7.1f us %7.1f us %10s %14s\n", pp_name[s], num, p50, p99, rr,
                   rb);
        }
        if (best >= 0) printf("   faster peer: %s\n", pp_name[best]);
        for (int k = 0; k < NKINDS; k++)
            if (kind_ok[k] > 0) printf("   %s: %s\n", kind_name[k], kind_version[k]);
    }
    for (int s = 0; s < P_COUNT; s++) {
        if (s >= P_PY) bench_peer_stop(&pw[s]);
        bench_samples_free(&lat[s]);
    }
    dlock_lock_free(l);
    dlock_client_free(c);
    redisFree(rc);
    return failed ? -1 : 0;
}

/* ======================= peer_handoff ======================= */

static long long info_field(redisContext *rc, const char *section, const char *field) {
    redisReply *r = redisCommand(rc, "INFO %s", section);
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        char key[64];
        snprintf(key, sizeof key, "\n%s:", field);
        const char *p = strstr(r->str, key);
        if (p) v = atoll(p + strlen(key));
    }
    if (r) freeReplyObject(r);
    return v;
}

/* One handoff of configuration c between workers a (holder) and b (waiter).
 * extra_us: a further wait before the release (idle-wait measurement; the
 * server's commands during it go to *cmds). Returns 0 and *lat_ns, *cpu_ns. */
static int peer_handoff_once(redisContext *rc, const peer_cfg *c, peer *a, peer *b,
                             int64_t extra_us, int64_t *lat_ns, int64_t *cpu_ns,
                             double *cmds, int64_t *waited_ns) {
    char name[96];
    snprintf(name, sizeof name, "bench:peer_handoff:%s", c->series);
    if (bench_peer_send(a, "hold %s %s", name, c->arg)) return -1;
    char *l = peer_reply(a, LINE_TIMEOUT_MS, "hold");
    if (!l || strcmp(l, "ok")) return -1;
    if (bench_peer_send(b, "wait %s %s", name, c->arg)) return -1;
    l = peer_reply(b, LINE_TIMEOUT_MS, "wait");
    if (!l || strcmp(l, "waiting")) return -1;
    int64_t tw = bench_now_ns();
    if (extra_us) {
        bench_sleep_us(2000);
        long long c0 = info_field(rc, "stats", "total_commands_processed");
        int64_t t0 = bench_now_ns();
        bench_sleep_us(extra_us);
        long long c1 = info_field(rc, "stats", "total_commands_processed");
        int64_t t1 = bench_now_ns();
        /* c1 - c0 counts the first INFO itself */
        *cmds = (double)(c1 - c0 - 1) * 1e9 / (double)(t1 - t0);
    } else {
        bench_sleep_us(2000 + (int64_t)(rand() % (int)(c->poll_us + 1)));
    }
    if (bench_peer_send(a, "release")) return -1;
    l = peer_reply(a, LINE_TIMEOUT_MS, "release");
    long long t0, t1, cpu = 0;
    if (!l || sscanf(l, "ok %lld", &t0) != 1) return -1;
    l = peer_reply(b, LINE_TIMEOUT_MS, "wait");
    if (!l || sscanf(l, "got %lld %lld", &t1, &cpu) < 1) return -1;
    *lat_ns = (t1 - b->offset) - (t0 - a->offset);
    *cpu_ns = cpu;
    if (waited_ns) *waited_ns = (t1 - b->offset) - tw;
    return 0;
}

/* dlock's idle waiter: a forked child blocked in dlock_acquire while this
 * process holds; the server's commands per second during the wait and the
 * child's CPU time per second of wait. */
static int dlock_idle(const bench_ctx *ctx, redisContext *rc, int64_t wait_us, double *cmds,
                      double *cpu_pct) {
    const char *name = "bench:peer_handoff:dlock-idle";
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    int failed = make_client(ctx, &c) ||
                 dlock_lock_new(c, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l) ||
                 dlock_acquire(l, DLOCK_NOWAIT, 30000, NULL);
    int fds[2] = {-1, -1};
    if (!failed) failed = pipe(fds);
    pid_t pid = -1;
    if (!failed) {
        fflush(NULL);
        pid = fork();
        failed = pid < 0;
    }
    if (pid == 0) {
        close(fds[0]);
        dlock_client *cc = NULL;
        dlock_lock *ll = NULL;
        int64_t res[2] = {-1, -1};
        if (!make_client(ctx, &cc) && !dlock_lock_new(cc, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &ll)) {
            struct rusage r0, r1;
            getrusage(RUSAGE_SELF, &r0);
            int64_t t0 = bench_now_ns();
            if (write(fds[1], "w", 1) != 1) _exit(1);
            if (dlock_acquire(ll, 60000, 30000, NULL) == DLOCK_OK) {
                getrusage(RUSAGE_SELF, &r1);
                res[0] = bench_now_ns() - t0;
                res[1] = ((int64_t)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1000000 +
                          (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
                          (int64_t)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1000000 +
                          (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec)) *
                         1000;
                dlock_release(ll);
            }
        }
        ssize_t w = write(fds[1], res, sizeof res);
        dlock_lock_free(ll);
        dlock_client_free(cc);
        _exit(w == (ssize_t)sizeof res && res[0] >= 0 ? 0 : 1);
    }
    if (pid > 0) {
        close(fds[1]);
        fds[1] = -1;
        char ch;
        failed = read(fds[0], &ch, 1) != 1;
        char chan[128];
        /* a plain-lock waiter has a channel of its own */
        snprintf(chan, sizeof chan, "redisson_lock__channel:{%s}:*", name);
        /* until the child sleeps on its channel */
        for (int i = 0; !failed && i < 20000; i++) {
            redisReply *r = redisCommand(rc, "PUBSUB CHANNELS %s", chan);
            long long n = r && r->type == REDIS_REPLY_ARRAY ? (long long)r->elements : -1;
            if (r) freeReplyObject(r);
            if (n >= 1) break;
            bench_sleep_us(100);
        }
        bench_sleep_us(2000);
        long long c0 = info_field(rc, "stats", "total_commands_processed");
        int64_t t0 = bench_now_ns();
        bench_sleep_us(wait_us);
        long long c1 = info_field(rc, "stats", "total_commands_processed");
        int64_t t1 = bench_now_ns();
        *cmds = (double)(c1 - c0 - 1) * 1e9 / (double)(t1 - t0);
        if (dlock_release(l)) failed = 1;
        int64_t res[2];
        if (!failed && read(fds[0], res, sizeof res) != (ssize_t)sizeof res) failed = 1;
        if (!failed) *cpu_pct = 100.0 * (double)res[1] / (double)res[0];
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st)) failed = 1;
    }
    if (fds[0] >= 0) close(fds[0]);
    if (fds[1] >= 0) close(fds[1]);
    dlock_lock_free(l);
    dlock_client_free(c);
    return failed ? -1 : 0;
}

int bench_peer_handoff(bench_ctx *ctx) {
    const int n = ctx->quick ? 8 : 200;
    const int64_t idle_us = ctx->quick ? 300000 : 1000000;
    peer pa[NKINDS], pb[NKINDS];
    int have[NKINDS] = {0};
    bench_samples lat[NCFG];
    memset(lat, 0, sizeof lat);
    int failed = 0;
    redisContext *rc = bench_redis_connect(ctx);
    if (!rc) return -1;
    srand((unsigned)bench_now_ns());
    printf("\n== peer_handoff: A releases, B (another process, blocked) holds; %d per "
           "configuration, round-robin\n",
           n);
    for (int k = 0; !failed && k < NKINDS; k++) {
        pa[k].pid = pb[k].pid = -1;
        int r = peers_start(ctx, k, &pa[k], 1);
        if (!r) {
            r = peers_start(ctx, k, &pb[k], 1);
            if (r) bench_peer_stop(&pa[k]);
        }
        if (r < 0) failed = 1;
        have[k] = r == 0;
    }
    for (int i = 0; !failed && i < n + 2; i++) {
        for (int s = 0; !failed && s < NCFG; s++) {
            const peer_cfg *c = &cfgs[s];
            if (!have[c->kind] || !bench_series_on(ctx, c->series)) continue;
            int64_t ns, cpu;
            failed = peer_handoff_once(rc, c, &pa[c->kind], &pb[c->kind], 0, &ns, &cpu, NULL,
                                       NULL);
            if (!failed && i >= 2) failed = bench_samples_add(&lat[s], ns); /* 2 warm-up */
        }
    }
    if (!failed) {
        printf("   %-18s %8s %10s %10s %10s %10s\n", "series", "handoffs", "p50", "p90", "p99",
               "max");
        for (int s = 0; s < NCFG; s++) {
            if (!lat[s].n) continue;
            double p50 = (double)bench_samples_quantile(&lat[s], 0.5) / 1e3;
            double p90 = (double)bench_samples_quantile(&lat[s], 0.9) / 1e3;
            double p99 = (double)bench_samples_quantile(&lat[s], 0.99) / 1e3;
            double mx = (double)bench_samples_max(&lat[s]) / 1e3;
            bench_metric("peer_handoff", cfgs[s].series, "p50_us", p50, "us");
            bench_metric("peer_handoff", cfgs[s].series, "p90_us", p90, "us");
            bench_metric("peer_handoff", cfgs[s].series, "p99_us", p99, "us");
            bench_metric("peer_handoff", cfgs[s].series, "max_us", mx, "us");
            bench_metric("peer_handoff", cfgs[s].series, "samples", (double)lat[s].n, "");
            printf("   %-18s %8zu %7.0f us %7.0f us %7.0f us %7.0f us\n", cfgs[s].series,
                   lat[s].n, p50, p90, p99, mx);
        }
        /* idle-wait cost: is the waiter polling? */
        printf("   idle wait (B blocked %.1f s): server commands/s during the wait, B's CPU\n",
               idle_us / 1e6);
        double cmds = 0, cpu_pct = 0;
        if (bench_series_on(ctx, "dlock")) {
            failed = dlock_idle(ctx, rc, idle_us, &cmds, &cpu_pct);
            if (!failed) {
                bench_metric("peer_handoff", "dlock", "wait_cmds_per_s", cmds, "1/s");
                bench_metric("peer_handoff", "dlock", "wait_cpu_pct", cpu_pct, "%");
                printf("   %-18s %8.1f cmd/s %8.2f %% CPU\n", "dlock", cmds, cpu_pct);
            }
        }
        for (int s = 0; !failed && s < NCFG; s++) {
            const peer_cfg *c = &cfgs[s];
            if (!lat[s].n) continue;
            int64_t ns, cpu, waited;
            failed = peer_handoff_once(rc, c, &pa[c->kind], &pb[c->kind], idle_us, &ns, &cpu,
                                       &cmds, &waited);
            if (failed) break;
            cpu_pct = 100.0 * (double)cpu / (double)waited;
            bench_metric("peer_handoff", c->series, "wait_cmds_per_s", cmds, "1/s");
            bench_metric("peer_handoff", c->series, "wait_cpu_pct", cpu_pct, "%");
            printf("   %-18s %8.1f cmd/s %8.2f %% CPU\n", c->series, cmds, cpu_pct);
        }
    }
    for (int k = 0; k < NKINDS; k++)
        if (have[k]) {
            bench_peer_stop(&pa[k]);
            bench_peer_stop(&pb[k]);
        }
    for (int s = 0; s < NCFG; s++) bench_samples_free(&lat[s]);
    redisFree(rc);
    return failed ? -1 : 0;
}

/* ======================= peer_contention ======================= */

/* dlock, dlock-fair, the raw ring (NDL: bench_procs children), then the 4
 * peer configurations */
#define NCS 7
#define NDL 3
#define CS_RING 2
static const char *const cs_name[NCS] = {"dlock",        "dlock-fair",   "raw-ring", "redis-py",
                                         "redis-py-1ms", "node-redlock", "node-redlock-5ms"};
static int cur_k, cur_series;

/* A contention worker: a dlock lock (plain or fair), or a place in the raw
 * ring. The ring is the floor a handoff-per-acquisition lock can reach on
 * this machine, not a lock: K processes pass one token, each BLPOP on a list
 * of its own, GET + SET of the counter, then RPUSH to the next one's list.
 * No lease, owner, queue or fencing; three round trips per acquisition, as
 * the fair lock's handoff (grant, GET, SET, release). */
typedef struct cworker {
    dlock_client *c;
    dlock_lock *l;
    redisContext *rc;
    char counter[96];
    char mine[112], next[112]; /* the ring's lists */
} cworker;

static void cs_names(int s, int k, char *lock, char *counter, size_t len) {
    snprintf(lock, len, "bench:peer_contention:%s-k%d", cs_name[s], k);
    snprintf(counter, len, "bench:peer_contention:counter:%s-k%d", cs_name[s], k);
}

static void cw_teardown(void *state) {
    cworker *w = state;
    dlock_lock_free(w->l);
    dlock_client_free(w->c);
    if (w->rc) redisFree(w->rc);
    free(w);
}

static int ring_setup(cworker *w, const char *lock, int idx) {
    snprintf(w->mine, sizeof w->mine, "%s:%d", lock, idx);
    snprintf(w->next, sizeof w->next, "%s:%d", lock, (idx + 1) % cur_k);
    if (idx != 0) return 0;
    /* worker 0 lays the token; between rounds it waits in some worker's list */
    int ok = 1;
    for (int i = 0; ok && i < cur_k; i++) {
        redisReply *r = redisCommand(w->rc, "DEL %s:%d", lock, i);
        ok = r && r->type == REDIS_REPLY_INTEGER;
        if (r) freeReplyObject(r);
    }
    redisReply *r = ok ? redisCommand(w->rc, "RPUSH %s token", w->mine) : NULL;
    ok = r && r->type == REDIS_REPLY_INTEGER;
    if (r) freeReplyObject(r);
    return ok ? 0 : -1;
}

static int cw_setup(const bench_ctx *ctx, int idx, void **state) {
    cworker *w = calloc(1, sizeof *w);
    if (!w) return -1;
    *state = w;
    char lock[96];
    cs_names(cur_series, cur_k, lock, w->counter, sizeof lock);
    w->rc = bench_redis_connect(ctx);
    if (!w->rc) return -1;
    if (cur_series == CS_RING) return ring_setup(w, lock, idx);
    if (make_client(ctx, &w->c) ||
        dlock_lock_new(w->c, lock, DLOCK_CSTR,
                       cur_series == 1 ? DLOCK_KIND_FAIR : DLOCK_KIND_PLAIN, &w->l))
        return -1;
    return 0;
}

/* 0: the token came (BLPOP, 30 s at most) */
static int ring_take(cworker *w) {
    redisReply *r = redisCommand(w->rc, "BLPOP %s 30", w->mine);
    int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2;
    if (r) freeReplyObject(r);
    if (!ok) fprintf(stderr, "dlock_bench: peer_contention raw-ring: no token in 30 s\n");
    return ok ? 0 : -1;
}

static int ring_pass(cworker *w) {
    redisReply *r = redisCommand(w->rc, "RPUSH %s token", w->next);
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    if (r) freeReplyObject(r);
    return ok ? 0 : -1;
}

static int cw_op(void *state, int64_t *wait_ns) {
    cworker *w = state;
    int64_t t0 = bench_now_ns();
    int rc = w->l ? dlock_acquire(w->l, 120000, 30000, NULL) : ring_take(w);
    if (rc) {
        if (w->l)
            fprintf(stderr, "dlock_bench: peer_contention acquire: %s\n", dlock_strerror(rc));
        return -1;
    }
    *wait_ns = bench_now_ns() - t0;
    long long v = 0;
    redisReply *r = redisCommand(w->rc, "GET %s", w->counter);
    int ok = r && (r->type == REDIS_REPLY_NIL || r->type == REDIS_REPLY_STRING);
    if (ok && r->type == REDIS_REPLY_STRING) v = atoll(r->str);
    if (r) freeReplyObject(r);
    if (ok) {
        r = redisCommand(w->rc, "SET %s %lld", w->counter, v + 1);
        ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
    }
    if (w->l ? dlock_release(w->l) != 0 : ring_pass(w) != 0) return -1;
    return ok ? 0 : -1;
}

static long long get_int(redisContext *rc, const char *key) {
    redisReply *r = redisCommand(rc, "GET %s", key);
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) v = atoll(r->str);
    else if (r && r->type == REDIS_REPLY_NIL) v = 0;
    if (r) freeReplyObject(r);
    return v;
}

/* One round of a peer series over its K workers. */
static int peer_round(peer *ws, int k, const peer_cfg *c, const char *lock, const char *counter,
                      int64_t start, int64_t end, int64_t *ops, int64_t *fin,
                      bench_samples *waits) {
    for (int i = 0; i < k; i++)
        if (bench_peer_send(&ws[i], "contend %s %s %s %lld %lld", lock, counter, c->arg,
                      (long long)(start + ws[i].offset), (long long)(end + ws[i].offset)))
            return -1;
    int tmo = (int)((end - bench_now_ns()) / 1000000) + 2 * LINE_TIMEOUT_MS;
    for (int i = 0; i < k; i++) {
        char *l = peer_reply(&ws[i], tmo, "contend");
        long long n, f;
        if (!l || parse_ok(l, &n, &f, waits)) return -1;
        ops[i] = n;
        fin[i] = f - ws[i].offset;
    }
    return 0;
}

static int contention_k(bench_ctx *ctx, redisContext *rc, int k) {
    const int rounds = ctx->quick ? 1 : 3;
    const int64_t round_ns = ctx->quick ? 500000000LL : 1000000000LL;
    bench_procs procs[NDL];
    memset(procs, 0, sizeof procs);
    peer *ws[NKINDS] = {0};
    int have[NCS] = {0};
    int64_t *total[NCS] = {0};
    bench_samples waits[NCS];
    memset(waits, 0, sizeof waits);
    double rate[NCS][3];
    int64_t ops[32], fin[32];
    int failed = 0, counter_bad[NCS] = {0};
    char lock[96], counter[96];

    for (int s = 0; s < NCS; s++) {
        total[s] = calloc((size_t)k, sizeof *total[s]);
        if (!total[s]) failed = 1;
        cs_names(s, k, lock, counter, sizeof lock);
        redisReply *r = redisCommand(rc, "DEL %s", lock);
        if (r) freeReplyObject(r);
    }
    static const bench_procs_spec spec = {cw_setup, cw_op, cw_teardown, 1};
    for (int s = 0; !failed && s < NDL; s++) {
        if (!bench_series_on(ctx, cs_name[s])) continue;
        cur_k = k;
        cur_series = s;
        failed = bench_procs_start(ctx, &spec, k, &procs[s]);
        have[s] = !failed;
    }
    for (int kind = 0; !failed && kind < NKINDS; kind++) {
        int want = 0;
        for (int s = NDL; s < NCS; s++)
            want |= cfgs[s - NDL].kind == kind && bench_series_on(ctx, cs_name[s]);
        if (!want || kind_ok[kind] < 0) continue;
        ws[kind] = calloc((size_t)k, sizeof *ws[kind]);
        int r = ws[kind] ? peers_start(ctx, kind, ws[kind], k) : -1;
        if (r < 0) failed = 1;
        if (r) {
            free(ws[kind]);
            ws[kind] = NULL;
            continue;
        }
        for (int s = NDL; s < NCS; s++)
            if (cfgs[s - NDL].kind == kind && bench_series_on(ctx, cs_name[s])) have[s] = 1;
    }
    for (int round = 0; !failed && round < rounds; round++) {
        for (int j = 0; !failed && j < NCS; j++) {
            int s = bench_order(round, j, NCS);
            if (!have[s]) continue;
            cs_names(s, k, lock, counter, sizeof lock);
            redisReply *r = redisCommand(rc, "SET %s 0", counter);
            if (r) freeReplyObject(r);
            int64_t start = bench_now_ns() + 50000000, end = start + round_ns;
            if (s < NDL)
                failed = bench_procs_round(&procs[s], start, end, ops, fin, &waits[s]);
            else
                failed = peer_round(ws[cfgs[s - NDL].kind], k, &cfgs[s - NDL], lock, counter, start,
                                    end, ops, fin, &waits[s]);
            if (failed) break;
            int64_t sum = 0, last = start;
            for (int i = 0; i < k; i++) {
                sum += ops[i];
                total[s][i] += ops[i];
                if (fin[i] > last) last = fin[i];
            }
            rate[s][round] = (double)sum * 1e9 / (double)(last - start);
            long long got = get_int(rc, counter);
            if (got != sum) {
                printf("   FAIL %s-k%d round %d: counter %lld != %lld acquisitions\n",
                       cs_name[s], k, round + 1, got, (long long)sum);
                counter_bad[s] = 1;
            }
            if (ctx->verbose)
                printf("   round %d %s-k%d %.0f acq/s\n", round + 1, cs_name[s], k,
                       rate[s][round]);
        }
    }
    for (int s = 0; s < NDL; s++)
        if (procs[s].k && bench_procs_stop(&procs[s], failed) && !failed) failed = 1;
    for (int kind = 0; kind < NKINDS; kind++) {
        if (!ws[kind]) continue;
        for (int i = 0; i < k; i++) bench_peer_stop(&ws[kind][i]);
        free(ws[kind]);
    }
    for (int s = 0; !failed && s < NCS; s++) {
        if (!have[s]) continue;
        int64_t mn = total[s][0], mx = total[s][0], sum = 0;
        for (int i = 0; i < k; i++) {
            if (total[s][i] < mn) mn = total[s][i];
            if (total[s][i] > mx) mx = total[s][i];
            sum += total[s][i];
        }
        char sn[48];
        snprintf(sn, sizeof sn, "%s-k%d", cs_name[s], k);
        double spread = (double)mx / (double)(mn > 0 ? mn : 1);
        double med = bench_median_d(rate[s], (size_t)rounds);
        double p50 = (double)bench_samples_quantile(&waits[s], 0.5) / 1e3;
        double p99 = (double)bench_samples_quantile(&waits[s], 0.99) / 1e3;
        double wmax = (double)bench_samples_max(&waits[s]) / 1e3;
        bench_metric("peer_contention", sn, "acq_per_s", med, "1/s");
        bench_metric("peer_contention", sn, "acquisitions", (double)sum, "");
        bench_metric("peer_contention", sn, "wait_p50_us", p50, "us");
        bench_metric("peer_contention", sn, "wait_p99_us", p99, "us");
        bench_metric("peer_contention", sn, "wait_max_us", wmax, "us");
        bench_metric("peer_contention", sn, "proc_min", (double)mn, "");
        bench_metric("peer_contention", sn, "proc_max", (double)mx, "");
        bench_metric("peer_contention", sn, "spread", spread, "x");
        bench_metric("peer_contention", sn, "counter_ok", counter_bad[s] ? 0 : 1, "");
        char rb[32];
        bench_fmt_num(rb, sizeof rb, med);
        printf("   %-22s %9s %9.1f ms %9.1f ms %9.1f ms %7lld %7lld %8.2fx %6s\n", sn, rb,
               p50 / 1e3, p99 / 1e3, wmax / 1e3, (long long)mn, (long long)mx, spread,
               counter_bad[s] ? "FAIL" : "exact");
    }
    /* dlock against the best peer at this K */
    double best = 0;
    for (int s = NDL; !failed && s < NCS; s++)
        if (have[s]) {
            double m = bench_median_d(rate[s], (size_t)rounds);
            if (m > best) best = m;
        }
    for (int s = 0; !failed && best > 0 && s < NDL; s++)
        if (have[s]) {
            char sn[48];
            snprintf(sn, sizeof sn, "%s-k%d", cs_name[s], k);
            bench_metric("peer_contention", sn, "ratio_to_best_peer",
                         bench_median_d(rate[s], (size_t)rounds) / best, "x");
        }
    /* dlock against the raw ring (the floor of a handoff per acquisition) */
    for (int s = 0; !failed && have[CS_RING] && s < CS_RING; s++)
        if (have[s]) {
            char sn[48];
            snprintf(sn, sizeof sn, "%s-k%d", cs_name[s], k);
            bench_metric("peer_contention", sn, "ratio_to_raw_ring",
                         bench_median_d(rate[s], (size_t)rounds) /
                             bench_median_d(rate[CS_RING], (size_t)rounds),
                         "x");
        }
    for (int s = 0; s < NCS; s++) {
        free(total[s]);
        bench_samples_free(&waits[s]);
        if (counter_bad[s] && s < NDL) failed = 1; /* a peer's miss is its own finding */
    }
    return failed ? -1 : 0;
}

int bench_peer_contention(bench_ctx *ctx) {
    static const int ks[3] = {2, 8, 32};
    const int nk = ctx->quick ? 2 : 3;
    redisContext *rc = bench_redis_connect(ctx);
    if (!rc) return -1;
    printf("\n== peer_contention: K processes acquire, GET+SET a counter, release "
           "(%d round%s x %.1f s per series, balanced order)\n",
           ctx->quick ? 1 : 3, ctx->quick ? "" : "s", ctx->quick ? 0.5 : 1.0);
    printf("   %-22s %9s %12s %12s %12s %7s %7s %9s %6s\n", "series", "acq/s", "wait p50",
           "wait p99", "wait max", "min", "max", "spread", "count");
    int failed = 0;
    for (int i = 0; !failed && i < nk; i++) failed = contention_k(ctx, rc, ks[i]);
    redisFree(rc);
    return failed ? -1 : 0;
}
