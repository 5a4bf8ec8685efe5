/* The reentrant lock: Redisson's RLock layout. A HASH at the lock's name,
 * field "<client uuid>:<thread id>" holding the hold count; the unlock
 * message "0" on redisson_lock__channel:{name}. */
#include <string.h>

#include "internal.h"

/* KEYS: lock, fence counter. ARGV: lease ms, owner field.
 * -> {1, fence, holds} acquired or re-entered | {0, pttl} */
static dl_script acquire_script = DL_SCRIPT("reentrant_acquire",
    "if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then "
    "local n = redis.call('hincrby', KEYS[1], ARGV[2], 1); "
    "redis.call('pexpire', KEYS[1], ARGV[1]); "
    "return {1, redis.call('incr', KEYS[2]), n} end "
    "return {0, redis.call('pttl', KEYS[1])}");

/* KEYS: lock, channel. ARGV: lease ms, owner field.
 * -> -1 not held | 0 still held (count > 0) | 1 released */
static dl_script release_script = DL_SCRIPT("reentrant_release",
    "if redis.pcall('hexists', KEYS[1], ARGV[2]) ~= 1 then return -1 end "
    "local n = redis.call('hincrby', KEYS[1], ARGV[2], -1); "
    "if n > 0 then redis.call('pexpire', KEYS[1], ARGV[1]); return 0 end "
    "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '0'); return 1");

/* KEYS: lock. ARGV: owner field, lease ms. -> 1 extended | 0 not ours */
static dl_script extend_script = DL_SCRIPT("reentrant_extend",
    "if redis.pcall('hexists', KEYS[1], ARGV[1]) == 1 then "
    "redis.call('pexpire', KEYS[1], ARGV[2]); return 1 end return 0");

/* Watchdog. KEYS: locks. ARGV: lease ms, owner field per key. */
static dl_script renew_script = DL_SCRIPT("reentrant_renew",
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "if redis.pcall('hexists', key, ARGV[i + 1]) == 1 then "
    "redis.call('pexpire', key, ARGV[1]); res[i] = 1 else res[i] = 0 end end "
    "return res");

static int reentrant_init(dlock_lock *l, dl_err *err) {
    l->channel = dl_derive_key("redisson_lock__channel:", l->name, l->name_len, "", &l->channel_len);
    return l->channel ? DLOCK_OK : dl_seterr(err, DLOCK_ENOMEM, "out of memory");
}

static int reentrant_attempt(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms,
                             dl_try *t, dl_err *err) {
    (void)wait_ms;
    char lease[24];
    size_t ll = dl_fmt_ll(lease, lease_ms);
    return dl_attempt_script(l, conn, &acquire_script, lease_ms, lease, ll, l->token, l->token_len,
                             t, err);
}

static int reentrant_release(dlock_lock *l, dl_conn *conn, long long *res, dl_err *err) {
    char lease[24];
    size_t ll = dl_fmt_ll(lease, l->lease_ms);
    const char *keys[2] = {l->name, l->channel};
    size_t keylens[2] = {l->name_len, l->channel_len};
    const char *args[2] = {lease, l->token};
    size_t arglens[2] = {ll, l->token_len};
    redisReply *r = NULL;
    int rc = dl_eval(conn, dl_cmd_deadline(l->c), &release_script, 2, keys, keylens, 2, args,
                     arglens, &r, err);
    if (!rc) rc = dl_reply_expect_int(r, "release", res, err);
    if (r) freeReplyObject(r);
    return rc;
}

static int reentrant_extend(dlock_lock *l, dl_conn *conn, int64_t lease_ms, long long *res,
                            dl_err *err) {
    char lease[24];
    size_t ll = dl_fmt_ll(lease, lease_ms);
    const char *keys[1] = {l->name};
    size_t keylens[1] = {l->name_len};
    const char *args[2] = {l->token, lease};
    size_t arglens[2] = {l->token_len, ll};
    redisReply *r = NULL;
    int rc = dl_eval(conn, dl_cmd_deadline(l->c), &extend_script, 1, keys, keylens, 2, args,
                     arglens, &r, err);
    if (!rc) rc = dl_reply_expect_int(r, "extend", res, err);
    if (r) freeReplyObject(r);
    return rc;
}

static int reentrant_check(dlock_lock *l, dl_conn *conn, int *held, int64_t *count, dl_err *err) {
    const char *argv[3] = {"HGET", l->name, l->token};
    size_t lens[3] = {4, l->name_len, l->token_len};
    redisReply *r = NULL;
    int rc = dl_conn_command(conn, dl_cmd_deadline(l->c), 3, argv, lens, &r, err);
    if (rc) return rc;
    long long n = 0;
    if (r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "check", err);
    else if (r->type == REDIS_REPLY_STRING && !dl_reply_int(r, &n)) {
        *held = n > 0;
        *count = n;
    }
    freeReplyObject(r);
    return rc;
}

const dl_kind_ops dl_reentrant_ops = {
    .kind = DLOCK_KIND_REENTRANT,
    .name = "reentrant",
    .reentrant = 1,
    .init = reentrant_init,
    .owner = dl_owner_thread,
    .attempt = reentrant_attempt,
    .release = reentrant_release,
    .extend = reentrant_extend,
    .check = reentrant_check,
    .renew = &renew_script,
};
