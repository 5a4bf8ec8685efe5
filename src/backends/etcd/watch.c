/* The etcd client's watch: one stream on its kept holds' keys, a hold lost at once when its key goes. (The design: etcd_backend.h.) */
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

/* ---- the client's watch ----
 * One streaming watch per client (its own thread and curl handle) on the
 * range spanning the keys of the holds it keeps (DLOCK_WATCHDOG holds),
 * started with its first such hold: a DELETE of a kept hold's key loses that
 * hold at once with its callback. The keys, not the locks' prefixes: the
 * other contenders' keys of a name stay out of the range (unless they sort
 * between two kept keys), so their acquires and releases send this client
 * nothing. Deletions only (the NOPUT filter): every acquire's own put would
 * otherwise come back on the stream; a key put again in place by another
 * client is found by the keep-alive round's check (dl_etcd_ka_main), and a key
 * deleted and created again shows its DELETE here. A handle's key is the
 * same for all its holds on one session lease (dl_etcd_put_and_own), so a handle
 * acquiring again stays inside the range. Not on the keep-alive thread: its requests
 * block for up to a request timeout, and an event must not wait for them.
 * The range only grows while the stream lives (a hold outside it restarts
 * the stream on the union, from the revision the new hold needs); it is
 * narrowed to the holds' span when the stream is reopened: after the client
 * kept no hold for a keep-alive period (the stream is then closed), or after
 * a failure. A broken stream resumes from the revision after the last event
 * it handled; when etcd has compacted that revision away, one txn of
 * compares (dl_etcd_ka_check) checks every kept hold and the stream resumes after
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

void dl_etcd_cw_wake(etcd_client *ec) {
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


/* ka_mu held. Whether the stream saw el's key deleted or replaced after
 * el->wfrom, before el was kept (the events that concerned no kept hold are
 * in the ring). When the stream does not cover el from wfrom on (not open,
 * el's key outside its range, or ring entries dropped since), it is
 * restarted CW_LAZY_MS later (if el is still kept) to replay el's events: 0. */
