/* PostgreSQL backend: postgres://user:pass@host:port/db (also postgresql://),
 * any URI or option libpq accepts (?sslmode=..., ?connect_timeout=...).
 *
 * Locks are session-level advisory locks (pg_advisory_lock and friends):
 * - The 64-bit key of a name is the first 8 bytes of SHA-256(name), read
 *   big-endian, as a signed bigint. In SQL:
 *     ('x' || left(encode(sha256(name::bytea), 'hex'), 16))::bit(64)::bigint
 *   Plain, reentrant, read and write locks of one name share that key: plain,
 *   reentrant and write take it exclusively, read takes it shared, so a
 *   writer excludes readers and other writers.
 * - Each lock handle has its own connection (opened when the handle is made),
 *   because a session's advisory locks are reentrant within the session: two
 *   handles on one session would not exclude each other. Re-entry of a held
 *   reentrant / read / write handle takes the key once more on its session.
 *   A thread that holds the write side and takes the read side through a
 *   second handle waits for itself: there is no downgrade.
 * - Try once: pg_try_advisory_lock[_shared]. Timed: SET lock_timeout, then
 *   pg_advisory_lock[_shared]; the server waits (no polling) and SQLSTATE
 *   55P03 (lock_not_available) is DLOCK_ETIMEDOUT. Forever: lock_timeout 0.
 *   dlock_lock_cancel stops such a wait with a cancel request (PQcancel):
 *   the statement ends with SQLSTATE 57014 (DLOCK_ECANCELED), and the
 *   session stays. Closing the connection instead would leave the server's
 *   backend waiting in the lock queue (it does not watch the client's socket
 *   there), to take the lock on the next release and hold it until it
 *   notices; that is only the fallback when the request cannot be sent.
 * - Lease: a lock is held while its session lives: pass DLOCK_WATCHDOG. An
 *   explicit lease_ms is DLOCK_ENOTSUP (a lease that would not be enforced
 *   is not offered), and so is dlock_extend. A holder that dies, or whose connection
 *   breaks, loses its locks when the server ends the session; the handle then
 *   reports DLOCK_ELOST on release and "not held" on check.
 * - Fencing tokens: table dlock_fence(name bytea primary key, n bigint),
 *   created if missing when the client opens; after each successful acquire,
 *   while holding, INSERT ... ON CONFLICT DO UPDATE SET n = n + 1 RETURNING n
 *   on the handle's session. Tokens of one name strictly increase.
 * - A waiter that dies (killed, crashed) leaves its statement queued for the
 *   lock until the server notices the client is gone: within 1 s on
 *   PostgreSQL 14+ (client_connection_check_interval, set on every session);
 *   on older servers only when the lock is granted to it (it then fails to
 *   answer, ends, and frees it).
 * - Timeouts: connect_timeout_ms becomes libpq's connect_timeout (seconds,
 *   rounded up); every statement that does not wait for a lock runs under
 *   statement_timeout = command_timeout_ms on the server and the same bound
 *   on the client (a client-side timeout closes the connection, and with it
 *   the session's locks).
 * - dlock_server_fact: "version", "session", or any setting by name
 *   (current_setting), for `dlock doctor`.
 * - force_unlock, list, semaphores, token operations: not supported (ending
 *   the holder's session with pg_terminate_backend would be the only way to
 *   take its lock, which is too brutal for a library call).
 */
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <openssl/sha.h>

#include "kinds.h"

typedef struct pg_client {
    const char **kw;            /* libpq connection keywords, NULL-terminated */
    const char **val;
    char *strs[16];             /* owned strings the values point into */
    size_t nstrs;
    char *scrub[2];             /* never shown in a message: the password as written, decoded */
    int64_t cmd_timeout_ms;
    pthread_mutex_t mu;         /* guards conn */
    PGconn *conn;               /* queries by name */
} pg_client;

typedef struct pg_lock {
    PGconn *conn;
    long long key;
} pg_lock;

static void no_notices(void *arg, const char *msg) {
    (void)arg;
    (void)msg;
}

/* Length of the password field of a URL's userinfo at p, which follows
 * "://": the bytes between the first ':' and the '@' of "user:password@",
 * 0 when there is none. */
