/* The permit-expirable semaphore on Redis (permits.c has the handle): the
 * calls of the backend table (dl_backend.permits_*) in Redisson's
 * RPermitExpirableSemaphore layout. STRING `name` holds the available
 * permits, ZSET "{name}:timeout" maps each permit out on lease (its 16 raw
 * bytes, as Redisson stores them) to its expiry in ms. Every script first
 * returns the expired permits to the pool (ZREMRANGEBYSCORE up to now,
 * INCRBY that many), so a holder that died loses its permits after their
 * lease instead of leaking them; when that frees permits, the new count is
 * published on "redisson_sc:{name}" like a release, so waiters of any
 * client retry.
 *
 * CLOCK: expiries are on the Redis server's clock (TIME, read inside each
 * script), so every client compares them against the same clock and client
 * clock skew cannot shorten or stretch a lease. (Redisson writes expiries
 * from its own client clock; a mixed deployment is only as exact as the
 * clocks agree.) Local waiting still uses the monotonic clock: a waiter is
 * told how many ms remain until the earliest expiry and sleeps that long. */
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

/* ---- scripts: KEYS[1] = name, KEYS[2] = {name}:timeout, KEYS[3] = channel ---- */

/* now: server time in ms (TIME, rounded down). reclaim(): returns expired
 * permits to the pool and answers how many: those whose expiry is below
 * now, not at it, as Redis expires a key (`now > when`): an expiry is now +
 * lease with now rounded down, so a permit taken at 100.7 ms with a lease
 * of L expires at 100 + L; reclaimed at now = 100 + L it would go up to
 * 1 ms before the holder's lease, counted from just before its request,
 * has run out (a holder that sent at 100.2 counts on 100.2 + L); kept
 * through that millisecond it goes at 101 + L at the earliest.
 * wake(back): publishes the count if permits came back and
 * some are available. value(): the available permits. */
#define PERMITS_PRELUDE                                                                       \
    "local t = redis.call('time') "                                                           \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "                  \
    "local function ms(x) return string.format('%.0f', x) end "                               \
    "local function value() "                                                                 \
    "local v = redis.call('get', KEYS[1]) "                                                   \
    "if not v then return 0 end "                                                             \
    "local n = tonumber(v) "                                                                  \
    "if not n then error('semaphore value is not an integer') end "                           \
    "return n end "                                                                           \
    "local function reclaim() "                                                               \
    "value() "                                                                                \
    "local n = redis.call('zremrangebyscore', KEYS[2], '-inf', '(' .. ms(now)) "              \
    "if n > 0 then redis.call('incrby', KEYS[1], n) end "                                     \
    "return n end "                                                                           \
    "local function wake(back) "                                                              \
    "if back > 0 then local v = value() "                                                     \
    "if v > 0 then redis.call('publish', KEYS[3], v) end end end "

/* ARGV: id, lease ms. -> {1, 0} taken | {0, ms until the earliest lease
 * expires, or -1 when none is out} */
dl_script dl_script_permits_acquire = DL_SCRIPT("permits_acquire",
    PERMITS_PRELUDE
    "local back = reclaim() "
    "if value() >= 1 then "
    "redis.call('decrby', KEYS[1], 1) "
    "redis.call('zadd', KEYS[2], ms(now + tonumber(ARGV[2])), ARGV[1]) "
    "wake(back) "
    "return {1, 0} end "
    "wake(back) "
    "local first = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES') "
    "if first[2] then "
    "local left = tonumber(first[2]) - now + 1 "
    "if left < 0 then left = 0 end "
    "return {0, left} end "
    "return {0, -1}");

/* ARGV: id. -> 1 released | 0 not out on lease (expired, or never issued) */
dl_script dl_script_permits_release = DL_SCRIPT("permits_release",
    PERMITS_PRELUDE
    "local back = reclaim() "
    "if redis.call('zrem', KEYS[2], ARGV[1]) == 1 then "
    "local v = redis.call('incrby', KEYS[1], 1) "
    "redis.call('publish', KEYS[3], v) "
    "return 1 end "
    "wake(back) "
    "return 0");

/* ARGV: id, lease ms. -> 1 renewed | 0 gone */
dl_script dl_script_permits_renew = DL_SCRIPT("permits_renew",
    PERMITS_PRELUDE
    "wake(reclaim()) "
    "local s = redis.call('zscore', KEYS[2], ARGV[1]) "
    "if s then "
    "if tonumber(s) < now + tonumber(ARGV[2]) then "
    "redis.call('zadd', KEYS[2], 'XX', ms(now + tonumber(ARGV[2])), ARGV[1]) end "
    "return 1 end "
    "return 0");

/* -> the available permits */
dl_script dl_script_permits_available = DL_SCRIPT("permits_available",
    PERMITS_PRELUDE
    "wake(reclaim()) "
    "return value()");

