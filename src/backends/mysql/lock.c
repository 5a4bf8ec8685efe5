/* MySQL lock handles (GET_LOCK, or the table mode's), queries by name, extend and force unlock. (The design: mysql_backend.h.) */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mysql.h>
#include <mysqld_error.h>
#include <errmsg.h>
#include <openssl/sha.h>

#include "mysql_backend.h"

/* ---- lock handles ---- */
int dl_my_lock_init(dlock_lock *l, dl_err *err) {
    my_lock *ml = calloc(1, sizeof *ml);
    if (!ml) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    l->h.backend_state = ml;
    ml->l = l;
    dl_my_make_key(l->h.name, l->h.name_len, ml->hex);
    my_client *mc = l->h.c->backend_client;
    if (mc->u.mode == MY_MODE_TABLE) return DLOCK_OK; /* uses the client's connection */
    return dl_my_connect(mc, &ml->db, err);
}

void dl_my_lock_destroy(dlock_lock *l) {
    my_lock *ml = l->h.backend_state;
    if (!ml) return;
    dl_my_renew_off(l->h.c->backend_client, ml);
    dl_my_close_db(&ml->db); /* ends the session: frees whatever it still held */
    free(ml);
    l->h.backend_state = NULL;
}

/* The session is gone (or given up): so is every lock it held. */
static void lock_conn_lost(dlock_lock *l) {
    my_lock *ml = l->h.backend_state;
    dl_my_close_db(&ml->db);
    if (l->holds > 0) {
        l->expires_at = 0; /* a later acquire starts afresh */
        atomic_store(&l->lease.lost, 1);
    }
}

/* Gives back one hold of l's GET_LOCK on its connection, best effort (the
 * connection is dropped if it broke). */
static void give_back(dlock_lock *l) {
    my_lock *ml = l->h.backend_state;
    my_client *mc = l->h.c->backend_client;
    char sql[64 + sizeof ml->hex];
    snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK(x'%s')", ml->hex);
    long long v;
    int isnull, broken = 0;
    dl_err e2 = {0};
    if (dl_my_query(ml->db, sql, dl_deadline(mc->cmd_ms), 1, &v, &isnull, &broken, &e2) && broken)
        lock_conn_lost(l);
}

