/* Scenario "peer_pairs" (peers.c describes it): uncontended pairs of raw
 * hiredis, dlock and every peer. */
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
    if (!failed) failed = pr_make_client(ctx, &c);
    if (!failed && dlock_lock_new(c, "bench:peer_pairs:dlock", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l))
        failed = 1;
    printf("\n== peer_pairs: uncontended acquire+release, one connection, dlock vs peers "
           "(%d rounds x %.2f s per series, balanced order)\n",
           rounds, round_ms / 1e3);
    for (int s = P_PY; !failed && s < P_COUNT; s++) {
        int r = pr_peers_start(ctx, s == P_PY ? K_PY : K_NODE, &pw[s], 1);
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
                char *line = pr_peer_reply(&pw[s], round_ms + PR_LINE_TIMEOUT_MS, "pairs");
                long long n, ns;
                if (!line || bench_peer_parse_ok(line, &n, &ns, &lat[s]) || ns <= 0) {
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
            if (pr_kind_ok[k] > 0) printf("   %s: %s\n", pr_kind_name[k], pr_kind_version[k]);
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