static size_t url_password_at(const char *p, size_t *skip_user) {
    size_t n = strcspn(p, "/?#\" \t\r\n");
    const char *at = NULL;
    for (const char *q = p; q < p + n; q++)
        if (*q == '@') at = q;
    if (!at) return 0;
    const char *colon = memchr(p, ':', (size_t)(at - p));
    if (!colon) return 0;
    *skip_user = (size_t)(colon + 1 - p);
    return (size_t)(at - colon - 1);
}

/* Copies msg into out as one line, without the password: the password
 * field of any URL in it ("scheme://user:***@host"), and a quoted value that
 * is the password whole ("***", as libpq quotes a badly encoded one). Only
 * those fields: masking every occurrence of a short password in the words
 * around would mangle the message and tell the password by elimination. */
static void clean_msg(const pg_client *pc, const char *msg, char *out, size_t outlen) {
    size_t n = 0;
    const char *p = msg ? msg : "";
    while (*p && n + 1 < outlen) {
        int skipped = 0;
        if (!strncmp(p, "://", 3)) {
            size_t user = 0, pl = url_password_at(p + 3, &user);
            if (pl) {
                for (size_t i = 0; i < 3 + user && n + 1 < outlen; i++) out[n++] = *p++;
                for (const char *r = "***"; *r && n + 1 < outlen; r++) out[n++] = *r;
                p += pl;
                continue;
            }
        }
        for (int i = 0; i < 2 && *p == '"'; i++) {
            const char *s = pc ? pc->scrub[i] : NULL;
            size_t sl = s ? strlen(s) : 0;
            if (sl && !strncmp(p + 1, s, sl) && p[1 + sl] == '"') {
                for (const char *r = "\"***\""; *r && n + 1 < outlen; r++) out[n++] = *r;
                p += sl + 2;
                skipped = 1;
                break;
            }
        }
        if (skipped) continue;
        char ch = *p++;
        if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
        if (ch == ' ' && n > 0 && out[n - 1] == ' ') continue;
        out[n++] = ch;
    }
    while (n > 0 && out[n - 1] == ' ') n--;
    out[n] = '\0';
}

static int conn_error(const pg_client *pc, PGconn *conn, const char *what, dl_err *err) {
    char m[200];
    clean_msg(pc, conn ? PQerrorMessage(conn) : "out of memory", m, sizeof m);
    int code = DLOCK_EIO;
    if (strstr(m, "password authentication failed") || strstr(m, "no password supplied") ||
        strstr(m, "authentication failed") || strstr(m, "no pg_hba.conf entry"))
        code = DLOCK_EAUTH;
    return dl_seterr(err, code, "postgres: %s: %s", what, m[0] ? m : "failed");
}

static int pg_run_cx(const pg_client *pc, PGconn *conn, const char *sql, int nparams,
                     const char *const *vals, const int *lens, int64_t deadline,
                     dl_cancel *cx, int *canceled, PGresult **out, char state[6], int *broken,
                     dl_err *err);

static int pg_run(const pg_client *pc, PGconn *conn, const char *sql, int nparams,
                  const char *const *vals, const int *lens, int64_t deadline, PGresult **out,
                  char state[6], int *broken, dl_err *err) {
    return pg_run_cx(pc, conn, sql, nparams, vals, lens, deadline, NULL, NULL, out, state,
                     broken, err);
}

/* Opens a session: the client's parameters, notices silenced, the
 * statement_timeout set. On PostgreSQL 14 and later the server also checks
 * every PG_CONN_CHECK_MS that the client is still there while a statement
 * runs (client_connection_check_interval): a waiter that dies in
 * pg_advisory_lock otherwise stays queued on the server, to take the lock
 * at the next release (or never leave, while the holder holds). */
#define PG_CONN_CHECK_MS 1000

static int pg_connect(pg_client *pc, PGconn **out, dl_err *err) {
    *out = NULL;
    PGconn *conn = PQconnectdbParams(pc->kw, pc->val, 1);
    if (!conn) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    if (PQstatus(conn) != CONNECTION_OK) {
        int rc = conn_error(pc, conn, "connect", err);
        PQfinish(conn);
        return rc;
    }
    PQsetNoticeProcessor(conn, no_notices, NULL);
    char sql[160];
    int n = snprintf(sql, sizeof sql, "SET statement_timeout = %lld; SET lock_timeout = 0",
                     (long long)pc->cmd_timeout_ms);
    if (PQserverVersion(conn) >= 140000)
        snprintf(sql + n, sizeof sql - (size_t)n, "; SET client_connection_check_interval = %d",
                 PG_CONN_CHECK_MS);
    PGresult *r = NULL;
    char st[6];
    int broken = 0;
    int rc = pg_run(pc, conn, sql, 0, NULL, NULL, dl_deadline(pc->cmd_timeout_ms), &r, st,
                    &broken, err);
    PQclear(r);
    if (rc) {
        PQfinish(conn);
        return rc;
    }
    *out = conn;
    return DLOCK_OK;
}

