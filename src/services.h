/* The services layer (docs/design.md, "Layers"): running scripts on one
 * server or several at once, cancelling a wait, the pub/sub service (its
 * subscribed connections, lingering ones included, and waiting on them),
 * and the lease-renewal thread. Included by the layer above (kinds.h) and
 * by scripts.c, fanout.c, cancel.c, pubsub.c, sync.c and renewer.c. */
#ifndef DLOCK_SERVICES_H
#define DLOCK_SERVICES_H

#include "topology.h"

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
#define DL_EVAL_PING_FIRST 1
int dl_eval_opt(dl_conn *c, int64_t deadline, int opts, dl_script *s, int nkeys,
                const char **keys, const size_t *keylens, int nargs, const char **args,
                const size_t *arglens, redisReply **out, dl_err *err);

/* Runs a script by EVALSHA, falling back to EVAL on NOSCRIPT.
 * keys/args are binary-safe (lens). */
int dl_eval(dl_conn *c, int64_t deadline, dl_script *s, int nkeys, const char **keys,
            const size_t *keylens, int nargs, const char **args, const size_t *arglens,
            redisReply **out, dl_err *err);

/* One script call as it goes on the wire, for the callers that queue their
 * requests themselves (a pipeline, a fan-out). */
typedef struct dl_eval_req {
    dl_script *s;
    const char *pre;           /* a command sent right before it (ASKING,
                                * PING), its reply read and dropped; or NULL */
    int with_prev;             /* reads what the request before it wrote (a
                                * holder record after its lock's script): sent
                                * again whenever that one is */
    int nkeys, nargs;
    const char *const *keys;
    const size_t *keylens;
    const char *const *args;
    const size_t *arglens;
} dl_eval_req;

/* Queues q (its pre first) by SHA (EVALSHA), or by its text (EVAL). */
int dl_eval_queue(dl_conn *c, const dl_eval_req *q, int by_text, dl_err *err);
/* The NOSCRIPT fallback, for every caller: *r is the reply to q, sent by
 * SHA unless *by_text. When the server's script cache lacks the script
 * (NOSCRIPT: SCRIPT FLUSH, a restart, a failover), frees *r, sets it NULL
 * and *by_text, and queues q by its text, which loads it: the reply to that
 * (the caller flushes) takes r's place. Otherwise *r stands. DLOCK_OK, or
 * the failure to queue (*r NULL then too). */
int dl_eval_fallback(dl_conn *c, const dl_eval_req *q, int *by_text, redisReply **r,
                     dl_err *err);
/* Reads the replies to the n requests queued and flushed on c by SHA
 * (dl_eval_queue) into out[i]: those that came back NOSCRIPT, and the
 * with_prev requests behind them, go again by text in one write
 * (dl_eval_fallback), their replies read into their place. On a failure the
 * replies read until then stay in out (NULL for the others; the caller
 * frees them all). */
int dl_eval_read_all(dl_conn *c, int64_t deadline, const dl_eval_req *q, size_t n,
                     redisReply **out, dl_err *err);
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
/* The script call of one operation, described rather than run, so that the
 * same call can go to one server or to every RedLock node. */
enum { DL_OP_ACQUIRE = 1, DL_OP_RELEASE = 2, DL_OP_EXTEND = 3 };
struct dl_call {
    dl_script *script;
    int nkeys, nargs;
    int opts;                  /* dl_eval_opt's options (DL_EVAL_PING_FIRST) */
    const char *keys[6];
    size_t keylens[6];
    const char *args[8];
    size_t arglens[8];
    char num[24];              /* the lease, in decimal, when an argument */
    char num2[24], num3[24];   /* other numbers a kind passes */
    char expect[24];           /* a release's expected count (dl_owner_expect) */
    int binary_release;        /* release answers 1 released / 0 not ours
                                * (else 1 released, 0 still held, -1 not ours) */
};
/* Starts a description: no keys, arguments or options yet (the arrays are
 * read only up to nkeys and nargs, so they are left as they are: a call is
 * described twice per acquire and release, and clearing all of it cost
 * more than the rest of the description). */
static inline void dl_call_start(dl_call *call) {
    call->nkeys = call->nargs = 0;
    call->opts = 0;
    call->binary_release = 0;
}

