/* etcd lock handles: acquire (one transaction), release (one delete), extend, check. (The design: etcd_backend.h.) */
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

/* ---- lock handles ---- */

int dl_etcd_lock_init(dlock_lock *l, dl_err *err) {
    etcd_lock *el = calloc(1, sizeof *el);
    if (!el) return OOM(err);
    l->h.backend_state = el;
    el->l = l;
    atomic_init(&el->lost, 0);
    el->reader = l->kind == DLOCK_KIND_READ;
    el->kn = atomic_fetch_add(&((etcd_client *)l->h.c->backend_client)->seq, 1);
    el->prefix = dl_etcd_name_prefix(l->h.name, l->h.name_len, NULL, &el->prefix_len);
    el->wprefix = dl_etcd_name_prefix(l->h.name, l->h.name_len, "w/", &el->wprefix_len);
    el->curl = curl_easy_init();
    if (!el->prefix || !el->wprefix || !el->curl) return OOM(err);
    return DLOCK_OK;
}

void dl_etcd_lock_destroy(dlock_lock *l) {
    etcd_lock *el = l->h.backend_state;
    if (!el) return;
    dl_etcd_ka_del(l->h.c->backend_client, el);
    if (el->curl) curl_easy_cleanup(el->curl);
    free(el->prefix);
    free(el->wprefix);
    free(el->key);
    free(el);
    l->h.backend_state = NULL;
}

/* Creates el's key under lease id (when absent) and reads the holder, in one
 * txn, the acquire's only request when uncontended: *owner 1 when the new key
 * is the oldest. Sets el->key and el->rev (the txn's revision: the fencing
 * token). The key is "<w|r>/<lease, 16 hex>", and for a session hold
 * "-<el->kn, hex>" after it: unique in the client per handle, not per hold,
 * so that a handle's holds on one session reuse one key. etcd keeps an index
 * entry for every key ever created until a compaction, and a range over the
 * prefix (the holder's read) visits them all: a new key per hold would make
 * every acquire on a name slower with each hold since the last compaction
 * (none by default). *nolease: etcd refused the lease as not found (it
 * expired or was revoked). */
static int put_and_own1(etcd_client *ec, etcd_lock *el, long long id, int *owner, int *nolease,
                        int *exists, dl_err *err);

int dl_etcd_put_and_own(etcd_client *ec, etcd_lock *el, long long id, int *owner, int *nolease,
                        dl_err *err) {
    *owner = 0;
    *nolease = 0;
    for (int tries = 0;; tries++) {
        int exists = 0;
        int rc = put_and_own1(ec, el, id, owner, nolease, &exists, err);
        if (rc || !exists) return rc;
        /* a key of this name is there: left by an earlier attempt of this
         * handle whose delete (best effort) failed. Not reused, as it may
         * stand anywhere in the queue: the handle takes another number. */
        if (tries == 2) return dl_seterr(err, DLOCK_EPROTO, "etcd: lock txn: the key exists");
        el->kn = atomic_fetch_add(&ec->seq, 1);
    }
}

