/* The MySQL table mode (?lock=table): leases in dlock_locks, renewed by a thread of the client. (The design: mysql_backend.h.) */
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

/* ---- table mode (?lock=table): leases in dlock_locks ---- */
static void to_hex(const char *s, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[(unsigned char)s[i] >> 4];
        out[2 * i + 1] = digits[(unsigned char)s[i] & 15];
    }
    out[2 * n] = '\0';
}




/* One acquire attempt in one transaction: the name's fence counter is
 * incremented (its row lock orders the acquirers of a name), then the lock
 * row is inserted, or taken over when it has expired or is already ours
 * (re-entry), with the new fence; a row we may not take is left as it was
 * (0 rows affected) and the transaction rolled back, fence increment
 * included. *got 1 with *fence on success, else 0. Holds mc->mu. */
static int table_try(my_client *mc, my_lock *ml, int64_t lease_ms, int *got, uint64_t *fence,
                     int *transient, dl_err *err) {
    *got = 0;
    *transient = 0;
    int64_t until = dl_deadline(mc->cmd_ms);
    long long n = 0;
    char sql[1024 + 2 * sizeof ml->hex + 4 * sizeof ml->tokhex];
    int rc = dl_my_cdb_exec(mc, "START TRANSACTION", until, NULL, NULL, err);
    if (rc) return rc;
    snprintf(sql, sizeof sql,
             "INSERT INTO dlock_fence (name, n) VALUES (x'%s', LAST_INSERT_ID(1)) "
             "ON DUPLICATE KEY UPDATE n = LAST_INSERT_ID(n + 1)",
             ml->hex);
    rc = dl_my_cdb_exec(mc, sql, until, NULL, NULL, err);
    if (rc) goto rollback;
    unsigned long long f = (unsigned long long)mysql_insert_id(mc->db);
    long long lease_us = (long long)lease_ms * 1000;
    /* assignments run left to right: after the first, token is the new one */
    int kind = (int)ml->l->kind;
    snprintf(sql, sizeof sql,
             "INSERT INTO dlock_locks (name, token, fence, expires_at, kind) VALUES "
             "(x'%s', x'%s', %llu, " MY_NOW_US " + %lld, %d) ON DUPLICATE KEY UPDATE "
             "token = IF(token = x'%s' OR expires_at < " MY_NOW_US ", x'%s', token), "
             "fence = IF(token = x'%s', %llu, fence), "
             "kind = IF(token = x'%s', %d, kind), "
             "expires_at = IF(token = x'%s', " MY_NOW_US " + %lld, expires_at)",
             ml->hex, ml->tokhex, f, lease_us, kind, ml->tokhex, ml->tokhex, ml->tokhex, f,
             ml->tokhex, kind, ml->tokhex, lease_us);
    rc = dl_my_cdb_exec(mc, sql, until, &n, NULL, err);
    if (rc) goto rollback;
    if (n == 0) { /* held by another: give the fence back */
        return dl_my_cdb_exec(mc, "ROLLBACK", until, NULL, NULL, err);
    }
    rc = dl_my_cdb_exec(mc, "COMMIT", until, NULL, NULL, err);
    if (rc) return rc;
    *got = 1;
    *fence = f;
    return DLOCK_OK;
rollback:
    if (mc->db) {
        /* a deadlock or lock wait timeout between acquirers: worth another try */
        unsigned e = mysql_errno(mc->db);
        *transient = e == ER_LOCK_DEADLOCK || e == ER_LOCK_WAIT_TIMEOUT;
        dl_err e2 = {0};
        if (dl_my_cdb_exec(mc, "ROLLBACK", until, NULL, NULL, &e2)) dl_my_close_db(&mc->db);
    }
    return rc;
}

/* Removes ml from the renewal list, waiting for a renewal round in flight
 * (unless called by the renewal thread itself, from a lost callback). */
void dl_my_renew_off(my_client *mc, my_lock *ml) {
    pthread_mutex_lock(&mc->rmu);
    while (mc->rrunning && !dl_renewer_is_self(&mc->renewer))
        pthread_cond_wait(&mc->rdone, &mc->rmu);
    if (ml->reg) {
        for (my_lock **p = &mc->rhead; *p; p = &(*p)->rnext)
            if (*p == ml) {
                *p = ml->rnext;
                break;
            }
        ml->reg = 0;
        ml->rnext = NULL;
    }
    pthread_mutex_unlock(&mc->rmu);
}


