/* Lock handles: the kind-independent part of acquire, release, extend and
 * the handle's queries. What differs per kind is in lock_<kind>.c. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

/* The most surplus holds a release gives back (a bound, not a count: one
 * lost reply leaves one). */
#define DL_SURPLUS_MAX 16

/* Every kind, by dlock_kind value. */
static const dl_kind_ops *dl_kind_lookup(dlock_kind kind) {
    static const dl_kind_ops *const kinds[] = {
        [DLOCK_KIND_PLAIN] = &dl_plain_ops,
        [DLOCK_KIND_REENTRANT] = &dl_reentrant_ops,
        [DLOCK_KIND_FAIR] = &dl_fair_ops,
        [DLOCK_KIND_READ] = &dl_read_ops,
        [DLOCK_KIND_WRITE] = &dl_write_ops,
    };
    if ((int)kind <= 0 || (size_t)kind >= sizeof kinds / sizeof kinds[0]) return NULL;
    return kinds[kind];
}

static int lock_fail(dlock_lock *l, const dl_err *err) { return dl_handle_fail(&l->h, err); }

static int lock_ok(dlock_lock *l) { return dl_handle_ok(&l->h); }

static void lease_lost(dl_lease *lease, int reason) {
    dlock_lock *l = (dlock_lock *)((char *)lease - offsetof(dlock_lock, lease));
    if (l->lost_fn) l->lost_fn(l, reason, l->lost_ud);
}

int dlock_lock_new(dlock_client *c, const char *name, size_t name_len, dlock_kind kind,
                   dlock_lock **out) {
    if (!out) return DLOCK_EINVAL;
    *out = NULL;
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    int rc = dl_check_name(name, &name_len, &err);
    if (!rc) rc = dl_check_cluster_name(c, name, name_len, &err);
    const dl_kind_ops *ops = dl_kind_lookup(kind);
    if (!rc && !ops) rc = dl_seterr(&err, DLOCK_EINVAL, "unknown lock kind %d", (int)kind);
    if (!rc && c->unusable) rc = dl_seterr(&err, DLOCK_EINVAL, "client failed to open; free it");
    if (rc) return dl_client_fail(c, &err);
    if (!(c->backend->kinds & (1u << kind))) {
        dl_seterr(&err, DLOCK_ENOTSUP, "%s locks are not supported by the %s backend", ops->name,
                  c->backend->name);
        return dl_client_fail(c, &err);
    }
    dlock_lock *l = calloc(1, sizeof *l);
    if (!l) goto oom;
    l->h.c = c;
    l->kind = kind;
    l->ops = ops;
    l->h.name = malloc(name_len + 1);
    if (!l->h.name) goto oom;
    memcpy(l->h.name, name, name_len);
    l->h.name[name_len] = '\0';
    l->h.name_len = name_len;
    rc = c->backend->lock_init ? c->backend->lock_init(l, &err) : DLOCK_OK;
    if (rc) goto fail;
    l->lease.renew = ops->renew;
    l->lease.key = l->h.name;
    l->lease.key_len = l->h.name_len;
    l->lease.owner = l->token;
    l->lease.on_lost = lease_lost;
    atomic_init(&l->lease.lost, 0);
    atomic_init(&l->lease.last_ok, 0);
    dl_cancel_init(&l->h.cancel);
    *out = l;
    dl_client_ok(c);
    return DLOCK_OK;
oom:
    dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
fail:
    if (l) {
        if (c->backend->lock_destroy) c->backend->lock_destroy(l);
        free(l->h.name);
        free(l->h.channel);
        free(l);
    }
    return dl_client_fail(c, &err);
}

static void wd_off(dlock_lock *l) {
    if (l->watchdog) {
        dl_watchdog_unregister(l->h.c, &l->lease);
        l->watchdog = 0;
    }
}

static int wd_on(dlock_lock *l, dl_err *err) {
    l->lease.owner_len = l->token_len;
    l->lease.lease_ms = l->lease_ms;
    l->lease.who = l->h.c->who != NULL;
    atomic_store(&l->lease.releasing, 0);
    int rc = dl_watchdog_register(l->h.c, &l->lease, err);
    if (!rc) l->watchdog = 1;
    return rc;
}

