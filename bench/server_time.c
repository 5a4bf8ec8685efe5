/* Scenario "server_time": what one call costs the server when it comes 2 ms
 * after the previous request, the idle a lock handoff meets (the waiter
 * slept, so did the server). The slow log (slowlog-log-slower-than 0, set
 * for the scenario and restored after) gives each command's execution time
 * in microseconds: no network, no client, no scheduling of other processes.
 *
 *   set-nx               raw SET NX PX: the raw pair's woken attempt
 *   raw-release          raw release script (GET, DEL, PUBLISH to a subscriber)
 *   plain-acquire        dlock_acquire(DLOCK_NOWAIT) of a free plain lock
 *   plain-release-wake   dlock_release of a plain lock with one registered,
 *                        subscribed waiter (it is told)
 *   fair-release-grant   dlock_release of a fair lock whose queue head is a
 *                        subscribed dlock waiter (the lock is handed to it)
 *
 * Per round, each series in a balanced order (bench_order): its state is set
 * up (pipelined, untimed), the slow log reset, 2 ms of sleep, the call, and
 * the slow log read back. The waiters are a hiredis connection subscribed to
 * their channels; the message each release must send is read and checked. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench.h"
#include "dlock.h"

#define IDLE_US 2000
#define LEASE "30000"

enum { T_SETNX, T_RAW_REL, T_PLAIN_ACQ, T_PLAIN_REL, T_FAIR_REL, T_COUNT };
static const char *const series_name[T_COUNT] = {"set-nx", "raw-release", "plain-acquire",
                                                 "plain-release-wake", "fair-release-grant"};

#define RAW_KEY "bench:st:raw"
#define PLAIN_KEY "bench:st:plain"
#define FAIR_KEY "bench:st:fair"
#define WAITER "st-waiter"          /* plain: the waiter's token; fair: its owner id */
#define RAW_CHAN "bench:st:raw:chan"
#define PLAIN_CHAN "redisson_lock__channel:{" PLAIN_KEY "}:" WAITER
#define FAIR_CHAN "redisson_lock__channel:{" FAIR_KEY "}:" WAITER

static const char raw_release_lua[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]); "
    "redis.call('publish', KEYS[2], '0'); return 1 end return 0";

typedef struct st_ctx {
    redisContext *ctl, *sub;
    dlock_client *client;
    dlock_lock *plain, *fair;
    char sha[48];
} st_ctx;

static int ok_reply(redisReply *r) { return r && r->type != REDIS_REPLY_ERROR; }

/* Runs fmt and frees the reply; -1 (message on stderr) on error. */
static int cmd(redisContext *rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    int ok = ok_reply(r);
    if (!ok) fprintf(stderr, "dlock_bench: server_time: %s: %s\n", fmt,
                     r ? r->str : rc->errstr);
    if (r) freeReplyObject(r);
    return ok ? 0 : -1;
}

/* The state a series' call needs, then SLOWLOG RESET. */
static int setup(st_ctx *x, int s) {
    int rc = cmd(x->ctl, "DEL %s %s %s redisson_lock_queue:{%s} redisson_lock_timeout:{%s} "
                         "redisson_lock_lease:{%s} dlock_waiters:{%s}",
                 RAW_KEY, PLAIN_KEY, FAIR_KEY, FAIR_KEY, FAIR_KEY, FAIR_KEY, PLAIN_KEY);
    if (!rc && s == T_RAW_REL) rc = cmd(x->ctl, "SET %s tokA PX %s", RAW_KEY, LEASE);
    if (!rc && s == T_PLAIN_REL) {
        if (dlock_acquire(x->plain, DLOCK_NOWAIT, 30000, NULL) != DLOCK_OK) {
            fprintf(stderr, "dlock_bench: server_time: %s\n", dlock_lock_errmsg(x->plain));
            return -1;
        }
        rc = cmd(x->ctl, "ZADD dlock_waiters:{%s} 1 %s", PLAIN_KEY, WAITER);
    }
    if (!rc && s == T_FAIR_REL) {
        if (dlock_acquire(x->fair, DLOCK_NOWAIT, 30000, NULL) != DLOCK_OK) {
            fprintf(stderr, "dlock_bench: server_time: %s\n", dlock_lock_errmsg(x->fair));
            return -1;
        }
        redisReply *t = redisCommand(x->ctl, "TIME");
        long long now_ms = t && t->type == REDIS_REPLY_ARRAY && t->elements == 2
                               ? atoll(t->element[0]->str) * 1000 +
                                     atoll(t->element[1]->str) / 1000
                               : 0;
        if (t) freeReplyObject(t);
        rc = cmd(x->ctl, "RPUSH redisson_lock_queue:{%s} %s", FAIR_KEY, WAITER);
        if (!rc)
            rc = cmd(x->ctl, "ZADD redisson_lock_timeout:{%s} %lld %s", FAIR_KEY,
                     now_ms + 60000, WAITER);
        if (!rc) rc = cmd(x->ctl, "HSET redisson_lock_lease:{%s} %s %s", FAIR_KEY, WAITER, LEASE);
    }
    if (!rc) rc = cmd(x->ctl, "SLOWLOG RESET");
    return rc;
}

