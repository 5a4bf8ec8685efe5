/* The "backends" scenario (backends.c), full mode: K processes on one
 * lock, a Redis counter under it. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends.h"

/* ---- contention: K processes on one lock, a Redis counter under it ---- */

/* dlock on ZooKeeper and etcd (bench_procs children) and the peers (K
 * workers each): each acquires (no time limit), GET + SET of a counter in
 * the bench's Redis on its own connection, releases. */
static const char *cur_url, *cur_series;
static int cur_k;

typedef struct cworker {
    dlock_client *c;
    dlock_lock *l;
    redisContext *rc;
    char counter[128];
} cworker;

static void cs_names(const char *series, int k, char *lock, char *counter, size_t len) {
    snprintf(lock, len, "bench:backends:contention:%s-k%d", series, k);
    snprintf(counter, len, "bench:backends:counter:%s-k%d", series, k);
}

static void cw_teardown(void *state) {
    cworker *w = state;
    dlock_lock_free(w->l);
    dlock_client_free(w->c);
    if (w->rc) redisFree(w->rc);
    free(w);
}

static int cw_setup(const bench_ctx *ctx, int idx, void **state) {
    (void)idx;
    cworker *w = calloc(1, sizeof *w);
    if (!w) return -1;
    *state = w;
    char lock[128], why[600];
    cs_names(cur_series, cur_k, lock, w->counter, sizeof lock);
    w->rc = bench_redis_connect(ctx);
    if (!w->rc) return -1;
    if (bk_new_client(cur_url, &w->c, why, sizeof why)) {
        fprintf(stderr, "dlock_bench: backends: contention: %s\n", why);
        return -1;
    }
    return dlock_lock_new(w->c, lock, DLOCK_CSTR, DLOCK_KIND_PLAIN, &w->l) ? -1 : 0;
}

static int cw_op(void *state, int64_t *wait_ns) {
    cworker *w = state;
    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(w->l, 120000, DLOCK_WATCHDOG, NULL);
    if (rc) {
        fprintf(stderr, "dlock_bench: backends: contention acquire: %s: %s\n",
                dlock_strerror(rc), dlock_lock_errmsg(w->l));
        return -1;
    }
    *wait_ns = bench_now_ns() - t0;
    int ok = bench_counter_step(w->rc, w->counter) == 0;
    if (dlock_release(w->l)) return -1;
    return ok ? 0 : -1;
}


