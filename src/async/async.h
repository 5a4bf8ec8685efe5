/* The asynchronous client (include/dlock_async.h), private to src/async/:
 *
 *   loop.c   the binding to the event loop: the adapter's fd slots and its
 *            one timer, over a heap of the client's timers
 *   sentinel.c  Redis Sentinel: the master's address asked of the
 *            sentinels without waiting
 *   pipe.c   a non-blocking RESP connection with its pipeline: requests
 *            queued, replies matched in order, a deadline per request,
 *            failure ending every request once
 *   cluster.c Redis Cluster: a pipe per master (and a subscribed one),
 *            the slot map (CLUSTER SLOTS), requests routed by key,
 *            redirects followed
 *   watch.c  Sentinel: the sentinels asked every second whether the
 *            master moved, the connections to a demoted one closed
 *   subs.c   the subscription service: one subscribed connection per
 *            client (per master with waiters in a cluster: sharded), a
 *            channel -> waiters table, messages dispatched
 *   renew.c  the watchdog: the holds with DLOCK_WATCHDOG leases renewed
 *            from the loop, batched, and their loss found in time
 *   kinds.c  each lock kind's keys and requests, on the blocking kinds'
 *            scripts (a table: plain, reentrant, fair, read, write)
 *   lock.c   the locks' operations (acquire with its wait, release,
 *            extend, cancel) for every kind of the table, and the
 *            client's fair wait time they send
 *   idworker.c the ID worker: ids of the blocking worker's layout, a queue
 *            of nexts served in order from a block one INCRBY reserves
 *   object.c the semaphore's, permit semaphore's and latch's handles and
 *            operations (acquire and await with their wait, release,
 *            count-down...), on the blocking objects' scripts
 *   object_calls.c their public calls: arguments checked, operations started
 *   multi.c  the multi-lock: a set of lock handles taken all or nothing,
 *            in the blocking multi-lock's order, by the public lock calls
 *   client.c the public client: options, URL, process, free
 *
 * Callers never call up this list (scripts/check-loops): a lower file
 * reaches a higher one only through the function pointers it was given
 * (a request's done, a waiter's wake, a timer's fn). */
#ifndef DLOCK_ASYNC_PRIV_H
#define DLOCK_ASYNC_PRIV_H

#include "dlock_async.h"
#include "kinds.h"

typedef struct dlock_async_client dl_aclient;

/* ---- loop.c ---- */
typedef struct dl_atimer dl_atimer;
struct dl_atimer {
    int64_t at;                /* dl_now_ms when due */
    size_t idx;                /* place in the heap + 1; 0: not armed */
    void (*fn)(dl_atimer *t);  /* runs from dl_aloop_run, disarmed first */
    void *arg;
};

/* A socket slot (dlock_async.h, "Slots"): what is wanted of it, what the
 * adapter was told. */
typedef struct dl_aslot {
    int used;                  /* taken by an owner (dl_aloop_slot_new) */
    void *owner;               /* the owner's (a pipe), for dl_aloop_owner */
    int fd, ev;                /* wanted (fd -1: none) */
    int told_fd, told_ev;      /* the adapter's (told_fd -1: nothing) */
    int refused;               /* the adapter's watch of fd failed: the owner
                                * is told at the next dl_aloop_run */
} dl_aslot;

typedef struct dl_aloop {
    dlock_async_adapter ad;
    int has_ad;
    dl_aslot *slots;           /* grown on demand, never shrunk */
    int nslots;
    int nrefused;              /* slots with refused set */
    /* a slot's watch was refused (out of memory): its owner ends the
     * connection (runs from dl_aloop_run, before the timers); returns
     * nonzero when the client is gone (doomed): nothing more runs */
    int (*refused)(struct dl_aloop *lp, int slot, void *owner);
    int64_t told_at;           /* the adapter's timer (dl_now_ms), -1 disarmed */
    dl_atimer **heap;
    size_t n, cap;
} dl_aloop;

