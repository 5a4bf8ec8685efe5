/* etcd queries by name and server facts. (The design: etcd_backend.h.) */
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

/* ---- queries by name ---- */

int dl_etcd_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                    dl_err *err) {
    etcd_client *ec = c->backend_client;
    size_t plen = 0, wlen = 0, rlen = 0;
    char *prefix = dl_etcd_name_prefix(name, len, NULL, &plen);
    char *wprefix = dl_etcd_name_prefix(name, len, "w/", &wlen);
    char *rprefix = dl_etcd_name_prefix(name, len, "r/", &rlen);
    cJSON *resp = NULL, *kv = NULL, *wresp = NULL, *wkv = NULL, *rresp = NULL, *rkv = NULL;
    cJSON *t = NULL;
    long long hrev = 0, readers = 0, rfence = 0;
    int writer = 0, rc;
    if (!prefix || !wprefix || !rprefix) {
        rc = OOM(err);
        goto out;
    }
    pthread_mutex_lock(&ec->mu);
    rc = dl_etcd_get_owner(ec, ec->curl, prefix, plen, 0, 0, 0, &resp, &kv, &hrev, err);
    if (!rc && kv) {
        /* an exclusive hold when the oldest key is under w/ */
        const char *k = dl_etcd_jstr(kv, "key");
        size_t kl = k ? strlen(k) : 0;
        char *kb = malloc(kl + 1);
        if (!kb) rc = OOM(err);
        else writer = dl_etcd_b64_dec(k ? k : "", kb, kl + 1) > wlen && !memcmp(kb, wprefix, wlen);
        free(kb);
        if (!rc && !writer) {
            /* readers: the read keys older than the oldest exclusive one */
            rc = dl_etcd_get_owner(ec, ec->curl, wprefix, wlen, 0, 0, 0, &wresp, &wkv, NULL, err);
            long long wrev = wkv ? dl_etcd_jnum(wkv, "create_revision") : 0;
            if (!rc)
                rc = dl_etcd_get_owner(ec, ec->curl, rprefix, rlen, wrev > 1 ? wrev - 1 : 0, 1, 1, &rresp,
                               &rkv, NULL, err);
            if (!rc) {
                readers = cJSON_GetArraySize(dl_etcd_jobj(rresp, "kvs"));
                rfence = rkv ? dl_etcd_jnum(rkv, "create_revision") : 0;
            }
        }
    }
    long long lease = kv ? dl_etcd_jnum(kv, "lease") : 0;
    if (!rc && lease) {
        cJSON *q = cJSON_CreateObject();
        if (!q || !dl_etcd_add_ll(q, "ID", lease)) {
            cJSON_Delete(q);
            rc = OOM(err);
        } else {
            int gcode = 0;
            rc = dl_etcd_rpc(ec, ec->curl, "/v3/lease/timetolive", q, dl_etcd_req_timeout(ec), &t, &gcode, err);
        }
    }
    pthread_mutex_unlock(&ec->mu);
    if (rc) goto out;
    memset(info, 0, sizeof *info);
    info->exists = kv != NULL;
    if (kv) {
        long long ttl = dl_etcd_jnum(t, "TTL");
        info->ttl_ms = ttl > 0 ? ttl * 1000 : lease ? 0 : -1;
        info->hold_count = 1;
        long long n = dl_etcd_jnum(resp, "count");
        if (writer) {
            info->kind = DLOCK_KIND_PLAIN;
            info->writer = 1;
            info->holders = 1;
            info->fence = (uint64_t)dl_etcd_jnum(kv, "create_revision");
            const char *v = dl_etcd_jstr(kv, "value");
            if (v) dl_etcd_b64_dec(v, info->holder, sizeof info->holder);
        } else {
            info->kind = DLOCK_KIND_READ;
            info->readers = readers;
            info->holders = (int)readers;
            info->fence = (uint64_t)rfence;
        }
        info->waiters = n > info->holders ? n - info->holders : 0;
    } else {
        info->ttl_ms = -2;
        info->fence = (uint64_t)hrev;
    }
out:
    cJSON_Delete(t);
    cJSON_Delete(resp);
    cJSON_Delete(wresp);
    cJSON_Delete(rresp);
    free(prefix);
    free(wprefix);
    free(rprefix);
    return rc;
}

int dl_etcd_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                          dl_err *err) {
    dlock_info info;
    int rc = dl_etcd_inspect(c, name, len, &info, err);
    if (!rc) *fence = info.fence;
    return rc;
}

int dl_etcd_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                        dl_err *err) {
    etcd_client *ec = c->backend_client;
    if (!strcmp(what, "session")) {
        snprintf(buf, buflen,
                 "the client's etcd session lease (DLOCK_WATCHDOG, shared by its holds): "
                 "%lld s kept alive every %lld ms by the client; or lease_ms: an etcd lease "
                 "per lock, rounded up to whole seconds, not renewed",
                 (long long)ec->wd_ttl_s, (long long)(ec->wd_ttl_s * 1000 / 3));
        return DLOCK_OK;
    }
    if (!strcmp(what, "endpoint")) {
        snprintf(buf, buflen, "%s", ec->eps[atomic_load(&ec->cur) % ec->neps]);
        return DLOCK_OK;
    }
    int version = !strcmp(what, "version"), cluster = !strcmp(what, "cluster_version");
    int revision = !strcmp(what, "revision");
    if (!version && !cluster && !revision)
        return dl_seterr(err, DLOCK_ESERVER, "no such fact: %s", what);
    cJSON *r = NULL;
    int rc;
    if (revision) {
        cJSON *q = cJSON_CreateObject();
        if (!q || !dl_etcd_add_b64(q, "key", "dlock/", 6) || !cJSON_AddTrueToObject(q, "count_only")) {
            cJSON_Delete(q);
            return OOM(err);
        }
        rc = dl_etcd_client_rpc(ec, "/v3/kv/range", q, &r, NULL, err);
        if (!rc) snprintf(buf, buflen, "%lld", dl_etcd_jnum(dl_etcd_jobj(r, "header"), "revision"));
    } else {
        rc = dl_etcd_client_rpc(ec, "/version", NULL, &r, NULL, err);
        const char *v = rc ? NULL : dl_etcd_jstr(r, version ? "etcdserver" : "etcdcluster");
        if (!rc && !v) rc = dl_seterr(err, DLOCK_EPROTO, "etcd: /version: unexpected answer");
        if (!rc) snprintf(buf, buflen, "%s", v);
    }
    cJSON_Delete(r);
    return rc;
}
