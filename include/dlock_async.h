/*
 * dlock_async: locks, semaphores and latches from an event loop, without a
 * thread per wait.
 *
 * An async client is bound to one event loop, either through an adapter
 * (the library asks the loop to watch its sockets and to arm one timer, and
 * the loop calls dlock_async_process back: include/dlock_async_libuv.h and
 * include/dlock_async_libevent.h are such adapters, header-only, so that
 * libdlock links neither library), or bare: the program asks which sockets
 * to poll for what (dlock_async_fds) and how long it may sleep
 * (dlock_async_timeout), and calls dlock_async_process after its poll.
 *
 * Threads. The client, its handles and every call on them belong to the
 * thread that runs the loop: create, drive and free the client on that
 * thread only (no call here is thread-safe). Every callback runs on that
 * thread, from dlock_async_process, or from dlock_async_cancel,
 * dlock_async_multi_cancel, dlock_async_idworker_free,
 * dlock_async_lock_free, dlock_async_object_cancel, dlock_async_object_free
 * or dlock_async_client_free for the operations they end. A call that starts an operation never runs its callback itself.
 *
 * Operations. dlock_async_acquire, dlock_async_release and
 * dlock_async_extend (and the objects' calls: "the synchronizer objects"
 * below) start an operation and return at once: DLOCK_OK means
 * the callback will run exactly once, later, with the outcome (the same
 * codes as the blocking call); any other code means it was not started and
 * the callback never runs. A handle has at most one operation pending.
 * Requests of all handles share one connection (one per master on a Redis
 * Cluster), pipelined: replies are matched to requests in order. Every request has the client's command
 * timeout as its deadline (the connect timeout too while connecting); a
 * reply that does not come by then closes the connection.
 *
 * Waiting. All waiters of a client share ONE subscribed connection (one
 * per master on a Redis Cluster) with a table from channel to waiters.
 * The keys, scripts and layouts are the
 * blocking API's, so async and blocking clients exclude each other on one
 * name, and a release by either wakes a waiter of either: a plain waiter
 * takes its place in the plain lock's waiter registry and is woken alone
 * on its own channel; a reentrant waiter listens on Redisson's unlock
 * channel; a fair waiter joins the fair lock's queue (FIFO with the
 * blocking waiters) and listens on its own channel, where a release grants
 * it the lock; read and write waiters listen on the read/write lock's
 * channel, a writer entering its waiting writers (writer preference); a
 * semaphore, permit or latch waiter listens on the blocking object's
 * channel. A waiter tries again when its channel says so, when the
 * holder's lease runs out (PTTL; a permit's lease), and at least every 2 s
 * (the backstop of docs/design.md). A lock waiter that gives up (deadline,
 * cancel, failure, its handle or client freed) leaves the registry, the
 * fair queue or the waiting writers.
 *
 * Owner. An async hold's owner is its handle: the plain lock takes a fresh
 * random token for each acquire, as the blocking plain lock does; the
 * reentrant, fair, read and write locks' owner field (Redisson's layouts)
 * is a random token of the handle, made with it (the write side's with
 * ":write"), where the blocking API writes "<client id>:<thread id>" (on
 * one loop thread that would make every handle re-enter every other). So
 * two handles of one client exclude each other (two read handles share the
 * read side, as two readers do), and a handle re-enters only its own hold;
 * a read handle and a write handle are two owners (no downgrade between
 * them).
 *
 * Failures. A connection lost, a server that stops answering, a reply
 * that is not RESP, or a reply that no request sent in full can be waiting
 * for (an extra one, as when the network sends a request twice: the
 * connection is out of step, DLOCK_EIO) ends every operation pending on
 * that connection, each once, with an error (DLOCK_EIO, DLOCK_EPROTO,
 * DLOCK_EAUTH...), but for
 * lock waits: a lock acquire that may wait (wait_ms != 0) and meets
 * DLOCK_EIO with time left waits on, as the blocking wait does, trying
 * again over a new connection after a pause (50 ms, doubling up to 1 s),
 * until it gets the lock or its deadline comes (then it ends with the
 * failure's code and message); the outage may be over before the wait. A
 * lock's acquire or release whose request went out has an unknown outcome
 * and is never sent again by itself (an object's change that may be
 * repeated is sent again once: "Outcomes" below). An acquire whose outcome
 * is unknown is given back (a release with its token, owner-checked) once
 * a connection is open again, before anything else on it, and a wait that
 * ended so leaves the fair queue or the waiting writers then (its abandon
 * is kept until it can be sent); until then the lock runs out with its
 * lease. The next operation opens a new connection.
 *
 * The watchdog. A hold taken with the lease DLOCK_WATCHDOG is renewed from
 * the loop (the client's timer) to the client's watchdog_lease_ms every
 * third of it, by the blocking watchdog's scripts, up to 100 holds per
 * script call and a round's calls pipelined, until it is released or its
 * handle freed; an extend makes it an explicit-lease hold. A renewal that
 * finds the hold gone or another owner's marks it lost
 * (DLOCK_LOST_TAKEN); a hold with no renewal confirmed by the start of the
 * request that last started its lease plus the lease, less
 * DLOCK_LOST_MARGIN_MS(lease), is marked lost then (DLOCK_LOST_UNREACHABLE),
 * whether renewals fail or hang: before the server can expire it. That
 * bound holds while the loop turns; a loop blocked past it tells late, so
 * check dlock_async_lock_valid_ms before work that must not outlive the
 * hold. A lost hold is renewed no more and its valid time is 0; the handle
 * still counts as holding until a release (DLOCK_ELOST, or DLOCK_OK if the
 * server still had it) or a new acquire of a reentrant handle.
 * A permit taken with DLOCK_WATCHDOG (dlock_async_permits_acquire) is kept
 * the same way, in the same rounds, by the blocking watchdog's script for
 * permits, until it is released or renewed by id through its handle, or
 * the handle is freed; its loss goes to dlock_async_object_on_lost's
 * callback.
 *
 * Sentinel (redis-sentinel://): each new connection first asks the
 * sentinels (one at a time, the one that answered last first, 500 ms
 * each) for the master, then checks with ROLE that it is one; requests
 * queued meanwhile go out once it is. While connected, the sentinels are
 * asked every second (a slot of its own, a connection kept open); when
 * they name another master, or a reply says READONLY (the master was made a replica), the connections to the
 * old one close: their requests end with DLOCK_EIO, an acquire that may
 * wait rides it out, and the next request connects to the new master.
 * As with the blocking client, a failover may lose a hold not yet
 * replicated (Redis replicates asynchronously: wait_replicas narrows
 * this), and for up to about a second after it requests may still reach
 * an old master that answers as one.
 *
 * wait_replicas (one server or Sentinel; DLOCK_ENOTSUP on a cluster): an
 * acquire that won, and an extend, send WAIT wait_replicas
 * wait_replicas_timeout_ms (0: 1000) on the connection their script went
 * on, as the blocking client does: fewer acknowledgements (or the lease
 * run out first) and the acquire is given back and ends with
 * DLOCK_EREPLICAS; the extend ends with DLOCK_EREPLICAS and the hold
 * keeps the shorter of its old and new validity. An acquire cancelled or
 * freed while its WAIT is out is given back. The WAIT holds up the
 * requests pipelined behind it on that connection until it returns.
 *
 * Redis Cluster (redis-cluster://seeds): a connection per master, each
 * request on its key's master (read from CLUSTER SLOTS without blocking;
 * MOVED, ASK and TRYAGAIN followed, at most 5 times, then DLOCK_EIO); lock
 * names whose keys would span slots refused (DLOCK_EINVAL); Redis 7 needed
 * (a node older than that found by the first request: every later request
 * DLOCK_ENOTSUP). Waiters there subscribe with SSUBSCRIBE on the master of
 * their channel's slot (one subscribed connection per such master), and
 * subscribe again where the slot went when it moves (docs/async.md).
 *
 * Not in this version: DLOCK_ENOTSUP for rediss:// (TLS) and RedLock
 * URLs, the other backends (ZooKeeper, etcd, MySQL, PostgreSQL); holder
 * identity has no async calls yet.
 * Host names are resolved with getaddrinfo on the calling thread; a host
 * name with several addresses (localhost: 127.0.0.1 and ::1) is connected
 * the blocking way, within the connect timeout: give an address or a unix
 * socket to never block the loop.
 */
