/* The PostgreSQL backend against a private postgres 15 (initdb in a temp dir,
 * as /work/shared/SERVERS.md section 5): mutual exclusion across processes
 * (exact counter), fencing tokens increasing across processes, a killed
 * holder's lock taken over promptly, session loss reported, read/write and
 * reentrant locks, try-once and timed waits, unsupported capabilities, bad
 * URL / wrong password messages, and `dlock run` (argv[1]: the CLI).
 * Skips (77) without the postgres binaries. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "harness.h"

#define PGBIN "/usr/lib/postgresql/15/bin"

static char g_dir[128];
static volatile pid_t g_pg; /* the postmaster */
static pid_t g_owner;
static int g_port;
static char g_url[256];

/* SIGINT (fast shutdown), bounded wait, SIGKILL; then rm -rf the dir.
 * Async-signal-safe. */
static void pg_stop(void) {
    if (getpid() != g_owner) return;
    th_stop_pid(&g_pg, SIGINT, 10000);
    th_rm_rf(g_dir);
}

static void on_signal(int sig) {
    if (getpid() != g_owner) _exit(128 + sig);
    static const char m[] = "backend_postgres: signal; stopping postgres\n";
    (void)!write(2, m, sizeof m - 1);
    pg_stop();
    _exit(sig == SIGALRM ? 1 : 128 + sig);
}

/* Runs argv (as postgres when root) with stdout/stderr to log; returns the
 * pid (wait = 0) or the exit status. */
