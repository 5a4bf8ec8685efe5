/* A worker process: `threads` service threads, each taking buy attempts from
 * the shared queue until it is empty. One process stands for one instance of
 * the seeds' voucher service; its threads for the requests it serves at once. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flash_sale.h"

int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void sleep_us(int64_t us) {
    if (us <= 0) return;
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

typedef struct wctx {
    const config *cfg;
    shared *sh;
    enum mode m;
    dlock_client *c;
    store *db;
    dlock_idworker *ids;
    int index;
} wctx;

/* The process-local lock of the `local` mode: a mutex serializes this
 * process's threads, but not the other processes. */
static pthread_mutex_t local_mu = PTHREAD_MUTEX_INITIALIZER;

/* Records the first error message of the run. */
static void note_error(shared *sh, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_error(shared *sh, const char *fmt, ...) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&sh->errmsg_set, &expected, 1)) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sh->errmsg, sizeof sh->errmsg, fmt, ap);
    va_end(ap);
}

static int db_error(wctx *w) {
    note_error(w->sh, "%s", store_errmsg(w->db));
    return OUT_ERROR;
}

/* The check-then-act of the seeds' voucher service, without any protection
 * of its own:
 *   1. one order per user: does this user have an order for the voucher?
 *   2. is there stock?
 *   3. (the business logic takes a moment: window_us)
 *   4. stock = stock - 1 (fenced: only with a newer fencing token)
 *   5. insert the order, its id from the ID worker.
 * hold_voucher/release_voucher bracket steps 2-4 (the dlock modes). */
typedef struct guard {
    int (*acquire)(wctx *w, int voucher, uint64_t *fence); /* 0 ok, else outcome */
    void (*release)(wctx *w);
} guard;

static int decrement(wctx *w, int voucher, long long stock, const uint64_t *fence) {
    /* --pause-holder: the holder that sees the last unit stops (as a GC pause
     * or SIGSTOP would) past its lease, then goes on as if it still held */
    if (w->cfg->pause_holder && (w->m == M_DLOCK || w->m == M_FENCED) && stock == 1) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&w->sh->pause_claimed, &expected, 1)) {
            if (w->cfg->verbose)
                fprintf(stderr, "  (worker %d: pausing %" PRId64 " ms while holding the lock "
                        "on the last unit)\n", w->index, w->cfg->pause_ms);
            sleep_us(w->cfg->pause_ms * 1000);
        }
    }
    sleep_us(w->cfg->window_us);
    if (fence) {
        int ok = 0;
        if (store_decrement_fenced(w->db, voucher, *fence, &ok)) return db_error(w);
        if (!ok) {
            atomic_fetch_add(&w->sh->stale, 1);
            return OUT_STALE;
        }
        return 0;
    }
    if (store_decrement(w->db, voucher)) return db_error(w);
    return 0;
}

static int place_order(wctx *w, int user, int voucher) {
    uint64_t id = 0;
    int rc = dlock_idworker_next(w->ids, &id);
    if (rc) {
        note_error(w->sh, "ID worker: %s", dlock_idworker_errmsg(w->ids));
        return OUT_ERROR;
    }
    int r = store_insert_order(w->db, id, user, voucher);
    if (r < 0) return db_error(w);
    if (r > 0) return OUT_DUPLICATE;
    return OUT_ORDERED;
}

/* none / local */
static int buy_unprotected(wctx *w, int user, int voucher) {
    int has = 0;
    long long stock = 0;
    if (store_has_order(w->db, user, voucher, &has)) return db_error(w);
    if (has) return OUT_DUPLICATE;
    if (store_stock(w->db, voucher, &stock)) return db_error(w);
    if (stock < 1) return OUT_SOLDOUT;
    int r = decrement(w, voucher, stock, NULL);
    if (r) return r;
    return place_order(w, user, voucher);
}

static int buy_local(wctx *w, int user, int voucher) {
    pthread_mutex_lock(&local_mu);
    int r = buy_unprotected(w, user, voucher);
    pthread_mutex_unlock(&local_mu);
    return r;
}