#ifndef DLOCK_ASYNC_H
#define DLOCK_ASYNC_H

#include <stdint.h>

#include "dlock.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dlock_async_client dlock_async_client;
typedef struct dlock_async_lock dlock_async_lock;

/* Socket events (a bit mask). */
#define DLOCK_ASYNC_READ 1
#define DLOCK_ASYNC_WRITE 2
/* How the library asks a loop for events. All three run on the loop's
 * thread, from the library's calls.
 *
 * Slots. Each socket the client watches has a slot: a small integer from
 * 0 up, the lowest free one, and reused after the slot was told events 0.
 * How many slots a client uses depends on its deployment: one Redis server
 * takes 2 (0 its command connection, 1 its subscribed connection),
 * Sentinel one more (the question whether the master moved), a Redis
 * Cluster 2 more per master it meets (a command and a subscribed
 * connection each); there is no fixed bound, so an adapter grows its
 * table on demand. */
typedef struct dlock_async_adapter {
    void *data; /* passed to each function */
    /* Watch fd for events (DLOCK_ASYNC_READ | DLOCK_ASYNC_WRITE) in slot
     * (>= 0, see "Slots"), replacing what the slot watched; events 0: stop
     * watching the slot's fd, which the library may close right after (this
     * never fails). A slot's fd changes only after a call with events 0.
     * When the fd is ready, call dlock_async_process(client, fd, ready
     * events). Returns 0, or nonzero when the loop cannot watch it (out of
     * memory: the slot then watches nothing); the library ends what waits
     * on that connection with DLOCK_ENOMEM (from dlock_async_process, at
     * once: the timer is armed for now) and opens a new one for the next
     * request. */
    int (*watch)(void *data, int slot, int fd, int events);
    /* Arm the one timer to fire ms (>= 0) from now, replacing the earlier
     * time; ms -1: disarm. When it fires, call
     * dlock_async_process(client, -1, 0). */
    void (*timer)(void *data, int64_t ms);
    /* The client is being freed: after every slot was told events 0 and the
     * timer disarmed. Free what the adapter holds (may be NULL). */
    void (*cleanup)(void *data);
} dlock_async_adapter;

/* The callback of an operation on lock: code is its outcome (below), fence
 * the fencing token of an acquire that succeeded (else 0),
 * dlock_async_lock_errmsg(lock) the message of a failure. It may start
 * operations, cancel them and free handles or the client. */
typedef void (*dlock_async_fn)(dlock_async_lock *lock, int code, uint64_t fence, void *udata);

/* The callback of a watchdog hold found lost (see "The watchdog"): reason
 * DLOCK_LOST_TAKEN or DLOCK_LOST_UNREACHABLE. It runs on the loop thread,
 * from dlock_async_process, and may call any function of this header (free
 * the handle, release, acquire again...). */
