/* The async client's binding to its event loop: which sockets it watches
 * for what (a slot each), and one timer for all of its own, kept in a
 * binary heap by due time. What changed is told to the adapter at the end
 * of each entry point (dl_aloop_sync), so that a burst of changes costs the
 * loop one call each. */
#include <stdlib.h>
#include <string.h>

#include "async.h"

void dl_aloop_init(dl_aloop *lp, const dlock_async_adapter *ad) {
    memset(lp, 0, sizeof *lp);
    if (ad) {
        lp->ad = *ad;
        lp->has_ad = 1;
    }
    for (int i = 0; i < DLOCK_ASYNC_SLOTS; i++) lp->fd[i] = lp->told_fd[i] = -1;
    lp->told_at = -1;
}

void dl_aloop_want(dl_aloop *lp, int slot, int fd, int events) {
    if (fd < 0) events = 0;
    /* a socket about to be closed (or replaced) is let go of at once: the
     * loop must not watch a descriptor number that may be reused */
    if (lp->told_fd[slot] >= 0 && (lp->told_fd[slot] != fd || !events)) {
        if (lp->has_ad && lp->ad.watch) lp->ad.watch(lp->ad.data, slot, lp->told_fd[slot], 0);
        lp->told_fd[slot] = -1;
        lp->told_ev[slot] = 0;
    }
    lp->fd[slot] = events ? fd : -1;
    lp->ev[slot] = events;
}

static void swap(dl_aloop *lp, size_t a, size_t b) {
    dl_atimer *t = lp->heap[a];
    lp->heap[a] = lp->heap[b];
    lp->heap[b] = t;
    lp->heap[a]->idx = a + 1;
    lp->heap[b]->idx = b + 1;
}

static void sift_up(dl_aloop *lp, size_t i) {
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (lp->heap[up]->at <= lp->heap[i]->at) break;
        swap(lp, i, up);
        i = up;
    }
}

static void sift_down(dl_aloop *lp, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < lp->n && lp->heap[l]->at < lp->heap[m]->at) m = l;
        if (r < lp->n && lp->heap[r]->at < lp->heap[m]->at) m = r;
        if (m == i) return;
        swap(lp, i, m);
        i = m;
    }
}

void dl_atimer_stop(dl_aloop *lp, dl_atimer *t) {
    if (!t->idx) return;
    size_t i = t->idx - 1;
    t->idx = 0;
    lp->n--;
    if (i == lp->n) return;
    lp->heap[i] = lp->heap[lp->n];
    lp->heap[i]->idx = i + 1;
    sift_down(lp, i);
    sift_up(lp, i);
}

int dl_aloop_reserve(dl_aloop *lp, size_t n) {
    if (n <= lp->cap) return DLOCK_OK;
    size_t cap = lp->cap ? lp->cap : 16;
    while (cap < n) cap *= 2;
    dl_atimer **h = realloc(lp->heap, cap * sizeof *h);
    if (!h) return DLOCK_ENOMEM;
    lp->heap = h;
    lp->cap = cap;
    return DLOCK_OK;
}

int dl_atimer_arm(dl_aloop *lp, dl_atimer *t, int64_t at) {
    if (t->idx) {
        t->at = at;
        sift_down(lp, t->idx - 1);
        sift_up(lp, t->idx - 1);
        return DLOCK_OK;
    }
    if (lp->n == lp->cap && dl_aloop_reserve(lp, lp->cap + 1)) return DLOCK_ENOMEM;
    t->at = at;
    lp->heap[lp->n] = t;
    t->idx = ++lp->n;
    sift_up(lp, lp->n - 1);
    return DLOCK_OK;
}

void dl_aloop_run(dl_aloop *lp) {
    int64_t now = dl_now_ms();
    /* a timer that a callback arms again for now runs at the next call,
     * not in this one: bounded work per call */
    size_t budget = lp->n;
    while (budget-- > 0 && lp->n && lp->heap[0]->at <= now) {
        dl_atimer *t = lp->heap[0];
        dl_atimer_stop(lp, t);
        t->fn(t);
    }
}

int64_t dl_aloop_next(const dl_aloop *lp) { return lp->n ? lp->heap[0]->at : -1; }

void dl_aloop_sync(dl_aloop *lp) {
    if (!lp->has_ad) return;
    for (int i = 0; i < DLOCK_ASYNC_SLOTS; i++) {
        if (lp->fd[i] == lp->told_fd[i] && lp->ev[i] == lp->told_ev[i]) continue;
        if (lp->ad.watch) lp->ad.watch(lp->ad.data, i, lp->fd[i], lp->ev[i]);
        lp->told_fd[i] = lp->fd[i];
        lp->told_ev[i] = lp->ev[i];
    }
    int64_t at = dl_aloop_next(lp);
    if (at == lp->told_at) return;
    lp->told_at = at;
    if (!lp->ad.timer) return;
    if (at < 0) {
        lp->ad.timer(lp->ad.data, -1);
    } else {
        int64_t ms = at - dl_now_ms();
        lp->ad.timer(lp->ad.data, ms > 0 ? ms : 0);
    }
}

void dl_aloop_close(dl_aloop *lp) {
    for (int i = 0; i < DLOCK_ASYNC_SLOTS; i++) dl_aloop_want(lp, i, -1, 0);
    while (lp->n) dl_atimer_stop(lp, lp->heap[0]);
    if (lp->has_ad) {
        if (lp->told_at >= 0 && lp->ad.timer) lp->ad.timer(lp->ad.data, -1);
        if (lp->ad.cleanup) lp->ad.cleanup(lp->ad.data);
    }
    lp->has_ad = 0;
    free(lp->heap);
    lp->heap = NULL;
    lp->cap = 0;
}
