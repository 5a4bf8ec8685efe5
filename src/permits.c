/* The permit-expirable semaphore (Redisson RPermitExpirableSemaphore
 * layout): STRING `name` holds the available permits, ZSET "{name}:timeout"
 * maps each permit out on lease to its expiry in ms. A permit id is 16
 * random bytes, stored raw in the ZSET as Redisson stores them; the API
 * shows them as 32 hex characters (as Redisson's does) and decodes them
 * before every script, so a permit taken by either client can be released
 * or renewed by the other given its id. Every script first returns the expired permits to the pool
 * (ZREMRANGEBYSCORE up to now, INCRBY that many), so a holder that died
 * loses its permits after their lease instead of leaking them; when that
 * frees permits, the new count is published on "redisson_sc:{name}" like a
 * release, so waiters of any client retry.
 *
 * CLOCK: expiries are on the Redis server's clock (TIME, read inside each
 * script), so every client compares them against the same clock and client
 * clock skew cannot shorten or stretch a lease. (Redisson writes expiries
 * from its own client clock; a mixed deployment is only as exact as the
 * clocks agree.) Local waiting still uses the monotonic clock: a waiter is
 * told how many ms remain until the earliest expiry and sleeps that long.
 *
 * Permits taken with DLOCK_WATCHDOG are renewed by the client's watchdog
 * through a generic dl_lease each (key: the ZSET, owner: the permit id). The
 * handle keeps a record of every permit it holds, watchdog or explicit lease,
 * with what dlock_permits_valid_ms needs: the monotonic time just before the
 * request that started the lease (for a watchdog permit, its last confirmed
 * renewal). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kinds.h"


/* ---- scripts: KEYS[1] = name, KEYS[2] = {name}:timeout, KEYS[3] = channel ---- */

/* now: server time in ms. reclaim(): returns expired permits to the pool and
 * answers how many. wake(back): publishes the count if permits came back and
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
    "local n = redis.call('zremrangebyscore', KEYS[2], '-inf', ms(now)) "                     \
    "if n > 0 then redis.call('incrby', KEYS[1], n) end "                                     \
    "return n end "                                                                           \
    "local function wake(back) "                                                              \
    "if back > 0 then local v = value() "                                                     \
    "if v > 0 then redis.call('publish', KEYS[3], v) end end end "

/* ARGV: id, lease ms. -> {1, 0} taken | {0, ms until the earliest lease
 * expires, or -1 when none is out} */
static dl_script acquire_script = DL_SCRIPT("permits_acquire",
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
    "local left = tonumber(first[2]) - now "
    "if left < 0 then left = 0 end "
    "return {0, left} end "
    "return {0, -1}");

/* ARGV: id. -> 1 released | 0 not out on lease (expired, or never issued) */
static dl_script release_script = DL_SCRIPT("permits_release",
    PERMITS_PRELUDE
    "local back = reclaim() "
    "if redis.call('zrem', KEYS[2], ARGV[1]) == 1 then "
    "local v = redis.call('incrby', KEYS[1], 1) "
    "redis.call('publish', KEYS[3], v) "
    "return 1 end "
    "wake(back) "
    "return 0");

/* ARGV: id, lease ms. -> 1 renewed | 0 gone */
static dl_script renew_script = DL_SCRIPT("permits_renew",
    PERMITS_PRELUDE
    "wake(reclaim()) "
    "local s = redis.call('zscore', KEYS[2], ARGV[1]) "
    "if s then "
    "if tonumber(s) < now + tonumber(ARGV[2]) then "
    "redis.call('zadd', KEYS[2], 'XX', ms(now + tonumber(ARGV[2])), ARGV[1]) end "
    "return 1 end "
    "return 0");

/* -> the available permits */
static dl_script available_script = DL_SCRIPT("permits_available",
    PERMITS_PRELUDE
    "wake(reclaim()) "
    "return value()");

/* ARGV: permits. -> 1 set | 0 exists already */
static dl_script try_set_script = DL_SCRIPT("permits_try_set",
    "if redis.call('set', KEYS[1], ARGV[1], 'NX') then "
    "redis.call('publish', KEYS[3], ARGV[1]) return 1 end "
    "return 0");

