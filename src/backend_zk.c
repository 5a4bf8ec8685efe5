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
 *   sends nothing); plus a create that fails and the container's create when
 *   the name's container is gone (its first use, or the server deleted it
 *   after its last child went). Waiting adds a get with a watch on the
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
 *   for it by guid after the reconnection (the "orphans" below).
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
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <zookeeper/zookeeper.h>
#include <zookeeper/zookeeper_version.h>

#include "internal.h"

#define ZK_GUID_BYTES 16
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
};

/* ---- helpers ---- */

static void no_log(const char *msg) { (void)msg; }

/* The request may or may not have been applied: the connection went (the C
 * client fails pending requests with one of these), or no answer came. */
static int zk_unknown(int zrc) {
    return zrc == ZCONNECTIONLOSS || zrc == ZOPERATIONTIMEOUT || zrc == ZK_NOANSWER;
}

static int zk_fail(int zrc, const char *what, dl_err *err) {
    if (zrc == ZK_NOANSWER)
        return dl_seterr(err, DLOCK_EIO, "zookeeper: %s: no answer within the command timeout",
                         what);
    if (zrc == ZCONNECTIONLOSS || zrc == ZOPERATIONTIMEOUT)
        return dl_seterr(err, DLOCK_EIO, "zookeeper: %s: connection lost (%s)", what,
                         zerror(zrc));
    if (zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE || zrc == ZSESSIONMOVED ||
        zrc == ZCLOSING)
        return dl_seterr(err, DLOCK_EIO, "zookeeper: %s: the session expired or closed", what);
    if (zrc == ZNOAUTH || zrc == ZAUTHFAILED)
        return dl_seterr(err, DLOCK_EAUTH, "zookeeper: %s: %s", what, zerror(zrc));
    if (zrc == ZBADARGUMENTS)
        return dl_seterr(err, DLOCK_EINVAL, "zookeeper: %s: bad arguments (a bad chroot path?)",
                         what);
    if (zrc == ZMARSHALLINGERROR)
        return dl_seterr(err, DLOCK_EPROTO, "zookeeper: %s: %s", what, zerror(zrc));
    if (zrc == ZSYSTEMERROR) return dl_seterr(err, DLOCK_ENOMEM, "zookeeper: %s: out of memory", what);
    return dl_seterr(err, DLOCK_ESERVER, "zookeeper: %s: %s (%d)", what, zerror(zrc), zrc);
}

/* Waits on cv until deadline (dl_now_ms; DL_INF_DEADLINE forever). The
 * condition variable runs on CLOCK_MONOTONIC, the deadline on the library's
 * clock (clock.c): the wait is given as the time left from now. */