void dl_aloop_init(dl_aloop *lp, const dlock_async_adapter *ad);
/* A free slot for owner (the lowest number), or -1 for want of memory. */
int dl_aloop_slot_new(dl_aloop *lp, void *owner);
/* Slot is free for reuse: its socket let go of first. */
void dl_aloop_slot_free(dl_aloop *lp, int slot);
/* The owner of the slot whose wanted socket is fd, or NULL. */
void *dl_aloop_owner(const dl_aloop *lp, int fd);
/* Slot's socket is fd (-1: none), wanted for events. Told to the adapter
 * at the next dl_aloop_sync, but events 0 at once (the fd may be closed). */
void dl_aloop_want(dl_aloop *lp, int slot, int fd, int events);
/* Room for n timers: arming fails for want of memory only beyond it (the
 * client reserves one per handle and one per connection). */
int dl_aloop_reserve(dl_aloop *lp, size_t n);
/* Arms t at `at` (re-arms if armed). DLOCK_OK or DLOCK_ENOMEM. */
int dl_atimer_arm(dl_aloop *lp, dl_atimer *t, int64_t at);
void dl_atimer_stop(dl_aloop *lp, dl_atimer *t);
/* Tells the owners of slots whose watch was refused (lp->refused), then
 * runs each timer due now, once (one armed again while running waits for
 * the next call when it is due later). */
void dl_aloop_run(dl_aloop *lp);
/* The earliest armed time (0 while a refused watch is to be told), or -1. */
int64_t dl_aloop_next(const dl_aloop *lp);
/* Tells the adapter what changed (fds, the timer); a watch refused marks
 * its slot, and the timer is armed for now. */
void dl_aloop_sync(dl_aloop *lp);
/* Every slot told events 0, the timer disarmed, the adapter cleaned up,
 * the slots and the heap freed. */
void dl_aloop_close(dl_aloop *lp);

/* ---- sentinel.c ---- */
/* The sentinels and the master's name (redis-sentinel:// URLs). */
typedef struct dl_asent dl_asent;
/* Takes t's sentinels and master name. */
int dl_asent_new(dl_target *t, dl_asent **out, dl_err *err);
void dl_asent_free(dl_asent *s);
/* The longest asking every sentinel in turn may take. */
int64_t dl_asent_budget(const dl_asent *s, int64_t connect_timeout_ms);
/* One question to the sentinels, one sentinel at a time. */
typedef struct dl_aprobe {
    dl_conn *conn;             /* the sentinel asked now (NULL: none) */
    size_t i;                  /* which */
    size_t tried;              /* sentinels tried for this question */
    int64_t deadline;          /* its answer's (dl_now_ms) */
    dl_err last;               /* the last sentinel's failure */
} dl_aprobe;
/* Asks the next sentinel not tried yet (the one that answered last
 * first; pr->conn closed first by the caller, dl_aprobe_stop): DLOCK_OK
 * with pr->conn connecting, or DLOCK_EIO when every one was tried (the
 * message names the last failure), DLOCK_ENOMEM. */
int dl_aprobe_start(dl_asent *s, dl_aprobe *pr, int64_t connect_timeout_ms, dl_err *err);
/* Asks again on pr->conn, a sentinel that answered (kept open).
 * DLOCK_OK or DLOCK_ENOMEM. */
int dl_aprobe_repeat(dl_asent *s, dl_aprobe *pr, int64_t connect_timeout_ms, dl_err *err);
/* Drives pr->conn with its socket's events: 0 no answer yet; 1 answered,
 * *host (malloc'd) and *port the master's; -1 this sentinel failed (start
 * the next); -2 out of memory (err). Unless 0, the caller lets the loop go
 * of the socket and closes it (dl_aprobe_stop). */
int dl_aprobe_io(dl_asent *s, dl_aprobe *pr, int events, char **host, int *port, dl_err *err);
/* 1 when the sentinel asked did not answer by its deadline (the caller
 * then closes it and asks the next). */
int dl_aprobe_timed_out(dl_asent *s, dl_aprobe *pr);
/* The events pr->conn waits for (DLOCK_ASYNC_*). */
int dl_aprobe_events(const dl_aprobe *pr);
/* Closes the question's connection (none: no-op). */
void dl_aprobe_stop(dl_aprobe *pr);

/* ---- pipe.c ---- */
typedef struct dl_areq dl_areq;
/* A request's end: r its reply (freed by the pipe after), or NULL with err
 * set when the connection failed before it came. Runs once. */