typedef void (*dlock_async_lost_fn)(dlock_async_lock *lock, int reason, void *udata);

/* The fair lock's thread wait time W of c's fair-lock waiters, in ms, from
 * their next attempt on, as dlock_client_set_fair_wait sets the blocking
 * client's (see there: the queue entry's deadline is the entry ahead's
 * plus W, a live waiter keeps it at least W ahead of the server's clock,
 * coming back at least every min(W, DLOCK_DEFAULT_FAIR_WAIT_MS) / 3 ms,
 * and a waiter that stopped coming back keeps its place until its
 * deadline). Default DLOCK_DEFAULT_FAIR_WAIT_MS; a queue shared with
 * Redisson clients needs theirs (DLOCK_REDISSON_FAIR_WAIT_MS by default).
 * On the loop thread, as every call on c. Returns DLOCK_OK, or DLOCK_EINVAL
 * (NULL c, a client being freed or unusable, wait_ms not within 1 ms to
 * 2^40 ms; the message is dlock_async_errmsg(c)). */
DLOCK_EXPORT int dlock_async_client_set_fair_wait(dlock_async_client *c, int64_t wait_ms);

/* Creates an async client for opts->url (opts may be NULL: $DLOCK_URL, else
 * redis://127.0.0.1:6379; password, username, the two timeouts and
 * watchdog_lease_ms, wait_replicas and wait_replicas_timeout_ms are read
 * from opts as dlock_client_new does; fence_url, the tls_* fields and
 * wait_replicas on a cluster, which would change what a hold guarantees,
 * are refused with DLOCK_ENOTSUP rather than ignored; the other fields are
 * ignored).
 * Nothing is sent yet: the first operation connects. adapter: copied; NULL
 * for the bare interface (dlock_async_fds, dlock_async_timeout).
 * out: receives the client; as with dlock_client_new, *out is set even when
 * the call fails (unless memory ran out), so that dlock_async_errmsg(*out)
 * tells why; free it with dlock_async_client_free.
 * Returns DLOCK_OK, DLOCK_EINVAL (NULL out, a bad URL or option),
 * DLOCK_ENOTSUP (rediss://, RedLock, another backend's URL, an option
 * above), DLOCK_ENOMEM. */
DLOCK_EXPORT int dlock_async_client_new(const dlock_options *opts,
                                        const dlock_async_adapter *adapter,
                                        dlock_async_client **out);

/* Completes every pending operation of the client (of its lock and object
 * handles) with DLOCK_ECANCELED (each callback runs before this returns),
 * closes the connections, tells the adapter to stop watching and to clean
 * up, and frees the client and its handles. Holds are not released (their
 * leases run out; a semaphore's permits stay taken); an acquire whose
 * request was out may have taken the lock, which then runs out with its
 * lease too (a fair one is given back by the abandon; a semaphore
 * acquire's permits stay taken, a permit runs out with its lease); what
 * was owed is dropped, but a pending lock acquire's abandon (leaving the
 * fair queue, the waiting writers, the plain registry), which is written
 * on the open command connection before it closes, behind the attempt
 * still out, if any. Called from a callback of this client, the memory
 * goes when the call that ran the callback (dlock_async_process,
 * dlock_async_cancel, dlock_async_lock_free, dlock_async_object_cancel,
 * dlock_async_object_free) returns. NULL is a no-op. */
DLOCK_EXPORT void dlock_async_client_free(dlock_async_client *c);

/* The client's last client-level failure message ("" if none). NULL c: a
 * static message. */
DLOCK_EXPORT const char *dlock_async_errmsg(const dlock_async_client *c);

/* Handles the events of fd (one of the client's, as told to the adapter or
 * by dlock_async_fds; fd -1: none, a timer) and whatever is due: replies,
 * messages, retries, deadlines. Runs the callbacks of the operations that
 * end. Other fds are ignored. NULL c is a no-op. */
DLOCK_EXPORT void dlock_async_process(dlock_async_client *c, int fd, int events);

/* The bare interface: the sockets to poll now and for what. Writes the
 * first min(count, cap) of them into fds (fds may be NULL when cap is 0)
 * and returns count, how many there are (as snprintf does: a count above
 * cap says to call again with room for count; one Redis server has at
 * most 2, see "Slots"). NULL c: 0. */
typedef struct dlock_async_pollfd {
    int fd;
    int events; /* DLOCK_ASYNC_READ | DLOCK_ASYNC_WRITE */
} dlock_async_pollfd;
DLOCK_EXPORT int dlock_async_fds(const dlock_async_client *c, dlock_async_pollfd *fds, int cap);
/* The bare interface: ms until dlock_async_process must be called even if
 * no socket is ready (0: now), or -1 when nothing is timed. */
DLOCK_EXPORT int64_t dlock_async_timeout(const dlock_async_client *c);

/* Creates a handle for the lock name of kind on c (DLOCK_KIND_PLAIN,
 * DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR, DLOCK_KIND_READ or
 * DLOCK_KIND_WRITE: the others DLOCK_ENOTSUP). The owner of every kind but
 * the plain lock is a random token made here (see "Owner"). Nothing is
 * sent.
 * name_len: bytes or
 * DLOCK_CSTR. Returns DLOCK_OK, DLOCK_EINVAL (NULL argument, empty name),
 * DLOCK_ENAMETOOLONG, DLOCK_ENOTSUP, DLOCK_ENOMEM, DLOCK_EINVAL also for a
 * name whose keys would hash to different slots on a Redis Cluster (as
 * dlock_lock_new); the message of a failure is dlock_async_errmsg(c). */
