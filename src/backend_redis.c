/* The Redis backend: one server (redis://, rediss://, unix://), RedLock over
 * independent masters (redlock://), Sentinel (redis-sentinel://) and Cluster
 * (redis-cluster://). Its table entry is here, and which way a lock's calls
 * go: to the node that holds the name, or to every RedLock master at once.
 * The work is done by the files of each concern: the topology and its
 * connection pools (topology.c, pool.c), the lock kinds' scripts
 * (lock_<kind>.c), waiting (wait.c), RedLock (redlock.c), the queries
 * (query.c), the semaphore (semaphore.c). It is the only backend
 * with every lock kind, the library's watchdog, token calls, listing,
 * permit-expirable semaphores and latches, and the ID worker (ZooKeeper has
 * semaphores too). */
#include <stdlib.h>

#include "kinds.h"

/* A lock's Redis keys beyond its name: the fencing counter
 * (redisson_lock_token:{name}, Redisson's RFencedLock layout), then the
 * kind's own (its channel, queues...). */
static int redis_lock_init(dlock_lock *l, dl_err *err) {
    l->fence_key =
        dl_derive_key("redisson_lock_token:", l->h.name, l->h.name_len, "", &l->fence_key_len);
    if (!l->fence_key) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return l->ops->init(l, err);
}

/* Also after a failed or an unmade init (the handle is zeroed first). */
static void redis_lock_destroy(dlock_lock *l) {
    if (l->ops->destroy) l->ops->destroy(l);
    free(l->fence_key);
    l->fence_key = NULL;
}

static int redis_owner(dlock_lock *l, dl_err *err) { return l->ops->owner(l, err); }

/* Borrows a connection to the node holding the lock's key. */
static int with_conn(dlock_lock *l, dl_conn **conn, dl_err *err) {
    return dl_pool_get_key(l->h.c, l->h.name, l->h.name_len, dl_cmd_deadline(l->h.c), conn, err);
}

/* ---- on the node that holds the name (one server, Sentinel, Cluster) ---- */

static int server_release(dlock_lock *l, long long *res, dl_err *err) {
    dl_conn *conn = NULL;
    int rc = with_conn(l, &conn, err);
    if (rc) return rc;
    conn->post = dl_who_post(l, 'd', l->lease_ms);
    rc = l->ops->release(l, conn, res, err);
    conn->post = NULL;
    dl_pool_put(l->h.c, conn);
    return rc;
}

static int server_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err) {
    dl_conn *conn = NULL;
    int rc = with_conn(l, &conn, err);
    if (rc) return rc;
    conn->post = dl_who_post(l, 'e', lease_ms);
    rc = l->ops->extend(l, conn, lease_ms, res, err);
    conn->post = NULL;
    if (!rc && *res == 1 && l->h.c->wait_replicas > 0) {
        /* the new lease counts only once the replicas have it: a failover to
         * one that has the old expiry would end the hold before the holder
         * thinks (the hold keeps its old validity, which they do have) */
        long long acks = 0;
        rc = dl_conn_wait_replicas(l->h.c, conn, l->h.c->wait_replicas_timeout_ms, 0, &acks, err);
        if (!rc && acks < l->h.c->wait_replicas) {
            char nm[80];
            rc = dl_seterr(
                err, DLOCK_EREPLICAS,
                "extend of lock '%s': only %lld of %d replicas acknowledged within "
                "%lld ms; it is counted valid for the shorter of what it had and the new lease",
                dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm), acks, l->h.c->wait_replicas,
                (long long)l->h.c->wait_replicas_timeout_ms);
        }
    }
    dl_pool_put(l->h.c, conn);
    return rc;
}

static int server_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    dl_conn *conn = NULL;
    int rc = with_conn(l, &conn, err);
    if (rc) return rc;
    rc = l->ops->check(l, conn, held, count, err);
    dl_pool_put(l->h.c, conn);
    return rc;
}