/* ARGV: delta. -> the new count */
static dl_script add_script = DL_SCRIPT("permits_add",
    PERMITS_PRELUDE
    "reclaim() "
    "local v = redis.call('incrby', KEYS[1], ARGV[1]) "
    "redis.call('publish', KEYS[3], v) "
    "return v");

/* Watchdog, the dl_lease convention: KEYS[i] = {name}:timeout, ARGV[1] =
 * lease ms, ARGV[1 + i] = permit id. Renews only permits still out and not
 * yet expired on the server's clock (an expired one is returned to the pool
 * by the next operation: it is lost). -> {1 renewed | 0 gone, ...} */
static dl_script wd_renew_script = DL_SCRIPT("permits_wd_renew",
    "local t = redis.call('time') "
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "local exp = string.format('%.0f', now + tonumber(ARGV[1])) "
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "local s = redis.pcall('zscore', key, ARGV[i + 1]) "
    "if type(s) == 'string' and tonumber(s) > now then "
    "if tonumber(s) < tonumber(exp) then redis.call('zadd', key, 'XX', exp, ARGV[i + 1]) end "
    "res[i] = 1 "
    "else res[i] = 0 end end "
    "return res");

/* ---- handles ---- */

#define ID_RAW (DLOCK_PERMIT_ID_LEN / 2)

typedef struct wd_permit {
    struct wd_permit *next;
    char id[DLOCK_PERMIT_ID_LEN + 1]; /* hex, as issued */
    char raw[ID_RAW];                 /* the ZSET member */
    int watchdog;              /* 1: renewed by the client's watchdog through lease */
    dl_lease lease;            /* registered with the watchdog while in the list */
    int64_t expires_at;        /* explicit lease: monotonic ms it surely lasts until */
    dlock_permits *owner;
} wd_permit;

struct dlock_permits {
    dl_object o;               /* client, name, channel, message */
    char *zkey;                /* {name}:timeout */
    size_t zkey_len;
    wd_permit *wd;             /* the permits this handle holds (see the top) */
    dlock_permit_lost_fn lost_fn; /* read by the watchdog, under its mutex */
    void *lost_ud;
};

/* The watchdog found a permit lost (its thread, its mutex held). */
static void permit_lost(dl_lease *lease, int reason) {
    wd_permit *w = (wd_permit *)((char *)lease - offsetof(wd_permit, lease));
    dlock_permits *p = w->owner;
    if (p->lost_fn) p->lost_fn(p, w->id, reason, p->lost_ud);
}

typedef struct lost_set {
    dlock_permits *p;
    dlock_permit_lost_fn fn;
    void *ud;
} lost_set;

static void set_lost(void *arg) {
    lost_set *s = arg;
    s->p->lost_fn = s->fn;
    s->p->lost_ud = s->ud;
}

void dlock_permits_on_lost(dlock_permits *p, dlock_permit_lost_fn fn, void *userdata) {
    if (!p) return;
    lost_set s = {p, fn, userdata};
    dl_watchdog_locked(p->o.h.c, set_lost, &s);
}

static int pm_fail(dlock_permits *p, const dl_err *err) { return dl_handle_fail(&p->o.h, err); }

static int pm_ok(dlock_permits *p) { return dl_handle_ok(&p->o.h); }

int dlock_permits_new(dlock_client *c, const char *name, size_t name_len, dlock_permits **out) {
    if (out) *out = NULL;
    int rc;
    dlock_permits *p = dl_object_new(c, sizeof *p, DLOCK_KIND_PERMIT_SEMAPHORE, name, name_len,
                                     "redisson_sc:", "dlock_permits_new", out != NULL, &rc);
    if (!p) return rc;
    p->zkey = dl_derive_key("", p->o.h.name, p->o.h.name_len, ":timeout", &p->zkey_len);
    if (!p->zkey) {
        dlock_permits_free(p);
        return dl_client_fail(c, &(dl_err){DLOCK_ENOMEM, "out of memory"});
    }
    *out = p;
    dl_client_ok(c);
    return DLOCK_OK;
}

