/* Scenario "backends" (issue 9): every backend beside Redis, in the same run.
 *
 *   dlock_bench --port P --backend-urls NAME=URL,NAME=URL,...
 *
 * e.g. postgres=postgres://...,mysql=mysql://...,mysql-table=mysql://...?lock=table,
 * zk=zk://127.0.0.1:P,etcd=etcd://127.0.0.1:P (bench/run.sh starts private
 * servers for what is installed and passes their URLs). "redis" is the
 * bench's own server (redis://host:port) unless the list names another.
 * Known backends without a URL are skipped with the reason printed; without
 * --backend-urls at all the scenario is skipped (the quick CI mode).
 *
 * Two measurements, one handle per backend, DLOCK_WATCHDOG leases (the one
 * lease every backend takes: the session-held ones, PostgreSQL, MySQL
 * GET_LOCK and ZooKeeper, answer an explicit lease_ms with DLOCK_ENOTSUP):
 *
 *   pairs    uncontended dlock_acquire(DLOCK_NOWAIT) + dlock_release on one
 *            handle, in short rounds over the backends in bench_order (so that
 *            the machine's slow and fast phases hit all alike); pairs/s is
 *            the median of the rounds, the ratio the median of the per-round
 *            ratios to Redis. Backends that take an explicit lease also run
 *            as "<name>-lease" (10 s lease, no watchdog registration).
 *   handoff  A (this process) holds; B, a process forked before any client
 *            existed here, is blocked in dlock_acquire(wait 20 s); A reads
 *            CLOCK_MONOTONIC just before dlock_release, B just after its
 *            dlock_acquire returns and sends it through a pipe. Before each
 *            release A waits until B is seen waiting where the server shows
 *            it (Redis: B's own unlock channel; ZooKeeper and etcd: B's
 *            node / key behind A's, by dlock_inspect), then a settle time
 *            drawn uniformly in [SETTLE_MIN, SETTLE_MAX] ms, the same draw for
 *            every backend of a round: B is then asleep in its wait (the
 *            server-side wait of PostgreSQL and GET_LOCK starts one round
 *            trip after the call), and MySQL's table mode, which polls (4 ms
 *            doubling to 100 ms), is caught at a random point of its poll
 *            schedule. Handoffs go round-robin over the backends.
 *
 * Full mode only (--quick prints a SKIP line for them):
 *
 *   contention  K = 8 and 32 processes on one lock, each acquiring (wait
 *            120 s), GET + SET of a counter in the bench's Redis on its own
 *            connection, releasing: dlock on ZooKeeper and etcd (bench_procs
 *            children, forked while this process has no client), then the
 *            peers; 3 rounds x 1 s per series in balanced order; acq/s (the
 *            median of the rounds, a round ending with its last critical
 *            section), waits (p50, p99, longest), the exact counter.
 *   peers    kazoo's Lock beside zk, python-etcd3's Lock beside etcd, on the
 *            same servers (bench/peers/coord_worker.py under
 *            /usr/bin/python3, driven by the line protocol of the Redis peers
 *            through bench_peer_*): their pairs series in the pairs rounds
 *            (timed in the worker), the contention series above, and their
 *            handoffs in the round-robin (two workers, A holding and B
 *            waiting; B says "waiting" just before its blocking acquire and
 *            A releases after the round's settle time plus 10 ms, as nothing
 *            shows B queued from outside). A peer that cannot run prints
 *            "SKIP <peer>: <reason>" and the rest goes on. Then the ratios
 *            dlock / peer: pairs/s (median of the per-round ratios), pair
 *            p50, acq/s and longest wait at K = 8 and 32, handoff p50.
 *   floor    beside etcd, when the bench is built with libcurl: the raw
 *            floor of an uncontended pair on the same gateway (as
 *            bench/etcd_breakdown.c's): a session lease granted once, then
 *            per pair one txn "create-if-absent under the lease + read the
 *            oldest key of the prefix" and one delete guarded by the key's
 *            create revision, on one reused connection, in the pairs rounds
 *            as "etcd-floor"; then dlock / floor (median of the per-round
 *            ratios) and floor / python-etcd3.
 *            Beside zk, when the bench is built with libzookeeper_mt: the
 *            recipe's minimum of an uncontended pair on one session of the
 *            C client's synchronous API, no watch: a create (ephemeral
 *            sequential), a get-children of the parent, a delete of the
 *            node, at dlock's parent depth and node name length, its host
 *            list resolved at most once a second as dlock's (see
 *            zk_floor_open), in the pairs rounds as "zk-floor"; then
 *            dlock / floor and floor / kazoo as for etcd.
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

#ifdef DLOCK_BENCH_HAVE_CURL
#include <curl/curl.h>
#endif
#ifdef DLOCK_BENCH_HAVE_ZK
#include <zookeeper/zookeeper.h>
#endif

#define MAX_BACKENDS 12
#define MAX_SERIES (2 * MAX_BACKENDS)
#define MAX_ROUNDS 8
#define LEASE_MS 10000
#define WAIT_MS 20000
#define PIPE_TIMEOUT_MS 25000
#define WARMUP_PAIRS 20
#define HANDOFF_WARMUP 3

static const char *const known[] = {"redis", "postgres", "mysql", "mysql-table", "zk", "etcd"};
#define NKNOWN (sizeof known / sizeof known[0])

typedef struct backend {
    char name[32];
    char url[512];
    int waiter_check;      /* 0 settle only, 1 redis channel, 2 dlock_inspect waiters */
    /* B, the waiter process */
    pid_t pid;
    int wfd, rfd;
    /* A: this process */
    dlock_client *client;
    dlock_lock *lock;      /* pairs and the holder's side of the handoffs */
    int has_lease;         /* an explicit lease is accepted: "<name>-lease" series */
    int ok;                /* still measured (0: skipped or failed) */
    bench_samples handoff;
} backend;

static const char pair_lock[] = "bench:backends:pairs";
static const char handoff_lock[] = "bench:backends:handoff";