static int lock_named(wctx *w, const char *kind, int id, int64_t lease_ms, dlock_lock **out,
                      uint64_t *fence) {
    char name[96];
    /* fixed names (no run id): with --url, later runs reuse the same few
     * fence counters instead of leaving new ones behind each time */
    snprintf(name, sizeof name, "flash-sale:%s:%d", kind, id);
    dlock_lock *l = NULL;
    int rc = dlock_lock_new(w->c, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l);
    if (rc) {
        note_error(w->sh, "lock %s: %s", name, dlock_errmsg(w->c));
        return OUT_ERROR;
    }
    rc = dlock_acquire(l, w->cfg->lock_wait_ms, lease_ms, fence);
    if (rc) {
        note_error(w->sh, "acquire %s: %s: %s", name, dlock_strerror(rc), dlock_lock_errmsg(l));
        dlock_lock_free(l);
        return OUT_ERROR;
    }
    *out = l;
    return 0;
}

static void unlock(wctx *w, dlock_lock *l) {
    int rc = dlock_release(l);
    if (rc == DLOCK_ELOST) atomic_fetch_add(&w->sh->lost, 1);
    else if (rc) note_error(w->sh, "release: %s: %s", dlock_strerror(rc), dlock_lock_errmsg(l));
    dlock_lock_free(l);
}

/* dlock / fenced: a per-user lock makes "one order per user" atomic; inside
 * it a per-voucher lock makes check-stock-then-decrement atomic. The voucher
 * lock is held only for the stock part, so different users' order inserts
 * run in parallel. Lock order is always user, then voucher. */
static int buy_dlock(wctx *w, int user, int voucher) {
    dlock_lock *ul = NULL, *vl = NULL;
    uint64_t fence = 0;
    int r = lock_named(w, "user", user, w->cfg->user_lease_ms, &ul, NULL);
    if (r) return r;
    int has = 0;
    long long stock = 0;
    if (store_has_order(w->db, user, voucher, &has)) {
        r = db_error(w);
        goto out;
    }
    if (has) {
        r = OUT_DUPLICATE;
        goto out;
    }
    r = lock_named(w, "voucher", voucher, w->cfg->voucher_lease_ms, &vl, &fence);
    if (r) goto out;
    if (store_stock(w->db, voucher, &stock)) r = db_error(w);
    else if (stock < 1) r = OUT_SOLDOUT;
    else r = decrement(w, voucher, stock, w->m == M_FENCED ? &fence : NULL);
    unlock(w, vl);
    if (r) goto out;
    r = place_order(w, user, voucher);
out:
    unlock(w, ul);
    return r;
}

/* optimistic: no lock; the database's conditional update is the check, the
 * UNIQUE (user_id, voucher_id) constraint enforces one order per user. Both
 * in one transaction so that a refused order gives its unit back. The update
 * comes first, as in the seeds: on InnoDB its row lock on the voucher queues
 * the transactions of one voucher before they touch the unique index. */
#define OUT_RETRY (-1) /* InnoDB chose the transaction as a deadlock victim */
#define OPTIMISTIC_TRIES 20

/* a failed step inside the transaction */
static int tx_error(wctx *w) { return store_retryable(w->db) ? OUT_RETRY : db_error(w); }

static int optimistic_once(wctx *w, int user, int voucher) {
    if (store_begin(w->db)) return tx_error(w);
    int ok = 0, r;
    uint64_t id = 0;
    if (dlock_idworker_next(w->ids, &id)) {
        note_error(w->sh, "ID worker: %s", dlock_idworker_errmsg(w->ids));
        r = OUT_ERROR;
    } else {
        int ins = 0;
        if (store_decrement_if_stock(w->db, voucher, &ok)) r = tx_error(w);
        else if (!ok) r = OUT_SOLDOUT;
        else if ((ins = store_insert_order(w->db, id, user, voucher)) < 0) r = tx_error(w);
        else r = ins > 0 ? OUT_DUPLICATE : OUT_ORDERED;
    }
    if (r == OUT_ORDERED ? store_commit(w->db) : store_rollback(w->db)) {
        r = r == OUT_ORDERED ? tx_error(w) : db_error(w);
        store_rollback(w->db);
    }
    return r;
}

