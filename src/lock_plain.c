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

static void plain_call(dlock_lock *l, int op, int64_t lease_ms, dl_call *call) {
    memset(call, 0, sizeof *call);
    size_t ll = dl_fmt_ll(call->num, lease_ms);
    call->keys[0] = l->name, call->keylens[0] = l->name_len;
    call->args[0] = l->token, call->arglens[0] = l->token_len;
    call->nkeys = 1;
    call->nargs = 2;
    call->args[1] = call->num, call->arglens[1] = ll;
    switch (op) {
    case DL_OP_ACQUIRE: /* KEYS lock, fence; ARGV token, lease */
        call->script = &acquire_script;
        call->keys[1] = l->fence_key, call->keylens[1] = l->fence_key_len;
        call->nkeys = 2;
        break;
    case DL_OP_RELEASE: /* KEYS lock, channel; ARGV token */
        call->script = &dl_script_plain_release;
        call->keys[1] = l->channel, call->keylens[1] = l->channel_len;
        call->nkeys = 2;
        call->nargs = 1;
        call->binary_release = 1;
        break;
    default: /* extend: KEYS lock; ARGV token, lease */
        call->script = &dl_script_plain_extend;
        break;
    }
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
    .attempt = dl_call_attempt,
    .release = dl_call_release,
    .extend = dl_call_extend,
    .check = plain_check,
    .renew = &renew_script,
    .call = plain_call,
};
