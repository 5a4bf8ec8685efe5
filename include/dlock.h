/*
 * dlock: distributed locks and coordination primitives on Redis.
 *
 * Public API. Everything the library exports is declared here; the layout of
 * every handle is private.
 *
 * Conventions
 * -----------
 * - Every function that can fail returns an int: DLOCK_OK (0) on success or a
 *   positive dlock_code. dlock_strerror() names a code; the handle's message
 *   (dlock_errmsg(), dlock_lock_errmsg()) says what happened in one line.
 *   Passwords never appear in a message.
 * - "Not acquired" is not a failure: DLOCK_EBUSY (try-once found the lock
 *   held) and DLOCK_ETIMEDOUT (the wait bound elapsed) are apart from real
 *   failures (I/O, protocol, out of memory, bad argument, ...).
 * - The library never prints, exits or aborts. Functions that free accept
 *   NULL and do nothing.
 * - Durations are int64_t milliseconds. Clocks: leases, validity
 *   (dlock_lock_valid_ms, dlock_permits_valid_ms), the watchdog's schedule,
 *   wait deadlines and command timeouts count on CLOCK_BOOTTIME, which
 *   never steps and also counts a system suspend (the server's lease runs on
 *   meanwhile, so a hold does not look valid after a resume). Condition
 *   variables inside the library run on CLOCK_MONOTONIC with timeouts
 *   relative to now, re-checked on CLOCK_BOOTTIME when they wake. Only the
 *   ID worker reads the wall clock (CLOCK_REALTIME). The servers' own
 *   clocks expire keys and give fencing tokens (dlock_acquire).
 * - Lock names are binary-safe: (pointer, length) pairs; pass
 *   DLOCK_CSTR as the length for a NUL-terminated name. A name is 1 to
 *   DLOCK_NAME_MAX bytes.
 *
 * Threads
 * -------
 * - A dlock_client is safe to share between threads. Each call borrows a
 *   connection from the client's pool, so one thread waiting for a lock never
 *   holds up another thread's commands.
 * - A dlock_lock handle is used by one thread at a time (create one per
 *   thread). The client's watchdog thread only reads a held handle's identity
 *   and sets its lost flag.
 * - dlock_errmsg(client) is per thread: it reports the last failure of a
 *   client-level call made by the calling thread (like errno).
 * - fork(): a client does not cross fork(); make clients in the child. Once
 *   a client has a watchdog lock its watchdog thread runs, and a fork at that
 *   point can leave a lock (the allocator's, say) held forever in the child:
 *   fork before, or exec at once in the child.
 */
#ifndef DLOCK_H
#define DLOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version: the single source of truth (CMake reads these lines) ---- */
#define DLOCK_VERSION_MAJOR 0
#define DLOCK_VERSION_MINOR 1
#define DLOCK_VERSION_PATCH 0
#define DLOCK_VERSION_NUM \
    ((DLOCK_VERSION_MAJOR << 16) | (DLOCK_VERSION_MINOR << 8) | DLOCK_VERSION_PATCH)
#define DLOCK_AT_LEAST_VERSION(x, y, z) (DLOCK_VERSION_NUM >= (((x) << 16) | ((y) << 8) | (z)))

#if defined(_WIN32)
#define DLOCK_EXPORT
#elif defined(__GNUC__)
#define DLOCK_EXPORT __attribute__((visibility("default")))
#else
#define DLOCK_EXPORT
#endif

/* Returns the library's version as "MAJOR.MINOR.PATCH" (static storage). */
DLOCK_EXPORT const char *dlock_version(void);
/* Returns DLOCK_VERSION_NUM of the library actually linked. */
DLOCK_EXPORT unsigned dlock_version_num(void);

/* ---- error codes: append-only, never renumbered ---- */
typedef enum dlock_code {
    DLOCK_OK = 0,
    DLOCK_EBUSY = 1,        /* try-once: the lock is held by another owner */
    DLOCK_ETIMEDOUT = 2,    /* the wait bound elapsed before the lock was had */
    DLOCK_EINVAL = 3,       /* bad argument (NULL handle, bad URL, bad name...) */
    DLOCK_ENOMEM = 4,       /* out of memory */
    DLOCK_EIO = 5,          /* connection failed, broke or timed out; or the
                             * server's first reply was not RESP ("not a Redis
                             * server?") */
    DLOCK_EPROTO = 6,       /* the server's reply was not what the protocol says */
    DLOCK_ESERVER = 7,      /* the server answered with an error (WRONGTYPE...) */
    DLOCK_ENOTHELD = 8,     /* this handle does not hold the lock */
    DLOCK_ENOTOWNER = 9,    /* the token does not own the lock (wrong or expired) */
    DLOCK_ELOST = 10,       /* the lease was lost: expired or taken over */
    DLOCK_EAUTH = 11,       /* authentication refused (AUTH, NOPERM) */
    DLOCK_ENAMETOOLONG = 12,/* lock name longer than DLOCK_NAME_MAX */
    DLOCK_ENOTSUP = 13,     /* not supported (by this kind or backend) */
    DLOCK_ESYS = 14,        /* a system call failed (getrandom, threads...) */
    DLOCK_EOVERFLOW = 15,   /* a counter would overflow (ID worker) */
    DLOCK_ENOQUORUM = 16,   /* RedLock: fewer than a majority of nodes answered */
    DLOCK_EREPLICAS = 17,   /* too few replicas acknowledged an acquire (wait_replicas) */
    DLOCK_ETLS = 18,        /* TLS handshake or certificate verification failed;
                             * also when a rediss:// server answers plaintext
                             * RESP (found once the handshake stalls 150 ms) */
    DLOCK_ECANCELED = 19,   /* the wait was cancelled (dlock_lock_cancel) */
    DLOCK_CODE_LAST_        /* not a code: one past the last */
} dlock_code;

/* Returns a static English name of a code ("lock is busy"...); never NULL. */
DLOCK_EXPORT const char *dlock_strerror(int code);

/* ---- limits and special values ---- */
#define DLOCK_NAME_MAX 1024          /* longest lock name, in bytes */
#define DLOCK_CSTR ((size_t)-1)      /* name length: the name is NUL-terminated */
#define DLOCK_WAIT_FOREVER (-1)      /* wait_ms: wait until acquired */
#define DLOCK_NOWAIT 0               /* wait_ms: try once */
#define DLOCK_WATCHDOG 0             /* lease_ms: watchdog-renewed lease */
#define DLOCK_TOKEN_LEN 32           /* hex characters of a plain lock token */
/* The largest count a semaphore, permit semaphore or latch call takes
 * (permits, a count, a count-down, a delta's magnitude): 2^53 - 1, the
 * largest integer the servers' scripts (Lua numbers are doubles) hold
 * exactly. Larger arguments are refused with DLOCK_EINVAL. */
