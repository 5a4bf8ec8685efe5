/* Faults: no server (refused port, and a listener that never answers) fails
 * with DLOCK_EIO within the connect timeout; a server restarted while locks
 * are held (data lost) gives reported errors (ELOST, lost callback), no crash,
 * and the client is usable afterwards; with AOF the lock survives a crash; a
 * server going away under a blocked waiter ends the wait in bounded time;
 * connections killed by the server and a flushed script cache are survived;
 * a server announcing arrays too large to hold is refused with DLOCK_EPROTO
 * before the client allocates for them. */
#include "harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static atomic_int g_lost;
static atomic_int g_lost_reason;

static void on_lost(dlock_lock *l, int reason, void *ud)
{
    (void)l;
    (void)ud;
    atomic_store(&g_lost_reason, reason);
    atomic_fetch_add(&g_lost, 1);
}

/* A listening socket on a free port; backlog accepts the TCP handshake but
 * nobody ever reads or answers. */
static int blackhole(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ASSERT_EQ(listen(fd, 16), 0);
    ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static void no_server(void)
{
    /* a port nobody listens on */
    int port;
    int fd = blackhole(&port);
    close(fd);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.connect_timeout_ms = 500;
    dlock_client *c = NULL;
    int64_t t0 = th_now_ms();
    int rc = dlock_client_new(&o, &c);
    int64_t took = th_now_ms() - t0;
    ASSERT_NOT_NULL(c);
    ASSERT_CCODE(c, rc, DLOCK_EIO);
    ASSERT_LE(took, 500 + 1000);
    ASSERT(dlock_errmsg(c)[0] != '\0');
    th_log("refused port: EIO in %lld ms: %s", (long long)took, dlock_errmsg(c));
    dlock_client_free(c);

    /* the same through a unix socket path that does not exist */
    o.url = "unix:///nonexistent-dlock-test-dir/redis.sock";
    c = NULL;
    rc = dlock_client_new(&o, &c);
    ASSERT_NOT_NULL(c);
    ASSERT_CCODE(c, rc, DLOCK_EIO);
    dlock_client_free(c);

    /* a listener that never answers: bounded by the timeouts */
    fd = blackhole(&port);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    o.url = url;
    o.connect_timeout_ms = 400;
    o.command_timeout_ms = 400;
    c = NULL;
    t0 = th_now_ms();
    rc = dlock_client_new(&o, &c);
    took = th_now_ms() - t0;
    ASSERT_NOT_NULL(c);
    ASSERT_CCODE(c, rc, DLOCK_EIO);
    th_log("silent listener: EIO in %lld ms: %s", (long long)took, dlock_errmsg(c));
    ASSERT_LE(took, 400 + 400 + 1200);
    dlock_client_free(c);
    close(fd);
}

/* A fake server: answers the first command it reads with reply, then reads
 * until the client hangs up. */
typedef struct {
    int lfd;
    const char *reply;
} huge_server;

static void *huge_serve(void *arg)
{
    huge_server *h = arg;
    int fd = accept(h->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    char buf[4096];
    if (read(fd, buf, sizeof buf) > 0) {
        size_t n = strlen(h->reply);
        if (write(fd, h->reply, n) != (ssize_t)n) {
            close(fd);
            return NULL;
        }
        while (read(fd, buf, sizeof buf) > 0) {}
    }
    close(fd);
    return NULL;
}

/* hiredis 0.14's reader callocs an array's element pointers when its
 * header arrives: without a bound, "*1000000000" costs 8 GB (an allocator
 * failure under ASan, a wait for elements that never come otherwise), and
 * arrays nested in one reply add up. The reply is refused as a protocol
 * error, at once. */
static void huge_arrays(void)
{
    static const char *replies[] = {
        "*1000000000\r\n",                 /* one header: 8 GB */
        "*3000000\r\n*3000000\r\n",       /* each allowed, not both */
        "*2\r\n*2147483647\r\n",          /* the largest count, nested */
    };
    for (size_t i = 0; i < sizeof replies / sizeof *replies; i++) {
        int port;
        huge_server h = {blackhole(&port), replies[i]};
        pthread_t t;
        ASSERT_EQ(pthread_create(&t, NULL, huge_serve, &h), 0);
        char url[64];
        snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
        dlock_options o;
        dlock_options_init(&o);
        o.url = url;
        o.connect_timeout_ms = 2000;
        o.command_timeout_ms = 2000;
        dlock_client *c = NULL;
        int64_t t0 = th_now_ms();
        int rc = dlock_client_new(&o, &c);
        if (rc == DLOCK_OK) {
            /* the client connects lazily: the first command reads the reply */
            dlock_lock *l = NULL;
            ASSERT_CCODE(c, dlock_lock_new(c, "huge", 4, DLOCK_KIND_PLAIN, &l), DLOCK_OK);
            rc = dlock_acquire(l, 0, 1000, NULL);
            dlock_lock_free(l);
        }
        int64_t took = th_now_ms() - t0;
        ASSERT_NOT_NULL(c);
        ASSERT_CCODE(c, rc, DLOCK_EPROTO);
        ASSERT(strstr(dlock_errmsg(c), "elements") != NULL);
        ASSERT_LE(took, 1500);
        th_log("huge array %zu: EPROTO in %lld ms: %s", i, (long long)took, dlock_errmsg(c));
        dlock_client_free(c);
        pthread_join(t, NULL);
        close(h.lfd);
    }
}

static dlock_client *fast_client(const th_server *s, int64_t wd)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = th_server_url(s);
    o.connect_timeout_ms = 1000;
    o.command_timeout_ms = 1000;
    o.watchdog_lease_ms = wd;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    ASSERT_CCODE(c, rc, DLOCK_OK);
    return c;
}

/* Retries op while it returns DLOCK_EIO (reconnect backoff), up to ms. */
#define RETRY_EIO(var, expr, ms)                                                         \
    do {                                                                                 \
        int64_t dl_ = th_now_ms() + (ms);                                                \
        for (;;) {                                                                       \
            var = (expr);                                                                \
            if (var != DLOCK_EIO || th_now_ms() > dl_) break;                            \
            th_sleep_ms(20);                                                             \
        }                                                                                \
    } while (0)

static void restart_data_lost(void)
{
    th_server *s = th_server_start(NULL);
    dlock_client *c = fast_client(s, 900);
    dlock_lock *wd = th_lock(c, "fault:wd", DLOCK_KIND_REENTRANT);
    dlock_lock *ex = th_lock(c, "fault:ex", DLOCK_KIND_PLAIN);
    dlock_lock_on_lost(wd, on_lost, NULL);
    ASSERT_LOK(wd, dlock_acquire(wd, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(ex, dlock_acquire(ex, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_COK(c, dlock_ping(c, NULL)); /* leaves a pooled connection to go stale */

    th_server_restart(s, SIGTERM); /* no AOF: both locks are gone */
    th_log("server restarted (data lost)");

    /* the watchdog finds the lock gone (or the server gone for a lease) */
    ASSERT_EVENTUALLY(atomic_load(&g_lost) > 0, 5000);
    int reason = atomic_load(&g_lost_reason);
    ASSERT_MSG(reason == DLOCK_LOST_TAKEN || reason == DLOCK_LOST_UNREACHABLE, "reason %d",
               reason);
    ASSERT_EQ(dlock_lock_is_lost(wd), 1);

    int rc;
    RETRY_EIO(rc, dlock_release(ex), 5000);
    ASSERT_LCODE(ex, rc, DLOCK_ELOST);
    ASSERT_EQ(dlock_lock_holding(ex), 0);
    RETRY_EIO(rc, dlock_release(wd), 5000);
    ASSERT_LCODE(wd, rc, DLOCK_ELOST);

    /* usable afterwards: the same handles acquire again */
    RETRY_EIO(rc, dlock_acquire(ex, DLOCK_NOWAIT, 5000, NULL), 5000);
    ASSERT_LCODE(ex, rc, DLOCK_OK);
    ASSERT_EQ(dlock_lock_is_lost(ex), 0);
    ASSERT_LOK(wd, dlock_acquire(wd, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_COK(c, dlock_ping(c, NULL));
    ASSERT_LOK(ex, dlock_release(ex));
    ASSERT_LOK(wd, dlock_release(wd));
    dlock_lock_free(ex);
    dlock_lock_free(wd);
    dlock_client_free(c);
    th_server_stop(s);
}

static void crash_with_aof(void)
{
    th_server_opts so = {1, NULL};
    th_server *s = th_server_start(&so);
    dlock_client *c = fast_client(s, 0);
    dlock_lock *l = th_lock(c, "fault:aof", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 30000, NULL));
    th_server_restart(s, SIGKILL); /* crash; appendfsync always kept the key */
    redisContext *rc = th_redis(s);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS fault:aof"), 1);
    int held = 0, rcode;
    RETRY_EIO(rcode, dlock_lock_check(l, &held, NULL), 5000);
    ASSERT_LCODE(l, rcode, DLOCK_OK);
    ASSERT_EQ(held, 1);
    RETRY_EIO(rcode, dlock_release(l), 5000);
    ASSERT_LCODE(l, rcode, DLOCK_OK);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS fault:aof"), 0);
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    th_server_stop(s);
}

typedef struct {
    dlock_client *c;
    int rc;
    int64_t took;
    const char *name;
    int64_t wait_ms;
    int64_t t_end;
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;
    dlock_lock *l = th_lock(w->c, w->name, DLOCK_KIND_PLAIN);
    int64_t t0 = th_now_ms();
    w->rc = dlock_acquire(l, w->wait_ms, 5000, NULL);
    w->t_end = th_now_ms();
    w->took = w->t_end - t0;
    if (w->rc == DLOCK_OK) dlock_release(l);
    dlock_lock_free(l);
    return NULL;
}

static void server_gone_under_waiter(void)
{
    th_server *s = th_server_start(NULL);
    dlock_client *c = fast_client(s, 0);
    dlock_lock *h = th_lock(c, "fault:wait", DLOCK_KIND_PLAIN);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    waiter w = {c, -1, 0};
    w.name = "fault:wait";
    w.wait_ms = 3000;
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, wait_thread, &w), 0);
    redisContext *rc = th_redis(s);
    th_wait_subscribers(rc, "fault:wait", 1, 5000);
    redisFree(rc);
    th_sleep_ms(300);
    th_server_halt(s, SIGKILL);
    ASSERT_EQ(pthread_join(t, NULL), 0);
    th_log("waiter after the server died: %s in %lld ms", dlock_strerror(w.rc), (long long)w.took);
    ASSERT_MSG(w.rc != DLOCK_OK, "acquired a lock on a dead server");
    ASSERT_LE(w.took, 3000 + 1000 + 2000);
    th_server_resume(s);
    int rcode;
    RETRY_EIO(rcode, dlock_release(h), 5000);
    ASSERT_LCODE(h, rcode, DLOCK_ELOST);
    RETRY_EIO(rcode, dlock_acquire(h, DLOCK_NOWAIT, 5000, NULL), 5000);
    ASSERT_LCODE(h, rcode, DLOCK_OK);
    ASSERT_LOK(h, dlock_release(h));
    dlock_lock_free(h);
    dlock_client_free(c);
    th_server_stop(s);
}

/* A server that stops answering (SIGSTOP) for longer than the command
 * timeout while a caller waits: the wait rides the outage out and gets the
 * lock once the server is back and the holder's lease ran out (before the
 * wait's own deadline), for every kind; with dlock_client_set_fail_fast it
 * ends at the first failure instead. */
typedef struct {
    dlock_client *c;
    const char *name;
    dlock_kind kind;
    int64_t wait_ms;
    int rc;
    int64_t took;
} kwaiter;

static void *kwait_thread(void *arg)
{
    kwaiter *w = arg;
    dlock_lock *l = th_lock(w->c, w->name, w->kind);
    int64_t t0 = th_now_ms();
    w->rc = dlock_acquire(l, w->wait_ms, 5000, NULL);
    w->took = th_now_ms() - t0;
    if (w->rc == DLOCK_OK) dlock_release(l);
    dlock_lock_free(l);
    return NULL;
}

static dlock_client *short_client(const th_server *s)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = th_server_url(s);
    o.connect_timeout_ms = 300;
    o.command_timeout_ms = 300;
    dlock_client *c = NULL;
    ASSERT_COK(c, dlock_client_new(&o, &c));
    return c;
}

static void frozen_server_under_waiter(void)
{
    th_server *s = th_server_start(NULL);
    /* every kind rides it out through the same wait (wait.c); failing fast
     * once is enough */
    const dlock_kind kinds[] = {DLOCK_KIND_PLAIN, DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR,
                                DLOCK_KIND_WRITE};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        for (int fast = 0; fast < (k == 0 ? 2 : 1); fast++) {
            char name[32];
            snprintf(name, sizeof name, "fault:frozen:%zu:%d", k, fast);
            dlock_client *hc = short_client(s);
            dlock_lock *h = th_lock(hc, name, kinds[k]);
            ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 1500, NULL));
            dlock_client *c = short_client(s);
            if (fast) ASSERT_COK(c, dlock_client_set_fail_fast(c, 1));
            kwaiter w = {c, name, kinds[k], 8000, -1, 0};
            pthread_t t;
            ASSERT_EQ(pthread_create(&t, NULL, kwait_thread, &w), 0);
            th_sleep_ms(200);
            th_server_pause(s); /* 2 s: several command timeouts */
            th_sleep_ms(2000);
            th_server_unpause(s);
            ASSERT_EQ(pthread_join(t, NULL), 0);
            th_log("kind %d, fail fast %d: %s in %lld ms", (int)kinds[k], fast,
                   dlock_strerror(w.rc), (long long)w.took);
            if (fast) {
                ASSERT_CCODE(c, w.rc, DLOCK_EIO);
                ASSERT_LE(w.took, 2200);
            } else {
                ASSERT_CCODE(c, w.rc, DLOCK_OK);
                ASSERT_LT(w.took, 8000);
            }
            dlock_lock_free(h);
            dlock_client_free(hc);
            dlock_client_free(c);
        }
    }
    th_server_stop(s);
}

