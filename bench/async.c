/* Scenarios of the async API (issue 24, include/dlock_async.h), each on a
 * bare poll loop of this thread (dlock_async_fds, dlock_async_timeout,
 * dlock_async_process):
 *
 *   async_waits    one async client W holds N (10,000; quick: 1,000) pending
 *                  acquires (DLOCK_WAIT_FOREVER) on N distinct plain locks,
 *                  each held by another async client H; then H releases them
 *                  in turn (each release sent when the previous one's reply
 *                  came). Every wait must be granted (asserted, quick mode
 *                  too). Reported: the bytes the process allocated over the
 *                  N waits (mallinfo2: uordblks + hblkhd, before W's handles
 *                  are made and once the server shows every waiter
 *                  subscribed) per wait, handle included; and from CLIENT
 *                  LIST the subscribed connections (sub > 0) and their
 *                  channels: one connection with N channels is the design.
 *                  Two series: "async" starts the N acquires in one go,
 *                  "async-batched" BATCH at a time (see run_waits).
 *   async_pairs    uncontended acquire+release pairs on DEPTH distinct plain
 *                  locks, pipelined DEPTH deep on one connection:
 *                    raw     hiredis on one connection, src/lock_plain.c's
 *                            acquire and release scripts (copied) by
 *                            EVALSHA with the async client's keys and
 *                            arguments, a window of DEPTH requests in flight:
 *                            each reply read queues the slot's next request
 *                            (redisAppendCommandArgv; redisGetReply writes what
 *                            is queued only when no reply is buffered). The
 *                            least work for the same requests: the floor.
 *                    async   DEPTH handles of one async client, each one
 *                            starting its release from its acquire's
 *                            callback and its next acquire from the
 *                            release's.
 *                    blocking  one thread of the blocking API
 *                            (dlock_acquire NOWAIT + dlock_release), one lock.
 *                  Rounds alternate the series (bench_order); the ratios are
 *                  medians of per-round ratios. Targets: async >= 0.8x raw,
 *                  async >= 5x blocking.
 *   async_handoff  from just before the holder's release call to the
 *                  waiter's grant, on one lock:
 *                    async     holder and waiter two async clients on this
 *                              loop; the release is started, the grant is
 *                              the waiter's callback.
 *                    blocking  the blocking API: the holder on this thread,
 *                              the waiter a thread of its own blocked in
 *                              dlock_acquire (its own client), which
 *                              records the time it returns.
 *                  Before each release the server must show the waiter
 *                  registered and subscribed (bench_lock_waiters), then a
 *                  settle time. Handoffs alternate the two series. Target:
 *                  async p50 within 1.1x blocking.
 */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "dlock.h"
#include "dlock_async.h"

/* mallinfo2 is glibc's (2.33 on): elsewhere async_waits reports no bytes */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define HAVE_MALLINFO2 1
#else
#define HAVE_MALLINFO2 0
#endif

#define LEASE_MS 60000
#define DEPTH 32
#define MAX_ROUNDS 20
#define SETTLE_US 2000

/* ---- the bare loop over several clients ---- */

/* One poll over every client's sockets, at most max_ms (and each client's
 * timeout), then dlock_async_process for each client's ready sockets, and
 * for each client once with fd -1 (its timers). */
static int loop_once(dlock_async_client **cs, int n, int max_ms) {
    struct pollfd p[64];
    int owner[64], np = 0;
    int64_t to = max_ms;
    for (int i = 0; i < n; i++) {
        dlock_async_pollfd f[64];
        int k = dlock_async_fds(cs[i], f, 64 - np);
        if (k > 64 - np) k = 64 - np; /* one server: 2 per client */
        for (int j = 0; j < k; j++) {
            p[np].fd = f[j].fd;
            p[np].events = (short)(((f[j].events & DLOCK_ASYNC_READ) ? POLLIN : 0) |
                                   ((f[j].events & DLOCK_ASYNC_WRITE) ? POLLOUT : 0));
            p[np].revents = 0;
            owner[np++] = i;
        }
        int64_t t = dlock_async_timeout(cs[i]);
        if (t >= 0 && t < to) to = t;
    }
    int ready = poll(p, (nfds_t)np, (int)to);
    for (int j = 0; j < np; j++) {
        if (!p[j].revents) continue;
        int ev = ((p[j].revents & (POLLIN | POLLERR | POLLHUP)) ? DLOCK_ASYNC_READ : 0) |
                 ((p[j].revents & POLLOUT) ? DLOCK_ASYNC_WRITE : 0);
        dlock_async_process(cs[owner[j]], p[j].fd, ev);
    }
    for (int i = 0; i < n; i++) dlock_async_process(cs[i], -1, 0);
    return ready;
}

