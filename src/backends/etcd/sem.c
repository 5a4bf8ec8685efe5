/* etcd semaphores. (The design: etcd_backend.h.) */
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

/* ---- semaphores ----
 * "dlock/sem/<len>/<name>/": the key "total" holds the total permits in
 * decimal (absent: unset), and each acquisition has one key "l/<lease id, 16
 * hex>" whose value is its permit count ("<k>", or "<k> held" once it got
 * them after waiting), put with a lease of its own (DLOCK_WATCHDOG TTL): kept
 * alive by the waiter while it waits and by the keep-alive thread while it
 * holds. FIFO as on ZooKeeper: an acquisition holds when the counts of the
 * keys created before its own, plus its own, fit the total, so holders are a
 * prefix of the queue (a large request at the head holds up smaller ones
 * behind it). Waiting without a herd: the first waiter watches the
 * semaphore's keys (a release, a new total, a newcomer); each waiter behind
 * another watches the key of the acquisition just ahead, which is re-put as
 * "<k> held" when it gets its permits after waiting, or deleted when it gives
 * up or its lease ends; a re-check every ETCD_SEM_RECHECK_MS covers holders
 * beyond a lowered total (they got in at once: unmarked). Permits are owned:
 * release(n) takes n from the handle's latest acquisitions (rewriting the
 * count, or deleting the key and revoking its lease), and is DLOCK_EINVAL
 * beyond what the handle holds; freeing the handle gives them back; a
 * holder that dies frees them when its lease runs out. A lease found gone
 * by the keep-alive thread runs the lost callback (DLOCK_LOST_TAKEN), and
 * release then says DLOCK_ELOST. */




int dl_etcd_sem_init(dl_object *o, dl_err *err) {
    etcd_sem *es = calloc(1, sizeof *es);
    if (!es) return OOM(err);
    o->h.backend_state = es;
    size_t plen = 0;
    char *prefix = dl_etcd_what_prefix("sem", o->h.name, o->h.name_len, NULL, &plen);
    if (prefix) {
        es->wkey = dl_etcd_b64_enc(prefix, plen);
        prefix[plen - 1]++; /* the range's end: '/' + 1 */
        es->wend = dl_etcd_b64_enc(prefix, plen);
        free(prefix);
    }
    es->lprefix = dl_etcd_what_prefix("sem", o->h.name, o->h.name_len, "l/", &es->lprefix_len);
    es->total = dl_etcd_what_prefix("sem", o->h.name, o->h.name_len, "total", &es->total_len);
    es->curl = curl_easy_init();
    if (!es->wkey || !es->wend || !es->lprefix || !es->total || !es->curl) return OOM(err);
    return DLOCK_OK;
}

static void acq_free(etcd_client *ec, etcd_sem *es, etcd_acq *a, int revoke) {
    dl_etcd_ka_del(ec, &a->ka);
    if (revoke) dl_etcd_lease_revoke(ec, es->curl, a->ka.lease);
    free(a->ka.key);
    free(a);
}

/* Freeing the handle gives its permits back. */
void dl_etcd_sem_destroy(dl_object *o) {
    etcd_sem *es = o->h.backend_state;
    if (!es) return;
    for (int i = 0; i < es->nacq; i++) acq_free(o->h.c->backend_client, es, es->acqs[i], 1);
    free(es->acqs);
    if (es->curl) curl_easy_cleanup(es->curl);
    free(es->lprefix);
    free(es->total);
    free(es->wkey);
    free(es->wend);
    free(es);
    o->h.backend_state = NULL;
}

/* A key's count ("<k>" or "<k> held"), *held set for the latter; -1 when
 * the value is not a count. */
static int64_t kv_count(const cJSON *kv, int *held) {
    char v[48];
    const char *b = dl_etcd_jstr(kv, "value");
    size_t n = b ? dl_etcd_b64_dec(b, v, sizeof v) : 0;
    char *end = NULL;
    long long k = n ? strtoll(v, &end, 10) : -1;
    if (held) *held = end && !strcmp(end, " held");
    return n && end != v && k >= 0 && (!*end || !strcmp(end, " held")) ? k : -1;
}

/* The semaphore at one revision: the total (0 unset) and the acquisitions'
 * keys in creation order (*kvs, in *resp). With put (not NULL): our key and
 * count are put first, in the same txn (lease id), and *rev is its create
 * revision. */
