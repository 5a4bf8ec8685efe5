/* Internal declarations of the layers above transport (prefix dl_): the
 * client and its topologies, the services, the lock kinds and objects, the
 * backends. Being split by layer (docs/design.md, "Layers"); base.h and
 * transport.h are the layers below. */
#ifndef DLOCK_INTERNAL_H
#define DLOCK_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "transport.h"


/* ---- scripts (scripts.c) ---- */
typedef struct dl_script dl_script;
struct dl_script {
    const char *name;
    const char *text;
    char sha[41];              /* computed on first use */
    atomic_int ready;
    /* for Redis Cluster: the text with PUBLISH as SPUBLISH (sharded pub/sub,
     * as Redisson uses on Redis 7 clusters), made on first use */
    char *stext;
    char ssha[41];
    atomic_int sready;
};

#define DL_SCRIPT(name, text) {name, text, "", 0}

/* Lua, inline: pops waiters from the ZSET z (lowest score first) until one
 * is subscribed to its channel prefix .. member, and tells it (PUBLISH):
 * one live waiter is told, dead ones (their connection gone) are dropped on
 * the way. Subscribed is read with PUBSUB NUMSUB, which counts the channel's
 * own subscribers only: PUBLISH's count includes every pattern subscriber
 * (a monitoring tool's PSUBSCRIBE *), and would take a dead waiter for a
 * live one. The plain lock's waiters register there (lock_plain.c). z and
 * prefix are Lua expressions.
 *
 * The lock scripts paste their snippets inline instead of defining Lua
 * functions: a `local function` builds a closure on every run, and on a
 * server that has been idle for a few milliseconds (every lock handoff: the
 * waiter slept) a script pays for each function it defines, a visible share
 * of a plain acquire's server time (docs/benchmarks.md, "Server time";
 * `bench/run.sh --only server_time`). The permit semaphore's
 * helpers are still functions: off the handoff path, and used more than
 * once per script. */
#define DL_LUA_WAKE_ONE(z, prefix)                                                     \
    "while true do local w = redis.call('zpopmin', " z ") "                            \
    "if not w[1] then break end "                                                      \
    "if redis.call('pubsub', 'numsub', " prefix " .. w[1])[2] > 0 then "               \
    "redis.call('publish', " prefix " .. w[1], '0') break end end "

/* Fencing tokens, Lua inline: DL_LUA_FENCE(var, k) sets the new local var to
 * the next token of the counter k (a Lua expression): max(counter + 1, the
 * server's clock in microseconds), stored back in the counter. It INCRs the
 * counter (redisson_lock_token:{N}), as Redisson's RFencedLock does, then
 * reads TIME and, when the clock is ahead (nearly always: acquisitions are
 * more than a microsecond apart), SETs the counter to it. The counter never
 * expires: Redisson's RFencedLock counts on from it with plain INCRs, and one
 * that expired would start those again at 1.
 *
 * Why tokens stay strictly increasing through any loss of the counter (a
 * restart from an older RDB or AOF, without persistence, a failover to a
 * replica that missed the latest increments, a DEL): every token is at most
 * the server's clock when it was issued, as long as the counter started at
 * or below the clock (a fresh counter, Redisson's, a small one from before)
 * and the clock never stepped back; so whatever older value the counter is
 * restored to, the next token is the clock of a later moment, above every
 * token before. The exact condition: the clock of the server that issues the
 * next token is ahead of the clock of every server that issued one before,
 * at the time it did (docs/design.md, "Fencing tokens").
 *
 * Two more calls than a bare INCR on every acquire (design.md gives the
 * cost). The token goes out as a string with string.format('%d'): Lua's
 * tostring shows 1.7e15 as "1.7e+15". An ACL user without +time
 * (SECURITY.md's recipe before +time) gets the plain INCR: tokens from 1,
 * increasing only while the counter is kept. A counter INCR cannot count on
 * (a foreign client wrote a word, another type, or its largest value) is set
 * to the clock, which the tokens before it did not pass (the condition
 * above); without the clock the script answers DL_FENCE_ERR after its
 * writes, and the caller gives the hold back. The lock is written first
 * because most attempts of a waiter find it taken: they spend nothing on the
 * counter. */
#define DL_LUA_FENCE(var, k)                                                           \
    DL_LUA_FENCE_TRY(var, k)                                                           \
    "if not " var " then return redis.error_reply('" DL_FENCE_ERR " the fencing "     \
    "counter ' .. " k " .. ' cannot be counted on (not an integer, or at its "       \
    "largest) and the server\\'s clock cannot be read (TIME)') end "

/* DL_LUA_FENCE without the error: var is nil when no token can be had (for
 * a handoff, which then wakes the waiter instead of granting it). */
#define DL_LUA_FENCE_TRY(var, k)                                                       \
    "local " var " = redis.pcall('incr', " k ") "                                      \
    "if type(" var ") ~= 'number' then " var " = nil end "                             \
    "do local t = redis.pcall('time') "                                                \
    "if t[1] then local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) "              \
    "if not " var " or now > " var " then " var " = now "                              \
    "redis.call('set', " k ", string.format('%d', " var ")) end end end "

/* The error a lock script answers when it wrote a hold it cannot give a
 * fencing token (DL_LUA_FENCE): the caller gives the hold back (the script
 * cannot undo its writes: Redis does not roll a script back). */
