/* The "backends" scenario (backends.c): B, the waiter process, and the
 * handoffs from A (this process) to B, round-robin over the backends and
 * the peers. */
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

/* ---- B: the waiter (a child process) ---- */

/* Answers 'r' once connected (or 'x'), then per 'g': 'w' just before
 * dlock_acquire, then the time it held the lock (or -1), after releasing. */
static int waiter_main(const char *url, int cmd_fd, int res_fd) {
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    char why[600] = "";
    int failed = bk_new_client(url, &c, why, sizeof why) != DLOCK_OK;
    if (!failed && dlock_lock_new(c, BK_HANDOFF_LOCK, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l)) {
        snprintf(why, sizeof why, "dlock_lock_new: %s", dlock_errmsg(c));
        failed = 1;
    }
    if (failed) fprintf(stderr, "dlock_bench: backends: waiter: %s\n", why);
    if (bench_write_full(res_fd, failed ? "x" : "r", 1)) failed = 1;
    while (!failed) {
        char op;
        if (bench_read_full(cmd_fd, &op, 1, 10 * PIPE_TIMEOUT_MS) || op != 'g') break;
        if (bench_write_full(res_fd, "w", 1)) break;
        int64_t held = -1;
        int rc = dlock_acquire(l, WAIT_MS, DLOCK_WATCHDOG, NULL);
        if (rc == DLOCK_OK) {
            held = bench_now_ns();
            rc = dlock_release(l);
            if (rc) held = -1;
        }
        if (rc) {
            fprintf(stderr, "dlock_bench: backends: waiter: %s: %s\n", dlock_strerror(rc),
                    dlock_lock_errmsg(l));
            failed = 1;
        }
        if (bench_write_full(res_fd, &held, sizeof held)) break;
    }
    dlock_lock_free(l);
    dlock_client_free(c);
    return failed;
}

int bk_start_waiter(backend *b) {
    int fds[2];
    pid_t pid;
    b->pid = -1;
    b->wfd = b->rfd = -1;
    if (bench_fork_piped(&pid, fds)) return -1;
    if (pid == 0) _exit(waiter_main(b->url, fds[0], fds[1]));
    b->pid = pid;
    b->wfd = fds[0];
    b->rfd = fds[1];
    return 0;
}