typedef void (*dl_areq_fn)(dl_areq *q, redisReply *r, const dl_err *err);
struct dl_areq {
    dl_areq *next;
    dl_areq_fn done;
    int64_t deadline;
    struct dl_apipe *pipe;     /* the pipe it was last queued on */
    /* a cluster pipe's request (dl_apipe.keep): its bytes as sent, to send
     * again elsewhere after a redirect (freed before done runs) */
    char *raw;
    size_t rawlen;
    int redirects;             /* redirections followed so far */
    int asked;                 /* last sent with ASKING (an ASK): a TRYAGAIN
                                * sends it with ASKING again */
    uint64_t end;              /* the pipe's qbytes once its request was queued */
};

typedef struct dl_apipe dl_apipe;
/* at least every script the async client sends (36: kinds.c's 18, the
 * kinds' 5 renewals, object.c's 13); one beyond goes by its text always */
#define DL_APIPE_LOADED 40
struct dl_apipe {
    dl_aclient *cl;
    int slot;                  /* the loop's fd slot */
    dl_conn *conn;             /* NULL: closed (opened by the next request) */
    int ready;                 /* connected, handshake answered (Sentinel:
                                * and the server confirmed a master) */
    /* Sentinel: while the master is asked for (probe) and confirmed
     * (role), requests queue into held, a connection that never opens,
     * and go to the master once it answers ROLE as one */
    dl_aprobe probe;
    dl_conn *held;
    int role;                  /* ROLE's reply is the next after the handshake */
    unsigned gen;              /* the client's ep_gen conn was opened to */
    int64_t connect_deadline;
    dl_areq *head, *tail;      /* requests waiting for their replies, in order */
    size_t pending;
    /* the bytes the requests queued on this connection (held, then conn)
     * since it opened: a request whose end is past what left the client
     * (qbytes - conn->olen) cannot have been answered yet, so a reply
     * then is an extra one (a request the network doubled) and the
     * connection is out of step */
    uint64_t qbytes;
    dl_atimer timer;           /* the head request's deadline (connect too) */
    /* a reply no request waits for (a pub/sub message): 1 taken, 0 not
     * (the connection is then out of step). NULL: none expected. */
    int (*push)(dl_apipe *p, redisReply *r);
    /* the connection closed after a failure, its requests ended (NULL: none) */
    void (*down)(dl_apipe *p, const dl_err *err);
    /* a new connection was opened: queues what must go before the request
     * that opened it (NULL: none) */
    void (*up)(dl_apipe *p);
    /* the scripts already sent by their text on this connection: a script's
     * first request on a connection goes by its text (EVAL), which loads it
     * for the requests pipelined behind it, so that a burst on a server
     * whose script cache is cold is not answered NOSCRIPT request by
     * request and sent again whole */
    const dl_script *loaded[DL_APIPE_LOADED];
    int nloaded;
    const dl_endpoint *ep;     /* where it connects (NULL: the client's) */
    int sharded;               /* a Redis Cluster node: sharded scripts */
    const dl_err *gate;        /* code set: opening refused with it */
    /* a Redis Cluster node's: each request's bytes are kept (areq.raw), and
     * an error reply is shown to redirect first: 1 when it took the request
     * (sent elsewhere, delayed or ended), 0 to give the reply to its done */
    int keep;
    int (*redirect)(dl_apipe *p, dl_areq *q, const redisReply *r);
};

void dl_apipe_init(dl_apipe *p, dl_aclient *cl, int slot);
/* Opens the connection if closed. DLOCK_OK, or the failure (nothing
 * changed). */
int dl_apipe_open(dl_apipe *p, dl_err *err);
/* The server's script cache was found empty (NOSCRIPT): each script's next
 * request goes by its text again. */
void dl_apipe_forget_scripts(dl_apipe *p);
/* Queues argv as q's request (q->done set by the caller), opening the
 * connection if needed; q's deadline is set. Flushed by the loop. */
int dl_apipe_command(dl_apipe *p, dl_areq *q, int argc, const char **argv, const size_t *lens,
                     dl_err *err);