void dlock_lock_free(dlock_lock *l) {
    if (!l) return;
    while (l->holds > 0) {
        if (dlock_release(l) != DLOCK_OK) break;
    }
    /* holds a release could not give back are no handle's from now on: the
     * owner's next last release among its other handles gives them back
     * (the surplus, above), or their lease ends them. Kept in the owner's
     * sum, they would stay on the server for as long as another handle of
     * the same owner re-entered them, each release renewing their lease. */
    if (l->holds > 0) dl_set_holds(l, 0);
    wd_off(l);
    if (l->h.c->backend->lock_destroy) l->h.c->backend->lock_destroy(l);
    dl_handle_clear(&l->h);
    free(l->who_key);
    free(l->who_val);
    free(l);
}

/* ---- cancelling a wait ---- */

int dlock_lock_cancel(dlock_lock *l) {
    return l ? dl_cancel_ask(l->h.c, &l->h.cancel) : DLOCK_EINVAL;
}

const char *dlock_lock_errmsg(const dlock_lock *l) {
    return l ? l->h.errmsg : "no lock (NULL handle)";
}


int dlock_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, uint64_t *fence) {
    if (!l) return DLOCK_EINVAL;
    dl_cancel_note(&l->h.cancel); /* earlier cancels are not for this call */
    return dl_acquire(l, wait_ms, lease_ms, fence);
}

int dl_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, uint64_t *fence) {
    dl_err err = {0};
    if (wait_ms < DLOCK_WAIT_FOREVER) {
        dl_seterr(&err, DLOCK_EINVAL, "wait must be >= 0 ms, or DLOCK_WAIT_FOREVER");
        return lock_fail(l, &err);
    }
    if (lease_ms < 0) {
        dl_seterr(&err, DLOCK_EINVAL, "lease must be > 0 ms, or DLOCK_WATCHDOG");
        return lock_fail(l, &err);
    }
    int reenter = 0;
    if (l->holds > 0 && dlock_lock_valid_ms(l) == 0) {
        /* a hold whose release failed (I/O) and whose lease has surely run
         * out since: nothing is left to re-enter, start afresh */
        wd_off(l);
        dl_set_holds(l, 0);
        l->token[0] = '\0';
        l->token_len = 0;
    }
    if (l->holds > 0) {
        if (!l->ops->reentrant) {
            dl_seterr(&err, DLOCK_EINVAL,
                      "this handle already holds the lock (%s locks are not reentrant)",
                      l->ops->name);
            return lock_fail(l, &err);
        }
        /* same thread? Reentrant owners are "<client id>:<thread id>[:...]";
         * compare without rewriting l->token, which the watchdog may be
         * reading */
        char me[64];
        int n = snprintf(me, sizeof me, "%s:%ld", l->h.c->id, dl_thread_id());
        size_t ml = (size_t)n;
        int same = l->token_len >= ml && !memcmp(l->token, me, ml) &&
                   (l->token_len == ml || l->token[ml] == ':');
        if (!same) {
            dl_seterr(&err, DLOCK_EINVAL, "this handle is held by another thread");
            return lock_fail(l, &err);
        }
        reenter = 1;
    } else {
        int rc =
            l->h.c->backend->owner ? l->h.c->backend->owner(l, &err) : dl_owner_thread(l, &err);
        if (rc) return lock_fail(l, &err);
    }
    int64_t lease = lease_ms == DLOCK_WATCHDOG ? l->h.c->watchdog_lease_ms : lease_ms;
    dl_outcome t;
    memset(&t, 0, sizeof t);
    int rc = l->h.c->backend->acquire(l, wait_ms, lease_ms, &t, &err);
    if (rc == DLOCK_ESERVER && strstr(err.msg, "WRONGTYPE")) {
        /* the name is taken by a lock of another layout (a plain lock's
         * STRING under a reentrant acquire...): held by someone else, and
         * its release would not wake this kind's waiters, so at once */
        char nm[80];
        dl_seterr(&err, DLOCK_EBUSY,
                  "lock '%s' is held as another kind of lock, not as a %s lock (dlock status "
                  "shows which)",
                  dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm), l->ops->name);
        rc = DLOCK_EBUSY;
    }
    if (rc) {
        if (!reenter) {
            l->token[0] = '\0';
            l->token_len = 0;
        }
        return lock_fail(l, &err);
    }
    dl_set_holds(l, l->holds + 1);
    l->fence = t.fence;
    /* a re-entry with an explicit lease of a hold the watchdog keeps leaves it
     * kept: the watchdog's lease stays the handle's (the re-entry's own lease
     * only raised the key's expiry) */
    if (!(reenter && l->watchdog)) l->lease_ms = lease;
    atomic_store(&l->lease.lost, 0);
    if (fence) *fence = t.fence;
    /* backends without the library's watchdog keep their holds themselves
     * (a session, their own renewal) */
    if (!(l->h.c->backend->caps & DL_CAP_WATCHDOG)) return lock_ok(l);
    if (lease_ms == DLOCK_WATCHDOG && !l->watchdog) {
        rc = wd_on(l, &err);
        if (rc) {
            dl_err saved = err;
            dlock_release(l); /* best effort; the lease runs out otherwise */
            dl_set_holds(l, 0);
            return lock_fail(l, &saved);
        }
    } else if (lease_ms != DLOCK_WATCHDOG && !reenter) {
        wd_off(l);
    }
    return lock_ok(l);
}

