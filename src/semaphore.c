/* The semaphore. The public calls check their arguments and go through the
 * client's backend table (sem_* calls); a backend without them answers
 * DLOCK_ENOTSUP when the handle is made (object.c).
 *
 * Redis (the dl_redis_sem_* calls below; Redisson RSemaphore layout): STRING
 * `name` holds the available permits; every change that can free permits
 * publishes the new count on "redisson_sc:{name}". Permits are not owned:
 * anyone may release. Waiting: dl_sync_* in sync.c.
 *
 * ZooKeeper: src/backends/zk/sem.c (permits held by lease nodes, released by their
 * holder only). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kinds.h"


/* ---- scripts ---- */

/* KEYS: semaphore. ARGV: permits. -> 1 taken | 0 not enough available
 * (inline Lua, no helper function: see DL_LUA_WAKE_ONE) */
dl_script dl_script_semaphore_acquire = DL_SCRIPT("semaphore_acquire",
    "local v = redis.call('get', KEYS[1]) "
    "local n = 0 "
    "if v then n = tonumber(v) "
    "if not n then return redis.error_reply('ERR semaphore value is not an integer') end end "
    "if n >= tonumber(ARGV[1]) then redis.call('decrby', KEYS[1], ARGV[1]); return 1 end "
    "return 0");

/* KEYS: semaphore, channel, the change's id key. ARGV: delta, the id key's
 * life in ms. Adds delta (release: > 0; add: any) and publishes the new
 * count, once per id: a second copy of the same change (a resent request)
 * finds the id key and changes nothing. -> the new count | nil: counted
 * before */
dl_script dl_script_semaphore_add_once = DL_SCRIPT("semaphore_add_once",
    "if not redis.call('set', KEYS[3], 1, 'NX', 'PX', ARGV[2]) then return false end "
    "local v = redis.call('incrby', KEYS[1], ARGV[1]) "
    "redis.call('publish', KEYS[2], v) "
    "return v");

/* KEYS: semaphore, channel. ARGV: permits. -> 1 set | 0 exists already */
dl_script dl_script_semaphore_try_set = DL_SCRIPT("semaphore_try_set",
    "if redis.call('set', KEYS[1], ARGV[1], 'NX') then "
    "redis.call('publish', KEYS[2], ARGV[1]); return 1 end "
    "return 0");

/* ---- handles ---- */

struct dlock_semaphore {
    dl_object o;               /* client, name, channel, message */
    char *chg_key;             /* DL_SEM_CHANGE_PREFIX{name}: + a change's id */
    size_t chg_prefix_len;
};

static int sem_fail(dlock_semaphore *s, const dl_err *err) { return dl_handle_fail(&s->o.h, err); }

static int sem_ok(dlock_semaphore *s) { return dl_handle_ok(&s->o.h); }

int dlock_semaphore_new(dlock_client *c, const char *name, size_t name_len, dlock_semaphore **out) {
    if (out) *out = NULL;
    int rc;
    dlock_semaphore *s = dl_object_new(c, sizeof *s, DLOCK_KIND_SEMAPHORE, name, name_len,
                                       "redisson_sc:", "dlock_semaphore_new", out != NULL, &rc);
    if (!s) return rc;
    dl_err err = {0};
    if (c->backend->sem_init && (rc = c->backend->sem_init(&s->o, &err))) {
        dlock_semaphore_free(s);
        return dl_client_fail(c, &err);
    }
    *out = s;
    dl_client_ok(c);
    return DLOCK_OK;
}

void dlock_semaphore_free(dlock_semaphore *s) {
    if (!s) return;
    if (s->o.h.c->backend->sem_destroy) s->o.h.c->backend->sem_destroy(&s->o);
    free(s->chg_key);
    dl_handle_clear(&s->o.h);
    free(s);
}

const char *dlock_semaphore_errmsg(const dlock_semaphore *s) {
    return s ? s->o.h.errmsg : "no semaphore (NULL handle)";
}

/* Runs one of the scripts on conn (or a pooled connection when conn is
 * NULL) with KEYS {name, channel} and one number argument; *v gets the
 * integer answer. */
static int sem_eval(dlock_semaphore *s, dl_conn *conn, dl_script *script, const char *what,
                    int64_t arg, long long *v, dl_err *err) {
    char num[24];
    const char *keys[2] = {s->o.h.name, s->o.h.channel};
    size_t keylens[2] = {s->o.h.name_len, s->o.h.channel_len};
    const char *args[1] = {num};
    size_t arglens[1] = {dl_fmt_ll(num, arg)};
    return dl_object_eval_int(&s->o, conn, script, what, 2, keys, keylens, 1, args, arglens, v,
                              err);
}

static int64_t wait_left(int64_t deadline) {
    if (deadline == DL_INF_DEADLINE) return -1;
    int64_t left = deadline - dl_now_ms();
    return left > 0 ? left : 0;
}

/* ---- Redis ---- */

