/* The etcd backend against a private etcd 3.4 (a temp dir on free ports, as
 * /work/shared/SERVERS.md section 6): mutual exclusion across processes
 * (exact counter), fencing tokens increasing across processes, try-once and
 * timed waits leaving no key behind, a killed holder's lease running out, a
 * watchdog lock kept beyond its lease, a lease revoked behind the holder's
 * back (lost), reentrant holds, read/write and fair locks, extend, several
 * endpoints (a three-member cluster losing the client's member), etcds://
 * (certificates made by openssl), unsupported
 * capabilities, and `dlock run` / `dlock id next` (argv[1]: the CLI).
 * Skips (77) without the etcd binary. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "harness.h"

#include <stdatomic.h>

#define ETCD "/usr/bin/etcd"

static char g_dir[128];
static volatile pid_t g_etcd;
static volatile pid_t g_members[3]; /* the three-member cluster */
static volatile pid_t g_tls;        /* the etcd serving https */
static pid_t g_owner;
static int g_port;
static int g_peer;      /* g_etcd's peer port (etcd_restart) */
static char g_url[128];  /* etcd://127.0.0.1:PORT */
static char g_http[128]; /* http://127.0.0.1:PORT */

/* Stops every etcd; then rm -rf the dir. Async-signal-safe. */
static void etcd_stop(void) {
    if (getpid() != g_owner) return;
    th_stop_pid(&g_etcd, SIGTERM, 10000);
    for (int i = 0; i < 3; i++) th_stop_pid(&g_members[i], SIGTERM, 10000);
    th_stop_pid(&g_tls, SIGTERM, 10000);
    th_rm_rf(g_dir);
}

static void on_signal(int sig) {
    if (getpid() != g_owner) _exit(128 + sig);
    static const char m[] = "backend_etcd: signal; stopping etcd\n";
    (void)!write(2, m, sizeof m - 1);
    etcd_stop();
    _exit(sig == SIGALRM ? 1 : 128 + sig);
}

/* ---- plain HTTP to etcd, for what the test checks behind the library ---- */

typedef struct body {
    char *p;
    size_t n;
} body;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud) {
    body *b = ud;
    size_t len = size * nmemb;
    char *p = realloc(b->p, b->n + len + 1);
    if (!p) return 0;
    memcpy(p + b->n, ptr, len);
    b->p = p;
    b->n += len;
    b->p[b->n] = '\0';
    return len;
}

/* POSTs data (GET when NULL) to path; returns the malloc'd answer or NULL. */
static char *http(const char *path, const char *data) {
    CURL *h = curl_easy_init();
    ASSERT(h != NULL);
    char url[300];
    snprintf(url, sizeof url, "%s%s", g_http, path);
    body b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    if (data) curl_easy_setopt(h, CURLOPT_POSTFIELDS, data);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK || status != 200) {
        free(b.p);
        return NULL;
    }
    return b.p ? b.p : strdup("");
}

static void b64(const char *s, char *out) {
    static const char c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = strlen(s), o = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)u[i] << 16;
        if (i + 1 < len) v |= (unsigned)u[i + 1] << 8;
        if (i + 2 < len) v |= u[i + 2];
        out[o++] = c[(v >> 18) & 63];
        out[o++] = c[(v >> 12) & 63];
        out[o++] = i + 1 < len ? c[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? c[v & 63] : '=';
    }
    out[o] = '\0';
}

/* The documented key prefix of a lock: "dlock/lock/<len>/<name>/" (of a
 * semaphore's permits: "dlock/sem/<len>/<name>/l/"), and the range body for
 * all keys under it. */
static void range_body_of(const char *what, const char *name, const char *sub, char *out,
                          size_t outlen) {
    char pre[200], end[200], k[300], e[300];
    snprintf(pre, sizeof pre, "dlock/%s/%zu/%s/%s", what, strlen(name), name, sub);
    snprintf(end, sizeof end, "%s", pre);
    end[strlen(end) - 1]++;
    b64(pre, k);
    b64(end, e);
    snprintf(out, outlen, "{\"key\":\"%s\",\"range_end\":\"%s\"}", k, e);
}

static void range_body(const char *name, char *out, size_t outlen) {
    range_body_of("lock", name, "", out, outlen);
}

/* How many keys under a range body. */
static long count_keys(const char *q) {
    char *r = http("/v3/kv/range", q);
    ASSERT_MSG(r != NULL, "range %s failed", q);
    long n = 0;
    char *c = strstr(r, "\"count\":\"");
    if (c) n = atol(c + 9);
    free(r);
    return n;
}

/* How many keys a lock has in etcd (holder and waiters). */
static long keys_of(const char *name) {
    char q[700];
    range_body(name, q, sizeof q);
    return count_keys(q);
}

/* How many acquisitions (held or waiting) a semaphore has in etcd. */
static long sem_keys_of(const char *name) {
    char q[700];
    range_body_of("sem", name, "l/", q, sizeof q);
    return count_keys(q);
}

/* The lease id of the oldest (newest: the newest) key of a lock, as the
 * gateway writes it. */
static void lease_of_key(const char *name, int newest, char *id, size_t idlen) {
    char q[800];
    range_body(name, q, sizeof q);
    snprintf(q + strlen(q) - 1, sizeof q - strlen(q) + 1,
             ",\"sort_target\":\"CREATE\",\"sort_order\":\"%s\",\"limit\":1}",
             newest ? "DESCEND" : "ASCEND");
    char *r = http("/v3/kv/range", q);
    ASSERT(r != NULL);
    char *c = strstr(r, "\"lease\":\"");
    ASSERT_MSG(c != NULL, "no lease in %s", r);
    c += 9;
    size_t n = strcspn(c, "\"");
    ASSERT(n < idlen);
    memcpy(id, c, n);
    id[n] = '\0';
    free(r);
}

/* The leases the server has (granted and not expired or revoked). */
static long lease_count(void) {
    char *r = http("/v3/lease/leases", "{}");
    ASSERT_MSG(r != NULL, "lease list failed");
    long n = 0;
    for (const char *p = r; (p = strstr(p, "\"ID\"")); p += 4) n++;
    free(r);
    return n;
}

static void lease_of(const char *name, char *id, size_t idlen) {
    lease_of_key(name, 0, id, idlen);
}

/* The lost-lease callback's last reason (set on the keep-alive thread). */
static atomic_int g_lost_reason;

static void on_lost(dlock_lock *l, int reason, void *ud) {
    (void)l, (void)ud;
    atomic_store(&g_lost_reason, reason);
}

static void lease_revoke_http(const char *id) {
    char q[100];
    snprintf(q, sizeof q, "{\"ID\":\"%s\"}", id);
    char *r = http("/v3/lease/revoke", q);
    ASSERT_MSG(r != NULL, "revoke %s failed", id);
    free(r);
}

static void etcd_start(void) {
    if (access(ETCD, X_OK)) th_skip(ETCD " not found (apt-get install etcd-server)");
    const char *base = access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm";
    snprintf(g_dir, sizeof g_dir, "%s/dletcd.XXXXXX", base);
    ASSERT(mkdtemp(g_dir) != NULL);
    char log[200], data[200];
    snprintf(log, sizeof log, "%s/etcd.log", g_dir);
    snprintf(data, sizeof data, "%s/etcd", g_dir);
    for (int attempt = 0; attempt < 3; attempt++) {
        g_port = th_free_port();
        int peer = g_peer = th_free_port();
        char client[64], peerurl[64], cluster[80];
        snprintf(client, sizeof client, "http://127.0.0.1:%d", g_port);
        snprintf(peerurl, sizeof peerurl, "http://127.0.0.1:%d", peer);
        snprintf(cluster, sizeof cluster, "t=%s", peerurl);
        snprintf(g_http, sizeof g_http, "%s", client);
        snprintf(g_url, sizeof g_url, "etcd://127.0.0.1:%d", g_port);
        fflush(NULL);
        pid_t pid = fork();
        ASSERT(pid >= 0);
        if (pid == 0) {
            int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            execl(ETCD, ETCD, "--name", "t", "--data-dir", data, "--listen-client-urls", client,
                  "--advertise-client-urls", client, "--listen-peer-urls", peerurl,
                  "--initial-advertise-peer-urls", peerurl, "--initial-cluster", cluster,
                  (char *)NULL);
            _exit(127);
        }
        g_etcd = pid;
        for (int i = 0; i < 200; i++) {
            char *h = http("/health", NULL);
            int ok = h && strstr(h, "true");
            free(h);
            if (ok) {
                th_log("etcd up on port %d (%s)", g_port, g_dir);
                return;
            }
            if (waitpid(pid, NULL, WNOHANG) == pid) break; /* port taken? retry */
            th_sleep_ms(100);
        }
        if (waitpid(pid, NULL, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        g_etcd = 0;
        char rm[300];
        snprintf(rm, sizeof rm, "rm -rf '%s'", data);
        (void)!system(rm);
    }
    th_fail(__FILE__, __LINE__, "etcd did not start: see %s", log);
}

/* Stops g_etcd and starts it again on the same ports and data. */
static void etcd_restart(void) {
    th_stop_pid(&g_etcd, SIGTERM, 10000);
    char log[200], data[200], client[64], peerurl[64], cluster[80];
    snprintf(log, sizeof log, "%s/etcd.log", g_dir);
    snprintf(data, sizeof data, "%s/etcd", g_dir);
    snprintf(client, sizeof client, "http://127.0.0.1:%d", g_port);
    snprintf(peerurl, sizeof peerurl, "http://127.0.0.1:%d", g_peer);
    snprintf(cluster, sizeof cluster, "t=%s", peerurl);
    char *args[] = {ETCD, "--name", "t", "--data-dir", data, "--listen-client-urls", client,
                    "--advertise-client-urls", client, "--listen-peer-urls", peerurl,
                    "--initial-advertise-peer-urls", peerurl, "--initial-cluster", cluster,
                    NULL};
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(ETCD, args);
        _exit(127);
    }
    g_etcd = pid;
    for (int i = 0; i < 200; i++) {
        char *h = http("/health", NULL);
        int ok = h && strstr(h, "true");
        free(h);
        if (ok) return;
        th_sleep_ms(50);
    }
    th_fail(__FILE__, __LINE__, "etcd did not restart: see %s", log);
}

/* Starts etcd with args (NULL-terminated), output to log. */
static pid_t spawn_etcd(const char *log, char *const args[]) {
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(ETCD, args);
        _exit(127);
    }
    return pid;
}

