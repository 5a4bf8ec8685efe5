/* The topology layer (docs/design.md, "Layers"): the client and its
 * backend's table, the pool of connections of each server node, Sentinel
 * and Cluster, and how a key reaches its node and a command its server.
 * Included by the layers above (services.h, kinds.h) and by pool.c,
 * topology.c, sentinel.c and cluster.c. */
#ifndef DLOCK_TOPOLOGY_H
#define DLOCK_TOPOLOGY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "transport.h"

/* ---- the client (client.c), its nodes and pool (pool.c) ---- */
/* The most nodes a client has: a URL's endpoints (url.c checks it), a
 * Cluster's masters. */
#define DL_MAX_NODES 64

typedef struct dl_watchdog dl_watchdog;
typedef struct dl_object dl_object;
typedef struct dl_lease dl_lease;
/* A permit id's raw bytes (dlock_permits; the API shows them in hex). */
#define DL_PERMIT_RAW (DLOCK_PERMIT_ID_LEN / 2)
typedef struct dl_backend dl_backend;

typedef struct dl_sentinel dl_sentinel;
typedef struct dl_cluster dl_cluster;

typedef struct dl_node dl_node;

/* Idle connections of a node that the pub/sub service keeps for itself
 * (lingering subscriptions, pubsub.c): the pool counts them (nkept) against
 * max_idle, takes one back through reclaim when it has no idle connection
 * of its own (the connection no longer subscribed, its UNSUBSCRIBE's
 * confirmation owed: draining; NULL if none), and has drop close them all
 * when the node moves (a Sentinel failover) or is freed. Both take the
 * node's mu themselves. */
typedef struct dl_kept_ops {
    dl_conn *(*reclaim)(dl_node *n, int64_t deadline);
    void (*drop)(dl_node *n);
} dl_kept_ops;

/* One server: its address and a pool of idle connections, re-established
 * after failures with a bounded exponential backoff. */
struct dl_node {
    dl_endpoint ep;            /* guarded by mu when sentinel is set (it moves) */
    dl_sentinel *sentinel;     /* set: the address is the master the sentinels name */
    dlock_client *client;      /* the client it belongs to */
    int max_idle;
    int64_t connect_timeout_ms;
    pthread_mutex_t mu;        /* guards the pool and the backoff state */
    dl_conn *idle;
    int nidle;
    const dl_kept_ops *kept_ops; /* set by the service that keeps some */
    struct dl_kept *kept;      /* that service's, opaque here */
    int nkept;
    int64_t backoff_ms;        /* current reconnect backoff, 0 when healthy */
    unsigned gen;              /* counts the address's moves (Sentinel): a
                                * connection opened before the last one is
                                * closed, never pooled (dl_conn.node_gen) */
    int64_t next_attempt_ms;   /* monotonic ms before which no connect is tried */
};

struct dlock_client {
    int mode;                  /* DL_MODE_* */
    dl_node **nodes;           /* single: 1 node; redlock: the masters */
    size_t nnodes;
    size_t quorum;             /* redlock: nnodes / 2 + 1 */
    dl_node *fence_node;       /* redlock: designated fencing counter, or NULL */
    dl_sentinel *sentinel;     /* sentinel mode: how nodes[0] finds the master */
    dl_cluster *cluster;       /* cluster mode: the slot map (nodes grow with it) */
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    int64_t watchdog_lease_ms;
    int64_t node_timeout_ms;
    char *who;                 /* holder identity "host\tlabel\tcommand", or NULL
                                * (dlock_client_set_identity; holder.c) */
    size_t who_host_len;
    atomic_int fail_fast;      /* a wait ends at a connection failure
                                * (dlock_client_set_fail_fast) */
    atomic_llong fair_wait_ms; /* the fair lock's thread wait time
                                * (dlock_client_set_fair_wait) */
    int wait_replicas;
    int64_t wait_replicas_timeout_ms;
    int max_idle;
    int unusable;              /* dlock_client_new failed: every call refuses */
    char id[40];               /* UUID-shaped client id */

    pthread_mutex_t wd_mu;     /* guards wd creation */
    /* holds of this client's handles per lock name and owner, for the kinds
     * whose server count is the owner's across handles (owner.c) */
    pthread_mutex_t owned_mu;
    struct dl_owned *owned;
    size_t nowned, owned_cap;
    int owned_broken;          /* a hold could not be recorded (memory) */
    dl_watchdog *wd;

    const dl_backend *backend; /* NULL: Redis (everything above); else the backend */
    void *backend_client;      /* the backend's client state */
};