DLOCK_EXPORT int dlock_async_lock_new(dlock_async_client *c, const char *name, size_t name_len,
                                      dlock_kind kind, dlock_async_lock **out);

/* Completes the handle's pending operation with DLOCK_ECANCELED (its
 * callback runs before this returns), releases the holds it has (every
 * hold of a reentrant, fair, read or write handle; best effort, no
 * callback), and frees the handle. NULL is a no-op. */
DLOCK_EXPORT void dlock_async_lock_free(dlock_async_lock *l);

/* The handle's last failure message ("" if none). */
DLOCK_EXPORT const char *dlock_async_lock_errmsg(const dlock_async_lock *l);

/* Starts acquiring l.
 * wait_ms: DLOCK_NOWAIT (try once), a bound in ms, or DLOCK_WAIT_FOREVER.
 * lease_ms: the lease (> 0), or DLOCK_WATCHDOG: the client's
 * watchdog_lease_ms, renewed from the loop (see "The watchdog"); a
 * re-entry into a hold the watchdog keeps stays kept, whatever its lease.
 * The callback gets DLOCK_OK with the fencing token (as dlock_acquire's),
 * DLOCK_EBUSY (try once, held), DLOCK_ETIMEDOUT, DLOCK_ECANCELED
 * (dlock_async_cancel, dlock_async_lock_free, dlock_async_client_free), or
 * a failure; on any code but DLOCK_OK nothing is held (an acquire whose
 * outcome a failure left unknown is given back, see "Failures" above).
 * A reentrant, fair, read or write handle that holds re-enters (hold
 * count + 1, a new fencing token, the lease raised, never shortened); a
 * plain one that holds is DLOCK_EINVAL.
 * Returns DLOCK_OK (started), DLOCK_EINVAL (NULL l or cb, a bad wait or
 * lease, a plain l holds already (also when its hold was found lost:
 * release it first), or l has an operation pending), DLOCK_ENOMEM, or a
 * failure to open the connection (DLOCK_EIO...: a try-once only; a wait
 * waits on, see "Failures"); the message is dlock_async_lock_errmsg(l). */
DLOCK_EXPORT int dlock_async_acquire(dlock_async_lock *l, int64_t wait_ms, int64_t lease_ms,
                                     dlock_async_fn cb, void *udata);

/* Starts releasing one of l's holds (owner-checked, as dlock_release: never
 * someone else's lock; the last hold of the lock wakes the plain lock's
 * first registered waiter, publishes the reentrant lock's unlock message,
 * grants the fair lock to its queue's head, or publishes the read/write
 * lock's message). The callback gets
 * DLOCK_OK, DLOCK_ELOST (the lease had run out or the lock was taken over),
 * DLOCK_ECANCELED, or a failure (DLOCK_EIO...: the outcome may be unknown;
 * as with dlock_release, the handle still counts as holding, so that a
 * retry is possible; the lease runs out otherwise).
 * Returns DLOCK_OK (started), DLOCK_EINVAL (NULL l or cb, an operation
 * pending), DLOCK_ENOTHELD, or a failure to open the connection. */
DLOCK_EXPORT int dlock_async_release(dlock_async_lock *l, dlock_async_fn cb, void *udata);

/* Starts extending l's hold to lease_ms (> 0) from now, owner-checked (a
 * hold the watchdog kept becomes an explicit-lease one once it is done). The
 * callback gets DLOCK_OK, DLOCK_ELOST (no longer ours: the handle holds
 * nothing), DLOCK_ECANCELED, or a failure (the hold keeps its validity).
 * Returns as dlock_async_release. */
DLOCK_EXPORT int dlock_async_extend(dlock_async_lock *l, int64_t lease_ms, dlock_async_fn cb,
                                    void *udata);

/* Ends l's pending operation with DLOCK_ECANCELED: its callback runs before
 * this returns. An acquire leaves the waiter registry (the fair queue, the
 * waiting writers); if its request was out, a lock it took is given back,
 * and a queue it joined left, when the reply comes. A release or
 * extend whose request was out may still be applied by the server.
 * Returns DLOCK_OK (one was cancelled), DLOCK_ENOTHELD (none was pending),
 * DLOCK_EINVAL (NULL). */
DLOCK_EXPORT int dlock_async_cancel(dlock_async_lock *l);

/* How long l's hold is surely valid, as dlock_lock_valid_ms: 0 when it holds
 * nothing, the lease ran out or the hold was found lost; a watchdog hold's
 * until it would be found lost (see "The watchdog"). */
DLOCK_EXPORT int64_t dlock_async_lock_valid_ms(const dlock_async_lock *l);

/* Sets the callback for l's watchdog hold found lost (NULL: none), as
 * dlock_lock_on_lost; see dlock_async_lost_fn. NULL l is a no-op. */
DLOCK_EXPORT void dlock_async_lock_on_lost(dlock_async_lock *l, dlock_async_lost_fn fn,
                                           void *udata);

/* 1 once the watchdog found l's hold lost (until a release or a new
 * acquire), else 0. */
DLOCK_EXPORT int dlock_async_lock_is_lost(const dlock_async_lock *l);

/* ---- the multi-lock ----
 * Several lock handles of one client (any kinds) taken all or nothing
 * within one wait bound, as dlock_multi_acquire takes blocking ones, by the
 * lock calls above. */

/* The callback of a set's operation: locks and n the set (a copy of the
 * array given, valid during the call, in the caller's order), code the
 * outcome, fences each lock's fencing token in the caller's order (an
 * acquire's DLOCK_OK only; NULL otherwise). It may start operations on the
 * handles, free them or the client. */
typedef void (*dlock_async_multi_fn)(dlock_async_lock *const *locks, size_t n, int code,
                                     const uint64_t *fences, void *udata);