static int put_and_own1(etcd_client *ec, etcd_lock *el, long long id, int *owner, int *nolease,
                        int *exists, dl_err *err) {
    dlock_lock *l = el->l;
    free(el->key);
    char tail[48];
    int tn = el->session ? snprintf(tail, sizeof tail, "%c/%016llx-%llx", el->reader ? 'r' : 'w',
                                    (unsigned long long)id, el->kn)
                         : snprintf(tail, sizeof tail, "%c/%016llx", el->reader ? 'r' : 'w',
                                    (unsigned long long)id);
    el->key_len = el->prefix_len + (size_t)tn;
    if (!(el->key = malloc(el->key_len + 1))) return OOM(err);
    memcpy(el->key, el->prefix, el->prefix_len);
    memcpy(el->key + el->prefix_len, tail, (size_t)tn + 1);
    cJSON *q = cJSON_CreateObject();
    cJSON *cmp = q ? cJSON_AddArrayToObject(q, "compare") : NULL;
    cJSON *succ = q ? cJSON_AddArrayToObject(q, "success") : NULL;
    cJSON *c1 = cJSON_CreateObject(), *o1 = cJSON_CreateObject(), *o2 = cJSON_CreateObject();
    cJSON *put = o1 ? cJSON_AddObjectToObject(o1, "request_put") : NULL;
    cJSON *rng = o2 ? cJSON_AddObjectToObject(o2, "request_range") : NULL;
    int ok = cmp && succ && c1 && put && rng && dl_etcd_add_b64(c1, "key", el->key, el->key_len) &&
             dl_etcd_add_str(c1, "target", "CREATE") && dl_etcd_add_ll(c1, "create_revision", 0) &&
             dl_etcd_add_b64(put, "key", el->key, el->key_len) &&
             dl_etcd_add_b64(put, "value", l->token, l->token_len) && dl_etcd_add_ll(put, "lease", id) &&
             (el->reader ? dl_etcd_add_prefix_range(rng, el->wprefix, el->wprefix_len)
                         : dl_etcd_add_prefix_range(rng, el->prefix, el->prefix_len)) &&
             dl_etcd_add_str(rng, "sort_order", "ASCEND") && dl_etcd_add_str(rng, "sort_target", "CREATE") &&
             dl_etcd_add_ll(rng, "limit", 1) && cJSON_AddTrueToObject(rng, "keys_only");
    if (!ok) {
        cJSON_Delete(c1);
        cJSON_Delete(o1);
        cJSON_Delete(o2);
        cJSON_Delete(q);
        return OOM(err);
    }
    cJSON_AddItemToArray(cmp, c1);
    cJSON_AddItemToArray(succ, o1);
    cJSON_AddItemToArray(succ, o2);
    cJSON *r = NULL;
    int gcode = 0;
    int rc = dl_etcd_rpc(ec, el->curl, "/v3/kv/txn", q, dl_etcd_req_timeout(ec), &r, &gcode, err);
    if (rc) return rc;
    if (gcode) {
        const char *m = dl_etcd_jstr(r, "message");
        *nolease = gcode == 5 && m && strstr(m, "lease not found");
        rc = dl_seterr(err,
                       gcode == 16 || gcode == 7   ? DLOCK_EAUTH
                       : gcode == 14 || gcode == 4 ? DLOCK_EIO
                                                   : DLOCK_ESERVER,
                       "etcd: /v3/kv/txn: %s (code %d)", m ? m : "error", gcode);
        cJSON_Delete(r);
        return rc;
    }
    if (!cJSON_IsTrue(dl_etcd_jobj(r, "succeeded"))) {
        *exists = 1;
        cJSON_Delete(r);
        return DLOCK_OK;
    }
    cJSON *resps = dl_etcd_jobj(r, "responses");
    cJSON *pr = dl_etcd_jobj(cJSON_GetArrayItem(resps, 0), "response_put");
    cJSON *rr = dl_etcd_jobj(cJSON_GetArrayItem(resps, 1), "response_range");
    cJSON *kvs = dl_etcd_jobj(rr, "kvs");
    cJSON *kv = cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
    el->rev = dl_etcd_jnum(dl_etcd_jobj(pr, "header"), "revision");
    if (!pr || !rr || (!kv && !el->reader) || el->rev <= 0) {
        cJSON_Delete(r);
        return dl_seterr(err, DLOCK_EPROTO, "etcd: lock txn: unexpected answer");
    }
    /* exclusive: ours is the oldest key; read: no older exclusive key */
    *owner = el->reader ? !kv || dl_etcd_jnum(kv, "create_revision") > el->rev
                        : dl_etcd_jnum(kv, "create_revision") == el->rev;
    cJSON_Delete(r);
    return DLOCK_OK;
}

/* Deletes el's key, when its create revision is still el->rev (best effort). */
static void key_drop(etcd_client *ec, etcd_lock *el) {
    int done = 0;
    dl_err e = {0};
    dl_etcd_txn_if(ec, el->curl, el->key, el->key_len, "CREATE", el->rev, NULL, 0, 0, &done, &e);
}

/* Gives up an attempt: a session attempt deletes its key, an attempt with a
 * lease of its own revokes the lease (which deletes the key). */
static void attempt_drop(etcd_client *ec, etcd_lock *el, long long id) {
    if (el->session) {
        if (el->rev > 0) key_drop(ec, el);
    } else {
        dl_etcd_lease_revoke(ec, el->curl, id);
    }
}

