/* ZooKeeper semaphores: a total and one leased node per permit. (The design: zk.h.) */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <zookeeper/zookeeper_version.h>

#include "zk.h"

/* ---- semaphores ----
 * {chroot}/dlock/sems/{hex(name)}: persistent, data = the total permits in
 * decimal ("" while unset: made by an acquire before any try_set / add).
 * Each permit held or asked for is one ephemeral sequential child
 * "lease-{guid}-{seq}" (data "1"); an acquire of k permits creates its k
 * children in one multi (atomic: consecutive sequence numbers, all or none). */




/* zs now holds leases on its session zs->sess: listed there (a session
 * that expired meanwhile has told its handles already: release says
 * DLOCK_ELOST, as for a lock). */
static void sem_held_add(zk_sem *zs) {
    zk_sess *s = zs->sess;
    pthread_mutex_lock(&s->mu);
    zs->prev = NULL;
    zs->next = s->held_sems;
    if (s->held_sems) s->held_sems->prev = zs;
    s->held_sems = zs;
    pthread_mutex_unlock(&s->mu);
}

static void sem_held_del(zk_sem *zs) {
    zk_sess *s = zs->sess;
    pthread_mutex_lock(&s->mu);
    if (zs->prev) zs->prev->next = zs->next;
    else if (s->held_sems == zs) s->held_sems = zs->next;
    if (zs->next) zs->next->prev = zs->prev;
    zs->next = zs->prev = NULL;
    pthread_mutex_unlock(&s->mu);
}

/* Parses "lease-<guid>-<seq>"; guid into g (33 bytes). */
static int parse_lease(const char *name, char *g, long long *seq) {
    size_t pl = strlen(ZK_LEASE_PREFIX);
    if (strncmp(name, ZK_LEASE_PREFIX, pl)) return 0;
    const char *p = name + pl;
    if (strlen(p) < 2 * ZK_GUID_BYTES + 2 || p[2 * ZK_GUID_BYTES] != '-') return 0;
    memcpy(g, p, 2 * ZK_GUID_BYTES);
    g[2 * ZK_GUID_BYTES] = '\0';
    const char *sq = p + 2 * ZK_GUID_BYTES + 1;
    char *end = NULL;
    errno = 0;
    *seq = strtoll(sq, &end, 10);
    return *sq && !*end && !errno && *seq >= 0;
}


static int lease_cmp(const void *a, const void *b) {
    long long x = ((const zk_lease *)a)->seq, y = ((const zk_lease *)b)->seq;
    return x < y ? -1 : x > y;
}

/* The lease children in queue order (sequence). v points into op's kids. */
static int leases_of(zk_op *op, zk_lease **out, int *n, dl_err *err) {
    *out = NULL;
    *n = 0;
    zk_lease *v = calloc((size_t)(op && op->nkids ? op->nkids : 1), sizeof *v);
    if (!v) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int k = 0;
    for (int i = 0; op && i < op->nkids; i++)
        if (parse_lease(op->kids[i], v[k].guid, &v[k].seq)) v[k++].name = op->kids[i];
    qsort(v, (size_t)k, sizeof *v, lease_cmp);
    *out = v;
    *n = k;
    return DLOCK_OK;
}

/* The permits held: the leases of the acquisitions (guid groups) that fit
 * the total counting every lease up to their last one. A group is one run
 * of the sorted leases (one multi: consecutive sequence numbers). Holders
 * are a prefix of the queue (a later group counts all earlier ones); *mine
 * (may be NULL) gets whether the group guid fits, *nmine its leases. */
static int64_t leases_held(const zk_lease *v, int n, int64_t total, const char *guid,
                           int *mine, int *nmine, int *ahead) {
    int64_t held = 0;
    int prev = -1, prev_fits = 0; /* the group before i's: its last lease */
    if (mine) *mine = 0;
    if (nmine) *nmine = 0;
    if (ahead) *ahead = -1;
    for (int i = 0; i < n;) {
        int last = i; /* the last lease of i's group */
        while (last + 1 < n && !strcmp(v[last + 1].guid, v[i].guid)) last++;
        int fits = (int64_t)last + 1 <= total;
        if (fits) held = last + 1;
        if (guid && !strcmp(v[i].guid, guid)) {
            if (mine) *mine = fits;
            if (nmine) *nmine += last - i + 1;
            if (ahead && prev >= 0 && !prev_fits) *ahead = prev;
        }
        prev = last;
        prev_fits = fits;
        i = last + 1;
    }
    return held;
}


