/* Lock handles: acquire, release, extend and the handle's own queries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int lock_fail(dlock_lock *l, const dl_err *err) {
    snprintf(l->errmsg, sizeof l->errmsg, "%s", err->msg[0] ? err->msg : dlock_strerror(err->code));
    return err->code;
}

static int lock_ok(dlock_lock *l) {
    l->errmsg[0] = '\0';
    return DLOCK_OK;
}

int dlock_lock_new(dlock_client *c, const char *name, size_t name_len, dlock_kind kind,
                   dlock_lock **out) {
    if (!out) return DLOCK_EINVAL;
    *out = NULL;
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    int rc = dl_check_name(name, &name_len, &err);
    if (!rc && kind != DLOCK_KIND_PLAIN && kind != DLOCK_KIND_REENTRANT)
        rc = dl_seterr(&err, DLOCK_EINVAL, "unknown lock kind %d", (int)kind);
    if (rc) return dl_client_fail(c, &err);
    dlock_lock *l = calloc(1, sizeof *l);
    if (!l) goto oom;
    l->c = c;
    l->kind = kind;
    l->name = malloc(name_len + 1);
    if (!l->name) goto oom;
    memcpy(l->name, name, name_len);
    l->name[name_len] = '\0';
    l->name_len = name_len;
    l->fence_key = dl_derive_key("redisson_lock_token:", name, name_len, "", &l->fence_key_len);
    l->channel = dl_derive_key("redisson_lock__channel:", name, name_len, "", &l->channel_len);
    if (!l->fence_key || !l->channel) goto oom;
    atomic_init(&l->lost, 0);
    atomic_init(&l->wd_last_ok, 0);
    *out = l;
    dl_client_ok(c);
    return DLOCK_OK;
oom:
    if (l) {
        free(l->name);
        free(l->fence_key);
        free(l->channel);
        free(l);
    }
    dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
    return dl_client_fail(c, &err);
}

void dlock_lock_free(dlock_lock *l) {
    if (!l) return;
    while (l->holds > 0) {
        if (dlock_release(l) != DLOCK_OK) break;
    }
    if (l->watchdog) {
        dl_watchdog_unregister(l->c, l);
        l->watchdog = 0;
    }
    free(l->name);
    free(l->fence_key);
    free(l->channel);
    free(l);
}

const char *dlock_lock_errmsg(const dlock_lock *l) {
    return l ? l->errmsg : "no lock (NULL handle)";
}

/* The owner string for a new hold. */
static int make_owner(dlock_lock *l, dl_err *err) {
    if (l->kind == DLOCK_KIND_PLAIN) {
        int rc = dl_random_hex(l->token, DLOCK_TOKEN_LEN / 2, err);
        if (rc) return rc;
        l->token_len = DLOCK_TOKEN_LEN;
        return DLOCK_OK;
    }
    int n = snprintf(l->token, sizeof l->token, "%s:%ld", l->c->id, dl_thread_id());
    l->token_len = (size_t)n;
    return DLOCK_OK;
}

int dlock_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, uint64_t *fence) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (wait_ms < DLOCK_WAIT_FOREVER) {
        dl_seterr(&err, DLOCK_EINVAL, "wait must be >= 0 ms, or DLOCK_WAIT_FOREVER");
        return lock_fail(l, &err);
    }
    if (lease_ms < 0) {
        dl_seterr(&err, DLOCK_EINVAL, "lease must be > 0 ms, or DLOCK_WATCHDOG");
        return lock_fail(l, &err);
    }
    int reenter = 0;
    if (l->holds > 0) {
        if (l->kind == DLOCK_KIND_PLAIN) {
            dl_seterr(&err, DLOCK_EINVAL, "this handle already holds the lock (plain locks are not "
                                          "reentrant)");
            return lock_fail(l, &err);
        }
        char me[96];
        snprintf(me, sizeof me, "%s:%ld", l->c->id, dl_thread_id());
        if (strcmp(me, l->token) != 0) {
            dl_seterr(&err, DLOCK_EINVAL, "this handle is held by another thread");
            return lock_fail(l, &err);
        }
        reenter = 1;
    } else {
        int rc = make_owner(l, &err);
        if (rc) return lock_fail(l, &err);
    }
    int64_t lease = lease_ms == DLOCK_WATCHDOG ? l->c->watchdog_lease_ms : lease_ms;
    dl_try t;
    int rc = dl_lock_wait(l, wait_ms, lease, &t, &err);
    if (rc) {
        if (!reenter) {
            l->token[0] = '\0';
            l->token_len = 0;
        }
        return lock_fail(l, &err);
    }
    l->holds++;
    l->fence = t.fence;
    l->lease_ms = lease;
    atomic_store(&l->lost, 0);
    if (fence) *fence = t.fence;
    if (lease_ms == DLOCK_WATCHDOG && !l->watchdog) {
        rc = dl_watchdog_register(l->c, l, &err);
        if (rc) {
            lock_fail(l, &err);
            dlock_release(l); /* best effort; the lease runs out otherwise */
            l->holds = 0;
            snprintf(l->errmsg, sizeof l->errmsg, "%s", err.msg);
            return rc;
        }
        l->watchdog = 1;
    } else if (lease_ms != DLOCK_WATCHDOG && l->watchdog) {
        dl_watchdog_unregister(l->c, l);
        l->watchdog = 0;
    }
    return lock_ok(l);
}

