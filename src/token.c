/* Plain locks addressed by name and token, for processes holding no handle
 * (the CLI's acquire / release / extend run as separate invocations). Each
 * call goes through a short-lived handle, so one server and RedLock behave
 * the same. */
#include <stdio.h>
#include <string.h>

#include "kinds.h"

int dlock_acquire_token(dlock_client *c, const char *name, size_t name_len, int64_t wait_ms,
                        int64_t lease_ms, char token[DLOCK_TOKEN_LEN + 1], uint64_t *fence) {
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!token) return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "token buffer is NULL"});
    token[0] = '\0';
    if (!(c->backend->caps & DL_CAP_TOKENS))
        return dl_backend_unsupported(c, "a lock that outlives its process (acquire by token)");
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

/* Releases (lease_ms 0) or extends the plain lock name held by token. */
static int token_op(dlock_client *c, const char *op, const char *name, size_t name_len,
                    const char *token, int64_t lease_ms) {
    dl_err err = {0};
    if (!(c->backend->caps & DL_CAP_TOKENS))
        return dl_backend_unsupported(c, lease_ms ? "extend by token" : "release by token");
    size_t nl = name_len; /* the name's own errors first */
    if (dl_check_name(name, &nl, &err)) return dl_client_fail(c, &err);
    /* only the shape dlock_acquire_token gives: a string that is not one
     * (an application's value, another client's token) could otherwise
     * "own" a key that is no lock of ours, and the release delete it */
    size_t tl = token ? strlen(token) : 0;
    int shaped = tl == DLOCK_TOKEN_LEN;
    for (size_t i = 0; shaped && i < tl; i++)
        shaped = (token[i] >= '0' && token[i] <= '9') || (token[i] >= 'a' && token[i] <= 'f');
    if (!shaped) {
        dl_seterr(&err, DLOCK_EINVAL,
                  "%s: missing or malformed token (a token of acquire is %d lowercase "
                  "hexadecimal digits)",
                  op, DLOCK_TOKEN_LEN);
        return dl_client_fail(c, &err);
    }
    dlock_lock *l = NULL;
    int rc = dlock_lock_new(c, name, name_len, DLOCK_KIND_PLAIN, &l);
    if (rc) return rc;
    /* adopt the hold the token stands for */
    l->token_len = strlen(token);
    memcpy(l->token, token, l->token_len + 1);
    l->holds = 1;
    l->lease_ms = lease_ms;
    rc = lease_ms ? dlock_extend(l, lease_ms) : dlock_release(l);
    if (rc == DLOCK_ELOST) {
        char nm[80];
        dl_seterr(&err, DLOCK_ENOTOWNER,
                  "%s: the token does not own lock '%s' (wrong token, or the lease expired)", op,
                  dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm));
        rc = DLOCK_ENOTOWNER;
    } else if (rc) {
        dl_seterr(&err, rc, "%s", dlock_lock_errmsg(l));
    }
    l->holds = 0; /* never release on free: the hold stays the caller's */
    dlock_lock_free(l);
    if (rc) return dl_client_fail(c, &err);
    dl_client_ok(c);
    return DLOCK_OK;
}

int dlock_release_token(dlock_client *c, const char *name, size_t name_len, const char *token) {
    if (!c) return DLOCK_EINVAL;
    return token_op(c, "release", name, name_len, token, 0);
}

int dlock_extend_token(dlock_client *c, const char *name, size_t name_len, const char *token,
                       int64_t lease_ms) {
    if (!c) return DLOCK_EINVAL;
    if (lease_ms <= 0)
        return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "extend: lease must be > 0 ms"});
    return token_op(c, "extend", name, name_len, token, lease_ms);
}