static int sem_state(etcd_client *ec, etcd_sem *es, const char *put, size_t put_len,
                     long long id, int64_t k, cJSON **resp, cJSON **kvs, int64_t *total,
                     long long *hrev, long long *rev, dl_err *err) {
    *resp = NULL;
    *kvs = NULL;
    *total = 0;
    char num[24];
    snprintf(num, sizeof num, "%lld", (long long)k);
    cJSON *q = cJSON_CreateObject();
    cJSON *succ = q ? cJSON_AddArrayToObject(q, "success") : NULL;
    cJSON *o0 = put ? cJSON_CreateObject() : NULL, *o1 = cJSON_CreateObject(),
          *o2 = cJSON_CreateObject();
    cJSON *pr = o0 ? cJSON_AddObjectToObject(o0, "request_put") : NULL;
    cJSON *r1 = o1 ? cJSON_AddObjectToObject(o1, "request_range") : NULL;
    cJSON *r2 = o2 ? cJSON_AddObjectToObject(o2, "request_range") : NULL;
    int ok = succ && r1 && r2 && (!put || pr) &&
             (!put || (dl_etcd_add_b64(pr, "key", put, put_len) && dl_etcd_add_b64(pr, "value", num, strlen(num)) &&
                       dl_etcd_add_ll(pr, "lease", id))) &&
             dl_etcd_add_prefix_range(r1, es->lprefix, es->lprefix_len) &&
             dl_etcd_add_str(r1, "sort_order", "ASCEND") && dl_etcd_add_str(r1, "sort_target", "CREATE") &&
             dl_etcd_add_b64(r2, "key", es->total, es->total_len);
    if (!ok) {
        cJSON_Delete(o0);
        cJSON_Delete(o1);
        cJSON_Delete(o2);
        cJSON_Delete(q);
        return OOM(err);
    }
    if (o0) cJSON_AddItemToArray(succ, o0);
    cJSON_AddItemToArray(succ, o1);
    cJSON_AddItemToArray(succ, o2);
    int rc = dl_etcd_rpc(ec, es->curl, "/v3/kv/txn", q, dl_etcd_req_timeout(ec), resp, NULL, err);
    if (rc) return rc;
    cJSON *resps = dl_etcd_jobj(*resp, "responses");
    int off = put ? 1 : 0;
    cJSON *lr = dl_etcd_jobj(cJSON_GetArrayItem(resps, off), "response_range");
    cJSON *tr = dl_etcd_jobj(cJSON_GetArrayItem(resps, off + 1), "response_range");
    *hrev = dl_etcd_jnum(dl_etcd_jobj(*resp, "header"), "revision");
    if (rev) *rev = *hrev; /* the put is this txn's only write */
    if (!lr || !tr) {
        cJSON_Delete(*resp);
        *resp = NULL;
        return dl_seterr(err, DLOCK_EPROTO, "etcd: semaphore txn: unexpected answer");
    }
    cJSON *tk = dl_etcd_jobj(tr, "kvs");
    cJSON *tkv = cJSON_IsArray(tk) ? cJSON_GetArrayItem(tk, 0) : NULL;
    if (tkv) {
        *total = kv_count(tkv, NULL);
        if (*total < 0) {
            cJSON_Delete(*resp);
            *resp = NULL;
            return dl_seterr(err, DLOCK_EPROTO, "etcd: the semaphore's total is not a number");
        }
    }
    *kvs = dl_etcd_jobj(lr, "kvs");
    return DLOCK_OK;
}

/* Where the acquisition with create revision rev stands: *mine 1 when it
 * fits (the counts up to it fit total), *present 0 when its key is gone;
 * *ahead the key of the acquisition just before it when that one does not
 * fit and is not marked held (else NULL: we are the first waiter). Returns
 * the permits held (the counts of the prefix that fits). */
static int64_t sem_place(const cJSON *kvs, int64_t total, long long rev, int *mine,
                         int *present, const cJSON **ahead) {
    int64_t sum = 0, held = 0;
    const cJSON *prev = NULL;
    int prev_fits = 1;
    *mine = *present = 0;
    if (ahead) *ahead = NULL;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, kvs) {
        int64_t k = kv_count(kv, NULL);
        if (k < 0) continue;
        sum += k;
        int fits = sum <= total;
        if (fits && prev_fits) held = sum;
        if (rev && dl_etcd_jnum(kv, "create_revision") == rev) {
            *present = 1;
            *mine = fits && prev_fits;
            if (ahead && prev && !prev_fits) *ahead = prev;
        }
        prev_fits = fits && prev_fits;
        prev = kv;
    }
    return held;
}

/* Re-puts a's key as "<k> held" (best effort): the waiter behind, which
 * watches it, wakes and becomes the first waiter. */
