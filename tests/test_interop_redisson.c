/* Interoperation with Redisson (../shared/INTEROP.md), played by raw
 * commands and Redisson-shaped Lua scripts over hiredis. The stand-in
 * follows Redisson 4.7.0 (its main branch at 4.7.1-SNAPSHOT, August 2026):
 * the scripts below are written from the facts of its published source
 * (RedissonLock, RedissonFairLock, RedissonPermitExpirableSemaphore), with
 * the KEYS and the ARGV order its Java code passes, and its defaults
 * (fairLockWaitTimeout 300,000 ms since 3.13.3; the lock watchdog's 30,000
 * ms lease). Parts: a "Redisson" holder excludes a dlock reentrant lock and
 * vice versa; a Redisson release wakes a blocked dlock waiter; a dlock
 * release publishes "0" on redisson_lock__channel:{name}; Redisson's renewal
 * sees dlock's field; a fence counter bumped by an RFencedLock is continued
 * by dlock; every object's keys and channels under names with and without a
 * hash tag; permit ids both ways; the fair lock's queue shared by both: the
 * exact deadlines after a scripted sequence from both sides, and 3 dlock and
 * 2 Redisson clients contending, none below half its fair share. */
#include "harness.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/time.h>

#define ASSERT_PCODE(p, expr, want) TH_CODE_(expr, want, dlock_permits_errmsg(p))
#define NAME "rsn:lock"
#define FIELD "6f1d2c3b-aaaa-4bbb-8ccc-0123456789ab:1"

/* Redisson's acquire: nil when acquired, else the key's PTTL. */
static const char *ACQUIRE =
    "if (redis.call('exists', KEYS[1]) == 0) or "
    "(redis.call('hexists', KEYS[1], ARGV[2]) == 1) then "
    "redis.call('hincrby', KEYS[1], ARGV[2], 1); "
    "redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
    "return redis.call('pttl', KEYS[1]);";
/* Redisson's release (RedissonLock.unlockInnerAsync). KEYS: lock, channel,
 * unlock latch "redisson_unlock_latch:{N}:<requestId>". ARGV: message "0",
 * lease, owner, publish command, latch ms. A retried request answers what the
 * first one did (the latch); else nil not held, 0 still held, 1 released
 * (and published). The caller DELs the latch afterwards. */
static const char *RELEASE =
    "local done = redis.call('get', KEYS[3]); "
    "if done ~= false then return tonumber(done); end; "
    "if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil; end; "
    "if redis.call('hincrby', KEYS[1], ARGV[3], -1) > 0 then "
    "redis.call('pexpire', KEYS[1], ARGV[2]); "
    "redis.call('set', KEYS[3], 0, 'px', ARGV[5]); return 0; end; "
    "redis.call('del', KEYS[1]); redis.call(ARGV[4], KEYS[2], ARGV[1]); "
    "redis.call('set', KEYS[3], 1, 'px', ARGV[5]); return 1;";
/* Redisson's renewal: 1 if the owner's field exists (lease refreshed). */
static const char *RENEW =
    "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then "
    "redis.call('pexpire', KEYS[1], ARGV[1]); return 1; end; return 0;";

static redisReply *rsn_acquire(redisContext *rc, const char *field, int lease)
{
    return th_cmd(rc, "EVAL %s 1 %s %d %s", ACQUIRE, NAME, lease, field);
}

static long long rsn_release(redisContext *rc, const char *field)
{
    redisReply *r = th_cmd(rc,
                           "EVAL %s 3 %s redisson_lock__channel:{%s} "
                           "redisson_unlock_latch:{%s}:00ff 0 30000 %s publish 12000",
                           RELEASE, NAME, NAME, NAME, field);
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    th_cmd_int(rc, "DEL redisson_unlock_latch:{%s}:00ff", NAME);
    return v; /* nil (not held): -1 */
}

/* ---- every object's keys and channels under Redisson's naming, for names
 * with and without a hash tag of their own. Redisson's rules (RedissonObject):
 * prefixName(p, N) = p ":{" N "}", or p ":" N when N contains '{';
 * suffixName(N, s) = "{" N "}:" s, or N ":" s when N contains '{'; the
 * latch's channel is "redisson_countdownlatch__channel__{" N "}" always. */
static void rprefix(char *out, size_t n, const char *p, const char *name)
{
    snprintf(out, n, strchr(name, '{') ? "%s:%s" : "%s:{%s}", p, name);
}

static void rsuffix(char *out, size_t n, const char *name, const char *sfx)
{
    snprintf(out, n, strchr(name, '{') ? "%s:%s" : "{%s}:%s", name, sfx);
}

/* ---- Redisson's RFairLock ----
 * KEYS: lock, "redisson_lock_queue:{N}", "redisson_lock_timeout:{N}".
 * Both acquire scripts first drop the queue heads whose deadline is at or
 * before now (no other deadline changes), then take the lock when it is free
 * and the queue is empty or headed by the caller: the caller leaves the queue
 * and every remaining deadline is lowered by the caller's wait time; a
 * re-entry counts up. They differ in what follows and in their ARGV order:
 *   lock() / tryLock(wait)   (EVAL_LONG): lease, owner, wait, now
 *   tryLock() once (EVAL_NULL_BOOLEAN): lease, owner, now, wait
 * The first, not acquiring: an owner already queued gets the lock's PTTL (at
 * least 0); a new one is queued behind the tail with the deadline
 *   d = ttl + wait + now, ttl = d(tail) - now, or the lock's PTTL when the
 *   queue is empty (or the tail has no deadline),
 * and gets ttl. The second answers 1 and queues nothing. "wait" is
 * Config.fairLockWaitTimeout, or the caller's tryLock wait when it gave one;
 * "now" is the client's System.currentTimeMillis(). */
#define RSN_FAIR_WAIT_MS 300000
#define FAIR_SWEEP(now)                                                                   \
    "while true do local h = redis.call('lindex', KEYS[2], 0); "                          \
    "if h == false then break; end; "                                                     \
    "local d = redis.call('zscore', KEYS[3], h); "                                        \
    "if d == false or tonumber(d) > tonumber(" now ") then break; end; "                  \
    "redis.call('zrem', KEYS[3], h); redis.call('lpop', KEYS[2]); end; "