/* Queues script s (EVALSHA, or EVAL by_text) as q's request. */
int dl_apipe_eval(dl_apipe *p, dl_areq *q, dl_script *s, int by_text, int nkeys,
                  const char **keys, const size_t *keylens, int nargs, const char **args,
                  const size_t *arglens, dl_err *err);
/* Queues q again on p with the bytes it was sent with (q->raw), ASKING
 * first when asking; the bytes are p's to free. DLOCK_OK, or the failure
 * (q not queued, its bytes freed). */
int dl_apipe_resend(dl_apipe *p, dl_areq *q, int asking, dl_err *err);
/* Reads and writes what p's socket allows (events: DLOCK_ASYNC_*), ending
 * requests whose replies came; on a failure, closes and ends every request
 * with it. */
void dl_apipe_io(dl_apipe *p, int events);
/* Closes the connection, ending each request with err (code and message). */
void dl_apipe_fail(dl_apipe *p, const dl_err *err);
/* Tells the loop what p's socket waits for. */
void dl_apipe_update(dl_apipe *p);
/* The socket p waits on now (the sentinel asked, or the server), or -1. */
int dl_apipe_fd(const dl_apipe *p);
/* 1 when requests queued now go out on the connection there is (open, or
 * being opened), 0 when the next request would open one. */
int dl_apipe_opened(const dl_apipe *p);

/* ---- watch.c ---- */
/* Sentinel (c->sent set): sets c->named and the watch's timer. */
void dl_awatch_init(dl_aclient *c);
/* The events of the watch's socket (slot wslot). */
void dl_awatch_io(dl_aclient *c, int events);
/* Stops watching (client free). */
void dl_awatch_close(dl_aclient *c);

/* ---- cluster.c ---- */
typedef struct dl_acluster dl_acluster;
/* Cluster mode for c: a node (its pipe and its subscribed pipe) per seed
 * of t, each pipe's up hook up, each subscribed pipe set up by sub_init. On a failure c->cluster may be half made (dl_acluster_free). */
int dl_acluster_new(dl_aclient *c, dl_target *t, void (*up)(dl_apipe *p),
                    void (*sub_init)(dl_apipe *p), dl_err *err);
/* Ends the requests waiting to be sent again (TRYAGAIN) with err. */
void dl_acluster_end(dl_aclient *c, const dl_err *err);
void dl_acluster_free(dl_aclient *c);
/* The pipe for a request on key: the command pipe of one server, the pipe
 * of the key's slot owner in a cluster (the map refreshed when stale). */
dl_apipe *dl_aroute(dl_aclient *c, const char *key, size_t len);
/* The command pipes: how many, and the i-th (NULL past the end). */
size_t dl_apipe_count(const dl_aclient *c);
dl_apipe *dl_apipe_nth(dl_aclient *c, size_t i);
/* The subscribed pipes, as many: the i-th (NULL past the end). */
dl_apipe *dl_asubpipe_nth(dl_aclient *c, size_t i);
/* The subscribed pipe for channel: the client's one, or in a cluster the
 * one of the master of the channel's slot (sharded pub/sub). */
dl_apipe *dl_asub_route(dl_aclient *c, const char *chan, size_t len);
/* r, an error reply, says MOVED: the map is updated (and refreshed). */
void dl_acluster_moved(dl_aclient *c, const redisReply *r);

/* ---- subs.c ---- */
typedef struct dl_awaiter dl_awaiter;
struct dl_awaiter {
    dl_awaiter *next;          /* on its channel */
    struct dl_achan *chan;     /* NULL: not in the table */
    /* its channel said something (a message), or became subscribed
     * (confirmed: subscribed 1). Never for a waiter that left. */
    void (*wake)(dl_awaiter *w, int confirmed);
    /* the subscribed connection failed: the waiter is out of the table */
    void (*lost)(dl_awaiter *w, const dl_err *err);
    /* a message, its payload msg: called instead of wake(w, 0) when set */
    void (*message)(dl_awaiter *w, const redisReply *msg);
};

typedef struct dl_asubs {
    dl_apipe pipe;
    struct dl_achan **buckets;
    size_t nbuckets, nchans;
} dl_asubs;