static void sem_mark(etcd_client *ec, etcd_sem *es, const etcd_acq *a) {
    char num[40];
    snprintf(num, sizeof num, "%lld held", (long long)a->k);
    cJSON *q = cJSON_CreateObject();
    if (!q || !dl_etcd_add_b64(q, "key", a->ka.key, a->ka.key_len) ||
        !dl_etcd_add_b64(q, "value", num, strlen(num)) || !dl_etcd_add_ll(q, "lease", a->ka.lease)) {
        cJSON_Delete(q);
        return;
    }
    cJSON *r = NULL;
    dl_err ignored = {0};
    if (!dl_etcd_rpc(ec, es->curl, "/v3/kv/put", q, dl_etcd_req_timeout(ec), &r, NULL, &ignored)) cJSON_Delete(r);
}

int dl_etcd_sem_acquire(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err) {
    etcd_client *ec = o->h.c->backend_client;
    etcd_sem *es = o->h.backend_state;
    char nm[80];
    dl_name_msg(o->h.name, o->h.name_len, nm, sizeof nm);
    if (es->nacq == es->cap) {
        int cap = es->cap ? es->cap * 2 : 4;
        etcd_acq **na = realloc(es->acqs, (size_t)cap * sizeof *na);
        if (!na) return OOM(err);
        es->acqs = na;
        es->cap = cap;
    }
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE : dl_deadline(wait_ms);
    for (;;) {
        long long id = 0;
        int64_t granted = 0;
        int rc = dl_etcd_lease_grant(ec, es->curl, ec->wd_ttl_s, &id, &granted, err);
        if (rc) return rc;
        etcd_acq *a = calloc(1, sizeof *a);
        if (a) a->ka.key = malloc(es->lprefix_len + 17);
        if (!a || !a->ka.key) {
            free(a);
            dl_etcd_lease_revoke(ec, es->curl, id);
            return OOM(err);
        }
        a->ka.sem = o;
        a->ka.lease = id;
        a->ka.ttl_s = granted;
        a->k = permits;
        atomic_init(&a->ka.lost, 0);
        memcpy(a->ka.key, es->lprefix, es->lprefix_len);
        snprintf(a->ka.key + es->lprefix_len, 17, "%016llx", (unsigned long long)id);
        a->ka.key_len = es->lprefix_len + 16;
        int waited = 0, gone = 0;
        const char *put = a->ka.key;
        for (;;) {
            cJSON *resp = NULL, *kvs = NULL;
            int64_t total = 0;
            long long hrev = 0;
            rc = sem_state(ec, es, put, a->ka.key_len, id, permits, &resp, &kvs, &total, &hrev,
                           put ? &a->ka.rev : NULL, err);
            put = NULL;
            if (rc) break;
            int mine = 0, present = 0;
            const cJSON *ahead = NULL;
            sem_place(kvs, total, a->ka.rev, &mine, &present, &ahead);
            char *akey = NULL;
            if (ahead) {
                int marked = 0;
                kv_count(ahead, &marked);
                const char *ak = dl_etcd_jstr(ahead, "key");
                if (!marked && ak && !(akey = strdup(ak))) rc = OOM(err);
            }
            cJSON_Delete(resp);
            if (rc) break;
            if (!present) {
                free(akey);
                gone = 1; /* our lease ran out while we waited: start over */
                break;
            }
            if (mine) {
                free(akey);
                if (waited) sem_mark(ec, es, a);
                rc = dl_etcd_ka_add(ec, &a->ka, NULL, err);
                if (rc) break;
                es->acqs[es->nacq++] = a;
                return DLOCK_OK;
            }
            int64_t left = deadline == DL_INF_DEADLINE ? INT64_MAX : deadline - dl_now_ms();
            if (wait_ms == 0 || left <= 0) {
                free(akey);
                rc = dl_sem_refused(o, permits, wait_ms != 0, err);
                break;
            }
            waited = 1;
            int64_t slice = granted * 1000 / 3;
            if (slice > left) slice = left;
            if (akey && slice > ETCD_SEM_RECHECK_MS) slice = ETCD_SEM_RECHECK_MS;
            /* behind another: its key; the first waiter: all the semaphore's */
            dl_cancel_begin(&o->h.cancel);
            rc = dl_etcd_watch_keys(ec, es->curl, akey ? akey : es->wkey, akey ? NULL : es->wend, 0,
                                    hrev + 1, slice, &o->h.cancel, err);
            dl_cancel_end(&o->h.cancel);
            free(akey);
            if (rc == DLOCK_ECANCELED) {
                rc = dl_seterr(err, DLOCK_ECANCELED, "waiting for '%s' was cancelled", nm);
                break;
            }
            int alive = 1;
            if (!rc) rc = dl_etcd_lease_keepalive(ec, es->curl, id, &alive, err);
            if (rc) break;
            if (!alive) {
                gone = 1;
                break;
            }
        }
        dl_etcd_lease_revoke(ec, es->curl, id); /* deletes our key */
        free(a->ka.key);
        free(a);
        if (!gone) return rc;
    }
}

