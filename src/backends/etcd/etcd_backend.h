/* The etcd backend's own declarations, shared by its files
 * (src/backends/etcd/): the design below, the types, and the functions one
 * file of the backend lends another. */
/* etcd backend: etcd://host1:2379,host2:2379 (port 2379 when left out).
 *
 * Talks to etcd's v3 JSON gateway (POST /v3/..., keys and values base64)
 * over HTTP (etcds://: HTTPS) with libcurl; answers are read with cJSON. Tested with
 * etcd 3.4 (Debian 12 ships 3.4.23).
 * - Endpoints: every host in the URL is an endpoint of one cluster. A request
 *   that cannot connect (refused, unresolvable, connect timeout) is sent to
 *   the next one; the one that answered is used first from then on. A request
 *   that was sent but not answered is not retried elsewhere (it may have been
 *   applied). user:password@ (etcd auth) is DLOCK_ENOTSUP for now, anything
 *   after the host list DLOCK_EINVAL.
 * - etcds://: HTTPS, the server verified against tls_ca_file / tls_ca_dir
 *   (else the system's CAs) and the URL's host, a client certificate sent
 *   when tls_cert_file and tls_key_file are set, tls_insecure skipping the
 *   verification (tests only); tls_server_name is DLOCK_ENOTSUP. Handshake
 *   and verification failures are DLOCK_ETLS.
 * - Keys: a lock named N of L bytes lives under the prefix
 *   "dlock/lock/<L>/<N>/" (the length keeps "a" and "a/b" apart). Each
 *   attempt creates "<prefix>w/<lease id, 16 hex>" (exclusive kinds: plain,
 *   reentrant, fair, write) or "<prefix>r/<lease id>" (read), "-<n, hex>"
 *   appended under the session lease, with that
 *   lease and the holder's token as value (n: the handle's number, so one
 *   handle's holds on a session reuse one key): the concurrency recipe
 *   of etcd's own Mutex / RWMutex, done by the client. An exclusive attempt
 *   holds the lock when its key is the oldest (lowest create_revision) under
 *   the prefix; a read attempt when no exclusive key is older than its own.
 *   A waiter watches only its predecessor (the newest older key; for a
 *   reader, the newest older exclusive key) for deletion, so a release wakes
 *   the next in line (no herd), waiters are served in arrival order (so the
 *   fair kind is the same lock), and a waiting writer holds back the readers
 *   that come after it.
 * - Acquire: one txn creates the key (if absent) and reads the oldest key
 *   of the prefix; its revision is the key's create_revision, the fencing
 *   token. Uncontended, with DLOCK_WATCHDOG, that txn is the only request
 *   (one Raft write). Try once (wait 0): when the holder is not us, the key
 *   is deleted (an explicit lease: revoked) and DLOCK_EBUSY is answered. A
 *   timed wait that runs out, a cancel or a failure does the same: nothing
 *   is left behind.
 * - After a wait the key is read back: a key gone (its lease expired while
 *   waiting, cf. etcd issue 11456 for the server's lock API) is not a lock;
 *   the attempt starts over while time remains. Uncontended there is no
 *   read-back: the txn that created the key read the holder atomically.
 * - Leases. DLOCK_WATCHDOG: every such hold of a client rides on one session
 *   lease (as etcd's concurrency.Session) of the client's watchdog_lease_ms
 *   (rounded UP to whole seconds), granted by the first such acquire, kept
 *   alive every third of it by one keep-alive thread per client (started
 *   then, stopped when the client is freed; an unused session lease is then
 *   revoked, one still holding runs out); the lock is held while the client
 *   lives (expires_at INT64_MAX). A session lease found gone (by the
 *   keep-alive, or by an acquire whose put etcd refuses for it) is dropped:
 *   every hold on it is lost at once, each with its callback, and the next
 *   acquire grants a new one. An explicit lease_ms is an
 *   etcd lease of lease_ms rounded UP to whole seconds (etcd grants at least
 *   2 s on default settings; the granted TTL is what counts), kept alive
 *   only while waiting and refreshed once when acquired, then left to run
 *   out: a lease per hold. dlock_extend grants a new lease, re-puts the key
 *   with it in a txn guarded by the key's create_revision (so the fencing
 *   token stays) and revokes the old lease (not the session's).
 * - Loss: the keep-alive finding a lease gone or a kept hold's key put again
 *   in place by another (its round's check txn), or the client's watch
 *   seeing a kept hold's key deleted (at once for a hold kept 50 ms: "the
 *   client's watch" below), or check / release / extend finding the key
 *   gone or re-created,
 *   means the lock is lost: release says DLOCK_ELOST, check "not held",
 *   dlock_lock_is_lost 1; the keep-alive or the watch thread runs the loss
 *   callback (DLOCK_LOST_TAKEN) for the holds it keeps.
 * - Fencing token: the lock key's create_revision (etcd's revision counter
 *   only grows, so tokens of one name strictly increase across holders).
 *   dlock_fence_current: the holder's token, or when free the store's
 *   current revision, which no token issued exceeds and every later token
 *   does. Reentrant re-entry keeps the token and counts holds locally.
 * - Release: delete the key in a txn guarded by its create_revision (one
 *   request, one write), then, for an explicit lease only, revoke it.
 * - Timeouts: every HTTP request connects within connect_timeout_ms and
 *   completes within connect_timeout_ms + command_timeout_ms; a wait watches
 *   for at most a third of the lease at a time and keeps the attempt's lease
 *   alive between watches.
 * - Kinds: plain, reentrant, fair, read and write, all on one name sharing
 *   the prefix. Re-entry of a handle that holds (reentrant, fair, read,
 *   write) is counted by the handle. Semaphores: see "semaphores" below.
 *   Permit-expirable semaphores, latches, tokens, force_unlock, list and the
 *   ID worker: not supported (DLOCK_ENOTSUP).
 * - dlock_inspect: writer / holder (token) / fence of the exclusive holder,
 *   or readers (the read keys older than the oldest exclusive key) with the
 *   newest reader's token as fence; waiters: the other keys; ttl_ms: the
 *   oldest key's lease TTL (whole seconds).
 * - dlock_server_fact: "version" (etcdserver of /version), "cluster_version"
 *   (etcdcluster of /version), "session" (what keeps a lock held),
 *   "endpoint" (the endpoint used last, http://host:port), "revision" (the
 *   store's current revision).
 */