int dl_etcd_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                    dl_err *err) {
    etcd_client *ec = l->h.c->backend_client;
    etcd_lock *el = l->h.backend_state;
    char nm[80];
    dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm);
    if (l->holds > 0) {
        /* re-entry of a reentrant handle: counted here */
        if (atomic_load(&el->lost))
            return dl_seterr(err, DLOCK_ELOST, "lock '%s': its etcd lease was lost", nm);
        t->acquired = 1;
        t->fence = l->fence;
        t->count = l->holds + 1;
        return DLOCK_OK;
    }
    int wd = lease_ms == DLOCK_WATCHDOG;
    int64_t ttl = wd ? ec->wd_ttl_s : dl_etcd_lease_secs(lease_ms);
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE : dl_deadline(wait_ms);
    atomic_store(&el->lost, 0);
    el->session = wd;
    int nolease_tries = 0;
    for (;;) {
        long long id = 0;
        int64_t granted = 0;
        int64_t t0 = dl_now_ms(); /* the lease surely runs from no earlier */
        el->rev = 0;
        /* DLOCK_WATCHDOG: the client's session lease (granted once, kept alive
         * by the keep-alive thread); else a lease of this hold's own */
        int rc = wd ? dl_etcd_sess_get(ec, el->curl, &id, &granted, err)
                    : dl_etcd_lease_grant(ec, el->curl, ttl, &id, &granted, err);
        if (rc) return rc;
        int owner = 0, nolease = 0;
        rc = dl_etcd_put_and_own(ec, el, id, &owner, &nolease, err);
        if (rc) {
            if (wd && nolease && nolease_tries++ < 3) {
                dl_etcd_sess_drop(ec, id); /* the session expired: its holds are lost */
                continue;
            }
            if (!wd) dl_etcd_lease_revoke(ec, el->curl, id);
            return rc;
        }
        int waited = 0, gone = 0;
        long long seen_rev = 0;
        while (!owner && !gone) {
            if (wait_ms == 0) {
                attempt_drop(ec, el, id);
                return dl_seterr(err, DLOCK_EBUSY, "lock '%s' is held by another owner", nm);
            }
            int64_t left = deadline == DL_INF_DEADLINE ? INT64_MAX : deadline - dl_now_ms();
            if (left <= 0) {
                attempt_drop(ec, el, id);
                return dl_seterr(err, DLOCK_ETIMEDOUT, "lock '%s' not acquired within %lld ms",
                                 nm, (long long)wait_ms);
            }
            waited = 1;
            /* the newest key older than ours (read: the newest exclusive one) */
            cJSON *resp = NULL, *kv = NULL;
            long long hrev = 0;
            rc = el->reader ? dl_etcd_get_owner(ec, el->curl, el->wprefix, el->wprefix_len, el->rev - 1,
                                        1, 0, &resp, &kv, &hrev, err)
                            : dl_etcd_get_owner(ec, el->curl, el->prefix, el->prefix_len, el->rev - 1,
                                        1, 0, &resp, &kv, &hrev, err);
            if (rc) {
                attempt_drop(ec, el, id);
                return rc;
            }
            if (!kv) {
                cJSON_Delete(resp);
                /* read back our key: its lease may have run out meanwhile
                 * (after a wait only, as etcd's own Mutex does: the
                 * uncontended txn put it and read the holder atomically) */
                long long crev = 0;
                rc = dl_etcd_key_state(ec, el->curl, el, &crev, NULL, &seen_rev, err);
                if (rc) {
                    attempt_drop(ec, el, id);
                    return rc;
                }
                if (crev == el->rev) owner = 1;
                else gone = 1;
                break;
            }
            int64_t slice = granted * 1000 / 3;
            if (slice > left) slice = left;
            const char *pkey = dl_etcd_jstr(kv, "key");
            char *pk = pkey ? strdup(pkey) : NULL;
            cJSON_Delete(resp);
            if (!pk) {
                attempt_drop(ec, el, id);
                return pkey ? OOM(err) : dl_seterr(err, DLOCK_EPROTO, "etcd: range: no key");
            }
            dl_cancel_begin(&l->h.cancel);
            rc = dl_etcd_watch_keys(ec, el->curl, pk, NULL, 1, hrev + 1, slice, &l->h.cancel, err);
            dl_cancel_end(&l->h.cancel);
            free(pk);
            if (rc == DLOCK_ECANCELED) {
                attempt_drop(ec, el, id);
                return dl_cancel_err(l, err);
            }
            int alive = 1;
            /* the session lease is kept alive by the keep-alive thread; an
             * attempt's own lease by the waiter */
            if (!rc && !wd) rc = dl_etcd_lease_keepalive(ec, el->curl, id, &alive, err);
            if (rc) {
                attempt_drop(ec, el, id);
                return rc;
            }
            if (!alive) gone = 1;
        }
        if (gone) {
            attempt_drop(ec, el, id);
            continue; /* our key went with its lease: start over */
        }
        if (waited && !wd) {
            /* the lease runs from now */
            t0 = dl_now_ms();
            int alive = 1;
            rc = dl_etcd_lease_keepalive(ec, el->curl, id, &alive, err);
            if (!rc && !alive) {
                dl_etcd_lease_revoke(ec, el->curl, id);
                continue;
            }
            if (rc) {
                dl_etcd_lease_revoke(ec, el->curl, id);
                return rc;
            }
        }
        el->lease = id;
        el->ttl_s = granted;
        if (wd) {
            int stale = 0;
            /* the key was ours when the txn put it, or when read back */
            el->wfrom = waited && seen_rev > el->rev ? seen_rev : el->rev;
            rc = dl_etcd_ka_add(ec, el, &stale, err);
            if (rc) {
                key_drop(ec, el);
                return rc;
            }
            if (stale) continue; /* our key went (the session ended, or deleted or replaced) */
            l->expires_at = INT64_MAX;
        } else {
            l->expires_at = t0 + granted * 1000;
        }
        t->acquired = 1;
        t->fence = (uint64_t)el->rev;
        t->count = 1;
        return DLOCK_OK;
    }
}