/* slot: the loop's slot of its connection */
void dl_asubs_init(dl_asubs *s, dl_aclient *cl, int slot);
/* A subscribed pipe's hooks (its messages and failure go to cl->subs). */
void dl_asubs_pipe_init(dl_apipe *p);
/* w (not in the table) waits on channel: SUBSCRIBE goes out when it is the
 * channel's first waiter, and w->wake(w, 1) runs once it is confirmed; a
 * channel confirmed already is not told again (dl_asubs_subscribed). */
int dl_asubs_join(dl_asubs *s, dl_awaiter *w, const char *channel, size_t len, dl_err *err);
/* 1 when w's channel is confirmed subscribed. */
int dl_asubs_subscribed(const dl_awaiter *w);
/* w leaves (no-op when not in): UNSUBSCRIBE when it was the last. */
void dl_asubs_leave(dl_asubs *s, dl_awaiter *w);
/* Frees the table (every waiter left first). */
void dl_asubs_free(dl_asubs *s);

/* ---- renew.c ---- */
/* A hold the watchdog renews (a DLOCK_WATCHDOG lease), inside its handle. */
typedef struct dl_alease dl_alease;
struct dl_alease {
    /* the kind's renewal script: KEYS[i] lock key, ARGV[1] lease,
     * ARGV[1+i] owner -> an array of 1 (renewed) / 0 (not ours) */
    dl_script *renew;
    const char *key, *owner;   /* the handle's; unchanged while registered */
    size_t key_len, owner_len;
    int64_t lease_ms;
    int64_t last_ok;           /* dl_now_ms before the request that last
                                * started the lease (acquire or renewal) */
    int releasing;             /* its final release is out: not renewed, and a
                                * renewal's "not ours" is not a loss */
    unsigned hslot;            /* the key's hash slot in a cluster, else 0 */
    size_t slot;               /* place in the table + 1; 0: not registered */
    uint64_t seq;              /* registration number (a slot is reused) */
    /* found lost (DLOCK_LOST_TAKEN, DLOCK_LOST_UNREACHABLE): unregistered
     * first; runs on the loop thread, from dlock_async_process */
    void (*lost)(dl_alease *l, int reason);
    void *arg;                 /* the holder's (lost's) */
};

typedef struct dl_arenew_slot {
    dl_alease *l;              /* NULL: free */
    uint64_t seq;
} dl_arenew_slot;

typedef struct dl_arenew {
    dl_aclient *cl;
    dl_arenew_slot *slots;
    size_t nslots, cap, count;
    size_t *freelist;          /* free slot indexes, cap of them room */
    size_t nfree;
    uint64_t next_seq;
    int64_t next_round;        /* dl_now_ms of the next round (-1: none) */
    size_t out;                /* the current round's requests awaiting replies */
    int failed;                /* a request of the current round failed */
    dl_atimer timer;           /* the next round or the earliest due time */
} dl_arenew;

void dl_arenew_init(dl_arenew *r, dl_aclient *cl);
/* l (last_ok, lease_ms, renew, key, owner and lost set) is renewed from now
 * on, every third of its lease. DLOCK_OK or DLOCK_ENOMEM. */
int dl_arenew_add(dl_arenew *r, dl_alease *l, dl_err *err);
/* l is renewed no more (no-op when not registered). */
void dl_arenew_remove(dl_arenew *r, dl_alease *l);
/* When l's hold is lost unless a renewal is confirmed first. */
int64_t dl_alease_due(const dl_alease *l);
/* Frees the table (every lease removed, every request ended first). */
void dl_arenew_free(dl_arenew *r);

/* ---- kinds.c ---- */
/* A lock request: what it is and the state it is built from. */
enum { DL_AR_ATTEMPT = 1, DL_AR_RELEASE, DL_AR_EXTEND, DL_AR_ABANDON };
typedef struct dl_aargs {
    int what;                  /* DL_AR_* (a give back is a release) */
    const char *token;         /* the owner (plain: the acquire's token) */
    size_t token_len;
    int64_t lease_ms;
    int queue;                 /* an attempt that waits: registers, queues */
    int reg;                   /* registered / queued by an earlier attempt
                                * of the same acquire */
    int joining;               /* sent before its channel was confirmed */
    int64_t held;              /* the handle's holds when it was sent */
    int64_t expect;            /* a release: the owner's count expected */
    int64_t fair_wait_ms;      /* the client's fair wait time W (0: the default) */
} dl_aargs;

