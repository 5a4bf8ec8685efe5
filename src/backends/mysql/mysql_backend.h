/* The MySQL backend's own declarations, shared by its files
 * (src/backends/mysql/): the design below, the types, and the functions one
 * file of the backend lends another. */
/* The MySQL / MariaDB backend:
 *   mysql://[user[:password]@]host[:port]/database[?lock=get_lock|table]
 * (also mariadb://; port 3306; user, password and database may be
 * percent-encoded), over libmariadb, always TCP (also for host "localhost",
 * which libmariadb would otherwise take for the local unix socket). The
 * lock= parameter picks one of two modes; any other parameter is
 * DLOCK_EINVAL. The two modes are different locks: one name locked in both
 * modes is two locks that do not exclude each other (they share only the
 * fence counter), so every user of a name must use the same mode.
 *
 * GET_LOCK mode (the default, ?lock=get_lock): locks are the server's named
 * user locks, GET_LOCK / RELEASE_LOCK, held by a connection (a session)
 * while it lives: each lock handle has its own connection, opened by
 * dlock_lock_new. A holder that dies or loses its connection loses the lock
 * at once (the server frees it when the connection ends); nothing expires
 * while the connection lives.
 *  - Kinds: DLOCK_KIND_PLAIN and DLOCK_KIND_REENTRANT (MariaDB >= 10.0.2 and
 *    MySQL >= 5.7 count nested GET_LOCKs per connection). GET_LOCK has no
 *    shared mode: no read/write or fair locks.
 *  - lease_ms: only DLOCK_WATCHDOG, meaning "held while the connection
 *    lives". An explicit lease (> 0) is DLOCK_ENOTSUP: the server cannot
 *    make the lock expire while its connection is open, and the library does
 *    not pretend it does. dlock_extend is DLOCK_ENOTSUP too.
 *  - Waits are the server's: GET_LOCK(name, seconds) with fractional seconds
 *    (0 for try-once, 1-year chunks for DLOCK_WAIT_FOREVER); no polling.
 *    dlock_lock_cancel ends such a wait with KILL QUERY <the handle's
 *    connection id> on the client's own connection: GET_LOCK ends, the
 *    connection stays. Closing the connection instead would leave the
 *    server's thread waiting for the lock until it notices the closed
 *    socket (MariaDB: about a second), and take the lock if it is released
 *    meanwhile; that is only the fallback when the KILL fails. The table mode's naps
 *    between attempts end at once.
 *  - Lock names (both modes): a name of at most 64 bytes of printable ASCII
 *    is used as is, as a binary string (MySQL's limit is 64 characters;
 *    MariaDB 10.11 compares binary names byte for byte; a server that folds
 *    case would make "A" and "a" one lock: safe, only less parallel). Any
 *    other name (longer, or with other bytes) is replaced by "dlock:" + the
 *    hex of the first 24 bytes of its SHA-256 (54 characters), so names
 *    starting "dlock:" are best avoided. The table mode keys its rows the
 *    same way.
 *  - Fencing tokens (both modes): table dlock_fence (name VARBINARY(255)
 *    PRIMARY KEY, n BIGINT), InnoDB, created if missing when the client
 *    opens (the user needs CREATE on the database once). Each successful
 *    acquire, re-entry included, increments the name's row; the new n is the
 *    token, strictly increasing per name.
 *  - A lost connection: release answers DLOCK_ELOST and check DLOCK_ELOST
 *    with *held 0 (the lock went with the connection); the next acquire
 *    connects again. The connection never reconnects by itself (that would
 *    drop the locks silently).
 *  - Timeouts: connect_timeout_ms and command_timeout_ms, rounded up to whole
 *    seconds, are the connection's connect / read / write timeouts; a
 *    GET_LOCK waits for the server's answer for its wait plus the command
 *    timeout (forever for DLOCK_WAIT_FOREVER).
 *  - Queries by name (dlock_inspect, dlock_is_locked, dlock_remaining_ttl,
 *    dlock_fence_current) use the client's own connection: exists from
 *    IS_USED_LOCK, ttl -1 while held (no expiry) and -2 when free, holder
 *    "connection <id>". dlock_force_unlock is not supported (only KILL of the
 *    holder's connection could do it).
 *
 * Table mode (?lock=table): the seeds' unique-key lock, made a lease. Table
 * dlock_locks (name VARBINARY(255) PRIMARY KEY, token VARBINARY(128), fence
 * BIGINT, expires_at BIGINT, kind TINYINT: the dlock_kind), InnoDB, created if missing when the client
 * opens: one row per held lock, inserted to acquire, deleted to release.
 *  - Clock: expires_at is microseconds since the Unix epoch by the server's
 *    clock (UNIX_TIMESTAMP(NOW(6)); the mode's connections set time_zone
 *    '+00:00', so no DST step), so every client compares against one clock
 *    and client clocks never matter. A step of the server's clock moves every
 *    lease with it. On the client, a lease is counted from before the
 *    statement was sent (monotonic), so dlock_lock_valid_ms never outlasts
 *    the server's view.
 *  - Acquire: one transaction: increment the fence row (dlock_fence; its row
 *    lock orders the acquirers of a name), then INSERT ... ON DUPLICATE KEY
 *    UPDATE that takes the existing row only if it has expired or already
 *    carries our token (re-entry) and else leaves it untouched (0 rows
 *    affected: busy, ROLLBACK, fence increment undone). The row lock makes
 *    the check and the takeover one step: two clients never both get it.
 *    The row keeps the holder's fence. A deadlock between acquirers (InnoDB
 *    may report one on concurrent first inserts) is tried again, 3 times,
 *    then counts as busy.
 *  - Owner token: "<client id>:<thread id>:<32 hex>", 128 bits from
 *    getrandom per hold (dlock_lock_token shows it; inspect's holder).
 *  - Waiting: there is no notification: a poll, every 4 ms at first,
 *    doubling to 100 ms at most, each nap a random half to whole of the
 *    interval, never past the deadline. Try once: DLOCK_EBUSY; timed:
 *    DLOCK_ETIMEDOUT.
 *  - Lease: lease_ms > 0 is the row's expiry; DLOCK_WATCHDOG is the client's
 *    watchdog_lease_ms, renewed every third of it by one renewal thread per
 *    client (started at the first such hold, joined by dlock_client_free),
 *    on a connection of its own whose timeouts come from the renewal period
 *    (whole seconds, 1 at least). A renewal that finds the row gone or not
 *    ours marks the hold lost (DLOCK_LOST_TAKEN); one without an answer for
 *    a whole lease, DLOCK_LOST_UNREACHABLE (up to about a second late while
 *    a reconnect hangs); the lost callback then runs on the renewal thread
 *    (set it before acquiring). dlock_lock_valid_ms of a renewed hold is very
 *    large until it is found lost, then 0.
 *  - extend: UPDATE ... WHERE name, token and not expired: no row matched
 *    (mysql_info's "Rows matched") is DLOCK_ELOST; a renewed hold becomes a
 *    fixed lease, as on Redis. Release: DELETE WHERE name, token and not
 *    expired: no row is DLOCK_ELOST (our own expired row, if nobody took it,
 *    is deleted too). A new holder's row is never touched: every statement
 *    names our token.
 *  - Kinds: plain and reentrant; re-entry is counted by the handle (the row
 *    is taken again with the same token: a new fence and lease); inspect's
 *    hold_count is 1.
 *  - Connections: the handles of a client share its one connection (no
 *    session state is needed), statement by statement, plus the renewal
 *    thread's. A broken connection
 *    is reopened by the next statement; a statement without an answer makes
 *    the call fail (DLOCK_EIO) and a hold it was taking may stay in the table
 *    until its lease runs out.
 *  - Queries: inspect / is_locked / remaining_ttl read the row (an expired
 *    row counts as free; ttl from the server's clock; holder the token;
 *    fence the name's counter); force_unlock deletes the row (existed: a
 *    live row was there); the holder finds out at its next renewal, extend,
 *    check or release.
 *
 * dlock_server_fact (both modes): "version" (SELECT VERSION()), "session"
 * ("the connection (GET_LOCK)" or "a lease in table dlock_locks, N ms ..."),
 * "mode" (get_lock / table), "wait_timeout" (seconds; an idle GET_LOCK holder
 * loses its lock with its connection), "server_time_ms" (the server's clock,
 * Unix ms), "connection_id" (of the client's query connection).
 * Messages name the server as mysql://user:***@host:port/database. */