/* One K: dlock on every backend of dl (zk, etcd) and every peer that runs. */
int bk_contention_k(const bench_ctx *ctx, redisContext *rc, backend **dl, int ndl, peerst *pe,
                    int k, cs_result *res) {
    enum { ROUNDS = 3 };
    const int64_t round_ns = 1000000000LL;
    int ns = ndl + NPEERS;
    bench_procs procs[2];
    bench_peer *ws[NPEERS] = {0};
    bench_samples waits[MAX_CS];
    double rate[MAX_CS][ROUNDS];
    int64_t ops[32], fin[32];
    char name[MAX_CS][48], lock[128], counter[128];
    int failed = 0;
    memset(procs, 0, sizeof procs);
    memset(waits, 0, sizeof waits);
    for (int s = 0; s < ns; s++) {
        res[s].have = 0;
        res[s].counter_ok = 1;
        snprintf(name[s], sizeof name[s], "%s%s", s < ndl ? "dlock-" : "",
                 s < ndl ? dl[s]->name : pe[s - ndl].name);
    }
    static const bench_procs_spec spec = {cw_setup, cw_op, cw_teardown, 1};
    for (int s = 0; !failed && s < ndl; s++) {
        cur_url = dl[s]->url;
        cur_series = name[s];
        cur_k = k;
        if (bench_procs_start(ctx, &spec, k, &procs[s])) {
            printf("   %s-k%d: FAILED (its workers did not start; see above)\n", name[s], k);
            continue;
        }
        res[s].have = 1;
    }
    for (int i = 0; i < NPEERS; i++) {
        if (!pe[i].ok) continue;
        ws[i] = calloc((size_t)k, sizeof *ws[i]);
        if (!ws[i]) return -1;
        int r = 0, j = 0;
        for (; j < k && !r; j++) r = bk_peer_spawn_one(ctx, &pe[i], &ws[i][j]);
        if (r) {
            for (int m = 0; m < j - 1; m++) bench_peer_stop(&ws[i][m]);
            free(ws[i]);
            ws[i] = NULL;
            if (r < 0) printf("   %s-k%d: FAILED (a worker did not start)\n", name[ndl + i], k);
            continue;
        }
        res[ndl + i].have = 1;
    }
    for (int round = 0; !failed && round < ROUNDS; round++) {
        for (int j = 0; !failed && j < ns; j++) {
            int s = bench_order(round, j, ns);
            if (!res[s].have) continue;
            cs_names(name[s], k, lock, counter, sizeof lock);
            redisReply *r = redisCommand(rc, "SET %s 0", counter);
            if (r) freeReplyObject(r);
            int64_t start = bench_now_ns() + 50000000, end = start + round_ns;
            int bad = 0;
            if (s < ndl) {
                bad = bench_procs_round(&procs[s], start, end, ops, fin, &waits[s]);
            } else {
                bench_peer *w = ws[s - ndl];
                for (int i = 0; i < k && !bad; i++)
                    bad = bench_peer_send(&w[i], "contend %s %s %lld %lld", lock, counter,
                                          (long long)(start + w[i].offset),
                                          (long long)(end + w[i].offset));
                int tmo = (int)((end - bench_now_ns()) / 1000000) + 2 * PEER_LINE_MS;
                for (int i = 0; i < k && !bad; i++) {
                    long long n, f;
                    char *l = bk_peer_reply(&pe[s - ndl], &w[i], tmo, "contend");
                    bad = bench_peer_parse_ok(l, &n, &f, &waits[s]);
                    ops[i] = n;
                    fin[i] = f - w[i].offset;
                }
            }
            if (bad) {
                printf("   %s-k%d: FAILED in round %d (see above)\n", name[s], k, round + 1);
                res[s].have = 0;
                if (s < ndl) failed = 1; /* dlock's failure fails the scenario */
                continue;
            }
            int64_t sum = 0, last = start;
            for (int i = 0; i < k; i++) {
                sum += ops[i];
                if (fin[i] > last) last = fin[i];
            }
            rate[s][round] = (double)sum * 1e9 / (double)(last - start);
            long long got = bench_get_int(rc, counter);
            if (got != sum) {
                printf("   FAIL %s-k%d round %d: counter %lld != %lld acquisitions\n", name[s], k,
                       round + 1, got, (long long)sum);
                res[s].counter_ok = 0;
                if (s < ndl) failed = 1;
            }
            if (ctx->verbose)
                printf("   round %d %s-k%d %.0f acq/s\n", round + 1, name[s], k, rate[s][round]);
        }
    }
    for (int s = 0; s < ndl; s++)
        if (procs[s].k && bench_procs_stop(&procs[s], failed) && !failed) failed = 1;
    for (int i = 0; i < NPEERS; i++) {
        if (!ws[i]) continue;
        for (int j = 0; j < k; j++) bench_peer_stop(&ws[i][j]);
        free(ws[i]);
    }
    for (int s = 0; s < ns; s++) {
        if (res[s].have && !failed) {
            char sn[64];
            snprintf(sn, sizeof sn, "%s-k%d", name[s], k);
            res[s].rate = bench_median_d(rate[s], ROUNDS);
            res[s].wait_p50_ms = (double)bench_samples_quantile(&waits[s], 0.5) / 1e6;
            res[s].wait_max_ms = (double)bench_samples_max(&waits[s]) / 1e6;
            double p99 = (double)bench_samples_quantile(&waits[s], 0.99) / 1e6;
            bench_metric("backends", sn, "acq_per_s", res[s].rate, "1/s");
            bench_metric("backends", sn, "wait_p50_us", res[s].wait_p50_ms * 1e3, "us");
            bench_metric("backends", sn, "wait_p99_us", p99 * 1e3, "us");
            bench_metric("backends", sn, "wait_max_us", res[s].wait_max_ms * 1e3, "us");
            bench_metric("backends", sn, "counter_ok", res[s].counter_ok, "");
            char rb[32];
            bench_fmt_num(rb, sizeof rb, res[s].rate);
            printf("   %-22s %9s %9.1f ms %9.1f ms %9.1f ms %6s\n", sn, rb, res[s].wait_p50_ms,
                   p99, res[s].wait_max_ms, res[s].counter_ok ? "exact" : "FAIL");
        } else {
            res[s].have = 0;
        }
        bench_samples_free(&waits[s]);
    }
    return failed ? -1 : 0;
}
