/* The flash sale's database: SQLite (WAL mode, busy timeout), one connection
 * per worker thread; and the dispatch of flash_sale.h's store functions to
 * SQLite or, for a mysql:// URL, to MariaDB/MySQL (store_mysql.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "store_impl.h"

#define BUSY_TIMEOUT_MS 15000

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
    [Q_HAS_ORDER] = "SELECT 1 FROM orders WHERE user_id = ?1 AND voucher_id = ?2 LIMIT 1",
    [Q_STOCK] = "SELECT stock FROM vouchers WHERE id = ?1",
    [Q_DEC] = "UPDATE vouchers SET stock = stock - 1 WHERE id = ?1",
    [Q_DEC_IF_STOCK] = "UPDATE vouchers SET stock = stock - 1 WHERE id = ?1 AND stock > 0",
    /* the fencing token is checked by the database: a write carrying a token
     * older than the last one applied is rejected */
    [Q_DEC_FENCED] = "UPDATE vouchers SET stock = stock - 1, last_fence = ?2 "
                     "WHERE id = ?1 AND last_fence < ?2",
    [Q_INSERT] = "INSERT INTO orders (id, user_id, voucher_id) VALUES (?1, ?2, ?3)",
};

typedef struct sq_store {
    store base; /* first */
    sqlite3 *db;
    sqlite3_stmt *q[Q_COUNT];
} sq_store;

static const store_ops sqlite_ops;

static int open_db(const char *path, sqlite3 **db, char *err, size_t errlen) {
    int rc = sqlite3_open_v2(path, db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "cannot open SQLite database '%s': %s", path,
                 *db ? sqlite3_errmsg(*db) : sqlite3_errstr(rc));
        sqlite3_close(*db);
        *db = NULL;
        return -1;
    }
    sqlite3_busy_timeout(*db, BUSY_TIMEOUT_MS);
    return 0;
}

static int exec_db(sqlite3 *db, const char *path, const char *sql, char *err, size_t errlen) {
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "SQLite database '%s': %s", path, msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static void sq_close(store *st);

static int sq_open(const char *path, store **out, char *err, size_t errlen) {
    *out = NULL;
    sq_store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->base.ops = &sqlite_ops;
    if (open_db(path, &s->db, err, errlen)) {
        free(s);
        return -1;
    }
    if (exec_db(s->db, path, "PRAGMA synchronous = NORMAL", err, errlen)) goto fail;
    for (int i = 0; i < Q_COUNT; i++) {
        if (sqlite3_prepare_v2(s->db, sql_text[i], -1, &s->q[i], NULL) != SQLITE_OK) {
            snprintf(err, errlen, "SQLite: preparing \"%s\": %s", sql_text[i],
                     sqlite3_errmsg(s->db));
            goto fail;
        }
    }
    *out = &s->base;
    return 0;
fail:
    sq_close(&s->base);
    return -1;
}

static void sq_close(store *st) {
    sq_store *s = (sq_store *)st;
    for (int i = 0; i < Q_COUNT; i++) sqlite3_finalize(s->q[i]);
    sqlite3_close(s->db);
    free(s);
}

static int fail(sq_store *s, int q) {
    snprintf(s->base.err, sizeof s->base.err, "SQLite: %s: %s", sql_text[q], sqlite3_errmsg(s->db));
    sqlite3_reset(s->q[q]);
    return -1;
}

/* Runs statement q to completion; *row gets the first column of the first
 * row (if any, and row non-NULL); *found whether there was a row. */
static int run(sq_store *s, int q, long long *row, int *found) {
    sqlite3_stmt *st = s->q[q];
    int rc = sqlite3_step(st);
    if (found) *found = 0;
    if (rc == SQLITE_ROW) {
        if (found) *found = 1;
        if (row) *row = sqlite3_column_int64(st, 0);
        rc = sqlite3_step(st);
        while (rc == SQLITE_ROW) rc = sqlite3_step(st);
    }
    if (rc != SQLITE_DONE) return fail(s, q);
    sqlite3_reset(st);
    return 0;
}

static int sq_has_order(store *st, int user, int voucher, int *has) {
    sq_store *s = (sq_store *)st;
    sqlite3_bind_int(s->q[Q_HAS_ORDER], 1, user);
    sqlite3_bind_int(s->q[Q_HAS_ORDER], 2, voucher);
    return run(s, Q_HAS_ORDER, NULL, has);
}

static int sq_stock(store *st, int voucher, long long *stock) {
    sq_store *s = (sq_store *)st;
    int found = 0;
    sqlite3_bind_int(s->q[Q_STOCK], 1, voucher);
    if (run(s, Q_STOCK, stock, &found)) return -1;
    if (!found) *stock = 0;
    return 0;
}

static int sq_decrement(store *st, int voucher) {
    sq_store *s = (sq_store *)st;
    sqlite3_bind_int(s->q[Q_DEC], 1, voucher);
    return run(s, Q_DEC, NULL, NULL);
}

static int sq_decrement_if_stock(store *st, int voucher, int *ok) {
    sq_store *s = (sq_store *)st;
    sqlite3_bind_int(s->q[Q_DEC_IF_STOCK], 1, voucher);
    if (run(s, Q_DEC_IF_STOCK, NULL, NULL)) return -1;
    *ok = sqlite3_changes(s->db) == 1;
    return 0;
}

static int sq_decrement_fenced(store *st, int voucher, uint64_t fence, int *ok) {
    sq_store *s = (sq_store *)st;
    sqlite3_bind_int(s->q[Q_DEC_FENCED], 1, voucher);
    sqlite3_bind_int64(s->q[Q_DEC_FENCED], 2, (sqlite3_int64)fence);
    if (run(s, Q_DEC_FENCED, NULL, NULL)) return -1;
    *ok = sqlite3_changes(s->db) == 1;
    return 0;
}

static int sq_insert_order(store *base, uint64_t id, int user, int voucher) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = s->q[Q_INSERT];
    sqlite3_bind_int64(st, 1, (sqlite3_int64)id);
    sqlite3_bind_int(st, 2, user);
    sqlite3_bind_int(st, 3, voucher);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_CONSTRAINT && sqlite3_extended_errcode(s->db) == SQLITE_CONSTRAINT_UNIQUE) {
        sqlite3_reset(st);
        return 1;
    }
    if (rc != SQLITE_DONE) return fail(s, Q_INSERT);
    sqlite3_reset(st);
    return 0;
}

