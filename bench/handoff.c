/* Scenarios "handoff" and "fair_handoff": from just before process A's
 * releasing call to just after process B, already blocked waiting, holds the
 * lock. "handoff" runs raw, dlock and dlock-reentrant; "fair_handoff" (issue
 * 4) runs raw, dlock and dlock-fair, by the same code.
 *
 *   raw              notify-then-SET with hiredis: B SUBSCRIBEs on one
 *                    connection, tries SET NX PX on another (fails: A holds),
 *                    blocks reading the subscription; A's release script
 *                    deletes the key and PUBLISHes; B on the message sends
 *                    SET NX PX and records the time once it succeeds.
 *   dlock            B blocks in dlock_acquire(wait) on a plain lock; A calls
 *                    dlock_release.
 *   dlock-reentrant  the same on a reentrant lock; no target.
 *   dlock-fair       the same on a fair lock (DLOCK_KIND_FAIR), whose release
 *                    script makes the queue head the owner and publishes
 *                    "granted:<fence>" on the head's own channel: B holds on
 *                    receipt, with no further round trip. Target: below raw.
 *   raw-notify       (fair_handoff only) the floor of any handoff: as raw, but
 *                    B records the time when the release's message arrives,
 *                    without taking anything. No lock can be handed over
 *                    faster than this; no target.
 *
 * A is this process; each series has its own waiter B, a child forked per
 * block. Both read CLOCK_MONOTONIC (one clock for every process on the
 * machine); B sends its timestamp back through a pipe. Before each release A
 * waits until the server shows B waiting (raw: PUBSUB NUMSUB of its channel;
 * dlock: B registered (plain) or queued (fair) and subscribed to its own
 * channel, bench_lock_waiters), then a further
 * settle time so that B is asleep in its wait, not still finishing its
 * subscribe-then-retry step. Within a block the handoffs go round-robin over
 * the series in a balanced order (bench_order), so noise hits all alike; the
 * first of a block are warm-up.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "dlock.h"

#define LEASE_MS 30000
#define WAIT_MS 20000
#define WARMUP 3
#define SETTLE_US 2000
#define PIPE_TIMEOUT_MS 20000

static const char release_pub_lua[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]); "
    "redis.call('publish', KEYS[2], '0'); return 1 end return 0";

enum { S_RAW, S_DLOCK, S_REENTRANT, S_FAIR, S_NOTIFY, S_COUNT };
static const char *const series_name[S_COUNT] = {"raw", "dlock", "dlock-reentrant",
                                                 "dlock-fair", "raw-notify"};
static const char *const lock_name[S_COUNT] = {"bench:handoff:raw", "bench:handoff:dlock",
                                               "bench:handoff:reentrant", "bench:handoff:fair",
                                               "bench:handoff:notify"};
static const dlock_kind lock_kind[S_COUNT] = {DLOCK_KIND_PLAIN, DLOCK_KIND_PLAIN,
                                              DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR,
                                              DLOCK_KIND_PLAIN};
/* The series A drives with hiredis (raw commands, no dlock handle). */
#define RAW_SERIES(s) ((s) == S_RAW || (s) == S_NOTIFY)

/* The lock's unlock channel: the raw waiter's; plain and fair waiters sleep
 * on a channel of their own, "redisson_lock__channel:{name}:<id>". */
static void channel_of(int s, char *buf, size_t len) {
    snprintf(buf, len, "redisson_lock__channel:{%s}", lock_name[s]);
}

/* ---- B: the waiter (child process) ---- */

static int make_client(const bench_ctx *ctx, dlock_client **out) {
    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    int rc = dlock_client_new(&o, out);
    if (rc) fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(*out));
    return rc ? -1 : 0;
}