/* Starts acquiring every lock in locks[0..n) (handles of one client, any
 * kinds and names), all or nothing, within one wait bound (wait_ms as
 * dlock_async_acquire's, for the whole set). The guarantees are
 * dlock_multi_acquire's:
 *  - the locks are taken one at a time in a canonical order (by name, then
 *    the write side first, then kind: the blocking multi-lock's), so that
 *    sets overlapping in any order, async or blocking, cannot deadlock;
 *  - once the whole set is held, the lease of every lock taken before the
 *    last one is restarted (dlock_async_extend with lease_ms,
 *    owner-checked), so that on DLOCK_OK every lock has about its full
 *    lease from then: dlock_async_multi_valid_ms is about lease_ms however
 *    long the wait for the later locks took. DLOCK_WATCHDOG is refused
 *    (DLOCK_ENOTSUP) in this version: checking the earlier holds on the
 *    client only (not found lost, still valid) missed one the server had
 *    forgotten (a restart without persistence) until the next renewal, and
 *    an async extend would end its renewals;
 *  - a lock whose lease ran out meanwhile (the extend answers
 *    DLOCK_ELOST) is never
 *    returned as held: the locks after it in the canonical order are given
 *    back and taken again after it, while the
 *    wait lasts (none left: DLOCK_ETIMEDOUT; wait DLOCK_NOWAIT:
 *    DLOCK_ELOST);
 *  - on failure every lock taken so far is released (the callback runs
 *    once those releases are answered, so the handles are free for new
 *    operations) and the first failure's code is given (DLOCK_EBUSY with
 *    DLOCK_NOWAIT, DLOCK_ETIMEDOUT when the wait ran out on any lock,
 *    DLOCK_ELOST, DLOCK_ECANCELED, DLOCK_EIO...), its message on the handle
 *    that met it (dlock_async_lock_errmsg).
 * The handles belong to the set until its callback: start no other
 * operation on them and free none of them meanwhile (dlock_async_lock_free
 * of the handle the set waits on ends the set with DLOCK_ECANCELED, the
 * other locks given back; of another member it is undefined). A
 * reentrant, fair, read or write handle that holds already re-enters (the
 * set's release gives back one hold); a plain one fails the set
 * (DLOCK_EINVAL).
 * Cancel: dlock_async_multi_cancel. dlock_async_client_free ends the set
 * with DLOCK_ECANCELED (its callback once, before the free returns; the
 * holds taken run out with their leases, as every hold of a freed client).
 * Returns DLOCK_OK (started: the callback runs exactly once, later),
 * DLOCK_EINVAL (NULL locks or cb, n 0, a NULL handle, the same handle
 * twice, handles of two clients, a bad wait or lease; the message is
 * dlock_async_errmsg of the first handle's client), DLOCK_ENOTSUP
 * (DLOCK_WATCHDOG; the message likewise
 * dlock_async_errmsg of the first handle's client), DLOCK_ENOMEM, or the
 * refusal of the first lock's acquire (an operation pending on it...; the
 * message on that handle); the callback never runs then. */
DLOCK_EXPORT int dlock_async_multi_acquire(dlock_async_lock *const *locks, size_t n,
                                           int64_t wait_ms, int64_t lease_ms,
                                           dlock_async_multi_fn cb, void *udata);

/* Cancels the set locks[0..n) being acquired by dlock_async_multi_acquire:
 * it ends with DLOCK_ECANCELED and gives back what it took; its callback
 * runs once those releases are answered (before this returns when it held
 * nothing). A set that was failing already ends with its own code (its
 * releases are not cancelled). A dlock_async_cancel of the member the set
 * waits on also ends it with DLOCK_ECANCELED, but that member, if it held
 * (its extend was cancelled), is left to the caller.
 * Returns DLOCK_OK (an operation of the set was cancelled), DLOCK_ENOTHELD
 * (none pending), DLOCK_EINVAL (as dlock_async_multi_acquire's set). */
DLOCK_EXPORT int dlock_async_multi_cancel(dlock_async_lock *const *locks, size_t n);

/* How long the set locks[0..n) is surely still held, in ms: the least
 * dlock_async_lock_valid_ms of its locks (0 when one is not held, is
 * lost, or locks is NULL or n is 0; a NULL entry counts as not held). No
 * round trip. */
DLOCK_EXPORT int64_t dlock_async_multi_valid_ms(dlock_async_lock *const *locks, size_t n);

/* Starts releasing one hold of every lock in locks[0..n) (owner-checked,
 * as dlock_async_release; all attempted even when one fails). The callback
 * runs once every release is answered, with the first failure
 * (DLOCK_ELOST, DLOCK_ENOTHELD for a handle that held nothing, DLOCK_EIO...;
 * DLOCK_OK if none) and fences NULL. Returns DLOCK_OK (started),
 * DLOCK_EINVAL (as dlock_async_multi_acquire's set, NULL cb), DLOCK_ENOMEM,
 * or, when no release could be started, the first refusal (the callback
 * never runs then). */
DLOCK_EXPORT int dlock_async_multi_release(dlock_async_lock *const *locks, size_t n,
                                           dlock_async_multi_fn cb, void *udata);

