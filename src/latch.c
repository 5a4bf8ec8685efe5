/* The countdown latch (Redisson RCountDownLatch layout): STRING `name` holds
 * the count; channel "redisson_countdownlatch__channel__{name}" (no colon,
 * braces for every name: dl_latch_channel)
 * gets "0" when the count reaches zero (the key is deleted then) and "1"
 * when a new count is set. An absent key is a count of zero. Waiters
 * subscribe, read the count, and sleep until a message or their deadline:
 * the count only reaches zero through a script that publishes "0". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kinds.h"


/* ---- scripts: KEYS[1] = latch, KEYS[2] = channel ---- */

/* The count into the new local var (inline, as DL_LUA_WAKE_ONE); a value
 * that is not an integer is an error. */
#define LATCH_COUNT_LUA(var)                                                                   \
    "local " var " = 0 "                                                                       \
    "do local v = redis.call('get', KEYS[1]) "                                                 \
    "if v then " var " = tonumber(v) "                                                         \
    "if not " var " then error('latch count is not an integer') end end end "

/* ARGV: count (>= 1). Sets it only at zero. -> 1 set | 0 not at zero */
dl_script dl_script_latch_try_set = DL_SCRIPT("latch_try_set",
    LATCH_COUNT_LUA("n")
    "if n > 0 then return 0 end "
    "redis.call('set', KEYS[1], ARGV[1]) "
    "redis.call('publish', KEYS[2], '1') "
    "return 1");

/* ARGV: count (>= 0). 0 deletes the key and wakes the waiters. -> 1 */
dl_script dl_script_latch_set = DL_SCRIPT("latch_set",
    "if tonumber(ARGV[1]) <= 0 then "
    "redis.call('del', KEYS[1]) "
    "redis.call('publish', KEYS[2], '0') "
    "else "
    "redis.call('set', KEYS[1], ARGV[1]) "
    "redis.call('publish', KEYS[2], '1') end "
    "return 1");

/* ARGV: k (>= 1). Counts down, not below zero; at zero deletes the key and
 * publishes "0". -> the new count */
dl_script dl_script_latch_count_down = DL_SCRIPT("latch_count_down",
    LATCH_COUNT_LUA("n")
    "if n <= 0 then "
    "if redis.call('exists', KEYS[1]) == 1 then redis.call('del', KEYS[1]) end "
    "return 0 end "
    "local k = tonumber(ARGV[1]) "
    "if k >= n then "
    "redis.call('del', KEYS[1]) "
    "redis.call('publish', KEYS[2], '0') "
    "return 0 end "
    "return redis.call('decrby', KEYS[1], ARGV[1])");

/* ---- handles ---- */

struct dlock_latch {
    dl_object o;               /* client, name, channel, message */
};

static int la_fail(dlock_latch *l, const dl_err *err) { return dl_handle_fail(&l->o.h, err); }

static int la_ok(dlock_latch *l) { return dl_handle_ok(&l->o.h); }

int dlock_latch_new(dlock_client *c, const char *name, size_t name_len, dlock_latch **out) {
    if (out) *out = NULL;
    int rc;
    dlock_latch *l = dl_object_new(c, sizeof *l, DLOCK_KIND_LATCH, name, name_len,
                                   DL_LATCH_CHANNEL_PREFIX, "dlock_latch_new", out != NULL, &rc);
    if (!l) return rc;
    *out = l;
    dl_client_ok(c);
    return DLOCK_OK;
}

void dlock_latch_free(dlock_latch *l) {
    if (!l) return;
    dl_handle_clear(&l->o.h);
    free(l);
}

const char *dlock_latch_errmsg(const dlock_latch *l) {
    return l ? l->o.h.errmsg : "no latch (NULL handle)";
}

/* Runs a script with KEYS {latch, channel} and one number argument. */
static int la_eval(dlock_latch *l, dl_script *s, const char *what, int64_t arg, long long *v,
                   dl_err *err) {
    char num[24];
    const char *keys[2] = {l->o.h.name, l->o.h.channel};
    size_t keylens[2] = {l->o.h.name_len, l->o.h.channel_len};
    const char *args[1] = {num};
    size_t arglens[1] = {dl_fmt_ll(num, arg)};
    return dl_object_eval_int(&l->o, NULL, s, what, 2, keys, keylens, 1, args, arglens, v, err);
}

/* GET on conn (a pooled one when NULL); absent is 0. */
static int read_count(dlock_latch *l, dl_conn *conn, int64_t *count, dl_err *err) {
    const char *argv[2] = {"GET", l->o.h.name};
    size_t lens[2] = {3, l->o.h.name_len};
    redisReply *r = NULL;
    int rc = conn ? dl_conn_command(conn, dl_cmd_deadline(l->o.h.c), 2, argv, lens, &r, err)
                  : dl_client_command(l->o.h.c, 2, argv, lens, &r, err);
    if (rc) return rc;
    long long v = 0;
    if (r->type == REDIS_REPLY_ERROR)
        rc = dl_reply_error(r, "latch count", err);
    else if (r->type != REDIS_REPLY_NIL && dl_reply_int(r, &v))
        rc = dl_seterr(err, DLOCK_EPROTO, "latch count: the value is not an integer");
    freeReplyObject(r);
    if (!rc) *count = v;
    return rc;
}

/* ---- Redis (the backend's table: backend_redis.c) ---- */