/* Raw waiter: one handoff. Returns the time it held the lock, or -1. */
static int64_t raw_wait_once(redisContext *sub, redisContext *cmd, const char *key,
                             const char *chan, int notify_only) {
    char token[33];
    bench_fast_hex(token, 16);
    redisReply *r = redisCommand(sub, "SUBSCRIBE %s", chan);
    if (!r) return -1;
    freeReplyObject(r);
    int64_t held = -1;
    for (int tries = 0; held < 0 && tries < 1000; tries++) {
        if (tries > 0 || notify_only) { /* wait for the unlock message */
            void *msg = NULL;
            if (redisGetReply(sub, &msg) != REDIS_OK) return -1;
            freeReplyObject(msg);
            if (notify_only) {
                held = bench_now_ns();
                break;
            }
        }
        r = redisCommand(cmd, "SET %s %s NX PX %d", key, token, LEASE_MS);
        if (!r) return -1;
        if (r->type == REDIS_REPLY_STATUS) held = bench_now_ns();
        freeReplyObject(r);
    }
    /* outside the measured window: leave the channel, free the lock */
    r = redisCommand(sub, "UNSUBSCRIBE %s", chan);
    if (!r) return -1;
    freeReplyObject(r);
    if (!notify_only) {
        r = redisCommand(cmd, "DEL %s", key);
        if (!r) return -1;
        freeReplyObject(r);
    }
    return held;
}

static int waiter_main(const bench_ctx *ctx, int s, int cmd_fd, int res_fd) {
    redisContext *sub = NULL, *cmd = NULL;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    int failed = 0;
    char chan[128];
    channel_of(s, chan, sizeof chan);
    if (RAW_SERIES(s)) {
        sub = bench_redis_connect(ctx);
        cmd = bench_redis_connect(ctx);
        failed = !sub || !cmd;
    } else {
        failed = make_client(ctx, &c) ||
                 dlock_lock_new(c, lock_name[s], DLOCK_CSTR, lock_kind[s], &l);
    }
    for (;;) {
        char op;
        if (bench_read_full(cmd_fd, &op, 1, PIPE_TIMEOUT_MS) || op != 'g') break;
        int64_t held = -1;
        if (!failed && RAW_SERIES(s)) {
            held = raw_wait_once(sub, cmd, lock_name[s], chan, s == S_NOTIFY);
            if (held < 0)
                fprintf(stderr, "dlock_bench: raw waiter: %s\n",
                        sub->err ? sub->errstr : cmd->err ? cmd->errstr : "never acquired");
        } else if (!failed) {
            int rc = dlock_acquire(l, WAIT_MS, LEASE_MS, NULL);
            if (rc == DLOCK_OK) {
                held = bench_now_ns();
                rc = dlock_release(l);
                if (rc) held = -1;
            }
            if (rc)
                fprintf(stderr, "dlock_bench: waiter: %s: %s\n", dlock_strerror(rc),
                        dlock_lock_errmsg(l));
        }
        if (held < 0) failed = 1;
        if (bench_write_full(res_fd, &held, sizeof held)) break;
    }
    dlock_lock_free(l);
    dlock_client_free(c);
    if (sub) redisFree(sub);
    if (cmd) redisFree(cmd);
    return failed;
}

/* ---- A: the holder (this process) ---- */

typedef struct holder {
    redisContext *ctl;      /* NUMSUB, and the raw series' commands */
    char sha[48];
    dlock_client *client;
    dlock_lock *locks[S_COUNT];
    unsigned mask;          /* the series this scenario runs (1 << S_...) */
} holder;

/* Waits until B is subscribed to chan (raw), or waiting on lock s (dlock:
 * registered or queued, and subscribed). */
static int await_subscriber(holder *h, int s, const char *chan) {
    int64_t give_up = bench_now_ns() + (int64_t)PIPE_TIMEOUT_MS * 1000000;
    while (bench_now_ns() < give_up) {
        long long n = -1;
        if (RAW_SERIES(s)) {
            redisReply *r = redisCommand(h->ctl, "PUBSUB NUMSUB %s", chan);
            if (!r) return -1;
            if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                r->element[1]->type == REDIS_REPLY_INTEGER)
                n = r->element[1]->integer;
            freeReplyObject(r);
        } else if ((n = bench_lock_waiters(h->ctl, lock_name[s])) < 0) {
            return -1;
        }
        if (n >= 1) return 0;
        bench_sleep_us(50);
    }
    fprintf(stderr, "dlock_bench: the waiter never subscribed to %s\n", chan);
    return -1;
}

/* A waiter process B of one series. */
typedef struct waiter {
    pid_t pid;
    int wfd, rfd;           /* commands to B, timestamps from B */
} waiter;

