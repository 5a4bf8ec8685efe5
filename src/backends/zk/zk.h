/* The ZooKeeper backend's own declarations, shared by its files
 * (src/backends/zk/): the design below, the types, and the functions one
 * file of the backend lends another. */
/* ZooKeeper backend: zk://host1:2181,host2:2181/chroot (the chroot is
 * optional; hosts as the ZooKeeper C client takes them).
 *
 * Locks follow the ZooKeeper lock recipe:
 * - Layout: {chroot}/dlock/locks/{hex(name)}/{kind}-{guid}-{seq}. The name's
 *   bytes in lowercase hex make one valid znode name whatever they are ('/',
 *   NUL, "..", ...). The per-name parent is a container node (the server
 *   deletes it some time after its last child goes); {chroot}, dlock and
 *   locks are persistent. Parents are created when a create under them
 *   answers ZNONODE (a container vanished, or a first use): the parent
 *   alone first, every ancestor from the top only when that answers ZNONODE
 *   too.
 * - Requests: an uncontended acquire + release sends the recipe's minimum,
 *   a create, a get-children and a delete, whatever the kind (a re-entry
 *   sends nothing). Once a handle has found its name's parent, its create's
 *   get-children is sent right behind the create, without waiting for the
 *   create's answer (a session's requests are applied in order: the listing
 *   has our node), so a pair takes two round trips. Plus a create that fails
 *   and the container's create when the name's container is gone (its first
 *   use, or the server deleted it after its last child went), and then the
 *   get-children sent along with the failed create. Waiting adds a get with a watch on the
 *   predecessor and a get-children per wake-up; a connection loss during the
 *   create adds the get-children that looks for our guid and an exists.
 * - An acquire creates an ephemeral sequential child. Kind is "write" for
 *   plain, reentrant and write locks, "read" for read locks, so every kind of
 *   one name shares one queue: a writer (or plain holder) waits for the child
 *   just before it, a reader for the last "write" child before it. Each waiter
 *   watches only that predecessor (no herd effect on the server; threads of
 *   one process waiting on one client re-check when any of their watches
 *   fires). The queue is FIFO.
 * - guid: 16 random bytes (getrandom) in hex, fresh per attempt. When a
 *   create fails with ZCONNECTIONLOSS the request may or may not have been
 *   applied: the children are listed to find the node with our guid before
 *   creating again, so one attempt never leaves a second node behind. A
 *   create that gets no answer within the command timeout is abandoned: a
 *   late success deletes the node it made, a late connection loss searches
 *   for it by guid after the reconnection (the "orphans" below). Only our
 *   queue nodes and leases are taken back so: a late create of a parent or
 *   of a semaphore's node (shared, its outcome reported unknown) stays.
 * - Orphans: nodes of ours that nobody waits for any more (a given-up wait
 *   whose delete did not get through, a handle freed while its release
 *   failed) are deleted in the background, again after each reconnection,
 *   until the server confirms or the session ends.
 * - wait_ms 0 tries once (DLOCK_EBUSY), a bound gives DLOCK_ETIMEDOUT; in
 *   both cases our child is deleted before returning. Forever waits forever.
 * - Fencing token: the czxid of our child (the zxid of the transaction that
 *   created it). Zxids are global to the ensemble and only grow, so tokens of
 *   one name strictly increase across holders. The sequence number is not
 *   used: it is per parent and restarts at 0 once the container parent is
 *   deleted and re-created. Re-entries of a handle return its hold's token.
 *   dlock_fence_current answers the token of the current holder (the largest
 *   among the readers holding), 0 when nobody holds: ZooKeeper keeps no record
 *   of a name whose nodes are gone.
 * - Sessions: one ZooKeeper session per client, requested with a timeout of
 *   the client's watchdog_lease_ms (the server clamps it to 2..20 ticks); it
 *   keeps every lock of the client held while it lives. Handles exclude each
 *   other (locks are per node, not per session); re-entries are counted by
 *   the handle. An explicit lease_ms and dlock_extend are DLOCK_ENOTSUP.
 * - Session expiry (the server ended the session: the process was frozen or
 *   cut off longer than the timeout) is seen by the session watcher: every
 *   handle holding on that session is marked lost at once (dlock_lock_is_lost,
 *   the lost callback with DLOCK_LOST_UNREACHABLE, on ZooKeeper's completion
 *   thread); release then says DLOCK_ELOST and check "not held". The client
 *   opens a new session for later calls. While merely disconnected, check
 *   fails with DLOCK_EIO (the lock may still be held); release re-sends its
 *   delete while the session lives (ZNONODE after an unanswered delete: it
 *   was applied), then fails with DLOCK_EIO keeping the hold.
 * - Timeouts: at open the hosts are tried by plain TCP first (the C client
 *   retries a refused host forever: this says "refused" at once); the
 *   first session must come up within connect_timeout_ms;
 *   every request waits at most command_timeout_ms for its answer (the
 *   asynchronous API plus a deadline; a late answer is dropped).
 * - The C client's own log goes to a no-op callback (per handle); nothing is
 *   printed. libzookeeper_mt runs two threads per session (I/O, completions).
 *   Its host list is resolved again at most every ZK_RESOLVE_DELAY_MS while
 *   connected, and at every connection attempt (by default the C client
 *   resolves it before each poll of its socket: a name lookup per request
 *   sent or answered).
 * - Semaphores (dlock_semaphore_*): {chroot}/dlock/sems/{hex(name)} is a
 *   persistent node whose data is the total permits in decimal; "" while
 *   unset (an acquire made the node before any try_set / add). try_set
 *   writes it only while unset (create, or a set with the version read: a
 *   compare-and-set); add adds to it (creating it at delta), again by
 *   compare-and-set. Each permit held or waited for is one ephemeral
 *   sequential child "lease-{guid}-{seq}" (data "1"): an acquire of k
 *   permits creates its k children in one multi (all or none, consecutive
 *   sequence numbers; found again by guid after a connection loss, as for
 *   locks). The acquisition holds when the number of leases up to its last
 *   one (in sequence order) fits the total, so holders are a prefix of the
 *   queue and order is FIFO (a big request at the head holds up smaller
 *   ones behind it). Otherwise it waits with the deadline, watching the
 *   total and, with no herd: the children if it is the first waiter, else
 *   the last lease of the waiter just ahead, which marks it (data "held")
 *   when admitted or deletes it when it gives up (see mark_held); try once
 *   (DLOCK_EBUSY) and a timed wait (DLOCK_ETIMEDOUT) delete its leases
 *   before returning.
 *   Permits are owned: release(n) deletes n of the handle's own leases (the
 *   latest first) and is DLOCK_EINVAL beyond what the handle holds (Redis's
 *   release adds permits whoever calls it); freeing the handle gives its
 *   permits back; a holder that dies frees them when its session ends; after
 *   the session expired, release says DLOCK_ELOST. available = total - the
 *   leases that fit (waiters are not counted). After add lowered the total
 *   below what is held, the holders beyond it keep their permits (nobody
 *   new gets one until enough are released); available counts only the
 *   holders that fit the new total, so it can read above 0 then (or the
 *   total, if negative). An add or try_set whose answer is lost is not
 *   re-sent (it could apply twice): DLOCK_EIO. An acquire's multi is kept
 *   under 512 KiB (the server's jute.maxbuffer is 1 MiB): about 5000
 *   permits per acquire for a short name, 240 for the longest
 *   (DLOCK_EINVAL beyond). The node of a name stays, like Redis's key.
 * - Not supported: leases, extend, force_unlock, list, permit-expirable
 *   semaphores, latches, token operations, fair locks (plain locks here are
 *   FIFO anyway).
 */
