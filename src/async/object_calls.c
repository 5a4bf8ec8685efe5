/* The public calls of the async semaphore, permit semaphore and latch:
 * each checks its arguments and starts its operation through object.c
 * (dl_aobj_start), which has the handle, the requests and the waiting. */
#include <string.h>

#include "async.h"

int dlock_async_semaphore_new(dlock_async_client *c, const char *name, size_t name_len,
                              dlock_async_object **out) {
    return dl_aobj_new(c, name, name_len, DLOCK_KIND_SEMAPHORE, out);
}

int dlock_async_permits_new(dlock_async_client *c, const char *name, size_t name_len,
                            dlock_async_object **out) {
    return dl_aobj_new(c, name, name_len, DLOCK_KIND_PERMIT_SEMAPHORE, out);
}

int dlock_async_latch_new(dlock_async_client *c, const char *name, size_t name_len,
                          dlock_async_object **out) {
    return dl_aobj_new(c, name, name_len, DLOCK_KIND_LATCH, out);
}

/* A count argument checked (dl_check_count), else its failure on o. */
#define CHECK_COUNT(o, v, min, what, arg)                                                          \
    do {                                                                                           \
        dl_err ce_ = {0};                                                                          \
        if (!(o)) return DLOCK_EINVAL;                                                             \
        if (dl_check_count(v, min, what, arg, &ce_)) return dl_aobj_fail(o, &ce_);                 \
    } while (0)

#define CHECK_WAIT(o, wait_ms)                                                                     \
    do {                                                                                           \
        dl_err we_ = {0};                                                                          \
        if (!(o)) return DLOCK_EINVAL;                                                             \
        if (dl_sync_check_wait(wait_ms, &we_)) return dl_aobj_fail(o, &we_);                       \
    } while (0)

int dlock_async_semaphore_acquire(dlock_async_object *o, int64_t permits, int64_t wait_ms,
                                  dlock_async_object_fn cb, void *udata) {
    CHECK_COUNT(o, permits, 1, "acquire", "permits");
    CHECK_WAIT(o, wait_ms);
    return dl_aobj_start(o, DLOCK_KIND_SEMAPHORE, DL_AOP_SEM_ACQ, DL_AOR_SEM_ACQ, permits, NULL,
                         wait_ms, cb, udata);
}

int dlock_async_semaphore_release(dlock_async_object *o, int64_t permits, dlock_async_object_fn cb,
                                  void *udata) {
    CHECK_COUNT(o, permits, 1, "release", "permits");
    return dl_aobj_start(o, DLOCK_KIND_SEMAPHORE, DL_AOP_ONE, DL_AOR_SEM_ADD, permits, NULL, 0, cb,
                         udata);
}

int dlock_async_semaphore_add(dlock_async_object *o, int64_t delta, dlock_async_object_fn cb,
                              void *udata) {
    CHECK_COUNT(o, delta, -DLOCK_COUNT_MAX, "add", "delta");
    return dl_aobj_start(o, DLOCK_KIND_SEMAPHORE, DL_AOP_ONE, DL_AOR_SEM_ADD, delta, NULL, 0, cb,
                         udata);
}

int dlock_async_semaphore_try_set(dlock_async_object *o, int64_t permits, dlock_async_object_fn cb,
                                  void *udata) {
    CHECK_COUNT(o, permits, 0, "try_set", "permits");
    return dl_aobj_start(o, DLOCK_KIND_SEMAPHORE, DL_AOP_ONE, DL_AOR_SEM_SET, permits, NULL, 0, cb,
                         udata);
}

int dlock_async_semaphore_available(dlock_async_object *o, dlock_async_object_fn cb, void *udata) {
    if (!o) return DLOCK_EINVAL;
    return dl_aobj_start(o, DLOCK_KIND_SEMAPHORE, DL_AOP_ONE, DL_AOR_GET, 0, NULL, 0, cb, udata);
}

int dlock_async_permits_acquire(dlock_async_object *o, int64_t wait_ms, int64_t lease_ms,
                                dlock_async_object_fn cb, void *udata) {
    CHECK_WAIT(o, wait_ms);
    if (lease_ms < 0)
        return dl_aobj_fail(o, &(dl_err){DLOCK_EINVAL, "lease must be > 0 ms, or DLOCK_WATCHDOG"});
    /* the permit's id: random, the same for every attempt of this acquire */
    char hex[DLOCK_PERMIT_ID_LEN + 1], raw[DL_PERMIT_RAW];
    dl_err err;
    if (dl_random_hex(hex, DL_PERMIT_RAW, &err)) return dl_aobj_fail(o, &err);
    for (int i = 0; i < DL_PERMIT_RAW; i++) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char ch = hex[2 * i + j];
            v = v * 16 + (ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
        }
        raw[i] = (char)v;
    }
    return dl_aobj_start(o, DLOCK_KIND_PERMIT_SEMAPHORE, DL_AOP_PM_ACQ, DL_AOR_PM_ACQ, lease_ms,
                         raw, wait_ms, cb, udata);
}

/* A permit id as issued (DLOCK_PERMIT_ID_LEN hex characters) into its raw
 * bytes; else DLOCK_EINVAL recorded on o. */
