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
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mysql.h>
#include <mysqld_error.h>
#include <errmsg.h>
#include <openssl/sha.h>

#include "internal.h"

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
    pthread_cond_t rcv;    /* wakes the thread: new hold, stop */
    pthread_cond_t rdone;  /* a renewal round ended */
    pthread_t rth;
    MYSQL *rdb;            /* the renewal thread's own connection (only it uses it) */
    int rstarted, rstop, rrunning;
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

/* ---- the URL ---- */
static int hexval(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    ch = tolower(ch);
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* [s, s+n) percent-decoded into out; -1 if too long, a bad escape or a NUL. */
static int decode(const char *s, size_t n, char *out, size_t outlen) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)s[i];
        if (ch == '%') {
            if (i + 2 >= n) return -1;
            int h = hexval((unsigned char)s[i + 1]), lo = hexval((unsigned char)s[i + 2]);
            if (h < 0 || lo < 0) return -1;
            ch = h * 16 + lo;
            i += 2;
        }
        if (ch == 0 || o + 1 >= outlen) return -1;
        out[o++] = (char)ch;
    }
    out[o] = '\0';
    return 0;
}

static int parse_url(const char *url, my_url *u, dl_err *err) {
    memset(u, 0, sizeof *u);
    u->port = 3306;
    const char *p = strstr(url, "://");
    if (!p) return dl_seterr(err, DLOCK_EINVAL, "bad MySQL URL");
    int scheme_len = (int)(p - url);
    p += 3;
    const char *slash = strchr(p, '/');
    const char *at = NULL;
    for (const char *q = p; *q && (!slash || q < slash); q++)
        if (*q == '@') at = q; /* the last '@' before the path */
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        size_t ulen = colon ? (size_t)(colon - p) : (size_t)(at - p);
        if (decode(p, ulen, u->user, sizeof u->user) ||
            (colon && decode(colon + 1, (size_t)(at - colon - 1), u->password,
                             sizeof u->password)))
            return dl_seterr(err, DLOCK_EINVAL, "bad user or password in the %.*s:// URL",
                             scheme_len, url);
        p = at + 1;
    }
    const char *hend = slash ? slash : p + strlen(p);
    const char *portp = NULL;
    if (*p == '[') { /* [IPv6] */
        const char *close = memchr(p, ']', (size_t)(hend - p));
        if (!close || (size_t)(close - p - 1) >= sizeof u->host) goto bad;
        memcpy(u->host, p + 1, (size_t)(close - p - 1));
        if (close + 1 < hend) {
            if (close[1] != ':') goto bad;
            portp = close + 2;
        }
    } else {
        const char *colon = memchr(p, ':', (size_t)(hend - p));
        size_t hlen = colon ? (size_t)(colon - p) : (size_t)(hend - p);
        if (hlen >= sizeof u->host) goto bad;
        memcpy(u->host, p, hlen);
        if (colon) portp = colon + 1;
    }
    if (!u->host[0]) goto bad;
    if (portp) {
        char *end;
        long v = strtol(portp, &end, 10);
        if (end == portp || end != hend || v < 1 || v > 65535) goto bad;
        u->port = (unsigned)v;
    }
    if (!slash || !slash[1]) goto bad;
    const char *q = strchr(slash + 1, '?');
    size_t dblen = q ? (size_t)(q - slash - 1) : strlen(slash + 1);
    if (!dblen || memchr(slash + 1, '/', dblen) || memchr(slash + 1, '#', dblen) ||
        decode(slash + 1, dblen, u->database, sizeof u->database))
        goto bad;
    /* parameters: lock=get_lock|table */
    for (const char *par = q ? q + 1 : NULL; par && *par;) {
        const char *amp = strchr(par, '&');
        size_t plen = amp ? (size_t)(amp - par) : strlen(par);
        if (plen == 13 && !strncmp(par, "lock=get_lock", 13)) {
            u->mode = MY_MODE_GET_LOCK;
        } else if (plen == 10 && !strncmp(par, "lock=table", 10)) {
            u->mode = MY_MODE_TABLE;
        } else {
            memset(u->password, 0, sizeof u->password);
            return dl_seterr(err, DLOCK_EINVAL,
                             "unknown parameter '%.*s' in the %.*s:// URL (known: "
                             "lock=get_lock, lock=table)",
                             (int)(plen > 40 ? 40 : plen), par, scheme_len, url);
        }
        par = amp ? amp + 1 : NULL;
    }
    return 0;
bad:
    memset(u->password, 0, sizeof u->password);
    return dl_seterr(err, DLOCK_EINVAL,
                     "bad MySQL/MariaDB URL (want %.*s://user:password@host:port/database)",
                     scheme_len, url);
}

static void make_label(my_url *u, const char *scheme, int scheme_len) {
    int v6 = strchr(u->host, ':') != NULL;
    snprintf(u->label, sizeof u->label, "%.*s://%s%s%s%s%s%s:%u/%s%s", scheme_len, scheme,
             u->user, u->password[0] ? ":***" : "", u->user[0] ? "@" : "", v6 ? "[" : "",
             u->host, v6 ? "]" : "", u->port, u->database,
             u->mode == MY_MODE_TABLE ? "?lock=table" : "");
}

/* ---- connections and queries ---- */
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static int lib_failed;
static void lib_init(void) { lib_failed = mysql_library_init(0, NULL, NULL) != 0; }

/* A client-side (CR_*) error: the connection is unusable from now on. */
static int conn_error(unsigned e) { return e >= 2000 && e < 3000; }

static int code_for(unsigned e) {
    switch (e) {
    case ER_ACCESS_DENIED_ERROR:
    case ER_DBACCESS_DENIED_ERROR:
    case ER_ACCESS_DENIED_NO_PASSWORD_ERROR:
    case ER_TABLEACCESS_DENIED_ERROR:
        return DLOCK_EAUTH;
    default:
        return conn_error(e) ? DLOCK_EIO : DLOCK_ESERVER;
    }
}

/* Records mysql_error(db) (one line) with the context what. */
static int my_fail(MYSQL *db, const char *what, dl_err *err) {
    char m[200];
    snprintf(m, sizeof m, "%s", mysql_error(db));
    for (char *s = m; *s; s++)
        if (*s == '\n' || *s == '\r') *s = ' ';
    return dl_seterr(err, code_for(mysql_errno(db)), "%s: %s", what, m);
}

/* Connects with the given timeouts (whole seconds). */
static int my_connect_t(my_client *mc, unsigned connect_s, unsigned rw_s, MYSQL **out,
                        dl_err *err) {
    *out = NULL;
    pthread_once(&lib_once, lib_init);
    if (lib_failed) return dl_seterr(err, DLOCK_ESYS, "cannot initialise libmariadb");
    MYSQL *m = mysql_init(NULL);
    if (!m) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    unsigned proto = MYSQL_PROTOCOL_TCP;
    my_bool no = 0;
    mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &connect_s);
    mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &rw_s);
    mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &rw_s);
    mysql_options(m, MYSQL_OPT_RECONNECT, &no); /* a reconnect would drop our locks */
    mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    if (mc->u.mode == MY_MODE_TABLE) /* expiry times in UTC: no DST jumps */
        mysql_options(m, MYSQL_INIT_COMMAND, "SET time_zone = '+00:00'");
    const my_url *u = &mc->u;
    if (!mysql_real_connect(m, u->host, u->user[0] ? u->user : NULL, u->password,
                            u->database, u->port, NULL, 0)) {
        char what[sizeof u->label + 32];
        snprintf(what, sizeof what, "cannot connect to %s", u->label);
        int rc = my_fail(m, what, err);
        mysql_close(m);
        return rc;
    }
    *out = m;
    return DLOCK_OK;
}

