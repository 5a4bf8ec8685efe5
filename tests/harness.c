/* Test harness: private redis-server instances, assertions, helpers. */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TH_MAX_SERVERS 16

struct th_server {
    volatile pid_t pid;      /* 0 when not running */
    int port;
    int appendonly;
    char *requirepass;
    char dir[128];
    char sock[160];
    char url[64];
    char unix_url[180];
    char log[192];
};

static const char *g_name = "test";
static pid_t g_owner;                 /* the process that owns the servers */
static th_server *volatile g_servers[TH_MAX_SERVERS];
static volatile sig_atomic_t g_cleaning;
static int64_t g_t0_ms;
static char g_redis_server[512];
#define TH_MAX_CHILDREN 64
static volatile pid_t g_children[TH_MAX_CHILDREN]; /* th_fork() children not yet reaped */

/* ---- time ---- */
int64_t th_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t th_now_ms(void) { return th_now_us() / 1000; }

void th_sleep_ms(int64_t ms)
{
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- cleanup ---- */
static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void rm_tree(const char *dir)
{
    if (dir[0]) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Waits for pid up to ms; 1 if reaped. */
static int reap_within(pid_t pid, int64_t ms)
{
    int64_t deadline = th_now_ms() + ms;
    for (;;) {
        pid_t r = waitpid(pid, NULL, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) return 1;
        if (th_now_ms() > deadline) return 0;
        th_sleep_ms(5);
    }
}

static void stop_process(th_server *s, int sig)
{
    pid_t pid = s->pid;
    if (pid <= 0) return;
    kill(pid, sig);
    kill(pid, SIGCONT); /* a paused server must run to act on sig */
    if (!reap_within(pid, 10000)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    s->pid = 0;
}

static void unregister(th_server *s)
{
    for (int i = 0; i < TH_MAX_SERVERS; i++)
        if (g_servers[i] == s) g_servers[i] = NULL;
}

static void forget_child(pid_t pid)
{
    for (int i = 0; i < TH_MAX_CHILDREN; i++)
        if (g_children[i] == pid) g_children[i] = 0;
}

/* Kills and reaps the test's own children still running (async-signal-safe). */
static void kill_children(void)
{
    for (int i = 0; i < TH_MAX_CHILDREN; i++) {
        pid_t pid = g_children[i];
        g_children[i] = 0;
        /* only a child of ours still running (a pid reaped elsewhere is skipped) */
        if (pid > 0 && waitpid(pid, NULL, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
    }
}

/* atexit: graceful stop of every server this process started. */
static void cleanup_atexit(void)
{
    if (getpid() != g_owner || g_cleaning) return;
    g_cleaning = 1;
    kill_children();
    for (int i = 0; i < TH_MAX_SERVERS; i++) {
        th_server *s = g_servers[i];
        if (!s) continue;
        g_servers[i] = NULL;
        stop_process(s, SIGTERM);
        rm_tree(s->dir);
    }
}

/* Async-signal-safe cleanup: SIGKILL, reap, rm -rf via fork/exec. */
static void cleanup_from_signal(void)
{
    if (getpid() != g_owner || g_cleaning) return;
    g_cleaning = 1;
    kill_children();
    for (int i = 0; i < TH_MAX_SERVERS; i++) {
        th_server *s = g_servers[i];
        if (!s) continue;
        if (s->pid > 0) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
            s->pid = 0;
        }
        if (s->dir[0]) {
            pid_t r = fork();
            if (r == 0) {
                execl("/bin/rm", "rm", "-rf", s->dir, (char *)NULL);
                _exit(127);
            }
            if (r > 0) waitpid(r, NULL, 0);
        }
    }
}

static void write_str(const char *s) { (void)!write(2, s, strlen(s)); }

static void on_signal(int sig)
{
    if (getpid() != g_owner) _exit(128 + sig);
    if (sig == SIGALRM) {
        write_str("FAIL: ");
        write_str(g_name);
        write_str(": test timed out (DLOCK_TEST_TIMEOUT); stopping servers\n");
    }
    cleanup_from_signal();
    if (sig == SIGALRM) _exit(1);
    signal(sig, SIG_DFL);
    raise(sig);
    _exit(128 + sig);
}

/* Called by ASan/UBSan before they exit after a report (atexit does not run). */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static void find_redis_server(void)
{
    const char *env = getenv("DLOCK_REDIS_SERVER");
    if (env && *env) {
        if (access(env, X_OK) == 0) snprintf(g_redis_server, sizeof g_redis_server, "%s", env);
        else g_redis_server[0] = '\0';
        return;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    while (*p) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char cand[512];
        if (n > 0 && n < sizeof cand - 20) {
            snprintf(cand, sizeof cand, "%.*s/redis-server", (int)n, p);
            if (access(cand, X_OK) == 0) {
                snprintf(g_redis_server, sizeof g_redis_server, "%s", cand);
                return;
            }
        }
        if (!end) break;
        p = end + 1;
    }
    g_redis_server[0] = '\0';
}

void th_init(const char *name)
{
    g_name = name;
    g_owner = getpid();
    g_t0_ms = th_now_ms();
    setvbuf(stdout, NULL, _IONBF, 0);
    setvbuf(stderr, NULL, _IONBF, 0);
    /* hermetic: the library reads these when options leave things unset */
    unsetenv("DLOCK_URL");
    unsetenv("DLOCK_PASSWORD");
    atexit(cleanup_atexit);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(cleanup_from_signal);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGALRM, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    const char *t = getenv("DLOCK_TEST_TIMEOUT");
    int timeout_s = t && atoi(t) > 0 ? atoi(t) : 60;
    alarm((unsigned)timeout_s);
    find_redis_server();
}

void th_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("SKIP: %s: ", g_name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    exit(77);
}

void th_skip_part(const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    const char *no = getenv("DLOCK_NO_SKIP");
    if (no && *no && strcmp(no, "0") != 0)
        th_fail(__FILE__, __LINE__, "a part would be skipped, and DLOCK_NO_SKIP forbids it: %s", why);
    printf("SKIP PART: %s: %s\n", g_name, why);
    fflush(stdout);
}

void th_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: FAIL (%s, pid %d): ", file, line, g_name, (int)getpid());
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

void th_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    printf("[%s +%.3fs] %s\n", g_name, (double)(th_now_ms() - g_t0_ms) / 1000.0, buf);
}

/* ---- servers ---- */
static int free_port(void);

int th_free_port(void) { return free_port(); }

static void sleep_ms_raw(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void th_stop_pid(volatile pid_t *slot, int sig, int64_t timeout_ms)
{
    pid_t pid = *slot;
    *slot = 0;
    if (pid <= 0) return;
    kill(pid, sig);
    for (int64_t waited = 0; waited < timeout_ms; waited += 10) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        sleep_ms_raw(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

void th_rm_rf(char *dir)
{
    if (!dir[0]) return;
    pid_t r = fork();
    if (r == 0) {
        execl("/bin/rm", "rm", "-rf", dir, (char *)NULL);
        _exit(127);
    }
    if (r > 0) waitpid(r, NULL, 0);
    dir[0] = '\0';
}

int th_run_capture(char *const argv[], const char *out, char *buf, size_t len,
                   int64_t timeout_ms)
{
    pid_t pid = th_fork();
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    int st = th_wait_child(pid, timeout_ms);
    buf[0] = '\0';
    FILE *f = fopen(out, "r");
    if (f) {
        size_t n = fread(buf, 1, len - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return st;
}

void th_on_fatal_signals(void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGALRM};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) th_fail(__FILE__, __LINE__, "socket: %s", strerror(errno));
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        th_fail(__FILE__, __LINE__, "bind/getsockname: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* Reads the log from offset into buf (NUL-terminated). */
static void read_log(const th_server *s, long offset, char *buf, size_t len)
{
    buf[0] = '\0';
    FILE *f = fopen(s->log, "r");
    if (!f) return;
    fseek(f, offset, SEEK_SET);
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* 1 when the server answers PONG on its unix socket (after AUTH if it needs
 * one): a server still loading its AOF answers -LOADING, which is not ready. */
static int answers_ping(const th_server *s)
{
    struct timeval tv = {0, 200000};
    redisContext *rc = redisConnectUnixWithTimeout(s->sock, tv);
    int ok = 0;
    if (rc && !rc->err) {
        redisSetTimeout(rc, tv);
        int authed = 1;
        if (s->requirepass) {
            redisReply *a = redisCommand(rc, "AUTH %s", s->requirepass);
            authed = a && a->type != REDIS_REPLY_ERROR;
            if (a) freeReplyObject(a);
        }
        redisReply *r = authed ? redisCommand(rc, "PING") : NULL;
        ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
        if (r) freeReplyObject(r);
    }
    if (rc) redisFree(rc);
    return ok;
}

/* Starts the process; 0 ready, 1 port taken (retry), fails otherwise. */
static int spawn(th_server *s)
{
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    const char *argv[32];
    int n = 0;
    argv[n++] = g_redis_server;
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--unixsocket";
    argv[n++] = s->sock;
    argv[n++] = "--unixsocketperm";
    argv[n++] = "700";
    argv[n++] = "--dir";
    argv[n++] = s->dir;
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = s->appendonly ? "yes" : "no";
    if (s->appendonly) {
        argv[n++] = "--appendfsync";
        argv[n++] = "always";
    }
    argv[n++] = "--logfile";
    argv[n++] = s->log;
    argv[n++] = "--daemonize";
    argv[n++] = "no";
    if (s->requirepass) {
        argv[n++] = "--requirepass";
        argv[n++] = s->requirepass;
    }
    argv[n] = NULL;

    long log_off = file_size(s->log);
    unlink(s->sock);
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) th_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* die with the test process even if it is SIGKILLed */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        signal(SIGPIPE, SIG_DFL);
        int nul = open("/dev/null", O_RDWR);
        char out[200];
        snprintf(out, sizeof out, "%s/stdout.log", s->dir);
        int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (nul >= 0) dup2(nul, 0);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(g_redis_server, (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    int64_t deadline = th_now_ms() + 10000;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            s->pid = 0;
            char buf[4096];
            read_log(s, log_off, buf, sizeof buf);
            if (strstr(buf, "already in use") || strstr(buf, "Could not create server TCP"))
                return 1;
            th_fail(__FILE__, __LINE__, "redis-server exited (status %d) at start; log:\n%s",
                    st, buf);
        }
        if (answers_ping(s)) return 0;
        if (th_now_ms() > deadline) {
            stop_process(s, SIGKILL);
            th_fail(__FILE__, __LINE__, "redis-server on port %d did not answer PING in 10 s",
                    s->port);
        }
        th_sleep_ms(10);
    }
}

int th_sentinel_ready(int port, int nsentinels)
{
    struct timeval tv = {1, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!rc || rc->err) {
        if (rc) redisFree(rc);
        return 0;
    }
    redisReply *r = redisCommand(rc, "SENTINEL master mymaster");
    long slaves = -1, others = -1;
    if (r && r->type == REDIS_REPLY_ARRAY)
        for (size_t i = 0; i + 1 < r->elements; i += 2) {
            if (!strcmp(r->element[i]->str, "num-slaves")) slaves = atol(r->element[i + 1]->str);
            if (!strcmp(r->element[i]->str, "num-other-sentinels"))
                others = atol(r->element[i + 1]->str);
        }
    if (r) freeReplyObject(r);
    redisFree(rc);
    return slaves == 1 && others == nsentinels - 1;
}

int th_sentinel_master_port(int sport)
{
    struct timeval tv = {1, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", sport, tv);
    if (!rc || rc->err) {
        if (rc) redisFree(rc);
        return 0;
    }
    redisReply *r = redisCommand(rc, "SENTINEL get-master-addr-by-name mymaster");
    int p = (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2) ? atoi(r->element[1]->str) : 0;
    if (r) freeReplyObject(r);
    redisFree(rc);
    return p;
}

th_server *th_server_start(const th_server_opts *opts)
{
    if (!g_redis_server[0])
        th_skip("redis-server not found on PATH (install the redis-server package, "
                "or set DLOCK_REDIS_SERVER)");
    th_server *s = calloc(1, sizeof *s);
    if (!s) th_fail(__FILE__, __LINE__, "out of memory");
    s->appendonly = opts ? opts->appendonly : 0;
    if (opts && opts->requirepass) s->requirepass = strdup(opts->requirepass);
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 60) tmp = "/tmp";
    snprintf(s->dir, sizeof s->dir, "%s/dlockt-XXXXXX", tmp);
    if (!mkdtemp(s->dir)) th_fail(__FILE__, __LINE__, "mkdtemp %s: %s", s->dir, strerror(errno));
    snprintf(s->sock, sizeof s->sock, "%s/redis.sock", s->dir);
    if (strlen(s->sock) >= 108) th_fail(__FILE__, __LINE__, "socket path too long: %s", s->sock);
    snprintf(s->log, sizeof s->log, "%s/redis.log", s->dir);
    snprintf(s->unix_url, sizeof s->unix_url, "unix://%s", s->sock);
    int slot = -1;
    for (int i = 0; i < TH_MAX_SERVERS; i++)
        if (!g_servers[i]) {
            slot = i;
            break;
        }
    if (slot < 0) th_fail(__FILE__, __LINE__, "too many servers");
    g_servers[slot] = s; /* registered before the process exists: always cleaned */
    for (int attempt = 0;; attempt++) {
        s->port = free_port();
        if (spawn(s) == 0) break;
        if (attempt >= 10) th_fail(__FILE__, __LINE__, "no free port after %d tries", attempt);
    }
    snprintf(s->url, sizeof s->url, "redis://127.0.0.1:%d", s->port);
    return s;
}

void th_server_halt(th_server *s, int sig) { stop_process(s, sig); }

void th_server_pause(th_server *s)
{
    if (s->pid > 0) kill(s->pid, SIGSTOP);
}

void th_server_unpause(th_server *s)
{
    if (s->pid > 0) kill(s->pid, SIGCONT);
}

void th_server_resume(th_server *s)
{
    int64_t deadline = th_now_ms() + 5000;
    while (spawn(s) != 0) {
        if (th_now_ms() > deadline)
            th_fail(__FILE__, __LINE__, "port %d stayed taken; cannot restart", s->port);
        th_sleep_ms(50);
    }
}

void th_server_restart(th_server *s, int sig)
{
    th_server_halt(s, sig);
    th_server_resume(s);
}

void th_server_stop(th_server *s)
{
    if (!s) return;
    stop_process(s, SIGTERM);
    unregister(s);
    rm_tree(s->dir);
    free(s->requirepass);
    free(s);
}

int th_server_port(const th_server *s) { return s->port; }
const char *th_server_url(const th_server *s) { return s->url; }
const char *th_server_unix_url(const th_server *s) { return s->unix_url; }
const char *th_server_sock(const th_server *s) { return s->sock; }
const char *th_server_dir(const th_server *s) { return s->dir; }
pid_t th_server_pid(const th_server *s) { return s->pid; }

/* ---- raw access ---- */
redisContext *th_redis(const th_server *s)
{
    struct timeval tv = {5, 0};
    redisContext *rc = redisConnectUnixWithTimeout(s->sock, tv);
    if (!rc || rc->err)
        th_fail(__FILE__, __LINE__, "hiredis connect %s: %s", s->sock,
                rc ? rc->errstr : "out of memory");
    struct timeval ctv = {10, 0};
    redisSetTimeout(rc, ctv);
    if (s->requirepass) {
        redisReply *r = redisCommand(rc, "AUTH %s", s->requirepass);
        if (!r || r->type == REDIS_REPLY_ERROR)
            th_fail(__FILE__, __LINE__, "AUTH failed: %s", r ? r->str : rc->errstr);
        freeReplyObject(r);
    }
    return rc;
}

static redisReply *vcmd(redisContext *rc, const char *fmt, va_list ap)
{
    redisReply *r = redisvCommand(rc, fmt, ap);
    if (!r) th_fail(__FILE__, __LINE__, "hiredis command \"%s\": %s", fmt, rc->errstr);
    return r;
}

redisReply *th_cmd(redisContext *rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcmd(rc, fmt, ap);
    va_end(ap);
    return r;
}

long long th_cmd_int(redisContext *rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcmd(rc, fmt, ap);
    va_end(ap);
    if (r->type != REDIS_REPLY_INTEGER)
        th_fail(__FILE__, __LINE__, "\"%s\": expected an integer reply, got type %d (%s)", fmt,
                r->type, r->str ? r->str : "");
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

char *th_cmd_str(redisContext *rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcmd(rc, fmt, ap);
    va_end(ap);
    char *out = NULL;
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
        out = malloc(r->len + 1);
        if (!out) th_fail(__FILE__, __LINE__, "out of memory");
        memcpy(out, r->str, r->len);
        out[r->len] = '\0';
    } else if (r->type != REDIS_REPLY_NIL) {
        th_fail(__FILE__, __LINE__, "\"%s\": expected a string or nil reply, got type %d (%s)",
                fmt, r->type, r->str ? r->str : "");
    }
    freeReplyObject(r);
    return out;
}

void th_cmd_ok(redisContext *rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcmd(rc, fmt, ap);
    va_end(ap);
    if (r->type == REDIS_REPLY_ERROR)
        th_fail(__FILE__, __LINE__, "\"%s\": error reply %s", fmt, r->str);
    freeReplyObject(r);
}

long long th_numsub(redisContext *rc, const char *channel)
{
    redisReply *r = th_cmd(rc, "PUBSUB NUMSUB %s", channel);
    long long n = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
        n = r->element[1]->integer;
    freeReplyObject(r);
    return n;
}

/* Waiters on the lock's channel (reentrant, Redisson) plus those on a
 * channel of their own "redisson_lock__channel:{name}:<id>" (plain, fair)
 * that are registered as waiting: <id> in the plain lock's registry
 * dlock_waiters:{name} or in the fair lock's queue. (A waiter that got the
 * lock keeps its own channel subscribed for a while: a lingering
 * subscription, which is not a waiter.) */
long long th_subscribers(redisContext *rc, const char *name)
{
    char ch[512];
    snprintf(ch, sizeof ch, "redisson_lock__channel:{%s}", name);
    long long n = th_numsub(rc, ch);
    for (int k = 0; k < 2; k++) {
        redisReply *r = k ? th_cmd(rc, "LRANGE redisson_lock_queue:{%s} 0 -1", name)
                          : th_cmd(rc, "ZRANGE dlock_waiters:{%s} 0 -1", name);
        for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
            if (r->element[i]->type != REDIS_REPLY_STRING) continue;
            snprintf(ch, sizeof ch, "redisson_lock__channel:{%s}:%s", name, r->element[i]->str);
            if (th_numsub(rc, ch) > 0) n++;
        }
        freeReplyObject(r);
    }
    return n;
}

void th_wait_subscribers(redisContext *rc, const char *name, int n, int64_t timeout_ms)
{
    int64_t deadline = th_now_ms() + timeout_ms;
    while (th_subscribers(rc, name) < n) {
        if (th_now_ms() > deadline)
            th_fail(__FILE__, __LINE__,
                    "fewer than %d waiter(s) subscribed to redisson_lock__channel:{%s} "
                    "after %lld ms", n, name, (long long)timeout_ms);
        th_sleep_ms(2);
    }
}

/* ---- dlock clients ---- */
dlock_client *th_client(const th_server *s, int64_t watchdog_lease_ms)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = s->url;
    o.password = s->requirepass;
    o.watchdog_lease_ms = watchdog_lease_ms;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    if (rc != DLOCK_OK)
        th_fail(__FILE__, __LINE__, "dlock_client_new(%s): %d (%s): %s", s->url, rc,
                dlock_strerror(rc), c ? dlock_errmsg(c) : "");
    return c;
}

dlock_lock *th_lock(dlock_client *c, const char *name, dlock_kind kind)
{
    dlock_lock *l = NULL;
    int rc = dlock_lock_new(c, name, DLOCK_CSTR, kind, &l);
    if (rc != DLOCK_OK)
        th_fail(__FILE__, __LINE__, "dlock_lock_new(%s): %d (%s): %s", name, rc,
                dlock_strerror(rc), dlock_errmsg(c));
    return l;
}

/* ---- processes ---- */
pid_t th_fork(void)
{
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) th_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        alarm(0);
        /* never outlive the test, even if it is SIGKILLed */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        /* the child owns no server and no child; g_owner stays the parent's pid */
        for (int i = 0; i < TH_MAX_CHILDREN; i++) g_children[i] = 0;
        return 0;
    }
    for (int i = 0; i < TH_MAX_CHILDREN; i++)
        if (g_children[i] == 0) {
            g_children[i] = pid;
            break;
        }
    return pid;
}

int th_wait_child(pid_t pid, int64_t timeout_ms)
{
    int64_t deadline = th_now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            forget_child(pid);
            if (WIFEXITED(st)) return WEXITSTATUS(st);
            if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
            return 255;
        }
        if (r < 0 && errno != EINTR)
            th_fail(__FILE__, __LINE__, "waitpid(%d): %s", (int)pid, strerror(errno));
        if (th_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            forget_child(pid);
            th_fail(__FILE__, __LINE__, "child %d still running after %lld ms (killed)",
                    (int)pid, (long long)timeout_ms);
        }
        th_sleep_ms(5);
    }
}

int th_python_has_redis(const char *python)
{
    if (access(python, X_OK) != 0) return 0;
    pid_t pid = th_fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
            dup2(nul, 2);
        }
        execl(python, python, "-c", "import redis", (char *)NULL);
        _exit(127);
    }
    return th_wait_child(pid, 30000) == 0;
}