/* Sets the lease of one hold again: 1 renewed, 0 not ours any more, -1 no
 * answer. */
static int renew_one(my_client *mc, renew_snap *s) {
    char sql[512 + sizeof s->hex + sizeof s->tokhex];
    snprintf(sql, sizeof sql,
             "UPDATE dlock_locks SET expires_at = " MY_NOW_US " + %lld WHERE name = x'%s' "
             "AND token = x'%s' AND expires_at >= " MY_NOW_US,
             (long long)s->lease_ms * 1000, s->hex, s->tokhex);
    int64_t limit = s->lease_ms / 3 < mc->cmd_ms ? s->lease_ms / 3 : mc->cmd_ms;
    if (limit < 10) limit = 10;
    long long matched = 0;
    dl_err err = {0};
    int broken = 0, rc = DLOCK_OK;
    if (!mc->rdb) {
        /* timeouts from the renewal period, so that a server that stopped
         * answering is found out about when the lease runs out (the
         * connector counts them in whole seconds: 1 s at least) */
        unsigned sec = (unsigned)((limit + 999) / 1000);
        rc = dl_my_connect_t(mc, sec, sec, &mc->rdb, &err);
    }
    if (!rc) rc = dl_my_exec(mc->rdb, sql, dl_deadline(limit), NULL, &matched, &broken, &err);
    if (rc && broken) dl_my_close_db(&mc->rdb);
    if (rc) return -1;
    return matched > 0 ? 1 : 0;
}

/* The renewal thread (renewer.c) runs on the MySQL client library's thread
 * state. */
static void renew_enter(void *arg) {
    (void)arg;
    mysql_thread_init();
}

static void renew_leave(void *arg) {
    (void)arg;
    mysql_thread_end();
}

/* The renewer's round (under rmu): renews each registered hold every third
 * of its lease; a hold the table no longer gives us, or one not renewed for
 * a whole lease, is marked lost and its callback run (under rmu). */
static int64_t renew_round(void *arg) {
    my_client *mc = arg;
    if (!mc->rhead) return DL_INF_DEADLINE; /* until a hold is registered */
    int64_t now = dl_now_ms(), due = INT64_MAX;
    size_t n = 0;
    for (my_lock *m = mc->rhead; m; m = m->rnext) {
        if (m->rnext_ms < due) due = m->rnext_ms;
        if (m->rnext_ms <= now) n++;
    }
    if (now < due) return due;
    renew_snap *snap = calloc(n, sizeof *snap);
    if (!snap) return now + 10;
    size_t k = 0;
    for (my_lock *m = mc->rhead; m && k < n; m = m->rnext) {
        if (m->rnext_ms > now) continue;
        snap[k].ml = m;
        snap[k].seq = m->rseq;
        snap[k].lease_ms = m->rlease_ms;
        memcpy(snap[k].hex, m->hex, sizeof m->hex);
        memcpy(snap[k].tokhex, m->tokhex, sizeof m->tokhex);
        k++;
    }
    mc->rrunning = 1;
    pthread_mutex_unlock(&mc->rmu);
    for (size_t i = 0; i < k; i++) {
        snap[i].t0 = dl_now_ms();
        snap[i].result = renew_one(mc, &snap[i]);
    }
    pthread_mutex_lock(&mc->rmu);
    mc->rrunning = 0;
    pthread_cond_broadcast(&mc->rdone);
    now = dl_now_ms();
    for (size_t i = 0; i < k; i++) {
        renew_snap *s = &snap[i];
        my_lock *m = s->ml;
        /* still registered as then? (dl_my_renew_off waits for the round, so m
         * is alive; the sequence number tells a new hold apart) */
        int alive = 0;
        for (my_lock *x = mc->rhead; x; x = x->rnext) alive |= x == m;
        if (!alive || m->rseq != s->seq) continue;
        dl_lease *lease = &m->l->lease;
        int reason = 0;
        int64_t period = s->lease_ms / 3 > 1 ? s->lease_ms / 3 : 1;
        if (s->result == 1) {
            atomic_store(&lease->last_ok, (long long)s->t0);
            m->rnext_ms = s->t0 + period;
        } else if (s->result == 0) {
            reason = DLOCK_LOST_TAKEN;
        } else {
            int64_t last = (int64_t)atomic_load(&lease->last_ok);
            if (now - last >= s->lease_ms) reason = DLOCK_LOST_UNREACHABLE;
            /* after a failure, try again sooner, and look again when
             * the lease would run out */
            int64_t next = now + period / 4 + 1;
            m->rnext_ms = next < last + s->lease_ms ? next : last + s->lease_ms;
        }
        if (reason) {
            atomic_store(&lease->lost, 1);
            for (my_lock **p = &mc->rhead; *p; p = &(*p)->rnext)
                if (*p == m) {
                    *p = m->rnext;
                    break;
                }
            m->reg = 0;
            m->rnext = NULL;
            if (lease->on_lost) lease->on_lost(lease, reason);
        }
    }
    free(snap);
    return dl_now_ms(); /* look at the due times again */
}

