/* Error codes, their names, and the per-thread client message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base.h"

static const char *const names[] = {
    [DLOCK_OK] = "success",
    [DLOCK_EBUSY] = "lock is held by another owner",
    [DLOCK_ETIMEDOUT] = "timed out waiting for the lock",
    [DLOCK_EINVAL] = "invalid argument",
    [DLOCK_ENOMEM] = "out of memory",
    [DLOCK_EIO] = "connection error",
    [DLOCK_EPROTO] = "protocol error",
    [DLOCK_ESERVER] = "server error",
    [DLOCK_ENOTHELD] = "lock not held by this handle",
    [DLOCK_ENOTOWNER] = "not the owner of the lock",
    [DLOCK_ELOST] = "lock lease lost",
    [DLOCK_EAUTH] = "authentication or permission refused",
    [DLOCK_ENAMETOOLONG] = "lock name too long",
    [DLOCK_ENOTSUP] = "not supported",
    [DLOCK_ESYS] = "system call failed",
    [DLOCK_EOVERFLOW] = "counter overflow",
    [DLOCK_ENOQUORUM] = "no quorum of nodes answered",
    [DLOCK_EREPLICAS] = "not acknowledged by enough replicas",
    [DLOCK_ETLS] = "TLS handshake or certificate verification failed",
    [DLOCK_ECANCELED] = "wait cancelled",
};

const char *dlock_strerror(int code) {
    if (code < 0 || code >= DLOCK_CODE_LAST_ || !names[code]) return "unknown error code";
    return names[code];
}

int dl_seterr(dl_err *err, int code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n < 0) err->msg[0] = '\0';
    /* one line: no newlines from server replies */
    for (char *p = err->msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return code;
}

/* The calling thread's last client-level error, remembered with the client
 * it belongs to (like errno, but per client). */
static _Thread_local const dlock_client *tls_client;
static _Thread_local char tls_msg[DL_ERRMSG_MAX];

int dl_client_fail(const dlock_client *c, const dl_err *err) {
    tls_client = c;
    snprintf(tls_msg, sizeof tls_msg, "%s", err->msg[0] ? err->msg : dlock_strerror(err->code));
    return err->code;
}

void dl_client_ok(const dlock_client *c) {
    if (tls_client == c) tls_msg[0] = '\0';
}

const char *dlock_errmsg(const dlock_client *c) {
    if (!c) return "no client (NULL handle)";
    return tls_client == c ? tls_msg : "";
}

int dl_check_count(int64_t v, int64_t min, const char *what, const char *arg, dl_err *err) {
    if (v < min)
        return dl_seterr(err, DLOCK_EINVAL, "%s: %s must be >= %lld (got %lld)", what, arg,
                         (long long)min, (long long)v);
    if (v > DLOCK_COUNT_MAX)
        return dl_seterr(err, DLOCK_EINVAL, "%s: %s must be at most 2^53 - 1 (got %lld)", what,
                         arg, (long long)v);
    return DLOCK_OK;
}