static void close_conn(PGconn **conn) {
    if (*conn) PQfinish(*conn);
    *conn = NULL;
}

/* Runs sql (several statements when nparams is 0) until deadline (monotonic
 * ms). *out: the last result with rows (may be NULL). A server error: its
 * SQLSTATE in state and DLOCK_ESERVER (statement timeout: DLOCK_EIO). A
 * client-side timeout or broken connection: DLOCK_EIO and *broken = 1 (the
 * caller closes the connection). cx (may be NULL; between dl_cancel_begin
 * and dl_cancel_end): on a cancel of that wait, *canceled = 1 and the server
 * is asked to cancel the statement (PQcancel: SQLSTATE 57014 then, or the
 * statement's own answer if it was done first), and the answer is waited for
 * at most the command timeout more, asking again meanwhile
 * (dl_cancel_poll_ask). When the request cannot be sent:
 * DLOCK_ECANCELED and *broken = 1 (closing the connection ends the session,
 * once the server notices). */
static int pg_run_cx(const pg_client *pc, PGconn *conn, const char *sql, int nparams,
                     const char *const *vals, const int *lens, int64_t deadline,
                     dl_cancel *cx, int *canceled, PGresult **out, char state[6], int *broken,
                     dl_err *err) {
    *out = NULL;
    *broken = 0;
    state[0] = '\0';
    int fmts[2] = {1, 1};
    int sent = nparams ? PQsendQueryParams(conn, sql, nparams, NULL, vals, lens, fmts, 0)
                       : PQsendQuery(conn, sql);
    if (!sent) {
        *broken = 1;
        return conn_error(pc, conn, "send", err);
    }
    int rc = DLOCK_OK;
    PGresult *keep = NULL;
    int64_t asked_at = 0; /* when the latest cancel request went */
    for (;;) {
        while (PQisBusy(conn)) {
            int64_t left = deadline == DL_INF_DEADLINE ? -1 : deadline - dl_now_ms();
            if (deadline != DL_INF_DEADLINE && left <= 0) {
                *broken = 1;
                PQclear(keep);
                return dl_seterr(err, DLOCK_EIO, "postgres: no answer within the command "
                                                 "timeout; connection closed");
            }
            struct pollfd pfd[2] = {{.fd = PQsocket(conn), .events = POLLIN}};
            if (pfd[0].fd < 0) {
                *broken = 1;
                PQclear(keep);
                return dl_seterr(err, DLOCK_EIO, "postgres: connection lost");
            }
            int ms = left < 0 || left > INT_MAX ? (left < 0 ? -1 : INT_MAX) : (int)left;
            int pr = dl_cancel_poll_ask(cx, &asked_at, pfd, 1, ms);
            if (pr == -2) {
                if (!asked_at) {
                    *canceled = 1;
                    int64_t soon = dl_deadline(pc->cmd_timeout_ms);
                    if (deadline == DL_INF_DEADLINE || soon < deadline) deadline = soon;
                }
                PGcancel *pgc = PQgetCancel(conn);
                char ebuf[160];
                int asked = pgc && PQcancel(pgc, ebuf, sizeof ebuf);
                PQfreeCancel(pgc);
                if (!asked) {
                    *broken = 1;
                    PQclear(keep);
                    return dl_seterr(err, DLOCK_ECANCELED, "postgres: the wait was cancelled");
                }
                asked_at = dl_now_ms();
                continue;
            }
            if (pr < 0) continue; /* EINTR */
            if (pr > 0 && !PQconsumeInput(conn)) {
                *broken = 1;
                PQclear(keep);
                return conn_error(pc, conn, "connection lost", err);
            }
        }
        PGresult *r = PQgetResult(conn);
        if (!r) break;
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE || st == PGRES_NONFATAL_ERROR) {
            if (!rc) {
                const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
                snprintf(state, 6, "%s", s ? s : "");
                const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
                char cm[160];
                clean_msg(pc, m ? m : PQerrorMessage(conn), cm, sizeof cm);
                if (!s) {
                    *broken = PQstatus(conn) != CONNECTION_OK;
                    rc = dl_seterr(err, DLOCK_EIO, "postgres: %s", cm[0] ? cm : "connection lost");
                } else if (!strcmp(state, "57014")) {
                    rc = dl_seterr(err, DLOCK_EIO, "postgres: %s", cm);
                } else if (!strncmp(state, "57P", 3) || !strncmp(state, "08", 2)) {
                    *broken = 1;
                    rc = dl_seterr(err, DLOCK_EIO, "postgres: %s", cm);
                } else if (!strncmp(state, "28", 2) || !strcmp(state, "42501")) {
                    rc = dl_seterr(err, DLOCK_EAUTH, "postgres: %s", cm);
                } else {
                    rc = dl_seterr(err, DLOCK_ESERVER, "postgres: %s (SQLSTATE %s)", cm, state);
                }
            }
            PQclear(r);
        } else if (st == PGRES_TUPLES_OK) {
            PQclear(keep);
            keep = r;
        } else {
            PQclear(r);
        }
        if (PQstatus(conn) != CONNECTION_OK) {
            *broken = 1;
            if (!rc) rc = dl_seterr(err, DLOCK_EIO, "postgres: connection lost");
            break;
        }
    }
    if (rc) {
        PQclear(keep);
        return rc;
    }
    *out = keep;
    return DLOCK_OK;
}

