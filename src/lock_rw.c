/* The read-write lock: Redisson's RReadWriteLock layout, read side
 * (DLOCK_KIND_READ) and write side (DLOCK_KIND_WRITE).
 *
 * Layout, for a lock called N:
 *   HASH N                 field "mode" = "read" | "write";
 *                          reader fields "<uuid>:<tid>" = hold count;
 *                          writer field "<uuid>:<tid>:write" = hold count.
 *   {N}:<uuid>:<tid>:rwlock_timeout:<k>
 *                          one STRING per read hold (k = 1..count) whose PTTL
 *                          is that hold's lease. N's PTTL is kept at the
 *                          largest of them, so a reader that crashed frees its
 *                          share once its own leases ran out.
 *   redisson_rwlock:{N}    channel: "0" on a read release that frees the lock,
 *                          "1" on a write release.
 *   redisson_lock_token:{N}  fence counter, INCRed on every acquire, both sides.
 *   {N}:write_waiters      dlock's own ZSET (Redisson ignores it) of waiting
 *                          writers -> deadline (server ms).
 *
 * Policy (writer preference): while a writer waits, a thread that holds no
 * read hold yet is refused the read side (re-entry by a current reader and
 * the writer's own downgrade stay allowed, or they could deadlock against the
 * waiting writer). A waiting writer writes itself into {N}:write_waiters with
 * a deadline of now + DL_RW_WAITER_MS on the server's clock at each attempt,
 * and makes the generic wait loop come back within DL_RW_REFRESH_MS so that
 * the entry is refreshed before it expires; it leaves the set when it gets
 * the lock or gives up (ops->abandon). Read attempts first drop expired
 * entries, so a writer that died while waiting blocks new readers for at most
 * DL_RW_WAITER_MS. A stream of readers therefore cannot starve writers;
 * writers may delay readers instead.
 *
 * Downgrade: the thread holding the write side may take the read side; the
 * mode stays "write" while the write hold lasts and becomes "read" when the
 * last write hold is released with read holds left. Never upgrade: a thread
 * holding only the read side that asks for the write side waits like any
 * other writer (try-once: DLOCK_EBUSY). It waits for its own read holds too,
 * so with a wait it gets the write side only once its own read leases ran
 * out (never, with a watchdog lease): don't do that. */
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

/* A waiting writer's entry lasts this long (server clock) unless refreshed. */
#define DL_RW_WAITER_MS 5000
/* ... and it re-attempts (refreshing it) at least this often. */
#define DL_RW_REFRESH_MS 2000


/* The largest PTTL of any reader's timeout keys into the new local var
 * (-2: none): h the hash, bp "{N}" (Lua expressions; inline, as
 * DL_LUA_WAKE_ONE). */
#define LUA_MAXREAD(var, h, bp)                                                          \
    "local " var " = -2 "                                                                \
    "do local f = redis.call('hgetall', " h "); "                                        \
    "for i = 1, #f, 2 do local k = f[i]; "                                               \
    "if k ~= 'mode' and string.sub(k, -6) ~= ':write' then "                             \
    "for j = 1, (tonumber(f[i + 1]) or 0) do "                                           \
    "local p = redis.call('pttl', " bp " .. ':' .. k .. ':rwlock_timeout:' .. j); "      \
    "if p > " var " then " var " = p end end end end end "

/* Server time in ms, into the new local var (inline: see DL_LUA_WAKE_ONE). */
#define LUA_NOW(var)                                                                     \
    "local tm = redis.call('time'); "                                                    \
    "local " var " = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000); "

/* KEYS: lock, fence counter, this reader's timeout prefix
 * "{N}:<owner>:rwlock_timeout", waiting writers. ARGV: lease ms, owner.
 * -> {1, fence, holds} | {0, ms to wait at most} */