#define FAIR_TAKE(wait)                                                                   \
    "if redis.call('exists', KEYS[1]) == 0 and (redis.call('exists', KEYS[2]) == 0 "      \
    "or redis.call('lindex', KEYS[2], 0) == ARGV[2]) then "                               \
    "redis.call('lpop', KEYS[2]); redis.call('zrem', KEYS[3], ARGV[2]); "                 \
    "for _, o in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do "                        \
    "redis.call('zincrby', KEYS[3], -tonumber(" wait "), o); end; "                       \
    "redis.call('hset', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); "  \
    "return nil; end; "                                                                   \
    "if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then "                               \
    "redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); " \
    "return nil; end; "
static const char *FAIR_ACQUIRE = FAIR_SWEEP("ARGV[4]") FAIR_TAKE("ARGV[3]")
    "if redis.call('zscore', KEYS[3], ARGV[2]) ~= false then "
    "return math.max(0, redis.call('pttl', KEYS[1])); end; "
    "local tail = redis.call('lindex', KEYS[2], -1); "
    "local ttl; "
    "if tail ~= false and tail ~= ARGV[2] and redis.call('zscore', KEYS[3], tail) ~= false then "
    "ttl = tonumber(redis.call('zscore', KEYS[3], tail)) - tonumber(ARGV[4]); "
    "else ttl = redis.call('pttl', KEYS[1]); end; "
    "if redis.call('zadd', KEYS[3], ttl + tonumber(ARGV[3]) + tonumber(ARGV[4]), ARGV[2]) == 1 "
    "then redis.call('rpush', KEYS[2], ARGV[2]); end; "
    "return ttl;";
static const char *FAIR_TRY_ONCE = FAIR_SWEEP("ARGV[3]") FAIR_TAKE("ARGV[4]") "return 1;";
/* Its release. KEYS: lock, queue, deadlines, "redisson_lock__channel:{N}",
 * unlock latch. ARGV: "0", lease, owner, now, publish command, latch ms.
 * After the latch check and the sweep: a lock already gone wakes the queue
 * head ("0" on its channel, <channel>:<head>) and answers 1; not held: nil;
 * a re-entry counts down (0); the last hold deletes the lock and wakes the
 * head (1). */
static const char *FAIR_RELEASE =
    "local done = redis.call('get', KEYS[5]); "
    "if done ~= false then return tonumber(done); end; "
    FAIR_SWEEP("ARGV[4]")
    "local function wake() local h = redis.call('lindex', KEYS[2], 0); "
    "if h ~= false then redis.call(ARGV[5], KEYS[4] .. ':' .. h, ARGV[1]); end; end; "
    "if redis.call('exists', KEYS[1]) == 0 then wake(); "
    "redis.call('set', KEYS[5], 1, 'px', ARGV[6]); return 1; end; "
    "if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil; end; "
    "if redis.call('hincrby', KEYS[1], ARGV[3], -1) > 0 then "
    "redis.call('pexpire', KEYS[1], ARGV[2]); "
    "redis.call('set', KEYS[5], 0, 'px', ARGV[6]); return 0; end; "
    "redis.call('del', KEYS[1]); redis.call('set', KEYS[5], 1, 'px', ARGV[6]); wake(); "
    "return 1;";
/* A waiter that gives up (acquireFailedAsync). KEYS: queue, deadlines.
 * ARGV: owner, wait. The deadlines of those behind it are lowered by wait;
 * it leaves the queue. */
static const char *FAIR_GIVE_UP =
    "local q = redis.call('lrange', KEYS[1], 0, -1); local behind = false; "
    "for _, o in ipairs(q) do "
    "if behind then redis.call('zincrby', KEYS[2], -tonumber(ARGV[2]), o); end; "
    "if o == ARGV[1] then behind = true; end; end; "
    "redis.call('zrem', KEYS[2], ARGV[1]); redis.call('lrem', KEYS[1], 0, ARGV[1]);";

