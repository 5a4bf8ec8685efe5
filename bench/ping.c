/* Scenario "ping": the round trip every other figure is made of. PING by a
 * raw hiredis loop and by dlock_ping (pool checkout + one command). */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "dlock.h"

int bench_ping(bench_ctx *ctx) {
    const int n = ctx->quick ? 500 : 5000;
    bench_samples raw = {0}, dl = {0};
    int failed = 0;
    redisContext *rc = bench_redis_connect(ctx);
    dlock_client *c = NULL;
    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    if (!rc) failed = 1;
    if (!failed && dlock_client_new(&o, &c)) {
        fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(c));
        failed = 1;
    }
    /* alternate in chunks of 100 so that noise hits both */
    for (int i = 0; !failed && i < n; i += 100) {
        for (int j = 0; !failed && j < 100; j++) {
            int64_t t0 = bench_now_ns();
            redisReply *r = redisCommand(rc, "PING");
            int64_t t1 = bench_now_ns();
            if (!r) {
                fprintf(stderr, "dlock_bench: PING: %s\n", rc->errstr);
                failed = 1;
                break;
            }
            freeReplyObject(r);
            failed = bench_samples_add(&raw, t1 - t0);
        }
        for (int j = 0; !failed && j < 100; j++) {
            int64_t t0 = bench_now_ns();
            int e = dlock_ping(c, NULL);
            int64_t t1 = bench_now_ns();
            if (e) {
                fprintf(stderr, "dlock_bench: dlock_ping: %s\n", dlock_errmsg(c));
                failed = 1;
                break;
            }
            failed = bench_samples_add(&dl, t1 - t0);
        }
    }
    if (!failed) {
        printf("\n== ping: one round trip (%d each, alternating chunks)\n", n);
        printf("   %-16s %10s %10s\n", "series", "p50", "p99");
        bench_samples *ss[2] = {&raw, &dl};
        const char *names[2] = {"raw", "dlock"};
        for (int i = 0; i < 2; i++) {
            double p50 = (double)bench_samples_quantile(ss[i], 0.50) / 1e3;
            double p99 = (double)bench_samples_quantile(ss[i], 0.99) / 1e3;
            bench_metric("ping", names[i], "p50_us", p50, "us");
            bench_metric("ping", names[i], "p99_us", p99, "us");
            printf("   %-16s %7.1f us %7.1f us\n", names[i], p50, p99);
        }
    }
    bench_samples_free(&raw);
    bench_samples_free(&dl);
    dlock_client_free(c);
    if (rc) redisFree(rc);
    return failed ? -1 : 0;
}