/* ---- Sentinel (sentinel.c) ---- */
/* Creates the sentinel state from a parsed target (takes its sentinels). */
int dl_sentinel_new(dl_target *t, dl_sentinel **out, dl_err *err);
void dl_sentinel_free(dl_sentinel *s);
/* Asks the sentinels for the master's address and moves node n there when it
 * changed (dropping n's idle connections). force: ask even if asked lately. */
int dl_sentinel_refresh(dl_node *n, int force, dl_err *err);
/* The master's address in a sentinel's reply r to SENTINEL
 * get-master-addr-by-name master_name: *host (malloc'd) and *port, or the
 * failure (DLOCK_EIO: the sentinel knows no such master). */
int dl_sentinel_answer(const char *master_name, const redisReply *r, char **host, int *port,
                       dl_err *err);
/* DLOCK_OK when r, a reply to ROLE, is a master's; else the failure. */
int dl_sentinel_role(const redisReply *r, dl_err *err);
/* Checks that a new connection's server is a master (ROLE). */
int dl_sentinel_check_role(dl_conn *conn, int64_t deadline, dl_err *err);

/* ---- Redis Cluster (cluster.c) ---- */
int dl_cluster_new(dl_cluster **out, dl_err *err);
void dl_cluster_free(dl_cluster *k);
/* Rebuilds the slot map from CLUSTER SLOTS. */
int dl_cluster_refresh(dlock_client *c, dl_err *err);
/* Whether the server whose INFO server text is info can run cluster mode:
 * it needs Redis 7 (SSUBSCRIBE / SPUBLISH, sharded pub/sub). DLOCK_OK for a
 * redis_version of 7 or later, or when info names no redis_version (a
 * server that does not say cannot be judged: its first SSUBSCRIBE tells);
 * DLOCK_ENOTSUP, with a message naming the version, for an older one. */
int dl_cluster_version_check(const char *info, dl_err *err);
/* dl_cluster_version_check on the first node that answers INFO server. */
int dl_cluster_check_server(dlock_client *c, dl_err *err);
/* How many nodes the client knows (a cluster's list grows). */
size_t dl_node_count(dlock_client *c);
/* The master owning slot (the map is refreshed when unknown or stale). */
dl_node *dl_cluster_route(dlock_client *c, unsigned slot);
/* For a MOVED / ASK error reply: the node to go to (*ask 1 for ASK), the
 * map updated for MOVED; NULL when r is no redirection. */
dl_node *dl_cluster_redirect(dlock_client *c, const redisReply *r, int *ask);
/* ---- nodes and their pools (pool.c), routing (topology.c) ---- */
/* A node for ep (ownership of ep's strings taken) with c's settings. */
dl_node *dl_node_new(dl_endpoint *ep, dlock_client *c);
/* Closes n's idle connections and frees it (NULL is a no-op). */
void dl_node_free(dl_node *n);
/* The node a key lives on: the slot owner in a cluster, else the main node. */
dl_node *dl_route(dlock_client *c, const char *key, size_t len);
/* 1 in cluster mode: sharded pub/sub (SSUBSCRIBE/SPUBLISH) is used. */
int dl_sharded(const dl_conn *conn);
/* Borrows a connection to the node holding key. */
int dl_pool_get_key(dlock_client *c, const char *key, size_t len, int64_t deadline,
                    dl_conn **out, dl_err *err);

/* Borrows a connection to node (an idle one, or a new one) before deadline.
 * While the node's reconnect backoff runs (after failed connects: 50 ms
 * doubling to 2 s) no connect is tried: DLOCK_EIO, or a sleep when the
 * backoff ends before deadline. */
int dl_node_get(dl_node *n, int64_t deadline, dl_conn **out, dl_err *err);
/* dl_node_get that connects at once, backoff or not (RedLock: a node the
 * quorum needs). */
int dl_node_get_now(dl_node *n, int64_t deadline, dl_conn **out, dl_err *err);
/* Takes an idle connection of n that is still good (no connect): 1 and
 * *out set, or 0 when there is none. */
int dl_node_take_idle(dl_node *n, int64_t deadline, dl_conn **out);
/* 1 when an idle connection (its idle_since_ms set when it went idle) can
 * be used: idle for less than 50 ms it is taken as is (a server does not
 * close and restart that fast, and a failure would be reported anyway,
 * never retried blindly), else unless it shows EOF or unexpected data. */
int dl_idle_alive(dl_conn *conn);
/* Records how a connect to n ended (DLOCK_EIO starts or doubles its
 * reconnect backoff, DLOCK_OK ends it). */