dl_script dl_script_read_acquire = DL_SCRIPT("rw_read_acquire",
    LUA_NOW("now")
    "redis.call('zremrangebyscore', KEYS[4], '-inf', now); "
    "local mode = redis.call('hget', KEYS[1], 'mode'); "
    "if mode == 'write' then "
    "  if redis.call('hexists', KEYS[1], ARGV[2] .. ':write') == 0 then "
    "    return {0, redis.call('pttl', KEYS[1])} end "
    "elseif mode == 'read' or redis.call('exists', KEYS[1]) == 0 then "
    "  if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then "
    "    local w = redis.call('zrange', KEYS[4], -1, -1, 'WITHSCORES'); "
    "    if #w > 0 then "
    "      local wait = tonumber(w[2]) - now; "
    "      local p = redis.call('pttl', KEYS[1]); "
    "      if p > 0 and p < wait then wait = p end "
    "      if wait < 1 then wait = 1 end "
    "      return {0, wait} end end "
    "else return {0, redis.call('pttl', KEYS[1])} end "
    "if not mode then redis.call('hset', KEYS[1], 'mode', 'read') end "
    "local n = redis.call('hincrby', KEYS[1], ARGV[2], 1); "
    "redis.call('set', KEYS[3] .. ':' .. n, '1', 'PX', ARGV[1]); "
    "if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then "
    "  redis.call('pexpire', KEYS[1], ARGV[1]) end "
    DL_LUA_FENCE("f", "KEYS[2]")
    "return {1, f, n}");

/* KEYS: lock, fence counter, waiting writers. ARGV: lease ms, owner
 * "<uuid>:<tid>:write", "1" to queue as a waiting writer.
 * -> {1, fence, holds} | {0, ms to wait at most} */
dl_script dl_script_write_acquire = DL_SCRIPT("rw_write_acquire",
    "local mode = redis.call('hget', KEYS[1], 'mode'); "
    "if (not mode and redis.call('exists', KEYS[1]) == 0) or "
    "   (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1) then "
    "  if not mode then redis.call('hset', KEYS[1], 'mode', 'write') end "
    "  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1); "
    "  if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then "
    "    redis.call('pexpire', KEYS[1], ARGV[1]) end "
    "  redis.call('zrem', KEYS[3], ARGV[2]); "
    DL_LUA_FENCE("f", "KEYS[2]")
    "  return {1, f, n} end "
    "local p = redis.call('pttl', KEYS[1]); "
    "if ARGV[3] == '1' then "
    LUA_NOW("now")
    "  redis.call('zadd', KEYS[3], now + " DL_STR(DL_RW_WAITER_MS) ", ARGV[2]); "
    "  redis.call('pexpire', KEYS[3], " DL_STR(DL_RW_WAITER_MS) "); "
    "  if p < 0 or p > " DL_STR(DL_RW_REFRESH_MS) " then p = " DL_STR(DL_RW_REFRESH_MS) " end "
    "end "
    "return {0, p}");

/* A waiting writer gives up. KEYS: waiting writers, lock, channel. ARGV: owner.
 * When it was the last waiting writer, readers it held back are woken. */
dl_script dl_script_write_abandon = DL_SCRIPT("rw_write_abandon",
    LUA_NOW("now")
    "redis.call('zremrangebyscore', KEYS[1], '-inf', now); "
    "if redis.call('zrem', KEYS[1], ARGV[1]) == 1 and redis.call('zcard', KEYS[1]) == 0 and "
    "   redis.pcall('hget', KEYS[2], 'mode') ~= 'write' then "
    "  redis.call('publish', KEYS[3], '1') end "
    "return 1");

/* KEYS: lock, channel, this reader's timeout prefix, "{N}". ARGV: owner, its
 * count expected before this release ('': not known; a count below it: this
 * release was counted already, a copy of its request).
 * -> -1 not held | 0 this owner still holds | 1 this owner's last hold */
