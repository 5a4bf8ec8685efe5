/* The flash sale's database on MariaDB or MySQL (libmariadb): the same tables
 * and statements as the SQLite side in store.c, InnoDB, one TCP connection per
 * worker thread (each worker process opens its own, none is shared across a
 * fork), prepared statements for the buy steps.
 *
 * db is mysql://[user[:password]@]host[:port]/database (or mariadb://...);
 * user, password and database may be percent-encoded. The password never
 * appears in a message: messages name the database as
 * mysql://user:***@host:port/database. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysql.h>
#include <mysqld_error.h>

#include "store_impl.h"

#define CONNECT_TIMEOUT_S 5
/* longer than InnoDB's lock wait timeout (50 s): a slow statement ends with
 * the server's error, not ours */
#define READ_TIMEOUT_S 120

enum {
    Q_HAS_ORDER,
    Q_STOCK,
    Q_DEC,
    Q_DEC_IF_STOCK,
    Q_DEC_FENCED,
    Q_INSERT,
    Q_COUNT
};

static const char *const sql_text[Q_COUNT] = {
    [Q_HAS_ORDER] = "SELECT 1 FROM orders WHERE user_id = ? AND voucher_id = ? LIMIT 1",
    [Q_STOCK] = "SELECT stock FROM vouchers WHERE id = ?",
    [Q_DEC] = "UPDATE vouchers SET stock = stock - 1 WHERE id = ?",
    [Q_DEC_IF_STOCK] = "UPDATE vouchers SET stock = stock - 1 WHERE id = ? AND stock > 0",
    /* the fencing token is checked by the database: a write carrying a token
     * older than the last one applied is rejected */
    [Q_DEC_FENCED] = "UPDATE vouchers SET stock = stock - 1, last_fence = ? "
                     "WHERE id = ? AND last_fence < ?",
    [Q_INSERT] = "INSERT INTO orders (id, user_id, voucher_id) VALUES (?, ?, ?)",
};

typedef struct my_store {
    store base; /* first */
    MYSQL *db;
    MYSQL_STMT *q[Q_COUNT];
} my_store;

/* ---- the URL ---- */
typedef struct my_url {
    char user[128], password[128], host[256], database[128];
    unsigned port;
    char label[600]; /* for messages: no password */
} my_url;

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Copies [s, s+n) percent-decoded into out; -1 if it does not fit or has a
 * bad escape or a NUL. */
static int decode(const char *s, size_t n, char *out, size_t outlen) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            if (i + 2 >= n) return -1;
            int h = hexval((unsigned char)s[i + 1]), l = hexval((unsigned char)s[i + 2]);
            if (h < 0 || l < 0) return -1;
            c = h * 16 + l;
            i += 2;
        }
        if (c == 0 || o + 1 >= outlen) return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

static int parse_url(const char *db, my_url *u, char *err, size_t errlen) {
    memset(u, 0, sizeof *u);
    u->port = 3306;
    const char *p = strstr(db, "://");
    size_t scheme_len = p ? (size_t)(p - db) : 0;
    p = p ? p + 3 : db;
    const char *slash = strchr(p, '/');
    const char *at = NULL;
    for (const char *q = p; *q && (!slash || q < slash); q++)
        if (*q == '@') at = q; /* the last '@' before the path */
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        size_t ulen = colon ? (size_t)(colon - p) : (size_t)(at - p);
        if (decode(p, ulen, u->user, sizeof u->user) ||
            (colon && decode(colon + 1, (size_t)(at - colon - 1), u->password,
                             sizeof u->password))) {
            snprintf(err, errlen, "--db: bad user or password in the %.*s:// URL",
                     (int)scheme_len, db);
            return -1;
        }
        p = at + 1;
    }
    const char *hend = slash ? slash : p + strlen(p);
    const char *portp = NULL;
    if (*p == '[') { /* [IPv6] */
        const char *close = memchr(p, ']', (size_t)(hend - p));
        if (!close) goto bad;
        if ((size_t)(close - p - 1) >= sizeof u->host) goto bad;
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
    int v6 = strchr(u->host, ':') != NULL;
    snprintf(u->label, sizeof u->label, "%.*s://%s%s%s%s%s%s:%u/%s", (int)scheme_len, db,
             u->user, u->password[0] ? ":***" : "", u->user[0] ? "@" : "", v6 ? "[" : "",
             u->host, v6 ? "]" : "", u->port, u->database);
    return 0;
bad:
    snprintf(err, errlen,
             "--db: bad MySQL/MariaDB URL (want %.*s://user:password@host:port/database)",
             (int)scheme_len, db);
    return -1;
}