void th_coproc_start(th_coproc *p, const char *what, char *const argv[])
{
    memset(p, 0, sizeof *p);
    p->what = what;
    int in[2], out[2];
    ASSERT_EQ(pipe(in), 0);
    ASSERT_EQ(pipe(out), 0);
    p->pid = th_fork();
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->to = in[1];
    p->from = out[0];
}

void th_coproc_send(th_coproc *p, const char *cmd)
{
    size_t n = strlen(cmd);
    ASSERT_EQ(write(p->to, cmd, n), (ssize_t)n);
    ASSERT_EQ(write(p->to, "\n", 1), 1);
}

const char *th_coproc_line(th_coproc *p, int64_t timeout_ms)
{
    int64_t deadline = th_now_ms() + timeout_ms;
    for (;;) {
        char *nl = p->blen ? memchr(p->buf, '\n', p->blen) : NULL;
        if (nl) {
            size_t n = (size_t)(nl - p->buf);
            free(p->line);
            p->line = malloc(n + 1);
            ASSERT(p->line != NULL);
            memcpy(p->line, p->buf, n);
            p->line[n] = '\0';
            p->blen -= n + 1;
            memmove(p->buf, nl + 1, p->blen);
            return p->line;
        }
        if (p->cap - p->blen < 4096) {
            p->cap = p->cap ? p->cap * 2 : 8192;
            p->buf = realloc(p->buf, p->cap);
            ASSERT(p->buf != NULL);
        }
        int64_t left = deadline - th_now_ms();
        ASSERT_MSG(left > 0, "%s did not answer within %lld ms", p->what, (long long)timeout_ms);
        struct pollfd pf = {p->from, POLLIN, 0};
        int pr = poll(&pf, 1, (int)left);
        if (pr < 0 && errno == EINTR) continue;
        ASSERT_MSG(pr == 1, "%s did not answer within %lld ms", p->what, (long long)timeout_ms);
        ssize_t n = read(p->from, p->buf + p->blen, p->cap - p->blen);
        ASSERT_MSG(n > 0, "%s exited (read: %zd)", p->what, n);
        p->blen += (size_t)n;
    }
}