/* The server's clock in ms: the clock of a Redisson client in step with it. */
static long long server_ms(redisContext *rc)
{
    redisReply *r = th_cmd(rc, "TIME");
    ASSERT(r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    long long ms = atoll(r->element[0]->str) * 1000 + atoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    return ms;
}

/* One Redisson client thread on the fair lock `name`: owner "<uuid>:<tid>". */
typedef struct {
    redisContext *rc;
    const char *name;
    const char *owner;
    long long wait; /* its wait time, ms */
    long long lease; /* ms; 0: the watchdog's 30,000 */
} rsn_fair;

/* Redisson's key of prefix for the lock (prefixName), in a buffer of the
 * calling thread's four taken in turn. */
static const char *rkey(const char *prefix, const char *name)
{
    static _Thread_local char buf[4][256];
    static _Thread_local int i;
    i = (i + 1) % 4;
    rprefix(buf[i], sizeof buf[i], prefix, name);
    return buf[i];
}

/* lock()'s attempt at client time now: -1 acquired, else the ttl answered. */
static long long rf_acquire(const rsn_fair *f, long long now)
{
    redisReply *r = th_cmd(f->rc, "EVAL %s 3 %s %s %s %lld %s %lld %lld", FAIR_ACQUIRE, f->name,
                           rkey("redisson_lock_queue", f->name),
                           rkey("redisson_lock_timeout", f->name), f->lease ? f->lease : 30000,
                           f->owner, f->wait, now);
    if (r->type != REDIS_REPLY_NIL && r->type != REDIS_REPLY_INTEGER)
        th_fail(__FILE__, __LINE__, "lock() script: %s", r->type == REDIS_REPLY_ERROR ? r->str : "?");
    long long v = r->type == REDIS_REPLY_NIL ? -1 : r->integer;
    freeReplyObject(r);
    return v;
}

/* tryLock()'s single attempt (ARGV: now before wait): 1 acquired, 0 not. */
static int rf_try_once(const rsn_fair *f, long long now)
{
    redisReply *r = th_cmd(f->rc, "EVAL %s 3 %s %s %s 30000 %s %lld %lld", FAIR_TRY_ONCE, f->name,
                           rkey("redisson_lock_queue", f->name),
                           rkey("redisson_lock_timeout", f->name), f->owner, now, f->wait);
    int got = r->type == REDIS_REPLY_NIL;
    freeReplyObject(r);
    return got;
}

/* unlock() at client time now: 1 released, 0 still held, -1 not held. */
static long long rf_release(const rsn_fair *f, long long now)
{
    static atomic_long seq; /* Redisson: a new random request id per unlock */
    char latch[300];
    snprintf(latch, sizeof latch, "%s:%s:%ld", rkey("redisson_unlock_latch", f->name), f->owner,
             atomic_fetch_add(&seq, 1));
    redisReply *r = th_cmd(f->rc, "EVAL %s 5 %s %s %s %s %s 0 30000 %s %lld publish 12000",
                           FAIR_RELEASE, f->name, rkey("redisson_lock_queue", f->name),
                           rkey("redisson_lock_timeout", f->name),
                           rkey("redisson_lock__channel", f->name), latch, f->owner, now);
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    th_cmd_int(f->rc, "DEL %s", latch);
    return v;
}

static void rf_give_up(const rsn_fair *f)
{
    freeReplyObject(th_cmd(f->rc, "EVAL %s 2 %s %s %s %lld", FAIR_GIVE_UP,
                           rkey("redisson_lock_queue", f->name),
                           rkey("redisson_lock_timeout", f->name), f->owner, f->wait));
}

/* The deadline of owner in the queue of name (-1: none). */
static long long rf_score(redisContext *rc, const char *name, const char *owner)
{
    char *v = th_cmd_str(rc, "ZSCORE %s %s", rkey("redisson_lock_timeout", name), owner);
    long long d = v ? atoll(v) : -1;
    free(v);
    return d;
}

typedef struct {
    dlock_client *c;
    int rc;
    int64_t t_got;
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;
    dlock_lock *l = th_lock(w->c, NAME, DLOCK_KIND_REENTRANT);
    w->rc = dlock_acquire(l, 10000, 5000, NULL);
    w->t_got = th_now_ms();
    if (w->rc == DLOCK_OK) dlock_release(l);
    dlock_lock_free(l);
    return NULL;
}


/* The next message on a subscribed raw connection must be want on chan. */
static void expect_msg(redisContext *sub, const char *chan, const char *want)
{
    void *m = NULL;
    ASSERT_EQ(redisGetReply(sub, &m), REDIS_OK);
    redisReply *r = m;
    ASSERT(r->type == REDIS_REPLY_ARRAY && r->elements == 3);
    ASSERT_STR_EQ(r->element[0]->str, "message");
    ASSERT_STR_EQ(r->element[1]->str, chan);
    ASSERT_STR_EQ(r->element[2]->str, want);
    freeReplyObject(r);
}

static redisContext *subscribed(const th_server *s, const char *chan)
{
    redisContext *sub = th_redis(s);
    struct timeval tv = {5, 0};
    redisSetTimeout(sub, tv);
    freeReplyObject(th_cmd(sub, "SUBSCRIBE %s", chan));
    return sub;
}

typedef struct {
    dlock_client *c;
    const char *name;
    int rc;
} fair_waiter;

static void *fair_wait_thread(void *arg)
{
    fair_waiter *w = arg;
    dlock_lock *l = th_lock(w->c, w->name, DLOCK_KIND_FAIR);
    w->rc = dlock_acquire(l, 10000, 5000, NULL);
    if (w->rc == DLOCK_OK) dlock_release(l);
    dlock_lock_free(l);
    return NULL;
}

static void object_names(const th_server *s, dlock_client *c, redisContext *rc, const char *nm)
{
    char k[256], ch[256];
    redisContext *sub;
    /* reentrant lock: the hash N, the fence counter, the unlock channel */
    dlock_lock *l = th_lock(c, nm, DLOCK_KIND_REENTRANT);
    uint64_t f = 0;
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, &f));
    ASSERT_EQ(th_cmd_int(rc, "HEXISTS %s %s", nm, dlock_lock_token(l)), 1);
    rprefix(k, sizeof k, "redisson_lock_token", nm);
    char *fv = th_cmd_str(rc, "GET %s", k);
    ASSERT_NOT_NULL(fv);
    ASSERT_U64_EQ(strtoull(fv, NULL, 10), f);
    free(fv);
    rprefix(ch, sizeof ch, "redisson_lock__channel", nm);
    sub = subscribed(s, ch);
    ASSERT_LOK(l, dlock_release(l));
    expect_msg(sub, ch, "0");
    redisFree(sub);
    dlock_lock_free(l);

    /* fair lock: a waiter's queue entry, deadline and own channel */
    rsn_fair rh = {rc, nm, FIELD, RSN_FAIR_WAIT_MS, 0};
    ASSERT_EQ(rf_acquire(&rh, server_ms(rc)), -1);
    fair_waiter w = {c, nm, -1};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, fair_wait_thread, &w), 0);
    rprefix(k, sizeof k, "redisson_lock_queue", nm);
    ASSERT_EVENTUALLY(th_cmd_int(rc, "LLEN %s", k) == 1, 5000);
    char *owner = th_cmd_str(rc, "LINDEX %s 0", k);
    ASSERT_NOT_NULL(owner);
    rprefix(k, sizeof k, "redisson_lock_timeout", nm);
    char *score = th_cmd_str(rc, "ZSCORE %s %s", k, owner);
    ASSERT_NOT_NULL(score);
    free(score);
    rprefix(ch, sizeof ch, "redisson_lock__channel", nm);
    size_t cl = strlen(ch);
    snprintf(ch + cl, sizeof ch - cl, ":%s", owner);
    ASSERT_EVENTUALLY(th_numsub(rc, ch) == 1, 5000);
    /* Redisson's release wakes the head ("0" on its channel) */
    ASSERT_EQ(rf_release(&rh, server_ms(rc)), 1);
    ASSERT_EQ(pthread_join(t, NULL), 0);
    ASSERT_CODE(w.rc, DLOCK_OK);
    free(owner);

    /* read-write lock: a read hold's timeout key, the channel's "0" and "1" */
    l = th_lock(c, nm, DLOCK_KIND_READ);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, NULL));
    char sfx[160];
    snprintf(sfx, sizeof sfx, "%s:rwlock_timeout:1", dlock_lock_token(l));
    rsuffix(k, sizeof k, nm, sfx);
    ASSERT_GT(th_cmd_int(rc, "PTTL %s", k), 0);
    rprefix(ch, sizeof ch, "redisson_rwlock", nm);
    sub = subscribed(s, ch);
    ASSERT_LOK(l, dlock_release(l));
    expect_msg(sub, ch, "0");
    dlock_lock_free(l);
    l = th_lock(c, nm, DLOCK_KIND_WRITE);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, NULL));
    ASSERT_LOK(l, dlock_release(l));
    expect_msg(sub, ch, "1");
    redisFree(sub);
    dlock_lock_free(l);

    /* semaphore: the count at N, published on redisson_sc */
    dlock_semaphore *sm = NULL;
    ASSERT_COK(c, dlock_semaphore_new(c, nm, DLOCK_CSTR, &sm));
    ASSERT_SOK(sm, dlock_semaphore_release(sm, 2));
    rprefix(ch, sizeof ch, "redisson_sc", nm);
    sub = subscribed(s, ch);
    ASSERT_SOK(sm, dlock_semaphore_release(sm, 1));
    expect_msg(sub, ch, "3");
    char *sv = th_cmd_str(rc, "GET %s", nm);
    ASSERT_STR_EQ(sv, "3");
    free(sv);
    dlock_semaphore_free(sm);
    ASSERT_EQ(th_cmd_int(rc, "DEL %s", nm), 1);

    /* permit semaphore: the leases in suffixName(N, "timeout") */
    dlock_permits *pm = NULL;
    ASSERT_COK(c, dlock_permits_new(c, nm, DLOCK_CSTR, &pm));
    int set = 0;
    ASSERT_OK(dlock_permits_try_set(pm, 1, &set));
    ASSERT_EQ(set, 1);
    char id[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_OK(dlock_permits_acquire(pm, DLOCK_NOWAIT, 15000, id));
    rsuffix(k, sizeof k, nm, "timeout");
    ASSERT_EQ(th_cmd_int(rc, "ZCARD %s", k), 1);
    ASSERT_OK(dlock_permits_release(pm, id));
    expect_msg(sub, ch, "1");
    ASSERT_EQ(th_cmd_int(rc, "ZCARD %s", k), 0);
    redisFree(sub);
    dlock_permits_free(pm);
    ASSERT_EQ(th_cmd_int(rc, "DEL %s", nm), 1);

    /* latch: braces around every name */
    snprintf(ch, sizeof ch, "redisson_countdownlatch__channel__{%s}", nm);
    sub = subscribed(s, ch);
    dlock_latch *la = NULL;
    ASSERT_COK(c, dlock_latch_new(c, nm, DLOCK_CSTR, &la));
    ASSERT_OK(dlock_latch_set(la, 1));
    expect_msg(sub, ch, "1");
    ASSERT_OK(dlock_latch_count_down(la, 1));
    expect_msg(sub, ch, "0");
    redisFree(sub);
    dlock_latch_free(la);
    th_log("'%s': every object's keys and channels are Redisson's", nm);
}