static int sq_exec(store *st, const char *sql) {
    sq_store *s = (sq_store *)st;
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(st->err, sizeof st->err, "SQLite: %s: %s", sql, msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

/* one writer at a time: the whole transaction holds the write lock */
static int sq_begin(store *s) { return sq_exec(s, "BEGIN IMMEDIATE"); }
static int sq_commit(store *s) { return sq_exec(s, "COMMIT"); }
static int sq_rollback(store *s) { return sq_exec(s, "ROLLBACK"); }

static int sq_reset(const char *path, int vouchers, int stock, int unique_pair, char *err,
                size_t errlen) {
    sqlite3 *db = NULL;
    if (open_db(path, &db, err, errlen)) return -1;
    int rc = -1;
    /* WAL: readers never block the writer, so 8+ processes can share the file */
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        snprintf(err, errlen, "cannot use SQLite database '%s': %s", path, sqlite3_errmsg(db));
        goto out;
    }
    if (strcmp((const char *)sqlite3_column_text(st, 0), "wal") != 0) {
        snprintf(err, errlen, "SQLite database '%s': cannot switch to WAL mode (got %s)", path,
                 (const char *)sqlite3_column_text(st, 0));
        goto out;
    }
    sqlite3_finalize(st);
    st = NULL;
    char sql[1024];
    snprintf(sql, sizeof sql,
             "DROP TABLE IF EXISTS orders;"
             "DROP TABLE IF EXISTS vouchers;"
             "CREATE TABLE vouchers (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL,"
             " last_fence INTEGER NOT NULL DEFAULT 0);"
             "CREATE TABLE orders (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL,"
             " voucher_id INTEGER NOT NULL%s);"
             "CREATE INDEX IF NOT EXISTS orders_user ON orders (user_id, voucher_id);"
             "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %d)"
             " INSERT INTO vouchers (id, stock) SELECT i, %d FROM n;",
             unique_pair ? ", UNIQUE (user_id, voucher_id)" : "", vouchers, stock);
    if (exec_db(db, path, sql, err, errlen)) goto out;
    rc = 0;
out:
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

static int scalar(sqlite3 *db, const char *sql, int stock, long long *v, char *err, size_t errlen) {
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK && sqlite3_bind_parameter_count(st) > 0) sqlite3_bind_int(st, 1, stock);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        snprintf(err, errlen, "SQLite: %s: %s", sql, sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return -1;
    }
    *v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return 0;
}

static int sq_stats_read(const char *path, int stock, store_stats *s, char *err, size_t errlen) {
    sqlite3 *db = NULL;
    if (open_db(path, &db, err, errlen)) return -1;
    int rc = scalar(db, "SELECT count(*) FROM orders", 0, &s->orders, err, errlen) ||
             scalar(db, "SELECT coalesce(sum(stock), 0) FROM vouchers", 0, &s->stock_left, err,
                    errlen) ||
             /* orders beyond a voucher's stock */
             scalar(db,
                    "SELECT coalesce(sum(max(n - ?1, 0)), 0) FROM"
                    " (SELECT count(*) AS n FROM orders GROUP BY voucher_id)",
                    stock, &s->oversold, err, errlen) ||
             /* second and later orders of one user for one voucher */
             scalar(db,
                    "SELECT coalesce(sum(n - 1), 0) FROM"
                    " (SELECT count(*) AS n FROM orders GROUP BY user_id, voucher_id)",
                    0, &s->duplicates, err, errlen) ||
             scalar(db, "SELECT count(*) - count(DISTINCT id) FROM orders", 0, &s->dup_ids, err,
                    errlen);
    sqlite3_close(db);
    return rc ? -1 : 0;
}

static const store_ops sqlite_ops = {
    .open = sq_open,
    .close = sq_close,
    .reset = sq_reset,
    .stats_read = sq_stats_read,
    .has_order = sq_has_order,
    .stock = sq_stock,
    .decrement = sq_decrement,
    .decrement_if_stock = sq_decrement_if_stock,
    .decrement_fenced = sq_decrement_fenced,
    .insert_order = sq_insert_order,
    .begin = sq_begin,
    .commit = sq_commit,
    .rollback = sq_rollback,
};

/* ---- dispatch ---- */
int store_is_mysql(const char *db) {
    return !strncmp(db, "mysql://", 8) || !strncmp(db, "mariadb://", 10);
}

int store_have_mysql(void) {
#ifdef FLASH_SALE_MYSQL
    return 1;
#else
    return 0;
#endif
}

static const store_ops *ops_for(const char *db) {
#ifdef FLASH_SALE_MYSQL
    if (store_is_mysql(db)) return &store_mysql_ops;
#else
    (void)db; /* main refuses mysql:// in this build */
#endif
    return &sqlite_ops;
}

int store_open(const char *db, store **out, char *err, size_t errlen) {
    return ops_for(db)->open(db, out, err, errlen);
}

void store_close(store *s) {
    if (s) s->ops->close(s);
}

int store_reset(const char *db, int vouchers, int stock, int unique_pair, char *err,
                size_t errlen) {
    return ops_for(db)->reset(db, vouchers, stock, unique_pair, err, errlen);
}

int store_stats_read(const char *db, int stock, store_stats *st, char *err, size_t errlen) {
    return ops_for(db)->stats_read(db, stock, st, err, errlen);
}

/* every step starts with a clean error state */
#define STEP(s, call) ((s)->retryable = 0, (s)->ops->call)
int store_has_order(store *s, int user, int voucher, int *has) {
    return STEP(s, has_order(s, user, voucher, has));
}
int store_stock(store *s, int voucher, long long *stock) {
    return STEP(s, stock(s, voucher, stock));
}
int store_decrement(store *s, int voucher) { return STEP(s, decrement(s, voucher)); }
int store_decrement_if_stock(store *s, int voucher, int *ok) {
    return STEP(s, decrement_if_stock(s, voucher, ok));
}
int store_decrement_fenced(store *s, int voucher, uint64_t fence, int *ok) {
    return STEP(s, decrement_fenced(s, voucher, fence, ok));
}
int store_insert_order(store *s, uint64_t id, int user, int voucher) {
    return STEP(s, insert_order(s, id, user, voucher));
}
int store_begin(store *s) { return STEP(s, begin(s)); }
int store_commit(store *s) { return STEP(s, commit(s)); }
int store_rollback(store *s) { return STEP(s, rollback(s)); }
#undef STEP
int store_retryable(store *s) { return s->retryable; }
const char *store_errmsg(store *s) { return s->err; }
