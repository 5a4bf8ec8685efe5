/*
 * Global ID worker (seed 002's RedisIdWorker).
 *
 *   id = (seconds since epoch_s, 31 bits) << 32 | n
 *
 * n comes from the per-day counter "icr:<prefix>:<yyyy:mm:dd>" (UTC date),
 * INCR (batch 1) or INCRBY batch (a block of ids reserved in one round trip).
 *
 * WALL CLOCK ON PURPOSE. The rest of the library uses CLOCK_BOOTTIME (clock.c).
 * Here the seconds part of an id and the day in the counter key must mean the
 * same thing on every machine that shares the prefix, so they come from the
 * wall clock (CLOCK_REALTIME). Uniqueness does not depend on the clocks
 * agreeing: the day of the key is always derived from the very seconds value
 * put into the id, so two ids with the same seconds value share one counter
 * key and hence differ in n. Monotonicity within one worker is kept by never
 * letting the seconds value go back (a wall clock stepped back reuses the
 * last seconds value, and with it the last day's key).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kinds.h"

#define IDW_DEFAULT_EPOCH 1640995200LL      /* 2022-01-01T00:00:00Z, as in the seed */
#define IDW_TS_LIMIT (1LL << 31)            /* seconds must be < 2^31 */
#define IDW_COUNT_MAX 0xFFFFFFFFULL         /* n must be <= 2^32 - 1 */
#define IDW_PREFIX_MAX DLOCK_NAME_MAX
#define IDW_EPOCH_BOUND (1LL << 40)

struct dlock_idworker {
    dlock_client *c;
    dl_idw s;             /* the layout's state, shared with the async worker */
    char errmsg[DL_ERRMSG_MAX];
};

static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* ---- the layout: shared by dlock_idworker_* and dlock_async_idworker_* ---- */

int dl_idw_init(dl_idw *s, const char *prefix, const dlock_idworker_options *opts, dl_err *err) {
    memset(s, 0, sizeof *s);
    size_t plen = strlen(prefix);
    if (plen == 0) return dl_seterr(err, DLOCK_EINVAL, "ID worker: empty prefix");
    if (plen > IDW_PREFIX_MAX)
        return dl_seterr(err, DLOCK_ENAMETOOLONG, "ID worker: prefix longer than %d bytes",
                         IDW_PREFIX_MAX);
    int64_t epoch = IDW_DEFAULT_EPOCH, batch = 1;
    if (opts) {
        /* any Unix second (before 1970 too), within +-2^40 so that the
         * arithmetic cannot overflow; 0 selects the default */
        if (opts->epoch_s < -IDW_EPOCH_BOUND || opts->epoch_s > IDW_EPOCH_BOUND)
            return dl_seterr(err, DLOCK_EINVAL, "ID worker: epoch_s %" PRId64 " out of range",
                             opts->epoch_s);
        if (opts->epoch_s != 0) epoch = opts->epoch_s;
        if (opts->batch < 0 || (uint64_t)opts->batch > IDW_COUNT_MAX)
            return dl_seterr(err, DLOCK_EINVAL, "ID worker: batch %" PRId64 " out of range 0..%llu",
                             opts->batch, (unsigned long long)IDW_COUNT_MAX);
        if (opts->batch > 1) batch = opts->batch;
    }
    if (!(s->prefix = strdup(prefix))) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    s->epoch_s = epoch;
    s->batch = batch;
    s->last_ts = -1;
    return DLOCK_OK;
}

void dl_idw_fini(dl_idw *s) {
    free(s->prefix);
    s->prefix = NULL;
}

/* The seconds value of an id issued now (never before the last one) and
 * its Unix seconds. */
