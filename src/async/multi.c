/* The async multi-lock (dlock_async_multi_acquire): several lock handles of
 * one client taken all or nothing within one wait bound, as
 * dlock_multi_acquire (src/multilock.c) takes blocking ones, and in its
 * canonical order (dl_multi_cmp), so that async and blocking sets on the
 * same names cannot deadlock each other either.
 *
 * A set is a client of the public lock calls: a small state object drives
 * dlock_async_acquire, dlock_async_extend and dlock_async_release on the
 * handles through their callbacks, one step after the other:
 *
 *   ACQUIRE   the handles in canonical order, each waiting for what is left
 *             of the set's wait;
 *   RESTART   once all are held, the leases of those taken before the last
 *             one restarted (owner-checked extend: DLOCK_ELOST when the
 *             lease ran out meanwhile); a DLOCK_WATCHDOG hold is kept by
 *             the watchdog, which renewed it while the set waited, and is
 *             checked instead (not found lost, still valid);
 *   RETAKE    a lock found no longer held: the ones after it (and a lost
 *             watchdog hold itself) given back together, then ACQUIRE goes
 *             on from it, within the wait;
 *   GIVEBACK  the set failed: every lock it took released together, then
 *             the callback with the first failure.
 *
 * Only one step's operations are pending at a time: one acquire or extend,
 * or the releases of a RETAKE or GIVEBACK. */
#include <stdlib.h>
#include <string.h>

#include "async.h"

enum { ST_ACQUIRE, ST_RESTART, ST_RETAKE, ST_GIVEBACK, ST_RELEASE };

typedef struct amulti {
    size_t n;
    dlock_async_lock **locks;  /* the caller's order (a copy) */
    size_t *order;             /* canonical position -> index in locks */
    uint64_t *fences;          /* by index in locks */
    unsigned char *held;       /* by canonical position: taken by this set */
    int64_t wait_ms, lease_ms, deadline;
    dlock_async_multi_fn cb;
    void *ud;
    int state;
    size_t taken;              /* canonical positions [0, taken) were taken */
    size_t last;               /* the one taken last (its lease is whole) */
    size_t cur;                /* RESTART: the position checked now */
    size_t lost;               /* RETAKE: the position to take again */
    size_t out;                /* operations pending */
    int code;                  /* the set's outcome once failed (first failure) */
    int cancelled;             /* a RETAKE release was cancelled: end the set */
} amulti;

/* The handle dlock_async_multi_cancel is cancelling now (its callback runs
 * inside that call): an operation ended by it is the set's own cancel, any
 * other DLOCK_ECANCELED comes from a free or a cancel of the handle. */
static _Thread_local const dlock_async_lock *cancelling;

static void advance(amulti *m);

static void multi_free(amulti *m) {
    free(m->locks);
    free(m->order);
    free(m->fences);
    free(m->held);
    free(m);
}

static void finish(amulti *m) {
    /* the callback may free the handles or the client: nothing of them is
     * touched after it, and m is the set's own memory */
    m->cb(m->locks, m->n, m->code, m->code || m->state == ST_RELEASE ? NULL : m->fences, m->ud);
    multi_free(m);
}

static size_t pos_of(const amulti *m, const dlock_async_lock *l) {
    for (size_t i = 0; i < m->n; i++)
        if (m->locks[m->order[i]] == l) return i;
    return m->n;
}

static void fail(amulti *m, int code) {
    if (!m->code) m->code = code;
    m->state = ST_GIVEBACK;
}

static int64_t wait_left(const amulti *m) {
    if (m->wait_ms == 0) return DLOCK_NOWAIT;
    if (m->deadline == DL_INF_DEADLINE) return DLOCK_WAIT_FOREVER;
    int64_t left = m->deadline - dl_now_ms();
    return left < 0 ? 0 : left;
}

static void acquired(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    amulti *m = ud;
    (void)l;
    m->out--;
    if (code) {
        /* a wait that ran out on a later lock is the whole set's timeout */
        fail(m, code == DLOCK_EBUSY && m->wait_ms != 0 ? DLOCK_ETIMEDOUT : code);
    } else {
        m->held[m->taken] = 1;
        m->fences[m->order[m->taken]] = fence;
        m->last = m->taken++;
    }
    advance(m);
}

static void restarted(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    amulti *m = ud;
    (void)fence;
    m->out--;
    if (!code) {
        m->cur++;
    } else if (code == DLOCK_ELOST) {
        /* its lease ran out (or it was taken over): the handle holds nothing */
        m->held[m->cur] = 0;
        m->lost = m->cur;
        m->state = ST_RETAKE;
    } else {
        /* a cancel by the handle itself (or its free) leaves it to the
         * caller: no operation is started on it again */
        if (code == DLOCK_ECANCELED && cancelling != l) m->held[m->cur] = 0;
        fail(m, code);
    }
    advance(m);
}

