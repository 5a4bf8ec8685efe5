/* Scenario "peer_handoff" (peers.c describes it): handoff latency between
 * two workers of each peer, then the idle-wait cost of dlock and every peer. */
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

/* ======================= peer_handoff ======================= */

static long long info_field(redisContext *rc, const char *section, const char *field) {
    redisReply *r = redisCommand(rc, "INFO %s", section);
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        char key[64];
        snprintf(key, sizeof key, "\n%s:", field);
        const char *p = strstr(r->str, key);
        if (p) v = atoll(p + strlen(key));
    }
    if (r) freeReplyObject(r);
    return v;
}

/* One handoff of configuration c between workers a (holder) and b (waiter).
 * extra_us: a further wait before the release (idle-wait measurement; the
 * server's commands during it go to *cmds). Returns 0 and *lat_ns, *cpu_ns. */
static int peer_handoff_once(redisContext *rc, const peer_cfg *c, peer *a, peer *b,
                             int64_t extra_us, int64_t *lat_ns, int64_t *cpu_ns,
                             double *cmds, int64_t *waited_ns) {
    char name[96];
    snprintf(name, sizeof name, "bench:peer_handoff:%s", c->series);
    if (bench_peer_send(a, "hold %s %s", name, c->arg)) return -1;
    char *l = pr_peer_reply(a, PR_LINE_TIMEOUT_MS, "hold");
    if (!l || strcmp(l, "ok")) return -1;
    if (bench_peer_send(b, "wait %s %s", name, c->arg)) return -1;
    l = pr_peer_reply(b, PR_LINE_TIMEOUT_MS, "wait");
    if (!l || strcmp(l, "waiting")) return -1;
    int64_t tw = bench_now_ns();
    if (extra_us) {
        bench_sleep_us(2000);
        long long c0 = info_field(rc, "stats", "total_commands_processed");
        int64_t t0 = bench_now_ns();
        bench_sleep_us(extra_us);
        long long c1 = info_field(rc, "stats", "total_commands_processed");
        int64_t t1 = bench_now_ns();
        /* c1 - c0 counts the first INFO itself */
        *cmds = (double)(c1 - c0 - 1) * 1e9 / (double)(t1 - t0);
    } else {
        bench_sleep_us(2000 + (int64_t)(rand() % (int)(c->poll_us + 1)));
    }
    if (bench_peer_send(a, "release")) return -1;
    l = pr_peer_reply(a, PR_LINE_TIMEOUT_MS, "release");
    long long t0, t1, cpu = 0;
    if (!l || sscanf(l, "ok %lld", &t0) != 1) return -1;
    l = pr_peer_reply(b, PR_LINE_TIMEOUT_MS, "wait");
    if (!l || sscanf(l, "got %lld %lld", &t1, &cpu) < 1) return -1;
    *lat_ns = (t1 - b->offset) - (t0 - a->offset);
    *cpu_ns = cpu;
    if (waited_ns) *waited_ns = (t1 - b->offset) - tw;
    return 0;
}

/* dlock's idle waiter: a forked child blocked in dlock_acquire while this
 * process holds; the server's commands per second during the wait and the
 * child's CPU time per second of wait. */
static int dlock_idle(const bench_ctx *ctx, redisContext *rc, int64_t wait_us, double *cmds,
                      double *cpu_pct) {
    const char *name = "bench:peer_handoff:dlock-idle";
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    int failed = pr_make_client(ctx, &c) ||
                 dlock_lock_new(c, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l) ||
                 dlock_acquire(l, DLOCK_NOWAIT, 30000, NULL);
    int fds[2] = {-1, -1};
    if (!failed) failed = pipe(fds);
    pid_t pid = -1;
    if (!failed) {
        fflush(NULL);
        pid = fork();
        failed = pid < 0;
    }
    if (pid == 0) {
        close(fds[0]);
        dlock_client *cc = NULL;
        dlock_lock *ll = NULL;
        int64_t res[2] = {-1, -1};
        if (!pr_make_client(ctx, &cc) && !dlock_lock_new(cc, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &ll)) {
            struct rusage r0, r1;
            getrusage(RUSAGE_SELF, &r0);
            int64_t t0 = bench_now_ns();
            if (write(fds[1], "w", 1) != 1) _exit(1);
            if (dlock_acquire(ll, 60000, 30000, NULL) == DLOCK_OK) {
                getrusage(RUSAGE_SELF, &r1);
                res[0] = bench_now_ns() - t0;
                res[1] = ((int64_t)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1000000 +
                          (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
                          (int64_t)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1000000 +
                          (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec)) *
                         1000;
                dlock_release(ll);
            }
        }
        ssize_t w = write(fds[1], res, sizeof res);
        dlock_lock_free(ll);
        dlock_client_free(cc);
        _exit(w == (ssize_t)sizeof res && res[0] >= 0 ? 0 : 1);
    }
    if (pid > 0) {
        close(fds[1]);
        fds[1] = -1;
        char ch;
        failed = read(fds[0], &ch, 1) != 1;
        char chan[128];
        /* a plain-lock waiter has a channel of its own */
        snprintf(chan, sizeof chan, "redisson_lock__channel:{%s}:*", name);
        /* until the child sleeps on its channel */
        for (int i = 0; !failed && i < 20000; i++) {
            redisReply *r = redisCommand(rc, "PUBSUB CHANNELS %s", chan);
            long long n = r && r->type == REDIS_REPLY_ARRAY ? (long long)r->elements : -1;
            if (r) freeReplyObject(r);
            if (n >= 1) break;
            bench_sleep_us(100);
        }
        bench_sleep_us(2000);
        long long c0 = info_field(rc, "stats", "total_commands_processed");
        int64_t t0 = bench_now_ns();
        bench_sleep_us(wait_us);
        long long c1 = info_field(rc, "stats", "total_commands_processed");
        int64_t t1 = bench_now_ns();
        *cmds = (double)(c1 - c0 - 1) * 1e9 / (double)(t1 - t0);
        if (dlock_release(l)) failed = 1;
        int64_t res[2];
        if (!failed && read(fds[0], res, sizeof res) != (ssize_t)sizeof res) failed = 1;
        if (!failed) *cpu_pct = 100.0 * (double)res[1] / (double)res[0];
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st)) failed = 1;
    }
    if (fds[0] >= 0) close(fds[0]);
    if (fds[1] >= 0) close(fds[1]);
    dlock_lock_free(l);
    dlock_client_free(c);
    return failed ? -1 : 0;
}

