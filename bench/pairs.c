/* Scenario "pairs": uncontended acquire+release pairs per second on one
 * connection, and the pair latency.
 *
 *   raw              hiredis: SET key token NX PX ttl, then the compare-and-
 *                    delete release script by EVALSHA (SCRIPT LOAD first)
 *   dlock            dlock_acquire(DLOCK_NOWAIT, explicit lease) + dlock_release
 *                    on a plain lock
 *   dlock-reentrant  the same on a reentrant (Redisson layout) lock; no target
 *   dlock-identity   "dlock" on a client that records holder identity
 *                    (dlock_client_set_identity); its ratio to "dlock" is
 *                    what the record costs (target: at least 0.95x)
 *   raw-fenced       hiredis running dlock's own protocol: the acquire script
 *                    (SET NX PX + INCR of the fence counter) and the release
 *                    script (compare, DEL, PUBLISH), both by EVALSHA. dlock
 *                    against raw-fenced is the client library's overhead;
 *                    raw-fenced against raw is the protocol's (fencing tokens
 *                    need the acquire to be a script). No target.
 *   raw-fenced-identity  raw-fenced with a holder record as dlock writes it:
 *                    the acquire script also SETs the record key with the
 *                    lease, the release script DELs it with the lock. Its
 *                    ratio to raw-fenced is the floor of a record kept in a
 *                    key of its own (the server's work for one more key
 *                    per hold, no client library); dlock-identity against it
 *                    is the library's overhead with the record on.
 *
 * Many short rounds alternate the series (this kind of machine swings between
 * a fast and a slow state every few hundred ms, so long rounds would give one
 * series the fast state and another the slow one), in a balanced order
 * (bench_order: every series runs after every other equally often; a series
 * also runs faster or slower for the one before it). pairs/s is the median of the rounds; the ratio is the median
 * of the per-round ratios (each series against the raw run of the same round);
 * latencies are quantiles over every pair of every round.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "dlock.h"

#define LEASE_MS 10000
#define WARMUP_PAIRS 50
#define MAX_ROUNDS 20

static const char release_lua[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end";
/* the work of dlock's plain acquire and release scripts (src/lock_plain.c;
 * the fence function is DL_LUA_FENCE of src/services.h) */
static const char fenced_acquire_lua[] =
    "local function fence(k) local f = redis.call('incr', k) "
    "local t = redis.call('time') "
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) "
    "if now > f then f = now redis.call('set', k, string.format('%d', f)) end "
    "return f end "
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
    "return {1, fence(KEYS[2])} end "
    "return {0, redis.call('pttl', KEYS[1])}";
static const char fenced_release_lua[] =
    "if redis.pcall('get', KEYS[1]) == ARGV[1] then "
    "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '0'); return 1 end "
    "return 0";
/* the same with the holder record (KEYS[3], ARGV[3]) of src/lock_plain.c */
static const char fenced_who_acquire_lua[] =
    "local function fence(k) local f = redis.call('incr', k) "
    "local t = redis.call('time') "
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) "
    "if now > f then f = now redis.call('set', k, string.format('%d', f)) end "
    "return f end "
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
    "redis.call('set', KEYS[3], ARGV[3], 'PX', ARGV[2]) "
    "return {1, fence(KEYS[2])} end "
    "return {0, redis.call('pttl', KEYS[1])}";
static const char fenced_who_release_lua[] =
    "if redis.pcall('get', KEYS[1]) == ARGV[1] then "
    "redis.call('del', KEYS[1], KEYS[3]); redis.call('publish', KEYS[2], '0'); return 1 end "
    "redis.call('del', KEYS[3]) return 0";

enum { S_RAW, S_DLOCK, S_REENTRANT, S_RAWFENCED, S_IDENTITY, S_RAWWHO, S_COUNT };
static const char *const series_name[S_COUNT] = {
    "raw", "dlock", "dlock-reentrant", "raw-fenced", "dlock-identity", "raw-fenced-identity"};

typedef struct pair_state {
    redisContext *rc;
    char sha[48], fa_sha[48], fr_sha[48], wa_sha[48], wr_sha[48];
    dlock_client *client, *who_client;
    dlock_lock *plain, *reentrant, *who;
} pair_state;