#define DL_FENCE_ERR "DLOCKFENCE"

/* Lua, inline: the expiry of key k becomes ms (a Lua expression) from now,
 * unless it is later already (a key without expiry gets one; ms <= 0
 * changes nothing). The kinds whose hold is shared by an owner's handles
 * (reentrant, fair, read and write locks: the server counts holds per owner,
 * not per handle) set their lease this way on every path but a new hold's:
 * a re-entry, a release that leaves holds, an extend or a renewal by one
 * handle never shortens the lease another handle of the same owner counts
 * on (dlock_lock_valid_ms). */
#define DL_LUA_RAISE_TTL(k, ms)                                                        \
    "do local m_ = tonumber(" ms ") "                                                  \
    "if m_ and m_ > 0 and redis.call('pttl', " k ") < m_ then "                        \
    "redis.call('pexpire', " k ", m_) end end "

/* The plain lock's waiter registry and its channel prefix. */
#define DL_PLAIN_WAITERS_PREFIX "dlock_waiters:"

/* dl_eval_opt: the script may tell a waiter (PUBLISH) that waits for it, a
 * handoff: send PING before it, in the same write. Redis queues a
 * connection's first pending reply at the head of the list it writes out
 * after the event loop's round, so without it the caller's reply went out
 * before the waiter's message, one loopback write (and the caller's wake-up)
 * before the waiter's. With the PING's reply queued first, the message
 * goes first. (ASKING, sent before a script on an ASK redirect, does the
 * same.) */
#define DL_EVAL_TELL_FIRST 1
int dl_eval_opt(dl_conn *c, int64_t deadline, int opts, dl_script *s, int nkeys,
                const char **keys, const size_t *keylens, int nargs, const char **args,
                const size_t *arglens, redisReply **out, dl_err *err);

/* Runs a script by EVALSHA, falling back to EVAL on NOSCRIPT.
 * keys/args are binary-safe (lens). */
int dl_eval(dl_conn *c, int64_t deadline, dl_script *s, int nkeys, const char **keys,
            const size_t *keylens, int nargs, const char **args, const size_t *arglens,
            redisReply **out, dl_err *err);
/* Queues an EVALSHA (no fallback; the caller re-sends by dl_eval on NOSCRIPT). */
int dl_eval_append(dl_conn *c, dl_script *s, int nkeys, const char **keys,
                   const size_t *keylens, int nargs, const char **args,
                   const size_t *arglens, dl_err *err);
int dl_is_noscript(const redisReply *r);
/* dl_eval on a pooled connection with the command deadline: the usual case. */
int dl_client_eval(dlock_client *c, dl_script *s, int nkeys, const char **keys,
                   const size_t *keylens, int nargs, const char **args, const size_t *arglens,
                   redisReply **out, dl_err *err);
/* Runs one script on several connections at once: sends to every non-NULL
 * conns[i], then waits for all answers in one poll() loop until deadline
 * (NOSCRIPT answered by EVAL on that connection). replies[i] gets each answer
 * or NULL (no connection, no answer in time: that connection is marked
 * broken). unanswered (may be NULL): 1 where the request went out whole but
 * no answer came in time (the server may still run it), else 0. Returns how
 * many answered. */
/* The last refusal of a new connection's AUTH that dl_fanout_eval met on
 * this thread (code DLOCK_EAUTH), for RedLock to tell a quorum missed for
 * it; its caller clears code before a fan-out. */
extern _Thread_local dl_err dl_fanout_refused;
size_t dl_fanout_eval(dl_conn **conns, size_t n, int64_t deadline, dl_script *s, int nkeys,
                      const char **keys, const size_t *keylens, int nargs, const char **args,
                      const size_t *arglens, redisReply **replies, unsigned char *unanswered);
/* Sends EVAL of s on c right behind the request dl_fanout_eval left
 * unanswered there, without waiting (what the socket takes at once; c stays
 * broken). A server runs one connection's commands in order, so s runs only
 * right after that request, never without it, and it runs whenever both
 * reached the server (a frozen server runs what it read once it thaws, even
 * from a connection closed meanwhile; a command cut short never runs). */
void dl_fanout_chase(dl_conn *c, dl_script *s, int nkeys, const char **keys,
                     const size_t *keylens, int nargs, const char **args, const size_t *arglens);
/* Queues EVAL (by text) of s. */
int dl_eval_append_text(dl_conn *c, dl_script *s, int nkeys, const char **keys,
                        const size_t *keylens, int nargs, const char **args,
                        const size_t *arglens, dl_err *err);
/* Interprets an integer script answer; error replies become codes. */
int dl_reply_expect_int(redisReply *r, const char *what, long long *v, dl_err *err);

extern dl_script dl_script_plain_release;   /* lock_plain.c: KEYS lock, channel; ARGV token */
extern dl_script dl_script_plain_extend;    /* lock_plain.c: KEYS lock; ARGV token, lease */
extern dl_script dl_script_force_unlock;    /* query.c */

/* ---- client and pool (client.c) ---- */
typedef struct dl_watchdog dl_watchdog;
typedef struct dl_backend dl_backend;

typedef struct dl_sentinel dl_sentinel;
typedef struct dl_cluster dl_cluster;

