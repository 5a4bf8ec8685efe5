/* The MySQL / MariaDB backend: mysql://[user[:password]@]host[:port]/database
 * (also mariadb://; port 3306; user, password and database may be
 * percent-encoded), over libmariadb, always TCP (also for host "localhost",
 * which libmariadb would otherwise take for the local unix socket).
 *
 * Locks are the server's named user locks, GET_LOCK / RELEASE_LOCK, held by a
 * connection (a session) while it lives: each lock handle has its own
 * connection, opened by dlock_lock_new. A holder that dies or loses its
 * connection loses the lock at once (the server frees it when the connection
 * ends); nothing expires while the connection lives.
 *  - Kinds: DLOCK_KIND_PLAIN and DLOCK_KIND_REENTRANT (MariaDB >= 10.0.2 and
 *    MySQL >= 5.7 count nested GET_LOCKs per connection). GET_LOCK has no
 *    shared mode: no read/write or fair locks.
 *  - lease_ms: only DLOCK_WATCHDOG, meaning "held while the connection
 *    lives". An explicit lease (> 0) is DLOCK_ENOTSUP: the server cannot
 *    make the lock expire while its connection is open, and the library does
 *    not pretend it does. dlock_extend is DLOCK_ENOTSUP too.
 *  - Waits are the server's: GET_LOCK(name, seconds) with fractional seconds
 *    (0 for try-once, 1-year chunks for DLOCK_WAIT_FOREVER); no polling.
 *  - Lock names: a name of at most 64 bytes of printable ASCII is used as
 *    is, as a binary string (MySQL's limit is 64 characters; MariaDB 10.11
 *    compares binary names byte for byte; a server that folds case would make
 *    "A" and "a" one lock: safe, only less parallel). Any other name (longer, or with other bytes) is
 *    replaced by "dlock:" + the hex of the first 24 bytes of its SHA-256 (54
 *    characters), so names starting "dlock:" are best avoided.
 *  - Fencing tokens: table dlock_fence (name VARBINARY(255) PRIMARY KEY,
 *    n BIGINT), InnoDB, created if missing when the client opens (the user
 *    needs CREATE on the database once). Each successful acquire, re-entry
 *    included, increments the name's row on the lock's connection; the new n
 *    is the token, strictly increasing per name.
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
 * Messages name the server as mysql://user:***@host:port/database. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysql.h>
#include <mysqld_error.h>
#include <errmsg.h>
#include <openssl/sha.h>

#include "internal.h"

#define MY_KEY_MAX 64                 /* longest lock name GET_LOCK takes (MySQL) */
#define MY_FOREVER_CHUNK_S 31536000LL /* one GET_LOCK of a forever wait: a year */

typedef struct my_url {
    char user[128], password[256], host[256], database[128];
    unsigned port;
    char label[700]; /* for messages: no password */
} my_url;

typedef struct my_client {
    my_url u;
    unsigned connect_s, rw_s; /* connection timeouts, whole seconds */
    int64_t cmd_ms;
    pthread_mutex_t mu; /* guards db */
    MYSQL *db;          /* queries by name, ping */
} my_client;

typedef struct my_lock {
    MYSQL *db;                       /* this handle's session; NULL when closed */
    char hex[2 * MY_KEY_MAX + 1];    /* the GET_LOCK name in hex, for x'...' */
} my_lock;

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
    if (!slash || !slash[1] || strpbrk(slash + 1, "/?#") ||
        decode(slash + 1, strlen(slash + 1), u->database, sizeof u->database))
        goto bad;
    return 0;
bad:
    memset(u->password, 0, sizeof u->password);
    return dl_seterr(err, DLOCK_EINVAL,
                     "bad MySQL/MariaDB URL (want %.*s://user:password@host:port/database)",
                     scheme_len, url);
}

static void make_label(my_url *u, const char *scheme, int scheme_len) {
    int v6 = strchr(u->host, ':') != NULL;
    snprintf(u->label, sizeof u->label, "%.*s://%s%s%s%s%s%s:%u/%s", scheme_len, scheme,
             u->user, u->password[0] ? ":***" : "", u->user[0] ? "@" : "", v6 ? "[" : "",
             u->host, v6 ? "]" : "", u->port, u->database);
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

static int my_connect(my_client *mc, MYSQL **out, dl_err *err) {
    *out = NULL;
    pthread_once(&lib_once, lib_init);
    if (lib_failed) return dl_seterr(err, DLOCK_ESYS, "cannot initialise libmariadb");
    MYSQL *m = mysql_init(NULL);
    if (!m) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    unsigned proto = MYSQL_PROTOCOL_TCP;
    my_bool no = 0;
    mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &mc->connect_s);
    mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &mc->rw_s);
    mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &mc->rw_s);
    mysql_options(m, MYSQL_OPT_RECONNECT, &no); /* a reconnect would drop our locks */
    mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
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