/* An attempt whose reply is lost, on a free lock: the server stops with the
 * attempt in its socket, the client times out, and the server runs the
 * attempt when it resumes: the lock is taken under the waiting call's
 * owner. A plain lock's wait finds that hold its own and gives it back,
 * then takes the lock anew, instead of waiting out the lost hold's 8 s
 * lease. The other kinds re-enter it; their release then finds the owner's
 * count above what its handles hold and gives the surplus back, so the lock
 * is free at once, not at the end of the lost hold's lease. */
static void lost_attempt_reply(dlock_kind kind)
{
    th_server *s = th_server_start(NULL);
    dlock_client *c = short_client(s);
    char name[48];
    snprintf(name, sizeof name, "fault:lostreply:%d", (int)kind);
    dlock_lock *l = th_lock(c, name, kind);
    /* the scripts in the server's cache (a lost EVALSHA of an unknown
     * script does nothing) and a pooled connection to send on */
    dlock_lock *warm = th_lock(c, "fault:lostreply:warm", kind);
    ASSERT_LOK(warm, dlock_acquire(warm, DLOCK_NOWAIT, 1000, NULL));
    ASSERT_LOK(warm, dlock_release(warm));
    dlock_lock_free(warm);
    th_server_pause(s);
    pid_t resumer = th_fork(); /* the server is back in 1.2 s */
    if (resumer == 0) {
        usleep(1200 * 1000);
        kill(th_server_pid(s), SIGCONT);
        _exit(0);
    }
    int64_t t0 = th_now_ms();
    int code = dlock_acquire(l, 10000, 8000, NULL);
    int64_t took = th_now_ms() - t0;
    ASSERT_EQ(th_wait_child(resumer, 5000), 0);
    th_server_unpause(s);
    th_log("kind %d: acquire across a lost reply: %s in %lld ms", (int)kind,
           dlock_strerror(code), (long long)took);
    ASSERT_LCODE(l, code, DLOCK_OK);
    if (kind == DLOCK_KIND_PLAIN) ASSERT_LT(took, 4000);
    redisContext *rc = th_redis(s);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", name), 1);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", name), 0);
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    th_server_stop(s);
}