/* Redisson's RPermitExpirableSemaphore (4.7): the id is 16 random bytes,
 * shown as 32 hex characters by its API and decoded before every script;
 * the ZSET "{N}:timeout" holds the raw bytes with the expiry (ms). Its
 * release: ZREM the id; if removed, INCRBY the count by 1, publish the new
 * count, and answer 1 unless the permit had expired. KEYS: name, channel,
 * timeouts. ARGV: raw id, 1, now ms. */
static const char *PM_RELEASE =
    "local expire = redis.call('zscore', KEYS[3], ARGV[1]); "
    "if redis.call('zrem', KEYS[3], ARGV[1]) ~= 1 then return 0; end; "
    "local value = redis.call('incrby', KEYS[1], ARGV[2]); "
    "redis.call('publish', KEYS[2], value); "
    "if tonumber(expire) <= tonumber(ARGV[3]) then return 0; end; "
    "return 1;";
/* Its acquire of one permit: DECRBY 1 and ZADD the raw id at the expiry when
 * one is available (expired leases reclaimed first, left out here). KEYS:
 * name, timeouts. ARGV: expiry ms, raw id. -> 1 taken | 0 */
static const char *PM_ACQUIRE =
    "local v = redis.call('get', KEYS[1]); "
    "if v ~= false and tonumber(v) >= 1 then redis.call('decrby', KEYS[1], 1); "
    "redis.call('zadd', KEYS[2], ARGV[1], ARGV[2]); return 1; end; return 0;";

static void hex_raw(const char *hex, char raw[16])
{
    for (int i = 0; i < 16; i++) {
        unsigned v = 0;
        ASSERT_EQ(sscanf(hex + 2 * i, "%2x", &v), 1);
        raw[i] = (char)v;
    }
}

/* Permit ids cross both ways: Redisson releases a dlock permit by the hex id
 * dlock's API gave, dlock releases and renews one Redisson took. */
static void permit_ids(dlock_client *c, redisContext *rc)
{
    const char *nm = "rsn:pm", *zk = "{rsn:pm}:timeout", *ch = "redisson_sc:{rsn:pm}";
    dlock_permits *pm = NULL;
    ASSERT_COK(c, dlock_permits_new(c, nm, DLOCK_CSTR, &pm));
    int set = 0;
    ASSERT_OK(dlock_permits_try_set(pm, 2, &set));
    ASSERT_EQ(set, 1);
    char id[DLOCK_PERMIT_ID_LEN + 1], raw[16];
    ASSERT_OK(dlock_permits_acquire(pm, DLOCK_NOWAIT, 20000, id));
    hex_raw(id, raw);
    /* the ZSET holds the 16 bytes, at the lease's expiry */
    char *sc = th_cmd_str(rc, "ZSCORE %s %b", zk, raw, (size_t)16);
    ASSERT_NOT_NULL(sc);
    ASSERT_GT(atoll(sc), server_ms(rc) + 15000);
    free(sc);
    redisReply *r = th_cmd(rc, "EVAL %s 3 %s %s %s %b 1 %lld", PM_RELEASE, nm, ch, zk, raw,
                           (size_t)16, server_ms(rc));
    ASSERT_EQ(r->type, REDIS_REPLY_INTEGER);
    ASSERT_EQ(r->integer, 1); /* Redisson released dlock's permit */
    freeReplyObject(r);
    ASSERT_PCODE(pm, dlock_permits_release(pm, id), DLOCK_ENOTOWNER);
    int64_t n = 0;
    ASSERT_OK(dlock_permits_available(pm, &n));
    ASSERT_EQ(n, 2);

    /* Redisson takes one (its id: 32 hex characters, upper case as Java's
     * may print them); dlock renews and releases it by that id */
    const char *rid = "0123456789ABCDEF0011223344556677";
    hex_raw(rid, raw);
    r = th_cmd(rc, "EVAL %s 2 %s %s %lld %b", PM_ACQUIRE, nm, zk, server_ms(rc) + 20000, raw,
               (size_t)16);
    ASSERT_EQ(r->integer, 1);
    freeReplyObject(r);
    ASSERT_OK(dlock_permits_renew(pm, rid, 60000));
    sc = th_cmd_str(rc, "ZSCORE %s %b", zk, raw, (size_t)16);
    ASSERT_NOT_NULL(sc);
    ASSERT_GT(atoll(sc), server_ms(rc) + 50000);
    free(sc);
    ASSERT_OK(dlock_permits_release(pm, rid));
    ASSERT_EQ(th_cmd_int(rc, "ZCARD %s", zk), 0);
    ASSERT_OK(dlock_permits_available(pm, &n));
    ASSERT_EQ(n, 2);
    dlock_permits_free(pm);
    th_log("permit ids: Redisson released dlock's, dlock renewed and released Redisson's");
}