/* One server: its address and a pool of idle connections, re-established
 * after failures with a bounded exponential backoff. */
typedef struct dl_node {
    dl_endpoint ep;            /* guarded by mu when sentinel is set (it moves) */
    dl_sentinel *sentinel;     /* set: the address is the master the sentinels name */
    dlock_client *client;      /* the client it belongs to */
    int max_idle;
    int64_t connect_timeout_ms;
    pthread_mutex_t mu;        /* guards the pool and the backoff state */
    dl_conn *idle;
    int nidle;
    int64_t backoff_ms;        /* current reconnect backoff, 0 when healthy */
    unsigned gen;              /* counts the address's moves (Sentinel): a
                                * connection opened before the last one is
                                * closed, never pooled (dl_conn.node_gen) */
    int64_t next_attempt_ms;   /* monotonic ms before which no connect is tried */
} dl_node;

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
     * whose server count is the owner's across handles (lock.c) */
    pthread_mutex_t owned_mu;
    struct dl_owned *owned;
    size_t nowned, owned_cap;
    int owned_broken;          /* a hold could not be recorded (memory) */
    dl_watchdog *wd;

    const dl_backend *backend; /* NULL: Redis (everything above); else the backend */
    void *bctx;                /* the backend's client state */
};

/* ---- Sentinel (sentinel.c) ---- */
/* Creates the sentinel state from a parsed target (takes its sentinels). */
int dl_sentinel_new(dl_target *t, dl_sentinel **out, dl_err *err);
void dl_sentinel_free(dl_sentinel *s);
/* Asks the sentinels for the master's address and moves node n there when it
 * changed (dropping n's idle connections). force: ask even if asked lately. */
int dl_sentinel_refresh(dl_node *n, int force, dl_err *err);
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
/* Records how a connect to n ended (DLOCK_EIO starts or doubles its
 * reconnect backoff, DLOCK_OK ends it). */
void dl_node_opened(dl_node *n, int rc);
/* 1 while n's reconnect backoff runs and n has no idle connection;
 * *may_probe = 1 when its last connect attempt is probe_ms old or older. */
int dl_node_backoff(dl_node *n, int64_t probe_ms, int *may_probe);
/* Returns a connection to its node: kept if healthy and not subscribed. */
void dl_node_put(dl_conn *conn);
/* A waiter's subscription outlives its wait: the waiter that holds the lock
 * returns at once, without writing UNSUBSCRIBE. sub (subscribed to channel
 * alone) goes back to its pool still subscribed; the UNSUBSCRIBE goes out
 * with the connection's next use, or not at all when the next waiter on its
 * node wants the same channel (dl_node_get_sub). A plain dl_node_get takes
 * such a connection last and unsubscribes it first. Falls back to
 * dl_unsubscribe_async when it cannot keep it. */
void dl_node_put_linger(dl_conn *sub, const char *channel, size_t channel_len);
/* A connection of the node to subscribe to channel with. *subscribed = 1:
 * it already is (a lingering connection of an earlier wait on the same
 * channel; no I/O was done); 0: the caller subscribes it (an UNSUBSCRIBE
 * from another lingering channel may be queued on it, and goes out with the
 * SUBSCRIBE). */
int dl_node_get_sub(dl_node *n, const char *channel, size_t channel_len, int64_t deadline,
                    dl_conn **out, int *subscribed, dl_err *err);
/* The lingering connection of the node subscribed to channel, if one is idle
 * (no I/O; NULL if none). */
dl_conn *dl_node_take_linger(dl_node *n, const char *channel, size_t channel_len);
/* Borrows a connection to the client's main node (single: the server;
 * redlock: the first master, used for queries) before deadline. */
int dl_pool_get(dlock_client *c, int64_t deadline, dl_conn **out, dl_err *err);
/* Returns a connection (NULL is a no-op). */
void dl_pool_put(dlock_client *c, dl_conn *conn);
/* Deadline for one command round trip from now. */
int64_t dl_cmd_deadline(const dlock_client *c);
/* Borrow, run one command, return: the usual one-shot round trip. */
int dl_client_command(dlock_client *c, int argc, const char **argv, const size_t *lens,
                      redisReply **out, dl_err *err);

/* ---- the common part of the synchronizer handles (object.c) ---- */
/* ---- cancelling a wait (cancel.c) ----
 * dlock_lock_cancel and its siblings add 1 to gen and write to fd, the
 * eventfd of the wait under way (-1 when none). An operation notes gen when
 * it starts (seen) and stops waiting once gen differs. The handle's eventfd
 * (own) is made by its first wait and kept until the handle is freed: a wait
 * that ends only unpublishes it, with no close() between the grant and the
 * caller holding the lock (about 5 us of a handoff's wake-up). busy counts
 * cancels between reading fd and writing to it: the eventfd is closed only
 * when none is, so a write never lands in a reused descriptor. */
typedef struct dl_cancel {
    atomic_uint gen;
    atomic_int fd;
    atomic_int busy;
    int own;
    unsigned seen;
} dl_cancel;

void dl_cancel_init(dl_cancel *x);
/* The handle is freed: closes its eventfd. */
void dl_cancel_destroy(dl_cancel *x);
/* The public cancels (async-signal-safe): DLOCK_ENOTSUP when c's backend
 * cannot cancel its waits, else the cancel is made and DLOCK_OK. */