/* The call under test. */
static int call(st_ctx *x, int s) {
    switch (s) {
    case T_SETNX: return cmd(x->ctl, "SET %s tokB NX PX %s", RAW_KEY, LEASE);
    case T_RAW_REL: return cmd(x->ctl, "EVALSHA %s 2 %s %s tokA", x->sha, RAW_KEY, RAW_CHAN);
    case T_PLAIN_ACQ:
        if (dlock_acquire(x->plain, DLOCK_NOWAIT, 30000, NULL) == DLOCK_OK) return 0;
        fprintf(stderr, "dlock_bench: server_time: %s\n", dlock_lock_errmsg(x->plain));
        return -1;
    default: {
        dlock_lock *l = s == T_PLAIN_REL ? x->plain : x->fair;
        if (dlock_release(l) == DLOCK_OK) return 0;
        fprintf(stderr, "dlock_bench: server_time: %s\n", dlock_lock_errmsg(l));
        return -1;
    }
    }
}

/* The waiter's message of a release: on its channel, "granted:..." for the
 * fair lock. */
static int expect_message(st_ctx *x, int s) {
    if (s != T_RAW_REL && s != T_PLAIN_REL && s != T_FAIR_REL) return 0;
    const char *chan = s == T_RAW_REL ? RAW_CHAN : s == T_PLAIN_REL ? PLAIN_CHAN : FAIR_CHAN;
    void *v = NULL;
    if (redisGetReply(x->sub, &v) != REDIS_OK) {
        fprintf(stderr, "dlock_bench: server_time: subscriber: %s\n", x->sub->errstr);
        return -1;
    }
    redisReply *m = v;
    int ok = m->type == REDIS_REPLY_ARRAY && m->elements == 3 &&
             m->element[1]->type == REDIS_REPLY_STRING && !strcmp(m->element[1]->str, chan) &&
             (s != T_FAIR_REL || !strncmp(m->element[2]->str, "granted:", 8));
    if (!ok) fprintf(stderr, "dlock_bench: server_time: %s: unexpected message\n", series_name[s]);
    freeReplyObject(m);
    return ok ? 0 : -1;
}

/* The slow log's time of the call: its newest SET, EVALSHA or EVAL entry. */
static int slowlog_us(st_ctx *x, int64_t *us) {
    redisReply *r = redisCommand(x->ctl, "SLOWLOG GET 16");
    int found = 0;
    if (r && r->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < r->elements && !found; i++) {
            redisReply *e = r->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 4) continue;
            redisReply *argv = e->element[3];
            if (argv->type != REDIS_REPLY_ARRAY || !argv->elements) continue;
            const char *c = argv->element[0]->str;
            if (c && (!strcasecmp(c, "SET") || !strcasecmp(c, "EVALSHA") || !strcasecmp(c, "EVAL"))) {
                *us = e->element[2]->integer;
                found = 1;
            }
        }
    }
    if (r) freeReplyObject(r);
    if (!found) fprintf(stderr, "dlock_bench: server_time: call not in the slow log\n");
    return found ? 0 : -1;
}

static int open_all(const bench_ctx *ctx, st_ctx *x) {
    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    if (!(x->ctl = bench_redis_connect(ctx)) || !(x->sub = bench_redis_connect(ctx))) return -1;
    if (dlock_client_new(&o, &x->client)) {
        fprintf(stderr, "dlock_bench: dlock_client_new: %s\n", dlock_errmsg(x->client));
        return -1;
    }
    if (dlock_lock_new(x->client, PLAIN_KEY, DLOCK_CSTR, DLOCK_KIND_PLAIN, &x->plain) ||
        dlock_lock_new(x->client, FAIR_KEY, DLOCK_CSTR, DLOCK_KIND_FAIR, &x->fair)) {
        fprintf(stderr, "dlock_bench: dlock_lock_new: %s\n", dlock_errmsg(x->client));
        return -1;
    }
    redisReply *r = redisCommand(x->ctl, "SCRIPT LOAD %s", raw_release_lua);
    int ok = r && r->type == REDIS_REPLY_STRING && r->len < sizeof x->sha;
    if (ok) memcpy(x->sha, r->str, r->len + 1);
    if (r) freeReplyObject(r);
    if (!ok) return -1;
    r = redisCommand(x->sub, "SUBSCRIBE %s %s %s", RAW_CHAN, PLAIN_CHAN, FAIR_CHAN);
    if (r) freeReplyObject(r);
    for (int i = 1; r && i < 3; i++) { /* the other two confirmations */
        void *v = NULL;
        if (redisGetReply(x->sub, &v) != REDIS_OK) return -1;
        freeReplyObject(v);
    }
    return r ? 0 : -1;
}