#ifndef DLOCK_BACKEND_ZK_H
#define DLOCK_BACKEND_ZK_H

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>

#include <zookeeper/zookeeper.h>

#include "kinds.h"

#define ZK_GUID_BYTES 16
/* how long a resolution of the host list stands while connected */
#define ZK_RESOLVE_DELAY_MS 1000
/* not a ZooKeeper code: our own deadline passed with the request unanswered */
#define ZK_NOANSWER (-10000)

typedef struct zk_lock zk_lock;
typedef struct zk_sem zk_sem;
typedef struct zk_orphan zk_orphan;

/* One ZooKeeper session. Freed (and closed) when the last reference goes:
 * the client's, and one per handle holding a node on it. */
typedef struct zk_sess {
    zhandle_t *zh;
    pthread_mutex_t mu;        /* guards what follows */
    pthread_cond_t cv;         /* state changes and watch events */
    int connected;
    int dead;                  /* expired or auth failed: never usable again */
    uint64_t events;           /* watch events seen */
    struct zk_waker *wakers;   /* waits told of each event through an eventfd */
    zk_lock *held;             /* handles holding a node on this session */
    zk_sem *held_sems;         /* semaphore handles holding leases on it */
    zk_orphan *orphans;        /* our nodes to delete (sent again on reconnect) */
    int refs;
} zk_sess;

