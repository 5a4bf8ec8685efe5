/* The MySQL/MariaDB backend's table mode (mysql://...?lock=table, in
 * src/backends/mysql/table.c): leases in table dlock_locks, against one private
 * mariadbd (mysql_server.h). Exits 77 when mariadbd is not installed.
 *
 * Order matters: every test that forks runs before the first DLOCK_WATCHDOG
 * hold of this process (which starts a renewal thread; a fork with it
 * running could deadlock ASan's allocator in the child), and each client
 * that renewed is freed (its thread joined) before the next fork. Children
 * leave with _exit.
 *
 * argv[1] (optional): the dlock CLI, for `dlock run` and `dlock status`. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "mysql_server.h"

static char g_turl[300]; /* ?lock=table */

static dlock_client *client_opts(const char *url, int64_t watchdog_ms) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.watchdog_lease_ms = watchdog_ms;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    ASSERT_MSG(rc == DLOCK_OK, "client %s: %s: %s", url, dlock_strerror(rc), dlock_errmsg(c));
    return c;
}

static dlock_client *client(void) { return client_opts(g_turl, 0); }

static dlock_lock *lock(dlock_client *c, const char *name, dlock_kind kind) {
    dlock_lock *l = NULL;
    ASSERT_COK(c, dlock_lock_new(c, name, DLOCK_CSTR, kind, &l));
    return l;
}

static int64_t ttl_of(dlock_client *c, const char *name) {
    int64_t ttl = 0;
    ASSERT_COK(c, dlock_remaining_ttl(c, name, DLOCK_CSTR, &ttl));
    return ttl;
}