static void close_db(MYSQL **db) {
    if (*db) mysql_close(*db);
    *db = NULL;
}

static int my_connect(my_client *mc, MYSQL **out, dl_err *err) {
    return my_connect_t(mc, mc->connect_s, mc->rw_s, out, err);
}

/* Runs sql on db and waits for its answer until `until` (monotonic ms;
 * DL_INF_DEADLINE: forever). With want, reads the first column of the first
 * row into *v (*isnull when SQL NULL or no row). *broken: the connection is
 * unusable afterwards (close it). */
static int kill_query(my_client *mc, unsigned long id, dl_err *err);

/* Sends sql and reads the head of its answer before `until` (see my_query).
 * cx (may be NULL; between dl_cancel_begin and dl_cancel_end): on a cancel
 * of that wait, *canceled = 1 and the statement is killed (KILL QUERY on
 * the client's own connection: it ends with an error, or with its own
 * answer if it was done first), whose answer is waited for at most the
 * command timeout more, killing again meanwhile (dl_cancel_poll_ask). When the kill fails: DLOCK_ECANCELED and *broken =
 * 1 (closing the connection ends the session, once the server notices). */
static int my_run_cx(my_client *mc, MYSQL *db, const char *sql, int64_t until, dl_cancel *cx,
                     int *canceled, int *broken, dl_err *err) {
    *broken = 0;
    if (mysql_send_query(db, sql, (unsigned long)strlen(sql))) goto fail;
    int fd = (int)mysql_get_socket(db);
    int64_t killed_at = 0; /* when the latest KILL QUERY went */
    for (;;) {
        int64_t now = dl_now_ms();
        int ms = -1;
        if (until != DL_INF_DEADLINE) {
            if (now >= until) {
                *broken = 1;
                return dl_seterr(err, DLOCK_EIO, "no answer from the server in time");
            }
            ms = until - now > 600000 ? 600000 : (int)(until - now);
        }
        struct pollfd pfd[2] = {{.fd = fd, .events = POLLIN}};
        int n = dl_cancel_poll_ask(cx, &killed_at, pfd, 1, ms);
        if (n == -2) {
            if (!killed_at) {
                *canceled = 1;
                int64_t soon = dl_deadline(mc->cmd_ms);
                if (until == DL_INF_DEADLINE || soon < until) until = soon;
            }
            dl_err e2 = {0};
            if (kill_query(mc, mysql_thread_id(db), &e2)) {
                *broken = 1;
                return dl_seterr(err, DLOCK_ECANCELED, "the wait was cancelled");
            }
            killed_at = dl_now_ms();
            continue;
        }
        if (n > 0) break;
        if (n < 0 && errno != EINTR) {
            *broken = 1;
            return dl_seterr(err, DLOCK_EIO, "poll failed: %s", strerror(errno));
        }
    }
    if (mysql_read_query_result(db)) goto fail;
    return DLOCK_OK;
fail:
    *broken = conn_error(mysql_errno(db));
    return my_fail(db, "query failed", err);
}

static int my_query_cx(my_client *mc, MYSQL *db, const char *sql, int64_t until,
                       dl_cancel *cx, int *canceled, int want, long long *v, int *isnull,
                       int *broken, dl_err *err) {
    if (v) *v = 0;
    if (isnull) *isnull = 1;
    int rc0 = my_run_cx(mc, db, sql, until, cx, canceled, broken, err);
    if (rc0) return rc0;
    MYSQL_RES *res = mysql_store_result(db);
    if (!res) {
        if (mysql_field_count(db) != 0) goto fail;
        if (want) return dl_seterr(err, DLOCK_EPROTO, "the server answered no rows");
        return DLOCK_OK;
    }
    int rc = DLOCK_OK;
    MYSQL_ROW row = mysql_fetch_row(res);
    if (want && row && row[0]) {
        char *end;
        errno = 0;
        long long x = strtoll(row[0], &end, 10);
        if (errno || end == row[0] || *end)
            rc = dl_seterr(err, DLOCK_EPROTO, "the server answered '%.40s', not a number",
                           row[0]);
        else {
            *v = x;
            *isnull = 0;
        }
    }
    mysql_free_result(res);
    return rc;
fail:
    *broken = conn_error(mysql_errno(db));
    return my_fail(db, "query failed", err);
}

static int my_run(MYSQL *db, const char *sql, int64_t until, int *broken, dl_err *err) {
    return my_run_cx(NULL, db, sql, until, NULL, NULL, broken, err);
}

static int my_query(MYSQL *db, const char *sql, int64_t until, int want, long long *v,
                    int *isnull, int *broken, dl_err *err) {
    return my_query_cx(NULL, db, sql, until, NULL, NULL, want, v, isnull, broken, err);
}

/* Runs a statement without rows (DML, START TRANSACTION...) before `until`:
 * *affected from mysql_affected_rows, *matched (may be NULL) the "Rows
 * matched" of an UPDATE (its affected rows count only changed rows). */
static int my_exec(MYSQL *db, const char *sql, int64_t until, long long *affected,
                   long long *matched, int *broken, dl_err *err) {
    if (affected) *affected = 0;
    if (matched) *matched = 0;
    int rc = my_run(db, sql, until, broken, err);
    if (rc) return rc;
    MYSQL_RES *res = mysql_store_result(db);
    if (res) mysql_free_result(res);
    if (affected) *affected = (long long)mysql_affected_rows(db);
    if (matched) {
        const char *info = mysql_info(db);
        const char *m = info ? strstr(info, "matched: ") : NULL;
        if (!m) return dl_seterr(err, DLOCK_EPROTO, "the server did not say how many rows matched");
        *matched = strtoll(m + 9, NULL, 10);
    }
    return DLOCK_OK;
}

#define MY_ROW_COLS 4
typedef struct my_row {
    int present;                   /* a row came */
    int isnull[MY_ROW_COLS];
    char v[MY_ROW_COLS][200];      /* NUL-terminated, truncated */
    unsigned long len[MY_ROW_COLS];
} my_row;

/* Runs a query and copies the first row's first MY_ROW_COLS columns. */
static int my_query_row(MYSQL *db, const char *sql, int64_t until, my_row *row, int *broken,
                        dl_err *err) {
    memset(row, 0, sizeof *row);
    for (int i = 0; i < MY_ROW_COLS; i++) row->isnull[i] = 1;
    int rc = my_run(db, sql, until, broken, err);
    if (rc) return rc;
    MYSQL_RES *res = mysql_store_result(db);
    if (!res) {
        if (mysql_field_count(db) == 0)
            return dl_seterr(err, DLOCK_EPROTO, "the server answered no rows");
        *broken = conn_error(mysql_errno(db));
        return my_fail(db, "query failed", err);
    }
    MYSQL_ROW r = mysql_fetch_row(res);
    unsigned long *lens = r ? mysql_fetch_lengths(res) : NULL;
    if (r && lens) {
        row->present = 1;
        unsigned n = mysql_num_fields(res);
        for (unsigned i = 0; i < n && i < MY_ROW_COLS; i++) {
            if (!r[i]) continue;
            row->isnull[i] = 0;
            size_t k = lens[i] < sizeof row->v[i] - 1 ? lens[i] : sizeof row->v[i] - 1;
            memcpy(row->v[i], r[i], k);
            row->v[i][k] = '\0';
            row->len[i] = (unsigned long)k;
        }
    }
    mysql_free_result(res);
    return DLOCK_OK;
}

