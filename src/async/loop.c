/* The async client's binding to its event loop: which sockets it watches
 * for what (a slot each, the table grown as connections come), and one timer for all of its own, kept in a
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
    lp->told_at = -1;
}

int dl_aloop_slot_new(dl_aloop *lp, void *owner) {
    int i = 0;
    while (i < lp->nslots && lp->slots[i].used) i++;
    if (i == lp->nslots) {
        dl_aslot *s = realloc(lp->slots, (size_t)(lp->nslots + 1) * sizeof *s);
        if (!s) return -1;
        lp->slots = s;
        lp->nslots++;
    }
    lp->slots[i] = (dl_aslot){.used = 1, .owner = owner, .fd = -1, .told_fd = -1};
    return i;
}

void dl_aloop_slot_free(dl_aloop *lp, int slot) {
    if (slot < 0 || slot >= lp->nslots || !lp->slots[slot].used) return;
    dl_aloop_want(lp, slot, -1, 0);
    if (lp->slots[slot].refused) lp->nrefused--;
    lp->slots[slot] = (dl_aslot){.fd = -1, .told_fd = -1};
}

void *dl_aloop_owner(const dl_aloop *lp, int fd) {
    if (fd < 0) return NULL;
    for (int i = 0; i < lp->nslots; i++)
        if (lp->slots[i].used && lp->slots[i].fd == fd) return lp->slots[i].owner;
    return NULL;
}

void dl_aloop_want(dl_aloop *lp, int slot, int fd, int events) {
    if (slot < 0 || slot >= lp->nslots) return; /* a client that could not start */
    dl_aslot *s = &lp->slots[slot];
    if (fd < 0) events = 0;
    /* a socket about to be closed (or replaced) is let go of at once: the
     * loop must not watch a descriptor number that may be reused */
    if (s->told_fd >= 0 && (s->told_fd != fd || !events)) {
        if (lp->has_ad && lp->ad.watch) (void)lp->ad.watch(lp->ad.data, slot, s->told_fd, 0);
        s->told_fd = -1;
        s->told_ev = 0;
    }
    if (s->refused && (s->fd != fd || !events)) {
        s->refused = 0; /* the socket refused is gone: nothing to tell */
        lp->nrefused--;
    }
    s->fd = events ? fd : -1;
    s->ev = events;
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
    /* a refused watch first: its connection would otherwise wait for
     * events that never come until its deadline */
    for (int i = 0; lp->nrefused > 0 && i < lp->nslots; i++) {
        dl_aslot *s = &lp->slots[i];
        if (!s->refused) continue;
        s->refused = 0;
        lp->nrefused--;
        if (s->fd >= 0 && s->told_fd != s->fd && lp->refused &&
            lp->refused(lp, i, s->owner))
            return;
    }
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

int64_t dl_aloop_next(const dl_aloop *lp) {
    if (lp->nrefused > 0) return 0;
    return lp->n ? lp->heap[0]->at : -1;
}

void dl_aloop_sync(dl_aloop *lp) {
    if (!lp->has_ad) return;
    for (int i = 0; i < lp->nslots; i++) {
        dl_aslot *s = &lp->slots[i];
        if (s->fd == s->told_fd && s->ev == s->told_ev) continue;
        if (s->fd < 0) continue; /* let go of already (dl_aloop_want) */
        int bad = lp->ad.watch ? lp->ad.watch(lp->ad.data, i, s->fd, s->ev) : 0;
        if (bad) {
            /* the adapter watches nothing in this slot now */
            s->told_fd = -1;
            s->told_ev = 0;
            if (!s->refused) {
                s->refused = 1;
                lp->nrefused++;
            }
            continue;
        }
        s->told_fd = s->fd;
        s->told_ev = s->ev;
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
    for (int i = 0; i < lp->nslots; i++) dl_aloop_want(lp, i, -1, 0);
    while (lp->n) dl_atimer_stop(lp, lp->heap[0]);
    if (lp->has_ad) {
        if (lp->told_at >= 0 && lp->ad.timer) lp->ad.timer(lp->ad.data, -1);
        if (lp->ad.cleanup) lp->ad.cleanup(lp->ad.data);
    }
    lp->has_ad = 0;
    free(lp->slots);
    lp->slots = NULL;
    lp->nslots = lp->nrefused = 0;
    free(lp->heap);
    lp->heap = NULL;
    lp->cap = 0;
}