int dl_redis_sem_acquire(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err) {
    dlock_semaphore *s = (dlock_semaphore *)o;
    dlock_client *c = s->o.h.c;
    int64_t deadline = dl_deadline(wait_ms);
    dl_conn *conn = NULL, *sub = NULL;
    long long got = 0;
    int rc = dl_pool_get_key(c, s->o.h.name, s->o.h.name_len, dl_cmd_deadline(c), &conn, err);
    if (!rc) rc = sem_eval(s, conn, &dl_script_semaphore_acquire, "semaphore acquire", permits, &got, err);
    if (rc || got == 1) goto out;
    if (wait_ms == DLOCK_NOWAIT) {
        rc = dl_sem_refused(&s->o, permits, 0, err);
        goto out;
    }
    rc = dl_sync_subscribe(c, s->o.h.channel, s->o.h.channel_len, &sub, err);
    dl_cancel_begin(&s->o.h.cancel); /* a cancel wakes dl_sync_wait */
    while (!rc) {
        /* subscribed before this attempt: a release after it is not missed */
        rc = sem_eval(s, conn, &dl_script_semaphore_acquire, "semaphore acquire", permits, &got, err);
        if (rc || got == 1) break;
        if (wait_left(deadline) == 0) {
            rc = dl_sem_refused(&s->o, permits, 1, err);
            break;
        }
        int moved = 0;
        rc = dl_follow_slot(s->o.h.c, s->o.h.channel, s->o.h.channel_len, &conn, &sub, &moved, err);
        if (rc || moved) continue;
        /* permits come back only through a release or add, which publish */
        rc = dl_sync_wait(&s->o, sub, deadline, err);
        if (rc == DLOCK_ETIMEDOUT) rc = DLOCK_OK; /* one last attempt, then time out */
    }
    dl_cancel_end(&s->o.h.cancel);
    dl_sync_unsubscribe(c, sub, s->o.h.channel, s->o.h.channel_len);
out:
    dl_pool_put(c, conn);
    return rc;
}

/* Adds delta once: the change carries a random id, and the script counts an
 * id once (dl_script_semaphore_add_once). A change whose reply was lost (the request or the
 * reply dropped, the connection cut, the command timed out) is sent again
 * with the same id on another connection, once, unless the client fails
 * fast: counted once whether or not the first copy arrived, as long as the
 * two copies reach the server within DL_SEM_CHANGE_ID_MS of each other. */
static int sem_change(dlock_semaphore *s, const char *what, int64_t delta, dl_err *err) {
    if (!s->chg_key) {
        size_t pl = 0;
        char *p = dl_derive_key(DL_SEM_CHANGE_PREFIX, s->o.h.name, s->o.h.name_len, ":", &pl);
        char *k = p ? realloc(p, pl + 2 * DL_SEM_CHANGE_ID_BYTES + 1) : NULL;
        if (!k) {
            free(p);
            return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        }
        s->chg_key = k;
        s->chg_prefix_len = pl;
    }
    int rc = dl_random_hex(s->chg_key + s->chg_prefix_len, DL_SEM_CHANGE_ID_BYTES, err);
    if (rc) return rc;
    char num[24], ttl[24];
    const char *keys[3] = {s->o.h.name, s->o.h.channel, s->chg_key};
    size_t keylens[3] = {s->o.h.name_len, s->o.h.channel_len,
                         s->chg_prefix_len + 2 * DL_SEM_CHANGE_ID_BYTES};
    const char *args[2] = {num, ttl};
    size_t arglens[2] = {dl_fmt_ll(num, delta), dl_fmt_ll(ttl, DL_SEM_CHANGE_ID_MS)};
    for (int attempt = 0;; attempt++) {
        redisReply *r = NULL;
        rc = dl_client_eval(s->o.h.c, &dl_script_semaphore_add_once, 3, keys, keylens, 2, args, arglens, &r, err);
        if (rc == DLOCK_EIO && attempt == 0 && !atomic_load(&s->o.h.c->fail_fast)) continue;
        if (rc) return rc;
        long long v = 0;
        if (r->type == REDIS_REPLY_ERROR)
            rc = dl_sync_reply_error(r, what, err);
        else if (r->type != REDIS_REPLY_NIL && dl_reply_int(r, &v))
            rc = dl_seterr(err, DLOCK_EPROTO, "%s: unexpected reply from the script", what);
        freeReplyObject(r);
        return rc;
    }
}

int dl_redis_sem_release(dl_object *o, int64_t permits, dl_err *err) {
    return sem_change((dlock_semaphore *)o, "semaphore release", permits, err);
}

int dl_redis_sem_add(dl_object *o, int64_t delta, dl_err *err) {
    return sem_change((dlock_semaphore *)o, "semaphore add", delta, err);
}

int dl_redis_sem_try_set(dl_object *o, int64_t permits, int *set, dl_err *err) {
    long long v = 0;
    int rc = sem_eval((dlock_semaphore *)o, NULL, &dl_script_semaphore_try_set, "semaphore try_set", permits,
                      &v, err);
    if (!rc) *set = v == 1;
    return rc;
}