/* Marks the handle as no longer holding, after the server said so. */
static int mark_lost(dlock_lock *l, const char *op, dl_err *err) {
    char nm[80];
    wd_off(l);
    dl_set_holds(l, 0);
    atomic_store(&l->lease.lost, 1);
    return dl_seterr(err, DLOCK_ELOST,
                     "%s: lock '%s' was no longer held by this owner (lease expired or taken "
                     "over)",
                     op, dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm));
}

int dlock_release(dlock_lock *l) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (l->holds <= 0) {
        dl_seterr(&err, DLOCK_ENOTHELD, "release: this handle does not hold the lock");
        return lock_fail(l, &err);
    }
    int final = l->holds == 1 && l->watchdog;
    /* the final release stops the renewals (or one racing the release would
     * report the lock lost) but stays registered while it is in flight: a
     * release stuck on a dead link must not hold the lost callback back past
     * the lease's due time */
    if (final) atomic_store(&l->lease.releasing, 1);
    long long res = 0;
    int rc = l->h.c->backend->release(l, &res, &err);
    if (rc) {
        if (final) atomic_store(&l->lease.releasing, 0); /* renewed again */
        return lock_fail(l, &err);
    }
    if (res == -1) {
        mark_lost(l, "release", &err);
        return lock_fail(l, &err);
    }
    int64_t owner_holds = dl_set_holds(l, res == 1 ? 0 : l->holds - 1);
    if (res == 0 && owner_holds == 0 && !dl_topo_fanout(l->h.c)) {
        /* the server still counts holds of this owner that none of this
         * client's handles has (owner.c): give them back, so
         * that the lock is free now and not at the end of its lease */
        for (int i = 0; i < DL_SURPLUS_MAX && res == 0; i++) {
            dl_err ignored = {0};
            if (l->h.c->backend->release(l, &res, &ignored) != DLOCK_OK) break;
        }
    }
    if (l->holds == 0) {
        wd_off(l);
        l->token[0] = '\0';
        l->token_len = 0;
    }
    return lock_ok(l);
}

