/* etcd leases, the session lease of the watchdog holds, and the keep-alive thread. (The design: etcd_backend.h.) */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "etcd_backend.h"

/* ---- leases ---- */


/* lease_ms rounded up to whole seconds, at most etcd's largest TTL. */
int64_t dl_etcd_lease_secs(int64_t lease_ms) {
    int64_t s = lease_ms / 1000 + (lease_ms % 1000 != 0);
    return s > ETCD_MAX_TTL_S ? ETCD_MAX_TTL_S : s;
}

int dl_etcd_lease_grant(etcd_client *ec, CURL *h, int64_t ttl_s, long long *id, int64_t *granted,
                        dl_err *err) {
    cJSON *q = cJSON_CreateObject();
    if (!q || !dl_etcd_add_ll(q, "TTL", ttl_s)) {
        cJSON_Delete(q);
        return OOM(err);
    }
    cJSON *r = NULL;
    int rc = dl_etcd_rpc(ec, h, "/v3/lease/grant", q, dl_etcd_req_timeout(ec), &r, NULL, err);
    if (rc) return rc;
    *id = dl_etcd_jnum(r, "ID");
    *granted = dl_etcd_jnum(r, "TTL");
    const char *e = dl_etcd_jstr(r, "error");
    if (!*id || *granted <= 0) {
        rc = dl_seterr(err, DLOCK_ESERVER, "etcd: lease grant: %s", e && *e ? e : "no lease");
    }
    cJSON_Delete(r);
    return rc;
}

/* Best effort. */
void dl_etcd_lease_revoke(etcd_client *ec, CURL *h, long long id) {
    cJSON *q = cJSON_CreateObject();
    if (!q || !dl_etcd_add_ll(q, "ID", id)) {
        cJSON_Delete(q);
        return;
    }
    cJSON *r = NULL;
    int gcode = 0;
    dl_err e = {0};
    if (!dl_etcd_rpc(ec, h, "/v3/lease/revoke", q, dl_etcd_req_timeout(ec), &r, &gcode, &e)) cJSON_Delete(r);
}

/* One keep-alive: *alive 1 (TTL renewed), 0 (the lease is gone). */
int dl_etcd_lease_keepalive(etcd_client *ec, CURL *h, long long id, int *alive, dl_err *err) {
    cJSON *q = cJSON_CreateObject();
    if (!q || !dl_etcd_add_ll(q, "ID", id)) {
        cJSON_Delete(q);
        return OOM(err);
    }
    cJSON *r = NULL;
    int gcode = 0;
    int rc = dl_etcd_rpc(ec, h, "/v3/lease/keepalive", q, dl_etcd_req_timeout(ec), &r, &gcode, err);
    if (rc) return rc;
    if (gcode) {
        *alive = 0;
        if (gcode != 5) {
            const char *m = dl_etcd_jstr(r, "message");
            rc = dl_seterr(err, DLOCK_ESERVER, "etcd: keep-alive: %s", m ? m : "error");
        }
    } else {
        *alive = dl_etcd_jnum(dl_etcd_jobj(r, "result"), "TTL") > 0;
    }
    cJSON_Delete(r);
    return rc;
}

/* ---- the keep-alive thread ---- */





/* The keep-alive thread's round (renewer.c; called under ka_mu): every third of the watchdog TTL, one keep-alive of
 * the session lease (while there is one) and one per entry holding a lease of
 * its own (semaphore acquisitions). A session lease found gone is dropped, and
 * every session hold whose lease is not the current session lease is lost: all
 * the holds of a lost session at once. Then one txn of compares (dl_etcd_ka_check)
 * finds a kept hold's key put again by another client in place (its lease or
 * create_revision changed): the client's watch sees deletions only (NOPUT:
 * its own puts would come back as events on every acquire), so such a put is
 * noticed here, within one round. */