/* One guarded delete; an explicit lease is revoked after it (a session
 * lease stays: other holds ride on it). */
int dl_etcd_release(dlock_lock *l, long long *res, dl_err *err) {
    etcd_client *ec = l->h.c->backend_client;
    etcd_lock *el = l->h.backend_state;
    if (l->holds > 1) {
        *res = atomic_load(&el->lost) ? -1 : 0;
        return DLOCK_OK;
    }
    int kept = dl_etcd_ka_del(ec, el);
    if (atomic_load(&el->lost)) {
        if (!el->session) dl_etcd_lease_revoke(ec, el->curl, el->lease);
        *res = -1;
        return DLOCK_OK;
    }
    int deleted = 0;
    int rc = dl_etcd_txn_if(ec, el->curl, el->key, el->key_len, "CREATE", el->rev, NULL, 0, 0, &deleted,
                    err);
    if (rc) {
        dl_err e2 = {0};
        if (kept) dl_etcd_ka_add(ec, el, NULL, &e2);
        return rc;
    }
    if (!el->session) dl_etcd_lease_revoke(ec, el->curl, el->lease);
    *res = deleted ? 1 : -1;
    return DLOCK_OK;
}

int dl_etcd_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err) {
    etcd_client *ec = l->h.c->backend_client;
    etcd_lock *el = l->h.backend_state;
    *res = 0;
    if (atomic_load(&el->lost)) return DLOCK_OK;
    long long id = 0;
    int64_t granted = 0;
    int64_t t0 = dl_now_ms();
    int rc = dl_etcd_lease_grant(ec, el->curl, dl_etcd_lease_secs(lease_ms), &id, &granted, err);
    if (rc) return rc;
    /* off the keep-alive list first: its key check must not take the move
     * to the new lease for a foreign put */
    int kept = dl_etcd_ka_del(ec, el);
    int moved = 0;
    rc = dl_etcd_txn_if(ec, el->curl, el->key, el->key_len, "CREATE", el->rev, l->token, l->token_len, id,
                &moved, err);
    if (rc) {
        dl_etcd_lease_revoke(ec, el->curl, id);
        dl_err e2 = {0};
        if (kept) dl_etcd_ka_add(ec, el, NULL, &e2);
        return rc;
    }
    if (!moved) {
        dl_etcd_lease_revoke(ec, el->curl, id);
        atomic_store(&el->lost, 1);
        return DLOCK_OK;
    }
    /* an explicit lease from now on */
    if (!el->session) dl_etcd_lease_revoke(ec, el->curl, el->lease);
    el->session = 0;
    el->lease = id;
    el->ttl_s = granted;
    l->expires_at = t0 + granted * 1000;
    *res = 1;
    return DLOCK_OK;
}

int dl_etcd_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    etcd_client *ec = l->h.c->backend_client;
    etcd_lock *el = l->h.backend_state;
    *held = 0;
    *count = 0;
    if (atomic_load(&el->lost)) return DLOCK_OK;
    long long crev = 0, lease = 0;
    int rc = dl_etcd_key_state(ec, el->curl, el, &crev, &lease, NULL, err);
    if (rc) return rc;
    if (crev == el->rev && lease == el->lease) {
        *held = 1;
        *count = l->holds;
    } else {
        atomic_store(&el->lost, 1);
        atomic_store(&l->lease.lost, 1);
        dl_etcd_ka_del(ec, el);
    }
    return DLOCK_OK;
}
