/* `dlock run`: run a command while holding a lock.
 *
 * Threads and signals. The library runs its own threads (the watchdog), so
 * the signals dlock handles (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
 * SIGUSR2 and SIGCHLD) are blocked in the main thread before the client is
 * created; every thread created later inherits the mask, and the main thread
 * reads them from a signalfd. The lock is acquired and released by a helper
 * thread (the "locker") so that the main thread stays free to answer a
 * signal while the acquire waits; every operation on the lock handle happens
 * on that one thread. The lost-lease callback runs on the watchdog thread and
 * only writes a byte to a pipe.
 *
 * What is held: one lock (dlock_acquire), several (--also: dlock_multi_acquire,
 * all of one kind, each with the lost-lease callback), or one permit of a
 * permit-expirable semaphore (--limit N: the permit is renewed by the
 * client's watchdog and released by its id; the lost-permit callback writes
 * to the same pipe as the lost-lease one). A backend without those
 * (ZooKeeper, etcd) gives --limit a permit of its semaphore, held by the
 * client's session or a lease it keeps alive, whose lost-permits callback
 * writes to that pipe too. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmds.h"

extern char **environ;

const char help_run[] =
    "Usage: dlock run [OPTIONS] NAME COMMAND [ARGS...]\n"
    "       dlock run [OPTIONS] NAME -c 'SHELL STRING'\n"
    "\n"
    "Acquires the lock NAME, runs COMMAND (through /bin/sh -c with -c), keeps the\n"
    "lease renewed while it runs and releases the lock once it has exited. The\n"
    "exit status is the command's (128+N if killed by signal N). SIGINT, SIGTERM,\n"
    "SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to the command, which\n"
    "runs in a process group of its own (everything it starts gets them), in\n"
    "the terminal's foreground when dlock has it. The command's environment\n"
    "gets DLOCK_NAME and DLOCK_FENCE (the fencing token).\n"
    "If the lock is lost while the command runs (or no renewal was confirmed for\n"
    "nine tenths of the lease), the command gets SIGTERM, then SIGKILL after\n"
    "--kill-after, and dlock exits with 80.\n"
    "\n"
    "Options:\n"
    "  -n, --nonblock       fail at once if the lock is held (exit 1, see -E)\n"
    "  -w, --wait DUR       wait at most DUR for the lock (0: as -n; default: forever)\n"
    "  -E, --conflict-exit-code N\n"
    "                       exit code when -n or -w fails (default 1)\n"
    "  --ttl DUR            lease, renewed every third of it while the command\n"
    "                       runs (default 30s)\n"
    "  --kind KIND          plain (default; the redis-py / redsync / node-redlock\n"
    "                       layout), reentrant (Redisson RLock), fair (Redisson\n"
    "                       RFairLock: first come, first served), read or write\n"
    "                       (the two sides of a Redisson RReadWriteLock)\n"
    "  -s, --shared         the read side of the read-write lock NAME (--kind read)\n"
    "  -x, --exclusive      the write side of the read-write lock NAME (--kind write)\n"
    "  --limit N            let at most N commands run at once: take one permit of\n"
    "                       the permit-expirable semaphore NAME (created with N\n"
    "                       permits by the first run), renewed while the command\n"
    "                       runs; a killed dlock's permit comes back after --ttl.\n"
    "                       The command gets DLOCK_PERMIT (the permit id), no\n"
    "                       DLOCK_FENCE. A lost permit stops the command as a\n"
    "                       lost lock does. On ZooKeeper and etcd: a permit of\n"
    "                       the semaphore NAME, held by dlock's session or lease\n"
    "                       (a killed dlock's comes back when it times out; no\n"
    "                       DLOCK_PERMIT).\n"
    "  --also NAME2         also hold the lock NAME2 (of the same kind); repeat for\n"
    "                       more. All are taken or none, without deadlock against\n"
    "                       runs that list them in another order; DLOCK_FENCE is\n"
    "                       NAME's token\n"
    "  --kill-after DUR     after a lost lock, SIGKILL the command if it has not\n"
    "                       exited DUR after SIGTERM (default 10s)\n"
    "  -c, --command STR    run STR with /bin/sh -c instead of COMMAND [ARGS...]\n"
    "  --label TEXT         a label recorded with the hold, shown by status and\n"
    "                       list (at most 255 bytes, no control characters)\n"
    "  -v, --verbose        also print how long getting the lock took\n"
    "  -q, --quiet          no message when the lock is busy\n";

enum { OPT_TTL = OPT_FIRST_LOCAL_, OPT_KIND, OPT_KILL_AFTER, OPT_LIMIT, OPT_ALSO, OPT_LABEL };

#define CMD "run"
#define LOST_EXPIRED 100 /* our own reason: the validity left reached the margin */
#define LOST_SESSION 101 /* our own reason: a session-kept hold's check said not held */
#define LOST_UNANSWERED 102 /* ... or got no answer */
/* How often a hold kept by a session (MySQL GET_LOCK, PostgreSQL advisory
 * locks: no lease, no renewal, nothing that calls back) is asked about. */
#define SESSION_CHECK_MS 1000
/* A validity this long is a session's (it never runs out by itself). */
#define SESSION_VALID_MS (100LL * 365 * 24 * 3600 * 1000)
#define MSG_MAX 256
#define MAX_ALSO 64

typedef struct run_opts {
    int64_t wait_ms;
    int conflict;
    int64_t ttl_ms;
    dlock_kind kind;
    const char *kind_opt; /* the option that set kind ("--kind", "-s", "-x"), or NULL */
    int64_t kill_after_ms;
    const char *shell; /* -c */
    const char *name;
    char **argv;       /* COMMAND [ARGS...] (NULL with -c) */
    long limit;        /* --limit N, 0: none */
    const char *also[MAX_ALSO]; /* --also NAME2... */
    size_t nalso;
} run_opts;

/* State shared with the locker thread (hand-offs go through the pipes). */
typedef struct locker {
    dlock_lock **locks; /* NAME, then the --also locks (none with --limit) */
    size_t nlocks;
    uint64_t *fences;   /* one per lock */
    dlock_permits *permits; /* --limit */
    dlock_semaphore *sem;   /* --limit where permits belong to a session (ZooKeeper) */
    int64_t limit;
    char permit_id[DLOCK_PERMIT_ID_LEN + 1];
    int64_t wait_ms;
    int acquire_rc;
    uint64_t fence;     /* NAME's fencing token */
    int64_t took_us;
    char acquire_msg[MSG_MAX];
    int release_rc;
    char release_msg[MSG_MAX];
    int cmd_pipe[2];  /* main -> locker: "release now" (or EOF) */
    int done_pipe[2]; /* locker -> main: 'a' acquire done, 'r' release done */
    /* the session checker (session_main) */
    int check_stop[2]; /* main -> checker: stop (a byte, or EOF) */
    int lost_fd;       /* checker -> main: the reason, as the lost callbacks */
    atomic_int session_lost; /* 1 + the index of the lock it found lost, 0 none */
    /* locks kept by a session, set before the checker starts: while it runs
     * it alone touches those handles (a check may mark one lost) */
    unsigned char session_kept[MAX_ALSO + 1];
} locker;

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void write_byte(int fd, char b)
{
    ssize_t r;
    do
        r = write(fd, &b, 1);
    while (r < 0 && errno == EINTR);
}

