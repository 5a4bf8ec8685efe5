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
 *            bk_zk_floor_open in backends_floor.c), in the pairs rounds as
 *            "zk-floor"; then dlock / floor and floor / kazoo as for etcd.
 *
 * Its parts: backends.h.
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

#include "backends.h"

static const char *const known[] = {"redis", "postgres", "mysql", "mysql-table", "zk", "etcd"};
#define NKNOWN (sizeof known / sizeof known[0])

int bk_new_client(const char *url, dlock_client **out, char *why, size_t whylen) {
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
        if (s->floor == FLOOR_ETCD ? bk_etcd_floor_pair() : bk_zk_floor_pair()) return -1;
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
                if (!bench_peer_send(&s->pe->a, "pairs %s %d", BK_PAIR_LOCK,
                                     (int)(round_ns / 1000000)))
                    l = bk_peer_reply(s->pe, &s->pe->a, (int)(round_ns / 1000000) + PEER_LINE_MS,
                                   "pairs");
                if (bench_peer_parse_ok(l, &n, &el, &s->pair) || n <= 0 || el <= 0) {
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
        if (bk_start_waiter(&bk[i])) bk[i].ok = 0, failed = 1;
    for (int i = 0; i < n; i++) {
        backend *b = &bk[i];
        char st = 0;
        if (b->pid < 0) continue;
        if (bench_read_full(b->rfd, &st, 1, PIPE_TIMEOUT_MS) || st != 'r') {
            printf("   SKIP %s: the waiter process could not connect (its message is above)\n",
                   b->name);
            bk_stop_waiter(b, 1);
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
            bk_url_server(pe[i].b->url, pe[i].server, sizeof pe[i].server);
            pe[i].ok = 1;
            int r = bk_peer_spawn_one(ctx, &pe[i], &pe[i].a);
            if (!r) {
                r = bk_peer_spawn_one(ctx, &pe[i], &pe[i].w);
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
                if (bk_contention_k(ctx, rc, dl, ndl, pe, ks[i], cres[i])) failed = 1;
            redisFree(rc);
        }
    }
    /* A's clients */
    for (int i = 0; i < n; i++) {
        backend *b = &bk[i];
        if (!b->ok) continue;
        char why[600];
        if (bk_new_client(b->url, &b->client, why, sizeof why)) {
            printf("   SKIP %s: %s\n", b->name, why);
            b->ok = 0;
            bk_stop_waiter(b, 0);
            continue;
        }
        if (dlock_lock_new(b->client, BK_PAIR_LOCK, DLOCK_CSTR, DLOCK_KIND_PLAIN, &b->lock)) {
            printf("   SKIP %s: dlock_lock_new: %s\n", b->name, dlock_errmsg(b->client));
            b->ok = 0;
            bk_stop_waiter(b, 0);
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
            bk_stop_waiter(b, 0);
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
        if (bk_etcd_floor_open(bk[i].url)) {
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
        if (bk_zk_floor_open(bk[i].url)) {
            printf("   SKIP zk-floor: no session or no parent on %s (its message is above)\n",
                   bk[i].url);
            bk_zk_floor_close();
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
    bk_etcd_floor_close();
#endif
#ifdef DLOCK_BENCH_HAVE_ZK
    bk_zk_floor_close();
#endif
    /* the handoffs use their own lock name: swap A's handles */
    for (int i = 0; i < n; i++) {
        backend *b = &bk[i];
        if (!b->ok) continue;
        dlock_lock_free(b->lock);
        b->lock = NULL;
        if (dlock_lock_new(b->client, BK_HANDOFF_LOCK, DLOCK_CSTR, DLOCK_KIND_PLAIN, &b->lock)) {
            fprintf(stderr, "dlock_bench: backends: %s: dlock_lock_new: %s\n", b->name,
                    dlock_errmsg(b->client));
            b->ok = 0;
            failed = 1;
        }
    }
    if (ns) failed |= bk_run_handoffs(ctx, bk, n, pe);
    if (!ctx->quick) compare_peers(sr, ns, (int)(ctx->quick ? 3 : MAX_ROUNDS), dl, ndl, pe, cres);

    for (int i = 0; i < n; i++) {
        if (bk_stop_waiter(&bk[i], 0) && bk[i].ok) {
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
