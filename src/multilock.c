/* Multi-lock: several locks, all or nothing, within one wait bound. Locks are
 * taken in one canonical order (name, then the write side before anything
 * else on the same name, then kind), so that two callers taking overlapping
 * sets cannot deadlock whatever order they list them in. */
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

static int rank(dlock_kind k) { return k == DLOCK_KIND_WRITE ? 0 : (int)k; }

int dl_multi_cmp(const char *an, size_t alen, dlock_kind ak, const char *bn, size_t blen,
                 dlock_kind bk) {
    int c = memcmp(an, bn, alen < blen ? alen : blen);
    if (c) return c;
    if (alen != blen) return alen < blen ? -1 : 1;
    return rank(ak) - rank(bk);
}

static int canon_cmp(const dlock_lock *a, const dlock_lock *b) {
    return dl_multi_cmp(a->h.name, a->h.name_len, a->kind, b->h.name, b->h.name_len, b->kind);
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

/* The wait left before deadline, as dl_acquire takes it. */
static int64_t wait_left(int64_t wait_ms, int64_t deadline) {
    if (wait_ms == 0) return 0;
    if (deadline == DL_INF_DEADLINE) return DLOCK_WAIT_FOREVER;
    int64_t left = deadline - dl_now_ms();
    return left < 0 ? 0 : left;
}

/* Each lock's lease starts when that lock is taken, so the first locks of a
 * set that had to wait for a later one may have run out by the time the set
 * is held (another client could then hold them too). Once every lock is
 * held, the lease of each one taken before the last is restarted,
 * owner-checked (as Redisson's MultiLock re-expires its set): every lock then
 * has its full lease, and dlock_multi_valid_ms is about lease_ms. A lock
 * found lost by then (its lease ran out, the watchdog lost it) is taken
 * again, after giving back the locks after it in the canonical order (so
 * that the order that prevents deadlocks still holds), within what is left
 * of the wait; when nothing is left the set fails. */
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
    for (size_t i = 0; i < n; i++) dl_cancel_note(&locks[i]->h.cancel);
    int64_t deadline = dl_deadline(wait_ms);
    int rc = DLOCK_OK;
    size_t taken = 0; /* locks[order[0..taken)] are held by this call */
    for (;;) {
        size_t last = taken;
        for (; taken < n; taken++) {
            dlock_lock *l = locks[order[taken]];
            uint64_t fence = 0;
            rc = dl_acquire(l, wait_left(wait_ms, deadline), lease_ms, &fence);
            if (rc) {
                /* a wait that ran out on a later lock is the whole set's timeout */
                if (rc == DLOCK_EBUSY && wait_ms != 0) rc = DLOCK_ETIMEDOUT;
                break;
            }
            last = taken;
            if (fences) fences[order[taken]] = fence;
        }
        if (rc) break;
        /* the whole set is held: restart the earlier leases */
        size_t lost = n;
        for (size_t i = 0; i < n && lost == n; i++) {
            if (i == last) continue; /* just taken: its lease is whole */
            dlock_lock *l = locks[order[i]];
            dl_err err = {0};
            rc = dl_lock_reexpire(l, &err);
            if (rc == DLOCK_ELOST) lost = i;
            if (rc) dl_handle_fail(&l->h, &err);
            if (rc && rc != DLOCK_ELOST) break;
        }
        if (lost == n) break; /* rc: DLOCK_OK, or the failure of a re-expiry */
        /* locks[order[lost]] no longer held (the handle says so): the ones
         * after it are given back and taken again after it */
        while (taken > lost + 1) dlock_release(locks[order[--taken]]);
        taken = lost;
        if (wait_ms == 0 || (deadline != DL_INF_DEADLINE && dl_now_ms() >= deadline)) {
            rc = wait_ms == 0 ? DLOCK_ELOST : DLOCK_ETIMEDOUT;
            break;
        }
    }
    if (rc) {
        while (taken > 0) {
            dlock_lock *l = locks[order[--taken]];
            if (dlock_lock_holding(l)) dlock_release(l);
        }
    }
    free(order);
    return rc;
}

int64_t dlock_multi_valid_ms(dlock_lock *const *locks, size_t n) {
    if (!locks || n == 0) return 0;
    int64_t least = INT64_MAX;
    for (size_t i = 0; i < n; i++) {
        int64_t v = dlock_lock_valid_ms(locks[i]);
        if (v < least) least = v;
    }
    return least;
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
