/* etcd backend: etcd://host1:2379,host2:2379 (port 2379 when left out).
 *
 * Talks to etcd's v3 JSON gateway (POST /v3/..., keys and values base64)
 * over HTTP (etcds://: HTTPS) with libcurl; answers are read with cJSON. Tested with
 * etcd 3.4 (Debian 12 ships 3.4.23).
 * - Endpoints: every host in the URL is an endpoint of one cluster. A request
 *   that cannot connect (refused, unresolvable, connect timeout) is sent to
 *   the next one; the one that answered is used first from then on. A request
 *   that was sent but not answered is not retried elsewhere (it may have been
 *   applied). user:password@ (etcd auth) is DLOCK_ENOTSUP for now, anything
 *   after the host list DLOCK_EINVAL.
 * - etcds://: HTTPS, the server verified against tls_ca_file / tls_ca_dir
 *   (else the system's CAs) and the URL's host, a client certificate sent
 *   when tls_cert_file and tls_key_file are set, tls_insecure skipping the
 *   verification (tests only); tls_server_name is DLOCK_ENOTSUP. Handshake
 *   and verification failures are DLOCK_ETLS.
 * - Keys: a lock named N of L bytes lives under the prefix
 *   "dlock/lock/<L>/<N>/" (the length keeps "a" and "a/b" apart). Each
 *   attempt creates "<prefix>w/<lease id, 16 hex>" (exclusive kinds: plain,
 *   reentrant, fair, write) or "<prefix>r/<lease id>" (read), "-<n, hex>"
 *   appended under the session lease, with that
 *   lease and the holder's token as value (n: the handle's number, so one
 *   handle's holds on a session reuse one key): the concurrency recipe
 *   of etcd's own Mutex / RWMutex, done by the client. An exclusive attempt
 *   holds the lock when its key is the oldest (lowest create_revision) under
 *   the prefix; a read attempt when no exclusive key is older than its own.
 *   A waiter watches only its predecessor (the newest older key; for a
 *   reader, the newest older exclusive key) for deletion, so a release wakes
 *   the next in line (no herd), waiters are served in arrival order (so the
 *   fair kind is the same lock), and a waiting writer holds back the readers
 *   that come after it.
 * - Acquire: one txn creates the key (if absent) and reads the oldest key
 *   of the prefix; its revision is the key's create_revision, the fencing
 *   token. Uncontended, with DLOCK_WATCHDOG, that txn is the only request
 *   (one Raft write). Try once (wait 0): when the holder is not us, the key
 *   is deleted (an explicit lease: revoked) and DLOCK_EBUSY is answered. A
 *   timed wait that runs out, a cancel or a failure does the same: nothing
 *   is left behind.
 * - After a wait the key is read back: a key gone (its lease expired while
 *   waiting, cf. etcd issue 11456 for the server's lock API) is not a lock;
 *   the attempt starts over while time remains. Uncontended there is no
 *   read-back: the txn that created the key read the holder atomically.
 * - Leases. DLOCK_WATCHDOG: every such hold of a client rides on one session
 *   lease (as etcd's concurrency.Session) of the client's watchdog_lease_ms
 *   (rounded UP to whole seconds), granted by the first such acquire, kept
 *   alive every third of it by one keep-alive thread per client (started
 *   then, stopped when the client is freed; an unused session lease is then
 *   revoked, one still holding runs out); the lock is held while the client
 *   lives (expires_at INT64_MAX). A session lease found gone (by the
 *   keep-alive, or by an acquire whose put etcd refuses for it) is dropped:
 *   every hold on it is lost at once, each with its callback, and the next
 *   acquire grants a new one. An explicit lease_ms is an
 *   etcd lease of lease_ms rounded UP to whole seconds (etcd grants at least
 *   2 s on default settings; the granted TTL is what counts), kept alive
 *   only while waiting and refreshed once when acquired, then left to run
 *   out: a lease per hold. dlock_extend grants a new lease, re-puts the key
 *   with it in a txn guarded by the key's create_revision (so the fencing
 *   token stays) and revokes the old lease (not the session's).
 * - Loss: the keep-alive finding a lease gone or a kept hold's key put again
 *   in place by another (its round's check txn), or the client's watch
 *   seeing a kept hold's key deleted (at once for a hold kept 50 ms: "the
 *   client's watch" below), or check / release / extend finding the key
 *   gone or re-created,
 *   means the lock is lost: release says DLOCK_ELOST, check "not held",
 *   dlock_lock_is_lost 1; the keep-alive or the watch thread runs the loss
 *   callback (DLOCK_LOST_TAKEN) for the holds it keeps.
 * - Fencing token: the lock key's create_revision (etcd's revision counter
 *   only grows, so tokens of one name strictly increase across holders).
 *   dlock_fence_current: the holder's token, or when free the store's
 *   current revision, which no token issued exceeds and every later token
 *   does. Reentrant re-entry keeps the token and counts holds locally.
 * - Release: delete the key in a txn guarded by its create_revision (one
 *   request, one write), then, for an explicit lease only, revoke it.
 * - Timeouts: every HTTP request connects within connect_timeout_ms and
 *   completes within connect_timeout_ms + command_timeout_ms; a wait watches
 *   for at most a third of the lease at a time and keeps the attempt's lease
 *   alive between watches.
 * - Kinds: plain, reentrant, fair, read and write, all on one name sharing
 *   the prefix. Re-entry of a handle that holds (reentrant, fair, read,
 *   write) is counted by the handle. Semaphores: see "semaphores" below.
 *   Permit-expirable semaphores, latches, tokens, force_unlock, list and the
 *   ID worker: not supported (DLOCK_ENOTSUP).
 * - dlock_inspect: writer / holder (token) / fence of the exclusive holder,
 *   or readers (the read keys older than the oldest exclusive key) with the
 *   newest reader's token as fence; waiters: the other keys; ttl_ms: the
 *   oldest key's lease TTL (whole seconds).
 * - dlock_server_fact: "version" (etcdserver of /version), "cluster_version"
 *   (etcdcluster of /version), "session" (what keeps a lock held),
 *   "endpoint" (the endpoint used last, http://host:port), "revision" (the
 *   store's current revision).
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "internal.h"

#define ETCD_MAX_EPS 16
#define ETCD_MAX_BODY (16u << 20) /* an answer larger than this is refused */

typedef struct etcd_lock etcd_lock;

/* An event of the client's watch that concerned no kept hold when it came:
 * a hold kept just after (its acquire's answer raced the event) looks here
 * for what happened to its key meanwhile. */
typedef struct cw_event {
    char *key;
    size_t key_len;
    long long mod_rev, create_rev, lease;
    int del;
} cw_event;

#define CW_RING 256

typedef struct etcd_client {
    char *eps[ETCD_MAX_EPS];      /* "http://host:port" or "https://host:port" */
    int tls;                      /* etcds:// */
    char *ca_file, *ca_dir, *cert_file, *key_file;
    int insecure;
    size_t neps;
    atomic_size_t cur;            /* the endpoint tried first */
    int64_t connect_ms, cmd_ms;
    int64_t wd_ttl_s;             /* DLOCK_WATCHDOG lease TTL, whole seconds */
    pthread_mutex_t mu;           /* guards curl */
    CURL *curl;                   /* queries by name */
    /* the keep-alive thread */
    pthread_mutex_t ka_mu;        /* guards what follows and every etcd_lock's kept/next */
    pthread_cond_t ka_cv;
    pthread_t ka_thread;
    int ka_started, ka_stop;
    etcd_lock *ka_list;
    int64_t sess_ttl;             /* its granted TTL, seconds */
    long long sess;               /* the session lease of DLOCK_WATCHDOG holds (0: none yet,
                                     or found gone: the next such acquire grants another) */
    pthread_mutex_t sess_mu;      /* one grant at a time */
    atomic_ullong seq;            /* numbers the handles: each session hold's key unique */
    /* the client's watch of its kept holds' keys (cw_main; ka_mu guards the
     * fields but cw_multi, which lives from the thread's start to close) */
    pthread_t cw_thread;
    pthread_cond_t cw_cv;
    CURLM *cw_multi;              /* the stream's; curl_multi_wakeup wakes the thread */
    int cw_started;
    int cw_live;                  /* a stream is open, or being opened, on [lo, hi) */
    int cw_restart;               /* a kept hold that stream does not cover */
    char *cw_lo, *cw_hi;          /* the range watched (binary keys) */
    size_t cw_lo_len, cw_hi_len;
    char *cw_add_lo, *cw_add_hi;  /* to take in at the restart (NULL: nothing) */
    size_t cw_add_lo_len, cw_add_hi_len;
    long long cw_start;           /* the stream's start revision */
    long long cw_next;            /* every event before it in the range was handled (0: none) */
    cw_event cw_ring[CW_RING];    /* the latest events that concerned no kept hold */
    size_t cw_ring_pos;
    long long cw_ring_floor;      /* events up to it may be missing from the ring */
} etcd_client;

