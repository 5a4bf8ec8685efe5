/* Scenario "idworker" (issue 6): ids per second from one ID worker, one INCR
 * per id against batched INCRBY, in one process on the benchmark's server.
 *
 *   single      batch 1: one round trip per id (the base of the ratios)
 *   batch-10, batch-100, batch-1000   ids reserved per INCRBY
 *
 * Alternating rounds (rounds.c); every id is checked to be above the last one
 * of its worker. (bench/bench_idworker is the stand-alone tool with several
 * processes; this scenario puts the figure beside the others.)
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "dlock.h"

enum { S_1, S_10, S_100, S_1000, S_COUNT };
static const char *const series_name[S_COUNT] = {"single", "batch-10", "batch-100",
                                                 "batch-1000"};
static const int64_t series_batch[S_COUNT] = {1, 10, 100, 1000};

typedef struct idw_state {
    dlock_client *c;
    dlock_idworker *w[S_COUNT];
    uint64_t last[S_COUNT];
} idw_state;

static int idw_op(void *state, int s, int64_t *ns) {
    idw_state *st = state;
    uint64_t id;
    int64_t t0 = bench_now_ns();
    int rc = dlock_idworker_next(st->w[s], &id);
    *ns = bench_now_ns() - t0;
    if (rc) {
        fprintf(stderr, "dlock_bench: idworker %s: %s: %s\n", series_name[s], dlock_strerror(rc),
                dlock_idworker_errmsg(st->w[s]));
        return -1;
    }
    if (id <= st->last[s]) {
        fprintf(stderr, "dlock_bench: idworker %s: id %" PRIu64 " not above %" PRIu64 "\n",
                series_name[s], id, st->last[s]);
        return -1;
    }
    st->last[s] = id;
    return 0;
}

int bench_idworker(bench_ctx *ctx) {
    idw_state st;
    memset(&st, 0, sizeof st);
    int failed = 0;
    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    if (dlock_client_new(&o, &st.c)) {
        fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(st.c));
        failed = 1;
    }
    for (int s = 0; !failed && s < S_COUNT; s++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "bench:%ld:%s", (long)getpid(), series_name[s]);
        dlock_idworker_options io = {.batch = series_batch[s]};
        if (dlock_idworker_new(st.c, prefix, &io, &st.w[s])) {
            fprintf(stderr, "dlock_bench: dlock_idworker_new: %s\n", dlock_errmsg(st.c));
            failed = 1;
        }
    }
    bench_rounds_spec sp = {
        .scenario = "idworker",
        .nseries = S_COUNT,
        .series = series_name,
        .base = S_1,
        .rate_name = "ids_per_s",
        .rounds = ctx->quick ? 4 : 20,
        .warmup = 10,
        .round_ns = ctx->quick ? 100000000LL : 250000000LL,
        .op = idw_op,
        .state = &st,
    };
    if (!failed) {
        printf("\n== idworker: ids per second, one INCR per id vs batched INCRBY "
               "(%d rounds x %.2f s per series, balanced order)\n",
               sp.rounds, (double)sp.round_ns / 1e9);
        failed = bench_rounds_run(ctx, &sp);
    }
    for (int s = 0; s < S_COUNT; s++) dlock_idworker_free(st.w[s]);
    dlock_client_free(st.c);
    return failed ? -1 : 0;
}
