/* Multi-lock: several locks, all or nothing, within one wait bound. Locks are
 * taken in one canonical order (name, then the write side before anything
 * else on the same name, then kind), so that two callers taking overlapping
 * sets cannot deadlock whatever order they list them in. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int rank(dlock_kind k) { return k == DLOCK_KIND_WRITE ? 0 : (int)k; }

static int canon_cmp(const dlock_lock *a, const dlock_lock *b) {
    size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
    int c = memcmp(a->name, b->name, n);
    if (c) return c;
    if (a->name_len != b->name_len) return a->name_len < b->name_len ? -1 : 1;
    return rank(a->kind) - rank(b->kind);
}

/* Insertion sort of indices: sets are small. */
static void canon_order(dlock_lock *const *locks, size_t n, size_t *order) {
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (j > 0 && canon_cmp(locks[order[j - 1]], locks[i]) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
}

int dlock_multi_acquire(dlock_lock *const *locks, size_t n, int64_t wait_ms, int64_t lease_ms,
                        uint64_t *fences) {
    if (!locks || n == 0 || wait_ms < DLOCK_WAIT_FOREVER || lease_ms < 0) return DLOCK_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!locks[i]) return DLOCK_EINVAL;
        for (size_t j = 0; j < i; j++)
            if (locks[j] == locks[i]) return DLOCK_EINVAL;
    }
    size_t *order = malloc(n * sizeof *order);
    if (!order) return DLOCK_ENOMEM;
    canon_order(locks, n, order);
    /* a cancel of a lock of the set from now on ends the wait for it (a
     * cancel of every lock ends the whole set's) */
    for (size_t i = 0; i < n; i++) dl_cancel_note(&locks[i]->cancel);
    int64_t deadline = dl_deadline(wait_ms);
    int rc = DLOCK_OK;
    size_t taken = 0;
    for (; taken < n; taken++) {
        dlock_lock *l = locks[order[taken]];
        int64_t left = DLOCK_WAIT_FOREVER;
        if (wait_ms == 0) {
            left = 0;
        } else if (deadline != DL_INF_DEADLINE) {
            left = deadline - dl_now_ms();
            if (left < 0) left = 0;
        }
        uint64_t fence = 0;
        rc = dl_acquire(l, left, lease_ms, &fence);
        if (rc) {
            /* a wait that ran out on a later lock is the whole set's timeout */
            if (rc == DLOCK_EBUSY && wait_ms != 0) rc = DLOCK_ETIMEDOUT;
            break;
        }
        if (fences) fences[order[taken]] = fence;
    }
    if (rc) {
        while (taken > 0) dlock_release(locks[order[--taken]]);
    }
    free(order);
    return rc;
}

int dlock_multi_release(dlock_lock *const *locks, size_t n) {
    if (!locks) return DLOCK_EINVAL;
    int first = DLOCK_OK;
    for (size_t i = n; i > 0; i--) {
        int rc = locks[i - 1] ? dlock_release(locks[i - 1]) : DLOCK_EINVAL;
        if (rc && !first) first = rc;
    }
    return first;
}