void dlock_permits_free(dlock_permits *p) {
    if (!p) return;
    while (p->wd) {
        wd_permit *w = p->wd;
        p->wd = w->next;
        if (w->watchdog) dl_watchdog_unregister(p->o.h.c, &w->lease);
        free(w);
    }
    free(p->zkey);
    dl_handle_clear(&p->o.h);
    free(p);
}

const char *dlock_permits_errmsg(const dlock_permits *p) {
    return p ? p->o.h.errmsg : "no permit semaphore (NULL handle)";
}

/* Takes the record of the permit (raw id) out of the handle's list (a watchdog
 * permit is unregistered); NULL when the handle holds no such permit. */
static wd_permit *wd_take(dlock_permits *p, const char *raw) {
    for (wd_permit **pp = &p->wd; *pp; pp = &(*pp)->next) {
        wd_permit *w = *pp;
        if (!memcmp(w->raw, raw, ID_RAW)) {
            *pp = w->next;
            if (w->watchdog) dl_watchdog_unregister(p->o.h.c, &w->lease);
            w->next = NULL;
            return w;
        }
    }
    return NULL;
}

/* Puts w in the list (a watchdog permit registered with the watchdog). */
static int wd_put(dlock_permits *p, wd_permit *w, dl_err *err) {
    if (w->watchdog) {
        int rc = dl_watchdog_register(p->o.h.c, &w->lease, err);
        if (rc) return rc;
    }
    w->next = p->wd;
    p->wd = w;
    return DLOCK_OK;
}

/* Drops the records of explicit-lease permits past their lease (the handle
 * would otherwise keep one per permit never released). */
static void prune_expired(dlock_permits *p) {
    int64_t now = dl_now_ms();
    for (wd_permit **pp = &p->wd; *pp;) {
        wd_permit *w = *pp;
        if (!w->watchdog && w->expires_at <= now) {
            *pp = w->next;
            free(w);
        } else {
            pp = &w->next;
        }
    }
}

static wd_permit *find(const dlock_permits *p, const char *raw) {
    for (wd_permit *w = p->wd; w; w = w->next)
        if (!memcmp(w->raw, raw, ID_RAW)) return w;
    return NULL;
}

/* A permit id as issued: DLOCK_PERMIT_ID_LEN hex characters. */
static int check_id(const char *id, const char *what, dl_err *err) {
    if (!id) return dl_seterr(err, DLOCK_EINVAL, "%s: NULL permit id", what);
    size_t n = strnlen(id, DLOCK_PERMIT_ID_LEN + 1);
    int ok = n == DLOCK_PERMIT_ID_LEN;
    for (size_t i = 0; ok && i < n; i++)
        ok = (id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f') ||
             (id[i] >= 'A' && id[i] <= 'F');
    if (!ok)
        return dl_seterr(err, DLOCK_EINVAL, "%s: a permit id is %d hex characters", what,
                         DLOCK_PERMIT_ID_LEN);
    return DLOCK_OK;
}

/* A valid hex id (check_id) to its 16 raw bytes. */
static void id_raw(const char *hex, char raw[ID_RAW]) {
    for (int i = 0; i < ID_RAW; i++) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char ch = hex[2 * i + j];
            v = v * 16 + (ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
        }
        raw[i] = (char)v;
    }
}

/* hex: a valid id (check_id); the record keeps it in lower case. */
static wd_permit *wd_new(dlock_permits *p, const char *hex, int watchdog) {
    wd_permit *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    for (int i = 0; i < DLOCK_PERMIT_ID_LEN; i++) w->id[i] = (char)(hex[i] | (hex[i] > '9' ? 0x20 : 0));
    id_raw(hex, w->raw);
    w->watchdog = watchdog;
    w->lease.renew = &wd_renew_script;
    w->lease.lease_ms = p->o.h.c->watchdog_lease_ms;
    w->lease.key = p->zkey;
    w->lease.key_len = p->zkey_len;
    w->lease.owner = w->raw;
    w->lease.owner_len = ID_RAW;
    atomic_init(&w->lease.lost, 0);
    atomic_init(&w->lease.last_ok, (long long)dl_now_ms());
    w->lease.on_lost = permit_lost;
    w->owner = p;
    return w;
}

