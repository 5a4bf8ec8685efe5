/* Scenarios of issue 7 beside the lock figures:
 *
 *   redis_benchmark  the server's own baseline: `redis-benchmark -t set` with
 *                    1 and 50 clients (SET requests per second, its CSV
 *                    output); skipped when redis-benchmark is not installed
 *   watchdog         one client (a forked process, so that getrusage counts
 *                    it alone) acquires 10,000 plain locks in watchdog mode,
 *                    then holds them 60 s (quick: 5 s, with a 3 s watchdog
 *                    lease so that renewals happen): its CPU time during the
 *                    hold (user + system, every thread: the watchdog's),
 *                    the commands the server ran per renewal period (INFO
 *                    commandstats deltas over the hold, by command), and
 *                    whether every lock was kept (not reported lost, and
 *                    released as owner afterwards)
 *   memory           Redis memory per held lock: 10,000 locks held (explicit
 *                    lease) of each kind: used_memory delta / 10,000 (INFO
 *                    memory, everything the locks leave: the lock key and
 *                    dlock's fence-counter key), and MEMORY USAGE of one
 *                    lock's keys; a raw SET NX PX key of the same name
 *                    length for comparison
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "dlock.h"

#define NLOCKS 10000

static int client_for(const bench_ctx *ctx, int64_t wd_lease_ms, dlock_client **c) {
    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.watchdog_lease_ms = wd_lease_ms;
    if (dlock_client_new(&o, c)) {
        fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(*c));
        return -1;
    }
    return 0;
}

/* ---------------- redis_benchmark ---------------- */

int bench_redis_benchmark(bench_ctx *ctx) {
    printf("\n== redis_benchmark: redis-benchmark -t set (SET requests/s)\n");
    if (system("command -v redis-benchmark >/dev/null 2>&1") != 0) {
        printf("   SKIP: redis-benchmark not found (apt-get install redis-tools)\n");
        return 0;
    }
    static const int clients[2] = {1, 50};
    for (int i = 0; i < 2; i++) {
        int n = ctx->quick ? (clients[i] == 1 ? 5000 : 20000)
                           : (clients[i] == 1 ? 30000 : 200000);
        char cmd[256];
        snprintf(cmd, sizeof cmd,
                 "redis-benchmark -h %s -p %d -t set -n %d -c %d -r 100000 --csv 2>/dev/null",
                 ctx->host, ctx->port, n, clients[i]);
        FILE *f = popen(cmd, "r");
        if (!f) return -1;
        char line[512];
        double rps = -1, p50 = -1, p99 = -1;
        while (fgets(line, sizeof line, f)) {
            /* "SET","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
             * "p95_latency_ms","p99_latency_ms","max_latency_ms" (redis 7) */
            if (strncmp(line, "\"SET\"", 5)) continue;
            double v[7] = {0};
            int k = sscanf(line, "\"SET\",\"%lf\",\"%lf\",\"%lf\",\"%lf\",\"%lf\",\"%lf\",\"%lf\"",
                           &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]);
            if (k >= 1) rps = v[0];
            if (k >= 6) p50 = v[3] * 1e3, p99 = v[5] * 1e3;
        }
        if (pclose(f) != 0 || rps < 0) {
            fprintf(stderr, "dlock_bench: redis-benchmark failed: %s\n", cmd);
            return -1;
        }
        char series[16], num[32];
        snprintf(series, sizeof series, "c%d", clients[i]);
        bench_metric("redis_benchmark", series, "set_per_s", rps, "1/s");
        if (p50 >= 0) {
            bench_metric("redis_benchmark", series, "p50_us", p50, "us");
            bench_metric("redis_benchmark", series, "p99_us", p99, "us");
        }
        bench_fmt_num(num, sizeof num, rps);
        printf("   %2d client%s %10s SET/s   p50 %6.0f us  p99 %6.0f us  (%d requests)\n",
               clients[i], clients[i] > 1 ? "s" : " ", num, p50, p99, n);
    }
    return 0;
}

