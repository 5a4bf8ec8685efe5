/* Scenario "contention" (issue 4): K processes on one lock, each in a loop
 * acquiring (waiting as long as it takes), doing a non-atomic increment of a
 * counter (GET, then SET of the value + 1, on its own hiredis connection),
 * and releasing.
 *
 *   plain-k8, plain-k32   DLOCK_KIND_PLAIN, K = 8 and 32
 *   fair-k8, fair-k32     DLOCK_KIND_FAIR (FIFO queue, direct handoff)
 *
 * The worker processes of every series are started first and stay alive;
 * each round runs every series once for the round time (1 s), in the order
 * of bench_order (quick: 1 round, full: 5, i.e. 5 s per series).
 * Figures: acquisitions per second (median of the rounds; a round's time runs
 * from its start to the end of its last critical section), the wait of every
 * acquire (p50/p99/max), each process's total acquisitions over all rounds
 * (min, max, spread = max/min; target for fair: under 1.5) and the counter
 * check: after each round the counter must equal the round's acquisitions,
 * else FAIL (the locks did not exclude) and the scenario fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "dlock.h"

#define LEASE_MS 30000
#define WAIT_MS 60000
#define NSERIES 4

static const char *const series_name[NSERIES] = {"plain-k8", "fair-k8", "plain-k32", "fair-k32"};
static const int series_k[NSERIES] = {8, 8, 32, 32};
static const dlock_kind series_kind[NSERIES] = {DLOCK_KIND_PLAIN, DLOCK_KIND_FAIR,
                                                DLOCK_KIND_PLAIN, DLOCK_KIND_FAIR};

typedef struct worker {
    dlock_client *c;
    dlock_lock *l;
    redisContext *rc;
    char counter[64];
} worker;

/* The series being started (set before fork; children read their copy). */
static int cur_series;

static void lock_name_of(int s, char *buf, size_t len) {
    snprintf(buf, len, "bench:contention:%s", series_name[s]);
}

static void counter_of(int s, char *buf, size_t len) {
    snprintf(buf, len, "bench:contention:counter:%s", series_name[s]);
}

static void worker_teardown(void *state) {
    worker *w = state;
    dlock_lock_free(w->l);
    dlock_client_free(w->c);
    if (w->rc) redisFree(w->rc);
    free(w);
}

static int worker_setup(const bench_ctx *ctx, int idx, void **state) {
    (void)idx;
    worker *w = calloc(1, sizeof *w);
    if (!w) return -1;
    *state = w;
    char url[128], name[96];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    lock_name_of(cur_series, name, sizeof name);
    counter_of(cur_series, w->counter, sizeof w->counter);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    if (dlock_client_new(&o, &w->c)) {
        fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(w->c));
        return -1;
    }
    if (dlock_lock_new(w->c, name, DLOCK_CSTR, series_kind[cur_series], &w->l)) return -1;
    w->rc = bench_redis_connect(ctx);
    return w->rc ? 0 : -1;
}

static int worker_op(void *state, int64_t *wait_ns) {
    worker *w = state;
    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(w->l, WAIT_MS, LEASE_MS, NULL);
    if (rc) {
        fprintf(stderr, "dlock_bench: contention acquire: %s: %s\n", dlock_strerror(rc),
                dlock_lock_errmsg(w->l));
        return -1;
    }
    *wait_ns = bench_now_ns() - t0;
    /* the critical section: a read-modify-write that only the lock protects */
    int ok = bench_counter_step(w->rc, w->counter) == 0;
    if (!ok) fprintf(stderr, "dlock_bench: contention counter: %s\n", w->rc->errstr);
    rc = dlock_release(w->l);
    if (rc) {
        fprintf(stderr, "dlock_bench: contention release: %s: %s\n", dlock_strerror(rc),
                dlock_lock_errmsg(w->l));
        return -1;
    }
    return ok ? 0 : -1;
}

