/* The fair lock: Redisson's RFairLock layout, with a direct handoff.
 *
 *   HASH  name                            field "<uuid>:<tid>" = hold count (as RLock)
 *   LIST  redisson_lock_queue:{name}      waiting owners, in arrival order
 *   ZSET  redisson_lock_timeout:{name}    waiting owner -> deadline (ms)
 *   HASH  redisson_lock_lease:{name}      dlock's own: waiting owner -> requested lease
 *                                         (ms) (Redisson ignores it)
 *   channel redisson_lock__channel:{name}:<uuid>:<tid>   one per waiter
 *
 * The lock goes to the queue head; a newcomer never jumps a live queue.
 * Deadlines follow Redisson's arithmetic (RedissonFairLock, 4.7), with W the
 * thread wait time (dlock_client_set_fair_wait; Redisson's
 * fairLockWaitTimeout): a waiter joins behind the tail with the tail's
 * deadline + W, or, with no tail, the lock's PTTL + now + W (the PTTL as
 * Redis answers it: -2 for a free lock, -1 for one without expiry), heads
 * whose deadline passed dropped first; every acquire (a free lock taken, a
 * grant taken up) lowers every queued deadline by the acquirer's W. A
 * Redisson waiter's entry never changes otherwise. A dlock waiter's later
 * attempts also raise its own deadline to now + W when it fell below: it
 * comes back at least every min(W, DL_FAIR_WAIT_MS) / 3 ms, so a live waiter
 * never expires, while one that stopped coming back is dropped from the head
 * once its deadline passed. In a queue of Redisson and dlock waiters with the
 * same W, each side's entries thus carry the deadlines a Redisson waiter's
 * would, and none is swept as stale while its owner waits.
 *
 * Clock: the deadlines are read and written with the server's TIME inside
 * the scripts (Redis 7 replicates script effects, so TIME is allowed before
 * writes). All dlock clients thus share one clock; Redisson writes its
 * waiters' scores with its client clock (System.currentTimeMillis()), which
 * agrees with the server's as far as the hosts' clocks agree (NTP). The
 * stacked deadlines are differences of scores plus W (a tail's deadline +
 * W), so a skew only shifts the deadlines of entries whose base was read
 * from a clock: it decides when a head counts as stale, never the order.
 *
 * Handoff: when the last hold is released and the queue head is a dlock
 * waiter that listens on its channel (it registered its lease in the lease
 * hash, and PUBSUB NUMSUB of its channel is not 0), the release script
 * grants it the lock provisionally (field = 1, PEXPIRE DL_FAIR_GRANT_MS,
 * INCR the fence counter, pop it from the queue) and publishes
 * "granted:<fence>" on its channel. The waiter takes the grant up with one
 * attempt, which finds its field and sets the lease it asked for; a grant not
 * taken up within DL_FAIR_GRANT_MS (the head is paused, or hung, or dead
 * behind a connection that stays open) runs out on the server, and the next
 * two waiters, told "next:<ms>" at the grant, come back then and the first
 * of them alive takes the lock.
 * Whether a waiter listens is read with NUMSUB, not from PUBLISH's count,
 * which pattern subscribers (a monitoring tool's PSUBSCRIBE *) inflate. A
 * head that listened and no longer does is dead: it is dropped at once and
 * the next head tried. A head making its first attempt (before it
 * subscribed) is "joining" (its lease is stored negative) and stays the head
 * while its deadline lasts (its next attempt takes the lock). A head without
 * a registered lease (a Redisson waiter) gets Redisson's plain wake-up "0" on
 * its channel instead, and stays the head while its deadline lasts.
 *
 * Taking the grant up costs the new owner one round trip after the message
 * (docs/benchmarks.md): the message alone cannot tell a waiter that is alive
 * from one that was paused before the grant and resumed after it passed on,
 * and a grant of the full lease would let a paused head stall the queue for
 * that lease.
 *
 * A handoff can race the waiter: its next attempt may run before it reads the
 * message, and it may give up before reading it. Both are told by the owner
 * field itself: an attempt of the same acquire call that finds the owner's
 * field set takes the grant instead of counting a re-entry, and an abandon
 * that finds it gives the lock back. (The owner is this client and thread,
 * blocked in that call, so no other handle of it can hold the lock then.)
 */
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