static void c_ignore(int rc, const struct Stat *st, const void *data) {
    (void)rc;
    (void)st;
    (void)data;
}

static void mark_held(zk_sess *s, const char *path) {
    (void)zoo_aset(s->zh, path, ZK_LEASE_HELD, (int)strlen(ZK_LEASE_HELD), -1, c_ignore, NULL);
}

/* Reads the total: *total (0 when unset), *set 1 if a value is there,
 * *version the node's data version. ZNONODE: DLOCK_OK with *exists 0. */
static int sem_read(zk_client *zc, zk_sess *s, const char *node, int watch, int64_t *total,
                    int *set, int *version, int *exists, dl_err *err) {
    *total = 0;
    *set = 0;
    *exists = 0;
    zk_op *op = NULL;
    int zrc = dl_zk_req(zc, s, watch ? OP_WATCH : OP_GET, node, 0, &op);
    if (zrc == ZNONODE) return DLOCK_OK;
    if (zrc != ZOK) return dl_zk_fail(zrc, "read the semaphore", err);
    *exists = 1;
    if (version) *version = op->st.version;
    int rc = DLOCK_OK;
    if (op->datalen > 0) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(op->data, &end, 10);
        if (*end || errno)
            rc = dl_seterr(err, DLOCK_EPROTO, "zookeeper: the semaphore node's data is not an "
                                              "integer");
        *total = v;
        *set = 1;
    }
    dl_zk_op_unref(op);
    return rc;
}

/* Creates the k leases of one acquisition in one multi. ZOK: op->mpaths. */
static int multi_create(zk_client *zc, zk_sess *s, const char *prefix, int k, zk_op **out) {
    *out = NULL;
    zk_op *op = dl_zk_op_new(s);
    if (!op) return ZSYSTEMERROR;
    size_t plen = strlen(prefix) + 16;
    op->own = 1;
    op->prefix = strdup(prefix); /* an abandoned create is searched for by it */
    op->mops = calloc((size_t)k, sizeof *op->mops);
    op->mres = calloc((size_t)k, sizeof *op->mres);
    op->mpaths = calloc((size_t)k, sizeof *op->mpaths);
    int ok = op->prefix && op->mops && op->mres && op->mpaths;
    for (int i = 0; ok && i < k; i++) {
        if (!(op->mpaths[i] = calloc(1, plen))) ok = 0;
        else op->nm = i + 1;
    }
    if (!ok) {
        atomic_store(&op->refs, 1); /* never started: the completion holds none */
        dl_zk_op_unref(op);
        return ZSYSTEMERROR;
    }
    for (int i = 0; i < k; i++)
        zoo_create_op_init(&op->mops[i], op->prefix, "1", 1, &ZOO_OPEN_ACL_UNSAFE,
                           ZOO_EPHEMERAL_SEQUENTIAL, op->mpaths[i], (int)plen);
    int rc = dl_zk_op_started(op, zoo_amulti(s->zh, k, op->mops, op->mres, dl_zk_c_void, op));
    if (rc == ZOK) rc = dl_zk_op_wait(op, dl_deadline(zc->cmd_timeout_ms), NULL);
    if (rc == ZOK) *out = op;
    else dl_zk_op_unref(op);
    return rc;
}

/* Our leases by guid (after a create whose outcome is unknown): *paths
 * (malloc'd) and *n; 0 when the create was not applied. */
static int find_leases(zk_client *zc, zk_sess *s, const char *node, const char *guid,
                       char ***paths, int *n, dl_err *err) {
    *paths = NULL;
    *n = 0;
    zk_op *op = NULL;
    int zrc = dl_zk_req(zc, s, OP_KIDS, node, 0, &op);
    if (zrc == ZNONODE) return DLOCK_OK;
    if (zrc != ZOK) return dl_zk_fail(zrc, "list the semaphore's leases", err);
    zk_lease *v = NULL;
    int nv = 0;
    int rc = leases_of(op, &v, &nv, err);
    char **p = rc ? NULL : calloc((size_t)(nv ? nv : 1), sizeof *p);
    if (!rc && !p) rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int k = 0;
    for (int i = 0; !rc && i < nv; i++) {
        if (strcmp(v[i].guid, guid)) continue;
        if (!(p[k] = dl_zk_join3(node, "/", v[i].name)))
            rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        else
            k++;
    }
    free(v);
    dl_zk_op_unref(op);
    if (rc) {
        for (int i = 0; i < k; i++) free(p[i]);
        free(p);
        return rc;
    }
    *paths = p;
    *n = k;
    return DLOCK_OK;
}