/* ARGV: permits. -> 1 set | 0 exists already */
dl_script dl_script_permits_try_set = DL_SCRIPT("permits_try_set",
    "if redis.call('set', KEYS[1], ARGV[1], 'NX') then "
    "redis.call('publish', KEYS[3], ARGV[1]) return 1 end "
    "return 0");

/* ARGV: delta. -> the new count */
dl_script dl_script_permits_add = DL_SCRIPT("permits_add",
    PERMITS_PRELUDE
    "reclaim() "
    "local v = redis.call('incrby', KEYS[1], ARGV[1]) "
    "redis.call('publish', KEYS[3], v) "
    "return v");

/* Watchdog, the dl_lease convention: KEYS[i] = {name}:timeout, ARGV[1] =
 * lease ms, ARGV[1 + i] = permit id. Renews only permits still out and not
 * yet expired on the server's clock (an expired one is returned to the pool
 * by the next operation: it is lost). -> {1 renewed | 0 gone, ...} */
dl_script dl_script_permits_wd_renew = DL_SCRIPT("permits_wd_renew",
    "local t = redis.call('time') "
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "local exp = string.format('%.0f', now + tonumber(ARGV[1])) "
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "local s = redis.pcall('zscore', key, ARGV[i + 1]) "
    "if type(s) == 'string' and tonumber(s) >= now then "
    "if tonumber(s) < tonumber(exp) then redis.call('zadd', key, 'XX', exp, ARGV[i + 1]) end "
    "res[i] = 1 "
    "else res[i] = 0 end end "
    "return res");

/* The handle's Redis keys (o->h.backend_state). */
typedef struct pm_keys {
    char *zkey; /* {name}:timeout */
    size_t zkey_len;
} pm_keys;

int dl_redis_permits_init(dl_object *o, dl_err *err) {
    pm_keys *k = calloc(1, sizeof *k);
    if (k) k->zkey = dl_derive_key("", o->h.name, o->h.name_len, ":timeout", &k->zkey_len);
    if (!k || !k->zkey) {
        free(k);
        return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    }
    o->h.backend_state = k;
    return DLOCK_OK;
}

void dl_redis_permits_destroy(dl_object *o) {
    pm_keys *k = o->h.backend_state;
    if (!k) return;
    free(k->zkey);
    free(k);
    o->h.backend_state = NULL;
}

void dl_redis_permits_lease(dl_object *o, dl_lease *lease) {
    const pm_keys *k = o->h.backend_state;
    lease->renew = &dl_script_permits_wd_renew;
    lease->key = k->zkey;
    lease->key_len = k->zkey_len;
}

/* Runs a script with KEYS {name, zkey, channel} on conn (a pooled one when
 * NULL). */
static int pm_eval(dl_object *o, dl_conn *conn, dl_script *s, int nargs, const char **args,
                   const size_t *arglens, redisReply **r, dl_err *err) {
    const pm_keys *k = o->h.backend_state;
    const char *keys[3] = {o->h.name, k->zkey, o->h.channel};
    size_t keylens[3] = {o->h.name_len, k->zkey_len, o->h.channel_len};
    if (conn)
        return dl_eval(conn, dl_cmd_deadline(o->h.c), s, 3, keys, keylens, nargs, args, arglens,
                       r, err);
    return dl_client_eval(o->h.c, s, 3, keys, keylens, nargs, args, arglens, r, err);
}

/* pm_eval expecting an integer answer. */
static int pm_eval_int(dl_object *o, dl_script *s, const char *what, int nargs,
                       const char **args, const size_t *arglens, long long *v, dl_err *err) {
    const pm_keys *k = o->h.backend_state;
    const char *keys[3] = {o->h.name, k->zkey, o->h.channel};
    size_t keylens[3] = {o->h.name_len, k->zkey_len, o->h.channel_len};
    return dl_object_eval_int(o, NULL, s, what, 3, keys, keylens, nargs, args, arglens, v, err);
}

/* One acquire attempt: *got 1, or 0 with *left_ms (ms to the earliest
 * expiry, -1 if none). */
static int attempt(dl_object *o, dl_conn *conn, const char *raw, const char *lease,
                   size_t lease_len, int *got, int64_t *left_ms, dl_err *err) {
    const char *args[2] = {raw, lease};
    size_t arglens[2] = {DL_PERMIT_RAW, lease_len};
    redisReply *r = NULL;
    long long a = 0, b = 0;
    int rc = pm_eval(o, conn, &dl_script_permits_acquire, 2, args, arglens, &r, err);
    if (rc) return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = dl_sync_reply_error(r, "permit acquire", err);
    else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || dl_reply_int(r->element[0], &a) ||
             dl_reply_int(r->element[1], &b))
        rc = dl_seterr(err, DLOCK_EPROTO, "permit acquire: unexpected reply from the script");
    freeReplyObject(r);
    if (rc) return rc;
    *got = a == 1;
    *left_ms = b;
    return DLOCK_OK;
}