/* Runs a script with KEYS {name, zkey, channel} on conn (a pooled one when
 * NULL). */
static int pm_eval(dlock_permits *p, dl_conn *conn, dl_script *s, int nargs, const char **args,
                   const size_t *arglens, redisReply **r, dl_err *err) {
    const char *keys[3] = {p->o.h.name, p->zkey, p->o.h.channel};
    size_t keylens[3] = {p->o.h.name_len, p->zkey_len, p->o.h.channel_len};
    if (conn)
        return dl_eval(conn, dl_cmd_deadline(p->o.h.c), s, 3, keys, keylens, nargs, args, arglens,
                       r, err);
    return dl_client_eval(p->o.h.c, s, 3, keys, keylens, nargs, args, arglens, r, err);
}

/* pm_eval expecting an integer answer. */
static int pm_eval_int(dlock_permits *p, dl_script *s, const char *what, int nargs,
                       const char **args, const size_t *arglens, long long *v, dl_err *err) {
    const char *keys[3] = {p->o.h.name, p->zkey, p->o.h.channel};
    size_t keylens[3] = {p->o.h.name_len, p->zkey_len, p->o.h.channel_len};
    return dl_object_eval_int(&p->o, NULL, s, what, 3, keys, keylens, nargs, args, arglens, v,
                              err);
}

/* One acquire attempt: *got 1, or 0 with *left_ms (ms to the earliest
 * expiry, -1 if none). */
static int attempt(dlock_permits *p, dl_conn *conn, const char *raw, const char *lease,
                   size_t lease_len, int *got, int64_t *left_ms, dl_err *err) {
    const char *args[2] = {raw, lease};
    size_t arglens[2] = {ID_RAW, lease_len};
    redisReply *r = NULL;
    long long a = 0, b = 0;
    int rc = pm_eval(p, conn, &acquire_script, 2, args, arglens, &r, err);
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

/* raw: the permit's id. *t0: the monotonic ms just before the attempt that
 * took the permit. */
static int acquire_wait(dlock_permits *p, const char *raw, int64_t wait_ms, int64_t lease_ms,
                        int64_t *t0, dl_err *err) {
    dlock_client *c = p->o.h.c;
    char nm[80], lease[24];
    size_t lease_len = dl_fmt_ll(lease, lease_ms);
    int64_t deadline = dl_deadline(wait_ms);
    dl_conn *conn = NULL, *sub = NULL;
    int got = 0;
    int64_t left = -1;
    int rc = dl_pool_get_key(c, p->o.h.name, p->o.h.name_len, dl_cmd_deadline(c), &conn, err);
    *t0 = dl_now_ms();
    if (!rc) rc = attempt(p, conn, raw, lease, lease_len, &got, &left, err);
    if (rc || got) goto out;
    if (wait_ms == DLOCK_NOWAIT) {
        rc = dl_seterr(err, DLOCK_EBUSY, "permit semaphore '%s': no permit available",
                       dl_name_msg(p->o.h.name, p->o.h.name_len, nm, sizeof nm));
        goto out;
    }
    rc = dl_sync_subscribe(c, p->o.h.channel, p->o.h.channel_len, &sub, err);
    dl_cancel_begin(&p->o.h.cancel); /* a cancel wakes dl_sync_wait */
    while (!rc) {
        /* subscribed before this attempt: a release after it is not missed */
        *t0 = dl_now_ms();
        rc = attempt(p, conn, raw, lease, lease_len, &got, &left, err);
        if (rc || got) break;
        int64_t now = dl_now_ms();
        if (wait_left(deadline) == 0) {
            rc = dl_seterr(err, DLOCK_ETIMEDOUT, "timed out waiting for a permit of '%s'",
                           dl_name_msg(p->o.h.name, p->o.h.name_len, nm, sizeof nm));
            break;
        }
        /* an expiring lease frees a permit without any message: wake then
         * (+1: surely expired on the server's clock) */
        int64_t until = deadline;
        if (left >= 0 && now + left + 1 < until) until = now + left + 1;
        int moved = 0;
        rc = dl_follow_slot(p->o.h.c, p->o.h.channel, p->o.h.channel_len, &conn, &sub, &moved, err);
        if (rc || moved) continue;
        rc = dl_sync_wait(&p->o, sub, until, err);
        if (rc == DLOCK_ETIMEDOUT) rc = DLOCK_OK;
    }
    dl_cancel_end(&p->o.h.cancel);
    dl_sync_unsubscribe(c, sub, p->o.h.channel, p->o.h.channel_len);
out:
    dl_pool_put(c, conn);
    return rc;
}

/* Gives back the permit (raw id; best effort, after a local failure). */
static void release_quietly(dlock_permits *p, const char *raw) {
    const char *args[1] = {raw};
    size_t arglens[1] = {ID_RAW};
    long long v = 0;
    dl_err ignored = {0};
    pm_eval_int(p, &release_script, "permit release", 1, args, arglens, &v, &ignored);
}

int dlock_permits_acquire(dlock_permits *p, int64_t wait_ms, int64_t lease_ms,
                          char id[DLOCK_PERMIT_ID_LEN + 1]) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!id) {
        dl_seterr(&err, DLOCK_EINVAL, "permit acquire: NULL id buffer");
        return pm_fail(p, &err);
    }
    id[0] = '\0';
    if (dl_sync_check_wait(wait_ms, &err)) return pm_fail(p, &err);
    if (lease_ms < 0) {
        dl_seterr(&err, DLOCK_EINVAL, "permit acquire: lease must be > 0 ms, or DLOCK_WATCHDOG");
        return pm_fail(p, &err);
    }
    dl_cancel_note(&p->o.h.cancel);
    char pid[DLOCK_PERMIT_ID_LEN + 1];
    int rc = dl_random_hex(pid, DLOCK_PERMIT_ID_LEN / 2, &err);
    if (rc) return pm_fail(p, &err);
    prune_expired(p);
    wd_permit *w = wd_new(p, pid, lease_ms == DLOCK_WATCHDOG);
    if (!w) {
        dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
        return pm_fail(p, &err);
    }
    int64_t lease = lease_ms == DLOCK_WATCHDOG ? p->o.h.c->watchdog_lease_ms : lease_ms;
    int64_t t0 = 0;
    rc = acquire_wait(p, w->raw, wait_ms, lease, &t0, &err);
    if (!rc) {
        /* the lease started on the server after t0 */
        atomic_store(&w->lease.last_ok, (long long)t0);
        w->expires_at = t0 + lease;
        rc = wd_put(p, w, &err);
        if (rc) release_quietly(p, w->raw); /* the lease runs out otherwise */
        else w = NULL;
    }
    free(w);
    if (rc) return pm_fail(p, &err);
    memcpy(id, pid, sizeof pid);
    return pm_ok(p);
}