const char *th_coproc_ask(th_coproc *p, const char *cmd)
{
    th_coproc_send(p, cmd);
    return th_coproc_line(p, 15000);
}

void th_coproc_quit(th_coproc *p)
{
    th_coproc_send(p, "quit");
    ASSERT_EQ(th_wait_child(p->pid, 10000), 0);
    close(p->to);
    close(p->from);
    free(p->buf);
    free(p->line);
    memset(p, 0, sizeof *p);
}

dlock_semaphore *th_sem(dlock_client *c, const char *name)
{
    dlock_semaphore *s = NULL;
    ASSERT_COK(c, dlock_semaphore_new(c, name, DLOCK_CSTR, &s));
    return s;
}

int64_t th_sem_available(dlock_semaphore *s)
{
    int64_t v = -12345;
    ASSERT_SOK(s, dlock_semaphore_available(s, &v));
    return v;
}

void th_check_semaphore_procs(dlock_client *(*mk)(void), const char *name, int permits,
                              int procs, int rounds)
{
    atomic_int *shm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT(shm != MAP_FAILED);
    atomic_int *cur = &shm[0], *max = &shm[1], *bad = &shm[2], *done = &shm[3];
    atomic_store(cur, 0);
    atomic_store(max, 0);
    atomic_store(bad, 0);
    atomic_store(done, 0);
    pid_t *kids = calloc((size_t)procs, sizeof *kids);
    ASSERT(kids != NULL);
    int64_t t0 = th_now_ms();
    for (int k = 0; k < procs; k++) {
        kids[k] = th_fork();
        if (kids[k] == 0) {
            dlock_client *c = mk();
            dlock_semaphore *s = NULL;
            if (dlock_semaphore_new(c, name, DLOCK_CSTR, &s)) _exit(2);
            int set = 0;
            if (dlock_semaphore_try_set(s, permits, &set)) _exit(3);
            for (int i = 0; i < rounds; i++) {
                if (dlock_semaphore_acquire(s, 1, DLOCK_WAIT_FOREVER)) {
                    fprintf(stderr, "sem acquire: %s\n", dlock_semaphore_errmsg(s));
                    _exit(4);
                }
                int n = atomic_fetch_add(cur, 1) + 1;
                if (n > permits) atomic_store(bad, n);
                int m = atomic_load(max);
                while (n > m && !atomic_compare_exchange_weak(max, &m, n)) {
                }
                /* until permits holders were in at once, a holder stays
                 * until they are (a loaded machine may start the others
                 * late); a semaphore that let fewer in runs out the 20 s */
                int64_t until = th_now_ms() + 20000;
                while (atomic_load(max) < permits && th_now_ms() < until) usleep(2000);
                usleep(30000);
                atomic_fetch_sub(cur, 1);
                if (dlock_semaphore_release(s, 1)) {
                    fprintf(stderr, "sem release: %s\n", dlock_semaphore_errmsg(s));
                    _exit(5);
                }
            }
            atomic_fetch_add(done, set);
            dlock_semaphore_free(s);
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int k = 0; k < procs; k++) ASSERT_EQ(th_wait_child(kids[k], 60000), 0);
    free(kids);
    th_log("semaphore of %d permits, %d processes x %d rounds: at most %d holders at once, "
           "in %lld ms", permits, procs, rounds, atomic_load(max), (long long)(th_now_ms() - t0));
    ASSERT_EQ(atomic_load(bad), 0);
    ASSERT_EQ(atomic_load(max), permits);
    ASSERT_EQ(atomic_load(done), 1); /* try_set: set by exactly one process */
    munmap(shm, 4096);
    dlock_client *c = mk();
    dlock_semaphore *s = th_sem(c, name);
    ASSERT_EQ(th_sem_available(s), permits);
    dlock_semaphore_free(s);
    dlock_client_free(c);
}

/* What a cancel contract waits on: a lock or a semaphore handle. */
typedef struct th_waitable {
    void *h;
    int64_t lease_ms;                       /* a lock's */
    int (*acquire)(struct th_waitable *w, int64_t wait_ms);
    int (*cancel)(void *h);
    const char *(*errmsg)(const void *h);
} th_waitable;

typedef struct th_canceled_wait {
    th_waitable *w;
    int64_t wait_ms;
    int rc;
    int64_t t_done;
    atomic_int done;
} th_canceled_wait;

static void *canceled_wait_main(void *arg) {
    th_canceled_wait *cw = arg;
    cw->rc = cw->w->acquire(cw->w, cw->wait_ms);
    cw->t_done = th_now_ms();
    atomic_store(&cw->done, 1);
    return NULL;
}

/* A wait of wait_ms in another thread, cancelled once it waits: it returns
 * DLOCK_ECANCELED within 1.5 s of the cancel. */
static void cancel_while_waiting(th_waitable *w, int64_t wait_ms) {
    th_canceled_wait cw = {.w = w, .wait_ms = wait_ms, .rc = -1};
    atomic_init(&cw.done, 0);
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, canceled_wait_main, &cw) == 0);
    th_sleep_ms(300);
    ASSERT_MSG(!atomic_load(&cw.done), "the waiter did not wait: %s", dlock_strerror(cw.rc));
    int64_t t0 = th_now_ms();
    ASSERT_EQ(w->cancel(w->h), DLOCK_OK);
    while (!atomic_load(&cw.done) && th_now_ms() - t0 < 10000) th_sleep_ms(5);
    ASSERT_MSG(atomic_load(&cw.done), "the cancelled wait did not end in 10 s");
    ASSERT(pthread_join(t, NULL) == 0);
    ASSERT_MSG(cw.rc == DLOCK_ECANCELED, "cancelled wait: %s: %s", dlock_strerror(cw.rc),
               w->errmsg(w->h));
    ASSERT(strstr(w->errmsg(w->h), "cancel") != NULL);
    th_log("cancel: a %s wait ended %lld ms after the cancel: %s",
           wait_ms == DLOCK_WAIT_FOREVER ? "forever" : "timed", (long long)(cw.t_done - t0),
           w->errmsg(w->h));
    ASSERT_LT(cw.t_done - t0, 1500);
}

