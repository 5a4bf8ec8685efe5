/* `dlock run`: the command's process: its environment and exec, its
 * process group and what left it, and the reaper that outlives dlock.
 * (The threads and signals: cmd_run.c.) */
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

extern char **environ;

int run_exec_check(const char *file)
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
char **run_child_env(const char *name, uint64_t fence, const char *permit)
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

void run_free_env(char **env)
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


/* In the child, between fork and exec: async-signal-safe calls only. */
void run_child_exec(const child_setup *cs)
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
int run_group_alive(pid_t pg)
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
int run_signal_tree(pid_t pg, pid_t skip, int sig)
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

void run_sleep_ms(long ms)
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
static void run_reaper_main(int fd, int64_t kill_after_ms)
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
    while (waited < kill_after_ms && run_group_alive(pg)) {
        run_sleep_ms(20);
        waited += 20;
    }
    (void)kill(-pg, SIGKILL);
    _exit(0);
}

/* Starts the reaper; its pid (and *fd, the pipe to it), or -1. */
pid_t run_start_reaper(const run_opts *o, int *fd)
{
    int p[2];
    pid_t pid;
    *fd = -1;
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        close(p[1]);
        run_reaper_main(p[0], o->kill_after_ms); /* does not return */
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
