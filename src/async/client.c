/* The async client: its URL and options, the entry point of its loop
 * (dlock_async_process), the bare interface, and its end. One server
 * (redis:// or unix://) or the master Sentinel names (redis-sentinel://)
 * in this version; the other deployments and backends answer
 * DLOCK_ENOTSUP (dlock_async.h). */
#include <stdlib.h>
#include <string.h>

#include "async.h"

static int open_client(dl_aclient *c, const dlock_options *o, dl_err *err) {
    if (o->connect_timeout_ms < 0 || o->command_timeout_ms < 0 || o->watchdog_lease_ms < 0)
        return dl_seterr(err, DLOCK_EINVAL, "timeouts and the watchdog lease must not be negative");
    /* options that change what a hold guarantees are refused rather than
     * ignored: an acquire must never return OK unprotected by what was asked */
    if (o->wait_replicas)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "wait_replicas is not supported by the async API yet");
    if (o->fence_url)
        return dl_seterr(err, DLOCK_ENOTSUP, "fence_url (RedLock) is not supported by the "
                                             "async API");
    if (o->tls_ca_file || o->tls_ca_dir || o->tls_cert_file || o->tls_key_file ||
        o->tls_server_name || o->tls_insecure)
        return dl_seterr(err, DLOCK_ENOTSUP, "TLS is not supported by the async API yet");
    c->connect_timeout_ms =
        o->connect_timeout_ms ? o->connect_timeout_ms : DLOCK_DEFAULT_CONNECT_TIMEOUT_MS;
    c->command_timeout_ms =
        o->command_timeout_ms ? o->command_timeout_ms : DLOCK_DEFAULT_COMMAND_TIMEOUT_MS;
    c->watchdog_lease_ms =
        o->watchdog_lease_ms ? o->watchdog_lease_ms : DLOCK_DEFAULT_WATCHDOG_MS;
    if (c->watchdog_lease_ms < 30)
        return dl_seterr(err, DLOCK_EINVAL, "watchdog lease must be at least 30 ms");
    const char *url = o->url ? o->url : getenv("DLOCK_URL");
    if (!url || !*url) url = DL_DEFAULT_URL;
    if (dl_backend_for(url) != &dl_backend_redis)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "the async API supports Redis only (redis://, unix://), not %.40s",
                         url);
    dl_target t;
    int rc = dl_target_parse(url, &t, err);
    if (rc) return rc;
    int tls = 0;
    for (size_t i = 0; i < t.neps; i++) tls |= t.eps[i].tls;
    if (tls || (t.mode != DL_MODE_SINGLE && t.mode != DL_MODE_SENTINEL) ||
        (t.mode == DL_MODE_SINGLE && t.neps != 1)) {
        rc = dl_seterr(err, DLOCK_ENOTSUP,
                       "the async API supports one Redis server (redis://, unix://) and "
                       "Sentinel (redis-sentinel://) only yet: not TLS, Cluster or RedLock");
    } else if (t.mode == DL_MODE_SENTINEL) {
        /* the master's address comes from the sentinels, at each connect */
        c->ep.db = t.db;
        c->ep.password = t.password;
        t.password = NULL;
        rc = dl_asent_new(&t, &c->sent, err);
        if (!rc) rc = dl_apply_credentials(&c->ep, o, err);
    } else {
        c->ep = t.eps[0];
        memset(&t.eps[0], 0, sizeof t.eps[0]);
        rc = dl_apply_credentials(&c->ep, o, err);
    }
    dl_target_clear(&t);
    return rc;
}

/* A new command connection: what the locks and the objects owe goes first. */
static void cmd_up(dl_apipe *p) {
    dl_alock_pipe_up(p);
    dl_aobj_pipe_up(p);
}

static void destroy(dl_aclient *c) {
    dl_awatch_close(c);
    dl_arenew_free(&c->renew);
    dl_aloop_close(&c->loop);
    dl_asubs_free(&c->subs);
    dl_endpoint_clear(&c->ep);
    dl_asent_free(c->sent);
    free(c);
}

int dlock_async_client_new(const dlock_options *opts, const dlock_async_adapter *adapter,
                           dlock_async_client **out) {
    if (!out) return DLOCK_EINVAL;
    dl_aclient *c = calloc(1, sizeof *c);
    *out = c;
    if (!c) return DLOCK_ENOMEM;
    dl_aloop_init(&c->loop, adapter);
    dl_apipe_init(&c->cmd, c, 0);
    c->cmd.up = cmd_up;
    c->destroy = destroy;
    dl_asubs_init(&c->subs, c);
    dl_arenew_init(&c->renew, c);
    dlock_options defaults;
    dlock_options_init(&defaults);
    dl_err err = {0};
    int rc = open_client(c, opts ? opts : &defaults, &err);
    if (!rc && c->sent) dl_awatch_init(c);
    if (rc) {
        c->freeing = 1; /* unusable: every operation refuses */
        snprintf(c->errmsg, sizeof c->errmsg, "%s", err.msg);
    }
    return rc;
}

const char *dlock_async_errmsg(const dlock_async_client *c) {
    return c ? c->errmsg : "NULL async client";
}

void dlock_async_client_free(dlock_async_client *c) {
    if (!c || c->doomed) return;
    c->freeing = 1;
    c->depth++;
    dl_aobj_free_all(c); /* before the locks': they fail the connections */
    dl_alock_free_all(c);
    c->depth--;
    if (c->depth > 0) {
        c->doomed = 1; /* from a callback: freed as the call that ran it returns */
        return;
    }
    destroy(c);
}

void dlock_async_process(dlock_async_client *c, int fd, int events) {
    if (!c || c->doomed) return;
    c->depth++;
    if (fd < 0) c->loop.told_at = -2; /* the adapter's timer fired: arm it again */
    if (fd >= 0 && fd == dl_apipe_fd(&c->cmd)) dl_apipe_io(&c->cmd, events);
    else if (fd >= 0 && fd == dl_apipe_fd(&c->subs.pipe)) dl_apipe_io(&c->subs.pipe, events);
    else if (fd >= 0 && c->wprobe.conn && fd == c->wprobe.conn->fd) dl_awatch_io(c, events);
    if (!c->doomed) dl_aloop_run(&c->loop);
    c->depth--;
    if (c->doomed) {
        if (!c->depth) destroy(c);
        return;
    }
    if (!c->depth) dl_aloop_sync(&c->loop);
}

int dlock_async_fds(const dlock_async_client *c, dlock_async_pollfd *fds) {
    if (!c || !fds) return 0;
    int n = 0;
    for (int i = 0; i < DLOCK_ASYNC_SLOTS; i++) {
        if (c->loop.fd[i] < 0 || !c->loop.ev[i]) continue;
        fds[n].fd = c->loop.fd[i];
        fds[n].events = c->loop.ev[i];
        n++;
    }
    return n;
}

int64_t dlock_async_timeout(const dlock_async_client *c) {
    if (!c) return -1;
    int64_t at = dl_aloop_next(&c->loop);
    if (at < 0) return -1;
    int64_t ms = at - dl_now_ms();
    return ms > 0 ? ms : 0;
}
