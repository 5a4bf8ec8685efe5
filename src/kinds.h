/* The kinds layer (docs/design.md, "Layers"): lock handles and their
 * kinds, owners, waiting for a lock, the watchdog's lease renewal, holder
 * identity, the synchronizer objects, RedLock, and the backends' entries.
 * The wait and the renewal work on lock handles, so they sit here until
 * the handle base moves below. Included by every other file of src/. */
#ifndef DLOCK_KINDS_H
#define DLOCK_KINDS_H

#include "services.h"

/* lock_plain.c: KEYS lock, fence, waiters; ARGV token, lease, recheck, registered */
extern dl_script dl_script_plain_acquire;
/* lock_plain.c: KEYS lock, waiters; ARGV token, waiter channel prefix */
extern dl_script dl_script_plain_abandon;
extern dl_script dl_script_plain_release;
/* lock_reentrant.c: KEYS lock, fence; ARGV lease, owner -> {1, fence, n} | {0, pttl} */
extern dl_script dl_script_reentrant_acquire;
/* lock_reentrant.c: KEYS lock, channel; ARGV lease, owner, expected count
 * -> -1 not held | 0 still held | 1 released */
extern dl_script dl_script_reentrant_release;
/* lock_reentrant.c: KEYS lock; ARGV owner, lease -> 1 | 0 */
extern dl_script dl_script_reentrant_extend;   /* lock_plain.c: KEYS lock, channel; ARGV token */
extern dl_script dl_script_plain_extend;    /* lock_plain.c: KEYS lock; ARGV token, lease */
extern dl_script dl_script_force_unlock;    /* query.c */
/* lock_fair.c (the queue's keys: KEYS lock, fence, queue, deadlines, leases):
 * acquire: ARGV lease, owner, mode ('r' new or re-entry, 'w' queued before),
 *   queue ('1' join, '0' try once), W, keep-alive, joining ('1' not
 *   subscribed yet), channel prefix -> {1, fence, n} | {0, ms}
 * release: ARGV channel prefix, lease, owner, expected count -> -1 | 0 | 1
 * abandon: ARGV channel prefix, owner -> 1 a grant given back | 0 left the queue */
extern dl_script dl_script_fair_acquire;
extern dl_script dl_script_fair_release;
extern dl_script dl_script_fair_abandon;
extern dl_script dl_script_fair_extend;     /* KEYS lock; ARGV owner, lease */
/* lock_rw.c: read acquire: KEYS lock, fence, timeout prefix, waiting
 * writers; ARGV lease, owner. Write acquire: KEYS lock, fence, waiting
 * writers; ARGV lease, owner, queue. Read release: KEYS lock, channel,
 * timeout prefix, "{N}"; ARGV owner, expected count. Write release: KEYS
 * lock, channel, "{N}"; ARGV owner, lease, expected count. Read extend: KEYS
 * lock, timeout prefix, "{N}"; ARGV owner, lease. Write extend: KEYS lock,
 * "{N}"; ARGV owner, lease. Write abandon: KEYS waiting writers, lock,
 * channel; ARGV owner. */
extern dl_script dl_script_read_acquire;
extern dl_script dl_script_read_release;
extern dl_script dl_script_read_extend;
extern dl_script dl_script_write_acquire;
extern dl_script dl_script_write_release;
extern dl_script dl_script_write_extend;
extern dl_script dl_script_write_abandon;

/* The synchronizer objects' scripts on Redis, shared with the async API
 * (src/async/object.c), so that both run the same text on the same keys.
 * semaphore.c: KEYS semaphore, channel; ARGV permits -> 1 taken | 0 */
extern dl_script dl_script_semaphore_acquire;
/* semaphore.c: KEYS semaphore, channel, change id key; ARGV delta, the id
 * key's life in ms -> the new count | nil: counted before */
