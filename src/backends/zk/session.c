/* ZooKeeper sessions, requests with a deadline, and orphan nodes deleted in the background. (The design: zk.h.) */
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

#include <zookeeper/zookeeper_version.h>

#include "zk.h"

/* ---- helpers ---- */

/* The session expired: every lock and semaphore handle holding on it lost
 * its holds (the server deleted its nodes); under s->mu (the session
 * watcher, on expiry). */
static void mark_lost_locked(zk_sess *s) {
    for (zk_lock *zl = s->held; zl; zl = zl->next) {
        zl->lost = 1;
        dlock_lock *l = zl->l;
        atomic_store(&l->lease.lost, 1);
        if (l->lost_fn) l->lost_fn(l, DLOCK_LOST_UNREACHABLE, l->lost_ud);
    }
    for (zk_sem *zs = s->held_sems; zs; zs = zs->next)
        dl_semaphore_lost(zs->o, DLOCK_LOST_UNREACHABLE);
}


static void no_log(const char *msg) { (void)msg; }

/* The request may or may not have been applied: the connection went (the C
 * client fails pending requests with one of these), or no answer came. */
int dl_zk_unknown(int zrc) {
    return zrc == ZCONNECTIONLOSS || zrc == ZOPERATIONTIMEOUT || zrc == ZK_NOANSWER;
}