/* ---- names ---- */
/* The GET_LOCK name of a lock name, in hex (see the header comment). */
static void make_key(const char *name, size_t len, char *hex) {
    static const char digits[] = "0123456789abcdef";
    int plain = len <= MY_KEY_MAX;
    for (size_t i = 0; plain && i < len; i++)
        plain = (unsigned char)name[i] >= 0x20 && (unsigned char)name[i] < 0x7f;
    unsigned char buf[MY_KEY_MAX];
    size_t n = len;
    if (plain) {
        memcpy(buf, name, len);
    } else {
        unsigned char md[SHA256_DIGEST_LENGTH];
        SHA256((const unsigned char *)name, len, md);
        memcpy(buf, "dlock:", 6);
        for (size_t i = 0; i < 24; i++) {
            buf[6 + 2 * i] = (unsigned char)digits[md[i] >> 4];
            buf[6 + 2 * i + 1] = (unsigned char)digits[md[i] & 15];
        }
        n = 6 + 48;
    }
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = digits[buf[i] >> 4];
        hex[2 * i + 1] = digits[buf[i] & 15];
    }
    hex[2 * n] = '\0';
}

static const char *nm(const dlock_lock *l, char *buf, size_t len) {
    return dl_name_msg(l->name, l->name_len, buf, len);
}

/* ---- client ---- */
static int my_open(dlock_client *c, const char *url, const dlock_options *o, dl_err *err) {
    my_client *mc = calloc(1, sizeof *mc);
    if (!mc) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&mc->mu, NULL);
    pthread_mutex_init(&mc->rmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&mc->rcv, &ca);
    pthread_cond_init(&mc->rdone, &ca);
    pthread_condattr_destroy(&ca);
    c->bctx = mc;
    int rc = parse_url(url, &mc->u, err);
    if (rc) return rc;
    if (o->username && o->username[0]) {
        if (strlen(o->username) >= sizeof mc->u.user)
            return dl_seterr(err, DLOCK_EINVAL, "user name too long");
        snprintf(mc->u.user, sizeof mc->u.user, "%s", o->username);
    }
    const char *pw = o->password ? o->password
                     : mc->u.password[0] ? NULL
                                         : getenv("DLOCK_PASSWORD");
    if (pw) {
        if (strlen(pw) >= sizeof mc->u.password)
            return dl_seterr(err, DLOCK_EINVAL, "password too long");
        snprintf(mc->u.password, sizeof mc->u.password, "%s", pw);
    }
    make_label(&mc->u, url, (int)(strstr(url, "://") - url));
    mc->cmd_ms = c->command_timeout_ms;
    int64_t cs = (c->connect_timeout_ms + 999) / 1000, ws = (c->command_timeout_ms + 999) / 1000;
    mc->connect_s = (unsigned)(cs < 1 ? 1 : cs > 86400 ? 86400 : cs);
    mc->rw_s = (unsigned)(ws < 1 ? 1 : ws > 86400 ? 86400 : ws);
    rc = my_connect(mc, &mc->db, err);
    if (rc) return rc;
    int broken;
    rc = my_query(mc->db,
                  "CREATE TABLE IF NOT EXISTS dlock_fence (name VARBINARY(255) NOT NULL "
                  "PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB",
                  dl_deadline(mc->cmd_ms), 0, NULL, NULL, &broken, err);
    if (rc) {
        char m[DL_ERRMSG_MAX];
        snprintf(m, sizeof m, "%s", err->msg);
        return dl_seterr(err, err->code, "%s: creating table dlock_fence: %s", mc->u.label, m);
    }
    if (mc->u.mode == MY_MODE_TABLE) {
        rc = my_query(mc->db,
                      "CREATE TABLE IF NOT EXISTS dlock_locks (name VARBINARY(255) NOT NULL "
                      "PRIMARY KEY, token VARBINARY(128) NOT NULL, fence BIGINT NOT NULL, "
                      "expires_at BIGINT NOT NULL, kind TINYINT NOT NULL DEFAULT 0) "
                      "ENGINE=InnoDB",
                      dl_deadline(mc->cmd_ms), 0, NULL, NULL, &broken, err);
        if (rc) {
            char m[DL_ERRMSG_MAX];
            snprintf(m, sizeof m, "%s", err->msg);
            return dl_seterr(err, err->code, "%s: creating table dlock_locks: %s", mc->u.label,
                             m);
        }
    }
    return DLOCK_OK;
}

static void my_close(dlock_client *c) {
    my_client *mc = c->bctx;
    if (!mc) return;
    pthread_mutex_lock(&mc->rmu);
    int started = mc->rstarted;
    mc->rstop = 1;
    pthread_cond_broadcast(&mc->rcv);
    pthread_mutex_unlock(&mc->rmu);
    if (started) pthread_join(mc->rth, NULL);
    close_db(&mc->rdb);
    close_db(&mc->db);
    memset(mc->u.password, 0, sizeof mc->u.password);
    pthread_cond_destroy(&mc->rcv);
    pthread_cond_destroy(&mc->rdone);
    pthread_mutex_destroy(&mc->rmu);
    pthread_mutex_destroy(&mc->mu);
    free(mc);
    c->bctx = NULL;
}

/* Runs a one-number query on the client's connection (connecting again if
 * it was lost; the queries are idempotent, so a lost one is retried once). */
static int client_query(dlock_client *c, const char *sql, long long *v, int *isnull,
                        dl_err *err) {
    my_client *mc = c->bctx;
    pthread_mutex_lock(&mc->mu);
    int rc = DLOCK_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!mc->db && (rc = my_connect(mc, &mc->db, err))) break;
        int broken = 0;
        rc = my_query(mc->db, sql, dl_deadline(mc->cmd_ms), 1, v, isnull, &broken, err);
        if (!rc || !broken) break;
        close_db(&mc->db);
    }
    pthread_mutex_unlock(&mc->mu);
    return rc;
}

static int my_ping(dlock_client *c, int64_t *rtt_us, dl_err *err) {
    long long v;
    int isnull;
    int64_t t0 = dl_now_us();
    int rc = client_query(c, "SELECT 1", &v, &isnull, err);
    if (!rc && rtt_us) *rtt_us = dl_now_us() - t0;
    return rc;
}

