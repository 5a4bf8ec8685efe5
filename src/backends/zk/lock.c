/* ZooKeeper lock handles: acquire, release, check, and queries by name. (The design: zk.h.) */
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

/* ---- lock handles ---- */

int dl_zk_lock_init(dlock_lock *l, dl_err *err) {
    zk_lock *zl = calloc(1, sizeof *zl);
    if (!zl) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    l->h.backend_state = zl;
    zl->l = l;
    zl->parent = dl_zk_name_parent(l->h.c->backend_client, l->h.name, l->h.name_len);
    if (!zl->parent) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
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
    if (del && zl->node) dl_zk_orphan_add(s, zl->node, NULL);
    free(zl->node);
    zl->node = NULL;
    zl->sess = NULL;
    dl_zk_sess_unref(s);
}

void dl_zk_lock_destroy(dlock_lock *l) {
    zk_lock *zl = l->h.backend_state;
    if (!zl) return;
    drop_node(zl, 1);
    free(zl->parent);
    free(zl);
    l->h.backend_state = NULL;
}


static int is_lost(zk_lock *zl) {
    pthread_mutex_lock(&zl->sess->mu);
    int lost = zl->lost || zl->sess->dead;
    pthread_mutex_unlock(&zl->sess->mu);
    return lost;
}





int dl_zk_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t, dl_err *err) {
    if (lease_ms != DLOCK_WATCHDOG)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "leases (lease_ms > 0) are not supported by the zookeeper backend: its "
                         "locks are held while the session lives (pass DLOCK_WATCHDOG)");
    zk_client *zc = l->h.c->backend_client;
    zk_lock *zl = l->h.backend_state;
    char nm[80];
    dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm);
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
    int rc = dl_zk_sess_get(zc, &s, err);
    if (rc) return rc;
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE
                       : wait_ms == 0               ? dl_deadline(zc->cmd_timeout_ms)
                                                    : dl_deadline(wait_ms);
    char guid[2 * ZK_GUID_BYTES + 1];
    rc = dl_random_hex(guid, ZK_GUID_BYTES, err);
    char *path = NULL;
    uint64_t czxid = 0;
    int write = l->kind != DLOCK_KIND_READ;
    /* the queue's first listing goes with the create once this handle has
     * seen the name's parent (else a missing container would fail both) */
    zk_op *first = NULL;
    if (!rc)
        rc = dl_zk_create_node(zc, s, zl->parent, write, guid,
                         wait_ms == 0 || deadline == DL_INF_DEADLINE ? dl_deadline(zc->cmd_timeout_ms)
                                                                     : deadline,
                         &path, &czxid, zl->parent_seen ? &first : NULL, err);
    if (rc) {
        dl_zk_sess_unref(s);
        return rc;
    }
    zl->parent_seen = 1;
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
        if (first) {
            rc = dl_zk_queue_of(first, &op, &v, &n, err);
            first = NULL;
        } else {
            rc = dl_zk_list_queue(zc, s, zl->parent, &op, &v, &n, err);
        }
        if (rc == DLOCK_EIO && !dl_zk_sess_dead(s) && dl_now_ms() < deadline && wait_ms != 0) {
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
        char *pp = pred >= 0 ? dl_zk_join3(zl->parent, "/", v[pred].name) : NULL;
        free(v);
        if (op) dl_zk_op_unref(op);
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
        rc = dl_zk_watch_ahead(zc, s, pp, deadline, "watch the lock's queue", NULL, err);
        free(pp);
        if (rc == ZK_LOOK_AGAIN) continue;
        if (rc) break;
        if (dl_zk_wait_event(s, ev0, deadline, &l->h.cancel)) {
            rc = dl_cancel_err(l, err);
            break;
        }
    }
    if (first) dl_zk_op_unref(first);
    dl_zk_give_up_node(zc, s, path);
    free(path);
    dl_zk_sess_unref(s);
    return rc;
}

int dl_zk_release(dlock_lock *l, long long *res, dl_err *err) {
    zk_client *zc = l->h.c->backend_client;
    zk_lock *zl = l->h.backend_state;
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
        zrc = dl_zk_req(zc, zl->sess, OP_DELETE, zl->node, 0, NULL);
        if (!dl_zk_unknown(zrc) || dl_zk_sess_dead(zl->sess) || dl_now_ms() >= until) break;
        unknown = 1;
        dl_sleep_ms(50);
    }
    if (zrc == ZOK || zrc == ZNONODE || zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE ||
        dl_zk_sess_dead(zl->sess)) {
        drop_node(zl, 0);
        *res = zrc == ZOK || (zrc == ZNONODE && unknown) ? 1 : -1;
        return DLOCK_OK;
    }
    /* no answer: the node may still be there; the handle keeps it (retry
     * the release, or free the handle: that deletes it without waiting) */
    return dl_zk_fail(zrc, "release", err);
}

int dl_zk_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    zk_client *zc = l->h.c->backend_client;
    zk_lock *zl = l->h.backend_state;
    *held = 0;
    *count = 0;
    if (!zl->sess || is_lost(zl)) return DLOCK_OK;
    int zrc = dl_zk_req(zc, zl->sess, OP_EXISTS, zl->node, 0, NULL);
    if (zrc == ZNONODE || zrc == ZSESSIONEXPIRED) return DLOCK_OK;
    if (zrc != ZOK) return dl_zk_fail(zrc, "check", err);
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
    zk_client *zc = c->backend_client;
    char *parent = dl_zk_name_parent(zc, name, len);
    if (!parent) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    zk_sess *s = NULL;
    int rc = dl_zk_sess_get(zc, &s, err);
    zk_op *op = NULL;
    zk_child *v = NULL;
    int n = 0;
    if (!rc) rc = dl_zk_list_queue(zc, s, parent, &op, &v, &n, err);
    int writer = 0, h = rc ? 0 : holders_of(v, n, &writer);
    uint64_t best = 0;
    for (int i = 0; !rc && i < h; i++) {
        char *p = dl_zk_join3(parent, "/", v[i].name);
        if (!p) {
            rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
            break;
        }
        zk_op *eo = NULL;
        int zrc = dl_zk_req(zc, s, OP_EXISTS, p, 0, &eo);
        free(p);
        if (zrc == ZOK) {
            if ((uint64_t)eo->st.czxid > best) best = (uint64_t)eo->st.czxid;
            dl_zk_op_unref(eo);
        } else if (zrc != ZNONODE) {
            rc = dl_zk_fail(zrc, "inspect", err);
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
    if (op) dl_zk_op_unref(op);
    dl_zk_sess_unref(s);
    free(parent);
    return rc;
}

int dl_zk_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                  dl_err *err) {
    return query(c, name, len, info, NULL, err);
}

int dl_zk_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                        dl_err *err) {
    *fence = 0;
    return query(c, name, len, NULL, fence, err);
}
