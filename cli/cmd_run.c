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
 * writes to that pipe too.
 *
 * This file: the options and the supervising loop. The locker thread and
 * the session checker are in run_locker.c, the command's process tree in
 * run_child.c; what they share is in run.h. */
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

#include "run.h"

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
    cs.env = run_child_env(o->name, lk->fence, lk->permits ? lk->permit_id : NULL);
    if (!cs.env) {
        cli_err(CMD, "out of memory");
        return EXIT_INTERNAL;
    }
    if (pipe2(errpipe, O_CLOEXEC) != 0) {
        cli_err(CMD, "pipe: %s", strerror(errno));
        run_free_env(cs.env);
        return EXIT_OSERR;
    }
    cs.errfd = errpipe[1];
    cs.tty = owned_tty();
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
    fflush(NULL);
    reaper = run_start_reaper(o, &reapfd);
    cs.pdeath = reaper < 0;
    if (reaper < 0 && g->verbose)
        cli_err(CMD, "cannot start the reaper (%s): if dlock is killed, only the command's "
                "first process is stopped", strerror(errno));
    pid = fork();
    if (pid < 0) {
        cli_err(CMD, "fork: %s", strerror(errno));
        close(errpipe[0]);
        close(errpipe[1]);
        run_free_env(cs.env);
        if (reapfd >= 0) {
            run_write_byte(reapfd, 'd');
            close(reapfd);
        }
        return EXIT_OSERR;
    }
    if (pid == 0)
        run_child_exec(&cs); /* does not return */
    (void)setpgid(pid, pid); /* as the child does: whichever runs first */
    if (cs.tty >= 0)
        (void)tcsetpgrp(cs.tty, pid); /* SIGTTOU is blocked (cmd_run) */
    if (reapfd >= 0) {
        ssize_t wr = write(reapfd, &pid, sizeof pid);
        (void)wr;
    }
    close(errpipe[1]);
    run_free_env(cs.env);
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
        if (done && (!lost || (!run_group_alive(pid) && !run_signal_tree(pid, reaper, 0))))
            break;
        for (i = 0; i < lk->nlocks && !lost; i++) {
            if (dlock_lock_is_lost(lk->locks[i])) {
                char b = 0;
                (void)run_read_byte(lostfd, &b); /* non-blocking: the reason, if written */
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
            run_signal_tree(pid, reaper, SIGTERM); /* and what left the group */
            run_signal_tree(pid, reaper, SIGCONT);
            cont = 0;
            kill_at = run_now_us() / 1000 + o->kill_after_ms;
        }
        if (cont) {
            kill(-pid, SIGCONT);
            cont = 0;
        }
        if (kill_at == -2) {
            /* what escaped the last round (a process handed to dlock while
             * its parent's list was read, more than TREE_MAX of them) */
            kill(-pid, SIGKILL);
            run_signal_tree(pid, reaper, SIGKILL);
            if (timeout > 20)
                timeout = 20;
        }
        if (kill_at >= 0) {
            int64_t rem = kill_at - run_now_us() / 1000;
            if (rem <= 0) {
                if (g->verbose)
                    cli_err(CMD, "sending SIGKILL to process group %ld", (long)pid);
                kill(-pid, SIGKILL);
                run_signal_tree(pid, reaper, SIGKILL);
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
            (void)run_read_byte(lostfd, &b);
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
        run_write_byte(reapfd, 'd'); /* done: the reaper exits */
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
    if (o.argv && (rc = run_exec_check(o.argv[0])) != 0) {
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
            dlock_permits_on_lost(lk.permits, run_on_permit_lost, &lostpipe[1]);
        /* no expirable permits (ZooKeeper): a semaphore whose permits
         * belong to this client's session, which ends with the process */
        if (rc == DLOCK_ENOTSUP &&
            dlock_semaphore_new(c, o.name, DLOCK_CSTR, &lk.sem) == DLOCK_OK) {
            dlock_semaphore_on_lost(lk.sem, run_on_sem_lost, &lostpipe[1]);
            rc = DLOCK_OK;
        }
    } else {
        rc = DLOCK_OK;
        for (i = 0; i <= o.nalso && rc == DLOCK_OK; i++) {
            rc = dlock_lock_new(c, i ? o.also[i - 1] : o.name, DLOCK_CSTR, o.kind, &locks[i]);
            if (rc == DLOCK_OK) {
                dlock_lock_on_lost(locks[i], run_on_lost, &lostpipe[1]);
                lk.nlocks++;
            }
        }
    }
    if (rc != DLOCK_OK) {
        cli_err(CMD, "%s", dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        code = cli_exit_code(rc, EXIT_INTERNAL);
        goto out;
    }

    if ((rc = pthread_create(&th, NULL, run_locker_main, &lk)) != 0) {
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
                if (run_give_up_waiting(&lk))
                    pthread_join(th, NULL);
                _exit(128 + (int)si.ssi_signo);
            }
        }
    }
    (void)run_read_byte(lk.done_pipe[0], &b);

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
        if (pthread_create(&checker, NULL, run_session_main, &lk) != 0) {
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
        run_write_byte(lk.check_stop[1], 's');
        pthread_join(checker, NULL);
        close(lk.check_stop[0]);
        close(lk.check_stop[1]);
    }

    /* Release (on the locker thread) only now that the child has exited. */
    run_write_byte(lk.cmd_pipe[1], 'r');
    if (run_read_byte(lk.done_pipe[0], &b) != 0) {
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