/* A node of ours that no one waits for any more and whose delete did not get
 * through yet: deleted in the background, again after each reconnection,
 * until the server confirms (or the session ends, taking it along). */
struct zk_orphan {
    zk_sess *s;
    char *path;                /* the node; or NULL and: */
    char *parent;              /* search parent for a child named match* */
    char *match;               /* "write-<guid>-" of a create whose outcome is unknown */
    int inflight;
    zk_orphan *next;
};

typedef struct zk_client {
    char *hosts;
    char *root;                /* "{chroot}/dlock/locks" */
    char *sems;                /* "{chroot}/dlock/sems" */
    int64_t cmd_timeout_ms;
    int64_t connect_timeout_ms;
    int session_ms;
    pthread_mutex_t mu;        /* guards sess */
    zk_sess *sess;
} zk_client;

struct zk_lock {
    dlock_lock *l;
    char *parent;              /* root + "/" + hex(name) */
    zk_sess *sess;             /* set (a reference) while we own a node */
    char *node;                /* our node's full path while we own it */
    int lost;                  /* guarded by sess->mu */
    zk_lock *next, *prev;      /* in sess->held, guarded by sess->mu */
    int parent_seen;           /* a create of this handle found or made parent */
};

/* A lock or semaphore wait sleeps in poll(2) on its handle's cancel
 * eventfd, which a cancel writes to (async-signal-safely: it cannot signal
 * a condition variable) and the session's watcher writes to on each event,
 * while the wait is registered here (under the session's mutex). Without an
 * eventfd (it could not be made), the wait sleeps on the condition variable
 * in ZK_CANCEL_SLICE_MS slices and looks at the cancel between them. */
typedef struct zk_waker {
    int fd;
    struct zk_waker *next;
} zk_waker;

#define ZK_CANCEL_SLICE_MS 50

/* One asynchronous request. Two references: the caller's, the completion's
 * (a caller that gives up at its deadline leaves the op to the completion).
 * state goes once from ZK_OP_PENDING to ZK_OP_DONE (the completion
 * delivered: rc and the results below are the caller's to read, and the
 * completion posts sem) or to ZK_OP_ABANDONED (the caller gave up first:
 * the completion cleans up after the request alone). */
typedef struct zk_op {
    sem_t sem;                 /* posted once, at ZK_OP_DONE */
    atomic_int refs;
    atomic_int state;
    int rc;
    zk_sess *s;                /* for cleaning up after an abandoned create */
    int own;                   /* a create of our own queue node or leases */
    char *prefix;              /* create: the path asked for */
    char *path;                /* create: the node made */
    struct Stat st;
    char **kids;               /* get_children: copies */
    int nkids;
    char *data;                /* get: a copy of the data (NUL-terminated) */
    int datalen;
    zoo_op_t *mops;            /* multi: the creates, their results and paths */
    zoo_op_result_t *mres;
    char **mpaths;
    int nm;
} zk_op;

enum { ZK_OP_PENDING, ZK_OP_DONE, ZK_OP_ABANDONED };

enum { OP_CREATE, OP_DELETE, OP_EXISTS, OP_WATCH, OP_KIDS, OP_WATCH_KIDS, OP_GET, OP_SET };

/* A child "read-<guid>-<seq>" / "write-<guid>-<seq>". */
typedef struct zk_child {
    const char *name;
    int write;
    char guid[2 * ZK_GUID_BYTES + 1];
    long long seq;
} zk_child;

/* A waiter reads the node ahead of it, leaving a watch on it (data change
 * or delete). DLOCK_OK: watched (*op, if op is not NULL, has its data);
 * ZK_LOOK_AGAIN: the waiter looks at the queue again at once (the node is
 * gone already, or the connection was lost for a moment: after a 50 ms
 * pause); else a failure code. */
#define ZK_LOOK_AGAIN (-1)

#define ZK_LEASE_PREFIX "lease-"

/* the most bytes of creates one acquire sends in its multi */
#define ZK_MULTI_BYTES (512 * 1024)