/* ---- table mode (?lock=table): leases in dlock_locks ---- */
static void to_hex(const char *s, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[(unsigned char)s[i] >> 4];
        out[2 * i + 1] = digits[(unsigned char)s[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Runs a statement on the client's connection, connecting first when there
 * is none; a broken connection is closed (the next statement reconnects).
 * The caller holds mc->mu. */
static int cdb_exec(my_client *mc, const char *sql, int64_t until, long long *affected,
                    long long *matched, dl_err *err) {
    int broken = 0;
    int rc = mc->db ? DLOCK_OK : my_connect(mc, &mc->db, err);
    if (!rc) rc = my_exec(mc->db, sql, until, affected, matched, &broken, err);
    if (rc && broken) close_db(&mc->db);
    return rc;
}

/* KILL QUERY id on the client's own connection (a user may kill its own
 * connections' statements). */
static int kill_query(my_client *mc, unsigned long id, dl_err *err) {
    char sql[48];
    snprintf(sql, sizeof sql, "KILL QUERY %lu", id);
    pthread_mutex_lock(&mc->mu);
    int rc = cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, NULL, err);
    pthread_mutex_unlock(&mc->mu);
    return rc;
}

/* Like client_query, for a row of strings. */
static int client_row(dlock_client *c, const char *sql, my_row *row, dl_err *err) {
    my_client *mc = c->bctx;
    pthread_mutex_lock(&mc->mu);
    int rc = DLOCK_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!mc->db && (rc = my_connect(mc, &mc->db, err))) break;
        int broken = 0;
        rc = my_query_row(mc->db, sql, dl_deadline(mc->cmd_ms), row, &broken, err);
        if (!rc || !broken) break;
        close_db(&mc->db);
    }
    pthread_mutex_unlock(&mc->mu);
    return rc;
}

/* One acquire attempt in one transaction: the name's fence counter is
 * incremented (its row lock orders the acquirers of a name), then the lock
 * row is inserted, or taken over when it has expired or is already ours
 * (re-entry), with the new fence; a row we may not take is left as it was
 * (0 rows affected) and the transaction rolled back, fence increment
 * included. *got 1 with *fence on success, else 0. Holds mc->mu. */
static int table_try(my_client *mc, my_lock *ml, int64_t lease_ms, int *got, uint64_t *fence,
                     int *transient, dl_err *err) {
    *got = 0;
    *transient = 0;
    int64_t until = dl_deadline(mc->cmd_ms);
    long long n = 0;
    char sql[1024 + 2 * sizeof ml->hex + 4 * sizeof ml->tokhex];
    int rc = cdb_exec(mc, "START TRANSACTION", until, NULL, NULL, err);
    if (rc) return rc;
    snprintf(sql, sizeof sql,
             "INSERT INTO dlock_fence (name, n) VALUES (x'%s', LAST_INSERT_ID(1)) "
             "ON DUPLICATE KEY UPDATE n = LAST_INSERT_ID(n + 1)",
             ml->hex);
    rc = cdb_exec(mc, sql, until, NULL, NULL, err);
    if (rc) goto rollback;
    unsigned long long f = (unsigned long long)mysql_insert_id(mc->db);
    long long lease_us = (long long)lease_ms * 1000;
    /* assignments run left to right: after the first, token is the new one */
    int kind = (int)ml->l->kind;
    snprintf(sql, sizeof sql,
             "INSERT INTO dlock_locks (name, token, fence, expires_at, kind) VALUES "
             "(x'%s', x'%s', %llu, " MY_NOW_US " + %lld, %d) ON DUPLICATE KEY UPDATE "
             "token = IF(token = x'%s' OR expires_at < " MY_NOW_US ", x'%s', token), "
             "fence = IF(token = x'%s', %llu, fence), "
             "kind = IF(token = x'%s', %d, kind), "
             "expires_at = IF(token = x'%s', " MY_NOW_US " + %lld, expires_at)",
             ml->hex, ml->tokhex, f, lease_us, kind, ml->tokhex, ml->tokhex, ml->tokhex, f,
             ml->tokhex, kind, ml->tokhex, lease_us);
    rc = cdb_exec(mc, sql, until, &n, NULL, err);
    if (rc) goto rollback;
    if (n == 0) { /* held by another: give the fence back */
        return cdb_exec(mc, "ROLLBACK", until, NULL, NULL, err);
    }
    rc = cdb_exec(mc, "COMMIT", until, NULL, NULL, err);
    if (rc) return rc;
    *got = 1;
    *fence = f;
    return DLOCK_OK;
rollback:
    if (mc->db) {
        /* a deadlock or lock wait timeout between acquirers: worth another try */
        unsigned e = mysql_errno(mc->db);
        *transient = e == ER_LOCK_DEADLOCK || e == ER_LOCK_WAIT_TIMEOUT;
        dl_err e2 = {0};
        if (cdb_exec(mc, "ROLLBACK", until, NULL, NULL, &e2)) close_db(&mc->db);
    }
    return rc;
}

/* Removes ml from the renewal list, waiting for a renewal round in flight
 * (unless called by the renewal thread itself, from a lost callback). */
static void renew_off(my_client *mc, my_lock *ml) {
    pthread_mutex_lock(&mc->rmu);
    while (mc->rrunning && !(mc->rstarted && pthread_equal(pthread_self(), mc->rth)))
        pthread_cond_wait(&mc->rdone, &mc->rmu);
    if (ml->reg) {
        for (my_lock **p = &mc->rhead; *p; p = &(*p)->rnext)
            if (*p == ml) {
                *p = ml->rnext;
                break;
            }
        ml->reg = 0;
        ml->rnext = NULL;
    }
    pthread_mutex_unlock(&mc->rmu);
}

typedef struct renew_snap {
    my_lock *ml;
    uint64_t seq;
    int64_t lease_ms;
    char hex[sizeof ((my_lock *)0)->hex];
    char tokhex[sizeof ((my_lock *)0)->tokhex];
    int64_t t0;
    int result; /* 1 renewed, 0 lost, -1 no answer */
} renew_snap;

/* Sets the lease of one hold again: 1 renewed, 0 not ours any more, -1 no
 * answer. */
static int renew_one(my_client *mc, renew_snap *s) {
    char sql[512 + sizeof s->hex + sizeof s->tokhex];
    snprintf(sql, sizeof sql,
             "UPDATE dlock_locks SET expires_at = " MY_NOW_US " + %lld WHERE name = x'%s' "
             "AND token = x'%s' AND expires_at >= " MY_NOW_US,
             (long long)s->lease_ms * 1000, s->hex, s->tokhex);
    int64_t limit = s->lease_ms / 3 < mc->cmd_ms ? s->lease_ms / 3 : mc->cmd_ms;
    if (limit < 10) limit = 10;
    long long matched = 0;
    dl_err err = {0};
    int broken = 0, rc = DLOCK_OK;
    if (!mc->rdb) {
        /* timeouts from the renewal period, so that a server that stopped
         * answering is found out about when the lease runs out (the
         * connector counts them in whole seconds: 1 s at least) */
        unsigned sec = (unsigned)((limit + 999) / 1000);
        rc = my_connect_t(mc, sec, sec, &mc->rdb, &err);
    }
    if (!rc) rc = my_exec(mc->rdb, sql, dl_deadline(limit), NULL, &matched, &broken, &err);
    if (rc && broken) close_db(&mc->rdb);
    if (rc) return -1;
    return matched > 0 ? 1 : 0;
}

static void cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