/* wait_replicas: WAIT for c->wait_replicas replicas to have conn's latest
 * write, at most timeout_ms; *acks the count the server answered. The
 * reply is read until io_deadline (0: timeout_ms plus the command timeout
 * from now). */
int dl_conn_wait_replicas(const dlock_client *c, dl_conn *conn, int64_t timeout_ms,
                          int64_t io_deadline, long long *acks, dl_err *err);
/* Interprets an integer script answer; error replies become codes. */
int dl_reply_expect_int(redisReply *r, const char *what, long long *v, dl_err *err);

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
/* Sets DLOCK_ECANCELED "waiting for lock '<name>' was cancelled" in err. */
int dl_cancel_name_err(const char *name, size_t name_len, dl_err *err);
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

/* The handles (object.c and lock.c; kinds.h). */
/* The common part of every handle, lock or synchronizer: its client, its
 * name, the channel its waiters subscribe to, its last message, a backend's
 * state, and the cancel of its operation under way. */
typedef struct dl_handle {
    dlock_client *c;
    char *name;
    size_t name_len;
    char *channel;             /* the channel its waiters subscribe to */
    size_t channel_len;
    char errmsg[DL_ERRMSG_MAX];
    void *backend_state;       /* another backend's per-handle state */
    dl_cancel cancel;          /* dlock_lock_cancel, dlock_semaphore_cancel... */
} dl_handle;

struct dl_object {
    dl_handle h;
    dlock_semaphore_lost_fn lost_fn; /* dlock_semaphore_on_lost (semaphores) */
    void *lost_ud;
};

/* ---- the pub/sub service's connections (pubsub.c) ---- */
/* Sends SUBSCRIBE or UNSUBSCRIBE for channel on sub and reads up to its
 * confirmation (messages before it are dropped: callers try again after
 * subscribing anyway). */
int dl_subscribe_cmd(dlock_client *c, dl_conn *sub, const char *cmd, const char *channel,
                     size_t channel_len, dl_err *err);
/* Borrows a connection and subscribes it to channel. */
int dl_sync_subscribe(dlock_client *c, const char *channel, size_t channel_len, dl_conn **out,
                      dl_err *err);
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
/* Queues (S)UNSUBSCRIBE from channel on sub, and sends it when flush (sub
 * is then no longer subscribed, its confirmation still to be read:
 * draining). 1 done, 0 failed. */
int dl_send_unsubscribe(dl_conn *sub, const char *channel, size_t channel_len, int flush,
                        int64_t deadline);
/* Sends UNSUBSCRIBE from channel without waiting for the confirmation and
 * returns the connection to its pool; the next user reads the confirmation
 * first (dl_node_get). Saves a round trip on the way out of a wait. */
void dl_unsubscribe_async(dl_conn *sub, const char *channel, size_t channel_len);
/* A waiter's subscription outlives its wait: the waiter that holds the lock
 * returns at once, without writing UNSUBSCRIBE. sub (subscribed to channel
 * alone) is kept idle, still subscribed, with its node (within the node's
 * max_idle, idle connections counted); the UNSUBSCRIBE goes out with the
 * connection's next use, or not at all when the next waiter on its node
 * wants the same channel (dl_sub_get). A plain dl_node_get takes such a
 * connection only when its node has no other idle one, and unsubscribes it
 * first. Falls back to dl_unsubscribe_async when it cannot keep it. */
void dl_sub_linger(dl_conn *sub, const char *channel, size_t channel_len);
/* A connection of node n to subscribe to channel with. *subscribed = 1: it
 * already is (a lingering subscription of an earlier wait on the same
 * channel; no I/O was done); 0: the caller subscribes it (an UNSUBSCRIBE
 * from another lingering channel may be queued on it, and goes out with the
 * SUBSCRIBE). */
int dl_sub_get(dl_node *n, const char *channel, size_t channel_len, int64_t deadline,
               dl_conn **out, int *subscribed, dl_err *err);
/* The lingering subscription of node n to channel, if one is kept (no I/O;
 * NULL if none). */
dl_conn *dl_sub_take_linger(dl_node *n, const char *channel, size_t channel_len);