extern dl_script dl_script_semaphore_add_once;
/* semaphore.c: KEYS semaphore, channel; ARGV permits -> 1 set | 0 */
extern dl_script dl_script_semaphore_try_set;
/* latch.c: KEYS latch, channel; ARGV count -> 1 set | 0 not at zero */
extern dl_script dl_script_latch_try_set;
/* latch.c: KEYS latch, channel; ARGV k -> the new count */
extern dl_script dl_script_latch_count_down;
/* latch.c: KEYS latch, channel; ARGV count (>= 0; 0 deletes) -> 1 */
extern dl_script dl_script_latch_set;
/* permits_redis.c: KEYS name, {name}:timeout, channel.
 * acquire: ARGV raw id, lease ms -> {1, 0} | {0, ms to the earliest expiry or -1}
 * release: ARGV raw id -> 1 | 0 not out on lease
 * renew: ARGV raw id, lease ms -> 1 renewed (never shortened) | 0 gone
 * available: -> the available permits (expired ones returned first)
 * try_set: ARGV permits -> 1 set | 0 exists
 * add: ARGV delta -> the new count (expired leases returned first)
 * wd_renew: the watchdog's, a lock's renewal shape: KEYS[i] {name}:timeout,
 *   ARGV[1] lease ms, ARGV[1 + i] raw id -> {1 renewed | 0 gone, ...} */
extern dl_script dl_script_permits_acquire;
extern dl_script dl_script_permits_release;
extern dl_script dl_script_permits_renew;
extern dl_script dl_script_permits_available;
extern dl_script dl_script_permits_try_set;
extern dl_script dl_script_permits_add;
extern dl_script dl_script_permits_wd_renew;

/* ---- the synchronizer objects (object.c, semaphore.c) ---- */
/* A backend found the permits of the semaphore whose handle o is gone:
 * runs its lost callback, if any. */
void dl_semaphore_lost(dl_object *o, int reason);
/* A semaphore acquire that did not get its permits: DLOCK_EBUSY (try once)
 * or DLOCK_ETIMEDOUT (timed_out), with the message every backend gives. */
int dl_sem_refused(const dl_object *o, int64_t permits, int timed_out, dl_err *err);
/* DLOCK_EINVAL: a release of more permits than the handle holds (backends
 * whose permits belong to the handle that took them). */
int dl_sem_over_release(const dl_object *o, int64_t permits, int64_t held, dl_err *err);

/* A new handle of size bytes whose first member is its dl_object (NULL,
 * with the code in *rc, on failure): checks that c's backend has objects of kind
 * (DLOCK_KIND_SEMAPHORE, DLOCK_KIND_PERMIT_SEMAPHORE, DLOCK_KIND_LATCH),
 * checks and copies name and derives the channel chan_prefix + {name} (the
 * latch's: dl_latch_channel, checked with dl_check_cluster_latch).
 * DLOCK_EINVAL for a NULL c, or (recorded on c as "<fn>: NULL out") when
 * the caller has no out pointer (have_out 0); other failures are recorded
 * on c (dlock_errmsg). */
void *dl_object_new(dlock_client *c, size_t size, dlock_kind kind, const char *name,
                    size_t name_len, const char *chan_prefix, const char *fn, int have_out,
                    int *rc);
/* Runs script s on conn (a pooled connection of the handle's client when
 * NULL) and reads its integer answer into *v; an error answer is the
 * script's error (dl_sync_reply_error), another answer DLOCK_EPROTO. */
int dl_object_eval_int(dl_object *o, dl_conn *conn, dl_script *s, const char *what, int nkeys,
                       const char **keys, const size_t *keylens, int nargs, const char **args,
                       const size_t *arglens, long long *v, dl_err *err);
/* Frees a handle's name and channel and its cancel's eventfd. */
void dl_handle_clear(dl_handle *h);
/* Records err as the handle's message (dlock_*_errmsg); returns its code. */
int dl_handle_fail(dl_handle *h, const dl_err *err);
/* Clears the handle's message; returns DLOCK_OK. */
int dl_handle_ok(dl_handle *h);

/* Redis and its deployments (single, RedLock, Sentinel, Cluster): the
 * backend of every URL no other backend claims (backend_redis.c). */
extern const dl_backend dl_backend_redis;
/* Its queries by name (query.c). */
int dl_redis_is_locked(dlock_client *c, const char *name, size_t len, int *locked, dl_err *err);
int dl_redis_remaining_ttl(dlock_client *c, const char *name, size_t len, int64_t *ttl_ms,
                           dl_err *err);
int dl_redis_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                           dl_err *err);
int dl_redis_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                     dl_err *err);
int dl_redis_force_unlock(dlock_client *c, const char *name, size_t len, int *existed,
                          dl_err *err);
