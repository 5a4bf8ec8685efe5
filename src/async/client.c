/* The async client: its URL and options, the entry point of its loop
 * (dlock_async_process), the bare interface, and its end. One server
 * (redis:// or unix://), the master Sentinel names (redis-sentinel://) or
 * a Redis Cluster (cluster.c) in this version; the other deployments and
 * backends answer DLOCK_ENOTSUP (dlock_async.h). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "async.h"

static void cmd_up(dl_apipe *p);

static int open_client(dl_aclient *c, const dlock_options *o, dl_err *err) {
    if (o->connect_timeout_ms < 0 || o->command_timeout_ms < 0 || o->watchdog_lease_ms < 0)
        return dl_seterr(err, DLOCK_EINVAL, "timeouts and the watchdog lease must not be negative");
    /* options that change what a hold guarantees are refused rather than
     * ignored: an acquire must never return OK unprotected by what was asked */
    if (o->wait_replicas < 0 || o->wait_replicas_timeout_ms < 0)
        return dl_seterr(err, DLOCK_EINVAL, "wait_replicas must not be negative");
    c->wait_replicas = o->wait_replicas;
    c->wait_replicas_timeout_ms =
        o->wait_replicas_timeout_ms ? o->wait_replicas_timeout_ms : 1000;
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
    if (tls || t.neps < 1 ||
        (t.mode != DL_MODE_SINGLE && t.mode != DL_MODE_SENTINEL && t.mode != DL_MODE_CLUSTER) ||
        (t.mode == DL_MODE_SINGLE && t.neps != 1)) {
        rc = dl_seterr(err, DLOCK_ENOTSUP,
                       "the async API supports one Redis server (redis://, unix://), Sentinel "
                       "(redis-sentinel://) and Redis Cluster only yet: not TLS or RedLock");
    } else if (t.mode == DL_MODE_SENTINEL) {
        /* the master's address comes from the sentinels, at each connect */
        c->ep.db = t.db;
        c->ep.password = t.password;
        t.password = NULL;
        rc = dl_asent_new(&t, &c->sent, err);
        if (!rc) rc = dl_apply_credentials(&c->ep, o, err);
    } else if (t.mode == DL_MODE_CLUSTER && c->wait_replicas) {
        /* a request a cluster redirects (ASK) runs on a connection its
         * WAIT would not follow */
        rc = dl_seterr(err, DLOCK_ENOTSUP,
                       "wait_replicas on a Redis Cluster is not supported by the async API yet");
    } else if (t.mode == DL_MODE_CLUSTER) {
        /* the credentials on every seed, then a node per seed; the
         * subscribed connection goes to the first seed */
        for (size_t i = 0; !rc && i < t.neps; i++) rc = dl_apply_credentials(&t.eps[i], o, err);
        if (!rc) rc = dl_endpoint_copy(&c->ep, &t.eps[0]) ? dl_seterr(err, DLOCK_ENOMEM, "out of memory") : 0;
        if (!rc) rc = dl_acluster_new(c, &t, cmd_up, dl_asubs_pipe_init, err);
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

/* The loop could not watch a connection's socket: what waits on it ends
 * (DLOCK_ENOMEM), and the next request opens a new connection. */
static int refused(dl_aloop *lp, int slot, void *owner) {
    (void)slot;
    dl_aclient *c = (dl_aclient *)((char *)lp - offsetof(dl_aclient, loop));
    if (!owner) return 0; /* the Sentinel watch's: its question times out */
    dl_err err;
    dl_seterr(&err, DLOCK_ENOMEM, "the event loop could not watch the connection's socket "
                                  "(out of memory)");
    dl_apipe_fail(owner, &err);
    return c->doomed;
}

static void destroy(dl_aclient *c) {
    dl_awatch_close(c);
    dl_arenew_free(&c->renew);
    dl_aloop_close(&c->loop);
    dl_asubs_free(&c->subs);
    dl_acluster_free(c);
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
    c->loop.refused = refused;
    /* slot 0 the command connection, 1 the subscribed one (dlock_async.h) */
    int cmd_slot = dl_aloop_slot_new(&c->loop, &c->cmd);
    int subs_slot = dl_aloop_slot_new(&c->loop, &c->subs.pipe);
    dl_apipe_init(&c->cmd, c, cmd_slot);
    c->cmd.up = cmd_up;
    c->destroy = destroy;
    dl_asubs_init(&c->subs, c, subs_slot);
    dl_arenew_init(&c->renew, c);
    dlock_options defaults;
    dlock_options_init(&defaults);
    dl_err err = {0};
    int rc = cmd_slot < 0 || subs_slot < 0
                 ? dl_seterr(&err, DLOCK_ENOMEM, "out of memory")
                 : open_client(c, opts ? opts : &defaults, &err);
    /* Sentinel: the watch's socket has a slot of its own */
    if (!rc && c->sent && (c->wslot = dl_aloop_slot_new(&c->loop, NULL)) < 0)
        rc = dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
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
    if (fd >= 0 && c->wprobe.conn && fd == c->wprobe.conn->fd) {
        dl_awatch_io(c, events);
    } else {
        dl_apipe *p = dl_aloop_owner(&c->loop, fd);
        if (p && fd == dl_apipe_fd(p)) dl_apipe_io(p, events);
    }
    if (!c->doomed) dl_aloop_run(&c->loop);
    c->depth--;
    if (c->doomed) {
        if (!c->depth) destroy(c);
        return;
    }
    if (!c->depth) dl_aloop_sync(&c->loop);
}

int dlock_async_fds(const dlock_async_client *c, dlock_async_pollfd *fds, int cap) {
    if (!c) return 0;
    if (!fds || cap < 0) cap = 0;
    int n = 0;
    for (int i = 0; i < c->loop.nslots; i++) {
        const dl_aslot *s = &c->loop.slots[i];
        if (!s->used || s->fd < 0 || !s->ev) continue;
        if (n < cap) {
            fds[n].fd = s->fd;
            fds[n].events = s->ev;
        }
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