/* The renewal thread: renews each registered hold every third of its
 * lease; a hold the table no longer gives us, or one not renewed for a
 * whole lease, is marked lost and its callback run (under rmu). */
static void *renew_main(void *arg) {
    my_client *mc = arg;
    mysql_thread_init();
    pthread_mutex_lock(&mc->rmu);
    while (!mc->rstop) {
        if (!mc->rhead) {
            pthread_cond_wait(&mc->rcv, &mc->rmu);
            continue;
        }
        int64_t now = dl_now_ms(), due = INT64_MAX;
        size_t n = 0;
        for (my_lock *m = mc->rhead; m; m = m->rnext) {
            if (m->rnext_ms < due) due = m->rnext_ms;
            if (m->rnext_ms <= now) n++;
        }
        if (now < due) {
            cond_wait_ms(&mc->rcv, &mc->rmu, due - now);
            continue;
        }
        renew_snap *snap = calloc(n, sizeof *snap);
        if (!snap) {
            cond_wait_ms(&mc->rcv, &mc->rmu, 10);
            continue;
        }
        size_t k = 0;
        for (my_lock *m = mc->rhead; m && k < n; m = m->rnext) {
            if (m->rnext_ms > now) continue;
            snap[k].ml = m;
            snap[k].seq = m->rseq;
            snap[k].lease_ms = m->rlease_ms;
            memcpy(snap[k].hex, m->hex, sizeof m->hex);
            memcpy(snap[k].tokhex, m->tokhex, sizeof m->tokhex);
            k++;
        }
        mc->rrunning = 1;
        pthread_mutex_unlock(&mc->rmu);
        for (size_t i = 0; i < k; i++) {
            snap[i].t0 = dl_now_ms();
            snap[i].result = renew_one(mc, &snap[i]);
        }
        pthread_mutex_lock(&mc->rmu);
        mc->rrunning = 0;
        pthread_cond_broadcast(&mc->rdone);
        now = dl_now_ms();
        for (size_t i = 0; i < k; i++) {
            renew_snap *s = &snap[i];
            my_lock *m = s->ml;
            /* still registered as then? (renew_off waits for the round, so m
             * is alive; the sequence number tells a new hold apart) */
            int alive = 0;
            for (my_lock *x = mc->rhead; x; x = x->rnext) alive |= x == m;
            if (!alive || m->rseq != s->seq) continue;
            dl_lease *lease = &m->l->lease;
            int reason = 0;
            int64_t period = s->lease_ms / 3 > 1 ? s->lease_ms / 3 : 1;
            if (s->result == 1) {
                atomic_store(&lease->last_ok, (long long)s->t0);
                m->rnext_ms = s->t0 + period;
            } else if (s->result == 0) {
                reason = DLOCK_LOST_TAKEN;
            } else {
                int64_t last = (int64_t)atomic_load(&lease->last_ok);
                if (now - last >= s->lease_ms) reason = DLOCK_LOST_UNREACHABLE;
                /* after a failure, try again sooner, and look again when
                 * the lease would run out */
                int64_t next = now + period / 4 + 1;
                m->rnext_ms = next < last + s->lease_ms ? next : last + s->lease_ms;
            }
            if (reason) {
                atomic_store(&lease->lost, 1);
                for (my_lock **p = &mc->rhead; *p; p = &(*p)->rnext)
                    if (*p == m) {
                        *p = m->rnext;
                        break;
                    }
                m->reg = 0;
                m->rnext = NULL;
                if (lease->on_lost) lease->on_lost(lease, reason);
            }
        }
        free(snap);
    }
    pthread_mutex_unlock(&mc->rmu);
    mysql_thread_end();
    return NULL;
}

/* Registers (or re-registers, with a new lease) ml for renewal; t0 is the
 * monotonic ms at which the lease last surely started. */
static int renew_on(my_client *mc, my_lock *ml, int64_t lease_ms, int64_t t0, dl_err *err) {
    pthread_mutex_lock(&mc->rmu);
    int rc = DLOCK_OK;
    if (!mc->rstarted) {
        int e = pthread_create(&mc->rth, NULL, renew_main, mc);
        if (e)
            rc = dl_seterr(err, DLOCK_ESYS, "cannot start the lease renewal thread: %s",
                           strerror(e));
        else
            mc->rstarted = 1;
    }
    if (!rc) {
        if (!ml->reg) {
            ml->rnext = mc->rhead;
            mc->rhead = ml;
            ml->reg = 1;
        }
        ml->rseq = ++mc->rseq;
        ml->rlease_ms = lease_ms;
        ml->rnext_ms = t0 + (lease_ms / 3 > 1 ? lease_ms / 3 : 1);
        atomic_store(&ml->l->lease.last_ok, (long long)t0);
        pthread_cond_signal(&mc->rcv);
    }
    pthread_mutex_unlock(&mc->rmu);
    return rc;
}

static int table_registered(my_client *mc, my_lock *ml) {
    pthread_mutex_lock(&mc->rmu);
    int r = ml->reg;
    pthread_mutex_unlock(&mc->rmu);
    return r;
}

/* Is the hold still ours (row with our token, not expired)? */
static int table_held(my_client *mc, my_lock *ml, int *held, dl_err *err) {
    char sql[512 + sizeof ml->hex + sizeof ml->tokhex];
    snprintf(sql, sizeof sql,
             "SELECT COUNT(*) FROM dlock_locks WHERE name = x'%s' AND token = x'%s' AND "
             "expires_at >= " MY_NOW_US,
             ml->hex, ml->tokhex);
    long long v = 0;
    int isnull = 1;
    pthread_mutex_lock(&mc->mu);
    int rc = DLOCK_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!mc->db && (rc = my_connect(mc, &mc->db, err))) break;
        int broken = 0;
        rc = my_query(mc->db, sql, dl_deadline(mc->cmd_ms), 1, &v, &isnull, &broken, err);
        if (!rc || !broken) break;
        close_db(&mc->db);
    }
    pthread_mutex_unlock(&mc->mu);
    *held = !rc && !isnull && v > 0;
    return rc;
}

static void table_mark_lost(my_client *mc, my_lock *ml) {
    renew_off(mc, ml);
    atomic_store(&ml->l->lease.lost, 1);
}

/* table_acquire's attempts, with naps between them, until one takes the
 * lock (*got), or the wait ends. */
