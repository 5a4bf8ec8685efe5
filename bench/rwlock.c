/* Scenario "rwlock" (issue 4): read-lock throughput with 8 reader processes.
 *
 *   read-8    8 processes, each in a loop: dlock_acquire + dlock_release of
 *             the read side (DLOCK_KIND_READ) of one lock; readers share it,
 *             so nobody waits
 *   plain-8   8 processes doing plain-lock pairs, each on its own name, so
 *             that neither series contends: what the read lock's heavier
 *             scripts cost against the plain lock at the same load
 *
 * Figure: acquire+release pairs per second summed over the 8 processes
 * (median of the rounds), and the median per-round ratio read-8 / plain-8.
 * The worker processes of both series stay alive; the rounds alternate.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "dlock.h"

#define LEASE_MS 10000
#define WAIT_MS 10000
#define NPROCS 8
#define NSERIES 2

static const char *const series_name[NSERIES] = {"read-8", "plain-8"};

typedef struct worker {
    dlock_client *c;
    dlock_lock *l;
} worker;

static int cur_series;

static void worker_teardown(void *state) {
    worker *w = state;
    dlock_lock_free(w->l);
    dlock_client_free(w->c);
    free(w);
}

static int worker_setup(const bench_ctx *ctx, int idx, void **state) {
    worker *w = calloc(1, sizeof *w);
    if (!w) return -1;
    *state = w;
    char url[128], name[64];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    if (cur_series == 0) snprintf(name, sizeof name, "bench:rwlock:shared");
    else snprintf(name, sizeof name, "bench:rwlock:plain:%d", idx);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    if (dlock_client_new(&o, &w->c)) {
        fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(w->c));
        return -1;
    }
    return dlock_lock_new(w->c, name, DLOCK_CSTR,
                          cur_series == 0 ? DLOCK_KIND_READ : DLOCK_KIND_PLAIN, &w->l)
               ? -1
               : 0;
}

static int worker_op(void *state, int64_t *wait_ns) {
    worker *w = state;
    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(w->l, WAIT_MS, LEASE_MS, NULL);
    if (!rc) rc = dlock_release(w->l);
    if (rc) {
        fprintf(stderr, "dlock_bench: rwlock pair: %s: %s\n", dlock_strerror(rc),
                dlock_lock_errmsg(w->l));
        return -1;
    }
    *wait_ns = bench_now_ns() - t0;
    return 0;
}

int bench_rwlock(bench_ctx *ctx) {
    const int rounds = ctx->quick ? 2 : 10;
    const int64_t round_ns = ctx->quick ? 300000000LL : 500000000LL;
    bench_procs procs[NSERIES];
    memset(procs, 0, sizeof procs);
    bench_samples lat[NSERIES];
    memset(lat, 0, sizeof lat);
    double rate[NSERIES][10], ratio[10];
    int64_t ops[NPROCS], fin[NPROCS];
    int failed = 0;

    printf("\n== rwlock: %d processes doing acquire+release pairs, read side of one lock "
           "vs plain locks on %d names (%d rounds x %.2f s per series, balanced order)\n",
           NPROCS, NPROCS, rounds, (double)round_ns / 1e9);
    for (int s = 0; !failed && s < NSERIES; s++) {
        if (!bench_series_on(ctx, series_name[s])) continue;
        cur_series = s;
        static const bench_procs_spec spec = {worker_setup, worker_op, worker_teardown, 1};
        failed = bench_procs_start(ctx, &spec, NPROCS, &procs[s]);
    }
    for (int round = 0; !failed && round < rounds; round++) {
        for (int k = 0; !failed && k < NSERIES; k++) {
            int s = bench_order(round, k, NSERIES);
            if (!procs[s].k) continue;
            int64_t start = bench_now_ns() + 20000000;
            failed = bench_procs_round(&procs[s], start, start + round_ns, ops, fin, &lat[s]);
            int64_t sum = 0, last = start;
            for (int i = 0; !failed && i < NPROCS; i++) {
                sum += ops[i];
                if (fin[i] > last) last = fin[i];
            }
            rate[s][round] = (double)sum * 1e9 / (double)(last - start);
            if (ctx->verbose && !failed)
                printf("   round %d %-8s %8.0f pairs/s\n", round + 1, series_name[s],
                       rate[s][round]);
        }
    }
    for (int s = 0; s < NSERIES; s++)
        if (procs[s].k && bench_procs_stop(&procs[s], failed) && !failed) {
            fprintf(stderr, "dlock_bench: an rwlock worker failed\n");
            failed = 1;
        }
    if (!failed) {
        printf("   %-8s %12s %10s %10s %10s\n", "series", "pairs/s", "pair p50", "pair p99",
               "ratio");
        for (int s = 0; s < NSERIES; s++) {
            if (!lat[s].n) continue;
            double med = bench_median_d(rate[s], (size_t)rounds);
            double p50 = (double)bench_samples_quantile(&lat[s], 0.50) / 1e3;
            double p99 = (double)bench_samples_quantile(&lat[s], 0.99) / 1e3;
            bench_metric("rwlock", series_name[s], "pairs_per_s", med, "1/s");
            bench_metric("rwlock", series_name[s], "pair_p50_us", p50, "us");
            bench_metric("rwlock", series_name[s], "pair_p99_us", p99, "us");
            char rt[32] = "-";
            if (s == 0 && lat[1].n) {
                for (int r = 0; r < rounds; r++) ratio[r] = rate[0][r] / rate[1][r];
                double rm = bench_median_d(ratio, (size_t)rounds);
                bench_metric("rwlock", series_name[s], "ratio_to_plain", rm, "x");
                snprintf(rt, sizeof rt, "%.2fx", rm);
            }
            char rb[32];
            bench_fmt_num(rb, sizeof rb, med);
            printf("   %-8s %12s %7.1f us %7.1f us %10s\n", series_name[s], rb, p50, p99, rt);
        }
    }
    for (int s = 0; s < NSERIES; s++) bench_samples_free(&lat[s]);
    return failed ? -1 : 0;
}