int dl_redis_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                         dl_err *err);
/* Its semaphore (semaphore.c). */
int dl_redis_sem_acquire(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err);
int dl_redis_sem_release(dl_object *o, int64_t permits, dl_err *err);
int dl_redis_sem_available(dl_object *o, int64_t *permits, dl_err *err);
int dl_redis_sem_try_set(dl_object *o, int64_t permits, int *set, dl_err *err);
int dl_redis_sem_add(dl_object *o, int64_t delta, dl_err *err);
/* Its countdown latch (latch.c). */
int dl_redis_permits_init(dl_object *o, dl_err *err);
void dl_redis_permits_destroy(dl_object *o);
int dl_redis_permits_acquire(dl_object *o, const char *raw, int64_t wait_ms, int64_t lease_ms,
                             int64_t *t0, dl_err *err);
int dl_redis_permits_release(dl_object *o, const char *raw, int *done, dl_err *err);
int dl_redis_permits_renew(dl_object *o, const char *raw, int64_t lease_ms, int *done,
                           dl_err *err);
int dl_redis_permits_available(dl_object *o, int64_t *permits, dl_err *err);
int dl_redis_permits_try_set(dl_object *o, int64_t permits, int *set, dl_err *err);
int dl_redis_permits_add(dl_object *o, int64_t delta, dl_err *err);
void dl_redis_permits_lease(dl_object *o, dl_lease *lease);
int dl_redis_latch_try_set(dl_object *o, int64_t count, int *set, dl_err *err);
int dl_redis_latch_set(dl_object *o, int64_t count, dl_err *err);
int dl_redis_latch_count_down(dl_object *o, int64_t k, dl_err *err);
int dl_redis_latch_count(dl_object *o, int64_t *count, dl_err *err);
int dl_redis_latch_await(dl_object *o, int64_t wait_ms, dl_err *err);
/* Its ID worker's day counter (idworker.c). */
/* The ID worker's layout (idworker.c), shared by the blocking and the async
 * worker: id = seconds since epoch_s (31 bits) << 32 | n, n from the UTC
 * day's counter "icr:<prefix>:<yyyy:mm:dd>" (docs/idworker.md). */
typedef struct dl_idw {
    char *prefix;
    int64_t epoch_s, batch;
    int have_block;           /* the reserved block: next..end of day `day` */
    int64_t day;
    uint64_t next, end;
    int64_t last_ts;          /* last seconds value issued (-1: none yet) */
    uint64_t last_id;
} dl_idw;
/* Checks prefix and opts (NULL: defaults) into s. */
int dl_idw_init(dl_idw *s, const char *prefix, const dlock_idworker_options *opts, dl_err *err);
void dl_idw_fini(dl_idw *s);
/* The next id from the block into *id; or, when the block is used up or of
 * another day, *need_t >= 0: the Unix seconds whose day's block to reserve
 * (dl_idw_key, INCRBY, dl_idw_fill), then take again. A failure: the
 * clock before the epoch, seconds past 31 bits (DLOCK_EOVERFLOW), the
 * counter found gone backwards (DLOCK_EPROTO). */
int dl_idw_take(dl_idw *s, uint64_t *id, int64_t *need_t, dl_err *err);
/* The counter key of the day of the Unix seconds t (malloc'd). */
int dl_idw_key(const dl_idw *s, int64_t t, char **key, size_t *len, dl_err *err);
/* The block n values up to hi (the INCRBY's reply) for t's day; a value past
 * 2^32 - 1 DLOCK_EOVERFLOW. */
int dl_idw_fill(dl_idw *s, int64_t t, int64_t n, long long hi, const char *key, dl_err *err);
/* The INCR/INCRBY reply r into *value (the server's overflow:
 * DLOCK_EOVERFLOW). */
int dl_idw_reply(const redisReply *r, const char *key, size_t key_len, long long *value,
                 dl_err *err);
int dl_redis_id_incr(dlock_client *c, const char *key, size_t key_len, int64_t n,
                     long long *value, dl_err *err);

/* The backend serving url: the one whose scheme it has, else Redis (whose
 * URL parser explains a bad one). */
const dl_backend *dl_backend_for(const char *url);