static void cv_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline) {
    if (deadline == DL_INF_DEADLINE) {
        pthread_cond_wait(cv, mu);
        return;
    }
    int64_t left = deadline - dl_now_ms();
    if (left <= 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(left / 1000);
    ts.tv_nsec += (long)(left % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

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

static void cv_init_mono(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

static char *join3(const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}

/* ---- sessions ---- */

static void mark_lost_locked(zk_sess *s);
static void orphans_send_locked(zk_sess *s);

static void sess_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx) {
    (void)zh;
    (void)path;
    zk_sess *s = ctx;
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    if (type == ZOO_SESSION_EVENT) {
        if (state == ZOO_CONNECTED_STATE || state == ZOO_READONLY_STATE) {
            s->connected = 1;
            orphans_send_locked(s);
        } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
            s->connected = 0;
            if (!s->dead) {
                s->dead = 1;
                mark_lost_locked(s);
            }
        } else {
            s->connected = 0;
        }
    }
    s->events++;
    pthread_cond_broadcast(&s->cv);
    for (zk_waker *w = s->wakers; w; w = w->next) {
        uint64_t one = 1;
        ssize_t n = write(w->fd, &one, sizeof one); /* EAGAIN: readable anyway */
        (void)n;
    }
    pthread_mutex_unlock(&s->mu);
}

static void sess_unref(zk_sess *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    int left = --s->refs;
    pthread_mutex_unlock(&s->mu);
    if (left > 0) return;
    /* ends the session: its ephemeral nodes go; pending completions are
     * called (ZCLOSING) before this returns */
    if (s->zh) zookeeper_close(s->zh);
    while (s->orphans) {
        zk_orphan *o = s->orphans;
        s->orphans = o->next;
        free(o->path);
        free(o->parent);
        free(o->match);
        free(o);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static int sess_open(zk_client *zc, zk_sess **out, dl_err *err) {
    *out = NULL;
    zk_sess *s = calloc(1, sizeof *s);
    if (!s) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    cv_init_mono(&s->cv);
    s->refs = 1;
    s->zh = zookeeper_init2(zc->hosts, sess_watcher, zc->session_ms, NULL, s, 0, no_log);
    if (!s->zh) {
        int e = errno;
        sess_unref(s);
        if (e == EINVAL)
            return dl_seterr(err, DLOCK_EINVAL, "bad zookeeper host list '%s'", zc->hosts);
        if (e == ENOMEM) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        return dl_seterr(err, DLOCK_EIO, "zookeeper: cannot start a session with %s: %s",
                         zc->hosts, strerror(e));
    }
    int64_t deadline = dl_deadline(zc->connect_timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (!s->connected && !s->dead && dl_now_ms() < deadline)
        cv_wait_until(&s->cv, &s->mu, deadline);
    int ok = s->connected, dead = s->dead;
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        sess_unref(s);
        if (dead)
            return dl_seterr(err, DLOCK_EAUTH, "zookeeper: %s refused the session", zc->hosts);
        return dl_seterr(err, DLOCK_EIO, "zookeeper: no server of %s answered within %lld ms",
                         zc->hosts, (long long)zc->connect_timeout_ms);
    }
    *out = s;
    return DLOCK_OK;
}

/* The client's live session (a reference), opening a new one after expiry. */
static int sess_get(zk_client *zc, zk_sess **out, dl_err *err) {
    pthread_mutex_lock(&zc->mu);
    zk_sess *s = zc->sess;
    int dead = 0;
    if (s) {
        pthread_mutex_lock(&s->mu);
        dead = s->dead;
        if (!dead) s->refs++;
        pthread_mutex_unlock(&s->mu);
    }
    int rc = DLOCK_OK;
    if (!s || dead) {
        zc->sess = NULL;
        sess_unref(s);
        rc = sess_open(zc, &zc->sess, err);
        if (!rc) {
            s = zc->sess;
            pthread_mutex_lock(&s->mu);
            s->refs++;
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_mutex_unlock(&zc->mu);
    *out = rc ? NULL : s;
    return rc;
}

/* ---- requests with a deadline ---- */

/* One asynchronous request. Two references: the caller's, the completion's
 * (a caller that gives up at its deadline leaves the op to the completion). */
typedef struct zk_op {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int done;
    int rc;
    int abandoned;
    zk_sess *s;                /* for cleaning up after an abandoned create */
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

static zk_op *op_new(zk_sess *s) {
    zk_op *op = calloc(1, sizeof *op);
    if (!op) return NULL;
    pthread_mutex_init(&op->mu, NULL);
    cv_init_mono(&op->cv);
    op->refs = 2;
    op->s = s;
    return op;
}

static void op_free(zk_op *op) {
    pthread_mutex_destroy(&op->mu);
    pthread_cond_destroy(&op->cv);
    free(op->path);
    free(op->prefix);
    for (int i = 0; i < op->nkids; i++) free(op->kids[i]);
    free(op->kids);
    free(op->data);
    for (int i = 0; i < op->nm; i++) free(op->mpaths[i]);
    free(op->mpaths);
    free(op->mops);
    free(op->mres);
    free(op);
}

static void op_unref(zk_op *op) {
    pthread_mutex_lock(&op->mu);
    int left = --op->refs;
    pthread_mutex_unlock(&op->mu);
    if (!left) op_free(op);
}

static void noop_void(int rc, const void *data) {
    (void)rc;
    (void)data;
}

static void orphan_add(zk_sess *s, const char *path, const char *prefix);

/* completion side: record, wake the caller, drop the completion's reference */
static void op_done(zk_op *op, int rc) {
    pthread_mutex_lock(&op->mu);
    op->rc = rc;
    op->done = 1;
    /* a create nobody waits for any more: its node, if any, must go */
    if (op->abandoned && rc == ZOK && op->path) orphan_add(op->s, op->path, NULL);
    for (int i = 0; op->abandoned && rc == ZOK && i < op->nm; i++)
        if (op->mpaths[i]) orphan_add(op->s, op->mpaths[i], NULL);
    if (op->abandoned && op->prefix && zk_unknown(rc)) orphan_add(op->s, NULL, op->prefix);
    pthread_cond_broadcast(&op->cv);
    int left = --op->refs;
    pthread_mutex_unlock(&op->mu);
    if (!left) op_free(op);
}

static void c_void(int rc, const void *data) { op_done((zk_op *)data, rc); }

static void c_stat(int rc, const struct Stat *st, const void *data) {
    zk_op *op = (zk_op *)data;
    if (rc == ZOK && st) op->st = *st;
    op_done(op, rc);
}

static void c_data(int rc, const char *v, int vlen, const struct Stat *st, const void *data) {
    zk_op *op = (zk_op *)data;
    if (rc == ZOK) {
        int n = v && vlen > 0 ? vlen : 0;
        op->data = malloc((size_t)n + 1);
        if (!op->data) {
            rc = ZSYSTEMERROR;
        } else {
            if (n) memcpy(op->data, v, (size_t)n);
            op->data[n] = '\0';
            op->datalen = n;
        }
    }
    c_stat(rc, st, data);
}

static void c_create(int rc, const char *value, const struct Stat *st, const void *data) {
    zk_op *op = (zk_op *)data;
    if (rc == ZOK) {
        if (st) op->st = *st;
        op->path = value ? strdup(value) : NULL;
        if (!op->path) rc = ZSYSTEMERROR;
    }
    op_done(op, rc);
}

static void c_kids(int rc, const struct String_vector *v, const void *data) {
    zk_op *op = (zk_op *)data;
    if (rc == ZOK && v && v->count > 0) {
        op->kids = calloc((size_t)v->count, sizeof *op->kids);
        if (!op->kids) rc = ZSYSTEMERROR;
        for (int i = 0; rc == ZOK && i < v->count; i++) {
            if (!(op->kids[i] = strdup(v->data[i]))) rc = ZSYSTEMERROR;
            else op->nkids = i + 1;
        }
    }
    op_done(op, rc);
}

/* Waits for op's answer until deadline. Returns the ZooKeeper code, or
 * ZK_NOANSWER with *late = 1 when no answer came in time. */
static int op_wait(zk_op *op, int64_t deadline, int *late) {
    pthread_mutex_lock(&op->mu);
    while (!op->done && dl_now_ms() < deadline) cv_wait_until(&op->cv, &op->mu, deadline);
    int rc = op->done ? op->rc : ZK_NOANSWER;
    if (!op->done) {
        op->abandoned = 1;
        if (late) *late = 1;
    }
    pthread_mutex_unlock(&op->mu);
    return rc;
}

/* Starts a request (sent() is the zoo_a* call's result): on a refusal the
 * completion will not run, so its reference is dropped here. */
static int op_started(zk_op *op, int sent) {
    if (sent != ZOK) {
        pthread_mutex_lock(&op->mu);
        op->refs--;
        pthread_mutex_unlock(&op->mu);
    }
    return sent;
}

/* ---- orphans ---- */

static void orphan_unlink_locked(zk_sess *s, zk_orphan *o) {
    for (zk_orphan **pp = &s->orphans; *pp; pp = &(*pp)->next)
        if (*pp == o) {
            *pp = o->next;
            break;
        }
    free(o->path);
    free(o->parent);
    free(o->match);
    free(o);
}

static int orphan_settled(int rc) {
    return rc == ZOK || rc == ZNONODE || rc == ZSESSIONEXPIRED || rc == ZCLOSING ||
           rc == ZINVALIDSTATE;
}

static void c_orphan(int rc, const void *data) {
    zk_orphan *o = (zk_orphan *)data;
    zk_sess *s = o->s;
    pthread_mutex_lock(&s->mu);
    o->inflight = 0;
    if (orphan_settled(rc)) orphan_unlink_locked(s, o);
    pthread_mutex_unlock(&s->mu);
}

static void orphans_send_locked(zk_sess *s);

/* the children of a search: our node (then deleted) or none (never made) */
static void c_orphan_kids(int rc, const struct String_vector *v, const void *data) {
    zk_orphan *o = (zk_orphan *)data;
    zk_sess *s = o->s;
    pthread_mutex_lock(&s->mu);
    o->inflight = 0;
    if (rc == ZOK) {
        /* every match: a semaphore's multi create makes several nodes */
        int found = 0;
        for (int i = 0; v && i < v->count; i++) {
            if (strncmp(v->data[i], o->match, strlen(o->match))) continue;
            char *p = join3(o->parent, "/", v->data[i]);
            if (!p) continue; /* out of memory: the session's end takes it */
            if (!found++) {
                o->path = p;
                continue;
            }
            zk_orphan *x = calloc(1, sizeof *x);
            if (!x) {
                free(p);
                continue;
            }
            x->s = s;
            x->path = p;
            x->next = s->orphans;
            s->orphans = x;
        }
        if (!found) orphan_unlink_locked(s, o);
        else if (s->connected) orphans_send_locked(s);
    } else if (orphan_settled(rc)) {
        orphan_unlink_locked(s, o);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Sends a delete (or a search) for every orphan not in flight (s->mu held). */
static void orphans_send_locked(zk_sess *s) {
    for (zk_orphan *o = s->orphans; o; o = o->next) {
        if (o->inflight || !s->zh) continue;
        o->inflight = 1;
        int sent = o->path ? zoo_adelete(s->zh, o->path, -1, c_orphan, o)
                           : zoo_aget_children(s->zh, o->parent, 0, c_orphan_kids, o);
        if (sent != ZOK) o->inflight = 0;
    }
}

/* Deletes path in the background until the server confirms; or, with
 * prefix (a create's path whose outcome is unknown), first looks for the
 * node that create may have made. */
static void orphan_add(zk_sess *s, const char *path, const char *prefix) {
    zk_orphan *o = calloc(1, sizeof *o);
    int ok = o != NULL;
    if (ok && path) ok = (o->path = strdup(path)) != NULL;
    if (ok && !path) {
        const char *slash = strrchr(prefix, '/');
        ok = slash && (o->parent = strndup(prefix, (size_t)(slash - prefix))) &&
             (o->match = strdup(slash + 1));
    }
    pthread_mutex_lock(&s->mu);
    if (ok && !s->dead) {
        o->s = s;
        o->next = s->orphans;
        s->orphans = o;
        if (s->connected) orphans_send_locked(s);
        o = NULL;
    } else if (!s->dead && path) {
        zoo_adelete(s->zh, path, -1, noop_void, NULL); /* out of memory: once */
    }
    pthread_mutex_unlock(&s->mu);
    if (o) {
        free(o->path);
        free(o->parent);
        free(o->match);
        free(o);
    }
}

enum { OP_CREATE, OP_DELETE, OP_EXISTS, OP_WATCH, OP_KIDS, OP_WATCH_KIDS, OP_GET, OP_SET };

/* Runs one request bounded by the command timeout. create: flags (path gets
 * the created node) and data; watch: get with a data watch on path (only set
 * if it exists); watch_kids: get_children with a child watch; set: data
 * if the node's version is flags. *out (may be NULL) gets the finished op,
 * which the caller frees with op_unref. Returns the ZooKeeper code; no
 * answer in time is ZK_NOANSWER. */
static int zk_req_data(zk_client *zc, zk_sess *s, int what, const char *path, int flags,
                       const char *data, zk_op **out) {
    if (out) *out = NULL;
    zk_op *op = op_new(s);
    if (!op) {
        errno = ENOMEM;
        return ZSYSTEMERROR;
    }
    int sent;
    switch (what) {
    case OP_CREATE:
        if (flags == ZOO_EPHEMERAL_SEQUENTIAL) op->prefix = strdup(path); /* NULL: no cleanup search */
        sent = zoo_acreate2(s->zh, path, data, data ? (int)strlen(data) : -1,
                            &ZOO_OPEN_ACL_UNSAFE, flags, c_create, op);
        break;
    case OP_DELETE: sent = zoo_adelete(s->zh, path, -1, c_void, op); break;
    case OP_EXISTS: sent = zoo_aexists(s->zh, path, 0, c_stat, op); break;
    case OP_WATCH: sent = zoo_awget(s->zh, path, sess_watcher, s, c_data, op); break;
    case OP_GET: sent = zoo_aget(s->zh, path, 0, c_data, op); break;
    case OP_SET:
        sent = zoo_aset(s->zh, path, data, (int)strlen(data), flags, c_stat, op);
        break;
    case OP_WATCH_KIDS:
        sent = zoo_awget_children(s->zh, path, sess_watcher, s, c_kids, op);
        break;
    default: sent = zoo_aget_children(s->zh, path, 0, c_kids, op); break;
    }
    int rc = op_started(op, sent);
    if (rc == ZOK) rc = op_wait(op, dl_deadline(zc->cmd_timeout_ms), NULL);
    if (rc == ZOK && out) *out = op;
    else op_unref(op);
    return rc;
}

static int zk_req(zk_client *zc, zk_sess *s, int what, const char *path, int flags,
                  zk_op **out) {
    return zk_req_data(zc, s, what, path, flags, NULL, out);
}

/* ---- client ---- */

static void zk_close(dlock_client *c) {
    zk_client *zc = c->bctx;
    if (!zc) return;
    sess_unref(zc->sess);
    pthread_mutex_destroy(&zc->mu);
    free(zc->hosts);
    free(zc->root);
    free(zc->sems);
    free(zc);
    c->bctx = NULL;
}

/* Connects to each host of the list in turn (TCP only) until one accepts,
 * within the connect timeout: the C client itself retries refused hosts
 * forever, so without this a wrong address would only show as a timeout. */
static int probe_hosts(zk_client *zc, dl_err *err) {
    char *list = strdup(zc->hosts);
    if (!list) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int64_t deadline = dl_deadline(zc->connect_timeout_ms);
    int rc = DLOCK_EIO;
    dl_err last = {0};
    char *save = NULL;
    for (char *h = strtok_r(list, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(h, ':');
        char *host = h;
        long port = 2181;
        if (colon && (h[0] != '[' || colon > strchr(h, ']'))) {
            char *end = NULL;
            port = strtol(colon + 1, &end, 10);
            if (!colon[1] || *end || port <= 0 || port > 65535) {
                rc = dl_seterr(err, DLOCK_EINVAL, "bad zookeeper host list '%s' (host:port,...)",
                               zc->hosts);
                break;
            }
            *colon = '\0';
        }
        if (host[0] == '[') {
            host++;
            char *rb = strchr(host, ']');
            if (rb) *rb = '\0';
        }
        if (!*host) {
            rc = dl_seterr(err, DLOCK_EINVAL, "bad zookeeper host list '%s' (host:port,...)",
                           zc->hosts);
            break;
        }
        dl_endpoint ep;
        memset(&ep, 0, sizeof ep);
        ep.host = host;
        ep.port = (int)port;
        int fd = -1;
        rc = dl_transport_connect(&ep, deadline, &fd, &last);
        if (!rc) {
            close(fd);
            break;
        }
    }
    free(list);
    if (rc == DLOCK_EIO || rc == DLOCK_ENOMEM)
        return dl_seterr(err, rc, "zookeeper: no server of %s reachable: %s", zc->hosts,
                         last.msg[0] ? last.msg : "connect failed");
    return rc;
}

static int zk_open(dlock_client *c, const char *url, const dlock_options *o, dl_err *err) {
    (void)o;
    zk_client *zc = calloc(1, sizeof *zc);
    if (!zc) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&zc->mu, NULL);
    c->bctx = zc;
    zc->cmd_timeout_ms = c->command_timeout_ms;
    zc->connect_timeout_ms = c->connect_timeout_ms;
    int64_t sm = c->watchdog_lease_ms;
    zc->session_ms = sm > INT_MAX ? INT_MAX : (int)sm;

    const char *p = url + strlen("zk://");
    size_t hl = strcspn(p, "/");
    if (hl == 0) return dl_seterr(err, DLOCK_EINVAL, "zookeeper URL without hosts (zk://host:2181[/chroot])");
    if (memchr(p, '@', hl) || strpbrk(p, "?#"))
        return dl_seterr(err, DLOCK_EINVAL,
                         "zookeeper URL: credentials and options are not supported "
                         "(zk://host:2181,host:2181[/chroot])");
    zc->hosts = strndup(p, hl);
    if (!zc->hosts) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    /* the chroot: "/a/b" (no trailing slash); "" or "/" is the root */
    char chroot[512];
    size_t cl = strlen(p + hl);
    if (cl >= sizeof chroot) return dl_seterr(err, DLOCK_EINVAL, "zookeeper URL: chroot too long");
    memcpy(chroot, p + hl, cl + 1);
    while (cl > 0 && chroot[cl - 1] == '/') chroot[--cl] = '\0';
    if (strstr(chroot, "//") || strstr(chroot, "/./") || strstr(chroot, "/../") ||
        (cl >= 2 && !strcmp(chroot + cl - 2, "/.")) || (cl >= 3 && !strcmp(chroot + cl - 3, "/..")))
        return dl_seterr(err, DLOCK_EINVAL, "zookeeper URL: bad chroot path '%s'", p + hl);
    zc->root = join3(chroot, "/dlock", "/locks");
    zc->sems = join3(chroot, "/dlock", "/sems");
    if (!zc->root || !zc->sems) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int rc = probe_hosts(zc, err);
    if (rc) return rc;
    zk_sess *s = NULL;
    rc = sess_get(zc, &s, err); /* connect now: a bad address is reported here */
    sess_unref(s);
    return rc;
}

static int zk_ping(dlock_client *c, int64_t *rtt_us, dl_err *err) {
    zk_client *zc = c->bctx;
    zk_sess *s = NULL;
    int rc = sess_get(zc, &s, err);
    if (rc) return rc;
    int64_t t0 = dl_now_us();
    int zrc = zk_req(zc, s, OP_EXISTS, "/", 0, NULL);
    sess_unref(s);
    if (zrc != ZOK) return zk_fail(zrc, "ping", err);
    if (rtt_us) *rtt_us = dl_now_us() - t0;
    return DLOCK_OK;
}

/* ---- names and queue nodes ---- */

/* root + "/" + hex(name) */
static char *name_under(const char *root, const char *name, size_t len) {
    static const char hx[] = "0123456789abcdef";
    size_t rl = strlen(root);
    char *s = malloc(rl + 1 + 2 * len + 1);
    if (!s) return NULL;
    memcpy(s, root, rl);
    s[rl] = '/';
    char *q = s + rl + 1;
    for (size_t i = 0; i < len; i++) {
        *q++ = hx[(unsigned char)name[i] >> 4];
        *q++ = hx[(unsigned char)name[i] & 15];
    }
    *q = '\0';
    return s;
}

static char *name_parent(zk_client *zc, const char *name, size_t len) {
    return name_under(zc->root, name, len);
}

/* A child "read-<guid>-<seq>" / "write-<guid>-<seq>". */
typedef struct zk_child {
    const char *name;
    int write;
    char guid[2 * ZK_GUID_BYTES + 1];
    long long seq;
} zk_child;

static int parse_child(const char *name, zk_child *ch) {
    const char *p;
    if (!strncmp(name, "write-", 6)) {
        ch->write = 1;
        p = name + 6;
    } else if (!strncmp(name, "read-", 5)) {
        ch->write = 0;
        p = name + 5;
    } else {
        return 0;
    }
    if (strlen(p) < 2 * ZK_GUID_BYTES + 2 || p[2 * ZK_GUID_BYTES] != '-') return 0;
    memcpy(ch->guid, p, 2 * ZK_GUID_BYTES);
    ch->guid[2 * ZK_GUID_BYTES] = '\0';
    const char *sq = p + 2 * ZK_GUID_BYTES + 1;
    char *end = NULL;
    errno = 0;
    ch->seq = strtoll(sq, &end, 10);
    if (!*sq || *end || errno || ch->seq < 0) return 0;
    ch->name = name;
    return 1;
}

/* The queue of a name, in order. *n 0 when the parent is missing. */
static int list_queue(zk_client *zc, zk_sess *s, const char *parent, zk_op **opout,
                      zk_child **out, int *n, dl_err *err) {
    *out = NULL;
    *n = 0;
    *opout = NULL;
    zk_op *op = NULL;
    int zrc = zk_req(zc, s, OP_KIDS, parent, 0, &op);
    if (zrc == ZNONODE) return DLOCK_OK;
    if (zrc != ZOK) return zk_fail(zrc, "list the queue", err);
    zk_child *v = calloc((size_t)(op->nkids ? op->nkids : 1), sizeof *v);
    if (!v) {
        op_unref(op);
        return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    }
    int k = 0;
    for (int i = 0; i < op->nkids; i++)
        if (parse_child(op->kids[i], &v[k])) k++;
    /* insertion sort by sequence (queues are short) */
    for (int i = 1; i < k; i++) {
        zk_child x = v[i];
        int j = i - 1;
        while (j >= 0 && v[j].seq > x.seq) {
            v[j + 1] = v[j];
            j--;
        }
        v[j + 1] = x;
    }
    *out = v;
    *n = k;
    *opout = op;
    return DLOCK_OK;
}

/* Creates parent (with last_flags: a container for a lock's queue) and,
 * when needed, its ancestors (persistent). Called after a create under
 * parent answered ZNONODE: the usual cause is the container of a name that
 * the server deleted after its last child went (or never made), with its
 * ancestors there, so parent alone is tried first (one request); when that
 * answers ZNONODE too, every ancestor is created from the top (ZNODEEXISTS
 * is fine), then parent. */
static int ensure_parents(zk_client *zc, zk_sess *s, const char *parent, int last_flags,
                          dl_err *err) {
    int zrc = zk_req(zc, s, OP_CREATE, parent, last_flags, NULL);
    if (zrc == ZOK || zrc == ZNODEEXISTS) return DLOCK_OK;
    if (zrc != ZNONODE) return zk_fail(zrc, "create the parent nodes", err);
    char *buf = strdup(parent);
    if (!buf) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int rc = DLOCK_OK;
    for (char *q = buf + 1;; q++) {
        if (*q != '/' && *q != '\0') continue;
        char saved = *q;
        *q = '\0';
        zrc = zk_req(zc, s, OP_CREATE, buf, saved ? ZOO_PERSISTENT : last_flags, NULL);
        *q = saved;
        if (zrc != ZOK && zrc != ZNODEEXISTS) {
            rc = zk_fail(zrc, "create the parent nodes", err);
            break;
        }
        if (!saved) break;
    }
    free(buf);
    return rc;
}

/* Finds the child with guid in parent: its full path and stat. *found 0 if
 * none. */
static int find_own(zk_client *zc, zk_sess *s, const char *parent, const char *guid,
                    char **path, struct Stat *st, int *found, dl_err *err) {
    *found = 0;
    zk_op *op = NULL;
    zk_child *v = NULL;
    int n = 0;
    int rc = list_queue(zc, s, parent, &op, &v, &n, err);
    if (rc) return rc;
    for (int i = 0; i < n && !*found; i++) {
        if (strcmp(v[i].guid, guid)) continue;
        *path = join3(parent, "/", v[i].name);
        if (!*path) rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        else *found = 1;
    }
    free(v);
    if (op) op_unref(op);
    if (rc || !*found) return rc;
    zk_op *eo = NULL;
    int zrc = zk_req(zc, s, OP_EXISTS, *path, 0, &eo);
    if (zrc == ZOK) {
        *st = eo->st;
        op_unref(eo);
        return DLOCK_OK;
    }
    free(*path);
    *path = NULL;
    *found = 0;
    return zrc == ZNONODE ? DLOCK_OK : zk_fail(zrc, "read our node", err);
}

/* Creates our queue node (once, even across a connection loss) before
 * deadline. */
static int create_node(zk_client *zc, zk_sess *s, const char *parent, int write,
                       const char *guid, int64_t deadline, char **path, uint64_t *czxid,
                       dl_err *err) {
    char *prefix = malloc(strlen(parent) + 2 * ZK_GUID_BYTES + 16);
    if (!prefix) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    sprintf(prefix, "%s/%s-%s-", parent, write ? "write" : "read", guid);
    int rc = DLOCK_OK, tries = 0, maybe = 0;
    for (;;) {
        if (maybe) {
            /* the last create may have been applied: look for our guid */
            int found = 0;
            struct Stat st;
            rc = find_own(zc, s, parent, guid, path, &st, &found, err);
            if (!rc && found) {
                *czxid = (uint64_t)st.czxid;
                break;
            }
            if (rc) {
                if (dl_now_ms() >= deadline) break;
                dl_sleep_ms(50);
                continue;
            }
            maybe = 0; /* not there: it was not applied */
        }
        zk_op *op = NULL;
        int zrc = zk_req(zc, s, OP_CREATE, prefix, ZOO_EPHEMERAL_SEQUENTIAL, &op);
        if (zrc == ZOK) {
            *path = op->path;
            op->path = NULL;
            *czxid = (uint64_t)op->st.czxid;
            op_unref(op);
            rc = DLOCK_OK;
            break;
        }
        if (zrc == ZNONODE && ++tries <= 3) {
            rc = ensure_parents(zc, s, parent, ZOO_CONTAINER, err);
            if (rc) break;
            continue;
        }
        if (zrc == ZCONNECTIONLOSS || zrc == ZOPERATIONTIMEOUT) {
            maybe = 1; /* the connection went: applied or not */
            if (dl_now_ms() < deadline) continue;
        }
        rc = zk_fail(zrc, "create the queue node", err);
        break;
    }
    /* giving up while a create's outcome is unknown: if it made a node, the
     * node is found and deleted after the reconnection */
    if (rc && maybe) orphan_add(s, NULL, prefix);
    free(prefix);
    return rc;
}

/* ---- lock handles ---- */

static int zk_lock_init(dlock_lock *l, dl_err *err) {
    zk_lock *zl = calloc(1, sizeof *zl);
    if (!zl) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    l->bdata = zl;
    zl->l = l;
    zl->parent = name_parent(l->c->bctx, l->name, l->name_len);
    if (!zl->parent) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

/* Called with s->mu held (the session watcher, on expiry). */
static void sems_lost_locked(zk_sess *s);

static void mark_lost_locked(zk_sess *s) {
    for (zk_lock *zl = s->held; zl; zl = zl->next) {
        zl->lost = 1;
        dlock_lock *l = zl->l;
        atomic_store(&l->lease.lost, 1);
        if (l->lost_fn) l->lost_fn(l, DLOCK_LOST_UNREACHABLE, l->lost_ud);
    }
    sems_lost_locked(s);
}

static void held_add(zk_lock *zl) {
    zk_sess *s = zl->sess;
    pthread_mutex_lock(&s->mu);
    zl->lost = s->dead;
    zl->prev = NULL;
    zl->next = s->held;
    if (s->held) s->held->prev = zl;
    s->held = zl;
    pthread_mutex_unlock(&s->mu);
}

/* Forgets our node (deleting it first if del, best effort, not waiting) and
 * drops the session reference. */
static void drop_node(zk_lock *zl, int del) {
    zk_sess *s = zl->sess;
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    if (zl->prev) zl->prev->next = zl->next;
    else if (s->held == zl) s->held = zl->next;
    if (zl->next) zl->next->prev = zl->prev;
    zl->next = zl->prev = NULL;
    pthread_mutex_unlock(&s->mu);
    if (del && zl->node) orphan_add(s, zl->node, NULL);
    free(zl->node);
    zl->node = NULL;
    zl->sess = NULL;
    sess_unref(s);
}

static void zk_lock_destroy(dlock_lock *l) {
    zk_lock *zl = l->bdata;
    if (!zl) return;
    drop_node(zl, 1);
    free(zl->parent);
    free(zl);
    l->bdata = NULL;
}

static int sess_dead(zk_sess *s) {
    pthread_mutex_lock(&s->mu);
    int dead = s->dead;
    pthread_mutex_unlock(&s->mu);
    return dead;
}

static int is_lost(zk_lock *zl) {
    pthread_mutex_lock(&zl->sess->mu);
    int lost = zl->lost || zl->sess->dead;
    pthread_mutex_unlock(&zl->sess->mu);
    return lost;
}

/* Deletes a node we gave up on (waiting for the answer, bounded); one that
 * did not get through is left to the background (orphan_add). */
static void give_up_node(zk_client *zc, zk_sess *s, const char *path) {
    int zrc = zk_req(zc, s, OP_DELETE, path, 0, NULL);
    if (zrc != ZOK && zrc != ZNONODE && zrc != ZSESSIONEXPIRED) orphan_add(s, path, NULL);
}

/* Waits until the session's next watch event (after ev0), its end,
 * deadline, or a cancel of cx (zk_waker). 1 cancelled. */
static int wait_event(zk_sess *s, uint64_t ev0, int64_t deadline, dl_cancel *cx) {
    int fd = dl_cancel_begin(cx);
    zk_waker me = {fd, NULL};
    pthread_mutex_lock(&s->mu);
    if (fd >= 0) {
        me.next = s->wakers;
        s->wakers = &me;
    }
    while (s->events == ev0 && !s->dead && !dl_canceled(cx)) {
        int64_t now = dl_now_ms();
        if (now >= deadline) break;
        int64_t until = deadline;
        if (fd < 0) {
            until = now + ZK_CANCEL_SLICE_MS;
            if (deadline != DL_INF_DEADLINE && deadline < until) until = deadline;
            cv_wait_until(&s->cv, &s->mu, until);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        struct pollfd p[1]; /* the eventfd only: dl_cancel_poll adds it */
        int64_t left = until - now;
        dl_cancel_poll(cx, p, 0, until == DL_INF_DEADLINE ? -1 : left > INT_MAX ? INT_MAX : (int)left);
        pthread_mutex_lock(&s->mu);
    }
    if (fd >= 0) {
        zk_waker **pp = &s->wakers;
        while (*pp != &me) pp = &(*pp)->next;
        *pp = me.next;
    }
    pthread_mutex_unlock(&s->mu);
    dl_cancel_end(cx);
    return dl_canceled(cx);
}

/* A waiter reads the node ahead of it, leaving a watch on it (data change
 * or delete). DLOCK_OK: watched (*op, if op is not NULL, has its data);
 * ZK_LOOK_AGAIN: the waiter looks at the queue again at once (the node is
 * gone already, or the connection was lost for a moment: after a 50 ms
 * pause); else a failure code. */
#define ZK_LOOK_AGAIN (-1)

static int watch_ahead(zk_client *zc, zk_sess *s, const char *path, int64_t deadline,
                       const char *what, zk_op **op, dl_err *err) {
    int zrc = zk_req(zc, s, OP_WATCH, path, 0, op);
    if (zrc == ZOK) return DLOCK_OK;
    if (zrc == ZNONODE) return ZK_LOOK_AGAIN;
    if (zk_unknown(zrc) && dl_now_ms() < deadline) {
        dl_sleep_ms(50);
        return ZK_LOOK_AGAIN;
    }
    return zk_fail(zrc, what, err);
}

static int zk_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_try *t, dl_err *err) {
    if (lease_ms != DLOCK_WATCHDOG)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "leases (lease_ms > 0) are not supported by the zookeeper backend: its "
                         "locks are held while the session lives (pass DLOCK_WATCHDOG)");
    zk_client *zc = l->c->bctx;
    zk_lock *zl = l->bdata;
    char nm[80];
    dl_name_msg(l->name, l->name_len, nm, sizeof nm);
    if (l->holds > 0) {
        /* re-entry: counted by the handle */
        if (zl->sess && is_lost(zl))
            return dl_seterr(err, DLOCK_ELOST, "lock '%s': the session holding it expired", nm);
        t->acquired = 1;
        t->fence = l->fence;
        t->count = l->holds + 1;
        l->expires_at = INT64_MAX;
        return DLOCK_OK;
    }
    drop_node(zl, 1); /* a hold the generic layer gave up on (lost) */
    zk_sess *s = NULL;
    int rc = sess_get(zc, &s, err);
    if (rc) return rc;
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE
                       : wait_ms == 0               ? dl_deadline(zc->cmd_timeout_ms)
                                                    : dl_deadline(wait_ms);
    char guid[2 * ZK_GUID_BYTES + 1];
    rc = dl_random_hex(guid, ZK_GUID_BYTES, err);
    char *path = NULL;
    uint64_t czxid = 0;
    int write = l->kind != DLOCK_KIND_READ;
    if (!rc)
        rc = create_node(zc, s, zl->parent, write, guid,
                         wait_ms == 0 || deadline == DL_INF_DEADLINE ? dl_deadline(zc->cmd_timeout_ms)
                                                                     : deadline,
                         &path, &czxid, err);
    if (rc) {
        sess_unref(s);
        return rc;
    }
    const char *mine = strrchr(path, '/') + 1;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        uint64_t ev0 = s->events;
        int dead = s->dead;
        pthread_mutex_unlock(&s->mu);
        if (dead) {
            rc = dl_seterr(err, DLOCK_EIO, "lock '%s': the zookeeper session expired while "
                                           "waiting", nm);
            break;
        }
        zk_op *op = NULL;
        zk_child *v = NULL;
        int n = 0;
        rc = list_queue(zc, s, zl->parent, &op, &v, &n, err);
        if (rc == DLOCK_EIO && !sess_dead(s) && dl_now_ms() < deadline && wait_ms != 0) {
            dl_sleep_ms(50); /* disconnected: the session may come back */
            continue;
        }
        if (rc) break;
        int me = -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(v[i].name, mine)) me = i;
        int pred = -1;
        for (int i = me - 1; i >= 0; i--)
            if (write || v[i].write) {
                pred = i;
                break;
            }
        char *pp = pred >= 0 ? join3(zl->parent, "/", v[pred].name) : NULL;
        free(v);
        if (op) op_unref(op);
        if (me < 0) {
            rc = dl_seterr(err, DLOCK_EIO, "lock '%s': our queue node vanished (session "
                                           "expired?)", nm);
            break;
        }
        if (pred < 0) {
            /* acquired */
            zl->sess = s;
            zl->node = path;
            held_add(zl);
            t->acquired = 1;
            t->fence = czxid;
            t->count = 1;
            l->expires_at = INT64_MAX;
            return DLOCK_OK;
        }
        if (!pp) {
            rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
            break;
        }
        if (wait_ms == 0) {
            free(pp);
            rc = dl_seterr(err, DLOCK_EBUSY, "lock '%s' is held by another handle", nm);
            break;
        }
        if (dl_now_ms() >= deadline) {
            free(pp);
            rc = dl_seterr(err, DLOCK_ETIMEDOUT, "lock '%s' not acquired within %lld ms", nm,
                           (long long)wait_ms);
            break;
        }
        /* watch the predecessor only */
        rc = watch_ahead(zc, s, pp, deadline, "watch the lock's queue", NULL, err);
        free(pp);
        if (rc == ZK_LOOK_AGAIN) continue;
        if (rc) break;
        if (wait_event(s, ev0, deadline, &l->cancel)) {
            rc = dl_cancel_err(l, err);
            break;
        }
    }
    give_up_node(zc, s, path);
    free(path);
    sess_unref(s);
    return rc;
}

static int zk_release(dlock_lock *l, long long *res, dl_err *err) {
    zk_client *zc = l->c->bctx;
    zk_lock *zl = l->bdata;
    if (!zl->sess) {
        *res = -1;
        return DLOCK_OK;
    }
    if (is_lost(zl)) {
        drop_node(zl, 0);
        *res = -1;
        return DLOCK_OK;
    }
    if (l->holds > 1) {
        *res = 0;
        return DLOCK_OK;
    }
    /* a delete whose outcome is unknown is sent again while the session
     * lives; ZNONODE then means the earlier one was applied */
    int64_t until = dl_deadline(zc->cmd_timeout_ms > zc->session_ms ? zc->cmd_timeout_ms
                                                                    : zc->session_ms);
    int zrc, unknown = 0;
    for (;;) {
        zrc = zk_req(zc, zl->sess, OP_DELETE, zl->node, 0, NULL);
        if (!zk_unknown(zrc) || sess_dead(zl->sess) || dl_now_ms() >= until) break;
        unknown = 1;
        dl_sleep_ms(50);
    }
    if (zrc == ZOK || zrc == ZNONODE || zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE ||
        sess_dead(zl->sess)) {
        drop_node(zl, 0);
        *res = zrc == ZOK || (zrc == ZNONODE && unknown) ? 1 : -1;
        return DLOCK_OK;
    }
    /* no answer: the node may still be there; the handle keeps it (retry
     * the release, or free the handle: that deletes it without waiting) */
    return zk_fail(zrc, "release", err);
}

static int zk_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    zk_client *zc = l->c->bctx;
    zk_lock *zl = l->bdata;
    *held = 0;
    *count = 0;
    if (!zl->sess || is_lost(zl)) return DLOCK_OK;
    int zrc = zk_req(zc, zl->sess, OP_EXISTS, zl->node, 0, NULL);
    if (zrc == ZNONODE || zrc == ZSESSIONEXPIRED) return DLOCK_OK;
    if (zrc != ZOK) return zk_fail(zrc, "check", err);
    *held = 1;
    *count = l->holds;
    return DLOCK_OK;
}

/* ---- queries by name ---- */

/* The holders of a name's queue: the first node if a writer, else the
 * readers before the first writer. */
static int holders_of(const zk_child *v, int n, int *writer) {
    *writer = n > 0 && v[0].write;
    if (*writer) return 1;
    int k = 0;
    while (k < n && !v[k].write) k++;
    return k;
}

static int query(dlock_client *c, const char *name, size_t len, dlock_info *info,
                 uint64_t *fence, dl_err *err) {
    zk_client *zc = c->bctx;
    char *parent = name_parent(zc, name, len);
    if (!parent) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    zk_sess *s = NULL;
    int rc = sess_get(zc, &s, err);
    zk_op *op = NULL;
    zk_child *v = NULL;
    int n = 0;
    if (!rc) rc = list_queue(zc, s, parent, &op, &v, &n, err);
    int writer = 0, h = rc ? 0 : holders_of(v, n, &writer);
    uint64_t best = 0;
    for (int i = 0; !rc && i < h; i++) {
        char *p = join3(parent, "/", v[i].name);
        if (!p) {
            rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
            break;
        }
        zk_op *eo = NULL;
        int zrc = zk_req(zc, s, OP_EXISTS, p, 0, &eo);
        free(p);
        if (zrc == ZOK) {
            if ((uint64_t)eo->st.czxid > best) best = (uint64_t)eo->st.czxid;
            op_unref(eo);
        } else if (zrc != ZNONODE) {
            rc = zk_fail(zrc, "inspect", err);
        }
    }
    if (!rc && info) {
        memset(info, 0, sizeof *info);
        info->exists = h > 0;
        info->kind = h > 0 ? DLOCK_KIND_PLAIN : 0;
        info->ttl_ms = h > 0 ? -1 : -2;
        info->fence = best;
        info->hold_count = h > 0 ? 1 : 0;
        info->holders = h;
        info->writer = writer;
        info->readers = writer ? 0 : h;
        info->waiters = n - h;
        info->queued = n - h;
        if (h > 0) snprintf(info->holder, sizeof info->holder, "%s", v[0].name);
    }
    if (!rc && fence) *fence = best;
    free(v);
    if (op) op_unref(op);
    sess_unref(s);
    free(parent);
    return rc;
}

static int zk_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                      dl_err *err) {
    return query(c, name, len, info, NULL, err);
}

static int zk_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                            dl_err *err) {
    *fence = 0;
    return query(c, name, len, NULL, fence, err);
}

/* ---- semaphores ----
 * {chroot}/dlock/sems/{hex(name)}: persistent, data = the total permits in
 * decimal ("" while unset: made by an acquire before any try_set / add).
 * Each permit held or asked for is one ephemeral sequential child
 * "lease-{guid}-{seq}" (data "1"); an acquire of k permits creates its k
 * children in one multi (atomic: consecutive sequence numbers, all or none). */

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

/* The session expired: every semaphore handle holding leases on it lost
 * them (the server deleted them); under s->mu. */
static void sems_lost_locked(zk_sess *s) {
    for (zk_sem *zs = s->held_sems; zs; zs = zs->next)
        dl_semaphore_lost(zs->o, DLOCK_LOST_UNREACHABLE);
}

/* zs now holds leases on its session zs->sess: listed there (a session
 * that expired meanwhile has told its handles already: release says
 * DLOCK_ELOST, as for a lock). */
static void sem_held_add(zk_sem *zs) {
    zk_sess *s = zs->sess;
    pthread_mutex_lock(&s->mu);
    zs->prev = NULL;
    zs->next = s->held_sems;
    if (s->held_sems) s->held_sems->prev = zs;
    s->held_sems = zs;
    pthread_mutex_unlock(&s->mu);
}

static void sem_held_del(zk_sem *zs) {
    zk_sess *s = zs->sess;
    pthread_mutex_lock(&s->mu);
    if (zs->prev) zs->prev->next = zs->next;
    else if (s->held_sems == zs) s->held_sems = zs->next;
    if (zs->next) zs->next->prev = zs->prev;
    zs->next = zs->prev = NULL;
    pthread_mutex_unlock(&s->mu);
}

/* Parses "lease-<guid>-<seq>"; guid into g (33 bytes). */
static int parse_lease(const char *name, char *g, long long *seq) {
    size_t pl = strlen(ZK_LEASE_PREFIX);
    if (strncmp(name, ZK_LEASE_PREFIX, pl)) return 0;
    const char *p = name + pl;
    if (strlen(p) < 2 * ZK_GUID_BYTES + 2 || p[2 * ZK_GUID_BYTES] != '-') return 0;
    memcpy(g, p, 2 * ZK_GUID_BYTES);
    g[2 * ZK_GUID_BYTES] = '\0';
    const char *sq = p + 2 * ZK_GUID_BYTES + 1;
    char *end = NULL;
    errno = 0;
    *seq = strtoll(sq, &end, 10);
    return *sq && !*end && !errno && *seq >= 0;
}

/* One lease child as listed. */
typedef struct zk_lease {
    const char *name;
    char guid[2 * ZK_GUID_BYTES + 1];
    long long seq;
} zk_lease;

static int lease_cmp(const void *a, const void *b) {
    long long x = ((const zk_lease *)a)->seq, y = ((const zk_lease *)b)->seq;
    return x < y ? -1 : x > y;
}

/* The lease children in queue order (sequence). v points into op's kids. */
static int leases_of(zk_op *op, zk_lease **out, int *n, dl_err *err) {
    *out = NULL;
    *n = 0;
    zk_lease *v = calloc((size_t)(op && op->nkids ? op->nkids : 1), sizeof *v);
    if (!v) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int k = 0;
    for (int i = 0; op && i < op->nkids; i++)
        if (parse_lease(op->kids[i], v[k].guid, &v[k].seq)) v[k++].name = op->kids[i];
    qsort(v, (size_t)k, sizeof *v, lease_cmp);
    *out = v;
    *n = k;
    return DLOCK_OK;
}

/* The permits held: the leases of the acquisitions (guid groups) that fit
 * the total counting every lease up to their last one. A group is one run
 * of the sorted leases (one multi: consecutive sequence numbers). Holders
 * are a prefix of the queue (a later group counts all earlier ones); *mine
 * (may be NULL) gets whether the group guid fits, *nmine its leases. */
static int64_t leases_held(const zk_lease *v, int n, int64_t total, const char *guid,
                           int *mine, int *nmine, int *ahead) {
    int64_t held = 0;
    int prev = -1, prev_fits = 0; /* the group before i's: its last lease */
    if (mine) *mine = 0;
    if (nmine) *nmine = 0;
    if (ahead) *ahead = -1;
    for (int i = 0; i < n;) {
        int last = i; /* the last lease of i's group */
        while (last + 1 < n && !strcmp(v[last + 1].guid, v[i].guid)) last++;
        int fits = (int64_t)last + 1 <= total;
        if (fits) held = last + 1;
        if (guid && !strcmp(v[i].guid, guid)) {
            if (mine) *mine = fits;
            if (nmine) *nmine += last - i + 1;
            if (ahead && prev >= 0 && !prev_fits) *ahead = prev;
        }
        prev = last;
        prev_fits = fits;
        i = last + 1;
    }
    return held;
}

/* A waiter that got its permits marks its last lease (data "held"), so the
 * waiter queued right behind it, which watches that lease, wakes and takes
 * over the watch on the leases. Sent without waiting for the answer: if it
 * is lost, that waiter's periodic re-check (ZK_SEM_RECHECK_MS) notices. */
#define ZK_LEASE_HELD "held"
#define ZK_SEM_RECHECK_MS 2000

static void c_ignore(int rc, const struct Stat *st, const void *data) {
    (void)rc;
    (void)st;
    (void)data;
}

static void mark_held(zk_sess *s, const char *path) {
    (void)zoo_aset(s->zh, path, ZK_LEASE_HELD, (int)strlen(ZK_LEASE_HELD), -1, c_ignore, NULL);
}

/* Reads the total: *total (0 when unset), *set 1 if a value is there,
 * *version the node's data version. ZNONODE: DLOCK_OK with *exists 0. */
static int sem_read(zk_client *zc, zk_sess *s, const char *node, int watch, int64_t *total,
                    int *set, int *version, int *exists, dl_err *err) {
    *total = 0;
    *set = 0;
    *exists = 0;
    zk_op *op = NULL;
    int zrc = zk_req(zc, s, watch ? OP_WATCH : OP_GET, node, 0, &op);
    if (zrc == ZNONODE) return DLOCK_OK;
    if (zrc != ZOK) return zk_fail(zrc, "read the semaphore", err);
    *exists = 1;
    if (version) *version = op->st.version;
    int rc = DLOCK_OK;
    if (op->datalen > 0) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(op->data, &end, 10);
        if (*end || errno)
            rc = dl_seterr(err, DLOCK_EPROTO, "zookeeper: the semaphore node's data is not an "
                                              "integer");
        *total = v;
        *set = 1;
    }
    op_unref(op);
    return rc;
}

/* Creates the k leases of one acquisition in one multi. ZOK: op->mpaths. */
static int multi_create(zk_client *zc, zk_sess *s, const char *prefix, int k, zk_op **out) {
    *out = NULL;
    zk_op *op = op_new(s);
    if (!op) return ZSYSTEMERROR;
    size_t plen = strlen(prefix) + 16;
    op->prefix = strdup(prefix); /* an abandoned create is searched for by it */
    op->mops = calloc((size_t)k, sizeof *op->mops);
    op->mres = calloc((size_t)k, sizeof *op->mres);
    op->mpaths = calloc((size_t)k, sizeof *op->mpaths);
    int ok = op->prefix && op->mops && op->mres && op->mpaths;
    for (int i = 0; ok && i < k; i++) {
        if (!(op->mpaths[i] = calloc(1, plen))) ok = 0;
        else op->nm = i + 1;
    }
    if (!ok) {
        op->refs = 1;
        op_unref(op);
        return ZSYSTEMERROR;
    }
    for (int i = 0; i < k; i++)
        zoo_create_op_init(&op->mops[i], op->prefix, "1", 1, &ZOO_OPEN_ACL_UNSAFE,
                           ZOO_EPHEMERAL_SEQUENTIAL, op->mpaths[i], (int)plen);
    int rc = op_started(op, zoo_amulti(s->zh, k, op->mops, op->mres, c_void, op));
    if (rc == ZOK) rc = op_wait(op, dl_deadline(zc->cmd_timeout_ms), NULL);
    if (rc == ZOK) *out = op;
    else op_unref(op);
    return rc;
}

/* Our leases by guid (after a create whose outcome is unknown): *paths
 * (malloc'd) and *n; 0 when the create was not applied. */
static int find_leases(zk_client *zc, zk_sess *s, const char *node, const char *guid,
                       char ***paths, int *n, dl_err *err) {
    *paths = NULL;
    *n = 0;
    zk_op *op = NULL;
    int zrc = zk_req(zc, s, OP_KIDS, node, 0, &op);
    if (zrc == ZNONODE) return DLOCK_OK;
    if (zrc != ZOK) return zk_fail(zrc, "list the semaphore's leases", err);
    zk_lease *v = NULL;
    int nv = 0;
    int rc = leases_of(op, &v, &nv, err);
    char **p = rc ? NULL : calloc((size_t)(nv ? nv : 1), sizeof *p);
    if (!rc && !p) rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int k = 0;
    for (int i = 0; !rc && i < nv; i++) {
        if (strcmp(v[i].guid, guid)) continue;
        if (!(p[k] = join3(node, "/", v[i].name)))
            rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        else
            k++;
    }
    free(v);
    op_unref(op);
    if (rc) {
        for (int i = 0; i < k; i++) free(p[i]);
        free(p);
        return rc;
    }
    *paths = p;
    *n = k;
    return DLOCK_OK;
}

static void free_paths(char **p, int n) {
    for (int i = 0; i < n; i++) free(p[i]);
    free(p);
}

/* Creates the k leases (once, even across a connection loss) before
 * deadline: *paths (malloc'd) with k entries. */
static int create_leases(zk_client *zc, zk_sess *s, const char *node, const char *guid, int k,
                         int64_t deadline, char ***paths, dl_err *err) {
    *paths = NULL;
    char *prefix = malloc(strlen(node) + 2 * ZK_GUID_BYTES + 16);
    if (!prefix) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    sprintf(prefix, "%s/" ZK_LEASE_PREFIX "%s-", node, guid);
    int rc = DLOCK_OK, tries = 0, maybe = 0;
    for (;;) {
        if (maybe) {
            int n = 0;
            rc = find_leases(zc, s, node, guid, paths, &n, err);
            if (!rc && n == k) break;
            if (!rc && n > 0) {
                free_paths(*paths, n);
                *paths = NULL;
                rc = dl_seterr(err, DLOCK_EPROTO, "zookeeper: %d of our %d lease nodes found", n,
                               k);
                break;
            }
            free(*paths);
            *paths = NULL;
            if (rc) {
                if (dl_now_ms() >= deadline) break;
                dl_sleep_ms(50);
                continue;
            }
            maybe = 0; /* not there: it was not applied */
        }
        zk_op *op = NULL;
        int zrc = multi_create(zc, s, prefix, k, &op);
        if (zrc == ZOK) {
            *paths = calloc((size_t)k, sizeof **paths);
            for (int i = 0; *paths && i < k; i++) {
                (*paths)[i] = op->mpaths[i]; /* the full path of the node made */
                op->mpaths[i] = NULL;
            }
            if (!*paths) {
                for (int i = 0; i < k; i++) orphan_add(s, op->mpaths[i], NULL);
                rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
            } else {
                rc = DLOCK_OK;
            }
            op_unref(op);
            break;
        }
        if (zrc == ZNONODE && ++tries <= 3) {
            rc = ensure_parents(zc, s, node, ZOO_PERSISTENT, err);
            if (rc) break;
            continue;
        }
        if (zrc == ZCONNECTIONLOSS || zrc == ZOPERATIONTIMEOUT) {
            maybe = 1;
            if (dl_now_ms() < deadline) continue;
        }
        rc = zk_fail(zrc, "create the semaphore's lease nodes", err);
        break;
    }
    if (rc && maybe) orphan_add(s, NULL, prefix);
    free(prefix);
    return rc;
}

static int zk_sem_init(dl_object *o, dl_err *err) {
    zk_sem *zs = calloc(1, sizeof *zs);
    if (!zs) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    o->bdata = zs;
    zs->o = o;
    zk_client *zc = o->c->bctx;
    zs->node = name_under(zc->sems, o->name, o->name_len);
    if (!zs->node) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

/* Forgets the handle's leases (deleting them in the background if del). */
static void sem_drop(zk_sem *zs, int del) {
    for (int64_t i = 0; i < zs->nleases; i++) {
        if (del && zs->sess) orphan_add(zs->sess, zs->leases[i], NULL);
        free(zs->leases[i]);
    }
    zs->nleases = 0;
    if (zs->sess) sem_held_del(zs);
    sess_unref(zs->sess);
    zs->sess = NULL;
}

/* Freeing the handle gives its permits back. */
static void zk_sem_destroy(dl_object *o) {
    zk_sem *zs = o->bdata;
    if (!zs) return;
    sem_drop(zs, 1);
    free(zs->leases);
    free(zs->node);
    free(zs);
    o->bdata = NULL;
}

static int zk_sem_acquire(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err) {
    zk_client *zc = o->c->bctx;
    zk_sem *zs = o->bdata;
    char nm[80];
    dl_name_msg(o->name, o->name_len, nm, sizeof nm);
    /* one node per permit, all in one request, which must stay well under
     * the server's jute.maxbuffer (1 MiB by default) */
    int64_t maxk = ZK_MULTI_BYTES / ((int64_t)strlen(zs->node) + 64);
    if (permits > maxk)
        return dl_seterr(err, DLOCK_EINVAL, "semaphore '%s': at most %lld permits per acquire "
                                            "for this name on zookeeper (a node each, in one "
                                            "request; got %lld)",
                         nm, (long long)maxk, (long long)permits);
    if (zs->sess && sess_dead(zs->sess)) sem_drop(zs, 0); /* the session took them */
    if (zs->nleases + permits > zs->cap) {
        int64_t cap = zs->cap ? zs->cap : 4;
        while (cap < zs->nleases + permits) cap *= 2;
        char **nl = realloc(zs->leases, (size_t)cap * sizeof *nl);
        if (!nl) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        zs->leases = nl;
        zs->cap = cap;
    }
    zk_sess *s = NULL;
    int rc = sess_get(zc, &s, err);
    if (rc) return rc;
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE
                       : wait_ms == 0               ? dl_deadline(zc->cmd_timeout_ms)
                                                    : dl_deadline(wait_ms);
    char guid[2 * ZK_GUID_BYTES + 1];
    rc = dl_random_hex(guid, ZK_GUID_BYTES, err);
    char **paths = NULL;
    int k = (int)permits;
    if (!rc)
        rc = create_leases(zc, s, zs->node, guid, k,
                           wait_ms == 0 || deadline == DL_INF_DEADLINE
                               ? dl_deadline(zc->cmd_timeout_ms)
                               : deadline,
                           &paths, err);
    if (rc) {
        sess_unref(s);
        return rc;
    }
    /* first: this waiter watches the leases (it is the first waiter, or
     * has not looked yet); waited: it was refused once (a waiter behind may
     * watch its lease); held_guid: a group ahead seen marked as holding
     * although it does not fit in our view (a later total lowered below
     * what is held): we are the first waiter then */
    int first = 1, waited = 0;
    char held_guid[2 * ZK_GUID_BYTES + 1] = "";
    for (;;) {
        pthread_mutex_lock(&s->mu);
        uint64_t ev0 = s->events;
        int dead = s->dead;
        pthread_mutex_unlock(&s->mu);
        if (dead) {
            rc = dl_seterr(err, DLOCK_EIO, "semaphore '%s': the zookeeper session expired while "
                                           "waiting", nm);
            break;
        }
        /* both reads leave a watch (the leases: the first waiter's only): a
         * release (delete) or a new total after them wakes us */
        zk_op *op = NULL;
        int zrc = zk_req(zc, s, first ? OP_WATCH_KIDS : OP_KIDS, zs->node, 0, &op);
        int64_t total = 0;
        int set = 0, exists = 0;
        rc = zrc == ZOK ? sem_read(zc, s, zs->node, 1, &total, &set, NULL, &exists, err)
                        : zk_fail(zrc, "list the semaphore's leases", err);
        if (rc == DLOCK_EIO && !sess_dead(s) && dl_now_ms() < deadline && wait_ms != 0) {
            if (op) op_unref(op);
            dl_sleep_ms(50); /* disconnected: the session may come back */
            continue;
        }
        zk_lease *v = NULL;
        int n = 0, mine = 0, nmine = 0, ahead = -1;
        if (!rc) rc = leases_of(op, &v, &n, err);
        if (!rc) leases_held(v, n, total, guid, &mine, &nmine, &ahead);
        /* the waiting group just ahead of ours: we watch its last lease */
        char *ap = NULL, aguid[2 * ZK_GUID_BYTES + 1] = "";
        if (!rc && ahead >= 0 && strcmp(v[ahead].guid, held_guid)) {
            memcpy(aguid, v[ahead].guid, sizeof aguid);
            if (!(ap = join3(zs->node, "/", v[ahead].name)))
                rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        }
        free(v);
        if (op) op_unref(op);
        if (rc) break;
        if (nmine != k) {
            free(ap);
            rc = dl_seterr(err, DLOCK_EIO, "semaphore '%s': our lease nodes vanished (session "
                                           "expired?)", nm);
            break;
        }
        if (mine) {
            free(ap);
            if (waited) mark_held(s, paths[k - 1]);
            if (zs->sess && zs->sess != s) sem_drop(zs, 0); /* an expired session's */
            for (int i = 0; i < k; i++) zs->leases[zs->nleases++] = paths[i];
            free(paths);
            if (zs->sess) {
                sess_unref(s); /* the handle has its reference already */
            } else {
                zs->sess = s;
                sem_held_add(zs);
            }
            return DLOCK_OK;
        }
        if (wait_ms == 0 || dl_now_ms() >= deadline) {
            free(ap);
            rc = dl_sem_refused(o, permits, wait_ms != 0, err);
            break;
        }
        waited = 1;
        int64_t until = deadline;
        if (!ap) {
            /* the first waiter: every release wakes it */
            if (!first) {
                first = 1; /* we listed without the watch: again, with it */
                continue;
            }
        } else {
            /* a waiter behind another: its admission (the lease marked),
             * its give-up or its release (the lease deleted) wakes us, as
             * does a new total; a re-check now and then covers a mark that
             * was lost, and holders beyond a lowered total (unmarked) */
            first = 0;
            zk_op *ao = NULL;
            rc = watch_ahead(zc, s, ap, deadline, "watch the semaphore's queue", &ao, err);
            free(ap);
            if (rc == ZK_LOOK_AGAIN) continue;
            if (rc) break;
            int held = ao->datalen == (int)strlen(ZK_LEASE_HELD) &&
                       !memcmp(ao->data, ZK_LEASE_HELD, strlen(ZK_LEASE_HELD));
            op_unref(ao);
            if (held) {
                memcpy(held_guid, aguid, sizeof held_guid);
                first = 1;
                continue;
            }
            int64_t re = dl_now_ms() + ZK_SEM_RECHECK_MS;
            if (re < until) until = re;
        }
        if (wait_event(s, ev0, until, &o->cancel)) {
            rc = dl_seterr(err, DLOCK_ECANCELED, "waiting for '%s' was cancelled", nm);
            break;
        }
    }
    for (int i = 0; i < k; i++) give_up_node(zc, s, paths[i]);
    free_paths(paths, k);
    sess_unref(s);
    return rc;
}

/* Gives back permits this handle holds (its latest leases first). */
static int zk_sem_release(dl_object *o, int64_t permits, dl_err *err) {
    zk_client *zc = o->c->bctx;
    zk_sem *zs = o->bdata;
    char nm[80];
    dl_name_msg(o->name, o->name_len, nm, sizeof nm);
    if (zs->sess && sess_dead(zs->sess)) {
        int64_t had = zs->nleases;
        sem_drop(zs, 0);
        return dl_seterr(err, DLOCK_ELOST, "semaphore '%s': the zookeeper session holding this "
                                           "handle's %lld permit(s) expired (they were freed)",
                         nm, (long long)had);
    }
    if (permits > zs->nleases) return dl_sem_over_release(o, permits, zs->nleases, err);
    int64_t until = dl_deadline(zc->cmd_timeout_ms > zc->session_ms ? zc->cmd_timeout_ms
                                                                    : zc->session_ms);
    while (permits > 0) {
        const char *path = zs->leases[zs->nleases - 1];
        int zrc;
        for (;;) {
            zrc = zk_req(zc, zs->sess, OP_DELETE, path, 0, NULL);
            if (!zk_unknown(zrc) || sess_dead(zs->sess) || dl_now_ms() >= until) break;
            dl_sleep_ms(50);
        }
        if (zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE || sess_dead(zs->sess)) {
            int64_t had = zs->nleases;
            sem_drop(zs, 0);
            return dl_seterr(err, DLOCK_ELOST, "semaphore '%s': the zookeeper session holding "
                                               "this handle's %lld permit(s) expired", nm,
                             (long long)had);
        }
        if (zrc != ZOK && zrc != ZNONODE) return zk_fail(zrc, "semaphore release", err);
        free(zs->leases[--zs->nleases]);
        permits--;
    }
    if (zs->nleases == 0) sem_drop(zs, 0);
    return DLOCK_OK;
}

/* total - the permits held (the leases that fit; waiters are not counted). */
static int zk_sem_available(dl_object *o, int64_t *permits, dl_err *err) {
    zk_client *zc = o->c->bctx;
    zk_sem *zs = o->bdata;
    zk_sess *s = NULL;
    int rc = sess_get(zc, &s, err);
    if (rc) return rc;
    int64_t total = 0;
    int set = 0, exists = 0;
    zk_op *op = NULL;
    rc = sem_read(zc, s, zs->node, 0, &total, &set, NULL, &exists, err);
    if (!rc && exists) {
        int zrc = zk_req(zc, s, OP_KIDS, zs->node, 0, &op);
        if (zrc != ZOK && zrc != ZNONODE) rc = zk_fail(zrc, "list the semaphore's leases", err);
    }
    zk_lease *v = NULL;
    int n = 0;
    if (!rc) rc = leases_of(op, &v, &n, err);
    if (!rc) *permits = total - leases_held(v, n, total, NULL, NULL, NULL, NULL);
    free(v);
    if (op) op_unref(op);
    sess_unref(s);
    return rc;
}

/* Sets the total: to permits only while unset (try_set), or adds delta. A
 * write whose outcome is unknown (connection lost) is not re-sent: an add
 * could be applied twice; DLOCK_EIO says so. */
static int sem_write(dl_object *o, int add, int64_t v, int *set, dl_err *err) {
    zk_client *zc = o->c->bctx;
    zk_sem *zs = o->bdata;
    const char *what = add ? "semaphore add" : "semaphore try_set";
    zk_sess *s = NULL;
    int rc = sess_get(zc, &s, err);
    if (rc) return rc;
    for (int tries = 0;; tries++) {
        if (tries >= 100) {
            rc = dl_seterr(err, DLOCK_EIO, "zookeeper: %s: the value kept changing", what);
            break;
        }
        int64_t total = 0;
        int has = 0, version = 0, exists = 0;
        rc = sem_read(zc, s, zs->node, 0, &total, &has, &version, &exists, err);
        if (rc) break;
        if (!add && has) {
            *set = 0;
            break;
        }
        if (add && ((v > 0 && total > INT64_MAX - v) || (v < 0 && total < INT64_MIN - v))) {
            rc = dl_seterr(err, DLOCK_EOVERFLOW, "%s: the permits would overflow", what);
            break;
        }
        char num[24];
        dl_fmt_ll(num, add ? total + v : v);
        int zrc = exists ? zk_req_data(zc, s, OP_SET, zs->node, version, num, NULL)
                         : zk_req_data(zc, s, OP_CREATE, zs->node, ZOO_PERSISTENT, num, NULL);
        if (zrc == ZOK) {
            if (set) *set = 1;
            break;
        }
        if (zrc == ZBADVERSION || zrc == ZNODEEXISTS) continue; /* changed meanwhile */
        if (zrc == ZNONODE && !exists) {
            rc = ensure_parents(zc, s, zc->sems, ZOO_PERSISTENT, err);
            if (rc) break;
            continue;
        }
        if (zrc == ZNONODE) continue; /* deleted meanwhile */
        rc = zk_fail(zrc, what, err);
        break;
    }
    sess_unref(s);
    return rc;
}

static int zk_sem_try_set(dl_object *o, int64_t permits, int *set, dl_err *err) {
    return sem_write(o, 0, permits, set, err);
}

static int zk_sem_add(dl_object *o, int64_t delta, dl_err *err) {
    return sem_write(o, 1, delta, NULL, err);
}

/* ---- server facts ---- */

/* Sends the `srvr` four-letter word to the connected server; the first line
 * ("Zookeeper version: ...") into buf. */
static int srvr_version(zk_client *zc, zk_sess *s, char *buf, size_t buflen, dl_err *err) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (!zookeeper_get_connected_host(s->zh, (struct sockaddr *)&ss, &sl))
        return dl_seterr(err, DLOCK_EIO, "zookeeper: not connected");
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return dl_seterr(err, DLOCK_ESYS, "socket: %s", strerror(errno));
    int64_t deadline = dl_deadline(zc->cmd_timeout_ms);
    char in[1024];
    size_t got = 0;
    int rc = DLOCK_OK, sent = 0;
    if (connect(fd, (struct sockaddr *)&ss, sl) < 0 && errno != EINPROGRESS)
        rc = dl_seterr(err, DLOCK_EIO, "zookeeper: srvr: connect: %s", strerror(errno));
    while (!rc) {
        int64_t left = deadline - dl_now_ms();
        if (left <= 0) {
            rc = dl_seterr(err, DLOCK_EIO, "zookeeper: srvr: no answer within %lld ms",
                           (long long)zc->cmd_timeout_ms);
            break;
        }
        struct pollfd pf = {.fd = fd, .events = sent ? POLLIN : POLLOUT};
        int pr = poll(&pf, 1, (int)(left > INT_MAX ? INT_MAX : left));
        if (pr <= 0) continue;
        if (!sent) {
            if (send(fd, "srvr", 4, MSG_NOSIGNAL) != 4) {
                rc = dl_seterr(err, DLOCK_EIO, "zookeeper: srvr: %s", strerror(errno));
                break;
            }
            sent = 1;
            continue;
        }
        ssize_t r = read(fd, in + got, sizeof in - 1 - got);
        if (r < 0) {
            rc = dl_seterr(err, DLOCK_EIO, "zookeeper: srvr: %s", strerror(errno));
            break;
        }
        got += (size_t)r;
        if (r == 0 || got == sizeof in - 1) break;
    }
    close(fd);
    if (rc) return rc;
    in[got] = '\0';
    const char *key = "Zookeeper version: ";
    char *v = strstr(in, key);
    if (!v) return dl_seterr(err, DLOCK_ESERVER, "zookeeper: srvr not answered (not in "
                                                 "4lw.commands.whitelist?)");
    v += strlen(key);
    v[strcspn(v, "\r\n")] = '\0';
    snprintf(buf, buflen, "%s", v);
    return DLOCK_OK;
}

static int zk_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                          dl_err *err) {
    zk_client *zc = c->bctx;
    if (!strcmp(what, "client_version")) {
        snprintf(buf, buflen, "%s", ZOO_VERSION);
        return DLOCK_OK;
    }
    zk_sess *s = NULL;
    int rc = sess_get(zc, &s, err);
    if (rc) return rc;
    if (!strcmp(what, "version")) {
        rc = srvr_version(zc, s, buf, buflen, err);
    } else if (!strcmp(what, "session")) {
        snprintf(buf, buflen, "a ZooKeeper session with a %d ms timeout",
                 zoo_recv_timeout(s->zh));
    } else if (!strcmp(what, "session_timeout_ms")) {
        snprintf(buf, buflen, "%d", zoo_recv_timeout(s->zh));
    } else if (!strcmp(what, "session_id")) {
        const clientid_t *id = zoo_client_id(s->zh);
        snprintf(buf, buflen, "0x%llx", id ? (unsigned long long)id->client_id : 0ULL);
    } else if (!strcmp(what, "server")) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        char host[INET6_ADDRSTRLEN] = "";
        int port = 0;
        if (zookeeper_get_connected_host(s->zh, (struct sockaddr *)&ss, &sl)) {
            if (ss.ss_family == AF_INET) {
                struct sockaddr_in *a = (struct sockaddr_in *)&ss;
                inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
                port = ntohs(a->sin_port);
            } else if (ss.ss_family == AF_INET6) {
                struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
                inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
                port = ntohs(a->sin6_port);
            }
        }
        if (!host[0]) rc = dl_seterr(err, DLOCK_EIO, "zookeeper: not connected");
        else snprintf(buf, buflen, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host, port);
    } else {
        rc = dl_seterr(err, DLOCK_ESERVER, "no such fact '%s' (zookeeper: version, session, "
                                           "session_timeout_ms, session_id, server, "
                                           "client_version)", what);
    }
    sess_unref(s);
    return rc;
}

static const char *const zk_schemes[] = {"zk://", NULL};

const dl_backend dl_backend_zookeeper = {
    .name = "zookeeper",
    .schemes = zk_schemes,
    .kinds = (1u << DLOCK_KIND_PLAIN) | (1u << DLOCK_KIND_REENTRANT) | (1u << DLOCK_KIND_READ) |
             (1u << DLOCK_KIND_WRITE),
    .caps = DL_CAP_CANCEL,
    .open = zk_open,
    .close = zk_close,
    .ping = zk_ping,
    .lock_init = zk_lock_init,
    .lock_destroy = zk_lock_destroy,
    .acquire = zk_acquire,
    .release = zk_release,
    .extend = NULL,
    .check = zk_check,
    .inspect = zk_inspect,
    .fence_current = zk_fence_current,
    .force_unlock = NULL,
    .server_fact = zk_server_fact,
    .sem_init = zk_sem_init,
    .sem_destroy = zk_sem_destroy,
    .sem_acquire = zk_sem_acquire,
    .sem_release = zk_sem_release,
    .sem_available = zk_sem_available,
    .sem_try_set = zk_sem_try_set,
    .sem_add = zk_sem_add,
};