/* ---- the synchronizer objects: semaphore, permit semaphore, latch ----
 * One handle type for the three (dlock_async_semaphore_new,
 * dlock_async_permits_new, dlock_async_latch_new), on the blocking
 * objects' keys, scripts and channels (dlock.h): a release or count-down by
 * an async handle wakes a blocking waiter and the reverse. The rules of the
 * locks hold: at most one operation pending per handle, its callback runs
 * exactly once and never from the call that started it, a waiter joins the
 * client's one subscribed connection on the object's channel and tries
 * again at each message there, at least every 2 s, and (permit semaphore)
 * when the earliest lease runs out; the attempt at the deadline is a
 * try-once. An operation of the wrong kind for the handle is DLOCK_EINVAL.
 *
 * Outcomes a failure leaves unknown (the request went out, its reply was
 * lost with the connection or its deadline):
 *  - semaphore release and add carry a change id, as the blocking calls':
 *    a lost reply sends the same change again once, at once, on a new
 *    connection, and the server counts it once; only when that copy fails
 *    too is the callback's code a failure, the change then made once or
 *    not at all.
 *  - a semaphore acquire may have taken its permits: they are not given
 *    back (a semaphore's permits have no owner, a blind release could make
 *    permits that never were) and stay taken, as after a blocking acquire
 *    whose reply was lost; dlock_semaphore_add can restore them. One whose
 *    reply says it took them after the operation ended (cancelled, freed)
 *    gives them back (a release of that many, counted once).
 *  - a permit semaphore acquire's permit, taken or not, is released by its
 *    id (harmless when it was not taken) once a connection is open again;
 *    until then it runs out with its lease. A permit release or renewal
 *    whose reply was lost is sent again once (releasing an id twice is
 *    harmless; renewing twice ends the lease later by the copies' interval
 *    at most).
 *  - a latch count-down may have counted: it is not sent again (the
 *    count-down is not idempotent).
 *  - a permit semaphore add and a latch set may have been applied: they
 *    are not sent again, as the blocking dlock_permits_add and
 *    dlock_latch_set are not (the add carries no change id: a copy would
 *    count twice; a set sent again could undo a count-down made between
 *    the copies); the callback's code is the failure.
 *  - a permit release or renewal by id of one of the handle's watchdog
 *    permits (below) whose outcome stays unknown leaves that permit
 *    renewed by the watchdog, as dlock_permits_release does; if it was
 *    released, the next renewal finds it gone and tells it lost.
 * dlock_async_client_free drops whatever was still owed. */
typedef struct dlock_async_object dlock_async_object;

/* The callback of an operation on o: code its outcome, value what the
 * operation answers (below; 0 on a failure), dlock_async_object_errmsg(o)
 * the message of a failure. It may start operations, cancel them and free
 * handles or the client. */
typedef void (*dlock_async_object_fn)(dlock_async_object *o, int code, int64_t value,
                                      void *udata);

/* Create a handle on c for the semaphore, the permit semaphore or the
 * latch called name (as dlock_semaphore_new, dlock_permits_new,
 * dlock_latch_new do: same keys). Nothing is sent. name_len: bytes or
 * DLOCK_CSTR. Returns DLOCK_OK, DLOCK_EINVAL (NULL argument, empty name,
 * a client being freed or unusable; on a Redis Cluster, as the blocking
 * calls, a name whose keys, or a latch's key and channel, would hash to
 * different slots), DLOCK_ENAMETOOLONG, DLOCK_ENOMEM; the message of a
 * failure is dlock_async_errmsg(c). */
DLOCK_EXPORT int dlock_async_semaphore_new(dlock_async_client *c, const char *name,
                                           size_t name_len, dlock_async_object **out);
DLOCK_EXPORT int dlock_async_permits_new(dlock_async_client *c, const char *name,
                                         size_t name_len, dlock_async_object **out);
DLOCK_EXPORT int dlock_async_latch_new(dlock_async_client *c, const char *name,
                                       size_t name_len, dlock_async_object **out);

/* Completes o's pending operation with DLOCK_ECANCELED (its callback runs
 * before this returns) and frees the handle; what is owed (above) is still
 * sent. Permits it took are not given back: release them first. NULL is a
 * no-op. */
DLOCK_EXPORT void dlock_async_object_free(dlock_async_object *o);

/* Ends o's pending operation with DLOCK_ECANCELED: its callback runs before
 * this returns; a waiter leaves the subscription table. A request already
 * out may still be applied by the server: an acquire that took permits
 * gives them back when its reply comes (see above). Returns DLOCK_OK (one
 * was cancelled), DLOCK_ENOTHELD (none was pending), DLOCK_EINVAL (NULL). */
DLOCK_EXPORT int dlock_async_object_cancel(dlock_async_object *o);

/* o's last failure message ("" if none). */
DLOCK_EXPORT const char *dlock_async_object_errmsg(const dlock_async_object *o);

/* Every start call below returns DLOCK_OK (started: the callback will run
 * once), DLOCK_EINVAL (NULL o or cb, a bad argument, the wrong kind of
 * handle, an operation pending, the client being freed), DLOCK_ENOMEM, or
 * a failure to open the connection (DLOCK_EIO...); the callback never runs
 * then, and the message is dlock_async_object_errmsg(o). A failure given
 * to the callback is DLOCK_EIO, DLOCK_EPROTO, DLOCK_ESERVER (the key holds
 * something else), DLOCK_EOVERFLOW... as the blocking call's. */

/* Semaphore: takes permits (>= 1, at most DLOCK_COUNT_MAX), waiting up to
 * wait_ms (DLOCK_NOWAIT: try once, a bound, DLOCK_WAIT_FOREVER). The
 * callback gets DLOCK_OK (value: permits), DLOCK_EBUSY (try once, not
 * enough available), DLOCK_ETIMEDOUT, DLOCK_ECANCELED, or a failure. */
DLOCK_EXPORT int dlock_async_semaphore_acquire(dlock_async_object *o, int64_t permits,
                                               int64_t wait_ms, dlock_async_object_fn cb,
                                               void *udata);