/* Runs sql on db and waits for its answer until `until` (monotonic ms;
 * DL_INF_DEADLINE: forever). With want, reads the first column of the first
 * row into *v (*isnull when SQL NULL or no row). *broken: the connection is
 * unusable afterwards (close it). */
static int my_query(MYSQL *db, const char *sql, int64_t until, int want, long long *v,
                    int *isnull, int *broken, dl_err *err) {
    *broken = 0;
    if (v) *v = 0;
    if (isnull) *isnull = 1;
    if (mysql_send_query(db, sql, (unsigned long)strlen(sql))) goto fail;
    int fd = (int)mysql_get_socket(db);
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
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int n = poll(&pfd, 1, ms);
        if (n > 0) break;
        if (n < 0 && errno != EINTR) {
            *broken = 1;
            return dl_seterr(err, DLOCK_EIO, "poll failed: %s", strerror(errno));
        }
    }
    if (mysql_read_query_result(db)) goto fail;
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
    return DLOCK_OK;
}

static void my_close(dlock_client *c) {
    my_client *mc = c->bctx;
    if (!mc) return;
    close_db(&mc->db);
    memset(mc->u.password, 0, sizeof mc->u.password);
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

/* ---- lock handles ---- */
static int my_lock_init(dlock_lock *l, dl_err *err) {
    my_lock *ml = calloc(1, sizeof *ml);
    if (!ml) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    l->bdata = ml;
    make_key(l->name, l->name_len, ml->hex);
    return my_connect(l->c->bctx, &ml->db, err);
}

static void my_lock_destroy(dlock_lock *l) {
    my_lock *ml = l->bdata;
    if (!ml) return;
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

static int my_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_try *t,
                      dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
    char nb[80];
    if (lease_ms != DLOCK_WATCHDOG)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "leases (lease_ms > 0) are not supported by the mysql backend: its "
                         "locks are held while the connection lives (pass DLOCK_WATCHDOG)");
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
        rc = my_query(ml->db, sql, until, 1, &v, &isnull, &broken, err);
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
        if (dl_now_ms() >= deadline)
            return dl_seterr(err, DLOCK_ETIMEDOUT, "lock '%s' not acquired within %lld ms",
                             nm(l, nb, sizeof nb), (long long)wait_ms);
    }
    /* the fencing token: LAST_INSERT_ID(expr) in both branches makes
     * mysql_insert_id() the new n, first insert included */
    char fsql[160 + sizeof ml->hex];
    snprintf(fsql, sizeof fsql,
             "INSERT INTO dlock_fence (name, n) VALUES (x'%s', LAST_INSERT_ID(1)) "
             "ON DUPLICATE KEY UPDATE n = LAST_INSERT_ID(n + 1)",
             ml->hex);
    rc = my_query(ml->db, fsql, dl_deadline(mc->cmd_ms), 0, NULL, NULL, &broken, err);
    if (rc) {
        if (!broken) { /* give back the hold just taken; best effort */
            int b2;
            dl_err e2 = {0};
            snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK(x'%s')", ml->hex);
            if (my_query(ml->db, sql, dl_deadline(mc->cmd_ms), 1, &v, &isnull, &b2, &e2) &&
                b2)
                lock_conn_lost(l);
        }
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
    if (broken) lock_conn_lost(l);
    return rc;
}

static int my_release(dlock_lock *l, long long *res, dl_err *err) {
    my_lock *ml = l->bdata;
    my_client *mc = l->c->bctx;
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

static const char *const my_schemes[] = {"mysql://", "mariadb://", NULL};

const dl_backend dl_backend_mysql = {
    .name = "mysql",
    .schemes = my_schemes,
    .kinds = (1u << DLOCK_KIND_PLAIN) | (1u << DLOCK_KIND_REENTRANT),
    .open = my_open,
    .close = my_close,
    .ping = my_ping,
    .lock_init = my_lock_init,
    .lock_destroy = my_lock_destroy,
    .acquire = my_acquire,
    .release = my_release,
    .extend = NULL,
    .check = my_check,
    .inspect = my_inspect,
    .fence_current = my_fence_current,
    .force_unlock = NULL,
};