static int read_byte(int fd, char *b)
{
    ssize_t r;
    do
        r = read(fd, b, 1);
    while (r < 0 && errno == EINTR);
    return r == 1 ? 0 : -1;
}

static void copy_msg(char *dst, const char *src)
{
    snprintf(dst, MSG_MAX, "%s", src ? src : "");
}

/* The message of the first lock that has one (a multi-lock failure leaves
 * it on the lock that failed). */
static const char *locks_errmsg(const locker *lk)
{
    size_t i;
    for (i = 0; i < lk->nlocks; i++) {
        const char *m = dlock_lock_errmsg(lk->locks[i]);
        if (m && *m)
            return m;
    }
    return "";
}

static void *locker_main(void *arg)
{
    locker *lk = arg;
    int64_t t0 = now_us();
    char b;

    if (lk->permits) {
        int set = 0;
        lk->acquire_rc = dlock_permits_try_set(lk->permits, lk->limit, &set);
        if (lk->acquire_rc == DLOCK_OK)
            lk->acquire_rc =
                dlock_permits_acquire(lk->permits, lk->wait_ms, DLOCK_WATCHDOG, lk->permit_id);
        if (lk->acquire_rc != DLOCK_OK)
            copy_msg(lk->acquire_msg, dlock_permits_errmsg(lk->permits));
    } else if (lk->sem) {
        int set = 0;
        lk->acquire_rc = dlock_semaphore_try_set(lk->sem, lk->limit, &set);
        if (lk->acquire_rc == DLOCK_OK)
            lk->acquire_rc = dlock_semaphore_acquire(lk->sem, 1, lk->wait_ms);
        if (lk->acquire_rc != DLOCK_OK)
            copy_msg(lk->acquire_msg, dlock_semaphore_errmsg(lk->sem));
    } else if (lk->nlocks == 1) {
        lk->acquire_rc = dlock_acquire(lk->locks[0], lk->wait_ms, DLOCK_WATCHDOG, &lk->fence);
        if (lk->acquire_rc != DLOCK_OK)
            copy_msg(lk->acquire_msg, dlock_lock_errmsg(lk->locks[0]));
    } else {
        lk->acquire_rc =
            dlock_multi_acquire(lk->locks, lk->nlocks, lk->wait_ms, DLOCK_WATCHDOG, lk->fences);
        if (lk->acquire_rc == DLOCK_OK)
            lk->fence = lk->fences[0];
        else
            copy_msg(lk->acquire_msg, locks_errmsg(lk));
    }
    lk->took_us = now_us() - t0;
    write_byte(lk->done_pipe[1], 'a');
    if (lk->acquire_rc != DLOCK_OK)
        return NULL;
    (void)read_byte(lk->cmd_pipe[0], &b); /* a byte or EOF: release now */
    if (lk->permits) {
        lk->release_rc = dlock_permits_release(lk->permits, lk->permit_id);
        if (lk->release_rc != DLOCK_OK)
            copy_msg(lk->release_msg, dlock_permits_errmsg(lk->permits));
    } else if (lk->sem) {
        lk->release_rc = dlock_semaphore_release(lk->sem, 1);
        if (lk->release_rc != DLOCK_OK)
            copy_msg(lk->release_msg, dlock_semaphore_errmsg(lk->sem));
    } else {
        lk->release_rc = lk->nlocks == 1 ? dlock_release(lk->locks[0])
                                         : dlock_multi_release(lk->locks, lk->nlocks);
        if (lk->release_rc != DLOCK_OK)
            copy_msg(lk->release_msg, locks_errmsg(lk));
    }
    write_byte(lk->done_pipe[1], 'r');
    return NULL;
}

/* A signal came while the locker waits: cancel its wait, so that it leaves
 * the lock's queue or waiter registry (and gives back a lock handed to it
 * meanwhile) instead of leaving a dead entry that others wait behind. If the
 * acquire won the race, release. Bounded by CANCEL_GRACE_MS per step. If a
 * cancel is refused (DLOCK_ENOTSUP), dlock just exits. 1 when the locker
 * thread has said its last word (it returns right after: join it). */
#define CANCEL_GRACE_MS 5000
static int readable_within(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    int n;
    do
        n = poll(&p, 1, ms);
    while (n < 0 && errno == EINTR);
    return n > 0;
}

static int give_up_waiting(locker *lk)
{
    char b;
    if (lk->permits) {
        if (dlock_permits_cancel(lk->permits) != DLOCK_OK)
            return 0;
    } else if (lk->sem) {
        if (dlock_semaphore_cancel(lk->sem) != DLOCK_OK)
            return 0;
    } else {
        for (size_t i = 0; i < lk->nlocks; i++)
            if (dlock_lock_cancel(lk->locks[i]) != DLOCK_OK)
                return 0; /* refused: just exit */
    }
    if (!readable_within(lk->done_pipe[0], CANCEL_GRACE_MS) || read_byte(lk->done_pipe[0], &b))
        return 0;
    if (lk->acquire_rc != DLOCK_OK)
        return 1;
    write_byte(lk->cmd_pipe[1], 'r');
    return readable_within(lk->done_pipe[0], CANCEL_GRACE_MS) &&
           read_byte(lk->done_pipe[0], &b) == 0;
}

/* The session checker: a hold kept by a session (MySQL GET_LOCK, PostgreSQL
 * advisory locks: no lease, no renewal, nothing that calls back) is lost
 * with its session, which tells nobody; this thread asks the server every
 * SESSION_CHECK_MS, apart from the supervising loop (a check can take up to
 * the command timeout when the server does not answer, and signals must be
 * forwarded meanwhile). It reads the handles only; the locker thread is
 * idle while the command runs, and the checker is stopped before the
 * release. */