int dlock_permits_release(dlock_permits *p, const char *id) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    char nm[80];
    if (check_id(id, "permit release", &err)) return pm_fail(p, &err);
    char raw[ID_RAW];
    id_raw(id, raw);
    /* stop renewing first, or a renewal racing the release would report the
     * permit lost */
    wd_permit *w = wd_take(p, raw);
    const char *args[1] = {raw};
    size_t arglens[1] = {ID_RAW};
    long long v = 0;
    int rc = pm_eval_int(p, &release_script, "permit release", 1, args, arglens, &v, &err);
    if (rc) {
        if (w) {
            dl_err e2 = {0};
            if (wd_put(p, w, &e2) == DLOCK_OK) w = NULL; /* still ours: keep renewing */
        }
        free(w);
        return pm_fail(p, &err);
    }
    free(w);
    if (v != 1) {
        dl_seterr(&err, DLOCK_ENOTOWNER,
                  "permit release: permit %.32s of '%s' is not out on lease (expired, released "
                  "or never issued)",
                  id, dl_name_msg(p->o.h.name, p->o.h.name_len, nm, sizeof nm));
        return pm_fail(p, &err);
    }
    return pm_ok(p);
}

int dlock_permits_renew(dlock_permits *p, const char *id, int64_t lease_ms) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    char nm[80];
    if (check_id(id, "permit renew", &err)) return pm_fail(p, &err);
    char raw[ID_RAW];
    id_raw(id, raw);
    if (lease_ms <= 0) {
        dl_seterr(&err, DLOCK_EINVAL, "permit renew: lease must be > 0 ms (got %lld)",
                  (long long)lease_ms);
        return pm_fail(p, &err);
    }
    /* a watchdog permit becomes an explicit-lease permit (as dlock_extend) */
    wd_permit *w = wd_take(p, raw);
    char lease[24];
    const char *args[2] = {raw, lease};
    size_t arglens[2] = {ID_RAW, dl_fmt_ll(lease, lease_ms)};
    long long v = 0;
    int64_t t0 = dl_now_ms();
    int rc = pm_eval_int(p, &renew_script, "permit renew", 2, args, arglens, &v, &err);
    if (rc) {
        if (w) {
            dl_err e2 = {0};
            if (wd_put(p, w, &e2) == DLOCK_OK) w = NULL;
        }
        free(w);
        return pm_fail(p, &err);
    }
    if (v != 1) {
        free(w);
        dl_seterr(&err, DLOCK_ENOTOWNER,
                  "permit renew: permit %.32s of '%s' is not out on lease (expired, released or "
                  "never issued)",
                  id, dl_name_msg(p->o.h.name, p->o.h.name_len, nm, sizeof nm));
        return pm_fail(p, &err);
    }
    /* held now with an explicit lease from t0: this handle tracks it (also an
     * id it did not take) */
    if (!w) w = wd_new(p, id, 0);
    if (w) {
        w->watchdog = 0;
        w->expires_at = t0 + lease_ms;
        (void)wd_put(p, w, &err); /* cannot fail without the watchdog */
    }
    return pm_ok(p);
}