/* The default W, and the longest a waiter stays away: a third of this or of
 * W, whichever is less (it also comes back when told). */
#define DL_FAIR_WAIT_MS DLOCK_DEFAULT_FAIR_WAIT_MS

/* How long a grant waits to be taken up: the release makes the queue head
 * the owner for this long (FAIR_LUA_ADVANCE); the head's next attempt sets
 * its own lease. A head that does not take it up in time (paused, hung, or
 * dead behind an open connection) loses it to the next waiters, which the
 * grant told to come back then. Far above the time a live waiter needs to
 * read the message and send its attempt (well under a millisecond idle, tens
 * of milliseconds on a loaded host), far below the queue entry lifetime and
 * any usual lease: the longest a paused head stalls the queue. */
#define DL_FAIR_GRANT_MS 500

/* Common Lua. KEYS[1] lock, KEYS[2] fence counter, KEYS[3] queue,
 * KEYS[4] deadlines, KEYS[5] leases.
 *
 * Every redis.call costs the server about 1 us when warm and 2 to 3 us right
 * after it woke up, which is when a release runs: the scripts read the clock
 * and clean the queue only when a queue head exists (an attempt: only when
 * the lock is free, too), and the release's
 * handoff is 10 calls (the plain release is 3). The snippets are pasted
 * inline, not defined as Lua functions (DL_LUA_WAKE_ONE): a function is a
 * closure built at every run, which an idle server pays for on every
 * handoff (docs/benchmarks.md, "Server time"). */

/* After a waiter wrote its entry: the queue's keys expire W after the
 * latest deadline in it, so that the entries of waiters that died or gave
 * up without leaving (a frozen link) go with their keys once nobody waits,
 * not at the next acquire of the name, which may never come. Every dlock
 * waiter's attempt pushes the expiry on; a Redisson waiter's entry keeps the
 * keys as long as dlock waiters come back, and is written again by its own
 * next attempt if they expired under it (it only loses its place). */
#define FAIR_LUA_EXPIRE                                                                \
    "do local last = redis.call('zrange', KEYS[4], -1, -1, 'WITHSCORES') "              \
    "local e = math.floor((tonumber(last[2]) or d) - now + W) "                          \
    "if e < W then e = W end "                                                           \
    "redis.call('pexpire', KEYS[3], e); redis.call('pexpire', KEYS[4], e); "            \
    "redis.call('pexpire', KEYS[5], e) end "

/* The server's clock in ms, into the existing local var. */
#define FAIR_LUA_CLOCK(var)                                                            \
    "do local tm = redis.call('time') "                                                \
    var " = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000) end "

/* h (a Lua expression, a queue entry) is a dlock waiter that listened and
 * has no subscription now: its connection is gone (SUBSCRIBE counts in
 * NUMSUB, a pattern subscriber does not). ARGV[8]: channel prefix. */
#define FAIR_LUA_GONE(h)                                                               \
    "(tonumber(redis.call('hget', KEYS[5], " h ")) or -1) > 0 and "                    \
    "redis.call('pubsub', 'numsub', ARGV[8] .. ':' .. " h ")[2] == 0"

/* h (a local, the queue head just read, not nil): when its deadline passed
 * (or it has none), or it is a dlock waiter that listened and no longer does
 * (FAIR_LUA_GONE), the dead heads are dropped and h becomes the live head,
 * or nil when the queue empties. now: the clock in ms; me: the attempt's
 * owner (alive by definition). */