static void *session_main(void *arg)
{
    locker *lk = arg;
    for (;;) {
        if (readable_within(lk->check_stop[0], SESSION_CHECK_MS))
            return NULL;
        for (size_t i = 0; i < lk->nlocks; i++) {
            if (!lk->session_kept[i])
                continue;
            int held = 0, rc = dlock_lock_check(lk->locks[i], &held, NULL);
            if (rc == DLOCK_OK && held)
                continue;
            atomic_store(&lk->session_lost, (int)i + 1); /* before the pipe's byte */
            write_byte(lk->lost_fd,
                       (char)(rc == DLOCK_OK || rc == DLOCK_ELOST ? LOST_SESSION : LOST_UNANSWERED));
            return NULL;
        }
    }
}

/* The lost-lease callback (watchdog thread): only a pipe write. */
static void on_lost(dlock_lock *l, int reason, void *userdata)
{
    int fd = *(const int *)userdata;
    (void)l;
    write_byte(fd, (char)reason);
}

/* The lost-permit callbacks (--limit; watchdog or session thread): the same. */
static void on_permit_lost(dlock_permits *p, const char *id, int reason, void *userdata)
{
    int fd = *(const int *)userdata;
    (void)p, (void)id;
    write_byte(fd, (char)reason);
}

static void on_sem_lost(dlock_semaphore *s, int reason, void *userdata)
{
    int fd = *(const int *)userdata;
    (void)s;
    write_byte(fd, (char)reason);
}

static int parse_args(int argc, char **argv, cli_global *g, run_opts *o)
{
    static const struct option longopts[] = {
        CLI_GLOBAL_LONGOPTS,
        {"nonblock", no_argument, NULL, 'n'},
        {"nb", no_argument, NULL, 'n'},
        {"wait", required_argument, NULL, 'w'},
        {"timeout-wait", required_argument, NULL, 'w'},
        {"conflict-exit-code", required_argument, NULL, 'E'},
        {"ttl", required_argument, NULL, OPT_TTL},
        {"kind", required_argument, NULL, OPT_KIND},
        {"kill-after", required_argument, NULL, OPT_KILL_AFTER},
        {"command", required_argument, NULL, 'c'},
        {"shared", no_argument, NULL, 's'},
        {"exclusive", no_argument, NULL, 'x'},
        {"limit", required_argument, NULL, OPT_LIMIT},
        {"also", required_argument, NULL, OPT_ALSO},
        {"label", required_argument, NULL, OPT_LABEL},
        {NULL, 0, NULL, 0}};
    int opt, rc;
    long n;
    size_t i, j;

    optind = 0;
    /* "+": stop at NAME, so that the command's own options are left alone */
    while ((opt = getopt_long(argc, argv, "+:nw:E:c:sx" CLI_GLOBAL_SHORTOPTS, longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 'n':
            o->wait_ms = DLOCK_NOWAIT;
            break;
        case 'w':
            if ((rc = cli_duration(CMD, "--wait", optarg, 0, &o->wait_ms)))
                return rc;
            break;
        case 'E':
            if ((rc = cli_integer(CMD, "--conflict-exit-code", optarg, 0, 255, &n)))
                return rc;
            o->conflict = (int)n;
            break;
        case OPT_TTL:
            if ((rc = cli_duration(CMD, "--ttl", optarg, 1, &o->ttl_ms)))
                return rc;
            break;
        case OPT_KIND:
        case 's':
        case 'x': {
            dlock_kind k = opt == 's' ? DLOCK_KIND_READ : DLOCK_KIND_WRITE;
            const char *what = opt == 's' ? "-s" : opt == 'x' ? "-x" : "--kind";
            if (opt == OPT_KIND && (rc = cli_kind(CMD, optarg, &k)))
                return rc;
            if (o->kind_opt && k != o->kind)
                return cli_usage(CMD, "%s conflicts with %s: give one kind", what, o->kind_opt);
            o->kind = k;
            o->kind_opt = what;
            break;
        }
        case OPT_LIMIT:
            if ((rc = cli_integer(CMD, "--limit", optarg, 1, 1000000000L, &o->limit)))
                return rc;
            break;
        case OPT_ALSO:
            if ((rc = cli_check_name(CMD, optarg)))
                return rc;
            if (o->nalso >= MAX_ALSO)
                return cli_usage(CMD, "--also: at most %d more locks", MAX_ALSO);
            o->also[o->nalso++] = optarg;
            break;
        case OPT_KILL_AFTER:
            if ((rc = cli_duration(CMD, "--kill-after", optarg, 0, &o->kill_after_ms)))
                return rc;
            break;
        case 'c':
            o->shell = optarg;
            break;
        case OPT_LABEL:
            if ((rc = cli_check_label(CMD, optarg)))
                return rc;
            g->label = optarg;
            break;
        default:
            rc = cli_common_opt(g, CMD, opt, argv);
            if (rc == CLI_WANT_HELP) {
                cli_print_help(stdout, CMD);
                return CLI_WANT_HELP;
            }
            if (rc)
                return rc;
        }
    }
    if (optind >= argc)
        return cli_usage(CMD, "missing lock NAME");
    o->name = argv[optind++];
    if ((rc = cli_check_name(CMD, o->name)))
        return rc;
    if (o->limit && o->kind_opt)
        return cli_usage(CMD, "--limit takes a semaphore permit; it cannot go with %s",
                         o->kind_opt);
    if (o->limit && o->nalso)
        return cli_usage(CMD, "--limit cannot go with --also");
    if (o->limit && cli_is_redlock(g))
        return cli_usage(CMD, "--limit: semaphores do not work with RedLock (several --url)");
    for (i = 0; i < o->nalso; i++) {
        if (strcmp(o->also[i], o->name) == 0)
            return cli_usage(CMD, "--also: '%s' is NAME itself", o->also[i]);
        for (j = 0; j < i; j++)
            if (strcmp(o->also[i], o->also[j]) == 0)
                return cli_usage(CMD, "--also: '%s' is given twice", o->also[i]);
    }
    if (!o->shell && optind < argc &&
        (strcmp(argv[optind], "-c") == 0 || strcmp(argv[optind], "--command") == 0)) {
        if (optind + 1 >= argc)
            return cli_usage(CMD, "option '%s' needs an argument", argv[optind]);
        o->shell = argv[optind + 1];
        optind += 2;
    } else if (optind < argc && strcmp(argv[optind], "--") == 0) {
        optind++;
    } else if (optind < argc && argv[optind][0] == '-' && argv[optind][1]) {
        /* getopt stopped at NAME: an option here would be taken for the
         * command */
        return cli_usage(CMD, "option '%s' after NAME: give options before NAME (a COMMAND "
                         "that starts with '-' goes after --)", argv[optind]);
    }
    if (o->shell) {
        if (optind < argc)
            return cli_usage(CMD, "unexpected argument '%s' after -c", argv[optind]);
        return 0;
    }
    if (optind >= argc)
        return cli_usage(CMD, "missing COMMAND (or -c 'SHELL STRING')");
    o->argv = argv + optind;
    return 0;
}

/* Whether execvp(file) could run: 0, or the errno it would fail with
 * (ENOENT: not found; EACCES: found, not executable). As execvp: a name
 * with a '/' is a path, others are looked up in $PATH (unset: confstr's
 * default path). Checked before the lock is taken, so that a command that
 * cannot run is reported at once instead of after waiting for the lock. */
static int exec_check(const char *file)
{
    const char *path = getenv("PATH");
    char dflt[256], buf[4096];
    int seen_eacces = 0;
    struct stat st;
    if (!*file)
        return ENOENT;
    if (strchr(file, '/')) {
        if (stat(file, &st) != 0)
            return errno;
        if (S_ISDIR(st.st_mode) || access(file, X_OK) != 0)
            return EACCES;
        return 0;
    }
    if (!path) {
        if (confstr(_CS_PATH, dflt, sizeof dflt) == 0 || strlen(dflt) >= sizeof dflt - 1)
            snprintf(dflt, sizeof dflt, "/bin:/usr/bin");
        path = dflt;
    }
    while (path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        /* an empty entry is the current directory */
        if (snprintf(buf, sizeof buf, "%.*s%s%s", (int)len, path, len ? "/" : "", file) <
                (int)sizeof buf &&
            stat(buf, &st) == 0) {
            if (!S_ISDIR(st.st_mode) && access(buf, X_OK) == 0)
                return 0;
            seen_eacces = 1;
        }
        path = end ? end + 1 : NULL;
    }
    return seen_eacces ? EACCES : ENOENT;
}

/* The child's environment: ours without DLOCK_NAME/DLOCK_FENCE/DLOCK_PERMIT,
 * plus DLOCK_NAME and either DLOCK_FENCE or (with a permit) DLOCK_PERMIT. */
static char **child_env(const char *name, uint64_t fence, const char *permit)
{
    size_t n = 0, i, j = 0;
    char **env;
    size_t namelen = strlen(name);
    while (environ && environ[n])
        n++;
    env = calloc(n + 3, sizeof *env);
    if (!env)
        return NULL;
    for (i = 0; i < n; i++) {
        if (strncmp(environ[i], "DLOCK_NAME=", 11) == 0 ||
            strncmp(environ[i], "DLOCK_FENCE=", 12) == 0 ||
            strncmp(environ[i], "DLOCK_PERMIT=", 13) == 0)
            continue;
        env[j++] = environ[i];
    }
    env[j] = malloc(namelen + 12);
    env[j + 1] = malloc(48);
    if (!env[j] || !env[j + 1]) {
        free(env[j]);
        free(env[j + 1]);
        free(env);
        return NULL;
    }
    memcpy(env[j], "DLOCK_NAME=", 11);
    memcpy(env[j] + 11, name, namelen + 1);
    if (permit)
        snprintf(env[j + 1], 48, "DLOCK_PERMIT=%s", permit);
    else
        snprintf(env[j + 1], 48, "DLOCK_FENCE=%" PRIu64, fence);
    env[j + 2] = NULL;
    return env;
}

static void free_env(char **env)
{
    size_t n = 0;
    if (!env)
        return;
    while (env[n])
        n++;
    /* the last two entries are ours */
    if (n >= 2) {
        free(env[n - 1]);
        free(env[n - 2]);
    }
    free(env);
}

typedef struct child_setup {
    const run_opts *o;
    char **env;
    sigset_t oldmask;
    struct sigaction oldpipe;
    pid_t parent;
    int errfd;  /* write end of the exec-error pipe (close-on-exec) */
    int tty;    /* the terminal whose foreground the command takes, or -1 */
    int pdeath; /* no reaper: SIGTERM the command itself when dlock dies */
} child_setup;

/* In the child, between fork and exec: async-signal-safe calls only. */
static void child_exec(const child_setup *cs)
{
    int err;
    /* A process group of its own, so that what stops the command reaches
     * everything it started (pipelines, forks): dlock signals the group. */
    (void)setpgid(0, 0);
    if (cs->tty >= 0) {
        /* the terminal's foreground, as a shell gives it to a job (the
         * parent does the same; whichever runs first wins). From a
         * background group this needs SIGTTOU blocked. */
        sigset_t ttou;
        sigemptyset(&ttou);
        sigaddset(&ttou, SIGTTOU);
        sigprocmask(SIG_BLOCK, &ttou, NULL);
        (void)tcsetpgrp(cs->tty, getpid());
    }
    if (cs->pdeath) {
        /* If dlock dies, nobody renews the lease: stop the command too. */
        (void)prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != cs->parent)
            _exit(128 + SIGTERM);
    }
    sigaction(SIGPIPE, &cs->oldpipe, NULL);
    sigprocmask(SIG_SETMASK, &cs->oldmask, NULL);
    if (cs->o->shell) {
        char *sh_argv[] = {"sh", "-c", (char *)cs->o->shell, NULL};
        execve("/bin/sh", sh_argv, cs->env);
    } else {
        execvpe(cs->o->argv[0], cs->o->argv, cs->env);
    }
    err = errno;
    {
        ssize_t r = write(cs->errfd, &err, sizeof err);
        (void)r;
    }
    _exit(err == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC);
}