int dl_etcd_cw_admit_locked(etcd_client *ec, etcd_lock *el) {
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
        dl_etcd_cw_wake(ec);
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
        if (cw_ends(el, e)) dl_etcd_ka_lost_locked(ec, el);
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


/* One line of the stream: 1 when it ends the stream. */
static int cw_line(cw_stream *st, const char *line) {
    cJSON *j = cJSON_Parse(line);
    if (!j) return 0;
    cJSON *res = dl_etcd_jobj(j, "result");
    int stop = 0;
    if (dl_etcd_jobj(j, "error") || !res) {
        st->failed = stop = 1;
    } else if (cJSON_IsTrue(dl_etcd_jobj(res, "canceled"))) {
        st->compacted = dl_etcd_jnum(res, "compact_revision") > 0;
        st->failed = stop = 1;
    } else {
        if (cJSON_IsTrue(dl_etcd_jobj(res, "created"))) st->created = 1;
        cJSON *evs = dl_etcd_jobj(res, "events"), *ev;
        etcd_client *ec = st->ec;
        pthread_mutex_lock(&ec->ka_mu);
        cJSON_ArrayForEach(ev, evs) {
            cJSON *kv = dl_etcd_jobj(ev, "kv");
            const char *k = dl_etcd_jstr(kv, "key");
            if (!k) continue;
            size_t cap = strlen(k) / 4 * 3 + 4;
            cw_event e = {.key = malloc(cap)};
            if (!e.key) { /* unmatched: the hold is checked when the stream restarts */
                st->failed = stop = 1;
                break;
            }
            e.key_len = dl_etcd_b64_dec(k, e.key, cap);
            e.mod_rev = dl_etcd_jnum(kv, "mod_revision");
            e.create_rev = dl_etcd_jnum(kv, "create_revision");
            e.lease = dl_etcd_jnum(kv, "lease");
            const char *type = dl_etcd_jstr(ev, "type");
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
    if (f && dl_etcd_add_b64(cr, "key", lo, lol) && dl_etcd_add_b64(cr, "range_end", hi, hil) &&
        dl_etcd_add_ll(cr, "start_revision", start))
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
 * kept lock hold checked by dl_etcd_ka_check; the stream resumes after the revision
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
    int rc = seen && m == ns && h ? dl_etcd_ka_check(ec, h, seen, m, &rev) : -1;
    pthread_mutex_lock(&ec->ka_mu);
    if (!rc) {
        for (etcd_lock *el = ec->ka_list, *next; el; el = next) {
            next = el->next;
            for (size_t i = 0; i < m; i++) {
                /* the same hold (one acquisition: its key's revision) as checked */
                if (seen[i].el != el || seen[i].rev != el->rev) continue;
                if (seen[i].gone) dl_etcd_ka_lost_locked(ec, el);
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
            dl_cond_wait_until(&ec->cw_cv, &ec->ka_mu, now + 1000);
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
                dl_etcd_curl_setup(ec, h, url, ebuf, 0);
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
            dl_cond_wait_until(&ec->cw_cv, &ec->ka_mu, until);
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
        if (dl_etcd_conn_failure(res)) fails++;
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

int dl_etcd_cw_start_locked(etcd_client *ec, dl_err *err) {
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
int dl_etcd_watch_keys(etcd_client *ec, CURL *h, const char *key_b64, const char *end_b64,
                       int noput, long long from, int64_t ms, dl_cancel *cx, dl_err *err) {
    cJSON *q = cJSON_CreateObject();
    cJSON *cr = q ? cJSON_AddObjectToObject(q, "create_request") : NULL;
    cJSON *f = cr ? cJSON_AddArrayToObject(cr, "filters") : NULL;
    cJSON *np = noput ? cJSON_CreateString("NOPUT") : NULL;
    if (!f || (noput && !np) || !dl_etcd_add_str(cr, "key", key_b64) ||
        (end_b64 && !dl_etcd_add_str(cr, "range_end", end_b64)) || !dl_etcd_add_ll(cr, "start_revision", from)) {
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
    int rc = dl_etcd_http_do_cx(ec, h, "/v3/watch", body, ms, cx, &b, &status, err);
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
int dl_etcd_txn_if(etcd_client *ec, CURL *h, const char *key, size_t key_len, const char *target,
                   long long rev, const char *value, size_t value_len, long long lease, int *done,
                   dl_err *err) {
    *done = 0;
    cJSON *q = cJSON_CreateObject();
    cJSON *cmp = q ? cJSON_AddArrayToObject(q, "compare") : NULL;
    cJSON *succ = q ? cJSON_AddArrayToObject(q, "success") : NULL;
    cJSON *c1 = cJSON_CreateObject(), *o1 = cJSON_CreateObject();
    cJSON *op = o1 ? cJSON_AddObjectToObject(o1, value ? "request_put" : "request_delete_range")
                   : NULL;
    int ok = cmp && succ && c1 && op && dl_etcd_add_b64(c1, "key", key, key_len) &&
             dl_etcd_add_str(c1, "target", target) &&
             dl_etcd_add_ll(c1, strcmp(target, "MOD") ? "create_revision" : "mod_revision", rev) &&
             dl_etcd_add_b64(op, "key", key, key_len) &&
             (!value || dl_etcd_add_b64(op, "value", value, value_len)) &&
             (!lease || dl_etcd_add_ll(op, "lease", lease));
    if (!ok) {
        cJSON_Delete(c1);
        cJSON_Delete(o1);
        cJSON_Delete(q);
        return OOM(err);
    }
    cJSON_AddItemToArray(cmp, c1);
    cJSON_AddItemToArray(succ, o1);
    cJSON *r = NULL;
    int rc = dl_etcd_rpc(ec, h, "/v3/kv/txn", q, dl_etcd_req_timeout(ec), &r, NULL, err);
    if (rc) return rc;
    *done = cJSON_IsTrue(dl_etcd_jobj(r, "succeeded"));
    cJSON_Delete(r);
    return DLOCK_OK;
}