#ifndef DLOCK_BACKEND_MYSQL_H
#define DLOCK_BACKEND_MYSQL_H

#include <pthread.h>
#include <stdint.h>

#include <mysql.h>

#include "kinds.h"

#define MY_KEY_MAX 64                 /* longest lock name GET_LOCK takes (MySQL) */
#define MY_FOREVER_CHUNK_S 31536000LL /* one GET_LOCK of a forever wait: a year */

#define MY_BACKOFF_MIN_MS 4          /* table mode: first poll interval */
#define MY_BACKOFF_MAX_MS 100        /* table mode: longest poll interval */
#define MY_TRY_RETRIES 3             /* table mode: attempts after a deadlock */
/* the server's clock in microseconds since the Unix epoch (the session's
 * time zone is UTC in table mode, so the round trip through NOW() is exact) */
#define MY_NOW_US "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"

enum { MY_MODE_GET_LOCK = 0, MY_MODE_TABLE = 1 };

typedef struct my_url {
    char user[128], password[256], host[256], database[128];
    unsigned port;
    int mode;        /* ?lock=get_lock (default) or ?lock=table */
    char label[700]; /* for messages: no password */
} my_url;

typedef struct my_lock my_lock;

typedef struct my_client {
    my_url u;
    unsigned connect_s, rw_s; /* connection timeouts, whole seconds */
    int64_t cmd_ms;
    pthread_mutex_t mu; /* guards db */
    MYSQL *db;          /* queries by name, ping; table mode: every lock statement */
    /* table mode: the renewal thread of DLOCK_WATCHDOG holds */
    pthread_mutex_t rmu;   /* guards the fields below and each my_lock's r* fields */
    dl_renewer renewer;    /* the thread (renewer.c); woken by a new hold */
    pthread_cond_t rdone;  /* a renewal round ended */
    MYSQL *rdb;            /* the renewal thread's own connection (only it uses it) */
    int rrunning;
    my_lock *rhead;        /* registered holds */
    uint64_t rseq;
} my_client;