int bench_contention(bench_ctx *ctx) {
    const int rounds = ctx->quick ? 1 : 5;
    const int64_t round_ns = 1000000000LL;
    bench_procs procs[NSERIES];
    memset(procs, 0, sizeof procs);
    int64_t *total[NSERIES] = {0}; /* per process, over all rounds */
    bench_samples waits[NSERIES];
    memset(waits, 0, sizeof waits);
    double rate[NSERIES][5];
    int64_t ops[32], fin[32];
    int failed = 0, counter_bad[NSERIES] = {0};
    redisContext *rc = bench_redis_connect(ctx);
    if (!rc) return -1;

    printf("\n== contention: K processes acquire, GET+SET a counter, release "
           "(%d round%s x %.0f s per series, balanced order)\n",
           rounds, rounds > 1 ? "s" : "", (double)round_ns / 1e9);
    for (int s = 0; !failed && s < NSERIES; s++) {
        if (!bench_series_on(ctx, series_name[s])) continue;
        char name[96];
        lock_name_of(s, name, sizeof name);
        redisReply *r = redisCommand(rc, "DEL %s", name);
        if (r) freeReplyObject(r);
        total[s] = calloc((size_t)series_k[s], sizeof *total[s]);
        cur_series = s;
        static const bench_procs_spec spec = {worker_setup, worker_op, worker_teardown, 1};
        failed = !total[s] || bench_procs_start(ctx, &spec, series_k[s], &procs[s]);
    }
    for (int round = 0; !failed && round < rounds; round++) {
        for (int k = 0; !failed && k < NSERIES; k++) {
            int s = bench_order(round, k, NSERIES);
            if (!procs[s].k) continue;
            char counter[64];
            counter_of(s, counter, sizeof counter);
            redisReply *r = redisCommand(rc, "SET %s 0", counter);
            if (r) freeReplyObject(r);
            int64_t start = bench_now_ns() + 20000000; /* all begin together */
            failed = bench_procs_round(&procs[s], start, start + round_ns, ops, fin, &waits[s]);
            if (failed) break;
            int64_t sum = 0, last = start;
            for (int i = 0; i < procs[s].k; i++) {
                sum += ops[i];
                total[s][i] += ops[i];
                if (fin[i] > last) last = fin[i];
            }
            rate[s][round] = (double)sum * 1e9 / (double)(last - start);
            long long got = bench_get_int(rc, counter);
            if (got != sum) {
                printf("   FAIL %s round %d: counter %lld != %lld acquisitions "
                       "(the lock did not exclude)\n",
                       series_name[s], round + 1, got, (long long)sum);
                counter_bad[s] = 1;
            }
            if (ctx->verbose)
                printf("   round %d %-10s %8.0f acq/s\n", round + 1, series_name[s],
                       rate[s][round]);
        }
    }
    for (int s = 0; s < NSERIES; s++)
        if (procs[s].k && bench_procs_stop(&procs[s], failed) && !failed) {
            fprintf(stderr, "dlock_bench: a contention worker failed\n");
            failed = 1;
        }
    if (!failed) {
        printf("   %-10s %10s %10s %10s %10s %8s %8s %7s %8s\n", "series", "acq/s", "wait p50",
               "wait p99", "wait max", "proc min", "proc max", "spread", "counter");
        for (int s = 0; s < NSERIES; s++) {
            if (!total[s]) continue;
            int64_t mn = total[s][0], mx = total[s][0], sum = 0;
            for (int i = 0; i < series_k[s]; i++) {
                if (total[s][i] < mn) mn = total[s][i];
                if (total[s][i] > mx) mx = total[s][i];
                sum += total[s][i];
            }
            /* a process that never got the lock: spread counted against 1 */
            double spread = (double)mx / (double)(mn > 0 ? mn : 1);
            double med = bench_median_d(rate[s], (size_t)rounds);
            double p50 = (double)bench_samples_quantile(&waits[s], 0.50) / 1e3;
            double p99 = (double)bench_samples_quantile(&waits[s], 0.99) / 1e3;
            double wmax = (double)bench_samples_max(&waits[s]) / 1e3;
            const char *sn = series_name[s];
            bench_metric("contention", sn, "acq_per_s", med, "1/s");
            bench_metric("contention", sn, "acquisitions", (double)sum, "");
            bench_metric("contention", sn, "wait_p50_us", p50, "us");
            bench_metric("contention", sn, "wait_p99_us", p99, "us");
            bench_metric("contention", sn, "wait_max_us", wmax, "us");
            bench_metric("contention", sn, "proc_min", (double)mn, "");
            bench_metric("contention", sn, "proc_max", (double)mx, "");
            bench_metric("contention", sn, "spread", spread, "x");
            bench_metric("contention", sn, "counter_ok", counter_bad[s] ? 0 : 1, "");
            char rb[32];
            bench_fmt_num(rb, sizeof rb, med);
            printf("   %-10s %10s %7.0f us %7.0f us %7.0f us %8lld %8lld %6.2fx %8s\n", sn, rb,
                   p50, p99, wmax, (long long)mn, (long long)mx, spread,
                   counter_bad[s] ? "FAIL" : "exact");
        }
    }
    for (int s = 0; s < NSERIES; s++) {
        free(total[s]);
        bench_samples_free(&waits[s]);
        if (counter_bad[s]) failed = 1;
    }
    redisFree(rc);
    return failed ? -1 : 0;
}
