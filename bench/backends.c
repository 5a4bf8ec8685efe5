/* Scenario "backends" (issue 9): every backend beside Redis, in the same run.
 *
 *   dlock_bench --port P --backend-urls NAME=URL,NAME=URL,...
 *
 * e.g. postgres=postgres://...,mysql=mysql://...,mysql-table=mysql://...?lock=table,
 * zk=zk://127.0.0.1:P,etcd=etcd://127.0.0.1:P (bench/run.sh starts private
 * servers for what is installed and passes their URLs). "redis" is the
 * bench's own server (redis://host:port) unless the list names another.
 * Known backends without a URL are skipped with the reason printed; without
 * --backend-urls at all the scenario is skipped (the quick CI mode).
 *
 * Two measurements, one handle per backend, DLOCK_WATCHDOG leases (the one
 * lease every backend takes: the session-held ones, PostgreSQL, MySQL
 * GET_LOCK and ZooKeeper, answer an explicit lease_ms with DLOCK_ENOTSUP):
 *
 *   pairs    uncontended dlock_acquire(DLOCK_NOWAIT) + dlock_release on one
 *            handle, in short rounds over the backends in bench_order (so that
 *            the machine's slow and fast phases hit all alike); pairs/s is
 *            the median of the rounds, the ratio the median of the per-round
 *            ratios to Redis. Backends that take an explicit lease also run
 *            as "<name>-lease" (10 s lease, no watchdog registration).
 *   handoff  A (this process) holds; B, a process forked before any client
 *            existed here, is blocked in dlock_acquire(wait 20 s); A reads
 *            CLOCK_MONOTONIC just before dlock_release, B just after its
 *            dlock_acquire returns and sends it through a pipe. Before each
 *            release A waits until B is seen waiting where the server shows
 *            it (Redis: B's own unlock channel; ZooKeeper and etcd: B's
 *            node / key behind A's, by dlock_inspect), then a settle time
 *            drawn uniformly in [SETTLE_MIN, SETTLE_MAX] ms, the same draw for
 *            every backend of a round: B is then asleep in its wait (the
 *            server-side wait of PostgreSQL and GET_LOCK starts one round
 *            trip after the call), and MySQL's table mode, which polls (4 ms
 *            doubling to 100 ms), is caught at a random point of its poll
 *            schedule. Handoffs go round-robin over the backends.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "dlock.h"

#define MAX_BACKENDS 12
#define MAX_SERIES (2 * MAX_BACKENDS)
#define MAX_ROUNDS 8
#define LEASE_MS 10000
#define WAIT_MS 20000
#define PIPE_TIMEOUT_MS 25000
#define WARMUP_PAIRS 20
#define HANDOFF_WARMUP 3

static const char *const known[] = {"redis", "postgres", "mysql", "mysql-table", "zk", "etcd"};
#define NKNOWN (sizeof known / sizeof known[0])

typedef struct backend {
    char name[32];
    char url[512];
    int waiter_check;      /* 0 settle only, 1 redis channel, 2 dlock_inspect waiters */
    /* B, the waiter process */
    pid_t pid;
    int wfd, rfd;
    /* A: this process */
    dlock_client *client;
    dlock_lock *lock;      /* pairs and the holder's side of the handoffs */
    int has_lease;         /* an explicit lease is accepted: "<name>-lease" series */
    int ok;                /* still measured (0: skipped or failed) */
    bench_samples handoff;
} backend;

static const char pair_lock[] = "bench:backends:pairs";
static const char handoff_lock[] = "bench:backends:handoff";

