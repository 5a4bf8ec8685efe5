/*
 * ID worker (issue 6): layout, batch vs single, overflow errors, uniqueness
 * across 8 processes x 10,000 ids, monotonicity per process.
 *
 * Self-contained: starts its own redis-server (on a free port, in a mkdtemp
 * directory) and stops it however the test ends. Exits 77 (skip) without
 * redis-server on PATH or $DLOCK_REDIS_SERVER.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "dlock.h"

#define NPROC 8
#define NIDS 10000

static pid_t server_pid = -1;
static pid_t owner_pid;
static char dir[64];
static char url[64];
static int port;

static void cleanup(void) {
    if (getpid() != owner_pid) return;
    if (server_pid > 0) {
        kill(server_pid, SIGKILL);
        waitpid(server_pid, NULL, 0);
        server_pid = -1;
    }
    if (dir[0]) {
        char p[128];
        snprintf(p, sizeof p, "%s/redis.log", dir);
        unlink(p);
        rmdir(dir);
        dir[0] = '\0';
    }
}

static void on_signal(int sig) {
    cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void die(int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void die(int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "test_idworker.c:%d: FAIL: ", line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}
#define CHECK(cond, ...)                         \
    do {                                         \
        if (!(cond)) die(__LINE__, __VA_ARGS__); \
    } while (0)

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len))
        die(__LINE__, "free port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static redisContext *raw(void) {
    redisContext *rc = redisConnect("127.0.0.1", port);
    CHECK(rc && !rc->err, "hiredis connect: %s", rc ? rc->errstr : "oom");
    return rc;
}

static void start_server(void) {
    const char *bin = getenv("DLOCK_REDIS_SERVER");
    if (!bin || !*bin) bin = "redis-server";
    if (system("command -v redis-server >/dev/null 2>&1") != 0 && !getenv("DLOCK_REDIS_SERVER")) {
        printf("SKIP: redis-server not found\n");
        exit(77);
    }
    snprintf(dir, sizeof dir, "/tmp/dlock-idw.XXXXXX");
    CHECK(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    port = free_port();
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    char portbuf[16], logbuf[128];
    snprintf(portbuf, sizeof portbuf, "%d", port);
    snprintf(logbuf, sizeof logbuf, "%s/redis.log", dir);
    server_pid = fork();
    CHECK(server_pid >= 0, "fork: %s", strerror(errno));
    if (server_pid == 0) {
        execlp(bin, bin, "--port", portbuf, "--bind", "127.0.0.1", "--save", "", "--appendonly",
               "no", "--dir", dir, "--logfile", logbuf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        redisContext *rc = redisConnect("127.0.0.1", port);
        if (rc && !rc->err) {
            redisReply *r = redisCommand(rc, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS;
            if (r) freeReplyObject(r);
            redisFree(rc);
            if (ok) return;
        } else if (rc) {
            redisFree(rc);
        }
        if (waitpid(server_pid, NULL, WNOHANG) == server_pid) {
            server_pid = -1;
            die(__LINE__, "redis-server exited at start (see it run by hand)");
        }
        usleep(10000);
    }
    die(__LINE__, "redis-server did not answer PING within 5 s");
}

static dlock_client *client(void) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    CHECK(rc == DLOCK_OK, "dlock_client_new: %s: %s", dlock_strerror(rc), dlock_errmsg(c));
    return c;
}

static dlock_idworker *worker(dlock_client *c, const char *prefix, int64_t batch, int64_t epoch) {
    dlock_idworker_options o = {.epoch_s = epoch, .batch = batch};
    dlock_idworker *w = NULL;
    int rc = dlock_idworker_new(c, prefix, &o, &w);
    CHECK(rc == DLOCK_OK && w, "dlock_idworker_new(%s): %s: %s", prefix, dlock_strerror(rc),
          dlock_errmsg(c));
    return w;
}

static uint64_t next_ok(dlock_idworker *w) {
    uint64_t id = 0;
    int rc = dlock_idworker_next(w, &id);
    CHECK(rc == DLOCK_OK, "dlock_idworker_next: %s: %s", dlock_strerror(rc),
          dlock_idworker_errmsg(w));
    return id;
}

/* "icr:<prefix>:yyyy:mm:dd" for the current UTC day */
static void day_key(const char *prefix, char *buf, size_t len) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(buf, len, "icr:%s:%04d:%02d:%02d", prefix, tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday);
}