/* Cancels from the moment the wait starts (before its statement, watch or
 * queue entry reaches the server, say), repeated every millisecond until
 * the acquire returns, which it does at once with DLOCK_ECANCELED. */
static void cancel_from_start(th_waitable *w) {
    th_canceled_wait cw = {.w = w, .wait_ms = DLOCK_WAIT_FOREVER, .rc = -1};
    atomic_init(&cw.done, 0);
    pthread_t t;
    int64_t t0 = th_now_ms();
    ASSERT(pthread_create(&t, NULL, canceled_wait_main, &cw) == 0);
    while (!atomic_load(&cw.done) && th_now_ms() - t0 < 10000) {
        ASSERT_EQ(w->cancel(w->h), DLOCK_OK);
        th_sleep_ms(1);
    }
    ASSERT_MSG(atomic_load(&cw.done), "the early-cancelled wait did not end in 10 s");
    ASSERT(pthread_join(t, NULL) == 0);
    ASSERT_MSG(cw.rc == DLOCK_ECANCELED, "early-cancelled wait: %s: %s", dlock_strerror(cw.rc),
               w->errmsg(w->h));
    th_log("cancel: a wait cancelled from its start ended after %lld ms",
           (long long)(cw.t_done - t0));
    ASSERT_LT(cw.t_done - t0, 2000);
}