/* Connections killed by the server (CLIENT KILL) and the script cache flushed
 * (SCRIPT FLUSH: EVALSHA answers NOSCRIPT): calls report an error at most once
 * and then work; a watchdog lock is not lost over it. */
static void killed_connections_and_flushed_scripts(void)
{
    th_server *s = th_server_start(NULL);
    dlock_client *c = fast_client(s, 900);
    redisContext *rc = th_redis(s);
    atomic_store(&g_lost, 0);
    dlock_lock *wd = th_lock(c, "fault:kill:wd", DLOCK_KIND_REENTRANT);
    dlock_lock_on_lost(wd, on_lost, NULL);
    ASSERT_LOK(wd, dlock_acquire(wd, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    dlock_lock *l = th_lock(c, "fault:kill", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 20000, NULL));

    for (int round = 0; round < 3; round++) {
        /* kill every connection but ours; flush the scripts */
        th_cmd_ok(rc, "CLIENT KILL TYPE normal SKIPME yes");
        th_cmd_ok(rc, "CLIENT KILL TYPE pubsub SKIPME yes");
        th_cmd_ok(rc, "SCRIPT FLUSH");
        int code, errors = 0;
        for (;;) {
            code = dlock_extend(l, 20000);
            if (code != DLOCK_EIO || ++errors > 50) break;
            th_sleep_ms(20);
        }
        ASSERT_LCODE(l, code, DLOCK_OK);
        ASSERT_COK(c, dlock_ping(c, NULL));
        th_sleep_ms(350); /* a watchdog renewal or two after the kill */
    }
    /* renewals went on through reconnects and NOSCRIPT */
    ASSERT_EQ(atomic_load(&g_lost), 0);
    ASSERT_EQ(dlock_lock_is_lost(wd), 0);
    ASSERT_GT(th_cmd_int(rc, "PTTL fault:kill:wd"), 0);
    th_cmd_ok(rc, "SCRIPT FLUSH");
    ASSERT_LOK(wd, dlock_acquire(wd, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL)); /* re-entry */
    int held = 0;
    int64_t count = 0;
    ASSERT_LOK(wd, dlock_lock_check(wd, &held, &count));
    ASSERT_EQ(count, 2);
    ASSERT_LOK(wd, dlock_release(wd));
    ASSERT_LOK(wd, dlock_release(wd));
    th_cmd_ok(rc, "SCRIPT FLUSH");
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS fault:kill fault:kill:wd"), 0);
    th_cmd_ok(rc, "SCRIPT FLUSH");
    char tok[DLOCK_TOKEN_LEN + 1];
    ASSERT_COK(c, dlock_acquire_token(c, "fault:kill", DLOCK_CSTR, 0, 5000, tok, NULL));
    th_cmd_ok(rc, "SCRIPT FLUSH");
    ASSERT_COK(c, dlock_extend_token(c, "fault:kill", DLOCK_CSTR, tok, 5000));
    th_cmd_ok(rc, "SCRIPT FLUSH");
    ASSERT_COK(c, dlock_release_token(c, "fault:kill", DLOCK_CSTR, tok));
    th_cmd_ok(rc, "SCRIPT FLUSH");
    ASSERT_COK(c, dlock_force_unlock(c, "fault:kill", DLOCK_CSTR, NULL));

    /* a waiter whose subscription is killed neither hangs to its bound nor
     * misses the release for long: it gets the lock or reports an error */
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 20000, NULL));
    waiter w = {c, -1, 0};
    w.name = "fault:kill";
    w.wait_ms = 10000;
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, wait_thread, &w), 0);
    th_wait_subscribers(rc, "fault:kill", 1, 5000);
    th_cmd_ok(rc, "CLIENT KILL TYPE pubsub SKIPME yes");
    th_sleep_ms(200);
    int64_t t_rel = th_now_ms();
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(pthread_join(t, NULL), 0);
    int64_t after = w.t_end - t_rel;
    th_log("waiter with a killed subscription: %s %lld ms after the release",
           dlock_strerror(w.rc), (long long)after);
    ASSERT_MSG(w.rc == DLOCK_OK || w.rc == DLOCK_EIO, "waiter: %s", dlock_strerror(w.rc));
    ASSERT_LT(after, 3000);

    dlock_lock_free(l);
    dlock_lock_free(wd);
    redisFree(rc);
    dlock_client_free(c);
    th_server_stop(s);
}

int main(void)
{
    th_init("faults");
    no_server();
    huge_arrays();
    restart_data_lost();
    crash_with_aof();
    server_gone_under_waiter();
    frozen_server_under_waiter();
    lost_attempt_reply(DLOCK_KIND_PLAIN);
    lost_attempt_reply(DLOCK_KIND_REENTRANT);
    lost_attempt_reply(DLOCK_KIND_FAIR);
    lost_attempt_reply(DLOCK_KIND_WRITE);
    killed_connections_and_flushed_scripts();
    th_log("ok");
    return 0;
}