/* One script call as built (pointers into the keys and into itself). */
typedef struct dl_acall {
    dl_script *s;
    int nkeys, nargs;
    const char *keys[5];
    size_t keylens[5];
    const char *args[8];
    size_t arglens[8];
    char lease[24], expect[24], wait[24];
} dl_acall;

#define DL_AKEYS_MAX 6
typedef struct dl_akeys dl_akeys;
typedef struct dl_akind {
    dlock_kind kind;
    int fresh_owner;           /* a new token per acquire (plain), else the
                                * handle's owner */
    int counted;               /* holds are counted per owner: an acquire
                                * re-enters, a release takes the expected
                                * count and answers 1 / 0 still held / -1 */
    int abandons;              /* a waiter that gives up runs the abandon
                                * (the fair one also gives back a grant) */
    const struct dl_akeyspec *keys;
    int chan;
    void (*call)(const dl_akeys *k, const dl_aargs *a, dl_acall *c);
    /* a message on the channel: 1 with *ms to come back in ms, not now */
    int (*message)(const redisReply *msg, int64_t *ms);
    const dl_kind_ops *ops;    /* the blocking kind: its watchdog's renewal script */
} dl_akind;

/* A handle's keys and owner, shared with the requests that outlive it;
 * one allocation (the strings in buf). */
struct dl_akeys {
    int refs;
    uint32_t owner_len, chan_len;
    uint32_t len[DL_AKEYS_MAX];
    const dl_akind *kind;
    char *owner;               /* the handle's owner ("": plain) */
    char *chan;                /* the channel its waiters subscribe to */
    char *s[DL_AKEYS_MAX];     /* the kind's keys, [0] the lock's name */
    char buf[];
};

/* The kind's table entry, or NULL when the async API lacks it. */
const dl_akind *dl_akind_of(dlock_kind kind);
/* The keys of lock name for kind (an owner made for the kinds that keep
 * one per handle); NULL with err on failure. */
dl_akeys *dl_akeys_new(const dl_akind *kind, const char *name, size_t len, dl_err *err);
void dl_akeys_unref(dl_akeys *k);
/* A plain acquire's token: its waiter channel becomes prefix + token. */
void dl_akeys_token(dl_akeys *k, const char *token);
/* Builds a's request for k's kind into c. */
static inline void dl_akind_call(const dl_akeys *k, const dl_aargs *a, dl_acall *c) {
    k->kind->call(k, a, c);
}

/* ---- client.c: the client ---- */
struct dlock_async_client {
    dl_endpoint ep;            /* the server (Sentinel: the master named last;
                                * host NULL before the first answer) */
    dl_asent *sent;            /* Sentinel: the sentinels; NULL otherwise */
    unsigned ep_gen;           /* counts the master's moves (Sentinel) */
    /* Sentinel: a connection to the master named (ep, ep_gen) was opened
     * (watch.c's: closes the others to an older master, watches) */
    void (*named)(dl_aclient *c);
    int wslot;                 /* Sentinel: the watch's socket slot */
    dl_aprobe wprobe;          /* Sentinel: the watch's question (slot wslot);
                                * its connection is kept between questions */
    int wasking;               /* the question is out on wprobe.conn */
    dl_atimer wtimer;          /* its next question, or its answer's deadline */
    int64_t connect_timeout_ms, command_timeout_ms;
    dl_aloop loop;
    dl_apipe cmd;              /* slot 0: scripts (one server) */
    dl_acluster *cluster;      /* Redis Cluster: the node pipes, the slot map
                                * (NULL: one server, cmd) */
    dl_asubs subs;             /* slot 1: the subscribed connection */
    int64_t watchdog_lease_ms; /* DLOCK_WATCHDOG's lease, renewed every third */
    int wait_replicas;         /* an acquire / extend WAITs for that many
                                * replicas (lock.c), up to the timeout */
    int64_t wait_replicas_timeout_ms;
    int64_t fair_wait_ms;      /* the fair lock's W from the next attempt on
                                * (dlock_async_client_set_fair_wait); 0: the
                                * default, DLOCK_DEFAULT_FAIR_WAIT_MS */
    dl_arenew renew;           /* the watchdog's holds */
    struct dlock_async_lock *locks; /* every live handle */
    size_t nlocks;
    struct dl_asettle *settle; /* acquires to give back (outcome unknown) */
    struct dlock_async_object *objs; /* every live object handle (object.c) */
    size_t nobjs;
    struct dl_aoreq *osettle;  /* the objects' requests owed (object.c) */
    struct dlock_async_idworker *idws; /* every live ID worker (idworker.c) */
    size_t nidws;
    int depth;                 /* inside dlock_async_process / a callback */
    int freeing;               /* dlock_async_client_free under way (or the
                                * client is unusable): operations refused */
    int doomed;                /* freed from a callback: when the call that
                                * ran it returns */
    void (*destroy)(dl_aclient *c); /* frees a doomed client (client.c) */
    char errmsg[DL_ERRMSG_MAX];
};