#define FAIR_LUA_LIVE(h)                                                               \
    "do local d = tonumber(redis.call('zscore', KEYS[4], " h ")) "                     \
    "if not (d and d > now and not (" h " ~= me and " FAIR_LUA_GONE(h) ")) then "      \
    "while true do "                                                                   \
    h " = redis.call('lindex', KEYS[3], 0) "                                           \
    "if not " h " then break end "                                                     \
    "d = tonumber(redis.call('zscore', KEYS[4], " h ")) "                              \
    "if d and d > now and not (" h " ~= me and " FAIR_LUA_GONE(h) ") then break end "  \
    "redis.call('lpop', KEYS[3]); redis.call('zrem', KEYS[4], " h "); "                \
    "redis.call('hdel', KEYS[5], " h ") end end end "

/* The lock was deleted: hand it to the head of the queue (a dlock waiter
 * that listens), or wake the head (a Redisson waiter). h: a local, the head
 * just popped from the queue (LPOP: one call fewer than LINDEX then LPOP; a
 * head that stays is pushed back), or nil. ARGV[1]: channel prefix.
 *
 * A dlock head that listens (PUBSUB NUMSUB of its own channel: its
 * subscription, not a pattern subscriber's, which PUBLISH would count too)
 * is granted the lock provisionally: owner field = 1, PEXPIRE of
 * DL_FAIR_GRANT_MS (its lease, if shorter), "granted:<fence>" on its
 * channel. It takes the grant up with its next attempt, which finds its
 * field and sets its own lease; a head that is paused or hung (connected,
 * subscribed, not acting) does not, and the server expires the grant
 * DL_FAIR_GRANT_MS later. The next two dlock waiters are told "next:<ms>"
 * at the grant, so that they come back when an untaken grant has run out and
 * the first of them alive takes the lock (its attempt drops the queue's dead
 * heads, FAIR_LUA_LIVE): the queue stalls past the grant only when the head
 * and both of them fail within one grant; then the waiters behind come back
 * on their own, within a third of W. A dlock head that does not listen is
 * dead (its connection is gone) and dropped, unless it is joining (its lease
 * is stored negative: its first attempt, made before it subscribed), which
 * stays the head once: its next attempt, right after it subscribed, takes the
 * lock; its lease is stored positive, so that a joining head that died is
 * dropped by the next look at the head (an attempt, FAIR_LUA_LIVE, or a
 * release), not kept for its whole deadline, which Redisson's stacked
 * arithmetic can put many seconds ahead.
 * A head without a registered lease (a Redisson waiter) stays the head while
 * its deadline lasts and gets Redisson's plain wake-up "0". A head kept that
 * was the queue's last entry re-creates the queue (its LPOP deleted the key):
 * it takes the deadlines' expiry (FAIR_LUA_EXPIRE), if they have one, or the
 * queue would stay after its waiters died. The clock is read
 * only for heads that are not granted. Each call saved counts: the handoff
 * runs on a server that was idle (docs/benchmarks.md, "Server time"). The
 * grant carries the counter as GET returns it: the same number as f, without
 * a string.format('%d', f). A granted owner's entry
 * in the lease hash stays (it is rewritten if it queues again, and the hash
 * goes with the queue). A head no fencing token can be had for (no clock,
 * and a counter INCR cannot count on: DL_LUA_FENCE) is not granted: it stays
 * the head and is woken with "0", so the release (or the attempt) that
 * hands over completes, and the head's own attempt fails holding nothing. */
