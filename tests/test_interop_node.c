/* Interoperation with node-redlock, and with every plain-lock client at once.
 *
 * 1. Mixed contention: 3 dlock processes (two poll with DLOCK_NOWAIT as the
 *    peers do, one waits), 2 redis-py `Lock` workers and 2 node-redlock
 *    workers take the same lock name for 2.5 s, each doing a non-atomic
 *    GET + SET of one counter under it; the counter must equal the
 *    acquisitions of all of them, and every library must have had some.
 * 2. node-redlock and dlock on one key: each excludes the other, neither
 *    releases the other's lock, and a dlock waiter takes the key after
 *    node-redlock releases it (node-redlock publishes nothing: the waiter's
 *    re-check finds it, within 2 s).
 *
 * The workers are the benchmark's (bench/peers/node/worker.js, on node-redlock
 * 4 and ioredis from bench/setup's `npm ci`; bench/peers/redispy_worker.py, on
 * Debian's python3-redis), driven line by line over pipes. Skipped (77) with
 * the reason when node, the node modules or redis-py are missing. */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PYTHON "/usr/bin/python3"
#define NODE_WORKER DLOCK_SOURCE_DIR "/bench/peers/node/worker.js"
#define PY_WORKER DLOCK_SOURCE_DIR "/bench/peers/redispy_worker.py"
#define NAME "interop:node"
#define MIXED "interop:mixed"
#define COUNTER "interop:mixed:counter"
#define DLOCK_PROCS 3
#define PEERS 2 /* workers of each other library */
#define RUN_MS 2500

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the workers' clock too */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* node's path from $PATH, or NULL. */
static char *find_node(void)
{
    const char *path = getenv("PATH");
    static char buf[4096];
    while (path && *path) {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        if (n > 0 && n + 6 < sizeof buf) {
            memcpy(buf, path, n);
            memcpy(buf + n, "/node", 6);
            if (access(buf, X_OK) == 0) return buf;
        }
        path = end ? end + 1 : NULL;
    }
    return NULL;
}

/* Starts a worker; skips the test with its reason if it says "skip". */
static void worker_start(th_coproc *p, const char *what, char *const argv[])
{
    th_coproc_start(p, what, argv);
    const char *hello = th_coproc_line(p, 30000);
    if (!strncmp(hello, "skip", 4)) th_skip("%s: %s", what, hello + 5);
    ASSERT_MSG(!strncmp(hello, "hello", 5), "%s said '%s'", what, hello);
    th_log("%s", hello + 6);
}

/* ---- 1. mixed contention ---- */

/* Worker i: even ones try once and sleep 1 ms between tries (they poll, as
 * the peers do), odd ones wait (woken by dlock's releases; the peers'
 * releases publish nothing, so these re-check every 2 s and get few). */
static void dlock_worker(const th_server *s, int i, int64_t start, int64_t end, long *ops)
{
    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, MIXED, DLOCK_KIND_PLAIN);
    redisContext *rc = th_redis(s);
    while (now_ns() < start) usleep(1000);
    long n = 0;
    while (now_ns() < end) {
        int r = dlock_acquire(l, i % 2 ? 10000 : DLOCK_NOWAIT, 10000, NULL);
        if (r == DLOCK_EBUSY && i % 2 == 0) {
            usleep(1000);
            continue;
        }
        if (r) {
            fprintf(stderr, "dlock worker: %s\n", dlock_lock_errmsg(l));
            _exit(2);
        }
        char *v = th_cmd_str(rc, "GET %s", COUNTER);
        long long x = v ? atoll(v) : 0;
        free(v);
        th_cmd_ok(rc, "SET %s %lld", COUNTER, x + 1);
        if (dlock_release(l)) {
            fprintf(stderr, "dlock worker: release: %s\n", dlock_lock_errmsg(l));
            _exit(3);
        }
        n++;
        usleep(1000); /* let the others find the key free now and then */
    }
    *ops = n;
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    _exit(0);
}

/* "ok <ops> <finish_ns> <wait_us> ..." -> ops */
static long contend_ops(th_coproc *p)
{
    const char *line = th_coproc_line(p, RUN_MS + 30000);
    ASSERT_MSG(!strncmp(line, "ok ", 3), "%s: contend said '%.200s'", p->what, line);
    return atol(line + 3);
}

