/* Scenario "redlock" (issue 5): acquire+release latency of a plain lock over
 * N independent masters (RedLock), beside the single-node figure in the same
 * run.
 *
 *   single     redis://host:port, the benchmark's own server
 *   redlock-1  redlock:// with one node (the RedLock code path, no fan-out)
 *   redlock-3  redlock://host:P1,host:P2,host:P3
 *   redlock-5  redlock://host:P1,...,host:P5   target: p50 within 1.5x single
 *   raw-1      hiredis: SET NX PX, then the compare-and-delete script by
 *              EVALSHA, on the first of the 5 servers
 *   raw-5      the same on all 5 at once: each command written to the 5
 *              connections before any reply is read (a parallel fan-out with
 *              no library at all). raw-5 / raw-1 is what contacting 5 servers
 *              costs on this machine, the floor for redlock-5 / single.
 *
 * The 5 further servers come from --redlock-ports (bench/run.sh starts them
 * and stops them); without it the scenario is skipped. Each pair is
 * dlock_acquire(DLOCK_NOWAIT, 10 s lease) + dlock_release, alternating rounds
 * (rounds.c); the latency is the whole pair.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "dlock.h"

#define LEASE_MS 10000
#define NODES 5

enum { S_SINGLE, S_RL1, S_RL3, S_RL5, S_RAW1, S_RAW5, S_COUNT };
static const char *const series_name[S_COUNT] = {"single", "redlock-1", "redlock-3",
                                                 "redlock-5", "raw-1", "raw-5"};
static const int series_nodes[S_COUNT] = {0, 1, 3, 5, 1, 5};

static const char release_lua[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end";

typedef struct rl_state {
    dlock_client *c[S_COUNT];
    dlock_lock *l[S_COUNT];
    redisContext *rc[NODES];
    char sha[48];
} rl_state;

/* One command on the first n raw connections: all written, then all read.
 * want: the reply type every node must give. */
static int raw_fanout(rl_state *st, int n, const char *fmt, const char *arg, int want) {
    for (int i = 0; i < n; i++) {
        if (redisAppendCommand(st->rc[i], fmt, arg) != REDIS_OK) return -1;
        int done = 0;
        while (!done)
            if (redisBufferWrite(st->rc[i], &done) != REDIS_OK) return -1;
    }
    int ok = 1;
    for (int i = 0; i < n; i++) {
        void *r = NULL;
        if (redisGetReply(st->rc[i], &r) != REDIS_OK) return -1;
        if (((redisReply *)r)->type != want) ok = 0;
        freeReplyObject(r);
    }
    return ok ? 0 : -1;
}

static int raw_pair(rl_state *st, int n) {
    char token[33], fmt[96];
    bench_fast_hex(token, 16);
    snprintf(fmt, sizeof fmt, "EVALSHA %s 1 bench:redlock:raw %%s", st->sha);
    if (raw_fanout(st, n, "SET bench:redlock:raw %s NX PX 10000", token, REDIS_REPLY_STATUS) ||
        raw_fanout(st, n, fmt, token, REDIS_REPLY_INTEGER)) {
        fprintf(stderr, "dlock_bench: raw-%d pair failed\n", n);
        return -1;
    }
    return 0;
}

static int rl_op(void *state, int s, int64_t *ns) {
    rl_state *st = state;
    int64_t t0 = bench_now_ns();
    if (s >= S_RAW1) {
        int rc = raw_pair(st, series_nodes[s]);
        *ns = bench_now_ns() - t0;
        return rc;
    }
    int rc = dlock_acquire(st->l[s], DLOCK_NOWAIT, LEASE_MS, NULL);
    if (!rc) rc = dlock_release(st->l[s]);
    *ns = bench_now_ns() - t0;
    if (rc)
        fprintf(stderr, "dlock_bench: %s pair: %s: %s\n", series_name[s], dlock_strerror(rc),
                dlock_lock_errmsg(st->l[s]));
    return rc ? -1 : 0;
}