/* One line: server messages are, but make sure. */
static void one_line(char *s) {
    for (; *s; s++)
        if (*s == '\n' || *s == '\r') *s = ' ';
}

/* Connects over TCP (also for host "localhost", which libmariadb would
 * otherwise take for the local unix socket). */
static MYSQL *connect_db(const char *db, char *err, size_t errlen) {
    my_url u;
    if (parse_url(db, &u, err, errlen)) return NULL;
    MYSQL *m = mysql_init(NULL);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    unsigned proto = MYSQL_PROTOCOL_TCP, cto = CONNECT_TIMEOUT_S, rto = READ_TIMEOUT_S;
    mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &cto);
    mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &rto);
    mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &rto);
    mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    /* CLIENT_FOUND_ROWS: an UPDATE reports the rows it matched, as SQLite's
     * changes() does */
    if (!mysql_real_connect(m, u.host, u.user[0] ? u.user : NULL, u.password, u.database,
                            u.port, NULL, CLIENT_FOUND_ROWS) ||
        mysql_autocommit(m, 1)) {
        snprintf(err, errlen, "cannot use MySQL/MariaDB at %s: %s", u.label, mysql_error(m));
        one_line(err);
        mysql_close(m);
        m = NULL;
    }
    memset(u.password, 0, sizeof u.password);
    return m;
}

static void my_close(store *st);

static int my_open(const char *db, store **out, char *err, size_t errlen) {
    *out = NULL;
    my_store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->base.ops = &store_mysql_ops;
    s->db = connect_db(db, err, errlen);
    if (!s->db) {
        free(s);
        return -1;
    }
    for (int i = 0; i < Q_COUNT; i++) {
        s->q[i] = mysql_stmt_init(s->db);
        if (!s->q[i] || mysql_stmt_prepare(s->q[i], sql_text[i], strlen(sql_text[i]))) {
            snprintf(err, errlen, "MySQL/MariaDB: preparing \"%s\": %s", sql_text[i],
                     s->q[i] ? mysql_stmt_error(s->q[i]) : mysql_error(s->db));
            one_line(err);
            goto fail;
        }
    }
    *out = &s->base;
    return 0;
fail:
    my_close(&s->base);
    return -1;
}

static void my_close(store *st) {
    my_store *s = (my_store *)st;
    for (int i = 0; i < Q_COUNT; i++)
        if (s->q[i]) mysql_stmt_close(s->q[i]);
    mysql_close(s->db);
    free(s);
}

static int is_retryable(unsigned e) { return e == ER_LOCK_DEADLOCK || e == ER_LOCK_WAIT_TIMEOUT; }

static int stmt_fail(my_store *s, int q) {
    MYSQL_STMT *st = s->q[q];
    s->base.retryable = is_retryable(mysql_stmt_errno(st));
    snprintf(s->base.err, sizeof s->base.err, "MySQL/MariaDB: %s: %s", sql_text[q],
             mysql_stmt_error(st));
    one_line(s->base.err);
    return -1;
}

/* Runs statement q with n integer parameters. *row gets the first column of
 * the first row (if any, and row non-NULL); *found whether there was a row;
 * *affected the rows an UPDATE matched. Returns 0, -1 on error, 1 on a
 * unique key violation. */