void dl_my_renewer_init(my_client *mc) {
    dl_renewer_init(&mc->renewer, &mc->rmu, renew_round, renew_enter, renew_leave, mc);
}

/* Registers (or re-registers, with a new lease) ml for renewal; t0 is the
 * monotonic ms at which the lease last surely started. */
static int renew_on(my_client *mc, my_lock *ml, int64_t lease_ms, int64_t t0, dl_err *err) {
    pthread_mutex_lock(&mc->rmu);
    int rc = dl_renewer_start(&mc->renewer, "the lease renewal thread", err);
    if (!rc) {
        if (!ml->reg) {
            ml->rnext = mc->rhead;
            mc->rhead = ml;
            ml->reg = 1;
        }
        ml->rseq = ++mc->rseq;
        ml->rlease_ms = lease_ms;
        ml->rnext_ms = t0 + (lease_ms / 3 > 1 ? lease_ms / 3 : 1);
        atomic_store(&ml->l->lease.last_ok, (long long)t0);
        dl_renewer_wake(&mc->renewer);
    }
    pthread_mutex_unlock(&mc->rmu);
    return rc;
}

static int table_registered(my_client *mc, my_lock *ml) {
    pthread_mutex_lock(&mc->rmu);
    int r = ml->reg;
    pthread_mutex_unlock(&mc->rmu);
    return r;
}

/* Is the hold still ours (row with our token, not expired)? */
static int table_held(my_client *mc, my_lock *ml, int *held, dl_err *err) {
    char sql[512 + sizeof ml->hex + sizeof ml->tokhex];
    snprintf(sql, sizeof sql,
             "SELECT COUNT(*) FROM dlock_locks WHERE name = x'%s' AND token = x'%s' AND "
             "expires_at >= " MY_NOW_US,
             ml->hex, ml->tokhex);
    long long v = 0;
    int isnull = 1;
    pthread_mutex_lock(&mc->mu);
    int rc = DLOCK_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!mc->db && (rc = dl_my_connect(mc, &mc->db, err))) break;
        int broken = 0;
        rc = dl_my_query(mc->db, sql, dl_deadline(mc->cmd_ms), 1, &v, &isnull, &broken, err);
        if (!rc || !broken) break;
        dl_my_close_db(&mc->db);
    }
    pthread_mutex_unlock(&mc->mu);
    *held = !rc && !isnull && v > 0;
    return rc;
}

static void table_mark_lost(my_client *mc, my_lock *ml) {
    dl_my_renew_off(mc, ml);
    atomic_store(&ml->l->lease.lost, 1);
}

/* dl_my_table_acquire's attempts, with naps between them, until one takes the
 * lock (*got), or the wait ends. */
