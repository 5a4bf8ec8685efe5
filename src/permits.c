/* The permit-expirable semaphore (Redisson's RPermitExpirableSemaphore):
 * the handle, its permit ids and its records, over the backend's
 * permits_* calls (Redis: permits_redis.c, the layout and the scripts). A
 * permit id is 16 random bytes; the API shows them as 32 hex characters (as
 * Redisson's does) and the calls take them decoded, so a permit taken by
 * either client can be released or renewed by the other given its id.
 *
 * Permits taken with DLOCK_WATCHDOG are renewed by the client's watchdog
 * through a generic dl_lease each (the backend's permits_lease names its
 * renewal; owner: the permit id). The handle keeps a record of every permit
 * it holds, watchdog or explicit lease, with what dlock_permits_valid_ms
 * needs: the monotonic time just before the request that started the lease
 * (for a watchdog permit, its last confirmed renewal). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

#define ID_RAW DL_PERMIT_RAW

typedef struct wd_permit {
    struct wd_permit *next;
    char id[DLOCK_PERMIT_ID_LEN + 1]; /* hex, as issued */
    char raw[ID_RAW];                 /* the ZSET member */
    int watchdog;              /* 1: renewed by the client's watchdog through lease */
    dl_lease lease;            /* registered with the watchdog while in the list */
    int64_t expires_at;        /* explicit lease: monotonic ms it surely lasts until */
    dlock_permits *owner;
} wd_permit;

struct dlock_permits {
    dl_object o;               /* client, name, channel, message */
    wd_permit *wd;             /* the permits this handle holds (see the top) */
    dlock_permit_lost_fn lost_fn; /* read by the watchdog, under its mutex */
    void *lost_ud;
};

/* The watchdog found a permit lost (its thread, its mutex held). */
static void permit_lost(dl_lease *lease, int reason) {
    wd_permit *w = (wd_permit *)((char *)lease - offsetof(wd_permit, lease));
    dlock_permits *p = w->owner;
    if (p->lost_fn) p->lost_fn(p, w->id, reason, p->lost_ud);
}

typedef struct lost_set {
    dlock_permits *p;
    dlock_permit_lost_fn fn;
    void *ud;
} lost_set;

static void set_lost(void *arg) {
    lost_set *s = arg;
    s->p->lost_fn = s->fn;
    s->p->lost_ud = s->ud;
}

void dlock_permits_on_lost(dlock_permits *p, dlock_permit_lost_fn fn, void *userdata) {
    if (!p) return;
    lost_set s = {p, fn, userdata};
    dl_watchdog_locked(p->o.h.c, set_lost, &s);
}

static int pm_fail(dlock_permits *p, const dl_err *err) { return dl_handle_fail(&p->o.h, err); }

static int pm_ok(dlock_permits *p) { return dl_handle_ok(&p->o.h); }

int dlock_permits_new(dlock_client *c, const char *name, size_t name_len, dlock_permits **out) {
    if (out) *out = NULL;
    int rc;
    dlock_permits *p = dl_object_new(c, sizeof *p, DLOCK_KIND_PERMIT_SEMAPHORE, name, name_len,
                                     "redisson_sc:", "dlock_permits_new", out != NULL, &rc);
    if (!p) return rc;
    dl_err err = {0};
    if (c->backend->permits_init && c->backend->permits_init(&p->o, &err)) {
        dlock_permits_free(p);
        return dl_client_fail(c, &err);
    }
    *out = p;
    dl_client_ok(c);
    return DLOCK_OK;
}

void dlock_permits_free(dlock_permits *p) {
    if (!p) return;
    while (p->wd) {
        wd_permit *w = p->wd;
        p->wd = w->next;
        if (w->watchdog) dl_watchdog_unregister(p->o.h.c, &w->lease);
        free(w);
    }
    if (p->o.h.c->backend->permits_destroy) p->o.h.c->backend->permits_destroy(&p->o);
    dl_handle_clear(&p->o.h);
    free(p);
}

const char *dlock_permits_errmsg(const dlock_permits *p) {
    return p ? p->o.h.errmsg : "no permit semaphore (NULL handle)";
}

/* Takes the record of the permit (raw id) out of the handle's list (a watchdog
 * permit is unregistered); NULL when the handle holds no such permit. */
static wd_permit *wd_take(dlock_permits *p, const char *raw) {
    for (wd_permit **pp = &p->wd; *pp; pp = &(*pp)->next) {
        wd_permit *w = *pp;
        if (!memcmp(w->raw, raw, ID_RAW)) {
            *pp = w->next;
            if (w->watchdog) dl_watchdog_unregister(p->o.h.c, &w->lease);
            w->next = NULL;
            return w;
        }
    }
    return NULL;
}

/* Puts w in the list (a watchdog permit registered with the watchdog). */
static int wd_put(dlock_permits *p, wd_permit *w, dl_err *err) {
    if (w->watchdog) {
        int rc = dl_watchdog_register(p->o.h.c, &w->lease, err);
        if (rc) return rc;
    }
    w->next = p->wd;
    p->wd = w;
    return DLOCK_OK;
}