/* ---- leases renewed by the watchdog (watchdog.c) ---- */
typedef struct dl_lease dl_lease;
struct dl_lease {
    /* Renewal script: KEYS[i] = key of item i, ARGV[1] = lease ms,
     * ARGV[1+i] = owner of item i; answers an array of 1 (renewed) / 0 (lost). */
    dl_script *renew;
    int64_t lease_ms;
    const char *key;           /* immutable while registered */
    size_t key_len;
    const char *owner;         /* immutable while registered */
    size_t owner_len;
    atomic_int lost;
    atomic_llong last_ok;      /* monotonic ms of the last confirmed lease start */
    int who;                   /* its holder identity key is renewed with it (holder.c) */
    /* the holder's final release is in flight: not renewed, a renewal's "not
     * ours" (the release came first) not taken for a loss, but still lost at
     * its due time if the release has not ended by then */
    atomic_int releasing;
    /* called on the watchdog thread, under its mutex, when found lost */
    void (*on_lost)(dl_lease *lease, int reason);
    size_t wd_slot;            /* guarded by the watchdog's mutex */
    uint64_t wd_seq;
};

int dl_watchdog_register(dlock_client *c, dl_lease *lease, dl_err *err);
void dl_watchdog_unregister(dlock_client *c, dl_lease *lease);
/* Runs fn(arg) under the watchdog's mutex (as is, when the client has no
 * watchdog yet): to change what an on_lost callback reads. */
void dl_watchdog_locked(dlock_client *c, void (*fn)(void *), void *arg);
void dl_watchdog_free(dl_watchdog *wd);

/* ---- locks (lock.c, wait.c, lock_<kind>.c) ---- */

/* Result of one acquire attempt. */
typedef struct dl_outcome {
    int acquired;
    uint64_t fence;
    int64_t count;             /* hold count after acquiring (reentrant kinds) */
    int64_t pttl;              /* not acquired: ms to wait at most before retrying
                                * (-1: no expiry known) */
    int unfenced;              /* failed with DL_FENCE_ERR: the script took the
                                * lock, which the caller must give back */
} dl_outcome;

typedef struct dl_kind_ops dl_kind_ops;


struct dlock_lock {
    dl_handle h;               /* client, name, channel, message, cancel */
    dlock_kind kind;
    const dl_kind_ops *ops;
    char *fence_key;           /* Redis: redisson_lock_token:{name} (backend_redis.c) */
    size_t fence_key_len;
    void *kind_state;          /* the kind's own state (extra keys...) */
    int listening;             /* the attempt under way is made while subscribed
                                * to l->h.channel (wait.c sets it) */

    char token[96];            /* owner: plain 32 hex; others uuid:tid */
    size_t token_len;
    int64_t holds;             /* this handle's hold count */
    int64_t lease_ms;          /* lease of the current hold */
    int watchdog;              /* registered with the watchdog */
    int64_t expires_at;        /* monotonic ms: the lease surely holds until then */
    uint64_t fence;
    dlock_lost_fn lost_fn;
    void *lost_ud;
    /* holder identity (holder.c): "dlock_holder:{name}:<owner>" and its value */
    char *who_key;
    size_t who_key_len, who_prefix_len;
    char *who_val;
    size_t who_val_cap;
    dl_call who_post;
    char who_mode[2];
    char who_lease[24];
    dl_lease lease;
};

/* What a hold's validity leaves out of its lease (dl_topo_margin). */
static inline int64_t dl_lease_margin(const dlock_lock *l, int64_t lease_ms) {
    return dl_topo_margin(l->h.c, lease_ms);
}

/* dlock_lock_valid_ms of a handle: 0 when it holds nothing, was marked lost
 * or its hold surely ended; the watchdog's last renewal counts. */
static inline int64_t dl_hold_valid_ms(const dlock_lock *l) {
    if (l->holds <= 0 || atomic_load(&l->lease.lost)) return 0;
    int64_t until = l->expires_at;
    if (l->watchdog) {
        int64_t renewed = (int64_t)atomic_load(&l->lease.last_ok) + l->lease_ms -
                          dl_lease_margin(l, l->lease_ms);
        if (renewed > until) until = renewed;
    }
    int64_t left = until - dl_now_ms();
    return left > 0 ? left : 0;
}