int dl_redis_latch_try_set(dl_object *o, int64_t count, int *set, dl_err *err) {
    long long v = 0;
    int rc = la_eval((dlock_latch *)o, &dl_script_latch_try_set, "latch try_set", count, &v, err);
    if (!rc) *set = v == 1;
    return rc;
}

int dl_redis_latch_set(dl_object *o, int64_t count, dl_err *err) {
    long long v = 0;
    return la_eval((dlock_latch *)o, &dl_script_latch_set, "latch set", count, &v, err);
}

int dl_redis_latch_count_down(dl_object *o, int64_t k, dl_err *err) {
    long long v = 0;
    return la_eval((dlock_latch *)o, &dl_script_latch_count_down, "latch count_down", k, &v, err);
}

int dl_redis_latch_count(dl_object *o, int64_t *count, dl_err *err) {
    return read_count((dlock_latch *)o, NULL, count, err);
}

int dl_redis_latch_await(dl_object *o, int64_t wait_ms, dl_err *err) {
    dlock_latch *l = (dlock_latch *)o;
    char nm[80];
    dlock_client *c = l->o.h.c;
    int64_t deadline = dl_deadline(wait_ms);
    dl_conn *conn = NULL, *sub = NULL;
    int64_t n = 0;
    int rc = dl_pool_get_key(c, l->o.h.name, l->o.h.name_len, dl_cmd_deadline(c), &conn, err);
    if (!rc) rc = read_count(l, conn, &n, err);
    if (rc || n <= 0) goto out;
    if (wait_ms == DLOCK_NOWAIT) {
        rc = dl_seterr(err, DLOCK_ETIMEDOUT, "latch '%s' is not at zero (count %lld)",
                       dl_name_msg(l->o.h.name, l->o.h.name_len, nm, sizeof nm), (long long)n);
        goto out;
    }
    rc = dl_sync_subscribe(c, l->o.h.channel, l->o.h.channel_len, &sub, err);
    dl_cancel_begin(&l->o.h.cancel); /* a cancel wakes dl_sync_wait */
    while (!rc) {
        /* subscribed before this read: the zero message after it is not missed */
        rc = read_count(l, conn, &n, err);
        if (rc || n <= 0) break;
        if (deadline != DL_INF_DEADLINE && dl_now_ms() >= deadline) {
            rc = dl_seterr(err, DLOCK_ETIMEDOUT, "timed out waiting for latch '%s' (count %lld)",
                           dl_name_msg(l->o.h.name, l->o.h.name_len, nm, sizeof nm), (long long)n);
            break;
        }
        int moved = 0;
        rc = dl_follow_slot(c, l->o.h.channel, l->o.h.channel_len, &conn, &sub, &moved, err);
        if (rc || moved) continue;
        rc = dl_sync_wait(&l->o, sub, deadline, err);
        if (rc == DLOCK_ETIMEDOUT) rc = DLOCK_OK; /* one last read, then time out */
    }
    dl_cancel_end(&l->o.h.cancel);
    dl_sync_unsubscribe(c, sub, l->o.h.channel, l->o.h.channel_len);
out:
    dl_pool_put(c, conn);
    return rc;
}

/* ---- the public calls: arguments checked, then the backend's ---- */

int dlock_latch_try_set(dlock_latch *l, int64_t count, int *set) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (set) *set = 0;
    if (!set) {
        dl_seterr(&err, DLOCK_EINVAL, "latch try_set: NULL result pointer");
        return la_fail(l, &err);
    }
    if (dl_check_count(count, 1, "latch try_set", "count", &err)) return la_fail(l, &err);
    int rc = l->o.h.c->backend->latch_try_set(&l->o, count, set, &err);
    return rc ? la_fail(l, &err) : la_ok(l);
}

int dlock_latch_set(dlock_latch *l, int64_t count) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (dl_check_count(count, 0, "latch set", "count", &err)) return la_fail(l, &err);
    int rc = l->o.h.c->backend->latch_set(&l->o, count, &err);
    return rc ? la_fail(l, &err) : la_ok(l);
}

int dlock_latch_count_down(dlock_latch *l, int64_t k) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (dl_check_count(k, 1, "latch count_down", "k", &err)) return la_fail(l, &err);
    int rc = l->o.h.c->backend->latch_count_down(&l->o, k, &err);
    return rc ? la_fail(l, &err) : la_ok(l);
}

int dlock_latch_count(dlock_latch *l, int64_t *count) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!count) {
        dl_seterr(&err, DLOCK_EINVAL, "latch count: NULL result pointer");
        return la_fail(l, &err);
    }
    *count = 0;
    int rc = l->o.h.c->backend->latch_count(&l->o, count, &err);
    return rc ? la_fail(l, &err) : la_ok(l);
}

int dlock_latch_await(dlock_latch *l, int64_t wait_ms) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (dl_sync_check_wait(wait_ms, &err)) return la_fail(l, &err);
    dl_cancel_note(&l->o.h.cancel);
    int rc = l->o.h.c->backend->latch_await(&l->o, wait_ms, &err);
    return rc ? la_fail(l, &err) : la_ok(l);
}

int dlock_latch_cancel(dlock_latch *l) {
    return l ? dl_cancel_ask(l->o.h.c, &l->o.h.cancel) : DLOCK_EINVAL;
}