/* Semaphore: gives back permits (>= 1) and wakes waiters of every client
 * (anyone may release: permits are not owned). The callback gets DLOCK_OK
 * (value: the available permits right after, or -1 when a copy sent again
 * after a lost reply found the change counted already), DLOCK_ECANCELED,
 * or a failure (see "Outcomes" above). */
DLOCK_EXPORT int dlock_async_semaphore_release(dlock_async_object *o, int64_t permits,
                                               dlock_async_object_fn cb, void *udata);
/* Semaphore: adds delta (may be negative, |delta| <= DLOCK_COUNT_MAX) to
 * the available permits, as dlock_semaphore_add; the callback as release's. */
DLOCK_EXPORT int dlock_async_semaphore_add(dlock_async_object *o, int64_t delta,
                                           dlock_async_object_fn cb, void *udata);
/* Semaphore: sets the permits (>= 0) only if the semaphore does not exist:
 * DLOCK_OK with value 1 (set) or 0 (it existed), DLOCK_ECANCELED, or a
 * failure. */
DLOCK_EXPORT int dlock_async_semaphore_try_set(dlock_async_object *o, int64_t permits,
                                               dlock_async_object_fn cb, void *udata);
/* Semaphore: DLOCK_OK with value the available permits, DLOCK_ECANCELED, or
 * a failure. */
DLOCK_EXPORT int dlock_async_semaphore_available(dlock_async_object *o,
                                                 dlock_async_object_fn cb, void *udata);

/* Permit semaphore: takes one permit with a lease (lease_ms > 0, or
 * DLOCK_WATCHDOG), waiting up to wait_ms. The callback gets DLOCK_OK
 * (value 1; the permit's id, DLOCK_PERMIT_ID_LEN hex characters, is
 * dlock_async_permits_id(o)), DLOCK_EBUSY, DLOCK_ETIMEDOUT,
 * DLOCK_ECANCELED, or a failure (DLOCK_ENOMEM: a watchdog permit that could
 * not be registered, given back). Released by its id by either API, or
 * given back by the server when its lease runs out.
 * DLOCK_WATCHDOG: the lease is the client's watchdog_lease_ms, renewed
 * from the loop every third of it (see "The watchdog": found lost as a
 * lock's hold, DLOCK_LOST_TAKEN or DLOCK_LOST_UNREACHABLE, and told to
 * dlock_async_object_on_lost's callback) until o releases it by id
 * (dlock_async_permits_release), o renews it with an explicit lease
 * (dlock_async_permits_renew: it is an explicit-lease permit then, as with
 * dlock_permits_renew), or o is freed (it then runs out with its lease).
 * A release or renewal of its id through another handle, or by the
 * blocking API, does not stop o's renewals: the next one finds it gone
 * and tells it lost. */
DLOCK_EXPORT int dlock_async_permits_acquire(dlock_async_object *o, int64_t wait_ms,
                                             int64_t lease_ms, dlock_async_object_fn cb,
                                             void *udata);
/* The callback of a watchdog permit found lost (see
 * dlock_async_permits_acquire): id is that permit's, reason
 * DLOCK_LOST_TAKEN (its lease entry was gone or expired at a renewal: it
 * expired, or another client removed it) or DLOCK_LOST_UNREACHABLE (no
 * renewal confirmed in time). The permit is renewed no more; its release
 * answers DLOCK_ENOTOWNER once it is gone. It runs on the loop thread,
 * from dlock_async_process, and may call any function of this header
 * (free the handle, acquire again...). */
typedef void (*dlock_async_permit_lost_fn)(dlock_async_object *o, const char *id, int reason,
                                           void *udata);
/* Sets the callback for o's watchdog permits found lost (NULL: none), as
 * dlock_permits_on_lost. NULL o is a no-op. */
DLOCK_EXPORT void dlock_async_object_on_lost(dlock_async_object *o,
                                             dlock_async_permit_lost_fn fn, void *udata);

/* The id of the permit o's last acquire took: valid from its callback
 * until o's next operation or its free; "" when the last acquire failed. */
DLOCK_EXPORT const char *dlock_async_permits_id(const dlock_async_object *o);
/* Permit semaphore: releases the permit id (taken by any handle of either
 * API). The callback gets DLOCK_OK, DLOCK_ENOTOWNER (not out on lease:
 * expired, released, never issued), DLOCK_ECANCELED, or a failure. */
DLOCK_EXPORT int dlock_async_permits_release(dlock_async_object *o, const char *id,
                                             dlock_async_object_fn cb, void *udata);
/* Permit semaphore: sets the lease of the permit id (taken by any handle
 * of either API) to lease_ms (> 0) from now, or leaves it when it ends
 * later already (never shortened), as dlock_permits_renew. The callback
 * gets DLOCK_OK, DLOCK_ENOTOWNER (not out on lease), DLOCK_ECANCELED, or a
 * failure (a renewal whose reply was lost is sent again once: the lease
 * may then end up to the time between the two copies later). */
DLOCK_EXPORT int dlock_async_permits_renew(dlock_async_object *o, const char *id,
                                           int64_t lease_ms, dlock_async_object_fn cb,
                                           void *udata);
/* Permit semaphore: DLOCK_OK with value the available permits (expired
 * leases returned first), DLOCK_ECANCELED, or a failure. */
DLOCK_EXPORT int dlock_async_permits_available(dlock_async_object *o, dlock_async_object_fn cb,
                                               void *udata);
/* Permit semaphore: as dlock_async_semaphore_try_set. */
DLOCK_EXPORT int dlock_async_permits_try_set(dlock_async_object *o, int64_t permits,
                                             dlock_async_object_fn cb, void *udata);