struct etcd_lock {
    dlock_lock *l;                /* NULL: a semaphore acquisition (sem) */
    dl_object *sem;               /* its semaphore handle, when l is NULL */
    CURL *curl;
    char *prefix;                 /* "dlock/lock/<len>/<name>/" (binary-safe) */
    size_t prefix_len;
    char *wprefix;                /* prefix + "w/": the exclusive holds' keys */
    size_t wprefix_len;
    int reader;                   /* a read lock: keys under prefix + "r/" */
    unsigned long long kn;        /* the handle's number in its client (ec->seq) */
    char *key;                    /* prefix + "w/" or "r/" + lease hex: the hold's key */
    size_t key_len;
    long long lease;              /* current hold's lease id */
    long long rev;                /* current hold's create_revision */
    int64_t ttl_s;                /* granted TTL of the lease */
    int session;                  /* lease is the client's session lease (DLOCK_WATCHDOG) */
    int kept;                     /* in the keep-alive list (ka_mu) */
    long long wfrom;              /* its key was its own at this revision (ka_mu) */
    int wreplay;                  /* the client's watch must replay from wfrom + 1 (ka_mu) */
    int64_t wdue;                 /* ... by then (dl_now_ms; ka_mu) */
    etcd_lock *next;              /* keep-alive list link (ka_mu) */
    atomic_int lost;
};

/* ---- base64 ---- */