#define FAIR_LUA_ADVANCE(h, pfx)                                                      \
    "while " h " do "                                                                  \
    "local ch = " pfx " .. ':' .. " h " "                                              \
    "local lease = tonumber(redis.call('hget', KEYS[5], " h ")) "                      \
    "local keep = not lease "                                                          \
    "if lease then if lease < 0 then lease, keep = -lease, true end "                  \
    "if redis.call('pubsub', 'numsub', ch)[2] > 0 then "                               \
    DL_LUA_FENCE_TRY("f", "KEYS[2]")                                                   \
    "if not f then redis.call('lpush', KEYS[3], " h ") "                               \
    "redis.call('publish', ch, '0') break end "                                        \
    "redis.call('zrem', KEYS[4], " h "); redis.call('hset', KEYS[1], " h ", 1) "       \
    "redis.call('pexpire', KEYS[1], math.min(lease, " DL_STR(DL_FAIR_GRANT_MS) ")) "   \
    "redis.call('publish', ch, 'granted:' .. redis.call('get', KEYS[2])) "             \
    "for _, n in ipairs(redis.call('lrange', KEYS[3], 0, 1)) do "                      \
    "if redis.call('hexists', KEYS[5], n) == 1 then "                                  \
    "redis.call('publish', " pfx " .. ':' .. n, 'next:" DL_STR(DL_FAIR_GRANT_MS) "') end end " \
    "break end end "                                                                   \
    "if keep then local now = 0 " FAIR_LUA_CLOCK("now")                                \
    "local d = tonumber(redis.call('zscore', KEYS[4], " h ")) "                        \
    "if d and d > now then redis.call('lpush', KEYS[3], " h ") "                       \
    "if redis.call('pttl', KEYS[3]) == -1 then local t = redis.call('pttl', KEYS[4]) " \
    "if t > 0 then redis.call('pexpire', KEYS[3], t) end end "                         \
    "if lease then redis.call('hset', KEYS[5], " h ", lease) "                         \
    "else redis.call('publish', ch, '0') end break end end "                           \
    "redis.call('zrem', KEYS[4], " h "); redis.call('hdel', KEYS[5], " h ") "          \
    h " = redis.call('lpop', KEYS[3]) end "                                            \
    "if not " h " then redis.call('del', KEYS[5]) end "

/* Every queued deadline lowered by W (a local): Redisson's rule on every
 * acquire. */
#define FAIR_LUA_LOWER                                                                 \
    "for _, o in ipairs(redis.call('zrange', KEYS[4], 0, -1)) do "                     \
    "redis.call('zincrby', KEYS[4], -W, o) end "

/* ARGV: lease ms, owner, mode ('r': a new call or a re-entry, 'w': this call
 * queued before), queue ('1' join/refresh the queue, '0' try once), W ms,
 * keep-alive ms, joining ('1': not subscribed yet, the lease is stored
 * negative), channel prefix.
 * -> {1, fence, holds} acquired | {0, ms to wait at most}
 *
 * An owner field found in 'w' mode is a grant (FAIR_LUA_ADVANCE) being taken
 * up: the owner is this client and thread, which is blocked in this call, so
 * no other handle of it can have taken the lock meanwhile. The lock is taken
 * with the fence of that grant (nothing can have moved the counter while it
 * is held), and the lease set from the grant's DL_FAIR_GRANT_MS to the one
 * asked for, running from this attempt.
 *
 * The queue head is read (and dead heads dropped) only when the lock is
 * free: while it is held, an attempt just joins or refreshes the queue (8
 * calls, not 10); the release that frees it drops dead heads
 * (FAIR_LUA_ADVANCE). A lock that came free without a release (its holder
 * died, its lease ran out) has granted nobody: an attempt that finds it free
 * with a live head other than itself grants that head as a release would
 * (FAIR_LUA_ADVANCE: provisionally, the next two waiters told), so that a
 * head paused or hung then costs the queue one grant, not the head's whole
 * deadline, and comes back when that grant has run out. Under contention this is the attempt of the process
 * that has just released and queues again, which the server runs while the
 * next owner starts its critical section. */