static int new_client(const char *url, dlock_client **out, char *why, size_t whylen) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    int rc = dlock_client_new(&o, out);
    if (rc) {
        snprintf(why, whylen, "dlock_client_new: %s: %s", dlock_strerror(rc),
                 *out ? dlock_errmsg(*out) : "out of memory");
        dlock_client_free(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- B: the waiter (a child process) ---- */

/* Answers 'r' once connected (or 'x'), then per 'g': 'w' just before
 * dlock_acquire, then the time it held the lock (or -1), after releasing. */
static int waiter_main(const char *url, int cmd_fd, int res_fd) {
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    char why[600] = "";
    int failed = new_client(url, &c, why, sizeof why) != DLOCK_OK;
    if (!failed && dlock_lock_new(c, handoff_lock, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l)) {
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

static int start_waiter(backend *b) {
    int a2b[2], b2a[2];
    b->pid = -1;
    b->wfd = b->rfd = -1;
    if (pipe(a2b)) return -1;
    if (pipe(b2a)) {
        close(a2b[0]), close(a2b[1]);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("dlock_bench: fork");
        close(a2b[0]), close(a2b[1]), close(b2a[0]), close(b2a[1]);
        return -1;
    }
    if (pid == 0) {
        close(a2b[1]);
        close(b2a[0]);
        _exit(waiter_main(b->url, a2b[0], b2a[1]));
    }
    close(a2b[0]);
    close(b2a[1]);
    b->pid = pid;
    b->wfd = a2b[1];
    b->rfd = b2a[0];
    return 0;
}

static int stop_waiter(backend *b, int kill_it) {
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

/* ---- the list of backends ---- */

static int parse_urls(const bench_ctx *ctx, backend *bk, int *n) {
    *n = 0;
    for (const char *p = ctx->backend_urls; p && *p;) {
        size_t l = strcspn(p, ",");
        const char *eq = memchr(p, '=', l);
        if (!eq || eq == p || (size_t)(eq - p) >= sizeof bk[0].name ||
            l - (size_t)(eq - p) - 1 >= sizeof bk[0].url) {
            fprintf(stderr, "dlock_bench: --backend-urls: bad entry '%.*s' (NAME=URL)\n", (int)l,
                    p);
            return -1;
        }
        if (*n == MAX_BACKENDS) {
            fprintf(stderr, "dlock_bench: --backend-urls: more than %d backends\n",
                    MAX_BACKENDS);
            return -1;
        }
        backend *b = &bk[(*n)++];
        memset(b, 0, sizeof *b);
        snprintf(b->name, sizeof b->name, "%.*s", (int)(eq - p), p);
        snprintf(b->url, sizeof b->url, "%.*s", (int)(l - (size_t)(eq - p) - 1), eq + 1);
        for (int i = 0; i < *n - 1; i++)
            if (!strcmp(bk[i].name, b->name)) {
                fprintf(stderr, "dlock_bench: --backend-urls: '%s' twice\n", b->name);
                return -1;
            }
        p += l;
        if (*p == ',') p++;
    }
    /* Redis first: the base of the ratios (the bench's server unless named) */
    int have_redis = -1;
    for (int i = 0; i < *n; i++)
        if (!strcmp(bk[i].name, "redis")) have_redis = i;
    if (have_redis < 0 && *n == MAX_BACKENDS) {
        fprintf(stderr, "dlock_bench: --backend-urls: more than %d backends\n", MAX_BACKENDS);
        return -1;
    }
    if (have_redis < 0) {
        memmove(&bk[1], &bk[0], (size_t)*n * sizeof *bk);
        memset(&bk[0], 0, sizeof *bk);
        snprintf(bk[0].name, sizeof bk[0].name, "redis");
        snprintf(bk[0].url, sizeof bk[0].url, "redis://%s:%d", ctx->host, ctx->port);
        bk[0].waiter_check = 1;
        (*n)++;
    } else if (have_redis > 0) {
        backend t = bk[have_redis];
        memmove(&bk[1], &bk[0], (size_t)have_redis * sizeof *bk);
        bk[0] = t;
    }
    for (int i = 0; i < *n; i++) {
        backend *b = &bk[i];
        if (!strcmp(b->name, "zk") || !strcmp(b->name, "etcd")) b->waiter_check = 2;
        b->pid = -1;
        b->ok = 1;
    }
    for (size_t k = 0; k < NKNOWN; k++) {
        int found = 0;
        for (int i = 0; i < *n; i++) found |= !strcmp(bk[i].name, known[k]);
        if (!found)
            printf("   SKIP %s: no URL given (--backend-urls %s=URL)\n", known[k], known[k]);
    }
    return 0;
}

/* ---- peers: kazoo's and python-etcd3's Lock (bench/peers/coord_worker.py) ---- */

typedef struct peerst {
    const char *name;      /* "kazoo" */
    const char *kind;      /* the worker's first argument */
    const char *backend;   /* the dlock backend it stands beside */
    backend *b;            /* that backend (its server), NULL: skipped */
    char server[300];      /* host:port */
    char version[96];
    int ok;
    bench_peer a, w;       /* A: pairs and the holder of the handoffs; B: the waiter */
    bench_samples handoff;
} peerst;

#define NPEERS 2
#define PEER_LINE_MS 60000
#define PEER_SETTLE_EXTRA_US 10000

/* host:port of a zk:// or etcd:// URL */
static void url_server(const char *url, char *out, size_t len) {
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    size_t n = strcspn(p, "/?");
    snprintf(out, len, "%.*s", (int)n, p);
}

/* Starts one worker of pe. 0 ok, 1 skipped (reason printed, pe->ok = 0), -1 failed. */
static int peer_spawn_one(const bench_ctx *ctx, peerst *pe, bench_peer *w) {
    char script[1024], rport[16];
    snprintf(script, sizeof script, "%s/coord_worker.py", bench_peers_dir());
    snprintf(rport, sizeof rport, "%d", ctx->port);
    char *const argv[] = {"/usr/bin/python3", script, (char *)pe->kind, "--server", pe->server,
                          "--redis-host", (char *)ctx->host, "--redis-port", rport, NULL};
    if (bench_peer_exec(w, argv)) return -1;
    char *l = bench_peer_line(w, PEER_LINE_MS);
    if (!l || strncmp(l, "hello ", 6)) {
        if (pe->ok)
            printf("   SKIP %s: %s\n", pe->name,
                   !l                       ? "the worker ended or said no hello within 60 s"
                   : !strncmp(l, "skip ", 5) ? l + 5
                                             : l);
        pe->ok = 0;
        bench_peer_stop(w);
        return 1;
    }
    snprintf(pe->version, sizeof pe->version, "%s", l + 6);
    if (bench_peer_clock(w, pe->name)) {
        bench_peer_stop(w);
        return -1;
    }
    return 0;
}

/* "ok <a> <b> <us> <us> ...": the us go to out (as ns) when out is not NULL. */
static int parse_ok(char *l, long long *a, long long *b, bench_samples *out) {
    char *e;
    if (!l || strncmp(l, "ok ", 3)) return -1;
    l += 3;
    *a = strtoll(l, &e, 10);
    if (e == l) return -1;
    l = e;
    *b = strtoll(l, &e, 10);
    if (e == l) return -1;
    for (l = e;;) {
        long long v = strtoll(l, &e, 10);
        if (e == l) break;
        l = e;
        if (out && bench_samples_add(out, (int64_t)v * 1000)) return -1;
    }
    return 0;
}

static char *peer_reply(peerst *pe, bench_peer *w, int timeout_ms, const char *what) {
    char *l = bench_peer_line(w, timeout_ms);
    if (!l) fprintf(stderr, "dlock_bench: backends: %s: no reply to %s\n", pe->name, what);
    else if (strncmp(l, "ok", 2) && strncmp(l, "got", 3) && strncmp(l, "waiting", 7)) {
        fprintf(stderr, "dlock_bench: backends: %s: %s: %s\n", pe->name, what, l);
        return NULL;
    }
    return l;
}

/* ---- contention: K processes on one lock, a Redis counter under it ---- */

/* dlock on ZooKeeper and etcd (bench_procs children) and the peers (K
 * workers each): each acquires (no time limit), GET + SET of a counter in
 * the bench's Redis on its own connection, releases. */
#define MAX_CS (2 + NPEERS)
static const char *cur_url, *cur_series;
static int cur_k;

typedef struct cworker {
    dlock_client *c;
    dlock_lock *l;
    redisContext *rc;
    char counter[128];
} cworker;

static void cs_names(const char *series, int k, char *lock, char *counter, size_t len) {
    snprintf(lock, len, "bench:backends:contention:%s-k%d", series, k);
    snprintf(counter, len, "bench:backends:counter:%s-k%d", series, k);
}

static void cw_teardown(void *state) {
    cworker *w = state;
    dlock_lock_free(w->l);
    dlock_client_free(w->c);
    if (w->rc) redisFree(w->rc);
    free(w);
}

static int cw_setup(const bench_ctx *ctx, int idx, void **state) {
    (void)idx;
    cworker *w = calloc(1, sizeof *w);
    if (!w) return -1;
    *state = w;
    char lock[128], why[600];
    cs_names(cur_series, cur_k, lock, w->counter, sizeof lock);
    w->rc = bench_redis_connect(ctx);
    if (!w->rc) return -1;
    if (new_client(cur_url, &w->c, why, sizeof why)) {
        fprintf(stderr, "dlock_bench: backends: contention: %s\n", why);
        return -1;
    }
    return dlock_lock_new(w->c, lock, DLOCK_CSTR, DLOCK_KIND_PLAIN, &w->l) ? -1 : 0;
}

static int cw_op(void *state, int64_t *wait_ns) {
    cworker *w = state;
    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(w->l, 120000, DLOCK_WATCHDOG, NULL);
    if (rc) {
        fprintf(stderr, "dlock_bench: backends: contention acquire: %s: %s\n",
                dlock_strerror(rc), dlock_lock_errmsg(w->l));
        return -1;
    }
    *wait_ns = bench_now_ns() - t0;
    long long v = 0;
    redisReply *r = redisCommand(w->rc, "GET %s", w->counter);
    int ok = r && (r->type == REDIS_REPLY_NIL || r->type == REDIS_REPLY_STRING);
    if (ok && r->type == REDIS_REPLY_STRING) v = atoll(r->str);
    if (r) freeReplyObject(r);
    if (ok) {
        r = redisCommand(w->rc, "SET %s %lld", w->counter, v + 1);
        ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
    }
    if (dlock_release(w->l)) return -1;
    return ok ? 0 : -1;
}

static long long get_int(redisContext *rc, const char *key) {
    redisReply *r = redisCommand(rc, "GET %s", key);
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) v = atoll(r->str);
    else if (r && r->type == REDIS_REPLY_NIL) v = 0;
    if (r) freeReplyObject(r);
    return v;
}

/* A contention series' figures at one K. */
typedef struct cs_result {
    int have;
    double rate;           /* acq/s, median of the rounds */
    double wait_max_ms, wait_p50_ms;
    int counter_ok;
} cs_result;

/* One K: dlock on every backend of dl (zk, etcd) and every peer that runs. */
static int contention_k(const bench_ctx *ctx, redisContext *rc, backend **dl, int ndl,
                        peerst *pe, int k, cs_result *res) {
    enum { ROUNDS = 3 };
    const int64_t round_ns = 1000000000LL;
    int ns = ndl + NPEERS;
    bench_procs procs[2];
    bench_peer *ws[NPEERS] = {0};
    bench_samples waits[MAX_CS];
    double rate[MAX_CS][ROUNDS];
    int64_t ops[32], fin[32];
    char name[MAX_CS][48], lock[128], counter[128];
    int failed = 0;
    memset(procs, 0, sizeof procs);
    memset(waits, 0, sizeof waits);
    for (int s = 0; s < ns; s++) {
        res[s].have = 0;
        res[s].counter_ok = 1;
        snprintf(name[s], sizeof name[s], "%s%s", s < ndl ? "dlock-" : "",
                 s < ndl ? dl[s]->name : pe[s - ndl].name);
    }
    static const bench_procs_spec spec = {cw_setup, cw_op, cw_teardown, 1};
    for (int s = 0; !failed && s < ndl; s++) {
        cur_url = dl[s]->url;
        cur_series = name[s];
        cur_k = k;
        if (bench_procs_start(ctx, &spec, k, &procs[s])) {
            printf("   %s-k%d: FAILED (its workers did not start; see above)\n", name[s], k);
            continue;
        }
        res[s].have = 1;
    }
    for (int i = 0; i < NPEERS; i++) {
        if (!pe[i].ok) continue;
        ws[i] = calloc((size_t)k, sizeof *ws[i]);
        if (!ws[i]) return -1;
        int r = 0, j = 0;
        for (; j < k && !r; j++) r = peer_spawn_one(ctx, &pe[i], &ws[i][j]);
        if (r) {
            for (int m = 0; m < j - 1; m++) bench_peer_stop(&ws[i][m]);
            free(ws[i]);
            ws[i] = NULL;
            if (r < 0) printf("   %s-k%d: FAILED (a worker did not start)\n", name[ndl + i], k);
            continue;
        }
        res[ndl + i].have = 1;
    }
    for (int round = 0; !failed && round < ROUNDS; round++) {
        for (int j = 0; !failed && j < ns; j++) {
            int s = bench_order(round, j, ns);
            if (!res[s].have) continue;
            cs_names(name[s], k, lock, counter, sizeof lock);
            redisReply *r = redisCommand(rc, "SET %s 0", counter);
            if (r) freeReplyObject(r);
            int64_t start = bench_now_ns() + 50000000, end = start + round_ns;
            int bad = 0;
            if (s < ndl) {
                bad = bench_procs_round(&procs[s], start, end, ops, fin, &waits[s]);
            } else {
                bench_peer *w = ws[s - ndl];
                for (int i = 0; i < k && !bad; i++)
                    bad = bench_peer_send(&w[i], "contend %s %s %lld %lld", lock, counter,
                                          (long long)(start + w[i].offset),
                                          (long long)(end + w[i].offset));
                int tmo = (int)((end - bench_now_ns()) / 1000000) + 2 * PEER_LINE_MS;
                for (int i = 0; i < k && !bad; i++) {
                    long long n, f;
                    char *l = peer_reply(&pe[s - ndl], &w[i], tmo, "contend");
                    bad = parse_ok(l, &n, &f, &waits[s]);
                    ops[i] = n;
                    fin[i] = f - w[i].offset;
                }
            }
            if (bad) {
                printf("   %s-k%d: FAILED in round %d (see above)\n", name[s], k, round + 1);
                res[s].have = 0;
                if (s < ndl) failed = 1; /* dlock's failure fails the scenario */
                continue;
            }
            int64_t sum = 0, last = start;
            for (int i = 0; i < k; i++) {
                sum += ops[i];
                if (fin[i] > last) last = fin[i];
            }
            rate[s][round] = (double)sum * 1e9 / (double)(last - start);
            long long got = get_int(rc, counter);
            if (got != sum) {
                printf("   FAIL %s-k%d round %d: counter %lld != %lld acquisitions\n", name[s], k,
                       round + 1, got, (long long)sum);
                res[s].counter_ok = 0;
                if (s < ndl) failed = 1;
            }
            if (ctx->verbose)
                printf("   round %d %s-k%d %.0f acq/s\n", round + 1, name[s], k, rate[s][round]);
        }
    }
    for (int s = 0; s < ndl; s++)
        if (procs[s].k && bench_procs_stop(&procs[s], failed) && !failed) failed = 1;
    for (int i = 0; i < NPEERS; i++) {
        if (!ws[i]) continue;
        for (int j = 0; j < k; j++) bench_peer_stop(&ws[i][j]);
        free(ws[i]);
    }
    for (int s = 0; s < ns; s++) {
        if (res[s].have && !failed) {
            char sn[64];
            snprintf(sn, sizeof sn, "%s-k%d", name[s], k);
            res[s].rate = bench_median_d(rate[s], ROUNDS);
            res[s].wait_p50_ms = (double)bench_samples_quantile(&waits[s], 0.5) / 1e6;
            res[s].wait_max_ms = (double)bench_samples_max(&waits[s]) / 1e6;
            double p99 = (double)bench_samples_quantile(&waits[s], 0.99) / 1e6;
            bench_metric("backends", sn, "acq_per_s", res[s].rate, "1/s");
            bench_metric("backends", sn, "wait_p50_us", res[s].wait_p50_ms * 1e3, "us");
            bench_metric("backends", sn, "wait_p99_us", p99 * 1e3, "us");
            bench_metric("backends", sn, "wait_max_us", res[s].wait_max_ms * 1e3, "us");
            bench_metric("backends", sn, "counter_ok", res[s].counter_ok, "");
            char rb[32];
            bench_fmt_num(rb, sizeof rb, res[s].rate);
            printf("   %-22s %9s %9.1f ms %9.1f ms %9.1f ms %6s\n", sn, rb, res[s].wait_p50_ms,
                   p99, res[s].wait_max_ms, res[s].counter_ok ? "exact" : "FAIL");
        } else {
            res[s].have = 0;
        }
        bench_samples_free(&waits[s]);
    }
    return failed ? -1 : 0;
}

/* ---- the etcd floor: the minimum requests of a pair, raw ---- */

#ifdef DLOCK_BENCH_HAVE_CURL
typedef struct floor_client {
    CURL *h;
    char base[320];        /* http://host:port */
    char *ans;
    size_t n;
    long long lease;
} floor_client;

static floor_client fl;
static const char floor_key[] = "YmVuY2gvYmFja2VuZHMvZmxvb3Ivdy9r"; /* bench/backends/floor/w/k */
static const char floor_pfx[] = "YmVuY2gvYmFja2VuZHMvZmxvb3Iv";     /* bench/backends/floor/ */
static const char floor_end[] = "YmVuY2gvYmFja2VuZHMvZmxvb3Iw";     /* bench/backends/floor0 */

static size_t floor_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    (void)ud;
    size_t len = size * nmemb;
    char *p = realloc(fl.ans, fl.n + len + 1);
    if (!p) return 0;
    memcpy(p + fl.n, ptr, len);
    fl.ans = p;
    fl.n += len;
    fl.ans[fl.n] = '\0';
    return len;
}

/* POSTs body to path; the answer in fl.ans, NULL on failure. */
static const char *floor_call(const char *path, const char *body) {
    char url[400];
    snprintf(url, sizeof url, "%s%s", fl.base, path);
    fl.n = 0;
    curl_easy_reset(fl.h);
    curl_easy_setopt(fl.h, CURLOPT_URL, url);
    curl_easy_setopt(fl.h, CURLOPT_WRITEFUNCTION, floor_data);
    curl_easy_setopt(fl.h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(fl.h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(fl.h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(fl.h, CURLOPT_POSTFIELDS, body);
    CURLcode rc = curl_easy_perform(fl.h);
    if (rc != CURLE_OK || !fl.ans) {
        fprintf(stderr, "dlock_bench: backends: etcd-floor: %s: %s\n", path,
                rc != CURLE_OK ? curl_easy_strerror(rc) : "no answer");
        return NULL;
    }
    return fl.ans;
}

/* A gateway int64 field ("name":"123") of an answer, 0 when missing. */
static long long floor_field(const char *s, const char *name) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", name);
    const char *p = s ? strstr(s, pat) : NULL;
    if (!p) return 0;
    p += strlen(pat);
    if (*p == '"') p++;
    return strtoll(p, NULL, 10);
}

/* etcd://host:port[/] of url: the floor's client and its session lease. */
static int floor_open(const char *url) {
    const char *p = strstr(url, "://");
    if (!p || strchr(url, ',') || !strncmp(url, "etcds", 5)) return -1;
    snprintf(fl.base, sizeof fl.base, "http://%.*s", (int)strcspn(p + 3, "/?"), p + 3);
    if (!strchr(fl.base + 7, ':')) strncat(fl.base, ":2379", sizeof fl.base - strlen(fl.base) - 1);
    if (!(fl.h = curl_easy_init())) return -1;
    fl.lease = floor_field(floor_call("/v3/lease/grant", "{\"TTL\":\"60\"}"), "ID");
    return fl.lease ? 0 : -1;
}

static void floor_close(void) {
    if (!fl.h) return;
    char body[64];
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", fl.lease);
    floor_call("/v3/lease/revoke", body);
    curl_easy_cleanup(fl.h);
    free(fl.ans);
    memset(&fl, 0, sizeof fl);
}

/* One pair: the create-if-absent txn reading the oldest key, the guarded delete. */
static int floor_pair(void) {
    char body[768];
    snprintf(body, sizeof body,
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"0\"}],"
             "\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"eA==\",\"lease\":\"%lld\"}},"
             "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\",\"sort_order\":\"ASCEND\","
             "\"sort_target\":\"CREATE\",\"limit\":\"1\"}}]}",
             floor_key, floor_key, fl.lease, floor_pfx, floor_end);
    const char *r = floor_call("/v3/kv/txn", body);
    if (!r || !strstr(r, "\"succeeded\":true")) {
        if (r) fprintf(stderr, "dlock_bench: backends: etcd-floor: txn: %.200s\n", r);
        return -1;
    }
    long long rev = floor_field(r, "revision");
    snprintf(body, sizeof body,
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"%lld\"}],"
             "\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}]}",
             floor_key, rev, floor_key);
    r = floor_call("/v3/kv/txn", body);
    if (!r || !strstr(r, "\"succeeded\":true")) {
        if (r) fprintf(stderr, "dlock_bench: backends: etcd-floor: delete: %.200s\n", r);
        return -1;
    }
    return 0;
}
#else
static int floor_pair(void) { return -1; }
#endif

/* ---- the ZooKeeper floor: the recipe's minimum requests of a pair, raw ---- */

#ifdef DLOCK_BENCH_HAVE_ZK
/* The floor's lock name: as long as pair_lock, so that its parent's name
 * (the name in hex, as dlock's) is as long as dlock's. */
static const char zk_floor_name[] = "bench:backends:floor";
_Static_assert(sizeof zk_floor_name == sizeof pair_lock, "the floor's name is dlock's length");

typedef struct zk_floor {
    zhandle_t *zh;
    char parent[600];      /* {chroot}/dlock/floor/{hex(zk_floor_name)} */
    char prefix[680];      /* parent/write-{32 hex digits}- */
} zk_floor;

static zk_floor zf;

static void zk_floor_nolog(const char *msg) { (void)msg; }

/* The session's watcher: the floor sets no watch; state changes are polled. */
static void zk_floor_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx) {
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

static int zk_floor_fail(const char *what, int rc) {
    fprintf(stderr, "dlock_bench: backends: zk-floor: %s: %s\n", what, zerror(rc));
    return -1;
}

/* zk://hosts[/chroot] of url: one session (requested with dlock's default
 * session timeout, DLOCK_DEFAULT_WATCHDOG_MS, as dlock's client asks), then
 * the parent and its ancestors, made once here as persistent nodes: the
 * pairs never pay for them. The layout mirrors dlock's
 * {chroot}/dlock/locks/{hex(name)}/write-{guid}-{seq} ("floor" is as long
 * as "locks"; a fixed guid of dlock's 32 hex digits), so every request
 * carries paths of dlock's lengths and the server's tree has its depth.
 * 0, or -1 with the reason printed. */
static int zk_floor_open(const char *url) {
    const char *p = strstr(url, "://");
    size_t hl = p ? strcspn(p + 3, "/?") : 0, cl = p ? strcspn(p + 3 + hl, "?") : 0;
    char hosts[512], chroot[256];
    if (!hl || hl >= sizeof hosts || cl >= sizeof chroot) {
        fprintf(stderr, "dlock_bench: backends: zk-floor: not a zk://hosts[/chroot] URL: %s\n",
                url);
        return -1;
    }
    p += 3;
    snprintf(hosts, sizeof hosts, "%.*s", (int)hl, p);
    snprintf(chroot, sizeof chroot, "%.*s", (int)cl, p + hl);
    while (cl > 0 && chroot[cl - 1] == '/') chroot[--cl] = '\0';
    char hex[2 * sizeof zk_floor_name];
    for (size_t i = 0; i + 1 < sizeof zk_floor_name; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)zk_floor_name[i]);
    snprintf(zf.parent, sizeof zf.parent, "%s/dlock/floor/%s", chroot, hex);
    snprintf(zf.prefix, sizeof zf.prefix, "%s/write-%s-", zf.parent,
             "0123456789abcdef0123456789abcdef");
    zf.zh = zookeeper_init2(hosts, zk_floor_watcher, DLOCK_DEFAULT_WATCHDOG_MS, NULL, NULL, 0,
                            zk_floor_nolog);
    if (!zf.zh) {
        fprintf(stderr, "dlock_bench: backends: zk-floor: zookeeper_init: %s\n", strerror(errno));
        return -1;
    }
#ifdef DLOCK_HAVE_ZOO_RESOLUTION_DELAY
    /* as dlock's sessions (ZK_RESOLVE_DELAY_MS): the host list is not
     * resolved again before every poll of the socket, the C client's default */
    zoo_set_servers_resolution_delay(zf.zh, 1000);
#endif
    int64_t give_up = bench_now_ns() + 10000000000LL;
    while (zoo_state(zf.zh) != ZOO_CONNECTED_STATE && bench_now_ns() < give_up)
        bench_sleep_us(1000);
    if (zoo_state(zf.zh) != ZOO_CONNECTED_STATE) {
        fprintf(stderr, "dlock_bench: backends: zk-floor: no session within 10 s\n");
        return -1;
    }
    /* every ancestor from the top, then the parent */
    char path[sizeof zf.parent];
    for (char *q = zf.parent + 1;; q++) {
        if (*q && *q != '/') continue;
        snprintf(path, sizeof path, "%.*s", (int)(q - zf.parent), zf.parent);
        int rc = zoo_create(zf.zh, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT, NULL, 0);
        if (rc != ZOK && rc != ZNODEEXISTS) return zk_floor_fail(path, rc);
        if (!*q) break;
    }
    return 0;
}

static void zk_floor_close(void) {
    if (!zf.zh) return;
    zoo_delete(zf.zh, zf.parent, -1);
    zookeeper_close(zf.zh);
    memset(&zf, 0, sizeof zf);
}

/* One pair, the recipe's minimum: create our ephemeral sequential node, list
 * the parent's children to see it is the lowest (the lock is ours), delete it. */
static int zk_floor_pair(void) {
    char node[sizeof zf.prefix + 16];
    int rc = zoo_create(zf.zh, zf.prefix, NULL, -1, &ZOO_OPEN_ACL_UNSAFE,
                        ZOO_EPHEMERAL | ZOO_SEQUENCE, node, (int)sizeof node);
    if (rc != ZOK) return zk_floor_fail("create", rc);
    struct String_vector kids = {0, NULL};
    rc = zoo_get_children(zf.zh, zf.parent, 0, &kids);
    if (rc != ZOK) return zk_floor_fail("get-children", rc);
    const char *ours = strrchr(node, '/') + 1;
    size_t pl = strlen(ours) - 10; /* the sequence: 10 digits */
    int first = 0;
    for (int i = 0; i < kids.count; i++) {
        const char *k = kids.data[i];
        size_t kl = strlen(k);
        if (kl >= 10 && strcmp(k + kl - 10, ours + pl) < 0) first = -1;
        else if (!first && !strcmp(k, ours)) first = 1;
    }
    deallocate_String_vector(&kids);
    if (first != 1) {
        fprintf(stderr, "dlock_bench: backends: zk-floor: %s is not the first child\n", ours);
        zoo_delete(zf.zh, node, -1);
        return -1;
    }
    rc = zoo_delete(zf.zh, node, -1);
    return rc == ZOK ? 0 : zk_floor_fail("delete", rc);
}
#else
static int zk_floor_pair(void) { return -1; }
#endif

/* ---- pairs ---- */

enum { FLOOR_ETCD = 1, FLOOR_ZK };

typedef struct series {
    backend *b;
    peerst *pe;            /* a peer's series (its worker A times the pairs) */
    int floor;             /* a floor's series (b: its backend): FLOOR_ETCD, FLOOR_ZK */
    int64_t lease;         /* DLOCK_WATCHDOG or LEASE_MS */
    char name[40];
    double rate[MAX_ROUNDS];
    bench_samples pair;
    double median;         /* pairs/s, set by run_pairs */
    int ok;
} series;

static int one_pair(series *s, int64_t *ns) {
    int64_t t0 = bench_now_ns();
    if (s->floor) {
        if (s->floor == FLOOR_ETCD ? floor_pair() : zk_floor_pair()) return -1;
        *ns = bench_now_ns() - t0;
        return 0;
    }
    int rc = dlock_acquire(s->b->lock, DLOCK_NOWAIT, s->lease, NULL);
    if (rc == DLOCK_OK) {
        rc = dlock_release(s->b->lock);
        *ns = bench_now_ns() - t0;
    }
    if (rc)
        fprintf(stderr, "dlock_bench: backends: %s pair: %s: %s\n", s->name, dlock_strerror(rc),
                dlock_lock_errmsg(s->b->lock));
    return rc ? -1 : 0;
}

static int run_pairs(const bench_ctx *ctx, series *sr, int ns) {
    const int rounds = ctx->quick ? 3 : MAX_ROUNDS;
    const int64_t round_ns = ctx->quick ? 100000000LL : 250000000LL;
    int failed = 0;
    printf("\n   pairs: uncontended dlock_acquire(DLOCK_NOWAIT) + dlock_release on one handle "
           "(%d rounds x %.2f s per series, balanced order)\n",
           rounds, (double)round_ns / 1e9);
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < ns; k++) {
            series *s = &sr[bench_order(r, k, ns)];
            if (!s->ok) continue;
            if (s->pe) {
                long long n = 0, el = 0;
                char *l = NULL;
                if (!bench_peer_send(&s->pe->a, "pairs %s %d", pair_lock,
                                     (int)(round_ns / 1000000)))
                    l = peer_reply(s->pe, &s->pe->a, (int)(round_ns / 1000000) + PEER_LINE_MS,
                                   "pairs");
                if (parse_ok(l, &n, &el, &s->pair) || n <= 0 || el <= 0) {
                    s->ok = 0; /* a peer's failure is its own: printed, not the scenario's */
                    continue;
                }
                s->rate[r] = (double)n * 1e9 / (double)el;
                if (ctx->verbose)
                    printf("   round %d %-18s %8.0f pairs/s\n", r + 1, s->name, s->rate[r]);
                continue;
            }
            int64_t t;
            for (int i = 0; s->ok && i < WARMUP_PAIRS; i++)
                if (one_pair(s, &t)) s->ok = 0;
            long n = 0;
            int64_t start = bench_now_ns(), end = start + round_ns, now = start;
            while (s->ok && now < end) {
                if (one_pair(s, &t) || bench_samples_add(&s->pair, t)) {
                    s->ok = 0;
                    break;
                }
                n++;
                now = bench_now_ns();
            }
            if (!s->ok) {
                if (!s->floor) failed = 1; /* the floor's failure is printed, its own */
                continue;
            }
            s->rate[r] = (double)n * 1e9 / (double)(now - start);
            if (ctx->verbose)
                printf("   round %d %-18s %8.0f pairs/s\n", r + 1, s->name, s->rate[r]);
        }
    }
    printf("   %-18s %10s %10s %10s %10s\n", "series", "pairs/s", "pair p50", "pair p99",
           "vs redis");
    for (int i = 0; i < ns; i++) {
        series *s = &sr[i];
        if (!s->ok) {
            printf("   %-18s FAILED (see above)\n", s->name);
            continue;
        }
        double med = bench_median_d(s->rate, (size_t)rounds);
        s->median = med;
        double p50 = (double)bench_samples_quantile(&s->pair, 0.50) / 1e3;
        double p99 = (double)bench_samples_quantile(&s->pair, 0.99) / 1e3;
        bench_metric("backends", s->name, "pairs_per_s", med, "1/s");
        bench_metric("backends", s->name, "pair_p50_us", p50, "us");
        bench_metric("backends", s->name, "pair_p99_us", p99, "us");
        bench_metric("backends", s->name, "pair_samples", (double)s->pair.n, "");
        char rtext[32] = "-";
        if (i > 0 && sr[0].ok && !strcmp(sr[0].name, "redis")) {
            double ratio[MAX_ROUNDS];
            for (int r = 0; r < rounds; r++) ratio[r] = s->rate[r] / sr[0].rate[r];
            double rm = bench_median_d(ratio, (size_t)rounds);
            snprintf(rtext, sizeof rtext, "%.3fx", rm);
            bench_metric("backends", s->name, "pairs_ratio_to_redis", rm, "x");
        }
        char rb[32];
        bench_fmt_num(rb, sizeof rb, med);
        printf("   %-18s %10s %7.1f us %7.1f us %10s\n", s->name, rb, p50, p99, rtext);
    }
    return failed;
}

/* ---- handoff ---- */

/* 1 when B is seen waiting (or the backend cannot show it), 0 not yet, -1 error */
static int waiter_seen(const bench_ctx *ctx, redisContext *rc, backend *b) {
    if (b->waiter_check == 1 && rc) {
        long long n = bench_lock_waiters(rc, handoff_lock);
        return n < 0 ? -1 : n >= 1;
    }
    if (b->waiter_check == 2) {
        dlock_info info;
        int e = dlock_inspect(b->client, handoff_lock, DLOCK_CSTR, &info);
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
    if (!bench_peer_send(&pe->a, "hold %s", handoff_lock))
        l = peer_reply(pe, &pe->a, PEER_LINE_MS, "hold");
    if (!l) return -1;
    l = NULL;
    if (!bench_peer_send(&pe->w, "wait %s", handoff_lock))
        l = peer_reply(pe, &pe->w, PEER_LINE_MS, "wait");
    if (!l || strcmp(l, "waiting")) return -1;
    bench_sleep_us(settle_us + PEER_SETTLE_EXTRA_US);
    long long t0 = 0, t1 = 0, cpu = 0;
    l = NULL;
    if (!bench_peer_send(&pe->a, "release"))
        l = peer_reply(pe, &pe->a, PEER_LINE_MS, "release");
    if (!l || sscanf(l, "ok %lld", &t0) != 1) return -1;
    l = peer_reply(pe, &pe->w, PEER_LINE_MS, "wait");
    if (!l || sscanf(l, "got %lld %lld", &t1, &cpu) != 2) return -1;
    *ns = ((int64_t)t1 - pe->w.offset) - ((int64_t)t0 - pe->a.offset);
    return 0;
}

static int run_handoffs(const bench_ctx *ctx, backend *bk, int n, peerst *pe) {
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
                stop_waiter(b, 1);
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
static void compare_peers(series *sr, int ns, int rounds, backend **dl, int ndl, peerst *pe,
                          cs_result cres[2][MAX_CS]) {
    int any = 0;
    for (int i = 0; i < NPEERS; i++) any |= pe[i].b != NULL;
    if (!any) return;
    printf("\n   dlock beside the peers (same run): rates dlock / peer (above 1: dlock does "
           "more), times dlock / peer (below 1: dlock is quicker)\n");
    printf("   %-22s %10s %10s %12s %14s %12s %14s %12s\n", "dlock : peer", "pairs/s",
           "pair p50", "K=8 acq/s", "K=8 max wait", "K=32 acq/s", "K=32 max wait", "handoff p50");
    for (int i = 0; i < NPEERS; i++) {
        peerst *p = &pe[i];
        if (!p->b) continue;
        series *d = NULL, *q = NULL;
        for (int s = 0; s < ns; s++) {
            if (sr[s].b == p->b && !sr[s].pe && !sr[s].floor && sr[s].lease == DLOCK_WATCHDOG)
                d = &sr[s];
            if (sr[s].pe == p) q = &sr[s];
        }
        char c[7][32];
        for (int j = 0; j < 7; j++) snprintf(c[j], sizeof c[j], "-");
        char sn[64];
        snprintf(sn, sizeof sn, "%s : %s", p->b->name, p->name);
        if (d && q && d->ok && q->ok) {
            double ratio[MAX_ROUNDS];
            for (int r = 0; r < rounds; r++) ratio[r] = d->rate[r] / q->rate[r];
            double rm = bench_median_d(ratio, (size_t)rounds);
            double p50 = (double)bench_samples_quantile(&d->pair, 0.5) /
                         (double)bench_samples_quantile(&q->pair, 0.5);
            snprintf(c[0], sizeof c[0], "%.2fx", rm);
            snprintf(c[1], sizeof c[1], "%.2fx", p50);
            bench_metric("backends", sn, "pairs_ratio", rm, "x");
            bench_metric("backends", sn, "pair_p50_ratio", p50, "x");
        }
        int di = -1;
        for (int j = 0; j < ndl; j++)
            if (dl[j] == p->b) di = j;
        for (int kk = 0; kk < 2 && di >= 0; kk++) {
            cs_result *a = &cres[kk][di], *b = &cres[kk][ndl + i];
            if (!a->have || !b->have || b->rate <= 0 || b->wait_max_ms <= 0) continue;
            snprintf(c[2 + 2 * kk], sizeof c[0], "%.2fx", a->rate / b->rate);
            snprintf(c[3 + 2 * kk], sizeof c[0], "%.2fx", a->wait_max_ms / b->wait_max_ms);
            bench_metric("backends", sn, kk ? "k32_acq_ratio" : "k8_acq_ratio", a->rate / b->rate,
                         "x");
            bench_metric("backends", sn, kk ? "k32_wait_max_ratio" : "k8_wait_max_ratio",
                         a->wait_max_ms / b->wait_max_ms, "x");
        }
        if (p->b->ok && p->b->handoff.n && p->handoff.n) {
            double h = (double)bench_samples_quantile(&p->b->handoff, 0.5) /
                       (double)bench_samples_quantile(&p->handoff, 0.5);
            snprintf(c[6], sizeof c[6], "%.2fx", h);
            bench_metric("backends", sn, "handoff_p50_ratio", h, "x");
        }
        printf("   %-22s %10s %10s %12s %14s %12s %14s %12s\n", sn, c[0], c[1], c[2], c[3], c[4],
               c[5], c[6]);
    }
}

/* dlock's pairs on a backend against its floor's, and the floor against
 * the peer's beside it (etcd: python-etcd3; zk: kazoo), in the same rounds
 * (medians of the per-round ratios). */
static void compare_floor(series *sr, int ns, int rounds, int kind) {
    series *d = NULL, *f = NULL, *q = NULL;
    for (int s = 0; s < ns; s++)
        if (sr[s].floor == kind) f = &sr[s];
    if (!f || !f->ok) return;
    const char *bn = f->b->name;
    for (int s = 0; s < ns; s++) {
        if (sr[s].pe && !strcmp(sr[s].pe->backend, bn)) q = &sr[s];
        if (sr[s].b == f->b && !sr[s].pe && !sr[s].floor && sr[s].lease == DLOCK_WATCHDOG)
            d = &sr[s];
    }
    const char *pn = q ? q->name : "-";
    printf("\n   %s beside its floor (same rounds; pairs/s ratios, median of the rounds')\n",
           bn);
    series *pairs[3][2] = {{d, f}, {f, q}, {d, q}};
    char what[3][128];
    snprintf(what[0], sizeof what[0], "dlock %s / %s", bn, f->name);
    snprintf(what[1], sizeof what[1], "%s / %s", f->name, pn);
    snprintf(what[2], sizeof what[2], "dlock %s / %s", bn, pn);
    static const char *const metric[3] = {"pairs_ratio_to_floor", "floor_ratio_to_peer",
                                          "pairs_ratio_to_peer"};
    for (int i = 0; i < 3; i++) {
        series *a = pairs[i][0], *b = pairs[i][1];
        if (!a || !b || !a->ok || !b->ok) continue;
        double ratio[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) ratio[r] = a->rate[r] / b->rate[r];
        double rm = bench_median_d(ratio, (size_t)rounds);
        bench_metric("backends", bn, metric[i], rm, "x");
        printf("   %-28s %6.2fx\n", what[i], rm);
    }
}

int bench_backends(bench_ctx *ctx) {
    if (!ctx->backend_urls) {
        printf("\n== backends: SKIP: no --backend-urls (bench/run.sh passes them with "
               "--only backends, or in full mode)\n");
        return 0;
    }
    backend bk[MAX_BACKENDS];
    series sr[MAX_SERIES];
    int n = 0, ns = 0, failed = 0;
    memset(sr, 0, sizeof sr);
    printf("\n== backends: every backend beside Redis, same run (DLOCK_WATCHDOG leases)\n");
    if (parse_urls(ctx, bk, &n)) return -1;

    /* B processes first, while this process has no client and no thread */
    for (int i = 0; i < n; i++)
        if (start_waiter(&bk[i])) bk[i].ok = 0, failed = 1;
    for (int i = 0; i < n; i++) {
        backend *b = &bk[i];
        char st = 0;
        if (b->pid < 0) continue;
        if (bench_read_full(b->rfd, &st, 1, PIPE_TIMEOUT_MS) || st != 'r') {
            printf("   SKIP %s: the waiter process could not connect (its message is above)\n",
                   b->name);
            stop_waiter(b, 1);
            b->ok = 0;
        }
    }
    /* the peers' workers (exec'd: safe to start while this process has
     * threads, but started here anyway), then contention, while this
     * process has no client and no thread: its workers are forked */
    peerst pe[NPEERS] = {{.name = "kazoo", .kind = "kazoo", .backend = "zk"},
                         {.name = "python-etcd3", .kind = "etcd3", .backend = "etcd"}};
    cs_result cres[2][MAX_CS];
    backend *dl[2];
    int ndl = 0;
    memset(cres, 0, sizeof cres);
    if (ctx->quick) {
        printf("   SKIP peers (kazoo, python-etcd3) and contention: --quick\n");
    } else {
        for (int i = 0; i < NPEERS; i++) {
            for (int j = 0; j < n; j++)
                if (bk[j].ok && !strcmp(bk[j].name, pe[i].backend)) pe[i].b = &bk[j];
            if (!pe[i].b) {
                printf("   SKIP %s: no %s server (its dlock backend is skipped)\n", pe[i].name,
                       pe[i].backend);
                continue;
            }
            url_server(pe[i].b->url, pe[i].server, sizeof pe[i].server);
            pe[i].ok = 1;
            int r = peer_spawn_one(ctx, &pe[i], &pe[i].a);
            if (!r) {
                r = peer_spawn_one(ctx, &pe[i], &pe[i].w);
                if (r) bench_peer_stop(&pe[i].a);
            }
            if (r < 0) printf("   SKIP %s: its worker did not start\n", pe[i].name);
            if (r) pe[i].ok = 0;
            else printf("   %-12s %s (%s)\n", pe[i].name, pe[i].server, pe[i].version);
        }
        for (int i = 0; i < n; i++)
            if (bk[i].ok && (!strcmp(bk[i].name, "zk") || !strcmp(bk[i].name, "etcd")))
                dl[ndl++] = &bk[i];
        redisContext *rc = bench_redis_connect(ctx);
        if (!rc) {
            printf("   SKIP contention: no connection to the bench's Redis (the counter)\n");
        } else {
            printf("\n   contention: K processes on one lock, each acquiring (no limit), GET+SET "
                   "of a counter in Redis, releasing (3 rounds x 1 s per series, balanced "
                   "order)\n");
            printf("   %-22s %9s %12s %12s %12s %6s\n", "series", "acq/s", "wait p50", "wait p99",
                   "wait max", "count");
            static const int ks[2] = {8, 32};
            for (int i = 0; i < 2 && !failed; i++)
                if (contention_k(ctx, rc, dl, ndl, pe, ks[i], cres[i])) failed = 1;
            redisFree(rc);
        }
    }
    /* A's clients */
    for (int i = 0; i < n; i++) {
        backend *b = &bk[i];
        if (!b->ok) continue;
        char why[600];
        if (new_client(b->url, &b->client, why, sizeof why)) {
            printf("   SKIP %s: %s\n", b->name, why);
            b->ok = 0;
            stop_waiter(b, 0);
            continue;
        }
        if (dlock_lock_new(b->client, pair_lock, DLOCK_CSTR, DLOCK_KIND_PLAIN, &b->lock)) {
            printf("   SKIP %s: dlock_lock_new: %s\n", b->name, dlock_errmsg(b->client));
            b->ok = 0;
            stop_waiter(b, 0);
            continue;
        }
        /* does it take an explicit lease? (the session-held backends: ENOTSUP) */
        int e = dlock_acquire(b->lock, DLOCK_NOWAIT, LEASE_MS, NULL);
        if (e == DLOCK_OK) {
            b->has_lease = 1;
            e = dlock_release(b->lock);
        } else if (e == DLOCK_ENOTSUP) {
            e = DLOCK_OK;
        }
        if (e) {
            printf("   SKIP %s: first acquire: %s: %s\n", b->name, dlock_strerror(e),
                   dlock_lock_errmsg(b->lock));
            b->ok = 0;
            stop_waiter(b, 0);
            continue;
        }
        char version[64] = "";
        if (dlock_server_fact(b->client, "version", version, sizeof version))
            dlock_server_fact(b->client, "info:server:redis_version", version, sizeof version);
        version[strcspn(version, " ,")] = '\0'; /* "15.20 (Debian ...)" */
        char *junk = strstr(version, "-${");       /* ZooKeeper's unfilled build id */
        if (junk) *junk = '\0';
        printf("   %-12s %s (server %s)%s\n", b->name, b->url, version[0] ? version : "?",
               b->has_lease ? "" : "; an explicit lease is DLOCK_ENOTSUP here");
        sr[ns].b = b, sr[ns].lease = DLOCK_WATCHDOG, sr[ns].ok = 1;
        snprintf(sr[ns].name, sizeof sr[ns].name, "%.31s", b->name);
        ns++;
    }
    for (int i = 0; i < n; i++) {
        if (!bk[i].ok || !bk[i].has_lease) continue;
        sr[ns].b = &bk[i], sr[ns].lease = LEASE_MS, sr[ns].ok = 1;
        snprintf(sr[ns].name, sizeof sr[ns].name, "%.31s-lease", bk[i].name);
        ns++;
    }
#ifdef DLOCK_BENCH_HAVE_CURL
    for (int i = 0; i < n; i++) {
        if (!bk[i].ok || strcmp(bk[i].name, "etcd")) continue;
        if (floor_open(bk[i].url)) {
            printf("   SKIP etcd-floor: no session lease from %s (one plain etcd:// host)\n",
                   bk[i].url);
            break;
        }
        sr[ns].b = &bk[i], sr[ns].floor = FLOOR_ETCD, sr[ns].ok = 1;
        snprintf(sr[ns].name, sizeof sr[ns].name, "etcd-floor");
        ns++;
    }
#endif
#ifdef DLOCK_BENCH_HAVE_ZK
    for (int i = 0; i < n; i++) {
        if (!bk[i].ok || strcmp(bk[i].name, "zk")) continue;
        if (zk_floor_open(bk[i].url)) {
            printf("   SKIP zk-floor: no session or no parent on %s (its message is above)\n",
                   bk[i].url);
            zk_floor_close();
            break;
        }
        sr[ns].b = &bk[i], sr[ns].floor = FLOOR_ZK, sr[ns].ok = 1;
        snprintf(sr[ns].name, sizeof sr[ns].name, "zk-floor");
        ns++;
    }
#endif
    for (int i = 0; i < NPEERS; i++) {
        if (!pe[i].ok) continue;
        sr[ns].pe = &pe[i], sr[ns].ok = 1;
        snprintf(sr[ns].name, sizeof sr[ns].name, "%s", pe[i].name);
        ns++;
    }
    if (!bk[0].ok) printf("   (no Redis figures: the ratios are left out)\n");

    if (ns) failed |= run_pairs(ctx, sr, ns);
    if (ns) compare_floor(sr, ns, (int)(ctx->quick ? 3 : MAX_ROUNDS), FLOOR_ETCD);
    if (ns) compare_floor(sr, ns, (int)(ctx->quick ? 3 : MAX_ROUNDS), FLOOR_ZK);
#ifdef DLOCK_BENCH_HAVE_CURL
    floor_close();
#endif
#ifdef DLOCK_BENCH_HAVE_ZK
    zk_floor_close();
#endif
    /* the handoffs use their own lock name: swap A's handles */
    for (int i = 0; i < n; i++) {
        backend *b = &bk[i];
        if (!b->ok) continue;
        dlock_lock_free(b->lock);
        b->lock = NULL;
        if (dlock_lock_new(b->client, handoff_lock, DLOCK_CSTR, DLOCK_KIND_PLAIN, &b->lock)) {
            fprintf(stderr, "dlock_bench: backends: %s: dlock_lock_new: %s\n", b->name,
                    dlock_errmsg(b->client));
            b->ok = 0;
            failed = 1;
        }
    }
    if (ns) failed |= run_handoffs(ctx, bk, n, pe);
    if (!ctx->quick) compare_peers(sr, ns, (int)(ctx->quick ? 3 : MAX_ROUNDS), dl, ndl, pe, cres);

    for (int i = 0; i < n; i++) {
        if (stop_waiter(&bk[i], 0) && bk[i].ok) {
            fprintf(stderr, "dlock_bench: backends: %s waiter process failed\n", bk[i].name);
            failed = 1;
        }
        dlock_lock_free(bk[i].lock);
        dlock_client_free(bk[i].client);
        bench_samples_free(&bk[i].handoff);
    }
    for (int i = 0; i < ns; i++) bench_samples_free(&sr[i].pair);
    for (int i = 0; i < NPEERS; i++) {
        if (pe[i].a.pid > 0) bench_peer_stop(&pe[i].a);
        if (pe[i].w.pid > 0) bench_peer_stop(&pe[i].w);
        bench_samples_free(&pe[i].handoff);
    }
    return failed ? -1 : 0;
}