dl_script dl_script_read_release = DL_SCRIPT("rw_read_release",
    "local v = redis.pcall('hget', KEYS[1], ARGV[1]); "
    "if type(v) ~= 'string' then return -1 end "
    "if ARGV[2] ~= '' and tonumber(v) < tonumber(ARGV[2]) then return 0 end "
    "local n = redis.call('hincrby', KEYS[1], ARGV[1], -1); "
    /* the owner's leases are a set of keys 1..n+1, not one per handle: the
     * one that goes is the shortest, so every hold left keeps a key at
     * least as long as the lease its handle counts on (the top key moves
     * into its place) */
    "do local top = KEYS[3] .. ':' .. (n + 1); local j, jp = n + 1, nil; "
    "  if n > 0 then for k = 1, n + 1 do "
    "    local p = redis.call('pttl', KEYS[3] .. ':' .. k); "
    "    if not jp or p < jp then j, jp = k, p end end end "
    "  if j ~= n + 1 then local tp = redis.call('pttl', top); "
    "    if tp > 0 then redis.call('set', KEYS[3] .. ':' .. j, '1', 'PX', tp) "
    "    elseif tp == -1 then redis.call('set', KEYS[3] .. ':' .. j, '1') "
    "    else redis.call('del', KEYS[3] .. ':' .. j) end end "
    "  redis.call('del', top) end "
    "local res = 0; "
    "if n <= 0 then redis.call('hdel', KEYS[1], ARGV[1]); res = 1 end "
    "if redis.call('hget', KEYS[1], 'mode') == 'write' then return res end "
    LUA_MAXREAD("m", "KEYS[1]", "KEYS[4]")
    "if m > 0 then redis.call('pexpire', KEYS[1], m); return res end "
    "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '0'); "
    "return res");

/* KEYS: lock, channel, "{N}". ARGV: owner "<uuid>:<tid>:write", lease ms, its
 * count expected before this release ('': not known; below it: counted
 * already, a copy of this release's request).
 * -> -1 not held | 0 still held | 1 released */
dl_script dl_script_write_release = DL_SCRIPT("rw_write_release",
    "local v = redis.pcall('hget', KEYS[1], ARGV[1]); "
    "if type(v) ~= 'string' or redis.call('hget', KEYS[1], 'mode') ~= 'write' then "
    "  return -1 end "
    "if ARGV[3] ~= '' and tonumber(v) < tonumber(ARGV[3]) then return 0 end "
    "local n = redis.call('hincrby', KEYS[1], ARGV[1], -1); "
    "if n > 0 then "
    LUA_MAXREAD("m", "KEYS[1]", "KEYS[3]")
    DL_LUA_RAISE_TTL("KEYS[1]", "math.max(tonumber(ARGV[2]), m)")
    "  return 0 end "
    "redis.call('hdel', KEYS[1], ARGV[1]); "
    "if redis.call('hlen', KEYS[1]) > 1 then "
    "  redis.call('hset', KEYS[1], 'mode', 'read'); "
    LUA_MAXREAD("m", "KEYS[1]", "KEYS[3]")
    "  if m > 0 then redis.call('pexpire', KEYS[1], m) else redis.call('del', KEYS[1]) end "
    "else redis.call('del', KEYS[1]) end "
    "redis.call('publish', KEYS[2], '1'); "
    "return 1");

/* KEYS: lock, this reader's timeout prefix, "{N}". ARGV: owner, lease ms.
 * -> 1 extended | 0 not ours */
dl_script dl_script_read_extend = DL_SCRIPT("rw_read_extend",
    "local v = redis.pcall('hget', KEYS[1], ARGV[1]); "
    "if type(v) ~= 'string' then return 0 end "
    "for k = 1, tonumber(v) do local t = KEYS[2] .. ':' .. k; "
    "  if redis.call('pttl', t) < tonumber(ARGV[2]) then "
    "    redis.call('set', t, '1', 'PX', ARGV[2]) end end "
    "if redis.call('hget', KEYS[1], 'mode') == 'write' then "
    DL_LUA_RAISE_TTL("KEYS[1]", "ARGV[2]")
    "else " LUA_MAXREAD("m", "KEYS[1]", "KEYS[3]") DL_LUA_RAISE_TTL("KEYS[1]", "m") "end "
    "return 1");

/* KEYS: lock, "{N}". ARGV: owner "<uuid>:<tid>:write", lease ms.
 * -> 1 extended | 0 not ours */
