/* The client: options, identity, and a pool of connections shared by threads,
 * re-established after failures with a bounded exponential backoff. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DL_DEFAULT_URL "redis://127.0.0.1:6379"
#define DL_BACKOFF_MIN_MS 50
#define DL_BACKOFF_MAX_MS 2000

void dlock_options_init(dlock_options *opts) {
    if (opts) memset(opts, 0, sizeof *opts);
}

const char *dlock_client_id(const dlock_client *c) { return c ? c->id : ""; }

int64_t dl_cmd_deadline(const dlock_client *c) { return dl_deadline(c->command_timeout_ms); }

int dl_pool_get(dlock_client *c, int64_t deadline, dl_conn **out, dl_err *err) {
    if (c->unusable) return dl_seterr(err, DLOCK_EINVAL, "client failed to open; free it");
    pthread_mutex_lock(&c->mu);
    while (c->idle) {
        dl_conn *conn = c->idle;
        c->idle = conn->next;
        c->nidle--;
        conn->next = NULL;
        if (!dl_conn_stale(conn)) {
            pthread_mutex_unlock(&c->mu);
            *out = conn;
            return DLOCK_OK;
        }
        dl_conn_close(conn); /* the server closed it (restart, timeout...) */
    }
    int64_t now = dl_now_ms();
    int64_t next = c->next_attempt_ms;
    pthread_mutex_unlock(&c->mu);
    if (now < next) {
        if (next >= deadline)
            return dl_seterr(err, DLOCK_EIO,
                             "server unavailable; next reconnect attempt in %lld ms",
                             (long long)(next - now));
        dl_sleep_ms(next - now);
    }
    int64_t cdl = dl_deadline(c->connect_timeout_ms);
    if (cdl > deadline) cdl = deadline;
    int rc = dl_conn_open(&c->ep, cdl, out, err);
    pthread_mutex_lock(&c->mu);
    if (rc == DLOCK_EIO) {
        c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : DL_BACKOFF_MIN_MS;
        if (c->backoff_ms > DL_BACKOFF_MAX_MS) c->backoff_ms = DL_BACKOFF_MAX_MS;
        c->next_attempt_ms = dl_now_ms() + c->backoff_ms;
    } else if (rc == DLOCK_OK) {
        c->backoff_ms = 0;
        c->next_attempt_ms = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void dl_pool_put(dlock_client *c, dl_conn *conn) {
    if (!conn) return;
    if (conn->broken || conn->subscribed || conn->olen) {
        dl_conn_close(conn);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (c->nidle < c->max_idle) {
        conn->next = c->idle;
        c->idle = conn;
        c->nidle++;
        conn = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    dl_conn_close(conn);
}

int dl_client_command(dlock_client *c, int argc, const char **argv, const size_t *lens,
                      redisReply **out, dl_err *err) {
    int64_t deadline = dl_cmd_deadline(c);
    dl_conn *conn;
    int rc = dl_pool_get(c, deadline, &conn, err);
    if (rc) return rc;
    rc = dl_conn_command(conn, deadline, argc, argv, lens, out, err);
    dl_pool_put(c, conn);
    return rc;
}

int dlock_ping(dlock_client *c, int64_t *rtt_us) {
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    const char *argv[] = {"PING"};
    size_t lens[] = {4};
    redisReply *r = NULL;
    int64_t t0 = dl_now_us();
    int rc = dl_client_command(c, 1, argv, lens, &r, &err);
    int64_t t1 = dl_now_us();
    if (!rc && r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "PING", &err);
    else if (!rc && !(r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG")))
        rc = dl_seterr(&err, DLOCK_EPROTO, "PING: unexpected reply");
    if (r) freeReplyObject(r);
    if (rc) return dl_client_fail(c, &err);
    if (rtt_us) *rtt_us = t1 - t0;
    dl_client_ok(c);
    return DLOCK_OK;
}

static char *dup_or_null(const char *s, int *oom) {
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *oom = 1;
    return d;
}

static int client_init(dlock_client *c, const dlock_options *o, dl_err *err) {
    const char *url = o->url ? o->url : getenv("DLOCK_URL");
    if (!url || !*url) url = DL_DEFAULT_URL;
    int rc = dl_url_parse(url, &c->ep, err);
    if (rc) return rc;
    int oom = 0;
    const char *pw = o->password;
    if (!pw && !c->ep.password) pw = getenv("DLOCK_PASSWORD");
    if (pw && *pw) {
        dl_endpoint tmp = {0};
        tmp.password = c->ep.password;
        dl_endpoint_clear(&tmp); /* wipes and frees the URL's password */
        c->ep.password = dup_or_null(pw, &oom);
    }
    if (o->username) {
        free(c->ep.user);
        c->ep.user = dup_or_null(o->username, &oom);
    }
    if (oom) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    if (c->ep.user && !c->ep.password)
        return dl_seterr(err, DLOCK_EINVAL, "a user name needs a password");
    if (o->connect_timeout_ms < 0 || o->command_timeout_ms < 0 || o->watchdog_lease_ms < 0 ||
        o->max_idle_connections < 0)
        return dl_seterr(err, DLOCK_EINVAL, "timeouts, lease and pool size must not be negative");
    c->connect_timeout_ms =
        o->connect_timeout_ms ? o->connect_timeout_ms : DLOCK_DEFAULT_CONNECT_TIMEOUT_MS;
    c->command_timeout_ms =
        o->command_timeout_ms ? o->command_timeout_ms : DLOCK_DEFAULT_COMMAND_TIMEOUT_MS;
    c->watchdog_lease_ms = o->watchdog_lease_ms ? o->watchdog_lease_ms : DLOCK_DEFAULT_WATCHDOG_MS;
    if (c->watchdog_lease_ms < 30)
        return dl_seterr(err, DLOCK_EINVAL, "watchdog lease must be at least 30 ms");
    c->max_idle = o->max_idle_connections ? o->max_idle_connections : 8;

    unsigned char raw[16];
    rc = dl_random_bytes(raw, sizeof raw, err);
    if (rc) return rc;
    snprintf(c->id, sizeof c->id,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", raw[0],
             raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], raw[8], raw[9], raw[10],
             raw[11], raw[12], raw[13], raw[14], raw[15]);

    /* connect now so that a bad address or password is reported here */
    const char *argv[] = {"PING"};
    size_t lens[] = {4};
    redisReply *r = NULL;
    rc = dl_client_command(c, 1, argv, lens, &r, err);
    if (!rc && r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "connect", err);
    if (r) freeReplyObject(r);
    return rc;
}

int dlock_client_new(const dlock_options *opts, dlock_client **out) {
    if (!out) return DLOCK_EINVAL;
    *out = NULL;
    dlock_client *c = calloc(1, sizeof *c);
    if (!c) return DLOCK_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->wd_mu, NULL);
    *out = c;
    dlock_options defaults;
    dlock_options_init(&defaults);
    dl_err err = {0};
    int rc = client_init(c, opts ? opts : &defaults, &err);
    if (rc) {
        /* keep the message on the handle; drop the connection state */
        dl_endpoint_clear(&c->ep);
        c->unusable = 1;
        return dl_client_fail(c, &err);
    }
    dl_client_ok(c);
    return DLOCK_OK;
}

void dlock_client_free(dlock_client *c) {
    if (!c) return;
    dl_watchdog_free(c->wd);
    c->wd = NULL;
    while (c->idle) {
        dl_conn *n = c->idle->next;
        dl_conn_close(c->idle);
        c->idle = n;
    }
    dl_endpoint_clear(&c->ep);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->wd_mu);
    dl_client_ok(c);
    free(c);
}