static int64_t ka_round(void *arg) {
    etcd_client *ec = arg;
    CURL *h = ec->ka_curl;
    int64_t period = ec->wd_ttl_s * 1000 / 3;
    if (period < 200) period = 200;
    {
        long long sess = ec->sess;
        size_t n = 0;
        for (etcd_lock *el = ec->ka_list; el; el = el->next) n += !el->session;
        long long *ids = n ? malloc(n * sizeof *ids) : NULL;
        size_t k = 0;
        if (ids)
            for (etcd_lock *el = ec->ka_list; el; el = el->next)
                if (!el->session) ids[k++] = el->lease;
        pthread_mutex_unlock(&ec->ka_mu);
        int sess_gone = 0;
        if (sess && h) {
            int alive = 1;
            dl_err e = {0};
            sess_gone = !dl_etcd_lease_keepalive(ec, h, sess, &alive, &e) && !alive;
        }
        for (size_t i = 0; i < k && h; i++) {
            int alive = 1;
            dl_err e = {0};
            if (dl_etcd_lease_keepalive(ec, h, ids[i], &alive, &e) || alive) {
                ids[i] = 0; /* renewed, or unknown (try again next round) */
            }
        }
        /* the kept lock holds' keys, copied, checked without the lock: one
         * txn of compares, no write */
        pthread_mutex_lock(&ec->ka_mu);
        size_t ns = 0;
        for (etcd_lock *el = ec->ka_list; el; el = el->next) ns += el->l && el->rev > 0;
        ka_seen *seen = ns && !sess_gone ? calloc(ns, sizeof *seen) : NULL;
        size_t m = 0;
        for (etcd_lock *el = ec->ka_list; el && seen; el = el->next) {
            if (!el->l || el->rev <= 0) continue;
            char *kc = malloc(el->key_len);
            if (!kc) continue;
            memcpy(kc, el->key, el->key_len);
            seen[m++] = (ka_seen){el, kc, el->key_len, el->rev, el->lease, 0};
        }
        pthread_mutex_unlock(&ec->ka_mu);
        long long crev = 0;
        int checked = m && h && dl_etcd_ka_check(ec, h, seen, m, &crev) == 0;
        pthread_mutex_lock(&ec->ka_mu);
        if (sess_gone && ec->sess == sess) ec->sess = 0;
        for (etcd_lock *el = ec->ka_list, *next; el; el = next) {
            next = el->next;
            int lost = 0;
            if (el->session) {
                lost = el->lease != ec->sess;
            } else {
                for (size_t i = 0; i < k && !lost; i++) lost = ids[i] && ids[i] == el->lease;
            }
            /* the same hold (one acquisition: its key's revision) as checked */
            for (size_t i = 0; checked && i < m && !lost; i++)
                lost = seen[i].gone && seen[i].el == el && seen[i].rev == el->rev;
            if (lost) dl_etcd_ka_lost_locked(ec, el);
        }
        for (size_t i = 0; i < m; i++) free(seen[i].key);
        free(seen);
        free(ids);
    }
    return dl_now_ms() + period;
}

/* The keep-alive thread's own HTTP handle. */
static void ka_enter(void *arg) {
    etcd_client *ec = arg;
    ec->ka_curl = curl_easy_init();
}

static void ka_leave(void *arg) {
    etcd_client *ec = arg;
    if (ec->ka_curl) curl_easy_cleanup(ec->ka_curl);
    ec->ka_curl = NULL;
}

void dl_etcd_ka_init(etcd_client *ec) {
    dl_renewer_init(&ec->ka, &ec->ka_mu, ka_round, ka_enter, ka_leave, ec);
}

static int ka_start_locked(etcd_client *ec, dl_err *err) {
    return dl_renewer_start(&ec->ka, "the etcd keep-alive thread", err);
}


/* Adds el to the keep-alive list (a lock hold: to the client's watch too,
 * el->wfrom set). A session hold whose lease is no longer
 * the session lease (found gone meanwhile) is not added: *stale 1 (may be
 * NULL for the others). */
int dl_etcd_ka_add(etcd_client *ec, etcd_lock *el, int *stale, dl_err *err) {
    if (stale) *stale = 0;
    pthread_mutex_lock(&ec->ka_mu);
    int rc = ka_start_locked(ec, err);
    if (!rc && el->l) rc = dl_etcd_cw_start_locked(ec, err);
    if (!rc && el->session && el->lease != ec->sess) {
        if (stale) *stale = 1;
    } else if (!rc && !el->kept && el->l && dl_etcd_cw_admit_locked(ec, el)) {
        /* its key was deleted or replaced after wfrom, before it was kept */
        if (stale) {
            *stale = 1;
        } else {
            atomic_store(&el->lost, 1);
            atomic_store(&el->l->lease.lost, 1);
        }
    } else if (!rc && !el->kept) {
        el->next = ec->ka_list;
        ec->ka_list = el;
        el->kept = 1;
    }
    pthread_mutex_unlock(&ec->ka_mu);
    return rc;
}

/* The session lease, granted on h when there is none (one grant at a time);
 * the keep-alive thread runs from then on. */
int dl_etcd_sess_get(etcd_client *ec, CURL *h, long long *id, int64_t *ttl_s, dl_err *err) {
    pthread_mutex_lock(&ec->sess_mu);
    pthread_mutex_lock(&ec->ka_mu);
    long long cur = ec->sess;
    pthread_mutex_unlock(&ec->ka_mu);
    int rc = DLOCK_OK;
    int64_t granted = 0;
    if (!cur) {
        rc = dl_etcd_lease_grant(ec, h, ec->wd_ttl_s, &cur, &granted, err);
        if (!rc) {
            pthread_mutex_lock(&ec->ka_mu);
            rc = ka_start_locked(ec, err);
            if (!rc) {
                ec->sess = cur;
                ec->sess_ttl = granted;
            }
            pthread_mutex_unlock(&ec->ka_mu);
            if (rc) dl_etcd_lease_revoke(ec, h, cur);
        }
    }
    pthread_mutex_lock(&ec->ka_mu);
    *ttl_s = ec->sess_ttl;
    pthread_mutex_unlock(&ec->ka_mu);
    pthread_mutex_unlock(&ec->sess_mu);
    *id = cur;
    return rc;
}

/* The session lease id was found gone (a put under it refused): dropped, so
 * that the next watchdog acquire grants another; the keep-alive thread, woken,
 * marks its holds lost. */
void dl_etcd_sess_drop(etcd_client *ec, long long id) {
    pthread_mutex_lock(&ec->ka_mu);
    if (ec->sess == id) ec->sess = 0;
    dl_renewer_wake(&ec->ka);
    pthread_mutex_unlock(&ec->ka_mu);
}