#ifndef DLOCK_BACKEND_ETCD_H
#define DLOCK_BACKEND_ETCD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "kinds.h"

#define ETCD_MAX_EPS 16
#define ETCD_MAX_BODY (16u << 20) /* an answer larger than this is refused */

typedef struct etcd_lock etcd_lock;

/* An event of the client's watch that concerned no kept hold when it came:
 * a hold kept just after (its acquire's answer raced the event) looks here
 * for what happened to its key meanwhile. */
typedef struct cw_event {
    char *key;
    size_t key_len;
    long long mod_rev, create_rev, lease;
    int del;
} cw_event;

#define CW_RING 256

typedef struct etcd_client {
    char *eps[ETCD_MAX_EPS];      /* "http://host:port" or "https://host:port" */
    int tls;                      /* etcds:// */
    char *ca_file, *ca_dir, *cert_file, *key_file;
    int insecure;
    size_t neps;
    atomic_size_t cur;            /* the endpoint tried first */
    int64_t connect_ms, cmd_ms;
    int64_t wd_ttl_s;             /* DLOCK_WATCHDOG lease TTL, whole seconds */
    pthread_mutex_t mu;           /* guards curl */
    CURL *curl;                   /* queries by name */
    /* the keep-alive thread */
    pthread_mutex_t ka_mu;        /* guards what follows and every etcd_lock's kept/next */
    dl_renewer ka;                /* the thread (renewer.c) */
    CURL *ka_curl;                /* its HTTP handle (only it uses it) */
    int ka_stop;                  /* the client is closing: the watch thread ends */
    etcd_lock *ka_list;
    int64_t sess_ttl;             /* its granted TTL, seconds */
    long long sess;               /* the session lease of DLOCK_WATCHDOG holds (0: none yet,
                                     or found gone: the next such acquire grants another) */
    pthread_mutex_t sess_mu;      /* one grant at a time */
    atomic_ullong seq;            /* numbers the handles: each session hold's key unique */
    /* the client's watch of its kept holds' keys (cw_main; ka_mu guards the
     * fields but cw_multi, which lives from the thread's start to close) */
    pthread_t cw_thread;
    pthread_cond_t cw_cv;
    CURLM *cw_multi;              /* the stream's; curl_multi_wakeup wakes the thread */
    int cw_started;
    int cw_live;                  /* a stream is open, or being opened, on [lo, hi) */
    int cw_restart;               /* a kept hold that stream does not cover */
    char *cw_lo, *cw_hi;          /* the range watched (binary keys) */
    size_t cw_lo_len, cw_hi_len;
    char *cw_add_lo, *cw_add_hi;  /* to take in at the restart (NULL: nothing) */
    size_t cw_add_lo_len, cw_add_hi_len;
    long long cw_start;           /* the stream's start revision */
    long long cw_next;            /* every event before it in the range was handled (0: none) */
    cw_event cw_ring[CW_RING];    /* the latest events that concerned no kept hold */
    size_t cw_ring_pos;
    long long cw_ring_floor;      /* events up to it may be missing from the ring */
} etcd_client;

