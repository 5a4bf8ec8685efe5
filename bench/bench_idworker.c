/*
 * bench_idworker: ids per second from the ID worker, one INCR per id vs
 * batched INCRBY (issue 6).
 *
 * usage: bench_idworker [--url URL] [--ids N] [--procs P]
 *
 * Without --url (and without $DLOCK_URL) it starts a throwaway redis-server
 * on a free port and stops it at the end. With P > 1, P processes each draw N
 * ids at once (the aggregate rate is shown). Output: one line per batch size,
 * "batch  ids  seconds  ids/s  round-trips".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"

static pid_t server = -1;
static char dir[64];

static void stop_server(void) {
    if (server > 0) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
        server = -1;
    }
    if (dir[0]) {
        char p[128];
        snprintf(p, sizeof p, "%s/redis.log", dir);
        unlink(p);
        rmdir(dir);
        dir[0] = '\0';
    }
}

static void on_signal(int sig) {
    stop_server();
    _exit(128 + sig);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int start_server(char *url, size_t len) {
    snprintf(dir, sizeof dir, "/tmp/bench-idw.XXXXXX");
    if (!mkdtemp(dir)) return -1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &al))
        return -1;
    close(fd);
    char port[16], log[128];
    snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
    snprintf(log, sizeof log, "%s/redis.log", dir);
    snprintf(url, len, "redis://127.0.0.1:%s", port);
    server = fork();
    if (server < 0) return -1;
    if (server == 0) {
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save",
               "", "--appendonly", "no", "--dir", dir, "--logfile", log, (char *)NULL);
        _exit(127);
    }
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.connect_timeout_ms = 200;
    for (int i = 0; i < 200; i++) {
        dlock_client *c = NULL;
        int rc = dlock_client_new(&o, &c);
        dlock_client_free(c);
        if (rc == DLOCK_OK) return 0;
        if (waitpid(server, NULL, WNOHANG) == server) {
            server = -1;
            return -1;
        }
        usleep(50000);
    }
    return -1;
}

/* Draws n ids with the given batch; returns 0 or a dlock code. */
static int draw(const char *url, const char *prefix, int64_t batch, long n) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    if (rc) {
        fprintf(stderr, "bench_idworker: %s\n", dlock_errmsg(c));
        dlock_client_free(c);
        return rc;
    }
    dlock_idworker_options io = {.batch = batch};
    dlock_idworker *w = NULL;
    rc = dlock_idworker_new(c, prefix, &io, &w);
    uint64_t id, last = 0;
    for (long i = 0; !rc && i < n; i++) {
        rc = dlock_idworker_next(w, &id);
        if (!rc && id <= last) rc = DLOCK_EPROTO;
        last = id;
    }
    if (rc) fprintf(stderr, "bench_idworker: %s\n", w ? dlock_idworker_errmsg(w) : dlock_errmsg(c));
    dlock_idworker_free(w);
    dlock_client_free(c);
    return rc;
}

int main(int argc, char **argv) {
    const char *url = getenv("DLOCK_URL");
    long n = 100000;
    int procs = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--url") && i + 1 < argc) url = argv[++i];
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc) n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--procs") && i + 1 < argc) procs = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_idworker [--url URL] [--ids N] [--procs P]\n");
            return 2;
        }
    }
    if (n < 1 || procs < 1 || procs > 256) {
        fprintf(stderr, "bench_idworker: --ids and --procs must be positive (procs <= 256)\n");
        return 2;
    }
    char own[64];
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (!url || !*url) {
        if (start_server(own, sizeof own)) {
            fprintf(stderr, "bench_idworker: cannot start redis-server (give --url)\n");
            stop_server();
            return 2;
        }
        url = own;
    }
    static const int64_t batches[] = {1, 10, 100, 1000};
    printf("%-6s %6s %10s %9s %12s %12s\n", "batch", "procs", "ids", "seconds", "ids/s",
           "round-trips");
    int status = 0;
    for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "bench:%ld:%" PRId64, (long)getpid(), batches[b]);
        fflush(stdout);
        double t0 = now_s();
        pid_t pids[256];
        int bad = 0;
        for (int p = 0; p < procs; p++) {
            pids[p] = fork();
            if (pids[p] == 0) _exit(draw(url, prefix, batches[b], n) ? 1 : 0);
        }
        for (int p = 0; p < procs; p++) {
            int st;
            if (pids[p] < 0 || waitpid(pids[p], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
                bad = 1;
        }
        double dt = now_s() - t0;
        long total = n * procs;
        if (bad) status = 1;
        printf("%-6" PRId64 " %6d %10ld %9.3f %12.0f %12ld%s\n", batches[b], procs, total, dt,
               total / dt, (long)((n + batches[b] - 1) / batches[b]) * procs,
               bad ? "  (FAILED)" : "");
    }
    stop_server();
    return status;
}