static int table_wait(dlock_lock *l, dl_cancel *cx, int64_t wait_ms, int64_t lease, int reenter,
                      int *got, uint64_t *fence, int64_t *t0, dl_err *err) {
    my_lock *ml = l->h.backend_state;
    my_client *mc = l->h.c->backend_client;
    char nb[80];
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE : dl_deadline(wait_ms);
    int64_t backoff = MY_BACKOFF_MIN_MS;
    int retries = 0;
    for (;;) {
        *t0 = dl_now_ms();
        pthread_mutex_lock(&mc->mu);
        int tr = 0;
        int rc = table_try(mc, ml, lease, got, fence, &tr, err);
        pthread_mutex_unlock(&mc->mu);
        if (rc && tr) { /* deadlock between acquirers: again, then count it as busy */
            if (retries++ < MY_TRY_RETRIES) continue;
            if (reenter) return rc;
            rc = DLOCK_OK;
            *got = 0;
        }
        if (rc) return rc;
        if (*got) return DLOCK_OK;
        if (reenter) {
            table_mark_lost(mc, ml);
            return dl_seterr(err, DLOCK_ELOST,
                             "re-entry: lock '%s' is no longer held by this handle (lease "
                             "expired or taken over)",
                             dl_my_name_msg(l, nb, sizeof nb));
        }
        if (wait_ms == 0)
            return dl_seterr(err, DLOCK_EBUSY, "lock '%s' is held by another owner",
                             dl_my_name_msg(l, nb, sizeof nb));
        int64_t now = dl_now_ms();
        if (deadline != DL_INF_DEADLINE && now >= deadline)
            return dl_seterr(err, DLOCK_ETIMEDOUT, "lock '%s' not acquired within %lld ms",
                             dl_my_name_msg(l, nb, sizeof nb), (long long)wait_ms);
        /* no notification in this mode: poll, with jitter, up to the deadline */
        int64_t nap = backoff / 2 + (int64_t)dl_random_below((uint64_t)(backoff / 2 + 1));
        if (deadline != DL_INF_DEADLINE && nap > deadline - now) nap = deadline - now;
        if (!cx) dl_sleep_ms(nap);
        else if (dl_cancel_nap(cx, nap)) return dl_cancel_err(l, err);
        backoff = backoff * 2 > MY_BACKOFF_MAX_MS ? MY_BACKOFF_MAX_MS : backoff * 2;
        retries = 0;
    }
}

int dl_my_table_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                        dl_err *err) {
    my_lock *ml = l->h.backend_state;
    my_client *mc = l->h.c->backend_client;
    int reenter = l->holds > 0;
    int64_t lease = lease_ms == DLOCK_WATCHDOG ? l->h.c->watchdog_lease_ms : lease_ms;
    if (!reenter) {
        /* a new hold: owner "<client id>:<thread id>:<128 random bits>" */
        dl_my_renew_off(mc, ml);
        char rnd[33];
        int rc = dl_random_hex(rnd, 16, err);
        if (rc) return rc;
        int k = snprintf(l->token + l->token_len, sizeof l->token - l->token_len, ":%s", rnd);
        if (k < 0 || (size_t)k >= sizeof l->token - l->token_len)
            return dl_seterr(err, DLOCK_EINVAL, "owner token too long");
        l->token_len += (size_t)k;
        to_hex(l->token, l->token_len, ml->tokhex);
    }
    int64_t t0 = 0;
    int got = 0;
    uint64_t fence = 0;
    /* dlock_lock_cancel ends the naps between attempts */
    dl_cancel *cx = wait_ms != 0 && !reenter ? &l->h.cancel : NULL;
    if (cx) dl_cancel_begin(cx);
    int rc = table_wait(l, cx, wait_ms, lease, reenter, &got, &fence, &t0, err);
    if (cx) dl_cancel_end(cx);
    if (rc) return rc;
    t->acquired = 1;
    t->fence = fence;
    t->count = l->holds + 1;
    t->pttl = -1;
    if (lease_ms == DLOCK_WATCHDOG) {
        rc = renew_on(mc, ml, lease, t0, err);
        if (rc) {
            if (!reenter) { /* give the row back; best effort */
                char sql[512 + sizeof ml->hex + sizeof ml->tokhex];
                snprintf(sql, sizeof sql, "DELETE FROM dlock_locks WHERE name = x'%s' AND token = x'%s'",
                         ml->hex, ml->tokhex);
                dl_err e2 = {0};
                pthread_mutex_lock(&mc->mu);
                dl_my_cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, NULL, &e2);
                pthread_mutex_unlock(&mc->mu);
            }
            return rc;
        }
        /* renewed while the client lives; dlock_lock_is_lost (and a
         * valid_ms of 0) tells when renewal failed */
        l->expires_at = INT64_MAX;
    } else {
        dl_my_renew_off(mc, ml);
        l->expires_at = t0 + lease;
    }
    return DLOCK_OK;
}