/* InnoDB locks rows (and index gaps), not the whole database as SQLite's
 * BEGIN IMMEDIATE: now and then it picks a transaction as a deadlock victim
 * and rolls it back. That transaction did nothing, so it runs again (what any
 * application on InnoDB does); the runs are counted (JSON "retries"). */
static int buy_optimistic(wctx *w, int user, int voucher) {
    for (int tries = 1;; tries++) {
        int r = optimistic_once(w, user, voucher);
        if (r != OUT_RETRY) return r;
        if (tries == OPTIMISTIC_TRIES) return db_error(w);
        atomic_fetch_add(&w->sh->retries, 1);
        sleep_us(100 * tries);
    }
}

static void *thread_main(void *arg) {
    wctx *w = arg;
    shared *sh = w->sh;
    char err[400];
    dlock_idworker_options io = {0};
    if (store_open(w->cfg->db, &w->db, err, sizeof err)) {
        note_error(sh, "%s", err);
        atomic_store(&sh->fatal, 1);
    } else if (dlock_idworker_new(w->c, "order", &io, &w->ids)) {
        note_error(sh, "ID worker: %s", dlock_errmsg(w->c));
        atomic_store(&sh->fatal, 1);
    }
    atomic_fetch_add(&sh->ready, 1);
    while (!atomic_load(&sh->go) && !atomic_load(&sh->fatal)) sleep_us(500);
    while (!atomic_load(&sh->fatal)) {
        long i = atomic_fetch_add(&sh->next, 1);
        if (i >= w->cfg->attempts) break;
        int user = sh->user[i], voucher = sh->voucher[i];
        int64_t t0 = now_us();
        int r;
        switch (w->m) {
        case M_NONE: r = buy_unprotected(w, user, voucher); break;
        case M_LOCAL: r = buy_local(w, user, voucher); break;
        case M_OPTIMISTIC: r = buy_optimistic(w, user, voucher); break;
        default: r = buy_dlock(w, user, voucher); break;
        }
        sh->latency_us[i] = (float)(now_us() - t0);
        sh->outcome[i] = (int8_t)r;
        if (r == OUT_ERROR) atomic_fetch_add(&sh->errors, 1);
        atomic_fetch_add(&sh->done, 1);
    }
    long long end = now_us(), seen = atomic_load(&sh->end_us);
    while (end > seen && !atomic_compare_exchange_weak(&sh->end_us, &seen, end)) {
    }
    dlock_idworker_free(w->ids);
    store_close(w->db);
    return NULL;
}

int worker_main(const config *cfg, shared *sh, enum mode m, int index) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = cfg->redis_url;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    if (rc) {
        note_error(sh, "worker %d: cannot connect to Redis: %s", index, dlock_errmsg(c));
        atomic_store(&sh->fatal, 1);
        dlock_client_free(c);
        return 1;
    }
    int n = cfg->threads;
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    wctx *ctx = calloc((size_t)n, sizeof *ctx);
    int started = 0;
    if (!tids || !ctx) {
        note_error(sh, "worker %d: out of memory", index);
        atomic_store(&sh->fatal, 1);
    } else {
        for (; started < n; started++) {
            ctx[started] = (wctx){.cfg = cfg, .sh = sh, .m = m, .c = c, .index = index};
            if (pthread_create(&tids[started], NULL, thread_main, &ctx[started]) != 0) {
                note_error(sh, "worker %d: cannot create a thread", index);
                atomic_store(&sh->fatal, 1);
                break;
            }
        }
    }
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    free(tids);
    free(ctx);
    dlock_client_free(c);
    return atomic_load(&sh->fatal) ? 1 : 0;
}