/* The fair lock's stand-in: Redisson's own deadline arithmetic among Redisson
 * threads (the scores each step must leave), both acquire scripts' ARGV
 * orders, and a dlock waiter woken by Redisson's release. */
static void fair_standin(const th_server *s, redisContext *rc)
{
    const char *nm = "rsn:fair";
    const long long W = RSN_FAIR_WAIT_MS;
    rsn_fair a = {rc, nm, "aaaa:1", W, 0}, b = {rc, nm, "bbbb:1", W, 0};
    rsn_fair d = {rc, nm, "dddd:1", W, 0}, e = {rc, nm, "eeee:1", W, 0};
    long long t = server_ms(rc);
    ASSERT_EQ(rf_acquire(&a, t), -1); /* a holds (lease 30 s) */
    long long ttl = rf_acquire(&b, t + 1); /* b queues behind the lock's PTTL */
    ASSERT(ttl > 25000 && ttl <= 30000);
    long long db = ttl + W + t + 1;
    ASSERT_EQ(rf_score(rc, nm, b.owner), db);
    ASSERT_EQ(rf_acquire(&d, t + 2), db - (t + 2)); /* d behind b: ttl = d(b) - now */
    ASSERT_EQ(rf_score(rc, nm, d.owner), db + W);
    long long again = rf_acquire(&d, t + 3); /* queued already: the PTTL, no change */
    ASSERT(again > 25000 && again <= 30000);
    ASSERT_EQ(rf_score(rc, nm, d.owner), db + W);
    ASSERT_EQ(rf_try_once(&e, t + 3), 0); /* tryLock(): no queue entry */
    ASSERT_EQ(rf_score(rc, nm, e.owner), -1);
    ASSERT_EQ(th_cmd_int(rc, "LLEN redisson_lock_queue:{%s}", nm), 2);
    /* a's release wakes the head b only */
    redisContext *sb = subscribed(s, "redisson_lock__channel:{rsn:fair}:bbbb:1");
    redisContext *sd = subscribed(s, "redisson_lock__channel:{rsn:fair}:dddd:1");
    ASSERT_EQ(rf_release(&a, t + 4), 1);
    expect_msg(sb, "redisson_lock__channel:{rsn:fair}:bbbb:1", "0");
    ASSERT_EQ(rf_try_once(&d, t + 5), 0); /* d cannot pass b */
    ASSERT_EQ(rf_acquire(&b, t + 5), -1);  /* b takes it: d's deadline comes down by W */
    ASSERT_EQ(rf_score(rc, nm, d.owner), db);
    ASSERT_EQ(rf_acquire(&e, t + 6), db - (t + 6));
    ASSERT_EQ(rf_score(rc, nm, e.owner), db + W);
    rf_give_up(&d); /* d gives up: e, behind it, comes down by W */
    ASSERT_EQ(rf_score(rc, nm, d.owner), -1);
    ASSERT_EQ(rf_score(rc, nm, e.owner), db);
    /* tryLock() reads now from ARGV[3]: at e's deadline the stale head goes */
    ASSERT_EQ(rf_try_once(&a, db), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS redisson_lock_queue:{%s} redisson_lock_timeout:{%s}", nm, nm),
              0);
    ASSERT_EQ(rf_release(&b, t + 7), 1); /* nobody queued: no message */
    redisFree(sb);
    redisFree(sd);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", nm), 0);
    th_log("fair stand-in: Redisson's stacked deadlines and both ARGV orders");
}

/* ---- a fair queue shared by Redisson and dlock waiters ---- */

/* A dlock waiter in its own thread and client (W = Redisson's default):
 * acquires, says so, holds until told, releases. */
typedef struct {
    const th_server *s;
    const char *name;
    atomic_int got;     /* 1: acquired (rc in rc) */
    atomic_int go;      /* 1: release now */
    int rc;
    int64_t wait;       /* W; 0: Redisson's default */
} dl_waiter;