/* ---- URL, facts, try-once, timed wait, inspect, fences ---- */
static void test_basic(void) {
    /* the mode parameter */
    char bad[320];
    snprintf(bad, sizeof bad, "%s&lock=bogus", g_turl);
    dlock_options o;
    dlock_options_init(&o);
    o.url = bad;
    dlock_client *x = NULL;
    ASSERT_CODE(dlock_client_new(&o, &x), DLOCK_EINVAL);
    th_log("bad parameter: %s", dlock_errmsg(x));
    ASSERT(strstr(dlock_errmsg(x), "lock=bogus"));
    ASSERT(!strstr(dlock_errmsg(x), "secret"));
    dlock_client_free(x);

    dlock_client *a = client(), *b = client();
    char buf[200];
    ASSERT_COK(a, dlock_server_fact(a, "backend", buf, sizeof buf));
    ASSERT_STR_EQ(buf, "mysql");
    ASSERT_COK(a, dlock_server_fact(a, "version", buf, sizeof buf));
    th_log("version: %s", buf);
    ASSERT(strstr(buf, "MariaDB") || (buf[0] >= '5' && buf[0] <= '9'));
    ASSERT_COK(a, dlock_server_fact(a, "session", buf, sizeof buf));
    th_log("session: %s", buf);
    ASSERT(strstr(buf, "a lease in table dlock_locks, 30000 ms"));
    ASSERT_COK(a, dlock_server_fact(a, "mode", buf, sizeof buf));
    ASSERT_STR_EQ(buf, "table");
    ASSERT_COK(a, dlock_server_fact(a, "server_time_ms", buf, sizeof buf));
    ASSERT_GT(strtoll(buf, NULL, 10), 1600000000000LL);
    ASSERT_COK(a, dlock_server_fact(a, "wait_timeout", buf, sizeof buf));
    ASSERT_GT(strtoll(buf, NULL, 10), 0);
    ASSERT_CCODE(a, dlock_server_fact(a, "maxmemory", buf, sizeof buf), DLOCK_ESERVER);
    dlock_client *g = client_opts(g_url, 0); /* the GET_LOCK mode's facts */
    ASSERT_COK(g, dlock_server_fact(g, "session", buf, sizeof buf));
    ASSERT_STR_EQ(buf, "the connection (GET_LOCK)");
    ASSERT_COK(g, dlock_server_fact(g, "mode", buf, sizeof buf));
    ASSERT_STR_EQ(buf, "get_lock");
    dlock_client_free(g);

    dlock_lock *la = lock(a, "basic", DLOCK_KIND_PLAIN), *lb = lock(b, "basic", DLOCK_KIND_PLAIN);
    uint64_t f1 = 0, f2 = 0, cur = 0;
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, 20000, &f1));
    ASSERT_U64_GT(f1, 0);
    ASSERT_COK(a, dlock_fence_current(a, "basic", DLOCK_CSTR, &cur));
    ASSERT_U64_EQ(cur, f1);
    int64_t valid = dlock_lock_valid_ms(la);
    ASSERT_GT(valid, 19000);
    ASSERT_LE(valid, 20000);
    int held = 0;
    int64_t count = 0;
    ASSERT_LOK(la, dlock_lock_check(la, &held, &count));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(count, 1);
    ASSERT_LCODE(la, dlock_acquire(la, DLOCK_NOWAIT, 20000, NULL), DLOCK_EINVAL);

    ASSERT_LCODE(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, NULL), DLOCK_EBUSY);
    ASSERT(strstr(dlock_lock_errmsg(lb), "basic"));
    ASSERT_LOK(lb, dlock_lock_check(lb, &held, &count));
    ASSERT_EQ(held, 0);
    int64_t t0 = th_now_ms();
    ASSERT_LCODE(lb, dlock_acquire(lb, 300, 20000, NULL), DLOCK_ETIMEDOUT);
    int64_t took = th_now_ms() - t0;
    th_log("timed acquire of 300 ms gave up after %lld ms (polling)", (long long)took);
    ASSERT_GE(took, 295);
    ASSERT_LT(took, 1500);

    dlock_info info;
    ASSERT_COK(b, dlock_inspect(b, "basic", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.holders, 1);
    ASSERT_STR_EQ(info.holder, dlock_lock_token(la));
    ASSERT_GT(info.ttl_ms, 15000);
    ASSERT_LE(info.ttl_ms, 20000);
    ASSERT_U64_EQ(info.fence, f1);
    ASSERT_EQ(info.kind, DLOCK_KIND_PLAIN);
    th_log("holder %s, ttl %lld ms", info.holder, (long long)info.ttl_ms);
    /* the token: "<client id>:<thread id>:<32 hex random>" */
    const char *tok = dlock_lock_token(la), *last = strrchr(tok, ':');
    ASSERT_NOT_NULL(last);
    ASSERT_EQ(strlen(last + 1), 32);
    int locked = 0;
    ASSERT_COK(b, dlock_is_locked(b, "basic", DLOCK_CSTR, &locked));
    ASSERT_EQ(locked, 1);

    /* explicit extend */
    ASSERT_LOK(la, dlock_extend(la, 40000));
    ASSERT_GT(ttl_of(b, "basic"), 35000);

    ASSERT_LOK(la, dlock_release(la));
    ASSERT_LCODE(la, dlock_release(la), DLOCK_ENOTHELD);
    ASSERT_LOK(lb, dlock_acquire(lb, 2000, 20000, &f2));
    ASSERT_U64_GT(f2, f1);
    ASSERT_LOK(lb, dlock_release(lb));
    ASSERT_COK(a, dlock_inspect(a, "basic", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 0);
    ASSERT_EQ(info.ttl_ms, -2);
    ASSERT_U64_EQ(info.fence, f2);
    ASSERT_EQ(ttl_of(a, "basic"), -2);

    /* force_unlock: honest in this mode */
    int existed = -1;
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_COK(b, dlock_force_unlock(b, "basic", DLOCK_CSTR, &existed));
    ASSERT_EQ(existed, 1);
    ASSERT_COK(b, dlock_force_unlock(b, "basic", DLOCK_CSTR, &existed));
    ASSERT_EQ(existed, 0);
    ASSERT_LOK(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_LOK(la, dlock_lock_check(la, &held, NULL));
    ASSERT_EQ(held, 0);
    ASSERT_EQ(dlock_lock_is_lost(la), 1);
    ASSERT_LCODE(la, dlock_release(la), DLOCK_ELOST);
    ASSERT_LOK(lb, dlock_release(lb));
    dlock_lock_free(la);
    dlock_lock_free(lb);
    dlock_client_free(a);
    dlock_client_free(b);
    th_log("basic: ok (fences %llu < %llu)", (unsigned long long)f1, (unsigned long long)f2);
}

/* ---- names over 64 bytes (hashed keys) and binary names ---- */
static void test_long_names(void) {
    char n1[300], n2[300];
    memset(n1, 'x', sizeof n1);
    memcpy(n2, n1, sizeof n2);
    n2[299] = 'y';
    dlock_client *a = client(), *b = client();
    dlock_lock *a1 = NULL, *b1 = NULL, *b2 = NULL;
    ASSERT_COK(a, dlock_lock_new(a, n1, sizeof n1, DLOCK_KIND_PLAIN, &a1));
    ASSERT_COK(b, dlock_lock_new(b, n1, sizeof n1, DLOCK_KIND_PLAIN, &b1));
    ASSERT_COK(b, dlock_lock_new(b, n2, sizeof n2, DLOCK_KIND_PLAIN, &b2));
    ASSERT_LOK(a1, dlock_acquire(a1, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_LCODE(b1, dlock_acquire(b1, DLOCK_NOWAIT, 20000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(b2, dlock_acquire(b2, DLOCK_NOWAIT, 20000, NULL));
    dlock_info info;
    ASSERT_COK(b, dlock_inspect(b, n1, sizeof n1, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_STR_EQ(info.holder, dlock_lock_token(a1));
    ASSERT_LOK(a1, dlock_extend(a1, 30000));
    ASSERT_LOK(a1, dlock_release(a1));
    ASSERT_LOK(b1, dlock_acquire(b1, DLOCK_NOWAIT, 20000, NULL));
    dlock_lock_free(a1);
    dlock_lock_free(b1);
    dlock_lock_free(b2);
    dlock_client_free(a);
    dlock_client_free(b);
    th_log("long names: ok");
}

/* ---- reentrant: counted by the handle, one row ---- */
static void test_reentrant(void) {
    dlock_client *a = client(), *b = client();
    dlock_lock *la = lock(a, "re", DLOCK_KIND_REENTRANT), *lb = lock(b, "re", DLOCK_KIND_REENTRANT);
    uint64_t f1, f2;
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, 20000, &f1));
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, 20000, &f2));
    ASSERT_U64_GT(f2, f1);
    int held;
    int64_t count;
    ASSERT_LOK(la, dlock_lock_check(la, &held, &count));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(count, 2);
    dlock_info info;
    ASSERT_COK(b, dlock_inspect(b, "re", DLOCK_CSTR, &info));
    ASSERT_EQ(info.kind, DLOCK_KIND_REENTRANT);
    ASSERT_U64_EQ(info.fence, f2);
    ASSERT_LOK(la, dlock_release(la));
    ASSERT_EQ(dlock_lock_holding(la), 1);
    ASSERT_LCODE(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(la, dlock_release(la));
    ASSERT_EQ(dlock_lock_holding(la), 0);
    ASSERT_LOK(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, NULL));
    dlock_lock_free(lb); /* releases */
    /* two handles of one client in one thread still exclude each other */
    dlock_lock *l2 = lock(a, "re", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_LCODE(l2, dlock_acquire(l2, DLOCK_NOWAIT, 20000, NULL), DLOCK_EBUSY);
    dlock_lock_free(l2);
    dlock_lock_free(la);
    dlock_client_free(a);
    dlock_client_free(b);
    th_log("reentrant: ok");
}

/* ---- an expired holder: its extend / release say lost, and do not touch
 * the new holder's row ---- */
static void test_expired_holder(void) {
    dlock_client *a = client(), *b = client();
    dlock_lock *la = lock(a, "exp", DLOCK_KIND_PLAIN), *lb = lock(b, "exp", DLOCK_KIND_PLAIN);
    for (int round = 0; round < 3; round++) {
        uint64_t fa = 0, fb = 0;
        ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, 300, &fa));
        ASSERT_LCODE(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, NULL), DLOCK_EBUSY);
        ASSERT_EVENTUALLY(ttl_of(b, "exp") == -2, 3000); /* expired by the server's clock */
        ASSERT_EQ(dlock_lock_valid_ms(la), 0);
        if (round == 2) { /* nobody took it: the release still says lost, and cleans up */
            ASSERT_LCODE(la, dlock_release(la), DLOCK_ELOST);
            int e = -1;
            ASSERT_COK(b, dlock_force_unlock(b, "exp", DLOCK_CSTR, &e));
            ASSERT_EQ(e, 0);
            break;
        }
        ASSERT_LOK(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, &fb));
        ASSERT_U64_GT(fb, fa);
        if (round == 0)
            ASSERT_LCODE(la, dlock_extend(la, 20000), DLOCK_ELOST);
        else
            ASSERT_LCODE(la, dlock_release(la), DLOCK_ELOST);
        th_log("expired holder, round %d: %s", round, dlock_lock_errmsg(la));
        ASSERT_EQ(dlock_lock_is_lost(la), 1);
        ASSERT_EQ(dlock_lock_holding(la), 0);
        /* b still holds, its row untouched */
        int held = 0;
        ASSERT_LOK(lb, dlock_lock_check(lb, &held, NULL));
        ASSERT_EQ(held, 1);
        dlock_info info;
        ASSERT_COK(a, dlock_inspect(a, "exp", DLOCK_CSTR, &info));
        ASSERT_EQ(info.exists, 1);
        ASSERT_STR_EQ(info.holder, dlock_lock_token(lb));
        ASSERT_GT(info.ttl_ms, 15000);
        ASSERT_LOK(lb, dlock_release(lb));
    }
    dlock_lock_free(la);
    dlock_lock_free(lb);
    dlock_client_free(a);
    dlock_client_free(b);
    th_log("expired holder: ok");
}

/* ---- a SIGKILLed holder with a 1 s lease: taken over after, not before ---- */
static void test_holder_killed(void) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = th_fork();
    if (pid == 0) {
        dlock_client *c = client();
        dlock_lock *l = lock(c, "crash", DLOCK_KIND_PLAIN);
        int64_t before = th_now_ms();
        uint64_t f = 0;
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 1000, &f));
        long long msg[2] = {(long long)before, (long long)f};
        ASSERT_EQ(write(p[1], msg, sizeof msg), (ssize_t)sizeof msg);
        for (;;) pause();
    }
    long long msg[2];
    ASSERT_EQ(read(p[0], msg, sizeof msg), (ssize_t)sizeof msg);
    kill(pid, SIGKILL);
    ASSERT_EQ(th_wait_child(pid, 5000), 128 + SIGKILL);
    dlock_client *c = client();
    dlock_lock *l = lock(c, "crash", DLOCK_KIND_PLAIN);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 20000, NULL), DLOCK_EBUSY);
    uint64_t f = 0;
    ASSERT_LOK(l, dlock_acquire(l, 10000, 20000, &f));
    int64_t after = th_now_ms() - msg[0];
    th_log("holder killed: taken over %lld ms after its acquire began (lease 1000 ms), fence "
           "%llu > %llu",
           (long long)after, (unsigned long long)f, (unsigned long long)msg[1]);
    ASSERT_GE(after, 998); /* 2 ms for the monotonic and wall clocks' rates */
    ASSERT_LT(after, 2500);
    ASSERT_U64_GT(f, (uint64_t)msg[1]);
    dlock_lock_free(l);
    dlock_client_free(c);
    close(p[0]);
    close(p[1]);
}

