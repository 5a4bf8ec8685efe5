/* The peer scenarios' parts (bench/peers.c describes them): the peer kinds
 * and their workers (peers.c), peer_pairs (peers_pairs.c), peer_handoff
 * (peers_handoff.c), peer_contention (peers_contention.c). */
#ifndef DLOCK_BENCH_PEERS_H
#define DLOCK_BENCH_PEERS_H

#include "bench.h"
#include "dlock.h"

#define PR_LINE_TIMEOUT_MS 60000

/* ---- peer kinds and configurations ---- */

enum { K_PY, K_NODE, NKINDS };
extern const char *const pr_kind_name[NKINDS];

typedef struct peer_cfg {
    const char *series; /* "redis-py-1ms" */
    int kind;
    const char *arg;    /* cfg argument of the worker protocol */
    int64_t poll_us;    /* nominal poll / retry interval */
} peer_cfg;

#define NCFG 4
extern const peer_cfg pr_cfgs[NCFG];

/* availability of each kind: 0 unknown, 1 runs, -1 skipped (reason printed) */
extern int pr_kind_ok[NKINDS];
extern char pr_kind_version[NKINDS][96];

typedef bench_peer peer;

/* Starts n workers of kind (all spawned, then all awaited). 0 ok, 1 skipped,
 * -1 failed; on non-zero every worker is stopped. */
int pr_peers_start(const bench_ctx *ctx, int kind, peer *ps, int n);
/* A worker's next line, NULL (reported) when none came or it is "err...". */
char *pr_peer_reply(peer *p, int timeout_ms, const char *what);
/* A dlock client of the bench's server. */
int pr_make_client(const bench_ctx *ctx, dlock_client **c);

#endif