static long long get_int(redisContext *rc, const char *key) {
    redisReply *r = redisCommand(rc, "GET %s", key);
    CHECK(r && r->type == REDIS_REPLY_STRING, "GET %s: no string", key);
    long long v = strtoll(r->str, NULL, 10);
    freeReplyObject(r);
    return v;
}

static void set_key(redisContext *rc, const char *key, const char *val) {
    redisReply *r = redisCommand(rc, "SET %s %s", key, val);
    CHECK(r && r->type == REDIS_REPLY_STATUS, "SET %s failed", key);
    freeReplyObject(r);
}

static void test_args(dlock_client *c) {
    dlock_idworker *w = (dlock_idworker *)1;
    CHECK(dlock_idworker_new(NULL, "x", NULL, &w) == DLOCK_EINVAL && w == NULL, "NULL client");
    CHECK(dlock_idworker_new(c, NULL, NULL, &w) == DLOCK_EINVAL, "NULL prefix");
    CHECK(strstr(dlock_errmsg(c), "prefix") != NULL, "message names the prefix: %s",
          dlock_errmsg(c));
    CHECK(dlock_idworker_new(c, "", NULL, &w) == DLOCK_EINVAL, "empty prefix");
    {
        static char longp[DLOCK_NAME_MAX + 2];
        memset(longp, 'p', DLOCK_NAME_MAX + 1);
        CHECK(dlock_idworker_new(c, longp, NULL, &w) == DLOCK_ENAMETOOLONG && w == NULL,
              "prefix of DLOCK_NAME_MAX + 1 bytes");
        CHECK(strstr(dlock_errmsg(c), "prefix longer than") != NULL, "message: %s",
              dlock_errmsg(c));
        longp[DLOCK_NAME_MAX] = '\0';
        CHECK(dlock_idworker_new(c, longp, NULL, &w) == DLOCK_OK, "prefix of DLOCK_NAME_MAX bytes");
        dlock_idworker_free(w);
        w = NULL;
    }
    dlock_idworker_options o = {.batch = -1};
    CHECK(dlock_idworker_new(c, "x", &o, &w) == DLOCK_EINVAL, "negative batch");
    o.batch = 0;
    o.epoch_s = -(1LL << 41);
    CHECK(dlock_idworker_new(c, "x", &o, &w) == DLOCK_EINVAL, "absurd epoch");
    CHECK(dlock_idworker_next(NULL, NULL) == DLOCK_EINVAL, "NULL worker");
    CHECK(dlock_idworker_errmsg(NULL)[0] != '\0', "NULL worker message");
    dlock_idworker_free(NULL);
    w = worker(c, "args", 0, 0);
    CHECK(dlock_idworker_next(w, NULL) == DLOCK_EINVAL, "NULL id");
    CHECK(dlock_idworker_errmsg(w)[0] != '\0', "message after NULL id");
    next_ok(w);
    CHECK(dlock_idworker_errmsg(w)[0] == '\0', "message cleared after success");
    dlock_idworker_free(w);
}

static void test_layout(dlock_client *c, redisContext *rc) {
    dlock_idworker *w = worker(c, "layout", 0, 0);
    char key[128];
    day_key("layout", key, sizeof key);
    time_t before = time(NULL);
    uint64_t id = next_ok(w);
    time_t after = time(NULL);
    int64_t ts = (int64_t)(id >> 32);
    CHECK(ts >= before - 1640995200 && ts <= after - 1640995200, "seconds part %" PRId64, ts);
    CHECK((id >> 63) == 0, "sign bit set");
    CHECK((id & 0xFFFFFFFFu) == 1, "first counter value %" PRIu64, id & 0xFFFFFFFFu);
    CHECK(get_int(rc, key) == 1, "counter key %s", key);
    dlock_idworker_free(w);

    /* a custom epoch */
    int64_t epoch = (int64_t)time(NULL) - 1000;
    w = worker(c, "layout", 0, epoch);
    id = next_ok(w);
    CHECK((id >> 32) >= 999 && (id >> 32) <= 1002, "custom epoch seconds %" PRIu64, id >> 32);
    CHECK((id & 0xFFFFFFFFu) == 2, "counter shared by prefix");
    dlock_idworker_free(w);
}

