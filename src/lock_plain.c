/* The plain lock: one STRING key holding the owner's random token, the
 * layout of redis-py's Lock, redsync and node-redlock. Not reentrant.
 *
 * Waiting wakes one waiter per release, not all of them:
 *
 *   ZSET    dlock_waiters:{name}                   waiting token -> 1 + the highest
 *                                                  score when it registered (FIFO)
 *   channel redisson_lock__channel:{name}:<token>  one per waiter
 *
 * A waiter subscribes to its own channel, then registers with each attempt
 * that fails (ZADD NX: it keeps its place). A release pops registered waiters
 * until one is subscribed to its channel (PUBSUB NUMSUB: DL_LUA_WAKE_ONE) and
 * tells it, so one live waiter tries again; a waiter that died is dropped on
 * the way. An attempt that wins removes its own entry whenever this call
 * registered it, so the registry never names a holder. A woken
 * waiter that loses the race (a newcomer took the lock first) registers
 * again, at the back. One that gives up after being woken passes the wake on
 * (abandon). A waiter that was woken and hung, or whose host died with its
 * connection open, swallows one wake: every registered waiter therefore
 * tries again at least every DL_PLAIN_RECHECK_MS, which also bounds the wait
 * after a release by a client that publishes nothing (redis-py, redsync).
 * The registry expires DL_PLAIN_REGISTRY_TTL_MS after the last attempt of
 * any waiter, so the waiters of a lock nobody releases leave nothing behind.
 * Telling every waiter instead (Redisson's single channel) would cost each
 * acquisition one acquire script per waiter (docs/benchmarks.md). */
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

#define DL_PLAIN_RECHECK_MS DL_WAIT_RECHECK_MS
#define DL_PLAIN_REGISTRY_TTL_MS (3 * DL_PLAIN_RECHECK_MS)

/* KEYS: lock, fence counter, waiters[, holder record]. ARGV: token, lease
 * ms, recheck ms ('0': not waiting: try once, or a RedLock node), '1' when
 * an attempt of this call registered it (it may still be registered: a win
 * removes it)[, the holder record (holder.c), written when acquired].
 * -> {1, fence} acquired | {0, ms to wait at most (pttl, capped when waiting)} */
dl_script dl_script_plain_acquire = DL_SCRIPT("plain_acquire",
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
    "if ARGV[4] == '1' then redis.call('zrem', KEYS[3], ARGV[1]) end "
    "if KEYS[4] then redis.call('set', KEYS[4], ARGV[5], 'PX', ARGV[2]) end "
    DL_LUA_FENCE("f", "KEYS[2]")
    "return {1, f} end "
    "local p = redis.call('pttl', KEYS[1]) "
    "if ARGV[3] ~= '0' then "
    "local last = redis.call('zrange', KEYS[3], -1, -1, 'WITHSCORES') "
    "redis.call('zadd', KEYS[3], 'NX', (tonumber(last[2]) or 0) + 1, ARGV[1]) "
    "redis.call('pexpire', KEYS[3], 3 * tonumber(ARGV[3])) "
    "if p > tonumber(ARGV[3]) then p = tonumber(ARGV[3]) end end "
    "return {0, p}");

/* KEYS: lock, waiters[, this token's holder record, deleted: the hold is
 * over either way]. ARGV: token, waiter channel prefix.
 * -> 1 released (one waiter told) | 0 not ours */
dl_script dl_script_plain_release = DL_SCRIPT("plain_release",
    "if redis.pcall('get', KEYS[1]) == ARGV[1] then "
    "if KEYS[3] then redis.call('del', KEYS[1], KEYS[3]) else redis.call('del', KEYS[1]) end "
    DL_LUA_WAKE_ONE("KEYS[2]", "ARGV[2]") "return 1 end "
    "if KEYS[3] then redis.call('del', KEYS[3]) end "
    "return 0");

/* A waiter gives up. KEYS: lock, waiters. ARGV: token, channel prefix.
 * Not registered any more while the lock is free: it was woken and must pass
 * the wake on. -> 1 passed on | 0 */