#define DLOCK_COUNT_MAX 9007199254740991LL
#define DLOCK_DEFAULT_WATCHDOG_MS 30000
#define DLOCK_DEFAULT_CONNECT_TIMEOUT_MS 2000
#define DLOCK_DEFAULT_COMMAND_TIMEOUT_MS 5000
/* How long before its lease runs out a holder should stop, given the lease:
 * a tenth of it. dlock_lock_valid_ms and dlock_permits_valid_ms count the
 * lease from just before the request that started it, so the server cannot
 * expire the hold sooner unless its clock runs faster than this process's;
 * a tenth covers a clock-rate difference of 1% (RedLock's drift factor,
 * twenty times NTP's 500 ppm bound) and leaves 9% of the lease (90 ms of a
 * 1 s lease, 2.7 s of 30 s) for the holder to notice and stop. `dlock run`
 * stops its command once the validity left is at most this margin, and the
 * client's watchdog (Redis) calls the lost callback at that point
 * (DLOCK_LOST_UNREACHABLE). */
#define DLOCK_LOST_MARGIN_MS(lease_ms) ((lease_ms) / 10)

/* ---- client ---- */
typedef struct dlock_client dlock_client;

typedef struct dlock_options {
    /* redis://[user[:password]@]host[:port][/db]   (port 6379, db 0)
     * rediss://...              the same over TLS (see the tls_* options)
     * unix:///path/to/redis.sock[?db=N]
     * redlock://NODE,NODE,...   independent masters, NODE as in redis://
     *                           without the scheme: [user[:password]@]host[:port][/db]
     * redis-sentinel://[password@]host:port,host:port/MASTER_NAME[/db]
     *                           sentinels to ask for the master MASTER_NAME; the
     *                           password is the master's (sentinels may use none)
     * redis-cluster://host:port,host:port   any reachable nodes of a Redis Cluster
     *                           of Redis 7 or later (sharded pub/sub): the first
     *                           node that answers INFO server at connect must say
     *                           redis_version 7 or more, else DLOCK_ENOTSUP
     * postgres://user:password@host:port/db  PostgreSQL advisory locks
     * mysql://user:password@host:port/db     MySQL/MariaDB GET_LOCK
     *                           (built when libpq / libmariadb were found). Their
     *                           locks are held while the session lives: pass
     *                           DLOCK_WATCHDOG; what they lack is DLOCK_ENOTSUP
     *                           (docs/backends.md).
     * zk://host:port,host:port[/chroot]      ZooKeeper lock recipe (session-held)
     * etcd://host:port,... / etcds://...     etcd leases (built when libcurl and
     *                           libcjson were found)
     * mysql://...?lock=table    MySQL/MariaDB table lock: a row with an expiry
     *                           (server clock) in dlock_locks: leases, extend
     *                           and force-unlock work
     * NULL means $DLOCK_URL, else redis://127.0.0.1:6379. User and password
     * may be percent-encoded (a ',' in a redlock password must be). */
    const char *url;
    /* Password for AUTH. Precedence: this field, then the URL's, then
     * $DLOCK_PASSWORD. Never logged, never in an error message. */
    const char *password;
    const char *username;        /* ACL user; NULL: the URL's, else none */
    int64_t connect_timeout_ms;  /* 0: DLOCK_DEFAULT_CONNECT_TIMEOUT_MS */
    int64_t command_timeout_ms;  /* 0: DLOCK_DEFAULT_COMMAND_TIMEOUT_MS */
    int64_t watchdog_lease_ms;   /* 0: DLOCK_DEFAULT_WATCHDOG_MS; renewed every third */
    int max_idle_connections;    /* pooled idle connections kept per server; 0: 8 */
    /* RedLock: how long one node may take to answer (connect included); 0:
     * 50 ms. Much smaller than the lease: a node down or frozen costs at most
     * this much of an acquire. */
    int64_t node_timeout_ms;
    /* RedLock: URL (redis://...) of one designated server whose counter
     * issues the fencing tokens, so that they are strictly increasing even
     * across node failures. NULL: each acquire's token is the largest of the
     * majority's own counters, which is NOT linearizable (see docs). The
     * token is asked for once a majority is held and must come within the
     * hold's validity: one that comes later could follow the next holder's,
     * so the acquire fails then (DLOCK_EIO, or not acquired: a wait goes on)
     * and gives the majority back. */
    const char *fence_url;
    /* After each lock acquire, wait until this many replicas acknowledged it
     * (Redis WAIT), for at most wait_replicas_timeout_ms (0: 1000 ms). Fewer
     * acknowledgements: the lock is released and DLOCK_EREPLICAS returned;
     * so too when they come only after the lease ran out (the lock is no
     * longer held then).
     * Every way of acquiring is covered, the fair lock's handoff by a
     * release included (the new owner takes the grant up with an attempt on
     * its own connection, a write after the grant, so its WAIT covers it),
     * and so is a Redis Cluster acquire redirected to another master (waited
     * for on the connection that wrote it). With Sentinel this keeps an
     * acquired lock across a failover to an acknowledging replica. 0: no
     * waiting. Not for RedLock; semaphores and latches are not waited for.
     * Lease renewals (the watchdog's) and dlock_extend wait too: a renewal
     * unacknowledged in time does not count (the hold is renewed again soon,
     * and lost at its due time if none is acknowledged), and an extend
     * unacknowledged fails with DLOCK_EREPLICAS, the hold keeping the
     * validity it had. Releases are not waited for. */
    int wait_replicas;
    int64_t wait_replicas_timeout_ms;
    /* TLS, for rediss:// (one server; not yet for redlock / sentinel / cluster
     * lists). The server's
     * certificate is verified against tls_ca_file / tls_ca_dir, or the
     * system's CAs when both are NULL, and must name the host of the URL (or
     * tls_server_name, also sent as SNI). A client certificate is sent when
     * tls_cert_file and tls_key_file are set. */
    const char *tls_ca_file;
    const char *tls_ca_dir;
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *tls_server_name;
    /* 1: skip certificate verification. For tests only: anyone on the path can
     * then read and change the traffic, passwords included. */
    int tls_insecure;
} dlock_options;