static int id_raw(dlock_async_object *o, const char *id, const char *what,
                  char raw[DL_PERMIT_RAW]) {
    size_t n = id ? strnlen(id, DLOCK_PERMIT_ID_LEN + 1) : 0;
    int ok = n == DLOCK_PERMIT_ID_LEN;
    for (size_t i = 0; ok && i < n; i += 2) {
        int v = 0;
        for (size_t j = i; ok && j < i + 2; j++) {
            char ch = (char)(id[j] | 0x20);
            ok = (id[j] >= '0' && id[j] <= '9') || (ch >= 'a' && ch <= 'f');
            v = v * 16 + (id[j] <= '9' ? id[j] - '0' : ch - 'a' + 10);
        }
        raw[i / 2] = (char)v;
    }
    if (ok) return DLOCK_OK;
    dl_err err;
    dl_seterr(&err, DLOCK_EINVAL, "%s: a permit id is %d hex characters", what,
              DLOCK_PERMIT_ID_LEN);
    return dl_aobj_fail(o, &err);
}

int dlock_async_permits_release(dlock_async_object *o, const char *id, dlock_async_object_fn cb,
                                void *udata) {
    if (!o) return DLOCK_EINVAL;
    char raw[DL_PERMIT_RAW];
    if (id_raw(o, id, "permit release", raw)) return DLOCK_EINVAL;
    return dl_aobj_start(o, DLOCK_KIND_PERMIT_SEMAPHORE, DL_AOP_ONE, DL_AOR_PM_REL, 0, raw, 0, cb,
                         udata);
}

int dlock_async_permits_renew(dlock_async_object *o, const char *id, int64_t lease_ms,
                              dlock_async_object_fn cb, void *udata) {
    if (!o) return DLOCK_EINVAL;
    char raw[DL_PERMIT_RAW];
    if (id_raw(o, id, "permit renew", raw)) return DLOCK_EINVAL;
    if (lease_ms <= 0) {
        dl_err err;
        dl_seterr(&err, DLOCK_EINVAL, "permit renew: lease must be > 0 ms (got %lld)",
                  (long long)lease_ms);
        return dl_aobj_fail(o, &err);
    }
    return dl_aobj_start(o, DLOCK_KIND_PERMIT_SEMAPHORE, DL_AOP_ONE, DL_AOR_PM_RENEW, lease_ms,
                         raw, 0, cb, udata);
}

int dlock_async_permits_available(dlock_async_object *o, dlock_async_object_fn cb, void *udata) {
    if (!o) return DLOCK_EINVAL;
    return dl_aobj_start(o, DLOCK_KIND_PERMIT_SEMAPHORE, DL_AOP_ONE, DL_AOR_PM_AVAIL, 0, NULL, 0,
                         cb, udata);
}

int dlock_async_permits_try_set(dlock_async_object *o, int64_t permits, dlock_async_object_fn cb,
                                void *udata) {
    CHECK_COUNT(o, permits, 0, "permit try_set", "permits");
    return dl_aobj_start(o, DLOCK_KIND_PERMIT_SEMAPHORE, DL_AOP_ONE, DL_AOR_PM_SET, permits, NULL,
                         0, cb, udata);
}

int dlock_async_latch_count_down(dlock_async_object *o, int64_t k, dlock_async_object_fn cb,
                                 void *udata) {
    CHECK_COUNT(o, k, 1, "latch count_down", "k");
    return dl_aobj_start(o, DLOCK_KIND_LATCH, DL_AOP_ONE, DL_AOR_LA_CD, k, NULL, 0, cb, udata);
}

int dlock_async_latch_await(dlock_async_object *o, int64_t wait_ms, dlock_async_object_fn cb,
                            void *udata) {
    CHECK_WAIT(o, wait_ms);
    return dl_aobj_start(o, DLOCK_KIND_LATCH, DL_AOP_LA_AWAIT, DL_AOR_GET, 0, NULL, wait_ms, cb,
                         udata);
}

int dlock_async_latch_try_set(dlock_async_object *o, int64_t count, dlock_async_object_fn cb,
                              void *udata) {
    CHECK_COUNT(o, count, 1, "latch try_set", "count");
    return dl_aobj_start(o, DLOCK_KIND_LATCH, DL_AOP_ONE, DL_AOR_LA_SET, count, NULL, 0, cb, udata);
}

int dlock_async_latch_count(dlock_async_object *o, dlock_async_object_fn cb, void *udata) {
    if (!o) return DLOCK_EINVAL;
    return dl_aobj_start(o, DLOCK_KIND_LATCH, DL_AOP_ONE, DL_AOR_GET, 0, NULL, 0, cb, udata);
}

int dlock_async_permits_add(dlock_async_object *o, int64_t delta, dlock_async_object_fn cb,
                            void *udata) {
    CHECK_COUNT(o, delta, -DLOCK_COUNT_MAX, "permit add", "delta");
    return dl_aobj_start(o, DLOCK_KIND_PERMIT_SEMAPHORE, DL_AOP_ONE, DL_AOR_PM_ADD, delta, NULL, 0,
                         cb, udata);
}

int dlock_async_latch_set(dlock_async_object *o, int64_t count, dlock_async_object_fn cb,
                          void *udata) {
    CHECK_COUNT(o, count, 0, "latch set", "count");
    return dl_aobj_start(o, DLOCK_KIND_LATCH, DL_AOP_ONE, DL_AOR_LA_FORCE, count, NULL, 0, cb,
                         udata);
}