static void released(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    amulti *m = ud;
    (void)fence;
    m->out--;
    size_t p = pos_of(m, l);
    if (code == DLOCK_ECANCELED && cancelling == l && dl_alock_holds(l) > 0) {
        /* the set's cancel met a give back: the release goes on (the set
         * ends once it is done) */
        if (m->state == ST_RETAKE) m->cancelled = 1;
        if (dlock_async_release(l, released, m) == DLOCK_OK) {
            m->out++;
            return;
        }
    } else if (code == DLOCK_ECANCELED && m->state == ST_RETAKE) {
        m->cancelled = 1;
    }
    if (p < m->n) m->held[p] = 0;
    if (m->out == 0) advance(m);
}

/* Starts a release of each position in [from, to) the set holds; returns
 * how many are pending. */
static size_t give_back(amulti *m, size_t from, size_t to) {
    for (size_t i = to; i > from; i--) {
        if (!m->held[i - 1]) continue;
        if (dlock_async_release(m->locks[m->order[i - 1]], released, m) == DLOCK_OK) m->out++;
        else m->held[i - 1] = 0; /* refused (the client is being freed...) */
    }
    return m->out;
}

/* Runs the set's next step (nothing pending): starts its operations, or
 * ends the set. */
static void advance(amulti *m) {
    for (;;) {
        switch (m->state) {
        case ST_ACQUIRE:
            if (m->taken == m->n) {
                m->state = ST_RESTART;
                m->cur = 0;
                continue;
            } else {
                dlock_async_lock *l = m->locks[m->order[m->taken]];
                int rc = dlock_async_acquire(l, wait_left(m), m->lease_ms, acquired, m);
                if (!rc) {
                    m->out++;
                    return;
                }
                fail(m, rc);
                continue;
            }
        case ST_RESTART:
            if (m->cur == m->last) m->cur++; /* just taken: its lease is whole */
            if (m->cur >= m->n) {
                finish(m); /* every lock held, each with about its lease */
                return;
            } else {
                dlock_async_lock *l = m->locks[m->order[m->cur]];
                if (m->lease_ms == DLOCK_WATCHDOG) {
                    /* renewed by the watchdog while the set waited */
                    if (dlock_async_lock_is_lost(l) || dlock_async_lock_valid_ms(l) <= 0) {
                        m->lost = m->cur;
                        m->state = ST_RETAKE;
                    } else {
                        m->cur++;
                    }
                    continue;
                }
                int rc = dlock_async_extend(l, m->lease_ms, restarted, m);
                if (!rc) {
                    m->out++;
                    return;
                }
                fail(m, rc);
                continue;
            }
        case ST_RETAKE:
            /* the locks after the lost one (and a lost watchdog hold itself,
             * which its handle still counts) given back, so that the
             * canonical order holds when they are taken again after it */
            if (!m->cancelled && give_back(m, m->lost, m->n)) return;
            if (m->cancelled) {
                fail(m, DLOCK_ECANCELED);
                continue;
            }
            if (m->wait_ms == 0) {
                fail(m, DLOCK_ELOST);
                continue;
            }
            if (m->deadline != DL_INF_DEADLINE && dl_now_ms() >= m->deadline) {
                fail(m, DLOCK_ETIMEDOUT);
                continue;
            }
            m->taken = m->lost;
            m->state = ST_ACQUIRE;
            continue;
        case ST_GIVEBACK:
            if (give_back(m, 0, m->n)) return;
            finish(m);
            return;
        default: /* ST_RELEASE: dlock_async_multi_release's */
            finish(m);
            return;
        }
    }
}

static int bad(dlock_async_lock *const *locks, size_t n, const char *msg) {
    /* the message goes to the client of the first handle there is */
    for (size_t i = 0; locks && i < n; i++)
        if (locks[i]) {
            dl_aclient *c = dl_alock_client(locks[i]);
            snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
            break;
        }
    return DLOCK_EINVAL;
}

/* Checks a set: no NULL, no handle twice, one client. */
static int check_set(dlock_async_lock *const *locks, size_t n) {
    if (!locks || n == 0) return bad(locks, n, "an empty set of locks");
    for (size_t i = 0; i < n; i++) {
        if (!locks[i]) return bad(locks, n, "a NULL lock handle in the set");
        if (dl_alock_client(locks[i]) != dl_alock_client(locks[0]))
            return bad(locks, n, "the handles of a set must belong to one client");
        for (size_t j = 0; j < i; j++)
            if (locks[j] == locks[i]) return bad(locks, n, "the same handle twice in the set");
    }
    return DLOCK_OK;
}