/* Fills *opts with defaults (all zero / NULL). */
DLOCK_EXPORT void dlock_options_init(dlock_options *opts);

/* Creates a client and connects it (one PING round trip checks the server
 * and the credentials).
 * opts: may be NULL (all defaults). The strings are copied.
 * out:  receives the client. As with sqlite3_open, *out is set even when the
 *       call fails (unless memory ran out, then it is NULL), so that
 *       dlock_errmsg(*out) tells why; free it with dlock_client_free().
 * Returns DLOCK_OK, DLOCK_EINVAL (bad URL or options), DLOCK_EIO (server
 * unreachable within the connect timeout), DLOCK_EAUTH, DLOCK_ENOMEM,
 * DLOCK_ESYS. */
DLOCK_EXPORT int dlock_client_new(const dlock_options *opts, dlock_client **out);

/* Stops the watchdog, closes every connection and frees the client. Locks
 * still held are not released (their leases run out); free or release lock
 * handles first. NULL is a no-op. */
DLOCK_EXPORT void dlock_client_free(dlock_client *c);

/* The calling thread's last client-level error message on c ("" if none).
 * Valid until the thread's next call on c. NULL c: a static message. */
DLOCK_EXPORT const char *dlock_errmsg(const dlock_client *c);

/* The fair lock's thread wait time W in ms (Redisson's
 * Config.fairLockWaitTimeout), used by this client's fair-lock waiters from
 * their next attempt on. A waiter joins the queue
 * "redisson_lock_timeout:{name}" with the deadline of the entry ahead of it
 * plus W (the first: the lock's remaining lease plus W), and every acquire
 * of the lock lowers the queued deadlines by W, as Redisson's do; a waiter
 * whose deadline passed is dropped from the head of the queue. A live dlock
 * waiter also keeps its deadline at least W ahead of the server's clock (it
 * comes back at least every min(W, 5000) / 3 ms), so it never expires while
 * it waits; one that stopped coming back (and kept its subscription: a
 * waiter whose connection is gone is dropped at once) keeps its place until
 * its deadline. Default DLOCK_DEFAULT_FAIR_WAIT_MS. A queue shared with Redisson
 * clients needs W equal to theirs on every client (Redisson's default is
 * DLOCK_REDISSON_FAIR_WAIT_MS): with a smaller W, each Redisson acquire
 * lowers dlock's entries below the clock and they lose their place. Safe to
 * call while other threads use c. DLOCK_EINVAL unless 1 <= wait_ms <=
 * 2^40; DLOCK_ENOTSUP off Redis (the fair lock is Redis's). */
#define DLOCK_DEFAULT_FAIR_WAIT_MS 5000
#define DLOCK_REDISSON_FAIR_WAIT_MS 300000
DLOCK_EXPORT int dlock_client_set_fair_wait(dlock_client *c, int64_t wait_ms);

/* What a wait does when the connection to the server fails or the server
 * stops answering (a command timeout) while it waits. By default (0) it
 * takes the failure for a transient outage: it pauses (50 ms, doubling up
 * to 1 s), connects again and goes on waiting, until the lock is had or the
 * caller's wait_ms runs out; then it returns the failure (DLOCK_EIO...) if
 * the server never came back, DLOCK_ETIMEDOUT if it did. An attempt whose
 * reply was lost may have taken the lock: a plain lock finds out (its
 * token is this call's) and gives such a hold back first; a reentrant,
 * fair, read or write lock re-enters it, and the release that ends the
 * last hold of the owner (client and thread) among the client's handles
 * gives back the count that no handle holds (not on RedLock, whose
 * leftover count runs out with the lease). With fail_fast 1 the
 * wait returns the failure at once. A try-once (wait_ms 0) never retries.
 * Locks (not the semaphores and latch, which return the failure at once);
 * RedLock waits ride out a node's failure by their majority instead.
 * Safe to call while other threads use c. Returns DLOCK_OK, DLOCK_EINVAL
 * (NULL c). */
DLOCK_EXPORT int dlock_client_set_fail_fast(dlock_client *c, int fail_fast);

/* Holder identity: from this call on, every lock that c acquires records
 * who holds it, for dlock_inspect_holder and `dlock status`: the host name,
 * the process id, command (NULL: this process's command line), the time the
 * hold began and label (NULL: none). The record lives in a key of its own
 * beside the lock, "dlock_holder:{name}:<owner>" (the layouts other clients
 * share are unchanged), written with the acquire, renewed with the lease
 * (extend and the watchdog) and deleted with the release; a holder that
 * crashed leaves it until its lease ends, and it is shown only while its
 * owner holds the lock. Plain, reentrant, fair, read and write locks (and
 * multi-locks of them). It costs no round trip: a short script goes in the
 * same write as each acquire attempt, release and extend, and one per
 * watchdog renewal batch. Tabs and line breaks in command and label become
 * spaces, and each is cut to 255 bytes. Call it again to change them; not
 * concurrently with other calls on c or its locks. Off by default.
 * Returns DLOCK_OK, DLOCK_EINVAL (NULL c), DLOCK_ENOMEM, DLOCK_ENOTSUP
 * (RedLock and the backends other than Redis). */
DLOCK_EXPORT int dlock_client_set_identity(dlock_client *c, const char *command,
                                           const char *label);

/* The identity recorded by holder `owner` of lock name (as dlock_inspect's
 * info.holder names it), written into buf (len bytes, NUL-terminated, cut
 * to fit) as tab-separated fields: host, pid, since (Unix ms), label,
 * command; later versions may add fields at the end. buf is "" when there is
 * none: the holder's client records no identity, or its hold ended. The
 * record says who took the hold; whether it still holds is the lock's to
 * say (dlock_inspect). Returns DLOCK_OK, DLOCK_EINVAL, DLOCK_ENAMETOOLONG,
 * DLOCK_ENOTSUP (as dlock_client_set_identity), or a failure code. */
DLOCK_EXPORT int dlock_inspect_holder(dlock_client *c, const char *name, size_t name_len,
                                      const char *owner, char *buf, size_t len);

/* This client's owner identity (a random 128-bit UUID-shaped string, as a
 * Redisson client's), used in reentrant lock fields "<uuid>:<thread id>". */
DLOCK_EXPORT const char *dlock_client_id(const dlock_client *c);