/* Turns of the loop until a turn of 1 ms finds nothing ready (at most 1 s). */
static void drain(dlock_async_client **cs, int n) {
    for (int64_t end = bench_now_ns() + 1000000000LL; bench_now_ns() < end;)
        if (loop_once(cs, n, 1) <= 0) break;
}

static dlock_async_client *async_new(const bench_ctx *ctx) {
    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_async_client *c = NULL;
    if (dlock_async_client_new(&o, NULL, &c)) {
        fprintf(stderr, "dlock_bench: dlock_async_client_new: %s\n", dlock_async_errmsg(c));
        dlock_async_client_free(c);
        return NULL;
    }
    return c;
}

/* bytes allocated by the process now (0 without mallinfo2) */
static size_t heap_bytes(void) {
#if HAVE_MALLINFO2
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
#else
    return 0;
#endif
}

/* ---- async_waits ---- */

typedef struct op_count {
    long ok, failed;
    int last_code;
} op_count;

static void count_cb(dlock_async_lock *l, int code, uint64_t fence, void *udata) {
    (void)fence;
    op_count *c = udata;
    if (code == DLOCK_OK) {
        c->ok++;
    } else {
        if (!c->failed)
            fprintf(stderr, "dlock_bench: async operation: %s: %s\n", dlock_strerror(code),
                    dlock_async_lock_errmsg(l));
        c->failed++;
        c->last_code = code;
    }
}

/* From CLIENT LIST: connections with a subscription, the most channels of
 * one, and every connection. */
static int client_list(redisContext *rc, long *subconns, long *maxsub, long *conns) {
    redisReply *r = redisCommand(rc, "CLIENT LIST");
    if (!r || r->type != REDIS_REPLY_STRING) {
        if (r) freeReplyObject(r);
        return -1;
    }
    *subconns = *maxsub = *conns = 0;
    for (char *line = r->str; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *s = strstr(line, " sub=");
        long sub = s ? atol(s + 5) : 0;
        (*conns)++;
        if (sub > 0) (*subconns)++;
        if (sub > *maxsub) *maxsub = sub;
        line = nl ? nl + 1 : NULL;
    }
    freeReplyObject(r);
    return 0;
}

/* One run: series "async" starts all n acquires at once, "async-batched"
 * BATCH at a time, each batch's requests out and answered before the next
 * (so that no connection's output buffer grows with n: the difference
 * between the two is buffer capacity kept after the burst, not the waits'
 * state). */