static int table_wait(dlock_lock *l, dl_cancel *cx, int64_t wait_ms, int64_t lease, int reenter,
                      int *got, uint64_t *fence, int64_t *t0, dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    char nb[80];
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE : dl_deadline(wait_ms);
    int64_t backoff = MY_BACKOFF_MIN_MS;
    int retries = 0;
    for (;;) {
        *t0 = dl_now_ms();
        pthread_mutex_lock(&mc->mu);
        int tr = 0;
        int rc = table_try(mc, ml, lease, got, fence, &tr, err);
        pthread_mutex_unlock(&mc->mu);
        if (rc && tr) { /* deadlock between acquirers: again, then count it as busy */
            if (retries++ < MY_TRY_RETRIES) continue;
            if (reenter) return rc;
            rc = DLOCK_OK;
            *got = 0;
        }
        if (rc) return rc;
        if (*got) return DLOCK_OK;
        if (reenter) {
            table_mark_lost(mc, ml);
            return dl_seterr(err, DLOCK_ELOST,
                             "re-entry: lock '%s' is no longer held by this handle (lease "
                             "expired or taken over)",
                             nm(l, nb, sizeof nb));
        }
        if (wait_ms == 0)
            return dl_seterr(err, DLOCK_EBUSY, "lock '%s' is held by another owner",
                             nm(l, nb, sizeof nb));
        int64_t now = dl_now_ms();
        if (deadline != DL_INF_DEADLINE && now >= deadline)
            return dl_seterr(err, DLOCK_ETIMEDOUT, "lock '%s' not acquired within %lld ms",
                             nm(l, nb, sizeof nb), (long long)wait_ms);
        /* no notification in this mode: poll, with jitter, up to the deadline */
        int64_t nap = backoff / 2 + (int64_t)dl_random_below((uint64_t)(backoff / 2 + 1));
        if (deadline != DL_INF_DEADLINE && nap > deadline - now) nap = deadline - now;
        if (!cx) dl_sleep_ms(nap);
        else if (dl_cancel_nap(cx, nap)) return dl_cancel_err(l, err);
        backoff = backoff * 2 > MY_BACKOFF_MAX_MS ? MY_BACKOFF_MAX_MS : backoff * 2;
        retries = 0;
    }
}

static int table_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_try *t,
                         dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    int reenter = l->holds > 0;
    int64_t lease = lease_ms == DLOCK_WATCHDOG ? l->c->watchdog_lease_ms : lease_ms;
    if (!reenter) {
        /* a new hold: owner "<client id>:<thread id>:<128 random bits>" */
        renew_off(mc, ml);
        char rnd[33];
        int rc = dl_random_hex(rnd, 16, err);
        if (rc) return rc;
        int k = snprintf(l->token + l->token_len, sizeof l->token - l->token_len, ":%s", rnd);
        if (k < 0 || (size_t)k >= sizeof l->token - l->token_len)
            return dl_seterr(err, DLOCK_EINVAL, "owner token too long");
        l->token_len += (size_t)k;
        to_hex(l->token, l->token_len, ml->tokhex);
    }
    int64_t t0 = 0;
    int got = 0;
    uint64_t fence = 0;
    /* dlock_lock_cancel ends the naps between attempts */
    dl_cancel *cx = wait_ms != 0 && !reenter ? &l->cancel : NULL;
    if (cx) dl_cancel_begin(cx);
    int rc = table_wait(l, cx, wait_ms, lease, reenter, &got, &fence, &t0, err);
    if (cx) dl_cancel_end(cx);
    if (rc) return rc;
    t->acquired = 1;
    t->fence = fence;
    t->count = l->holds + 1;
    t->pttl = -1;
    if (lease_ms == DLOCK_WATCHDOG) {
        rc = renew_on(mc, ml, lease, t0, err);
        if (rc) {
            if (!reenter) { /* give the row back; best effort */
                char sql[512 + sizeof ml->hex + sizeof ml->tokhex];
                snprintf(sql, sizeof sql, "DELETE FROM dlock_locks WHERE name = x'%s' AND token = x'%s'",
                         ml->hex, ml->tokhex);
                dl_err e2 = {0};
                pthread_mutex_lock(&mc->mu);
                cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, NULL, &e2);
                pthread_mutex_unlock(&mc->mu);
            }
            return rc;
        }
        /* renewed while the client lives; dlock_lock_is_lost (and a
         * valid_ms of 0) tells when renewal failed */
        l->expires_at = INT64_MAX;
    } else {
        renew_off(mc, ml);
        l->expires_at = t0 + lease;
    }
    return DLOCK_OK;
}

static int table_release(dlock_lock *l, long long *res, dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    *res = -1;
    if (l->holds > 1) { /* re-entered: counted by the handle; still ours? */
        int held = 0;
        int rc = table_held(mc, ml, &held, err);
        if (rc) return rc;
        if (!held) table_mark_lost(mc, ml);
        *res = held ? 0 : -1;
        return DLOCK_OK;
    }
    int was = table_registered(mc, ml);
    renew_off(mc, ml); /* else a renewal after the delete would call it lost */
    char sql[512 + sizeof ml->hex + sizeof ml->tokhex];
    snprintf(sql, sizeof sql,
             "DELETE FROM dlock_locks WHERE name = x'%s' AND token = x'%s' AND expires_at >= "
             MY_NOW_US,
             ml->hex, ml->tokhex);
    long long n = 0;
    pthread_mutex_lock(&mc->mu);
    int rc = cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), &n, NULL, err);
    if (!rc && n == 0) { /* expired: remove our stale row, if nobody took it */
        dl_err e2 = {0};
        snprintf(sql, sizeof sql, "DELETE FROM dlock_locks WHERE name = x'%s' AND token = x'%s'",
                 ml->hex, ml->tokhex);
        cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, NULL, &e2);
    }
    pthread_mutex_unlock(&mc->mu);
    if (rc) {
        if (was) {
            dl_err e2 = {0};
            renew_on(mc, ml, l->lease_ms, (int64_t)atomic_load(&l->lease.last_ok), &e2);
        }
        return rc;
    }
    *res = n > 0 ? 1 : -1;
    return DLOCK_OK;
}

static int table_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    *res = 0;
    int was = table_registered(mc, ml);
    renew_off(mc, ml); /* a fixed lease from now on, as on Redis */
    char sql[512 + sizeof ml->hex + sizeof ml->tokhex];
    snprintf(sql, sizeof sql,
             "UPDATE dlock_locks SET expires_at = " MY_NOW_US " + %lld WHERE name = x'%s' AND "
             "token = x'%s' AND expires_at >= " MY_NOW_US,
             (long long)lease_ms * 1000, ml->hex, ml->tokhex);
    long long matched = 0;
    pthread_mutex_lock(&mc->mu);
    int rc = cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, &matched, err);
    pthread_mutex_unlock(&mc->mu);
    if (rc) {
        if (was) {
            dl_err e2 = {0};
            renew_on(mc, ml, l->lease_ms, (int64_t)atomic_load(&l->lease.last_ok), &e2);
        }
        return rc;
    }
    *res = matched > 0 ? 1 : 0;
    if (!*res) atomic_store(&l->lease.lost, 1);
    return DLOCK_OK;
}

static int table_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    int rc = table_held(mc, ml, held, err);
    if (rc) return rc;
    if (!*held) table_mark_lost(mc, ml);
    *count = *held ? l->holds : 0;
    return DLOCK_OK;
}

static int table_inspect(dlock_client *c, const char *hex, dlock_info *info, dl_err *err) {
    char sql[1024 + 4 * MY_KEY_MAX];
    snprintf(sql, sizeof sql,
             "SELECT l.token, l.expires_at - " MY_NOW_US ", (SELECT n FROM dlock_fence f WHERE "
             "f.name = x'%s'), l.kind FROM (SELECT 1) AS one LEFT JOIN dlock_locks l ON l.name = x'%s' "
             "AND l.expires_at >= " MY_NOW_US,
             hex, hex);
    my_row row;
    int rc = client_row(c, sql, &row, err);
    if (rc) return rc;
    if (!row.present) return dl_seterr(err, DLOCK_EPROTO, "the server answered no rows");
    info->exists = !row.isnull[0];
    info->fence = row.isnull[2] ? 0 : strtoull(row.v[2], NULL, 10);
    if (info->exists) {
        long long us = strtoll(row.v[1], NULL, 10);
        info->ttl_ms = us <= 0 ? 0 : (us + 999) / 1000;
        info->holders = 1;
        info->hold_count = 1; /* re-entries are counted by the holder's handle */
        info->kind = row.isnull[3] ? 0 : atoi(row.v[3]);
        snprintf(info->holder, sizeof info->holder, "%.159s", row.v[0]);
    } else {
        info->ttl_ms = -2;
    }
    return DLOCK_OK;
}