/* One PING round trip; *rtt_us (may be NULL) receives the round trip time in
 * microseconds. */
DLOCK_EXPORT int dlock_ping(dlock_client *c, int64_t *rtt_us);

/* ---- locks ---- */
typedef enum dlock_kind {
    /* One STRING key holding the owner's random token (redis-py Lock,
     * node-redlock, redsync layout). Not reentrant. */
    DLOCK_KIND_PLAIN = 1,
    /* Redisson RLock layout: HASH key, field "<client uuid>:<thread id>",
     * value the hold count. Reentrant per thread. */
    DLOCK_KIND_REENTRANT = 2,
    /* Redisson RFairLock layout: reentrant, and waiters get the lock in the
     * order they arrived (queue "redisson_lock_queue:{name}", deadlines in
     * "redisson_lock_timeout:{name}"). The release hands the lock straight
     * to the next waiter, which takes it up with one attempt; a waiter that
     * does not take it up within 500 ms (paused, hung) loses it and its
     * place, and the lock goes to the waiter behind it. A waiter that died
     * (its connection closed) is skipped at once. */
    DLOCK_KIND_FAIR = 3,
    /* The read side of Redisson's RReadWriteLock at `name`: many readers at
     * once, reentrant per thread. */
    DLOCK_KIND_READ = 4,
    /* The write side: one writer and no reader, reentrant per thread. The
     * thread holding the write side may also take the read side (downgrade),
     * never the reverse. Writer preference: while a writer waits, new readers
     * wait too, so a stream of readers cannot starve writers. The reverse is
     * not bounded: while writers keep waiting, readers wait (8 writers and 8
     * readers in loops for 40 s: 82,084 write holds and 8 read holds, the
     * readers' 30 s waits timing out). Readers that must progress under a
     * steady stream of writers need the writers paced, or one lock kind for
     * both (DLOCK_KIND_FAIR serves every waiter in arrival order). */
    DLOCK_KIND_WRITE = 5,
    /* Not lock kinds: what dlock_inspect()/dlock_list() report for the
     * other objects. */
    DLOCK_KIND_SEMAPHORE = 6,
    DLOCK_KIND_PERMIT_SEMAPHORE = 7,
    DLOCK_KIND_LATCH = 8
} dlock_kind;

typedef struct dlock_lock dlock_lock;

/* Lost-lease reasons passed to the callback. */
#define DLOCK_LOST_TAKEN 1        /* renewal found the lock no longer ours */
#define DLOCK_LOST_UNREACHABLE 2  /* no renewal confirmed in time (see dlock_lost_fn) */

/* Called on the client's watchdog thread when a held lock is found lost (on
 * ZooKeeper, etcd and MySQL's table mode: the backend's session or renewal
 * thread; register the callback there before acquiring). It must return
 * quickly and must not call dlock functions; set a flag, write a pipe or
 * signal a thread.
 * Redis (the client's watchdog): DLOCK_LOST_TAKEN when a renewal finds the
 * hold gone or another owner's; DLOCK_LOST_UNREACHABLE when no renewal has
 * been confirmed by the last confirmed one's start plus the lease minus
 * DLOCK_LOST_MARGIN_MS(lease), whether renewals fail or hang: before the
 * server can expire the hold, so before another client can acquire it
 * (tests/test_watchdog.c, a holder behind a killed or frozen proxy: the
 * callback ran ~100 ms, the margin of a 1 s lease, before another client
 * got the lock). That bound holds while the watchdog thread runs; a process
 * paused or starved past it gets the callback late, so supervise with
 * dlock_lock_valid_ms too, as `dlock run` does. The other backends keep
 * their own rules (docs/backends.md): there the callback may come after
 * the hold is gone. */
typedef void (*dlock_lost_fn)(dlock_lock *lock, int reason, void *userdata);

/* Creates a handle for the lock `name` of `kind` (DLOCK_KIND_PLAIN to
 * DLOCK_KIND_WRITE) on client c. Nothing is sent to the server. name_len:
 * bytes, or DLOCK_CSTR.
 * Returns DLOCK_OK, DLOCK_EINVAL (NULL argument, empty name, unknown kind),
 * DLOCK_ENAMETOOLONG, DLOCK_ENOMEM. */
DLOCK_EXPORT int dlock_lock_new(dlock_client *c, const char *name, size_t name_len,
                                dlock_kind kind, dlock_lock **out);

/* Frees the handle. If it still holds the lock, the lock is released first
 * (all holds of a reentrant handle), best effort. NULL is a no-op. */
DLOCK_EXPORT void dlock_lock_free(dlock_lock *l);

/* The handle's last error message ("" if none). */
DLOCK_EXPORT const char *dlock_lock_errmsg(const dlock_lock *l);

/* Acquires the lock.
 * wait_ms:  DLOCK_NOWAIT (try once), a bound in ms, or DLOCK_WAIT_FOREVER.
 *           Waiters sleep on the lock's pub/sub channel and retry when a
 *           release is announced, or after the holder's remaining TTL
 *           (bounded by the wait), so releases by clients that publish
 *           nothing are noticed too. As a backstop, a waiter on Redis also
 *           re-checks at a fixed interval: at least every 2 s, whatever it
 *           was told (a release nobody announced, a wake-up lost to a hung
 *           waiter); semaphore, permit semaphore and latch waits do the
 *           same.
 * lease_ms: the lease (> 0), or DLOCK_WATCHDOG: a lease of the client's
 *           watchdog_lease_ms renewed every third of it by the client's
 *           watchdog thread until released.
 * fence:    may be NULL; receives the fencing token, a 64-bit number strictly
 *           greater than every token issued before for this name. Redis: the
 *           token is max(counter + 1, the server's clock in microseconds),
 *           taken by the acquire script (re-entry and the fair lock's
 *           handoff included) and stored in the counter key
 *           "redisson_lock_token:{name}", which never expires (Redisson's
 *           RFencedLock INCRs the same key). It stays above every token
 *           before through a restart from any snapshot, without persistence,
 *           a failover, or a deleted counter, provided (docs/design.md,
 *           "Fencing tokens"): the clock of the server that issues it is
 *           ahead of the clocks of the servers that issued the earlier ones,
 *           at the times they did (no step back of the server's clock; a
 *           promoted replica's clock not behind by more than the failover
 *           took); the counter was not set ahead of the clock; and the ACL
 *           user may run TIME (without it: a plain INCR, increasing while
 *           the counter is kept). A counter INCR cannot count on (a word,
 *           another type, its largest value: a foreign write) is set to the
 *           clock; without TIME the acquire then fails (DLOCK_ESERVER) and
 *           holds nothing.
 * A reentrant handle already held by this thread re-enters (hold count + 1,
 * lease refreshed: raised, never shortened; a hold the watchdog keeps stays
 * kept, whatever the re-entry's lease). A plain handle that already holds
 * returns DLOCK_EINVAL.
 * Returns DLOCK_OK, DLOCK_EBUSY (try once, held elsewhere; also at once,
 * whatever the wait, when the name is held as a lock of another kind, whose
 * layout this kind cannot read), DLOCK_ETIMEDOUT, DLOCK_ECANCELED
 * (dlock_lock_cancel), or a failure code; on any non-OK return nothing is
 * held. */