/* ---------------- watchdog ---------------- */

/* INFO commandstats -> "cmd=calls" pairs; returns calls of every command
 * (name[i], calls[i]), up to max. */
static int commandstats(redisContext *rc, char names[][32], long long *calls, int max) {
    redisReply *r = redisCommand(rc, "INFO commandstats");
    int n = 0;
    if (r && r->type == REDIS_REPLY_STRING) {
        for (const char *p = strstr(r->str, "cmdstat_"); p && n < max;
             p = strstr(p + 1, "cmdstat_")) {
            const char *colon = strchr(p, ':');
            const char *c = colon ? strstr(colon, "calls=") : NULL;
            if (!colon || !c) break;
            snprintf(names[n], 32, "%.*s", (int)(colon - p - 8), p + 8);
            calls[n++] = atoll(c + 6);
        }
    }
    if (r) freeReplyObject(r);
    return n;
}

static int64_t rusage_ns(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000 +
           ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000;
}

typedef struct wd_res {
    int64_t cpu_ns, hold_ns, acquire_ns, kept, lost, released;
} wd_res;

/* The holder process: acquire every lock, say so, hold until told, report. */
static int wd_child(const bench_ctx *ctx, int64_t lease_ms, int cmd_fd, int res_fd) {
    dlock_client *c = NULL;
    dlock_lock **l = calloc(NLOCKS, sizeof *l);
    wd_res res;
    memset(&res, 0, sizeof res);
    int failed = !l || client_for(ctx, lease_ms, &c);
    int64_t t0 = bench_now_ns();
    for (int i = 0; !failed && i < NLOCKS; i++) {
        char name[48];
        snprintf(name, sizeof name, "bench:watchdog:%d", i);
        failed = dlock_lock_new(c, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l[i]) ||
                 dlock_acquire(l[i], DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL);
        if (failed) fprintf(stderr, "dlock_bench: watchdog acquire %d failed\n", i);
    }
    res.acquire_ns = bench_now_ns() - t0;
    char ch = failed ? 'f' : 'a';
    if (write(res_fd, &ch, 1) != 1 || failed) return 1;
    int64_t c0 = rusage_ns(), h0 = bench_now_ns();
    if (read(cmd_fd, &ch, 1) != 1) return 1; /* the driver says: stop holding */
    res.cpu_ns = rusage_ns() - c0;
    res.hold_ns = bench_now_ns() - h0;
    for (int i = 0; i < NLOCKS; i++) {
        if (dlock_lock_is_lost(l[i])) res.lost++;
        else res.kept++;
        if (dlock_release(l[i]) == DLOCK_OK) res.released++;
        dlock_lock_free(l[i]);
    }
    free(l);
    dlock_client_free(c);
    return write(res_fd, &res, sizeof res) == (ssize_t)sizeof res ? 0 : 1;
}