int bench_peer_handoff(bench_ctx *ctx) {
    const int n = ctx->quick ? 8 : 200;
    const int64_t idle_us = ctx->quick ? 300000 : 1000000;
    peer pa[NKINDS], pb[NKINDS];
    int have[NKINDS] = {0};
    bench_samples lat[NCFG];
    memset(lat, 0, sizeof lat);
    int failed = 0;
    redisContext *rc = bench_redis_connect(ctx);
    if (!rc) return -1;
    srand((unsigned)bench_now_ns());
    printf("\n== peer_handoff: A releases, B (another process, blocked) holds; %d per "
           "configuration, round-robin\n",
           n);
    for (int k = 0; !failed && k < NKINDS; k++) {
        pa[k].pid = pb[k].pid = -1;
        int r = pr_peers_start(ctx, k, &pa[k], 1);
        if (!r) {
            r = pr_peers_start(ctx, k, &pb[k], 1);
            if (r) bench_peer_stop(&pa[k]);
        }
        if (r < 0) failed = 1;
        have[k] = r == 0;
    }
    for (int i = 0; !failed && i < n + 2; i++) {
        for (int s = 0; !failed && s < NCFG; s++) {
            const peer_cfg *c = &pr_cfgs[s];
            if (!have[c->kind] || !bench_series_on(ctx, c->series)) continue;
            int64_t ns, cpu;
            failed = peer_handoff_once(rc, c, &pa[c->kind], &pb[c->kind], 0, &ns, &cpu, NULL,
                                       NULL);
            if (!failed && i >= 2) failed = bench_samples_add(&lat[s], ns); /* 2 warm-up */
        }
    }
    if (!failed) {
        printf("   %-18s %8s %10s %10s %10s %10s\n", "series", "handoffs", "p50", "p90", "p99",
               "max");
        for (int s = 0; s < NCFG; s++) {
            if (!lat[s].n) continue;
            double p50 = (double)bench_samples_quantile(&lat[s], 0.5) / 1e3;
            double p90 = (double)bench_samples_quantile(&lat[s], 0.9) / 1e3;
            double p99 = (double)bench_samples_quantile(&lat[s], 0.99) / 1e3;
            double mx = (double)bench_samples_max(&lat[s]) / 1e3;
            bench_metric("peer_handoff", pr_cfgs[s].series, "p50_us", p50, "us");
            bench_metric("peer_handoff", pr_cfgs[s].series, "p90_us", p90, "us");
            bench_metric("peer_handoff", pr_cfgs[s].series, "p99_us", p99, "us");
            bench_metric("peer_handoff", pr_cfgs[s].series, "max_us", mx, "us");
            bench_metric("peer_handoff", pr_cfgs[s].series, "samples", (double)lat[s].n, "");
            printf("   %-18s %8zu %7.0f us %7.0f us %7.0f us %7.0f us\n", pr_cfgs[s].series,
                   lat[s].n, p50, p90, p99, mx);
        }
        /* idle-wait cost: is the waiter polling? */
        printf("   idle wait (B blocked %.1f s): server commands/s during the wait, B's CPU\n",
               idle_us / 1e6);
        double cmds = 0, cpu_pct = 0;
        if (bench_series_on(ctx, "dlock")) {
            failed = dlock_idle(ctx, rc, idle_us, &cmds, &cpu_pct);
            if (!failed) {
                bench_metric("peer_handoff", "dlock", "wait_cmds_per_s", cmds, "1/s");
                bench_metric("peer_handoff", "dlock", "wait_cpu_pct", cpu_pct, "%");
                printf("   %-18s %8.1f cmd/s %8.2f %% CPU\n", "dlock", cmds, cpu_pct);
            }
        }
        for (int s = 0; !failed && s < NCFG; s++) {
            const peer_cfg *c = &pr_cfgs[s];
            if (!lat[s].n) continue;
            int64_t ns, cpu, waited;
            failed = peer_handoff_once(rc, c, &pa[c->kind], &pb[c->kind], idle_us, &ns, &cpu,
                                       &cmds, &waited);
            if (failed) break;
            cpu_pct = 100.0 * (double)cpu / (double)waited;
            bench_metric("peer_handoff", c->series, "wait_cmds_per_s", cmds, "1/s");
            bench_metric("peer_handoff", c->series, "wait_cpu_pct", cpu_pct, "%");
            printf("   %-18s %8.1f cmd/s %8.2f %% CPU\n", c->series, cmds, cpu_pct);
        }
    }
    for (int k = 0; k < NKINDS; k++)
        if (have[k]) {
            bench_peer_stop(&pa[k]);
            bench_peer_stop(&pb[k]);
        }
    for (int s = 0; s < NCFG; s++) bench_samples_free(&lat[s]);
    redisFree(rc);
    return failed ? -1 : 0;
}