int dl_cancel_ask(dlock_client *c, dl_cancel *x);
/* An operation that may wait starts: earlier cancels are not for it. */
void dl_cancel_note(dl_cancel *x);
/* 1 if the operation under way was cancelled. */
int dl_canceled(dl_cancel *x);
/* A wait starts: publishes the handle's eventfd (made on first use), which a
 * cancel writes to, and returns it (-1 if it cannot be created: a cancel is
 * then noticed at the next wake-up of the wait). Only the waiting thread
 * calls it. A count left by a cancel that came as the previous wait ended
 * wakes this one once, which reads it away and finds itself not cancelled. */
int dl_cancel_begin(dl_cancel *x);
/* The wait is over: a cancel no longer writes to the eventfd. A no-op
 * without dl_cancel_begin. */
void dl_cancel_end(dl_cancel *x);
/* Reads the eventfd empty (after poll saw it readable). */
void dl_cancel_drain(dl_cancel *x);
/* Between dl_cancel_begin and dl_cancel_end: sleeps ms, or less when the
 * wait is cancelled. 1 cancelled, 0 not. For waits that poll the server (no
 * notification to wait on). */
int dl_cancel_nap(dl_cancel *x, int64_t ms);
/* Between dl_cancel_begin and dl_cancel_end: poll(2) on fds plus the
 * eventfd (in fds[n], which the caller leaves room for), up to ms (-1:
 * forever). Returns poll's result for fds[0..n-1] (0: none ready), or -2
 * when the wait is cancelled. EINTR counts as none ready. */
struct pollfd;
int dl_cancel_poll(dl_cancel *x, struct pollfd *fds, int n, int ms);
/* For a wait the server runs (a statement), whose end must be asked for (a
 * cancel request, KILL QUERY): as dl_cancel_poll (x may be NULL: poll) until
 * the caller first asks, then poll(2) on fds alone. *asked: 0, then when the
 * caller last asked (monotonic ms; the caller sets it). Returns -2 when it is
 * time to ask: on the cancel, then every DL_CANCEL_ASK_AGAIN_MS until the
 * answer comes (a request that reaches the server before it started the
 * statement is dropped); else poll's result. */
#define DL_CANCEL_ASK_AGAIN_MS 200
int dl_cancel_poll_ask(dl_cancel *x, const int64_t *asked, struct pollfd *fds, int n, int ms);

typedef struct dl_object {
    dlock_client *c;
    char *name;
    size_t name_len;
    char *channel;             /* the channel its waiters subscribe to */
    size_t channel_len;
    char errmsg[DL_ERRMSG_MAX];
    void *bdata;               /* a backend's per-handle state (sem_init) */
    dl_cancel cancel;          /* dlock_semaphore_cancel and its siblings */
    dlock_semaphore_lost_fn lost_fn; /* dlock_semaphore_on_lost (semaphores) */
    void *lost_ud;
} dl_object;

/* A backend found the permits of the semaphore whose handle o is gone:
 * runs its lost callback, if any. */
void dl_semaphore_lost(dl_object *o, int reason);
/* A semaphore acquire that did not get its permits: DLOCK_EBUSY (try once)
 * or DLOCK_ETIMEDOUT (timed_out), with the message every backend gives. */
int dl_sem_refused(const dl_object *o, int64_t permits, int timed_out, dl_err *err);
/* DLOCK_EINVAL: a release of more permits than the handle holds (backends
 * whose permits belong to the handle that took them). */
int dl_sem_over_release(const dl_object *o, int64_t permits, int64_t held, dl_err *err);

/* Checks that c's backend has objects of kind (DLOCK_KIND_SEMAPHORE,
 * DLOCK_KIND_PERMIT_SEMAPHORE, DLOCK_KIND_LATCH), checks and copies name and
 * derives the channel chan_prefix + {name} (the latch's: dl_latch_channel,
 * checked with dl_check_cluster_latch). Failures are recorded on c
 * (dlock_errmsg) and returned. */
int dl_object_init(dl_object *o, dlock_client *c, dlock_kind kind, const char *name,
                   size_t name_len, const char *chan_prefix);
void dl_object_clear(dl_object *o);
/* Records err on the handle; returns its code. */
int dl_object_fail(dl_object *o, const dl_err *err);
int dl_object_ok(dl_object *o);

/* ---- backends (backend.c, backend_<name>.c) ----
 * A backend serves the lock API over one kind of server, chosen by the URL
 * scheme: Redis (backend_redis.c), ZooKeeper, etcd, PostgreSQL, MySQL. The
 * public calls go through its table; what a backend leaves NULL (or out of
 * its kinds and caps) answers DLOCK_ENOTSUP, "not supported by the <name>
 * backend". */