/* ---- waiting on pub/sub (sync.c) ---- */
/* Every wait on Redis tries again at least this often, whatever it was told:
 * the backstop for a change that published nothing (a client that does not
 * publish, a manual INCRBY or DEL) or a wake-up that was lost (a woken waiter
 * that hung). dl_sync_wait caps its sleep at it; the lock kinds' scripts cap
 * the wait they return at it or below (lock_plain.c, lock_rw.c, lock_fair.c),
 * and wait.c caps every other kind's. */
#define DL_WAIT_RECHECK_MS 2000

/* The next message on the subscribed connection sub into *msg (the caller
 * frees it): one already read is taken first, else it sleeps in poll until
 * one arrives. DLOCK_ETIMEDOUT at the monotonic time until (at once when it
 * has passed and none is buffered), DLOCK_ECANCELED (no message, nothing
 * set in err: the caller words it) once the wait of cx is cancelled (cx may
 * be NULL), or a failure (a message that cannot be parsed marks sub
 * broken). The one loop of every wait on pub/sub: the locks' (wait.c) and
 * the objects' (dl_sync_wait). */
int dl_sub_next(dl_conn *sub, dl_cancel *cx, int64_t until, redisReply **msg, dl_err *err);
/* Waits for message(s) on o's subscription sub until `until` (monotonic
 * ms), at most DL_WAIT_RECHECK_MS: DLOCK_OK when a message came,
 * DLOCK_ETIMEDOUT at until or at that bound (the caller tries again, and
 * tells its own deadline), DLOCK_ECANCELED once o's operation is cancelled
 * (its wait begun with dl_cancel_begin), or a failure. */
int dl_sync_wait(dl_object *o, dl_conn *sub, int64_t until, dl_err *err);
/* Sleeps up to left ms until sub has something to read (*ready = 1) or the
 * wait of cx (may be NULL) is cancelled (*ready = 0; the caller checks
 * dl_canceled), or time runs out (*ready = 0). DLOCK_OK, or DLOCK_EIO if
 * poll fails. */
int dl_sub_poll(dl_conn *sub, dl_cancel *cx, int64_t left, int *ready, dl_err *err);
/* DLOCK_EINVAL unless wait_ms >= 0 or DLOCK_WAIT_FOREVER. */
int dl_sync_check_wait(int64_t wait_ms, dl_err *err);
/* dl_reply_error, but an INCRBY/DECRBY overflow is DLOCK_EOVERFLOW. */
int dl_sync_reply_error(const redisReply *r, const char *what, dl_err *err);

/* ---- the lease-renewal service (renewer.c) ----
 * One thread that does what its user registered when it is due: it calls
 * round(ctx) with the user's mutex mu held, first when started, then each
 * time the time round last answered comes or the thread is woken. round
 * does what is due (it may unlock mu for its I/O and lock it again) and
 * answers the next time it has something to do: a time already past calls
 * it again at once, DL_INF_DEADLINE not before a wake. enter and leave (may
 * be NULL) run on the thread before the first round and after the last,
 * without mu. Users: the Redis watchdog (watchdog.c), MySQL's table-mode
 * renewal, etcd's keep-alive. */
typedef struct dl_renewer {
    pthread_mutex_t *mu;       /* the user's: guards what round reads, and stop */
    pthread_cond_t cv;         /* on CLOCK_MONOTONIC */
    pthread_t th;
    int started, stop, woken;  /* under mu */
    int64_t (*round)(void *ctx);
    void (*enter)(void *ctx);
    void (*leave)(void *ctx);
    void *ctx;
} dl_renewer;

void dl_renewer_init(dl_renewer *r, pthread_mutex_t *mu, int64_t (*round)(void *ctx),
                     void (*enter)(void *ctx), void (*leave)(void *ctx), void *ctx);
/* Starts the thread unless it runs (under mu); DLOCK_ESYS "cannot start
 * <what>: ..." when it cannot be created. */
int dl_renewer_start(dl_renewer *r, const char *what, dl_err *err);
/* Calls round again now, or as soon as the one under way ends (under mu). */
void dl_renewer_wake(dl_renewer *r);
/* 1 on the renewal thread itself. */
int dl_renewer_is_self(const dl_renewer *r);
/* Stops the thread after its round under way and joins it (without mu;
 * round is not called again), then frees what init made. */
void dl_renewer_stop(dl_renewer *r);

#endif