static void free_paths(char **p, int n) {
    for (int i = 0; i < n; i++) free(p[i]);
    free(p);
}

/* Creates the k leases (once, even across a connection loss) before
 * deadline: *paths (malloc'd) with k entries. */
static int create_leases(zk_client *zc, zk_sess *s, const char *node, const char *guid, int k,
                         int64_t deadline, char ***paths, dl_err *err) {
    *paths = NULL;
    char *prefix = malloc(strlen(node) + 2 * ZK_GUID_BYTES + 16);
    if (!prefix) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    sprintf(prefix, "%s/" ZK_LEASE_PREFIX "%s-", node, guid);
    int rc = DLOCK_OK, tries = 0, maybe = 0;
    for (;;) {
        if (maybe) {
            int n = 0;
            rc = find_leases(zc, s, node, guid, paths, &n, err);
            if (!rc && n == k) break;
            if (!rc && n > 0) {
                free_paths(*paths, n);
                *paths = NULL;
                rc = dl_seterr(err, DLOCK_EPROTO, "zookeeper: %d of our %d lease nodes found", n,
                               k);
                break;
            }
            free(*paths);
            *paths = NULL;
            if (rc) {
                if (dl_now_ms() >= deadline) break;
                dl_sleep_ms(50);
                continue;
            }
            maybe = 0; /* not there: it was not applied */
        }
        zk_op *op = NULL;
        int zrc = multi_create(zc, s, prefix, k, &op);
        if (zrc == ZOK) {
            *paths = calloc((size_t)k, sizeof **paths);
            for (int i = 0; *paths && i < k; i++) {
                (*paths)[i] = op->mpaths[i]; /* the full path of the node made */
                op->mpaths[i] = NULL;
            }
            if (!*paths) {
                for (int i = 0; i < k; i++) dl_zk_orphan_add(s, op->mpaths[i], NULL);
                rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
            } else {
                rc = DLOCK_OK;
            }
            dl_zk_op_unref(op);
            break;
        }
        if (zrc == ZNONODE && ++tries <= 3) {
            rc = dl_zk_ensure_parents(zc, s, node, ZOO_PERSISTENT, err);
            if (rc) break;
            continue;
        }
        if (zrc == ZCONNECTIONLOSS || zrc == ZOPERATIONTIMEOUT) {
            maybe = 1;
            if (dl_now_ms() < deadline) continue;
        }
        rc = dl_zk_fail(zrc, "create the semaphore's lease nodes", err);
        break;
    }
    if (rc && maybe) dl_zk_orphan_add(s, NULL, prefix);
    free(prefix);
    return rc;
}

