/* etcd keys: the layout of a name's keys, the holder of a name, guarded transactions. (The design: etcd_backend.h.) */
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

/* ---- keys ---- */

/* "dlock/<what>/<len>/<name>/" + sub (NULL: nothing). */
char *dl_etcd_what_prefix(const char *what, const char *name, size_t len, const char *sub,
                          size_t *outlen) {
    char head[48];
    int hn = snprintf(head, sizeof head, "dlock/%s/%zu/", what, len);
    size_t sl = sub ? strlen(sub) : 0;
    char *p = malloc((size_t)hn + len + 2 + sl);
    if (!p) return NULL;
    memcpy(p, head, (size_t)hn);
    memcpy(p + hn, name, len);
    p[hn + len] = '/';
    if (sl) memcpy(p + hn + len + 1, sub, sl);
    p[hn + len + 1 + sl] = '\0';
    *outlen = (size_t)hn + len + 1 + sl;
    return p;
}

/* "dlock/lock/<len>/<name>/" + sub (NULL: nothing). */
char *dl_etcd_name_prefix(const char *name, size_t len, const char *sub, size_t *outlen) {
    return dl_etcd_what_prefix("lock", name, len, sub, outlen);
}

/* The oldest (newest: the newest) key under prefix created before max_rev
 * (0: any): *kv (a reference into *resp, which the caller deletes) or NULL;
 * *rev the header revision. all: every such key (keys only), in *resp's kvs. */
int dl_etcd_get_owner(etcd_client *ec, CURL *h, const char *prefix, size_t plen, long long max_rev,
                      int newest, int all, cJSON **resp, cJSON **kv, long long *rev, dl_err *err) {
    *resp = NULL;
    *kv = NULL;
    cJSON *q = cJSON_CreateObject();
    if (!q || !dl_etcd_add_prefix_range(q, prefix, plen) ||
        !dl_etcd_add_str(q, "sort_order", newest ? "DESCEND" : "ASCEND") ||
        !dl_etcd_add_str(q, "sort_target", "CREATE") || (!all && !dl_etcd_add_ll(q, "limit", 1)) ||
        (all && !cJSON_AddTrueToObject(q, "keys_only")) ||
        (max_rev > 0 && !dl_etcd_add_ll(q, "max_create_revision", max_rev))) {
        cJSON_Delete(q);
        return OOM(err);
    }
    int rc = dl_etcd_rpc(ec, h, "/v3/kv/range", q, dl_etcd_req_timeout(ec), resp, NULL, err);
    if (rc) return rc;
    cJSON *kvs = dl_etcd_jobj(*resp, "kvs");
    if (cJSON_IsArray(kvs) && cJSON_GetArraySize(kvs) > 0) *kv = cJSON_GetArrayItem(kvs, 0);
    if (rev) *rev = dl_etcd_jnum(dl_etcd_jobj(*resp, "header"), "revision");
    return DLOCK_OK;
}

/* The create_revision of el's key now (0: gone), its lease and the revision
 * read at (lease, hrev: may be NULL). */
int dl_etcd_key_state(etcd_client *ec, CURL *h, etcd_lock *el, long long *crev, long long *lease,
                      long long *hrev, dl_err *err) {
    cJSON *q = cJSON_CreateObject();
    if (!q || !dl_etcd_add_b64(q, "key", el->key, el->key_len)) {
        cJSON_Delete(q);
        return OOM(err);
    }
    cJSON *r = NULL;
    int rc = dl_etcd_rpc(ec, h, "/v3/kv/range", q, dl_etcd_req_timeout(ec), &r, NULL, err);
    if (rc) return rc;
    cJSON *kvs = dl_etcd_jobj(r, "kvs");
    cJSON *kv = cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
    *crev = kv ? dl_etcd_jnum(kv, "create_revision") : 0;
    if (lease) *lease = kv ? dl_etcd_jnum(kv, "lease") : 0;
    if (hrev) *hrev = dl_etcd_jnum(dl_etcd_jobj(r, "header"), "revision");
    cJSON_Delete(r);
    return DLOCK_OK;
}


/* Sets seen[i].gone for every hold whose key is no longer its own: gone, or
 * re-created (another create_revision), or put again under another lease (a
 * foreign put). One txn of compares per ETCD_CHECK_PER_TXN holds answers "all
 * still ours" in the usual case; when it fails, each key of that batch is
 * read. *rev: a revision at which every hold not gone was still its own (the
 * oldest txn's). -1 when a request failed: nothing is decided. */
int dl_etcd_ka_check(etcd_client *ec, CURL *h, ka_seen *seen, size_t n, long long *rev) {
    *rev = 0;
    for (size_t b = 0; b < n; b += ETCD_CHECK_PER_TXN) {
        size_t e = b + ETCD_CHECK_PER_TXN < n ? b + ETCD_CHECK_PER_TXN : n;
        cJSON *q = cJSON_CreateObject();
        cJSON *cmp = q ? cJSON_AddArrayToObject(q, "compare") : NULL;
        int ok = cmp != NULL;
        for (size_t i = b; i < e && ok; i++) {
            cJSON *c1 = cJSON_CreateObject(), *c2 = cJSON_CreateObject();
            if (c1) cJSON_AddItemToArray(cmp, c1);
            if (c2) cJSON_AddItemToArray(cmp, c2);
            ok = c1 && c2 && dl_etcd_add_b64(c1, "key", seen[i].key, seen[i].key_len) &&
                 dl_etcd_add_str(c1, "target", "CREATE") &&
                 dl_etcd_add_ll(c1, "create_revision", seen[i].rev) &&
                 dl_etcd_add_b64(c2, "key", seen[i].key, seen[i].key_len) &&
                 dl_etcd_add_str(c2, "target", "LEASE") && dl_etcd_add_ll(c2, "lease", seen[i].lease);
        }
        if (!ok) {
            cJSON_Delete(q);
            return -1;
        }
        cJSON *r = NULL;
        dl_err ignored = {0};
        if (dl_etcd_rpc(ec, h, "/v3/kv/txn", q, dl_etcd_req_timeout(ec), &r, NULL, &ignored)) return -1;
        int all = cJSON_IsTrue(dl_etcd_jobj(r, "succeeded"));
        long long hrev = dl_etcd_jnum(dl_etcd_jobj(r, "header"), "revision");
        if (!*rev || hrev < *rev) *rev = hrev;
        cJSON_Delete(r);
        if (all) continue;
        for (size_t i = b; i < e; i++) {
            etcd_lock probe = {.key = seen[i].key, .key_len = seen[i].key_len};
            long long crev = 0, lease = 0;
            if (dl_etcd_key_state(ec, h, &probe, &crev, &lease, NULL, &ignored)) return -1;
            seen[i].gone = crev != seen[i].rev || lease != seen[i].lease;
        }
    }
    return 0;
}