static int start_waiter(const bench_ctx *ctx, int s, waiter *w) {
    int fds[2];
    pid_t pid;
    w->pid = -1;
    w->wfd = w->rfd = -1;
    if (bench_fork_piped(&pid, fds)) return -1;
    if (pid == 0) _exit(waiter_main(ctx, s, fds[0], fds[1]));
    w->pid = pid;
    w->wfd = fds[0];
    w->rfd = fds[1];
    return 0;
}

/* Tells B to quit and reaps it; -1 if it failed. */
static int stop_waiter(waiter *w, int kill_it) {
    if (w->pid < 0) return 0;
    bench_write_full(w->wfd, "q", 1);
    close(w->wfd);
    close(w->rfd);
    int status = 0;
    if (kill_it) kill(w->pid, SIGTERM);
    while (waitpid(w->pid, &status, 0) < 0 && errno == EINTR) {
    }
    w->pid = -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* One handoff of series s from this process to waiter w: *ns the latency. */
static int one_handoff(holder *h, waiter *w, int s, int64_t *ns) {
    char chan[128], token[33];
    channel_of(s, chan, sizeof chan);
    /* A takes the lock (B released it before answering last time) */
    if (RAW_SERIES(s)) {
        bench_fast_hex(token, 16);
        redisReply *r = redisCommand(h->ctl, "SET %s %s NX PX %d", lock_name[s], token, LEASE_MS);
        int ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
        if (!ok) {
            fprintf(stderr, "dlock_bench: holder could not take %s\n", lock_name[s]);
            return -1;
        }
    } else if (dlock_acquire(h->locks[s], DLOCK_NOWAIT, LEASE_MS, NULL) != DLOCK_OK) {
        fprintf(stderr, "dlock_bench: holder acquire: %s\n", dlock_lock_errmsg(h->locks[s]));
        return -1;
    }
    /* B starts waiting; A waits until B sleeps on the channel */
    if (bench_write_full(w->wfd, "g", 1) || await_subscriber(h, s, chan)) return -1;
    bench_sleep_us(SETTLE_US);
    int64_t t0 = bench_now_ns();
    if (RAW_SERIES(s)) {
        redisReply *r =
            redisCommand(h->ctl, "EVALSHA %s 2 %s %s %s", h->sha, lock_name[s], chan, token);
        int ok = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        if (r) freeReplyObject(r);
        if (!ok) {
            fprintf(stderr, "dlock_bench: holder release of %s failed\n", lock_name[s]);
            return -1;
        }
    } else if (dlock_release(h->locks[s]) != DLOCK_OK) {
        fprintf(stderr, "dlock_bench: holder release: %s\n", dlock_lock_errmsg(h->locks[s]));
        return -1;
    }
    int64_t t1 = -1;
    if (bench_read_full(w->rfd, &t1, sizeof t1, PIPE_TIMEOUT_MS) || t1 < 0) {
        fprintf(stderr, "dlock_bench: the waiter of %s failed or timed out\n", lock_name[s]);
        return -1;
    }
    *ns = t1 - t0;
    return 0;
}

/* One block: a fresh waiter per series, handoffs round-robin over the series
 * in bench_order, so that noise (and what the handoff before left behind)
 * hits all alike. */
static int run_block(const bench_ctx *ctx, holder *h, int n, bench_samples *out) {
    waiter w[S_COUNT];
    int failed = 0;
    for (int s = 0; s < S_COUNT; s++) w[s].pid = -1;
    for (int s = 0; !failed && s < S_COUNT; s++)
        if ((h->mask & 1u << s) && bench_series_on(ctx, series_name[s]))
            failed = start_waiter(ctx, s, &w[s]);
    for (int i = 0; !failed && i < n + WARMUP; i++) {
        for (int k = 0; !failed && k < S_COUNT; k++) {
            int s = bench_order(i, k, S_COUNT);
            if (w[s].pid < 0) continue;
            int64_t ns = 0;
            failed = one_handoff(h, &w[s], s, &ns);
            if (!failed && i >= WARMUP) failed = bench_samples_add(&out[s], ns);
        }
    }
    for (int s = 0; s < S_COUNT; s++) {
        if (stop_waiter(&w[s], failed) && !failed) {
            fprintf(stderr, "dlock_bench: waiter process of %s failed\n", lock_name[s]);
            failed = -1;
        }
        /* a failed block may leave the lock held: free it for the next one */
        if (failed && RAW_SERIES(s)) {
            redisReply *r = redisCommand(h->ctl, "DEL %s", lock_name[s]);
            if (r) freeReplyObject(r);
        } else if (failed && h->locks[s] && dlock_lock_holding(h->locks[s])) {
            dlock_release(h->locks[s]);
        }
    }
    return failed ? -1 : 0;
}

/* Runs the series in mask as scenario `scenario`. */
static int handoff_run(bench_ctx *ctx, const char *scenario, unsigned mask) {
    const int blocks = ctx->quick ? 2 : 5;
    const int per_block = ctx->quick ? 40 : 200;
    holder h;
    memset(&h, 0, sizeof h);
    h.mask = mask;
    bench_samples samples[S_COUNT];
    memset(samples, 0, sizeof samples);
    int failed = 0;

    h.ctl = bench_redis_connect(ctx);
    if (!h.ctl) failed = 1;
    if (!failed) {
        const char *argv[] = {"SCRIPT", "LOAD", release_pub_lua};
        redisReply *r = bench_redis_cmd(h.ctl, 3, argv);
        if (!r) failed = 1;
        else snprintf(h.sha, sizeof h.sha, "%s", r->str ? r->str : "");
        if (r) freeReplyObject(r);
    }
    if (!failed) failed = make_client(ctx, &h.client);
    for (int s = S_DLOCK; !failed && s < S_COUNT; s++)
        if ((mask & 1u << s) && !RAW_SERIES(s))
            failed = dlock_lock_new(h.client, lock_name[s], DLOCK_CSTR, lock_kind[s],
                                    &h.locks[s]) != DLOCK_OK;

    printf("\n== %s: A releases, B (another process, already blocked) holds "
           "(%d blocks x %d per series, round-robin)\n",
           scenario, blocks, per_block);
    for (int b = 0; !failed && b < blocks; b++) failed = run_block(ctx, &h, per_block, samples);

    if (!failed) {
        printf("   %-16s %8s %10s %10s %10s %10s\n", "series", "handoffs", "p50", "p99", "max",
               "p50 ratio");
        double raw_p50 = (double)bench_samples_quantile(&samples[S_RAW], 0.50) / 1e3;
        for (int s = 0; s < S_COUNT; s++) {
            if (!samples[s].n) continue;
            double p50 = (double)bench_samples_quantile(&samples[s], 0.50) / 1e3;
            double p90 = (double)bench_samples_quantile(&samples[s], 0.90) / 1e3;
            double p99 = (double)bench_samples_quantile(&samples[s], 0.99) / 1e3;
            double mx = (double)bench_samples_max(&samples[s]) / 1e3;
            bench_metric(scenario, series_name[s], "p50_us", p50, "us");
            bench_metric(scenario, series_name[s], "p90_us", p90, "us");
            bench_metric(scenario, series_name[s], "p99_us", p99, "us");
            bench_metric(scenario, series_name[s], "max_us", mx, "us");
            bench_metric(scenario, series_name[s], "samples", (double)samples[s].n, "");
            char ratio[32] = "-";
            if (s != S_RAW && samples[S_RAW].n) {
                snprintf(ratio, sizeof ratio, "%.2fx", p50 / raw_p50);
                bench_metric(scenario, series_name[s], "p50_ratio_to_raw", p50 / raw_p50, "x");
            }
            printf("   %-16s %8zu %7.1f us %7.1f us %7.1f us %10s\n", series_name[s],
                   samples[s].n, p50, p99, mx, ratio);
        }
    }
    for (int s = 0; s < S_COUNT; s++) {
        dlock_lock_free(h.locks[s]);
        bench_samples_free(&samples[s]);
    }
    dlock_client_free(h.client);
    if (h.ctl) redisFree(h.ctl);
    return failed ? -1 : 0;
}

int bench_handoff(bench_ctx *ctx) {
    return handoff_run(ctx, "handoff", 1u << S_RAW | 1u << S_DLOCK | 1u << S_REENTRANT);
}

int bench_handoff_fair(bench_ctx *ctx) {
    return handoff_run(ctx, "fair_handoff",
                       1u << S_RAW | 1u << S_DLOCK | 1u << S_FAIR | 1u << S_NOTIFY);
}