int dl_zk_sem_init(dl_object *o, dl_err *err) {
    zk_sem *zs = calloc(1, sizeof *zs);
    if (!zs) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    o->h.backend_state = zs;
    zs->o = o;
    zk_client *zc = o->h.c->backend_client;
    zs->node = dl_zk_name_under(zc->sems, o->h.name, o->h.name_len);
    if (!zs->node) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

/* Forgets the handle's leases (deleting them in the background if del). */
static void sem_drop(zk_sem *zs, int del) {
    for (int64_t i = 0; i < zs->nleases; i++) {
        if (del && zs->sess) dl_zk_orphan_add(zs->sess, zs->leases[i], NULL);
        free(zs->leases[i]);
    }
    zs->nleases = 0;
    if (zs->sess) sem_held_del(zs);
    dl_zk_sess_unref(zs->sess);
    zs->sess = NULL;
}

/* Freeing the handle gives its permits back. */
void dl_zk_sem_destroy(dl_object *o) {
    zk_sem *zs = o->h.backend_state;
    if (!zs) return;
    sem_drop(zs, 1);
    free(zs->leases);
    free(zs->node);
    free(zs);
    o->h.backend_state = NULL;
}

int dl_zk_sem_acquire(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err) {
    zk_client *zc = o->h.c->backend_client;
    zk_sem *zs = o->h.backend_state;
    char nm[80];
    dl_name_msg(o->h.name, o->h.name_len, nm, sizeof nm);
    /* one node per permit, all in one request, which must stay well under
     * the server's jute.maxbuffer (1 MiB by default) */
    int64_t maxk = ZK_MULTI_BYTES / ((int64_t)strlen(zs->node) + 64);
    if (permits > maxk)
        return dl_seterr(err, DLOCK_EINVAL, "semaphore '%s': at most %lld permits per acquire "
                                            "for this name on zookeeper (a node each, in one "
                                            "request; got %lld)",
                         nm, (long long)maxk, (long long)permits);
    if (zs->sess && dl_zk_sess_dead(zs->sess)) sem_drop(zs, 0); /* the session took them */
    if (zs->nleases + permits > zs->cap) {
        int64_t cap = zs->cap ? zs->cap : 4;
        while (cap < zs->nleases + permits) cap *= 2;
        char **nl = realloc(zs->leases, (size_t)cap * sizeof *nl);
        if (!nl) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        zs->leases = nl;
        zs->cap = cap;
    }
    zk_sess *s = NULL;
    int rc = dl_zk_sess_get(zc, &s, err);
    if (rc) return rc;
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE
                       : wait_ms == 0               ? dl_deadline(zc->cmd_timeout_ms)
                                                    : dl_deadline(wait_ms);
    char guid[2 * ZK_GUID_BYTES + 1];
    rc = dl_random_hex(guid, ZK_GUID_BYTES, err);
    char **paths = NULL;
    int k = (int)permits;
    if (!rc)
        rc = create_leases(zc, s, zs->node, guid, k,
                           wait_ms == 0 || deadline == DL_INF_DEADLINE
                               ? dl_deadline(zc->cmd_timeout_ms)
                               : deadline,
                           &paths, err);
    if (rc) {
        dl_zk_sess_unref(s);
        return rc;
    }
    /* first: this waiter watches the leases (it is the first waiter, or
     * has not looked yet); waited: it was refused once (a waiter behind may
     * watch its lease); held_guid: a group ahead seen marked as holding
     * although it does not fit in our view (a later total lowered below
     * what is held): we are the first waiter then */
    int first = 1, waited = 0;
    char held_guid[2 * ZK_GUID_BYTES + 1] = "";
    for (;;) {
        pthread_mutex_lock(&s->mu);
        uint64_t ev0 = s->events;
        int dead = s->dead;
        pthread_mutex_unlock(&s->mu);
        if (dead) {
            rc = dl_seterr(err, DLOCK_EIO, "semaphore '%s': the zookeeper session expired while "
                                           "waiting", nm);
            break;
        }
        /* both reads leave a watch (the leases: the first waiter's only): a
         * release (delete) or a new total after them wakes us */
        zk_op *op = NULL;
        int zrc = dl_zk_req(zc, s, first ? OP_WATCH_KIDS : OP_KIDS, zs->node, 0, &op);
        int64_t total = 0;
        int set = 0, exists = 0;
        rc = zrc == ZOK ? sem_read(zc, s, zs->node, 1, &total, &set, NULL, &exists, err)
                        : dl_zk_fail(zrc, "list the semaphore's leases", err);
        if (rc == DLOCK_EIO && !dl_zk_sess_dead(s) && dl_now_ms() < deadline && wait_ms != 0) {
            if (op) dl_zk_op_unref(op);
            dl_sleep_ms(50); /* disconnected: the session may come back */
            continue;
        }
        zk_lease *v = NULL;
        int n = 0, mine = 0, nmine = 0, ahead = -1;
        if (!rc) rc = leases_of(op, &v, &n, err);
        if (!rc) leases_held(v, n, total, guid, &mine, &nmine, &ahead);
        /* the waiting group just ahead of ours: we watch its last lease */
        char *ap = NULL, aguid[2 * ZK_GUID_BYTES + 1] = "";
        if (!rc && ahead >= 0 && strcmp(v[ahead].guid, held_guid)) {
            memcpy(aguid, v[ahead].guid, sizeof aguid);
            if (!(ap = dl_zk_join3(zs->node, "/", v[ahead].name)))
                rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        }
        free(v);
        if (op) dl_zk_op_unref(op);
        if (rc) break;
        if (nmine != k) {
            free(ap);
            rc = dl_seterr(err, DLOCK_EIO, "semaphore '%s': our lease nodes vanished (session "
                                           "expired?)", nm);
            break;
        }
        if (mine) {
            free(ap);
            if (waited) mark_held(s, paths[k - 1]);
            if (zs->sess && zs->sess != s) sem_drop(zs, 0); /* an expired session's */
            for (int i = 0; i < k; i++) zs->leases[zs->nleases++] = paths[i];
            free(paths);
            if (zs->sess) {
                dl_zk_sess_unref(s); /* the handle has its reference already */
            } else {
                zs->sess = s;
                sem_held_add(zs);
            }
            return DLOCK_OK;
        }
        if (wait_ms == 0 || dl_now_ms() >= deadline) {
            free(ap);
            rc = dl_sem_refused(o, permits, wait_ms != 0, err);
            break;
        }
        waited = 1;
        int64_t until = deadline;
        if (!ap) {
            /* the first waiter: every release wakes it */
            if (!first) {
                first = 1; /* we listed without the watch: again, with it */
                continue;
            }
        } else {
            /* a waiter behind another: its admission (the lease marked),
             * its give-up or its release (the lease deleted) wakes us, as
             * does a new total; a re-check now and then covers a mark that
             * was lost, and holders beyond a lowered total (unmarked) */
            first = 0;
            zk_op *ao = NULL;
            rc = dl_zk_watch_ahead(zc, s, ap, deadline, "watch the semaphore's queue", &ao, err);
            free(ap);
            if (rc == ZK_LOOK_AGAIN) continue;
            if (rc) break;
            int held = ao->datalen == (int)strlen(ZK_LEASE_HELD) &&
                       !memcmp(ao->data, ZK_LEASE_HELD, strlen(ZK_LEASE_HELD));
            dl_zk_op_unref(ao);
            if (held) {
                memcpy(held_guid, aguid, sizeof held_guid);
                first = 1;
                continue;
            }
            int64_t re = dl_now_ms() + ZK_SEM_RECHECK_MS;
            if (re < until) until = re;
        }
        if (dl_zk_wait_event(s, ev0, until, &o->h.cancel)) {
            rc = dl_seterr(err, DLOCK_ECANCELED, "waiting for '%s' was cancelled", nm);
            break;
        }
    }
    for (int i = 0; i < k; i++) dl_zk_give_up_node(zc, s, paths[i]);
    free_paths(paths, k);
    dl_zk_sess_unref(s);
    return rc;
}

/* Gives back permits this handle holds (its latest leases first). */
int dl_zk_sem_release(dl_object *o, int64_t permits, dl_err *err) {
    zk_client *zc = o->h.c->backend_client;
    zk_sem *zs = o->h.backend_state;
    char nm[80];
    dl_name_msg(o->h.name, o->h.name_len, nm, sizeof nm);
    if (zs->sess && dl_zk_sess_dead(zs->sess)) {
        int64_t had = zs->nleases;
        sem_drop(zs, 0);
        return dl_seterr(err, DLOCK_ELOST, "semaphore '%s': the zookeeper session holding this "
                                           "handle's %lld permit(s) expired (they were freed)",
                         nm, (long long)had);
    }
    if (permits > zs->nleases) return dl_sem_over_release(o, permits, zs->nleases, err);
    int64_t until = dl_deadline(zc->cmd_timeout_ms > zc->session_ms ? zc->cmd_timeout_ms
                                                                    : zc->session_ms);
    while (permits > 0) {
        const char *path = zs->leases[zs->nleases - 1];
        int zrc;
        for (;;) {
            zrc = dl_zk_req(zc, zs->sess, OP_DELETE, path, 0, NULL);
            if (!dl_zk_unknown(zrc) || dl_zk_sess_dead(zs->sess) || dl_now_ms() >= until) break;
            dl_sleep_ms(50);
        }
        if (zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE || dl_zk_sess_dead(zs->sess)) {
            int64_t had = zs->nleases;
            sem_drop(zs, 0);
            return dl_seterr(err, DLOCK_ELOST, "semaphore '%s': the zookeeper session holding "
                                               "this handle's %lld permit(s) expired", nm,
                             (long long)had);
        }
        if (zrc != ZOK && zrc != ZNONODE) return dl_zk_fail(zrc, "semaphore release", err);
        free(zs->leases[--zs->nleases]);
        permits--;
    }
    if (zs->nleases == 0) sem_drop(zs, 0);
    return DLOCK_OK;
}

/* total - the permits held (the leases that fit; waiters are not counted). */
int dl_zk_sem_available(dl_object *o, int64_t *permits, dl_err *err) {
    zk_client *zc = o->h.c->backend_client;
    zk_sem *zs = o->h.backend_state;
    zk_sess *s = NULL;
    int rc = dl_zk_sess_get(zc, &s, err);
    if (rc) return rc;
    int64_t total = 0;
    int set = 0, exists = 0;
    zk_op *op = NULL;
    rc = sem_read(zc, s, zs->node, 0, &total, &set, NULL, &exists, err);
    if (!rc && exists) {
        int zrc = dl_zk_req(zc, s, OP_KIDS, zs->node, 0, &op);
        if (zrc != ZOK && zrc != ZNONODE) rc = dl_zk_fail(zrc, "list the semaphore's leases", err);
    }
    zk_lease *v = NULL;
    int n = 0;
    if (!rc) rc = leases_of(op, &v, &n, err);
    if (!rc) *permits = total - leases_held(v, n, total, NULL, NULL, NULL, NULL);
    free(v);
    if (op) dl_zk_op_unref(op);
    dl_zk_sess_unref(s);
    return rc;
}

/* Sets the total: to permits only while unset (try_set), or adds delta. A
 * write whose outcome is unknown (connection lost) is not re-sent: an add
 * could be applied twice; DLOCK_EIO says so. */
static int sem_write(dl_object *o, int add, int64_t v, int *set, dl_err *err) {
    zk_client *zc = o->h.c->backend_client;
    zk_sem *zs = o->h.backend_state;
    const char *what = add ? "semaphore add" : "semaphore try_set";
    zk_sess *s = NULL;
    int rc = dl_zk_sess_get(zc, &s, err);
    if (rc) return rc;
    for (int tries = 0;; tries++) {
        if (tries >= 100) {
            rc = dl_seterr(err, DLOCK_EIO, "zookeeper: %s: the value kept changing", what);
            break;
        }
        int64_t total = 0;
        int has = 0, version = 0, exists = 0;
        rc = sem_read(zc, s, zs->node, 0, &total, &has, &version, &exists, err);
        if (rc) break;
        if (!add && has) {
            *set = 0;
            break;
        }
        if (add && ((v > 0 && total > INT64_MAX - v) || (v < 0 && total < INT64_MIN - v))) {
            rc = dl_seterr(err, DLOCK_EOVERFLOW, "%s: the permits would overflow", what);
            break;
        }
        char num[24];
        dl_fmt_ll(num, add ? total + v : v);
        int zrc = exists ? dl_zk_req_data(zc, s, OP_SET, zs->node, version, num, NULL)
                         : dl_zk_req_data(zc, s, OP_CREATE, zs->node, ZOO_PERSISTENT, num, NULL);
        if (zrc == ZOK) {
            if (set) *set = 1;
            break;
        }
        if (zrc == ZBADVERSION || zrc == ZNODEEXISTS) continue; /* changed meanwhile */
        if (zrc == ZNONODE && !exists) {
            rc = dl_zk_ensure_parents(zc, s, zc->sems, ZOO_PERSISTENT, err);
            if (rc) break;
            continue;
        }
        if (zrc == ZNONODE) continue; /* deleted meanwhile */
        rc = dl_zk_fail(zrc, what, err);
        break;
    }
    dl_zk_sess_unref(s);
    return rc;
}

int dl_zk_sem_try_set(dl_object *o, int64_t permits, int *set, dl_err *err) {
    return sem_write(o, 0, permits, set, err);
}

int dl_zk_sem_add(dl_object *o, int64_t delta, dl_err *err) {
    return sem_write(o, 1, delta, NULL, err);
}
