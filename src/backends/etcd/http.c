/* The etcd backend's transport: base64, the JSON gateway over HTTP (libcurl), JSON helpers. (The design: etcd_backend.h.) */
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

/* ---- base64 ---- */

static const char b64c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *dl_etcd_b64_enc(const char *src, size_t len) {
    char *out = malloc((len + 2) / 3 * 4 + 1);
    if (!out) return NULL;
    const unsigned char *s = (const unsigned char *)src;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)s[i] << 16;
        if (i + 1 < len) v |= (unsigned)s[i + 1] << 8;
        if (i + 2 < len) v |= s[i + 2];
        out[o++] = b64c[(v >> 18) & 63];
        out[o++] = b64c[(v >> 12) & 63];
        out[o++] = i + 1 < len ? b64c[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? b64c[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

/* Decodes into out (at most outlen - 1 bytes, NUL-terminated); returns the length. */
size_t dl_etcd_b64_dec(const char *s, char *out, size_t outlen) {
    unsigned v = 0;
    int bits = 0;
    size_t n = 0;
    for (; *s && *s != '='; s++) {
        const char *p = strchr(b64c, *s);
        if (!p) continue;
        v = (v << 6) | (unsigned)(p - b64c);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n + 1 < outlen) out[n++] = (char)((v >> bits) & 0xff);
        }
    }
    if (outlen) out[n] = '\0';
    return n;
}

/* ---- HTTP ---- */



/* A complete line of a watch stream: 1 when it ends the watch. */
static int stream_line(http_buf *b, const char *line) {
    cJSON *j = cJSON_Parse(line);
    if (!j) return 0;
    int stop = 0;
    cJSON *res = cJSON_GetObjectItemCaseSensitive(j, "result");
    if (cJSON_GetObjectItemCaseSensitive(j, "error")) {
        b->stream_err = 1;
        stop = 1;
    } else if (res) {
        cJSON *ev = cJSON_GetObjectItemCaseSensitive(res, "events");
        if ((cJSON_IsArray(ev) && cJSON_GetArraySize(ev) > 0) ||
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "canceled"))) {
            b->event = 1;
            stop = 1;
        }
    }
    cJSON_Delete(j);
    return stop;
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    http_buf *b = ud;
    size_t len = size * nmemb;
    if (b->n + len + 1 > ETCD_MAX_BODY) return 0;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + len + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return 0;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, ptr, len);
    b->n += len;
    b->p[b->n] = '\0';
    if (b->stream) {
        char *nl;
        while ((nl = memchr(b->p + b->scanned, '\n', b->n - b->scanned))) {
            *nl = '\0';
            int stop = stream_line(b, b->p + b->scanned);
            *nl = '\n';
            b->scanned = (size_t)(nl - b->p) + 1;
            if (stop) return 0; /* ends the transfer (CURLE_WRITE_ERROR) */
        }
    }
    return len;
}

static int tls_failure(CURLcode rc) {
    return rc == CURLE_SSL_CONNECT_ERROR || rc == CURLE_PEER_FAILED_VERIFICATION ||
           rc == CURLE_SSL_CERTPROBLEM || rc == CURLE_SSL_CIPHER ||
           rc == CURLE_SSL_CACERT_BADFILE || rc == CURLE_SSL_ENGINE_INITFAILED ||
           rc == CURLE_SSL_ISSUER_ERROR || rc == CURLE_SSL_CRL_BADFILE;
}

int dl_etcd_conn_failure(CURLcode rc) {
    return rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
           rc == CURLE_COULDNT_RESOLVE_PROXY;
}

/* curl_easy_perform; with cx (between dl_cancel_begin and dl_cancel_end),
 * on a multi handle whose poll also watches the cancel's eventfd, so that a
 * cancel ends the transfer at once (CURLE_ABORTED_BY_CALLBACK). */
static CURLcode perform_cx(CURL *h, dl_cancel *cx) {
    if (!cx) return curl_easy_perform(h);
    CURLM *m = curl_multi_init();
    if (!m) return CURLE_OUT_OF_MEMORY;
    if (curl_multi_add_handle(m, h) != CURLM_OK) {
        curl_multi_cleanup(m);
        return CURLE_FAILED_INIT;
    }
    CURLcode res = CURLE_OK;
    for (;;) {
        int running = 0;
        if (curl_multi_perform(m, &running) != CURLM_OK) {
            res = CURLE_FAILED_INIT;
            break;
        }
        if (!running) {
            int left = 0;
            CURLMsg *msg = curl_multi_info_read(m, &left);
            res = msg && msg->msg == CURLMSG_DONE ? msg->data.result : CURLE_FAILED_INIT;
            break;
        }
        if (dl_canceled(cx)) {
            res = CURLE_ABORTED_BY_CALLBACK;
            break;
        }
        struct curl_waitfd w = {.fd = cx->own, .events = CURL_WAIT_POLLIN, .revents = 0};
#if LIBCURL_VERSION_NUM >= 0x074200
        curl_multi_poll(m, &w, cx->own >= 0 ? 1 : 0, 1000, NULL);
#else
        curl_multi_wait(m, &w, cx->own >= 0 ? 1 : 0, 1000, NULL);
#endif
        if (w.revents) dl_cancel_drain(cx);
    }
    curl_multi_remove_handle(m, h);
    curl_multi_cleanup(m);
    return res;
}