/* ---- lock.c ---- */
/* Every pending operation of c ends with DLOCK_ECANCELED, every handle is
 * freed, the acquires to give back are dropped (client free). */
void dl_alock_free_all(dl_aclient *c);
/* A new command connection: queues the releases owed for acquires whose
 * outcome a failure left unknown, first (the pipe's up). */
void dl_alock_pipe_up(dl_apipe *p);
/* What multi.c reads of a handle: its client, keys (name, kind) and hold
 * count. */
dl_aclient *dl_alock_client(const dlock_async_lock *l);
const dl_akeys *dl_alock_keys(const dlock_async_lock *l);
int64_t dl_alock_holds(const dlock_async_lock *l);

/* ---- idworker.c ---- */
/* Every ID worker of c freed, its nexts ended with DLOCK_ECANCELED (client
 * free: from dl_aobj_free_all, before the connections fail). */
void dl_aidw_free_all(dl_aclient *c);

/* ---- object.c ---- */
/* An object operation (DL_AOP_*; NONE: none pending, ONE: one request
 * answers) and its requests (DL_AOR_*: GET, or the blocking objects'
 * scripts). */
enum { DL_AOP_NONE = 0, DL_AOP_SEM_ACQ, DL_AOP_PM_ACQ, DL_AOP_LA_AWAIT, DL_AOP_ONE };
enum { DL_AOR_GET = 1, DL_AOR_SEM_ACQ, DL_AOR_SEM_ADD, DL_AOR_SEM_SET, DL_AOR_PM_ACQ,
       DL_AOR_PM_REL, DL_AOR_PM_RENEW, DL_AOR_PM_AVAIL, DL_AOR_PM_SET, DL_AOR_PM_ADD,
       DL_AOR_LA_CD, DL_AOR_LA_SET, DL_AOR_LA_FORCE };
/* A new handle of kind on c (dlock_async_semaphore_new's contract). */
int dl_aobj_new(dl_aclient *c, const char *name, size_t name_len, dlock_kind kind,
                dlock_async_object **out);
/* Records err as o's message; returns its code. */
int dl_aobj_fail(dlock_async_object *o, const dl_err *err);
/* Starts o's operation type (DL_AOP_*) on an object of kind: its first
 * request what with n (permits, delta, count, lease; a permit acquire's
 * DLOCK_WATCHDOG: the client's watchdog lease, the permit then renewed by
 * renew.c) and raw (a permit's id, or NULL); a waiting type waits up to
 * wait_ms. DLOCK_OK (cb runs
 * once, later), or the failure recorded on o (cb never runs). */
int dl_aobj_start(dlock_async_object *o, dlock_kind kind, int type, int what, int64_t n,
                  const char *raw, int64_t wait_ms, dlock_async_object_fn cb, void *ud);
/* Every pending operation of an object handle of c ends with
 * DLOCK_ECANCELED, every object handle is freed, what was owed is dropped
 * (client free; before dl_alock_free_all fails the connections). */
void dl_aobj_free_all(dl_aclient *c);
/* A new command connection: queues the objects' requests owed (the pipe's
 * up, after dl_alock_pipe_up). */
void dl_aobj_pipe_up(dl_apipe *p);

#endif