static pid_t run_as_pg(char *const argv[], const char *log, int wait) {
    char *full[24];
    int n = 0;
    if (geteuid() == 0) {
        static char *pre[] = {"/usr/bin/setpriv", "--reuid=postgres", "--regid=postgres",
                              "--init-groups", "--"};
        for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++) full[n++] = pre[i];
    }
    for (int i = 0; argv[i]; i++) full[n++] = argv[i];
    full[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (chdir(g_dir) != 0) _exit(126);
        execv(full[0], full);
        _exit(127);
    }
    if (!wait) return pid;
    int st;
    ASSERT(waitpid(pid, &st, 0) == pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static PGconn *admin(const char *db) {
    char ci[300];
    snprintf(ci, sizeof ci, "host=%s port=%d user=postgres dbname=%s connect_timeout=5", g_dir,
             g_port, db);
    PGconn *c = PQconnectdb(ci);
    ASSERT_MSG(PQstatus(c) == CONNECTION_OK, "admin connect: %s", PQerrorMessage(c));
    return c;
}

static void sql_ok(PGconn *c, const char *sql) {
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    ASSERT_MSG(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK, "%s: %s", sql,
               PQerrorMessage(c));
    PQclear(r);
}

static long long sql_int(PGconn *c, const char *sql) {
    PGresult *r = PQexec(c, sql);
    ASSERT_MSG(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "%s: %s", sql,
               PQerrorMessage(c));
    long long v = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

static void pg_start(void) {
    if (access(PGBIN "/initdb", X_OK) || access(PGBIN "/postgres", X_OK))
        th_skip("postgres binaries not found in " PGBIN " (apt-get install postgresql)");
    struct passwd *pw = getpwnam("postgres");
    if (geteuid() == 0 && (!pw || access("/usr/bin/setpriv", X_OK)))
        th_skip("running as root needs the postgres user and setpriv to run initdb");
    snprintf(g_dir, sizeof g_dir, "/tmp/dlpg.XXXXXX");
    ASSERT(mkdtemp(g_dir) != NULL);
    if (geteuid() == 0) ASSERT(chown(g_dir, pw->pw_uid, pw->pw_gid) == 0);
    char data[200], log[200], initlog[200];
    snprintf(data, sizeof data, "%s/data", g_dir);
    snprintf(log, sizeof log, "%s/log", g_dir);
    snprintf(initlog, sizeof initlog, "%s/initdb.log", g_dir);
    char *init[] = {PGBIN "/initdb", "-D", data, "-U", "postgres", "--auth-local=trust",
                    "--auth-host=scram-sha-256", "--no-sync", "--locale=C.UTF-8", NULL};
    int st = (int)run_as_pg(init, initlog, 1);
    ASSERT_MSG(st == 0, "initdb failed (%d): see %s", st, initlog);
    for (int attempt = 0; attempt < 3; attempt++) {
        g_port = th_free_port();
        char port[16];
        snprintf(port, sizeof port, "%d", g_port);
        char *srv[] = {PGBIN "/postgres", "-D", data, "-p", port, "-k", g_dir,
                       "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", NULL};
        g_pg = run_as_pg(srv, log, 0);
        char ci[300];
        snprintf(ci, sizeof ci, "host=%s port=%d user=postgres dbname=postgres", g_dir, g_port);
        for (int i = 0; i < 300; i++) {
            if (PQping(ci) == PQPING_OK) {
                th_log("postgres up on port %d (%s)", g_port, g_dir);
                PGconn *c = admin("postgres");
                sql_ok(c, "CREATE ROLE test LOGIN PASSWORD 'secret'");
                sql_ok(c, "CREATE DATABASE testdb OWNER test");
                PQfinish(c);
                snprintf(g_url, sizeof g_url, "postgres://test:secret@127.0.0.1:%d/testdb", g_port);
                return;
            }
            if (waitpid(g_pg, NULL, WNOHANG) == g_pg) break; /* port taken? retry */
            th_sleep_ms(100);
        }
        if (g_pg > 0 && waitpid(g_pg, NULL, WNOHANG) == 0) {
            kill(g_pg, SIGKILL);
            waitpid(g_pg, NULL, 0);
        }
        g_pg = 0;
    }
    th_fail(__FILE__, __LINE__, "postgres did not start: see %s", log);
}

static dlock_client *client(void) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = g_url;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    ASSERT_MSG(rc == DLOCK_OK, "client: %s: %s", dlock_strerror(rc), dlock_errmsg(c));
    return c;
}

static dlock_lock *lock(dlock_client *c, const char *name, dlock_kind kind) {
    dlock_lock *l = NULL;
    ASSERT_COK(c, dlock_lock_new(c, name, DLOCK_CSTR, kind, &l));
    return l;
}

/* ---- mutual exclusion and fencing across processes ---- */
#define NPROC 8
#define ROUNDS 50

static void test_counter(void) {
    PGconn *a = admin("testdb");
    sql_ok(a, "CREATE TABLE counter (v bigint NOT NULL, last_fence bigint NOT NULL, "
              "bad bigint NOT NULL)");
    sql_ok(a, "INSERT INTO counter VALUES (0, 0, 0)");
    sql_ok(a, "GRANT ALL ON counter TO test");
    pid_t kids[NPROC];
    int64_t t0 = th_now_ms();
    for (int k = 0; k < NPROC; k++) {
        kids[k] = th_fork();
        if (kids[k] == 0) {
            dlock_client *c = client();
            dlock_lock *l = lock(c, "counter", k % 2 ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN);
            char ci[300];
            snprintf(ci, sizeof ci, "host=127.0.0.1 port=%d user=test password=secret "
                                    "dbname=testdb", g_port);
            PGconn *db = PQconnectdb(ci);
            if (PQstatus(db) != CONNECTION_OK) _exit(2);
            for (int i = 0; i < ROUNDS; i++) {
                uint64_t fence = 0;
                if (dlock_acquire(l, DLOCK_WAIT_FOREVER, DLOCK_WATCHDOG, &fence)) {
                    fprintf(stderr, "acquire: %s\n", dlock_lock_errmsg(l));
                    _exit(3);
                }
                /* read, then write in a separate statement: not atomic */
                PGresult *r = PQexec(db, "SELECT v, last_fence FROM counter");
                if (PQresultStatus(r) != PGRES_TUPLES_OK) _exit(4);
                long long v = atoll(PQgetvalue(r, 0, 0));
                unsigned long long last = strtoull(PQgetvalue(r, 0, 1), NULL, 10);
                PQclear(r);
                if (i % 10 == 0) usleep(1000);
                char sql[200];
                snprintf(sql, sizeof sql,
                         "UPDATE counter SET v = %lld, last_fence = %llu, bad = bad + %d", v + 1,
                         (unsigned long long)fence, fence > last ? 0 : 1);
                r = PQexec(db, sql);
                if (PQresultStatus(r) != PGRES_COMMAND_OK) _exit(5);
                PQclear(r);
                int held = 0;
                if (i == 0 && (dlock_lock_check(l, &held, NULL) || !held)) _exit(6);
                if (dlock_release(l)) {
                    fprintf(stderr, "release: %s\n", dlock_lock_errmsg(l));
                    _exit(7);
                }
            }
            PQfinish(db);
            dlock_lock_free(l);
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int k = 0; k < NPROC; k++) ASSERT_EQ(th_wait_child(kids[k], 60000), 0);
    long long v = sql_int(a, "SELECT v FROM counter");
    long long bad = sql_int(a, "SELECT bad FROM counter");
    long long lastf = sql_int(a, "SELECT last_fence FROM counter");
    th_log("counter %lld (want %d) in %lld ms; fence went backwards %lld times; last fence %lld",
           v, NPROC * ROUNDS, (long long)(th_now_ms() - t0), bad, lastf);
    ASSERT_EQ(v, NPROC * ROUNDS);
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(lastf, NPROC * ROUNDS);
    dlock_client *c = client();
    uint64_t f = 0;
    ASSERT_COK(c, dlock_fence_current(c, "counter", DLOCK_CSTR, &f));
    ASSERT_U64_EQ(f, NPROC * ROUNDS);
    ASSERT_COK(c, dlock_fence_current(c, "never-used", DLOCK_CSTR, &f));
    ASSERT_U64_EQ(f, 0);
    dlock_client_free(c);
    PQfinish(a);
}

/* ---- a killed holder; try-once and timed waits ---- */
static void test_crash_and_waits(void) {
    int p[2];
    ASSERT(pipe(p) == 0);
    pid_t kid = th_fork();
    if (kid == 0) {
        close(p[0]);
        dlock_client *c = client();
        dlock_lock *l = lock(c, "crash", DLOCK_KIND_PLAIN);
        if (dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL)) _exit(3);
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
    ASSERT_EQ(ttl, -1);
    int64_t t0 = th_now_ms();
    ASSERT_LCODE(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    th_log("try once: busy in %lld ms: %s", (long long)(th_now_ms() - t0), dlock_lock_errmsg(l));
    t0 = th_now_ms();
    ASSERT_LCODE(l, dlock_acquire(l, 300, DLOCK_WATCHDOG, NULL), DLOCK_ETIMEDOUT);
    int64_t el = th_now_ms() - t0;
    th_log("timed 300 ms: timed out after %lld ms: %s", (long long)el, dlock_lock_errmsg(l));
    ASSERT_GE(el, 290);
    ASSERT_LT(el, 1500);
    /* the timed wait left the session as it was: a try still answers at once */
    t0 = th_now_ms();
    ASSERT_LCODE(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_LT(th_now_ms() - t0, 1000);
    /* kill -9 the holder while we wait: the server ends its session */
    pid_t killer = th_fork();
    if (killer == 0) {
        th_sleep_ms(200);
        kill(kid, SIGKILL);
        _exit(0);
    }
    t0 = th_now_ms();
    int64_t killed_at = t0 + 200;
    ASSERT_LOK(l, dlock_acquire(l, 10000, DLOCK_WATCHDOG, NULL));
    el = th_now_ms() - killed_at;
    th_log("holder killed: lock taken over %lld ms after the kill", (long long)el);
    ASSERT_LT(el, 2000);
    ASSERT_EQ(th_wait_child(kid, 5000), 128 + SIGKILL);
    ASSERT_EQ(th_wait_child(killer, 5000), 0);
    ASSERT_EQ(dlock_lock_valid_ms(l) > 1000000, 1);
    ASSERT_LCODE(l, dlock_extend(l, 1000), DLOCK_ENOTSUP);
    {
        /* an explicit lease would not be enforced: not offered */
        dlock_lock *x = th_lock(c, "pg:lease", DLOCK_KIND_PLAIN);
        ASSERT_LCODE(x, dlock_acquire(x, DLOCK_NOWAIT, 5000, NULL), DLOCK_ENOTSUP);
        ASSERT(strstr(dlock_lock_errmsg(x), "postgres") != NULL);
        dlock_lock_free(x);
    }
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_COK(c, dlock_is_locked(c, "crash", DLOCK_CSTR, &locked));
    ASSERT_EQ(locked, 0);
    ASSERT_COK(c, dlock_remaining_ttl(c, "crash", DLOCK_CSTR, &ttl));
    ASSERT_EQ(ttl, -2);
    dlock_lock_free(l);
    dlock_client_free(c);
}

/* ---- a waiter killed while it waits leaves nothing queued ---- */
static void test_killed_waiter(void) {
    dlock_client *c = client();
    dlock_lock *h = lock(c, "kw", DLOCK_KIND_PLAIN);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    pid_t kid = th_fork();
    if (kid == 0) {
        dlock_client *kc = client();
        dlock_lock *kl = lock(kc, "kw", DLOCK_KIND_PLAIN);
        dlock_acquire(kl, DLOCK_WAIT_FOREVER, DLOCK_WATCHDOG, NULL);
        _exit(3); /* never: killed while it waits */
    }
    PGconn *a = admin("testdb");
    const char *waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'";
    int64_t t0 = th_now_ms();
    while (sql_int(a, waiting) < 1 && th_now_ms() - t0 < 5000) th_sleep_ms(20);
    ASSERT_EQ(sql_int(a, waiting), 1);
    kill(kid, SIGKILL);
    ASSERT_EQ(th_wait_child(kid, 5000), 128 + SIGKILL);
    /* the server notices the dead client within client_connection_check_interval */
    t0 = th_now_ms();
    while (sql_int(a, waiting) > 0 && th_now_ms() - t0 < 5000) th_sleep_ms(20);
    long long left = sql_int(a, waiting);
    th_log("killed waiter: its statement left the queue %lld ms after the kill (%lld left)",
           (long long)(th_now_ms() - t0), left);
    ASSERT_EQ(left, 0);
    PQfinish(a);
    ASSERT_LOK(h, dlock_release(h));
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(h, dlock_release(h));
    dlock_lock_free(h);
    dlock_client_free(c);
}

/* ---- session loss: the server ends the holder's session ---- */
static void test_session_loss(void) {
    dlock_client *c = client();
    dlock_lock *l = lock(c, "lost", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL));
    int held = 0;
    int64_t n = 0;
    ASSERT_LOK(l, dlock_lock_check(l, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(n, 1);
    PGconn *a = admin("testdb");
    /* the key is the documented one: SHA-256's first 8 bytes, big-endian, signed */
    ASSERT_EQ(sql_int(a, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                         "AND objsubid = 1 AND mode = 'ExclusiveLock' AND "
                         "((classid::bigint << 32) | objid::bigint) = "
                         "('x' || left(encode(sha256('lost'::bytea), 'hex'), 16))::bit(64)::bigint"),
              1);
    ASSERT_EQ(sql_int(a, "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE "
                         "locktype = 'advisory' AND granted"),
              1);
    PQfinish(a);
    th_sleep_ms(100);
    ASSERT_LOK(l, dlock_lock_check(l, &held, &n));
    ASSERT_EQ(held, 0);
    ASSERT_LCODE(l, dlock_release(l), DLOCK_ELOST);
    th_log("session ended: check says not held, release: %s", dlock_lock_errmsg(l));
    ASSERT_EQ(dlock_lock_holding(l), 0);
    /* the handle reconnects for its next acquire */
    ASSERT_LOK(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(l, dlock_release(l));
    /* and the client's own session too */
    a = admin("testdb");
    sql_int(a, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
               "usename = 'test'");
    PQfinish(a);
    th_sleep_ms(100);
    int locked = 1;
    ASSERT_COK(c, dlock_is_locked(c, "lost", DLOCK_CSTR, &locked));
    ASSERT_EQ(locked, 0);
    int64_t rtt = 0;
    ASSERT_COK(c, dlock_ping(c, &rtt));
    dlock_lock_free(l);
    dlock_client_free(c);

    /* a session that stops answering: the release gives up after the command
     * timeout, closes the connection (so the server drops the lock) and says
     * lost */
    dlock_options o;
    dlock_options_init(&o);
    o.url = g_url;
    o.command_timeout_ms = 500;
    ASSERT_OK(dlock_client_new(&o, &c));
    l = lock(c, "hung", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL));
    a = admin("testdb");
    pid_t be = (pid_t)sql_int(a, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted");
    ASSERT(be > 0);
    ASSERT(kill(be, SIGSTOP) == 0);
    int64_t t0 = th_now_ms();
    int rc = dlock_release(l);
    int64_t el = th_now_ms() - t0;
    kill(be, SIGCONT);
    th_log("hung session: release -> %s after %lld ms: %s", dlock_strerror(rc), (long long)el,
           dlock_lock_errmsg(l));
    ASSERT_EQ(rc, DLOCK_ELOST);
    ASSERT_GE(el, 450);
    ASSERT_LT(el, 3000);
    dlock_lock *l2 = lock(c, "hung", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l2, dlock_acquire(l2, 5000, DLOCK_WATCHDOG, NULL));
    dlock_lock_free(l2);
    PQfinish(a);
    dlock_lock_free(l);
    dlock_client_free(c);
}

/* ---- read/write and reentrant ---- */
static void test_rw_reentrant(void) {
    dlock_client *c = client();
    dlock_lock *r1 = lock(c, "rw", DLOCK_KIND_READ);
    dlock_lock *r2 = lock(c, "rw", DLOCK_KIND_READ);
    dlock_lock *w = lock(c, "rw", DLOCK_KIND_WRITE);
    dlock_lock *w2 = lock(c, "rw", DLOCK_KIND_WRITE);
    ASSERT_LOK(r1, dlock_acquire(r1, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(r2, dlock_acquire(r2, 1000, DLOCK_WATCHDOG, NULL));
    ASSERT_LCODE(w, dlock_acquire(w, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(w, dlock_acquire(w, 100, DLOCK_WATCHDOG, NULL), DLOCK_ETIMEDOUT);
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
    ASSERT_LCODE(w, dlock_acquire(w, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_LOK(r2, dlock_release(r2));
    ASSERT_LOK(w, dlock_acquire(w, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LCODE(r1, dlock_acquire(r1, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(w2, dlock_acquire(w2, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_COK(c, dlock_inspect(c, "rw", DLOCK_CSTR, &info));
    ASSERT_EQ(info.readers, 0);
    ASSERT_EQ(info.writer, 1);
    ASSERT_LOK(w, dlock_release(w));
    ASSERT_COK(c, dlock_inspect(c, "rw", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 0);
    ASSERT(info.fence >= 3);

    /* reentrant: two holds on one handle, released one at a time */
    dlock_lock *re = lock(c, "re", DLOCK_KIND_REENTRANT);
    dlock_lock *other = lock(c, "re", DLOCK_KIND_PLAIN);
    uint64_t f1 = 0, f2 = 0;
    ASSERT_LOK(re, dlock_acquire(re, 0, DLOCK_WATCHDOG, &f1));
    ASSERT_LOK(re, dlock_acquire(re, 0, DLOCK_WATCHDOG, &f2));
    ASSERT_U64_GT(f2, f1);
    int64_t n = 0;
    ASSERT_LOK(re, dlock_lock_check(re, &held, &n));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(n, 2);
    ASSERT_LOK(re, dlock_release(re));
    ASSERT_EQ(dlock_lock_holding(re), 1);
    ASSERT_LCODE(other, dlock_acquire(other, 0, DLOCK_WATCHDOG, NULL), DLOCK_EBUSY);
    ASSERT_LOK(re, dlock_release(re));
    ASSERT_EQ(dlock_lock_holding(re), 0);
    ASSERT_LOK(other, dlock_acquire(other, 0, DLOCK_WATCHDOG, NULL));
    /* a plain handle that holds is refused */
    ASSERT_LCODE(other, dlock_acquire(other, 0, DLOCK_WATCHDOG, NULL), DLOCK_EINVAL);
    ASSERT_LCODE(re, dlock_release(re), DLOCK_ENOTHELD);
    dlock_lock_free(other); /* frees while holding: released */
    ASSERT_LOK(re, dlock_acquire(re, 0, DLOCK_WATCHDOG, NULL));
    dlock_lock_free(re);
    dlock_lock_free(r1);
    dlock_lock_free(r2);
    dlock_lock_free(w);
    dlock_lock_free(w2);
    dlock_client_free(c);
}

/* ---- what the backend lacks, and bad input ---- */
static int list_cb(const char *name, size_t len, const dlock_info *info, void *ud) {
    (void)name, (void)len, (void)info, (void)ud;
    return 0;
}

static void want_postgres_msg(const char *msg) {
    ASSERT_MSG(strstr(msg, "postgres") != NULL, "message does not name the backend: %s", msg);
}

static void test_unsupported_and_errors(void) {
    dlock_client *c = client();
    dlock_semaphore *s = NULL;
    ASSERT_CCODE(c, dlock_semaphore_new(c, "sem", DLOCK_CSTR, &s), DLOCK_ENOTSUP);
    want_postgres_msg(dlock_errmsg(c));
    th_log("semaphore: %s", dlock_errmsg(c));
    char tok[DLOCK_TOKEN_LEN + 1];
    ASSERT_CCODE(c, dlock_acquire_token(c, "t", DLOCK_CSTR, 0, 1000, tok, NULL), DLOCK_ENOTSUP);
    want_postgres_msg(dlock_errmsg(c));
    ASSERT_CCODE(c, dlock_list(c, NULL, list_cb, NULL), DLOCK_ENOTSUP);
    want_postgres_msg(dlock_errmsg(c));
    int existed = 0;
    ASSERT_CCODE(c, dlock_force_unlock(c, "x", DLOCK_CSTR, &existed), DLOCK_ENOTSUP);
    want_postgres_msg(dlock_errmsg(c));
    dlock_lock *l = NULL;
    ASSERT_CCODE(c, dlock_lock_new(c, "f", DLOCK_CSTR, DLOCK_KIND_FAIR, &l), DLOCK_ENOTSUP);
    want_postgres_msg(dlock_errmsg(c));
    dlock_client_free(c);

    struct {
        const char *url_fmt;
        int want;
        const char *secret;
    } bad[] = {
        {"postgres://test:hunter2x@127.0.0.1:%d/testdb", DLOCK_EAUTH, "hunter2x"},
        {"postgresql://test:s3cr%%21t@127.0.0.1:%d/testdb?bogus_option=1", DLOCK_EINVAL, "s3cr"},
        {"postgres://test:pw%%zzzzz@127.0.0.1:%d/testdb", DLOCK_EINVAL, "zzzzz"},
        {"postgres://test:topsecret@127.0.0.1:1/testdb?application_name=t%d", DLOCK_EIO, "topsecret"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char url[256];
        snprintf(url, sizeof url, bad[i].url_fmt, g_port);
        dlock_options o;
        dlock_options_init(&o);
        o.url = url;
        o.connect_timeout_ms = 3000;
        dlock_client *bc = NULL;
        int rc = dlock_client_new(&o, &bc);
        const char *m = dlock_errmsg(bc);
        th_log("%s -> %s: %s", bad[i].want == DLOCK_EAUTH ? "wrong password" : "bad URL",
               dlock_strerror(rc), m);
        ASSERT_CCODE(bc, rc, bad[i].want);
        ASSERT_MSG(strstr(m, bad[i].secret) == NULL, "message shows the password: %s", m);
        ASSERT(m[0] != '\0');
        dlock_client_free(bc);
    }
    /* one-letter passwords: only the password field is masked, never the
     * same letter in the words around it (which would mangle the message
     * and tell the password by elimination) */
    struct {
        const char *url_fmt;
        int want;
        const char *must; /* the message keeps this whole */
        const char *leak; /* and never shows this */
    } one[] = {
        {"postgres://test:e@127.0.0.1:%d/testdb", DLOCK_EAUTH, "authentication failed", ":e@"},
        {"postgres://test:t@127.0.0.1:%d/testdb", DLOCK_EAUTH, "\"test\"", ":t@"},
        {"postgres://test:s@127.0.0.1:%d/testdb?bogus_option=1", DLOCK_EINVAL, "bogus_option",
         ":s@"},
        {"postgres://test:%%@127.0.0.1:%d/testdb", DLOCK_EINVAL, "percent", "\"%\""},
    };
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
        char url[256];
        snprintf(url, sizeof url, one[i].url_fmt, g_port);
        dlock_options o;
        dlock_options_init(&o);
        o.url = url;
        o.connect_timeout_ms = 3000;
        dlock_client *bc = NULL;
        int rc = dlock_client_new(&o, &bc);
        const char *m = dlock_errmsg(bc);
        th_log("one-letter password -> %s: %s", dlock_strerror(rc), m);
        ASSERT_CCODE(bc, rc, one[i].want);
        ASSERT_MSG(strstr(m, one[i].must) != NULL, "message mangled: %s", m);
        ASSERT_MSG(strstr(m, one[i].leak) == NULL, "message shows the password: %s", m);
        dlock_client_free(bc);
    }
    /* the password from the options, over a URL without one */
    dlock_options o;
    dlock_options_init(&o);
    char url[256];
    snprintf(url, sizeof url, "postgresql://test@127.0.0.1:%d/testdb", g_port);
    o.url = url;
    o.password = "secret";
    dlock_client *oc = NULL;
    ASSERT_CCODE(oc, dlock_client_new(&o, &oc), DLOCK_OK);
    dlock_client_free(oc);
}

/* ---- server facts ---- */
static void test_facts(void) {
    dlock_client *c = client();
    char v[128];
    ASSERT_COK(c, dlock_server_fact(c, "backend", v, sizeof v));
    ASSERT_STR_EQ(v, "postgres");
    ASSERT_COK(c, dlock_server_fact(c, "version", v, sizeof v));
    th_log("version fact: %s", v);
    ASSERT(v[0] >= '1' && v[0] <= '9');
    ASSERT_COK(c, dlock_server_fact(c, "session", v, sizeof v));
    ASSERT(strstr(v, "connection") != NULL);
    ASSERT_COK(c, dlock_server_fact(c, "idle_session_timeout", v, sizeof v));
    ASSERT_STR_EQ(v, "0");
    ASSERT_CCODE(c, dlock_server_fact(c, "no_such_setting_x", v, sizeof v), DLOCK_ESERVER);
    ASSERT(strstr(dlock_errmsg(c), "no_such_setting_x") != NULL);
    dlock_client_free(c);
}

/* ---- the CLI ---- */
/* Runs the CLI with args after --url; its exit status, output in buf. */
static int run_cli(const char *cli, const char *const *args, char *buf, size_t len) {
    char out[300];
    snprintf(out, sizeof out, "%s/cli.out", g_dir);
    const char *argv[16] = {cli, "--url", g_url};
    int n = 3;
    for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
    argv[n] = NULL;
    return th_run_capture((char *const *)argv, out, buf, len, 20000);
}

static void test_cli(const char *cli) {
    if (!cli || access(cli, X_OK)) {
        th_skip_part("CLI not given or not built (%s): `dlock run`", cli ? cli : "none");
        return;
    }
    char buf[2048];
    const char *run[] = {"run", "cli-lock", "--", "sh", "-c", "echo fence=$DLOCK_FENCE", NULL};
    int st = run_cli(cli, run, buf, sizeof buf);
    th_log("dlock run: exit %d, output: %s", st, buf);
    ASSERT_EQ(st, 0);
    ASSERT(strstr(buf, "fence=1") != NULL);
    ASSERT(strstr(buf, "secret") == NULL);

    const char *doctor[] = {"doctor", NULL};
    st = run_cli(cli, doctor, buf, sizeof buf);
    th_log("dlock doctor: exit %d, output:\n%s", st, buf);
    ASSERT_EQ(st, 0);
    ASSERT(strstr(buf, "PASS  version      postgres ") != NULL);
    ASSERT(strstr(buf, "PASS  session") != NULL);
    ASSERT(strstr(buf, "PASS  lock") != NULL);
    ASSERT(strstr(buf, "PASS  timeouts     idle_session_timeout 0") != NULL);
    ASSERT(strstr(buf, "latency") != NULL);
    ASSERT(strstr(buf, "FAIL  ") == NULL);
    ASSERT(strstr(buf, "maxmemory") == NULL); /* no Redis questions */

    /* a signal while `dlock run` waits: it cancels its wait and exits
     * 128+15, and leaves nothing that takes the lock later */
    dlock_client *c = client();
    dlock_lock *h = lock(c, "cli-wait", DLOCK_KIND_PLAIN);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    char errf[300];
    snprintf(errf, sizeof errf, "%s/cli-wait.err", g_dir);
    pid_t kid = th_fork();
    if (kid == 0) {
        int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(cli, cli, "--url", g_url, "run", "cli-wait", "--", "true", (char *)NULL);
        _exit(127);
    }
    th_sleep_ms(500);
    int64_t t0 = th_now_ms();
    kill(kid, SIGTERM);
    st = th_wait_child(kid, 10000);
    th_log("dlock run waiting, SIGTERM: exit %d after %lld ms", st,
           (long long)(th_now_ms() - t0));
    if (st != 128 + SIGTERM) {
        char out[8192] = "";
        FILE *f = fopen(errf, "r");
        if (f) {
            out[fread(out, 1, sizeof out - 1, f)] = '\0';
            fclose(f);
        }
        th_log("its output:\n%s", out);
    }
    ASSERT_EQ(st, 128 + SIGTERM);
    ASSERT_LOK(h, dlock_release(h));
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(h, dlock_release(h));
    dlock_lock_free(h);
    dlock_client_free(c);
}

/* `dlock run` whose holding session the server ends (pg_terminate_backend;
 * idle_session_timeout, a restart or a cut link do the same): an advisory
 * lock has no lease and nothing calls back, so dlock asks the server every
 * second and stops the command when the session is gone (before: the
 * command ran to its end beside the next holder's). */
static void test_cli_session_lost(const char *cli) {
    if (!cli || access(cli, X_OK)) return;
    char started[300], script[400];
    snprintf(started, sizeof started, "%s/cli-killed.started", g_dir);
    snprintf(script, sizeof script, "touch '%s'; exec sleep 30", started);
    pid_t kid = th_fork();
    if (kid == 0) {
        execl(cli, cli, "--url", g_url, "run", "cli-killed", "-c", script, (char *)NULL);
        _exit(127);
    }
    PGconn *a = admin("testdb");
    ASSERT_EVENTUALLY(access(started, F_OK) == 0, 15000); /* the command runs: held */
    int64_t t0 = th_now_ms();
    ASSERT_EQ(sql_int(a, "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE "
                         "locktype = 'advisory' AND granted"),
              1);
    PQfinish(a);
    int st = th_wait_child(kid, 20000);
    int64_t took = th_now_ms() - t0;
    th_log("dlock run, its session terminated: exit %d after %lld ms", st, (long long)took);
    ASSERT_EQ(st, 80);
    ASSERT_LT(took, 5000);
}

/* Signals reach the command at once while a session check hangs on a
 * frozen server (the check runs on a thread of its own; before: the
 * supervising loop sat in the check for the command timeout). */
static void test_cli_check_frozen(const char *cli) {
    if (!cli || access(cli, X_OK)) return;
    char started[300], termed[300], script[800];
    snprintf(started, sizeof started, "%s/cli-frozen.started", g_dir);
    snprintf(termed, sizeof termed, "%s/cli-frozen.termed", g_dir);
    snprintf(script, sizeof script,
             "trap 'touch \"%s\"; exit 3' TERM; touch '%s'; while :; do sleep 0.05; done",
             termed, started);
    pid_t kid = th_fork();
    if (kid == 0) {
        execl(cli, cli, "--url", g_url, "--timeout", "5s", "run", "cli-frozen", "-c", script,
              (char *)NULL);
        _exit(127);
    }
    ASSERT_EVENTUALLY(access(started, F_OK) == 0, 15000);
    th_sleep_ms(300);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "kill -STOP %ld $(pgrep -P %ld)", (long)g_pg, (long)g_pg);
    ASSERT_EQ(system(cmd), 0);
    th_sleep_ms(1500); /* a check is under way, waiting for the frozen server */
    int64_t t0 = th_now_ms();
    kill(kid, SIGTERM);
    ASSERT_EVENTUALLY(access(termed, F_OK) == 0, 10000);
    int64_t took = th_now_ms() - t0;
    snprintf(cmd, sizeof cmd, "kill -CONT %ld $(pgrep -P %ld)", (long)g_pg, (long)g_pg);
    ASSERT_EQ(system(cmd), 0);
    int st = th_wait_child(kid, 20000);
    th_log("dlock run, server frozen, SIGTERM: the command had it after %lld ms (dlock exit %d)",
           (long long)took, st);
    ASSERT_LT(took, 1000);
}

/* ---- dlock_lock_cancel: the server cancels the waiting statement ---- */
static void test_cancel(void) {
    dlock_client *c = client();
    th_check_lock_cancel(c, "pg:cancel", DLOCK_WATCHDOG);
    /* the cancelled waits left no advisory lock behind */
    PGconn *a = admin("testdb");
    long long n = sql_int(a, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'");
    th_log("cancel: advisory locks left: %lld", n);
    ASSERT_EQ(n, 0);
    PQfinish(a);
    dlock_client_free(c);
}

int main(int argc, char **argv) {
    th_init("backend_postgres");
    g_owner = getpid();
    atexit(pg_stop);
    th_on_fatal_signals(on_signal);
    pg_start();
    test_rw_reentrant();
    test_crash_and_waits();
    test_killed_waiter();
    test_session_loss();
    test_unsupported_and_errors();
    test_counter();
    test_facts();
    test_cli(argc > 1 ? argv[1] : NULL);
    test_cli_session_lost(argc > 1 ? argv[1] : NULL);
    test_cli_check_frozen(argc > 1 ? argv[1] : NULL);
    test_cancel(); /* last: a thread (no fork after it) */
    th_log("all passed");
    return 0;
}