static void *dl_waiter_thread(void *arg)
{
    dl_waiter *w = arg;
    dlock_client *c = th_client(w->s, 0);
    ASSERT_COK(c, dlock_client_set_fair_wait(c, w->wait ? w->wait : DLOCK_REDISSON_FAIR_WAIT_MS));
    dlock_lock *l = th_lock(c, w->name, DLOCK_KIND_FAIR);
    w->rc = dlock_acquire(l, 60000, 30000, NULL);
    atomic_store(&w->got, 1);
    while (!atomic_load(&w->go)) th_sleep_ms(1);
    if (w->rc == DLOCK_OK) ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

/* The queue is exactly owners[0..n) with the deadlines want[0..n). */
static void expect_queue(redisContext *rc, const char *nm, const char *const *owners,
                         const long long *want, size_t n)
{
    redisReply *r = th_cmd(rc, "LRANGE %s 0 -1", rkey("redisson_lock_queue", nm));
    ASSERT(r->type == REDIS_REPLY_ARRAY);
    ASSERT_EQ(r->elements, n);
    for (size_t i = 0; i < n; i++) ASSERT_STR_EQ(r->element[i]->str, owners[i]);
    freeReplyObject(r);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD %s", rkey("redisson_lock_timeout", nm)), (long long)n);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(rf_score(rc, nm, owners[i]), want[i]);
}

/* The owner queued at position i (malloc'd), once the queue is i + 1 long. */
static char *queued_owner(redisContext *rc, const char *nm, int i)
{
    ASSERT_EVENTUALLY(th_cmd_int(rc, "LLEN %s", rkey("redisson_lock_queue", nm)) == i + 1,
                      5000);
    char *o = th_cmd_str(rc, "LINDEX %s %d", rkey("redisson_lock_queue", nm), i);
    ASSERT_NOT_NULL(o);
    return o;
}

/* Redisson 4.7's formulas, W = 300,000 ms on both sides: B (Redisson) queues
 * behind A's lease, b = ttl + W + now; X and Y (dlock), C and D (Redisson)
 * queue behind it, each at the tail's deadline + W; then each acquire, by
 * Redisson (B, C, D: its lock() script), by dlock taking a free lock (X,
 * woken by Redisson's release) or taking up a grant (Y, granted by X's
 * release), lowers every queued deadline by W. The queue and every deadline
 * are asserted after each step. */
static void mixed_scores(const th_server *s, redisContext *rc)
{
    const char *nm = "rsn:mixed";
    const long long W = RSN_FAIR_WAIT_MS;
    rsn_fair A = {rc, nm, "aaaa:1", W, 0}, B = {rc, nm, "bbbb:1", W, 0};
    rsn_fair C = {rc, nm, "cccc:1", W, 0}, D = {rc, nm, "dddd:1", W, 0};
    ASSERT_EQ(rf_acquire(&A, server_ms(rc)), -1);
    long long tb = server_ms(rc);
    long long b = rf_acquire(&B, tb) + W + tb;
    dl_waiter x = {s, nm, 0, 0, -1, 0}, y = {s, nm, 0, 0, -1, 0};
    pthread_t tx, ty;
    ASSERT_EQ(pthread_create(&tx, NULL, dl_waiter_thread, &x), 0);
    char *X = queued_owner(rc, nm, 1);
    ASSERT_EQ(pthread_create(&ty, NULL, dl_waiter_thread, &y), 0);
    char *Y = queued_owner(rc, nm, 2);
    long long tc = server_ms(rc);
    ASSERT_EQ(rf_acquire(&C, tc), b + 2 * W - tc); /* C's ttl: Y's deadline - now */
    long long td = server_ms(rc);
    ASSERT_EQ(rf_acquire(&D, td), b + 3 * W - td);
    const char *q5[] = {B.owner, X, Y, C.owner, D.owner};
    expect_queue(rc, nm, q5, (long long[]){b, b + W, b + 2 * W, b + 3 * W, b + 4 * W}, 5);
    /* the dlock waiters' keep-alive attempts leave their deadlines as they are */
    th_sleep_ms(1800);
    expect_queue(rc, nm, q5, (long long[]){b, b + W, b + 2 * W, b + 3 * W, b + 4 * W}, 5);

    ASSERT_EQ(rf_release(&A, server_ms(rc)), 1); /* wakes B */
    ASSERT_EQ(rf_acquire(&B, server_ms(rc)), -1);
    expect_queue(rc, nm, q5 + 1, (long long[]){b, b + W, b + 2 * W, b + 3 * W}, 4);
    ASSERT_EQ(atomic_load(&x.got), 0);

    ASSERT_EQ(rf_release(&B, server_ms(rc)), 1); /* wakes X ("0"): dlock takes the free lock */
    ASSERT_EVENTUALLY(atomic_load(&x.got), 10000);
    ASSERT_CODE(x.rc, DLOCK_OK);
    expect_queue(rc, nm, q5 + 2, (long long[]){b, b + W, b + 2 * W}, 3);

    atomic_store(&x.go, 1); /* X's release grants to Y, which takes it up */
    ASSERT_EVENTUALLY(atomic_load(&y.got), 10000);
    ASSERT_CODE(y.rc, DLOCK_OK);
    ASSERT_EQ(pthread_join(tx, NULL), 0);
    expect_queue(rc, nm, q5 + 3, (long long[]){b, b + W}, 2);

    atomic_store(&y.go, 1); /* Y's release wakes C ("0"), the head */
    ASSERT_EQ(pthread_join(ty, NULL), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", nm), 0);
    ASSERT_EQ(rf_acquire(&C, server_ms(rc)), -1);
    expect_queue(rc, nm, q5 + 4, (long long[]){b}, 1);
    ASSERT_EQ(rf_release(&C, server_ms(rc)), 1);
    ASSERT_EQ(rf_acquire(&D, server_ms(rc)), -1);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s %s", rkey("redisson_lock_queue", nm),
                         rkey("redisson_lock_timeout", nm)),
              0);
    ASSERT_EQ(rf_release(&D, server_ms(rc)), 1);
    free(X);
    free(Y);
    th_log("mixed queue B X Y C D: every deadline as Redisson's formulas give, step by step");
}

/* A live dlock waiter keeps its place where a Redisson waiter's deadline
 * runs out: W = 1 s on both sides, A holds with a 200 ms lease, B, X (dlock)
 * and C queue; once B holds (X's deadline lowered to b, about 1.2 s ahead),
 * B keeps the lock 2.6 s. X's keep-alive has raised its deadline to at least
 * now + W meanwhile, C's (Redisson) is unchanged and past; B's release wakes
 * X, the head, which takes the lock. */
static void keep_place(const th_server *s, redisContext *rc)
{
    const char *nm = "rsn:keep";
    const long long W = 1000;
    rsn_fair A = {rc, nm, "aaaa:2", W, 200}, B = {rc, nm, "bbbb:2", W, 5000};
    rsn_fair C = {rc, nm, "cccc:2", W, 0};
    ASSERT_EQ(rf_acquire(&A, server_ms(rc)), -1);
    long long tb = server_ms(rc);
    long long b = rf_acquire(&B, tb) + W + tb;
    dl_waiter x = {s, nm, 0, 0, -1, W};
    pthread_t tx;
    ASSERT_EQ(pthread_create(&tx, NULL, dl_waiter_thread, &x), 0);
    char *X = queued_owner(rc, nm, 1);
    ASSERT_EQ(rf_score(rc, nm, X), b + W);
    long long tc = server_ms(rc);
    ASSERT_EQ(rf_acquire(&C, tc), b + W - tc);
    ASSERT_EQ(rf_release(&A, server_ms(rc)), 1);
    ASSERT_EQ(rf_acquire(&B, server_ms(rc)), -1);
    const char *q2[] = {X, C.owner};
    expect_queue(rc, nm, q2, (long long[]){b, b + W}, 2);
    th_sleep_ms(2600);
    long long now = server_ms(rc);
    ASSERT_GT(now, b + W);                  /* both stacked deadlines are past */
    ASSERT_GE(rf_score(rc, nm, X), now + W - 500); /* X's was raised */
    ASSERT_EQ(rf_score(rc, nm, C.owner), b + W);   /* C's stays */
    ASSERT_EQ(rf_release(&B, now), 1); /* the sweep keeps X, the head, and wakes it */
    ASSERT_EVENTUALLY(atomic_load(&x.got), 5000);
    ASSERT_CODE(x.rc, DLOCK_OK);
    atomic_store(&x.go, 1);
    ASSERT_EQ(pthread_join(tx, NULL), 0);
    rf_give_up(&C);
    free(X);
    th_log("a live dlock waiter kept its place past its stacked deadline (W = 1 s)");
}