/* One pair; returns 0 or -1 (message printed). acq_ns/pair_ns receive times. */
static int raw_pair(pair_state *st, int64_t *acq_ns, int64_t *pair_ns) {
    char token[33];
    bench_fast_hex(token, 16);
    int64_t t0 = bench_now_ns();
    redisReply *r = redisCommand(st->rc, "SET bench:pairs:raw %s NX PX %d", token, LEASE_MS);
    if (!r || r->type != REDIS_REPLY_STATUS) {
        fprintf(stderr, "dlock_bench: raw SET NX failed: %s\n",
                r ? (r->str ? r->str : "not acquired") : st->rc->errstr);
        if (r) freeReplyObject(r);
        return -1;
    }
    freeReplyObject(r);
    int64_t t1 = bench_now_ns();
    r = redisCommand(st->rc, "EVALSHA %s 1 bench:pairs:raw %s", st->sha, token);
    if (!r || r->type != REDIS_REPLY_INTEGER || r->integer != 1) {
        fprintf(stderr, "dlock_bench: raw release failed: %s\n",
                r ? (r->str ? r->str : "not released") : st->rc->errstr);
        if (r) freeReplyObject(r);
        return -1;
    }
    freeReplyObject(r);
    int64_t t2 = bench_now_ns();
    *acq_ns = t1 - t0;
    *pair_ns = t2 - t0;
    return 0;
}

/* who: with the holder record (raw-fenced-identity) */
static int raw_fenced_pair(pair_state *st, int who, int64_t *acq_ns, int64_t *pair_ns) {
    char token[33], key[96], rec[160];
    bench_fast_hex(token, 16);
    /* the record as src/holder.c makes it: host, pid, since, label, command */
    snprintf(key, sizeof key, "dlock_holder:{bench:pairs:fenced}:%s", token);
    snprintf(rec, sizeof rec, "benchhost\t12345\t%lld\tbench\tdlock_bench pairs",
             (long long)(bench_now_ns() / 1000000));
    int64_t t0 = bench_now_ns();
    redisReply *r =
        who ? redisCommand(st->rc, "EVALSHA %s 3 bench:pairs:fenced %s %s %s %d %s", st->wa_sha,
                           "redisson_lock_token:{bench:pairs:fenced}", key, token, LEASE_MS, rec)
            : redisCommand(st->rc, "EVALSHA %s 2 bench:pairs:fenced %s %s %d", st->fa_sha,
                           "redisson_lock_token:{bench:pairs:fenced}", token, LEASE_MS);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[0]->integer != 1) {
        fprintf(stderr, "dlock_bench: raw fenced acquire failed: %s\n",
                r ? (r->str ? r->str : "not acquired") : st->rc->errstr);
        if (r) freeReplyObject(r);
        return -1;
    }
    freeReplyObject(r);
    int64_t t1 = bench_now_ns();
    r = who ? redisCommand(st->rc, "EVALSHA %s 3 bench:pairs:fenced %s %s %s %s", st->wr_sha,
                           "dlock_waiters:{bench:pairs:fenced}", key, token,
                           "redisson_lock__channel:{bench:pairs:fenced}:")
            : redisCommand(st->rc, "EVALSHA %s 2 bench:pairs:fenced %s %s %s", st->fr_sha,
                           "dlock_waiters:{bench:pairs:fenced}", token,
                           "redisson_lock__channel:{bench:pairs:fenced}:");
    if (!r || r->type != REDIS_REPLY_INTEGER || r->integer != 1) {
        fprintf(stderr, "dlock_bench: raw fenced release failed: %s\n",
                r ? (r->str ? r->str : "not released") : st->rc->errstr);
        if (r) freeReplyObject(r);
        return -1;
    }
    freeReplyObject(r);
    int64_t t2 = bench_now_ns();
    *acq_ns = t1 - t0;
    *pair_ns = t2 - t0;
    return 0;
}

static int dlock_pair(dlock_lock *l, int64_t *acq_ns, int64_t *pair_ns) {
    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(l, DLOCK_NOWAIT, LEASE_MS, NULL);
    if (rc) {
        fprintf(stderr, "dlock_bench: dlock_acquire: %s: %s\n", dlock_strerror(rc),
                dlock_lock_errmsg(l));
        return -1;
    }
    int64_t t1 = bench_now_ns();
    rc = dlock_release(l);
    if (rc) {
        fprintf(stderr, "dlock_bench: dlock_release: %s: %s\n", dlock_strerror(rc),
                dlock_lock_errmsg(l));
        return -1;
    }
    int64_t t2 = bench_now_ns();
    *acq_ns = t1 - t0;
    *pair_ns = t2 - t0;
    return 0;
}