dl_script dl_script_write_extend = DL_SCRIPT("rw_write_extend",
    "if redis.pcall('hget', KEYS[1], 'mode') ~= 'write' or "
    "   redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end "
    LUA_MAXREAD("m", "KEYS[1]", "KEYS[2]")
    DL_LUA_RAISE_TTL("KEYS[1]", "math.max(tonumber(ARGV[2]), m)")
    "return 1");

/* Watchdog, read side. KEYS: locks. ARGV: lease ms, owner per key. Refreshes
 * this reader's timeout keys and raises the hash's PTTL to the lease. */
static dl_script read_renew_script = DL_SCRIPT("rw_read_renew",
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "  local v = redis.pcall('hget', key, ARGV[i + 1]); "
    "  if type(v) == 'string' then "
    "    local bp = key; "
    "    if not string.find(key, '{', 1, true) then bp = '{' .. key .. '}' end "
    "    for k = 1, tonumber(v) do "
    "      local t = bp .. ':' .. ARGV[i + 1] .. ':rwlock_timeout:' .. k; "
    "      if redis.call('pttl', t) < tonumber(ARGV[1]) then "
    "        redis.call('set', t, '1', 'PX', ARGV[1]) end end "
    "    if redis.call('pttl', key) < tonumber(ARGV[1]) then "
    "      redis.call('pexpire', key, ARGV[1]) end "
    "    res[i] = 1 "
    "  else res[i] = 0 end end "
    "return res");

/* Watchdog, write side. KEYS: locks. ARGV: lease ms, owner per key. */
static dl_script write_renew_script = DL_SCRIPT("rw_write_renew",
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "  if redis.pcall('hget', key, 'mode') == 'write' and "
    "     redis.call('hexists', key, ARGV[i + 1]) == 1 then "
    "    if redis.call('pttl', key) < tonumber(ARGV[1]) then "
    "      redis.call('pexpire', key, ARGV[1]) end "
    "    res[i] = 1 "
    "  else res[i] = 0 end end "
    "return res");

/* The kind's own keys (l->kind_state). */
typedef struct rw_keys {
    char *brace;          /* "{N}" (N itself when it has a '{') */
    size_t brace_len;
    char *waiters;        /* "{N}:write_waiters" */
    size_t waiters_len;
    char *prefix;         /* the read side's "{N}:<uuid>:<tid>:rwlock_timeout" of
                           * the current owner (read_call; room for any owner) */
    size_t prefix_len;
    int queue;            /* the write side: the attempt under way waits */
} rw_keys;

static void rw_destroy(dlock_lock *l) {
    rw_keys *k = l->kind_state;
    if (!k) return;
    free(k->brace);
    free(k->waiters);
    free(k->prefix);
    free(k);
    l->kind_state = NULL;
}

static const char timeout_suffix[] = ":rwlock_timeout";

static int rw_init(dlock_lock *l, dl_err *err) {
    rw_keys *k = calloc(1, sizeof *k);
    if (!k) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    l->kind_state = k;
    k->brace = dl_derive_key("", l->h.name, l->h.name_len, "", &k->brace_len);
    k->waiters = dl_derive_key("", l->h.name, l->h.name_len, ":write_waiters", &k->waiters_len);
    l->h.channel =
        dl_derive_key("redisson_rwlock:", l->h.name, l->h.name_len, "", &l->h.channel_len);
    if (k->brace) k->prefix = malloc(k->brace_len + 1 + sizeof l->token + sizeof timeout_suffix);
    if (!k->brace || !k->waiters || !l->h.channel || !k->prefix)
        return dl_seterr(err, DLOCK_ENOMEM, "out of memory"); /* lock.c frees */
    return DLOCK_OK;
}

/* The reader identity of this handle's owner: the token without ":write". */
static size_t reader_len(const dlock_lock *l) {
    if (l->kind == DLOCK_KIND_WRITE && l->token_len >= 6) return l->token_len - 6;
    return l->token_len;
}

