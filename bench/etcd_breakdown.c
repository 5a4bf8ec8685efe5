/* etcd: where an uncontended acquire + release spends its time.
 *
 *   etcd_breakdown http://127.0.0.1:PORT [pairs]      (bench/etcd_breakdown.sh
 *                                                      starts a private etcd)
 *
 * 1. trace   one dlock acquire(DLOCK_NOWAIT) + release, watchdog and 10 s
 *            lease, after a warm-up: every HTTP request the library makes
 *            (path, time, new TCP connections), seen by wrapping
 *            curl_easy_perform (this program links the static library, so its
 *            definition is the one the library calls).
 * 2. costs   per gateway request kind, sent alone in a loop on one reused
 *            connection: p50 of lease grant, a put txn, a delete txn, lease
 *            revoke, a linearizable range, one keep-alive.
 * 3. pairs   pairs/s and pair p50 of: dlock (watchdog, 10 s lease); the raw
 *            floor (a C client on the same gateway doing only the minimum:
 *            one txn "create-if-absent under a session lease granted once +
 *            read the oldest key", one guarded delete); the floor on a fresh
 *            TCP connection per request; python-etcd3's Lock (gRPC, when the
 *            module imports). For each, the server's own counters per pair
 *            (GET /metrics): WAL fsyncs, raft proposals committed, and the
 *            gRPC calls the gateway (or the client) made, by method.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "dlock.h"

static int tracing;

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The library's requests pass through here (see above). */
CURLcode curl_easy_perform(CURL *h) {
    static CURLcode (*real)(CURL *);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "curl_easy_perform");
    int64_t t0 = now_us();
    CURLcode rc = real(h);
    if (tracing) {
        char *url = NULL;
        long conns = 0;
        curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &url);
        curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &conns);
        const char *path = url ? strstr(url + 8, "/") : NULL;
        printf("    %-22s %7.2f ms  new connections %ld\n", path ? path : "?",
               (double)(now_us() - t0) / 1000.0, conns);
    }
    return rc;
}

/* ---- raw gateway calls ---- */

typedef struct buf {
    char *p;
    size_t n;
} buf;

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    buf *b = ud;
    size_t len = size * nmemb;
    char *p = realloc(b->p, b->n + len + 1);
    if (!p) return 0;
    memcpy(p + b->n, ptr, len);
    b->p = p;
    b->n += len;
    b->p[b->n] = '\0';
    return len;
}

static const char *base;
static CURL *raw;
static int fresh;