static void test_mixed(const th_server *s, redisContext *rc, th_coproc *py, th_coproc *node)
{
    th_cmd_ok(rc, "SET %s 0", COUNTER);
    th_cmd_int(rc, "DEL %s", MIXED);
    long *shm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT(shm != MAP_FAILED);
    int64_t start = now_ns() + 1500000000LL, end = start + (int64_t)RUN_MS * 1000000;
    pid_t kids[DLOCK_PROCS];
    for (int i = 0; i < DLOCK_PROCS; i++) {
        shm[i] = -1;
        kids[i] = th_fork();
        if (kids[i] == 0) dlock_worker(s, i, start, end, &shm[i]);
    }
    char cmd[200];
    for (int i = 0; i < PEERS; i++) {
        /* redis-py polls every 1 ms, node-redlock retries 0 to 4 ms apart
         * (their defaults, 100 and 200 ms, would rarely find the key free) */
        snprintf(cmd, sizeof cmd, "contend %s %s 0.001 %lld %lld", MIXED, COUNTER,
                 (long long)start, (long long)end);
        th_coproc_send(&py[i], cmd);
        snprintf(cmd, sizeof cmd, "contend %s %s 2 %lld %lld", MIXED, COUNTER, (long long)start,
                 (long long)end);
        th_coproc_send(&node[i], cmd);
    }
    long by_dlock = 0, by_polling = 0, by_py = 0, by_node = 0;
    for (int i = 0; i < PEERS; i++) {
        by_py += contend_ops(&py[i]);
        by_node += contend_ops(&node[i]);
    }
    for (int i = 0; i < DLOCK_PROCS; i++) {
        ASSERT_EQ(th_wait_child(kids[i], 30000), 0);
        ASSERT(shm[i] >= 0);
        by_dlock += shm[i];
        if (i % 2 == 0) by_polling += shm[i];
    }
    munmap(shm, 4096);
    char *cv = th_cmd_str(rc, "GET %s", COUNTER);
    long long counter = cv ? atoll(cv) : -1;
    free(cv);
    th_log("mixed contention on one key for %d ms: %ld acquisitions by %d dlock processes "
           "(%ld by those polling), %ld by %d redis-py, %ld by %d node-redlock; counter %lld",
           RUN_MS, by_dlock, DLOCK_PROCS, by_polling, by_py, PEERS, by_node, PEERS, counter);
    ASSERT_EQ(counter, by_dlock + by_py + by_node);
    ASSERT(by_polling > 0);
    ASSERT(by_py > 0);
    ASSERT(by_node > 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", MIXED), 0);
}

/* ---- 2. node-redlock and dlock on one key ---- */

typedef struct waiter {
    dlock_lock *l;
    int rc;
    int64_t t_done;
    atomic_int done;
} waiter;

static void *wait_main(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_acquire(w->l, 8000, 10000, NULL);
    w->t_done = th_now_ms();
    atomic_store(&w->done, 1);
    return NULL;
}

static void test_pairwise(const th_server *s, redisContext *rc, th_coproc *node)
{
    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, NAME, DLOCK_KIND_PLAIN);

    /* node-redlock holds: dlock is excluded and sees who holds */
    ASSERT_STR_EQ(th_coproc_ask(node, "hold " NAME " default"), "ok");
    char *ntoken = th_cmd_str(rc, "GET %s", NAME);
    ASSERT(ntoken != NULL && strlen(ntoken) >= 32);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(l, dlock_acquire(l, 300, 5000, NULL), DLOCK_ETIMEDOUT);
    dlock_info info;
    ASSERT_COK(c, dlock_inspect(c, NAME, DLOCK_CSTR, &info));
    ASSERT_EQ(info.kind, DLOCK_KIND_PLAIN);
    ASSERT_STR_EQ(info.holder, ntoken);
    ASSERT(info.ttl_ms > 20000); /* node-redlock's 30 s */
    ASSERT_CCODE(c, dlock_release_token(c, NAME, DLOCK_CSTR, "0123456789abcdef0123456789abcdef"),
                 DLOCK_ENOTOWNER);
    char *v = th_cmd_str(rc, "GET %s", NAME);
    ASSERT_STR_EQ(v, ntoken);
    free(v);

    /* node-redlock releases its own; dlock takes it; node-redlock is excluded */
    ASSERT(!strncmp(th_coproc_ask(node, "release"), "ok ", 3));
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL));
    const char *r = th_coproc_ask(node, "hold " NAME " default");
    ASSERT_MSG(!strncmp(r, "err", 3), "node-redlock took a key dlock holds: '%s'", r);
    v = th_cmd_str(rc, "GET %s", NAME);
    ASSERT_STR_EQ(v, dlock_lock_token(l));
    free(v);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_STR_EQ(th_coproc_ask(node, "hold " NAME " default"), "ok");
    free(ntoken);
    ntoken = th_cmd_str(rc, "GET %s", NAME); /* a new one per lock */
    ASSERT(ntoken != NULL);

    /* a dlock waiter on node-redlock's key: still waiting while node holds,
     * holding within the re-check (2 s) of node's silent release */
    waiter w = {.l = l};
    atomic_init(&w.done, 0);
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, wait_main, &w) == 0);
    th_sleep_ms(500);
    ASSERT_EQ(atomic_load(&w.done), 0);
    v = th_cmd_str(rc, "GET %s", NAME);
    ASSERT_STR_EQ(v, ntoken);
    free(v);
    int64_t t0 = th_now_ms();
    ASSERT(!strncmp(th_coproc_ask(node, "release"), "ok ", 3));
    pthread_join(t, NULL);
    ASSERT_LOK(l, w.rc);
    th_log("a dlock waiter held node-redlock's key %lld ms after node-redlock released it",
           (long long)(w.t_done - t0));
    ASSERT_LE(w.t_done - t0, 2000 + 1000);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", NAME), 0);
    free(ntoken);
    dlock_lock_free(l);
    dlock_client_free(c);
}

int main(void)
{
    th_init("interop_node");
    char *node = find_node();
    if (!node) th_skip("node not found in $PATH (node-redlock's runtime)");
    if (!th_python_has_redis(PYTHON))
        th_skip(PYTHON " cannot import redis (install Debian's python3-redis)");
    th_server *s = th_server_start(NULL);
    redisContext *rc = th_redis(s);
    char port[16];
    snprintf(port, sizeof port, "%d", th_server_port(s));
    th_coproc py[PEERS], nd[PEERS];
    for (int i = 0; i < PEERS; i++) {
        char *nargv[] = {node, NODE_WORKER, "--port", port, NULL};
        worker_start(&nd[i], "node-redlock worker", nargv);
        char *pargv[] = {PYTHON, PY_WORKER, "--port", port, NULL};
        worker_start(&py[i], "redis-py worker", pargv);
    }
    /* the forks first: no dlock client (and its threads) in this process yet */
    test_mixed(s, rc, py, nd);
    test_pairwise(s, rc, &nd[0]);
    for (int i = 0; i < PEERS; i++) {
        th_coproc_quit(&py[i]);
        th_coproc_quit(&nd[i]);
    }
    redisFree(rc);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