static int64_t cmd_deadline(const pg_client *pc) { return dl_deadline(pc->cmd_timeout_ms); }

/* The single value of a one-row result, or NULL. */
static const char *one_value(const PGresult *r) {
    if (!r || PQntuples(r) < 1 || PQnfields(r) < 1 || PQgetisnull(r, 0, 0)) return NULL;
    return PQgetvalue(r, 0, 0);
}

/* ---- the key ---- */

static long long name_key(const char *name, size_t len) {
    unsigned char d[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)name, len, d);
    uint64_t u = 0;
    for (int i = 0; i < 8; i++) u = (u << 8) | d[i];
    return (long long)u; /* two's complement: the signed bigint */
}

/* "classid = H AND objid = L AND objsubid = 1" of a bigint advisory key in pg_locks */
static void key_where(long long key, char *buf, size_t len) {
    uint64_t u = (uint64_t)key;
    snprintf(buf, len,
             "locktype = 'advisory' AND classid = %lu::oid AND objid = %lu::oid AND "
             "objsubid = 1",
             (unsigned long)(u >> 32), (unsigned long)(u & 0xffffffffu));
}

/* ---- client ---- */

static char *own(pg_client *pc, const char *s) {
    if (pc->nstrs >= sizeof pc->strs / sizeof pc->strs[0]) return NULL;
    char *d = strdup(s);
    if (d) pc->strs[pc->nstrs++] = d;
    return d;
}

static void pg_close(dlock_client *c) {
    pg_client *pc = c->backend_client;
    if (!pc) return;
    close_conn(&pc->conn);
    pthread_mutex_destroy(&pc->mu);
    for (size_t i = 0; i < pc->nstrs; i++) {
        size_t n = strlen(pc->strs[i]);
        memset(pc->strs[i], 0, n); /* the URL and password */
        free(pc->strs[i]);
    }
    for (int i = 0; i < 2; i++) free(pc->scrub[i]);
    free(pc->kw);
    free(pc->val);
    free(pc);
    c->backend_client = NULL;
}

/* The password part of a URI's userinfo ("user:password@"), as written. */
static char *url_userinfo(const char *url) {
    const char *p = strstr(url, "://");
    if (!p) return NULL;
    p += 3;
    size_t hostpart = strcspn(p, "/?");
    const char *at = NULL;
    for (const char *q = p; q < p + hostpart; q++)
        if (*q == '@') at = q;
    if (!at) return NULL;
    const char *colon = memchr(p, ':', (size_t)(at - p));
    if (!colon || colon + 1 == at) return NULL;
    colon++;
    char *s = malloc((size_t)(at - colon) + 1);
    if (!s) return NULL;
    memcpy(s, colon, (size_t)(at - colon));
    s[at - colon] = '\0';
    return s;
}