/* ---- lock handles ---- */
static int my_lock_init(dlock_lock *l, dl_err *err) {
    my_lock *ml = calloc(1, sizeof *ml);
    if (!ml) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    l->bdata = ml;
    ml->l = l;
    make_key(l->name, l->name_len, ml->hex);
    my_client *mc = l->c->bctx;
    if (mc->u.mode == MY_MODE_TABLE) return DLOCK_OK; /* uses the client's connection */
    return my_connect(mc, &ml->db, err);
}

static void my_lock_destroy(dlock_lock *l) {
    my_lock *ml = l->bdata;
    if (!ml) return;
    renew_off(l->c->bctx, ml);
    close_db(&ml->db); /* ends the session: frees whatever it still held */
    free(ml);
    l->bdata = NULL;
}

/* The session is gone (or given up): so is every lock it held. */
static void lock_conn_lost(dlock_lock *l) {
    my_lock *ml = l->bdata;
    close_db(&ml->db);
    if (l->holds > 0) {
        l->expires_at = 0; /* a later acquire starts afresh */
        atomic_store(&l->lease.lost, 1);
    }
}

/* Gives back one hold of l's GET_LOCK on its connection, best effort (the
 * connection is dropped if it broke). */
static void give_back(dlock_lock *l) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    char sql[64 + sizeof ml->hex];
    snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK(x'%s')", ml->hex);
    long long v;
    int isnull, broken = 0;
    dl_err e2 = {0};
    if (my_query(ml->db, sql, dl_deadline(mc->cmd_ms), 1, &v, &isnull, &broken, &e2) && broken)
        lock_conn_lost(l);
}

static int my_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_try *t,
                      dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    char nb[80];
    if (mc->u.mode == MY_MODE_TABLE) return table_acquire(l, wait_ms, lease_ms, t, err);
    if (lease_ms != DLOCK_WATCHDOG)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "leases (lease_ms > 0) are not supported by the mysql backend in "
                         "GET_LOCK mode: its locks are held while the connection lives (pass "
                         "DLOCK_WATCHDOG, or use ?lock=table)");
    if (!ml->db) {
        if (l->holds > 0)
            return dl_seterr(err, DLOCK_ELOST, "lock '%s' was lost with its connection",
                             nm(l, nb, sizeof nb));
        int rc = my_connect(mc, &ml->db, err);
        if (rc) return rc;
    }
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE : dl_deadline(wait_ms);
    char sql[64 + sizeof ml->hex];
    int rc, broken = 0, isnull;
    long long v;
    /* a wait can be cancelled (dlock_lock_cancel); a re-entry does not wait */
    dl_cancel *cx = wait_ms != 0 && l->holds == 0 ? &l->cancel : NULL;
    int canceled = 0;
    if (cx) dl_cancel_begin(cx);
    for (;;) {
        long long ms = MY_FOREVER_CHUNK_S * 1000;
        if (deadline != DL_INF_DEADLINE) {
            ms = deadline - dl_now_ms();
            if (ms < 0 || wait_ms == 0) ms = 0;
        }
        snprintf(sql, sizeof sql, "SELECT GET_LOCK(x'%s', %lld.%03lld)", ml->hex, ms / 1000,
                 ms % 1000);
        int64_t until = deadline == DL_INF_DEADLINE ? DL_INF_DEADLINE
                                                    : dl_deadline(ms + mc->cmd_ms);
        rc = my_query_cx(mc, ml->db, sql, until, cx, &canceled, 1, &v, &isnull, &broken, err);
        /* cancelled: the statement was killed (an error, or NULL), or the
         * kill failed (the connection is closed); a lock taken first is
         * kept (OK) */
        if (canceled && (rc || isnull || v != 1)) {
            /* killed as GET_LOCK returned: the lock may be the session's
             * (it held none before: no re-entry waits) */
            if (rc && !broken) give_back(l);
            rc = dl_cancel_err(l, err);
            goto fail;
        }
        if (rc) goto fail;
        if (isnull) {
            rc = dl_seterr(err, DLOCK_ESERVER, "GET_LOCK of '%s' failed (NULL)",
                           nm(l, nb, sizeof nb));
            goto fail;
        }
        if (v == 1) break;
        if (deadline == DL_INF_DEADLINE) continue;
        if (wait_ms == 0)
            return dl_seterr(err, DLOCK_EBUSY, "lock '%s' is held by another owner",
                             nm(l, nb, sizeof nb));
        if (dl_now_ms() >= deadline) {
            rc = dl_seterr(err, DLOCK_ETIMEDOUT, "lock '%s' not acquired within %lld ms",
                           nm(l, nb, sizeof nb), (long long)wait_ms);
            goto fail;
        }
    }
    if (cx) dl_cancel_end(cx);
    /* the fencing token: LAST_INSERT_ID(expr) in both branches makes
     * mysql_insert_id() the new n, first insert included */
    char fsql[160 + sizeof ml->hex];
    snprintf(fsql, sizeof fsql,
             "INSERT INTO dlock_fence (name, n) VALUES (x'%s', LAST_INSERT_ID(1)) "
             "ON DUPLICATE KEY UPDATE n = LAST_INSERT_ID(n + 1)",
             ml->hex);
    rc = my_query(ml->db, fsql, dl_deadline(mc->cmd_ms), 0, NULL, NULL, &broken, err);
    if (rc) {
        if (!broken) give_back(l); /* the hold just taken */
        char m[DL_ERRMSG_MAX];
        snprintf(m, sizeof m, "%s", err->msg);
        dl_seterr(err, err->code, "fencing token of '%s': %s", nm(l, nb, sizeof nb), m);
        goto fail;
    }
    t->acquired = 1;
    t->fence = (uint64_t)mysql_insert_id(ml->db);
    t->count = l->holds + 1;
    t->pttl = -1;
    l->expires_at = INT64_MAX;
    return DLOCK_OK;
fail:
    if (cx) dl_cancel_end(cx);
    if (broken) lock_conn_lost(l);
    return rc;
}

static int my_release(dlock_lock *l, long long *res, dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    if (mc->u.mode == MY_MODE_TABLE) return table_release(l, res, err);
    *res = -1;
    if (!ml->db) return DLOCK_OK; /* the session, and the lock with it, is gone */
    char sql[64 + sizeof ml->hex];
    snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK(x'%s')", ml->hex);
    long long v;
    int isnull, broken;
    int rc = my_query(ml->db, sql, dl_deadline(mc->cmd_ms), 1, &v, &isnull, &broken, err);
    if (rc) {
        if (!broken) return rc;
        lock_conn_lost(l);
        return DLOCK_OK; /* -1: lost */
    }
    if (!isnull && v == 1) *res = l->holds > 1 ? 0 : 1;
    return DLOCK_OK;
}