int bench_redlock(bench_ctx *ctx) {
    if (!ctx->redlock_ports) {
        printf("\n== redlock: SKIP (no --redlock-ports; bench/run.sh starts 5 servers)\n");
        return 0;
    }
    int ports[NODES], n = 0;
    for (const char *p = ctx->redlock_ports; *p && n < NODES;) {
        ports[n++] = atoi(p);
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
    if (n < NODES) {
        fprintf(stderr, "dlock_bench: --redlock-ports needs %d ports\n", NODES);
        return -1;
    }
    rl_state st;
    memset(&st, 0, sizeof st);
    int failed = 0;
    for (int i = 0; !failed && i < NODES; i++) {
        bench_ctx node = *ctx;
        node.port = ports[i];
        st.rc[i] = bench_redis_connect(&node);
        if (!st.rc[i]) failed = 1;
        const char *argv[] = {"SCRIPT", "LOAD", release_lua};
        redisReply *r = failed ? NULL : bench_redis_cmd(st.rc[i], 3, argv);
        if (!r) failed = 1;
        else snprintf(st.sha, sizeof st.sha, "%s", r->str ? r->str : "");
        if (r) freeReplyObject(r);
    }
    for (int s = 0; !failed && s < S_COUNT && s < S_RAW1; s++) {
        char url[512];
        if (series_nodes[s] == 0) {
            snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
        } else {
            size_t len = (size_t)snprintf(url, sizeof url, "redlock://");
            for (int i = 0; i < series_nodes[s]; i++)
                len += (size_t)snprintf(url + len, sizeof url - len, "%s%s:%d", i ? "," : "",
                                        ctx->host, ports[i]);
        }
        dlock_options o;
        dlock_options_init(&o);
        o.url = url;
        if (dlock_client_new(&o, &st.c[s])) {
            fprintf(stderr, "dlock_bench: dlock_client_new(%s): %s\n", url,
                    dlock_errmsg(st.c[s]));
            failed = 1;
        } else if (dlock_lock_new(st.c[s], "bench:redlock", DLOCK_CSTR, DLOCK_KIND_PLAIN,
                                  &st.l[s])) {
            failed = 1;
        }
    }
    bench_rounds_spec sp = {
        .scenario = "redlock",
        .nseries = S_COUNT,
        .series = series_name,
        .base = S_SINGLE,
        .rate_name = "pairs_per_s",
        .rounds = ctx->quick ? 4 : 20,
        .warmup = 50,
        .round_ns = ctx->quick ? 100000000LL : 300000000LL,
        .op = rl_op,
        .state = &st,
    };
    if (!failed) {
        printf("\n== redlock: acquire+release over N independent masters vs one node "
               "(%d rounds x %.2f s per series, balanced order)\n",
               sp.rounds, (double)sp.round_ns / 1e9);
        failed = bench_rounds_run(ctx, &sp);
    }
    double r5, r1, d5, d1;
    if (!failed && !bench_metric_get("redlock", "raw-5", "p50_us", &r5) &&
        !bench_metric_get("redlock", "raw-1", "p50_us", &r1) &&
        !bench_metric_get("redlock", "redlock-5", "p50_us", &d5) &&
        !bench_metric_get("redlock", "single", "p50_us", &d1) && r1 > 0 && d1 > 0) {
        bench_metric("redlock", "raw-5", "p50_ratio_to_raw-1", r5 / r1, "x");
        printf("   p50 5 nodes / 1 node: dlock %.2fx, raw hiredis fan-out %.2fx (the machine's "
               "floor)\n",
               d5 / d1, r5 / r1);
    }
    for (int s = 0; s < S_COUNT; s++) {
        dlock_lock_free(st.l[s]);
        dlock_client_free(st.c[s]);
    }
    for (int i = 0; i < NODES; i++)
        if (st.rc[i]) redisFree(st.rc[i]);
    return failed ? -1 : 0;
}