static int pg_open(dlock_client *c, const char *url, const dlock_options *o, dl_err *err) {
    pg_client *pc = calloc(1, sizeof *pc);
    if (!pc) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&pc->mu, NULL);
    c->backend_client = pc;
    pc->cmd_timeout_ms = c->command_timeout_ms;
    pc->scrub[0] = url_userinfo(url);

    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(url, &perr);
    if (!opts) {
        char m[200];
        clean_msg(pc, perr ? perr : "out of memory", m, sizeof m);
        PQfreemem(perr);
        return dl_seterr(err, perr ? DLOCK_EINVAL : DLOCK_ENOMEM, "bad postgres URL: %s", m);
    }
    int url_has_password = 0;
    for (PQconninfoOption *op = opts; op->keyword; op++) {
        if (!strcmp(op->keyword, "password") && op->val && *op->val) {
            url_has_password = 1;
            pc->scrub[1] = strdup(op->val);
        }
    }
    PQconninfoFree(opts);
    const char *password = o->password;
    if (!password && !url_has_password) {
        const char *env = getenv("DLOCK_PASSWORD");
        if (env && *env) password = env;
    }
    if (password && *password) {
        free(pc->scrub[1]);
        pc->scrub[1] = strdup(password);
    }

    pc->kw = calloc(12, sizeof *pc->kw);
    pc->val = calloc(12, sizeof *pc->val);
    if (!pc->kw || !pc->val) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    size_t n = 0;
    char num[24];
    int64_t ct = c->connect_timeout_ms;
    snprintf(num, sizeof num, "%lld", (long long)((ct + 999) / 1000));
    const char *pairs[][2] = {
        {"connect_timeout", num},   {"fallback_application_name", "dlock"},
        {"keepalives", "1"},        {"keepalives_idle", "10"},
        {"keepalives_interval", "5"}, {"keepalives_count", "3"},
        {"dbname", url},            /* expanded; what follows overrides it */
        {"user", o->username},      {"password", password},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        if (!pairs[i][1]) continue;
        if (!strcmp(pairs[i][0], "password") && !*pairs[i][1]) continue;
        pc->kw[n] = pairs[i][0];
        if (!(pc->val[n] = own(pc, pairs[i][1])))
            return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        n++;
    }
    pc->kw[n] = NULL;
    pc->val[n] = NULL;

    int rc = pg_connect(pc, &pc->conn, err);
    if (rc) return rc;
    /* the fence table; concurrent CREATEs may collide (23505 / 42P07): fine */
    PGresult *r = NULL;
    char st[6];
    int broken = 0;
    rc = pg_run(pc, pc->conn, "SELECT to_regclass('dlock_fence') IS NOT NULL", 0, NULL, NULL,
                cmd_deadline(pc), &r, st, &broken, err);
    if (rc) return rc;
    const char *v = one_value(r);
    int exists = v && v[0] == 't';
    PQclear(r);
    if (!exists) {
        dl_err e2 = {0};
        rc = pg_run(pc, pc->conn,
                    "CREATE TABLE IF NOT EXISTS dlock_fence (name bytea PRIMARY KEY, "
                    "n bigint NOT NULL)",
                    0, NULL, NULL, cmd_deadline(pc), &r, st, &broken, &e2);
        PQclear(r);
        if (rc && strcmp(st, "23505") && strcmp(st, "42P07")) {
            *err = e2;
            return rc;
        }
    }
    return DLOCK_OK;
}

/* Runs a query on the client's own session, reconnecting once if it broke. */
static int client_query(dlock_client *c, const char *sql, int nparams, const char *const *vals,
                        const int *lens, PGresult **out, dl_err *err) {
    pg_client *pc = c->backend_client;
    pthread_mutex_lock(&pc->mu);
    int rc = DLOCK_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!pc->conn || PQstatus(pc->conn) != CONNECTION_OK) {
            close_conn(&pc->conn);
            rc = pg_connect(pc, &pc->conn, err);
            if (rc) break;
        }
        char st[6];
        int broken = 0;
        rc = pg_run(pc, pc->conn, sql, nparams, vals, lens, cmd_deadline(pc), out, st, &broken,
                    err);
        if (broken) close_conn(&pc->conn);
        if (!rc || !broken) break;
    }
    pthread_mutex_unlock(&pc->mu);
    return rc;
}

static int pg_ping(dlock_client *c, int64_t *rtt_us, dl_err *err) {
    int64_t t0 = dl_now_us();
    PGresult *r = NULL;
    int rc = client_query(c, "SELECT 1", 0, NULL, NULL, &r, err);
    PQclear(r);
    if (!rc && rtt_us) *rtt_us = dl_now_us() - t0;
    return rc;
}