typedef struct dl_try dl_try;
/* What a backend has beyond the calls of its table. */
enum {
    DL_CAP_WATCHDOG = 1u << 0, /* DLOCK_WATCHDOG holds renewed by watchdog.c */
    DL_CAP_TOKENS = 1u << 1,   /* acquire / release / extend by token (token.c) */
    DL_CAP_LIST = 1u << 2,     /* dlock_list */
    DL_CAP_OBJECTS = 1u << 3,  /* expirable permits and latches (semaphores:
                                * the sem_* calls of the table) */
    DL_CAP_IDWORKER = 1u << 4, /* the ID worker */
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
    /* client: open sets c->bctx; close frees it */
    int (*open)(dlock_client *c, const char *url, const dlock_options *o, dl_err *err);
    void (*close)(dlock_client *c);
    int (*ping)(dlock_client *c, int64_t *rtt_us, dl_err *err);
    /* a lock handle: l->bdata is the backend's (its own connection, say) */
    int (*lock_init)(dlock_lock *l, dl_err *err);
    void (*lock_destroy)(dlock_lock *l);
    /* wait_ms as dlock_acquire; lease_ms > 0 or DLOCK_WATCHDOG (held while
     * the session lives). Success: t->acquired, t->fence, t->count filled,
     * l->expires_at set (INT64_MAX for a session-held lock). Not acquired:
     * DLOCK_EBUSY (try once) or DLOCK_ETIMEDOUT, with a message. Reentry of
     * a handle that holds: called again, t->count the new hold count. */
    int (*acquire)(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_try *t, dl_err *err);
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
     * (may be NULL) sets o->bdata, sem_destroy frees it. Arguments are
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
};

/* Redis and its deployments (single, RedLock, Sentinel, Cluster): the
 * backend of every URL no other backend claims (backend_redis.c). */
extern const dl_backend dl_backend_redis;
/* Its client set-up (topology.c): parses url, connects, checks the nodes;
 * dl_topology_clear frees what it set up (at dlock_client_free, or after a
 * failed open). */
int dl_redis_open(dlock_client *c, const char *url, const dlock_options *o, dl_err *err);
void dl_topology_clear(dlock_client *c);
int dl_redis_ping(dlock_client *c, int64_t *rtt_us, dl_err *err);
/* Its queries by name (query.c). */
int dl_redis_is_locked(dlock_client *c, const char *name, size_t len, int *locked, dl_err *err);
int dl_redis_remaining_ttl(dlock_client *c, const char *name, size_t len, int64_t *ttl_ms,
                           dl_err *err);
int dl_redis_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                           dl_err *err);
int dl_redis_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                     dl_err *err);
int dl_redis_force_unlock(dlock_client *c, const char *name, size_t len, int *existed,
                          dl_err *err);
int dl_redis_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                         dl_err *err);
/* Its semaphore (semaphore.c). */
int dl_redis_sem_acquire(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err);
int dl_redis_sem_release(dl_object *o, int64_t permits, dl_err *err);
int dl_redis_sem_available(dl_object *o, int64_t *permits, dl_err *err);
int dl_redis_sem_try_set(dl_object *o, int64_t permits, int *set, dl_err *err);
int dl_redis_sem_add(dl_object *o, int64_t delta, dl_err *err);

/* The backend serving url: the one whose scheme it has, else Redis (whose
 * URL parser explains a bad one). */
const dl_backend *dl_backend_for(const char *url);
/* Records DLOCK_ENOTSUP "<what> is not supported by the <name> backend" on c. */
static inline int dl_backend_unsupported(dlock_client *c, const char *what) {
    dl_err err = {0};
    dl_seterr(&err, DLOCK_ENOTSUP, "%s is not supported by the %s backend", what,
              c->backend->name);
    return dl_client_fail(c, &err);
}

/* ---- pub/sub waiting for non-lock objects (sync.c) ---- */
/* Sends SUBSCRIBE or UNSUBSCRIBE for channel on sub and reads up to its
 * confirmation (messages before it are dropped: callers try again after
 * subscribing anyway). */
int dl_subscribe_cmd(dlock_client *c, dl_conn *sub, const char *cmd, const char *channel,
                     size_t channel_len, dl_err *err);
/* Borrows a connection and subscribes it to channel. */
int dl_sync_subscribe(dlock_client *c, const char *channel, size_t channel_len, dl_conn **out,
                      dl_err *err);
/* Every wait on Redis tries again at least this often, whatever it was told:
 * the backstop for a change that published nothing (a client that does not
 * publish, a manual INCRBY or DEL) or a wake-up that was lost (a woken waiter
 * that hung). dl_sync_wait caps its sleep at it; the lock kinds' scripts cap
 * the wait they return at it or below (lock_plain.c, lock_rw.c, lock_fair.c),
 * and wait.c caps every other kind's. */
#define DL_WAIT_RECHECK_MS 2000

/* Waits for message(s) on o's subscription sub until `until` (monotonic
 * ms), at most DL_WAIT_RECHECK_MS: DLOCK_OK when a message came,
 * DLOCK_ETIMEDOUT at until or at that bound (the caller tries again, and
 * tells its own deadline), DLOCK_ECANCELED once o's operation is cancelled
 * (its wait begun with dl_cancel_begin), or a failure. */
int dl_sync_wait(dl_object *o, dl_conn *sub, int64_t until, dl_err *err);
/* Queues (S)UNSUBSCRIBE from channel on sub, and sends it when flush (sub
 * is then no longer subscribed, its confirmation still to be read:
 * draining). 1 done, 0 failed. */
int dl_send_unsubscribe(dl_conn *sub, const char *channel, size_t channel_len, int flush,
                        int64_t deadline);