static int one_pair(pair_state *st, int s, int64_t *acq_ns, int64_t *pair_ns) {
    switch (s) {
    case S_RAW: return raw_pair(st, acq_ns, pair_ns);
    case S_DLOCK: return dlock_pair(st->plain, acq_ns, pair_ns);
    case S_RAWFENCED: return raw_fenced_pair(st, 0, acq_ns, pair_ns);
    case S_RAWWHO: return raw_fenced_pair(st, 1, acq_ns, pair_ns);
    case S_IDENTITY: return dlock_pair(st->who, acq_ns, pair_ns);
    default: return dlock_pair(st->reentrant, acq_ns, pair_ns);
    }
}

static int setup(bench_ctx *ctx, pair_state *st) {
    st->rc = bench_redis_connect(ctx);
    if (!st->rc) return -1;
    const char *texts[5] = {release_lua, fenced_acquire_lua, fenced_release_lua,
                            fenced_who_acquire_lua, fenced_who_release_lua};
    char *shas[5] = {st->sha, st->fa_sha, st->fr_sha, st->wa_sha, st->wr_sha};
    for (int i = 0; i < 5; i++) {
        const char *argv[] = {"SCRIPT", "LOAD", texts[i]};
        redisReply *r = bench_redis_cmd(st->rc, 3, argv);
        if (!r) return -1;
        snprintf(shas[i], sizeof st->sha, "%s", r->str ? r->str : "");
        freeReplyObject(r);
    }

    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    int rc = dlock_client_new(&o, &st->client);
    if (rc) {
        fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(st->client));
        return -1;
    }
    if (dlock_lock_new(st->client, "bench:pairs:dlock", DLOCK_CSTR, DLOCK_KIND_PLAIN,
                       &st->plain) ||
        dlock_lock_new(st->client, "bench:pairs:reentrant", DLOCK_CSTR, DLOCK_KIND_REENTRANT,
                       &st->reentrant)) {
        fprintf(stderr, "dlock_bench: dlock_lock_new: %s\n", dlock_errmsg(st->client));
        return -1;
    }
    rc = dlock_client_new(&o, &st->who_client);
    if (!rc) rc = dlock_client_set_identity(st->who_client, "dlock_bench pairs", "bench");
    if (!rc)
        rc = dlock_lock_new(st->who_client, "bench:pairs:identity", DLOCK_CSTR, DLOCK_KIND_PLAIN,
                            &st->who);
    if (rc) {
        fprintf(stderr, "dlock_bench: identity client: %s\n", dlock_errmsg(st->who_client));
        return -1;
    }
    return 0;
}

static void teardown(pair_state *st) {
    dlock_lock_free(st->plain);
    dlock_lock_free(st->reentrant);
    dlock_lock_free(st->who);
    dlock_client_free(st->client);
    dlock_client_free(st->who_client);
    if (st->rc) redisFree(st->rc);
}

/* The median of the per-round ratios of series s to series base, as metric
 * name of s (when base runs). */
static void ratio_to(bench_ctx *ctx, double rate[][MAX_ROUNDS], int rounds, int s, int base,
                     const char *name) {
    if (!bench_series_on(ctx, series_name[base])) return;
    double ratio[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) ratio[r] = rate[s][r] / rate[base][r];
    bench_metric("pairs", series_name[s], name, bench_median_d(ratio, (size_t)rounds), "x");
}