static int stamp(const dl_idw *s, int64_t *ts_out, int64_t *t_out, dl_err *err) {
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0)
        return dl_seterr(err, DLOCK_ESYS, "ID worker: clock_gettime(CLOCK_REALTIME): %s",
                         strerror(errno));
    int64_t ts = (int64_t)now.tv_sec - s->epoch_s;
    if (ts < s->last_ts) ts = s->last_ts; /* wall clock stepped back: keep the last value */
    if (ts < 0)
        return dl_seterr(err, DLOCK_EINVAL,
                         "ID worker: the wall clock (%lld) is before the epoch (%" PRId64 ")",
                         (long long)now.tv_sec, s->epoch_s);
    if (ts >= IDW_TS_LIMIT)
        return dl_seterr(err, DLOCK_EOVERFLOW,
                         "ID worker: %" PRId64 " seconds since the epoch %" PRId64
                         " no longer fit 31 bits (choose a later epoch_s)",
                         ts, s->epoch_s);
    *ts_out = ts;
    *t_out = s->epoch_s + ts;
    return DLOCK_OK;
}

int dl_idw_take(dl_idw *s, uint64_t *id, int64_t *need_t, dl_err *err) {
    int64_t ts = 0, t = 0;
    *need_t = -1;
    int rc = stamp(s, &ts, &t, err);
    if (rc) return rc;
    int64_t day = floor_div(t, 86400);
    /* A block is only valid for its own day: on another day the counter key
     * differs and the same n is handed out again by that day's key. */
    if (!s->have_block || s->day != day || s->next > s->end) {
        s->have_block = 0;
        *need_t = t;
        return DLOCK_OK;
    }
    uint64_t v = ((uint64_t)ts << 32) | s->next;
    if (s->last_ts >= 0 && v <= s->last_id) {
        /* only if the day's counter key was deleted or lowered meanwhile */
        s->have_block = 0;
        return dl_seterr(err, DLOCK_EPROTO,
                         "ID worker: counter for prefix '%s' went backwards (key deleted or "
                         "reset?); refusing to issue a non-increasing id",
                         s->prefix);
    }
    s->next++;
    s->last_ts = ts;
    s->last_id = v;
    *id = v;
    return DLOCK_OK;
}

int dl_idw_key(const dl_idw *s, int64_t t, char **key, size_t *len, dl_err *err) {
    struct tm tm;
    time_t tt = (time_t)t;
    if (!gmtime_r(&tt, &tm))
        return dl_seterr(err, DLOCK_ESYS, "ID worker: gmtime failed for %" PRId64, t);
    size_t klen = strlen(s->prefix) + 32;
    char *k = malloc(klen);
    if (!k) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int kn = snprintf(k, klen, "icr:%s:%04d:%02d:%02d", s->prefix, tm.tm_year + 1900,
                      tm.tm_mon + 1, tm.tm_mday);
    *key = k;
    *len = (size_t)kn;
    return DLOCK_OK;
}

int dl_idw_fill(dl_idw *s, int64_t t, int64_t n, long long hi, const char *key, dl_err *err) {
    long long lo = hi - n + 1;
    if (lo < 0) return dl_seterr(err, DLOCK_EPROTO, "ID worker: counter %s is negative (%lld)", key, hi);
    if ((unsigned long long)lo > IDW_COUNT_MAX)
        return dl_seterr(err, DLOCK_EOVERFLOW,
                         "ID worker: counter %s passed 2^32-1 (now %lld): no more ids for "
                         "prefix '%s' on this UTC day",
                         key, hi, s->prefix);
    s->have_block = 1;
    s->day = floor_div(t, 86400);
    s->next = (uint64_t)lo;
    s->end = (unsigned long long)hi > IDW_COUNT_MAX ? IDW_COUNT_MAX : (uint64_t)hi;
    return DLOCK_OK;
}

int dl_idw_reply(const redisReply *r, const char *key, size_t key_len, long long *value,
                 dl_err *err) {
    if (r->type == REDIS_REPLY_ERROR) {
        if (r->str && strstr(r->str, "overflow"))
            return dl_seterr(err, DLOCK_EOVERFLOW,
                             "ID worker: counter %.*s overflowed (server: %.100s)", (int)key_len,
                             key, r->str);
        return dl_reply_error(r, "INCRBY", err);
    }
    if (r->type != REDIS_REPLY_INTEGER)
        return dl_seterr(err, DLOCK_EPROTO, "ID worker: INCRBY %.*s: integer reply expected",
                         (int)key_len, key);
    *value = r->integer;
    return DLOCK_OK;
}

