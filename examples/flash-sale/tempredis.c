/* A throwaway redis-server: free port, temp directory, waits for PING. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flash_sale.h"

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* The last non-empty line of the server's log (why it exited). */
static void last_log_line(const char *path, char *buf, size_t len) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0]) snprintf(buf, len, "%.200s", line);
    }
    fclose(f);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int tempredis_start(const char *bin, const char *dir, tempredis *t, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    t->pid = -1;
    const char *exe = bin ? bin : "redis-server";
    t->port = free_port();
    if (t->port <= 0) {
        snprintf(err, errlen, "cannot find a free TCP port: %s", strerror(errno));
        return -1;
    }
    snprintf(t->url, sizeof t->url, "redis://127.0.0.1:%d", t->port);
    snprintf(t->log, sizeof t->log, "%s/redis.log", dir);
    char port[16];
    snprintf(port, sizeof port, "%d", t->port);

    /* exec failure is reported through a close-on-exec pipe */
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        /* own process group: a terminal ^C reaches the demo, which stops us */
        setpgid(0, 0);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        int dn = open("/dev/null", O_RDWR);
        if (dn >= 0) {
            dup2(dn, 0);
            dup2(dn, 1);
            dup2(dn, 2);
        }
        const char *argv[] = {exe,          "--port",      port,   "--bind",   "127.0.0.1",
                              "--save",     "",            "--appendonly", "no", "--dir",
                              dir,          "--logfile",   t->log, "--daemonize", "no",
                              NULL};
        if (strchr(exe, '/'))
            execv(exe, (char *const *)argv);
        else
            execvp(exe, (char *const *)argv);
        int e = errno;
        ssize_t w = write(pfd[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    close(pfd[1]);
    int e = 0;
    ssize_t n;
    do {
        n = read(pfd[0], &e, sizeof e);
    } while (n < 0 && errno == EINTR);
    close(pfd[0]);
    if (n == (ssize_t)sizeof e) {
        waitpid(pid, NULL, 0);
        snprintf(err, errlen, "cannot run redis-server '%s': %s (install redis-server, or "
                 "give --redis-server PATH or --url)", exe, strerror(e));
        return -1;
    }
    t->pid = pid;

    /* wait until it answers PING (up to 10 s) */
    dlock_options o;
    dlock_options_init(&o);
    o.url = t->url;
    o.connect_timeout_ms = 200;
    o.command_timeout_ms = 1000;
    for (int i = 0; i < 200; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            t->pid = -1;
            char line[300];
            last_log_line(t->log, line, sizeof line);
            snprintf(err, errlen, "redis-server '%s' exited at start%s%s", exe,
                     line[0] ? ": " : "", line);
            unlink(t->log);
            return -1;
        }
        dlock_client *c = NULL;
        int rc = dlock_client_new(&o, &c);
        if (rc == DLOCK_OK) rc = dlock_ping(c, NULL);
        dlock_client_free(c);
        if (rc == DLOCK_OK) return 0;
        sleep_ms(50);
    }
    snprintf(err, errlen, "redis-server '%s' did not answer PING on port %d within 10 s", exe,
             t->port);
    tempredis_stop(t);
    return -1;
}

void tempredis_stop(tempredis *t) {
    if (t->pid > 0) {
        kill(t->pid, SIGTERM);
        int st;
        for (int i = 0; i < 200; i++) { /* 2 s, then SIGKILL */
            if (waitpid(t->pid, &st, WNOHANG) == t->pid) {
                t->pid = -1;
                break;
            }
            sleep_ms(10);
        }
        if (t->pid > 0) {
            kill(t->pid, SIGKILL);
            waitpid(t->pid, &st, 0);
            t->pid = -1;
        }
    }
    if (t->log[0]) unlink(t->log);
}