DLOCK_EXPORT int dlock_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms,
                               uint64_t *fence);

/* Cancels the dlock_acquire of l under way in another thread (cancel every
 * lock of a dlock_multi_acquire's set to cancel it: it waits for one at a
 * time, and gives back the ones it had): it stops waiting, leaves the lock's queue or waiter
 * registry, gives back a lock that a release handed to it meanwhile (fair
 * lock), and returns DLOCK_ECANCELED, within a command round trip. An
 * acquire that already had the lock returns DLOCK_OK as usual. Only acquires
 * under way when this is called are cancelled; a later one waits as usual.
 * Safe from any thread and from a signal handler (async-signal-safe: it
 * updates an atomic counter and writes to an eventfd), but not concurrently
 * with dlock_lock_free(l). A handle that has waited keeps that one eventfd
 * open until dlock_lock_free. Every backend: on PostgreSQL and MySQL the
 * waiting thread, woken by the cancel, asks the server to end its statement
 * (a cancel request, KILL QUERY; the session stays); on ZooKeeper and etcd
 * the wait ends at once.
 * Returns DLOCK_OK, DLOCK_EINVAL (NULL). */
DLOCK_EXPORT int dlock_lock_cancel(dlock_lock *l);

/* Releases one hold (the last hold deletes the key and publishes the unlock
 * message on "redisson_lock__channel:{name}"). The server deletes the key only
 * if this handle's owner still owns it: never someone else's lock.
 * Returns DLOCK_OK, DLOCK_ENOTHELD (the handle holds nothing), DLOCK_ELOST
 * (the handle held it but the lease had expired or was taken over; the handle
 * no longer holds), or a failure code (DLOCK_EIO: the handle still counts as
 * holding, so a retry is possible; the lease runs out otherwise). RedLock:
 * DLOCK_ELOST when fewer than a majority still had the hold (counting the
 * nodes that did not answer); DLOCK_ENOQUORUM when fewer than a majority
 * answered (deleted on those that did; the handle still holds). A release of
 * one of a reentrant handle's holds leaves it holding only when a majority
 * still has the hold after it; otherwise the hold is over and the handle
 * holds nothing (DLOCK_OK; a count left on a minority of nodes runs out with
 * its lease). */
DLOCK_EXPORT int dlock_release(dlock_lock *l);

/* Sets the lease of a held lock to lease_ms (> 0) from now, owner-checked:
 * dlock_lock_valid_ms counts lease_ms from just before the request. A
 * watchdog lock becomes an explicit-lease lock. On the kinds whose hold the
 * server counts per owner (reentrant, fair, read and write locks: every
 * handle of one client and thread shares it), no re-entry, release that
 * leaves holds, extend or renewal shortens the server's expiry: the key
 * keeps the longer of its remaining lease and the new one, since another
 * handle of the same owner may count on it. Returns DLOCK_OK,
 * DLOCK_ENOTHELD, DLOCK_ELOST, DLOCK_EINVAL or a failure code; after a
 * failure that may have reached the server (DLOCK_EIO, DLOCK_EREPLICAS) the
 * handle still holds, counted valid for the shorter of what it had and
 * lease_ms. */
DLOCK_EXPORT int dlock_extend(dlock_lock *l, int64_t lease_ms);

/* 1 if the handle believes it holds the lock (no round trip), else 0. */
DLOCK_EXPORT int dlock_lock_holding(const dlock_lock *l);
/* How long the current hold is surely still valid, in ms, by this process's
 * CLOCK_BOOTTIME (it counts a system suspend): the lease counted from just before the request that
 * started it (acquire, extend, or the watchdog's last confirmed renewal);
 * RedLock: the lease less its clock-drift allowance (lease / 100 + 2 ms) in
 * every case. 0 when not held, lost, or past it. No round trip. Use it to skip work that
 * would not finish in time; fencing tokens are what make late writes safe. */
DLOCK_EXPORT int64_t dlock_lock_valid_ms(const dlock_lock *l);
/* 1 once the watchdog (or a release/extend) found the lease lost, else 0.
 * Cleared by the next successful acquire. Safe from any thread. */
DLOCK_EXPORT int dlock_lock_is_lost(const dlock_lock *l);
/* Registers the lost-lease callback (NULL to remove). */
DLOCK_EXPORT void dlock_lock_on_lost(dlock_lock *l, dlock_lost_fn fn, void *userdata);
/* The owner token of the current hold (plain: 32 hex chars; reentrant:
 * "<uuid>:<thread id>"), or "" when not held. */
DLOCK_EXPORT const char *dlock_lock_token(const dlock_lock *l);
/* The fencing token of the latest successful acquire (0 if none). */
DLOCK_EXPORT uint64_t dlock_lock_fence(const dlock_lock *l);
DLOCK_EXPORT const char *dlock_lock_name(const dlock_lock *l, size_t *len);
DLOCK_EXPORT dlock_kind dlock_lock_kind(const dlock_lock *l);

/* Asks the server whether this handle's owner holds the lock now: *held 1/0;
 * *count (may be NULL) the server's hold count for this owner (plain: 1/0). */
DLOCK_EXPORT int dlock_lock_check(dlock_lock *l, int *held, int64_t *count);

/* ---- queries by name (any client; no handle needed) ---- */

/* *locked = 1 if the key `name` exists (held by anyone), else 0. */
DLOCK_EXPORT int dlock_is_locked(dlock_client *c, const char *name, size_t name_len,
                                 int *locked);