void dl_node_opened(dl_node *n, int rc);
/* 1 while n's reconnect backoff runs and n has no idle connection;
 * *may_probe = 1 when its last connect attempt is probe_ms old or older. */
int dl_node_backoff(dl_node *n, int64_t probe_ms, int *may_probe);
/* Returns a connection to its node: kept if healthy and not subscribed. */
void dl_node_put(dl_conn *conn);
/* Borrows a connection to the client's main node (single: the server;
 * redlock: the first master, used for queries) before deadline. */
int dl_pool_get(dlock_client *c, int64_t deadline, dl_conn **out, dl_err *err);
/* Returns a connection (NULL is a no-op). */
void dl_pool_put(dlock_client *c, dl_conn *conn);
/* Deadline for one command round trip from now. */
int64_t dl_cmd_deadline(const dlock_client *c);
/* Runs a request again where a redirection sends it: conn borrowed from
 * that node, asking 1 for an ASK redirection (the request goes after
 * ASKING); the reply into *out. */
typedef int (*dl_redirect_run)(void *ctx, dl_conn *conn, int asking, redisReply **out,
                               dl_err *err);
/* Redis Cluster (nothing elsewhere): while *out, the reply of a request
 * made on a connection to node from, is a MOVED or ASK redirection, or
 * TRYAGAIN (a multi-key request while its slot migrates, waited out with a
 * growing pause), frees it and runs the request again with run where it
 * says, 8 times at most; MOVED updates the slot map. *out is the last reply
 * (NULL after a failure, whose code is returned). */
int dl_follow_redirects(dlock_client *c, dl_node *from, int64_t deadline, dl_redirect_run run,
                        void *ctx, redisReply **out, dl_err *err);
/* Borrow, run one command, return: the usual one-shot round trip. */
int dl_client_command(dlock_client *c, int argc, const char **argv, const size_t *lens,
                      redisReply **out, dl_err *err);


/* ---- lock names on a Redis Cluster (cluster.c) ---- */
/* On a Redis Cluster client: DLOCK_EINVAL when the keys derived from name
 * (a valid name, len resolved) would not share its slot. */
int dl_check_cluster_name(const dlock_client *c, const char *name, size_t len, dl_err *err);
/* On a Redis Cluster client: DLOCK_EINVAL when a latch's channel (from
 * dl_latch_channel) hashes to another slot than the latch's key, as it does
 * for a name with a hash tag of its own. */
int dl_check_cluster_latch(const dlock_client *c, const char *name, size_t len,
                           const char *channel, size_t channel_len, dl_err *err);

/* ---- the backend's table (backend.c, backend_redis.c, backends/) ----
 * A backend serves the lock API over one kind of server, chosen by the URL
 * scheme: Redis (backend_redis.c), ZooKeeper, etcd, PostgreSQL, MySQL. The
 * public calls go through its table; what a backend leaves NULL (or out of
 * its kinds and caps) answers DLOCK_ENOTSUP, "not supported by the <name>
 * backend". */
typedef struct dl_outcome dl_outcome;
/* What a backend has beyond the calls of its table. */
enum {
    DL_CAP_WATCHDOG = 1u << 0, /* DLOCK_WATCHDOG holds renewed by watchdog.c */
    DL_CAP_TOKENS = 1u << 1,   /* acquire / release / extend by token (token.c) */
    DL_CAP_LIST = 1u << 2,     /* dlock_list */
    DL_CAP_CANCEL = 1u << 5,   /* dlock_lock_cancel (waits in wait.c / redlock.c) */
    DL_CAP_HOLDER = 1u << 6,   /* holder identity records (holder.c) */
    DL_CAP_OWNER_HOLDS = 1u << 7, /* the server counts a reentrant owner's holds over
                                   * all its handles (owner.c keeps per-handle records) */
};