/* The group exists and has a member (a zombie counts until reaped). */
static int group_alive(pid_t pg)
{
    return kill(-pg, 0) == 0 || errno == EPERM;
}

/* Sends sig to every process under dlock that is not in the command's
 * process group pg (those a signal to the group reaches: sent twice, a
 * SIGTERM would also stop what a trap of the command starts) and is not
 * skip (the reaper): the processes that left the group (setsid), read from
 * /proc/<pid>/task/<tid>/children; once their parent is gone they are
 * dlock's children (dlock is a subreaper). Returns how many processes are
 * under dlock but skip, in the group or not (sig 0: only counts them). */
#define TREE_MAX 4096
static int signal_tree(pid_t pg, pid_t skip, int sig)
{
    static pid_t q[TREE_MAX];
    int head = 0, tail = 0, n = 0;
    q[tail++] = getpid();
    while (head < tail) {
        pid_t p = q[head++];
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/task", (long)p);
        DIR *d = opendir(path);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char cpath[96];
            snprintf(cpath, sizeof cpath, "/proc/%ld/task/%.20s/children", (long)p, e->d_name);
            /* the whole list first: a process killed while its list is
             * read hands the rest of it to dlock, read already */
            int fd = open(cpath, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            static char buf[65536];
            size_t len = 0;
            ssize_t r;
            while (len < sizeof buf - 1 && (r = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
                len += (size_t)r;
            close(fd);
            buf[len] = '\0';
            int first = tail;
            for (char *cp = buf, *end; *cp; cp = end) {
                long c = strtol(cp, &end, 10);
                if (end == cp)
                    break;
                if ((pid_t)c != skip && tail < TREE_MAX)
                    q[tail++] = (pid_t)c;
                if ((pid_t)c != skip)
                    n++;
            }
            for (int k = first; sig && k < tail; k++)
                if (getpgid(q[k]) != pg)
                    (void)kill(q[k], sig);
        }
        closedir(d);
    }
    return n;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* The reaper: a process in a session of its own that outlives dlock to stop
 * the command's process group when dlock dies without saying so (SIGKILL, a
 * crash). It reads the group id, then waits for one byte (dlock is done:
 * exit) or end of file (dlock is gone: SIGTERM and SIGCONT to the group,
 * SIGKILL after --kill-after if any of it is left). It ignores the signals
 * that reach dlock's group or a terminal's, and keeps no other descriptor,
 * so that it holds no connection to the server open. Forked from a threaded
 * process: async-signal-safe calls only. */
static void reaper_main(int fd, int64_t kill_after_ms)
{
    static const int ignored[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGUSR1,
                                  SIGUSR2, SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE};
    struct sigaction sa;
    pid_t pg = 0;
    int64_t waited = 0;
    size_t i;
    char b;
    int n;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    for (i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        sigaction(ignored[i], &sa, NULL);
    (void)setsid();
    if (fd != 0) {
        (void)dup2(fd, 0);
        fd = 0;
    }
    for (n = 1; n < 4096; n++)
        (void)close(n);
    if (read(fd, &pg, sizeof pg) != (ssize_t)sizeof pg || pg <= 0)
        _exit(0);
    do
        n = (int)read(fd, &b, 1);
    while (n < 0 && errno == EINTR);
    if (n == 1)
        _exit(0); /* dlock is done with the command */
    (void)kill(-pg, SIGTERM);
    (void)kill(-pg, SIGCONT);
    while (waited < kill_after_ms && group_alive(pg)) {
        sleep_ms(20);
        waited += 20;
    }
    (void)kill(-pg, SIGKILL);
    _exit(0);
}

/* Starts the reaper; its pid (and *fd, the pipe to it), or -1. */
static pid_t start_reaper(const run_opts *o, int *fd)
{
    int p[2];
    pid_t pid;
    *fd = -1;
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        close(p[1]);
        reaper_main(p[0], o->kill_after_ms); /* does not return */
    }
    close(p[0]);
    if (pid < 0) {
        close(p[1]);
        return -1;
    }
    *fd = p[1];
    return pid;
}

/* The terminal dlock may give to the command: the first of stdin, stdout
 * and stderr that is a terminal whose foreground process group is dlock's
 * (dlock runs in the foreground); -1 if none. */
static int owned_tty(void)
{
    int fd;
    for (fd = 0; fd < 3; fd++)
        if (isatty(fd))
            return tcgetpgrp(fd) == getpgrp() ? fd : -1;
    return -1;
}

static int has_tty(void)
{
    return isatty(0) || isatty(1) || isatty(2);
}

static int status_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return EXIT_INTERNAL;
}

static const char *lost_reason(int reason)
{
    switch (reason) {
    case DLOCK_LOST_TAKEN:
        return "the renewal found it expired or taken over";
    case DLOCK_LOST_UNREACHABLE:
        return "the server was unreachable for longer than the lease";
    case LOST_EXPIRED:
        return "no renewal was confirmed for nine tenths of the lease";
    case LOST_SESSION:
        return "the server no longer keeps the session that held it";
    case LOST_UNANSWERED:
        return "the server did not answer a check of the session that holds it";
    default:
        return "the lease was lost";
    }
}

static void fmt_secs(char *buf, size_t len, int64_t ms)
{
    snprintf(buf, len, "%lld.%03llds", (long long)(ms / 1000), (long long)(ms % 1000));
}

/* Runs the child under the held lock; returns the exit code.
 *
 * The command runs in a process group of its own (as GNU timeout runs it),
 * and every signal dlock sends goes to that group: forwarded signals, and
 * after a lost lock SIGTERM (with SIGCONT), then SIGKILL after --kill-after
 * to whatever of the group is left, even once the command itself has
 * exited. dlock is a child subreaper, so that the command's orphans are
 * reaped here and an empty group is seen as such. If dlock runs in the
 * foreground of a terminal, the command's group gets the terminal's
 * foreground while it runs, as a shell gives it to a job: ^C reaches the
 * command once (from the terminal; dlock, in the background then, gets
 * nothing to forward), and the command can read the terminal. A command
 * stopped from the terminal (^Z, or a read or write from the background)
 * stops dlock too, so that its shell gets the terminal back; when dlock is
 * continued it continues the command (in the foreground if it is). A
 * reaper process stops the group if dlock dies without saying so. */
static int supervise(cli_global *g, const run_opts *o, locker *lk, int sigfd, int lostfd,
                     const sigset_t *oldmask, const struct sigaction *oldpipe)
{
    child_setup cs;
    int errpipe[2], reapfd = -1;
    pid_t pid, reaper;
    int status = 0, exec_err = 0, lost = 0, code, done = 0, cont = 0;
    int64_t kill_at = -1;
    ssize_t r;
    size_t i;
    const char *lost_name = o->name;
    int64_t margin = DLOCK_LOST_MARGIN_MS(o->ttl_ms);

    memset(&cs, 0, sizeof cs);
    cs.o = o;
    cs.oldmask = *oldmask;
    cs.oldpipe = *oldpipe;
    cs.parent = getpid();
#ifdef DLOCK_CLI_FUZZ
    /* The fuzz target runs the tool in-process against an address where
     * nothing listens, so no lock is ever held and this is never reached;
     * should it be, no child is started (forking in a fuzzer is slow). */
    cli_err(CMD, "fuzz build: no command is started");
    return EXIT_OSERR;
#endif
    cs.env = child_env(o->name, lk->fence, lk->permits ? lk->permit_id : NULL);
    if (!cs.env) {
        cli_err(CMD, "out of memory");
        return EXIT_INTERNAL;
    }
    if (pipe2(errpipe, O_CLOEXEC) != 0) {
        cli_err(CMD, "pipe: %s", strerror(errno));
        free_env(cs.env);
        return EXIT_OSERR;
    }
    cs.errfd = errpipe[1];
    cs.tty = owned_tty();
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
    fflush(NULL);
    reaper = start_reaper(o, &reapfd);
    cs.pdeath = reaper < 0;
    if (reaper < 0 && g->verbose)
        cli_err(CMD, "cannot start the reaper (%s): if dlock is killed, only the command's "
                "first process is stopped", strerror(errno));
    pid = fork();
    if (pid < 0) {
        cli_err(CMD, "fork: %s", strerror(errno));
        close(errpipe[0]);
        close(errpipe[1]);
        free_env(cs.env);
        if (reapfd >= 0) {
            write_byte(reapfd, 'd');
            close(reapfd);
        }
        return EXIT_OSERR;
    }
    if (pid == 0)
        child_exec(&cs); /* does not return */
    (void)setpgid(pid, pid); /* as the child does: whichever runs first */
    if (cs.tty >= 0)
        (void)tcsetpgrp(cs.tty, pid); /* SIGTTOU is blocked (cmd_run) */
    if (reapfd >= 0) {
        ssize_t wr = write(reapfd, &pid, sizeof pid);
        (void)wr;
    }
    close(errpipe[1]);
    free_env(cs.env);
    do
        r = read(errpipe[0], &exec_err, sizeof exec_err);
    while (r < 0 && errno == EINTR);
    close(errpipe[0]);
    if (r == (ssize_t)sizeof exec_err) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        cli_err(CMD, "cannot run '%s': %s", o->shell ? "/bin/sh" : o->argv[0],
                strerror(exec_err));
        code = exec_err == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC;
        goto out;
    }
    if (g->verbose)
        cli_err(CMD, "started command, pid %ld (process group %ld%s)", (long)pid, (long)pid,
                cs.tty >= 0 ? ", in the terminal's foreground" : "");

    for (;;) {
        struct pollfd pfd[2];
        int timeout = 1000, st;
        pid_t w;
        /* the command, a stop of it, the reaper, or an orphan of the group */
        while ((w = waitpid(-1, &st, WNOHANG | WUNTRACED)) > 0) {
            if (w == reaper && !WIFSTOPPED(st)) {
                reaper = -1; /* killed: nothing to do about it */
            } else if (w == pid && WIFSTOPPED(st)) {
                int sig = WSTOPSIG(st);
                if ((sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU) && has_tty() &&
                    !done) {
                    /* stopped from the terminal: stop as its job, so that
                     * its shell gets the terminal back */
                    if (cs.tty >= 0 && tcgetpgrp(cs.tty) == pid)
                        (void)tcsetpgrp(cs.tty, getpgrp());
                    if (g->verbose)
                        cli_err(CMD, "the command stopped (signal %d); stopping too", sig);
                    kill(getpid(), SIGSTOP);
                    /* continued (fg or bg) */
                    cs.tty = owned_tty();
                    if (cs.tty >= 0)
                        (void)tcsetpgrp(cs.tty, pid);
                    cont = 1; /* once the lock is checked below */
                }
            } else if (w == pid) {
                status = st;
                done = 1;
            }
        }
        /* after a lost lock, dlock ends once nothing it started is left */
        if (done && (!lost || (!group_alive(pid) && !signal_tree(pid, reaper, 0))))
            break;
        for (i = 0; i < lk->nlocks && !lost; i++) {
            if (dlock_lock_is_lost(lk->locks[i])) {
                char b = 0;
                (void)read_byte(lostfd, &b); /* non-blocking: the reason, if written */
                lost = b ? (unsigned char)b : -1;
                lost_name = (i ? o->also[i - 1] : o->name);
            }
        }
        for (i = 0; i < lk->nlocks + (lk->permits != NULL) && !lost; i++) {
            /* What holds the lock or permit is its validity, whatever the
             * callbacks say: with no renewal confirmed (a server cut off,
             * frozen, or a renewal stuck), the command is stopped a margin
             * before the server can expire the hold, so that it has stopped
             * before another holder starts. A permit is supervised as a lock
             * is. The locker thread is idle now, so reading the handles here
             * is safe. */
            if (i < lk->nlocks && lk->session_kept[i])
                continue; /* the checker thread watches it (and alone reads it) */
            int64_t valid = i < lk->nlocks ? dlock_lock_valid_ms(lk->locks[i])
                                           : dlock_permits_valid_ms(lk->permits, lk->permit_id);
            if (i < lk->nlocks && valid > SESSION_VALID_MS)
                continue; /* kept by a session, with no checker (it could not start) */
            int64_t left = valid - margin;
            if (left <= 0) {
                lost = LOST_EXPIRED;
                lost_name = (i && i < lk->nlocks ? o->also[i - 1] : o->name);
            } else if (left < timeout) {
                timeout = (int)left + 1;
            }
        }
        if (lost && kill_at == -1) {
            char ka[32];
            fmt_secs(ka, sizeof ka, o->kill_after_ms);
            cli_err(CMD, "%s '%s' lost while the command ran: %s; sending SIGTERM to its "
                    "process group %ld (SIGKILL after %s)",
                    lk->permits || lk->sem ? "permit of" : "lock", lost_name, lost_reason(lost),
                    (long)pid, ka);
            kill(-pid, SIGTERM);
            kill(-pid, SIGCONT); /* a stopped process would not see the SIGTERM */
            signal_tree(pid, reaper, SIGTERM); /* and what left the group */
            signal_tree(pid, reaper, SIGCONT);
            cont = 0;
            kill_at = now_us() / 1000 + o->kill_after_ms;
        }
        if (cont) {
            kill(-pid, SIGCONT);
            cont = 0;
        }
        if (kill_at == -2) {
            /* what escaped the last round (a process handed to dlock while
             * its parent's list was read, more than TREE_MAX of them) */
            kill(-pid, SIGKILL);
            signal_tree(pid, reaper, SIGKILL);
            if (timeout > 20)
                timeout = 20;
        }
        if (kill_at >= 0) {
            int64_t rem = kill_at - now_us() / 1000;
            if (rem <= 0) {
                if (g->verbose)
                    cli_err(CMD, "sending SIGKILL to process group %ld", (long)pid);
                kill(-pid, SIGKILL);
                signal_tree(pid, reaper, SIGKILL);
                kill_at = -2; /* done: from now on, every round kills what is left */
                continue;
            }
            if (rem < timeout)
                timeout = (int)rem;
        }
        if (done && timeout > 20)
            timeout = 20; /* the command is gone; what it left is polled for */
        pfd[0].fd = sigfd;
        pfd[0].events = POLLIN;
        pfd[1].fd = lostfd;
        pfd[1].events = POLLIN;
        if (poll(pfd, 2, timeout) < 0 && errno != EINTR) {
            cli_err(CMD, "poll: %s", strerror(errno));
            code = EXIT_OSERR;
            goto out;
        }
        if (pfd[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (si.ssi_signo == SIGCHLD || done)
                    continue;
                if (g->verbose)
                    cli_err(CMD, "forwarding signal %u to process group %ld", si.ssi_signo,
                            (long)pid);
                kill(-pid, (int)si.ssi_signo);
            }
        }
        if (!lost && (pfd[1].revents & POLLIN)) {
            char b = 0;
            (void)read_byte(lostfd, &b);
            lost = b ? (unsigned char)b : -1;
            for (i = 0; i < lk->nlocks; i++)
                if (dlock_lock_is_lost(lk->locks[i]))
                    lost_name = (i ? o->also[i - 1] : o->name);
            int sl = atomic_load(&lk->session_lost);
            if ((lost == LOST_SESSION || lost == LOST_UNANSWERED) && sl >= 1)
                lost_name = sl > 1 ? o->also[sl - 2] : o->name;
        }
    }
    code = status_code(status);
    if (g->verbose)
        cli_err(CMD, "command exited with status %d", code);
    if (lost)
        code = EXIT_LOST;
out:
    /* the terminal back to dlock's group, if the command's still has it */
    if (cs.tty >= 0 && tcgetpgrp(cs.tty) == pid)
        (void)tcsetpgrp(cs.tty, getpgrp());
    if (reapfd >= 0) {
        write_byte(reapfd, 'd'); /* done: the reaper exits */
        close(reapfd);
    }
    if (reaper > 0)
        while (waitpid(reaper, NULL, 0) < 0 && errno == EINTR)
            ;
    return code;
}

