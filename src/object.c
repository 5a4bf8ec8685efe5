/* The common part of every handle (dl_handle: a client, a name, a channel,
 * the last message, the cancel), and the synchronizer handles' (semaphore,
 * expirable semaphore, latch) making and script calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

static int object_init(dl_object *o, dlock_client *c, dlock_kind kind, const char *name,
                       size_t name_len, const char *chan_prefix) {
    dl_err err = {0};
    memset(o, 0, sizeof *o);
    o->h.c = c;
    dl_cancel_init(&o->h.cancel);
    if (kind == DLOCK_KIND_SEMAPHORE) {
        if (!c->backend->sem_acquire) return dl_backend_unsupported(c, "the semaphore");
    } else if (kind == DLOCK_KIND_LATCH ? !c->backend->latch_await
                                          : !c->backend->permits_acquire) {
        return dl_backend_unsupported(c, kind == DLOCK_KIND_LATCH
                                             ? "the countdown latch"
                                             : "the permit-expirable semaphore");
    }
    if (dl_topo_fanout(c))
        return dl_client_fail(c, &(dl_err){DLOCK_ENOTSUP, "semaphores and latches are not "
                                                          "supported on redlock://"});
    int rc = dl_check_name(name, &name_len, &err);
    if (!rc) rc = dl_check_cluster_name(c, name, name_len, &err);
    if (rc) return dl_client_fail(c, &err);
    o->h.name = malloc(name_len + 1);
    if (o->h.name) {
        memcpy(o->h.name, name, name_len);
        o->h.name[name_len] = '\0';
        o->h.name_len = name_len;
        o->h.channel = kind == DLOCK_KIND_LATCH
                           ? dl_latch_channel(name, name_len, &o->h.channel_len)
                           : dl_derive_key(chan_prefix, name, name_len, "", &o->h.channel_len);
    }
    if (!o->h.name || !o->h.channel) {
        dl_handle_clear(&o->h);
        dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
        return dl_client_fail(c, &err);
    }
    if (kind == DLOCK_KIND_LATCH &&
        dl_check_cluster_latch(c, name, name_len, o->h.channel, o->h.channel_len, &err)) {
        dl_handle_clear(&o->h);
        return dl_client_fail(c, &err);
    }
    return DLOCK_OK;
}

void dl_handle_clear(dl_handle *h) {
    dl_cancel_destroy(&h->cancel);
    free(h->name);
    free(h->channel);
    h->name = h->channel = NULL;
}

int dl_handle_fail(dl_handle *h, const dl_err *err) {
    snprintf(h->errmsg, sizeof h->errmsg, "%s", err->msg[0] ? err->msg : dlock_strerror(err->code));
    return err->code;
}

int dl_handle_ok(dl_handle *h) {
    h->errmsg[0] = '\0';
    return DLOCK_OK;
}

void *dl_object_new(dlock_client *c, size_t size, dlock_kind kind, const char *name,
                    size_t name_len, const char *chan_prefix, const char *fn, int have_out,
                    int *rc) {
    *rc = DLOCK_EINVAL;
    if (!c) return NULL;
    if (!have_out) {
        dl_err err = {0};
        dl_seterr(&err, DLOCK_EINVAL, "%s: NULL out", fn);
        *rc = dl_client_fail(c, &err);
        return NULL;
    }
    dl_object *o = calloc(1, size);
    if (!o) {
        *rc = dl_client_fail(c, &(dl_err){DLOCK_ENOMEM, "out of memory"});
        return NULL;
    }
    *rc = object_init(o, c, kind, name, name_len, chan_prefix);
    if (*rc) {
        free(o);
        return NULL;
    }
    return o;
}

int dl_object_eval_int(dl_object *o, dl_conn *conn, dl_script *s, const char *what, int nkeys,
                       const char **keys, const size_t *keylens, int nargs, const char **args,
                       const size_t *arglens, long long *v, dl_err *err) {
    redisReply *r = NULL;
    int rc = conn ? dl_eval(conn, dl_cmd_deadline(o->h.c), s, nkeys, keys, keylens, nargs, args,
                            arglens, &r, err)
                  : dl_client_eval(o->h.c, s, nkeys, keys, keylens, nargs, args, arglens, &r, err);
    if (rc) return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = dl_sync_reply_error(r, what, err);
    else if (dl_reply_int(r, v))
        rc = dl_seterr(err, DLOCK_EPROTO, "%s: unexpected reply from the script", what);
    freeReplyObject(r);
    return rc;
}