/* ---- 8 processes: a non-atomic read-increment-write under the lock ---- */
#define PROCS 8
#define ROUNDS 30

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
            /* odd children: reentrant handles renewed by the client's
             * thread (a short watchdog lease, renewed often); even: plain
             * handles with a fixed lease */
            dlock_client *c = client_opts(g_turl, i % 2 ? 900 : 0);
            dlock_lock *l = lock(c, "counter", i % 2 ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN);
            for (int r = 0; r < ROUNDS; r++) {
                uint64_t f = 0;
                ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, i % 2 ? DLOCK_WATCHDOG : 10000,
                                            &f));
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
    for (int i = 0; i < PROCS; i++) ASSERT_EQ(th_wait_child(pids[i], 90000), 0);
    ASSERT_EQ(read_num(counter), PROCS * ROUNDS);
    dlock_client *c = client();
    uint64_t cur;
    ASSERT_COK(c, dlock_fence_current(c, "counter", DLOCK_CSTR, &cur));
    ASSERT_U64_EQ(cur, (uint64_t)read_num(fences));
    ASSERT_EQ(ttl_of(c, "counter"), -2);
    dlock_client_free(c);
    th_log("mutex: %d processes x %d rounds exact in %lld ms (last fence %llu)", PROCS, ROUNDS,
           (long long)(th_now_ms() - t0), (unsigned long long)cur);
}