static int run(my_store *s, int q, const long long *params, int n, long long *row, int *found,
               long long *affected) {
    MYSQL_STMT *st = s->q[q];
    MYSQL_BIND b[3];
    long long pv[3];
    memset(b, 0, sizeof b);
    for (int i = 0; i < n; i++) {
        pv[i] = params[i];
        b[i].buffer_type = MYSQL_TYPE_LONGLONG;
        b[i].buffer = &pv[i];
    }
    if (found) *found = 0;
    if (mysql_stmt_bind_param(st, b)) return stmt_fail(s, q);
    if (mysql_stmt_execute(st)) {
        if (mysql_stmt_errno(st) == ER_DUP_ENTRY) return 1;
        return stmt_fail(s, q);
    }
    if (mysql_stmt_field_count(st) > 0) {
        long long v = 0;
        my_bool is_null = 0;
        MYSQL_BIND r;
        memset(&r, 0, sizeof r);
        r.buffer_type = MYSQL_TYPE_LONGLONG;
        r.buffer = &v;
        r.is_null = &is_null;
        if (mysql_stmt_bind_result(st, &r)) return stmt_fail(s, q);
        int rc = mysql_stmt_fetch(st);
        if (rc == 0 || rc == MYSQL_DATA_TRUNCATED) {
            if (found) *found = 1;
            if (row) *row = is_null ? 0 : v;
            while ((rc = mysql_stmt_fetch(st)) == 0 || rc == MYSQL_DATA_TRUNCATED) {
            }
        }
        if (rc != MYSQL_NO_DATA) {
            stmt_fail(s, q);
            mysql_stmt_free_result(st);
            return -1;
        }
        mysql_stmt_free_result(st);
    } else if (affected) {
        *affected = (long long)mysql_stmt_affected_rows(st);
    }
    return 0;
}

static int my_has_order(store *st, int user, int voucher, int *has) {
    long long p[] = {user, voucher};
    return run((my_store *)st, Q_HAS_ORDER, p, 2, NULL, has, NULL) ? -1 : 0;
}

static int my_stock(store *st, int voucher, long long *stock) {
    long long p[] = {voucher};
    int found = 0;
    if (run((my_store *)st, Q_STOCK, p, 1, stock, &found, NULL)) return -1;
    if (!found) *stock = 0;
    return 0;
}

static int my_decrement(store *st, int voucher) {
    long long p[] = {voucher};
    return run((my_store *)st, Q_DEC, p, 1, NULL, NULL, NULL) ? -1 : 0;
}

static int my_decrement_if_stock(store *st, int voucher, int *ok) {
    long long p[] = {voucher}, n = 0;
    if (run((my_store *)st, Q_DEC_IF_STOCK, p, 1, NULL, NULL, &n)) return -1;
    *ok = n == 1;
    return 0;
}

static int my_decrement_fenced(store *st, int voucher, uint64_t fence, int *ok) {
    long long p[] = {(long long)fence, voucher, (long long)fence}, n = 0;
    if (run((my_store *)st, Q_DEC_FENCED, p, 3, NULL, NULL, &n)) return -1;
    *ok = n == 1;
    return 0;
}

static int my_insert_order(store *st, uint64_t id, int user, int voucher) {
    long long p[] = {(long long)id, user, voucher};
    return run((my_store *)st, Q_INSERT, p, 3, NULL, NULL, NULL);
}

static int query(MYSQL *m, const char *sql, char *err, size_t errlen, int *retryable) {
    if (mysql_query(m, sql) == 0) return 0;
    if (retryable) *retryable = is_retryable(mysql_errno(m));
    snprintf(err, errlen, "MySQL/MariaDB: %s: %s", sql, mysql_error(m));
    one_line(err);
    return -1;
}

static int tx(store *st, const char *sql) {
    my_store *s = (my_store *)st;
    return query(s->db, sql, st->err, sizeof st->err, &st->retryable);
}

/* InnoDB row locks: the conditional UPDATE and the unique key check see the
 * latest committed rows, whatever the isolation level */
static int my_begin(store *s) { return tx(s, "START TRANSACTION"); }
static int my_commit(store *s) { return tx(s, "COMMIT"); }
static int my_rollback(store *s) { return tx(s, "ROLLBACK"); }

