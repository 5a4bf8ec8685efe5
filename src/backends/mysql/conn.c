/* MySQL connections and queries with a deadline (KILL QUERY on a cancel), the client's own connection, and lock names as GET_LOCK keys. (The design: mysql_backend.h.) */
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

#include "mysql_backend.h"

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
int dl_my_connect_t(my_client *mc, unsigned connect_s, unsigned rw_s, MYSQL **out,
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

void dl_my_close_db(MYSQL **db) {
    if (*db) mysql_close(*db);
    *db = NULL;
}

int dl_my_connect(my_client *mc, MYSQL **out, dl_err *err) {
    return dl_my_connect_t(mc, mc->connect_s, mc->rw_s, out, err);
}

/* Runs sql on db and waits for its answer until `until` (monotonic ms;
 * DL_INF_DEADLINE: forever). With want, reads the first column of the first
 * row into *v (*isnull when SQL NULL or no row). *broken: the connection is
 * unusable afterwards (close it). */

/* Sends sql and reads the head of its answer before `until` (see dl_my_query).
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
            if (dl_my_kill_query(mc, mysql_thread_id(db), &e2)) {
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

int dl_my_query_cx(my_client *mc, MYSQL *db, const char *sql, int64_t until,
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

int dl_my_query(MYSQL *db, const char *sql, int64_t until, int want, long long *v,
                int *isnull, int *broken, dl_err *err) {
    return dl_my_query_cx(NULL, db, sql, until, NULL, NULL, want, v, isnull, broken, err);
}

/* Runs a statement without rows (DML, START TRANSACTION...) before `until`:
 * *affected from mysql_affected_rows, *matched (may be NULL) the "Rows
 * matched" of an UPDATE (its affected rows count only changed rows). */
int dl_my_exec(MYSQL *db, const char *sql, int64_t until, long long *affected,
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


/* Runs a query and copies the first row's first MY_ROW_COLS columns. */
int dl_my_query_row(MYSQL *db, const char *sql, int64_t until, my_row *row, int *broken,
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
void dl_my_make_key(const char *name, size_t len, char *hex) {
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

const char *dl_my_name_msg(const dlock_lock *l, char *buf, size_t len) {
    return dl_name_msg(l->h.name, l->h.name_len, buf, len);
}

/* ---- the client's own connection ---- */

/* Runs a statement on the client's connection, connecting first when there
 * is none; a broken connection is closed (the next statement reconnects).
 * The caller holds mc->mu. */
int dl_my_cdb_exec(my_client *mc, const char *sql, int64_t until, long long *affected,
                   long long *matched, dl_err *err) {
    int broken = 0;
    int rc = mc->db ? DLOCK_OK : dl_my_connect(mc, &mc->db, err);
    if (!rc) rc = dl_my_exec(mc->db, sql, until, affected, matched, &broken, err);
    if (rc && broken) dl_my_close_db(&mc->db);
    return rc;
}

/* Runs a one-number query on the client's connection (connecting again if
 * it was lost; the queries are idempotent, so a lost one is retried once). */
int dl_my_client_query(dlock_client *c, const char *sql, long long *v, int *isnull,
                       dl_err *err) {
    my_client *mc = c->backend_client;
    pthread_mutex_lock(&mc->mu);
    int rc = DLOCK_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!mc->db && (rc = dl_my_connect(mc, &mc->db, err))) break;
        int broken = 0;
        rc = dl_my_query(mc->db, sql, dl_deadline(mc->cmd_ms), 1, v, isnull, &broken, err);
        if (!rc || !broken) break;
        dl_my_close_db(&mc->db);
    }
    pthread_mutex_unlock(&mc->mu);
    return rc;
}

/* Like dl_my_client_query, for a row of strings. */
int dl_my_client_row(dlock_client *c, const char *sql, my_row *row, dl_err *err) {
    my_client *mc = c->backend_client;
    pthread_mutex_lock(&mc->mu);
    int rc = DLOCK_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!mc->db && (rc = dl_my_connect(mc, &mc->db, err))) break;
        int broken = 0;
        rc = dl_my_query_row(mc->db, sql, dl_deadline(mc->cmd_ms), row, &broken, err);
        if (!rc || !broken) break;
        dl_my_close_db(&mc->db);
    }
    pthread_mutex_unlock(&mc->mu);
    return rc;
}

/* KILL QUERY id on the client's own connection (a user may kill its own
 * connections' statements). */
int dl_my_kill_query(my_client *mc, unsigned long id, dl_err *err) {
    char sql[48];
    snprintf(sql, sizeof sql, "KILL QUERY %lu", id);
    pthread_mutex_lock(&mc->mu);
    int rc = dl_my_cdb_exec(mc, sql, dl_deadline(mc->cmd_ms), NULL, NULL, err);
    pthread_mutex_unlock(&mc->mu);
    return rc;
}