/* ---- the blocking worker ---- */

int dlock_idworker_new(dlock_client *c, const char *prefix, const dlock_idworker_options *opts,
                       dlock_idworker **out) {
    dl_err err = {0};
    if (out) *out = NULL;
    if (!c || !prefix || !out) {
        dl_seterr(&err, DLOCK_EINVAL, "dlock_idworker_new: NULL %s",
                  !c ? "client" : !prefix ? "prefix" : "out");
        return c ? dl_client_fail(c, &err) : DLOCK_EINVAL;
    }
    if (!c->backend->id_incr) return dl_backend_unsupported(c, "the ID worker");
    dl_idw s;
    if (dl_idw_init(&s, prefix, opts, &err)) return dl_client_fail(c, &err);
    dlock_idworker *w = calloc(1, sizeof *w);
    if (!w) {
        dl_idw_fini(&s);
        dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
        return dl_client_fail(c, &err);
    }
    w->c = c;
    w->s = s;
    *out = w;
    dl_client_ok(c);
    return DLOCK_OK;
}

void dlock_idworker_free(dlock_idworker *w) {
    if (!w) return;
    dl_idw_fini(&w->s);
    free(w);
}

const char *dlock_idworker_errmsg(const dlock_idworker *w) {
    if (!w) return "no ID worker (NULL handle)";
    return w->errmsg;
}

static int fail(dlock_idworker *w, const dl_err *err) {
    snprintf(w->errmsg, sizeof w->errmsg, "%s",
             err->msg[0] ? err->msg : dlock_strerror(err->code));
    return err->code;
}

/* The Redis backend's day counter (its table: backend_redis.c): INCR, or
 * INCRBY n, on the counter key. */
int dl_redis_id_incr(dlock_client *c, const char *key, size_t key_len, int64_t n,
                     long long *value, dl_err *err) {
    char nbuf[24];
    int nn = snprintf(nbuf, sizeof nbuf, "%" PRId64, n);
    const char *argv[3] = {n > 1 ? "INCRBY" : "INCR", key, nbuf};
    size_t lens[3] = {strlen(argv[0]), key_len, (size_t)nn};
    redisReply *r = NULL;
    int rc = dl_client_command(c, n > 1 ? 3 : 2, argv, lens, &r, err);
    if (rc) return rc;
    rc = dl_idw_reply(r, key, key_len, value, err);
    freeReplyObject(r);
    return rc;
}

/* Reserves a new block for the day of the Unix seconds t. */
static int reserve(dlock_idworker *w, int64_t t, dl_err *err) {
    char *key = NULL;
    size_t kn = 0;
    int rc = dl_idw_key(&w->s, t, &key, &kn, err);
    if (rc) return rc;
    long long hi = 0;
    rc = w->c->backend->id_incr(w->c, key, kn, w->s.batch, &hi, err);
    if (!rc) rc = dl_idw_fill(&w->s, t, w->s.batch, hi, key, err);
    free(key);
    return rc;
}

int dlock_idworker_next(dlock_idworker *w, uint64_t *id) {
    if (!w) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!id) {
        dl_seterr(&err, DLOCK_EINVAL, "dlock_idworker_next: NULL id");
        return fail(w, &err);
    }
    for (;;) {
        int64_t need_t = -1;
        int rc = dl_idw_take(&w->s, id, &need_t, &err);
        if (!rc && need_t >= 0) rc = reserve(w, need_t, &err);
        else if (!rc) break;
        if (rc) return fail(w, &err);
    }
    w->errmsg[0] = '\0';
    return DLOCK_OK;
}