/* Gives back permits this handle holds (its latest acquisitions first). */
int dl_etcd_sem_release(dl_object *o, int64_t permits, dl_err *err) {
    etcd_client *ec = o->h.c->backend_client;
    etcd_sem *es = o->h.backend_state;
    char nm[80];
    dl_name_msg(o->h.name, o->h.name_len, nm, sizeof nm);
    int64_t have = 0;
    for (int i = 0; i < es->nacq; i++) have += es->acqs[i]->k;
    if (permits > have) return dl_sem_over_release(o, permits, have, err);
    int lost = 0;
    while (permits > 0) {
        etcd_acq *a = es->acqs[es->nacq - 1];
        int64_t left = permits >= a->k ? 0 : a->k - permits;
        int rc = DLOCK_OK, done = 0;
        if (!atomic_load(&a->ka.lost)) {
            /* guarded by the key's create revision: a key made again is not
             * ours; the new count, or a delete */
            char num[40];
            snprintf(num, sizeof num, "%lld held", (long long)left);
            rc = dl_etcd_txn_if(ec, es->curl, a->ka.key, a->ka.key_len, "CREATE", a->ka.rev,
                        left ? num : NULL, strlen(num), left ? a->ka.lease : 0, &done, err);
            if (rc) return rc; /* nothing changed here: a retry is possible */
        }
        if (!done) lost = 1;
        if (done && left) {
            a->k = left;
            break;
        }
        permits -= a->k;
        es->nacq--;
        acq_free(ec, es, a, 1);
    }
    if (lost)
        return dl_seterr(err, DLOCK_ELOST, "semaphore '%s': the etcd lease of permits this "
                                           "handle held ran out (they were freed)", nm);
    return DLOCK_OK;
}

/* total - the permits held (waiters are not counted). */
int dl_etcd_sem_available(dl_object *o, int64_t *permits, dl_err *err) {
    etcd_client *ec = o->h.c->backend_client;
    etcd_sem *es = o->h.backend_state;
    cJSON *resp = NULL, *kvs = NULL;
    int64_t total = 0;
    long long hrev = 0;
    int rc = sem_state(ec, es, NULL, 0, 0, 0, &resp, &kvs, &total, &hrev, NULL, err);
    if (rc) return rc;
    int mine = 0, present = 0;
    *permits = total - sem_place(kvs, total, 0, &mine, &present, NULL);
    if (*permits < 0) *permits = 0;
    cJSON_Delete(resp);
    return DLOCK_OK;
}

/* Puts the total when it is unset (try_set) or its mod revision is still
 * mod (add): *done 1 when it was written. */
static int total_put(etcd_client *ec, etcd_sem *es, long long mod, int64_t v, int *done,
                     dl_err *err) {
    char num[24];
    snprintf(num, sizeof num, "%lld", (long long)v);
    return dl_etcd_txn_if(ec, es->curl, es->total, es->total_len, mod ? "MOD" : "CREATE", mod, num,
                  strlen(num), 0, done, err);
}

int dl_etcd_sem_try_set(dl_object *o, int64_t permits, int *set, dl_err *err) {
    return total_put(o->h.c->backend_client, o->h.backend_state, 0, permits, set, err);
}

/* Adds delta to the total by compare-and-set (creating it at delta). */
int dl_etcd_sem_add(dl_object *o, int64_t delta, dl_err *err) {
    etcd_client *ec = o->h.c->backend_client;
    etcd_sem *es = o->h.backend_state;
    for (int tries = 0; tries < 100; tries++) {
        cJSON *q = cJSON_CreateObject();
        if (!q || !dl_etcd_add_b64(q, "key", es->total, es->total_len)) {
            cJSON_Delete(q);
            return OOM(err);
        }
        cJSON *r = NULL;
        int rc = dl_etcd_rpc(ec, es->curl, "/v3/kv/range", q, dl_etcd_req_timeout(ec), &r, NULL, err);
        if (rc) return rc;
        cJSON *kvs = dl_etcd_jobj(r, "kvs");
        cJSON *kv = cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
        int64_t v = kv ? kv_count(kv, NULL) : 0;
        long long mod = kv ? dl_etcd_jnum(kv, "mod_revision") : 0;
        cJSON_Delete(r);
        if (kv && v < 0)
            return dl_seterr(err, DLOCK_EPROTO, "etcd: the semaphore's total is not a number");
        if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta))
            return dl_seterr(err, DLOCK_EOVERFLOW, "semaphore add: the total would overflow");
        int done = 0;
        rc = total_put(ec, es, mod, v + delta, &done, err);
        if (rc || done) return rc;
    }
    return dl_seterr(err, DLOCK_EIO, "semaphore add: the total kept changing (100 tries)");
}