struct dl_backend {
    const char *name;                  /* "redis", "postgres", "mysql", ... */
    const char *const *schemes;        /* URL prefixes it serves, NULL-terminated */
    unsigned kinds;                    /* bit 1 << kind for each lock kind it has */
    unsigned caps;                     /* DL_CAP_* */
    /* client: open sets c->backend_client; close frees it */
    int (*open)(dlock_client *c, const char *url, const dlock_options *o, dl_err *err);
    void (*close)(dlock_client *c);
    int (*ping)(dlock_client *c, int64_t *rtt_us, dl_err *err);
    /* a lock handle: l->h.backend_state is the backend's (its own connection, say) */
    int (*lock_init)(dlock_lock *l, dl_err *err);
    void (*lock_destroy)(dlock_lock *l);
    /* wait_ms as dlock_acquire; lease_ms > 0 or DLOCK_WATCHDOG (held while
     * the session lives). Success: t->acquired, t->fence, t->count filled,
     * l->expires_at set (INT64_MAX for a session-held lock). Not acquired:
     * DLOCK_EBUSY (try once) or DLOCK_ETIMEDOUT, with a message. Reentry of
     * a handle that holds: called again, t->count the new hold count. */
    int (*acquire)(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t, dl_err *err);
    /* one hold: *res 1 released fully, 0 still held, -1 was not held (lost) */
    int (*release)(dlock_lock *l, long long *res, dl_err *err);
    int (*extend)(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err);
    int (*check)(dlock_lock *l, int *held, int64_t *count, dl_err *err);
    /* queries by name */
    int (*inspect)(dlock_client *c, const char *name, size_t len, dlock_info *info, dl_err *err);
    int (*fence_current)(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                         dl_err *err);
    int (*force_unlock)(dlock_client *c, const char *name, size_t len, int *existed,
                        dl_err *err);
    /* dlock_server_fact for this backend: at least "version" (the server's
     * version) and "session" (one line: what keeps a lock held, e.g. "the
     * connection" or "a session with a 10000 ms timeout"); DLOCK_ESERVER
     * "no such fact" for others. */
    int (*server_fact)(dlock_client *c, const char *what, char *buf, size_t buflen,
                       dl_err *err);
    /* the owner of a new hold into l->token; NULL: "<client id>:<thread id>" */
    int (*owner)(dlock_lock *l, dl_err *err);
    /* cheaper forms of inspect, when the backend has them (NULL: inspect) */
    int (*is_locked)(dlock_client *c, const char *name, size_t len, int *locked, dl_err *err);
    int (*remaining_ttl)(dlock_client *c, const char *name, size_t len, int64_t *ttl_ms,
                         dl_err *err);
    /* the semaphore (dlock_semaphore_*), when the backend has one (NULL
     * sem_acquire: DLOCK_ENOTSUP). o is the handle's common part; sem_init
     * (may be NULL) sets o->h.backend_state, sem_destroy frees it. Arguments are
     * checked by semaphore.c before: permits >= 1 (acquire, release),
     * wait_ms >= 0 or DLOCK_WAIT_FOREVER, permits >= 0 (try_set), result
     * pointers not NULL. Not acquired: DLOCK_EBUSY (wait_ms 0) or
     * DLOCK_ETIMEDOUT, with a message. */
    int (*sem_init)(dl_object *o, dl_err *err);
    void (*sem_destroy)(dl_object *o);
    int (*sem_acquire)(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err);
    int (*sem_release)(dl_object *o, int64_t permits, dl_err *err);
    int (*sem_available)(dl_object *o, int64_t *permits, dl_err *err);
    int (*sem_try_set)(dl_object *o, int64_t permits, int *set, dl_err *err);
    int (*sem_add)(dl_object *o, int64_t delta, dl_err *err);
    /* the countdown latch (dlock_latch_*), when the backend has one (NULL
     * latch_await: DLOCK_ENOTSUP); arguments checked by latch.c before */
    int (*latch_try_set)(dl_object *o, int64_t count, int *set, dl_err *err);
    int (*latch_set)(dl_object *o, int64_t count, dl_err *err);
    int (*latch_count_down)(dl_object *o, int64_t k, dl_err *err);
    int (*latch_count)(dl_object *o, int64_t *count, dl_err *err);
    int (*latch_await)(dl_object *o, int64_t wait_ms, dl_err *err);
    /* the permit-expirable semaphore (dlock_permits_*), when the backend has
     * one (NULL permits_acquire: DLOCK_ENOTSUP); permits.c checks the
     * arguments and keeps the handle's records. raw: a permit id's
     * DL_PERMIT_RAW bytes. permits_init (may be NULL) sets
     * o->h.backend_state, permits_destroy frees it; permits_acquire takes a
     * permit under raw for lease_ms, waiting as wait_ms says, *t0 the
     * monotonic ms just before the request that took it; release and renew
     * answer *done 0 when the permit is not out on lease; permits_lease
     * names a watchdog permit's renewal (lease->renew, key) */
    int (*permits_init)(dl_object *o, dl_err *err);
    void (*permits_destroy)(dl_object *o);
    int (*permits_acquire)(dl_object *o, const char *raw, int64_t wait_ms, int64_t lease_ms,
                           int64_t *t0, dl_err *err);
    int (*permits_release)(dl_object *o, const char *raw, int *done, dl_err *err);
    int (*permits_renew)(dl_object *o, const char *raw, int64_t lease_ms, int *done, dl_err *err);
    int (*permits_available)(dl_object *o, int64_t *permits, dl_err *err);
    int (*permits_try_set)(dl_object *o, int64_t permits, int *set, dl_err *err);
    int (*permits_add)(dl_object *o, int64_t delta, dl_err *err);
    void (*permits_lease)(dl_object *o, dl_lease *lease);
    /* the ID worker's day counter: adds n to the counter key (made at 0 when
     * absent) and answers its new value in *value; DLOCK_EOVERFLOW when it
     * cannot count on (NULL: no ID worker) */
    int (*id_incr)(dlock_client *c, const char *key, size_t key_len, int64_t n,
                   long long *value, dl_err *err);
};