/* ---- the CLI: dlock run, with dlock status inside it ---- */
static int run_logged(char *const argv[], char *out, size_t outlen) {
    char log[128];
    snprintf(log, sizeof log, "%s/cmd.log", g_dir);
    return th_run_capture(argv, log, out, outlen, 30000);
}

static void test_cli(const char *dlock) {
    if (!dlock || access(dlock, X_OK) != 0) {
        th_log("cli: no dlock binary given, not run");
        return;
    }
    char out[4096];
    char *argv[] = {(char *)dlock, "--url", g_turl, "run", "--wait", "0", "cli-lock", "--",
                    (char *)dlock, "--url", g_turl, "status", "cli-lock", NULL};
    int st = run_logged(argv, out, sizeof out);
    th_log("cli: dlock run ... dlock status:\n%s", out);
    ASSERT_EQ(st, 0);
    ASSERT(strstr(out, "state:      held"));
    ASSERT(strstr(out, "holder:     "));
    ASSERT(strstr(out, "kind:       plain"));
    dlock_client *c = client();
    ASSERT_EQ(ttl_of(c, "cli-lock"), -2); /* released after the command */
    dlock_lock *l = lock(c, "cli-lock", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 20000, NULL));
    char *busy[] = {(char *)dlock, "--url", g_turl, "run", "--wait", "0", "cli-lock", "--",
                    "true", NULL};
    st = run_logged(busy, out, sizeof out);
    th_log("cli: busy lock: exit %d: %s", st, out);
    ASSERT_NE(st, 0);
    ASSERT_LOK(l, dlock_release(l));
    char *free_[] = {(char *)dlock, "--url", g_turl, "status", "cli-lock", NULL};
    ASSERT_EQ(run_logged(free_, out, sizeof out), 0);
    ASSERT(strstr(out, "state:      free"));
    dlock_lock_free(l);
    dlock_client_free(c);

    /* dlock doctor asks each mode what it has, and no Redis questions */
    char *doc_t[] = {(char *)dlock, "--url", g_turl, "doctor", NULL};
    st = run_logged(doc_t, out, sizeof out);
    th_log("cli: dlock doctor (table mode): exit %d:\n%s", st, out);
    ASSERT_EQ(st, 0);
    ASSERT(strstr(out, "PASS  version      mysql "));
    ASSERT(strstr(out, "PASS  session      a lock is held by a lease in table dlock_locks"));
    ASSERT(strstr(out, "PASS  lock "));
    ASSERT(strstr(out, "PASS  timeouts     table mode"));
    ASSERT(strstr(out, "latency"));
    ASSERT(!strstr(out, "FAIL  "));
    ASSERT(!strstr(out, "maxmemory"));
    char *doc_g[] = {(char *)dlock, "--url", g_url, "doctor", NULL};
    st = run_logged(doc_g, out, sizeof out);
    th_log("cli: dlock doctor (GET_LOCK mode): exit %d:\n%s", st, out);
    ASSERT_EQ(st, 0);
    ASSERT(strstr(out, "PASS  session      a lock is held by the connection (GET_LOCK)"));
    ASSERT(strstr(out, "PASS  lock "));
    ASSERT(strstr(out, "WARN  timeouts     wait_timeout "));
    ASSERT(!strstr(out, "FAIL  "));
    th_log("cli: ok");
}