/* ---- lock handles ---- */

static int pg_lock_init(dlock_lock *l, dl_err *err) {
    pg_lock *pl = calloc(1, sizeof *pl);
    if (!pl) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    l->h.backend_state = pl;
    pl->key = name_key(l->h.name, l->h.name_len);
    return pg_connect(l->h.c->backend_client, &pl->conn, err);
}

static void pg_lock_destroy(dlock_lock *l) {
    pg_lock *pl = l->h.backend_state;
    if (!pl) return;
    close_conn(&pl->conn); /* ends the session: whatever it held is released */
    free(pl);
    l->h.backend_state = NULL;
}

static const char *shared_sfx(const dlock_lock *l) {
    return l->kind == DLOCK_KIND_READ ? "_shared" : "";
}

/* The next fencing token of the name, on the handle's session. */
static int next_fence(dlock_lock *l, uint64_t *fence, dl_err *err) {
    pg_client *pc = l->h.c->backend_client;
    pg_lock *pl = l->h.backend_state;
    const char *vals[1] = {l->h.name};
    int lens[1] = {(int)l->h.name_len};
    PGresult *r = NULL;
    char st[6];
    int broken = 0;
    int rc = pg_run(pc, pl->conn,
                    "INSERT INTO dlock_fence (name, n) VALUES ($1, 1) ON CONFLICT (name) DO "
                    "UPDATE SET n = dlock_fence.n + 1 RETURNING n",
                    1, vals, lens, cmd_deadline(pc), &r, st, &broken, err);
    if (broken) close_conn(&pl->conn);
    if (rc) return rc;
    const char *v = one_value(r);
    char *end = NULL;
    uint64_t u = v ? strtoull(v, &end, 10) : 0;
    int bad = !v || !*v || *end || u == 0;
    PQclear(r);
    if (bad) return dl_seterr(err, DLOCK_EPROTO, "postgres: fence: unexpected answer");
    *fence = u;
    return DLOCK_OK;
}

/* Gives back one hold of l's key on its session, best effort (the session
 * is closed if that fails). */
static void give_back(dlock_lock *l) {
    pg_client *pc = l->h.c->backend_client;
    pg_lock *pl = l->h.backend_state;
    if (!pl->conn) return;
    char sql[96], st[6];
    snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock%s(%lld)", shared_sfx(l), pl->key);
    PGresult *r = NULL;
    int broken = 0;
    dl_err e2 = {0};
    int rc = pg_run(pc, pl->conn, sql, 0, NULL, NULL, cmd_deadline(pc), &r, st, &broken, &e2);
    PQclear(r);
    if (rc) close_conn(&pl->conn);
}