/* Sleeps up to left ms until sub has something to read (*ready = 1) or the
 * wait of cx is cancelled (*ready = 0; the caller checks dl_canceled), or
 * time runs out (*ready = 0). DLOCK_OK, or DLOCK_EIO if poll fails. */
int dl_sub_poll(dl_conn *sub, dl_cancel *cx, int64_t left, int *ready, dl_err *err);
/* Sends UNSUBSCRIBE from channel without waiting for the confirmation and
 * returns the connection to its pool; the next user reads the confirmation
 * first (dl_node_get). Saves a round trip on the way out of a wait. */
void dl_unsubscribe_async(dl_conn *sub, const char *channel, size_t channel_len);
/* Unsubscribes and returns the connection (closed if that fails). */
void dl_sync_unsubscribe(dlock_client *c, dl_conn *sub, const char *channel, size_t channel_len);
/* Redis Cluster, a waiter subscribed to channel on *sub: when the channel's
 * slot has moved to another master (an attempt met MOVED; the old master's
 * SUNSUBSCRIBE at the move woke the waiter for it), moves the subscription
 * and the command connection *conn there and sets *moved: the caller
 * attempts again before it waits. Releases publish on the new master's
 * shard; a waiter left on the old one heard nothing (a lock waiter until its
 * re-check, a semaphore waiter until its deadline). */
int dl_follow_slot(dlock_client *c, const char *channel, size_t channel_len, dl_conn **conn,
                   dl_conn **sub, int *moved, dl_err *err);
/* DLOCK_EINVAL unless wait_ms >= 0 or DLOCK_WAIT_FOREVER. */
int dl_sync_check_wait(int64_t wait_ms, dl_err *err);
/* dl_reply_error, but an INCRBY/DECRBY overflow is DLOCK_EOVERFLOW. */
int dl_sync_reply_error(const redisReply *r, const char *what, dl_err *err);

/* ---- lock names on a Redis Cluster (cluster.c) ---- */
/* On a Redis Cluster client: DLOCK_EINVAL when the keys derived from name
 * (a valid name, len resolved) would not share its slot. */
int dl_check_cluster_name(const dlock_client *c, const char *name, size_t len, dl_err *err);
/* On a Redis Cluster client: DLOCK_EINVAL when a latch's channel (from
 * dl_latch_channel) hashes to another slot than the latch's key, as it does
 * for a name with a hash tag of its own. */
int dl_check_cluster_latch(const dlock_client *c, const char *name, size_t len,
                           const char *channel, size_t channel_len, dl_err *err);

/* ---- leases renewed by the watchdog (watchdog.c) ---- */
typedef struct dl_lease dl_lease;
struct dl_lease {
    /* Renewal script: KEYS[i] = key of item i, ARGV[1] = lease ms,
     * ARGV[1+i] = owner of item i; answers an array of 1 (renewed) / 0 (lost). */
    dl_script *renew;
    int64_t lease_ms;
    const char *key;           /* immutable while registered */
    size_t key_len;
    const char *owner;         /* immutable while registered */
    size_t owner_len;
    atomic_int lost;
    atomic_llong last_ok;      /* monotonic ms of the last confirmed lease start */
    int who;                   /* its holder identity key is renewed with it (holder.c) */
    /* the holder's final release is in flight: not renewed, a renewal's "not
     * ours" (the release came first) not taken for a loss, but still lost at
     * its due time if the release has not ended by then */
    atomic_int releasing;
    /* called on the watchdog thread, under its mutex, when found lost */
    void (*on_lost)(dl_lease *lease, int reason);
    size_t wd_slot;            /* guarded by the watchdog's mutex */
    uint64_t wd_seq;
};

int dl_watchdog_register(dlock_client *c, dl_lease *lease, dl_err *err);
void dl_watchdog_unregister(dlock_client *c, dl_lease *lease);
/* Runs fn(arg) under the watchdog's mutex (as is, when the client has no
 * watchdog yet): to change what an on_lost callback reads. */
void dl_watchdog_locked(dlock_client *c, void (*fn)(void *), void *arg);
void dl_watchdog_free(dl_watchdog *wd);

/* ---- locks (lock.c, wait.c, lock_<kind>.c) ---- */

/* Result of one acquire attempt. */
typedef struct dl_try {
    int acquired;
    uint64_t fence;
    int64_t count;             /* hold count after acquiring (reentrant kinds) */
    int64_t pttl;              /* not acquired: ms to wait at most before retrying
                                * (-1: no expiry known) */
    int unfenced;              /* failed with DL_FENCE_ERR: the script took the
                                * lock, which the caller must give back */
} dl_try;

typedef struct dl_kind_ops dl_kind_ops;

/* The script call of one operation, described rather than run, so that the
 * same call can go to one server or to every RedLock node. */
enum { DL_OP_ACQUIRE = 1, DL_OP_RELEASE = 2, DL_OP_EXTEND = 3 };
struct dl_call {
    dl_script *script;
    int nkeys, nargs;
    const char *keys[4];
    size_t keylens[4];
    const char *args[6];
    size_t arglens[6];
    char num[24];              /* the lease, in decimal, when an argument */
    char expect[24];           /* a release's expected count (dl_owner_expect) */
    int binary_release;        /* release answers 1 released / 0 not ours
                                * (else 1 released, 0 still held, -1 not ours) */
};