int dl_my_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                  dl_err *err) {
    my_lock *ml = l->h.backend_state;
    my_client *mc = l->h.c->backend_client;
    char nb[80];
    if (mc->u.mode == MY_MODE_TABLE) return dl_my_table_acquire(l, wait_ms, lease_ms, t, err);
    if (lease_ms != DLOCK_WATCHDOG)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "leases (lease_ms > 0) are not supported by the mysql backend in "
                         "GET_LOCK mode: its locks are held while the connection lives (pass "
                         "DLOCK_WATCHDOG, or use ?lock=table)");
    if (!ml->db) {
        if (l->holds > 0)
            return dl_seterr(err, DLOCK_ELOST, "lock '%s' was lost with its connection",
                             dl_my_name_msg(l, nb, sizeof nb));
        int rc = dl_my_connect(mc, &ml->db, err);
        if (rc) return rc;
    }
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE : dl_deadline(wait_ms);
    char sql[64 + sizeof ml->hex];
    int rc, broken = 0, isnull;
    long long v;
    /* a wait can be cancelled (dlock_lock_cancel); a re-entry does not wait */
    dl_cancel *cx = wait_ms != 0 && l->holds == 0 ? &l->h.cancel : NULL;
    int canceled = 0;
    if (cx) dl_cancel_begin(cx);
    for (;;) {
        long long ms = MY_FOREVER_CHUNK_S * 1000;
        if (deadline != DL_INF_DEADLINE) {
            ms = deadline - dl_now_ms();
            if (ms < 0 || wait_ms == 0) ms = 0;
        }
        snprintf(sql, sizeof sql, "SELECT GET_LOCK(x'%s', %lld.%03lld)", ml->hex, ms / 1000,
                 ms % 1000);
        int64_t until = deadline == DL_INF_DEADLINE ? DL_INF_DEADLINE
                                                    : dl_deadline(ms + mc->cmd_ms);
        rc = dl_my_query_cx(mc, ml->db, sql, until, cx, &canceled, 1, &v, &isnull, &broken, err);
        /* cancelled: the statement was killed (an error, or NULL), or the
         * kill failed (the connection is closed); a lock taken first is
         * kept (OK) */
        if (canceled && (rc || isnull || v != 1)) {
            /* killed as GET_LOCK returned: the lock may be the session's
             * (it held none before: no re-entry waits) */
            if (rc && !broken) give_back(l);
            rc = dl_cancel_err(l, err);
            goto fail;
        }
        if (rc) goto fail;
        if (isnull) {
            rc = dl_seterr(err, DLOCK_ESERVER, "GET_LOCK of '%s' failed (NULL)",
                           dl_my_name_msg(l, nb, sizeof nb));
            goto fail;
        }
        if (v == 1) break;
        if (deadline == DL_INF_DEADLINE) continue;
        if (wait_ms == 0)
            return dl_seterr(err, DLOCK_EBUSY, "lock '%s' is held by another owner",
                             dl_my_name_msg(l, nb, sizeof nb));
        if (dl_now_ms() >= deadline) {
            rc = dl_seterr(err, DLOCK_ETIMEDOUT, "lock '%s' not acquired within %lld ms",
                           dl_my_name_msg(l, nb, sizeof nb), (long long)wait_ms);
            goto fail;
        }
    }
    if (cx) dl_cancel_end(cx);
    /* the fencing token: LAST_INSERT_ID(expr) in both branches makes
     * mysql_insert_id() the new n, first insert included */
    char fsql[160 + sizeof ml->hex];
    snprintf(fsql, sizeof fsql,
             "INSERT INTO dlock_fence (name, n) VALUES (x'%s', LAST_INSERT_ID(1)) "
             "ON DUPLICATE KEY UPDATE n = LAST_INSERT_ID(n + 1)",
             ml->hex);
    rc = dl_my_query(ml->db, fsql, dl_deadline(mc->cmd_ms), 0, NULL, NULL, &broken, err);
    if (rc) {
        if (!broken) give_back(l); /* the hold just taken */
        char m[DL_ERRMSG_MAX];
        snprintf(m, sizeof m, "%s", err->msg);
        dl_seterr(err, err->code, "fencing token of '%s': %s", dl_my_name_msg(l, nb, sizeof nb), m);
        goto fail;
    }
    t->acquired = 1;
    t->fence = (uint64_t)mysql_insert_id(ml->db);
    t->count = l->holds + 1;
    t->pttl = -1;
    l->expires_at = INT64_MAX;
    return DLOCK_OK;
fail:
    if (cx) dl_cancel_end(cx);
    if (broken) lock_conn_lost(l);
    return rc;
}

int dl_my_release(dlock_lock *l, long long *res, dl_err *err) {
    my_lock *ml = l->h.backend_state;
    my_client *mc = l->h.c->backend_client;
    if (mc->u.mode == MY_MODE_TABLE) return dl_my_table_release(l, res, err);
    *res = -1;
    if (!ml->db) return DLOCK_OK; /* the session, and the lock with it, is gone */
    char sql[64 + sizeof ml->hex];
    snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK(x'%s')", ml->hex);
    long long v;
    int isnull, broken;
    int rc = dl_my_query(ml->db, sql, dl_deadline(mc->cmd_ms), 1, &v, &isnull, &broken, err);
    if (rc) {
        if (!broken) return rc;
        lock_conn_lost(l);
        return DLOCK_OK; /* -1: lost */
    }
    if (!isnull && v == 1) *res = l->holds > 1 ? 0 : 1;
    return DLOCK_OK;
}

int dl_my_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    my_lock *ml = l->h.backend_state;
    my_client *mc = l->h.c->backend_client;
    char nb[80];
    *held = 0;
    *count = 0;
    if (mc->u.mode == MY_MODE_TABLE) return dl_my_table_check(l, held, count, err);
    int rc = DLOCK_OK, broken = 0;
    if (ml->db) {
        char sql[80 + sizeof ml->hex];
        snprintf(sql, sizeof sql, "SELECT IS_USED_LOCK(x'%s') = CONNECTION_ID()", ml->hex);
        long long v;
        int isnull;
        rc = dl_my_query(ml->db, sql, dl_deadline(mc->cmd_ms), 1, &v, &isnull, &broken, err);
        if (!rc) {
            *held = !isnull && v == 1;
            *count = *held ? l->holds : 0;
            return DLOCK_OK;
        }
        if (!broken) return rc;
        lock_conn_lost(l);
    }
    return dl_seterr(err, DLOCK_ELOST, "lock '%s' was lost with its connection",
                     dl_my_name_msg(l, nb, sizeof nb));
}