static int pg_acquire(dlock_lock *l, int64_t wait_ms, int64_t lease_ms, dl_outcome *t,
                      dl_err *err) {
    if (lease_ms != DLOCK_WATCHDOG)
        return dl_seterr(err, DLOCK_ENOTSUP,
                         "leases (lease_ms > 0) are not supported by the postgres backend: its "
                         "locks are held while the session lives (pass DLOCK_WATCHDOG)");
    pg_client *pc = l->h.c->backend_client;
    pg_lock *pl = l->h.backend_state;
    char nm[80];
    dl_name_msg(l->h.name, l->h.name_len, nm, sizeof nm);
    if (!pl->conn || PQstatus(pl->conn) != CONNECTION_OK) {
        if (l->holds > 0)
            return dl_seterr(err, DLOCK_ELOST, "lock '%s': the session holding it was lost", nm);
        close_conn(&pl->conn);
        int rc = pg_connect(pc, &pl->conn, err);
        if (rc) return rc;
    }
    char sql[320];
    int64_t deadline;
    if (wait_ms == 0) {
        snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock%s(%lld)", shared_sfx(l), pl->key);
        deadline = cmd_deadline(pc);
    } else {
        long long lt = wait_ms == DLOCK_WAIT_FOREVER ? 0 : wait_ms > INT_MAX ? INT_MAX : wait_ms;
        /* one implicit transaction: on lock_timeout the SETs roll back too */
        snprintf(sql, sizeof sql,
                 "SET statement_timeout = 0; SET lock_timeout = %lld; "
                 "SELECT pg_advisory_lock%s(%lld) IS NULL; "
                 "SET lock_timeout = 0; SET statement_timeout = %lld",
                 lt, shared_sfx(l), pl->key, (long long)pc->cmd_timeout_ms);
        deadline = wait_ms == DLOCK_WAIT_FOREVER ? DL_INF_DEADLINE
                                                 : dl_deadline(wait_ms + pc->cmd_timeout_ms);
    }
    PGresult *r = NULL;
    char st[6];
    int broken = 0;
    /* a wait can be cancelled (dlock_lock_cancel); a re-entry does not wait */
    dl_cancel *cx = wait_ms != 0 && l->holds == 0 ? &l->h.cancel : NULL;
    int canceled = 0;
    if (cx) dl_cancel_begin(cx);
    int rc = pg_run_cx(pc, pl->conn, sql, 0, NULL, NULL, deadline, cx, &canceled, &r, st,
                       &broken, err);
    if (cx) dl_cancel_end(cx);
    if (broken) close_conn(&pl->conn);
    /* cancelled: the statement ended (57014), or the request could not be
     * sent (the connection is closed), or no answer came (the same); a lock
     * taken first is kept (OK) */
    if (canceled && rc) {
        /* the cancel may have hit the SETs after pg_advisory_lock returned:
         * a session lock outlives the rolled-back transaction (the session
         * held none before: no re-entry waits) */
        give_back(l);
        return dl_cancel_err(l, err);
    }
    if (rc) {
        if (!strcmp(st, "55P03"))
            return dl_seterr(err, DLOCK_ETIMEDOUT, "lock '%s' not acquired within %lld ms", nm,
                             (long long)wait_ms);
        return rc;
    }
    const char *v = one_value(r);
    int got = v && v[0] == (wait_ms == 0 ? 't' : 'f');
    PQclear(r);
    if (!got) {
        if (wait_ms == 0)
            return dl_seterr(err, DLOCK_EBUSY, "lock '%s' is held by another session", nm);
        return dl_seterr(err, DLOCK_EPROTO, "postgres: lock '%s': unexpected answer", nm);
    }
    uint64_t fence = 0;
    rc = next_fence(l, &fence, err);
    if (rc) {
        give_back(l); /* the hold just taken (or the whole session) */
        return rc;
    }
    t->acquired = 1;
    t->fence = fence;
    t->count = l->holds + 1;
    l->expires_at = INT64_MAX;
    return DLOCK_OK;
}

static int pg_release(dlock_lock *l, long long *res, dl_err *err) {
    pg_client *pc = l->h.c->backend_client;
    pg_lock *pl = l->h.backend_state;
    (void)err;
    if (!pl->conn || PQstatus(pl->conn) != CONNECTION_OK) {
        close_conn(&pl->conn);
        *res = -1; /* the session is gone, and its locks with it */
        return DLOCK_OK;
    }
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock%s(%lld)", shared_sfx(l), pl->key);
    PGresult *r = NULL;
    char st[6];
    int broken = 0;
    dl_err e2 = {0};
    int rc = pg_run(pc, pl->conn, sql, 0, NULL, NULL, cmd_deadline(pc), &r, st, &broken, &e2);
    if (rc) {
        /* no answer: end the session so that the lock surely goes */
        close_conn(&pl->conn);
        *res = -1;
        return DLOCK_OK;
    }
    const char *v = one_value(r);
    int ok = v && v[0] == 't';
    PQclear(r);
    *res = !ok ? -1 : l->holds > 1 ? 0 : 1;
    return DLOCK_OK;
}

static int pg_check(dlock_lock *l, int *held, int64_t *count, dl_err *err) {
    pg_client *pc = l->h.c->backend_client;
    pg_lock *pl = l->h.backend_state;
    *held = 0;
    *count = 0;
    if (!pl->conn || PQstatus(pl->conn) != CONNECTION_OK) {
        close_conn(&pl->conn);
        return DLOCK_OK;
    }
    char where[160], sql[320];
    key_where(pl->key, where, sizeof where);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_locks WHERE %s AND pid = pg_backend_pid() AND granted "
             "AND mode = '%s'",
             where, l->kind == DLOCK_KIND_READ ? "ShareLock" : "ExclusiveLock");
    PGresult *r = NULL;
    char st[6];
    int broken = 0;
    int rc = pg_run(pc, pl->conn, sql, 0, NULL, NULL, cmd_deadline(pc), &r, st, &broken, err);
    if (broken) {
        close_conn(&pl->conn);
        PQclear(r);
        return DLOCK_OK; /* session gone: not held */
    }
    if (rc) return rc;
    const char *v = one_value(r);
    *held = v && atoll(v) > 0;
    PQclear(r);
    if (*held) *count = l->holds;
    return DLOCK_OK;
}