int dl_zk_fail(int zrc, const char *what, dl_err *err) {
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

char *dl_zk_join3(const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}

/* ---- sessions ---- */

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

void dl_zk_sess_unref(zk_sess *s) {
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
    dl_cond_init(&s->cv);
    s->refs = 1;
    s->zh = zookeeper_init2(zc->hosts, sess_watcher, zc->session_ms, NULL, s, 0, no_log);
#ifdef DLOCK_HAVE_ZOO_RESOLUTION_DELAY
    if (s->zh) zoo_set_servers_resolution_delay(s->zh, ZK_RESOLVE_DELAY_MS);
#endif
    if (!s->zh) {
        int e = errno;
        dl_zk_sess_unref(s);
        if (e == EINVAL)
            return dl_seterr(err, DLOCK_EINVAL, "bad zookeeper host list '%s'", zc->hosts);
        if (e == ENOMEM) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        return dl_seterr(err, DLOCK_EIO, "zookeeper: cannot start a session with %s: %s",
                         zc->hosts, strerror(e));
    }
    int64_t deadline = dl_deadline(zc->connect_timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (!s->connected && !s->dead && dl_now_ms() < deadline)
        dl_cond_wait_until(&s->cv, &s->mu, deadline);
    int ok = s->connected, dead = s->dead;
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        dl_zk_sess_unref(s);
        if (dead)
            return dl_seterr(err, DLOCK_EAUTH, "zookeeper: %s refused the session", zc->hosts);
        return dl_seterr(err, DLOCK_EIO, "zookeeper: no server of %s answered within %lld ms",
                         zc->hosts, (long long)zc->connect_timeout_ms);
    }
    *out = s;
    return DLOCK_OK;
}

/* The client's live session (a reference), opening a new one after expiry. */
int dl_zk_sess_get(zk_client *zc, zk_sess **out, dl_err *err) {
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
        dl_zk_sess_unref(s);
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


zk_op *dl_zk_op_new(zk_sess *s) {
    zk_op *op = calloc(1, sizeof *op);
    if (!op) return NULL;
    if (sem_init(&op->sem, 0, 0) != 0) {
        free(op);
        return NULL;
    }
    atomic_init(&op->refs, 2);
    atomic_init(&op->state, ZK_OP_PENDING);
    op->s = s;
    return op;
}

static void op_free(zk_op *op) {
    sem_destroy(&op->sem);
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

void dl_zk_op_unref(zk_op *op) {
    if (atomic_fetch_sub(&op->refs, 1) == 1) op_free(op);
}

static void noop_void(int rc, const void *data) {
    (void)rc;
    (void)data;
}


/* completion side: record, hand the answer to the caller (or, if it gave
 * up, clean up after the request), drop the completion's reference */
static void op_done(zk_op *op, int rc) {
    op->rc = rc;
    int pending = ZK_OP_PENDING;
    if (atomic_compare_exchange_strong(&op->state, &pending, ZK_OP_DONE)) {
        /* the completion's reference keeps sem alive until here */
        sem_post(&op->sem);
    } else if (op->own) {
        /* a create of our own queue node or leases that nobody waits for any
         * more: its nodes, if any, must go. (Other creates, of parents or of
         * a semaphore's node with its total, stay: shared nodes, whose
         * caller was told the outcome is unknown.) */
        if (rc == ZOK && op->path) dl_zk_orphan_add(op->s, op->path, NULL);
        for (int i = 0; rc == ZOK && i < op->nm; i++)
            if (op->mpaths[i]) dl_zk_orphan_add(op->s, op->mpaths[i], NULL);
        if (op->prefix && dl_zk_unknown(rc)) dl_zk_orphan_add(op->s, NULL, op->prefix);
    }
    dl_zk_op_unref(op);
}

void dl_zk_c_void(int rc, const void *data) { op_done((zk_op *)data, rc); }

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

/* Sleeps on sem until it is posted, deadline (dl_now_ms; DL_INF_DEADLINE
 * forever) or a signal; the caller looks at the time again. The deadline is
 * on the library's clock (clock.c), the wait on CLOCK_MONOTONIC: it is given
 * as the time left from now. Without sem_clockwait the wait is on
 * CLOCK_REALTIME, so a step of the wall clock moves its end by the step
 * (the caller re-checks the deadline when it wakes). */
static void sem_wait_until(sem_t *sem, int64_t deadline) {
    if (deadline == DL_INF_DEADLINE) {
        sem_wait(sem);
        return;
    }
    int64_t left = deadline - dl_now_ms();
    if (left <= 0) return;
    struct timespec ts;
#ifdef DLOCK_HAVE_SEM_CLOCKWAIT
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    clock_gettime(CLOCK_REALTIME, &ts);
#endif
    ts.tv_sec += (time_t)(left / 1000);
    ts.tv_nsec += (long)(left % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
#ifdef DLOCK_HAVE_SEM_CLOCKWAIT
    sem_clockwait(sem, CLOCK_MONOTONIC, &ts);
#else
    sem_timedwait(sem, &ts);
#endif
}

/* Waits for op's answer until deadline. Returns the ZooKeeper code, or
 * ZK_NOANSWER with *late = 1 when no answer came in time (the op is then
 * abandoned: its completion cleans up after it). */
int dl_zk_op_wait(zk_op *op, int64_t deadline, int *late) {
    while (atomic_load(&op->state) != ZK_OP_DONE && dl_now_ms() < deadline)
        sem_wait_until(&op->sem, deadline);
    int pending = ZK_OP_PENDING;
    if (atomic_compare_exchange_strong(&op->state, &pending, ZK_OP_ABANDONED)) {
        if (late) *late = 1;
        return ZK_NOANSWER;
    }
    return op->rc; /* ZK_OP_DONE, if only at the deadline */
}

/* Starts a request (sent() is the zoo_a* call's result): on a refusal the
 * completion will not run, so its reference is dropped here. */
int dl_zk_op_started(zk_op *op, int sent) {
    if (sent != ZOK) atomic_fetch_sub(&op->refs, 1);
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
            char *p = dl_zk_join3(o->parent, "/", v->data[i]);
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
void dl_zk_orphan_add(zk_sess *s, const char *path, const char *prefix) {
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


/* Sends one request without waiting for its answer. create: flags (the
 * finished op's path gets the created node) and data; watch: get with a
 * data watch on path (only set if it exists); watch_kids: get_children with
 * a child watch; set: data if the node's version is flags. *op gets the
 * request, to be waited for with dl_zk_req_wait (NULL when it was not
 * sent). Returns the zoo_a* call's code (ZSYSTEMERROR: out of memory). */
int dl_zk_req_send(zk_sess *s, int what, const char *path, int flags, const char *data,
                   zk_op **op) {
    *op = NULL;
    zk_op *o = dl_zk_op_new(s);
    if (!o) {
        errno = ENOMEM;
        return ZSYSTEMERROR;
    }
    int sent;
    switch (what) {
    case OP_CREATE:
        if (flags == ZOO_EPHEMERAL_SEQUENTIAL) {
            o->own = 1;
            o->prefix = strdup(path); /* NULL: no cleanup search */
        }
        sent = zoo_acreate2(s->zh, path, data, data ? (int)strlen(data) : -1,
                            &ZOO_OPEN_ACL_UNSAFE, flags, c_create, o);
        break;
    case OP_DELETE: sent = zoo_adelete(s->zh, path, -1, dl_zk_c_void, o); break;
    case OP_EXISTS: sent = zoo_aexists(s->zh, path, 0, c_stat, o); break;
    case OP_WATCH: sent = zoo_awget(s->zh, path, sess_watcher, s, c_data, o); break;
    case OP_GET: sent = zoo_aget(s->zh, path, 0, c_data, o); break;
    case OP_SET:
        sent = zoo_aset(s->zh, path, data, (int)strlen(data), flags, c_stat, o);
        break;
    case OP_WATCH_KIDS:
        sent = zoo_awget_children(s->zh, path, sess_watcher, s, c_kids, o);
        break;
    default: sent = zoo_aget_children(s->zh, path, 0, c_kids, o); break;
    }
    if (dl_zk_op_started(o, sent) != ZOK) {
        dl_zk_op_unref(o);
        return sent;
    }
    *op = o;
    return ZOK;
}

/* Waits for a sent request's answer until deadline and returns its code (no
 * answer in time: ZK_NOANSWER). With ZOK and out, *out gets the finished op,
 * which the caller frees with dl_zk_op_unref; else the op is dropped here. */
int dl_zk_req_wait(zk_op *op, int64_t deadline, zk_op **out) {
    if (out) *out = NULL;
    int rc = dl_zk_op_wait(op, deadline, NULL);
    if (rc == ZOK && out) *out = op;
    else dl_zk_op_unref(op);
    return rc;
}

/* Runs one request (as dl_zk_req_send) bounded by the command timeout.
 * *out (may be NULL) gets the finished op, which the caller frees with
 * dl_zk_op_unref. Returns the ZooKeeper code; no answer in time is
 * ZK_NOANSWER. */
int dl_zk_req_data(zk_client *zc, zk_sess *s, int what, const char *path, int flags,
                   const char *data, zk_op **out) {
    if (out) *out = NULL;
    zk_op *op = NULL;
    int rc = dl_zk_req_send(s, what, path, flags, data, &op);
    if (rc != ZOK) return rc;
    return dl_zk_req_wait(op, dl_deadline(zc->cmd_timeout_ms), out);
}

int dl_zk_req(zk_client *zc, zk_sess *s, int what, const char *path, int flags,
              zk_op **out) {
    return dl_zk_req_data(zc, s, what, path, flags, NULL, out);
}
