/* Redis Sentinel: the client's node is "whatever master the sentinels name".
 * The address is asked for when the client opens, again at most once a
 * second while the client is used (so a failover is followed even while the
 * old master still answers), and at once after a connection to the master
 * fails. A new connection whose server reports itself a replica is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "topology.h"

#define DL_SENTINEL_REFRESH_MS 1000
#define DL_SENTINEL_TIMEOUT_MS 500

struct dl_sentinel {
    dl_endpoint *eps;          /* the sentinels */
    size_t n;
    size_t good;               /* the sentinel that answered last */
    char *master_name;
    pthread_mutex_t mu;        /* one refresh at a time */
    int64_t last_ms;           /* monotonic ms of the last answer, 0 never */
};

int dl_sentinel_new(dl_target *t, dl_sentinel **out, dl_err *err) {
    dl_sentinel *s = calloc(1, sizeof *s);
    if (!s) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    s->eps = t->eps;
    s->n = t->neps;
    s->master_name = t->master_name;
    t->eps = NULL;
    t->neps = 0;
    t->master_name = NULL;
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return DLOCK_OK;
}

void dl_sentinel_free(dl_sentinel *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) dl_endpoint_clear(&s->eps[i]);
    free(s->eps);
    free(s->master_name);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int dl_sentinel_answer(const char *master_name, const redisReply *r, char **host, int *port,
                       dl_err *err) {
    long long p = 0;
    if (r->type == REDIS_REPLY_ERROR) return dl_reply_error(r, "SENTINEL", err);
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || dl_reply_int(r->element[1], &p) || p <= 0 ||
        p > 65535)
        return dl_seterr(err, DLOCK_EIO, "sentinel knows no master named '%.60s'", master_name);
    if (!(*host = strdup(r->element[0]->str)))
        return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    *port = (int)p;
    return DLOCK_OK;
}

/* Asks one sentinel; host (malloc'd) and port on success. */
static int ask(dl_sentinel *s, size_t i, char **host, int *port, dl_err *err) {
    dl_conn *conn = NULL;
    int64_t deadline = dl_deadline(DL_SENTINEL_TIMEOUT_MS);
    int rc = dl_conn_open(&s->eps[i], deadline, &conn, err);
    if (rc) return rc;
    const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", s->master_name};
    size_t lens[3] = {8, 23, strlen(s->master_name)};
    redisReply *r = NULL;
    rc = dl_conn_command(conn, deadline, 3, argv, lens, &r, err);
    dl_conn_close(conn);
    if (rc) return rc;
    rc = dl_sentinel_answer(s->master_name, r, host, port, err);
    freeReplyObject(r);
    return rc;
}

int dl_sentinel_refresh(dl_node *n, int force, dl_err *err) {
    dl_sentinel *s = n->sentinel;
    if (pthread_mutex_trylock(&s->mu) != 0) {
        if (!force) return DLOCK_OK; /* another thread is asking right now */
        pthread_mutex_lock(&s->mu);
    }
    int64_t now = dl_now_ms();
    if (!force && s->last_ms && now - s->last_ms < DL_SENTINEL_REFRESH_MS) {
        pthread_mutex_unlock(&s->mu);
        return DLOCK_OK;
    }
    char *host = NULL;
    int port = 0, rc = DLOCK_EIO;
    dl_err last = {0};
    for (size_t k = 0; k < s->n; k++) {
        size_t i = (s->good + k) % s->n;
        rc = ask(s, i, &host, &port, &last);
        if (!rc) {
            s->good = i;
            break;
        }
    }
    if (rc) {
        pthread_mutex_unlock(&s->mu);
        return dl_seterr(err, rc == DLOCK_ENOMEM ? rc : DLOCK_EIO,
                         "no sentinel could name master '%.60s' (%s)", s->master_name, last.msg);
    }
    s->last_ms = dl_now_ms();
    dl_conn *stale = NULL;
    const dl_kept_ops *kept = NULL;
    pthread_mutex_lock(&n->mu);
    if (!n->ep.host || strcmp(n->ep.host, host) != 0 || n->ep.port != port) {
        free(n->ep.host);
        n->ep.host = host;
        host = NULL;
        n->ep.port = port;
        /* connections to the old master must not be used again: the idle
         * ones are closed here (the lingering subscriptions too), those in
         * use when they come back */
        n->gen++;
        kept = n->kept_ops;
        stale = n->idle;
        n->idle = NULL;
        n->nidle = 0;
        n->backoff_ms = 0;
        n->next_attempt_ms = 0;
    }
    pthread_mutex_unlock(&n->mu);
    pthread_mutex_unlock(&s->mu);
    free(host);
    if (kept) kept->drop(n);
    while (stale) {
        dl_conn *next = stale->next;
        dl_conn_close(stale);
        stale = next;
    }
    return DLOCK_OK;
}

int dl_sentinel_role(const redisReply *r, dl_err *err) {
    if (r->type == REDIS_REPLY_ERROR) return dl_reply_error(r, "ROLE", err);
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return dl_seterr(err, DLOCK_EPROTO, "ROLE: unexpected reply");
    if (strcmp(r->element[0]->str, "master") != 0)
        return dl_seterr(err, DLOCK_EIO,
                         "the server the sentinels named reports itself a %.20s, not a master "
                         "(failover in progress?)",
                         r->element[0]->str);
    return DLOCK_OK;
}

int dl_sentinel_check_role(dl_conn *conn, int64_t deadline, dl_err *err) {
    const char *argv[1] = {"ROLE"};
    size_t lens[1] = {4};
    redisReply *r = NULL;
    int rc = dl_conn_command(conn, deadline, 1, argv, lens, &r, err);
    if (rc) return rc;
    rc = dl_sentinel_role(r, err);
    freeReplyObject(r);
    return rc;
}