static int healthy(int port) {
    char url[80];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/health", port);
    CURL *h = curl_easy_init();
    body b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    int ok = curl_easy_perform(h) == CURLE_OK && b.p && strstr(b.p, "true");
    curl_easy_cleanup(h);
    free(b.p);
    return ok;
}

static dlock_client *client_wd(int64_t watchdog_ms) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = g_url;
    o.watchdog_lease_ms = watchdog_ms;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    ASSERT_MSG(rc == DLOCK_OK, "client: %s: %s", dlock_strerror(rc), dlock_errmsg(c));
    return c;
}

static dlock_client *client(void) { return client_wd(0); }

static dlock_lock *lock(dlock_client *c, const char *name, dlock_kind kind) {
    dlock_lock *l = NULL;
    ASSERT_COK(c, dlock_lock_new(c, name, DLOCK_CSTR, kind, &l));
    return l;
}

/* ---- mutual exclusion and fencing across processes ---- */
#define NPROC 8
#define ROUNDS 25

static void test_counter(void) {
    char path[200];
    snprintf(path, sizeof path, "%s/counter", g_dir);
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fprintf(f, "0 0 0\n");
    fclose(f);
    pid_t kids[NPROC];
    int64_t t0 = th_now_ms();
    for (int k = 0; k < NPROC; k++) {
        kids[k] = th_fork();
        if (kids[k] == 0) {
            dlock_client *c = client();
            /* every exclusive kind: they exclude each other */
            static const dlock_kind kinds[] = {DLOCK_KIND_PLAIN, DLOCK_KIND_REENTRANT,
                                               DLOCK_KIND_WRITE, DLOCK_KIND_FAIR};
            dlock_lock *l = lock(c, "counter", kinds[k % 4]);
            for (int i = 0; i < ROUNDS; i++) {
                uint64_t fence = 0;
                /* half of them with an explicit lease: no keep-alive thread */
                int64_t lease = k % 4 < 2 ? DLOCK_WATCHDOG : 20000;
                if (dlock_acquire(l, DLOCK_WAIT_FOREVER, lease, &fence)) {
                    fprintf(stderr, "acquire: %s\n", dlock_lock_errmsg(l));
                    _exit(3);
                }
                /* read, then write: not atomic */
                FILE *in = fopen(path, "r");
                long long v = 0, bad = 0;
                unsigned long long last = 0;
                if (!in || fscanf(in, "%lld %llu %lld", &v, &last, &bad) != 3) _exit(4);
                fclose(in);
                if (i % 5 == 0) usleep(2000);
                FILE *out = fopen(path, "w");
                if (!out) _exit(5);
                fprintf(out, "%lld %llu %lld\n", v + 1, (unsigned long long)fence,
                        bad + (fence > last ? 0 : 1));
                fclose(out);
                int held = 0;
                if (i == 0 && (dlock_lock_check(l, &held, NULL) || !held)) _exit(6);
                if (dlock_release(l)) {
                    fprintf(stderr, "release: %s\n", dlock_lock_errmsg(l));
                    _exit(7);
                }
            }
            dlock_lock_free(l);
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int k = 0; k < NPROC; k++) ASSERT_EQ(th_wait_child(kids[k], 80000), 0);
    f = fopen(path, "r");
    ASSERT(f != NULL);
    long long v = 0, bad = 0;
    unsigned long long last = 0;
    ASSERT_EQ(fscanf(f, "%lld %llu %lld", &v, &last, &bad), 3);
    fclose(f);
    th_log("counter %lld (want %d) in %lld ms; fence went backwards %lld times; last fence %llu",
           v, NPROC * ROUNDS, (long long)(th_now_ms() - t0), bad, last);
    ASSERT_EQ(v, NPROC * ROUNDS);
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(keys_of("counter"), 0);
    dlock_client *c = client();
    uint64_t fc = 0;
    ASSERT_COK(c, dlock_fence_current(c, "counter", DLOCK_CSTR, &fc));
    ASSERT_U64_GT(fc, last);
    dlock_client_free(c);
}

/* ---- a killed holder with a short lease; try-once and timed waits ---- */
static void test_crash_and_waits(void) {
    int p[2];
    ASSERT(pipe(p) == 0);
    pid_t kid = th_fork();
    if (kid == 0) {
        close(p[0]);
        dlock_client *c = client();
        dlock_lock *l = lock(c, "crash", DLOCK_KIND_PLAIN);
        if (dlock_acquire(l, 0, 2000, NULL)) _exit(3);
        (void)!write(p[1], "x", 1);
        for (;;) pause();
    }
    close(p[1]);
    char ch;
    ASSERT_EQ(read(p[0], &ch, 1), 1);
    close(p[0]);
    dlock_client *c = client();
    dlock_lock *l = lock(c, "crash", DLOCK_KIND_PLAIN);
    int locked = 0;
    ASSERT_COK(c, dlock_is_locked(c, "crash", DLOCK_CSTR, &locked));
    ASSERT_EQ(locked, 1);
    int64_t ttl = 0;
    ASSERT_COK(c, dlock_remaining_ttl(c, "crash", DLOCK_CSTR, &ttl));
    ASSERT(ttl > 0 && ttl <= 2000);
    int64_t t0 = th_now_ms();
    ASSERT_LCODE(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    th_log("try once: busy in %lld ms: %s", (long long)(th_now_ms() - t0), dlock_lock_errmsg(l));
    ASSERT_EQ(keys_of("crash"), 1);
    t0 = th_now_ms();
    ASSERT_LCODE(l, dlock_acquire(l, 300, 5000, NULL), DLOCK_ETIMEDOUT);
    int64_t el = th_now_ms() - t0;
    th_log("timed 300 ms: timed out after %lld ms: %s", (long long)el, dlock_lock_errmsg(l));
    ASSERT_GE(el, 290);
    ASSERT_LT(el, 1500);
    ASSERT_EQ(keys_of("crash"), 1);
    /* kill -9 the holder: its 2 s lease runs out */
    ASSERT(kill(kid, SIGKILL) == 0);
    int64_t killed_at = th_now_ms();
    ASSERT_EQ(th_wait_child(kid, 5000), 128 + SIGKILL);
    ASSERT_LOK(l, dlock_acquire(l, 10000, 5000, NULL));
    el = th_now_ms() - killed_at;
    th_log("holder killed: lock taken over %lld ms after the kill", (long long)el);
    ASSERT_LT(el, 4000);
    int64_t valid = dlock_lock_valid_ms(l);
    ASSERT(valid > 3000 && valid <= 5000);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_COK(c, dlock_is_locked(c, "crash", DLOCK_CSTR, &locked));
    ASSERT_EQ(locked, 0);
    ASSERT_COK(c, dlock_remaining_ttl(c, "crash", DLOCK_CSTR, &ttl));
    ASSERT_EQ(ttl, -2);
    ASSERT_EQ(keys_of("crash"), 0);
    dlock_lock_free(l);
    dlock_client_free(c);
}

/* ---- waiters in line: FIFO by create_revision, one woken per release ---- */
static void test_handoff(void) {
    dlock_client *c = client();
    dlock_lock *a = lock(c, "line", DLOCK_KIND_PLAIN);
    uint64_t fa = 0;
    ASSERT_LOK(a, dlock_acquire(a, 0, 10000, &fa));
    pid_t kids[3];
    for (int k = 0; k < 3; k++) {
        kids[k] = th_fork();
        if (kids[k] == 0) {
            dlock_client *cc = client();
            dlock_lock *l = lock(cc, "line", DLOCK_KIND_PLAIN);
            uint64_t f = 0;
            if (dlock_acquire(l, 15000, 10000, &f)) _exit(3);
            th_sleep_ms(100);
            if (dlock_release(l)) _exit(4);
            dlock_lock_free(l);
            dlock_client_free(cc);
            _exit(f > fa ? 0 : 5);
        }
        ASSERT_EVENTUALLY(keys_of("line") == k + 2, 5000);
    }
    int64_t t0 = th_now_ms();
    ASSERT_LOK(a, dlock_release(a));
    for (int k = 0; k < 3; k++) ASSERT_EQ(th_wait_child(kids[k], 20000), 0);
    th_log("3 waiters served one after the other in %lld ms", (long long)(th_now_ms() - t0));
    ASSERT_EQ(keys_of("line"), 0);

    /* a waiter whose lease goes while it waits: it queues again with a new one */
    ASSERT_LOK(a, dlock_acquire(a, 0, 10000, &fa));
    pid_t kid = th_fork();
    if (kid == 0) {
        dlock_client *cc = client();
        dlock_lock *l = lock(cc, "line", DLOCK_KIND_PLAIN);
        int held = 0;
        if (dlock_acquire(l, 15000, 3000, NULL)) _exit(3);
        if (dlock_lock_check(l, &held, NULL) || !held) _exit(4);
        if (dlock_release(l)) _exit(5);
        dlock_lock_free(l);
        dlock_client_free(cc);
        _exit(0);
    }
    ASSERT_EVENTUALLY(keys_of("line") == 2, 5000);
    char id[40], id2[40];
    lease_of_key("line", 1, id, sizeof id);
    lease_revoke_http(id);
    ASSERT_EQ(keys_of("line"), 1);
    /* the waiter notices at its next keep-alive (a third of 3 s) */
    int requeued = 0;
    for (int i = 0; i < 50 && !requeued; i++) {
        th_sleep_ms(100);
        if (keys_of("line") == 2) {
            lease_of_key("line", 1, id2, sizeof id2);
            requeued = strcmp(id, id2) != 0;
        }
    }
    ASSERT(requeued);
    ASSERT_LOK(a, dlock_release(a));
    ASSERT_EQ(th_wait_child(kid, 10000), 0);
    th_log("a waiter whose lease was revoked queued again and got the lock");
    ASSERT_EQ(keys_of("line"), 0);
    dlock_lock_free(a);
    dlock_client_free(c);
}

/* ---- read/write and fair (explicit leases: no keep-alive thread, so the
 * child may be forked) ---- */
static void test_rw_fair(void) {
    dlock_client *c = client();
    dlock_lock *r1 = lock(c, "rw", DLOCK_KIND_READ);
    dlock_lock *r2 = lock(c, "rw", DLOCK_KIND_READ);
    dlock_lock *w = lock(c, "rw", DLOCK_KIND_WRITE);
    dlock_lock *w2 = lock(c, "rw", DLOCK_KIND_WRITE);
    ASSERT_LOK(r1, dlock_acquire(r1, 0, 10000, NULL));
    ASSERT_LOK(r2, dlock_acquire(r2, 1000, 10000, NULL));
    ASSERT_LCODE(w, dlock_acquire(w, 0, 10000, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(w, dlock_acquire(w, 100, 10000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_EQ(keys_of("rw"), 2);
    dlock_info info;
    ASSERT_COK(c, dlock_inspect(c, "rw", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.readers, 2);
    ASSERT_EQ(info.writer, 0);
    ASSERT_EQ(info.holders, 2);
    int held = 0;
    ASSERT_LOK(r1, dlock_lock_check(r1, &held, NULL));
    ASSERT_EQ(held, 1);
    ASSERT_LOK(r1, dlock_release(r1));
    ASSERT_LCODE(w, dlock_acquire(w, 0, 10000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(r2, dlock_release(r2));
    ASSERT_LOK(w, dlock_acquire(w, 0, 10000, NULL));
    ASSERT_LCODE(r1, dlock_acquire(r1, 0, 10000, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(w2, dlock_acquire(w2, 0, 10000, NULL), DLOCK_EBUSY);
    ASSERT_COK(c, dlock_inspect(c, "rw", DLOCK_CSTR, &info));
    ASSERT_EQ(info.readers, 0);
    ASSERT_EQ(info.writer, 1);
    ASSERT_STR_EQ(info.holder, dlock_lock_token(w));
    ASSERT_LOK(w, dlock_release(w));
    ASSERT_COK(c, dlock_inspect(c, "rw", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 0);
    /* a writer waiting behind a reader holds back the readers after it */
    ASSERT_LOK(r1, dlock_acquire(r1, 0, 10000, NULL));
    pid_t kid = th_fork();
    if (kid == 0) {
        dlock_client *cc = client();
        dlock_lock *l = lock(cc, "rw", DLOCK_KIND_WRITE);
        if (dlock_acquire(l, 10000, 10000, NULL)) _exit(3);
        th_sleep_ms(300);
        if (dlock_release(l)) _exit(4);
        dlock_lock_free(l);
        dlock_client_free(cc);
        _exit(0);
    }
    ASSERT_EVENTUALLY(keys_of("rw") == 2, 5000);
    ASSERT_LCODE(r2, dlock_acquire(r2, 0, 10000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(r1, dlock_release(r1));
    ASSERT_LOK(r2, dlock_acquire(r2, 10000, 10000, NULL));
    ASSERT_EQ(th_wait_child(kid, 5000), 0);
    ASSERT_LOK(r2, dlock_release(r2));
    th_log("read/write: readers share, writers exclude, a waiting writer is not starved");
    /* fair: first come, first served, excluding plain holders of the name */
    dlock_lock *f = lock(c, "rw", DLOCK_KIND_FAIR);
    ASSERT_LOK(f, dlock_acquire(f, 0, 10000, NULL));
    ASSERT_LOK(f, dlock_acquire(f, 0, 10000, NULL));
    ASSERT_LCODE(w, dlock_acquire(w, 0, 10000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(f, dlock_release(f));
    ASSERT_LOK(f, dlock_release(f));
    ASSERT_EQ(keys_of("rw"), 0);
    dlock_lock_free(f);
    dlock_lock_free(r1);
    dlock_lock_free(r2);
    dlock_lock_free(w);
    dlock_lock_free(w2);
    dlock_client_free(c);
}

/* ---- watchdog beyond the lease, lost leases, reentrant, extend ---- */
static void test_leases(void) {
    /* a 2 s lease kept alive: held well beyond it */
    dlock_client *c = client_wd(2000);
    dlock_client *c2 = client();
    dlock_lock *l = lock(c, "wd", DLOCK_KIND_PLAIN);
    dlock_lock *o = lock(c2, "wd", DLOCK_KIND_PLAIN);
    uint64_t f1 = 0, f2 = 0;
    ASSERT_LOK(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, &f1));
    th_sleep_ms(5000);
    int held = 0;
    int64_t n = 0;
    ASSERT_LOK(l, dlock_lock_check(l, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(dlock_lock_is_lost(l), 0);
    ASSERT_LCODE(o, dlock_acquire(o, 0, 5000, NULL), DLOCK_EBUSY);
    th_log("watchdog: still held after 5 s on a 2 s lease");
    uint64_t fc = 0;
    ASSERT_COK(c2, dlock_fence_current(c2, "wd", DLOCK_CSTR, &fc));
    ASSERT_U64_EQ(fc, f1);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_LOK(o, dlock_acquire(o, 0, 5000, &f2));
    ASSERT_U64_GT(f2, f1);
    ASSERT_LOK(o, dlock_release(o));

    /* an explicit lease revoked behind the holder's back */
    char id[40];
    ASSERT_LOK(l, dlock_acquire(l, 0, 30000, NULL));
    lease_of("wd", id, sizeof id);
    lease_revoke_http(id);
    ASSERT_LOK(l, dlock_lock_check(l, &held, &n));
    ASSERT_EQ(held, 0);
    ASSERT_LCODE(l, dlock_release(l), DLOCK_ELOST);
    th_log("lease revoked: check says not held, release: %s", dlock_lock_errmsg(l));
    ASSERT_EQ(dlock_lock_holding(l), 0);

    /* a watchdog lease revoked: the keep-alive notices, and tells */
    dlock_lock_on_lost(l, on_lost, NULL);
    ASSERT_LOK(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL));
    lease_of("wd", id, sizeof id);
    lease_revoke_http(id);
    ASSERT_EVENTUALLY(dlock_lock_is_lost(l), 3000);
    ASSERT_EVENTUALLY(atomic_load(&g_lost_reason) == DLOCK_LOST_TAKEN, 3000);
    ASSERT_EQ(dlock_lock_valid_ms(l), 0);
    ASSERT_LCODE(l, dlock_release(l), DLOCK_ELOST);
    th_log("watchdog lease revoked: lost, release: %s", dlock_lock_errmsg(l));

    /* reentrant: holds counted by the handle, one token */
    dlock_lock *re = lock(c, "re", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(re, dlock_acquire(re, 0, DLOCK_WATCHDOG, &f1));
    ASSERT_LOK(re, dlock_acquire(re, 0, DLOCK_WATCHDOG, &f2));
    ASSERT_U64_EQ(f2, f1);
    ASSERT_LOK(re, dlock_lock_check(re, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(n, 2);
    dlock_info info;
    ASSERT_COK(c2, dlock_inspect(c2, "re", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_U64_EQ(info.fence, f1);
    ASSERT_STR_EQ(info.holder, dlock_lock_token(re));
    ASSERT_LOK(re, dlock_release(re));
    ASSERT_EQ(dlock_lock_holding(re), 1);
    dlock_lock *other = lock(c2, "re", DLOCK_KIND_PLAIN);
    ASSERT_LCODE(other, dlock_acquire(other, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_LOK(re, dlock_release(re));
    ASSERT_EQ(dlock_lock_holding(re), 0);
    ASSERT_EQ(keys_of("re"), 0);
    ASSERT_LOK(other, dlock_acquire(other, 0, DLOCK_WATCHDOG, NULL));
    dlock_lock_free(other); /* frees while holding: released */
    ASSERT_EQ(keys_of("re"), 0);

    /* extend: a new lease for the same key (same token) */
    ASSERT_LOK(l, dlock_acquire(l, 0, 2000, &f1));
    ASSERT_LOK(l, dlock_extend(l, 8000));
    th_sleep_ms(3500);
    ASSERT_LOK(l, dlock_lock_check(l, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_COK(c2, dlock_fence_current(c2, "wd", DLOCK_CSTR, &fc));
    ASSERT_U64_EQ(fc, f1);
    /* extend after the lease was revoked behind the holder's back: lost,
     * and the lease granted for the extension is revoked again */
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_LOK(l, dlock_acquire(l, 0, 30000, NULL));
    lease_of("wd", id, sizeof id);
    long leases0 = lease_count();
    lease_revoke_http(id);
    ASSERT_LCODE(l, dlock_extend(l, 8000), DLOCK_ELOST);
    th_log("extend after the lease was revoked: %s", dlock_lock_errmsg(l));
    ASSERT_EQ(dlock_lock_holding(l), 0);
    ASSERT_EQ(keys_of("wd"), 0);
    ASSERT_EQ(lease_count(), leases0 - 1);
    /* from the watchdog to an explicit lease */
    ASSERT_LOK(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(l, dlock_extend(l, 3000));
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(keys_of("wd"), 0);

    dlock_lock_free(re);
    dlock_lock_free(o);
    dlock_lock_free(l);
    dlock_client_free(c);
    dlock_client_free(c2);
}

/* ---- endpoints, facts, what the backend lacks, and bad URLs ---- */
static int list_cb(const char *name, size_t len, const dlock_info *info, void *ud) {
    (void)name, (void)len, (void)info, (void)ud;
    return 0;
}

static void want_etcd_msg(const char *msg) {
    ASSERT_MSG(strstr(msg, "not supported by the etcd backend") != NULL,
               "message does not name the backend: %s", msg);
}

static void test_unsupported_and_errors(void) {
    /* the first endpoint refuses: the second answers */
    dlock_options o;
    dlock_options_init(&o);
    char url[200];
    snprintf(url, sizeof url, "etcd://127.0.0.1:1,127.0.0.1:%d/", g_port);
    o.url = url;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    dlock_lock *l = lock(c, "multi", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, 0, 5000, NULL));
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    char buf[200];
    ASSERT_COK(c, dlock_server_fact(c, "endpoint", buf, sizeof buf));
    ASSERT_STR_EQ(buf, g_http);
    ASSERT_COK(c, dlock_server_fact(c, "version", buf, sizeof buf));
    th_log("server version %s", buf);
    ASSERT(strchr(buf, '.') != NULL);
    ASSERT_COK(c, dlock_server_fact(c, "session", buf, sizeof buf));
    th_log("session: %s", buf);
    ASSERT(strstr(buf, "lease") != NULL);
    ASSERT_COK(c, dlock_server_fact(c, "backend", buf, sizeof buf));
    ASSERT_STR_EQ(buf, "etcd");
    ASSERT_COK(c, dlock_server_fact(c, "revision", buf, sizeof buf));
    ASSERT(atoll(buf) > 0);
    ASSERT_CCODE(c, dlock_server_fact(c, "nonsense", buf, sizeof buf), DLOCK_ESERVER);
    int64_t rtt = 0;
    ASSERT_COK(c, dlock_ping(c, &rtt));

    dlock_permits *pm = NULL;
    ASSERT_CCODE(c, dlock_permits_new(c, "pm", DLOCK_CSTR, &pm), DLOCK_ENOTSUP);
    want_etcd_msg(dlock_errmsg(c));
    th_log("permit-expirable semaphore: %s", dlock_errmsg(c));
    char tok[DLOCK_TOKEN_LEN + 1];
    ASSERT_CCODE(c, dlock_acquire_token(c, "t", DLOCK_CSTR, 0, 1000, tok, NULL), DLOCK_ENOTSUP);
    want_etcd_msg(dlock_errmsg(c));
    ASSERT_CCODE(c, dlock_list(c, NULL, list_cb, NULL), DLOCK_ENOTSUP);
    want_etcd_msg(dlock_errmsg(c));
    int existed = 0;
    ASSERT_CCODE(c, dlock_force_unlock(c, "x", DLOCK_CSTR, &existed), DLOCK_ENOTSUP);
    want_etcd_msg(dlock_errmsg(c));
    dlock_client_free(c);

    struct {
        const char *url;
        int want;
    } bad[] = {
        {"etcds://127.0.0.1:1", DLOCK_EIO},
        {"etcd://user:pw@127.0.0.1:2379", DLOCK_ENOTSUP},
        {"etcd://127.0.0.1:1", DLOCK_EIO},
        {"etcd://127.0.0.1:99999", DLOCK_EINVAL},
        {"etcd://", DLOCK_EINVAL},
        {"etcd://a,,b", DLOCK_EINVAL},
        {"etcd://127.0.0.1:2379/x?y", DLOCK_EINVAL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dlock_options_init(&o);
        o.url = bad[i].url;
        o.connect_timeout_ms = 2000;
        dlock_client *bc = NULL;
        int rc = dlock_client_new(&o, &bc);
        const char *m = dlock_errmsg(bc);
        th_log("%s -> %s: %s", bad[i].url, dlock_strerror(rc), m);
        ASSERT_CCODE(bc, rc, bad[i].want);
        ASSERT(m[0] != '\0');
        ASSERT(strstr(m, "pw@") == NULL);
        dlock_client_free(bc);
    }
}

/* ---- the CLI ---- */
static int run_cli(char *const argv[], char *buf, size_t buflen) {
    char out[300];
    snprintf(out, sizeof out, "%s/cli.out", g_dir);
    return th_run_capture(argv, out, buf, buflen, 20000);
}

static void test_cli(const char *cli) {
    if (!cli || access(cli, X_OK)) {
        th_skip_part("CLI not given or not built (%s): `dlock run`", cli ? cli : "none");
        return;
    }
    char buf[512];
    char *run[] = {(char *)cli, "--url", g_url, "run", "cli-lock", "--", "sh", "-c",
                   "echo fence=$DLOCK_FENCE", NULL};
    int st = run_cli(run, buf, sizeof buf);
    th_log("dlock run: exit %d, output: %s", st, buf);
    ASSERT_EQ(st, 0);
    char *f = strstr(buf, "fence=");
    ASSERT(f != NULL);
    ASSERT(atoll(f + 6) > 0);
    ASSERT_EQ(keys_of("cli-lock"), 0);
    /* --limit: a permit of the semaphore, kept by the keep-alive thread */
    char *lim[] = {(char *)cli, "--url", g_url, "run", "--limit", "2", "cli-sem", "--", "sh",
                   "-c", "exit 7", NULL};
    st = run_cli(lim, buf, sizeof buf);
    th_log("dlock run --limit 2: exit %d: %s", st, buf);
    ASSERT_EQ(st, 7);
    ASSERT_EQ(sem_keys_of("cli-sem"), 0);
    char *id[] = {(char *)cli, "--url", g_url, "id", "next", NULL};
    st = run_cli(id, buf, sizeof buf);
    th_log("dlock id next: exit %d, output: %s", st, buf);
    ASSERT_NE(st, 0);
    ASSERT(strstr(buf, "not supported by the etcd backend") != NULL);
    /* doctor asks the backend's questions, none of Redis's */
    char doc_out[2048];
    char *doc[] = {(char *)cli, "--url", g_url, "doctor", NULL};
    st = run_cli(doc, doc_out, sizeof doc_out);
    th_log("dlock doctor: exit %d:\n%s", st, doc_out);
    ASSERT_EQ(st, 0);
    ASSERT(strstr(doc_out, "PASS  version      etcd 3.") != NULL);
    ASSERT(strstr(doc_out, "PASS  session ") != NULL);
    ASSERT(strstr(doc_out, "PASS  lock ") != NULL);
    ASSERT(strstr(doc_out, "latency") != NULL);
    ASSERT(strstr(doc_out, "FAIL  ") == NULL);
    ASSERT(strstr(doc_out, "maxmemory") == NULL);
    ASSERT_EQ(keys_of("dlock:doctor"), 0);
}

/* ---- a three-member cluster: the client moves on when its member dies ---- */
static void test_cluster(void) {
    int cport[3], pport[3];
    char curl_[3][64], purl[3][64], cluster[300] = "", log[200], data[3][200];
    for (int i = 0; i < 3; i++) {
        cport[i] = th_free_port();
        pport[i] = th_free_port();
        snprintf(curl_[i], sizeof curl_[i], "http://127.0.0.1:%d", cport[i]);
        snprintf(purl[i], sizeof purl[i], "http://127.0.0.1:%d", pport[i]);
        snprintf(data[i], sizeof data[i], "%s/member%d", g_dir, i);
        size_t n = strlen(cluster);
        snprintf(cluster + n, sizeof cluster - n, "%sm%d=%s", i ? "," : "", i, purl[i]);
    }
    snprintf(log, sizeof log, "%s/cluster.log", g_dir);
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof name, "m%d", i);
        char *args[] = {ETCD, "--name", name, "--data-dir", data[i], "--listen-client-urls",
                        curl_[i], "--advertise-client-urls", curl_[i], "--listen-peer-urls",
                        purl[i], "--initial-advertise-peer-urls", purl[i], "--initial-cluster",
                        cluster, "--initial-cluster-state", "new", "--initial-cluster-token",
                        "dlock-test", NULL};
        g_members[i] = spawn_etcd(log, args);
    }
    int up = 0;
    for (int t = 0; t < 150 && !up; t++) {
        up = healthy(cport[0]) && healthy(cport[1]) && healthy(cport[2]);
        if (!up) th_sleep_ms(100);
    }
    if (!up) {
        th_skip_part("the three-member cluster did not come up (ports taken?); see %s", log);
        for (int i = 0; i < 3; i++) th_stop_pid(&g_members[i], SIGTERM, 10000);
        return;
    }
    char url[300];
    snprintf(url, sizeof url, "etcd://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", cport[0],
             cport[1], cport[2]);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.watchdog_lease_ms = 3000;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    dlock_lock *l = lock(c, "cluster", DLOCK_KIND_PLAIN);
    uint64_t f1 = 0, f2 = 0;
    ASSERT_LOK(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, &f1));
    char ep[100];
    ASSERT_COK(c, dlock_server_fact(c, "endpoint", ep, sizeof ep));
    int dead = -1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(ep, curl_[i])) dead = i;
    ASSERT(dead >= 0);
    th_stop_pid(&g_members[dead], SIGTERM, 10000);
    th_log("member %s stopped while holding", ep);
    th_sleep_ms(4000); /* over a lease: renewed through the others */
    int held = 0;
    ASSERT_LOK(l, dlock_lock_check(l, &held, NULL));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(dlock_lock_is_lost(l), 0);
    char ep2[100];
    ASSERT_COK(c, dlock_server_fact(c, "endpoint", ep2, sizeof ep2));
    ASSERT(strcmp(ep, ep2) != 0);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_LOK(l, dlock_acquire(l, 1000, 5000, &f2));
    ASSERT_U64_GT(f2, f1);
    ASSERT_LOK(l, dlock_release(l));
    th_log("cluster: lock kept through the loss of its member, now on %s", ep2);
    dlock_lock_free(l);
    dlock_client_free(c);
    for (int i = 0; i < 3; i++) th_stop_pid(&g_members[i], SIGTERM, 10000);
}

/* ---- etcds:// ---- */
static void sh(const char *cmd) {
    int st = system(cmd);
    ASSERT_MSG(st == 0, "%s: exit %d", cmd, st);
}

static int healthy_tls(int port, const char *dir) {
    char url[80], ca[240], crt[240], key[240];
    snprintf(url, sizeof url, "https://127.0.0.1:%d/health", port);
    snprintf(ca, sizeof ca, "%s/ca.crt", dir);
    snprintf(crt, sizeof crt, "%s/client.crt", dir);
    snprintf(key, sizeof key, "%s/client.key", dir);
    CURL *h = curl_easy_init();
    body b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
    curl_easy_setopt(h, CURLOPT_CAINFO, ca);
    curl_easy_setopt(h, CURLOPT_SSLCERT, crt);
    curl_easy_setopt(h, CURLOPT_SSLKEY, key);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    int ok = curl_easy_perform(h) == CURLE_OK && b.p && strstr(b.p, "true");
    curl_easy_cleanup(h);
    free(b.p);
    return ok;
}

static void test_tls(void) {
    if (system("command -v openssl >/dev/null 2>&1") != 0) {
        th_skip_part("openssl not installed: etcds://");
        return;
    }
    char dir[200], cmd[1200];
    snprintf(dir, sizeof dir, "%s/tls", g_dir);
    ASSERT(mkdir(dir, 0700) == 0);
    /* a CA, another CA, and server + client certificates from the first */
    for (int i = 0; i < 2; i++) {
        const char *n = i ? "other" : "ca";
        snprintf(cmd, sizeof cmd,
                 "cd %s && openssl req -x509 -newkey rsa:2048 -noenc -days 2 -subj /CN=%s "
                 "-keyout %s.key -out %s.crt >/dev/null 2>&1",
                 dir, n, n, n);
        sh(cmd);
    }
    snprintf(cmd, sizeof cmd,
             "cd %s && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext", dir);
    sh(cmd);
    for (int i = 0; i < 2; i++) {
        const char *n = i ? "client" : "server";
        snprintf(cmd, sizeof cmd,
                 "cd %s && openssl req -newkey rsa:2048 -noenc -subj /CN=localhost -keyout "
                 "%s.key -out %s.csr >/dev/null 2>&1 && openssl x509 -req -days 2 -in %s.csr "
                 "-CA ca.crt -CAkey ca.key -CAcreateserial -extfile san.ext -out %s.crt "
                 ">/dev/null 2>&1",
                 dir, n, n, n, n);
        sh(cmd);
    }
    int port = th_free_port(), peer = th_free_port();
    char client[64], peerurl[64], cluster[80], data[220], log[220];
    char f[5][220];
    snprintf(client, sizeof client, "https://127.0.0.1:%d", port);
    snprintf(peerurl, sizeof peerurl, "http://127.0.0.1:%d", peer);
    snprintf(cluster, sizeof cluster, "t=%s", peerurl);
    snprintf(data, sizeof data, "%s/etcd", dir);
    snprintf(log, sizeof log, "%s/etcd.log", dir);
    const char *names[5] = {"server.crt", "server.key", "ca.crt", "client.crt", "client.key"};
    for (int i = 0; i < 5; i++) snprintf(f[i], sizeof f[i], "%s/%s", dir, names[i]);
    char *args[] = {ETCD, "--name", "t", "--data-dir", data, "--listen-client-urls", client,
                    "--advertise-client-urls", client, "--listen-peer-urls", peerurl,
                    "--initial-advertise-peer-urls", peerurl, "--initial-cluster", cluster,
                    "--cert-file", f[0], "--key-file", f[1], "--client-cert-auth",
                    "--trusted-ca-file", f[2], NULL};
    g_tls = spawn_etcd(log, args);
    int up = 0;
    for (int t = 0; t < 100 && !up; t++) {
        up = healthy_tls(port, dir);
        if (!up) th_sleep_ms(100);
    }
    if (!up) {
        th_skip_part("etcd with TLS did not come up (port taken?); see %s", log);
        th_stop_pid(&g_tls, SIGTERM, 10000);
        return;
    }
    char url[100];
    snprintf(url, sizeof url, "etcds://127.0.0.1:%d", port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.tls_ca_file = f[2];
    o.tls_cert_file = f[3];
    o.tls_key_file = f[4];
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    dlock_lock *l = lock(c, "tls", DLOCK_KIND_PLAIN);
    dlock_lock *l2 = lock(c, "tls", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, 0, 5000, NULL));
    ASSERT_LCODE(l2, dlock_acquire(l2, 200, 5000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_LOK(l2, dlock_acquire(l2, 0, 5000, NULL));
    ASSERT_LOK(l2, dlock_release(l2));
    char ep[100];
    ASSERT_COK(c, dlock_server_fact(c, "endpoint", ep, sizeof ep));
    ASSERT_STR_EQ(ep, client);
    dlock_lock_free(l);
    dlock_lock_free(l2);
    dlock_client_free(c);
    th_log("etcds:// with a client certificate: lock, wait, release");
    /* the wrong CA, or the system's: refused */
    struct {
        const char *ca, *cert, *key, *sni;
        int insecure, want;
    } cases[] = {
        {"other.crt", "client.crt", "client.key", NULL, 0, DLOCK_ETLS},
        {NULL, "client.crt", "client.key", NULL, 0, DLOCK_ETLS},
        {NULL, "client.crt", "client.key", NULL, 1, DLOCK_OK},
        {"ca.crt", "client.crt", NULL, NULL, 0, DLOCK_EINVAL},
        {"ca.crt", "client.crt", "client.key", "localhost", 0, DLOCK_ENOTSUP},
        {"ca.crt", NULL, NULL, NULL, 0, -1}, /* no client certificate: refused somehow */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char ca[220], crt[220], key[220];
        snprintf(ca, sizeof ca, "%s/%s", dir, cases[i].ca ? cases[i].ca : "");
        snprintf(crt, sizeof crt, "%s/%s", dir, cases[i].cert ? cases[i].cert : "");
        snprintf(key, sizeof key, "%s/%s", dir, cases[i].key ? cases[i].key : "");
        dlock_options_init(&o);
        o.url = url;
        o.tls_ca_file = cases[i].ca ? ca : NULL;
        o.tls_cert_file = cases[i].cert ? crt : NULL;
        o.tls_key_file = cases[i].key ? key : NULL;
        o.tls_server_name = cases[i].sni;
        o.tls_insecure = cases[i].insecure;
        c = NULL;
        int rc = dlock_client_new(&o, &c);
        th_log("TLS case %zu: %s: %s", i, dlock_strerror(rc), dlock_errmsg(c));
        if (cases[i].want >= 0) ASSERT_CCODE(c, rc, cases[i].want);
        else ASSERT_NE(rc, DLOCK_OK);
        dlock_client_free(c);
    }
    th_stop_pid(&g_tls, SIGTERM, 10000);
}


/* ---- semaphores ---- */


/* 10 processes on 3 permits (th_check_semaphore_procs); no key left. */
static void test_sem_procs(void) {
    th_check_semaphore_procs(client, "sem:procs", 3, 10, 3);
    ASSERT_EQ(sem_keys_of("sem:procs"), 0);
}

/* A waiter thread on its own client: acquire g_wpermits of g_wname waiting
 * a->wait_ms; a->rc its answer; holds 10 ms, releases. g_worder: the
 * order in which the waiters got their permits. */
static const char *g_wname;
static int64_t g_wpermits = 1;
static atomic_int g_wnext, g_worder[16];

typedef struct sem_arg {
    dlock_client *c;
    int idx;
    int64_t wait_ms;
    atomic_int rc; /* -1 until the acquire returned */
} sem_arg;

static void *sem_waiter(void *arg) {
    sem_arg *a = arg;
    dlock_semaphore *s = NULL;
    int rc = dlock_semaphore_new(a->c, g_wname, DLOCK_CSTR, &s);
    if (!rc) rc = dlock_semaphore_acquire(s, g_wpermits, a->wait_ms);
    a->rc = rc;
    if (!rc) {
        atomic_store(&g_worder[atomic_fetch_add(&g_wnext, 1)], a->idx);
        usleep(10000);
        a->rc = dlock_semaphore_release(s, g_wpermits);
    }
    dlock_semaphore_free(s);
    return NULL;
}

static atomic_int g_sem_lost;
static void on_sem_lost(dlock_semaphore *s, int reason, void *ud) {
    (void)s, (void)ud;
    atomic_store(&g_sem_lost, reason);
}

static void *cancel_later(void *arg) {
    th_sleep_ms(300);
    dlock_semaphore_cancel(arg);
    return NULL;
}

static void test_sem_calls(void) {
    dlock_client *c = client_wd(3000), *c2 = client();
    dlock_semaphore *s = th_sem(c, "sem:calls"), *o = th_sem(c2, "sem:calls");
    int set = 0;
    /* unset: nothing available; a try refused, leaving no key */
    ASSERT_EQ(th_sem_available(s), 0);
    ASSERT_SCODE(s, dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT), DLOCK_EBUSY);
    ASSERT_EQ(sem_keys_of("sem:calls"), 0);
    ASSERT_SOK(s, dlock_semaphore_try_set(s, 3, &set));
    ASSERT_EQ(set, 1);
    ASSERT_SOK(o, dlock_semaphore_try_set(o, 7, &set));
    ASSERT_EQ(set, 0);
    ASSERT_EQ(th_sem_available(o), 3);
    ASSERT_SOK(s, dlock_semaphore_acquire(s, 2, DLOCK_NOWAIT));
    ASSERT_EQ(th_sem_available(o), 1);
    ASSERT_SCODE(o, dlock_semaphore_acquire(o, 2, DLOCK_NOWAIT), DLOCK_EBUSY);
    int64_t t0 = th_now_ms();
    ASSERT_SCODE(o, dlock_semaphore_acquire(o, 2, 300), DLOCK_ETIMEDOUT);
    ASSERT_GE(th_now_ms() - t0, 250);
    ASSERT_EQ(sem_keys_of("sem:calls"), 1); /* only the holder's */
    /* permits are owned: a handle gives back only its own */
    ASSERT_SCODE(o, dlock_semaphore_release(o, 1), DLOCK_EINVAL);
    ASSERT_SCODE(s, dlock_semaphore_release(s, 3), DLOCK_EINVAL);
    ASSERT_SOK(s, dlock_semaphore_release(s, 1)); /* partly */
    ASSERT_EQ(th_sem_available(o), 2);
    ASSERT_SOK(o, dlock_semaphore_add(o, 2)); /* total 5 */
    ASSERT_EQ(th_sem_available(o), 4);
    ASSERT_SOK(o, dlock_semaphore_acquire(o, 4, DLOCK_NOWAIT));
    ASSERT_EQ(th_sem_available(s), 0);
    ASSERT_SOK(o, dlock_semaphore_add(o, -2)); /* total 3, 5 held: nobody new gets one */
    dlock_semaphore *y = th_sem(c2, "sem:calls");
    ASSERT_SCODE(y, dlock_semaphore_acquire(y, 1, DLOCK_NOWAIT), DLOCK_EBUSY);
    dlock_semaphore_free(y);
    /* available counts the holders that fit the new total (s's 1): o's 4,
     * beyond it, are not told apart from a waiter's */
    ASSERT_EQ(th_sem_available(s), 2);
    ASSERT_SOK(o, dlock_semaphore_release(o, 4));
    ASSERT_SOK(s, dlock_semaphore_release(s, 1));
    ASSERT_EQ(th_sem_available(s), 3);
    ASSERT_EQ(sem_keys_of("sem:calls"), 0);
    /* freeing a handle gives its permits back */
    ASSERT_SOK(o, dlock_semaphore_acquire(o, 3, DLOCK_NOWAIT));
    dlock_semaphore_free(o);
    ASSERT_EQ(th_sem_available(s), 3);

    /* FIFO: a waiter for 2 at the head holds up a request for 1 */
    ASSERT_SOK(s, dlock_semaphore_acquire(s, 2, DLOCK_NOWAIT));
    g_wname = "sem:calls";
    g_wpermits = 2;
    atomic_store(&g_wnext, 0);
    pthread_t t;
    sem_arg wa = {c2, 0, DLOCK_WAIT_FOREVER, -1};
    ASSERT(pthread_create(&t, NULL, sem_waiter, &wa) == 0);
    ASSERT_EVENTUALLY(sem_keys_of("sem:calls") == 2, 5000);
    dlock_semaphore *x = th_sem(c, "sem:calls");
    ASSERT_SCODE(x, dlock_semaphore_acquire(x, 1, DLOCK_NOWAIT), DLOCK_EBUSY);
    t0 = th_now_ms();
    ASSERT_SOK(s, dlock_semaphore_release(s, 2));
    pthread_join(t, NULL);
    ASSERT_EQ(wa.rc, DLOCK_OK);
    th_log("semaphore FIFO: a request for 1 refused behind a waiter for 2; the waiter had its "
           "permits %lld ms after the release", (long long)(th_now_ms() - t0));
    g_wpermits = 1;

    /* a wait cancelled from another thread (the whole contract: test_cancel)
     * leaves no key */
    ASSERT_SOK(s, dlock_semaphore_acquire(s, 3, DLOCK_NOWAIT));
    ASSERT(pthread_create(&t, NULL, cancel_later, x) == 0);
    ASSERT_SCODE(x, dlock_semaphore_acquire(x, 1, DLOCK_WAIT_FOREVER), DLOCK_ECANCELED);
    pthread_join(t, NULL);
    ASSERT_EQ(sem_keys_of("sem:calls"), 1);
    ASSERT_SOK(s, dlock_semaphore_release(s, 3));

    /* the lease revoked behind the holder's back: lost callback, release
     * DLOCK_ELOST, the permits free again */
    dlock_semaphore_on_lost(s, on_sem_lost, NULL);
    atomic_store(&g_sem_lost, 0);
    ASSERT_SOK(s, dlock_semaphore_acquire(s, 2, DLOCK_NOWAIT));
    char q[700];
    range_body_of("sem", "sem:calls", "l/", q, sizeof q);
    char *r = http("/v3/kv/range", q);
    ASSERT(r != NULL);
    char *lp = strstr(r, "\"lease\":\"");
    ASSERT_MSG(lp != NULL, "no lease in %s", r);
    char id[40];
    size_t n = strcspn(lp + 9, "\"");
    ASSERT(n < sizeof id);
    memcpy(id, lp + 9, n);
    id[n] = '\0';
    free(r);
    lease_revoke_http(id);
    ASSERT_EVENTUALLY(atomic_load(&g_sem_lost) == DLOCK_LOST_TAKEN, 5000);
    ASSERT_SCODE(s, dlock_semaphore_release(s, 2), DLOCK_ELOST);
    ASSERT_EQ(th_sem_available(x), 3);
    th_log("semaphore lease revoked: lost callback, release: %s", dlock_semaphore_errmsg(s));

    dlock_semaphore_free(x);
    dlock_semaphore_free(s);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/* Waiters on their own clients, queued one at a time on one permit: served
 * in FIFO order, one at a time; one in the middle that times out is
 * skipped, the one behind it (it watched its key) comes next. No herd: the
 * server's KV requests per handoff (its metrics) stay under 6. */
/* The KV requests (Range, Txn, Put, DeleteRange) the server has started
 * so far, from its metrics. */
static long kv_requests(void) {
    char *m = http("/metrics", NULL);
    ASSERT_MSG(m != NULL, "no /metrics");
    long n = 0;
    for (char *p = m; (p = strstr(p, "grpc_server_started_total{")); p++) {
        char *eol = strchr(p, '\n');
        if (!eol) break;
        *eol = '\0';
        if (strstr(p, "grpc_service=\"etcdserverpb.KV\"")) {
            char *v = strrchr(p, ' ');
            if (v) n += atol(v + 1);
        }
        *eol = '\n';
    }
    free(m);
    return n;
}

static void test_sem_queue(void) {
    enum { NW = 16 };
    dlock_client *hc = client(), *wc[NW];
    dlock_semaphore *h = th_sem(hc, "sem:queue");
    int set = 0;
    ASSERT_SOK(h, dlock_semaphore_try_set(h, 1, &set));
    ASSERT_SOK(h, dlock_semaphore_acquire(h, 1, DLOCK_NOWAIT));
    g_wname = "sem:queue";
    g_wpermits = 1;
    atomic_store(&g_wnext, 0);
    pthread_t t[NW];
    sem_arg a[NW];
    for (int i = 0; i < NW; i++) {
        wc[i] = client();
        a[i] = (sem_arg){wc[i], i, i == 2 ? 600 : DLOCK_WAIT_FOREVER, -1};
        ASSERT(pthread_create(&t[i], NULL, sem_waiter, &a[i]) == 0);
        /* the holder's key and one per waiter queued; waiter 2's is gone
         * once its 600 ms ran out, which a loaded machine may make happen
         * before the last waiters queue */
        ASSERT_EVENTUALLY(sem_keys_of("sem:queue") ==
                              i + 2 - (i >= 2 && atomic_load(&a[2].rc) != -1),
                          5000);
    }
    if (atomic_load(&a[2].rc) != -1)
        th_log("waiter 2 timed out before the last waiter queued: not in the middle");
    pthread_join(t[2], NULL);
    ASSERT_EQ(a[2].rc, DLOCK_ETIMEDOUT);
    th_sleep_ms(300); /* every waiter settled on its watch */
    long r0 = kv_requests();
    int64_t t0 = th_now_ms();
    ASSERT_SOK(h, dlock_semaphore_release(h, 1));
    for (int i = 0; i < NW; i++)
        if (i != 2) pthread_join(t[i], NULL);
    double per = (double)(kv_requests() - r0) / (NW - 1);
    th_log("semaphore queue: %d waiters (one timed out) served in %lld ms, %.1f KV requests "
           "per handoff (12.5 to 12.9 when every waiter watched the semaphore: a herd)",
           NW - 1, (long long)(th_now_ms() - t0), per);
    ASSERT_EQ(atomic_load(&g_wnext), NW - 1);
    for (int i = 0, k = 0; i < NW; i++) {
        if (i == 2) continue;
        ASSERT_EQ(a[i].rc, DLOCK_OK);
        ASSERT_EQ(atomic_load(&g_worder[k++]), i);
    }
    ASSERT_LT(per, 6.0);
    ASSERT_EQ(th_sem_available(h), 1);
    ASSERT_EQ(sem_keys_of("sem:queue"), 0);
    for (int i = 0; i < NW; i++) dlock_client_free(wc[i]);
    dlock_semaphore_free(h);
    dlock_client_free(hc);
}

/* dlock_lock_cancel: the watch of the predecessor's key ends at once, and
 * the waiter's key goes with its lease */
/* ---- DLOCK_WATCHDOG holds share the client's session lease (issue 22) ---- */

/* How many gRPC calls of method the server started (the gateway makes one
 * per HTTP request). */
static long grpc_calls(const char *method) {
    char *m = http("/metrics", NULL);
    ASSERT_MSG(m != NULL, "no /metrics");
    char pat[80];
    snprintf(pat, sizeof pat, "grpc_method=\"%s\"", method);
    long n = 0;
    for (char *p = m; (p = strstr(p, "grpc_server_started_total{")); p++) {
        char *eol = strchr(p, '\n');
        if (!eol) break;
        *eol = '\0';
        if (strstr(p, pat)) {
            char *v = strrchr(p, ' ');
            if (v) n += atol(v + 1);
        }
        *eol = '\n';
    }
    free(m);
    return n;
}

/* How many keys are attached to lease id (-1: the lease is gone). */
static long keys_of_lease(const char *id) {
    char q[100];
    snprintf(q, sizeof q, "{\"ID\":\"%s\",\"keys\":true}", id);
    char *r = http("/v3/lease/timetolive", q);
    ASSERT_MSG(r != NULL, "timetolive %s failed", id);
    long n = -1;
    char *ttl = strstr(r, "\"TTL\":\"");
    if (ttl && atol(ttl + 7) > 0) {
        n = 0;
        char *k = strstr(r, "\"keys\":[");
        for (char *p = k; k && p && *p && *p != ']'; p++) n += *p == ',';
        if (k && k[8] != ']') n++;
    }
    free(r);
    return n;
}

static void on_lost_count(dlock_lock *l, int reason, void *ud) {
    (void)l;
    if (reason == DLOCK_LOST_TAKEN) atomic_fetch_add((atomic_int *)ud, 1);
}

static void test_session_lease(void) {
    static atomic_int lost_a, lost_b, lost_x;
    dlock_client *c = client_wd(3000);
    dlock_lock *a = lock(c, "sess-a", DLOCK_KIND_PLAIN);
    dlock_lock *b = lock(c, "sess-b", DLOCK_KIND_PLAIN);
    dlock_lock *x = lock(c, "sess-x", DLOCK_KIND_PLAIN);
    dlock_lock_on_lost(a, on_lost_count, &lost_a);
    dlock_lock_on_lost(b, on_lost_count, &lost_b);
    dlock_lock_on_lost(x, on_lost_count, &lost_x);

    /* two watchdog holds: one lease, both keys on it */
    ASSERT_LOK(a, dlock_acquire(a, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(b, dlock_acquire(b, 0, DLOCK_WATCHDOG, NULL));
    char la[40], lb[40], lx[40];
    lease_of("sess-a", la, sizeof la);
    lease_of("sess-b", lb, sizeof lb);
    ASSERT_STR_EQ(lb, la);
    ASSERT_EQ(keys_of_lease(la), 2);
    /* an explicit lease: a lease of its own */
    ASSERT_LOK(x, dlock_acquire(x, 0, 30000, NULL));
    lease_of("sess-x", lx, sizeof lx);
    ASSERT(strcmp(lx, la) != 0);
    ASSERT_EQ(keys_of_lease(lx), 1);
    ASSERT_EQ(keys_of_lease(la), 2);
    th_log("two watchdog holds on lease %s, the explicit one on %s", la, lx);

    /* two handles of one client on one name still exclude each other (their
     * keys differ on the shared lease) */
    dlock_lock *a2 = lock(c, "sess-a", DLOCK_KIND_PLAIN);
    ASSERT_LCODE(a2, dlock_acquire(a2, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(a2, dlock_acquire(a2, 200, DLOCK_WATCHDOG, NULL), DLOCK_ETIMEDOUT);
    ASSERT_EQ(keys_of("sess-a"), 1);
    ASSERT_EQ(keys_of_lease(la), 2);

    /* an uncontended pair is one txn to acquire and one to release: no lease
     * granted or revoked, nothing read */
    dlock_lock *p = lock(c, "sess-pairs", DLOCK_KIND_PLAIN);
    long watch0 = grpc_calls("Watch");
    long txn0 = grpc_calls("Txn"), grant0 = grpc_calls("LeaseGrant");
    long revoke0 = grpc_calls("LeaseRevoke"), range0 = grpc_calls("Range");
    uint64_t f0 = 0, f = 0;
    for (int i = 0; i < 10; i++) {
        ASSERT_LOK(p, dlock_acquire(p, 0, DLOCK_WATCHDOG, &f));
        ASSERT_U64_GT(f, f0);
        f0 = f;
        ASSERT_LOK(p, dlock_release(p));
    }
    long txns = grpc_calls("Txn") - txn0, grants = grpc_calls("LeaseGrant") - grant0;
    long revokes = grpc_calls("LeaseRevoke") - revoke0, ranges = grpc_calls("Range") - range0;
    long watches = grpc_calls("Watch") - watch0;
    th_log("10 pairs: %ld txn, %ld grant, %ld revoke, %ld range, %ld watch", txns, grants,
           revokes, ranges, watches);
    /* holds this short start no watch (it waits 50 ms for a hold); at most
     * one, if the machine stalls a hold that long */
    ASSERT(watches <= 1);
    /* 2 per pair, and maybe the keep-alive round's check of the kept holds a
     * and b (one read-only txn a second here) inside the loop */
    ASSERT(txns == 20 || txns == 21);
    ASSERT_EQ(grants, 0);
    ASSERT_EQ(revokes, 0);
    ASSERT_EQ(ranges, 0);
    ASSERT_EQ(keys_of("sess-pairs"), 0);

    /* the session lease revoked: both its holds lost at once, each with the
     * callback; the explicit-lease hold goes on */
    lease_revoke_http(la);
    ASSERT_EVENTUALLY(atomic_load(&lost_a) == 1 && atomic_load(&lost_b) == 1, 3000);
    ASSERT_EQ(dlock_lock_is_lost(a), 1);
    ASSERT_EQ(dlock_lock_is_lost(b), 1);
    int held = 0;
    int64_t n = 0;
    ASSERT_LOK(x, dlock_lock_check(x, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(dlock_lock_is_lost(x), 0);
    ASSERT_EQ(atomic_load(&lost_x), 0);
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);
    ASSERT_LCODE(b, dlock_release(b), DLOCK_ELOST);
    th_log("session lease revoked: both watchdog holds lost, the explicit one held");

    /* the next watchdog acquire runs on a new session lease */
    ASSERT_LOK(a, dlock_acquire(a, 0, DLOCK_WATCHDOG, NULL));
    char la2[40];
    lease_of("sess-a", la2, sizeof la2);
    ASSERT(strcmp(la2, la) != 0);
    ASSERT_EQ(keys_of_lease(la2), 1);

    /* revoked, then an acquire before the keep-alive notices: etcd refuses
     * the dead lease, the acquire takes a new one, and the hold on the old
     * one is lost with its callback */
    lease_revoke_http(la2);
    ASSERT_LOK(b, dlock_acquire(b, 0, DLOCK_WATCHDOG, NULL));
    lease_of("sess-b", lb, sizeof lb);
    ASSERT(strcmp(lb, la2) != 0);
    ASSERT_EVENTUALLY(atomic_load(&lost_a) == 2, 3000);
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);
    ASSERT_LOK(b, dlock_lock_check(b, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(atomic_load(&lost_b), 1);
    ASSERT_LOK(b, dlock_release(b));
    ASSERT_LOK(x, dlock_release(x));

    /* freeing the client revokes the session lease no hold uses */
    ASSERT_EQ(keys_of_lease(lb), 0);
    dlock_lock_free(p);
    dlock_lock_free(a2);
    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_lock_free(x);
    dlock_client_free(c);
    ASSERT_EQ(keys_of_lease(lb), -1);
}

/* The key of a hold deleted or replaced by another client (etcdctl del, a
 * foreign put) is noticed by the keep-alive's next round, as a revoked lease
 * is: the hold is lost with its callback, release says DLOCK_ELOST and does
 * not delete the foreign key. Holds whose keys stay are not touched. Issue 19
 * ("etcd: deleting the lock key by hand... not noticed until release"). */
static void test_deleted_key(void) {
    static atomic_int lost_a, lost_b, lost_k;
    dlock_client *c = client_wd(3000); /* kept alive every second */
    dlock_lock *a = lock(c, "gone-a", DLOCK_KIND_PLAIN);
    dlock_lock *b = lock(c, "gone-b", DLOCK_KIND_REENTRANT);
    dlock_lock *k = lock(c, "gone-k", DLOCK_KIND_PLAIN);
    dlock_lock_on_lost(a, on_lost_count, &lost_a);
    dlock_lock_on_lost(b, on_lost_count, &lost_b);
    dlock_lock_on_lost(k, on_lost_count, &lost_k);
    ASSERT_LOK(a, dlock_acquire(a, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(b, dlock_acquire(b, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(k, dlock_acquire(k, 0, DLOCK_WATCHDOG, NULL));

    /* a's key deleted by hand */
    char q[800];
    range_body("gone-a", q, sizeof q);
    char *r = http("/v3/kv/deleterange", q);
    ASSERT_MSG(r && strstr(r, "\"deleted\":\"1\""), "deleterange: %s", r ? r : "(failed)");
    free(r);
    int64_t t0 = th_now_ms();
    ASSERT_EVENTUALLY(atomic_load(&lost_a) == 1, 4000);
    th_log("a deleted key: lost after %lld ms (keep-alive period 1000 ms)",
           (long long)(th_now_ms() - t0));
    ASSERT_EQ(dlock_lock_is_lost(a), 1);
    /* another client takes the name; the old holder's release touches nothing */
    dlock_client *c2 = client();
    dlock_lock *a2 = lock(c2, "gone-a", DLOCK_KIND_PLAIN);
    ASSERT_LOK(a2, dlock_acquire(a2, 0, 30000, NULL));
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);
    ASSERT_EQ(keys_of("gone-a"), 1);
    int held = 0;
    int64_t n = 0;
    ASSERT_LOK(a2, dlock_lock_check(a2, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_LOK(a2, dlock_release(a2));

    /* b's key put again by a foreign client (no lease: its value replaced,
     * its create_revision kept) */
    range_body("gone-b", q, sizeof q);
    r = http("/v3/kv/range", q);
    ASSERT(r != NULL);
    char *kk = strstr(r, "\"key\":\"");
    ASSERT_MSG(kk != NULL, "no key in %s", r);
    kk += 7;
    size_t kl = strcspn(kk, "\"");
    char put[600];
    snprintf(put, sizeof put, "{\"key\":\"%.*s\",\"value\":\"%s\"}", (int)kl, kk, "Zm9yZWlnbg==");
    free(r);
    r = http("/v3/kv/put", put);
    ASSERT(r != NULL);
    free(r);
    ASSERT_EVENTUALLY(atomic_load(&lost_b) == 1, 4000);
    ASSERT_LCODE(b, dlock_release(b), DLOCK_ELOST);
    ASSERT_EQ(keys_of("gone-b"), 1); /* the foreign key stays */
    r = http("/v3/kv/deleterange", q);
    free(r);

    /* k's key untouched: held, no callback */
    th_sleep_ms(1200);
    ASSERT_EQ(atomic_load(&lost_k), 0);
    ASSERT_EQ(dlock_lock_is_lost(k), 0);
    ASSERT_LOK(k, dlock_lock_check(k, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_LOK(k, dlock_release(k));
    ASSERT_EQ(atomic_load(&lost_a), 1);
    ASSERT_EQ(atomic_load(&lost_b), 1);
    th_log("deleted and replaced keys: both holds lost with their callback, the third kept");
    dlock_lock_free(a2);
    dlock_client_free(c2);
    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_lock_free(k);
    dlock_client_free(c);
}

/* ---- the client's watch: a kept hold's key deleted or replaced is noticed
 * at once (issue 22), not at the next keep-alive round ---- */

static atomic_llong g_lost_at[4];

static void on_lost_at(dlock_lock *l, int reason, void *ud) {
    (void)l;
    if (reason == DLOCK_LOST_TAKEN) atomic_store((atomic_llong *)ud, (long long)th_now_ms());
}

/* The base64 key of name's only key. */
static void key_of(const char *name, char *out, size_t outlen) {
    char q[700];
    range_body(name, q, sizeof q);
    char *r = http("/v3/kv/range", q);
    ASSERT(r != NULL);
    char *kk = strstr(r, "\"key\":\"");
    ASSERT_MSG(kk != NULL, "no key in %s", r);
    kk += 7;
    snprintf(out, outlen, "%.*s", (int)strcspn(kk, "\""), kk);
    free(r);
}

/* Deletes name's keys; returns the time just before the request. */
static int64_t delete_keys(const char *name) {
    char q[700];
    range_body(name, q, sizeof q);
    int64_t t0 = th_now_ms();
    char *r = http("/v3/kv/deleterange", q);
    ASSERT_MSG(r && strstr(r, "\"deleted\":\"1\""), "deleterange: %s", r ? r : "(failed)");
    free(r);
    return t0;
}

/* With a 30 s session lease (a keep-alive every 10 s), a hold's key deleted
 * by hand, and another's deleted and created again by a foreign client, are
 * each lost with the callback within 200 ms of the request; a third hold is
 * untouched. */
static void test_watch_deleted(void) {
    dlock_client *c = client_wd(30000);
    dlock_lock *a = lock(c, "cw-a", DLOCK_KIND_PLAIN);
    dlock_lock *b = lock(c, "cw-b", DLOCK_KIND_FAIR);
    dlock_lock *k = lock(c, "cw-k", DLOCK_KIND_WRITE);
    for (int i = 0; i < 3; i++) atomic_store(&g_lost_at[i], 0);
    dlock_lock_on_lost(a, on_lost_at, &g_lost_at[0]);
    dlock_lock_on_lost(b, on_lost_at, &g_lost_at[1]);
    dlock_lock_on_lost(k, on_lost_at, &g_lost_at[2]);
    ASSERT_LOK(a, dlock_acquire(a, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(b, dlock_acquire(b, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(k, dlock_acquire(k, 0, DLOCK_WATCHDOG, NULL));
    th_sleep_ms(300); /* the watch under way */

    int64_t t0 = delete_keys("cw-a");
    ASSERT_EVENTUALLY(atomic_load(&g_lost_at[0]) != 0, 5000);
    long long da = atomic_load(&g_lost_at[0]) - t0;
    th_log("a deleted key: lost %lld ms after the delete (keep-alive period 10 s)", da);
    ASSERT_MSG(da < 200, "lost %lld ms after the delete", da);
    ASSERT_EQ(dlock_lock_is_lost(a), 1);
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);

    /* replaced: deleted and created again by a foreign client (the DELETE
     * reaches the watch; a put in place is the keep-alive round's,
     * test_deleted_key) */
    char key[400], put[600];
    key_of("cw-b", key, sizeof key);
    snprintf(put, sizeof put, "{\"key\":\"%s\",\"value\":\"Zm9yZWlnbg==\"}", key);
    t0 = delete_keys("cw-b");
    char *r = http("/v3/kv/put", put);
    ASSERT(r != NULL);
    free(r);
    ASSERT_EVENTUALLY(atomic_load(&g_lost_at[1]) != 0, 5000);
    long long db = atomic_load(&g_lost_at[1]) - t0;
    th_log("a replaced key: lost %lld ms after the foreign delete + put", db);
    ASSERT_MSG(db < 200, "lost %lld ms after the replace", db);
    ASSERT_LCODE(b, dlock_release(b), DLOCK_ELOST);
    ASSERT_EQ(keys_of("cw-b"), 1); /* the foreign key stays */
    delete_keys("cw-b");

    ASSERT_EQ(atomic_load(&g_lost_at[2]), 0);
    int held = 0;
    int64_t n = 0;
    ASSERT_LOK(k, dlock_lock_check(k, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_LOK(k, dlock_release(k));
    ASSERT_EQ(atomic_load(&g_lost_at[2]), 0);
    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_lock_free(k);
    dlock_client_free(c);
}

/* The watch broken by an etcd restart, the revision it would resume from
 * compacted meanwhile: it checks the holds once (a txn of compares), resumes,
 * and a key deleted after that is lost within 200 ms. */
static void test_watch_reconnect(void) {
    dlock_client *c = client_wd(30000);
    dlock_lock *a = lock(c, "cw-r", DLOCK_KIND_PLAIN);
    dlock_lock *b = lock(c, "cw-s", DLOCK_KIND_PLAIN);
    atomic_store(&g_lost_at[0], 0);
    atomic_store(&g_lost_at[1], 0);
    dlock_lock_on_lost(a, on_lost_at, &g_lost_at[0]);
    dlock_lock_on_lost(b, on_lost_at, &g_lost_at[1]);
    ASSERT_LOK(a, dlock_acquire(a, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(b, dlock_acquire(b, 0, DLOCK_WATCHDOG, NULL));
    th_sleep_ms(300);
    /* writes outside the watched range, then everything before them compacted */
    char *r = NULL;
    for (int i = 0; i < 5; i++) {
        r = http("/v3/kv/put", "{\"key\":\"b3RoZXI=\",\"value\":\"eA==\"}"); /* other */
        ASSERT(r != NULL);
        char *rv = strstr(r, "\"revision\":\"");
        ASSERT(rv != NULL);
        long long rev = atoll(rv + 12);
        free(r);
        if (i == 4) {
            char q[80];
            snprintf(q, sizeof q, "{\"revision\":\"%lld\",\"physical\":true}", rev);
            r = http("/v3/kv/compaction", q);
            ASSERT_MSG(r != NULL, "compaction failed");
            free(r);
        }
    }
    etcd_restart();
    /* the server's counters start again at 0: the one txn is the watch's
     * check (the keep-alive's next round is 10 s away, and sends no txn) */
    ASSERT_EVENTUALLY(grpc_calls("Txn") == 1, 5000);
    th_log("etcd restarted: the watch resumed after a check (1 txn)");
    th_sleep_ms(300);
    ASSERT_EQ(grpc_calls("Txn"), 1);
    ASSERT_EQ(atomic_load(&g_lost_at[0]), 0);
    ASSERT_EQ(atomic_load(&g_lost_at[1]), 0);
    int64_t t0 = delete_keys("cw-r");
    ASSERT_EVENTUALLY(atomic_load(&g_lost_at[0]) != 0, 5000);
    long long d = atomic_load(&g_lost_at[0]) - t0;
    th_log("after the restart, a deleted key: lost %lld ms after the delete", d);
    ASSERT_MSG(d < 200, "lost %lld ms after the delete", d);
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);
    ASSERT_EQ(atomic_load(&g_lost_at[1]), 0);
    ASSERT_LOK(b, dlock_release(b));
    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_client_free(c);
}

static void test_cancel(void) {
    dlock_client *c = client();
    th_check_lock_cancel(c, "etcd:cancel", DLOCK_WATCHDOG);
    th_check_semaphore_cancel(c, "etcd:cancel-sem");
    dlock_client_free(c);
}

int main(int argc, char **argv) {
    th_init("backend_etcd");
    g_owner = getpid();
    atexit(etcd_stop);
    th_on_fatal_signals(on_signal);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    etcd_start();
    /* the tests that fork come first, while the parent has no keep-alive
     * thread (each frees its clients, which joins their threads) */
    test_counter();
    test_sem_procs();
    test_crash_and_waits();
    test_handoff();
    test_rw_fair();
    test_cli(argc > 1 ? argv[1] : NULL);
    test_leases();
    test_session_lease();
    test_deleted_key();
    test_watch_deleted();
    test_watch_reconnect();
    test_unsupported_and_errors();
    test_cluster();
    test_tls();
    test_cancel();
    test_sem_calls();
    test_sem_queue();
    curl_global_cleanup();
    th_log("all passed");
    return 0;
}