/* Resets h for one request to url: TLS as configured, connected within
 * connect_timeout_ms, done within timeout_ms (0: no limit, for the client's
 * watch stream). ebuf: CURL_ERROR_SIZE bytes. */
void dl_etcd_curl_setup(etcd_client *ec, CURL *h, const char *url, char *ebuf, int64_t timeout_ms) {
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, ec->tls ? "https" : "http");
#else
    curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(ec->tls ? CURLPROTO_HTTPS : CURLPROTO_HTTP));
#endif
    if (ec->tls) {
        if (ec->ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, ec->ca_file);
        if (ec->ca_dir) curl_easy_setopt(h, CURLOPT_CAPATH, ec->ca_dir);
        if (ec->cert_file) curl_easy_setopt(h, CURLOPT_SSLCERT, ec->cert_file);
        if (ec->key_file) curl_easy_setopt(h, CURLOPT_SSLKEY, ec->key_file);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, ec->insecure ? 0L : 1L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, ec->insecure ? 0L : 2L);
    }
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
    int64_t cms = timeout_ms > 0 && timeout_ms < ec->connect_ms ? timeout_ms : ec->connect_ms;
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, cms > LONG_MAX ? LONG_MAX : (long)cms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms > LONG_MAX ? LONG_MAX : (long)timeout_ms);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
}

/* POSTs body (GET when NULL) to path on the first endpoint that accepts a
 * connection, within timeout_ms. *status: the HTTP status. A stream (watch)
 * that ends early by an event, or times out, is not an error: out->event
 * tells. cx: as perform_cx; a cancelled transfer is DLOCK_ECANCELED. */
int dl_etcd_http_do_cx(etcd_client *ec, CURL *h, const char *path, const char *body,
                       int64_t timeout_ms, dl_cancel *cx, http_buf *out, long *status,
                       dl_err *err) {
    *status = 0;
    if (timeout_ms < 1) timeout_ms = 1;
    size_t start = atomic_load(&ec->cur);
    CURLcode rc = CURLE_OK;
    char ebuf[CURL_ERROR_SIZE];
    size_t i;
    for (i = 0; i < ec->neps; i++) {
        size_t e = (start + i) % ec->neps;
        char url[600];
        snprintf(url, sizeof url, "%s%s", ec->eps[e], path);
        ebuf[0] = '\0';
        out->n = 0;
        out->scanned = 0;
        out->event = out->stream_err = 0;
        dl_etcd_curl_setup(ec, h, url, ebuf, timeout_ms);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
        if (body) {
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
        }
        rc = perform_cx(h, cx);
        if (rc == CURLE_ABORTED_BY_CALLBACK)
            return dl_seterr(err, DLOCK_ECANCELED, "etcd: the wait was cancelled");
        if (rc == CURLE_OPERATION_TIMEDOUT) {
            /* not connected within the connect timeout: try the next one */
            curl_off_t connected = 0;
            curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &connected);
            if (connected == 0 && !out->stream && i + 1 < ec->neps) continue;
        }
        if (!dl_etcd_conn_failure(rc)) break;
    }
    if (i < ec->neps) atomic_store(&ec->cur, (start + i) % ec->neps);
    if (out->stream && (out->event || out->stream_err || rc == CURLE_OPERATION_TIMEDOUT)) {
        if (out->stream_err) return dl_seterr(err, DLOCK_ESERVER, "etcd: watch failed");
        if (rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_WRITE_ERROR) return DLOCK_OK;
    }
    if (rc != CURLE_OK) {
        const char *m = ebuf[0] ? ebuf : curl_easy_strerror(rc);
        if (rc == CURLE_OPERATION_TIMEDOUT)
            return dl_seterr(err, DLOCK_EIO, "etcd: %s: no answer within %lld ms (%s)", path,
                             (long long)timeout_ms, m);
        if (dl_etcd_conn_failure(rc))
            return dl_seterr(err, DLOCK_EIO, "etcd: no endpoint reachable (%zu tried): %s",
                             ec->neps, m);
        if (tls_failure(rc)) return dl_seterr(err, DLOCK_ETLS, "etcd: TLS: %s", m);
        return dl_seterr(err, DLOCK_EIO, "etcd: %s: %s", path, m);
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    return DLOCK_OK;
}

static int http_do(etcd_client *ec, CURL *h, const char *path, const char *body,
                   int64_t timeout_ms, http_buf *out, long *status, dl_err *err) {
    return dl_etcd_http_do_cx(ec, h, path, body, timeout_ms, NULL, out, status, err);
}