#define BATCH 100
static int run_waits(bench_ctx *ctx, const char *series, long batch) {
    const long n = ctx->quick ? 1000 : 10000;
    int failed = 0;
    redisContext *rc = bench_redis_connect(ctx);
    dlock_async_client *h = async_new(ctx), *w = async_new(ctx);
    dlock_async_lock **hl = calloc((size_t)n, sizeof *hl), **wl = calloc((size_t)n, sizeof *wl);
    op_count hacq = {0}, hrel = {0}, wacq = {0}, wrel = {0};
    if (!rc || !h || !w || !hl || !wl) failed = -1;
    printf("   -- %s: %ld acquires started %ld at a time\n", series, n, batch);
    char name[64];
    dlock_async_client *both[2] = {h, w};
    /* H takes every lock */
    for (long i = 0; !failed && i < n; i++) {
        snprintf(name, sizeof name, "bench:async:%s:%ld", series, i);
        if (dlock_async_lock_new(h, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &hl[i]) ||
            dlock_async_acquire(hl[i], DLOCK_NOWAIT, LEASE_MS, count_cb, &hacq)) {
            fprintf(stderr, "dlock_bench: holder %ld: %s\n", i, dlock_async_errmsg(h));
            failed = -1;
        }
    }
    int64_t deadline = bench_now_ns() + 30000000000LL;
    while (!failed && hacq.ok + hacq.failed < n && bench_now_ns() < deadline)
        loop_once(both, 2, 100);
    if (!failed && hacq.ok != n) {
        fprintf(stderr, "dlock_bench: holder took %ld of %ld locks\n", hacq.ok, n);
        failed = -1;
    }
    /* W waits on each; the bytes allocated from here until the server shows
     * every waiter subscribed are the waits' (W's connections included) */
    size_t before = heap_bytes();
    int64_t t0 = bench_now_ns();
    for (long i = 0; !failed && i < n; i++) {
        snprintf(name, sizeof name, "bench:async:%s:%ld", series, i);
        if (dlock_async_lock_new(w, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &wl[i])) {
            fprintf(stderr, "dlock_bench: waiter %ld: %s\n", i, dlock_async_errmsg(w));
            failed = -1;
        }
    }
    size_t handles = heap_bytes();
    for (long i = 0; !failed && i < n; i++) {
        if (dlock_async_acquire(wl[i], DLOCK_WAIT_FOREVER, LEASE_MS, count_cb, &wacq)) {
            fprintf(stderr, "dlock_bench: waiter %ld: %s\n", i, dlock_async_errmsg(w));
            failed = -1;
        }
        if ((i + 1) % batch == 0) drain(both, 2);
    }
    long subconns = 0, maxsub = 0, conns = 0;
    int64_t next_check = 0;
    while (!failed && maxsub < n && bench_now_ns() < deadline) {
        loop_once(both, 2, 10);
        if (bench_now_ns() >= next_check) {
            if (client_list(rc, &subconns, &maxsub, &conns)) failed = -1;
            next_check = bench_now_ns() + 20000000;
        }
    }
    int64_t t_pending = bench_now_ns() - t0;
    /* a little more loop so that the last replies are read */
    for (int64_t end = bench_now_ns() + 200000000; !failed && bench_now_ns() < end;)
        loop_once(both, 2, 10);
    size_t after = heap_bytes();
    if (!failed && client_list(rc, &subconns, &maxsub, &conns)) failed = -1;
    if (!failed && (maxsub < n || wacq.ok + wacq.failed)) {
        fprintf(stderr, "dlock_bench: %ld of %ld waits subscribed, %ld ended early\n", maxsub, n,
                wacq.ok + wacq.failed);
        failed = -1;
    }
    double per_wait = ((double)after - (double)before) / (double)n;
    double per_handle = ((double)handles - (double)before) / (double)n;
    /* H releases in turn */
    int64_t t1 = bench_now_ns();
    for (long i = 0; !failed && i < n; i++) {
        if (dlock_async_release(hl[i], count_cb, &hrel)) {
            fprintf(stderr, "dlock_bench: release %ld: %s\n", i, dlock_async_lock_errmsg(hl[i]));
            failed = -1;
            break;
        }
        while (hrel.ok + hrel.failed <= i && bench_now_ns() < deadline + 30000000000LL)
            loop_once(both, 2, 100);
    }
    while (!failed && wacq.ok + wacq.failed < n && bench_now_ns() < deadline + 30000000000LL)
        loop_once(both, 2, 100);
    int64_t t_served = bench_now_ns() - t1;
    if (!failed && (wacq.ok != n || hrel.ok != n)) {
        fprintf(stderr, "dlock_bench: async_waits: %ld of %ld waits served (%ld releases)\n",
                wacq.ok, n, hrel.ok);
        failed = -1;
    }
    if (!failed) {
        bench_metric("async_waits", series, "waits", (double)n, "");
        bench_metric("async_waits", series, "served", (double)wacq.ok, "");
        bench_metric("async_waits", series, "served_ok", wacq.ok == n, "");
        if (HAVE_MALLINFO2) {
            bench_metric("async_waits", series, "bytes_per_wait", per_wait, "B");
            bench_metric("async_waits", series, "handle_bytes", per_handle, "B");
            bench_metric("async_waits", series, "wait_bytes", per_wait - per_handle, "B");
        }
        bench_metric("async_waits", series, "subscribed_conns", (double)subconns, "");
        bench_metric("async_waits", series, "max_channels_per_conn", (double)maxsub, "");
        bench_metric("async_waits", series, "server_conns", (double)conns, "");
        bench_metric("async_waits", series, "pending_s", (double)t_pending / 1e9, "s");
        bench_metric("async_waits", series, "served_per_s",
                     (double)n * 1e9 / (double)t_served, "1/s");
        printf("   %ld waits served of %ld; %.0f bytes allocated per pending wait (handle "
               "included; %.1f MB in all)\n",
               wacq.ok, n, per_wait, ((double)after - (double)before) / 1e6);
        printf("   of which the handle (dlock_async_lock_new) %.0f, the pending acquire %.0f\n",
               per_handle, per_wait - per_handle);
        printf("   server: %ld connection(s) subscribed, %ld channels on the busiest; %ld "
               "connections in all (this bench's raw one, H's and W's)\n",
               subconns, maxsub, conns);
        printf("   all %ld waiting (subscribed) after %.2f s; served in turn in %.2f s "
               "(%.0f handoffs/s)\n",
               n, (double)t_pending / 1e9, (double)t_served / 1e9,
               (double)n * 1e9 / (double)t_served);
    }
    /* give the locks back, then free */
    for (long i = 0; w && i < n && wl[i]; i++)
        if (dlock_async_release(wl[i], count_cb, &wrel)) wrel.failed++;
    for (int64_t end = bench_now_ns() + 10000000000LL;
         w && wrel.ok + wrel.failed < wacq.ok && bench_now_ns() < end;)
        loop_once(both, 2, 100);
    dlock_async_client_free(h);
    dlock_async_client_free(w);
    free(hl);
    free(wl);
    if (rc) redisFree(rc);
    return failed;
}