int bench_watchdog(bench_ctx *ctx) {
    const int64_t hold_s = ctx->quick ? 5 : 60;
    const int64_t lease_ms = ctx->quick ? 3000 : DLOCK_DEFAULT_WATCHDOG_MS;
    const int64_t period_ms = lease_ms / 3;
    printf("\n== watchdog: one client holds %d locks in watchdog mode for %lld s "
           "(lease %lld ms, renewed every %lld ms)\n",
           NLOCKS, (long long)hold_s, (long long)lease_ms, (long long)period_ms);
    redisContext *rc = bench_redis_connect(ctx);
    if (!rc) return -1;
    int a2b[2], b2a[2];
    if (pipe(a2b) || pipe(b2a)) {
        redisFree(rc);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        redisFree(rc);
        return -1;
    }
    if (pid == 0) {
        close(a2b[1]);
        close(b2a[0]);
        _exit(wd_child(ctx, lease_ms, a2b[0], b2a[1]));
    }
    close(a2b[0]);
    close(b2a[1]);
    int failed = 0;
    char ch = 0;
    if (read(b2a[0], &ch, 1) != 1 || ch != 'a') failed = 1;
    static char n0[256][32], n1[256][32];
    static long long c0[256], c1[256];
    int k0 = 0, k1 = 0;
    int64_t t0 = 0, t1 = 0;
    if (!failed) {
        k0 = commandstats(rc, n0, c0, 256);
        t0 = bench_now_ns();
        bench_sleep_us(hold_s * 1000000);
        k1 = commandstats(rc, n1, c1, 256);
        t1 = bench_now_ns();
    }
    if (write(a2b[1], "s", 1) != 1) failed = 1;
    wd_res res;
    memset(&res, 0, sizeof res);
    if (!failed && read(b2a[0], &res, sizeof res) != (ssize_t)sizeof res) failed = 1;
    close(a2b[1]);
    close(b2a[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st)) failed = 1;
    if (!failed) {
        double periods = (double)(t1 - t0) / 1e6 / (double)period_ms;
        long long total = 0, scripts = 0;
        char detail[512] = "";
        size_t dl = 0;
        for (int i = 0; i < k1; i++) {
            long long before = 0;
            for (int j = 0; j < k0; j++)
                if (!strcmp(n0[j], n1[i])) before = c0[j];
            long long d = c1[i] - before;
            if (!strcmp(n1[i], "info")) d -= 1; /* our own INFO */
            if (d <= 0) continue;
            total += d;
            if (!strcmp(n1[i], "evalsha") || !strcmp(n1[i], "eval")) scripts += d;
            dl += (size_t)snprintf(detail + dl, sizeof detail - dl, "%s%s %.1f", dl ? ", " : "",
                                   n1[i], (double)d / periods);
            if (dl >= sizeof detail) dl = sizeof detail - 1;
        }
        double cpu_pct = 100.0 * (double)res.cpu_ns / (double)res.hold_ns;
        bench_metric("watchdog", "dlock", "locks", NLOCKS, "");
        bench_metric("watchdog", "dlock", "hold_s", (double)res.hold_ns / 1e9, "s");
        bench_metric("watchdog", "dlock", "lease_ms", (double)lease_ms, "ms");
        bench_metric("watchdog", "dlock", "cpu_pct", cpu_pct, "%");
        bench_metric("watchdog", "dlock", "cpu_ms", (double)res.cpu_ns / 1e6, "ms");
        bench_metric("watchdog", "dlock", "periods", periods, "");
        bench_metric("watchdog", "dlock", "cmds_per_period", (double)total / periods, "");
        bench_metric("watchdog", "dlock", "scripts_per_period", (double)scripts / periods, "");
        bench_metric("watchdog", "dlock", "kept", (double)res.kept, "");
        bench_metric("watchdog", "dlock", "all_kept",
                     res.kept == NLOCKS && res.released == NLOCKS ? 1 : 0, "");
        bench_metric("watchdog", "dlock", "acquire_all_s", (double)res.acquire_ns / 1e9, "s");
        printf("   acquired %d locks in %.2f s; held %.1f s = %.1f renewal periods\n", NLOCKS,
               (double)res.acquire_ns / 1e9, (double)res.hold_ns / 1e9, periods);
        printf("   client CPU during the hold: %.0f ms = %.3f %% of one core\n",
               (double)res.cpu_ns / 1e6, cpu_pct);
        printf("   server commands per renewal period: %.1f, of which %.1f script calls sent by "
               "the client (INFO commandstats counts the calls inside scripts too: %s)\n",
               (double)total / periods, (double)scripts / periods, total ? detail : "none");
        printf("   kept: %lld of %d (lost %lld), released as owner: %lld\n",
               (long long)res.kept, NLOCKS, (long long)res.lost, (long long)res.released);
    }
    redisFree(rc);
    return failed ? -1 : 0;
}

/* ---------------- memory ---------------- */

static long long used_memory(redisContext *rc) {
    redisReply *r = redisCommand(rc, "INFO memory");
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        const char *p = strstr(r->str, "used_memory:");
        if (p) v = atoll(p + 12);
    }
    if (r) freeReplyObject(r);
    return v;
}