/* *ttl_ms = remaining lease in ms; -2 when free, -1 when held without expiry. */
DLOCK_EXPORT int dlock_remaining_ttl(dlock_client *c, const char *name, size_t name_len,
                                     int64_t *ttl_ms);
/* *fence = the last fencing token issued for name (its counter; 0 if none
 * was ever issued, or the counter was deleted or lost; dlock_acquire). */
DLOCK_EXPORT int dlock_fence_current(dlock_client *c, const char *name, size_t name_len,
                                     uint64_t *fence);

/* Information about one lock, from dlock_inspect(). */
typedef struct dlock_info {
    int exists;          /* 1 if held (the key exists) */
    int kind;            /* DLOCK_KIND_PLAIN / DLOCK_KIND_REENTRANT, 0 if free or unknown */
    int64_t ttl_ms;      /* as dlock_remaining_ttl */
    uint64_t fence;      /* last fencing token issued */
    int64_t hold_count;  /* reentrant: the holder's count; plain: 1 when held */
    int64_t waiters;     /* blocked waiters: subscribers of the unlock channel
                          * (reentrant, Redisson), plus the plain lock's
                          * registered and the fair lock's queued waiters;
                          * read and write: subscribers of the read-write
                          * channel redisson_rwlock:{name} */
    char holder[160];    /* plain: the token; reentrant: the first field; "" */
    int holders;         /* number of holder fields (reentrant), 1 or 0 (plain) */
    /* read-write lock: readers holding, 1 if a writer holds */
    int64_t readers;
    int writer;
    int64_t queued;      /* fair lock: waiters in the queue */
    int64_t permits;     /* semaphores: available permits; latch: the count */
    int64_t leased;      /* permit-expirable semaphore: permits out on lease */
} dlock_info;

/* Fills *info for name in a few round trips. Redis: a key whose layout is
 * none of the locks', semaphores' or latches' (docs/cli.md "What list and
 * force-unlock recognise": a plain lock's value must be an owner token, a
 * HASH's fields owner fields with positive counts) gives kind 0 and
 * exists 1. */
DLOCK_EXPORT int dlock_inspect(dlock_client *c, const char *name, size_t name_len,
                               dlock_info *info);

/* DANGEROUS: deletes the lock whoever holds it and publishes the unlock
 * message so waiters retry. The holder is not told until its next renewal,
 * extend or release, and may still be running its critical section: use it
 * only to clean up after a holder known dead. *existed (may be NULL) 1/0. */
DLOCK_EXPORT int dlock_force_unlock(dlock_client *c, const char *name, size_t name_len,
                                    int *existed);

/* ---- token operations (for processes that hold no handle, e.g. the CLI's
 * acquire / release / extend across separate invocations) ---- */

/* Acquires a plain lock with an explicit lease and no handle. token must have
 * room for DLOCK_TOKEN_LEN + 1 bytes; receives the random owner token.
 * wait_ms as dlock_acquire. */
DLOCK_EXPORT int dlock_acquire_token(dlock_client *c, const char *name, size_t name_len,
                                     int64_t wait_ms, int64_t lease_ms,
                                     char token[DLOCK_TOKEN_LEN + 1], uint64_t *fence);
/* Releases the plain lock name if token owns it. DLOCK_ENOTOWNER otherwise
 * (wrong token, or the lease expired); nothing is changed then. A token not
 * of the shape dlock_acquire_token gives (DLOCK_TOKEN_LEN lowercase hex
 * digits) is DLOCK_EINVAL, so that no other value of the key can pass for
 * one (dlock_extend_token too). */
DLOCK_EXPORT int dlock_release_token(dlock_client *c, const char *name, size_t name_len,
                                     const char *token);
/* Sets the lease of the plain lock name to lease_ms if token owns it;
 * DLOCK_ENOTOWNER otherwise. */
DLOCK_EXPORT int dlock_extend_token(dlock_client *c, const char *name, size_t name_len,
                                    const char *token, int64_t lease_ms);

/* ---- listing ---- */

/* Calls fn once per key matching the glob pattern (NULL: "*") laid out as a
 * lock, a semaphore or a latch (dlock_inspect gives it a kind other than 0),
 * using SCAN (never KEYS). fn returns 0 to go on, non-zero to stop. */
typedef int (*dlock_list_fn)(const char *name, size_t name_len, const dlock_info *info,
                             void *userdata);
DLOCK_EXPORT int dlock_list(dlock_client *c, const char *pattern, dlock_list_fn fn,
                            void *userdata);

/* ---- server facts (for `dlock doctor`) ---- */

/* Reads one fact about the server into buf (truncated to buflen - 1 bytes).
 * "backend" works on every client: "redis", "postgres", "mysql", ...
 * Redis: CONFIG GET / INFO field `what` (e.g. "maxmemory-policy", or
 * "info:replication:role"). Other backends: "version" (the server's version)
 * and "session" (what keeps a lock held there), plus the ones docs/backends.md
 * lists. Returns DLOCK_OK, DLOCK_ESERVER when the server refuses (CONFIG
 * disabled by ACL) or has no such fact, or a failure code. */
DLOCK_EXPORT int dlock_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen);

/* ---- multi-lock ---- */

/* Acquires every lock in locks[0..n) (any kinds, any names, one client or
 * several), all or nothing, within one wait bound. Locks are taken in a
 * canonical order (by name, then kind), so two callers taking overlapping
 * sets in different orders cannot deadlock. lease_ms as dlock_acquire; once
 * the whole set is held, the lease of every lock taken before the last one
 * is restarted (owner-checked, watchdog locks too), so that on DLOCK_OK
 * every lock has its full lease from about then: dlock_multi_valid_ms is
 * about lease_ms (the watchdog lease with DLOCK_WATCHDOG), however long the
 * wait for the later locks took. A lock whose lease ran out meanwhile (or
 * that the watchdog lost) is never returned as held: it is taken again
 * (the locks after it in the canonical order given back and taken again
 * after it) while the wait lasts. On failure every lock taken so far is
 * released and the first failure's code is returned (DLOCK_EBUSY,
 * DLOCK_ETIMEDOUT, DLOCK_ELOST with a wait of 0 when a lock's lease ran out
 * before the set was complete...), with its message on that lock's handle.
 * fences (may be NULL) receives each lock's token in the caller's order.
 * The same handle twice is DLOCK_EINVAL. */
DLOCK_EXPORT int dlock_multi_acquire(dlock_lock *const *locks, size_t n, int64_t wait_ms,
                                     int64_t lease_ms, uint64_t *fences);