struct my_lock {
    dlock_lock *l;
    MYSQL *db;                       /* GET_LOCK mode: this handle's session; NULL when closed */
    char hex[2 * MY_KEY_MAX + 1];    /* the lock name (key) in hex, for x'...' */
    /* table mode: the owner token of the current hold (l->token) in hex */
    char tokhex[2 * sizeof ((dlock_lock *)0)->token + 1];
    /* table mode, guarded by the client's rmu: the renewal registration */
    int reg;                         /* in the client's renewal list */
    uint64_t rseq;                   /* registration number */
    int64_t rlease_ms;               /* lease each renewal sets */
    int64_t rnext_ms;                /* monotonic ms of the next renewal */
    my_lock *rnext;
};

#define MY_ROW_COLS 4

typedef struct my_row {
    int present;                   /* a row came */
    int isnull[MY_ROW_COLS];
    char v[MY_ROW_COLS][200];      /* NUL-terminated, truncated */
    unsigned long len[MY_ROW_COLS];
} my_row;

typedef struct renew_snap {
    my_lock *ml;
    uint64_t seq;
    int64_t lease_ms;
    char hex[sizeof ((my_lock *)0)->hex];
    char tokhex[sizeof ((my_lock *)0)->tokhex];
    int64_t t0;
    int result; /* 1 renewed, 0 lost, -1 no answer */
} renew_snap;

/* conn.c */
int dl_my_connect_t(my_client *mc, unsigned connect_s, unsigned rw_s, MYSQL **out,
                    dl_err *err);
void dl_my_close_db(MYSQL **db);
int dl_my_connect(my_client *mc, MYSQL **out, dl_err *err);
int dl_my_query_cx(my_client *mc, MYSQL *db, const char *sql, int64_t until,
                   dl_cancel *cx, int *canceled, int want, long long *v, int *isnull,
                   int *broken, dl_err *err);
int dl_my_query(MYSQL *db, const char *sql, int64_t until, int want, long long *v,
                int *isnull, int *broken, dl_err *err);
int dl_my_exec(MYSQL *db, const char *sql, int64_t until, long long *affected,
               long long *matched, int *broken, dl_err *err);
int dl_my_query_row(MYSQL *db, const char *sql, int64_t until, my_row *row, int *broken,
                    dl_err *err);
void dl_my_make_key(const char *name, size_t len, char *hex);
const char *dl_my_name_msg(const dlock_lock *l, char *buf, size_t len);
int dl_my_client_query(dlock_client *c, const char *sql, long long *v, int *isnull,
                       dl_err *err);
int dl_my_client_row(dlock_client *c, const char *sql, my_row *row, dl_err *err);
int dl_my_cdb_exec(my_client *mc, const char *sql, int64_t until, long long *affected,
                   long long *matched, dl_err *err);
int dl_my_kill_query(my_client *mc, unsigned long id, dl_err *err);

/* lock.c */
int dl_my_lock_init(dlock_lock *l, dl_err *err);
void dl_my_lock_destroy(dlock_lock *l);
int dl_my_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                  dl_err *err);
int dl_my_release(dlock_lock *l, long long *res, dl_err *err);
int dl_my_check(dlock_lock *l, int *held, int64_t *count, dl_err *err);
int dl_my_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                  dl_err *err);
int dl_my_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                        dl_err *err);
int dl_my_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err);
int dl_my_force_unlock(dlock_client *c, const char *name, size_t len, int *existed,
                       dl_err *err);

/* table.c */
void dl_my_renewer_init(my_client *mc);
void dl_my_renew_off(my_client *mc, my_lock *ml);
int dl_my_table_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                        dl_err *err);
int dl_my_table_release(dlock_lock *l, long long *res, dl_err *err);
int dl_my_table_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err);
int dl_my_table_check(dlock_lock *l, int *held, int64_t *count, dl_err *err);
int dl_my_table_inspect(dlock_client *c, const char *hex, dlock_info *info, dl_err *err);

/* url.c */
int dl_my_parse_url(const char *url, my_url *u, dl_err *err);
void dl_my_make_label(my_url *u, const char *scheme, int scheme_len);

extern const dl_backend dl_backend_mysql;

#endif