/* Permit semaphore: adds delta (may be negative, |delta| <= DLOCK_COUNT_MAX)
 * to the available permits, expired leases returned first, and wakes
 * waiters of every client, as dlock_permits_add. The callback gets
 * DLOCK_OK (value: the available permits right after), DLOCK_ECANCELED,
 * or a failure (not sent again: see "Outcomes" above). */
DLOCK_EXPORT int dlock_async_permits_add(dlock_async_object *o, int64_t delta,
                                         dlock_async_object_fn cb, void *udata);

/* Latch: counts down by k (>= 1), not below zero; at zero the waiters of
 * every client are woken. The callback gets DLOCK_OK (value: the count
 * after), DLOCK_ECANCELED, or a failure (see "Outcomes" above). */
DLOCK_EXPORT int dlock_async_latch_count_down(dlock_async_object *o, int64_t k,
                                              dlock_async_object_fn cb, void *udata);
/* Latch: waits up to wait_ms for the count to be zero (an absent latch is
 * at zero). The callback gets DLOCK_OK, DLOCK_ETIMEDOUT (also DLOCK_NOWAIT
 * when not at zero, as dlock_latch_await; the message has the count last
 * read), DLOCK_ECANCELED, or a failure. */
DLOCK_EXPORT int dlock_async_latch_await(dlock_async_object *o, int64_t wait_ms,
                                         dlock_async_object_fn cb, void *udata);
/* Latch: sets the count (>= 1) only if it is at zero: DLOCK_OK with value
 * 1 (set) or 0, DLOCK_ECANCELED, or a failure. */
DLOCK_EXPORT int dlock_async_latch_try_set(dlock_async_object *o, int64_t count,
                                           dlock_async_object_fn cb, void *udata);
/* Latch: sets the count (>= 0) unconditionally, as dlock_latch_set: 0
 * deletes it and wakes the waiters of every client (a "0" message), more
 * tells them a new count (a "1"). The callback gets DLOCK_OK (value: the
 * count set), DLOCK_ECANCELED, or a failure (not sent again: see
 * "Outcomes" above). */
DLOCK_EXPORT int dlock_async_latch_set(dlock_async_object *o, int64_t count,
                                       dlock_async_object_fn cb, void *udata);
/* Latch: DLOCK_OK with value the count, DLOCK_ECANCELED, or a failure. */
DLOCK_EXPORT int dlock_async_latch_count(dlock_async_object *o, dlock_async_object_fn cb,
                                         void *udata);

/* ---- the ID worker ----
 * The blocking ID worker's ids (dlock_idworker_*, docs/idworker.md: the
 * same layout, the same day counter "icr:<prefix>:<yyyy:mm:dd>", the same
 * checks), handed out from the loop: async and blocking workers on one
 * prefix never hand out the same id. */
typedef struct dlock_async_idworker dlock_async_idworker;

/* The callback of a next: code DLOCK_OK with id, or a failure (id 0;
 * dlock_async_idworker_errmsg(w) says what). It may ask for more ids, free
 * the worker or the client. */
typedef void (*dlock_async_idworker_fn)(dlock_async_idworker *w, int code, uint64_t id,
                                        void *udata);

/* Creates an ID worker for prefix on c (opts as dlock_idworker_new's: the
 * epoch and the batch; NULL: defaults). Nothing is sent. Freed by
 * dlock_async_idworker_free or with its client. Returns DLOCK_OK,
 * DLOCK_EINVAL (NULL argument, empty prefix, a bad option, a client being
 * freed), DLOCK_ENAMETOOLONG, DLOCK_ENOMEM; the message is
 * dlock_async_errmsg(c). */
DLOCK_EXPORT int dlock_async_idworker_new(dlock_async_client *c, const char *prefix,
                                          const dlock_idworker_options *opts,
                                          dlock_async_idworker **out);

/* Asks w for its next id. Any number of nexts may be pending: their
 * callbacks run in the order they were asked for, with increasing ids,
 * from the loop (never from this call), those the reserved block can serve
 * at the loop's next turn. A block is reserved by one INCRBY of the day's
 * counter for the nexts waiting then: the worker's batch, or as many as
 * are waiting when that is more (a burst shares one round trip; with batch
 * 1 no value is left over). The callback gets DLOCK_OK with the id,
 * DLOCK_EOVERFLOW as dlock_idworker_next (the day's counter passed
 * 2^32 - 1, the seconds no longer fit 31 bits), DLOCK_EPROTO (the counter
 * went backwards), DLOCK_ECANCELED (the worker or the client freed), or a
 * failure of the INCRBY (DLOCK_EIO...: every next waiting for it gets it;
 * the values it may have reserved are a gap). Returns DLOCK_OK (the
 * callback runs once, later), DLOCK_EINVAL (NULL w or cb, a worker or
 * client being freed), DLOCK_ENOMEM. */
DLOCK_EXPORT int dlock_async_idworker_next(dlock_async_idworker *w, dlock_async_idworker_fn cb,
                                           void *udata);

/* Ends w's pending nexts with DLOCK_ECANCELED (their callbacks run before
 * this returns; called from one of w's callbacks, the memory goes when
 * that returns) and frees w; an INCRBY out is dropped when it comes (its
 * values a gap). NULL is a no-op. */
DLOCK_EXPORT void dlock_async_idworker_free(dlock_async_idworker *w);

/* w's last failure message ("" if none). */
DLOCK_EXPORT const char *dlock_async_idworker_errmsg(const dlock_async_idworker *w);

#ifdef __cplusplus
}
#endif

#endif