static int64_t wait_left(int64_t deadline) {
    if (deadline == DL_INF_DEADLINE) return -1;
    int64_t left = deadline - dl_now_ms();
    return left > 0 ? left : 0;
}

int dl_redis_permits_acquire(dl_object *o, const char *raw, int64_t wait_ms, int64_t lease_ms,
                             int64_t *t0, dl_err *err) {
    dlock_client *c = o->h.c;
    char nm[80], lease[24];
    size_t lease_len = dl_fmt_ll(lease, lease_ms);
    int64_t deadline = dl_deadline(wait_ms);
    dl_conn *conn = NULL, *sub = NULL;
    int got = 0;
    int64_t left = -1;
    int rc = dl_pool_get_key(c, o->h.name, o->h.name_len, dl_cmd_deadline(c), &conn, err);
    *t0 = dl_now_ms();
    if (!rc) rc = attempt(o, conn, raw, lease, lease_len, &got, &left, err);
    if (rc || got) goto out;
    if (wait_ms == DLOCK_NOWAIT) {
        rc = dl_seterr(err, DLOCK_EBUSY, "permit semaphore '%s': no permit available",
                       dl_name_msg(o->h.name, o->h.name_len, nm, sizeof nm));
        goto out;
    }
    rc = dl_sync_subscribe(c, o->h.channel, o->h.channel_len, &sub, err);
    dl_cancel_begin(&o->h.cancel); /* a cancel wakes dl_sync_wait */
    while (!rc) {
        /* subscribed before this attempt: a release after it is not missed */
        *t0 = dl_now_ms();
        rc = attempt(o, conn, raw, lease, lease_len, &got, &left, err);
        if (rc || got) break;
        int64_t now = dl_now_ms();
        if (wait_left(deadline) == 0) {
            rc = dl_seterr(err, DLOCK_ETIMEDOUT, "timed out waiting for a permit of '%s'",
                           dl_name_msg(o->h.name, o->h.name_len, nm, sizeof nm));
            break;
        }
        /* an expiring lease frees a permit without any message: wake then
         * (+1: surely expired on the server's clock) */
        int64_t until = deadline;
        if (left >= 0 && now + left + 1 < until) until = now + left + 1;
        int moved = 0;
        rc = dl_follow_slot(o->h.c, o->h.channel, o->h.channel_len, &conn, &sub, &moved, err);
        if (rc || moved) continue;
        rc = dl_sync_wait(o, sub, until, err);
        if (rc == DLOCK_ETIMEDOUT) rc = DLOCK_OK;
    }
    dl_cancel_end(&o->h.cancel);
    dl_sync_unsubscribe(c, sub, o->h.channel, o->h.channel_len);
out:
    dl_pool_put(c, conn);
    return rc;
}

int dl_redis_permits_release(dl_object *o, const char *raw, int *released, dl_err *err) {
    const char *args[1] = {raw};
    size_t arglens[1] = {DL_PERMIT_RAW};
    long long v = 0;
    int rc = pm_eval_int(o, &dl_script_permits_release, "permit release", 1, args, arglens, &v, err);
    *released = !rc && v == 1;
    return rc;
}

int dl_redis_permits_renew(dl_object *o, const char *raw, int64_t lease_ms, int *renewed,
                           dl_err *err) {
    char lease[24];
    const char *args[2] = {raw, lease};
    size_t arglens[2] = {DL_PERMIT_RAW, dl_fmt_ll(lease, lease_ms)};
    long long v = 0;
    int rc = pm_eval_int(o, &dl_script_permits_renew, "permit renew", 2, args, arglens, &v, err);
    *renewed = !rc && v == 1;
    return rc;
}

int dl_redis_permits_available(dl_object *o, int64_t *permits, dl_err *err) {
    long long v = 0;
    int rc = pm_eval_int(o, &dl_script_permits_available, "permit available", 0, NULL, NULL, &v, err);
    if (!rc) *permits = v;
    return rc;
}

int dl_redis_permits_try_set(dl_object *o, int64_t permits, int *set, dl_err *err) {
    char num[24];
    const char *args[1] = {num};
    size_t arglens[1] = {dl_fmt_ll(num, permits)};
    long long v = 0;
    int rc = pm_eval_int(o, &dl_script_permits_try_set, "permit try_set", 1, args, arglens, &v, err);
    if (!rc) *set = v == 1;
    return rc;
}

int dl_redis_permits_add(dl_object *o, int64_t delta, dl_err *err) {
    char num[24];
    const char *args[1] = {num};
    size_t arglens[1] = {dl_fmt_ll(num, delta)};
    long long v = 0;
    return pm_eval_int(o, &dl_script_permits_add, "permit add", 1, args, arglens, &v, err);
}