/* ---- queries by name ---- */
int dl_my_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                  dl_err *err) {
    char hex[2 * MY_KEY_MAX + 1], sql[160 + 2 * sizeof hex];
    dl_my_make_key(name, len, hex);
    memset(info, 0, sizeof *info);
    if (((my_client *)c->backend_client)->u.mode == MY_MODE_TABLE)
        return dl_my_table_inspect(c, hex, info, err);
    snprintf(sql, sizeof sql, "SELECT IS_USED_LOCK(x'%s')", hex);
    long long v, f;
    int isnull, fnull;
    int rc = dl_my_client_query(c, sql, &v, &isnull, err);
    if (!rc) {
        snprintf(sql, sizeof sql, "SELECT n FROM dlock_fence WHERE name = x'%s'", hex);
        rc = dl_my_client_query(c, sql, &f, &fnull, err);
    }
    if (rc) return rc;
    info->exists = !isnull;
    info->ttl_ms = isnull ? -2 : -1;
    info->fence = fnull ? 0 : (uint64_t)f;
    info->hold_count = info->holders = !isnull;
    if (!isnull) snprintf(info->holder, sizeof info->holder, "connection %lld", v);
    return DLOCK_OK;
}

int dl_my_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                        dl_err *err) {
    char hex[2 * MY_KEY_MAX + 1], sql[80 + sizeof hex];
    dl_my_make_key(name, len, hex);
    snprintf(sql, sizeof sql, "SELECT n FROM dlock_fence WHERE name = x'%s'", hex);
    long long v;
    int isnull;
    int rc = dl_my_client_query(c, sql, &v, &isnull, err);
    if (!rc) *fence = isnull ? 0 : (uint64_t)v;
    return rc;
}

int dl_my_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err) {
    my_client *mc = l->h.c->backend_client;
    if (mc->u.mode == MY_MODE_TABLE) return dl_my_table_extend(l, lease_ms, res, err);
    return dl_seterr(err, DLOCK_ENOTSUP,
                     "extend is not supported by the mysql backend in GET_LOCK mode (its locks "
                     "live as long as the connection; ?lock=table has leases)");
}

/* Table mode: deletes the row, whoever holds it; the holder finds out at
 * its next extend, renewal, check or release (DLOCK_ELOST). */
int dl_my_force_unlock(dlock_client *c, const char *name, size_t len, int *existed,
                       dl_err *err) {
    my_client *mc = c->backend_client;
    if (mc->u.mode != MY_MODE_TABLE)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "force_unlock is not supported by the mysql backend in GET_LOCK mode "
                         "(only KILL of the holder's connection could do it)");
    char hex[2 * MY_KEY_MAX + 1], sql[200 + sizeof hex];
    dl_my_make_key(name, len, hex);
    snprintf(sql, sizeof sql,
             "DELETE FROM dlock_locks WHERE name = x'%s' AND expires_at >= " MY_NOW_US, hex);
    long long n = 0;
    pthread_mutex_lock(&mc->mu);
    int rc = dl_my_cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), &n, NULL, err);
    if (!rc) { /* an expired row too: nobody holds it */
        snprintf(sql, sizeof sql, "DELETE FROM dlock_locks WHERE name = x'%s'", hex);
        rc = dl_my_cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, NULL, err);
    }
    pthread_mutex_unlock(&mc->mu);
    if (!rc && existed) *existed = n > 0;
    return rc;
}

/* dlock_server_fact: "version", "session", "mode" (get_lock / table),
 * "wait_timeout" (seconds an idle connection lives: GET_LOCK holders lose
 * their locks with it), "server_time_ms" (the server's clock, Unix ms: the
 * clock that decides table-mode expiry), "connection_id" (of the client's
 * query connection). */