struct etcd_lock {
    dlock_lock *l;                /* NULL: a semaphore acquisition (sem) */
    dl_object *sem;               /* its semaphore handle, when l is NULL */
    CURL *curl;
    char *prefix;                 /* "dlock/lock/<len>/<name>/" (binary-safe) */
    size_t prefix_len;
    char *wprefix;                /* prefix + "w/": the exclusive holds' keys */
    size_t wprefix_len;
    int reader;                   /* a read lock: keys under prefix + "r/" */
    unsigned long long kn;        /* the handle's number in its client (ec->seq) */
    char *key;                    /* prefix + "w/" or "r/" + lease hex: the hold's key */
    size_t key_len;
    long long lease;              /* current hold's lease id */
    long long rev;                /* current hold's create_revision */
    int64_t ttl_s;                /* granted TTL of the lease */
    int session;                  /* lease is the client's session lease (DLOCK_WATCHDOG) */
    int kept;                     /* in the keep-alive list (ka_mu) */
    long long wfrom;              /* its key was its own at this revision (ka_mu) */
    int wreplay;                  /* the client's watch must replay from wfrom + 1 (ka_mu) */
    int64_t wdue;                 /* ... by then (dl_now_ms; ka_mu) */
    etcd_lock *next;              /* keep-alive list link (ka_mu) */
    atomic_int lost;
};

typedef struct http_buf {
    char *p;
    size_t n, cap;
    /* watch streams: stop at the first event (or cancel / error) */
    int stream, event, stream_err;
    size_t scanned;
} http_buf;

#define OOM(err) dl_seterr(err, DLOCK_ENOMEM, "out of memory")

/* etcd's largest lease TTL (MaxLeaseTTL), in seconds */
#define ETCD_MAX_TTL_S 9000000000LL

/* A kept lock hold as seen for a check of its key (dl_etcd_ka_check). */
typedef struct ka_seen {
    etcd_lock *el;
    char *key;
    size_t key_len;
    long long rev, lease;
    int gone;
} ka_seen;

/* etcd's default limit of operations (compares too) in one txn
 * (--max-txn-ops): a check of more holds takes several txns. Two compares
 * per hold. */
#define ETCD_CHECK_PER_TXN 64

/* How long a kept hold the stream does not cover waits for it: a hold
 * released sooner never (re)starts the stream, so that short holds (an
 * uncontended acquire + release takes about 2 ms) cost no stream and no
 * event; a deletion in that time is seen when the stream replays from the
 * hold's revision, or by the release (DLOCK_ELOST). */
#define CW_LAZY_MS 50

typedef struct cw_stream {
    etcd_client *ec;
    char *p;
    size_t n, cap;
    int created, compacted, failed; /* what the stream said */
} cw_stream;

#define ETCD_SEM_RECHECK_MS 2000

typedef struct etcd_acq {
    etcd_lock ka;                 /* the lease's entry in the keep-alive list */
    int64_t k;                    /* permits it holds (its key's count) */
} etcd_acq;

typedef struct etcd_sem {
    CURL *curl;
    char *lprefix, *total;        /* its keys: "dlock/sem/<len>/<name>/" + "l/", + "total" */
    size_t lprefix_len, total_len;
    char *wkey, *wend;            /* base64: the range of all its keys (first waiter's watch) */
    etcd_acq **acqs;              /* held, oldest first */
    int nacq, cap;
} etcd_sem;

/* http.c */
int dl_etcd_client_rpc(etcd_client *ec, const char *path, cJSON *req, cJSON **resp, int *gcode,
                       dl_err *err);
char *dl_etcd_b64_enc(const char *src, size_t len);
size_t dl_etcd_b64_dec(const char *s, char *out, size_t outlen);
int dl_etcd_conn_failure(CURLcode rc);
void dl_etcd_curl_setup(etcd_client *ec, CURL *h, const char *url, char *ebuf, int64_t timeout_ms);
int dl_etcd_http_do_cx(etcd_client *ec, CURL *h, const char *path, const char *body,
                       int64_t timeout_ms, dl_cancel *cx, http_buf *out, long *status,
                       dl_err *err);
int64_t dl_etcd_req_timeout(const etcd_client *ec);
int dl_etcd_rpc(etcd_client *ec, CURL *h, const char *path, cJSON *req, int64_t timeout_ms,
                cJSON **resp, int *gcode, dl_err *err);