int dl_my_table_release(dlock_lock *l, long long *res, dl_err *err) {
    my_lock *ml = l->h.backend_state;
    my_client *mc = l->h.c->backend_client;
    *res = -1;
    if (l->holds > 1) { /* re-entered: counted by the handle; still ours? */
        int held = 0;
        int rc = table_held(mc, ml, &held, err);
        if (rc) return rc;
        if (!held) table_mark_lost(mc, ml);
        *res = held ? 0 : -1;
        return DLOCK_OK;
    }
    int was = table_registered(mc, ml);
    dl_my_renew_off(mc, ml); /* else a renewal after the delete would call it lost */
    char sql[512 + sizeof ml->hex + sizeof ml->tokhex];
    snprintf(sql, sizeof sql,
             "DELETE FROM dlock_locks WHERE name = x'%s' AND token = x'%s' AND expires_at >= "
             MY_NOW_US,
             ml->hex, ml->tokhex);
    long long n = 0;
    pthread_mutex_lock(&mc->mu);
    int rc = dl_my_cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), &n, NULL, err);
    if (!rc && n == 0) { /* expired: remove our stale row, if nobody took it */
        dl_err e2 = {0};
        snprintf(sql, sizeof sql, "DELETE FROM dlock_locks WHERE name = x'%s' AND token = x'%s'",
                 ml->hex, ml->tokhex);
        dl_my_cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, NULL, &e2);
    }
    pthread_mutex_unlock(&mc->mu);
    if (rc) {
        if (was) {
            dl_err e2 = {0};
            renew_on(mc, ml, l->lease_ms, (int64_t)atomic_load(&l->lease.last_ok), &e2);
        }
        return rc;
    }
    *res = n > 0 ? 1 : -1;
    return DLOCK_OK;
}

int dl_my_table_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err) {
    my_lock *ml = l->h.backend_state;
    my_client *mc = l->h.c->backend_client;
    *res = 0;
    int was = table_registered(mc, ml);
    dl_my_renew_off(mc, ml); /* a fixed lease from now on, as on Redis */
    char sql[512 + sizeof ml->hex + sizeof ml->tokhex];
    snprintf(sql, sizeof sql,
             "UPDATE dlock_locks SET expires_at = " MY_NOW_US " + %lld WHERE name = x'%s' AND "
             "token = x'%s' AND expires_at >= " MY_NOW_US,
             (long long)lease_ms * 1000, ml->hex, ml->tokhex);
    long long matched = 0;
    pthread_mutex_lock(&mc->mu);
    int rc = dl_my_cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, &matched, err);
    pthread_mutex_unlock(&mc->mu);
    if (rc) {
        if (was) {
            dl_err e2 = {0};
            renew_on(mc, ml, l->lease_ms, (int64_t)atomic_load(&l->lease.last_ok), &e2);
        }
        return rc;
    }
    *res = matched > 0 ? 1 : 0;
    if (!*res) atomic_store(&l->lease.lost, 1);
    return DLOCK_OK;
}

int dl_my_table_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    my_lock *ml = l->h.backend_state;
    my_client *mc = l->h.c->backend_client;
    int rc = table_held(mc, ml, held, err);
    if (rc) return rc;
    if (!*held) table_mark_lost(mc, ml);
    *count = *held ? l->holds : 0;
    return DLOCK_OK;
}

int dl_my_table_inspect(dlock_client *c, const char *hex, dlock_info *info, dl_err *err) {
    char sql[1024 + 4 * MY_KEY_MAX];
    snprintf(sql, sizeof sql,
             "SELECT l.token, l.expires_at - " MY_NOW_US ", (SELECT n FROM dlock_fence f WHERE "
             "f.name = x'%s'), l.kind FROM (SELECT 1) AS one LEFT JOIN dlock_locks l ON l.name = x'%s' "
             "AND l.expires_at >= " MY_NOW_US,
             hex, hex);
    my_row row;
    int rc = dl_my_client_row(c, sql, &row, err);
    if (rc) return rc;
    if (!row.present) return dl_seterr(err, DLOCK_EPROTO, "the server answered no rows");
    info->exists = !row.isnull[0];
    info->fence = row.isnull[2] ? 0 : strtoull(row.v[2], NULL, 10);
    if (info->exists) {
        long long us = strtoll(row.v[1], NULL, 10);
        info->ttl_ms = us <= 0 ? 0 : (us + 999) / 1000;
        info->holders = 1;
        info->hold_count = 1; /* re-entries are counted by the holder's handle */
        info->kind = row.isnull[3] ? 0 : atoi(row.v[3]);
        snprintf(info->holder, sizeof info->holder, "%.159s", row.v[0]);
    } else {
        info->ttl_ms = -2;
    }
    return DLOCK_OK;
}