int dl_redis_sem_available(dl_object *o, int64_t *permits, dl_err *err) {
    const char *argv[2] = {"GET", o->h.name};
    size_t lens[2] = {3, o->h.name_len};
    redisReply *r = NULL;
    int rc = dl_client_command(o->h.c, 2, argv, lens, &r, err);
    if (rc) return rc;
    long long v = 0;
    if (r->type == REDIS_REPLY_ERROR)
        rc = dl_reply_error(r, "semaphore available", err);
    else if (r->type != REDIS_REPLY_NIL && dl_reply_int(r, &v))
        rc = dl_seterr(err, DLOCK_EPROTO, "semaphore available: the value is not an integer");
    freeReplyObject(r);
    if (!rc) *permits = v;
    return rc;
}

/* ---- the public calls ---- */

int dlock_semaphore_acquire(dlock_semaphore *s, int64_t permits, int64_t wait_ms) {
    if (!s) return DLOCK_EINVAL;
    dl_err err = {0};
    if (dl_check_count(permits, 1, "acquire", "permits", &err)) return sem_fail(s, &err);
    if (dl_sync_check_wait(wait_ms, &err)) return sem_fail(s, &err);
    dl_cancel_note(&s->o.h.cancel);
    int rc = s->o.h.c->backend->sem_acquire(&s->o, permits, wait_ms, &err);
    return rc ? sem_fail(s, &err) : sem_ok(s);
}

int dlock_semaphore_release(dlock_semaphore *s, int64_t permits) {
    if (!s) return DLOCK_EINVAL;
    dl_err err = {0};
    if (dl_check_count(permits, 1, "release", "permits", &err)) return sem_fail(s, &err);
    int rc = s->o.h.c->backend->sem_release(&s->o, permits, &err);
    return rc ? sem_fail(s, &err) : sem_ok(s);
}

int dlock_semaphore_add(dlock_semaphore *s, int64_t delta) {
    if (!s) return DLOCK_EINVAL;
    dl_err err = {0};
    if (dl_check_count(delta, -DLOCK_COUNT_MAX, "add", "delta", &err)) return sem_fail(s, &err);
    int rc = s->o.h.c->backend->sem_add(&s->o, delta, &err);
    return rc ? sem_fail(s, &err) : sem_ok(s);
}

int dlock_semaphore_try_set(dlock_semaphore *s, int64_t permits, int *set) {
    if (!s) return DLOCK_EINVAL;
    dl_err err = {0};
    if (set) *set = 0;
    if (!set) {
        dl_seterr(&err, DLOCK_EINVAL, "try_set: NULL result pointer");
        return sem_fail(s, &err);
    }
    if (dl_check_count(permits, 0, "try_set", "permits", &err)) return sem_fail(s, &err);
    int rc = s->o.h.c->backend->sem_try_set(&s->o, permits, set, &err);
    return rc ? sem_fail(s, &err) : sem_ok(s);
}

int dlock_semaphore_available(dlock_semaphore *s, int64_t *permits) {
    if (!s) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!permits) {
        dl_seterr(&err, DLOCK_EINVAL, "available: NULL result pointer");
        return sem_fail(s, &err);
    }
    *permits = 0;
    int64_t v = 0;
    int rc = s->o.h.c->backend->sem_available(&s->o, &v, &err);
    if (rc) return sem_fail(s, &err);
    *permits = v;
    return sem_ok(s);
}

void dlock_semaphore_on_lost(dlock_semaphore *s, dlock_semaphore_lost_fn fn, void *userdata) {
    if (!s) return;
    s->o.lost_fn = fn;
    s->o.lost_ud = userdata;
}

int dl_sem_refused(const dl_object *o, int64_t permits, int timed_out, dl_err *err) {
    char nm[80];
    dl_name_msg(o->h.name, o->h.name_len, nm, sizeof nm);
    if (timed_out)
        return dl_seterr(err, DLOCK_ETIMEDOUT,
                         "timed out waiting for %lld permit(s) of semaphore '%s'",
                         (long long)permits, nm);
    return dl_seterr(err, DLOCK_EBUSY, "semaphore '%s': %lld permit(s) not available", nm,
                     (long long)permits);
}

int dl_sem_over_release(const dl_object *o, int64_t permits, int64_t held, dl_err *err) {
    char nm[80];
    dl_name_msg(o->h.name, o->h.name_len, nm, sizeof nm);
    return dl_seterr(err, DLOCK_EINVAL,
                     "semaphore '%s': release of %lld permit(s), but this handle holds %lld (on "
                     "%s a handle gives back only permits it acquired)",
                     nm, (long long)permits, (long long)held, o->h.c->backend->name);
}

void dl_semaphore_lost(dl_object *o, int reason) {
    /* o is the first member of its dlock_semaphore */
    if (o->lost_fn) o->lost_fn((dlock_semaphore *)o, reason, o->lost_ud);
}

int dlock_semaphore_cancel(dlock_semaphore *s) {
    return s ? dl_cancel_ask(s->o.h.c, &s->o.h.cancel) : DLOCK_EINVAL;
}