struct dlock_lock {
    dlock_client *c;
    dlock_kind kind;
    const dl_kind_ops *ops;
    char *name;
    size_t name_len;
    char *fence_key;           /* redisson_lock_token:{name} */
    size_t fence_key_len;
    char *channel;             /* the channel a waiter subscribes to */
    size_t channel_len;
    void *kdata;               /* the kind's own state (extra keys...) */
    int listening;             /* the attempt under way is made while subscribed
                                * to l->channel (wait.c sets it) */

    char token[96];            /* owner: plain 32 hex; others uuid:tid */
    size_t token_len;
    int64_t holds;             /* this handle's hold count */
    int64_t lease_ms;          /* lease of the current hold */
    int watchdog;              /* registered with the watchdog */
    int64_t expires_at;        /* monotonic ms: the lease surely holds until then */
    uint64_t fence;
    dlock_lost_fn lost_fn;
    void *lost_ud;
    /* holder identity (holder.c): "dlock_holder:{name}:<owner>" and its value */
    char *who_key;
    size_t who_key_len, who_prefix_len;
    char *who_val;
    size_t who_val_cap;
    dl_call who_post;
    char who_mode[2];
    char who_lease[24];
    char errmsg[DL_ERRMSG_MAX];
    dl_lease lease;
    void *bdata;               /* another backend's per-lock state */
    dl_cancel cancel;          /* dlock_lock_cancel */
};

/* RedLock's allowance for clock drift over a lease: lease / 100 + 2 ms. A
 * RedLock hold is counted valid for the lease less this, from just before
 * the request that started it (acquire, extend, watchdog renewal). */
static inline int64_t dl_redlock_drift_ms(int64_t lease_ms) { return lease_ms / 100 + 2; }

/* What a hold's validity leaves out of its lease: RedLock's clock drift. */
static inline int64_t dl_lease_margin(const dlock_lock *l, int64_t lease_ms) {
    return l->c->mode == DL_MODE_REDLOCK ? dl_redlock_drift_ms(lease_ms) : 0;
}

/* dlock_lock_valid_ms of a handle: 0 when it holds nothing, was marked lost
 * or its hold surely ended; the watchdog's last renewal counts. */
static inline int64_t dl_hold_valid_ms(const dlock_lock *l) {
    if (l->holds <= 0 || atomic_load(&l->lease.lost)) return 0;
    int64_t until = l->expires_at;
    if (l->watchdog) {
        int64_t renewed = (int64_t)atomic_load(&l->lease.last_ok) + l->lease_ms -
                          dl_lease_margin(l, l->lease_ms);
        if (renewed > until) until = renewed;
    }
    int64_t left = until - dl_now_ms();
    return left > 0 ? left : 0;
}

/* ---- owners and their holds (owner.c) ---- */
/* The holds l's owner should have on the server before a release of l: the
 * sum of this client's handles' counts (owner.c, "holds per owner"), in
 * decimal into buf (24 bytes); "" (returns 0) when not known (an untracked
 * kind, no record, a hold that went unrecorded). The release scripts of the
 * counted kinds take it last: a count already below it means this release
 * was applied before (a copy of the request), and changes nothing. */
size_t dl_owner_expect(dlock_lock *l, char *buf);
/* l's hold count becomes v, and its record with it; returns the owner's sum
 * over this client's handles afterwards (-1: unknown or not counted). */
int64_t dl_set_holds(dlock_lock *l, int64_t v);
/* Frees the client's records (at dlock_client_free). */
void dl_owned_free(dlock_client *c);
/* "<client id>:<thread id>" into l->token. */
int dl_owner_thread(dlock_lock *l, dl_err *err);

/* dlock_acquire without noting where cancels stand (l->cancel_seen): for
 * dlock_multi_acquire, which notes it for every lock of the set first. */
int dl_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, uint64_t *fence);
/* Restarts the lease of l's hold (its lease_ms from now), owner-checked,
 * leaving the watchdog as it is: DLOCK_OK (nothing to do for a hold kept by
 * a session); DLOCK_ELOST, the handle marked as no longer holding, when the
 * server no longer gives it to this owner; or a failure code (the handle
 * unchanged). */
int dl_lock_reexpire(dlock_lock *l, dl_err *err);
/* Records err as l's message; returns its code. */
int dl_lock_fail(dlock_lock *l, const dl_err *err);

/* Sets DLOCK_ECANCELED for lock l's wait in err. cancel.c. */
int dl_cancel_err(dlock_lock *l, dl_err *err);

