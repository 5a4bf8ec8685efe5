/* The "backends" scenario's parts (bench/backends.c describes it): the
 * pairs and the comparisons (backends.c), the waiter process and the
 * handoffs (backends_handoff.c), the peer workers' protocol
 * (backends_peers.c), the contention series (backends_contention.c), the
 * etcd and ZooKeeper floors (backends_floor.c). */
#ifndef DLOCK_BENCH_BACKENDS_H
#define DLOCK_BENCH_BACKENDS_H

#include <sys/types.h>

#include "bench.h"
#include "dlock.h"

#define MAX_BACKENDS 12
#define MAX_SERIES (2 * MAX_BACKENDS)
#define MAX_ROUNDS 8
#define LEASE_MS 10000
#define WAIT_MS 20000
#define PIPE_TIMEOUT_MS 25000
#define WARMUP_PAIRS 20
#define HANDOFF_WARMUP 3


typedef struct backend {
    char name[32];
    char url[512];
    int waiter_check;      /* 0 settle only, 1 redis channel, 2 dlock_inspect waiters */
    /* B, the waiter process */
    pid_t pid;
    int wfd, rfd;
    /* A: this process */
    dlock_client *client;
    dlock_lock *lock;      /* pairs and the holder's side of the handoffs */
    int has_lease;         /* an explicit lease is accepted: "<name>-lease" series */
    int ok;                /* still measured (0: skipped or failed) */
    bench_samples handoff;
} backend;

#define BK_PAIR_LOCK "bench:backends:pairs"
#define BK_HANDOFF_LOCK "bench:backends:handoff"

/* ---- peers: kazoo's and python-etcd3's Lock (bench/peers/coord_worker.py) ---- */
typedef struct peerst {
    const char *name;      /* "kazoo" */
    const char *kind;      /* the worker's first argument */
    const char *backend;   /* the dlock backend it stands beside */
    backend *b;            /* that backend (its server), NULL: skipped */
    char server[300];      /* host:port */
    char version[96];
    int ok;
    bench_peer a, w;       /* A: pairs and the holder of the handoffs; B: the waiter */
    bench_samples handoff;
} peerst;

#define NPEERS 2
#define PEER_LINE_MS 60000
#define PEER_SETTLE_EXTRA_US 10000

/* ---- contention (backends_contention.c) ---- */
#define MAX_CS (2 + NPEERS)
/* A contention series' figures at one K. */
typedef struct cs_result {
    int have;
    double rate;           /* acq/s, median of the rounds */
    double wait_max_ms, wait_p50_ms;
    int counter_ok;
} cs_result;

/* A dlock client of url; why gets the reason when it fails. */
int bk_new_client(const char *url, dlock_client **out, char *why, size_t whylen);

/* B, the waiter process of b's handoffs (backends_handoff.c): started
 * before any client exists here; stopped (killed when kill_it). */
int bk_start_waiter(backend *b);
int bk_stop_waiter(backend *b, int kill_it);
/* The handoffs round-robin over the backends and the peers. */
int bk_run_handoffs(const bench_ctx *ctx, backend *bk, int n, peerst *pe);

/* The peer workers (backends_peers.c): host:port of a zk:// or etcd://
 * URL; one worker of pe started (0 ok, 1 skipped with the reason printed,
 * -1 failed); a worker's reply line, NULL (reported) when none or an
 * error. Their "ok" lines are read by bench_peer_parse_ok. */
void bk_url_server(const char *url, char *out, size_t len);
int bk_peer_spawn_one(const bench_ctx *ctx, peerst *pe, bench_peer *w);
char *bk_peer_reply(peerst *pe, bench_peer *w, int timeout_ms, const char *what);

/* One K of the contention series: dlock on every backend of dl (zk, etcd)
 * and every peer that runs; res[] gets each series' figures. */
int bk_contention_k(const bench_ctx *ctx, redisContext *rc, backend **dl, int ndl, peerst *pe,
                    int k, cs_result *res);

/* The floors (backends_floor.c): a raw client of etcd's gateway, of
 * ZooKeeper's C API; open 0 ok, pair 0 ok (-1 also when built without). */
int bk_etcd_floor_open(const char *url);
void bk_etcd_floor_close(void);
int bk_etcd_floor_pair(void);
int bk_zk_floor_open(const char *url);
void bk_zk_floor_close(void);
int bk_zk_floor_pair(void);

#endif