struct zk_sem {
    dl_object *o;
    char *node;                /* sems + "/" + hex(name) */
    zk_sess *sess;             /* set (a reference) while leases are held */
    char **leases;             /* full paths of the lease nodes this handle holds */
    int64_t nleases, cap;
    zk_sem *prev, *next;       /* in sess->held_sems while leases are held */
};

/* One lease child as listed. */
typedef struct zk_lease {
    const char *name;
    char guid[2 * ZK_GUID_BYTES + 1];
    long long seq;
} zk_lease;

/* A waiter that got its permits marks its last lease (data "held"), so the
 * waiter queued right behind it, which watches that lease, wakes and takes
 * over the watch on the leases. Sent without waiting for the answer: if it
 * is lost, that waiter's periodic re-check (ZK_SEM_RECHECK_MS) notices. */
#define ZK_LEASE_HELD "held"

#define ZK_SEM_RECHECK_MS 2000

/* wait.c */
int dl_zk_sess_dead(zk_sess *s);
void dl_zk_give_up_node(zk_client *zc, zk_sess *s, const char *path);
int dl_zk_wait_event(zk_sess *s, uint64_t ev0, int64_t deadline, dl_cancel *cx);
int dl_zk_watch_ahead(zk_client *zc, zk_sess *s, const char *path, int64_t deadline,
                      const char *what, zk_op **op, dl_err *err);

/* lock.c */
int dl_zk_lock_init(dlock_lock *l, dl_err *err);
void dl_zk_lock_destroy(dlock_lock *l);
int dl_zk_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t, dl_err *err);
int dl_zk_release(dlock_lock *l, long long *res, dl_err *err);
int dl_zk_check(dlock_lock *l, int *held, int64_t *count, dl_err *err);
int dl_zk_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                  dl_err *err);
int dl_zk_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                        dl_err *err);

/* queue.c */
char *dl_zk_name_under(const char *root, const char *name, size_t len);
char *dl_zk_name_parent(zk_client *zc, const char *name, size_t len);
int dl_zk_queue_of(zk_op *op, zk_op **opout, zk_child **out, int *n, dl_err *err);
int dl_zk_list_queue(zk_client *zc, zk_sess *s, const char *parent, zk_op **opout,
                     zk_child **out, int *n, dl_err *err);
int dl_zk_ensure_parents(zk_client *zc, zk_sess *s, const char *parent, int last_flags,
                         dl_err *err);
int dl_zk_create_node(zk_client *zc, zk_sess *s, const char *parent, int write,
                      const char *guid, int64_t deadline, char **path, uint64_t *czxid,
                      zk_op **kids, dl_err *err);

/* sem.c */
int dl_zk_sem_init(dl_object *o, dl_err *err);
void dl_zk_sem_destroy(dl_object *o);
int dl_zk_sem_acquire(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err);
int dl_zk_sem_release(dl_object *o, int64_t permits, dl_err *err);
int dl_zk_sem_available(dl_object *o, int64_t *permits, dl_err *err);
int dl_zk_sem_try_set(dl_object *o, int64_t permits, int *set, dl_err *err);
int dl_zk_sem_add(dl_object *o, int64_t delta, dl_err *err);

/* session.c */
int dl_zk_unknown(int zrc);
int dl_zk_fail(int zrc, const char *what, dl_err *err);
char *dl_zk_join3(const char *a, const char *b, const char *c);
void dl_zk_sess_unref(zk_sess *s);
int dl_zk_sess_get(zk_client *zc, zk_sess **out, dl_err *err);
zk_op *dl_zk_op_new(zk_sess *s);
void dl_zk_op_unref(zk_op *op);
void dl_zk_c_void(int rc, const void *data);
int dl_zk_op_wait(zk_op *op, int64_t deadline, int *late);
int dl_zk_op_started(zk_op *op, int sent);
void dl_zk_orphan_add(zk_sess *s, const char *path, const char *prefix);
int dl_zk_req_send(zk_sess *s, int what, const char *path, int flags, const char *data,
                   zk_op **op);
int dl_zk_req_wait(zk_op *op, int64_t deadline, zk_op **out);
int dl_zk_req_data(zk_client *zc, zk_sess *s, int what, const char *path, int flags,
                   const char *data, zk_op **out);
int dl_zk_req(zk_client *zc, zk_sess *s, int what, const char *path, int flags,
              zk_op **out);

extern const dl_backend dl_backend_zookeeper;

#endif
