/* The reentrant lock: Redisson's RLock layout. A HASH at the lock's name,
 * field "<client uuid>:<thread id>" holding the hold count; the unlock
 * message "0" on redisson_lock__channel:{name}. */
#include <string.h>

#include "kinds.h"

/* KEYS: lock, fence counter. ARGV: lease ms, owner field.
 * -> {1, fence, holds} acquired or re-entered | {0, pttl} */
dl_script dl_script_reentrant_acquire = DL_SCRIPT("reentrant_acquire",
    "if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then "
    "local n = redis.call('hincrby', KEYS[1], ARGV[2], 1); "
    "if n == 1 then redis.call('pexpire', KEYS[1], ARGV[1]) else "
    DL_LUA_RAISE_TTL("KEYS[1]", "ARGV[1]") "end "
    DL_LUA_FENCE("f", "KEYS[2]")
    "return {1, f, n} end "
    "return {0, redis.call('pttl', KEYS[1])}");

/* KEYS: lock, channel. ARGV: lease ms, owner field, the owner's count
 * expected before this release ('' or missing: not known; a count below it
 * means this release was counted already: a copy of its request).
 * -> -1 not held | 0 still held (count > 0) | 1 released */
dl_script dl_script_reentrant_release = DL_SCRIPT("reentrant_release",
    "local v = redis.pcall('hget', KEYS[1], ARGV[2]) "
    "if type(v) ~= 'string' then return -1 end "
    "if ARGV[3] and ARGV[3] ~= '' and tonumber(v) < tonumber(ARGV[3]) then return 0 end "
    "local n = redis.call('hincrby', KEYS[1], ARGV[2], -1); "
    "if n > 0 then " DL_LUA_RAISE_TTL("KEYS[1]", "ARGV[1]") "return 0 end "
    "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '0'); return 1");

/* KEYS: lock. ARGV: owner field, lease ms. -> 1 extended | 0 not ours */
dl_script dl_script_reentrant_extend = DL_SCRIPT("reentrant_extend",
    "if redis.pcall('hexists', KEYS[1], ARGV[1]) == 1 then "
    DL_LUA_RAISE_TTL("KEYS[1]", "ARGV[2]") "return 1 end return 0");

/* Watchdog. KEYS: locks. ARGV: lease ms, owner field per key. */
static dl_script renew_script = DL_SCRIPT("reentrant_renew",
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "if redis.pcall('hexists', key, ARGV[i + 1]) == 1 then "
    DL_LUA_RAISE_TTL("key", "ARGV[1]") "res[i] = 1 else res[i] = 0 end end "
    "return res");

static int reentrant_init(dlock_lock *l, dl_err *err) {
    l->h.channel =
        dl_derive_key("redisson_lock__channel:", l->h.name, l->h.name_len, "", &l->h.channel_len);
    return l->h.channel ? DLOCK_OK : dl_seterr(err, DLOCK_ENOMEM, "out of memory");
}

static void reentrant_call(dlock_lock *l, int op, int64_t lease_ms, dl_call *call) {
    dl_call_start(call);
    size_t ll = dl_fmt_ll(call->num, lease_ms);
    call->keys[0] = l->h.name, call->keylens[0] = l->h.name_len;
    call->nkeys = 2;
    call->nargs = 2;
    switch (op) {
    case DL_OP_ACQUIRE: /* KEYS lock, fence; ARGV lease, owner */
        call->script = &dl_script_reentrant_acquire;
        call->keys[1] = l->fence_key, call->keylens[1] = l->fence_key_len;
        call->args[0] = call->num, call->arglens[0] = ll;
        call->args[1] = l->token, call->arglens[1] = l->token_len;
        break;
    case DL_OP_RELEASE: /* KEYS lock, channel; ARGV lease, owner, expected count */
        call->script = &dl_script_reentrant_release;
        call->keys[1] = l->h.channel, call->keylens[1] = l->h.channel_len;
        call->args[0] = call->num, call->arglens[0] = ll;
        call->args[1] = l->token, call->arglens[1] = l->token_len;
        call->args[2] = call->expect, call->arglens[2] = dl_owner_expect(l, call->expect);
        call->nargs = 3;
        break;
    default: /* extend: KEYS lock; ARGV owner, lease */
        call->script = &dl_script_reentrant_extend;
        call->nkeys = 1;
        call->args[0] = l->token, call->arglens[0] = l->token_len;
        call->args[1] = call->num, call->arglens[1] = ll;
        break;
    }
}

static int reentrant_check(dlock_lock *l, dl_conn *conn, int *held, int64_t *count, dl_err *err) {
    const char *argv[3] = {"HGET", l->h.name, l->token};
    size_t lens[3] = {4, l->h.name_len, l->token_len};
    redisReply *r = NULL;
    int rc = dl_conn_command(conn, dl_cmd_deadline(l->h.c), 3, argv, lens, &r, err);
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
    .attempt = dl_call_attempt,
    .release = dl_call_release,
    .extend = dl_call_extend,
    .check = reentrant_check,
    .renew = &renew_script,
    .call = reentrant_call,
};