/* Marks the handle as no longer holding, after the server said so. */
static int mark_lost(dlock_lock *l, const char *op, dl_err *err) {
    char nm[80];
    l->holds = 0;
    atomic_store(&l->lost, 1);
    return dl_seterr(err, DLOCK_ELOST,
                     "%s: lock '%s' was no longer held by this owner (lease expired or taken "
                     "over)",
                     op, dl_name_msg(l->name, l->name_len, nm, sizeof nm));
}

int dlock_release(dlock_lock *l) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (l->holds <= 0) {
        dl_seterr(&err, DLOCK_ENOTHELD, "release: this handle does not hold the lock");
        return lock_fail(l, &err);
    }
    int was_wd = l->watchdog;
    int final = l->holds == 1;
    if (final && was_wd) {
        /* stop renewing first, or a renewal racing the release would report
         * the lock lost */
        dl_watchdog_unregister(l->c, l);
        l->watchdog = 0;
    }
    dlock_client *c = l->c;
    int64_t deadline = dl_cmd_deadline(c);
    dl_conn *conn = NULL;
    redisReply *r = NULL;
    int rc = dl_pool_get(c, deadline, &conn, &err);
    if (!rc) {
        const char *keys[2] = {l->name, l->channel};
        size_t keylens[2] = {l->name_len, l->channel_len};
        char lease[24];
        int ll = snprintf(lease, sizeof lease, "%lld", (long long)l->lease_ms);
        if (l->kind == DLOCK_KIND_PLAIN) {
            const char *args[1] = {l->token};
            size_t arglens[1] = {l->token_len};
            rc = dl_eval(conn, deadline, &dl_script_plain_release, 2, keys, keylens, 1, args,
                         arglens, &r, &err);
        } else {
            const char *args[2] = {lease, l->token};
            size_t arglens[2] = {(size_t)ll, l->token_len};
            rc = dl_eval(conn, deadline, &dl_script_reentrant_release, 2, keys, keylens, 2, args,
                         arglens, &r, &err);
        }
        dl_pool_put(c, conn);
    }
    long long v = 0;
    if (!rc) {
        if (r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "release", &err);
        else if (dl_reply_int(r, &v)) rc = dl_seterr(&err, DLOCK_EPROTO, "release: bad reply");
    }
    if (r) freeReplyObject(r);
    if (rc) {
        if (final && was_wd) {
            dl_err e2 = {0};
            if (dl_watchdog_register(c, l, &e2) == DLOCK_OK) l->watchdog = 1;
        }
        return lock_fail(l, &err);
    }
    if (l->kind == DLOCK_KIND_PLAIN ? v != 1 : v == -1) {
        if (l->watchdog) {
            dl_watchdog_unregister(c, l);
            l->watchdog = 0;
        }
        mark_lost(l, "release", &err);
        return lock_fail(l, &err);
    }
    l->holds = (v == 1) ? 0 : l->holds - 1;
    if (l->holds == 0) {
        if (l->watchdog) {
            dl_watchdog_unregister(c, l);
            l->watchdog = 0;
        }
        l->token[0] = '\0';
        l->token_len = 0;
    }
    return lock_ok(l);
}