static int lock_acquire_w(th_waitable *w, int64_t wait_ms) {
    return dlock_acquire(w->h, wait_ms, w->lease_ms, NULL);
}
static int lock_cancel_w(void *h) { return dlock_lock_cancel(h); }
static const char *lock_errmsg_w(const void *h) { return dlock_lock_errmsg(h); }

void th_check_lock_cancel(dlock_client *c, const char *name, int64_t lease_ms) {
    dlock_lock *h = th_lock(c, name, DLOCK_KIND_PLAIN);
    dlock_lock *l = th_lock(c, name, DLOCK_KIND_PLAIN);
    th_waitable w = {l, lease_ms, lock_acquire_w, lock_cancel_w, lock_errmsg_w};
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, lease_ms, NULL));
    const int64_t waits[2] = {DLOCK_WAIT_FOREVER, 20000};
    for (int i = 0; i < 2; i++) {
        cancel_while_waiting(&w, waits[i]);
        int held = 0;
        int64_t count = 0;
        ASSERT_LOK(h, dlock_lock_check(h, &held, &count));
        ASSERT_EQ(held, 1);
        ASSERT_LOK(l, dlock_lock_check(l, &held, &count));
        ASSERT_EQ(held, 0);
    }
    cancel_from_start(&w);
    /* a cancel with nothing under way is not for the next acquire */
    ASSERT_LOK(l, dlock_lock_cancel(l));
    int64_t t0 = th_now_ms();
    ASSERT_LCODE(l, dlock_acquire(l, 300, lease_ms, NULL), DLOCK_ETIMEDOUT);
    ASSERT_GE(th_now_ms() - t0, 250);
    ASSERT_LOK(h, dlock_release(h));
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, lease_ms, NULL));
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_lock_free(h);
}