int64_t dlock_permits_valid_ms(const dlock_permits *p, const char *id) {
    dl_err ignored = {0};
    if (!p || check_id(id, "permit valid_ms", &ignored)) return 0;
    char raw[ID_RAW];
    id_raw(id, raw);
    const wd_permit *w = find(p, raw);
    if (!w) return 0;
    int64_t until = w->expires_at;
    if (w->watchdog) {
        if (atomic_load(&w->lease.lost)) return 0;
        until = (int64_t)atomic_load(&w->lease.last_ok) + w->lease.lease_ms;
    }
    int64_t left = until - dl_now_ms();
    return left > 0 ? left : 0;
}

int dlock_permits_available(dlock_permits *p, int64_t *permits) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!permits) {
        dl_seterr(&err, DLOCK_EINVAL, "permit available: NULL result pointer");
        return pm_fail(p, &err);
    }
    *permits = 0;
    long long v = 0;
    int rc = pm_eval_int(p, &available_script, "permit available", 0, NULL, NULL, &v, &err);
    if (rc) return pm_fail(p, &err);
    *permits = v;
    return pm_ok(p);
}

int dlock_permits_try_set(dlock_permits *p, int64_t permits, int *set) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    if (set) *set = 0;
    if (!set) {
        dl_seterr(&err, DLOCK_EINVAL, "permit try_set: NULL result pointer");
        return pm_fail(p, &err);
    }
    if (dl_check_count(permits, 0, "permit try_set", "permits", &err)) return pm_fail(p, &err);
    char num[24];
    const char *args[1] = {num};
    size_t arglens[1] = {dl_fmt_ll(num, permits)};
    long long v = 0;
    int rc = pm_eval_int(p, &try_set_script, "permit try_set", 1, args, arglens, &v, &err);
    if (rc) return pm_fail(p, &err);
    *set = v == 1;
    return pm_ok(p);
}

int dlock_permits_add(dlock_permits *p, int64_t delta) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    if (dl_check_count(delta, -DLOCK_COUNT_MAX, "permit add", "delta", &err))
        return pm_fail(p, &err);
    char num[24];
    const char *args[1] = {num};
    size_t arglens[1] = {dl_fmt_ll(num, delta)};
    long long v = 0;
    int rc = pm_eval_int(p, &add_script, "permit add", 1, args, arglens, &v, &err);
    return rc ? pm_fail(p, &err) : pm_ok(p);
}

int dlock_permits_cancel(dlock_permits *p) {
    return p ? dl_cancel_ask(p->o.h.c, &p->o.h.cancel) : DLOCK_EINVAL;
}
