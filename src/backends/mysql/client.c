/* The MySQL client: open, close, ping, server facts, and the backend table. (The design: mysql_backend.h.) */
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

/* ---- client ---- */
static int my_open(dlock_client *c, const char *url, const dlock_options *o, dl_err *err) {
    my_client *mc = calloc(1, sizeof *mc);
    if (!mc) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&mc->mu, NULL);
    pthread_mutex_init(&mc->rmu, NULL);
    dl_cond_init(&mc->rdone);
    dl_my_renewer_init(mc);
    c->backend_client = mc;
    int rc = dl_my_parse_url(url, &mc->u, err);
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
    dl_my_make_label(&mc->u, url, (int)(strstr(url, "://") - url));
    mc->cmd_ms = c->command_timeout_ms;
    int64_t cs = (c->connect_timeout_ms + 999) / 1000, ws = (c->command_timeout_ms + 999) / 1000;
    mc->connect_s = (unsigned)(cs < 1 ? 1 : cs > 86400 ? 86400 : cs);
    mc->rw_s = (unsigned)(ws < 1 ? 1 : ws > 86400 ? 86400 : ws);
    rc = dl_my_connect(mc, &mc->db, err);
    if (rc) return rc;
    int broken;
    rc = dl_my_query(mc->db,
                  "CREATE TABLE IF NOT EXISTS dlock_fence (name VARBINARY(255) NOT NULL "
                  "PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB",
                  dl_deadline(mc->cmd_ms), 0, NULL, NULL, &broken, err);
    if (rc) {
        char m[DL_ERRMSG_MAX];
        snprintf(m, sizeof m, "%s", err->msg);
        return dl_seterr(err, err->code, "%s: creating table dlock_fence: %s", mc->u.label, m);
    }
    if (mc->u.mode == MY_MODE_TABLE) {
        rc = dl_my_query(mc->db,
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
    my_client *mc = c->backend_client;
    if (!mc) return;
    dl_renewer_stop(&mc->renewer);
    dl_my_close_db(&mc->rdb);
    dl_my_close_db(&mc->db);
    memset(mc->u.password, 0, sizeof mc->u.password);
    pthread_cond_destroy(&mc->rdone);
    pthread_mutex_destroy(&mc->rmu);
    pthread_mutex_destroy(&mc->mu);
    free(mc);
    c->backend_client = NULL;
}


static int my_ping(dlock_client *c, int64_t *rtt_us, dl_err *err) {
    long long v;
    int isnull;
    int64_t t0 = dl_now_us();
    int rc = dl_my_client_query(c, "SELECT 1", &v, &isnull, err);
    if (!rc && rtt_us) *rtt_us = dl_now_us() - t0;
    return rc;
}

static int my_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                          dl_err *err) {
    my_client *mc = c->backend_client;
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
    int rc = dl_my_client_row(c, sql, &row, err);
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
    .lock_init = dl_my_lock_init,
    .lock_destroy = dl_my_lock_destroy,
    .acquire = dl_my_acquire,
    .release = dl_my_release,
    .extend = dl_my_extend,
    .check = dl_my_check,
    .inspect = dl_my_inspect,
    .fence_current = dl_my_fence_current,
    .force_unlock = dl_my_force_unlock,
    .server_fact = my_server_fact,
};