/* The command line recorded with the hold (dlock_client_set_identity):
 * the command's arguments joined by spaces, or the -c string as given; the
 * library keeps its first 255 bytes. */
static void command_line(const run_opts *o, char *buf, size_t len)
{
    size_t n = 0, i;
    buf[0] = '\0';
    if (o->shell) {
        snprintf(buf, len, "%s", o->shell);
        return;
    }
    for (i = 0; o->argv[i] && n + 1 < len; i++) {
        int w = snprintf(buf + n, len - n, "%s%s", i ? " " : "", o->argv[i]);
        if (w < 0)
            break;
        n += (size_t)w;
    }
}

int cmd_run(int argc, char **argv, cli_global *g)
{
    run_opts o;
    locker lk;
    dlock_client *c = NULL;
    pthread_t th;
    int started = 0, rc, code = 0, sigfd = -1, lostpipe[2] = {-1, -1};
    sigset_t set, oldmask;
    struct sigaction ign, oldpipe;
    char b;
    dlock_lock *locks[MAX_ALSO + 1];
    uint64_t fences[MAX_ALSO + 1];
    char what[160], cmdline[CLI_LABEL_MAX + 2];
    size_t i;

    memset(&o, 0, sizeof o);
    o.wait_ms = DLOCK_WAIT_FOREVER;
    o.conflict = EXIT_CONFLICT_DEFAULT;
    o.ttl_ms = DLOCK_DEFAULT_WATCHDOG_MS;
    o.kind = DLOCK_KIND_PLAIN;
    o.kill_after_ms = 10000;
    rc = parse_args(argc, argv, g, &o);
    if (rc == CLI_WANT_HELP)
        return 0;
    if (rc)
        return rc;
    if (o.argv && (rc = exec_check(o.argv[0])) != 0) {
        cli_err(CMD, "cannot run '%s': %s", o.argv[0], strerror(rc));
        return rc == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC;
    }

    memset(&lk, 0, sizeof lk);
    memset(locks, 0, sizeof locks);
    lk.cmd_pipe[0] = lk.cmd_pipe[1] = lk.done_pipe[0] = lk.done_pipe[1] = -1;
    lk.wait_ms = o.wait_ms;
    lk.locks = locks;
    lk.fences = fences;
    lk.limit = o.limit;
    if (o.limit)
        snprintf(what, sizeof what, "a permit of semaphore '%s'", o.name);
    else if (o.nalso)
        snprintf(what, sizeof what, "lock '%s' and %zu --also lock%s", o.name, o.nalso,
                 o.nalso > 1 ? "s" : "");
    else
        snprintf(what, sizeof what, "lock '%s'", o.name);

    /* Block the handled signals before any thread exists (see the top). */
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    sigaddset(&set, SIGCHLD);
    pthread_sigmask(SIG_BLOCK, &set, &oldmask);
    {
        /* SIGTTOU too, apart from the signalfd: giving the terminal's
         * foreground away and taking it back from the background
         * (tcsetpgrp) needs it blocked, and dlock's own messages are then
         * written whatever the terminal's tostop says */
        sigset_t ttou;
        sigemptyset(&ttou);
        sigaddset(&ttou, SIGTTOU);
        pthread_sigmask(SIG_BLOCK, &ttou, NULL);
    }
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &oldpipe);

    sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0 || pipe2(lostpipe, O_CLOEXEC | O_NONBLOCK) != 0 ||
        pipe2(lk.cmd_pipe, O_CLOEXEC) != 0 || pipe2(lk.done_pipe, O_CLOEXEC) != 0) {
        cli_err(CMD, "cannot set up signals and pipes: %s", strerror(errno));
        code = EXIT_OSERR;
        goto out;
    }

    /* Renewals must not wait on a frozen server longer than a third of the
     * lease: bound the command timeout by it unless --timeout was given. */
    if (g->timeout_ms == 0 && o.ttl_ms / 3 < DLOCK_DEFAULT_COMMAND_TIMEOUT_MS) {
        g->timeout_ms = o.ttl_ms / 3 > 100 ? o.ttl_ms / 3 : 100;
        g->connect_timeout_ms = DLOCK_DEFAULT_CONNECT_TIMEOUT_MS;
    }
    if ((code = cli_connect(g, CMD, o.ttl_ms, &c)))
        goto out;
    command_line(&o, cmdline, sizeof cmdline);
    if ((code = cli_set_identity(g, CMD, c, cmdline)))
        goto out;
    if (o.limit) {
        rc = dlock_permits_new(c, o.name, DLOCK_CSTR, &lk.permits);
        if (rc == DLOCK_OK)
            dlock_permits_on_lost(lk.permits, on_permit_lost, &lostpipe[1]);
        /* no expirable permits (ZooKeeper): a semaphore whose permits
         * belong to this client's session, which ends with the process */
        if (rc == DLOCK_ENOTSUP &&
            dlock_semaphore_new(c, o.name, DLOCK_CSTR, &lk.sem) == DLOCK_OK) {
            dlock_semaphore_on_lost(lk.sem, on_sem_lost, &lostpipe[1]);
            rc = DLOCK_OK;
        }
    } else {
        rc = DLOCK_OK;
        for (i = 0; i <= o.nalso && rc == DLOCK_OK; i++) {
            rc = dlock_lock_new(c, i ? o.also[i - 1] : o.name, DLOCK_CSTR, o.kind, &locks[i]);
            if (rc == DLOCK_OK) {
                dlock_lock_on_lost(locks[i], on_lost, &lostpipe[1]);
                lk.nlocks++;
            }
        }
    }
    if (rc != DLOCK_OK) {
        cli_err(CMD, "%s", dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        code = cli_exit_code(rc, EXIT_INTERNAL);
        goto out;
    }

    if ((rc = pthread_create(&th, NULL, locker_main, &lk)) != 0) {
        cli_err(CMD, "cannot start a thread: %s", strerror(rc));
        code = EXIT_OSERR;
        goto out;
    }
    started = 1;

    /* Wait for the acquire; a signal meanwhile ends dlock, after cancelling
     * the wait (give_up_waiting: nothing is left queued or held). */
    for (;;) {
        struct pollfd pfd[2] = {{lk.done_pipe[0], POLLIN, 0}, {sigfd, POLLIN, 0}};
        if (poll(pfd, 2, -1) < 0 && errno != EINTR) {
            cli_err(CMD, "poll: %s", strerror(errno));
            _exit(EXIT_OSERR);
        }
        if (pfd[0].revents)
            break;
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (si.ssi_signo == SIGCHLD)
                    continue;
                if (g->verbose)
                    cli_err(CMD, "signal %u while waiting for %s; giving up", si.ssi_signo,
                            what);
                if (give_up_waiting(&lk))
                    pthread_join(th, NULL);
                _exit(128 + (int)si.ssi_signo);
            }
        }
    }
    (void)read_byte(lk.done_pipe[0], &b);

    rc = lk.acquire_rc;
    if (rc == DLOCK_EBUSY || rc == DLOCK_ETIMEDOUT) {
        if (rc == DLOCK_EBUSY && o.limit)
            cli_info(g, CMD, "all permits of semaphore '%s' are taken", o.name);
        else if (rc == DLOCK_EBUSY && o.nalso)
            cli_info(g, CMD, "%s: one is held by another owner", what);
        else if (rc == DLOCK_EBUSY)
            cli_info(g, CMD, "%s", lk.acquire_msg[0] ? lk.acquire_msg : "the lock is held");
        else {
            char w[32];
            fmt_secs(w, sizeof w, o.wait_ms);
            cli_info(g, CMD, "timed out after %s waiting for %s", w, what);
        }
        code = o.conflict;
        goto out;
    }
    if (rc != DLOCK_OK) {
        cli_err(CMD, "cannot acquire %s: %s", what,
                lk.acquire_msg[0] ? lk.acquire_msg : dlock_strerror(rc));
        code = cli_exit_code(rc, o.conflict);
        goto out;
    }
    if (g->verbose && o.limit)
        cli_err(CMD, "getting %s took %lld.%06lld seconds (permit %s)", what,
                (long long)(lk.took_us / 1000000), (long long)(lk.took_us % 1000000),
                lk.permits ? lk.permit_id : "held by the session");
    else if (g->verbose)
        cli_err(CMD, "getting %s took %lld.%06lld seconds (fence %" PRIu64 ", token %s)", what,
                (long long)(lk.took_us / 1000000), (long long)(lk.took_us % 1000000), lk.fence,
                lk.nlocks ? dlock_lock_token(lk.locks[0]) : "");

    int session = 0;
    pthread_t checker;
    for (i = 0; i < lk.nlocks; i++)
        if (dlock_lock_valid_ms(lk.locks[i]) > SESSION_VALID_MS)
            session = 1;
    if (session && pipe2(lk.check_stop, O_CLOEXEC) == 0) {
        lk.lost_fd = lostpipe[1];
        for (i = 0; i < lk.nlocks; i++)
            lk.session_kept[i] = dlock_lock_valid_ms(lk.locks[i]) > SESSION_VALID_MS;
        if (pthread_create(&checker, NULL, session_main, &lk) != 0) {
            close(lk.check_stop[0]);
            close(lk.check_stop[1]);
            memset(lk.session_kept, 0, sizeof lk.session_kept);
            session = 0;
        }
    } else if (session) {
        session = 0;
    }
    if (!session && lk.nlocks && dlock_lock_valid_ms(lk.locks[0]) > SESSION_VALID_MS && g->verbose)
        cli_err(CMD, "cannot start the session checker: a lost session is seen at release only");
    code = supervise(g, &o, &lk, sigfd, lostpipe[0], &oldmask, &oldpipe);
    if (session) {
        write_byte(lk.check_stop[1], 's');
        pthread_join(checker, NULL);
        close(lk.check_stop[0]);
        close(lk.check_stop[1]);
    }

    /* Release (on the locker thread) only now that the child has exited. */
    write_byte(lk.cmd_pipe[1], 'r');
    if (read_byte(lk.done_pipe[0], &b) != 0) {
        cli_err(CMD, "internal error: no answer from the lock thread");
        code = EXIT_INTERNAL;
    } else if (code != EXIT_LOST && lk.permits && lk.release_rc == DLOCK_ENOTOWNER) {
        cli_err(CMD, "%s had been lost before the command finished: its lease ran out or the "
                "semaphore was deleted", what);
        code = EXIT_LOST;
    } else if (code != EXIT_LOST && lk.release_rc == DLOCK_ELOST) {
        cli_err(CMD, "%s had been lost before the command finished: %s",
                o.nalso ? "a lock" : what,
                lk.release_msg[0] ? lk.release_msg : dlock_strerror(lk.release_rc));
        code = EXIT_LOST;
    } else if (code != EXIT_LOST && lk.release_rc != DLOCK_OK) {
        cli_err(CMD, "warning: cannot release %s (its lease runs out by itself): %s", what,
                lk.release_msg[0] ? lk.release_msg : dlock_strerror(lk.release_rc));
    }

out:
    if (started) {
        /* the locker returns after a failed acquire, or after releasing; an
         * EOF on its command pipe makes it release if it has not yet */
        close(lk.cmd_pipe[1]);
        lk.cmd_pipe[1] = -1;
        pthread_join(th, NULL);
    }
    for (i = 0; i <= MAX_ALSO; i++)
        dlock_lock_free(locks[i]);
    dlock_permits_free(lk.permits);
    dlock_semaphore_free(lk.sem);
    dlock_client_free(c);
    if (sigfd >= 0)
        close(sigfd);
    for (i = 0; i < 2; i++) {
        if (lostpipe[i] >= 0)
            close(lostpipe[i]);
        if (lk.cmd_pipe[i] >= 0)
            close(lk.cmd_pipe[i]);
        if (lk.done_pipe[i] >= 0)
            close(lk.done_pipe[i]);
    }
    /* The signals stay blocked: one that came after the command exited must
     * not turn dlock's exit status into a death by signal. */
    sigaction(SIGPIPE, &oldpipe, NULL);
    return code;
}