int bench_server_time(bench_ctx *ctx) {
    const int rounds = ctx->quick ? 20 : 300;
    st_ctx x;
    memset(&x, 0, sizeof x);
    bench_samples smp[T_COUNT];
    memset(smp, 0, sizeof smp);
    char old_slower[32] = "10000", old_len[32] = "128";
    int failed = open_all(ctx, &x);
    if (!failed) {
        redisReply *r = redisCommand(x.ctl, "CONFIG GET slowlog-*");
        for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
            char *dst = !strcmp(r->element[i]->str, "slowlog-log-slower-than") ? old_slower
                        : !strcmp(r->element[i]->str, "slowlog-max-len")       ? old_len
                                                                                : NULL;
            if (dst) snprintf(dst, 32, "%s", r->element[i + 1]->str);
        }
        if (r) freeReplyObject(r);
        failed = cmd(x.ctl, "CONFIG SET slowlog-log-slower-than 0") ||
                 cmd(x.ctl, "CONFIG SET slowlog-max-len 128");
    }
    for (int round = -2; !failed && round < rounds; round++) { /* 2 warm-up rounds */
        for (int k = 0; !failed && k < T_COUNT; k++) {
            int s = bench_order(round < 0 ? 0 : round, k, T_COUNT);
            if (!bench_series_on(ctx, series_name[s])) continue;
            int64_t us = 0;
            failed = setup(&x, s);
            if (!failed) bench_sleep_us(IDLE_US);
            if (!failed) failed = call(&x, s);
            if (!failed) failed = expect_message(&x, s);
            if (!failed) failed = slowlog_us(&x, &us);
            if (!failed && round >= 0) failed = bench_samples_add(&smp[s], us);
            if (!failed && s == T_PLAIN_ACQ && dlock_release(x.plain) != DLOCK_OK) failed = 1;
        }
    }
    if (x.ctl) {
        cmd(x.ctl, "CONFIG SET slowlog-log-slower-than %s", old_slower);
        cmd(x.ctl, "CONFIG SET slowlog-max-len %s", old_len);
        cmd(x.ctl, "SLOWLOG RESET");
        cmd(x.ctl, "DEL %s %s %s redisson_lock_queue:{%s} redisson_lock_timeout:{%s} "
                   "redisson_lock_lease:{%s} dlock_waiters:{%s}",
            RAW_KEY, PLAIN_KEY, FAIR_KEY, FAIR_KEY, FAIR_KEY, FAIR_KEY, PLAIN_KEY);
    }
    if (!failed) {
        printf("\n== server_time: one call's time on the server (slow log), %d us after the "
               "previous request (%d rounds, balanced order)\n",
               IDLE_US, rounds);
        printf("   %-20s %6s %8s %8s %14s\n", "series", "calls", "p50", "p90",
               "p50 / raw-rel");
        double raw = (double)bench_samples_quantile(&smp[T_RAW_REL], 0.50);
        for (int s = 0; s < T_COUNT; s++) {
            if (!smp[s].n) continue;
            double p50 = (double)bench_samples_quantile(&smp[s], 0.50);
            double p90 = (double)bench_samples_quantile(&smp[s], 0.90);
            bench_metric("server_time", series_name[s], "p50_us", p50, "us");
            bench_metric("server_time", series_name[s], "p90_us", p90, "us");
            printf("   %-20s %6zu %5.0f us %5.0f us", series_name[s], smp[s].n, p50, p90);
            if (raw > 0) {
                bench_metric("server_time", series_name[s], "ratio_to_raw_release", p50 / raw, "x");
                printf(" %13.2fx", p50 / raw);
            }
            printf("\n");
        }
    }
    for (int s = 0; s < T_COUNT; s++) bench_samples_free(&smp[s]);
    dlock_lock_free(x.plain);
    dlock_lock_free(x.fair);
    dlock_client_free(x.client);
    if (x.sub) redisFree(x.sub);
    if (x.ctl) redisFree(x.ctl);
    return failed ? -1 : 0;
}