dl_script dl_script_fair_acquire = DL_SCRIPT("fair_acquire",
    "local me, W = ARGV[2], tonumber(ARGV[5]) "
    "if redis.call('hexists', KEYS[1], me) == 1 then "
    DL_LUA_RAISE_TTL("KEYS[1]", "ARGV[1]")
    "if ARGV[3] == 'w' then " FAIR_LUA_LOWER
    "return {1, tonumber(redis.call('get', KEYS[2])), "
    "tonumber(redis.call('hget', KEYS[1], me))} end "
    "local n = redis.call('hincrby', KEYS[1], me, 1) "
    "if redis.call('zrem', KEYS[4], me) == 1 then redis.call('lrem', KEYS[3], 0, me) end "
    "redis.call('hdel', KEYS[5], me) "
    DL_LUA_FENCE("f", "KEYS[2]")
    "return {1, f, n} end "
    "local p = redis.call('pttl', KEYS[1]) "
    "local head, now = nil, nil "
    "if p == -2 then head = redis.call('lindex', KEYS[3], 0) "
    "if head then " FAIR_LUA_CLOCK("now") FAIR_LUA_LIVE("head") "end "
    "if not head or head == me then "
    "if head then redis.call('lpop', KEYS[3]); redis.call('zrem', KEYS[4], me); "
    "redis.call('hdel', KEYS[5], me) " FAIR_LUA_LOWER "end "
    "redis.call('hset', KEYS[1], me, 1); redis.call('pexpire', KEYS[1], ARGV[1]) "
    DL_LUA_FENCE("f", "KEYS[2]")
    "return {1, f, 1} end end "
    "if not now then " FAIR_LUA_CLOCK("now") "end "
    "local ka = tonumber(ARGV[6]) "
    "if ARGV[4] == '1' then "
    "local d = tonumber(redis.call('zscore', KEYS[4], me)) "
    "if d then if d < now + W then d = now + W end "
    "else "
    "if p ~= -2 then local h = redis.call('lindex', KEYS[3], 0) "
    "if h then " FAIR_LUA_LIVE("h") "end end "
    "local t = redis.call('lindex', KEYS[3], -1) "
    "d = t and t ~= me and tonumber(redis.call('zscore', KEYS[4], t)) "
    "d = (d or p + now) + W "
    "redis.call('rpush', KEYS[3], me) end "
    "redis.call('zadd', KEYS[4], d, me) "
    "redis.call('hset', KEYS[5], me, ARGV[7] == '1' and -tonumber(ARGV[1]) or ARGV[1]) "
    FAIR_LUA_EXPIRE "end "
    "if p == -2 and head and head ~= me then "
    "local h = redis.call('lpop', KEYS[3]) " FAIR_LUA_ADVANCE("h", "ARGV[8]")
    "if redis.call('exists', KEYS[1]) == 1 then return {0, " DL_STR(DL_FAIR_GRANT_MS) " + 1} end end "
    "if p == -2 then "
    "local d = head and tonumber(redis.call('zscore', KEYS[4], head)) "
    "if d then p = d - now + 1 else p = ka end "
    "elseif p < 0 then p = ka end "
    "if p > ka then p = ka end "
    "return {0, p}");

/* ARGV: channel prefix, lease ms, owner, the owner's count expected before
 * this release ('': not known; a count below it: this release was counted
 * already, a copy of its request).
 * -> -1 not held | 0 still held (count > 0) | 1 released */
dl_script dl_script_fair_release = DL_SCRIPT("fair_release",
    "local v = redis.pcall('hget', KEYS[1], ARGV[3]) "
    "if type(v) ~= 'string' then return -1 end "
    "if ARGV[4] ~= '' and tonumber(v) < tonumber(ARGV[4]) then return 0 end "
    "if tonumber(v) > 1 then redis.call('hincrby', KEYS[1], ARGV[3], -1) "
    DL_LUA_RAISE_TTL("KEYS[1]", "ARGV[2]") "return 0 end "
    "local h = redis.call('lpop', KEYS[3]) "
    "if not h then redis.call('del', KEYS[1], KEYS[5]); return 1 end "
    "redis.call('del', KEYS[1]) "
    FAIR_LUA_ADVANCE("h", "ARGV[1]")
    "return 1");