/* How long the set locks[0..n) is surely still held, in ms: the least
 * dlock_lock_valid_ms of its locks (0 when one is not held, is lost, or
 * locks is NULL or n is 0; a NULL entry counts as not held). No round trip. */
DLOCK_EXPORT int64_t dlock_multi_valid_ms(dlock_lock *const *locks, size_t n);
/* Releases one hold of every lock in locks[0..n), all attempted even when
 * one fails; returns the first failure (DLOCK_OK if none). */
DLOCK_EXPORT int dlock_multi_release(dlock_lock *const *locks, size_t n);

/* ---- semaphore (Redisson RSemaphore layout) ----
 * STRING `name` holds the available permits; a release publishes the new
 * count on "redisson_sc:{name}". Permits are not owned: anyone may release.
 * On ZooKeeper (zk://) and etcd (etcd://) permits are owned by the handle
 * that acquired them (lease nodes / leased keys; docs/backends.md): release
 * gives back only those, freeing the handle gives them back, a dead
 * holder's come back at its session's end / when its lease runs out. Other
 * backends: DLOCK_ENOTSUP from dlock_semaphore_new.
 * A handle is used by one thread at a time. */
typedef struct dlock_semaphore dlock_semaphore;

DLOCK_EXPORT int dlock_semaphore_new(dlock_client *c, const char *name, size_t name_len,
                                     dlock_semaphore **out);
DLOCK_EXPORT void dlock_semaphore_free(dlock_semaphore *s);
DLOCK_EXPORT const char *dlock_semaphore_errmsg(const dlock_semaphore *s);
/* Takes `permits` (>= 1) permits, waiting up to wait_ms (DLOCK_NOWAIT,
 * DLOCK_WAIT_FOREVER). DLOCK_EBUSY / DLOCK_ETIMEDOUT when not available.
 * A waiter wakes on the count a release or add publishes, and on Redis
 * re-checks at least every 2 s as a backstop (permits added by a client
 * that publishes nothing, a manual INCRBY). */
DLOCK_EXPORT int dlock_semaphore_acquire(dlock_semaphore *s, int64_t permits, int64_t wait_ms);
/* As dlock_lock_cancel, for a dlock_semaphore_acquire of s waiting in
 * another thread: it returns DLOCK_ECANCELED, holding nothing (on
 * ZooKeeper its lease nodes are deleted). Redis and ZooKeeper. */
DLOCK_EXPORT int dlock_semaphore_cancel(dlock_semaphore *s);
/* Gives back `permits` (>= 1) permits and wakes waiters. ZooKeeper:
 * DLOCK_EINVAL if this handle holds fewer; DLOCK_ELOST if the session
 * holding them expired (they were freed). Redis: a release (and an add) is
 * counted once: it carries a random id, kept 60 s in the key
 * "dlock_semchg:{name}:<id>", and one whose reply was lost is sent again
 * with that id on another connection, once (not when the client fails
 * fast); DLOCK_EIO only when that fails too, the change then counted once
 * or not at all (docs/design.md, "Semaphore changes counted once"). */
DLOCK_EXPORT int dlock_semaphore_release(dlock_semaphore *s, int64_t permits);
DLOCK_EXPORT int dlock_semaphore_available(dlock_semaphore *s, int64_t *permits);
/* Sets the permits only if the semaphore does not exist yet: *set 1/0. */
DLOCK_EXPORT int dlock_semaphore_try_set(dlock_semaphore *s, int64_t permits, int *set);
/* Adds delta (may be negative) to the available permits (ZooKeeper: to
 * the total; creates the semaphore at delta if missing). */
DLOCK_EXPORT int dlock_semaphore_add(dlock_semaphore *s, int64_t delta);
/* Called when permits s holds are gone without a release. Only where
 * permits belong to their holder: on ZooKeeper, when the session holding
 * them expired (reason DLOCK_LOST_UNREACHABLE; on the ZooKeeper client's
 * thread); on etcd, when the keep-alive thread finds their lease gone
 * (DLOCK_LOST_TAKEN, on that thread). Release then says DLOCK_ELOST. A Redis semaphore is a
 * counter: its permits are never lost, fn is never called. The rules of
 * dlock_lost_fn apply: return quickly, call no dlock function. */
typedef void (*dlock_semaphore_lost_fn)(dlock_semaphore *s, int reason, void *userdata);
/* Registers the lost-permits callback (NULL to remove). Register it before
 * acquiring. */
DLOCK_EXPORT void dlock_semaphore_on_lost(dlock_semaphore *s, dlock_semaphore_lost_fn fn,
                                          void *userdata);

/* ---- permit-expirable semaphore (Redisson RPermitExpirableSemaphore) ----
 * STRING `name` holds the available permits, ZSET "{name}:timeout" each
 * acquired permit's id and expiry. A holder that dies loses its permits
 * after their lease instead of leaking them. A permit id is 16 random
 * bytes: the API shows them as DLOCK_PERMIT_ID_LEN hex characters (lower
 * case; either case is accepted), the ZSET holds the raw bytes, as
 * Redisson's: an id from Redisson's RPermitExpirableSemaphore can be
 * released or renewed here and one from here there. */
#define DLOCK_PERMIT_ID_LEN 32   /* hex characters of a permit id */
typedef struct dlock_permits dlock_permits;

DLOCK_EXPORT int dlock_permits_new(dlock_client *c, const char *name, size_t name_len,
                                   dlock_permits **out);
/* Stops renewing this handle's watchdog permits (they expire) and frees. */
DLOCK_EXPORT void dlock_permits_free(dlock_permits *p);
DLOCK_EXPORT const char *dlock_permits_errmsg(const dlock_permits *p);
/* Takes one permit with a lease (> 0, or DLOCK_WATCHDOG: renewed by the
 * client's watchdog until released), waiting up to wait_ms. id receives the
 * permit's id. DLOCK_EBUSY / DLOCK_ETIMEDOUT when none is available. */
DLOCK_EXPORT int dlock_permits_acquire(dlock_permits *p, int64_t wait_ms, int64_t lease_ms,
                                       char id[DLOCK_PERMIT_ID_LEN + 1]);
/* As dlock_lock_cancel, for a dlock_permits_acquire of p waiting in another
 * thread: it returns DLOCK_ECANCELED, holding no permit. */
DLOCK_EXPORT int dlock_permits_cancel(dlock_permits *p);
/* Releases the permit id: DLOCK_ENOTOWNER if it is not held (expired, or
 * never issued). */