/* Contention: 3 dlock threads and 2 Redisson threads (its lock() loop: the
 * attempt, then wait for "0" on its own channel or the answered ttl) on one
 * fair lock for 3 s, each holding 1 ms per round. At the end a Redisson
 * thread may give up at the head of the queue; Redisson's give-up wakes
 * nobody, so the dlock waiter behind it comes back on its own (min(W, 5 s)
 * / 3 later): after the count, which it does not change. */
#define MIX_DLOCK 3
#define MIX_RSN 2
#define MIX_MS 3000
static atomic_int mix_inside;
static atomic_int mix_stop;

typedef struct {
    const th_server *s;
    int id;
    long n;
    int64_t longest; /* ms, the longest acquire (dlock) */
} mixer;

static void mix_hold(void)
{
    ASSERT_EQ(atomic_fetch_add(&mix_inside, 1), 0);
    th_sleep_ms(1);
    atomic_fetch_sub(&mix_inside, 1);
}

static void *mix_dlock(void *arg)
{
    mixer *m = arg;
    dlock_client *c = th_client(m->s, 0);
    ASSERT_COK(c, dlock_client_set_fair_wait(c, DLOCK_REDISSON_FAIR_WAIT_MS));
    dlock_lock *l = th_lock(c, "rsn:mix", DLOCK_KIND_FAIR);
    while (!atomic_load(&mix_stop)) {
        int64_t t0 = th_now_ms();
        int rc = dlock_acquire(l, 5000, 10000, NULL);
        int64_t took = th_now_ms() - t0;
        if (took > m->longest && !atomic_load(&mix_stop)) m->longest = took; /* in the 3 s */
        if (rc != DLOCK_OK) {
            th_log("dlock client %d: %s: %s", m->id, dlock_strerror(rc), dlock_lock_errmsg(l));
            continue;
        }
        mix_hold();
        m->n++;
        ASSERT_LOK(l, dlock_release(l));
    }
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

static void *mix_redisson(void *arg)
{
    mixer *m = arg;
    redisContext *rc = th_redis(m->s), *sub = th_redis(m->s);
    char owner[64], ch[128];
    snprintf(owner, sizeof owner, "7e57%04d-0000-4000-8000-000000000000:%d", m->id, m->id);
    snprintf(ch, sizeof ch, "%s:%s", rkey("redisson_lock__channel", "rsn:mix"), owner);
    freeReplyObject(th_cmd(sub, "SUBSCRIBE %s", ch));
    rsn_fair f = {rc, "rsn:mix", owner, RSN_FAIR_WAIT_MS, 0};
    while (!atomic_load(&mix_stop)) {
        long long ttl = rf_acquire(&f, server_ms(rc));
        if (ttl >= 0) { /* wait for "0" on its channel, at most ttl (Redisson's latch) */
            struct pollfd pfd = {sub->fd, POLLIN, 0};
            if (poll(&pfd, 1, ttl > 100 ? 100 : (int)ttl) > 0) {
                void *msg = NULL;
                ASSERT_EQ(redisGetReply(sub, &msg), REDIS_OK);
                freeReplyObject(msg);
            }
            continue;
        }
        mix_hold();
        m->n++;
        ASSERT_EQ(rf_release(&f, server_ms(rc)), 1);
    }
    rf_give_up(&f);
    redisFree(sub);
    redisFree(rc);
    return NULL;
}

static void mixed_contention(const th_server *s)
{
    mixer m[MIX_DLOCK + MIX_RSN];
    pthread_t t[MIX_DLOCK + MIX_RSN];
    for (int i = 0; i < MIX_DLOCK + MIX_RSN; i++) {
        m[i] = (mixer){s, i, 0, 0};
        ASSERT_EQ(pthread_create(&t[i], NULL, i < MIX_DLOCK ? mix_dlock : mix_redisson, &m[i]),
                  0);
    }
    th_sleep_ms(MIX_MS);
    atomic_store(&mix_stop, 1);
    long total = 0;
    for (int i = 0; i < MIX_DLOCK + MIX_RSN; i++) {
        ASSERT_EQ(pthread_join(t[i], NULL), 0);
        total += m[i].n;
    }
    th_log("%d s of 3 dlock and 2 Redisson clients on one fair lock: dlock %ld %ld %ld, "
           "Redisson %ld %ld; dlock's longest waits %lld %lld %lld ms", MIX_MS / 1000, m[0].n,
           m[1].n, m[2].n, m[3].n, m[4].n, (long long)m[0].longest, (long long)m[1].longest,
           (long long)m[2].longest);
    ASSERT_GT(total, 50);
#ifdef __SANITIZE_THREAD__
    /* ThreadSanitizer slows each thread tenfold on a shared 2-core host: a
     * grant not taken up within DL_FAIR_GRANT_MS (500 ms) passes on by
     * design, and a thread held up that long loses its place; the shares
     * then say more about the scheduler than about the queue */
    for (int i = 0; i < MIX_DLOCK + MIX_RSN; i++) ASSERT_GT(m[i].n, 0);
#else
    for (int i = 0; i < MIX_DLOCK + MIX_RSN; i++)
        ASSERT_GE(m[i].n * 2 * (MIX_DLOCK + MIX_RSN), total); /* half a fair share at least */
#endif
}

int main(void)
{
    th_init("interop_redisson");
    th_server *s = th_server_start(NULL);
    redisContext *rc = th_redis(s);
    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, NAME, DLOCK_KIND_REENTRANT);

    /* 1. Redisson holds (twice): dlock is excluded and sees the holder */
    redisReply *r = rsn_acquire(rc, FIELD, 20000);
    ASSERT_EQ(r->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    r = rsn_acquire(rc, FIELD, 20000);
    ASSERT_EQ(r->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    dlock_info info;
    ASSERT_COK(c, dlock_inspect(c, NAME, DLOCK_CSTR, &info));
    ASSERT_EQ(info.kind, DLOCK_KIND_REENTRANT);
    ASSERT_STR_EQ(info.holder, FIELD);
    ASSERT_EQ(info.hold_count, 2);
    ASSERT_EQ(info.holders, 1);

    /* 2. a blocked dlock waiter wakes on Redisson's release message */
    waiter w = {c, -1, 0};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, wait_thread, &w), 0);
    th_wait_subscribers(rc, NAME, 1, 5000);
    ASSERT_EQ(rsn_release(rc, FIELD), 0); /* count 2 -> 1: still held */
    th_sleep_ms(200);
    ASSERT_EQ(th_cmd_int(rc, "HEXISTS %s %s", NAME, FIELD), 1); /* the waiter did not get in */
    int64_t t_rel = th_now_ms();
    ASSERT_EQ(rsn_release(rc, FIELD), 1);
    ASSERT_EQ(pthread_join(t, NULL), 0);
    ASSERT_CODE(w.rc, DLOCK_OK);
    th_log("dlock waiter had it %lld ms after Redisson's release (lease 20 s)",
           (long long)(w.t_got - t_rel));
    ASSERT_LT(w.t_got - t_rel, 2000);

    /* 3. dlock holds: Redisson is excluded (gets the PTTL), cannot release */
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, NULL));
    r = rsn_acquire(rc, FIELD, 20000);
    ASSERT_EQ(r->type, REDIS_REPLY_INTEGER);
    ASSERT_GT(r->integer, 10000);
    freeReplyObject(r);
    ASSERT_EQ(rsn_release(rc, FIELD), -1); /* not held */
    /* Redisson's renewal script recognises dlock's owner field */
    r = th_cmd(rc, "EVAL %s 1 %s 30000 %s", RENEW, NAME, dlock_lock_token(l));
    ASSERT_EQ(r->type, REDIS_REPLY_INTEGER);
    ASSERT_EQ(r->integer, 1);
    freeReplyObject(r);
    char *cnt = th_cmd_str(rc, "HGET %s %s", NAME, dlock_lock_token(l));
    ASSERT_STR_EQ(cnt, "1");
    free(cnt);

    /* 4. dlock's last release publishes "0" on the Redisson channel */
    redisContext *sub = th_redis(s);
    r = th_cmd(sub, "SUBSCRIBE redisson_lock__channel:{%s}", NAME);
    freeReplyObject(r);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, NULL)); /* re-enter: count 2 */
    ASSERT_LOK(l, dlock_release(l));                           /* 2 -> 1: no message */
    ASSERT_LOK(l, dlock_release(l));                           /* 1 -> 0: "0" */
    void *reply = NULL;
    ASSERT_EQ(redisGetReply(sub, &reply), REDIS_OK);
    r = reply;
    ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
    ASSERT_EQ(r->elements, 3);
    ASSERT_STR_EQ(r->element[0]->str, "message");
    ASSERT_STR_EQ(r->element[2]->str, "0");
    freeReplyObject(r);
    redisFree(sub);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", NAME), 0);

    /* 5. Redisson's force unlock (DEL + PUBLISH 0): the dlock holder finds out */
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, NULL));
    ASSERT_EQ(th_cmd_int(rc, "DEL %s", NAME), 1);
    th_cmd_ok(rc, "PUBLISH redisson_lock__channel:{%s} 0", NAME);
    ASSERT_LCODE(l, dlock_release(l), DLOCK_ELOST);

    /* 6. the fence counter is shared with RFencedLock, which INCRs it and
     * never expires it: dlock's tokens (max(counter + 1, the server's clock
     * in us)) stay above Redisson's and Redisson's above dlock's, and dlock
     * leaves no expiry on it (one would restart Redisson's tokens at 1) */
    uint64_t f = 0, f2 = 0;
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, &f));
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "PTTL redisson_lock_token:{%s}", NAME), -1);
    ASSERT_EQ(th_cmd_int(rc, "INCR redisson_lock_token:{%s}", NAME), (long long)f + 1);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, &f2));
    ASSERT_U64_GT(f2, f + 1);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "INCR redisson_lock_token:{%s}", NAME), (long long)f2 + 1);
    ASSERT_EQ(th_cmd_int(rc, "PTTL redisson_lock_token:{%s}", NAME), -1);
    /* a counter ahead of the clock: both count on by one */
    th_cmd_ok(rc, "SET redisson_lock_token:{%s} 8000000000001000", NAME);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, &f));
    ASSERT_U64_EQ(f, 8000000000001001ULL);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "INCR redisson_lock_token:{%s}", NAME), 8000000000001002LL);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 15000, &f));
    ASSERT_U64_EQ(f, 8000000000001003ULL);
    ASSERT_LOK(l, dlock_release(l));

    dlock_lock_free(l);

    /* 7. every object under Redisson's names, with and without a hash tag */
    static const char *const names[] = {"rsn:obj", "rsn:{t}:obj", "{rsn}obj", "rsn{open"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) object_names(s, c, rc, names[i]);

    /* 8. permit ids are Redisson's 16 raw bytes */
    permit_ids(c, rc);

    /* 9. the fair lock's stand-in */
    fair_standin(s, rc);

    /* 10. one fair queue shared by Redisson and dlock waiters */
    ASSERT_CCODE(c, dlock_client_set_fair_wait(c, 0), DLOCK_EINVAL);
    ASSERT_CCODE(c, dlock_client_set_fair_wait(c, ((int64_t)1 << 40) + 1), DLOCK_EINVAL);
    ASSERT(strstr(dlock_errmsg(c), "fair wait") != NULL);
    ASSERT_COK(c, dlock_client_set_fair_wait(c, DLOCK_REDISSON_FAIR_WAIT_MS));
    mixed_scores(s, rc);
    keep_place(s, rc);
    mixed_contention(s);

    dlock_client_free(c);
    redisFree(rc);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
