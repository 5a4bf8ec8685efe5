/* Scenario "cluster" (issue 5): acquire+release pairs of plain locks on a
 * 3-master Redis Cluster, beside the single-node figure in the same run.
 *
 *   single   redis://host:port, the benchmark's own server
 *   cluster  redis-cluster://host:P1,host:P2,host:P3, lock names spread over
 *            every master (64 names, taken in turn), so the figure includes
 *            slot routing to all of them
 *
 * The 3 masters come from --cluster-ports (bench/run.sh starts them and
 * creates the cluster); without it the scenario is skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "dlock.h"

#define LEASE_MS 10000
#define NAMES 64

enum { S_SINGLE, S_CLUSTER, S_COUNT };
static const char *const series_name[S_COUNT] = {"single", "cluster"};

typedef struct cl_state {
    dlock_client *c[S_COUNT];
    dlock_lock *l[S_COUNT][NAMES];
    int next[S_COUNT];
} cl_state;

static int cl_op(void *state, int s, int64_t *ns) {
    cl_state *st = state;
    dlock_lock *l = st->l[s][st->next[s]++ % NAMES];
    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(l, DLOCK_NOWAIT, LEASE_MS, NULL);
    if (!rc) rc = dlock_release(l);
    *ns = bench_now_ns() - t0;
    if (rc)
        fprintf(stderr, "dlock_bench: %s pair: %s: %s\n", series_name[s], dlock_strerror(rc),
                dlock_lock_errmsg(l));
    return rc ? -1 : 0;
}

int bench_cluster(bench_ctx *ctx) {
    if (!ctx->cluster_ports) {
        printf("\n== cluster: SKIP (no --cluster-ports; bench/run.sh starts a 3-master "
               "cluster)\n");
        return 0;
    }
    char url[512];
    cl_state st;
    memset(&st, 0, sizeof st);
    int failed = 0;
    for (int s = 0; !failed && s < S_COUNT; s++) {
        if (s == S_SINGLE) {
            snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
        } else {
            size_t len = (size_t)snprintf(url, sizeof url, "redis-cluster://");
            for (const char *p = ctx->cluster_ports; *p;) {
                size_t n = strcspn(p, ",");
                len += (size_t)snprintf(url + len, sizeof url - len, "%s%s:%.*s",
                                        p == ctx->cluster_ports ? "" : ",", ctx->host, (int)n,
                                        p);
                p += n;
                if (*p == ',') p++;
            }
        }
        dlock_options o;
        dlock_options_init(&o);
        o.url = url;
        if (dlock_client_new(&o, &st.c[s])) {
            fprintf(stderr, "dlock_bench: dlock_client_new(%s): %s\n", url,
                    dlock_errmsg(st.c[s]));
            failed = 1;
            break;
        }
        for (int i = 0; !failed && i < NAMES; i++) {
            char name[32];
            snprintf(name, sizeof name, "bench:cluster:%d", i);
            if (dlock_lock_new(st.c[s], name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &st.l[s][i]))
                failed = 1;
        }
    }
    bench_rounds_spec sp = {
        .scenario = "cluster",
        .nseries = S_COUNT,
        .series = series_name,
        .base = S_SINGLE,
        .rate_name = "pairs_per_s",
        .rounds = ctx->quick ? 4 : 20,
        .warmup = 100,
        .round_ns = ctx->quick ? 100000000LL : 300000000LL,
        .op = cl_op,
        .state = &st,
    };
    if (!failed) {
        printf("\n== cluster: acquire+release on a 3-master cluster vs one node "
               "(%d rounds x %.2f s per series, balanced order)\n",
               sp.rounds, (double)sp.round_ns / 1e9);
        failed = bench_rounds_run(ctx, &sp);
    }
    for (int s = 0; s < S_COUNT; s++) {
        for (int i = 0; i < NAMES; i++) dlock_lock_free(st.l[s][i]);
        dlock_client_free(st.c[s]);
    }
    return failed ? -1 : 0;
}