/* ---- queries by name ---- */

static int pg_inspect(dlock_client *c, const char *name, size_t len, dlock_info *info,
                      dl_err *err) {
    char where[160], sql[640];
    key_where(name_key(name, len), where, sizeof where);
    snprintf(sql, sizeof sql,
             "SELECT (SELECT count(*) FROM pg_locks WHERE %s AND granted AND mode = "
             "'ShareLock')::text, (SELECT count(*) FROM pg_locks WHERE %s AND granted AND "
             "mode = 'ExclusiveLock')::text, (SELECT n FROM dlock_fence WHERE name = $1)::text",
             where, where);
    const char *vals[1] = {name};
    int lens[1] = {(int)len};
    PGresult *r = NULL;
    int rc = client_query(c, sql, 1, vals, lens, &r, err);
    if (rc) return rc;
    memset(info, 0, sizeof *info);
    if (!r || PQntuples(r) != 1 || PQnfields(r) != 3) {
        PQclear(r);
        return dl_seterr(err, DLOCK_EPROTO, "postgres: inspect: unexpected answer");
    }
    long long readers = atoll(PQgetvalue(r, 0, 0));
    long long writers = atoll(PQgetvalue(r, 0, 1));
    info->fence = PQgetisnull(r, 0, 2) ? 0 : strtoull(PQgetvalue(r, 0, 2), NULL, 10);
    PQclear(r);
    info->holders = (int)(readers + writers);
    info->exists = info->holders > 0;
    info->kind = info->exists ? DLOCK_KIND_PLAIN : 0;
    info->ttl_ms = info->exists ? -1 : -2;
    info->hold_count = info->exists ? 1 : 0;
    info->readers = readers;
    info->writer = writers > 0;
    return DLOCK_OK;
}

static int pg_fence_current(dlock_client *c, const char *name, size_t len, uint64_t *fence,
                            dl_err *err) {
    const char *vals[1] = {name};
    int lens[1] = {(int)len};
    PGresult *r = NULL;
    int rc = client_query(c, "SELECT n::text FROM dlock_fence WHERE name = $1", 1, vals, lens, &r,
                          err);
    if (rc) return rc;
    const char *v = one_value(r);
    *fence = v ? strtoull(v, NULL, 10) : 0;
    PQclear(r);
    return DLOCK_OK;
}

/* dlock_server_fact: "version" (server_version), "session" (what holds a
 * lock), and any run-time setting by name through current_setting() (e.g.
 * "idle_session_timeout", "tcp_keepalives_idle", "max_connections"). */
static int pg_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                          dl_err *err) {
    if (!strcmp(what, "session")) {
        snprintf(buf, buflen, "the connection (session-level advisory locks)");
        return DLOCK_OK;
    }
    const char *name = !strcmp(what, "version") ? "server_version" : what;
    const char *vals[1] = {name};
    int lens[1] = {(int)strlen(name)};
    PGresult *r = NULL;
    int rc = client_query(c, "SELECT current_setting($1, true)", 1, vals, lens, &r, err);
    if (rc) return rc;
    const char *v = one_value(r);
    if (v) snprintf(buf, buflen, "%s", v);
    else rc = dl_seterr(err, DLOCK_ESERVER, "postgres: no such setting '%.60s'", what);
    PQclear(r);
    return rc;
}

static const char *const pg_schemes[] = {"postgres://", "postgresql://", NULL};

const dl_backend dl_backend_postgres = {
    .name = "postgres",
    .schemes = pg_schemes,
    .kinds = (1u << DLOCK_KIND_PLAIN) | (1u << DLOCK_KIND_REENTRANT) | (1u << DLOCK_KIND_READ) |
             (1u << DLOCK_KIND_WRITE),
    .caps = DL_CAP_CANCEL,
    .open = pg_open,
    .close = pg_close,
    .ping = pg_ping,
    .lock_init = pg_lock_init,
    .lock_destroy = pg_lock_destroy,
    .acquire = pg_acquire,
    .release = pg_release,
    .extend = NULL,
    .check = pg_check,
    .inspect = pg_inspect,
    .fence_current = pg_fence_current,
    .force_unlock = NULL,
    .server_fact = pg_server_fact,
};
