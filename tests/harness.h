/*
 * Test harness for the dlock library tests.
 *
 * - th_init() installs the cleanup machinery (atexit, SIGINT/SIGTERM/SIGHUP/
 *   SIGABRT, and a SIGALRM watchdog slightly shorter than the ctest TIMEOUT,
 *   read from $DLOCK_TEST_TIMEOUT), clears $DLOCK_URL / $DLOCK_PASSWORD so the
 *   tests are hermetic, and makes stdout unbuffered.
 * - th_server_start() starts a private redis-server (fork/exec) on a free
 *   127.0.0.1 port plus a unix socket in a mkdtemp directory, waits until it
 *   answers PING, and registers it so that it is always stopped (SIGTERM, then
 *   SIGKILL) and its directory removed, whatever way the test ends. Without
 *   redis-server on PATH (or $DLOCK_REDIS_SERVER) the test exits 77 (skip).
 * - ASSERT_* macros print both values and file:line, then exit(1).
 * - th_redis*(): raw hiredis access to a test server (over its unix socket).
 *
 * Children made with th_fork() never stop the parent's servers.
 */
#ifndef DLOCK_TEST_HARNESS_H
#define DLOCK_TEST_HARNESS_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#include "dlock.h"

/* ---- set-up and failure ---- */

/* Call first in main(). name: shown in messages. */
void th_init(const char *name);
/* Prints "SKIP: reason" and exits 77 (ctest SKIP_RETURN_CODE). scripts/test
 * fails a CI run (CI=true) in which any test reported a skip. */
