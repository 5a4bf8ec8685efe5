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
    char *prefix;
    int64_t epoch_s;
    int64_t batch;

    /* the reserved block: counter values next..end (inclusive) of day `day` */
    int have_block;
    int64_t day;          /* days since the Unix epoch (UTC) of the block */
    uint64_t next, end;

    int64_t last_ts;      /* last seconds value issued (-1: none yet) */
    uint64_t last_id;
    char errmsg[DL_ERRMSG_MAX];
};

static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

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
    size_t plen = strlen(prefix);
    if (plen == 0) {
        dl_seterr(&err, DLOCK_EINVAL, "ID worker: empty prefix");
        return dl_client_fail(c, &err);
    }
    if (plen > IDW_PREFIX_MAX) {
        dl_seterr(&err, DLOCK_ENAMETOOLONG, "ID worker: prefix longer than %d bytes",
                  IDW_PREFIX_MAX);
        return dl_client_fail(c, &err);
    }
    int64_t epoch = IDW_DEFAULT_EPOCH, batch = 1;
    if (opts) {
        /* any Unix second (before 1970 too), within +-2^40 so that the
         * arithmetic cannot overflow; 0 selects the default */
        if (opts->epoch_s < -IDW_EPOCH_BOUND || opts->epoch_s > IDW_EPOCH_BOUND) {
            dl_seterr(&err, DLOCK_EINVAL, "ID worker: epoch_s %" PRId64 " out of range",
                      opts->epoch_s);
            return dl_client_fail(c, &err);
        }
        if (opts->epoch_s != 0) epoch = opts->epoch_s;
        if (opts->batch < 0 || (uint64_t)opts->batch > IDW_COUNT_MAX) {
            dl_seterr(&err, DLOCK_EINVAL, "ID worker: batch %" PRId64 " out of range 0..%llu",
                      opts->batch, (unsigned long long)IDW_COUNT_MAX);
            return dl_client_fail(c, &err);
        }
        if (opts->batch > 1) batch = opts->batch;
    }
    dlock_idworker *w = calloc(1, sizeof *w);
    char *p = w ? strdup(prefix) : NULL;
    if (!p) {
        free(w);
        dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
        return dl_client_fail(c, &err);
    }
    w->c = c;
    w->prefix = p;
    w->epoch_s = epoch;
    w->batch = batch;
    w->last_ts = -1;
    *out = w;
    dl_client_ok(c);
    return DLOCK_OK;
}

void dlock_idworker_free(dlock_idworker *w) {
    if (!w) return;
    free(w->prefix);
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
    if (r->type == REDIS_REPLY_ERROR) {
        if (r->str && strstr(r->str, "overflow"))
            rc = dl_seterr(err, DLOCK_EOVERFLOW,
                           "ID worker: counter %.*s overflowed (server: %.100s)", (int)key_len,
                           key, r->str);
        else
            rc = dl_reply_error(r, argv[0], err);
    } else if (r->type != REDIS_REPLY_INTEGER) {
        rc = dl_seterr(err, DLOCK_EPROTO, "ID worker: %s %.*s: integer reply expected", argv[0],
                       (int)key_len, key);
    } else {
        *value = r->integer;
    }
    freeReplyObject(r);
    return rc;
}

/* Reserves a new block for `day` (the key's date from the Unix seconds t). */
static int reserve(dlock_idworker *w, int64_t t, int64_t day, dl_err *err) {
    struct tm tm;
    time_t tt = (time_t)t;
    if (!gmtime_r(&tt, &tm))
        return dl_seterr(err, DLOCK_ESYS, "ID worker: gmtime failed for %" PRId64, t);
    size_t klen = strlen(w->prefix) + 32;
    char *key = malloc(klen);
    if (!key) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int kn = snprintf(key, klen, "icr:%s:%04d:%02d:%02d", w->prefix, tm.tm_year + 1900,
                      tm.tm_mon + 1, tm.tm_mday);
    long long hi = 0;
    int rc = w->c->backend->id_incr(w->c, key, (size_t)kn, w->batch, &hi, err);
    if (rc) goto out;
    long long lo = hi - w->batch + 1;
    if (lo < 0) {
        rc = dl_seterr(err, DLOCK_EPROTO, "ID worker: counter %s is negative (%lld)", key, hi);
        goto out;
    }
    if ((unsigned long long)lo > IDW_COUNT_MAX) {
        rc = dl_seterr(err, DLOCK_EOVERFLOW,
                       "ID worker: counter %s passed 2^32-1 (now %lld): no more ids for "
                       "prefix '%s' on this UTC day",
                       key, hi, w->prefix);
        goto out;
    }
    w->have_block = 1;
    w->day = day;
    w->next = (uint64_t)lo;
    w->end = (unsigned long long)hi > IDW_COUNT_MAX ? IDW_COUNT_MAX : (uint64_t)hi;
out:
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
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
        dl_seterr(&err, DLOCK_ESYS, "ID worker: clock_gettime(CLOCK_REALTIME): %s",
                  strerror(errno));
        return fail(w, &err);
    }
    int64_t ts = (int64_t)now.tv_sec - w->epoch_s;
    if (ts < w->last_ts) ts = w->last_ts; /* wall clock stepped back: keep the last value */
    if (ts < 0) {
        dl_seterr(&err, DLOCK_EINVAL,
                  "ID worker: the wall clock (%lld) is before the epoch (%" PRId64 ")",
                  (long long)now.tv_sec, w->epoch_s);
        return fail(w, &err);
    }
    if (ts >= IDW_TS_LIMIT) {
        dl_seterr(&err, DLOCK_EOVERFLOW,
                  "ID worker: %" PRId64 " seconds since the epoch %" PRId64
                  " no longer fit 31 bits (choose a later epoch_s)",
                  ts, w->epoch_s);
        return fail(w, &err);
    }
    int64_t t = w->epoch_s + ts;
    int64_t day = floor_div(t, 86400);
    /* A block is only valid for its own day: on another day the counter key
     * differs and the same n is handed out again by that day's key. */
    if (!w->have_block || w->day != day || w->next > w->end) {
        w->have_block = 0;
        int rc = reserve(w, t, day, &err);
        if (rc) return fail(w, &err);
    }
    uint64_t v = ((uint64_t)ts << 32) | w->next;
    if (w->last_ts >= 0 && v <= w->last_id) {
        /* only if the day's counter key was deleted or lowered meanwhile */
        w->have_block = 0;
        dl_seterr(&err, DLOCK_EPROTO,
                  "ID worker: counter for prefix '%s' went backwards (key deleted or "
                  "reset?); refusing to issue a non-increasing id",
                  w->prefix);
        return fail(w, &err);
    }
    w->next++;
    w->last_ts = ts;
    w->last_id = v;
    w->errmsg[0] = '\0';
    *id = v;
    return DLOCK_OK;
}