/* POST body to path (GET when NULL); the answer in a static buffer. */
static const char *call(const char *path, const char *body) {
    static buf b;
    b.n = 0;
    if (b.p) b.p[0] = '\0';
    char url[256];
    snprintf(url, sizeof url, "%s%s", base, path);
    curl_easy_reset(raw);
    curl_easy_setopt(raw, CURLOPT_URL, url);
    curl_easy_setopt(raw, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(raw, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(raw, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(raw, CURLOPT_NOSIGNAL, 1L);
    if (fresh) {
        curl_easy_setopt(raw, CURLOPT_FRESH_CONNECT, 1L);
        curl_easy_setopt(raw, CURLOPT_FORBID_REUSE, 1L);
    }
    if (body) curl_easy_setopt(raw, CURLOPT_POSTFIELDS, body);
    int t = tracing;
    tracing = 0;
    CURLcode rc = curl_easy_perform(raw);
    tracing = t;
    if (rc != CURLE_OK) {
        fprintf(stderr, "etcd_breakdown: %s: %s\n", path, curl_easy_strerror(rc));
        exit(1);
    }
    return b.p ? b.p : "";
}

/* A gateway int64 field ("name":"123") of an answer, 0 when missing. */
static long long field(const char *s, const char *name) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", name);
    const char *p = strstr(s, pat);
    if (!p) return 0;
    p += strlen(pat);
    if (*p == '"') p++;
    return strtoll(p, NULL, 10);
}

static void b64(const char *s, char *out) {
    static const char c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = strlen(s), o = 0;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)(unsigned char)s[i] << 16;
        if (i + 1 < len) v |= (unsigned)(unsigned char)s[i + 1] << 8;
        if (i + 2 < len) v |= (unsigned char)s[i + 2];
        out[o++] = c[(v >> 18) & 63];
        out[o++] = c[(v >> 12) & 63];
        out[o++] = i + 1 < len ? c[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? c[v & 63] : '=';
    }
    out[o] = '\0';
}

/* ---- the server's counters ---- */

#define NMETHODS 8
static const char *const methods[NMETHODS] = {"Range", "Put", "DeleteRange", "Txn",
                                             "LeaseGrant", "LeaseRevoke", "LeaseKeepAlive",
                                             "Watch"};

typedef struct counters {
    double fsyncs, proposals, calls[NMETHODS];
} counters;

static void snapshot(counters *c) {
    memset(c, 0, sizeof *c);
    const char *m = call("/metrics", NULL);
    for (const char *line = m; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "") {
        if (*line == '#') continue;
        const char *sp = strchr(line, ' ');
        const char *nl = strchr(line, '\n');
        if (!sp || (nl && sp > nl)) continue;
        double v = strtod(sp + 1, NULL);
        if (!strncmp(line, "etcd_disk_wal_fsync_duration_seconds_count ", 43)) c->fsyncs = v;
        else if (!strncmp(line, "etcd_server_proposals_committed_total ", 38)) c->proposals = v;
        else if (!strncmp(line, "grpc_server_started_total{", 26)) {
            for (int i = 0; i < NMETHODS; i++) {
                char pat[64];
                snprintf(pat, sizeof pat, "grpc_method=\"%s\"", methods[i]);
                const char *p = strstr(line, pat);
                if (p && p < sp) c->calls[i] += v;
            }
        }
    }
}

static void print_counts(const counters *a, const counters *b, int n) {
    printf("    per pair: fsyncs %.2f, proposals %.2f, gRPC:", (b->fsyncs - a->fsyncs) / n,
           (b->proposals - a->proposals) / n);
    for (int i = 0; i < NMETHODS; i++) {
        double d = (b->calls[i] - a->calls[i]) / n;
        if (d >= 0.005) printf(" %s %.2f", methods[i], d);
    }
    printf("\n");
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void print_times(const char *what, int64_t *us, int n, int64_t total_us) {
    qsort(us, (size_t)n, sizeof *us, cmp64);
    printf("  %-34s %8.0f pairs/s  p50 %6.2f ms  p90 %6.2f ms\n", what,
           n * 1e6 / (double)total_us, (double)us[n / 2] / 1000.0,
           (double)us[n * 9 / 10] / 1000.0);
}

/* ---- dlock ---- */

static void dlock_pairs(const char *url, int64_t lease, int n, int trace) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    if (dlock_client_new(&o, &c) ||
        dlock_lock_new(c, "bench:etcd:pairs", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l)) {
        fprintf(stderr, "etcd_breakdown: %s\n", dlock_errmsg(c));
        exit(1);
    }
    for (int i = 0; i < 20; i++) {
        if (dlock_acquire(l, DLOCK_NOWAIT, lease, NULL) || dlock_release(l)) {
            fprintf(stderr, "etcd_breakdown: %s\n", dlock_lock_errmsg(l));
            exit(1);
        }
    }
    const char *what = lease == DLOCK_WATCHDOG ? "dlock etcd:// (watchdog)" : "dlock etcd:// (10 s lease)";
    if (trace) {
        printf("  %s, one pair:\n   acquire:\n", what);
        tracing = 1;
        dlock_acquire(l, DLOCK_NOWAIT, lease, NULL);
        printf("   release:\n");
        dlock_release(l);
        tracing = 0;
        dlock_lock_free(l);
        dlock_client_free(c);
        return;
    }
    int64_t *us = malloc((size_t)n * sizeof *us);
    counters a, b;
    snapshot(&a);
    int64_t t0 = now_us();
    for (int i = 0; i < n; i++) {
        int64_t s = now_us();
        if (dlock_acquire(l, DLOCK_NOWAIT, lease, NULL) || dlock_release(l)) {
            fprintf(stderr, "etcd_breakdown: %s\n", dlock_lock_errmsg(l));
            exit(1);
        }
        us[i] = now_us() - s;
    }
    int64_t total = now_us() - t0;
    snapshot(&b);
    print_times(what, us, n, total);
    print_counts(&a, &b, n);
    free(us);
    dlock_lock_free(l);
    dlock_client_free(c);
}

/* ---- the floor ---- */

static char key_b64[64], pfx_b64[64], end_b64[64];

static long long grant(int ttl) {
    char body[64];
    snprintf(body, sizeof body, "{\"TTL\":\"%d\"}", ttl);
    return field(call("/v3/lease/grant", body), "ID");
}

/* create-if-absent under the lease, reading the oldest key of the prefix;
 * returns the key's create revision (the txn's header revision) */
static long long floor_acquire(long long lease) {
    char body[768];
    snprintf(body, sizeof body,
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"0\"}],"
             "\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"eA==\",\"lease\":\"%lld\"}},"
             "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\",\"sort_order\":\"ASCEND\","
             "\"sort_target\":\"CREATE\",\"limit\":\"1\"}}],"
             "\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
             key_b64, key_b64, lease, pfx_b64, end_b64, key_b64);
    const char *r = call("/v3/kv/txn", body);
    if (!strstr(r, "\"succeeded\":true")) {
        fprintf(stderr, "etcd_breakdown: floor txn: %s\n", r);
        exit(1);
    }
    return field(r, "revision");
}

static void floor_release(long long rev) {
    char body[512];
    snprintf(body, sizeof body,
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"%lld\"}],"
             "\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}]}",
             key_b64, rev, key_b64);
    call("/v3/kv/txn", body);
}

static void floor_pairs(int n, int fresh_conn) {
    long long lease = grant(60);
    fresh = fresh_conn;
    for (int i = 0; i < 20; i++) floor_release(floor_acquire(lease));
    int64_t *us = malloc((size_t)n * sizeof *us);
    counters a, b;
    fresh = 0;
    snapshot(&a);
    fresh = fresh_conn;
    int64_t t0 = now_us();
    for (int i = 0; i < n; i++) {
        int64_t s = now_us();
        floor_release(floor_acquire(lease));
        us[i] = now_us() - s;
    }
    int64_t total = now_us() - t0;
    fresh = 0;
    snapshot(&b);
    print_times(fresh_conn ? "floor, new connection per request" : "floor (raw C, session lease)",
                us, n, total);
    print_counts(&a, &b, n);
    free(us);
    char body[64];
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", lease);
    call("/v3/lease/revoke", body);
}

/* ---- one request kind alone ---- */

static void cost(const char *what, int n, int kind) {
    int64_t *us = malloc((size_t)n * sizeof *us);
    long long lease = grant(60);
    char body[512];
    long long rev = 0;
    for (int i = 0; i < n + 5; i++) {
        long long id = 0;
        if (kind == 3) id = grant(60);
        if (kind == 2) rev = floor_acquire(lease);
        int64_t s = now_us();
        switch (kind) {
        case 0: grant(60); break;
        case 1: rev = floor_acquire(lease); break;
        case 2: floor_release(rev); break;
        case 3:
            snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", id);
            call("/v3/lease/revoke", body);
            break;
        case 4:
            snprintf(body, sizeof body, "{\"key\":\"%s\"}", key_b64);
            call("/v3/kv/range", body);
            break;
        case 5:
            snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", lease);
            call("/v3/lease/keepalive", body);
            break;
        }
        if (i >= 5) us[i - 5] = now_us() - s;
        if (kind == 1) floor_release(rev);
    }
    qsort(us, (size_t)n, sizeof *us, cmp64);
    printf("  %-52s p50 %6.2f ms\n", what, (double)us[n / 2] / 1000.0);
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", lease);
    call("/v3/lease/revoke", body);
    free(us);
}

/* ---- python-etcd3 (bench/peers/etcd3_pairs.py: the same measure, in Python) ---- */

static void python_pairs(const char *dir, int n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/peers/etcd3_pairs.py %s %d 2>&1", dir, base,
             n);
    FILE *p = popen(cmd, "r");
    char line[512];
    while (p && fgets(line, sizeof line, p)) fputs(line, stdout);
    if (!p) printf("  python-etcd3 Lock: not measured (popen failed)\n");
    else pclose(p);
}

