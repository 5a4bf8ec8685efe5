/* Plain locks addressed by name and token, for processes holding no handle
 * (the CLI's acquire / release / extend run as separate invocations). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int dlock_acquire_token(dlock_client *c, const char *name, size_t name_len, int64_t wait_ms,
                        int64_t lease_ms, char token[DLOCK_TOKEN_LEN + 1], uint64_t *fence) {
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!token) return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "token buffer is NULL"});
    token[0] = '\0';
    if (lease_ms <= 0) {
        dl_seterr(&err, DLOCK_EINVAL, "a token lock needs a lease > 0 ms (no watchdog)");
        return dl_client_fail(c, &err);
    }
    dlock_lock *l = NULL;
    int rc = dlock_lock_new(c, name, name_len, DLOCK_KIND_PLAIN, &l);
    if (rc) return rc;
    rc = dlock_acquire(l, wait_ms, lease_ms, fence);
    if (rc) {
        dl_seterr(&err, rc, "%s", dlock_lock_errmsg(l));
        dlock_lock_free(l);
        return dl_client_fail(c, &err);
    }
    memcpy(token, l->token, DLOCK_TOKEN_LEN + 1);
    l->holds = 0; /* hand the hold to the caller: freeing must not release */
    dlock_lock_free(l);
    dl_client_ok(c);
    return DLOCK_OK;
}

/* Runs a plain-lock script that answers 1 (done) or 0 (token does not own). */
static int token_script(dlock_client *c, const char *op, const char *name, size_t name_len,
                        const char *token, int64_t lease_ms) {
    dl_err err = {0};
    int rc = dl_check_name(name, &name_len, &err);
    if (!rc && (!token || !*token || strlen(token) > 200))
        rc = dl_seterr(&err, DLOCK_EINVAL, "%s: missing or malformed token", op);
    if (!rc && lease_ms < 0)
        rc = dl_seterr(&err, DLOCK_EINVAL, "%s: lease must be > 0 ms", op);
    if (rc) return dl_client_fail(c, &err);
    size_t chlen = 0;
    char *channel = dl_derive_key("redisson_lock__channel:", name, name_len, "", &chlen);
    if (!channel) return dl_client_fail(c, &(dl_err){DLOCK_ENOMEM, "out of memory"});
    char lease[24];
    int ll = snprintf(lease, sizeof lease, "%lld", (long long)lease_ms);
    const char *keys[2] = {name, channel};
    size_t keylens[2] = {name_len, chlen};
    const char *args[2] = {token, lease};
    size_t arglens[2] = {strlen(token), (size_t)ll};
    int64_t deadline = dl_cmd_deadline(c);
    dl_conn *conn = NULL;
    redisReply *r = NULL;
    rc = dl_pool_get(c, deadline, &conn, &err);
    if (!rc) {
        if (lease_ms == 0)
            rc = dl_eval(conn, deadline, &dl_script_plain_release, 2, keys, keylens, 1, args,
                         arglens, &r, &err);
        else
            rc = dl_eval(conn, deadline, &dl_script_plain_extend, 1, keys, keylens, 2, args,
                         arglens, &r, &err);
        dl_pool_put(c, conn);
    }
    free(channel);
    long long v = 0;
    if (!rc) {
        if (r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, op, &err);
        else if (dl_reply_int(r, &v)) rc = dl_seterr(&err, DLOCK_EPROTO, "%s: bad reply", op);
        else if (v != 1) {
            char nm[80];
            rc = dl_seterr(&err, DLOCK_ENOTOWNER,
                           "%s: the token does not own lock '%s' (wrong token, or the lease "
                           "expired)",
                           op, dl_name_msg(name, name_len, nm, sizeof nm));
        }
    }
    if (r) freeReplyObject(r);
    if (rc) return dl_client_fail(c, &err);
    dl_client_ok(c);
    return DLOCK_OK;
}

int dlock_release_token(dlock_client *c, const char *name, size_t name_len, const char *token) {
    if (!c) return DLOCK_EINVAL;
    return token_script(c, "release", name, name_len, token, 0);
}

int dlock_extend_token(dlock_client *c, const char *name, size_t name_len, const char *token,
                       int64_t lease_ms) {
    if (!c) return DLOCK_EINVAL;
    if (lease_ms <= 0)
        return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "extend: lease must be > 0 ms"});
    return token_script(c, "extend", name, name_len, token, lease_ms);
}