int dlock_extend(dlock_lock *l, int64_t lease_ms) {
    if (!l) return DLOCK_EINVAL;
    dl_err err = {0};
    if (lease_ms <= 0) {
        dl_seterr(&err, DLOCK_EINVAL, "extend: lease must be > 0 ms");
        return lock_fail(l, &err);
    }
    if (l->holds <= 0) {
        dl_seterr(&err, DLOCK_ENOTHELD, "extend: this handle does not hold the lock");
        return lock_fail(l, &err);
    }
    int was_wd = l->watchdog;
    int64_t t0 = dl_now_ms();
    int64_t had = t0 + dlock_lock_valid_ms(l); /* the watchdog's renewals counted */
    wd_off(l);
    long long res = 0;
    int rc = l->h.c->backend->extend ? l->h.c->backend->extend(l, lease_ms, &res, &err)
                                     : dl_seterr(&err, DLOCK_ENOTSUP,
                                                 "extend is not supported by the %s backend "
                                                 "(its locks live as long as the session)",
                                                 l->h.c->backend->name);
    if (rc) {
        /* the extend may have reached the server (a reply lost, too few
         * replicas acknowledging it): the hold is counted valid for the
         * shorter of what it had and the new lease from t0 */
        int64_t until = t0 + lease_ms - dl_lease_margin(l, lease_ms);
        if (until < had) {
            l->expires_at = until;
            if (was_wd) /* the watchdog counts from its last renewal */
                atomic_store(&l->lease.last_ok,
                             (long long)(until - l->lease_ms + dl_lease_margin(l, l->lease_ms)));
        }
        if (was_wd) {
            dl_err e2 = {0};
            wd_on(l, &e2);
        }
        return lock_fail(l, &err);
    }
    if (res != 1) {
        mark_lost(l, "extend", &err);
        return lock_fail(l, &err);
    }
    l->lease_ms = lease_ms;
    l->expires_at = t0 + lease_ms - dl_lease_margin(l, lease_ms);
    return lock_ok(l);
}

int dl_lock_reexpire(dlock_lock *l, dl_err *err) {
    if (l->holds <= 0)
        return dl_seterr(err, DLOCK_ENOTHELD, "this handle does not hold the lock");
    /* a hold kept by a session (or by the backend's own renewal) has no
     * lease of ours to restart */
    if (!l->h.c->backend->extend || l->expires_at == INT64_MAX) return DLOCK_OK;
    if (atomic_load(&l->lease.lost)) return mark_lost(l, "acquire", err);
    long long res = 0;
    int64_t t0 = dl_now_ms();
    /* the watchdog stays on: a renewal racing this one is owner-checked too */
    int rc = l->h.c->backend->extend(l, l->lease_ms, &res, err);
    if (rc) return rc;
    if (res != 1) return mark_lost(l, "acquire", err);
    l->expires_at = t0 + l->lease_ms - dl_lease_margin(l, l->lease_ms);
    return DLOCK_OK;
}

int dlock_lock_holding(const dlock_lock *l) { return l && l->holds > 0; }

int64_t dlock_lock_valid_ms(const dlock_lock *l) { return l ? dl_hold_valid_ms(l) : 0; }

int dlock_lock_is_lost(const dlock_lock *l) { return l ? atomic_load(&l->lease.lost) : 0; }

void dlock_lock_on_lost(dlock_lock *l, dlock_lost_fn fn, void *userdata) {
    if (!l) return;
    /* the watchdog reads these under its mutex: take the lock out meanwhile */
    int was_wd = l->watchdog;
    wd_off(l);
    l->lost_fn = fn;
    l->lost_ud = userdata;
    if (was_wd) {
        dl_err err = {0};
        wd_on(l, &err);
    }
}

const char *dlock_lock_token(const dlock_lock *l) { return l && l->holds > 0 ? l->token : ""; }

uint64_t dlock_lock_fence(const dlock_lock *l) { return l ? l->fence : 0; }

const char *dlock_lock_name(const dlock_lock *l, size_t *len) {
    if (!l) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = l->h.name_len;
    return l->h.name;
}

dlock_kind dlock_lock_kind(const dlock_lock *l) { return l ? l->kind : (dlock_kind)0; }

int dlock_lock_check(dlock_lock *l, int *held, int64_t *count) {
    if (!l || !held) return DLOCK_EINVAL;
    dl_err err = {0};
    int64_t n = 0;
    *held = 0;
    if (count) *count = 0;
    if (l->holds <= 0) return lock_ok(l);
    int rc = l->h.c->backend->check(l, held, &n, &err);
    if (rc) return lock_fail(l, &err);
    if (count) *count = n;
    return lock_ok(l);
}
