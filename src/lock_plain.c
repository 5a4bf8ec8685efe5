/* The plain lock: one STRING key holding the owner's random token, the
 * layout of redis-py's Lock, redsync and node-redlock. Not reentrant. */
#include <string.h>

#include "internal.h"

/* KEYS: lock, fence counter. ARGV: token, lease ms.
 * -> {1, fence} acquired | {0, pttl} held by another */
static dl_script acquire_script = DL_SCRIPT("plain_acquire",
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
    "return {1, redis.call('incr', KEYS[2])} end "
    "return {0, redis.call('pttl', KEYS[1])}");

/* KEYS: lock, channel. ARGV: token. -> 1 released | 0 not ours */
dl_script dl_script_plain_release = DL_SCRIPT("plain_release",
    "if redis.pcall('get', KEYS[1]) == ARGV[1] then "
    "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '0'); return 1 end "
    "return 0");

/* KEYS: lock. ARGV: token, lease ms. -> 1 extended | 0 not ours */
dl_script dl_script_plain_extend = DL_SCRIPT("plain_extend",
    "if redis.pcall('get', KEYS[1]) == ARGV[1] then "
    "redis.call('pexpire', KEYS[1], ARGV[2]); return 1 end return 0");

/* Watchdog. KEYS: locks. ARGV: lease ms, owner per key. -> {1|0 ...} */
static dl_script renew_script = DL_SCRIPT("plain_renew",
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "if redis.pcall('get', key) == ARGV[i + 1] then "
    "redis.call('pexpire', key, ARGV[1]); res[i] = 1 else res[i] = 0 end end "
    "return res");

static int plain_init(dlock_lock *l, dl_err *err) {
    l->channel = dl_derive_key("redisson_lock__channel:", l->name, l->name_len, "", &l->channel_len);
    return l->channel ? DLOCK_OK : dl_seterr(err, DLOCK_ENOMEM, "out of memory");
}

static int plain_owner(dlock_lock *l, dl_err *err) {
    int rc = dl_random_hex(l->token, DLOCK_TOKEN_LEN / 2, err);
    if (!rc) l->token_len = DLOCK_TOKEN_LEN;
    return rc;
}

static int plain_attempt(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms,
                         dl_try *t, dl_err *err) {
    (void)wait_ms;
    char lease[24];
    size_t ll = dl_fmt_ll(lease, lease_ms);
    return dl_attempt_script(l, conn, &acquire_script, lease_ms, l->token, l->token_len, lease, ll,
                             t, err);
}

static int plain_release(dlock_lock *l, dl_conn *conn, long long *res, dl_err *err) {
    const char *keys[2] = {l->name, l->channel};
    size_t keylens[2] = {l->name_len, l->channel_len};
    const char *args[1] = {l->token};
    size_t arglens[1] = {l->token_len};
    redisReply *r = NULL;
    int rc = dl_eval(conn, dl_cmd_deadline(l->c), &dl_script_plain_release, 2, keys, keylens, 1,
                     args, arglens, &r, err);
    if (!rc) rc = dl_reply_expect_int(r, "release", res, err);
    if (r) freeReplyObject(r);
    if (!rc && *res != 1) *res = -1;
    return rc;
}

static int plain_extend(dlock_lock *l, dl_conn *conn, int64_t lease_ms, long long *res,
                        dl_err *err) {
    char lease[24];
    size_t ll = dl_fmt_ll(lease, lease_ms);
    const char *keys[1] = {l->name};
    size_t keylens[1] = {l->name_len};
    const char *args[2] = {l->token, lease};
    size_t arglens[2] = {l->token_len, ll};
    redisReply *r = NULL;
    int rc = dl_eval(conn, dl_cmd_deadline(l->c), &dl_script_plain_extend, 1, keys, keylens, 2,
                     args, arglens, &r, err);
    if (!rc) rc = dl_reply_expect_int(r, "extend", res, err);
    if (r) freeReplyObject(r);
    return rc;
}

static int plain_check(dlock_lock *l, dl_conn *conn, int *held, int64_t *count, dl_err *err) {
    const char *argv[2] = {"GET", l->name};
    size_t lens[2] = {3, l->name_len};
    redisReply *r = NULL;
    int rc = dl_conn_command(conn, dl_cmd_deadline(l->c), 2, argv, lens, &r, err);
    if (rc) return rc;
    if (r->type == REDIS_REPLY_STRING)
        *held = r->len == l->token_len && !memcmp(r->str, l->token, r->len);
    *count = *held;
    freeReplyObject(r);
    return DLOCK_OK;
}

const dl_kind_ops dl_plain_ops = {
    .kind = DLOCK_KIND_PLAIN,
    .name = "plain",
    .reentrant = 0,
    .init = plain_init,
    .owner = plain_owner,
    .attempt = plain_attempt,
    .release = plain_release,
    .extend = plain_extend,
    .check = plain_check,
    .renew = &renew_script,
};