void th_skip(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
/* One part of a test cannot run here (a tool or server missing): prints
 * "SKIP PART: reason" and returns, so the rest of the test runs. With
 * $DLOCK_NO_SKIP set (CI) it fails the test instead: every check must run. */
void th_skip_part(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "file:line: FAIL: ..." and exits 1 (servers are stopped by atexit). */
void th_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
/* Progress line on stdout, prefixed with the test name and elapsed time. */
void th_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- assertions ---- */
#define TH_CMP_(a, op, b, opname)                                                        \
    do {                                                                                 \
        int64_t th_a_ = (int64_t)(a);                                                    \
        int64_t th_b_ = (int64_t)(b);                                                    \
        if (!(th_a_ op th_b_))                                                           \
            th_fail(__FILE__, __LINE__, "ASSERT_" opname "(%s, %s): %" PRId64 " vs %" PRId64, \
                    #a, #b, th_a_, th_b_);                                               \
    } while (0)

#define ASSERT(cond)                                                                     \
    do {                                                                                 \
        if (!(cond)) th_fail(__FILE__, __LINE__, "ASSERT(%s)", #cond);                   \
    } while (0)
#define ASSERT_MSG(cond, ...)                                                            \
    do {                                                                                 \
        if (!(cond)) th_fail(__FILE__, __LINE__, __VA_ARGS__);                           \
    } while (0)
#define ASSERT_EQ(a, b) TH_CMP_(a, ==, b, "EQ")
#define ASSERT_NE(a, b) TH_CMP_(a, !=, b, "NE")
#define ASSERT_LT(a, b) TH_CMP_(a, <, b, "LT")
#define ASSERT_LE(a, b) TH_CMP_(a, <=, b, "LE")
#define ASSERT_GT(a, b) TH_CMP_(a, >, b, "GT")
#define ASSERT_GE(a, b) TH_CMP_(a, >=, b, "GE")
#define ASSERT_U64_GT(a, b)                                                              \
    do {                                                                                 \
        uint64_t th_a_ = (uint64_t)(a);                                                  \
        uint64_t th_b_ = (uint64_t)(b);                                                  \
        if (!(th_a_ > th_b_))                                                            \
            th_fail(__FILE__, __LINE__, "ASSERT_U64_GT(%s, %s): %" PRIu64 " vs %" PRIu64, \
                    #a, #b, th_a_, th_b_);                                               \
    } while (0)
#define ASSERT_U64_EQ(a, b)                                                              \
    do {                                                                                 \
        uint64_t th_a_ = (uint64_t)(a);                                                  \
        uint64_t th_b_ = (uint64_t)(b);                                                  \
        if (!(th_a_ == th_b_))                                                           \
            th_fail(__FILE__, __LINE__, "ASSERT_U64_EQ(%s, %s): %" PRIu64 " vs %" PRIu64, \
                    #a, #b, th_a_, th_b_);                                               \
    } while (0)
#define ASSERT_STR_EQ(a, b)                                                              \
    do {                                                                                 \
        const char *th_a_ = (a);                                                         \
        const char *th_b_ = (b);                                                         \
        if (th_a_ == NULL || th_b_ == NULL || strcmp(th_a_, th_b_) != 0)                 \
            th_fail(__FILE__, __LINE__, "ASSERT_STR_EQ(%s, %s): \"%s\" vs \"%s\"", #a, #b, \
                    th_a_ ? th_a_ : "(null)", th_b_ ? th_b_ : "(null)");                 \
    } while (0)
#define ASSERT_NULL(p) ASSERT((p) == NULL)
#define ASSERT_NOT_NULL(p) ASSERT((p) != NULL)

/* A dlock call returned the expected code; prints both codes by name. */
#define TH_CODE_(expr, want, msg)                                                        \
    do {                                                                                 \
        int th_got_ = (expr);                                                            \
        int th_want_ = (want);                                                           \
        if (th_got_ != th_want_)                                                         \
            th_fail(__FILE__, __LINE__, "%s: got %d (%s), want %d (%s)%s%s", #expr,      \
                    th_got_, dlock_strerror(th_got_), th_want_, dlock_strerror(th_want_), \
                    (msg) ? "; message: " : "", (msg) ? (const char *)(msg) : "");       \
    } while (0)
#define ASSERT_CODE(expr, want) TH_CODE_(expr, want, (const char *)NULL)
#define ASSERT_OK(expr) TH_CODE_(expr, DLOCK_OK, (const char *)NULL)
/* ... also printing the lock handle's / client's message on failure */
#define ASSERT_LCODE(l, expr, want) TH_CODE_(expr, want, dlock_lock_errmsg(l))
#define ASSERT_LOK(l, expr) TH_CODE_(expr, DLOCK_OK, dlock_lock_errmsg(l))
#define ASSERT_SCODE(s, expr, want) TH_CODE_(expr, want, dlock_semaphore_errmsg(s))
#define ASSERT_SOK(s, expr) TH_CODE_(expr, DLOCK_OK, dlock_semaphore_errmsg(s))
#define ASSERT_CCODE(c, expr, want) TH_CODE_(expr, want, dlock_errmsg(c))
#define ASSERT_COK(c, expr) TH_CODE_(expr, DLOCK_OK, dlock_errmsg(c))

/* Polls cond every 2 ms; fails the test if it is not true within timeout_ms. */
#define ASSERT_EVENTUALLY(cond, timeout_ms)                                              \
    do {                                                                                 \
        int64_t th_dl_ = th_now_ms() + (int64_t)(timeout_ms);                            \
        while (!(cond)) {                                                                \
            if (th_now_ms() > th_dl_)                                                    \
                th_fail(__FILE__, __LINE__, "not true within %lld ms: %s",               \
                        (long long)(timeout_ms), #cond);                                 \
            th_sleep_ms(2);                                                              \
        }                                                                                \
    } while (0)

/* ---- time ---- */
int64_t th_now_ms(void); /* CLOCK_MONOTONIC (comparable across processes) */
int64_t th_now_us(void);
void th_sleep_ms(int64_t ms);

/* ---- servers ---- */
typedef struct th_server th_server;

typedef struct th_server_opts {
    int appendonly;          /* 1: --appendonly yes --appendfsync always */
    const char *requirepass; /* NULL: no password */
} th_server_opts;

/* Starts a server (opts may be NULL); fails the test if it cannot. */
/* ---- private servers of other kinds (ZooKeeper, etcd, PostgreSQL, MariaDB) ---- */
/* Redis Sentinel at 127.0.0.1:port watching "mymaster": 1 when it sees
 * one replica and nsentinels - 1 other sentinels (ready for a failover). */
int th_sentinel_ready(int port, int nsentinels);
/* The port of the master a sentinel at 127.0.0.1:port names for
 * "mymaster" (0: none, or no answer). */
int th_sentinel_master_port(int port);
/* A free 127.0.0.1 TCP port (bound, read, closed). */
int th_free_port(void);
/* A TCP proxy to 127.0.0.1:to in a child process (start it before any
 * client thread exists); *port receives its port. SIGKILL cuts the clients
 * behind it off (closed, then refused), SIGSTOP leaves them unanswered;
 * the caller kills and reaps it (th_wait_child). */
pid_t th_proxy_start(int to, int *port);
/* Stops the process in *slot (0: none): sig, up to timeout_ms for it to
 * exit, then SIGKILL; reaps it; sets *slot to 0. Async-signal-safe. */
void th_stop_pid(volatile pid_t *slot, int sig, int64_t timeout_ms);
/* rm -rf dir (a NUL-terminated buffer), then dir[0] = '\0'; nothing when
 * it is already empty. Async-signal-safe. */
void th_rm_rf(char *dir);
/* Runs argv (argv[0] a path) with stdout and stderr to the file out, waits
 * up to timeout_ms, and reads what it wrote into buf (NUL-terminated);
 * returns its status as th_wait_child does. */
int th_run_capture(char *const argv[], const char *out, char *buf, size_t len,
                   int64_t timeout_ms);
/* Runs handler on SIGINT, SIGTERM, SIGHUP and SIGALRM (the test timeout):
 * the handler stops the test's servers and _exits. */
void th_on_fatal_signals(void (*handler)(int));

th_server *th_server_start(const th_server_opts *opts);
/* Stops the server (SIGTERM, bounded wait, SIGKILL), removes its directory and
 * frees it. NULL is a no-op. */
void th_server_stop(th_server *s);
/* Stops the server process with sig (SIGTERM: clean shutdown, SIGKILL: crash)
 * but keeps its directory, port and registration: th_server_resume() starts it
 * again on the same port and socket (AOF data survives with appendonly). */
void th_server_halt(th_server *s, int sig);
void th_server_resume(th_server *s);
/* SIGSTOP / SIGCONT the server: it keeps its connections but answers nothing
 * (a hung server). Stopping a paused server works. */
void th_server_pause(th_server *s);
void th_server_unpause(th_server *s);
/* halt(sig) + resume. */
void th_server_restart(th_server *s, int sig);

int th_server_port(const th_server *s);
const char *th_server_url(const th_server *s);      /* redis://127.0.0.1:PORT */
const char *th_server_unix_url(const th_server *s); /* unix:///dir/redis.sock */
const char *th_server_sock(const th_server *s);     /* the socket path */
const char *th_server_dir(const th_server *s);
pid_t th_server_pid(const th_server *s);

/* ---- raw access (hiredis over the unix socket; AUTH done if needed) ---- */
redisContext *th_redis(const th_server *s);
/* Runs a command (redisCommand format, %b for binary); fails on I/O errors.
 * The caller frees the reply. */
redisReply *th_cmd(redisContext *rc, const char *fmt, ...);
/* Runs a command expecting an integer reply. */
long long th_cmd_int(redisContext *rc, const char *fmt, ...);
/* Runs a command expecting a string/status reply (malloc'd copy) or nil (NULL). */
char *th_cmd_str(redisContext *rc, const char *fmt, ...);
/* Runs a command expecting a status reply "OK" (or any non-error reply). */
void th_cmd_ok(redisContext *rc, const char *fmt, ...);

/* Subscribers of channel (PUBSUB NUMSUB). */
long long th_numsub(redisContext *rc, const char *channel);
/* Blocked waiters of lock name: subscribers of its unlock channel
 * "redisson_lock__channel:{name}" plus the registered plain and fair waiters
 * subscribed to their own channel "redisson_lock__channel:{name}:<id>". */
long long th_subscribers(redisContext *rc, const char *name);
/* Waits until at least n clients are subscribed to name's unlock channel
 * (i.e. blocked waiters); fails the test after timeout_ms. */
void th_wait_subscribers(redisContext *rc, const char *name, int n, int64_t timeout_ms);

/* ---- dlock clients ---- */
/* A client on s (TCP url). watchdog_lease_ms 0: the default. Fails on error. */
dlock_client *th_client(const th_server *s, int64_t watchdog_lease_ms);
/* A lock handle; fails on error. */
dlock_lock *th_lock(dlock_client *c, const char *name, dlock_kind kind);
/* dlock_lock_cancel's contract on any backend that has it: with name held by
 * a handle of c, a plain handle waiting in another thread (forever, then for
 * 20 s) returns DLOCK_ECANCELED within 1.5 s of the cancel, and the holder
 * still holds; so does a wait cancelled from its very start (cancels every
 * millisecond); a cancel with no acquire under way is not for the next one
 * (a 300 ms wait then times out); once the holder releases, the cancelled
 * handle takes the lock at once. lease_ms: the backend's (DLOCK_WATCHDOG for
 * session locks). Its thread is gone when it returns. */
void th_check_lock_cancel(dlock_client *c, const char *name, int64_t lease_ms);

/* Mutual exclusion of a semaphore across processes: procs forked
 * processes, each on a client of its own from mk(), try_set(permits) then
 * rounds x (acquire 1 waiting forever, count the holders in shared memory
 * for 30 ms, release; until permits holders were in at once, a holder stays
 * up to 20 s for them). Never more than permits holders at once, permits
 * reached, try_set won by exactly one; afterwards all permits available.
 * Call it while this process has no client (it forks). */
/* A semaphore handle on c (fails on error), and its available permits. */
dlock_semaphore *th_sem(dlock_client *c, const char *name);
int64_t th_sem_available(dlock_semaphore *s);

/* dlock_semaphore_cancel's contract, as th_check_lock_cancel's: with the
 * only permit of name (set to 1 here) held by a handle of c, a wait in
 * another thread (forever, then for 20 s) returns DLOCK_ECANCELED within
 * 1.5 s of the cancel, leaving nothing queued (once the holder releases,
 * the permit is available and the cancelled handle takes it at once); so
 * does a wait cancelled from its very start; a cancel with no acquire under
 * way is not for the next one. */
void th_check_semaphore_cancel(dlock_client *c, const char *name);

void th_check_semaphore_procs(dlock_client *(*mk)(void), const char *name, int permits,
                              int procs, int rounds);

/* ---- processes ---- */
/* fflush + fork; fails on error. In the child, the harness no longer owns the
 * parent's servers. The child gets SIGKILL when the test process dies, and a
 * child not yet reaped by th_wait_child() is killed when the test ends. */
pid_t th_fork(void);
/* Waits for pid up to timeout_ms; returns its exit status (128+sig if
 * signalled); on timeout kills it and fails the test. */
int th_wait_child(pid_t pid, int64_t timeout_ms);
/* 1 if the python interpreter at path can `import redis`. */
int th_python_has_redis(const char *python);

/* A worker process of another client library, driven line by line over
 * pipes: its stdin takes commands, each answer is one line on its stdout
 * (stderr stays the test's). */
typedef struct th_coproc {
    pid_t pid;
    int to, from;
    const char *what;  /* its name in failure messages */
    char *buf, *line;  /* what was read; the last line returned */
    size_t blen, cap;
} th_coproc;
/* Starts argv (argv[0] a path) as a coprocess. */
void th_coproc_start(th_coproc *p, const char *what, char *const argv[]);
/* Sends cmd and a newline. */
void th_coproc_send(th_coproc *p, const char *cmd);
/* The next line it writes (without the newline; valid until the next
 * call); fails the test after timeout_ms or when it exits. */
const char *th_coproc_line(th_coproc *p, int64_t timeout_ms);
/* send + line (15 s). */
const char *th_coproc_ask(th_coproc *p, const char *cmd);
/* Sends "quit", waits up to 10 s for it to exit (0 expected) and frees it. */
void th_coproc_quit(th_coproc *p);

#endif