static void test_batch_vs_single(dlock_client *c, redisContext *rc) {
    char key[128];
    /* single: the counter advances by exactly one per id */
    dlock_idworker *w = worker(c, "single", 1, 0);
    day_key("single", key, sizeof key);
    uint64_t prev = 0;
    for (int i = 1; i <= 250; i++) {
        uint64_t id = next_ok(w);
        CHECK((id & 0xFFFFFFFFu) == (uint64_t)i, "single: n %" PRIu64 " at %d", id & 0xFFFFFFFFu, i);
        CHECK(id > prev, "single: not increasing");
        prev = id;
    }
    CHECK(get_int(rc, key) == 250, "single: counter %lld", get_int(rc, key));
    dlock_idworker_free(w);

    /* batched: one INCRBY per 100 ids; two workers get disjoint blocks */
    dlock_idworker *a = worker(c, "batch", 100, 0), *b = worker(c, "batch", 100, 0);
    day_key("batch", key, sizeof key);
    uint64_t pa = 0, pb = 0;
    for (int i = 0; i < 250; i++) {
        uint64_t ia = next_ok(a), ib = next_ok(b);
        uint64_t na = ia & 0xFFFFFFFFu, nb = ib & 0xFFFFFFFFu;
        CHECK(ia > pa && ib > pb, "batch: not increasing");
        CHECK(na != nb, "batch: same counter value %" PRIu64, na);
        /* a reserved 1..100, 201..300, 401..500; b 101..200, 301..400, 501..600 */
        uint64_t wa = (uint64_t)(i / 100) * 200 + (uint64_t)(i % 100) + 1;
        CHECK(na == wa, "batch: a's n %" PRIu64 " want %" PRIu64, na, wa);
        CHECK(nb == wa + 100, "batch: b's n %" PRIu64 " want %" PRIu64, nb, wa + 100);
        pa = ia;
        pb = ib;
    }
    CHECK(get_int(rc, key) == 600, "batch: counter %lld (6 INCRBY 100)", get_int(rc, key));
    dlock_idworker_free(a);
    dlock_idworker_free(b);
}

static void test_overflow(dlock_client *c, redisContext *rc) {
    char key[128], key2[128];
    for (int attempt = 0; attempt < 2; attempt++) {
        day_key("ovf", key, sizeof key);
        set_key(rc, key, "4294967293");
        dlock_idworker *w = worker(c, "ovf", 0, 0);
        uint64_t id1 = 0, id2 = 0, id3 = 0;
        int r1 = dlock_idworker_next(w, &id1);
        int r2 = dlock_idworker_next(w, &id2);
        int r3 = dlock_idworker_next(w, &id3);
        day_key("ovf", key2, sizeof key2);
        if (strcmp(key, key2) != 0) { /* crossed midnight UTC: redo */
            dlock_idworker_free(w);
            continue;
        }
        CHECK(r1 == DLOCK_OK && (id1 & 0xFFFFFFFFu) == 4294967294u, "ovf: first");
        CHECK(r2 == DLOCK_OK && (id2 & 0xFFFFFFFFu) == 4294967295u, "ovf: last valid");
        CHECK(r3 == DLOCK_EOVERFLOW, "ovf: want EOVERFLOW, got %s", dlock_strerror(r3));
        CHECK(strstr(dlock_idworker_errmsg(w), "2^32") != NULL, "ovf message: %s",
              dlock_idworker_errmsg(w));
        CHECK(strstr(dlock_idworker_errmsg(w), key) != NULL, "ovf message names the key: %s",
              dlock_idworker_errmsg(w));
        /* stays an error (no wrap-around) */
        CHECK(dlock_idworker_next(w, &id3) == DLOCK_EOVERFLOW, "ovf: second EOVERFLOW");
        dlock_idworker_free(w);

        /* batched: a block straddling 2^32-1 is used up to the limit */
        set_key(rc, key, "4294967290");
        w = worker(c, "ovf", 10, 0);
        for (uint64_t n = 4294967291u; n <= 4294967295u; n++) {
            uint64_t id = next_ok(w);
            CHECK((id & 0xFFFFFFFFu) == n, "ovf batch: n %" PRIu64 " want %" PRIu64,
                  id & 0xFFFFFFFFu, n);
        }
        int r = dlock_idworker_next(w, &id3);
        CHECK(r == DLOCK_EOVERFLOW, "ovf batch: want EOVERFLOW, got %s", dlock_strerror(r));
        dlock_idworker_free(w);

        /* the server's own integer overflow also reads as EOVERFLOW */
        set_key(rc, key, "9223372036854775800");
        w = worker(c, "ovf", 100, 0);
        r = dlock_idworker_next(w, &id3);
        CHECK(r == DLOCK_EOVERFLOW, "ovf server: want EOVERFLOW, got %s: %s", dlock_strerror(r),
              dlock_idworker_errmsg(w));
        dlock_idworker_free(w);

        /* a negative counter is a protocol error, not an id */
        set_key(rc, key, "-10");
        w = worker(c, "ovf", 0, 0);
        r = dlock_idworker_next(w, &id3);
        CHECK(r == DLOCK_EPROTO, "negative counter: got %s", dlock_strerror(r));
        dlock_idworker_free(w);

        /* seconds past 31 bits */
        w = worker(c, "ovf-ts", 0, (int64_t)time(NULL) - (1LL << 31) - 100);
        r = dlock_idworker_next(w, &id3);
        CHECK(r == DLOCK_EOVERFLOW, "31-bit seconds: got %s", dlock_strerror(r));
        CHECK(strstr(dlock_idworker_errmsg(w), "31 bits") != NULL, "ts message: %s",
              dlock_idworker_errmsg(w));
        dlock_idworker_free(w);
        /* just inside 31 bits still works */
        w = worker(c, "ovf-ts", 0, (int64_t)time(NULL) - (1LL << 31) + 100);
        id3 = next_ok(w);
        CHECK((id3 >> 32) < (1u << 31) && (id3 >> 32) >= (1u << 31) - 102, "ts near the limit");
        dlock_idworker_free(w);

        /* an epoch in the future */
        w = worker(c, "ovf-ts", 0, (int64_t)time(NULL) + 3600);
        r = dlock_idworker_next(w, &id3);
        CHECK(r == DLOCK_EINVAL, "future epoch: got %s", dlock_strerror(r));
        dlock_idworker_free(w);
        return;
    }
    die(__LINE__, "crossed midnight twice?");
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Child: NIDS ids into file; exits 0, or 1 on error / non-increasing id. */
static void child(int idx, const char *path) {
    dlock_client *c = client();
    dlock_idworker *w = worker(c, "multi", (idx % 2) ? 64 : 0, 0);
    uint64_t *ids = malloc(sizeof *ids * NIDS);
    CHECK(ids, "oom");
    for (int i = 0; i < NIDS; i++) {
        ids[i] = next_ok(w);
        CHECK(i == 0 || ids[i] > ids[i - 1], "child %d: id %d not increasing", idx, i);
    }
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(ids, sizeof *ids, NIDS, f) == NIDS && fclose(f) == 0, "write %s", path);
    free(ids);
    dlock_idworker_free(w);
    dlock_client_free(c);
    exit(0); /* not _exit: the leak checker runs in children too */
}