/* ---- owners and their holds (owner.c) ---- */
/* The holds l's owner should have on the server before a release of l: the
 * sum of this client's handles' counts (owner.c, "holds per owner"), in
 * decimal into buf (24 bytes); "" (returns 0) when not known (an untracked
 * kind, no record, a hold that went unrecorded). The release scripts of the
 * counted kinds take it last: a count already below it means this release
 * was applied before (a copy of the request), and changes nothing. */
size_t dl_owner_expect(dlock_lock *l, char *buf);
/* l's hold count becomes v, and its record with it; returns the owner's sum
 * over this client's handles afterwards (-1: unknown or not counted). */
int64_t dl_set_holds(dlock_lock *l, int64_t v);
/* Frees the client's records (at dlock_client_free). */
void dl_owned_free(dlock_client *c);
/* "<client id>:<thread id>" into l->token. */
int dl_owner_thread(dlock_lock *l, dl_err *err);

/* dlock_acquire without noting where cancels stand (l->cancel_seen): for
 * dlock_multi_acquire, which notes it for every lock of the set first. */
int dl_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, uint64_t *fence);
/* Restarts the lease of l's hold (its lease_ms from now), owner-checked,
 * leaving the watchdog as it is: DLOCK_OK (nothing to do for a hold kept by
 * a session); DLOCK_ELOST, the handle marked as no longer holding, when the
 * server no longer gives it to this owner; or a failure code (the handle
 * unchanged). */
int dl_lock_reexpire(dlock_lock *l, dl_err *err);
/* The multi-lock's canonical order (multilock.c), shared by the async
 * multi-lock so that blocking and async sets on the same names take them in
 * one order: by name (bytes, a prefix first), then the write side before
 * anything else on the same name, then kind. <0, 0, >0 as memcmp. */
int dl_multi_cmp(const char *an, size_t alen, dlock_kind ak, const char *bn, size_t blen,
                 dlock_kind bk);

/* Sets DLOCK_ECANCELED for lock l's wait in err. */
static inline int dl_cancel_err(dlock_lock *l, dl_err *err) {
    return dl_cancel_name_err(l->h.name, l->h.name_len, err);
}

/* What a lock kind does; one table per kind, one file per kind. */
struct dl_kind_ops {
    dlock_kind kind;
    const char *name;
    int reentrant;
    /* l->h.channel is this waiter's own (no one else listens on it, and no
     * release publishes on it once the waiter stopped waiting): its
     * subscription may linger after an acquire (dl_sub_linger) */
    int own_channel;
    /* sets up l->h.channel (and l->kind_state) when the handle is created */
    int (*init)(dlock_lock *l, dl_err *err);
    void (*destroy)(dlock_lock *l);
    /* writes the owner of a new hold into l->token (may update l->h.channel) */
    int (*owner)(dlock_lock *l, dl_err *err);
    /* one attempt; wait_ms is the caller's remaining wait (0 try once,
     * -1 forever) for kinds that queue */
    int (*attempt)(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms, dl_outcome *t,
                   dl_err *err);
    /* a message on l->h.channel: returns 0 to try again now, -1 to try again
     * in t->pttl ms (or when the next message comes). A message never hands
     * the lock over by itself: the attempt that follows takes it (and, being
     * a write on the waiter's own connection, lets WAIT cover it) */
    int (*message)(dlock_lock *l, const redisReply *msg, dl_outcome *t);
    /* stops waiting (leave a queue); best effort, may be NULL */
    void (*abandon)(dlock_lock *l, dl_conn *conn);
    /* releases one hold: *res 1 released fully, 0 still held, -1 not ours */
    int (*release)(dlock_lock *l, dl_conn *conn, long long *res, dl_err *err);
    /* sets the lease: *res 1 done, 0 not ours */
    int (*extend)(dlock_lock *l, dl_conn *conn, int64_t lease_ms, long long *res, dl_err *err);
    /* server's view: held by this owner, and hold count */
    int (*check)(dlock_lock *l, dl_conn *conn, int *held, int64_t *count, dl_err *err);
    dl_script *renew;
    /* describes an operation's script call (state an attempt depends on,
     * such as whether it waits, is set in kind_state by the kind's attempt
     * before it calls dl_call_attempt); the dl_call_* functions run it as
     * attempt / release / extend on one server, and RedLock (redlock.c) on
     * every node unless one_server says otherwise */
    void (*call)(dlock_lock *l, int op, int64_t lease_ms, dl_call *call);
    /* its calls are sound on one server only, not on a majority of
     * independent masters (the reason is at the kind's ops) */
    int one_server;
    /* each acquire call has an owner of its own (a fresh token): a hold
     * found under it after a lost reply is that call's (wait.c) */
    int unique_owner;
    /* its acquire, release and extend scripts keep the holder identity
     * record themselves (dl_who_inline), not the script after them */
    int who_inline;
};