static int sem_acquire_w(th_waitable *w, int64_t wait_ms) {
    return dlock_semaphore_acquire(w->h, 1, wait_ms);
}
static int sem_cancel_w(void *h) { return dlock_semaphore_cancel(h); }
static const char *sem_errmsg_w(const void *h) { return dlock_semaphore_errmsg(h); }

void th_check_semaphore_cancel(dlock_client *c, const char *name) {
    dlock_semaphore *h = th_sem(c, name), *s = th_sem(c, name);
    th_waitable w = {s, 0, sem_acquire_w, sem_cancel_w, sem_errmsg_w};
    int set = 0;
    ASSERT_SOK(h, dlock_semaphore_try_set(h, 1, &set));
    ASSERT_SOK(h, dlock_semaphore_acquire(h, 1, DLOCK_NOWAIT));
    cancel_while_waiting(&w, DLOCK_WAIT_FOREVER);
    ASSERT_EQ(th_sem_available(h), 0);
    cancel_while_waiting(&w, 20000);
    ASSERT_EQ(th_sem_available(h), 0);
    cancel_from_start(&w);
    /* a cancel with nothing under way is not for the next acquire */
    ASSERT_SOK(s, dlock_semaphore_cancel(s));
    int64_t t0 = th_now_ms();
    ASSERT_SCODE(s, dlock_semaphore_acquire(s, 1, 300), DLOCK_ETIMEDOUT);
    ASSERT_GE(th_now_ms() - t0, 250);
    /* nothing left queued: the released permit is there for the next */
    ASSERT_SOK(h, dlock_semaphore_release(h, 1));
    ASSERT_EQ(th_sem_available(h), 1);
    ASSERT_SOK(s, dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT));
    ASSERT_SOK(s, dlock_semaphore_release(s, 1));
    dlock_semaphore_free(s);
    dlock_semaphore_free(h);
}