int bk_stop_waiter(backend *b, int kill_it) {
    if (b->pid < 0) return 0;
    if (!kill_it) bench_write_full(b->wfd, "q", 1);
    close(b->wfd);
    close(b->rfd);
    if (kill_it) kill(b->pid, SIGTERM);
    int status = 0;
    while (waitpid(b->pid, &status, 0) < 0 && errno == EINTR) {
    }
    b->pid = -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ---- handoff ---- */

/* 1 when B is seen waiting (or the backend cannot show it), 0 not yet, -1 error */
static int waiter_seen(const bench_ctx *ctx, redisContext *rc, backend *b) {
    if (b->waiter_check == 1 && rc) {
        long long n = bench_lock_waiters(rc, BK_HANDOFF_LOCK);
        return n < 0 ? -1 : n >= 1;
    }
    if (b->waiter_check == 2) {
        dlock_info info;
        int e = dlock_inspect(b->client, BK_HANDOFF_LOCK, DLOCK_CSTR, &info);
        if (e) {
            fprintf(stderr, "dlock_bench: backends: %s inspect: %s: %s\n", b->name,
                    dlock_strerror(e), dlock_errmsg(b->client));
            return -1;
        }
        return info.waiters >= 1;
    }
    (void)ctx;
    return 1;
}

static int one_handoff(const bench_ctx *ctx, redisContext *rc, backend *b, int64_t settle_us,
                       int64_t *ns) {
    int e = dlock_acquire(b->lock, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL);
    if (e) {
        fprintf(stderr, "dlock_bench: backends: %s holder acquire: %s: %s\n", b->name,
                dlock_strerror(e), dlock_lock_errmsg(b->lock));
        return -1;
    }
    char w = 0;
    if (bench_write_full(b->wfd, "g", 1) || bench_read_full(b->rfd, &w, 1, PIPE_TIMEOUT_MS) || w != 'w') {
        fprintf(stderr, "dlock_bench: backends: %s waiter did not start waiting\n", b->name);
        return -1;
    }
    int64_t give_up = bench_now_ns() + 10000000000LL;
    int seen;
    while ((seen = waiter_seen(ctx, rc, b)) == 0 && bench_now_ns() < give_up) bench_sleep_us(200);
    if (seen != 1) {
        if (!seen) fprintf(stderr, "dlock_bench: backends: %s waiter never seen\n", b->name);
        return -1;
    }
    bench_sleep_us(settle_us);
    int64_t t0 = bench_now_ns();
    e = dlock_release(b->lock);
    if (e) {
        fprintf(stderr, "dlock_bench: backends: %s holder release: %s: %s\n", b->name,
                dlock_strerror(e), dlock_lock_errmsg(b->lock));
        return -1;
    }
    int64_t t1 = -1;
    if (bench_read_full(b->rfd, &t1, sizeof t1, PIPE_TIMEOUT_MS) || t1 < 0) {
        fprintf(stderr, "dlock_bench: backends: %s waiter failed or timed out\n", b->name);
        return -1;
    }
    *ns = t1 - t0;
    return 0;
}

/* A peer's handoff: its worker A holds, B says "waiting" just before its
 * blocking acquire, then the round's settle time plus
 * PEER_SETTLE_EXTRA_US (the peers give no way to see B queued from outside:
 * the extra covers B's own requests before it waits), A releases. */
static int one_peer_handoff(peerst *pe, int64_t settle_us, int64_t *ns) {
    char *l = NULL;
    if (!bench_peer_send(&pe->a, "hold %s", BK_HANDOFF_LOCK))
        l = bk_peer_reply(pe, &pe->a, PEER_LINE_MS, "hold");
    if (!l) return -1;
    l = NULL;
    if (!bench_peer_send(&pe->w, "wait %s", BK_HANDOFF_LOCK))
        l = bk_peer_reply(pe, &pe->w, PEER_LINE_MS, "wait");
    if (!l || strcmp(l, "waiting")) return -1;
    bench_sleep_us(settle_us + PEER_SETTLE_EXTRA_US);
    long long t0 = 0, t1 = 0, cpu = 0;
    l = NULL;
    if (!bench_peer_send(&pe->a, "release"))
        l = bk_peer_reply(pe, &pe->a, PEER_LINE_MS, "release");
    if (!l || sscanf(l, "ok %lld", &t0) != 1) return -1;
    l = bk_peer_reply(pe, &pe->w, PEER_LINE_MS, "wait");
    if (!l || sscanf(l, "got %lld %lld", &t1, &cpu) != 2) return -1;
    *ns = ((int64_t)t1 - pe->w.offset) - ((int64_t)t0 - pe->a.offset);
    return 0;
}

int bk_run_handoffs(const bench_ctx *ctx, backend *bk, int n, peerst *pe) {
    const int per = ctx->quick ? 30 : 200;
    const int64_t smin = ctx->quick ? 2000 : 5000, smax = ctx->quick ? 10000 : 50000;
    int failed = 0;
    redisContext *rc = bk[0].waiter_check == 1 ? bench_redis_connect(ctx) : NULL;
    if (bk[0].waiter_check == 1 && !rc) bk[0].waiter_check = 0;
    printf("\n   handoff: A releases, B (another process, blocked in dlock_acquire) holds "
           "(%d per backend, round-robin; settle %lld-%lld ms)\n",
           per, (long long)(smin / 1000), (long long)(smax / 1000));
    uint64_t rnd = (uint64_t)bench_now_ns() | 1;
    for (int i = 0; i < per + HANDOFF_WARMUP; i++) {
        rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
        int64_t settle = smin + (int64_t)(rnd % (uint64_t)(smax - smin + 1));
        for (int k = 0; k < n; k++) {
            backend *b = &bk[k];
            if (!b->ok) continue;
            int64_t t = 0;
            if (one_handoff(ctx, rc, b, settle, &t) ||
                (i >= HANDOFF_WARMUP && bench_samples_add(&b->handoff, t))) {
                b->ok = 0;
                failed = 1;
                bk_stop_waiter(b, 1);
                if (dlock_lock_holding(b->lock)) dlock_release(b->lock);
            }
        }
        for (int k = 0; k < NPEERS; k++) {
            peerst *p = &pe[k];
            if (!p->ok) continue;
            int64_t t = 0;
            if (one_peer_handoff(p, settle, &t) ||
                (i >= HANDOFF_WARMUP && bench_samples_add(&p->handoff, t))) {
                printf("   %s: handoff FAILED (see above)\n", p->name);
                p->ok = 0; /* a peer's failure is its own */
            }
        }
    }
    if (rc) redisFree(rc);
    printf("   %-18s %8s %10s %10s %10s %10s\n", "backend", "handoffs", "p50", "p99", "max",
           "p50 vs redis");
    double base = bk[0].ok ? (double)bench_samples_quantile(&bk[0].handoff, 0.50) / 1e3 : 0;
    for (int k = 0; k < n; k++) {
        backend *b = &bk[k];
        if (!b->client) continue;
        if (!b->ok) {
            printf("   %-18s FAILED (see above)\n", b->name);
            continue;
        }
        double p50 = (double)bench_samples_quantile(&b->handoff, 0.50) / 1e3;
        double p90 = (double)bench_samples_quantile(&b->handoff, 0.90) / 1e3;
        double p99 = (double)bench_samples_quantile(&b->handoff, 0.99) / 1e3;
        double mx = (double)bench_samples_max(&b->handoff) / 1e3;
        bench_metric("backends", b->name, "handoff_p50_us", p50, "us");
        bench_metric("backends", b->name, "handoff_p90_us", p90, "us");
        bench_metric("backends", b->name, "handoff_p99_us", p99, "us");
        bench_metric("backends", b->name, "handoff_max_us", mx, "us");
        bench_metric("backends", b->name, "handoff_samples", (double)b->handoff.n, "");
        char rtext[32] = "-";
        if (k > 0 && base > 0) {
            snprintf(rtext, sizeof rtext, "%.1fx", p50 / base);
            bench_metric("backends", b->name, "handoff_p50_ratio_to_redis", p50 / base, "x");
        }
        printf("   %-18s %8zu %7.1f us %7.1f us %7.1f us %10s\n", b->name, b->handoff.n, p50, p99,
               mx, rtext);
    }
    for (int k = 0; k < NPEERS; k++) {
        peerst *p = &pe[k];
        if (!p->ok || !p->handoff.n) continue;
        double p50 = (double)bench_samples_quantile(&p->handoff, 0.50) / 1e3;
        double p99 = (double)bench_samples_quantile(&p->handoff, 0.99) / 1e3;
        double mx = (double)bench_samples_max(&p->handoff) / 1e3;
        bench_metric("backends", p->name, "handoff_p50_us", p50, "us");
        bench_metric("backends", p->name, "handoff_p99_us", p99, "us");
        bench_metric("backends", p->name, "handoff_max_us", mx, "us");
        bench_metric("backends", p->name, "handoff_samples", (double)p->handoff.n, "");
        char rtext[32] = "-";
        if (base > 0) snprintf(rtext, sizeof rtext, "%.1fx", p50 / base);
        printf("   %-18s %8zu %7.1f us %7.1f us %7.1f us %10s\n", p->name, p->handoff.n, p50, p99,
               mx, rtext);
    }
    return failed;
}

/* dlock beside each peer on the same server: rates dlock / peer (above 1:
 * dlock does more), latencies dlock / peer (below 1: dlock is quicker).
 * The pairs ratio is the median of the per-round ratios. */