int bench_pairs(bench_ctx *ctx) {
    const int rounds = ctx->quick ? 4 : MAX_ROUNDS;
    const int64_t round_ns = ctx->quick ? 150000000LL : 500000000LL;
    pair_state st;
    memset(&st, 0, sizeof st);
    bench_samples acq[S_COUNT], pair[S_COUNT];
    memset(acq, 0, sizeof acq);
    memset(pair, 0, sizeof pair);
    double rate[S_COUNT][MAX_ROUNDS], ratio[MAX_ROUNDS];
    int failed = setup(ctx, &st);

    printf("\n== pairs: uncontended acquire+release on one connection (%d rounds x %.2f s "
           "per series, balanced order)\n",
           rounds, (double)round_ns / 1e9);
    for (int round = 0; !failed && round < rounds; round++) {
        for (int k = 0; !failed && k < S_COUNT; k++) {
            int s = bench_order(round, k, S_COUNT);
            if (!bench_series_on(ctx, series_name[s])) continue;
            int64_t a, p;
            for (int i = 0; !failed && i < WARMUP_PAIRS; i++) failed = one_pair(&st, s, &a, &p);
            long n = 0;
            int64_t start = bench_now_ns(), end = start + round_ns, now = start;
            while (!failed && now < end) {
                failed = one_pair(&st, s, &a, &p);
                if (failed) break;
                if (bench_samples_add(&acq[s], a) || bench_samples_add(&pair[s], p)) {
                    fprintf(stderr, "dlock_bench: out of memory\n");
                    failed = -1;
                }
                n++;
                now = bench_now_ns();
            }
            rate[s][round] = (double)n * 1e9 / (double)(now - start);
            if (ctx->verbose && !failed)
                printf("   round %d %-20s %8.0f pairs/s\n", round + 1, series_name[s],
                       rate[s][round]);
        }
    }
    if (!failed) {
        printf("   %-20s %12s %10s %10s %10s %10s\n", "series", "pairs/s", "pair p50",
               "pair p99", "acq p50", "ratio");
        int have_raw = bench_series_on(ctx, series_name[S_RAW]);
        for (int s = 0; s < S_COUNT; s++) {
            if (!bench_series_on(ctx, series_name[s])) continue;
            double med = bench_median_d(rate[s], (size_t)rounds);
            double p50 = (double)bench_samples_quantile(&pair[s], 0.50) / 1e3;
            double p99 = (double)bench_samples_quantile(&pair[s], 0.99) / 1e3;
            double a50 = (double)bench_samples_quantile(&acq[s], 0.50) / 1e3;
            double lo = rate[s][0], hi = rate[s][0];
            for (int r = 1; r < rounds; r++) {
                if (rate[s][r] < lo) lo = rate[s][r];
                if (rate[s][r] > hi) hi = rate[s][r];
            }
            bench_metric("pairs", series_name[s], "pairs_per_s", med, "1/s");
            bench_metric("pairs", series_name[s], "pairs_per_s_min", lo, "1/s");
            bench_metric("pairs", series_name[s], "pairs_per_s_max", hi, "1/s");
            bench_metric("pairs", series_name[s], "pair_p50_us", p50, "us");
            bench_metric("pairs", series_name[s], "pair_p99_us", p99, "us");
            bench_metric("pairs", series_name[s], "acquire_p50_us", a50, "us");
            bench_metric("pairs", series_name[s], "samples", (double)pair[s].n, "");
            char rtext[32] = "-";
            if (s != S_RAW && have_raw) {
                for (int r = 0; r < rounds; r++) ratio[r] = rate[s][r] / rate[S_RAW][r];
                double rm = bench_median_d(ratio, (size_t)rounds);
                snprintf(rtext, sizeof rtext, "%.2fx", rm);
                bench_metric("pairs", series_name[s], "ratio_to_raw", rm, "x");
            }
            /* the client library's own overhead: same protocol, same server work */
            if (s == S_DLOCK) ratio_to(ctx, rate, rounds, s, S_RAWFENCED, "ratio_to_raw_fenced");
            /* what recording the holder's identity costs, and against its floor */
            if (s == S_IDENTITY) ratio_to(ctx, rate, rounds, s, S_DLOCK, "ratio_to_dlock");
            if (s == S_IDENTITY)
                ratio_to(ctx, rate, rounds, s, S_RAWWHO, "ratio_to_raw_fenced_identity");
            /* the floor: one more key per hold on the server, no library */
            if (s == S_RAWWHO) ratio_to(ctx, rate, rounds, s, S_RAWFENCED, "ratio_to_raw_fenced");
            char rb[32];
            bench_fmt_num(rb, sizeof rb, med);
            printf("   %-20s %12s %7.1f us %7.1f us %7.1f us %10s\n", series_name[s], rb, p50,
                   p99, a50, rtext);
        }
    }
    double lib;
    if (!failed && !bench_metric_get("pairs", "dlock", "ratio_to_raw_fenced", &lib))
        printf("   dlock / raw-fenced (client library overhead alone): %.2fx\n", lib);
    if (!failed && !bench_metric_get("pairs", "dlock-identity", "ratio_to_dlock", &lib))
        printf("   dlock-identity / dlock (the holder identity record): %.2fx\n", lib);
    if (!failed && !bench_metric_get("pairs", "raw-fenced-identity", "ratio_to_raw_fenced", &lib))
        printf("   raw-fenced-identity / raw-fenced (the record's floor: one key more per hold, "
               "no library): %.2fx\n", lib);
    if (!failed &&
        !bench_metric_get("pairs", "dlock-identity", "ratio_to_raw_fenced_identity", &lib))
        printf("   dlock-identity / raw-fenced-identity (library overhead, record on): %.2fx\n",
               lib);
    for (int s = 0; s < S_COUNT; s++) {
        bench_samples_free(&acq[s]);
        bench_samples_free(&pair[s]);
    }
    teardown(&st);
    return failed ? -1 : 0;
}