/* Drops the records of explicit-lease permits past their lease (the handle
 * would otherwise keep one per permit never released). */
static void prune_expired(dlock_permits *p) {
    int64_t now = dl_now_ms();
    for (wd_permit **pp = &p->wd; *pp;) {
        wd_permit *w = *pp;
        if (!w->watchdog && w->expires_at <= now) {
            *pp = w->next;
            free(w);
        } else {
            pp = &w->next;
        }
    }
}

static wd_permit *find(const dlock_permits *p, const char *raw) {
    for (wd_permit *w = p->wd; w; w = w->next)
        if (!memcmp(w->raw, raw, ID_RAW)) return w;
    return NULL;
}

/* A permit id as issued: DLOCK_PERMIT_ID_LEN hex characters. */
static int check_id(const char *id, const char *what, dl_err *err) {
    if (!id) return dl_seterr(err, DLOCK_EINVAL, "%s: NULL permit id", what);
    size_t n = strnlen(id, DLOCK_PERMIT_ID_LEN + 1);
    int ok = n == DLOCK_PERMIT_ID_LEN;
    for (size_t i = 0; ok && i < n; i++)
        ok = (id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f') ||
             (id[i] >= 'A' && id[i] <= 'F');
    if (!ok)
        return dl_seterr(err, DLOCK_EINVAL, "%s: a permit id is %d hex characters", what,
                         DLOCK_PERMIT_ID_LEN);
    return DLOCK_OK;
}

/* A valid hex id (check_id) to its 16 raw bytes. */
static void id_raw(const char *hex, char raw[ID_RAW]) {
    for (int i = 0; i < ID_RAW; i++) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char ch = hex[2 * i + j];
            v = v * 16 + (ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
        }
        raw[i] = (char)v;
    }
}

/* hex: a valid id (check_id); the record keeps it in lower case. */
static wd_permit *wd_new(dlock_permits *p, const char *hex, int watchdog) {
    wd_permit *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    for (int i = 0; i < DLOCK_PERMIT_ID_LEN; i++) w->id[i] = (char)(hex[i] | (hex[i] > '9' ? 0x20 : 0));
    id_raw(hex, w->raw);
    w->watchdog = watchdog;
    p->o.h.c->backend->permits_lease(&p->o, &w->lease);
    w->lease.lease_ms = p->o.h.c->watchdog_lease_ms;
    w->lease.owner = w->raw;
    w->lease.owner_len = ID_RAW;
    atomic_init(&w->lease.lost, 0);
    atomic_init(&w->lease.last_ok, (long long)dl_now_ms());
    w->lease.on_lost = permit_lost;
    w->owner = p;
    return w;
}

/* Gives back the permit (raw id; best effort, after a local failure). */
static void release_quietly(dlock_permits *p, const char *raw) {
    int released = 0;
    dl_err ignored = {0};
    p->o.h.c->backend->permits_release(&p->o, raw, &released, &ignored);
}

int dlock_permits_acquire(dlock_permits *p, int64_t wait_ms, int64_t lease_ms,
                          char id[DLOCK_PERMIT_ID_LEN + 1]) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!id) {
        dl_seterr(&err, DLOCK_EINVAL, "permit acquire: NULL id buffer");
        return pm_fail(p, &err);
    }
    id[0] = '\0';
    if (dl_sync_check_wait(wait_ms, &err)) return pm_fail(p, &err);
    if (lease_ms < 0) {
        dl_seterr(&err, DLOCK_EINVAL, "permit acquire: lease must be > 0 ms, or DLOCK_WATCHDOG");
        return pm_fail(p, &err);
    }
    dl_cancel_note(&p->o.h.cancel);
    char pid[DLOCK_PERMIT_ID_LEN + 1];
    int rc = dl_random_hex(pid, DLOCK_PERMIT_ID_LEN / 2, &err);
    if (rc) return pm_fail(p, &err);
    prune_expired(p);
    wd_permit *w = wd_new(p, pid, lease_ms == DLOCK_WATCHDOG);
    if (!w) {
        dl_seterr(&err, DLOCK_ENOMEM, "out of memory");
        return pm_fail(p, &err);
    }
    int64_t lease = lease_ms == DLOCK_WATCHDOG ? p->o.h.c->watchdog_lease_ms : lease_ms;
    int64_t t0 = 0;
    rc = p->o.h.c->backend->permits_acquire(&p->o, w->raw, wait_ms, lease, &t0, &err);
    if (!rc) {
        /* the lease started on the server after t0 */
        atomic_store(&w->lease.last_ok, (long long)t0);
        w->expires_at = t0 + lease;
        rc = wd_put(p, w, &err);
        if (rc) release_quietly(p, w->raw); /* the lease runs out otherwise */
        else w = NULL;
    }
    free(w);
    if (rc) return pm_fail(p, &err);
    memcpy(id, pid, sizeof pid);
    return pm_ok(p);
}