int dlock_extend(dlock_lock *l, int64_t lease_ms) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (lease_ms <= 0) {
        dl_seterr(&err, DLOCK_EINVAL, "extend: lease must be > 0 ms");
        return lock_fail(l, &err);
    }
    if (l->holds <= 0) {
        dl_seterr(&err, DLOCK_ENOTHELD, "extend: this handle does not hold the lock");
        return lock_fail(l, &err);
    }
    int was_wd = l->watchdog;
    if (was_wd) {
        dl_watchdog_unregister(l->c, l);
        l->watchdog = 0;
    }
    dlock_client *c = l->c;
    int64_t deadline = dl_cmd_deadline(c);
    char lease[24];
    int ll = snprintf(lease, sizeof lease, "%lld", (long long)lease_ms);
    const char *keys[1] = {l->name};
    size_t keylens[1] = {l->name_len};
    const char *args[2];
    size_t arglens[2];
    dl_script *s;
    if (l->kind == DLOCK_KIND_PLAIN) {
        s = &dl_script_plain_extend;
        args[0] = l->token, arglens[0] = l->token_len;
        args[1] = lease, arglens[1] = (size_t)ll;
    } else {
        s = &dl_script_reentrant_extend;
        args[0] = l->token, arglens[0] = l->token_len;
        args[1] = lease, arglens[1] = (size_t)ll;
    }
    dl_conn *conn = NULL;
    redisReply *r = NULL;
    int64_t t0 = dl_now_ms();
    int rc = dl_pool_get(c, deadline, &conn, &err);
    if (!rc) {
        rc = dl_eval(conn, deadline, s, 1, keys, keylens, 2, args, arglens, &r, &err);
        dl_pool_put(c, conn);
    }
    long long v = 0;
    if (!rc) {
        if (r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "extend", &err);
        else if (dl_reply_int(r, &v)) rc = dl_seterr(&err, DLOCK_EPROTO, "extend: bad reply");
    }
    if (r) freeReplyObject(r);
    if (rc) {
        if (was_wd) {
            dl_err e2 = {0};
            if (dl_watchdog_register(c, l, &e2) == DLOCK_OK) l->watchdog = 1;
        }
        return lock_fail(l, &err);
    }
    if (v != 1) {
        mark_lost(l, "extend", &err);
        return lock_fail(l, &err);
    }
    l->lease_ms = lease_ms;
    l->expires_at = t0 + lease_ms;
    return lock_ok(l);
}

int dlock_lock_holding(const dlock_lock *l) { return l && l->holds > 0; }

int dlock_lock_is_lost(const dlock_lock *l) { return l ? atomic_load(&l->lost) : 0; }

void dlock_lock_on_lost(dlock_lock *l, dlock_lost_fn fn, void *userdata) {
    if (!l) return;
    /* the watchdog reads these under its mutex: see watchdog.c */
    dl_watchdog_unregister(l->c, l);
    l->lost_fn = fn;
    l->lost_ud = userdata;
    if (l->watchdog) {
        dl_err err = {0};
        if (dl_watchdog_register(l->c, l, &err) != DLOCK_OK) l->watchdog = 0;
    }
}

const char *dlock_lock_token(const dlock_lock *l) {
    return l && l->holds > 0 ? l->token : "";
}

uint64_t dlock_lock_fence(const dlock_lock *l) { return l ? l->fence : 0; }

const char *dlock_lock_name(const dlock_lock *l, size_t *len) {
    if (!l) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = l->name_len;
    return l->name;
}

dlock_kind dlock_lock_kind(const dlock_lock *l) { return l ? l->kind : (dlock_kind)0; }

int dlock_lock_check(dlock_lock *l, int *held, int64_t *count) {
    if (!l || !held) return DLOCK_EINVAL;
    dl_err err = {0};
    *held = 0;
    if (count) *count = 0;
    if (l->holds <= 0) return lock_ok(l);
    const char *argv[3];
    size_t lens[3];
    if (l->kind == DLOCK_KIND_PLAIN) {
        argv[0] = "GET", lens[0] = 3;
    } else {
        argv[0] = "HGET", lens[0] = 4;
        argv[2] = l->token, lens[2] = l->token_len;
    }
    argv[1] = l->name, lens[1] = l->name_len;
    redisReply *r = NULL;
    int rc = dl_client_command(l->c, l->kind == DLOCK_KIND_PLAIN ? 2 : 3, argv, lens, &r, &err);
    if (rc) return lock_fail(l, &err);
    long long n = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = dl_reply_error(r, "check", &err);
    } else if (r->type == REDIS_REPLY_STRING) {
        if (l->kind == DLOCK_KIND_PLAIN) {
            *held = r->len == l->token_len && !memcmp(r->str, l->token, r->len);
            if (count) *count = *held;
        } else if (!dl_reply_int(r, &n)) {
            *held = n > 0;
            if (count) *count = n;
        }
    }
    freeReplyObject(r);
    return rc ? lock_fail(l, &err) : lock_ok(l);
}