dl_script dl_script_plain_abandon = DL_SCRIPT("plain_abandon",
    "if redis.call('zrem', KEYS[2], ARGV[1]) == 0 and redis.call('exists', KEYS[1]) == 0 then "
    DL_LUA_WAKE_ONE("KEYS[2]", "ARGV[2]") "return 1 end return 0");

/* KEYS: lock[, holder record]. ARGV: token, lease ms.
 * -> 1 extended | 0 not ours */
dl_script dl_script_plain_extend = DL_SCRIPT("plain_extend",
    "if redis.pcall('get', KEYS[1]) == ARGV[1] then "
    "redis.call('pexpire', KEYS[1], ARGV[2]) "
    "if KEYS[2] then redis.call('pexpire', KEYS[2], ARGV[2]) end return 1 end return 0");

/* Watchdog. KEYS: locks. ARGV: lease ms, owner per key. -> {1|0 ...} */
static dl_script renew_script = DL_SCRIPT("plain_renew",
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "if redis.pcall('get', key) == ARGV[i + 1] then "
    "redis.call('pexpire', key, ARGV[1]); res[i] = 1 else res[i] = 0 end end "
    "return res");

typedef struct plain_data {
    char *waiters;     /* dlock_waiters:{name} */
    size_t waiters_len;
    char *prefix;      /* redisson_lock__channel:{name}: */
    size_t prefix_len;
    int waiting;       /* the current attempt registers (the caller waits) */
    int registered;    /* an attempt of this call registered it: it may still
                        * be registered (a wake pops it, but a later attempt
                        * that lost may have registered it again before the
                        * wake was read) */
} plain_data;

static void plain_destroy(dlock_lock *l) {
    plain_data *d = l->kind_state;
    if (!d) return;
    free(d->waiters);
    free(d->prefix);
    free(d);
    l->kind_state = NULL;
}