int bench_async_waits(bench_ctx *ctx) {
    printf("\n== async_waits: one async client holding %d waits on as many names, released in "
           "turn by another\n", ctx->quick ? 1000 : 10000);
    if (run_waits(ctx, "async", ctx->quick ? 1000 : 10000)) return -1;
    return run_waits(ctx, "async-batched", BATCH);
}

/* ---- async_pairs ---- */

/* src/lock_plain.c's acquire and release scripts, copied (as bench/pairs.c
 * copies its scripts; DL_LUA_FENCE and DL_LUA_WAKE_ONE of src/services.h
 * expanded): the raw series sends the same requests as the async client,
 * with the same keys and arguments. */
static const char plain_acquire_lua[] =
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
    "if ARGV[4] == '1' then redis.call('zrem', KEYS[3], ARGV[1]) end "
    "if KEYS[4] then redis.call('set', KEYS[4], ARGV[5], 'PX', ARGV[2]) end "
    "local f = redis.pcall('incr', KEYS[2]) "
    "if type(f) ~= 'number' then f = nil end "
    "do local t = redis.pcall('time') "
    "if t[1] then local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) "
    "if not f or now > f then f = now "
    "redis.call('set', KEYS[2], string.format('%d', f)) end end end "
    "if not f then return redis.error_reply('DLOCKFENCE the fencing counter ' .. KEYS[2] .. "
    "' cannot be counted on') end "
    "return {1, f} end "
    "local p = redis.call('pttl', KEYS[1]) "
    "if ARGV[3] ~= '0' then "
    "local last = redis.call('zrange', KEYS[3], -1, -1, 'WITHSCORES') "
    "redis.call('zadd', KEYS[3], 'NX', (tonumber(last[2]) or 0) + 1, ARGV[1]) "
    "redis.call('pexpire', KEYS[3], 3 * tonumber(ARGV[3])) "
    "if p > tonumber(ARGV[3]) then p = tonumber(ARGV[3]) end end "
    "return {0, p}";
static const char plain_release_lua[] =
    "if redis.pcall('get', KEYS[1]) == ARGV[1] then "
    "if KEYS[3] then redis.call('del', KEYS[1], KEYS[3]) else redis.call('del', KEYS[1]) end "
    "while true do local w = redis.call('zpopmin', KEYS[2]) "
    "if not w[1] then break end "
    "if redis.call('pubsub', 'numsub', ARGV[2] .. w[1])[2] > 0 then "
    "redis.call('publish', ARGV[2] .. w[1], '0') break end end "
    "return 1 end "
    "if KEYS[3] then redis.call('del', KEYS[3]) end "
    "return 0";

enum { P_RAW, P_ASYNC, P_BLOCKING, P_COUNT };
static const char *const pair_series[P_COUNT] = {"raw", "async", "blocking"};

typedef struct pairs_state {
    redisContext *rc;
    char acq_sha[48], rel_sha[48];
    dlock_async_client *ac;
    dlock_async_lock *al[DEPTH];
    dlock_client *bc;
    dlock_lock *bl;
    /* async run */
    int64_t end;
    long pairs;
    int running, error;
} pairs_state;

/* slot's request, its keys made once (raw_keys): the least client work */
static char raw_key[DEPTH][64], raw_fence[DEPTH][96], raw_waiters[DEPTH][96], raw_chan[DEPTH][96];

static void raw_keys(void) {
    for (int i = 0; i < DEPTH; i++) {
        snprintf(raw_key[i], sizeof raw_key[i], "bench:async:pr:%d", i);
        snprintf(raw_fence[i], sizeof raw_fence[i], "redisson_lock_token:{%s}", raw_key[i]);
        snprintf(raw_waiters[i], sizeof raw_waiters[i], "dlock_waiters:{%s}", raw_key[i]);
        snprintf(raw_chan[i], sizeof raw_chan[i], "redisson_lock__channel:{%s}:", raw_key[i]);
    }
}

static void raw_append(pairs_state *st, int slot, int release, const char *token) {
    static char lease[16];
    if (!lease[0]) snprintf(lease, sizeof lease, "%d", LEASE_MS);
    if (release) {
        /* KEYS: lock, waiters. ARGV: token, waiter channel prefix */
        const char *argv[7] = {"EVALSHA", st->rel_sha, "2", raw_key[slot], raw_waiters[slot],
                               token, raw_chan[slot]};
        redisAppendCommandArgv(st->rc, 7, argv, NULL);
    } else {
        /* KEYS: lock, fence counter, waiters. ARGV: token, lease, recheck
         * ('0': try once), registered ('0') */
        const char *argv[10] = {"EVALSHA", st->acq_sha, "3", raw_key[slot], raw_fence[slot],
                                raw_waiters[slot], token, lease, "0", "0"};
        redisAppendCommandArgv(st->rc, 10, argv, NULL);
    }
}

