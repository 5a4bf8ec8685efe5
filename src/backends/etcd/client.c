/* The etcd client: open, close, ping, and the backend table. (The design: etcd_backend.h.) */
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

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }
/* ---- client ---- */

static void etcd_close(dlock_client *c) {
    etcd_client *ec = c->backend_client;
    if (!ec) return;
    pthread_mutex_lock(&ec->ka_mu);
    ec->ka_stop = 1;
    int cw = ec->cw_started;
    dl_etcd_cw_wake(ec);
    pthread_mutex_unlock(&ec->ka_mu);
    dl_renewer_stop(&ec->ka);
    if (cw) pthread_join(ec->cw_thread, NULL);
    if (ec->cw_multi) curl_multi_cleanup(ec->cw_multi);
    for (size_t i = 0; i < CW_RING; i++) free(ec->cw_ring[i].key);
    free(ec->cw_lo);
    free(ec->cw_hi);
    free(ec->cw_add_lo);
    free(ec->cw_add_hi);
    /* a session lease no hold uses any more is revoked; one that still keeps
     * holds runs out, as documented for dlock_client_free */
    int sess_holds = 0;
    for (etcd_lock *el = ec->ka_list; el; el = el->next) sess_holds |= el->session;
    if (ec->sess && !sess_holds && ec->curl) dl_etcd_lease_revoke(ec, ec->curl, ec->sess);
    if (ec->curl) curl_easy_cleanup(ec->curl);
    for (size_t i = 0; i < ec->neps; i++) free(ec->eps[i]);
    free(ec->ca_file);
    free(ec->ca_dir);
    free(ec->cert_file);
    free(ec->key_file);
    pthread_mutex_destroy(&ec->mu);
    pthread_mutex_destroy(&ec->ka_mu);
    pthread_mutex_destroy(&ec->sess_mu);
    pthread_cond_destroy(&ec->cw_cv);
    free(ec);
    c->backend_client = NULL;
}

/* A copy of s (NULL stays NULL); 0 when out of memory. */
static int dup_opt(char **dst, const char *s) {
    *dst = s ? strdup(s) : NULL;
    return !s || *dst;
}

