/* The client: its options, its identity, the backend its URL names, and
 * what it owns (the watchdog, the owners' records) freed with it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>


#include "kinds.h"

void dlock_options_init(dlock_options *opts) {
    if (opts) memset(opts, 0, sizeof *opts);
}

const char *dlock_client_id(const dlock_client *c) { return c ? c->id : ""; }

int dlock_ping(dlock_client *c, int64_t *rtt_us) {
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    if (c->unusable)
        return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "client failed to open; free it"});
    if (!c->backend->ping) return dl_backend_unsupported(c, "ping");
    int rc = c->backend->ping(c, rtt_us, &err);
    if (rc) return dl_client_fail(c, &err);
    dl_client_ok(c);
    return DLOCK_OK;
}

static int client_init(dlock_client *c, const dlock_options *o, dl_err *err) {
    if (o->connect_timeout_ms < 0 || o->command_timeout_ms < 0 || o->watchdog_lease_ms < 0 ||
        o->max_idle_connections < 0 || o->node_timeout_ms < 0)
        return dl_seterr(err, DLOCK_EINVAL, "timeouts, lease and pool size must not be negative");
    c->connect_timeout_ms =
        o->connect_timeout_ms ? o->connect_timeout_ms : DLOCK_DEFAULT_CONNECT_TIMEOUT_MS;
    c->command_timeout_ms =
        o->command_timeout_ms ? o->command_timeout_ms : DLOCK_DEFAULT_COMMAND_TIMEOUT_MS;
    c->watchdog_lease_ms = o->watchdog_lease_ms ? o->watchdog_lease_ms : DLOCK_DEFAULT_WATCHDOG_MS;
    c->node_timeout_ms = o->node_timeout_ms ? o->node_timeout_ms : 50;
    atomic_init(&c->fair_wait_ms, DLOCK_DEFAULT_FAIR_WAIT_MS);
    if (o->wait_replicas < 0 || o->wait_replicas_timeout_ms < 0)
        return dl_seterr(err, DLOCK_EINVAL, "wait_replicas must not be negative");
    c->wait_replicas = o->wait_replicas;
    c->wait_replicas_timeout_ms =
        o->wait_replicas_timeout_ms ? o->wait_replicas_timeout_ms : 1000;
    if (c->watchdog_lease_ms < 30)
        return dl_seterr(err, DLOCK_EINVAL, "watchdog lease must be at least 30 ms");
    c->max_idle = o->max_idle_connections ? o->max_idle_connections : 8;

    const char *url = o->url ? o->url : getenv("DLOCK_URL");
    if (!url || !*url) url = DL_DEFAULT_URL;
    unsigned char raw[16];
    int rc = dl_random_bytes(raw, sizeof raw, err);
    if (rc) return rc;
    snprintf(c->id, sizeof c->id,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", raw[0],
             raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], raw[8], raw[9], raw[10],
             raw[11], raw[12], raw[13], raw[14], raw[15]);
    /* the backend the URL's scheme names does the rest */
    c->backend = dl_backend_for(url);
    return c->backend->open(c, url, o, err);
}

int dlock_client_new(const dlock_options *opts, dlock_client **out) {
    if (!out) return DLOCK_EINVAL;
    *out = NULL;
    dlock_client *c = calloc(1, sizeof *c);
    if (!c) return DLOCK_ENOMEM;
    pthread_mutex_init(&c->wd_mu, NULL);
    pthread_mutex_init(&c->owned_mu, NULL);
    c->backend = &dl_backend_redis; /* until the URL names another */
    *out = c;
    dlock_options defaults;
    dlock_options_init(&defaults);
    dl_err err = {0};
    int rc = client_init(c, opts ? opts : &defaults, &err);
    if (rc) {
        /* keep the message on the handle; drop the connection state */
        if (c->backend->close && c->backend_client) c->backend->close(c);
        c->backend_client = NULL;
        dl_topology_clear(c);
        c->unusable = 1;
        return dl_client_fail(c, &err);
    }
    dl_client_ok(c);
    return DLOCK_OK;
}

int dlock_client_set_fail_fast(dlock_client *c, int fail_fast) {
    if (!c) return DLOCK_EINVAL;
    atomic_store(&c->fail_fast, fail_fast != 0);
    dl_client_ok(c);
    return DLOCK_OK;
}

void dlock_client_free(dlock_client *c) {
    if (!c) return;
    dl_watchdog_free(c->wd);
    c->wd = NULL;
    if (c->backend->close && c->backend_client) c->backend->close(c);
    dl_topology_clear(c);
    pthread_mutex_destroy(&c->wd_mu);
    dl_owned_free(c);
    dl_client_ok(c);
    free(c->who);
    free(c);
}