int dlock_permits_release(dlock_permits *p, const char *id) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    char nm[80];
    if (check_id(id, "permit release", &err)) return pm_fail(p, &err);
    char raw[ID_RAW];
    id_raw(id, raw);
    /* stop renewing first, or a renewal racing the release would report the
     * permit lost */
    wd_permit *w = wd_take(p, raw);
    int released = 0;
    int rc = p->o.h.c->backend->permits_release(&p->o, raw, &released, &err);
    if (rc) {
        if (w) {
            dl_err e2 = {0};
            if (wd_put(p, w, &e2) == DLOCK_OK) w = NULL; /* still ours: keep renewing */
        }
        free(w);
        return pm_fail(p, &err);
    }
    free(w);
    if (!released) {
        dl_seterr(&err, DLOCK_ENOTOWNER,
                  "permit release: permit %.32s of '%s' is not out on lease (expired, released "
                  "or never issued)",
                  id, dl_name_msg(p->o.h.name, p->o.h.name_len, nm, sizeof nm));
        return pm_fail(p, &err);
    }
    return pm_ok(p);
}

int dlock_permits_renew(dlock_permits *p, const char *id, int64_t lease_ms) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    char nm[80];
    if (check_id(id, "permit renew", &err)) return pm_fail(p, &err);
    char raw[ID_RAW];
    id_raw(id, raw);
    if (lease_ms <= 0) {
        dl_seterr(&err, DLOCK_EINVAL, "permit renew: lease must be > 0 ms (got %lld)",
                  (long long)lease_ms);
        return pm_fail(p, &err);
    }
    /* a watchdog permit becomes an explicit-lease permit (as dlock_extend) */
    wd_permit *w = wd_take(p, raw);
    int renewed = 0;
    int64_t t0 = dl_now_ms();
    int rc = p->o.h.c->backend->permits_renew(&p->o, raw, lease_ms, &renewed, &err);
    if (rc) {
        if (w) {
            dl_err e2 = {0};
            if (wd_put(p, w, &e2) == DLOCK_OK) w = NULL;
        }
        free(w);
        return pm_fail(p, &err);
    }
    if (!renewed) {
        free(w);
        dl_seterr(&err, DLOCK_ENOTOWNER,
                  "permit renew: permit %.32s of '%s' is not out on lease (expired, released or "
                  "never issued)",
                  id, dl_name_msg(p->o.h.name, p->o.h.name_len, nm, sizeof nm));
        return pm_fail(p, &err);
    }
    /* held now with an explicit lease from t0: this handle tracks it (also an
     * id it did not take) */
    if (!w) w = wd_new(p, id, 0);
    if (w) {
        w->watchdog = 0;
        w->expires_at = t0 + lease_ms;
        (void)wd_put(p, w, &err); /* cannot fail without the watchdog */
    }
    return pm_ok(p);
}

int64_t dlock_permits_valid_ms(const dlock_permits *p, const char *id) {
    dl_err ignored = {0};
    if (!p || check_id(id, "permit valid_ms", &ignored)) return 0;
    char raw[ID_RAW];
    id_raw(id, raw);
    const wd_permit *w = find(p, raw);
    if (!w) return 0;
    int64_t until = w->expires_at;
    if (w->watchdog) {
        if (atomic_load(&w->lease.lost)) return 0;
        until = (int64_t)atomic_load(&w->lease.last_ok) + w->lease.lease_ms;
    }
    int64_t left = until - dl_now_ms();
    return left > 0 ? left : 0;
}

int dlock_permits_available(dlock_permits *p, int64_t *permits) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!permits) {
        dl_seterr(&err, DLOCK_EINVAL, "permit available: NULL result pointer");
        return pm_fail(p, &err);
    }
    *permits = 0;
    int rc = p->o.h.c->backend->permits_available(&p->o, permits, &err);
    return rc ? pm_fail(p, &err) : pm_ok(p);
}

int dlock_permits_try_set(dlock_permits *p, int64_t permits, int *set) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    if (set) *set = 0;
    if (!set) {
        dl_seterr(&err, DLOCK_EINVAL, "permit try_set: NULL result pointer");
        return pm_fail(p, &err);
    }
    if (dl_check_count(permits, 0, "permit try_set", "permits", &err)) return pm_fail(p, &err);
    int rc = p->o.h.c->backend->permits_try_set(&p->o, permits, set, &err);
    return rc ? pm_fail(p, &err) : pm_ok(p);
}

int dlock_permits_add(dlock_permits *p, int64_t delta) {
    if (!p) return DLOCK_EINVAL;
    dl_err err = {0};
    if (dl_check_count(delta, -DLOCK_COUNT_MAX, "permit add", "delta", &err))
        return pm_fail(p, &err);
    int rc = p->o.h.c->backend->permits_add(&p->o, delta, &err);
    return rc ? pm_fail(p, &err) : pm_ok(p);
}

int dlock_permits_cancel(dlock_permits *p) {
    return p ? dl_cancel_ask(p->o.h.c, &p->o.h.cancel) : DLOCK_EINVAL;
}
