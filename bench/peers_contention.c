/* Scenario "peer_contention" (peers.c describes it): K processes on one
 * lock per series, dlock, dlock-fair, the raw ring and every peer. */
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
    if (pr_make_client(ctx, &w->c) ||
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
    int ok = bench_counter_step(w->rc, w->counter) == 0;
    if (w->l ? dlock_release(w->l) != 0 : ring_pass(w) != 0) return -1;
    return ok ? 0 : -1;
}

/* One round of a peer series over its K workers. */
static int peer_round(peer *ws, int k, const peer_cfg *c, const char *lock, const char *counter,
                      int64_t start, int64_t end, int64_t *ops, int64_t *fin,
                      bench_samples *waits) {
    for (int i = 0; i < k; i++)
        if (bench_peer_send(&ws[i], "contend %s %s %s %lld %lld", lock, counter, c->arg,
                      (long long)(start + ws[i].offset), (long long)(end + ws[i].offset)))
            return -1;
    int tmo = (int)((end - bench_now_ns()) / 1000000) + 2 * PR_LINE_TIMEOUT_MS;
    for (int i = 0; i < k; i++) {
        char *l = pr_peer_reply(&ws[i], tmo, "contend");
        long long n, f;
        if (!l || bench_peer_parse_ok(l, &n, &f, waits)) return -1;
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
            want |= pr_cfgs[s - NDL].kind == kind && bench_series_on(ctx, cs_name[s]);
        if (!want || pr_kind_ok[kind] < 0) continue;
        ws[kind] = calloc((size_t)k, sizeof *ws[kind]);
        int r = ws[kind] ? pr_peers_start(ctx, kind, ws[kind], k) : -1;
        if (r < 0) failed = 1;
        if (r) {
            free(ws[kind]);
            ws[kind] = NULL;
            continue;
        }
        for (int s = NDL; s < NCS; s++)
            if (pr_cfgs[s - NDL].kind == kind && bench_series_on(ctx, cs_name[s])) have[s] = 1;
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
                failed = peer_round(ws[pr_cfgs[s - NDL].kind], k, &pr_cfgs[s - NDL], lock, counter, start,
                                    end, ops, fin, &waits[s]);
            if (failed) break;
            int64_t sum = 0, last = start;
            for (int i = 0; i < k; i++) {
                sum += ops[i];
                total[s][i] += ops[i];
                if (fin[i] > last) last = fin[i];
            }
            rate[s][round] = (double)sum * 1e9 / (double)(last - start);
            long long got = bench_get_int(rc, counter);
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