static long long mem_usage(redisContext *rc, const char *key) {
    redisReply *r = redisCommand(rc, "MEMORY USAGE %s SAMPLES 0", key);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    if (r) freeReplyObject(r);
    return v;
}

static long long dbsize(redisContext *rc) {
    redisReply *r = redisCommand(rc, "DBSIZE");
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r) freeReplyObject(r);
    return v;
}

int bench_memory(bench_ctx *ctx) {
    const int n = ctx->quick ? 2000 : NLOCKS;
    static const char *const series[3] = {"raw", "dlock", "dlock-reentrant"};
    printf("\n== memory: Redis memory per held lock (%d locks held, names "
           "\"bench:mem:<kind>:<i>\")\n",
           n);
    redisContext *rc = bench_redis_connect(ctx);
    if (!rc) return -1;
    dlock_client *c = NULL;
    int failed = client_for(ctx, 0, &c);
    dlock_lock **l = calloc((size_t)n, sizeof *l);
    if (!l) failed = 1;
    printf("   %-16s %12s %12s %10s  %s\n", "series", "bytes/lock", "keys/lock", "MEMORY",
           "USAGE of one lock's keys");
    for (int s = 0; !failed && s < 3; s++) {
        redisReply *r = redisCommand(rc, "FLUSHALL");
        if (r) freeReplyObject(r);
        long long k0 = dbsize(rc), m0 = used_memory(rc);
        char name[64];
        for (int i = 0; !failed && i < n; i++) {
            snprintf(name, sizeof name, "bench:mem:%s:%d", s == 2 ? "reent" : "plain", i);
            if (s == 0) {
                char tok[33];
                bench_fast_hex(tok, 16);
                r = redisCommand(rc, "SET %s %s NX PX 600000", name, tok);
                failed = !r || r->type != REDIS_REPLY_STATUS;
                if (r) freeReplyObject(r);
            } else {
                failed = dlock_lock_new(c, name, DLOCK_CSTR,
                                        s == 2 ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN, &l[i]) ||
                         dlock_acquire(l[i], DLOCK_NOWAIT, 600000, NULL);
            }
        }
        if (failed) break;
        long long k1 = dbsize(rc), m1 = used_memory(rc);
        /* the keys of lock 0 */
        snprintf(name, sizeof name, "bench:mem:%s:0", s == 2 ? "reent" : "plain");
        r = redisCommand(rc, "KEYS *{bench:mem:%s:0}*", s == 2 ? "reent" : "plain");
        long long usage = mem_usage(rc, name);
        char keys[256];
        int kl = snprintf(keys, sizeof keys, "%s %lld", name, usage);
        if (r && r->type == REDIS_REPLY_ARRAY)
            for (size_t j = 0; j < r->elements && kl < (int)sizeof keys; j++) {
                long long u = mem_usage(rc, r->element[j]->str);
                usage += u;
                kl += snprintf(keys + kl, sizeof keys - (size_t)kl, ", %s %lld",
                               r->element[j]->str, u);
            }
        if (r) freeReplyObject(r);
        double per = (double)(m1 - m0) / n, kper = (double)(k1 - k0) / n;
        bench_metric("memory", series[s], "bytes_per_lock", per, "B");
        bench_metric("memory", series[s], "keys_per_lock", kper, "");
        bench_metric("memory", series[s], "memory_usage", (double)usage, "B");
        printf("   %-16s %12.0f %12.2f %10lld  %s\n", series[s], per, kper, usage, keys);
        for (int i = 0; s > 0 && i < n; i++) {
            dlock_release(l[i]);
            dlock_lock_free(l[i]);
            l[i] = NULL;
        }
    }
    if (l)
        for (int i = 0; i < n; i++) dlock_lock_free(l[i]);
    free(l);
    dlock_client_free(c);
    redisReply *r = redisCommand(rc, "FLUSHALL");
    if (r) freeReplyObject(r);
    redisFree(rc);
    return failed ? -1 : 0;
}