static const char b64c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_enc(const char *src, size_t len) {
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
static size_t b64_dec(const char *s, char *out, size_t outlen) {
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

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

typedef struct http_buf {
    char *p;
    size_t n, cap;
    /* watch streams: stop at the first event (or cancel / error) */
    int stream, event, stream_err;
    size_t scanned;
} http_buf;

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

static int conn_failure(CURLcode rc) {
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
static void curl_setup(etcd_client *ec, CURL *h, const char *url, char *ebuf, int64_t timeout_ms) {
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
static int http_do_cx(etcd_client *ec, CURL *h, const char *path, const char *body,
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
        curl_setup(ec, h, url, ebuf, timeout_ms);
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
        if (!conn_failure(rc)) break;
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
        if (conn_failure(rc))
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
    return http_do_cx(ec, h, path, body, timeout_ms, NULL, out, status, err);
}

static int64_t req_timeout(const etcd_client *ec) { return ec->connect_ms + ec->cmd_ms; }

/* One gateway call: req (consumed) to path; *resp the parsed answer.
 * A gRPC error answer: its code in *gcode (when not NULL, else an error),
 * 5 NotFound being the usual one. */
static int rpc(etcd_client *ec, CURL *h, const char *path, cJSON *req, int64_t timeout_ms,
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
static long long jnum(const cJSON *o, const char *name) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    if (cJSON_IsString(v)) return strtoll(v->valuestring, NULL, 10);
    if (cJSON_IsNumber(v)) return (long long)v->valuedouble;
    return 0;
}

static const char *jstr(const cJSON *o, const char *name) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static cJSON *jobj(const cJSON *o, const char *name) {
    return o ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
}

static int add_str(cJSON *o, const char *name, const char *v) {
    return cJSON_AddStringToObject(o, name, v) != NULL;
}

static int add_ll(cJSON *o, const char *name, long long v) {
    char num[24];
    snprintf(num, sizeof num, "%lld", v);
    return add_str(o, name, num);
}

/* Adds name: base64(s, len). */
static int add_b64(cJSON *o, const char *name, const char *s, size_t len) {
    char *e = b64_enc(s, len);
    if (!e) return 0;
    int ok = add_str(o, name, e);
    free(e);
    return ok;
}

/* The end of a prefix range: the prefix with its last byte incremented
 * (prefixes here end in '/', so no carry). */
static int add_prefix_range(cJSON *o, const char *prefix, size_t len) {
    char *end = malloc(len);
    if (!end) return 0;
    memcpy(end, prefix, len);
    end[len - 1]++;
    int ok = add_b64(o, "key", prefix, len) && add_b64(o, "range_end", end, len);
    free(end);
    return ok;
}

#define OOM(err) dl_seterr(err, DLOCK_ENOMEM, "out of memory")

/* ---- leases ---- */

/* etcd's largest lease TTL (MaxLeaseTTL), in seconds */
#define ETCD_MAX_TTL_S 9000000000LL

/* lease_ms rounded up to whole seconds, at most etcd's largest TTL. */
static int64_t lease_secs(int64_t lease_ms) {
    int64_t s = lease_ms / 1000 + (lease_ms % 1000 != 0);
    return s > ETCD_MAX_TTL_S ? ETCD_MAX_TTL_S : s;
}

static int lease_grant(etcd_client *ec, CURL *h, int64_t ttl_s, long long *id, int64_t *granted,
                       dl_err *err) {
    cJSON *q = cJSON_CreateObject();
    if (!q || !add_ll(q, "TTL", ttl_s)) {
        cJSON_Delete(q);
        return OOM(err);
    }
    cJSON *r = NULL;
    int rc = rpc(ec, h, "/v3/lease/grant", q, req_timeout(ec), &r, NULL, err);
    if (rc) return rc;
    *id = jnum(r, "ID");
    *granted = jnum(r, "TTL");
    const char *e = jstr(r, "error");
    if (!*id || *granted <= 0) {
        rc = dl_seterr(err, DLOCK_ESERVER, "etcd: lease grant: %s", e && *e ? e : "no lease");
    }
    cJSON_Delete(r);
    return rc;
}

/* Best effort. */
static void lease_revoke(etcd_client *ec, CURL *h, long long id) {
    cJSON *q = cJSON_CreateObject();
    if (!q || !add_ll(q, "ID", id)) {
        cJSON_Delete(q);
        return;
    }
    cJSON *r = NULL;
    int gcode = 0;
    dl_err e = {0};
    if (!rpc(ec, h, "/v3/lease/revoke", q, req_timeout(ec), &r, &gcode, &e)) cJSON_Delete(r);
}

/* One keep-alive: *alive 1 (TTL renewed), 0 (the lease is gone). */
static int lease_keepalive(etcd_client *ec, CURL *h, long long id, int *alive, dl_err *err) {
    cJSON *q = cJSON_CreateObject();
    if (!q || !add_ll(q, "ID", id)) {
        cJSON_Delete(q);
        return OOM(err);
    }
    cJSON *r = NULL;
    int gcode = 0;
    int rc = rpc(ec, h, "/v3/lease/keepalive", q, req_timeout(ec), &r, &gcode, err);
    if (rc) return rc;
    if (gcode) {
        *alive = 0;
        if (gcode != 5) {
            const char *m = jstr(r, "message");
            rc = dl_seterr(err, DLOCK_ESERVER, "etcd: keep-alive: %s", m ? m : "error");
        }
    } else {
        *alive = jnum(jobj(r, "result"), "TTL") > 0;
    }
    cJSON_Delete(r);
    return rc;
}

/* ---- the keep-alive thread ---- */

static void ka_remove_locked(etcd_client *ec, etcd_lock *el) {
    if (!el->kept) return;
    for (etcd_lock **p = &ec->ka_list; *p; p = &(*p)->next) {
        if (*p == el) {
            *p = el->next;
            break;
        }
    }
    el->next = NULL;
    el->kept = 0;
}

/* Marks el lost and runs its callback, on the keep-alive thread (ka_mu held). */
static void ka_lost_locked(etcd_client *ec, etcd_lock *el) {
    atomic_store(&el->lost, 1);
    if (el->l) {
        atomic_store(&el->l->lease.lost, 1);
        /* the lost-lease callback, as the Redis watchdog runs it (on this
         * thread; registered before the acquire) */
        if (el->l->lease.on_lost) el->l->lease.on_lost(&el->l->lease, DLOCK_LOST_TAKEN);
    } else {
        dl_semaphore_lost(el->sem, DLOCK_LOST_TAKEN);
    }
    ka_remove_locked(ec, el);
}

/* A kept lock hold as seen for a check of its key (ka_check). */
typedef struct ka_seen {
    etcd_lock *el;
    char *key;
    size_t key_len;
    long long rev, lease;
    int gone;
} ka_seen;

static int ka_check(etcd_client *ec, CURL *h, ka_seen *seen, size_t n, long long *rev);

/* The keep-alive thread: every third of the watchdog TTL, one keep-alive of
 * the session lease (while there is one) and one per entry holding a lease of
 * its own (semaphore acquisitions). A session lease found gone is dropped, and
 * every session hold whose lease is not the current session lease is lost: all
 * the holds of a lost session at once. Then one txn of compares (ka_check)
 * finds a kept hold's key put again by another client in place (its lease or
 * create_revision changed): the client's watch sees deletions only (NOPUT:
 * its own puts would come back as events on every acquire), so such a put is
 * noticed here, within one round. */
static void *ka_main(void *arg) {
    etcd_client *ec = arg;
    CURL *h = curl_easy_init();
    int64_t period = ec->wd_ttl_s * 1000 / 3;
    if (period < 200) period = 200;
    pthread_mutex_lock(&ec->ka_mu);
    while (!ec->ka_stop) {
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
            sess_gone = !lease_keepalive(ec, h, sess, &alive, &e) && !alive;
        }
        for (size_t i = 0; i < k && h; i++) {
            int alive = 1;
            dl_err e = {0};
            if (lease_keepalive(ec, h, ids[i], &alive, &e) || alive) {
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
        int checked = m && h && ka_check(ec, h, seen, m, &crev) == 0;
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
            if (lost) ka_lost_locked(ec, el);
        }
        for (size_t i = 0; i < m; i++) free(seen[i].key);
        free(seen);
        free(ids);
        if (ec->ka_stop) break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += period / 1000;
        ts.tv_nsec += (period % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&ec->ka_cv, &ec->ka_mu, &ts);
    }
    pthread_mutex_unlock(&ec->ka_mu);
    if (h) curl_easy_cleanup(h);
    return NULL;
}

static int ka_start_locked(etcd_client *ec, dl_err *err) {
    if (ec->ka_started) return DLOCK_OK;
    int prc = pthread_create(&ec->ka_thread, NULL, ka_main, ec);
    if (prc)
        return dl_seterr(err, DLOCK_ESYS, "etcd: cannot start the keep-alive thread: %s",
                         strerror(prc));
    ec->ka_started = 1;
    return DLOCK_OK;
}

static int cw_start_locked(etcd_client *ec, dl_err *err);
static int cw_admit_locked(etcd_client *ec, etcd_lock *el);
static void cw_wake(etcd_client *ec);

/* Adds el to the keep-alive list (a lock hold: to the client's watch too,
 * el->wfrom set). A session hold whose lease is no longer
 * the session lease (found gone meanwhile) is not added: *stale 1 (may be
 * NULL for the others). */
static int ka_add(etcd_client *ec, etcd_lock *el, int *stale, dl_err *err) {
    if (stale) *stale = 0;
    pthread_mutex_lock(&ec->ka_mu);
    int rc = ka_start_locked(ec, err);
    if (!rc && el->l) rc = cw_start_locked(ec, err);
    if (!rc && el->session && el->lease != ec->sess) {
        if (stale) *stale = 1;
    } else if (!rc && !el->kept && el->l && cw_admit_locked(ec, el)) {
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
static int sess_get(etcd_client *ec, CURL *h, long long *id, int64_t *ttl_s, dl_err *err) {
    pthread_mutex_lock(&ec->sess_mu);
    pthread_mutex_lock(&ec->ka_mu);
    long long cur = ec->sess;
    pthread_mutex_unlock(&ec->ka_mu);
    int rc = DLOCK_OK;
    int64_t granted = 0;
    if (!cur) {
        rc = lease_grant(ec, h, ec->wd_ttl_s, &cur, &granted, err);
        if (!rc) {
            pthread_mutex_lock(&ec->ka_mu);
            rc = ka_start_locked(ec, err);
            if (!rc) {
                ec->sess = cur;
                ec->sess_ttl = granted;
            }
            pthread_mutex_unlock(&ec->ka_mu);
            if (rc) lease_revoke(ec, h, cur);
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
static void sess_drop(etcd_client *ec, long long id) {
    pthread_mutex_lock(&ec->ka_mu);
    if (ec->sess == id) ec->sess = 0;
    pthread_cond_broadcast(&ec->ka_cv);
    pthread_mutex_unlock(&ec->ka_mu);
}

/* Returns whether it was kept. */
static int ka_del(etcd_client *ec, etcd_lock *el) {
    pthread_mutex_lock(&ec->ka_mu);
    int was = el->kept;
    ka_remove_locked(ec, el);
    pthread_mutex_unlock(&ec->ka_mu);
    return was;
}

/* ---- client ---- */

static void etcd_close(dlock_client *c) {
    etcd_client *ec = c->bctx;
    if (!ec) return;
    pthread_mutex_lock(&ec->ka_mu);
    int started = ec->ka_started;
    ec->ka_stop = 1;
    pthread_cond_broadcast(&ec->ka_cv);
    int cw = ec->cw_started;
    cw_wake(ec);
    pthread_mutex_unlock(&ec->ka_mu);
    if (started) pthread_join(ec->ka_thread, NULL);
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
    if (ec->sess && !sess_holds && ec->curl) lease_revoke(ec, ec->curl, ec->sess);
    if (ec->curl) curl_easy_cleanup(ec->curl);
    for (size_t i = 0; i < ec->neps; i++) free(ec->eps[i]);
    free(ec->ca_file);
    free(ec->ca_dir);
    free(ec->cert_file);
    free(ec->key_file);
    pthread_mutex_destroy(&ec->mu);
    pthread_mutex_destroy(&ec->ka_mu);
    pthread_mutex_destroy(&ec->sess_mu);
    pthread_cond_destroy(&ec->ka_cv);
    pthread_cond_destroy(&ec->cw_cv);
    free(ec);
    c->bctx = NULL;
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
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ec->ka_cv, &ca);
    pthread_cond_init(&ec->cw_cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&ec->cur, 0);
    c->bctx = ec;
    ec->connect_ms = c->connect_timeout_ms;
    ec->cmd_ms = c->command_timeout_ms;
    ec->wd_ttl_s = lease_secs(c->watchdog_lease_ms);
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
    int rc = rpc(ec, ec->curl, "/version", NULL, req_timeout(ec), &r, NULL, err);
    pthread_mutex_unlock(&ec->mu);
    if (!rc && !jstr(r, "etcdserver"))
        rc = dl_seterr(err, DLOCK_EPROTO, "etcd: /version: not an etcd server");
    cJSON_Delete(r);
    return rc;
}

/* A call on the client's own handle. */
static int client_rpc(etcd_client *ec, const char *path, cJSON *req, cJSON **resp, int *gcode,
                      dl_err *err) {
    pthread_mutex_lock(&ec->mu);
    int rc = rpc(ec, ec->curl, path, req, req_timeout(ec), resp, gcode, err);
    pthread_mutex_unlock(&ec->mu);
    return rc;
}

static int etcd_ping(dlock_client *c, int64_t *rtt_us, dl_err *err) {
    int64_t t0 = dl_now_us();
    cJSON *r = NULL;
    int rc = client_rpc(c->bctx, "/version", NULL, &r, NULL, err);
    cJSON_Delete(r);
    if (!rc && rtt_us) *rtt_us = dl_now_us() - t0;
    return rc;
}

/* ---- keys ---- */

/* "dlock/<what>/<len>/<name>/" + sub (NULL: nothing). */
static char *what_prefix(const char *what, const char *name, size_t len, const char *sub,
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
static char *name_prefix(const char *name, size_t len, const char *sub, size_t *outlen) {
    return what_prefix("lock", name, len, sub, outlen);
}

/* The oldest (newest: the newest) key under prefix created before max_rev
 * (0: any): *kv (a reference into *resp, which the caller deletes) or NULL;
 * *rev the header revision. all: every such key (keys only), in *resp's kvs. */
static int get_owner(etcd_client *ec, CURL *h, const char *prefix, size_t plen, long long max_rev,
                     int newest, int all, cJSON **resp, cJSON **kv, long long *rev, dl_err *err) {
    *resp = NULL;
    *kv = NULL;
    cJSON *q = cJSON_CreateObject();
    if (!q || !add_prefix_range(q, prefix, plen) ||
        !add_str(q, "sort_order", newest ? "DESCEND" : "ASCEND") ||
        !add_str(q, "sort_target", "CREATE") || (!all && !add_ll(q, "limit", 1)) ||
        (all && !cJSON_AddTrueToObject(q, "keys_only")) ||
        (max_rev > 0 && !add_ll(q, "max_create_revision", max_rev))) {
        cJSON_Delete(q);
        return OOM(err);
    }
    int rc = rpc(ec, h, "/v3/kv/range", q, req_timeout(ec), resp, NULL, err);
    if (rc) return rc;
    cJSON *kvs = jobj(*resp, "kvs");
    if (cJSON_IsArray(kvs) && cJSON_GetArraySize(kvs) > 0) *kv = cJSON_GetArrayItem(kvs, 0);
    if (rev) *rev = jnum(jobj(*resp, "header"), "revision");
    return DLOCK_OK;
}

/* The create_revision of el's key now (0: gone), its lease and the revision
 * read at (lease, hrev: may be NULL). */
static int key_state(etcd_client *ec, CURL *h, etcd_lock *el, long long *crev, long long *lease,
                     long long *hrev, dl_err *err) {
    cJSON *q = cJSON_CreateObject();
    if (!q || !add_b64(q, "key", el->key, el->key_len)) {
        cJSON_Delete(q);
        return OOM(err);
    }
    cJSON *r = NULL;
    int rc = rpc(ec, h, "/v3/kv/range", q, req_timeout(ec), &r, NULL, err);
    if (rc) return rc;
    cJSON *kvs = jobj(r, "kvs");
    cJSON *kv = cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
    *crev = kv ? jnum(kv, "create_revision") : 0;
    if (lease) *lease = kv ? jnum(kv, "lease") : 0;
    if (hrev) *hrev = jnum(jobj(r, "header"), "revision");
    cJSON_Delete(r);
    return DLOCK_OK;
}

/* etcd's default limit of operations (compares too) in one txn
 * (--max-txn-ops): a check of more holds takes several txns. Two compares
 * per hold. */
#define ETCD_CHECK_PER_TXN 64

/* Sets seen[i].gone for every hold whose key is no longer its own: gone, or
 * re-created (another create_revision), or put again under another lease (a
 * foreign put). One txn of compares per ETCD_CHECK_PER_TXN holds answers "all
 * still ours" in the usual case; when it fails, each key of that batch is
 * read. *rev: a revision at which every hold not gone was still its own (the
 * oldest txn's). -1 when a request failed: nothing is decided. */
static int ka_check(etcd_client *ec, CURL *h, ka_seen *seen, size_t n, long long *rev) {
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
            ok = c1 && c2 && add_b64(c1, "key", seen[i].key, seen[i].key_len) &&
                 add_str(c1, "target", "CREATE") &&
                 add_ll(c1, "create_revision", seen[i].rev) &&
                 add_b64(c2, "key", seen[i].key, seen[i].key_len) &&
                 add_str(c2, "target", "LEASE") && add_ll(c2, "lease", seen[i].lease);
        }
        if (!ok) {
            cJSON_Delete(q);
            return -1;
        }
        cJSON *r = NULL;
        dl_err ignored = {0};
        if (rpc(ec, h, "/v3/kv/txn", q, req_timeout(ec), &r, NULL, &ignored)) return -1;
        int all = cJSON_IsTrue(jobj(r, "succeeded"));
        long long hrev = jnum(jobj(r, "header"), "revision");
        if (!*rev || hrev < *rev) *rev = hrev;
        cJSON_Delete(r);
        if (all) continue;
        for (size_t i = b; i < e; i++) {
            etcd_lock probe = {.key = seen[i].key, .key_len = seen[i].key_len};
            long long crev = 0, lease = 0;
            if (key_state(ec, h, &probe, &crev, &lease, NULL, &ignored)) return -1;
            seen[i].gone = crev != seen[i].rev || lease != seen[i].lease;
        }
    }
    return 0;
}

/* ---- the client's watch ----
 * One streaming watch per client (its own thread and curl handle) on the
 * range spanning the keys of the holds it keeps (DLOCK_WATCHDOG holds),
 * started with its first such hold: a DELETE of a kept hold's key loses that
 * hold at once with its callback. The keys, not the locks' prefixes: the
 * other contenders' keys of a name stay out of the range (unless they sort
 * between two kept keys), so their acquires and releases send this client
 * nothing. Deletions only (the NOPUT filter): every acquire's own put would
 * otherwise come back on the stream; a key put again in place by another
 * client is found by the keep-alive round's check (ka_main), and a key
 * deleted and created again shows its DELETE here. A handle's key is the
 * same for all its holds on one session lease (put_and_own), so a handle
 * acquiring again stays inside the range. Not on the keep-alive thread: its requests
 * block for up to a request timeout, and an event must not wait for them.
 * The range only grows while the stream lives (a hold outside it restarts
 * the stream on the union, from the revision the new hold needs); it is
 * narrowed to the holds' span when the stream is reopened: after the client
 * kept no hold for a keep-alive period (the stream is then closed), or after
 * a failure. A broken stream resumes from the revision after the last event
 * it handled; when etcd has compacted that revision away, one txn of
 * compares (ka_check) checks every kept hold and the stream resumes after
 * it. A dead connection without a reset is found by TCP keep-alive probes. */

static int keycmp(const char *a, size_t al, const char *b, size_t bl) {
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (al > bl) - (al < bl);
}

/* Sets *dst to a copy of src (len bytes), its last byte plus 1 when inc. */
static int cw_set(char **dst, size_t *dlen, const char *src, size_t len, int inc) {
    char *p = malloc(len ? len : 1);
    if (!p) return 0;
    memcpy(p, src, len);
    if (inc && len) p[len - 1]++;
    free(*dst);
    *dst = p;
    *dlen = len;
    return 1;
}

/* Grows the range [*lo, *hi) (none when *lo is NULL) to take in [alo,
 * ahi). 0 when out of memory. */
static int cw_union(char **lo, size_t *lol, char **hi, size_t *hil, const char *alo,
                    size_t alol, const char *ahi, size_t ahil) {
    if ((!*lo || keycmp(alo, alol, *lo, *lol) < 0) && !cw_set(lo, lol, alo, alol, 0)) return 0;
    if ((!*hi || keycmp(ahi, ahil, *hi, *hil) > 0) && !cw_set(hi, hil, ahi, ahil, 0)) return 0;
    return 1;
}

/* The same with the one key (its end: the key and a 0 byte, the next key). */
static int cw_grow(char **lo, size_t *lol, char **hi, size_t *hil, const char *key,
                   size_t klen) {
    char *end = malloc(klen + 1);
    if (!end) return 0;
    memcpy(end, key, klen);
    end[klen] = '\0';
    int ok = cw_union(lo, lol, hi, hil, key, klen, end, klen + 1);
    free(end);
    return ok;
}

static void cw_wake(etcd_client *ec) {
    pthread_cond_broadcast(&ec->cw_cv);
#if LIBCURL_VERSION_NUM >= 0x074400
    if (ec->cw_multi) curl_multi_wakeup(ec->cw_multi);
#endif
}

/* Whether the event on key ends el's hold: after wfrom, a delete, or a put
 * of another create_revision or lease. */
static int cw_ends(const etcd_lock *el, const cw_event *e) {
    return e->mod_rev > el->wfrom && e->key_len == el->key_len &&
           !memcmp(e->key, el->key, e->key_len) &&
           (e->del || e->create_rev != el->rev || e->lease != el->lease);
}

/* How long a kept hold the stream does not cover waits for it: a hold
 * released sooner never (re)starts the stream, so that short holds (an
 * uncontended acquire + release takes about 2 ms) cost no stream and no
 * event; a deletion in that time is seen when the stream replays from the
 * hold's revision, or by the release (DLOCK_ELOST). */
#define CW_LAZY_MS 50

/* ka_mu held. Whether the stream saw el's key deleted or replaced after
 * el->wfrom, before el was kept (the events that concerned no kept hold are
 * in the ring). When the stream does not cover el from wfrom on (not open,
 * el's key outside its range, or ring entries dropped since), it is
 * restarted CW_LAZY_MS later (if el is still kept) to replay el's events: 0. */
static int cw_admit_locked(etcd_client *ec, etcd_lock *el) {
    int covered = ec->cw_live && ec->cw_lo && ec->cw_start <= el->wfrom + 1 &&
                  ec->cw_ring_floor <= el->wfrom &&
                  keycmp(el->key, el->key_len, ec->cw_lo, ec->cw_lo_len) >= 0 &&
                  keycmp(el->key, el->key_len, ec->cw_hi, ec->cw_hi_len) < 0;
    if (!covered) {
        /* the restart takes in el's key even if el is released by then: the
         * handle's next hold on the session reuses it, and is then covered */
        cw_grow(&ec->cw_add_lo, &ec->cw_add_lo_len, &ec->cw_add_hi, &ec->cw_add_hi_len,
                el->key, el->key_len);
        el->wreplay = 1;
        el->wdue = dl_now_ms() + CW_LAZY_MS;
        cw_wake(ec);
        return 0;
    }
    for (size_t i = 0; i < CW_RING; i++)
        if (ec->cw_ring[i].key && cw_ends(el, &ec->cw_ring[i])) return 1;
    return 0;
}

/* ka_mu held: one event; the key is the ring's (owned) when it ends no kept
 * hold. */
static void cw_event_locked(etcd_client *ec, cw_event *e) {
    int kept = 0;
    for (etcd_lock *el = ec->ka_list, *next; el; el = next) {
        next = el->next;
        if (!el->l || el->key_len != e->key_len || memcmp(el->key, e->key, e->key_len)) continue;
        kept = 1;
        if (cw_ends(el, e)) ka_lost_locked(ec, el);
    }
    if (e->mod_rev + 1 > ec->cw_next) ec->cw_next = e->mod_rev + 1;
    if (kept) {
        free(e->key);
        return;
    }
    cw_event *slot = &ec->cw_ring[ec->cw_ring_pos];
    if (slot->key && slot->mod_rev > ec->cw_ring_floor) ec->cw_ring_floor = slot->mod_rev;
    free(slot->key);
    *slot = *e;
    ec->cw_ring_pos = (ec->cw_ring_pos + 1) % CW_RING;
}

typedef struct cw_stream {
    etcd_client *ec;
    char *p;
    size_t n, cap;
    int created, compacted, failed; /* what the stream said */
} cw_stream;

/* One line of the stream: 1 when it ends the stream. */
static int cw_line(cw_stream *st, const char *line) {
    cJSON *j = cJSON_Parse(line);
    if (!j) return 0;
    cJSON *res = jobj(j, "result");
    int stop = 0;
    if (jobj(j, "error") || !res) {
        st->failed = stop = 1;
    } else if (cJSON_IsTrue(jobj(res, "canceled"))) {
        st->compacted = jnum(res, "compact_revision") > 0;
        st->failed = stop = 1;
    } else {
        if (cJSON_IsTrue(jobj(res, "created"))) st->created = 1;
        cJSON *evs = jobj(res, "events"), *ev;
        etcd_client *ec = st->ec;
        pthread_mutex_lock(&ec->ka_mu);
        cJSON_ArrayForEach(ev, evs) {
            cJSON *kv = jobj(ev, "kv");
            const char *k = jstr(kv, "key");
            if (!k) continue;
            size_t cap = strlen(k) / 4 * 3 + 4;
            cw_event e = {.key = malloc(cap)};
            if (!e.key) { /* unmatched: the hold is checked when the stream restarts */
                st->failed = stop = 1;
                break;
            }
            e.key_len = b64_dec(k, e.key, cap);
            e.mod_rev = jnum(kv, "mod_revision");
            e.create_rev = jnum(kv, "create_revision");
            e.lease = jnum(kv, "lease");
            const char *type = jstr(ev, "type");
            e.del = type && !strcmp(type, "DELETE");
            cw_event_locked(ec, &e);
        }
        pthread_mutex_unlock(&ec->ka_mu);
    }
    cJSON_Delete(j);
    return stop;
}

static size_t cw_on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    cw_stream *st = ud;
    size_t len = size * nmemb;
    if (st->n + len + 1 > ETCD_MAX_BODY) return 0;
    if (st->n + len + 1 > st->cap) {
        size_t cap = st->cap ? st->cap : 4096;
        while (cap < st->n + len + 1) cap *= 2;
        char *p = realloc(st->p, cap);
        if (!p) return 0;
        st->p = p;
        st->cap = cap;
    }
    memcpy(st->p + st->n, ptr, len);
    st->n += len;
    st->p[st->n] = '\0';
    char *start = st->p, *nl;
    while ((nl = memchr(start, '\n', st->n - (size_t)(start - st->p)))) {
        *nl = '\0';
        if (cw_line(st, start)) return 0; /* ends the transfer */
        start = nl + 1;
    }
    st->n -= (size_t)(start - st->p);
    memmove(st->p, start, st->n + 1);
    return len;
}


/* ka_mu held: the request body of the stream to open (NULL: none to open,
 * or out of memory), and its range and start revision set: the kept holds'
 * span, plus the old range when resuming; from the revision after the last
 * one handled, or earlier for a hold to replay. */
static char *cw_request_locked(etcd_client *ec) {
    long long start = ec->cw_live ? (ec->cw_next > 0 ? ec->cw_next : ec->cw_start) : LLONG_MAX;
    char *lo = NULL, *hi = NULL;
    size_t lol = 0, hil = 0;
    int ok = 1;
    if (ec->cw_live && ec->cw_lo) {
        ok = cw_set(&lo, &lol, ec->cw_lo, ec->cw_lo_len, 0) &&
             cw_set(&hi, &hil, ec->cw_hi, ec->cw_hi_len, 0);
    }
    if (ok && ec->cw_add_lo)
        ok = cw_union(&lo, &lol, &hi, &hil, ec->cw_add_lo, ec->cw_add_lo_len, ec->cw_add_hi,
                      ec->cw_add_hi_len);
    for (etcd_lock *el = ec->ka_list; el && ok; el = el->next) {
        if (!el->l) continue;
        if ((el->wreplay || !ec->cw_live) && el->wfrom + 1 < start) start = el->wfrom + 1;
        ok = cw_grow(&lo, &lol, &hi, &hil, el->key, el->key_len);
    }
    if (!ok || !lo || start == LLONG_MAX) {
        free(lo);
        free(hi);
        return NULL;
    }
    cJSON *q = cJSON_CreateObject();
    cJSON *cr = q ? cJSON_AddObjectToObject(q, "create_request") : NULL;
    char *body = NULL;
    cJSON *f = cr ? cJSON_AddArrayToObject(cr, "filters") : NULL;
    cJSON *np = cJSON_CreateString("NOPUT");
    if (f && np) {
        cJSON_AddItemToArray(f, np);
        np = NULL;
    }
    cJSON_Delete(np);
    if (f && add_b64(cr, "key", lo, lol) && add_b64(cr, "range_end", hi, hil) &&
        add_ll(cr, "start_revision", start))
        body = cJSON_PrintUnformatted(q);
    cJSON_Delete(q);
    if (!body) {
        free(lo);
        free(hi);
        return NULL;
    }
    free(ec->cw_lo);
    free(ec->cw_hi);
    free(ec->cw_add_lo);
    free(ec->cw_add_hi);
    ec->cw_add_lo = ec->cw_add_hi = NULL;
    ec->cw_lo = lo;
    ec->cw_lo_len = lol;
    ec->cw_hi = hi;
    ec->cw_hi_len = hil;
    ec->cw_start = start;
    ec->cw_next = 0;
    ec->cw_live = 1;
    ec->cw_restart = 0;
    for (etcd_lock *el = ec->ka_list; el; el = el->next) el->wreplay = 0;
    return body;
}

/* The fallback when the stream cannot resume (its revision compacted): every
 * kept lock hold checked by ka_check; the stream resumes after the revision
 * checked at. ka_mu held, released meanwhile. 0, or -1 (try again later). */
static int cw_check_locked(etcd_client *ec, CURL *h) {
    size_t ns = 0;
    for (etcd_lock *el = ec->ka_list; el; el = el->next) ns += el->l != NULL;
    if (!ns) {
        ec->cw_live = 0; /* the next hold opens a new stream */
        return 0;
    }
    ka_seen *seen = calloc(ns, sizeof *seen);
    size_t m = 0;
    for (etcd_lock *el = ec->ka_list; el && seen; el = el->next) {
        if (!el->l) continue;
        char *kc = malloc(el->key_len);
        if (!kc) break;
        memcpy(kc, el->key, el->key_len);
        seen[m++] = (ka_seen){el, kc, el->key_len, el->rev, el->lease, 0};
    }
    /* a hold kept meanwhile cannot rely on the ring: it replays */
    ec->cw_ring_floor = LLONG_MAX;
    pthread_mutex_unlock(&ec->ka_mu);
    long long rev = 0;
    int rc = seen && m == ns && h ? ka_check(ec, h, seen, m, &rev) : -1;
    pthread_mutex_lock(&ec->ka_mu);
    if (!rc) {
        for (etcd_lock *el = ec->ka_list, *next; el; el = next) {
            next = el->next;
            for (size_t i = 0; i < m; i++) {
                /* the same hold (one acquisition: its key's revision) as checked */
                if (seen[i].el != el || seen[i].rev != el->rev) continue;
                if (seen[i].gone) ka_lost_locked(ec, el);
                else if (el->wfrom < rev) el->wfrom = rev;
                break;
            }
        }
        ec->cw_ring_floor = rev;
        ec->cw_next = rev + 1;
    }
    for (size_t i = 0; i < m; i++) free(seen[i].key);
    free(seen);
    return rc;
}

static void *cw_main(void *arg) {
    etcd_client *ec = arg;
    CURLM *m = ec->cw_multi;
    CURL *h = curl_easy_init(), *hc = curl_easy_init();
    cw_stream st = {.ec = ec};
    char ebuf[CURL_ERROR_SIZE];
    int64_t period = ec->wd_ttl_s * 1000 / 3;
    if (period < 200) period = 200;
    int64_t idle_since = 0, retry_at = 0, backoff = 0;
    size_t fails = 0;
    int running = 0;
    char *body = NULL;
    pthread_mutex_lock(&ec->ka_mu);
    while (!ec->ka_stop && h) {
        int holds = 0;
        int64_t now = dl_now_ms(), due = INT64_MAX;
        for (etcd_lock *el = ec->ka_list; el; el = el->next) {
            holds += el->l != NULL;
            if (el->l && el->wreplay && el->wdue < due) due = el->wdue;
        }
        if (due <= now) ec->cw_restart = 1;
        if (holds) {
            idle_since = 0;
        } else if (!idle_since) {
            idle_since = now;
        }
        if (!holds && (!running || now - idle_since >= period)) {
            /* nothing kept for a while: the stream closes (reopened on the
             * holds' span by the next one) */
            if (running) curl_multi_remove_handle(m, h);
            running = 0;
            ec->cw_live = 0;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&ec->cw_cv, &ec->ka_mu, &ts);
            continue;
        }
        if (holds && ((!running && ec->cw_live) || ec->cw_restart) && now >= retry_at) {
            if (running) curl_multi_remove_handle(m, h);
            running = 0;
            free(body);
            body = cw_request_locked(ec);
            if (body) {
                char url[600];
                snprintf(url, sizeof url, "%s/v3/watch",
                         ec->eps[(atomic_load(&ec->cur) + fails) % ec->neps]);
                curl_setup(ec, h, url, ebuf, 0);
                curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, cw_on_data);
                curl_easy_setopt(h, CURLOPT_WRITEDATA, &st);
                curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
                curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
                curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
                curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, (long)(period / 1000 + 1));
                curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 1L);
                st.n = 0;
                st.created = st.compacted = st.failed = 0;
                running = curl_multi_add_handle(m, h) == CURLM_OK;
            }
            if (!running) retry_at = now + 1000;
        }
        if (!running) {
            /* until a pending hold is due, or the retry */
            int64_t until = now + 100;
            if (retry_at > now && retry_at < until) until = retry_at;
            if (due > now && due < until) until = due;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t ns = (int64_t)ts.tv_nsec + (until - now) * 1000000;
            ts.tv_sec += (time_t)(ns / 1000000000);
            ts.tv_nsec = (long)(ns % 1000000000);
            pthread_cond_timedwait(&ec->cw_cv, &ec->ka_mu, &ts);
            continue;
        }
        int64_t poll_ms = due > now && due - now < 1000 ? due - now : 1000;
        pthread_mutex_unlock(&ec->ka_mu);
        int done = 0;
        CURLcode res = CURLE_OK;
        if (running) {
            int still = 0;
            curl_multi_perform(m, &still);
            CURLMsg *msg;
            int left = 0;
            while ((msg = curl_multi_info_read(m, &left)))
                if (msg->msg == CURLMSG_DONE) {
                    done = 1;
                    res = msg->data.result;
                }
            if (!done) {
#if LIBCURL_VERSION_NUM >= 0x074400
                curl_multi_poll(m, NULL, 0, (int)poll_ms, NULL);
#else
                curl_multi_wait(m, NULL, 0, poll_ms < 100 ? (int)poll_ms : 100, NULL);
#endif
            }
        }
        pthread_mutex_lock(&ec->ka_mu);
        if (!done) continue;
        curl_multi_remove_handle(m, h);
        running = 0;
        if (st.created) backoff = 0;
        if (conn_failure(res)) fails++;
        if (st.compacted && cw_check_locked(ec, hc) == 0) {
            retry_at = 0;
            continue;
        }
        /* broken (or the check failed): resume after a pause */
        backoff = backoff ? (backoff * 2 > 1000 ? 1000 : backoff * 2) : 50;
        retry_at = dl_now_ms() + backoff;
    }
    if (running) curl_multi_remove_handle(m, h);
    ec->cw_live = 0;
    pthread_mutex_unlock(&ec->ka_mu);
    free(body);
    free(st.p);
    if (h) curl_easy_cleanup(h);
    if (hc) curl_easy_cleanup(hc);
    return NULL;
}

static int cw_start_locked(etcd_client *ec, dl_err *err) {
    if (ec->cw_started) return DLOCK_OK;
    if (!ec->cw_multi && !(ec->cw_multi = curl_multi_init())) return OOM(err);
    int prc = pthread_create(&ec->cw_thread, NULL, cw_main, ec);
    if (prc)
        return dl_seterr(err, DLOCK_ESYS, "etcd: cannot start the watch thread: %s",
                         strerror(prc));
    ec->cw_started = 1;
    return DLOCK_OK;
}

/* Watches key (base64; with range_end, base64, the keys in [key, end)) from
 * revision from, for at most ms: DLOCK_OK at the first event (a deletion
 * only, with noput) or when the time passed (the caller looks again);
 * DLOCK_ECANCELED when cx (may be NULL) is cancelled. */
static int watch_keys(etcd_client *ec, CURL *h, const char *key_b64, const char *end_b64,
                      int noput, long long from, int64_t ms, dl_cancel *cx, dl_err *err) {
    cJSON *q = cJSON_CreateObject();
    cJSON *cr = q ? cJSON_AddObjectToObject(q, "create_request") : NULL;
    cJSON *f = cr ? cJSON_AddArrayToObject(cr, "filters") : NULL;
    cJSON *np = noput ? cJSON_CreateString("NOPUT") : NULL;
    if (!f || (noput && !np) || !add_str(cr, "key", key_b64) ||
        (end_b64 && !add_str(cr, "range_end", end_b64)) || !add_ll(cr, "start_revision", from)) {
        cJSON_Delete(np);
        cJSON_Delete(q);
        return OOM(err);
    }
    if (np) cJSON_AddItemToArray(f, np);
    char *body = cJSON_PrintUnformatted(q);
    cJSON_Delete(q);
    if (!body) return OOM(err);
    http_buf b = {0};
    b.stream = 1;
    long status = 0;
    int rc = http_do_cx(ec, h, "/v3/watch", body, ms, cx, &b, &status, err);
    free(b.p);
    free(body);
    if (!rc && !b.event && status != 200 && status != 0)
        return dl_seterr(err, DLOCK_ESERVER, "etcd: watch: HTTP %ld", status);
    if (!rc && !b.event && status == 200) dl_sleep_ms(50); /* closed early: not too fast */
    return rc;
}

/* One txn on key: when its target revision ("CREATE" or "MOD") is rev, a
 * put of value (with lease, when not 0), or a delete when value is NULL.
 * *done: whether it ran. */
static int txn_if(etcd_client *ec, CURL *h, const char *key, size_t key_len, const char *target,
                  long long rev, const char *value, size_t value_len, long long lease, int *done,
                  dl_err *err) {
    *done = 0;
    cJSON *q = cJSON_CreateObject();
    cJSON *cmp = q ? cJSON_AddArrayToObject(q, "compare") : NULL;
    cJSON *succ = q ? cJSON_AddArrayToObject(q, "success") : NULL;
    cJSON *c1 = cJSON_CreateObject(), *o1 = cJSON_CreateObject();
    cJSON *op = o1 ? cJSON_AddObjectToObject(o1, value ? "request_put" : "request_delete_range")
                   : NULL;
    int ok = cmp && succ && c1 && op && add_b64(c1, "key", key, key_len) &&
             add_str(c1, "target", target) &&
             add_ll(c1, strcmp(target, "MOD") ? "create_revision" : "mod_revision", rev) &&
             add_b64(op, "key", key, key_len) &&
             (!value || add_b64(op, "value", value, value_len)) &&
             (!lease || add_ll(op, "lease", lease));
    if (!ok) {
        cJSON_Delete(c1);
        cJSON_Delete(o1);
        cJSON_Delete(q);
        return OOM(err);
    }
    cJSON_AddItemToArray(cmp, c1);
    cJSON_AddItemToArray(succ, o1);
    cJSON *r = NULL;
    int rc = rpc(ec, h, "/v3/kv/txn", q, req_timeout(ec), &r, NULL, err);
    if (rc) return rc;
    *done = cJSON_IsTrue(jobj(r, "succeeded"));
    cJSON_Delete(r);
    return DLOCK_OK;
}

/* ---- lock handles ---- */

static int etcd_lock_init(dlock_lock *l, dl_err *err) {
    etcd_lock *el = calloc(1, sizeof *el);
    if (!el) return OOM(err);
    l->bdata = el;
    el->l = l;
    atomic_init(&el->lost, 0);
    el->reader = l->kind == DLOCK_KIND_READ;
    el->kn = atomic_fetch_add(&((etcd_client *)l->c->bctx)->seq, 1);
    el->prefix = name_prefix(l->name, l->name_len, NULL, &el->prefix_len);
    el->wprefix = name_prefix(l->name, l->name_len, "w/", &el->wprefix_len);
    el->curl = curl_easy_init();
    if (!el->prefix || !el->wprefix || !el->curl) return OOM(err);
    return DLOCK_OK;
}

static void etcd_lock_destroy(dlock_lock *l) {
    etcd_lock *el = l->bdata;
    if (!el) return;
    ka_del(l->c->bctx, el);
    if (el->curl) curl_easy_cleanup(el->curl);
    free(el->prefix);
    free(el->wprefix);
    free(el->key);
    free(el);
    l->bdata = NULL;
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

static int put_and_own(etcd_client *ec, etcd_lock *el, long long id, int *owner, int *nolease,
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
    int ok = cmp && succ && c1 && put && rng && add_b64(c1, "key", el->key, el->key_len) &&
             add_str(c1, "target", "CREATE") && add_ll(c1, "create_revision", 0) &&
             add_b64(put, "key", el->key, el->key_len) &&
             add_b64(put, "value", l->token, l->token_len) && add_ll(put, "lease", id) &&
             (el->reader ? add_prefix_range(rng, el->wprefix, el->wprefix_len)
                         : add_prefix_range(rng, el->prefix, el->prefix_len)) &&
             add_str(rng, "sort_order", "ASCEND") && add_str(rng, "sort_target", "CREATE") &&
             add_ll(rng, "limit", 1) && cJSON_AddTrueToObject(rng, "keys_only");
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
    int rc = rpc(ec, el->curl, "/v3/kv/txn", q, req_timeout(ec), &r, &gcode, err);
    if (rc) return rc;
    if (gcode) {
        const char *m = jstr(r, "message");
        *nolease = gcode == 5 && m && strstr(m, "lease not found");
        rc = dl_seterr(err,
                       gcode == 16 || gcode == 7   ? DLOCK_EAUTH
                       : gcode == 14 || gcode == 4 ? DLOCK_EIO
                                                   : DLOCK_ESERVER,
                       "etcd: /v3/kv/txn: %s (code %d)", m ? m : "error", gcode);
        cJSON_Delete(r);
        return rc;
    }
    if (!cJSON_IsTrue(jobj(r, "succeeded"))) {
        *exists = 1;
        cJSON_Delete(r);
        return DLOCK_OK;
    }
    cJSON *resps = jobj(r, "responses");
    cJSON *pr = jobj(cJSON_GetArrayItem(resps, 0), "response_put");
    cJSON *rr = jobj(cJSON_GetArrayItem(resps, 1), "response_range");
    cJSON *kvs = jobj(rr, "kvs");
    cJSON *kv = cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
    el->rev = jnum(jobj(pr, "header"), "revision");
    if (!pr || !rr || (!kv && !el->reader) || el->rev <= 0) {
        cJSON_Delete(r);
        return dl_seterr(err, DLOCK_EPROTO, "etcd: lock txn: unexpected answer");
    }
    /* exclusive: ours is the oldest key; read: no older exclusive key */
    *owner = el->reader ? !kv || jnum(kv, "create_revision") > el->rev
                        : jnum(kv, "create_revision") == el->rev;
    cJSON_Delete(r);
    return DLOCK_OK;
}

/* Deletes el's key, when its create revision is still el->rev (best effort). */
static void key_drop(etcd_client *ec, etcd_lock *el) {
    int done = 0;
    dl_err e = {0};
    txn_if(ec, el->curl, el->key, el->key_len, "CREATE", el->rev, NULL, 0, 0, &done, &e);
}

/* Gives up an attempt: a session attempt deletes its key, an attempt with a
 * lease of its own revokes the lease (which deletes the key). */
static void attempt_drop(etcd_client *ec, etcd_lock *el, long long id) {
    if (el->session) {
        if (el->rev > 0) key_drop(ec, el);
    } else {
        lease_revoke(ec, el->curl, id);
    }
}

static int etcd_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_try *t,
                        dl_err *err) {
    etcd_client *ec = l->c->bctx;
    etcd_lock *el = l->bdata;
    char nm[80];
    dl_name_msg(l->name, l->name_len, nm, sizeof nm);
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
    int64_t ttl = wd ? ec->wd_ttl_s : lease_secs(lease_ms);
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
        int rc = wd ? sess_get(ec, el->curl, &id, &granted, err)
                    : lease_grant(ec, el->curl, ttl, &id, &granted, err);
        if (rc) return rc;
        int owner = 0, nolease = 0;
        rc = put_and_own(ec, el, id, &owner, &nolease, err);
        if (rc) {
            if (wd && nolease && nolease_tries++ < 3) {
                sess_drop(ec, id); /* the session expired: its holds are lost */
                continue;
            }
            if (!wd) lease_revoke(ec, el->curl, id);
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
            rc = el->reader ? get_owner(ec, el->curl, el->wprefix, el->wprefix_len, el->rev - 1,
                                        1, 0, &resp, &kv, &hrev, err)
                            : get_owner(ec, el->curl, el->prefix, el->prefix_len, el->rev - 1,
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
                rc = key_state(ec, el->curl, el, &crev, NULL, &seen_rev, err);
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
            const char *pkey = jstr(kv, "key");
            char *pk = pkey ? strdup(pkey) : NULL;
            cJSON_Delete(resp);
            if (!pk) {
                attempt_drop(ec, el, id);
                return pkey ? OOM(err) : dl_seterr(err, DLOCK_EPROTO, "etcd: range: no key");
            }
            dl_cancel_begin(&l->cancel);
            rc = watch_keys(ec, el->curl, pk, NULL, 1, hrev + 1, slice, &l->cancel, err);
            dl_cancel_end(&l->cancel);
            free(pk);
            if (rc == DLOCK_ECANCELED) {
                attempt_drop(ec, el, id);
                return dl_cancel_err(l, err);
            }
            int alive = 1;
            /* the session lease is kept alive by the keep-alive thread; an
             * attempt's own lease by the waiter */
            if (!rc && !wd) rc = lease_keepalive(ec, el->curl, id, &alive, err);
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
            rc = lease_keepalive(ec, el->curl, id, &alive, err);
            if (!rc && !alive) {
                lease_revoke(ec, el->curl, id);
                continue;
            }
            if (rc) {
                lease_revoke(ec, el->curl, id);
                return rc;
            }
        }
        el->lease = id;
        el->ttl_s = granted;
        if (wd) {
            int stale = 0;
            /* the key was ours when the txn put it, or when read back */
            el->wfrom = waited && seen_rev > el->rev ? seen_rev : el->rev;
            rc = ka_add(ec, el, &stale, err);
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
static int etcd_release(dlock_lock *l, long long *res, dl_err *err) {
    etcd_client *ec = l->c->bctx;
    etcd_lock *el = l->bdata;
    if (l->holds > 1) {
        *res = atomic_load(&el->lost) ? -1 : 0;
        return DLOCK_OK;
    }
    int kept = ka_del(ec, el);
    if (atomic_load(&el->lost)) {
        if (!el->session) lease_revoke(ec, el->curl, el->lease);
        *res = -1;
        return DLOCK_OK;
    }
    int deleted = 0;
    int rc = txn_if(ec, el->curl, el->key, el->key_len, "CREATE", el->rev, NULL, 0, 0, &deleted,
                    err);
    if (rc) {
        dl_err e2 = {0};
        if (kept) ka_add(ec, el, NULL, &e2);
        return rc;
    }
    if (!el->session) lease_revoke(ec, el->curl, el->lease);
    *res = deleted ? 1 : -1;
    return DLOCK_OK;
}

static int etcd_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err) {
    etcd_client *ec = l->c->bctx;
    etcd_lock *el = l->bdata;
    *res = 0;
    if (atomic_load(&el->lost)) return DLOCK_OK;
    long long id = 0;
    int64_t granted = 0;
    int64_t t0 = dl_now_ms();
    int rc = lease_grant(ec, el->curl, lease_secs(lease_ms), &id, &granted, err);
    if (rc) return rc;
    /* off the keep-alive list first: its key check must not take the move
     * to the new lease for a foreign put */
    int kept = ka_del(ec, el);
    int moved = 0;
    rc = txn_if(ec, el->curl, el->key, el->key_len, "CREATE", el->rev, l->token, l->token_len, id,
                &moved, err);
    if (rc) {
        lease_revoke(ec, el->curl, id);
        dl_err e2 = {0};
        if (kept) ka_add(ec, el, NULL, &e2);
        return rc;
    }
    if (!moved) {
        lease_revoke(ec, el->curl, id);
        atomic_store(&el->lost, 1);
        return DLOCK_OK;
    }
    /* an explicit lease from now on */
    if (!el->session) lease_revoke(ec, el->curl, el->lease);
    el->session = 0;
    el->lease = id;
    el->ttl_s = granted;
    l->expires_at = t0 + granted * 1000;
    *res = 1;
    return DLOCK_OK;
}

static int etcd_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    etcd_client *ec = l->c->bctx;
    etcd_lock *el = l->bdata;
    *held = 0;
    *count = 0;
    if (atomic_load(&el->lost)) return DLOCK_OK;
    long long crev = 0, lease = 0;
    int rc = key_state(ec, el->curl, el, &crev, &lease, NULL, err);
    if (rc) return rc;
    if (crev == el->rev && lease == el->lease) {
        *held = 1;
        *count = l->holds;
    } else {
        atomic_store(&el->lost, 1);
        atomic_store(&l->lease.lost, 1);
        ka_del(ec, el);
    }
    return DLOCK_OK;
}

/* ---- queries by name ---- */

static int etcd_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                        dl_err *err) {
    etcd_client *ec = c->bctx;
    size_t plen = 0, wlen = 0, rlen = 0;
    char *prefix = name_prefix(name, len, NULL, &plen);
    char *wprefix = name_prefix(name, len, "w/", &wlen);
    char *rprefix = name_prefix(name, len, "r/", &rlen);
    cJSON *resp = NULL, *kv = NULL, *wresp = NULL, *wkv = NULL, *rresp = NULL, *rkv = NULL;
    cJSON *t = NULL;
    long long hrev = 0, readers = 0, rfence = 0;
    int writer = 0, rc;
    if (!prefix || !wprefix || !rprefix) {
        rc = OOM(err);
        goto out;
    }
    pthread_mutex_lock(&ec->mu);
    rc = get_owner(ec, ec->curl, prefix, plen, 0, 0, 0, &resp, &kv, &hrev, err);
    if (!rc && kv) {
        /* an exclusive hold when the oldest key is under w/ */
        const char *k = jstr(kv, "key");
        size_t kl = k ? strlen(k) : 0;
        char *kb = malloc(kl + 1);
        if (!kb) rc = OOM(err);
        else writer = b64_dec(k ? k : "", kb, kl + 1) > wlen && !memcmp(kb, wprefix, wlen);
        free(kb);
        if (!rc && !writer) {
            /* readers: the read keys older than the oldest exclusive one */
            rc = get_owner(ec, ec->curl, wprefix, wlen, 0, 0, 0, &wresp, &wkv, NULL, err);
            long long wrev = wkv ? jnum(wkv, "create_revision") : 0;
            if (!rc)
                rc = get_owner(ec, ec->curl, rprefix, rlen, wrev > 1 ? wrev - 1 : 0, 1, 1, &rresp,
                               &rkv, NULL, err);
            if (!rc) {
                readers = cJSON_GetArraySize(jobj(rresp, "kvs"));
                rfence = rkv ? jnum(rkv, "create_revision") : 0;
            }
        }
    }
    long long lease = kv ? jnum(kv, "lease") : 0;
    if (!rc && lease) {
        cJSON *q = cJSON_CreateObject();
        if (!q || !add_ll(q, "ID", lease)) {
            cJSON_Delete(q);
            rc = OOM(err);
        } else {
            int gcode = 0;
            rc = rpc(ec, ec->curl, "/v3/lease/timetolive", q, req_timeout(ec), &t, &gcode, err);
        }
    }
    pthread_mutex_unlock(&ec->mu);
    if (rc) goto out;
    memset(info, 0, sizeof *info);
    info->exists = kv != NULL;
    if (kv) {
        long long ttl = jnum(t, "TTL");
        info->ttl_ms = ttl > 0 ? ttl * 1000 : lease ? 0 : -1;
        info->hold_count = 1;
        long long n = jnum(resp, "count");
        if (writer) {
            info->kind = DLOCK_KIND_PLAIN;
            info->writer = 1;
            info->holders = 1;
            info->fence = (uint64_t)jnum(kv, "create_revision");
            const char *v = jstr(kv, "value");
            if (v) b64_dec(v, info->holder, sizeof info->holder);
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

static int etcd_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                              dl_err *err) {
    dlock_info info;
    int rc = etcd_inspect(c, name, len, &info, err);
    if (!rc) *fence = info.fence;
    return rc;
}

static int etcd_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                            dl_err *err) {
    etcd_client *ec = c->bctx;
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
        if (!q || !add_b64(q, "key", "dlock/", 6) || !cJSON_AddTrueToObject(q, "count_only")) {
            cJSON_Delete(q);
            return OOM(err);
        }
        rc = client_rpc(ec, "/v3/kv/range", q, &r, NULL, err);
        if (!rc) snprintf(buf, buflen, "%lld", jnum(jobj(r, "header"), "revision"));
    } else {
        rc = client_rpc(ec, "/version", NULL, &r, NULL, err);
        const char *v = rc ? NULL : jstr(r, version ? "etcdserver" : "etcdcluster");
        if (!rc && !v) rc = dl_seterr(err, DLOCK_EPROTO, "etcd: /version: unexpected answer");
        if (!rc) snprintf(buf, buflen, "%s", v);
    }
    cJSON_Delete(r);
    return rc;
}

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

#define ETCD_SEM_RECHECK_MS 2000

typedef struct etcd_acq {
    etcd_lock ka;                 /* the lease's entry in the keep-alive list */
    int64_t k;                    /* permits it holds (its key's count) */
} etcd_acq;

typedef struct etcd_sem {
    CURL *curl;
    char *lprefix, *total;        /* its keys: "dlock/sem/<len>/<name>/" + "l/", + "total" */
    size_t lprefix_len, total_len;
    char *wkey, *wend;            /* base64: the range of all its keys (first waiter's watch) */
    etcd_acq **acqs;              /* held, oldest first */
    int nacq, cap;
} etcd_sem;

static int etcd_sem_init(dl_object *o, dl_err *err) {
    etcd_sem *es = calloc(1, sizeof *es);
    if (!es) return OOM(err);
    o->bdata = es;
    size_t plen = 0;
    char *prefix = what_prefix("sem", o->name, o->name_len, NULL, &plen);
    if (prefix) {
        es->wkey = b64_enc(prefix, plen);
        prefix[plen - 1]++; /* the range's end: '/' + 1 */
        es->wend = b64_enc(prefix, plen);
        free(prefix);
    }
    es->lprefix = what_prefix("sem", o->name, o->name_len, "l/", &es->lprefix_len);
    es->total = what_prefix("sem", o->name, o->name_len, "total", &es->total_len);
    es->curl = curl_easy_init();
    if (!es->wkey || !es->wend || !es->lprefix || !es->total || !es->curl) return OOM(err);
    return DLOCK_OK;
}

static void acq_free(etcd_client *ec, etcd_sem *es, etcd_acq *a, int revoke) {
    ka_del(ec, &a->ka);
    if (revoke) lease_revoke(ec, es->curl, a->ka.lease);
    free(a->ka.key);
    free(a);
}

/* Freeing the handle gives its permits back. */
static void etcd_sem_destroy(dl_object *o) {
    etcd_sem *es = o->bdata;
    if (!es) return;
    for (int i = 0; i < es->nacq; i++) acq_free(o->c->bctx, es, es->acqs[i], 1);
    free(es->acqs);
    if (es->curl) curl_easy_cleanup(es->curl);
    free(es->lprefix);
    free(es->total);
    free(es->wkey);
    free(es->wend);
    free(es);
    o->bdata = NULL;
}

/* A key's count ("<k>" or "<k> held"), *held set for the latter; -1 when
 * the value is not a count. */
static int64_t kv_count(const cJSON *kv, int *held) {
    char v[48];
    const char *b = jstr(kv, "value");
    size_t n = b ? b64_dec(b, v, sizeof v) : 0;
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
             (!put || (add_b64(pr, "key", put, put_len) && add_b64(pr, "value", num, strlen(num)) &&
                       add_ll(pr, "lease", id))) &&
             add_prefix_range(r1, es->lprefix, es->lprefix_len) &&
             add_str(r1, "sort_order", "ASCEND") && add_str(r1, "sort_target", "CREATE") &&
             add_b64(r2, "key", es->total, es->total_len);
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
    int rc = rpc(ec, es->curl, "/v3/kv/txn", q, req_timeout(ec), resp, NULL, err);
    if (rc) return rc;
    cJSON *resps = jobj(*resp, "responses");
    int off = put ? 1 : 0;
    cJSON *lr = jobj(cJSON_GetArrayItem(resps, off), "response_range");
    cJSON *tr = jobj(cJSON_GetArrayItem(resps, off + 1), "response_range");
    *hrev = jnum(jobj(*resp, "header"), "revision");
    if (rev) *rev = *hrev; /* the put is this txn's only write */
    if (!lr || !tr) {
        cJSON_Delete(*resp);
        *resp = NULL;
        return dl_seterr(err, DLOCK_EPROTO, "etcd: semaphore txn: unexpected answer");
    }
    cJSON *tk = jobj(tr, "kvs");
    cJSON *tkv = cJSON_IsArray(tk) ? cJSON_GetArrayItem(tk, 0) : NULL;
    if (tkv) {
        *total = kv_count(tkv, NULL);
        if (*total < 0) {
            cJSON_Delete(*resp);
            *resp = NULL;
            return dl_seterr(err, DLOCK_EPROTO, "etcd: the semaphore's total is not a number");
        }
    }
    *kvs = jobj(lr, "kvs");
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
        if (rev && jnum(kv, "create_revision") == rev) {
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
    if (!q || !add_b64(q, "key", a->ka.key, a->ka.key_len) ||
        !add_b64(q, "value", num, strlen(num)) || !add_ll(q, "lease", a->ka.lease)) {
        cJSON_Delete(q);
        return;
    }
    cJSON *r = NULL;
    dl_err ignored = {0};
    if (!rpc(ec, es->curl, "/v3/kv/put", q, req_timeout(ec), &r, NULL, &ignored)) cJSON_Delete(r);
}

static int etcd_sem_acquire(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err) {
    etcd_client *ec = o->c->bctx;
    etcd_sem *es = o->bdata;
    char nm[80];
    dl_name_msg(o->name, o->name_len, nm, sizeof nm);
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
        int rc = lease_grant(ec, es->curl, ec->wd_ttl_s, &id, &granted, err);
        if (rc) return rc;
        etcd_acq *a = calloc(1, sizeof *a);
        if (a) a->ka.key = malloc(es->lprefix_len + 17);
        if (!a || !a->ka.key) {
            free(a);
            lease_revoke(ec, es->curl, id);
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
                const char *ak = jstr(ahead, "key");
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
                rc = ka_add(ec, &a->ka, NULL, err);
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
            dl_cancel_begin(&o->cancel);
            rc = watch_keys(ec, es->curl, akey ? akey : es->wkey, akey ? NULL : es->wend, 0,
                            hrev + 1, slice, &o->cancel, err);
            dl_cancel_end(&o->cancel);
            free(akey);
            if (rc == DLOCK_ECANCELED) {
                rc = dl_seterr(err, DLOCK_ECANCELED, "waiting for '%s' was cancelled", nm);
                break;
            }
            int alive = 1;
            if (!rc) rc = lease_keepalive(ec, es->curl, id, &alive, err);
            if (rc) break;
            if (!alive) {
                gone = 1;
                break;
            }
        }
        lease_revoke(ec, es->curl, id); /* deletes our key */
        free(a->ka.key);
        free(a);
        if (!gone) return rc;
    }
}

/* Gives back permits this handle holds (its latest acquisitions first). */
static int etcd_sem_release(dl_object *o, int64_t permits, dl_err *err) {
    etcd_client *ec = o->c->bctx;
    etcd_sem *es = o->bdata;
    char nm[80];
    dl_name_msg(o->name, o->name_len, nm, sizeof nm);
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
            rc = txn_if(ec, es->curl, a->ka.key, a->ka.key_len, "CREATE", a->ka.rev,
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
static int etcd_sem_available(dl_object *o, int64_t *permits, dl_err *err) {
    etcd_client *ec = o->c->bctx;
    etcd_sem *es = o->bdata;
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
    return txn_if(ec, es->curl, es->total, es->total_len, mod ? "MOD" : "CREATE", mod, num,
                  strlen(num), 0, done, err);
}

static int etcd_sem_try_set(dl_object *o, int64_t permits, int *set, dl_err *err) {
    return total_put(o->c->bctx, o->bdata, 0, permits, set, err);
}

/* Adds delta to the total by compare-and-set (creating it at delta). */
static int etcd_sem_add(dl_object *o, int64_t delta, dl_err *err) {
    etcd_client *ec = o->c->bctx;
    etcd_sem *es = o->bdata;
    for (int tries = 0; tries < 100; tries++) {
        cJSON *q = cJSON_CreateObject();
        if (!q || !add_b64(q, "key", es->total, es->total_len)) {
            cJSON_Delete(q);
            return OOM(err);
        }
        cJSON *r = NULL;
        int rc = rpc(ec, es->curl, "/v3/kv/range", q, req_timeout(ec), &r, NULL, err);
        if (rc) return rc;
        cJSON *kvs = jobj(r, "kvs");
        cJSON *kv = cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
        int64_t v = kv ? kv_count(kv, NULL) : 0;
        long long mod = kv ? jnum(kv, "mod_revision") : 0;
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
    .lock_init = etcd_lock_init,
    .lock_destroy = etcd_lock_destroy,
    .acquire = etcd_acquire,
    .release = etcd_release,
    .extend = etcd_extend,
    .check = etcd_check,
    .inspect = etcd_inspect,
    .fence_current = etcd_fence_current,
    .force_unlock = NULL,
    .server_fact = etcd_server_fact,
    .sem_init = etcd_sem_init,
    .sem_destroy = etcd_sem_destroy,
    .sem_acquire = etcd_sem_acquire,
    .sem_release = etcd_sem_release,
    .sem_available = etcd_sem_available,
    .sem_try_set = etcd_sem_try_set,
    .sem_add = etcd_sem_add,
};
