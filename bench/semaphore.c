/* Scenario "semaphore" (issue 4): semaphore acquire+release pairs per second
 * in one process on one connection, beside plain-lock pairs in the same run.
 *
 *   semaphore  dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT) +
 *              dlock_semaphore_release(s, 1), on a semaphore of 1 permit
 *              (Redisson RSemaphore layout; the release publishes the count)
 *   dlock      dlock_acquire(DLOCK_NOWAIT, 10 s lease) + dlock_release on a
 *              plain lock: the base of the ratio
 *
 * Alternating rounds (rounds.c). No target: the figure is recorded.
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "dlock.h"

#define LEASE_MS 10000
#define SEM_NAME "bench:semaphore"

enum { S_SEM, S_PLAIN, S_COUNT };
static const char *const series_name[S_COUNT] = {"semaphore", "dlock"};

typedef struct sem_state {
    dlock_client *c;
    dlock_semaphore *sem;
    dlock_lock *plain;
} sem_state;

static int sem_op(void *state, int s, int64_t *ns) {
    sem_state *st = state;
    int64_t t0 = bench_now_ns();
    int rc;
    const char *msg;
    if (s == S_SEM) {
        rc = dlock_semaphore_acquire(st->sem, 1, DLOCK_NOWAIT);
        if (!rc) rc = dlock_semaphore_release(st->sem, 1);
        msg = dlock_semaphore_errmsg(st->sem);
    } else {
        rc = dlock_acquire(st->plain, DLOCK_NOWAIT, LEASE_MS, NULL);
        if (!rc) rc = dlock_release(st->plain);
        msg = dlock_lock_errmsg(st->plain);
    }
    *ns = bench_now_ns() - t0;
    if (rc) fprintf(stderr, "dlock_bench: %s pair: %s: %s\n", series_name[s], dlock_strerror(rc), msg);
    return rc ? -1 : 0;
}

int bench_semaphore(bench_ctx *ctx) {
    sem_state st;
    memset(&st, 0, sizeof st);
    int failed = 0;
    redisContext *rc = bench_redis_connect(ctx);
    if (!rc) return -1;
    redisReply *r = redisCommand(rc, "DEL %s", SEM_NAME);
    if (r) freeReplyObject(r);
    redisFree(rc);

    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    int set = 0;
    if (dlock_client_new(&o, &st.c)) {
        fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(st.c));
        failed = 1;
    } else if (dlock_semaphore_new(st.c, SEM_NAME, DLOCK_CSTR, &st.sem) ||
               dlock_semaphore_try_set(st.sem, 1, &set) || !set ||
               dlock_lock_new(st.c, "bench:semaphore:plain", DLOCK_CSTR, DLOCK_KIND_PLAIN,
                              &st.plain)) {
        fprintf(stderr, "dlock_bench: semaphore setup: %s\n",
                st.sem ? dlock_semaphore_errmsg(st.sem) : dlock_errmsg(st.c));
        failed = 1;
    }
    bench_rounds_spec sp = {
        .scenario = "semaphore",
        .nseries = S_COUNT,
        .series = series_name,
        .base = S_PLAIN,
        .rate_name = "pairs_per_s",
        .rounds = ctx->quick ? 4 : 20,
        .warmup = 50,
        .round_ns = ctx->quick ? 100000000LL : 300000000LL,
        .op = sem_op,
        .state = &st,
    };
    if (!failed) {
        printf("\n== semaphore: acquire+release of 1 permit vs plain-lock pairs, one connection "
               "(%d rounds x %.2f s per series, balanced order)\n",
               sp.rounds, (double)sp.round_ns / 1e9);
        failed = bench_rounds_run(ctx, &sp);
    }
    dlock_lock_free(st.plain);
    dlock_semaphore_free(st.sem);
    dlock_client_free(st.c);
    return failed ? -1 : 0;
}