/* ---- a lock's calls on the client's topology ---- */

/* How a lock's calls run: on the node that holds the name, or on every
 * RedLock master at once (redlock.c). */
typedef struct lock_path {
    int (*wait)(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t, dl_err *err);
    int (*release)(dlock_lock *l, long long *res, dl_err *err);
    int (*extend)(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err);
    int (*check)(dlock_lock *l, int *held, int64_t *count, dl_err *err);
} lock_path;

static const lock_path server_path = {dl_lock_wait, server_release, server_extend, server_check};
static const lock_path fanout_path = {dl_redlock_wait, dl_redlock_release, dl_redlock_extend,
                                      dl_redlock_check};

static const lock_path *path(const dlock_client *c) {
    return dl_topo_fanout(c) ? &fanout_path : &server_path;
}

static int redis_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                         dl_err *err) {
    int64_t lease = lease_ms == DLOCK_WATCHDOG ? l->h.c->watchdog_lease_ms : lease_ms;
    return path(l->h.c)->wait(l, wait_ms, lease, t, err);
}

static int redis_release(dlock_lock *l, long long *res, dl_err *err) {
    return path(l->h.c)->release(l, res, err);
}

static int redis_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err) {
    return path(l->h.c)->extend(l, lease_ms, res, err);
}

static int redis_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    return path(l->h.c)->check(l, held, count, err);
}

static const char *const redis_schemes[] = {"redis://",         "rediss://",
                                            "unix://",          "redlock://",
                                            "redis-sentinel://", "redis-cluster://",
                                            NULL};

const dl_backend dl_backend_redis = {
    .name = "redis",
    .schemes = redis_schemes,
    .kinds = (1u << DLOCK_KIND_PLAIN) | (1u << DLOCK_KIND_REENTRANT) | (1u << DLOCK_KIND_FAIR) |
             (1u << DLOCK_KIND_READ) | (1u << DLOCK_KIND_WRITE),
    .caps = DL_CAP_WATCHDOG | DL_CAP_TOKENS | DL_CAP_LIST | DL_CAP_CANCEL |
            DL_CAP_HOLDER | DL_CAP_OWNER_HOLDS,
    .open = dl_redis_open,
    .close = NULL, /* the client frees its nodes (dl_topology_clear) */
    .ping = dl_redis_ping,
    .lock_init = redis_lock_init,
    .lock_destroy = redis_lock_destroy,
    .acquire = redis_acquire,
    .release = redis_release,
    .extend = redis_extend,
    .check = redis_check,
    .inspect = dl_redis_inspect,
    .fence_current = dl_redis_fence_current,
    .force_unlock = dl_redis_force_unlock,
    .server_fact = dl_redis_server_fact,
    .owner = redis_owner,
    .is_locked = dl_redis_is_locked,
    .remaining_ttl = dl_redis_remaining_ttl,
    .sem_acquire = dl_redis_sem_acquire,
    .sem_release = dl_redis_sem_release,
    .sem_available = dl_redis_sem_available,
    .sem_try_set = dl_redis_sem_try_set,
    .sem_add = dl_redis_sem_add,
    .permits_init = dl_redis_permits_init,
    .permits_destroy = dl_redis_permits_destroy,
    .permits_acquire = dl_redis_permits_acquire,
    .permits_release = dl_redis_permits_release,
    .permits_renew = dl_redis_permits_renew,
    .permits_available = dl_redis_permits_available,
    .permits_try_set = dl_redis_permits_try_set,
    .permits_add = dl_redis_permits_add,
    .permits_lease = dl_redis_permits_lease,
    .latch_try_set = dl_redis_latch_try_set,
    .latch_set = dl_redis_latch_set,
    .latch_count_down = dl_redis_latch_count_down,
    .latch_count = dl_redis_latch_count,
    .latch_await = dl_redis_latch_await,
    .id_incr = dl_redis_id_incr,
};