int main(int argc, char **argv) {
    if (argc < 2 || strncmp(argv[1], "http://", 7)) {
        fprintf(stderr, "usage: etcd_breakdown http://host:port [pairs]\n");
        return 2;
    }
    base = argv[1];
    int n = argc > 2 ? atoi(argv[2]) : 300;
    if (n < 10) n = 10;
    char url[256];
    snprintf(url, sizeof url, "etcd://%s", base + 7);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    raw = curl_easy_init();
    b64("bench/etcd/floor/w/k", key_b64);
    b64("bench/etcd/floor/", pfx_b64);
    b64("bench/etcd/floor0", end_b64);

    printf("1. the requests of one uncontended pair (after a warm-up)\n");
    dlock_pairs(url, DLOCK_WATCHDOG, 0, 1);
    dlock_pairs(url, 10000, 0, 1);

    printf("2. one request kind alone, on one reused connection (%d each)\n", n);
    cost("POST /v3/lease/grant", n, 0);
    cost("POST /v3/kv/txn: create-if-absent put + range (write)", n, 1);
    cost("POST /v3/kv/txn: guarded delete (write)", n, 2);
    cost("POST /v3/lease/revoke", n, 3);
    cost("POST /v3/kv/range (linearizable read)", n, 4);
    cost("POST /v3/lease/keepalive", n, 5);

    printf("3. uncontended pairs (%d each)\n", n);
    dlock_pairs(url, DLOCK_WATCHDOG, n, 0);
    dlock_pairs(url, 10000, n, 0);
    floor_pairs(n, 0);
    floor_pairs(n, 1);
    python_pairs(DLOCK_BENCH_DIR, n);

    curl_easy_cleanup(raw);
    return 0;
}