/* k->prefix for the current owner: "{N}" ":" <uuid>:<tid> ":rwlock_timeout". */
static void build_prefix(const dlock_lock *l, rw_keys *k) {
    size_t rl = reader_len(l), n = k->brace_len;
    memcpy(k->prefix, k->brace, n);
    k->prefix[n++] = ':';
    memcpy(k->prefix + n, l->token, rl);
    n += rl;
    memcpy(k->prefix + n, timeout_suffix, sizeof timeout_suffix);
    k->prefix_len = n + sizeof timeout_suffix - 1;
}

static int write_owner(dlock_lock *l, dl_err *err) {
    int rc = dl_owner_thread(l, err);
    if (rc) return rc;
    if (l->token_len + 7 > sizeof l->token)
        return dl_seterr(err, DLOCK_EINVAL, "owner identity too long");
    memcpy(l->token + l->token_len, ":write", 7);
    l->token_len += 6;
    return DLOCK_OK;
}

/* The read side's calls. */
static void read_call(dlock_lock *l, int op, int64_t lease_ms, dl_call *call) {
    rw_keys *k = l->kind_state;
    dl_call_start(call);
    size_t ll = dl_fmt_ll(call->num, lease_ms);
    build_prefix(l, k);
    call->keys[0] = l->h.name, call->keylens[0] = l->h.name_len;
    call->nargs = 2;
    switch (op) {
    case DL_OP_ACQUIRE: /* KEYS lock, fence, timeout prefix, waiters; ARGV lease, owner */
        call->script = &dl_script_read_acquire;
        call->keys[1] = l->fence_key, call->keylens[1] = l->fence_key_len;
        call->keys[2] = k->prefix, call->keylens[2] = k->prefix_len;
        call->keys[3] = k->waiters, call->keylens[3] = k->waiters_len;
        call->nkeys = 4;
        call->args[0] = call->num, call->arglens[0] = ll;
        call->args[1] = l->token, call->arglens[1] = l->token_len;
        break;
    case DL_OP_RELEASE: /* KEYS lock, channel, timeout prefix, "{N}"; ARGV owner, expected count */
        call->script = &dl_script_read_release;
        call->keys[1] = l->h.channel, call->keylens[1] = l->h.channel_len;
        call->keys[2] = k->prefix, call->keylens[2] = k->prefix_len;
        call->keys[3] = k->brace, call->keylens[3] = k->brace_len;
        call->nkeys = 4;
        call->args[0] = l->token, call->arglens[0] = l->token_len;
        call->args[1] = call->expect, call->arglens[1] = dl_owner_expect(l, call->expect);
        break;
    default: /* extend: KEYS lock, timeout prefix, "{N}"; ARGV owner, lease */
        call->script = &dl_script_read_extend;
        call->keys[1] = k->prefix, call->keylens[1] = k->prefix_len;
        call->keys[2] = k->brace, call->keylens[2] = k->brace_len;
        call->nkeys = 3;
        call->args[0] = l->token, call->arglens[0] = l->token_len;
        call->args[1] = call->num, call->arglens[1] = ll;
        break;
    }
}

/* The write side's calls. */
static void write_call(dlock_lock *l, int op, int64_t lease_ms, dl_call *call) {
    rw_keys *k = l->kind_state;
    dl_call_start(call);
    size_t ll = dl_fmt_ll(call->num, lease_ms);
    call->keys[0] = l->h.name, call->keylens[0] = l->h.name_len;
    switch (op) {
    case DL_OP_ACQUIRE: /* KEYS lock, fence, waiters; ARGV lease, owner, queue */
        call->script = &dl_script_write_acquire;
        call->keys[1] = l->fence_key, call->keylens[1] = l->fence_key_len;
        call->keys[2] = k->waiters, call->keylens[2] = k->waiters_len;
        call->nkeys = 3;
        call->args[0] = call->num, call->arglens[0] = ll;
        call->args[1] = l->token, call->arglens[1] = l->token_len;
        call->args[2] = k->queue ? "1" : "0", call->arglens[2] = 1;
        call->nargs = 3;
        break;
    case DL_OP_RELEASE: /* KEYS lock, channel, "{N}"; ARGV owner, lease, expected count */
        call->script = &dl_script_write_release;
        call->keys[1] = l->h.channel, call->keylens[1] = l->h.channel_len;
        call->keys[2] = k->brace, call->keylens[2] = k->brace_len;
        call->nkeys = 3;
        call->args[0] = l->token, call->arglens[0] = l->token_len;
        call->args[1] = call->num, call->arglens[1] = ll;
        call->args[2] = call->expect, call->arglens[2] = dl_owner_expect(l, call->expect);
        call->nargs = 3;
        break;
    default: /* extend: KEYS lock, "{N}"; ARGV owner, lease */
        call->script = &dl_script_write_extend;
        call->keys[1] = k->brace, call->keylens[1] = k->brace_len;
        call->nkeys = 2;
        call->args[0] = l->token, call->arglens[0] = l->token_len;
        call->args[1] = call->num, call->arglens[1] = ll;
        call->nargs = 2;
        break;
    }
}