/* ---- DLOCK_WATCHDOG: renewed beyond the lease; a lost renewal is told ---- */
static atomic_int g_lost_reason;

static void on_lost(dlock_lock *l, int reason, void *ud) {
    (void)l;
    (void)ud;
    atomic_store(&g_lost_reason, reason);
}

static void test_watchdog(void) {
    dlock_client *a = client_opts(g_turl, 900), *b = client();
    char buf[200];
    ASSERT_COK(a, dlock_server_fact(a, "session", buf, sizeof buf));
    ASSERT(strstr(buf, "900 ms"));
    dlock_lock *la = lock(a, "wd", DLOCK_KIND_REENTRANT), *lb = lock(b, "wd", DLOCK_KIND_PLAIN);
    dlock_lock_on_lost(la, on_lost, NULL);
    uint64_t f1 = 0, f2 = 0;
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, &f1));
    int64_t t0 = th_now_ms();
    /* three leases long, another client never gets it */
    while (th_now_ms() - t0 < 2700) {
        ASSERT_LCODE(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, NULL), DLOCK_EBUSY);
        int64_t ttl = ttl_of(b, "wd");
        ASSERT_GT(ttl, 0);
        ASSERT_LE(ttl, 900);
        th_sleep_ms(50);
    }
    ASSERT_GT(dlock_lock_valid_ms(la), 0);
    ASSERT_EQ(dlock_lock_is_lost(la), 0);
    ASSERT_EQ(atomic_load(&g_lost_reason), 0);
    /* re-entry keeps the renewal; a timed wait of another times out */
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, &f2));
    ASSERT_U64_GT(f2, f1);
    ASSERT_LCODE(lb, dlock_acquire(lb, 700, 20000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_LOK(la, dlock_release(la));
    ASSERT_LCODE(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(la, dlock_release(la));
    ASSERT_LOK(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_LOK(lb, dlock_release(lb));

    /* taken away (force_unlock) while renewed: the renewal finds out */
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    int e = 0;
    ASSERT_COK(b, dlock_force_unlock(b, "wd", DLOCK_CSTR, &e));
    ASSERT_EQ(e, 1);
    ASSERT_EVENTUALLY(dlock_lock_is_lost(la) == 1, 3000);
    /* the flag is set before the callback runs (on the renewal thread) */
    ASSERT_EVENTUALLY(atomic_load(&g_lost_reason) == DLOCK_LOST_TAKEN, 3000);
    ASSERT_EQ(dlock_lock_valid_ms(la), 0);
    ASSERT_LCODE(la, dlock_release(la), DLOCK_ELOST);

    /* extend turns a renewed hold into a fixed lease */
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(la, dlock_extend(la, 400));
    ASSERT_EVENTUALLY(ttl_of(b, "wd") == -2, 3000);
    ASSERT_LOK(lb, dlock_acquire(lb, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_LCODE(la, dlock_release(la), DLOCK_ELOST);
    ASSERT_LOK(lb, dlock_release(lb));

    /* a handle freed while renewed: released, no renewal left behind */
    ASSERT_LOK(la, dlock_acquire(la, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    dlock_lock_free(la);
    ASSERT_EQ(ttl_of(b, "wd"), -2);
    dlock_lock_free(lb);
    dlock_client_free(a);
    dlock_client_free(b);
    th_log("watchdog: ok");
}

/* ---- several threads of one client, each its own handle ---- */
#define THREADS 4
#define TROUNDS 25
static long long g_shared; /* guarded by the lock "threads" */
static dlock_client *g_tc;

static void *thread_main(void *arg) {
    (void)arg;
    dlock_lock *l = lock(g_tc, "threads", DLOCK_KIND_PLAIN);
    for (int r = 0; r < TROUNDS; r++) {
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, r % 2 ? DLOCK_WATCHDOG : 10000, NULL));
        long long v = g_shared;
        if (r % 5 == 0) th_sleep_ms(1);
        g_shared = v + 1;
        ASSERT_LOK(l, dlock_release(l));
    }
    dlock_lock_free(l);
    return NULL;
}

static void test_threads(void) {
    g_tc = client_opts(g_turl, 1000);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) ASSERT_EQ(pthread_create(&th[i], NULL, thread_main, NULL), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    ASSERT_EQ(g_shared, THREADS * TROUNDS);
    dlock_client_free(g_tc);
    th_log("threads: %d x %d exact", THREADS, TROUNDS);
}

/* ---- the server stops answering: a renewed hold is lost as unreachable
 * (about when its lease runs out: the renewal's connect timeout is counted
 * in whole seconds) ---- */
static void test_unreachable(void) {
    atomic_store(&g_lost_reason, 0);
    dlock_client *a = client_opts(g_turl, 1500);
    dlock_lock *l = lock(a, "unreach", DLOCK_KIND_PLAIN);
    dlock_lock_on_lost(l, on_lost, NULL);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    th_sleep_ms(600); /* one renewal on the renewal thread's connection */
    ASSERT_EQ(dlock_lock_is_lost(l), 0);
    ASSERT_EQ(kill(g_mysqld, SIGSTOP), 0);
    int64_t t0 = th_now_ms();
    int64_t dl = t0 + 6000;
    while (!dlock_lock_is_lost(l) && th_now_ms() < dl) th_sleep_ms(10);
    int64_t took = th_now_ms() - t0;
    ASSERT_EQ(kill(g_mysqld, SIGCONT), 0);
    th_log("unreachable: found lost %lld ms after the server stopped (lease 1500 ms)",
           (long long)took);
    ASSERT_EQ(dlock_lock_is_lost(l), 1);
    ASSERT_EVENTUALLY(atomic_load(&g_lost_reason) == DLOCK_LOST_UNREACHABLE, 3000);
    ASSERT_EQ(dlock_lock_valid_ms(l), 0);
    ASSERT_LCODE(l, dlock_release(l), DLOCK_ELOST);
    dlock_lock_free(l);
    dlock_client_free(a);
}

/* dlock_lock_cancel: the naps between a waiter's attempts end at once */
static void test_cancel(void) {
    dlock_client *c = client();
    th_check_lock_cancel(c, "tbl:cancel", 20000);
    dlock_client_free(c);
}

int main(int argc, char **argv) {
    th_init("backend_mysql_table");
    start_server();
    snprintf(g_turl, sizeof g_turl, "%s?lock=table", g_url);
    test_basic();
    test_long_names();
    test_reentrant();
    test_expired_holder();
    test_holder_killed();
    test_mutex();
    test_cli(argc > 1 ? argv[1] : NULL);
    /* from here on this process has renewal threads: no more forks */
    test_watchdog();
    test_threads();
    test_cancel();
    test_unreachable();
    th_log("all passed");
    return 0;
}