static amulti *multi_new(dlock_async_lock *const *locks, size_t n) {
    amulti *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->n = n;
    m->locks = malloc(n * sizeof *m->locks);
    m->order = malloc(n * sizeof *m->order);
    m->fences = calloc(n, sizeof *m->fences);
    m->held = calloc(n, 1);
    if (!m->locks || !m->order || !m->fences || !m->held) {
        multi_free(m);
        return NULL;
    }
    memcpy(m->locks, locks, n * sizeof *locks);
    return m;
}

static int canon_cmp(const dlock_async_lock *a, const dlock_async_lock *b) {
    const dl_akeys *ka = dl_alock_keys(a), *kb = dl_alock_keys(b);
    return dl_multi_cmp(ka->s[0], ka->len[0], ka->kind->kind, kb->s[0], kb->len[0],
                        kb->kind->kind);
}

int dlock_async_multi_acquire(dlock_async_lock *const *locks, size_t n, int64_t wait_ms,
                              int64_t lease_ms, dlock_async_multi_fn cb, void *udata) {
    int rc = check_set(locks, n);
    if (rc) return rc;
    if (!cb) return bad(locks, n, "NULL callback");
    if (wait_ms < DLOCK_WAIT_FOREVER)
        return bad(locks, n, "wait must be >= 0 ms, or DLOCK_WAIT_FOREVER");
    if (lease_ms == DLOCK_WATCHDOG) {
        /* the earlier holds would be checked on the client only (not
         * found lost, still valid): one the server forgot (a restart
         * without persistence) passed until the next renewal (the fault
         * explorer's async multi-lock workers), and an async extend would
         * end its renewals */
        bad(locks, n, "DLOCK_WATCHDOG leases are not supported by the async multi-lock yet: "
                      "give a lease > 0");
        return DLOCK_ENOTSUP;
    }
    if (lease_ms < 0) return bad(locks, n, "lease must be > 0 ms");
    amulti *m = multi_new(locks, n);
    if (!m) {
        snprintf(dl_alock_client(locks[0])->errmsg, DL_ERRMSG_MAX, "out of memory");
        return DLOCK_ENOMEM;
    }
    /* insertion sort of indices: sets are small */
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (j > 0 && canon_cmp(locks[m->order[j - 1]], locks[i]) > 0) {
            m->order[j] = m->order[j - 1];
            j--;
        }
        m->order[j] = i;
    }
    m->wait_ms = wait_ms;
    m->lease_ms = lease_ms;
    m->deadline = dl_deadline(wait_ms);
    m->cb = cb;
    m->ud = udata;
    m->state = ST_ACQUIRE;
    /* the first acquire is started here: refused, the set is not started
     * (its message on that handle) and the callback never runs */
    rc = dlock_async_acquire(locks[m->order[0]], wait_ms, lease_ms, acquired, m);
    if (rc) {
        multi_free(m);
        return rc;
    }
    m->out = 1;
    return DLOCK_OK;
}

int dlock_async_multi_cancel(dlock_async_lock *const *locks, size_t n) {
    int rc = check_set(locks, n);
    if (rc) return rc;
    /* one step of a set is pending at a time: its one acquire or extend,
     * or its releases (which go on: the set ends once they are done) */
    for (size_t i = 0; i < n; i++) {
        cancelling = locks[i];
        rc = dlock_async_cancel(locks[i]);
        cancelling = NULL;
        if (rc == DLOCK_OK) return DLOCK_OK;
    }
    return DLOCK_ENOTHELD;
}

int64_t dlock_async_multi_valid_ms(dlock_async_lock *const *locks, size_t n) {
    if (!locks || n == 0) return 0;
    int64_t least = INT64_MAX;
    for (size_t i = 0; i < n; i++) {
        int64_t v = dlock_async_lock_valid_ms(locks[i]);
        if (v < least) least = v;
    }
    return least;
}

static void one_released(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    amulti *m = ud;
    (void)l, (void)fence;
    if (code && !m->code) m->code = code;
    if (--m->out == 0) advance(m);
}

int dlock_async_multi_release(dlock_async_lock *const *locks, size_t n, dlock_async_multi_fn cb,
                              void *udata) {
    int rc = check_set(locks, n);
    if (rc) return rc;
    if (!cb) return bad(locks, n, "NULL callback");
    amulti *m = multi_new(locks, n);
    if (!m) {
        snprintf(dl_alock_client(locks[0])->errmsg, DL_ERRMSG_MAX, "out of memory");
        return DLOCK_ENOMEM;
    }
    m->cb = cb;
    m->ud = udata;
    m->state = ST_RELEASE;
    for (size_t i = n; i > 0; i--) {
        rc = dlock_async_release(locks[i - 1], one_released, m);
        if (!rc) m->out++;
        else if (!m->code) m->code = rc;
    }
    if (m->out == 0) {
        rc = m->code;
        multi_free(m);
        return rc;
    }
    return DLOCK_OK;
}