/* A writer's attempt: a waiting one (wait_ms != 0) enters {N}:write_waiters;
 * try-once never does (nothing would take it out again). */
static int write_attempt(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms,
                         dl_outcome *t, dl_err *err) {
    rw_keys *k = l->kind_state;
    k->queue = wait_ms != 0;
    int rc = dl_call_attempt(l, conn, lease_ms, wait_ms, t, err);
    k->queue = 0;
    return rc;
}

static void write_abandon(dlock_lock *l, dl_conn *conn) {
    rw_keys *k = l->kind_state;
    const char *keys[3] = {k->waiters, l->h.name, l->h.channel};
    size_t keylens[3] = {k->waiters_len, l->h.name_len, l->h.channel_len};
    const char *args[1] = {l->token};
    size_t arglens[1] = {l->token_len};
    redisReply *r = NULL;
    dl_err ignored = {0};
    if (dl_eval(conn, dl_cmd_deadline(l->h.c), &dl_script_write_abandon, 3, keys, keylens, 1, args,
                arglens, &r, &ignored) == DLOCK_OK)
        freeReplyObject(r);
}

/* Both sides: the owner's field in the hash is its hold count. */
static int rw_check(dlock_lock *l, dl_conn *conn, int *held, int64_t *count, dl_err *err) {
    const char *argv[3] = {"HGET", l->h.name, l->token};
    size_t lens[3] = {4, l->h.name_len, l->token_len};
    redisReply *r = NULL;
    int rc = dl_conn_command(conn, dl_cmd_deadline(l->h.c), 3, argv, lens, &r, err);
    if (rc) return rc;
    long long n = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = dl_reply_error(r, "check", err);
    } else if (r->type == REDIS_REPLY_STRING && !dl_reply_int(r, &n)) {
        *held = n > 0;
        *count = n;
    }
    freeReplyObject(r);
    return rc;
}

const dl_kind_ops dl_read_ops = {
    .kind = DLOCK_KIND_READ,
    .name = "read",
    .reentrant = 1,
    .init = rw_init,
    .destroy = rw_destroy,
    .owner = dl_owner_thread,
    .attempt = dl_call_attempt,
    .release = dl_call_release,
    .extend = dl_call_extend,
    .check = rw_check,
    .renew = &read_renew_script,
    .call = read_call,
    /* a writer that gives up leaves {N}:write_waiters by an abandon, which
     * the RedLock fan-out does not send: on a majority of masters its entry
     * would keep new readers out for DL_RW_WAITER_MS on each */
    .one_server = 1,
};

const dl_kind_ops dl_write_ops = {
    .kind = DLOCK_KIND_WRITE,
    .name = "write",
    .reentrant = 1,
    .init = rw_init,
    .destroy = rw_destroy,
    .owner = write_owner,
    .attempt = write_attempt,
    .abandon = write_abandon,
    .release = dl_call_release,
    .extend = dl_call_extend,
    .check = rw_check,
    .renew = &write_renew_script,
    .call = write_call,
    .one_server = 1, /* as the read side's */
};
