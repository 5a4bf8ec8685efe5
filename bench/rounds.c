/* In-process series measured in alternating rounds (semaphore, redlock,
 * idworker): many short rounds, every series once per round, in the
 * balanced order of bench_order, as pairs.c does. The rate is the median of the rounds;
 * the ratio is the median of the per-round ratios against the base series of
 * the same round; latency quantiles are over every operation of every round.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

int bench_rounds_run(const bench_ctx *ctx, const bench_rounds_spec *sp) {
    const int ns = sp->nseries, nr = sp->rounds;
    double *rate = calloc((size_t)(ns * nr), sizeof *rate);
    double *ratio = calloc((size_t)nr, sizeof *ratio);
    bench_samples *lat = calloc((size_t)ns, sizeof *lat);
    int failed = !rate || !ratio || !lat;
    if (failed) fprintf(stderr, "dlock_bench: out of memory\n");
    for (int round = 0; !failed && round < nr; round++) {
        for (int k = 0; !failed && k < ns; k++) {
            int s = bench_order(round, k, ns);
            if (!bench_series_on(ctx, sp->series[s])) continue;
            int64_t t;
            for (int i = 0; !failed && i < sp->warmup; i++) failed = sp->op(sp->state, s, &t);
            long n = 0;
            int64_t start = bench_now_ns(), end = start + sp->round_ns, now = start;
            while (!failed && now < end) {
                failed = sp->op(sp->state, s, &t);
                if (failed) break;
                if (bench_samples_add(&lat[s], t)) {
                    fprintf(stderr, "dlock_bench: out of memory\n");
                    failed = -1;
                }
                n++;
                now = bench_now_ns();
            }
            rate[s * nr + round] = (double)n * 1e9 / (double)(now - start);
            if (ctx->verbose && !failed)
                printf("   round %d %-16s %10.0f %s\n", round + 1, sp->series[s],
                       rate[s * nr + round], sp->rate_name);
        }
    }
    if (!failed) {
        int have_base = bench_series_on(ctx, sp->series[sp->base]);
        printf("   %-16s %12s %10s %10s %10s %10s %10s\n", "series", sp->rate_name, "p50", "p99",
               "max", "rate ratio", "p50 ratio");
        double base_p50 = (double)bench_samples_quantile(&lat[sp->base], 0.50) / 1e3;
        char rname[40];
        snprintf(rname, sizeof rname, "ratio_to_%s", sp->series[sp->base]);
        for (int s = 0; s < ns; s++) {
            if (!bench_series_on(ctx, sp->series[s])) continue;
            double *r = &rate[s * nr];
            double med = bench_median_d(r, (size_t)nr);
            double lo = r[0], hi = r[0];
            for (int i = 1; i < nr; i++) {
                if (r[i] < lo) lo = r[i];
                if (r[i] > hi) hi = r[i];
            }
            double p50 = (double)bench_samples_quantile(&lat[s], 0.50) / 1e3;
            double p99 = (double)bench_samples_quantile(&lat[s], 0.99) / 1e3;
            double mx = (double)bench_samples_max(&lat[s]) / 1e3;
            char mname[48];
            bench_metric(sp->scenario, sp->series[s], sp->rate_name, med, "1/s");
            snprintf(mname, sizeof mname, "%s_min", sp->rate_name);
            bench_metric(sp->scenario, sp->series[s], mname, lo, "1/s");
            snprintf(mname, sizeof mname, "%s_max", sp->rate_name);
            bench_metric(sp->scenario, sp->series[s], mname, hi, "1/s");
            bench_metric(sp->scenario, sp->series[s], "p50_us", p50, "us");
            bench_metric(sp->scenario, sp->series[s], "p99_us", p99, "us");
            bench_metric(sp->scenario, sp->series[s], "max_us", mx, "us");
            bench_metric(sp->scenario, sp->series[s], "samples", (double)lat[s].n, "");
            char rt[32] = "-", pt[32] = "-";
            if (s != sp->base && have_base) {
                for (int i = 0; i < nr; i++) ratio[i] = r[i] / rate[sp->base * nr + i];
                double rm = bench_median_d(ratio, (size_t)nr);
                bench_metric(sp->scenario, sp->series[s], rname, rm, "x");
                snprintf(rt, sizeof rt, "%.2fx", rm);
                if (base_p50 > 0) {
                    bench_metric(sp->scenario, sp->series[s], "p50_ratio", p50 / base_p50, "x");
                    snprintf(pt, sizeof pt, "%.2fx", p50 / base_p50);
                }
            }
            char rb[32];
            bench_fmt_num(rb, sizeof rb, med);
            printf("   %-16s %12s %7.1f us %7.1f us %7.1f us %10s %10s\n", sp->series[s], rb, p50,
                   p99, mx, rt, pt);
        }
    }
    if (lat)
        for (int s = 0; s < ns; s++) bench_samples_free(&lat[s]);
    free(lat);
    free(rate);
    free(ratio);
    return failed ? -1 : 0;
}