/* ---- holder identity (holder.c) ---- */
#define DL_WHO_PREFIX "dlock_holder:" /* the records' keys: dlock_holder:{name}:<owner> */

/* ---- semaphore changes counted once (semaphore.c) ----
 * A release or add of a Redis semaphore writes DL_SEM_CHANGE_PREFIX{name}:<id>
 * beside the counter, alive DL_SEM_CHANGE_ID_MS: a copy of the same change
 * arriving while it lives is not counted again. */
#define DL_SEM_CHANGE_PREFIX "dlock_semchg:"
#define DL_SEM_CHANGE_ID_BYTES 16
#define DL_SEM_CHANGE_ID_MS 60000
/* The identity script to run after l's next script call (conn->post), or
 * NULL when the client records no identity. mode: 'a' acquire (first hold),
 * 'r' re-entry, 'e' extend, 'd' release. */
dl_call *dl_who_post(dlock_lock *l, char mode, int64_t lease_ms);
/* For kinds whose own scripts keep the record (dl_kind_ops.who_inline):
 * l's record key for its current owner, and with value set (an acquire)
 * the record to write; 0, or -1 when the client records none (or out of
 * memory: no record then). */
int dl_who_inline(dlock_lock *l, const char **key, size_t *key_len, const char **value,
                  size_t *value_len);
/* The renewal of the identity keys of n holds (lock key and owner each) to
 * lease_ms, for those still held, as one script call (q; one reply) to
 * queue behind the holds' own renewal. q points into w (w stays where it
 * is while q is used); dl_who_renewal_clear frees what q points to. */
typedef struct dl_who_renewal {
    dl_eval_req q;
    char lease[24];
    size_t n;
    const char **keys, **args;
    size_t *keylens, *arglens;
    char **owned;              /* the identity keys */
} dl_who_renewal;
int dl_who_renewal_make(dl_who_renewal *w, const char *const *locks, const size_t *locklens,
                        const char *const *owners, const size_t *ownerlens, size_t n,
                        int64_t lease_ms, dl_err *err);
void dl_who_renewal_clear(dl_who_renewal *w);

int dl_call_attempt(dlock_lock *l, dl_conn *conn, int64_t lease_ms, int64_t wait_ms, dl_outcome *t,
                    dl_err *err);
int dl_call_release(dlock_lock *l, dl_conn *conn, long long *res, dl_err *err);
int dl_call_extend(dlock_lock *l, dl_conn *conn, int64_t lease_ms, long long *res, dl_err *err);
/* Maps a release answer to 1 released / 0 still held / -1 not ours. */
long long dl_call_release_result(const dl_call *call, long long v);

/* RedLock versions of the generic lock steps (redlock.c). */
int dl_redlock_wait(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t, dl_err *err);
int dl_redlock_release(dlock_lock *l, long long *res, dl_err *err);
int dl_redlock_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err);
int dl_redlock_check(dlock_lock *l, int *held, int64_t *count, dl_err *err);

extern const dl_kind_ops dl_plain_ops;
extern const dl_kind_ops dl_reentrant_ops;
extern const dl_kind_ops dl_fair_ops;
extern const dl_kind_ops dl_read_ops;
extern const dl_kind_ops dl_write_ops;

/* Tries, and waits through pub/sub until acquired or deadline. */
int dl_lock_wait(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t, dl_err *err);
/* Parses {1, fence[, count]} | {0, pttl} answers of acquire scripts. */
int dl_parse_attempt(dlock_lock *l, redisReply *r, int64_t t0, int64_t lease_ms, dl_outcome *t,
                     dl_err *err);

#endif