/* A waiter gives up (it holds nothing through this handle). ARGV: channel
 * prefix, owner.
 * -> 1 the lock had been handed to it (given back) | 0 left the queue
 * An owner field found here is a handoff that came after the waiter gave up
 * (or an attempt whose reply was lost): the lock is given back. */
dl_script dl_script_fair_abandon = DL_SCRIPT("fair_abandon",
    "local me = ARGV[2] "
    "local res, go = 0, false "
    "if redis.pcall('hexists', KEYS[1], me) == 1 then res = 1 "
    "if redis.call('hincrby', KEYS[1], me, -1) <= 0 then redis.call('del', KEYS[1]); go = true end "
    "else local head = redis.call('lindex', KEYS[3], 0) "
    "redis.call('lrem', KEYS[3], 0, me); redis.call('zrem', KEYS[4], me) "
    "redis.call('hdel', KEYS[5], me) "
    "go = head == me and redis.call('exists', KEYS[1]) == 0 end "
    "if go then local h = redis.call('lpop', KEYS[3]) " FAIR_LUA_ADVANCE("h", "ARGV[1]") "end "
    "return res");

/* KEYS: lock. ARGV: owner field, lease ms. -> 1 extended | 0 not ours */
dl_script dl_script_fair_extend = DL_SCRIPT("fair_extend",
    "if redis.pcall('hexists', KEYS[1], ARGV[1]) == 1 then "
    DL_LUA_RAISE_TTL("KEYS[1]", "ARGV[2]") "return 1 end return 0");

/* Watchdog. KEYS: locks. ARGV: lease ms, owner field per key. */
static dl_script renew_script = DL_SCRIPT("fair_renew",
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "if redis.pcall('hexists', key, ARGV[i + 1]) == 1 then "
    DL_LUA_RAISE_TTL("key", "ARGV[1]") "res[i] = 1 else res[i] = 0 end end "
    "return res");

typedef struct fair_data {
    char *queue, *timeouts, *leases, *chan; /* chan: redisson_lock__channel:{name} */
    size_t queue_len, timeouts_len, leases_len, chan_len;
    int queued;        /* this acquire call joined the queue */
    int waiting;       /* the attempt under way waits (joins the queue) */
} fair_data;

static void fair_destroy(dlock_lock *l) {
    fair_data *d = l->kind_state;
    if (!d) return;
    free(d->queue);
    free(d->timeouts);
    free(d->leases);
    free(d->chan);
    free(d);
    l->kind_state = NULL;
}

