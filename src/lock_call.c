/* attempt / release / extend for kinds that describe their script calls
 * (dl_kind_ops.call): one implementation for one server, and the same
 * description serves every RedLock node (redlock.c). */
#include <string.h>

#include "kinds.h"

int dl_parse_attempt(dlock_lock *l, redisReply *r, int64_t t0, int64_t lease_ms, dl_outcome *t,
                     dl_err *err) {
    long long a = 0, b = 0, n = 0;
    memset(t, 0, sizeof *t);
    if (r->type == REDIS_REPLY_ERROR) {
        t->unfenced = r->str && !strncmp(r->str, DL_FENCE_ERR, sizeof DL_FENCE_ERR - 1);
        return dl_reply_error(r, "acquire", err);
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || dl_reply_int(r->element[0], &a) ||
        dl_reply_int(r->element[1], &b) || (r->elements > 2 && dl_reply_int(r->element[2], &n)))
        return dl_seterr(err, DLOCK_EPROTO, "acquire: unexpected reply from the script");
    if (a == 1) {
        t->acquired = 1;
        t->fence = (uint64_t)b;
        t->count = r->elements > 2 ? n : 1;
        l->expires_at = t0 + lease_ms;
        atomic_store(&l->lease.last_ok, (long long)t0);
    } else {
        t->pttl = b;
    }
    return DLOCK_OK;
}

int dl_call_attempt(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms, dl_outcome *t,
                    dl_err *err) {
    (void)wait_ms;
    dl_call call;
    l->ops->call(l, DL_OP_ACQUIRE, lease_ms, &call);
    int64_t t0 = dl_now_ms();
    redisReply *r = NULL;
    int rc = dl_eval_opt(conn, dl_cmd_deadline(l->h.c), call.opts, call.script, call.nkeys,
                         call.keys, call.keylens, call.nargs, call.args, call.arglens, &r, err);
    if (rc) return rc;
    rc = dl_parse_attempt(l, r, t0, lease_ms, t, err);
    freeReplyObject(r);
    return rc;
}

long long dl_call_release_result(const dl_call *call, long long v) {
    if (call->binary_release) return v == 1 ? 1 : -1;
    return v;
}

int dl_call_release(dlock_lock *l, dl_conn *conn, long long *res, dl_err *err) {
    dl_call call;
    l->ops->call(l, DL_OP_RELEASE, l->lease_ms, &call);
    redisReply *r = NULL;
    int rc = dl_eval_opt(conn, dl_cmd_deadline(l->h.c), call.opts, call.script, call.nkeys,
                         call.keys, call.keylens, call.nargs, call.args, call.arglens, &r, err);
    if (!rc) rc = dl_reply_expect_int(r, "release", res, err);
    if (r) freeReplyObject(r);
    if (!rc) *res = dl_call_release_result(&call, *res);
    return rc;
}

int dl_call_extend(dlock_lock *l, dl_conn *conn, int64_t lease_ms, long long *res, dl_err *err) {
    dl_call call;
    l->ops->call(l, DL_OP_EXTEND, lease_ms, &call);
    redisReply *r = NULL;
    int rc = dl_eval_opt(conn, dl_cmd_deadline(l->h.c), call.opts, call.script, call.nkeys,
                         call.keys, call.keylens, call.nargs, call.args, call.arglens, &r, err);
    if (!rc) rc = dl_reply_expect_int(r, "extend", res, err);
    if (r) freeReplyObject(r);
    return rc;
}