/* What a lock kind does; one table per kind, one file per kind. */
struct dl_kind_ops {
    dlock_kind kind;
    const char *name;
    int reentrant;
    /* l->channel is this waiter's own (no one else listens on it, and no
     * release publishes on it once the waiter stopped waiting): its
     * subscription may linger after an acquire (dl_node_put_linger) */
    int own_channel;
    /* sets up l->channel (and l->kdata) when the handle is created */
    int (*init)(dlock_lock *l, dl_err *err);
    void (*destroy)(dlock_lock *l);
    /* writes the owner of a new hold into l->token (may update l->channel) */
    int (*owner)(dlock_lock *l, dl_err *err);
    /* one attempt; wait_ms is the caller's remaining wait (0 try once,
     * -1 forever) for kinds that queue */
    int (*attempt)(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms, dl_try *t,
                   dl_err *err);
    /* a message on l->channel: returns 0 to try again now, -1 to try again
     * in t->pttl ms (or when the next message comes). A message never hands
     * the lock over by itself: the attempt that follows takes it (and, being
     * a write on the waiter's own connection, lets WAIT cover it) */
    int (*message)(dlock_lock *l, const redisReply *msg, dl_try *t);
    /* stops waiting (leave a queue); best effort, may be NULL */
    void (*abandon)(dlock_lock *l, dl_conn *conn);
    /* releases one hold: *res 1 released fully, 0 still held, -1 not ours */
    int (*release)(dlock_lock *l, dl_conn *conn, long long *res, dl_err *err);
    /* sets the lease: *res 1 done, 0 not ours */
    int (*extend)(dlock_lock *l, dl_conn *conn, int64_t lease_ms, long long *res, dl_err *err);
    /* server's view: held by this owner, and hold count */
    int (*check)(dlock_lock *l, dl_conn *conn, int *held, int64_t *count, dl_err *err);
    dl_script *renew;
    /* describes an operation's script call; kinds that have it can run on
     * RedLock (redlock.c) and may use the dl_call_* functions as their
     * attempt / release / extend. NULL: single server only. */
    void (*call)(dlock_lock *l, int op, int64_t lease_ms, dl_call *call);
    /* each acquire call has an owner of its own (a fresh token): a hold
     * found under it after a lost reply is that call's (wait.c) */
    int unique_owner;
    /* its acquire, release and extend scripts keep the holder identity
     * record themselves (dl_who_inline), not the script after them */
    int who_inline;
};

/* ---- holder identity (holder.c) ---- */
#define DL_WHO_PREFIX "dlock_holder:" /* the records' keys: dlock_holder:{name}:<owner> */

/* ---- semaphore changes counted once (semaphore.c) ----
 * A release or add of a Redis semaphore writes DL_SEM_CHANGE_PREFIX{name}:<id>
 * beside the counter, alive DL_SEM_CHANGE_ID_MS: a copy of the same change
 * arriving while it lives is not counted again. */
#define DL_SEM_CHANGE_PREFIX "dlock_semchg:"
#define DL_SEM_CHANGE_ID_BYTES 16
#define DL_SEM_CHANGE_ID_MS 60000
/* The identity script to run after l's next script call (conn->post), or
 * NULL when the client records no identity. mode: 'a' acquire (first hold),
 * 'r' re-entry, 'e' extend, 'd' release. */
dl_call *dl_who_post(dlock_lock *l, char mode, int64_t lease_ms);
/* For kinds whose own scripts keep the record (dl_kind_ops.who_inline):
 * l's record key for its current owner, and with value set (an acquire)
 * the record to write; 0, or -1 when the client records none (or out of
 * memory: no record then). */
int dl_who_inline(dlock_lock *l, const char **key, size_t *key_len, const char **value,
                  size_t *value_len);
/* Queues on conn (EVALSHA, or EVAL when by_text) the renewal of the
 * identity keys of n holds (lock key and owner each) to lease_ms, for those
 * still held; one reply. */
int dl_who_renew_append(dl_conn *conn, int by_text, const char *const *locks,
                        const size_t *locklens, const char *const *owners,
                        const size_t *ownerlens, size_t n, int64_t lease_ms, dl_err *err);

int dl_call_attempt(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms, dl_try *t,
                    dl_err *err);
int dl_call_release(dlock_lock *l, dl_conn *conn, long long *res, dl_err *err);
int dl_call_extend(dlock_lock *l, dl_conn *conn, int64_t lease_ms, long long *res, dl_err *err);
/* Maps a release answer to 1 released / 0 still held / -1 not ours. */
long long dl_call_release_result(const dl_call *call, long long v);

/* RedLock versions of the generic lock steps (redlock.c). */
int dl_redlock_wait(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_try *t, dl_err *err);
int dl_redlock_release(dlock_lock *l, long long *res, dl_err *err);
int dl_redlock_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err);
int dl_redlock_check(dlock_lock *l, int *held, int64_t *count, dl_err *err);

extern const dl_kind_ops dl_plain_ops;
extern const dl_kind_ops dl_reentrant_ops;
extern const dl_kind_ops dl_fair_ops;
extern const dl_kind_ops dl_read_ops;
extern const dl_kind_ops dl_write_ops;

/* wait_replicas: WAIT for c->wait_replicas replicas to have conn's latest
 * write, at most timeout_ms; *acks the count the server answered. The
 * reply is read until io_deadline (0: timeout_ms plus the command timeout
 * from now). scripts.c. */
int dl_conn_wait_replicas(const dlock_client *c, dl_conn *conn, int64_t timeout_ms,
                          int64_t io_deadline, long long *acks, dl_err *err);
/* Tries, and waits through pub/sub until acquired or deadline. */
int dl_lock_wait(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_try *t, dl_err *err);
/* Parses {1, fence[, count]} | {0, pttl} answers of acquire scripts. */
int dl_parse_attempt(dlock_lock *l, redisReply *r, int64_t t0, int64_t lease_ms, dl_try *t,
                     dl_err *err);

#endif
