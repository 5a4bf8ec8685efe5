/* The "backends" scenario (backends.c): the peer workers' line protocol
 * (bench/peers/coord_worker.py: kazoo's and python-etcd3's Lock). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends.h"

/* ---- peers: kazoo's and python-etcd3's Lock (bench/peers/coord_worker.py) ---- */


/* host:port of a zk:// or etcd:// URL */
void bk_url_server(const char *url, char *out, size_t len) {
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    size_t n = strcspn(p, "/?");
    snprintf(out, len, "%.*s", (int)n, p);
}

/* Starts one worker of pe. 0 ok, 1 skipped (reason printed, pe->ok = 0), -1 failed. */
int bk_peer_spawn_one(const bench_ctx *ctx, peerst *pe, bench_peer *w) {
    char script[1024], rport[16];
    snprintf(script, sizeof script, "%s/coord_worker.py", bench_peers_dir());
    snprintf(rport, sizeof rport, "%d", ctx->port);
    char *const argv[] = {"/usr/bin/python3", script, (char *)pe->kind, "--server", pe->server,
                          "--redis-host", (char *)ctx->host, "--redis-port", rport, NULL};
    if (bench_peer_exec(w, argv)) return -1;
    char *l = bench_peer_line(w, PEER_LINE_MS);
    if (!l || strncmp(l, "hello ", 6)) {
        if (pe->ok)
            printf("   SKIP %s: %s\n", pe->name,
                   !l                       ? "the worker ended or said no hello within 60 s"
                   : !strncmp(l, "skip ", 5) ? l + 5
                                             : l);
        pe->ok = 0;
        bench_peer_stop(w);
        return 1;
    }
    snprintf(pe->version, sizeof pe->version, "%s", l + 6);
    if (bench_peer_clock(w, pe->name)) {
        bench_peer_stop(w);
        return -1;
    }
    return 0;
}

char *bk_peer_reply(peerst *pe, bench_peer *w, int timeout_ms, const char *what) {
    char *l = bench_peer_line(w, timeout_ms);
    if (!l) fprintf(stderr, "dlock_bench: backends: %s: no reply to %s\n", pe->name, what);
    else if (strncmp(l, "ok", 2) && strncmp(l, "got", 3) && strncmp(l, "waiting", 7)) {
        fprintf(stderr, "dlock_bench: backends: %s: %s: %s\n", pe->name, what, l);
        return NULL;
    }
    return l;
}