static int my_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    char nb[80];
    *held = 0;
    *count = 0;
    if (mc->u.mode == MY_MODE_TABLE) return table_check(l, held, count, err);
    int rc = DLOCK_OK, broken = 0;
    if (ml->db) {
        char sql[80 + sizeof ml->hex];
        snprintf(sql, sizeof sql, "SELECT IS_USED_LOCK(x'%s') = CONNECTION_ID()", ml->hex);
        long long v;
        int isnull;
        rc = my_query(ml->db, sql, dl_deadline(mc->cmd_ms), 1, &v, &isnull, &broken, err);
        if (!rc) {
            *held = !isnull && v == 1;
            *count = *held ? l->holds : 0;
            return DLOCK_OK;
        }
        if (!broken) return rc;
        lock_conn_lost(l);
    }
    return dl_seterr(err, DLOCK_ELOST, "lock '%s' was lost with its connection",
                     nm(l, nb, sizeof nb));
}

/* ---- queries by name ---- */
static int my_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                      dl_err *err) {
    char hex[2 * MY_KEY_MAX + 1], sql[160 + 2 * sizeof hex];
    make_key(name, len, hex);
    memset(info, 0, sizeof *info);
    if (((my_client *)c->bctx)->u.mode == MY_MODE_TABLE) return table_inspect(c, hex, info, err);
    snprintf(sql, sizeof sql, "SELECT IS_USED_LOCK(x'%s')", hex);
    long long v, f;
    int isnull, fnull;
    int rc = client_query(c, sql, &v, &isnull, err);
    if (!rc) {
        snprintf(sql, sizeof sql, "SELECT n FROM dlock_fence WHERE name = x'%s'", hex);
        rc = client_query(c, sql, &f, &fnull, err);
    }
    if (rc) return rc;
    info->exists = !isnull;
    info->ttl_ms = isnull ? -2 : -1;
    info->fence = fnull ? 0 : (uint64_t)f;
    info->hold_count = info->holders = !isnull;
    if (!isnull) snprintf(info->holder, sizeof info->holder, "connection %lld", v);
    return DLOCK_OK;
}

static int my_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                            dl_err *err) {
    char hex[2 * MY_KEY_MAX + 1], sql[80 + sizeof hex];
    make_key(name, len, hex);
    snprintf(sql, sizeof sql, "SELECT n FROM dlock_fence WHERE name = x'%s'", hex);
    long long v;
    int isnull;
    int rc = client_query(c, sql, &v, &isnull, err);
    if (!rc) *fence = isnull ? 0 : (uint64_t)v;
    return rc;
}

static int my_extend(dlock_lock *l, int64_t lease_ms, long long *res, dl_err *err) {
    my_client *mc = l->c->bctx;
    if (mc->u.mode == MY_MODE_TABLE) return table_extend(l, lease_ms, res, err);
    return dl_seterr(err, DLOCK_ENOTSUP,
                     "extend is not supported by the mysql backend in GET_LOCK mode (its locks "
                     "live as long as the connection; ?lock=table has leases)");
}

/* Table mode: deletes the row, whoever holds it; the holder finds out at
 * its next extend, renewal, check or release (DLOCK_ELOST). */
static int my_force_unlock(dlock_client *c, const char *name, size_t len, int *existed,
                           dl_err *err) {
    my_client *mc = c->bctx;
    if (mc->u.mode != MY_MODE_TABLE)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "force_unlock is not supported by the mysql backend in GET_LOCK mode "
                         "(only KILL of the holder's connection could do it)");
    char hex[2 * MY_KEY_MAX + 1], sql[200 + sizeof hex];
    make_key(name, len, hex);
    snprintf(sql, sizeof sql,
             "DELETE FROM dlock_locks WHERE name = x'%s' AND expires_at >= " MY_NOW_US, hex);
    long long n = 0;
    pthread_mutex_lock(&mc->mu);
    int rc = cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), &n, NULL, err);
    if (!rc) { /* an expired row too: nobody holds it */
        snprintf(sql, sizeof sql, "DELETE FROM dlock_locks WHERE name = x'%s'", hex);
        rc = cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, NULL, err);
    }
    pthread_mutex_unlock(&mc->mu);
    if (!rc && existed) *existed = n > 0;
    return rc;
}

/* dlock_server_fact: "version", "session", "mode" (get_lock / table),
 * "wait_timeout" (seconds an idle connection lives: GET_LOCK holders lose
 * their locks with it), "server_time_ms" (the server's clock, Unix ms: the
 * clock that decides table-mode expiry), "connection_id" (of the client's
 * query connection). */
static int my_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                          dl_err *err) {
    my_client *mc = c->bctx;
    const char *sql = NULL;
    if (!strcmp(what, "session")) {
        if (mc->u.mode == MY_MODE_TABLE)
            snprintf(buf, buflen,
                     "a lease in table dlock_locks, %lld ms (DLOCK_WATCHDOG: renewed every "
                     "third while the client lives)",
                     (long long)c->watchdog_lease_ms);
        else
            snprintf(buf, buflen, "the connection (GET_LOCK)");
        return DLOCK_OK;
    }
    if (!strcmp(what, "mode")) {
        snprintf(buf, buflen, "%s", mc->u.mode == MY_MODE_TABLE ? "table" : "get_lock");
        return DLOCK_OK;
    }
    if (!strcmp(what, "version")) sql = "SELECT VERSION()";
    else if (!strcmp(what, "wait_timeout")) sql = "SELECT @@SESSION.wait_timeout";
    else if (!strcmp(what, "connection_id")) sql = "SELECT CONNECTION_ID()";
    else if (!strcmp(what, "server_time_ms"))
        sql = "SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000 AS SIGNED)";
    if (!sql)
        return dl_seterr(err, DLOCK_ESERVER,
                         "no such fact '%.40s' on the mysql backend (version, session, mode, "
                         "wait_timeout, server_time_ms, connection_id)",
                         what);
    my_row row;
    int rc = client_row(c, sql, &row, err);
    if (rc) return rc;
    if (!row.present || row.isnull[0])
        return dl_seterr(err, DLOCK_EPROTO, "the server answered no value for '%s'", what);
    snprintf(buf, buflen, "%s", row.v[0]);
    return DLOCK_OK;
}

static const char *const my_schemes[] = {"mysql://", "mariadb://", NULL};

const dl_backend dl_backend_mysql = {
    .name = "mysql",
    .schemes = my_schemes,
    .kinds = (1u << DLOCK_KIND_PLAIN) | (1u << DLOCK_KIND_REENTRANT),
    .caps = DL_CAP_CANCEL,
    .open = my_open,
    .close = my_close,
    .ping = my_ping,
    .lock_init = my_lock_init,
    .lock_destroy = my_lock_destroy,
    .acquire = my_acquire,
    .release = my_release,
    .extend = my_extend,
    .check = my_check,
    .inspect = my_inspect,
    .fence_current = my_fence_current,
    .force_unlock = my_force_unlock,
    .server_fact = my_server_fact,
};