/* Pairs for round_ns with DEPTH requests in flight; the count, or -1. */
static long raw_run(pairs_state *st, int64_t round_ns) {
    char token[DEPTH][33];
    int phase[DEPTH]; /* 0: acquire in flight, 1: release in flight */
    for (int i = 0; i < DEPTH; i++) {
        bench_fast_hex(token[i], 16);
        phase[i] = 0;
        raw_append(st, i, 0, token[i]);
    }
    int64_t end = bench_now_ns() + round_ns;
    long pairs = 0;
    int inflight = DEPTH, stopping = 0;
    for (int slot = 0; inflight > 0; slot = (slot + 1) % DEPTH) {
        redisReply *r = NULL;
        if (redisGetReply(st->rc, (void **)&r) != REDIS_OK || !r) {
            fprintf(stderr, "dlock_bench: raw pipeline: %s\n", st->rc->errstr);
            return -1;
        }
        int ok = phase[slot] ? (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
                             : (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                                r->element[0]->integer == 1);
        freeReplyObject(r);
        if (!ok) {
            fprintf(stderr, "dlock_bench: raw pipeline: unexpected reply (%s)\n",
                    phase[slot] ? "release" : "acquire");
            return -1;
        }
        inflight--;
        if (phase[slot]) {
            pairs++;
            if (!stopping && (pairs & 15) == 0 && bench_now_ns() >= end) stopping = 1;
            if (stopping) continue;
            bench_fast_hex(token[slot], 16);
            phase[slot] = 0;
        } else {
            phase[slot] = 1;
        }
        raw_append(st, slot, phase[slot], token[slot]);
        inflight++;
    }
    return pairs;
}

static void pair_cb(dlock_async_lock *l, int code, uint64_t fence, void *udata);

static void pair_acq_cb(dlock_async_lock *l, int code, uint64_t fence, void *udata) {
    (void)fence;
    pairs_state *st = udata;
    if (code != DLOCK_OK || dlock_async_release(l, pair_cb, st)) {
        fprintf(stderr, "dlock_bench: async acquire: %s: %s\n", dlock_strerror(code),
                dlock_async_lock_errmsg(l));
        st->error = 1;
        st->running--;
    }
}

static void pair_cb(dlock_async_lock *l, int code, uint64_t fence, void *udata) {
    (void)fence;
    pairs_state *st = udata;
    if (code != DLOCK_OK) {
        fprintf(stderr, "dlock_bench: async release: %s: %s\n", dlock_strerror(code),
                dlock_async_lock_errmsg(l));
        st->error = 1;
        st->running--;
        return;
    }
    st->pairs++;
    if (st->error || ((st->pairs & 15) == 0 && bench_now_ns() >= st->end)) st->end = 0;
    if (st->end == 0 || dlock_async_acquire(l, DLOCK_NOWAIT, LEASE_MS, pair_acq_cb, st))
        st->running--;
}

static long async_run(pairs_state *st, int64_t round_ns) {
    st->end = bench_now_ns() + round_ns;
    st->pairs = 0;
    st->running = 0;
    st->error = 0;
    for (int i = 0; i < DEPTH; i++) {
        if (dlock_async_acquire(st->al[i], DLOCK_NOWAIT, LEASE_MS, pair_acq_cb, st)) {
            fprintf(stderr, "dlock_bench: async acquire: %s\n", dlock_async_lock_errmsg(st->al[i]));
            st->error = 1;
            break;
        }
        st->running++;
    }
    while (st->running > 0) loop_once(&st->ac, 1, 1000);
    return st->error ? -1 : st->pairs;
}

static long blocking_run(pairs_state *st, int64_t round_ns) {
    int64_t end = bench_now_ns() + round_ns;
    long pairs = 0;
    do {
        int rc = dlock_acquire(st->bl, DLOCK_NOWAIT, LEASE_MS, NULL);
        if (!rc) rc = dlock_release(st->bl);
        if (rc) {
            fprintf(stderr, "dlock_bench: blocking pair: %s: %s\n", dlock_strerror(rc),
                    dlock_lock_errmsg(st->bl));
            return -1;
        }
        pairs++;
    } while (bench_now_ns() < end);
    return pairs;
}

int bench_async_pairs(bench_ctx *ctx) {
    const int rounds = ctx->quick ? 4 : MAX_ROUNDS;
    const int64_t round_ns = ctx->quick ? 100000000LL : 500000000LL;
    pairs_state st;
    memset(&st, 0, sizeof st);
    int failed = 0;
    st.rc = bench_redis_connect(ctx);
    st.ac = async_new(ctx);
    if (!st.rc || !st.ac) failed = -1;
    const char *texts[2] = {plain_acquire_lua, plain_release_lua};
    char *shas[2] = {st.acq_sha, st.rel_sha};
    for (int i = 0; !failed && i < 2; i++) {
        const char *argv[] = {"SCRIPT", "LOAD", texts[i]};
        redisReply *r = bench_redis_cmd(st.rc, 3, argv);
        if (!r) {
            failed = -1;
            break;
        }
        snprintf(shas[i], sizeof st.acq_sha, "%s", r->str ? r->str : "");
        freeReplyObject(r);
    }
    char name[64];
    raw_keys();
    for (int i = 0; !failed && i < DEPTH; i++) {
        snprintf(name, sizeof name, "bench:async:pa:%d", i);
        if (dlock_async_lock_new(st.ac, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &st.al[i])) failed = -1;
    }
    if (!failed) {
        char url[128];
        snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
        dlock_options o;
        dlock_options_init(&o);
        o.url = url;
        if (dlock_client_new(&o, &st.bc) ||
            dlock_lock_new(st.bc, "bench:async:pb", DLOCK_CSTR, DLOCK_KIND_PLAIN, &st.bl)) {
            fprintf(stderr, "dlock_bench: blocking client: %s\n", dlock_errmsg(st.bc));
            failed = -1;
        }
    }
    double rate[P_COUNT][MAX_ROUNDS];
    printf("\n== async_pairs: uncontended pairs, %d deep on one connection (%d rounds x %.2f s "
           "per series, balanced order)\n",
           DEPTH, rounds, (double)round_ns / 1e9);
    for (int round = 0; !failed && round < rounds; round++) {
        for (int k = 0; !failed && k < P_COUNT; k++) {
            int s = bench_order(round, k, P_COUNT);
            /* warm-up, then the timed run */
            long (*run)(pairs_state *, int64_t) =
                s == P_RAW ? raw_run : s == P_ASYNC ? async_run : blocking_run;
            if (run(&st, 5000000) < 0) {
                failed = -1;
                break;
            }
            int64_t t0 = bench_now_ns();
            long n = run(&st, round_ns);
            int64_t t1 = bench_now_ns();
            if (n < 0) {
                failed = -1;
                break;
            }
            rate[s][round] = (double)n * 1e9 / (double)(t1 - t0);
            if (ctx->verbose)
                printf("   round %d %-10s %10.0f pairs/s\n", round + 1, pair_series[s],
                       rate[s][round]);
        }
    }
    if (!failed) {
        printf("   %-10s %12s %12s %12s %14s\n", "series", "pairs/s", "min", "max", "ratio");
        for (int s = 0; s < P_COUNT; s++) {
            double med = bench_median_d(rate[s], (size_t)rounds), lo = rate[s][0],
                   hi = rate[s][0];
            for (int r = 1; r < rounds; r++) {
                if (rate[s][r] < lo) lo = rate[s][r];
                if (rate[s][r] > hi) hi = rate[s][r];
            }
            bench_metric("async_pairs", pair_series[s], "pairs_per_s", med, "1/s");
            bench_metric("async_pairs", pair_series[s], "pairs_per_s_min", lo, "1/s");
            bench_metric("async_pairs", pair_series[s], "pairs_per_s_max", hi, "1/s");
            char rtext[48] = "-", rb[32], lb[32], hb[32];
            if (s == P_ASYNC) {
                double ra[MAX_ROUNDS], rb2[MAX_ROUNDS];
                for (int r = 0; r < rounds; r++) {
                    ra[r] = rate[P_ASYNC][r] / rate[P_RAW][r];
                    rb2[r] = rate[P_ASYNC][r] / rate[P_BLOCKING][r];
                }
                double x = bench_median_d(ra, (size_t)rounds),
                       y = bench_median_d(rb2, (size_t)rounds);
                bench_metric("async_pairs", "async", "ratio_to_raw", x, "x");
                bench_metric("async_pairs", "async", "ratio_to_blocking", y, "x");
                snprintf(rtext, sizeof rtext, "%.2fx raw, %.1fx blk", x, y);
            }
            bench_fmt_num(rb, sizeof rb, med);
            bench_fmt_num(lb, sizeof lb, lo);
            bench_fmt_num(hb, sizeof hb, hi);
            printf("   %-10s %12s %12s %12s %14s\n", pair_series[s], rb, lb, hb, rtext);
        }
    }
    for (int i = 0; i < DEPTH; i++) dlock_async_lock_free(st.al[i]);
    dlock_async_client_free(st.ac);
    dlock_lock_free(st.bl);
    dlock_client_free(st.bc);
    if (st.rc) redisFree(st.rc);
    return failed;
}

/* ---- async_handoff ---- */

typedef struct handoff_state {
    /* async */
    dlock_async_client *ac[2]; /* holder, waiter */
    dlock_async_lock *ah, *aw;
    int done;
    int code;
    int64_t granted_ns;
    /* blocking */
    dlock_client *bc[2];
    dlock_lock *bh, *bw;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go, quit, wcode;     /* main -> waiter thread: start a wait; stop */
    int64_t wgranted_ns;     /* waiter thread -> main; 0 while waiting */
} handoff_state;

static void grant_cb(dlock_async_lock *l, int code, uint64_t fence, void *udata) {
    (void)l;
    (void)fence;
    handoff_state *st = udata;
    st->granted_ns = bench_now_ns();
    st->code = code;
    st->done = 1;
}

static void done_cb(dlock_async_lock *l, int code, uint64_t fence, void *udata) {
    (void)l;
    (void)fence;
    handoff_state *st = udata;
    st->code = code;
    st->done = 1;
}

/* runs the loop until st->done (at most 10 s); the code, or -1 */
static int async_wait_done(handoff_state *st) {
    int64_t end = bench_now_ns() + 10000000000LL;
    while (!st->done && bench_now_ns() < end) loop_once(st->ac, 2, 100);
    return st->done ? st->code : -1;
}

/* the waiter thread of the blocking series: on each go, one blocking acquire,
 * its time, then a release when main says go again */
static void *blocking_waiter(void *arg) {
    handoff_state *st = arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->go && !st->quit) pthread_cond_wait(&st->cv, &st->mu);
        if (st->quit) break;
        st->go = 0;
        pthread_mutex_unlock(&st->mu);
        int rc = dlock_acquire(st->bw, 20000, LEASE_MS, NULL);
        int64_t t = bench_now_ns();
        if (!rc) rc = dlock_release(st->bw);
        pthread_mutex_lock(&st->mu);
        st->wcode = rc;
        st->wgranted_ns = t;
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* waits (driving the async loop when async) until the server shows lock
 * name's waiter, then SETTLE_US more; 0 or -1 */
static int wait_waiter(redisContext *rc, handoff_state *st, int async, const char *name) {
    int64_t end = bench_now_ns() + 10000000000LL;
    for (;;) {
        long long w = bench_lock_waiters(rc, name);
        if (w < 0) return -1;
        if (w > 0) break;
        if (bench_now_ns() > end) {
            fprintf(stderr, "dlock_bench: async_handoff: no waiter on %s\n", name);
            return -1;
        }
        if (async) loop_once(st->ac, 2, 1);
        else bench_sleep_us(200);
    }
    for (int64_t e = bench_now_ns() + SETTLE_US * 1000LL; bench_now_ns() < e;) {
        if (async) loop_once(st->ac, 2, 1);
        else bench_sleep_us(200);
    }
    return 0;
}

static int handoff_async_one(redisContext *rc, handoff_state *st, int64_t *ns) {
    st->done = 0;
    if (dlock_async_acquire(st->ah, DLOCK_NOWAIT, LEASE_MS, done_cb, st) ||
        async_wait_done(st) != DLOCK_OK) {
        fprintf(stderr, "dlock_bench: async holder: %s\n", dlock_async_lock_errmsg(st->ah));
        return -1;
    }
    st->done = 0;
    if (dlock_async_acquire(st->aw, DLOCK_WAIT_FOREVER, LEASE_MS, grant_cb, st)) return -1;
    if (wait_waiter(rc, st, 1, "bench:async:ho")) return -1;
    if (st->done) {
        fprintf(stderr, "dlock_bench: async waiter granted early\n");
        return -1;
    }
    /* the release's own callback goes to a counter: the grant is what counts */
    op_count rel = {0};
    int64_t t0 = bench_now_ns();
    if (dlock_async_release(st->ah, count_cb, &rel)) return -1;
    if (async_wait_done(st) != DLOCK_OK) {
        fprintf(stderr, "dlock_bench: async waiter: %s\n", dlock_async_lock_errmsg(st->aw));
        return -1;
    }
    *ns = st->granted_ns - t0;
    for (int64_t end = bench_now_ns() + 10000000000LL; !rel.ok && !rel.failed &&
                                                        bench_now_ns() < end;)
        loop_once(st->ac, 2, 100);
    st->done = 0;
    if (rel.ok != 1 || dlock_async_release(st->aw, done_cb, st) ||
        async_wait_done(st) != DLOCK_OK)
        return -1;
    return 0;
}

static int handoff_blocking_one(redisContext *rc, handoff_state *st, int64_t *ns) {
    if (dlock_acquire(st->bh, DLOCK_NOWAIT, LEASE_MS, NULL)) {
        fprintf(stderr, "dlock_bench: blocking holder: %s\n", dlock_lock_errmsg(st->bh));
        return -1;
    }
    pthread_mutex_lock(&st->mu);
    st->wgranted_ns = 0;
    st->go = 1;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    if (wait_waiter(rc, st, 0, "bench:async:hb")) return -1;
    int64_t t0 = bench_now_ns();
    if (dlock_release(st->bh)) return -1;
    pthread_mutex_lock(&st->mu);
    while (!st->wgranted_ns) pthread_cond_wait(&st->cv, &st->mu);
    int64_t t1 = st->wgranted_ns;
    int code = st->wcode;
    pthread_mutex_unlock(&st->mu);
    if (code) {
        fprintf(stderr, "dlock_bench: blocking waiter: %s\n", dlock_strerror(code));
        return -1;
    }
    *ns = t1 - t0;
    return 0;
}

int bench_async_handoff(bench_ctx *ctx) {
    const int n = ctx->quick ? 20 : 300, warmup = 3;
    handoff_state st;
    memset(&st, 0, sizeof st);
    pthread_mutex_init(&st.mu, NULL);
    pthread_cond_init(&st.cv, NULL);
    int failed = 0, thread = 0;
    pthread_t th;
    redisContext *rc = bench_redis_connect(ctx);
    st.ac[0] = async_new(ctx);
    st.ac[1] = async_new(ctx);
    if (!rc || !st.ac[0] || !st.ac[1] ||
        dlock_async_lock_new(st.ac[0], "bench:async:ho", DLOCK_CSTR, DLOCK_KIND_PLAIN, &st.ah) ||
        dlock_async_lock_new(st.ac[1], "bench:async:ho", DLOCK_CSTR, DLOCK_KIND_PLAIN, &st.aw))
        failed = -1;
    char url[128];
    snprintf(url, sizeof url, "redis://%s:%d", ctx->host, ctx->port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    for (int i = 0; !failed && i < 2; i++)
        if (dlock_client_new(&o, &st.bc[i])) failed = -1;
    if (!failed &&
        (dlock_lock_new(st.bc[0], "bench:async:hb", DLOCK_CSTR, DLOCK_KIND_PLAIN, &st.bh) ||
         dlock_lock_new(st.bc[1], "bench:async:hb", DLOCK_CSTR, DLOCK_KIND_PLAIN, &st.bw)))
        failed = -1;
    if (!failed) {
        if (pthread_create(&th, NULL, blocking_waiter, &st)) failed = -1;
        else thread = 1;
    }
    bench_samples smp[2];
    memset(smp, 0, sizeof smp);
    static const char *const names[2] = {"async", "blocking"};
    printf("\n== async_handoff: release to the waiter's grant, async vs blocking API (%d "
           "handoffs each, alternating)\n", n);
    for (int i = 0; !failed && i < n + warmup; i++) {
        for (int k = 0; !failed && k < 2; k++) {
            int s = (i + k) % 2;
            int64_t ns = 0;
            failed = s == 0 ? handoff_async_one(rc, &st, &ns) : handoff_blocking_one(rc, &st, &ns);
            if (!failed && i >= warmup && bench_samples_add(&smp[s], ns)) failed = -1;
        }
    }
    if (!failed) {
        printf("   %-10s %10s %10s %10s\n", "series", "p50", "p99", "max");
        double p50[2];
        for (int s = 0; s < 2; s++) {
            int64_t mx = bench_samples_max(&smp[s]);
            p50[s] = (double)bench_samples_quantile(&smp[s], 0.50) / 1e3;
            double p99 = (double)bench_samples_quantile(&smp[s], 0.99) / 1e3;
            bench_metric("async_handoff", names[s], "p50_us", p50[s], "us");
            bench_metric("async_handoff", names[s], "p99_us", p99, "us");
            bench_metric("async_handoff", names[s], "max_us", (double)mx / 1e3, "us");
            printf("   %-10s %7.1f us %7.1f us %7.1f us\n", names[s], p50[s], p99,
                   (double)mx / 1e3);
        }
        bench_metric("async_handoff", "async", "p50_ratio_to_blocking", p50[0] / p50[1], "x");
        printf("   async / blocking p50: %.2fx\n", p50[0] / p50[1]);
    }
    if (thread) {
        pthread_mutex_lock(&st.mu);
        st.quit = 1;
        pthread_cond_broadcast(&st.cv);
        pthread_mutex_unlock(&st.mu);
        pthread_join(th, NULL);
    }
    for (int s = 0; s < 2; s++) bench_samples_free(&smp[s]);
    dlock_async_lock_free(st.ah);
    dlock_async_lock_free(st.aw);
    dlock_async_client_free(st.ac[0]);
    dlock_async_client_free(st.ac[1]);
    dlock_lock_free(st.bh);
    dlock_lock_free(st.bw);
    dlock_client_free(st.bc[0]);
    dlock_client_free(st.bc[1]);
    if (rc) redisFree(rc);
    pthread_mutex_destroy(&st.mu);
    pthread_cond_destroy(&st.cv);
    return failed;
}