static int new_client(const char *url, dlock_client **out, char *why, size_t whylen) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    int rc = dlock_client_new(&o, out);
    if (rc) {
        snprintf(why, whylen, "dlock_client_new: %s: %s", dlock_strerror(rc),
                 *out ? dlock_errmsg(*out) : "out of memory");
        dlock_client_free(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- B: the waiter (a child process) ---- */

/* Answers 'r' once connected (or 'x'), then per 'g': 'w' just before
 * dlock_acquire, then the time it held the lock (or -1), after releasing. */
static int waiter_main(const char *url, int cmd_fd, int res_fd) {
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    char why[600] = "";
    int failed = new_client(url, &c, why, sizeof why) != DLOCK_OK;
    if (!failed && dlock_lock_new(c, handoff_lock, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l)) {
        snprintf(why, sizeof why, "dlock_lock_new: %s", dlock_errmsg(c));
        failed = 1;
    }
    if (failed) fprintf(stderr, "dlock_bench: backends: waiter: %s\n", why);
    if (bench_write_full(res_fd, failed ? "x" : "r", 1)) failed = 1;
    while (!failed) {
        char op;
        if (bench_read_full(cmd_fd, &op, 1, 10 * PIPE_TIMEOUT_MS) || op != 'g') break;
        if (bench_write_full(res_fd, "w", 1)) break;
        int64_t held = -1;
        int rc = dlock_acquire(l, WAIT_MS, DLOCK_WATCHDOG, NULL);
        if (rc == DLOCK_OK) {
            held = bench_now_ns();
            rc = dlock_release(l);
            if (rc) held = -1;
        }
        if (rc) {
            fprintf(stderr, "dlock_bench: backends: waiter: %s: %s\n", dlock_strerror(rc),
                    dlock_lock_errmsg(l));
            failed = 1;
        }
        if (bench_write_full(res_fd, &held, sizeof held)) break;
    }
    dlock_lock_free(l);
    dlock_client_free(c);
    return failed;
}

static int start_waiter(backend *b) {
    int a2b[2], b2a[2];
    b->pid = -1;
    b->wfd = b->rfd = -1;
    if (pipe(a2b)) return -1;
    if (pipe(b2a)) {
        close(a2b[0]), close(a2b[1]);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("dlock_bench: fork");
        close(a2b[0]), close(a2b[1]), close(b2a[0]), close(b2a[1]);
        return -1;
    }
    if (pid == 0) {
        close(a2b[1]);
        close(b2a[0]);
        _exit(waiter_main(b->url, a2b[0], b2a[1]));
    }
    close(a2b[0]);
    close(b2a[1]);
    b->pid = pid;
    b->wfd = a2b[1];
    b->rfd = b2a[0];
    return 0;
}

static int stop_waiter(backend *b, int kill_it) {
    if (b->pid < 0) return 0;
    if (!kill_it) bench_write_full(b->wfd, "q", 1);
    close(b->wfd);
    close(b->rfd);
    if (kill_it) kill(b->pid, SIGTERM);
    int status = 0;
    while (waitpid(b->pid, &status, 0) < 0 && errno == EINTR) {
    }
    b->pid = -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ---- the list of backends ---- */

static int parse_urls(const bench_ctx *ctx, backend *bk, int *n) {
    *n = 0;
    for (const char *p = ctx->backend_urls; p && *p;) {
        size_t l = strcspn(p, ",");
        const char *eq = memchr(p, '=', l);
        if (!eq || eq == p || (size_t)(eq - p) >= sizeof bk[0].name ||
            l - (size_t)(eq - p) - 1 >= sizeof bk[0].url) {
            fprintf(stderr, "dlock_bench: --backend-urls: bad entry '%.*s' (NAME=URL)\n", (int)l,
                    p);
            return -1;
        }
        if (*n == MAX_BACKENDS) {
            fprintf(stderr, "dlock_bench: --backend-urls: more than %d backends\n",
                    MAX_BACKENDS);
            return -1;
        }
        backend *b = &bk[(*n)++];
        memset(b, 0, sizeof *b);
        snprintf(b->name, sizeof b->name, "%.*s", (int)(eq - p), p);
        snprintf(b->url, sizeof b->url, "%.*s", (int)(l - (size_t)(eq - p) - 1), eq + 1);
        for (int i = 0; i < *n - 1; i++)
            if (!strcmp(bk[i].name, b->name)) {
                fprintf(stderr, "dlock_bench: --backend-urls: '%s' twice\n", b->name);
                return -1;
            }
        p += l;
        if (*p == ',') p++;
    }
    /* Redis first: the base of the ratios (the bench's server unless named) */
    int have_redis = -1;
    for (int i = 0; i < *n; i++)
        if (!strcmp(bk[i].name, "redis")) have_redis = i;
    if (have_redis < 0 && *n == MAX_BACKENDS) {
        fprintf(stderr, "dlock_bench: --backend-urls: more than %d backends\n", MAX_BACKENDS);
        return -1;
    }
    if (have_redis < 0) {
        memmove(&bk[1], &bk[0], (size_t)*n * sizeof *bk);
        memset(&bk[0], 0, sizeof *bk);
        snprintf(bk[0].name, sizeof bk[0].name, "redis");
        snprintf(bk[0].url, sizeof bk[0].url, "redis://%s:%d", ctx->host, ctx->port);
        bk[0].waiter_check = 1;
        (*n)++;
    } else if (have_redis > 0) {
        backend t = bk[have_redis];
        memmove(&bk[1], &bk[0], (size_t)have_redis * sizeof *bk);
        bk[0] = t;
    }
    for (int i = 0; i < *n; i++) {
        backend *b = &bk[i];
        if (!strcmp(b->name, "zk") || !strcmp(b->name, "etcd")) b->waiter_check = 2;
        b->pid = -1;
        b->ok = 1;
    }
    for (size_t k = 0; k < NKNOWN; k++) {
        int found = 0;
        for (int i = 0; i < *n; i++) found |= !strcmp(bk[i].name, known[k]);
        if (!found)
            printf("   SKIP %s: no URL given (--backend-urls %s=URL)\n", known[k], known[k]);
    }
    return 0;
}

/* ---- pairs ---- */

typedef struct series {
    backend *b;
    int64_t lease;         /* DLOCK_WATCHDOG or LEASE_MS */
    char name[40];
    double rate[MAX_ROUNDS];
    bench_samples pair;
    int ok;
} series;

static int one_pair(series *s, int64_t *ns) {
    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(s->b->lock, DLOCK_NOWAIT, s->lease, NULL);
    if (rc == DLOCK_OK) {
        rc = dlock_release(s->b->lock);
        *ns = bench_now_ns() - t0;
    }
    if (rc)
        fprintf(stderr, "dlock_bench: backends: %s pair: %s: %s\n", s->name, dlock_strerror(rc),
                dlock_lock_errmsg(s->b->lock));
    return rc ? -1 : 0;
}

static int run_pairs(const bench_ctx *ctx, series *sr, int ns) {
    const int rounds = ctx->quick ? 3 : MAX_ROUNDS;
    const int64_t round_ns = ctx->quick ? 100000000LL : 250000000LL;
    int failed = 0;
    printf("\n   pairs: uncontended dlock_acquire(DLOCK_NOWAIT) + dlock_release on one handle "
           "(%d rounds x %.2f s per series, balanced order)\n",
           rounds, (double)round_ns / 1e9);
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < ns; k++) {
            series *s = &sr[bench_order(r, k, ns)];
            if (!s->ok) continue;
            int64_t t;
            for (int i = 0; s->ok && i < WARMUP_PAIRS; i++)
                if (one_pair(s, &t)) s->ok = 0;
            long n = 0;
            int64_t start = bench_now_ns(), end = start + round_ns, now = start;
            while (s->ok && now < end) {
                if (one_pair(s, &t) || bench_samples_add(&s->pair, t)) {
                    s->ok = 0;
                    break;
                }
                n++;
                now = bench_now_ns();
            }
            if (!s->ok) {
                failed = 1;
                continue;
            }
            s->rate[r] = (double)n * 1e9 / (double)(now - start);
            if (ctx->verbose)
                printf("   round %d %-18s %8.0f pairs/s\n", r + 1, s->name, s->rate[r]);
        }
    }
    printf("   %-18s %10s %10s %10s %10s\n", "series", "pairs/s", "pair p50", "pair p99",
           "vs redis");
    for (int i = 0; i < ns; i++) {
        series *s = &sr[i];
        if (!s->ok) {
            printf("   %-18s FAILED (see above)\n", s->name);
            continue;
        }
        double med = bench_median_d(s->rate, (size_t)rounds);
        double p50 = (double)bench_samples_quantile(&s->pair, 0.50) / 1e3;
        double p99 = (double)bench_samples_quantile(&s->pair, 0.99) / 1e3;
        bench_metric("backends", s->name, "pairs_per_s", med, "1/s");
        bench_metric("backends", s->name, "pair_p50_us", p50, "us");
        bench_metric("backends", s->name, "pair_p99_us", p99, "us");
        bench_metric("backends", s->name, "pair_samples", (double)s->pair.n, "");
        char rtext[32] = "-";
        if (i > 0 && sr[0].ok && !strcmp(sr[0].name, "redis")) {
            double ratio[MAX_ROUNDS];
            for (int r = 0; r < rounds; r++) ratio[r] = s->rate[r] / sr[0].rate[r];
            double rm = bench_median_d(ratio, (size_t)rounds);
            snprintf(rtext, sizeof rtext, "%.3fx", rm);
            bench_metric("backends", s->name, "pairs_ratio_to_redis", rm, "x");
        }
        char rb[32];
        bench_fmt_num(rb, sizeof rb, med);
        printf("   %-18s %10s %7.1f us %7.1f us %10s\n", s->name, rb, p50, p99, rtext);
    }
    return failed;
}

/* ---- handoff ---- */

/* 1 when B is seen waiting (or the backend cannot show it), 0 not yet, -1 error */
static int waiter_seen(const bench_ctx *ctx, redisContext *rc, backend *b) {
    if (b->waiter_check == 1 && rc) {
        long long n = bench_lock_waiters(rc, handoff_lock);
        return n < 0 ? -1 : n >= 1;
    }
    if (b->waiter_check == 2) {
        dlock_info info;
        int e = dlock_inspect(b->client, handoff_lock, DLOCK_CSTR, &info);
        if (e) {
            fprintf(stderr, "dlock_bench: backends: %s inspect: %s: %s\n", b->name,
                    dlock_strerror(e), dlock_errmsg(b->client));
            return -1;
        }
        return info.waiters >= 1;
    }
    (void)ctx;
    return 1;
}

static int one_handoff(const bench_ctx *ctx, redisContext *rc, backend *b, int64_t settle_us,
                       int64_t *ns) {
    int e = dlock_acquire(b->lock, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL);
    if (e) {
        fprintf(stderr, "dlock_bench: backends: %s holder acquire: %s: %s\n", b->name,
                dlock_strerror(e), dlock_lock_errmsg(b->lock));
        return -1;
    }
    char w = 0;
    if (bench_write_full(b->wfd, "g", 1) || bench_read_full(b->rfd, &w, 1, PIPE_TIMEOUT_MS) || w != 'w') {
        fprintf(stderr, "dlock_bench: backends: %s waiter did not start waiting\n", b->name);
        return -1;
    }
    int64_t give_up = bench_now_ns() + 10000000000LL;
    int seen;
    while ((seen = waiter_seen(ctx, rc, b)) == 0 && bench_now_ns() < give_up) bench_sleep_us(200);
    if (seen != 1) {
        if (!seen) fprintf(stderr, "dlock_bench: backends: %s waiter never seen\n", b->name);
        return -1;
    }
    bench_sleep_us(settle_us);
    int64_t t0 = bench_now_ns();
    e = dlock_release(b->lock);
    if (e) {
        fprintf(stderr, "dlock_bench: backends: %s holder release: %s: %s\n", b->name,
                dlock_strerror(e), dlock_lock_errmsg(b->lock));
        return -1;
    }
    int64_t t1 = -1;
    if (bench_read_full(b->rfd, &t1, sizeof t1, PIPE_TIMEOUT_MS) || t1 < 0) {
        fprintf(stderr, "dlock_bench: backends: %s waiter failed or timed out\n", b->name);
        return -1;
    }
    *ns = t1 - t0;
    return 0;
}

static int run_handoffs(const bench_ctx *ctx, backend *bk, int n) {
    const int per = ctx->quick ? 30 : 200;
    const int64_t smin = ctx->quick ? 2000 : 5000, smax = ctx->quick ? 10000 : 50000;
    int failed = 0;
    redisContext *rc = bk[0].waiter_check == 1 ? bench_redis_connect(ctx) : NULL;
    if (bk[0].waiter_check == 1 && !rc) bk[0].waiter_check = 0;
    printf("\n   handoff: A releases, B (another process, blocked in dlock_acquire) holds "
           "(%d per backend, round-robin; settle %lld-%lld ms)\n",
           per, (long long)(smin / 1000), (long long)(smax / 1000));
    uint64_t rnd = (uint64_t)bench_now_ns() | 1;
    for (int i = 0; i < per + HANDOFF_WARMUP; i++) {
        rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
        int64_t settle = smin + (int64_t)(rnd % (uint64_t)(smax - smin + 1));
        for (int k = 0; k < n; k++) {
            backend *b = &bk[k];
            if (!b->ok) continue;
            int64_t t = 0;
            if (one_handoff(ctx, rc, b, settle, &t) ||
                (i >= HANDOFF_WARMUP && bench_samples_add(&b->handoff, t))) {
                b->ok = 0;
                failed = 1;
                stop_waiter(b, 1);
                if (dlock_lock_holding(b->lock)) dlock_release(b->lock);
            }
        }
    }
    if (rc) redisFree(rc);
    printf("   %-18s %8s %10s %10s %10s %10s\n", "backend", "handoffs", "p50", "p99", "max",
           "p50 vs redis");
    double base = bk[0].ok ? (double)bench_samples_quantile(&bk[0].handoff, 0.50) / 1e3 : 0;
    for (int k = 0; k < n; k++) {
        backend *b = &bk[k];
        if (!b->client) continue;
        if (!b->ok) {
            printf("   %-18s FAILED (see above)\n", b->name);
            continue;
        }
        double p50 = (double)bench_samples_quantile(&b->handoff, 0.50) / 1e3;
        double p90 = (double)bench_samples_quantile(&b->handoff, 0.90) / 1e3;
        double p99 = (double)bench_samples_quantile(&b->handoff, 0.99) / 1e3;
        double mx = (double)bench_samples_max(&b->handoff) / 1e3;
        bench_metric("backends", b->name, "handoff_p50_us", p50, "us");
        bench_metric("backends", b->name, "handoff_p90_us", p90, "us");
        bench_metric("backends", b->name, "handoff_p99_us", p99, "us");
        bench_metric("backends", b->name, "handoff_max_us", mx, "us");
        bench_metric("backends", b->name, "handoff_samples", (double)b->handoff.n, "");
        char rtext[32] = "-";
        if (k > 0 && base > 0) {
            snprintf(rtext, sizeof rtext, "%.1fx", p50 / base);
            bench_metric("backends", b->name, "handoff_p50_ratio_to_redis", p50 / base, "x");
        }
        printf("   %-18s %8zu %7.1f us %7.1f us %7.1f us %10s\n", b->name, b->handoff.n, p50, p99,
               mx, rtext);
    }
    return failed;
}

int bench_backends(bench_ctx *ctx) {
    if (!ctx->backend_urls) {
        printf("\n== backends: SKIP: no --backend-urls (bench/run.sh passes them with "
               "--only backends, or in full mode)\n");
        return 0;
    }
    backend bk[MAX_BACKENDS];
    series sr[MAX_SERIES];
    int n = 0, ns = 0, failed = 0;
    memset(sr, 0, sizeof sr);
    printf("\n== backends: every backend beside Redis, same run (DLOCK_WATCHDOG leases)\n");
    if (parse_urls(ctx, bk, &n)) return -1;

    /* B processes first, while this process has no client and no thread */
    for (int i = 0; i < n; i++)
        if (start_waiter(&bk[i])) bk[i].ok = 0, failed = 1;
    for (int i = 0; i < n; i++) {
        backend *b = &bk[i];
        char st = 0;
        if (b->pid < 0) continue;
        if (bench_read_full(b->rfd, &st, 1, PIPE_TIMEOUT_MS) || st != 'r') {
            printf("   SKIP %s: the waiter process could not connect (its message is above)\n",
                   b->name);
            stop_waiter(b, 1);
            b->ok = 0;
        }
    }
    /* A's clients */
    for (int i = 0; i < n; i++) {
        backend *b = &bk[i];
        if (!b->ok) continue;
        char why[600];
        if (new_client(b->url, &b->client, why, sizeof why)) {
            printf("   SKIP %s: %s\n", b->name, why);
            b->ok = 0;
            stop_waiter(b, 0);
            continue;
        }
        if (dlock_lock_new(b->client, pair_lock, DLOCK_CSTR, DLOCK_KIND_PLAIN, &b->lock)) {
            printf("   SKIP %s: dlock_lock_new: %s\n", b->name, dlock_errmsg(b->client));
            b->ok = 0;
            stop_waiter(b, 0);
            continue;
        }
        /* does it take an explicit lease? (the session-held backends: ENOTSUP) */
        int e = dlock_acquire(b->lock, DLOCK_NOWAIT, LEASE_MS, NULL);
        if (e == DLOCK_OK) {
            b->has_lease = 1;
            e = dlock_release(b->lock);
        } else if (e == DLOCK_ENOTSUP) {
            e = DLOCK_OK;
        }
        if (e) {
            printf("   SKIP %s: first acquire: %s: %s\n", b->name, dlock_strerror(e),
                   dlock_lock_errmsg(b->lock));
            b->ok = 0;
            stop_waiter(b, 0);
            continue;
        }
        char version[64] = "";
        if (dlock_server_fact(b->client, "version", version, sizeof version))
            dlock_server_fact(b->client, "info:server:redis_version", version, sizeof version);
        version[strcspn(version, " ,")] = '\0'; /* "15.20 (Debian ...)" */
        char *junk = strstr(version, "-${");       /* ZooKeeper's unfilled build id */
        if (junk) *junk = '\0';
        printf("   %-12s %s (server %s)%s\n", b->name, b->url, version[0] ? version : "?",
               b->has_lease ? "" : "; an explicit lease is DLOCK_ENOTSUP here");
        sr[ns].b = b, sr[ns].lease = DLOCK_WATCHDOG, sr[ns].ok = 1;
        snprintf(sr[ns].name, sizeof sr[ns].name, "%.31s", b->name);
        ns++;
    }
    for (int i = 0; i < n; i++) {
        if (!bk[i].ok || !bk[i].has_lease) continue;
        sr[ns].b = &bk[i], sr[ns].lease = LEASE_MS, sr[ns].ok = 1;
        snprintf(sr[ns].name, sizeof sr[ns].name, "%.31s-lease", bk[i].name);
        ns++;
    }
    if (!bk[0].ok) printf("   (no Redis figures: the ratios are left out)\n");

    if (ns) failed |= run_pairs(ctx, sr, ns);
    /* the handoffs use their own lock name: swap A's handles */
    for (int i = 0; i < n; i++) {
        backend *b = &bk[i];
        if (!b->ok) continue;
        dlock_lock_free(b->lock);
        b->lock = NULL;
        if (dlock_lock_new(b->client, handoff_lock, DLOCK_CSTR, DLOCK_KIND_PLAIN, &b->lock)) {
            fprintf(stderr, "dlock_bench: backends: %s: dlock_lock_new: %s\n", b->name,
                    dlock_errmsg(b->client));
            b->ok = 0;
            failed = 1;
        }
    }
    if (ns) failed |= run_handoffs(ctx, bk, n);

    for (int i = 0; i < n; i++) {
        if (stop_waiter(&bk[i], 0) && bk[i].ok) {
            fprintf(stderr, "dlock_bench: backends: %s waiter process failed\n", bk[i].name);
            failed = 1;
        }
        dlock_lock_free(bk[i].lock);
        dlock_client_free(bk[i].client);
        bench_samples_free(&bk[i].handoff);
    }
    for (int i = 0; i < ns; i++) bench_samples_free(&sr[i].pair);
    return failed ? -1 : 0;
}