/* Records DLOCK_ENOTSUP "<what> is not supported by the <name> backend" on c. */
static inline int dl_backend_unsupported(dlock_client *c, const char *what) {
    dl_err err = {0};
    dl_seterr(&err, DLOCK_ENOTSUP, "%s is not supported by the %s backend", what,
              c->backend->name);
    return dl_client_fail(c, &err);
}

/* RedLock's allowance for clock drift over a lease: lease / 100 + 2 ms. A
 * RedLock hold is counted valid for the lease less this, from just before
 * the request that started it (acquire, extend, watchdog renewal). */
static inline int64_t dl_redlock_drift_ms(int64_t lease_ms) { return lease_ms / 100 + 2; }

/* ---- the topology's answers (topology.c) ----
 * What differs between one server, a Sentinel-watched master, a Cluster and
 * RedLock's independent masters, asked here rather than of the client's
 * mode: the files above never read the mode. */
/* 1 when a lock's calls go to all of the client's masters at once and a
 * majority decides (RedLock: redlock.c runs them). Inline, as the two
 * below: they are asked on every acquire and release. */
static inline int dl_topo_fanout(const dlock_client *c) { return c->mode == DL_MODE_REDLOCK; }
/* How many nodes must say yes (or no) for an answer to stand: RedLock's
 * majority, else 1. */
static inline size_t dl_topo_quorum(const dlock_client *c) {
    return dl_topo_fanout(c) ? c->quorum : 1;
}
/* What a hold's validity leaves out of its lease: RedLock's clock drift
 * (dl_redlock_drift_ms), else 0. */
static inline int64_t dl_topo_margin(const dlock_client *c, int64_t lease_ms) {
    return dl_topo_fanout(c) ? dl_redlock_drift_ms(lease_ms) : 0;
}
/* The longest one request to one node may take, at most limit: RedLock
 * bounds it by four node timeouts, so that a frozen node cannot use up the
 * others' time. */
int64_t dl_topo_request_ms(const dlock_client *c, int64_t limit);
/* What a key's requests are grouped by to share a node: its hash slot in a
 * Cluster, else 0 (one group). */
unsigned dl_topo_slot(const dlock_client *c, const char *key, size_t len);
/* 1 when node serves slot (every node does outside a Cluster). */
int dl_topo_serves(dlock_client *c, dl_node *node, unsigned slot);
/* The nodes that hold a name's keys into nodes (cap at most): RedLock's
 * every master, else the node the name routes to. Returns how many. */
size_t dl_topo_name_nodes(dlock_client *c, const char *name, size_t len, dl_node **nodes,
                          size_t cap);
/* How many of c->nodes a listing scans: a Cluster's every master, else the
 * first node. */
size_t dl_topo_scan_nodes(dlock_client *c);
/* A reply that names another node for a key (a Cluster's MOVED) updates the
 * slot map; nothing elsewhere. */
void dl_topo_note_reply(dlock_client *c, const redisReply *r);

/* A Redis client's set-up (topology.c): parses url, connects, checks the nodes;
 * dl_topology_clear frees what it set up (at dlock_client_free, or after a
 * failed open). */
int dl_redis_open(dlock_client *c, const char *url, const dlock_options *o, dl_err *err);
/* Applies o's password ($DLOCK_PASSWORD when neither o nor the URL has one)
 * and username to ep: DLOCK_OK, DLOCK_EINVAL (a user without a password),
 * DLOCK_ENOMEM. */
int dl_apply_credentials(dl_endpoint *ep, const dlock_options *o, dl_err *err);
void dl_topology_clear(dlock_client *c);
int dl_redis_ping(dlock_client *c, int64_t *rtt_us, dl_err *err);

#endif
