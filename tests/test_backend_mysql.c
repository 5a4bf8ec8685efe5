/* The MySQL/MariaDB backend (src/backends/mysql/) against a private mariadbd
 * started in a temporary directory on a free 127.0.0.1 port (SERVERS.md,
 * section 4): database testdb, user 'test'@'127.0.0.1'. The server is always
 * stopped and its directory removed (atexit; the harness SIGKILLs it on a
 * signal or timeout, and it dies with the test through PR_SET_PDEATHSIG).
 * Exits 77 when mariadbd is not installed.
 *
 * argv[1] (optional): the dlock CLI, run once against the server. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "mysql_server.h"

static dlock_client *client_url(const char *url) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    ASSERT_MSG(rc == DLOCK_OK, "client %s: %s: %s", url, dlock_strerror(rc), dlock_errmsg(c));
    return c;
}

static dlock_client *client(void) { return client_url(g_url); }

static dlock_lock *lock_n(dlock_client *c, const char *name, size_t len, dlock_kind kind) {
    dlock_lock *l = NULL;
    ASSERT_COK(c, dlock_lock_new(c, name, len, kind, &l));
    return l;
}

static dlock_lock *lock(dlock_client *c, const char *name, dlock_kind kind) {
    return lock_n(c, name, DLOCK_CSTR, kind);
}

/* ---- try-once, timed, fencing, check, inspect ---- */
static void test_basic(void) {
    dlock_client *a = client(), *b = client();
    dlock_lock *la = lock(a, "basic", DLOCK_KIND_PLAIN), *lb = lock(b, "basic", DLOCK_KIND_PLAIN);
    uint64_t f1 = 0, f2 = 0, cur = 0;
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, &f1));
    ASSERT_U64_GT(f1, 0);
    ASSERT_COK(a, dlock_fence_current(a, "basic", DLOCK_CSTR, &cur));
    ASSERT_U64_EQ(cur, f1);
    ASSERT_GT(dlock_lock_valid_ms(la), 1000000);
    int held = 0;
    int64_t count = 0;
    ASSERT_LOK(la, dlock_lock_check(la, &held, &count));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(count, 1);
    /* a plain handle does not re-enter */
    ASSERT_LCODE(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL), DLOCK_EINVAL);

    ASSERT_LCODE(lb, dlock_acquire(lb, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT(strstr(dlock_lock_errmsg(lb), "basic"));
    ASSERT_LOK(lb, dlock_lock_check(lb, &held, &count));
    ASSERT_EQ(held, 0);
    int64_t t0 = th_now_ms();
    ASSERT_LCODE(lb, dlock_acquire(lb, 300, DLOCK_WATCHDOG, NULL), DLOCK_ETIMEDOUT);
    int64_t took = th_now_ms() - t0;
    th_log("timed acquire of 300 ms gave up after %lld ms", (long long)took);
    ASSERT_GE(took, 280);
    ASSERT_LT(took, 1500);

    dlock_info info;
    ASSERT_COK(b, dlock_inspect(b, "basic", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.holders, 1);
    ASSERT_EQ(info.ttl_ms, -1);
    ASSERT_U64_EQ(info.fence, f1);
    int locked = 0;
    ASSERT_COK(b, dlock_is_locked(b, "basic", DLOCK_CSTR, &locked));
    ASSERT_EQ(locked, 1);

    ASSERT_LOK(la, dlock_release(la));
    ASSERT_LCODE(la, dlock_release(la), DLOCK_ENOTHELD);
    ASSERT_LOK(lb, dlock_acquire(lb, 2000, DLOCK_WATCHDOG, &f2));
    ASSERT_U64_GT(f2, f1);
    ASSERT_LOK(lb, dlock_release(lb));
    ASSERT_COK(a, dlock_inspect(a, "basic", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 0);
    ASSERT_EQ(info.ttl_ms, -2);
    int64_t ttl = 0;
    ASSERT_COK(a, dlock_remaining_ttl(a, "basic", DLOCK_CSTR, &ttl));
    ASSERT_EQ(ttl, -2);
    ASSERT_COK(a, dlock_fence_current(a, "never-locked", DLOCK_CSTR, &cur));
    ASSERT_U64_EQ(cur, 0);
    int64_t rtt = -1;
    ASSERT_COK(a, dlock_ping(a, &rtt));
    ASSERT_GE(rtt, 0);
    dlock_lock_free(la);
    dlock_lock_free(lb);
    dlock_client_free(a);
    dlock_client_free(b);
    th_log("basic: ok (fences %llu < %llu)", (unsigned long long)f1, (unsigned long long)f2);
}

/* ---- a timed waiter is woken by the release ---- */
static void test_handoff(void) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = th_fork();
    if (pid == 0) {
        dlock_client *c = client();
        dlock_lock *l = lock(c, "handoff", DLOCK_KIND_PLAIN);
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
        ASSERT_EQ(write(p[1], "a", 1), 1);
        th_sleep_ms(300);
        ASSERT_LOK(l, dlock_release(l));
        dlock_lock_free(l);
        dlock_client_free(c);
        _exit(0);
    }
    char ch;
    ASSERT_EQ(read(p[0], &ch, 1), 1);
    dlock_client *c = client();
    dlock_lock *l = lock(c, "handoff", DLOCK_KIND_PLAIN);
    int64_t t0 = th_now_ms();
    ASSERT_LOK(l, dlock_acquire(l, 10000, DLOCK_WATCHDOG, NULL));
    int64_t took = th_now_ms() - t0;
    ASSERT_LT(took, 2000);
    ASSERT_EQ(th_wait_child(pid, 5000), 0);
    dlock_lock_free(l); /* releases */
    l = lock(c, "handoff", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    dlock_lock_free(l);
    dlock_client_free(c);
    close(p[0]);
    close(p[1]);
    th_log("handoff: ok (waited %lld ms for a 300 ms hold)", (long long)took);
}

/* ---- reentrant ---- */
static void test_reentrant(void) {
    dlock_client *a = client(), *b = client();
    dlock_lock *la = lock(a, "re", DLOCK_KIND_REENTRANT), *lb = lock(b, "re", DLOCK_KIND_REENTRANT);
    uint64_t f1, f2;
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, &f1));
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, &f2));
    ASSERT_U64_GT(f2, f1);
    int held;
    int64_t count;
    ASSERT_LOK(la, dlock_lock_check(la, &held, &count));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(count, 2);
    ASSERT_LOK(la, dlock_release(la));
    ASSERT_EQ(dlock_lock_holding(la), 1);
    ASSERT_LCODE(lb, dlock_acquire(lb, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_LOK(la, dlock_release(la));
    ASSERT_EQ(dlock_lock_holding(la), 0);
    ASSERT_LOK(lb, dlock_acquire(lb, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    dlock_lock_free(lb); /* releases */
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    dlock_lock_free(la);
    dlock_client_free(a);
    dlock_client_free(b);
    th_log("reentrant: ok");
}

/* ---- names over 64 bytes, and binary names ---- */
static void test_long_names(void) {
    char n1[300], n2[300];
    memset(n1, 'x', sizeof n1);
    memcpy(n2, n1, sizeof n2);
    n2[299] = 'y'; /* differs in the last byte only */
    const char bin[] = {'a', 0, (char)0xff, '\n', 'b'};
    dlock_client *a = client(), *b = client();
    dlock_lock *a1 = lock_n(a, n1, sizeof n1, DLOCK_KIND_PLAIN);
    dlock_lock *b1 = lock_n(b, n1, sizeof n1, DLOCK_KIND_PLAIN);
    dlock_lock *b2 = lock_n(b, n2, sizeof n2, DLOCK_KIND_PLAIN);
    dlock_lock *a3 = lock_n(a, bin, sizeof bin, DLOCK_KIND_PLAIN);
    dlock_lock *b3 = lock_n(b, bin, sizeof bin, DLOCK_KIND_PLAIN);
    uint64_t f1, f2;
    ASSERT_LOK(a1, dlock_acquire(a1, DLOCK_NOWAIT, DLOCK_WATCHDOG, &f1));
    ASSERT_LCODE(b1, dlock_acquire(b1, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_LOK(b2, dlock_acquire(b2, DLOCK_NOWAIT, DLOCK_WATCHDOG, &f2));
    ASSERT_U64_EQ(f2, 1); /* its own counter */
    ASSERT_LOK(a3, dlock_acquire(a3, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LCODE(b3, dlock_acquire(b3, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    int locked = 0;
    ASSERT_COK(a, dlock_is_locked(a, n2, sizeof n2, &locked));
    ASSERT_EQ(locked, 1);
    uint64_t cur;
    ASSERT_COK(a, dlock_fence_current(a, n1, sizeof n1, &cur));
    ASSERT_U64_EQ(cur, f1);
    ASSERT_LOK(a1, dlock_release(a1));
    ASSERT_LOK(b1, dlock_acquire(b1, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    dlock_lock_free(a1);
    dlock_lock_free(b1);
    dlock_lock_free(b2);
    dlock_lock_free(a3);
    dlock_lock_free(b3);
    dlock_client_free(a);
    dlock_client_free(b);
    th_log("long and binary names: ok");
}

/* ---- what the backend does not have ---- */
static void assert_notsup(int rc, const char *msg) {
    ASSERT_MSG(rc == DLOCK_ENOTSUP, "want DLOCK_ENOTSUP, got %d (%s): %s", rc,
               dlock_strerror(rc), msg);
    ASSERT_MSG(strstr(msg, "mysql") != NULL, "message does not name the backend: %s", msg);
}

static void test_unsupported(void) {
    dlock_client *c = client();
    dlock_lock *l = NULL;
    int rc = dlock_lock_new(c, "x", DLOCK_CSTR, DLOCK_KIND_READ, &l);
    assert_notsup(rc, dlock_errmsg(c));
    rc = dlock_lock_new(c, "x", DLOCK_CSTR, DLOCK_KIND_FAIR, &l);
    assert_notsup(rc, dlock_errmsg(c));
    ASSERT_NULL(l);
    l = lock(c, "x", DLOCK_KIND_PLAIN);
    rc = dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL);
    assert_notsup(rc, dlock_lock_errmsg(l));
    th_log("explicit lease: %s", dlock_lock_errmsg(l));
    ASSERT_EQ(dlock_lock_holding(l), 0);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    rc = dlock_extend(l, 5000);
    assert_notsup(rc, dlock_lock_errmsg(l));
    int e = 0;
    rc = dlock_force_unlock(c, "x", DLOCK_CSTR, &e);
    assert_notsup(rc, dlock_errmsg(c));
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_client_free(c);
    th_log("unsupported: ok");
}

/* ---- bad URLs and credentials ---- */
static void test_bad_url(void) {
    const char *bad[] = {"mysql://test:pw-in-url@127.0.0.1:notaport/testdb",
                         "mysql://test:pw-in-url@127.0.0.1:3306",
                         "mariadb://test:pw-in-url@/testdb"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dlock_options o;
        dlock_options_init(&o);
        o.url = bad[i];
        dlock_client *c = NULL;
        int rc = dlock_client_new(&o, &c);
        ASSERT_MSG(rc == DLOCK_EINVAL, "%s: got %d: %s", bad[i], rc, dlock_errmsg(c));
        ASSERT_MSG(!strstr(dlock_errmsg(c), "pw-in-url"), "password in: %s", dlock_errmsg(c));
        dlock_client_free(c);
    }
    char url[256];
    snprintf(url, sizeof url, "mariadb://test:Wrong-Secret@127.0.0.1:%d/testdb", g_port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    const char *m = dlock_errmsg(c);
    th_log("wrong password: %s", m);
    ASSERT_MSG(rc == DLOCK_EAUTH, "wrong password: got %d: %s", rc, m);
    ASSERT_MSG(!strstr(m, "Wrong-Secret"), "password in: %s", m);
    ASSERT(strstr(m, "***"));
    dlock_client_free(c);
    /* the password option wins over the URL's */
    o.password = "secret";
    ASSERT_COK(c, dlock_client_new(&o, &c));
    dlock_client_free(c);
    /* nothing listening */
    snprintf(url, sizeof url, "mysql://test:secret@127.0.0.1:%d/testdb", th_free_port());
    o.url = url;
    o.password = NULL;
    o.connect_timeout_ms = 2000;
    rc = dlock_client_new(&o, &c);
    th_log("refused: %s", dlock_errmsg(c));
    ASSERT_MSG(rc == DLOCK_EIO, "refused: got %d: %s", rc, dlock_errmsg(c));
    ASSERT(!strstr(dlock_errmsg(c), "secret"));
    dlock_client_free(c);
    /* percent-escapes in the user and the password (a space, '@', ':',
     * '/', '%'), decoded before they reach the server; a bad escape is a
     * bad URL */
    ASSERT_EQ(sql_root("CREATE USER 'dl user'@'127.0.0.1' IDENTIFIED BY 'p@ss:w/rd%'; "
                       "GRANT ALL ON testdb.* TO 'dl user'@'127.0.0.1'"),
              0);
    snprintf(url, sizeof url, "mysql://dl%%20user:p%%40ss%%3Aw%%2Frd%%25@127.0.0.1:%d/testdb",
             g_port);
    o.url = url;
    ASSERT_COK(c, dlock_client_new(&o, &c));
    dlock_lock *el = lock(c, "escaped", DLOCK_KIND_PLAIN);
    ASSERT_LOK(el, dlock_acquire(el, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(el, dlock_release(el));
    dlock_lock_free(el);
    dlock_client_free(c);
    const char *badesc[] = {"mysql://test:se%%zzret@127.0.0.1:%d/testdb",
                            "mysql://test:secret%%4@127.0.0.1:%d/testdb",
                            "mysql://te%%00st:secret@127.0.0.1:%d/testdb"};
    for (size_t i = 0; i < sizeof badesc / sizeof badesc[0]; i++) {
        snprintf(url, sizeof url, badesc[i], g_port);
        o.url = url;
        rc = dlock_client_new(&o, &c);
        th_log("%s: %s", url, dlock_errmsg(c));
        ASSERT_MSG(rc == DLOCK_EINVAL, "%s: got %d: %s", url, rc, dlock_errmsg(c));
        dlock_client_free(c);
    }
    th_log("bad URL and credentials: ok");
}

/* ---- the holder's connection is killed: its lock is lost ---- */
static void test_conn_lost(void) {
    dlock_client *c = client(), *d = client();
    dlock_lock *l = lock(c, "lost", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    dlock_info info;
    ASSERT_COK(d, dlock_inspect(d, "lost", DLOCK_CSTR, &info));
    long long id = 0;
    ASSERT_EQ(sscanf(info.holder, "connection %lld", &id), 1);
    char sql[64];
    snprintf(sql, sizeof sql, "KILL %lld", id);
    ASSERT_EQ(sql_root(sql), 0);
    int held = 1;
    ASSERT_LCODE(l, dlock_lock_check(l, &held, NULL), DLOCK_ELOST);
    ASSERT_EQ(held, 0);
    ASSERT_EQ(dlock_lock_is_lost(l), 1);
    ASSERT_LCODE(l, dlock_release(l), DLOCK_ELOST);
    dlock_lock *m = lock(d, "lost", DLOCK_KIND_PLAIN);
    ASSERT_LOK(m, dlock_acquire(m, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(m, dlock_release(m));
    /* the handle connects again */
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(m);
    dlock_lock_free(l);
    dlock_client_free(c);
    dlock_client_free(d);
    th_log("connection lost: ok");
}

/* ---- a holder killed with SIGKILL ---- */
static void test_holder_killed(void) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = th_fork();
    if (pid == 0) {
        dlock_client *c = client();
        dlock_lock *l = lock(c, "crash", DLOCK_KIND_PLAIN);
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
        ASSERT_EQ(write(p[1], "a", 1), 1);
        for (;;) pause();
    }
    char ch;
    ASSERT_EQ(read(p[0], &ch, 1), 1);
    dlock_client *c = client();
    dlock_lock *l = lock(c, "crash", DLOCK_KIND_PLAIN);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    kill(pid, SIGKILL);
    ASSERT_EQ(th_wait_child(pid, 5000), 128 + SIGKILL);
    int64_t t0 = th_now_ms();
    ASSERT_LOK(l, dlock_acquire(l, 10000, DLOCK_WATCHDOG, NULL));
    int64_t took = th_now_ms() - t0;
    th_log("holder killed: lock taken over %lld ms after its death", (long long)took);
    ASSERT_LT(took, 2000);
    dlock_lock_free(l);
    dlock_client_free(c);
    close(p[0]);
    close(p[1]);
}

/* sessions waiting for a user lock (GET_LOCK), by the server's process list */
static long long lock_waiters(void) {
    char sock[160], out[200], buf[256];
    snprintf(sock, sizeof sock, "--socket=%s", g_sock);
    snprintf(out, sizeof out, "%s/q.out", g_dir);
    char *argv[] = {g_tools[3], "--no-defaults", sock, "-u", "root", "-N", "-e",
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE LIKE "
                    "'%user lock%'",
                    NULL};
    ASSERT_EQ(th_run_capture(argv, out, buf, sizeof buf, 20000), 0);
    return atoll(buf);
}

/* ---- a waiter killed while it waits leaves nothing queued ---- */
static void test_waiter_killed(void) {
    dlock_client *c = client();
    dlock_lock *h = lock(c, "kw", DLOCK_KIND_PLAIN), *x = lock(c, "kw", DLOCK_KIND_PLAIN);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    pid_t pid = th_fork();
    if (pid == 0) {
        dlock_client *kc = client();
        dlock_lock *kl = lock(kc, "kw", DLOCK_KIND_PLAIN);
        dlock_acquire(kl, DLOCK_WAIT_FOREVER, DLOCK_WATCHDOG, NULL);
        _exit(3); /* never: killed while it waits */
    }
    int64_t t0 = th_now_ms();
    while (lock_waiters() < 1 && th_now_ms() - t0 < 5000) th_sleep_ms(20);
    ASSERT_EQ(lock_waiters(), 1);
    kill(pid, SIGKILL);
    ASSERT_EQ(th_wait_child(pid, 5000), 128 + SIGKILL);
    t0 = th_now_ms();
    while (lock_waiters() > 0 && th_now_ms() - t0 < 5000) th_sleep_ms(20);
    long long left = lock_waiters();
    th_log("waiter killed: %lld still waiting %lld ms after the kill (MariaDB notices a "
           "dead client in GET_LOCK)", left, (long long)(th_now_ms() - t0));
    ASSERT_EQ(left, 0);
    ASSERT_LOK(h, dlock_release(h));
    int rc = dlock_acquire(x, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL);
    th_log("waiter killed, holder released: try-once %s: %s", dlock_strerror(rc),
           dlock_lock_errmsg(x));
    ASSERT_LOK(x, rc);
    ASSERT_LOK(x, dlock_release(x));
    dlock_lock_free(x);
    dlock_lock_free(h);
    dlock_client_free(c);
}

/* ---- 8 processes x 50 rounds: exact counter, increasing fences ---- */
#define PROCS 8
#define ROUNDS 50

static long long read_num(const char *path) {
    FILE *f = fopen(path, "r");
    long long v = 0;
    if (f) {
        if (fscanf(f, "%lld", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

static void write_num(const char *path, long long v) {
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fprintf(f, "%lld\n", v);
    fclose(f);
}

static void test_mutex(void) {
    char counter[128], fences[128];
    snprintf(counter, sizeof counter, "%s/counter", g_dir);
    snprintf(fences, sizeof fences, "%s/fence", g_dir);
    write_num(counter, 0);
    write_num(fences, 0);
    pid_t pids[PROCS];
    int64_t t0 = th_now_ms();
    for (int i = 0; i < PROCS; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) {
            dlock_client *c = client();
            dlock_lock *l = lock(c, "counter", i % 2 ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN);
            for (int r = 0; r < ROUNDS; r++) {
                uint64_t f = 0;
                ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, DLOCK_WATCHDOG, &f));
                long long last = read_num(fences);
                ASSERT_MSG((long long)f > last, "fence %llu not above the last %lld",
                           (unsigned long long)f, last);
                write_num(fences, (long long)f);
                long long v = read_num(counter);
                if (r % 7 == 0) th_sleep_ms(1); /* widen the race window */
                write_num(counter, v + 1);
                ASSERT_LOK(l, dlock_release(l));
            }
            dlock_lock_free(l);
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int i = 0; i < PROCS; i++) ASSERT_EQ(th_wait_child(pids[i], 60000), 0);
    ASSERT_EQ(read_num(counter), PROCS * ROUNDS);
    dlock_client *c = client();
    uint64_t cur;
    ASSERT_COK(c, dlock_fence_current(c, "counter", DLOCK_CSTR, &cur));
    ASSERT_U64_EQ(cur, (uint64_t)read_num(fences));
    ASSERT_U64_EQ(cur, PROCS * ROUNDS);
    dlock_client_free(c);
    th_log("mutex: %d processes x %d rounds exact in %lld ms", PROCS, ROUNDS,
           (long long)(th_now_ms() - t0));
}

/* ---- the CLI ---- */
static int run_cli(const char *dlock, const char *wait, const char *name) {
    char *argv[] = {(char *)dlock, "--url", g_url, "run", "--wait", (char *)wait,
                    (char *)name, "--", "true", NULL};
    return run(argv, 20000);
}

static void test_cli(const char *dlock) {
    if (!dlock || access(dlock, X_OK) != 0) {
        th_log("cli: no dlock binary given, not run");
        return;
    }
    ASSERT_EQ(run_cli(dlock, "0", "cli-lock"), 0);
    dlock_client *c = client();
    dlock_lock *l = lock(c, "cli-lock", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    int st = run_cli(dlock, "0", "cli-lock");
    ASSERT_NE(st, 0); /* busy */
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(run_cli(dlock, "0", "cli-lock"), 0);
    dlock_lock_free(l);
    dlock_client_free(c);
    th_log("cli: ok (busy lock: exit %d)", st);
}

/* `dlock run` whose holding session the server ends (KILL; wait_timeout, a
 * restart or a cut link do the same): GET_LOCK has no lease and nothing
 * calls back, so dlock asks the server every second and stops the command
 * when the session is gone (before: the command ran to its end while
 * another holder ran, and only the release said so). */
static void test_cli_session_lost(const char *dlock) {
    if (!dlock || access(dlock, X_OK) != 0) return;
    char started[] = "/tmp/dlock-mysql-cli-XXXXXX", script[200];
    int sfd = mkstemp(started);
    ASSERT(sfd >= 0);
    close(sfd);
    unlink(started);
    snprintf(script, sizeof script, "touch '%s'; exec sleep 30", started);
    pid_t pid = th_fork();
    if (pid == 0) {
        execl(dlock, dlock, "--url", g_url, "run", "cli-killed", "-c", script, (char *)NULL);
        _exit(127);
    }
    ASSERT_EVENTUALLY(access(started, F_OK) == 0, 15000); /* the command runs: held */
    unlink(started);
    dlock_client *d = client();
    dlock_info info;
    long long id = 0;
    ASSERT_EVENTUALLY(dlock_inspect(d, "cli-killed", DLOCK_CSTR, &info) == DLOCK_OK &&
                          info.exists && sscanf(info.holder, "connection %lld", &id) == 1,
                      15000);
    char sql[64];
    snprintf(sql, sizeof sql, "KILL %lld", id);
    int64_t t0 = th_now_ms();
    ASSERT_EQ(sql_root(sql), 0);
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    int64_t took = th_now_ms() - t0;
    th_log("cli: the holder's session killed: exit %d after %lld ms", WEXITSTATUS(st),
           (long long)took);
    ASSERT(WIFEXITED(st));
    ASSERT_EQ(WEXITSTATUS(st), 80);
    ASSERT_LT(took, 5000);
    dlock_client_free(d);
}

/* dlock_lock_cancel: the waiting GET_LOCK is killed (KILL QUERY) */
static void test_cancel(void) {
    dlock_client *c = client();
    th_check_lock_cancel(c, "my:cancel", DLOCK_WATCHDOG);
    dlock_client_free(c);
}

int main(int argc, char **argv) {
    th_init("backend_mysql");
    start_server();
    test_basic();
    test_handoff();
    test_reentrant();
    test_long_names();
    test_unsupported();
    test_bad_url();
    test_conn_lost();
    test_holder_killed();
    test_waiter_killed();
    test_mutex();
    test_cli(argc > 1 ? argv[1] : NULL);
    test_cli_session_lost(argc > 1 ? argv[1] : NULL);
    test_cancel(); /* last: a thread (no fork after it) */
    th_log("all passed");
    return 0;
}