int64_t dl_etcd_req_timeout(const etcd_client *ec) { return ec->connect_ms + ec->cmd_ms; }

/* One gateway call: req (consumed) to path; *resp the parsed answer.
 * A gRPC error answer: its code in *gcode (when not NULL, else an error),
 * 5 NotFound being the usual one. */
int dl_etcd_rpc(etcd_client *ec, CURL *h, const char *path, cJSON *req, int64_t timeout_ms,
                cJSON **resp, int *gcode, dl_err *err) {
    *resp = NULL;
    if (gcode) *gcode = 0;
    char *body = req ? cJSON_PrintUnformatted(req) : NULL;
    cJSON_Delete(req);
    if (req && !body) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    http_buf b = {0};
    long status = 0;
    int rc = http_do(ec, h, path, body, timeout_ms, &b, &status, err);
    free(body);
    if (rc) {
        free(b.p);
        return rc;
    }
    cJSON *j = b.p ? cJSON_Parse(b.p) : NULL;
    if (!j) {
        char snip[80];
        snprintf(snip, sizeof snip, "%s", b.p ? b.p : "");
        for (char *p = snip; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' ';
        free(b.p);
        if (status == 401 || status == 403)
            return dl_seterr(err, DLOCK_EAUTH, "etcd: %s: HTTP %ld", path, status);
        return dl_seterr(err, DLOCK_EPROTO, "etcd: %s: HTTP %ld, not JSON: %s", path, status,
                         snip);
    }
    free(b.p);
    cJSON *ecode = cJSON_GetObjectItemCaseSensitive(j, "code");
    cJSON *emsg = cJSON_GetObjectItemCaseSensitive(j, "message");
    if (status != 200 || cJSON_GetObjectItemCaseSensitive(j, "error")) {
        int code = cJSON_IsNumber(ecode) ? ecode->valueint : -1;
        if (gcode && code > 0) {
            *gcode = code;
            *resp = j;
            return DLOCK_OK;
        }
        char m[160];
        snprintf(m, sizeof m, "%s", cJSON_IsString(emsg) ? emsg->valuestring : "error");
        cJSON_Delete(j);
        if (code == 16 || code == 7)
            return dl_seterr(err, DLOCK_EAUTH, "etcd: %s: %s", path, m);
        if (code == 14 || code == 4)
            return dl_seterr(err, DLOCK_EIO, "etcd: %s: %s", path, m);
        return dl_seterr(err, DLOCK_ESERVER, "etcd: %s: %s (HTTP %ld, code %d)", path, m,
                         status, code);
    }
    *resp = j;
    return DLOCK_OK;
}

/* ---- JSON helpers ---- */

/* A gateway int64 ("123" or 123); 0 when missing. */
long long dl_etcd_jnum(const cJSON *o, const char *name) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    if (cJSON_IsString(v)) return strtoll(v->valuestring, NULL, 10);
    if (cJSON_IsNumber(v)) return (long long)v->valuedouble;
    return 0;
}

const char *dl_etcd_jstr(const cJSON *o, const char *name) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

cJSON *dl_etcd_jobj(const cJSON *o, const char *name) {
    return o ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
}

int dl_etcd_add_str(cJSON *o, const char *name, const char *v) {
    return cJSON_AddStringToObject(o, name, v) != NULL;
}

int dl_etcd_add_ll(cJSON *o, const char *name, long long v) {
    char num[24];
    snprintf(num, sizeof num, "%lld", v);
    return dl_etcd_add_str(o, name, num);
}

/* Adds name: base64(s, len). */
int dl_etcd_add_b64(cJSON *o, const char *name, const char *s, size_t len) {
    char *e = dl_etcd_b64_enc(s, len);
    if (!e) return 0;
    int ok = dl_etcd_add_str(o, name, e);
    free(e);
    return ok;
}

/* The end of a prefix range: the prefix with its last byte incremented
 * (prefixes here end in '/', so no carry). */
int dl_etcd_add_prefix_range(cJSON *o, const char *prefix, size_t len) {
    char *end = malloc(len);
    if (!end) return 0;
    memcpy(end, prefix, len);
    end[len - 1]++;
    int ok = dl_etcd_add_b64(o, "key", prefix, len) && dl_etcd_add_b64(o, "range_end", end, len);
    free(end);
    return ok;
}

/* A call on the client's own handle. */
int dl_etcd_client_rpc(etcd_client *ec, const char *path, cJSON *req, cJSON **resp, int *gcode,
                       dl_err *err) {
    pthread_mutex_lock(&ec->mu);
    int rc = dl_etcd_rpc(ec, ec->curl, path, req, dl_etcd_req_timeout(ec), resp, gcode, err);
    pthread_mutex_unlock(&ec->mu);
    return rc;
}