static int plain_init(dlock_lock *l, dl_err *err) {
    plain_data *d = calloc(1, sizeof *d);
    if (!d) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    l->kind_state = d;
    d->waiters =
        dl_derive_key(DL_PLAIN_WAITERS_PREFIX, l->h.name, l->h.name_len, "", &d->waiters_len);
    d->prefix =
        dl_derive_key("redisson_lock__channel:", l->h.name, l->h.name_len, ":", &d->prefix_len);
    /* until a hold has a token: the waiter channel is set by plain_owner */
    l->h.channel =
        dl_derive_key("redisson_lock__channel:", l->h.name, l->h.name_len, "", &l->h.channel_len);
    if (!d->waiters || !d->prefix || !l->h.channel)
        return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

/* A new random token, and the waiter channel named after it. */
static int plain_owner(dlock_lock *l, dl_err *err) {
    plain_data *d = l->kind_state;
    int rc = dl_random_hex(l->token, DLOCK_TOKEN_LEN / 2, err);
    if (rc) return rc;
    l->token_len = DLOCK_TOKEN_LEN;
    d->registered = 0; /* a new call, a new token: registered nowhere */
    char *ch = malloc(d->prefix_len + l->token_len + 1);
    if (!ch) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    memcpy(ch, d->prefix, d->prefix_len);
    memcpy(ch + d->prefix_len, l->token, l->token_len);
    ch[d->prefix_len + l->token_len] = '\0';
    free(l->h.channel);
    l->h.channel = ch;
    l->h.channel_len = d->prefix_len + l->token_len;
    return DLOCK_OK;
}

static void plain_call(dlock_lock *l, int op, int64_t lease_ms, dl_call *call) {
    plain_data *d = l->kind_state;
    dl_call_start(call);
    size_t ll = dl_fmt_ll(call->num, lease_ms);
    call->keys[0] = l->h.name, call->keylens[0] = l->h.name_len;
    call->args[0] = l->token, call->arglens[0] = l->token_len;
    call->nkeys = 1;
    call->nargs = 2;
    call->args[1] = call->num, call->arglens[1] = ll;
    switch (op) {
    case DL_OP_ACQUIRE: /* KEYS lock, fence, waiters; ARGV token, lease, recheck */
        call->script = &dl_script_plain_acquire;
        call->keys[1] = l->fence_key, call->keylens[1] = l->fence_key_len;
        call->keys[2] = d->waiters, call->keylens[2] = d->waiters_len;
        call->nkeys = 3;
        call->args[2] = d->waiting ? DL_STR(DL_PLAIN_RECHECK_MS) : "0";
        call->arglens[2] = strlen(call->args[2]);
        /* not only while waiting: the attempt at the wait's deadline is a
         * try-once (it does not register), and one that wins must leave no
         * entry behind, or the next release would wake the new holder
         * itself instead of a waiter */
        call->args[3] = d->registered ? "1" : "0";
        call->arglens[3] = 1;
        call->nargs = 4;
        if (!dl_who_inline(l, &call->keys[3], &call->keylens[3], &call->args[4],
                           &call->arglens[4])) {
            call->nkeys = 4;
            call->nargs = 5;
        }
        break;
    case DL_OP_RELEASE: /* KEYS lock, waiters; ARGV token, channel prefix */
        call->script = &dl_script_plain_release;
        call->keys[1] = d->waiters, call->keylens[1] = d->waiters_len;
        call->nkeys = 2;
        call->args[1] = d->prefix, call->arglens[1] = d->prefix_len;
        call->binary_release = 1;
        if (!dl_who_inline(l, &call->keys[2], &call->keylens[2], NULL, NULL)) call->nkeys = 3;
        break;
    default: /* extend: KEYS lock; ARGV token, lease */
        call->script = &dl_script_plain_extend;
        if (!dl_who_inline(l, &call->keys[1], &call->keylens[1], NULL, NULL)) call->nkeys = 2;
        break;
    }
}

/* One attempt: a waiting caller (wait_ms != 0) registers as a waiter. */
static int plain_attempt(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms,
                         dl_outcome *t, dl_err *err) {
    plain_data *d = l->kind_state;
    d->waiting = wait_ms != 0;
    int rc = dl_call_attempt(l, conn, lease_ms, wait_ms, t, err);
    /* a failed waiting attempt registered it (and one that failed in transit
     * may have); one that succeeded removed it */
    if (!rc && t->acquired) d->registered = 0;
    else if (d->waiting) d->registered = 1;
    d->waiting = 0;
    return rc;
}

/* A wake-up: the release that sent it popped this waiter from the registry
 * (an attempt since may have registered it again: d->registered stays). */
static int plain_message(dlock_lock *l, const redisReply *msg, dl_outcome *t) {
    (void)l, (void)msg, (void)t;
    return 0;
}

static void plain_abandon(dlock_lock *l, dl_conn *conn) {
    plain_data *d = l->kind_state;
    const char *keys[2] = {l->h.name, d->waiters};
    size_t keylens[2] = {l->h.name_len, d->waiters_len};
    const char *args[2] = {l->token, d->prefix};
    size_t arglens[2] = {l->token_len, d->prefix_len};
    redisReply *r = NULL;
    dl_err ignored = {0};
    dl_eval(conn, dl_cmd_deadline(l->h.c), &dl_script_plain_abandon, 2, keys, keylens, 2, args,
            arglens, &r, &ignored);
    if (r) freeReplyObject(r);
}

static int plain_check(dlock_lock *l, dl_conn *conn, int *held, int64_t *count, dl_err *err) {
    const char *argv[2] = {"GET", l->h.name};
    size_t lens[2] = {3, l->h.name_len};
    redisReply *r = NULL;
    int rc = dl_conn_command(conn, dl_cmd_deadline(l->h.c), 2, argv, lens, &r, err);
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
    .own_channel = 1,
    .init = plain_init,
    .destroy = plain_destroy,
    .owner = plain_owner,
    .attempt = plain_attempt,
    .message = plain_message,
    .abandon = plain_abandon,
    .release = dl_call_release,
    .extend = dl_call_extend,
    .check = plain_check,
    .renew = &renew_script,
    .call = plain_call,
    .who_inline = 1,
    .unique_owner = 1,
};