DLOCK_EXPORT int dlock_permits_release(dlock_permits *p, const char *id);
/* Sets the lease of permit id to lease_ms from now, or leaves it when it
 * runs longer already (another handle may count on it: a lease is never
 * shortened, the watchdog's renewals included); DLOCK_ENOTOWNER if gone. */
DLOCK_EXPORT int dlock_permits_renew(dlock_permits *p, const char *id, int64_t lease_ms);
/* How long permit id, held through p, is surely still valid, in ms, by this
 * process's CLOCK_BOOTTIME: as dlock_lock_valid_ms, its lease counted from
 * just before the request that started it (the acquire, a
 * dlock_permits_renew through p, or the watchdog's last confirmed renewal).
 * 0 when p holds no such permit (never taken or renewed through p,
 * released, past its lease) or the watchdog found it lost. No round trip;
 * not concurrently with another call on p (the watchdog's renewals may run
 * meanwhile). Supervise a DLOCK_WATCHDOG permit with it as a lock with
 * dlock_lock_valid_ms: the lost-permit callback cannot run before the
 * watchdog has a reason to call it. */
DLOCK_EXPORT int64_t dlock_permits_valid_ms(const dlock_permits *p, const char *id);
/* Called on the client's watchdog thread when a permit p took with
 * DLOCK_WATCHDOG is found lost: its lease entry was gone at a renewal
 * (DLOCK_LOST_TAKEN: it expired, or another client removed it) or no renewal
 * was confirmed in time (DLOCK_LOST_UNREACHABLE, at the same point as a
 * lock's: see dlock_lost_fn). id is that
 * permit's id. The permit is no longer renewed, and its release answers
 * DLOCK_ENOTOWNER once it is gone. The rules of dlock_lost_fn apply: return
 * quickly, call no dlock function. */
typedef void (*dlock_permit_lost_fn)(dlock_permits *p, const char *id, int reason,
                                     void *userdata);
/* Registers the lost-permit callback for p's watchdog permits (NULL to
 * remove); safe while the watchdog renews them. */
DLOCK_EXPORT void dlock_permits_on_lost(dlock_permits *p, dlock_permit_lost_fn fn,
                                        void *userdata);
/* Available permits, after returning expired ones. */
DLOCK_EXPORT int dlock_permits_available(dlock_permits *p, int64_t *permits);
DLOCK_EXPORT int dlock_permits_try_set(dlock_permits *p, int64_t permits, int *set);
DLOCK_EXPORT int dlock_permits_add(dlock_permits *p, int64_t delta);

/* ---- countdown latch (Redisson RCountDownLatch layout) ----
 * STRING `name` holds the count; channel
 * "redisson_countdownlatch__channel__{name}" gets "0" when the count reaches
 * zero (the key is deleted then) and "1" when a new count is set. The braces
 * are there for every name, one with a hash tag of its own too (as
 * Redisson's). */
typedef struct dlock_latch dlock_latch;

/* Creates a latch handle (nothing is sent). DLOCK_EINVAL for a bad name; on a
 * Redis Cluster also for a name whose channel hashes to another slot than
 * the key (a name with '{' and '}' in it, e.g. "job{42}": the message says
 * so). DLOCK_ENOTSUP off Redis. */
DLOCK_EXPORT int dlock_latch_new(dlock_client *c, const char *name, size_t name_len,
                                 dlock_latch **out);
DLOCK_EXPORT void dlock_latch_free(dlock_latch *l);
DLOCK_EXPORT const char *dlock_latch_errmsg(const dlock_latch *l);
/* Sets the count (>= 1) only if the latch is at zero: *set 1/0. */
DLOCK_EXPORT int dlock_latch_try_set(dlock_latch *l, int64_t count, int *set);
/* Sets the count (>= 0) unconditionally. */
DLOCK_EXPORT int dlock_latch_set(dlock_latch *l, int64_t count);
/* Counts down by k (>= 1), not below zero; reaching zero wakes waiters. */
DLOCK_EXPORT int dlock_latch_count_down(dlock_latch *l, int64_t k);
/* Waits until the count is zero: DLOCK_OK, or DLOCK_ETIMEDOUT. */
DLOCK_EXPORT int dlock_latch_await(dlock_latch *l, int64_t wait_ms);
/* As dlock_lock_cancel, for a dlock_latch_await of l waiting in another
 * thread: it returns DLOCK_ECANCELED. */
DLOCK_EXPORT int dlock_latch_cancel(dlock_latch *l);
DLOCK_EXPORT int dlock_latch_count(dlock_latch *l, int64_t *count);

/* ---- parsing helpers shared with the CLI ---- */

/* Parses a duration: "250ms", "1.5s", "30s", "5m", "1h", "2d"; a bare number
 * is seconds. Result in ms, rounded to the nearest ms; must fit 0..2^53 ms.
 * Returns DLOCK_OK or DLOCK_EINVAL. */
DLOCK_EXPORT int dlock_parse_duration(const char *s, int64_t *ms);

/* ---- global ID worker (seed 002's RedisIdWorker) ----
 * id = (seconds since epoch_s) << 32 | n, where n comes from a per-day Redis
 * counter "icr:<prefix>:<yyyy:mm:dd>" (UTC). */
typedef struct dlock_idworker dlock_idworker;

typedef struct dlock_idworker_options {
    int64_t epoch_s;   /* Unix seconds of the epoch; 0: 2022-01-01T00:00:00Z */
    int64_t batch;     /* ids reserved per INCRBY; 0 or 1: one INCR per id */
} dlock_idworker_options;

/* Creates an ID worker for prefix on c. opts may be NULL. */
DLOCK_EXPORT int dlock_idworker_new(dlock_client *c, const char *prefix,
                                    const dlock_idworker_options *opts,
                                    dlock_idworker **out);
DLOCK_EXPORT void dlock_idworker_free(dlock_idworker *w);
/* Next id. DLOCK_EOVERFLOW when the day's counter passed 2^32 - 1 or the
 * seconds no longer fit 31 bits. Not thread-safe: one worker per thread. */
DLOCK_EXPORT int dlock_idworker_next(dlock_idworker *w, uint64_t *id);
DLOCK_EXPORT const char *dlock_idworker_errmsg(const dlock_idworker *w);

#ifdef __cplusplus
}
#endif
#endif /* DLOCK_H */