/* th_proxy_start (harness.h) */
#define PROXY_PAIRS 16
pid_t th_proxy_start(int to, int *port)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT(ls >= 0);
    ASSERT(bind(ls, (struct sockaddr *)&a, sizeof a) == 0);
    ASSERT(listen(ls, 16) == 0);
    ASSERT(getsockname(ls, (struct sockaddr *)&a, &len) == 0);
    *port = ntohs(a.sin_port);
    pid_t pid = th_fork();
    if (pid) {
        close(ls);
        return pid;
    }
    int fds[2 * PROXY_PAIRS], n = 0; /* fds[i] and fds[i ^ 1] are peers */
    for (;;) {
        struct pollfd p[1 + 2 * PROXY_PAIRS];
        p[0].fd = ls;
        p[0].events = POLLIN;
        for (int i = 0; i < n; i++) p[1 + i].fd = fds[i], p[1 + i].events = POLLIN;
        if (poll(p, 1 + n, -1) < 0) continue;
        if ((p[0].revents & POLLIN) && n < 2 * PROXY_PAIRS) {
            int c = accept(ls, NULL, NULL);
            int u = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in t = a;
            t.sin_port = htons((uint16_t)to);
            if (c >= 0 && u >= 0 && connect(u, (struct sockaddr *)&t, sizeof t) == 0) {
                fds[n++] = c;
                fds[n++] = u;
            } else {
                if (c >= 0) close(c);
                if (u >= 0) close(u);
            }
        }
        for (int i = 0; i < n; i++) {
            if (!p[1 + i].revents) continue;
            char buf[16384];
            ssize_t r = read(fds[i], buf, sizeof buf), w = 0;
            while (r > 0 && w < r) {
                ssize_t k = write(fds[i ^ 1], buf + w, (size_t)(r - w));
                if (k <= 0) break;
                w += k;
            }
            if (r <= 0 || w < r) { /* close the pair; the last pair takes its place */
                int pair = i & ~1;
                close(fds[pair]);
                close(fds[pair + 1]);
                fds[pair] = fds[n - 2];
                fds[pair + 1] = fds[n - 1];
                n -= 2;
                break; /* poll again */
            }
        }
    }
}
