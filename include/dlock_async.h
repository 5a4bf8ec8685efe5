/*
 * dlock_async: locks from an event loop, without a thread per wait.
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
 * dlock_async_lock_free or dlock_async_client_free for the operations they
 * end. A call that starts an operation never runs its callback itself.
 *
 * Operations. dlock_async_acquire, dlock_async_release and
 * dlock_async_extend start an operation and return at once: DLOCK_OK means
 * the callback will run exactly once, later, with the outcome (the same
 * codes as the blocking call); any other code means it was not started and
 * the callback never runs. A handle has at most one operation pending.
 * Requests of all handles share one connection, pipelined: replies are
 * matched to requests in order. Every request has the client's command
 * timeout as its deadline (the connect timeout too while connecting); a
 * reply that does not come by then closes the connection.
 *
 * Waiting. All waiters of a client share ONE subscribed connection with a
 * table from channel to waiters. The keys, scripts and layouts are the
 * blocking API's, so async and blocking clients exclude each other on one
 * name, and a release by either wakes a waiter of either: a plain waiter
 * takes its place in the plain lock's waiter registry and is woken alone
 * on its own channel; a reentrant waiter listens on Redisson's unlock
 * channel; a fair waiter joins the fair lock's queue (FIFO with the
 * blocking waiters) and listens on its own channel, where a release grants
 * it the lock; read and write waiters listen on the read/write lock's
 * channel, a writer entering its waiting writers (writer preference). A
 * waiter tries again when its channel says so, when the holder's lease
 * runs out (PTTL), and at least every 2 s (the backstop of docs/design.md).
 * A waiter that gives up (deadline, cancel, failure, its handle or client
 * freed) leaves the registry, the fair queue or the waiting writers.
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
 * Failures. A connection lost, a server that stops answering or a reply
 * that is not RESP ends every operation pending on that connection, each
 * once, with an error (DLOCK_EIO, DLOCK_EPROTO, DLOCK_EAUTH...): an acquire
 * or release whose request went out has an unknown outcome and is never
 * sent again by itself. An acquire whose outcome is unknown is given back
 * (a release with its token, owner-checked) once a connection is open
 * again, and a wait that ended so leaves the fair queue or the waiting
 * writers then (its abandon is kept until it can be sent); until then the
 * lock runs out with its lease. The next operation opens a new connection.
 *
 * Not in this version: DLOCK_ENOTSUP for rediss:// (TLS), Sentinel,
 * Cluster and RedLock URLs, the other backends (ZooKeeper, etcd, MySQL,
 * PostgreSQL), the synchronizer kinds (DLOCK_KIND_SEMAPHORE,
 * DLOCK_KIND_PERMIT_SEMAPHORE, DLOCK_KIND_LATCH) and DLOCK_WATCHDOG leases.
 * The fair lock's thread wait time is the default
 * (DLOCK_DEFAULT_FAIR_WAIT_MS): no async dlock_client_set_fair_wait.
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
/* How many sockets a client has at most at once: its command connection
 * (slot 0) and its subscribed connection (slot 1). */
#define DLOCK_ASYNC_SLOTS 2

/* How the library asks a loop for events. All three run on the loop's
 * thread, from the library's calls. */