static void test_multiprocess(void) {
    pid_t pids[NPROC];
    char paths[NPROC][128];
    fflush(NULL);
    for (int i = 0; i < NPROC; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/ids.%d", dir, i);
        pids[i] = fork();
        CHECK(pids[i] >= 0, "fork: %s", strerror(errno));
        if (pids[i] == 0) child(i, paths[i]);
    }
    int bad = 0;
    for (int i = 0; i < NPROC; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
    }
    CHECK(bad == 0, "%d of %d children failed", bad, NPROC);
    uint64_t *all = malloc(sizeof *all * NPROC * NIDS);
    CHECK(all, "oom");
    for (int i = 0; i < NPROC; i++) {
        FILE *f = fopen(paths[i], "rb");
        CHECK(f && fread(all + (size_t)i * NIDS, sizeof *all, NIDS, f) == NIDS, "read %s",
              paths[i]);
        fclose(f);
        unlink(paths[i]);
    }
    qsort(all, (size_t)NPROC * NIDS, sizeof *all, cmp_u64);
    for (size_t i = 1; i < (size_t)NPROC * NIDS; i++)
        CHECK(all[i] != all[i - 1], "duplicate id %" PRIu64, all[i]);
    free(all);
    printf("ok: %d processes x %d ids, all unique, increasing per process\n", NPROC, NIDS);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    owner_pid = getpid();
    atexit(cleanup);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGALRM, on_signal);
    alarm(110);
    start_server();
    dlock_client *c = client();
    redisContext *rc = raw();
    test_args(c);
    printf("ok: arguments\n");
    test_layout(c, rc);
    printf("ok: layout\n");
    test_batch_vs_single(c, rc);
    printf("ok: batch vs single\n");
    test_overflow(c, rc);
    printf("ok: overflow errors\n");
    test_multiprocess();
    redisFree(rc);
    dlock_client_free(c);
    return 0;
}