static int etcd_open(dlock_client *c, const char *url, const dlock_options *o, dl_err *err) {
    pthread_once(&curl_once, curl_init_once);
    etcd_client *ec = calloc(1, sizeof *ec);
    if (!ec) return OOM(err);
    pthread_mutex_init(&ec->mu, NULL);
    pthread_mutex_init(&ec->ka_mu, NULL);
    pthread_mutex_init(&ec->sess_mu, NULL);
    atomic_init(&ec->seq, 0);
    dl_cond_init(&ec->cw_cv);
    atomic_init(&ec->cur, 0);
    dl_etcd_ka_init(ec);
    c->backend_client = ec;
    ec->connect_ms = c->connect_timeout_ms;
    ec->cmd_ms = c->command_timeout_ms;
    ec->wd_ttl_s = dl_etcd_lease_secs(c->watchdog_lease_ms);
    if (ec->wd_ttl_s < 2) ec->wd_ttl_s = 2;

    ec->tls = !strncmp(url, "etcds://", 8);
    if (ec->tls) {
        if (o->tls_server_name)
            return dl_seterr(err, DLOCK_ENOTSUP,
                             "tls_server_name is not supported by the etcd backend: name the "
                             "host as its certificate does");
        if (!o->tls_cert_file != !o->tls_key_file)
            return dl_seterr(err, DLOCK_EINVAL,
                             "TLS: tls_cert_file and tls_key_file go together");
        if (!dup_opt(&ec->ca_file, o->tls_ca_file) || !dup_opt(&ec->ca_dir, o->tls_ca_dir) ||
            !dup_opt(&ec->cert_file, o->tls_cert_file) ||
            !dup_opt(&ec->key_file, o->tls_key_file))
            return OOM(err);
        ec->insecure = o->tls_insecure != 0;
    }
    const char *p = url + (ec->tls ? 8 : 7);
    size_t hl = strcspn(p, "/?#");
    if (p[hl] == '/' && p[hl + 1] == '\0') {
        /* a trailing slash is fine */
    } else if (p[hl]) {
        return dl_seterr(err, DLOCK_EINVAL,
                         "bad etcd URL: only etcd://host[:port][,host[:port]...] is understood");
    }
    if (memchr(p, '@', hl))
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "bad etcd URL: etcd user/password authentication is not supported by "
                         "the etcd backend");
    const char *q = p;
    while (q < p + hl) {
        size_t n = strcspn(q, ",");
        if (q + n > p + hl) n = (size_t)(p + hl - q);
        if (n == 0 || n > 255)
            return dl_seterr(err, DLOCK_EINVAL, "bad etcd URL: empty or overlong host in the list");
        if (ec->neps >= ETCD_MAX_EPS)
            return dl_seterr(err, DLOCK_EINVAL, "bad etcd URL: more than %d endpoints",
                             ETCD_MAX_EPS);
        char host[256];
        memcpy(host, q, n);
        host[n] = '\0';
        for (char *s = host; *s; s++)
            if (*s <= ' ' || *s == '\\' || *s == '"' || *s == '%')
                return dl_seterr(err, DLOCK_EINVAL, "bad etcd URL: bad character in a host");
        /* a port given? the last ':' after any "[v6]" */
        const char *rb = strrchr(host, ']');
        const char *colon = strrchr(rb ? rb : host, ':');
        if (host[0] == '[' && !rb)
            return dl_seterr(err, DLOCK_EINVAL, "bad etcd URL: unterminated [IPv6 address]");
        if (!rb && colon && strchr(host, ':') != colon)
            return dl_seterr(err, DLOCK_EINVAL, "bad etcd URL: write IPv6 addresses as [addr]");
        if (colon) {
            char *end = NULL;
            long port = strtol(colon + 1, &end, 10);
            if (!colon[1] || *end || port < 1 || port > 65535)
                return dl_seterr(err, DLOCK_EINVAL, "bad etcd URL: bad port in '%s'", host);
        }
        size_t ul = n + 24;
        if (!(ec->eps[ec->neps] = malloc(ul))) return OOM(err);
        snprintf(ec->eps[ec->neps], ul, "%s://%s%s", ec->tls ? "https" : "http", host,
                 colon ? "" : ":2379");
        ec->neps++;
        q += n;
        if (*q == ',') q++;
    }
    if (!ec->neps) return dl_seterr(err, DLOCK_EINVAL, "bad etcd URL: no host");
    if (!(ec->curl = curl_easy_init())) return OOM(err);
    /* one round trip, so that a bad address fails here */
    cJSON *r = NULL;
    pthread_mutex_lock(&ec->mu);
    int rc = dl_etcd_rpc(ec, ec->curl, "/version", NULL, dl_etcd_req_timeout(ec), &r, NULL, err);
    pthread_mutex_unlock(&ec->mu);
    if (!rc && !dl_etcd_jstr(r, "etcdserver"))
        rc = dl_seterr(err, DLOCK_EPROTO, "etcd: /version: not an etcd server");
    cJSON_Delete(r);
    return rc;
}


static int etcd_ping(dlock_client *c, int64_t *rtt_us, dl_err *err) {
    int64_t t0 = dl_now_us();
    cJSON *r = NULL;
    int rc = dl_etcd_client_rpc(c->backend_client, "/version", NULL, &r, NULL, err);
    cJSON_Delete(r);
    if (!rc && rtt_us) *rtt_us = dl_now_us() - t0;
    return rc;
}

static const char *const etcd_schemes[] = {"etcd://", "etcds://", NULL};

const dl_backend dl_backend_etcd = {
    .name = "etcd",
    .schemes = etcd_schemes,
    .kinds = (1u << DLOCK_KIND_PLAIN) | (1u << DLOCK_KIND_REENTRANT) | (1u << DLOCK_KIND_FAIR) |
             (1u << DLOCK_KIND_READ) | (1u << DLOCK_KIND_WRITE),
    .caps = DL_CAP_CANCEL,
    .open = etcd_open,
    .close = etcd_close,
    .ping = etcd_ping,
    .lock_init = dl_etcd_lock_init,
    .lock_destroy = dl_etcd_lock_destroy,
    .acquire = dl_etcd_acquire,
    .release = dl_etcd_release,
    .extend = dl_etcd_extend,
    .check = dl_etcd_check,
    .inspect = dl_etcd_inspect,
    .fence_current = dl_etcd_fence_current,
    .force_unlock = NULL,
    .server_fact = dl_etcd_server_fact,
    .sem_init = dl_etcd_sem_init,
    .sem_destroy = dl_etcd_sem_destroy,
    .sem_acquire = dl_etcd_sem_acquire,
    .sem_release = dl_etcd_sem_release,
    .sem_available = dl_etcd_sem_available,
    .sem_try_set = dl_etcd_sem_try_set,
    .sem_add = dl_etcd_sem_add,
};