typedef struct dlock_async_adapter {
    void *data; /* passed to each function */
    /* Watch fd for events (DLOCK_ASYNC_READ | DLOCK_ASYNC_WRITE) in slot
     * (0 .. DLOCK_ASYNC_SLOTS - 1), replacing what the slot watched; events
     * 0: stop watching the slot's fd, which the library may close right
     * after. A slot's fd changes only after a call with events 0. When the
     * fd is ready, call dlock_async_process(client, fd, ready events). */
    void (*watch)(void *data, int slot, int fd, int events);
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

/* Creates an async client for opts->url (opts may be NULL: $DLOCK_URL, else
 * redis://127.0.0.1:6379; password, username and the two timeouts are read
 * from opts as dlock_client_new does; wait_replicas, fence_url and the tls_*
 * fields, which would change what a hold guarantees, are refused with
 * DLOCK_ENOTSUP rather than ignored; the other fields are ignored).
 * Nothing is sent yet: the first operation connects. adapter: copied; NULL
 * for the bare interface (dlock_async_fds, dlock_async_timeout).
 * out: receives the client; as with dlock_client_new, *out is set even when
 * the call fails (unless memory ran out), so that dlock_async_errmsg(*out)
 * tells why; free it with dlock_async_client_free.
 * Returns DLOCK_OK, DLOCK_EINVAL (NULL out, a bad URL or option),
 * DLOCK_ENOTSUP (rediss://, Sentinel, Cluster, RedLock, another backend's
 * URL, an option above), DLOCK_ENOMEM. */
DLOCK_EXPORT int dlock_async_client_new(const dlock_options *opts,
                                        const dlock_async_adapter *adapter,
                                        dlock_async_client **out);

/* Completes every pending operation of the client with DLOCK_ECANCELED
 * (each callback runs before this returns), closes the connections, tells
 * the adapter to stop watching and to clean up, and frees the client and
 * its handles. Holds are not released (their leases run out); an acquire
 * whose request was out may have taken the lock, which then runs out with
 * its lease too (a fair one is given back by the abandon). A pending
 * acquire's abandon (leaving the fair queue, the waiting writers, the plain
 * registry) is written on the open command connection before it closes,
 * behind the attempt still out, if any. Called from a callback of this client, the memory goes
 * when the call that ran the callback (dlock_async_process,
 * dlock_async_cancel, dlock_async_lock_free) returns. NULL is a no-op. */
DLOCK_EXPORT void dlock_async_client_free(dlock_async_client *c);

/* The client's last client-level failure message ("" if none). NULL c: a
 * static message. */
DLOCK_EXPORT const char *dlock_async_errmsg(const dlock_async_client *c);

/* Handles the events of fd (one of the client's, as told to the adapter or
 * by dlock_async_fds; fd -1: none, a timer) and whatever is due: replies,
 * messages, retries, deadlines. Runs the callbacks of the operations that
 * end. Other fds are ignored. NULL c is a no-op. */
DLOCK_EXPORT void dlock_async_process(dlock_async_client *c, int fd, int events);

/* The bare interface: the sockets to poll now and for what, into fds
 * (room for DLOCK_ASYNC_SLOTS); returns how many (0 .. DLOCK_ASYNC_SLOTS). */
typedef struct dlock_async_pollfd {
    int fd;
    int events; /* DLOCK_ASYNC_READ | DLOCK_ASYNC_WRITE */
} dlock_async_pollfd;
DLOCK_EXPORT int dlock_async_fds(const dlock_async_client *c, dlock_async_pollfd *fds);
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
 * DLOCK_ENAMETOOLONG, DLOCK_ENOTSUP, DLOCK_ENOMEM; the message of a failure
 * is dlock_async_errmsg(c). */
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
 * lease_ms: the lease (> 0); DLOCK_WATCHDOG is DLOCK_ENOTSUP here.
 * The callback gets DLOCK_OK with the fencing token (as dlock_acquire's),
 * DLOCK_EBUSY (try once, held), DLOCK_ETIMEDOUT, DLOCK_ECANCELED
 * (dlock_async_cancel, dlock_async_lock_free, dlock_async_client_free), or
 * a failure; on any code but DLOCK_OK nothing is held (an acquire whose
 * outcome a failure left unknown is given back, see "Failures" above).
 * A reentrant, fair, read or write handle that holds re-enters (hold
 * count + 1, a new fencing token, the lease raised, never shortened); a
 * plain one that holds is DLOCK_EINVAL.
 * Returns DLOCK_OK (started), DLOCK_EINVAL (NULL l or cb, a bad wait or
 * lease, a plain l holds already, or l has an operation pending), DLOCK_ENOTSUP
 * (DLOCK_WATCHDOG), DLOCK_ENOMEM, or a failure to open the connection
 * (DLOCK_EIO...); the message is dlock_async_lock_errmsg(l). */
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

/* Starts extending l's hold to lease_ms (> 0) from now, owner-checked. The
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
 * nothing or the lease ran out. */
DLOCK_EXPORT int64_t dlock_async_lock_valid_ms(const dlock_async_lock *l);

#ifdef __cplusplus
}
#endif

#endif