long long dl_etcd_jnum(const cJSON *o, const char *name);
const char *dl_etcd_jstr(const cJSON *o, const char *name);
cJSON *dl_etcd_jobj(const cJSON *o, const char *name);
int dl_etcd_add_str(cJSON *o, const char *name, const char *v);
int dl_etcd_add_ll(cJSON *o, const char *name, long long v);
int dl_etcd_add_b64(cJSON *o, const char *name, const char *s, size_t len);
int dl_etcd_add_prefix_range(cJSON *o, const char *prefix, size_t len);

/* keys.c */
char *dl_etcd_what_prefix(const char *what, const char *name, size_t len, const char *sub,
                          size_t *outlen);
char *dl_etcd_name_prefix(const char *name, size_t len, const char *sub, size_t *outlen);
int dl_etcd_get_owner(etcd_client *ec, CURL *h, const char *prefix, size_t plen, long long max_rev,
                      int newest, int all, cJSON **resp, cJSON **kv, long long *rev, dl_err *err);
int dl_etcd_key_state(etcd_client *ec, CURL *h, etcd_lock *el, long long *crev, long long *lease,
                      long long *hrev, dl_err *err);
int dl_etcd_ka_check(etcd_client *ec, CURL *h, ka_seen *seen, size_t n, long long *rev);

/* lock.c */
int dl_etcd_lock_init(dlock_lock *l, dl_err *err);
void dl_etcd_lock_destroy(dlock_lock *l);
int dl_etcd_put_and_own(etcd_client *ec, etcd_lock *el, long long id, int *owner, int *nolease,
                        dl_err *err);
int dl_etcd_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                    dl_err *err);
int dl_etcd_release(dlock_lock *l, long long *res, dl_err *err);
int dl_etcd_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err);
int dl_etcd_check(dlock_lock *l, int *held, int64_t *count, dl_err *err);

/* query.c */
int dl_etcd_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                    dl_err *err);
int dl_etcd_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                          dl_err *err);
int dl_etcd_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                        dl_err *err);

/* sem.c */
int dl_etcd_sem_init(dl_object *o, dl_err *err);
void dl_etcd_sem_destroy(dl_object *o);
int dl_etcd_sem_acquire(dl_object *o, int64_t permits, int64_t wait_ms, dl_err *err);
int dl_etcd_sem_release(dl_object *o, int64_t permits, dl_err *err);
int dl_etcd_sem_available(dl_object *o, int64_t *permits, dl_err *err);
int dl_etcd_sem_try_set(dl_object *o, int64_t permits, int *set, dl_err *err);
int dl_etcd_sem_add(dl_object *o, int64_t delta, dl_err *err);

/* session.c */
int64_t dl_etcd_lease_secs(int64_t lease_ms);
int dl_etcd_lease_grant(etcd_client *ec, CURL *h, int64_t ttl_s, long long *id, int64_t *granted,
                        dl_err *err);
void dl_etcd_lease_revoke(etcd_client *ec, CURL *h, long long id);
int dl_etcd_lease_keepalive(etcd_client *ec, CURL *h, long long id, int *alive, dl_err *err);
void dl_etcd_ka_init(etcd_client *ec);
int dl_etcd_ka_add(etcd_client *ec, etcd_lock *el, int *stale, dl_err *err);
int dl_etcd_sess_get(etcd_client *ec, CURL *h, long long *id, int64_t *ttl_s, dl_err *err);
void dl_etcd_sess_drop(etcd_client *ec, long long id);

/* kept.c (under ka_mu: the _locked ones) */
void dl_etcd_ka_remove_locked(etcd_client *ec, etcd_lock *el);
void dl_etcd_ka_lost_locked(etcd_client *ec, etcd_lock *el);
int dl_etcd_ka_del(etcd_client *ec, etcd_lock *el);

/* watch.c */
void dl_etcd_cw_wake(etcd_client *ec);
int dl_etcd_cw_admit_locked(etcd_client *ec, etcd_lock *el);
int dl_etcd_cw_start_locked(etcd_client *ec, dl_err *err);
int dl_etcd_watch_keys(etcd_client *ec, CURL *h, const char *key_b64, const char *end_b64,
                       int noput, long long from, int64_t ms, dl_cancel *cx, dl_err *err);
int dl_etcd_txn_if(etcd_client *ec, CURL *h, const char *key, size_t key_len, const char *target,
                   long long rev, const char *value, size_t value_len, long long lease, int *done,
                   dl_err *err);

extern const dl_backend dl_backend_etcd;

#endif