static int fair_init(dlock_lock *l, dl_err *err) {
    fair_data *d = calloc(1, sizeof *d);
    if (!d) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    l->kind_state = d;
    d->queue = dl_derive_key("redisson_lock_queue:", l->h.name, l->h.name_len, "", &d->queue_len);
    d->timeouts =
        dl_derive_key("redisson_lock_timeout:", l->h.name, l->h.name_len, "", &d->timeouts_len);
    d->leases = dl_derive_key("redisson_lock_lease:", l->h.name, l->h.name_len, "", &d->leases_len);
    d->chan = dl_derive_key("redisson_lock__channel:", l->h.name, l->h.name_len, "", &d->chan_len);
    /* the per-owner channel is set by fair_owner; until then, the common one */
    l->h.channel =
        dl_derive_key("redisson_lock__channel:", l->h.name, l->h.name_len, "", &l->h.channel_len);
    if (!d->queue || !d->timeouts || !d->leases || !d->chan || !l->h.channel)
        return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

/* The owner "<uuid>:<tid>" and its channel "redisson_lock__channel:{name}:<owner>". */
static int fair_owner(dlock_lock *l, dl_err *err) {
    fair_data *d = l->kind_state;
    int rc = dl_owner_thread(l, err);
    if (rc) return rc;
    size_t len = d->chan_len + 1 + l->token_len;
    char *ch = malloc(len + 1);
    if (!ch) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    memcpy(ch, d->chan, d->chan_len);
    ch[d->chan_len] = ':';
    memcpy(ch + d->chan_len + 1, l->token, l->token_len);
    ch[len] = '\0';
    free(l->h.channel);
    l->h.channel = ch;
    l->h.channel_len = len;
    d->queued = 0;
    return DLOCK_OK;
}

/* The fair lock's calls. The acquire's mode is "r" (re-entry, or not yet
 * queued: the queue is not looked at) or "w" (a queued waiter's attempt);
 * an attempt made before the subscription joins as "joining", which a
 * release does not take for dead. */
static void fair_call(dlock_lock *l, int op, int64_t lease_ms, dl_call *call) {
    fair_data *d = l->kind_state;
    dl_call_start(call);
    size_t ll = dl_fmt_ll(call->num, lease_ms);
    const char *keys[5] = {l->h.name, l->fence_key, d->queue, d->timeouts, d->leases};
    size_t keylens[5] = {l->h.name_len, l->fence_key_len, d->queue_len, d->timeouts_len,
                         d->leases_len};
    memcpy(call->keys, keys, sizeof keys);
    memcpy(call->keylens, keylens, sizeof keylens);
    call->nkeys = 5;
    switch (op) {
    case DL_OP_ACQUIRE: { /* ARGV lease, owner, mode, queue, life, keep-alive, joining, channel */
        int64_t w = (int64_t)atomic_load(&l->h.c->fair_wait_ms);
        size_t lifel = dl_fmt_ll(call->num2, w);
        size_t kal = dl_fmt_ll(call->num3, (w < DL_FAIR_WAIT_MS ? w : DL_FAIR_WAIT_MS) / 3);
        const char *mode = (l->holds > 0 || !d->queued) ? "r" : "w";
        const char *args[8] = {call->num, l->token, mode, d->waiting ? "1" : "0", call->num2,
                               call->num3, l->listening ? "0" : "1", d->chan};
        size_t arglens[8] = {ll, l->token_len, 1, 1, lifel, kal, 1, d->chan_len};
        call->script = &dl_script_fair_acquire;
        memcpy(call->args, args, sizeof args);
        memcpy(call->arglens, arglens, sizeof arglens);
        call->nargs = 8;
        break;
    }
    case DL_OP_RELEASE: /* ARGV channel, lease, owner, expected count */
        call->script = &dl_script_fair_release;
        call->args[0] = d->chan, call->arglens[0] = d->chan_len;
        call->args[1] = call->num, call->arglens[1] = ll;
        call->args[2] = l->token, call->arglens[2] = l->token_len;
        call->args[3] = call->expect, call->arglens[3] = dl_owner_expect(l, call->expect);
        call->nargs = 4;
        /* the grant reaches the next owner before our reply reaches us */
        call->opts = DL_EVAL_PING_FIRST;
        break;
    default: /* extend: KEYS lock; ARGV owner, lease */
        call->script = &dl_script_fair_extend;
        call->nkeys = 1;
        call->args[0] = l->token, call->arglens[0] = l->token_len;
        call->args[1] = call->num, call->arglens[1] = ll;
        call->nargs = 2;
        break;
    }
}

/* One attempt: a waiting caller (wait_ms != 0) joins the queue. */
static int fair_attempt(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms,
                        dl_outcome *t, dl_err *err) {
    fair_data *d = l->kind_state;
    d->waiting = wait_ms != 0;
    int rc = dl_call_attempt(l, conn, lease_ms, wait_ms, t, err);
    if (!rc && t->acquired) d->queued = 0;
    else if (!rc && d->waiting) d->queued = 1;
    d->waiting = 0;
    return rc;
}

/* A message on the waiter's channel. "granted:<fence>": the release made this
 * waiter the owner for DL_FAIR_GRANT_MS; the attempt that follows at once
 * takes the grant up (it finds the owner field and sets the lease) or learns
 * that it ran out. The message alone proves nothing: it may have sat unread
 * while this process was paused and the grant passed on. "next:<ms>": the
 * waiter ahead was just granted the lock; come back in <ms> (when an untaken
 * grant has run out) rather than at once. Anything else (Redisson's "0"):
 * try again now. */
static int fair_message(dlock_lock *l, const redisReply *msg, dl_outcome *t) {
    (void)l;
    static const char pfx[] = "next:";
    const size_t plen = sizeof pfx - 1;
    if (msg->type != REDIS_REPLY_STRING || msg->len <= plen || msg->len > plen + 9 ||
        memcmp(msg->str, pfx, plen) != 0)
        return 0;
    int64_t ms = 0;
    for (size_t i = plen; i < msg->len; i++) {
        unsigned char ch = (unsigned char)msg->str[i];
        if (ch < '0' || ch > '9') return 0;
        ms = ms * 10 + (ch - '0');
    }
    t->pttl = ms;
    return -1;
}

static int run_script(dlock_lock *l, dl_conn *conn, int opts, dl_script *s, int nargs,
                      const char **args, const size_t *arglens, const char *what, long long *res,
                      dl_err *err) {
    fair_data *d = l->kind_state;
    const char *keys[5] = {l->h.name, l->fence_key, d->queue, d->timeouts, d->leases};
    size_t keylens[5] = {l->h.name_len, l->fence_key_len, d->queue_len, d->timeouts_len,
                         d->leases_len};
    redisReply *r = NULL;
    int rc = dl_eval_opt(conn, dl_cmd_deadline(l->h.c), opts, s, 5, keys, keylens, nargs, args,
                         arglens, &r, err);
    if (!rc) rc = dl_reply_expect_int(r, what, res, err);
    if (r) freeReplyObject(r);
    return rc;
}

static void fair_abandon(dlock_lock *l, dl_conn *conn) {
    fair_data *d = l->kind_state;
    const char *args[2] = {d->chan, l->token};
    size_t arglens[2] = {d->chan_len, l->token_len};
    long long res = 0;
    dl_err ignored = {0};
    run_script(l, conn, 0, &dl_script_fair_abandon, 2, args, arglens, "abandon", &res, &ignored);
    d->queued = 0;
}

static int fair_check(dlock_lock *l, dl_conn *conn, int *held, int64_t *count, dl_err *err) {
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

const dl_kind_ops dl_fair_ops = {
    .kind = DLOCK_KIND_FAIR,
    .name = "fair",
    .reentrant = 1,
    .own_channel = 1,
    .init = fair_init,
    .destroy = fair_destroy,
    .owner = fair_owner,
    .attempt = fair_attempt,
    .message = fair_message,
    .abandon = fair_abandon,
    .release = dl_call_release,
    .extend = dl_call_extend,
    .check = fair_check,
    .renew = &renew_script,
    .call = fair_call,
    /* the queue's order is one server's: independent masters would each
     * grant their own head, and the grant is one master's message */
    .one_server = 1,
};

int dlock_client_set_fair_wait(dlock_client *c, int64_t wait_ms) {
    if (!c) return DLOCK_EINVAL;
    if (!(c->backend->kinds & (1u << DLOCK_KIND_FAIR)))
        return dl_client_fail(c, &(dl_err){DLOCK_ENOTSUP, "the fair lock is Redis's: no fair "
                                                          "wait time to set on this backend"});
    if (wait_ms < 1 || wait_ms > ((int64_t)1 << 40)) {
        dl_err err = {0};
        dl_seterr(&err, DLOCK_EINVAL, "fair wait time must be 1 ms to 2^40 ms (got %lld)",
                  (long long)wait_ms);
        return dl_client_fail(c, &err);
    }
    atomic_store(&c->fair_wait_ms, (long long)wait_ms);
    dl_client_ok(c);
    return DLOCK_OK;
}