static int my_reset(const char *db, int vouchers, int stock, int unique_pair, char *err,
                    size_t errlen) {
    MYSQL *m = connect_db(db, err, errlen);
    if (!m) return -1;
    char sql[512];
    snprintf(sql, sizeof sql,
             "CREATE TABLE orders (id BIGINT NOT NULL PRIMARY KEY, user_id INT NOT NULL,"
             " voucher_id INT NOT NULL, %s (user_id, voucher_id)) ENGINE=InnoDB",
             unique_pair ? "UNIQUE KEY orders_user" : "KEY orders_user");
    int rc = query(m, "DROP TABLE IF EXISTS orders", err, errlen, NULL) ||
             query(m, "DROP TABLE IF EXISTS vouchers", err, errlen, NULL) ||
             query(m,
                   "CREATE TABLE vouchers (id INT NOT NULL PRIMARY KEY, stock INT NOT NULL,"
                   " last_fence BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB",
                   err, errlen, NULL) ||
             query(m, sql, err, errlen, NULL);
    /* vouchers 1..n, 1000 rows per INSERT */
    size_t cap = 64 + 1000 * 24;
    char *ins = rc ? NULL : malloc(cap);
    if (!rc && !ins) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    for (int first = 1; !rc && first <= vouchers; first += 1000) {
        size_t len = (size_t)snprintf(ins, cap, "INSERT INTO vouchers (id, stock) VALUES ");
        for (int id = first; id <= vouchers && id < first + 1000; id++)
            len += (size_t)snprintf(ins + len, cap - len, "%s(%d,%d)", id > first ? "," : "",
                                    id, stock);
        rc = query(m, ins, err, errlen, NULL);
    }
    free(ins);
    mysql_close(m);
    return rc ? -1 : 0;
}

static int scalar(MYSQL *m, const char *sql, long long *v, char *err, size_t errlen) {
    if (query(m, sql, err, errlen, NULL)) return -1;
    MYSQL_RES *res = mysql_store_result(m);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    if (!row || !row[0]) {
        snprintf(err, errlen, "MySQL/MariaDB: %s: %s", sql,
                 mysql_errno(m) ? mysql_error(m) : "no result");
        one_line(err);
        mysql_free_result(res);
        return -1;
    }
    *v = strtoll(row[0], NULL, 10); /* sum() is a DECIMAL: "12" */
    mysql_free_result(res);
    return 0;
}

static int my_stats_read(const char *db, int stock, store_stats *s, char *err, size_t errlen) {
    MYSQL *m = connect_db(db, err, errlen);
    if (!m) return -1;
    char over[256];
    /* orders beyond a voucher's stock */
    snprintf(over, sizeof over,
             "SELECT coalesce(sum(greatest(n - %d, 0)), 0) FROM"
             " (SELECT count(*) AS n FROM orders GROUP BY voucher_id) AS per_voucher",
             stock);
    int rc = scalar(m, "SELECT count(*) FROM orders", &s->orders, err, errlen) ||
             scalar(m, "SELECT coalesce(sum(stock), 0) FROM vouchers", &s->stock_left, err,
                    errlen) ||
             scalar(m, over, &s->oversold, err, errlen) ||
             /* second and later orders of one user for one voucher */
             scalar(m,
                    "SELECT coalesce(sum(n - 1), 0) FROM"
                    " (SELECT count(*) AS n FROM orders GROUP BY user_id, voucher_id) AS per_user",
                    &s->duplicates, err, errlen) ||
             scalar(m, "SELECT count(*) - count(DISTINCT id) FROM orders", &s->dup_ids, err,
                    errlen);
    mysql_close(m);
    return rc ? -1 : 0;
}

const store_ops store_mysql_ops = {
    .open = my_open,
    .close = my_close,
    .reset = my_reset,
    .stats_read = my_stats_read,
    .has_order = my_has_order,
    .stock = my_stock,
    .decrement = my_decrement,
    .decrement_if_stock = my_decrement_if_stock,
    .decrement_fenced = my_decrement_fenced,
    .insert_order = my_insert_order,
    .begin = my_begin,
    .commit = my_commit,
    .rollback = my_rollback,
};
