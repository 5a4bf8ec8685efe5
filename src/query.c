/* Queries by lock name: existence, TTL, fence counter, inspection, listing,
 * force unlock, and server facts for `dlock doctor`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kinds.h"

/* KEYS: lock, channel, plain waiters. ARGV: plain waiter channel prefix.
 * -> 1 deleted (waiters told: the channel's, and one plain waiter) | 0 was free */
dl_script dl_script_force_unlock = DL_SCRIPT("force_unlock",
    "if redis.call('del', KEYS[1]) == 1 then redis.call('publish', KEYS[2], '0') "
    DL_LUA_WAKE_ONE("KEYS[3]", "ARGV[1]") "return 1 end return 0");

/* Runs one command on `name` (and optional extra argument) and returns the reply. */
static int name_cmd(dlock_client *c, const char *cmd, const char *name, size_t name_len,
                    redisReply **r, dl_err *err) {
    int rc = dl_check_name(name, &name_len, err);
    if (rc) return rc;
    const char *argv[2] = {cmd, name};
    size_t lens[2] = {strlen(cmd), name_len};
    rc = dl_client_command(c, 2, argv, lens, r, err);
    if (!rc && (*r)->type == REDIS_REPLY_ERROR) {
        rc = dl_reply_error(*r, cmd, err);
        freeReplyObject(*r);
        *r = NULL;
    }
    return rc;
}

/* A query by name through the client's backend: checks the name and the
 * client, records the outcome on the client. op: 'l' is_locked, 't' TTL,
 * 'f' fence, 'i' inspect, 'u' force unlock. */
static int by_name(dlock_client *c, const char *what, int op, const char *name,
                   size_t name_len, void *out) {
    dl_err err = {0};
    const dl_backend *b = c->backend;
    int rc = dl_check_name(name, &name_len, &err);
    if (!rc && c->unusable) rc = dl_seterr(&err, DLOCK_EINVAL, "client failed to open; free it");
    if (!rc) rc = dl_check_cluster_name(c, name, name_len, &err);
    if (rc) return dl_client_fail(c, &err);
    dlock_info info;
    switch (op) {
    case 'l':
    case 't':
        if (op == 'l' && b->is_locked) {
            rc = b->is_locked(c, name, name_len, out, &err);
        } else if (op == 't' && b->remaining_ttl) {
            rc = b->remaining_ttl(c, name, name_len, out, &err);
        } else { /* from inspect */
            if (!b->inspect) return dl_backend_unsupported(c, what);
            rc = b->inspect(c, name, name_len, &info, &err);
            if (!rc && op == 'l') *(int *)out = info.exists;
            if (!rc && op == 't') *(int64_t *)out = info.ttl_ms;
        }
        break;
    case 'f':
        if (!b->fence_current) return dl_backend_unsupported(c, what);
        rc = b->fence_current(c, name, name_len, out, &err);
        break;
    case 'i':
        if (!b->inspect) return dl_backend_unsupported(c, what);
        rc = b->inspect(c, name, name_len, out, &err);
        break;
    default:
        if (!b->force_unlock) return dl_backend_unsupported(c, what);
        rc = b->force_unlock(c, name, name_len, out, &err);
        break;
    }
    if (rc) return dl_client_fail(c, &err);
    dl_client_ok(c);
    return DLOCK_OK;
}

int dlock_is_locked(dlock_client *c, const char *name, size_t name_len, int *locked) {
    if (!c) return DLOCK_EINVAL;
    if (!locked) return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "locked is NULL"});
    return by_name(c, "is_locked", 'l', name, name_len, locked);
}

int dlock_remaining_ttl(dlock_client *c, const char *name, size_t name_len, int64_t *ttl_ms) {
    if (!c) return DLOCK_EINVAL;
    if (!ttl_ms) return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "ttl_ms is NULL"});
    return by_name(c, "remaining_ttl", 't', name, name_len, ttl_ms);
}

int dlock_fence_current(dlock_client *c, const char *name, size_t name_len, uint64_t *fence) {
    if (!c) return DLOCK_EINVAL;
    if (!fence) return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "fence is NULL"});
    return by_name(c, "fence_current", 'f', name, name_len, fence);
}

int dlock_inspect(dlock_client *c, const char *name, size_t name_len, dlock_info *info) {
    if (!c) return DLOCK_EINVAL;
    if (!info) return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "info is NULL"});
    return by_name(c, "inspect", 'i', name, name_len, info);
}

int dlock_force_unlock(dlock_client *c, const char *name, size_t name_len, int *existed) {
    if (!c) return DLOCK_EINVAL;
    int e = 0;
    int rc = by_name(c, "force_unlock", 'u', name, name_len, &e);
    if (!rc && existed) *existed = e;
    return rc;
}

/* ---- the Redis backend's queries ---- */

int dl_redis_is_locked(dlock_client *c, const char *name, size_t name_len, int *locked,
                       dl_err *err) {
    redisReply *r = NULL;
    int rc = name_cmd(c, "EXISTS", name, name_len, &r, err);
    if (rc) return rc;
    *locked = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    freeReplyObject(r);
    return DLOCK_OK;
}

int dl_redis_remaining_ttl(dlock_client *c, const char *name, size_t name_len, int64_t *ttl_ms,
                           dl_err *err) {
    redisReply *r = NULL;
    int rc = name_cmd(c, "PTTL", name, name_len, &r, err);
    if (rc) return rc;
    long long v = -2;
    if (dl_reply_int(r, &v)) rc = dl_seterr(err, DLOCK_EPROTO, "PTTL: bad reply");
    freeReplyObject(r);
    if (!rc) *ttl_ms = v;
    return rc;
}

int dl_redis_fence_current(dlock_client *c, const char *name, size_t name_len, uint64_t *fence,
                           dl_err *err) {
    size_t kl;
    char *key = dl_derive_key("redisson_lock_token:", name, name_len, "", &kl);
    if (!key) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    /* the derived key may be longer than a name may be: no name check here */
    const char *argv[2] = {"GET", key};
    size_t lens[2] = {3, kl};
    redisReply *r = NULL;
    int rc = dl_client_command(c, 2, argv, lens, &r, err);
    free(key);
    if (rc) return rc;
    long long v = 0;
    if (r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "GET", err);
    else if (r->type != REDIS_REPLY_NIL && (dl_reply_int(r, &v) || v < 0))
        rc = dl_seterr(err, DLOCK_EPROTO, "fence counter is not a number");
    freeReplyObject(r);
    if (!rc) *fence = (uint64_t)v;
    return rc;
}

/* ---- recognising the layouts (docs/cli.md "What list and force-unlock
 * recognise"): a key of any other shape is not a lock, and the admin
 * commands leave it alone ---- */

static size_t hex_run(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && ((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') ||
                     (s[i] >= 'A' && s[i] <= 'F')))
        i++;
    return i;
}

/* Length of the UUID at the start of s: 36 (8-4-4-4-12 hex with dashes), 32
 * (hex without dashes), or 0 when s does not start with one. */
static size_t uuid_prefix(const char *s, size_t n) {
    static const size_t groups[5] = {8, 4, 4, 4, 12};
    size_t at = 0;
    for (int g = 0; g < 5; g++) {
        if (g && (at >= n || s[at] != '-')) break;
        if (g) at++;
        if (hex_run(s + at, n - at) < groups[g]) break;
        at += groups[g];
        if (g == 4) return at;
    }
    return hex_run(s, n) >= 32 ? 32 : 0;
}

static int all_digits(const char *s, size_t n) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

/* A plain lock's owner token: 32 hex characters (dlock, redis-py's
 * uuid1().hex, node-redlock), 16 bytes in base64 (redsync), a UUID (with or
 * without dashes), or a UUID and a thread id joined by '-' or ':'
 * (SimpleRedisLock, Redisson-style owners). */
static int plain_token(const char *s, size_t n) {
    if (n == 24 && s[22] == '=' && s[23] == '=') {
        for (size_t i = 0; i < 22; i++)
            if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') ||
                  (s[i] >= '0' && s[i] <= '9') || s[i] == '+' || s[i] == '/'))
                return 0;
        return 1;
    }
    size_t u = uuid_prefix(s, n);
    if (!u) return 0;
    if (u == n) return 1;
    return (s[u] == '-' || s[u] == ':') && all_digits(s + u + 1, n - u - 1);
}

/* A holder field of a Redisson-layout HASH: "<uuid>:<thread id>", with
 * ":write" after it when write is 1. */
static int owner_field(const char *s, size_t n, int write) {
    if (write) {
        if (n < 6 || memcmp(s + n - 6, ":write", 6)) return 0;
        n -= 6;
    }
    size_t u = uuid_prefix(s, n);
    return u && u < n && s[u] == ':' && all_digits(s + u + 1, n - u - 1);
}

/* 1 when every field of the HASH h is a lock's: owner fields holding a
 * positive count, and for a read-write lock a "mode" of read or write. */
static int lock_hash(const redisReply *h) {
    int rw = 0;
    long long v;
    for (size_t i = 0; i + 1 < h->elements; i += 2)
        if (h->element[i]->len == 4 && !memcmp(h->element[i]->str, "mode", 4)) {
            const redisReply *m = h->element[i + 1];
            if (!((m->len == 4 && !memcmp(m->str, "read", 4)) ||
                  (m->len == 5 && !memcmp(m->str, "write", 5))))
                return 0;
            rw = 1;
        }
    for (size_t i = 0; i + 1 < h->elements; i += 2) {
        const redisReply *f = h->element[i];
        if (f->len == 4 && !memcmp(f->str, "mode", 4)) continue;
        if (!owner_field(f->str, f->len, 0) && !(rw && owner_field(f->str, f->len, 1)))
            return 0;
        if (dl_reply_int(h->element[i + 1], &v) || v < 1) return 0;
    }
    return h->elements >= 2;
}

/* Classifies a HASH lock from its fields: Redisson's read-write lock has a
 * "mode" field; a fair lock has a queue key beside it. */
static void inspect_hash(const redisReply *h, long long queued, dlock_info *info) {
    const redisReply *mode = NULL;
    for (size_t i = 0; i + 1 < h->elements; i += 2)
        if (h->element[i]->len == 4 && !memcmp(h->element[i]->str, "mode", 4))
            mode = h->element[i + 1];
    long long v;
    if (!mode) {
        info->kind = queued > 0 ? DLOCK_KIND_FAIR : DLOCK_KIND_REENTRANT;
        info->queued = queued;
        info->holders = (int)(h->elements / 2);
        if (h->elements >= 2) {
            snprintf(info->holder, sizeof info->holder, "%.*s", (int)h->element[0]->len,
                     h->element[0]->str);
            if (!dl_reply_int(h->element[1], &v)) info->hold_count = v;
        }
        return;
    }
    int is_write = mode->len == 5 && !memcmp(mode->str, "write", 5);
    info->kind = is_write ? DLOCK_KIND_WRITE : DLOCK_KIND_READ;
    for (size_t i = 0; i + 1 < h->elements; i += 2) {
        const redisReply *f = h->element[i];
        if (f->len == 4 && !memcmp(f->str, "mode", 4)) continue;
        int w = f->len > 6 && !memcmp(f->str + f->len - 6, ":write", 6);
        if (w) info->writer = 1;
        else info->readers++;
        if (!info->holder[0] || w) {
            snprintf(info->holder, sizeof info->holder, "%.*s", (int)f->len, f->str);
            if (!dl_reply_int(h->element[i + 1], &v)) info->hold_count = v;
        }
    }
    info->holders = (int)info->readers + info->writer;
}

/* One pipelined round trip: TYPE, PTTL, GET fence, PUBSUB NUMSUB, GET, HGETALL,
 * LLEN of a fair lock's queue, ZCARD of an expirable semaphore's leases,
 * ZCARD of the plain lock's waiter registry (its waiters listen on channels
 * of their own, as the fair lock's do, so NUMSUB does not count them), and
 * PUBSUB NUMSUB of the read-write lock's channel (its waiters').
 * The reads of the wrong type answer WRONGTYPE, which is ignored. */
static int inspect_conn(dl_conn *conn, int64_t deadline, const char *name, size_t name_len,
                        dlock_info *info, dl_err *err) {
    memset(info, 0, sizeof *info);
    size_t fkl, chl, qkl, tkl, scl, lcl;
    char *fkey = dl_derive_key("redisson_lock_token:", name, name_len, "", &fkl);
    char *chan = dl_derive_key("redisson_lock__channel:", name, name_len, "", &chl);
    char *qkey = dl_derive_key("redisson_lock_queue:", name, name_len, "", &qkl);
    char *tkey = dl_derive_key("", name, name_len, ":timeout", &tkl);
    char *schan = dl_derive_key("redisson_sc:", name, name_len, "", &scl);
    char *lchan = dl_latch_channel(name, name_len, &lcl);
    size_t wkl, rwl;
    char *wkey = dl_derive_key(DL_PLAIN_WAITERS_PREFIX, name, name_len, "", &wkl);
    char *rwchan = dl_derive_key("redisson_rwlock:", name, name_len, "", &rwl);
    int rc = (!fkey || !chan || !qkey || !tkey || !schan || !lchan || !wkey || !rwchan)
                 ? dl_seterr(err, DLOCK_ENOMEM, "out of memory")
                 : DLOCK_OK;
    enum { N = 11 };
    /* the waiters of a semaphore or a latch listen on their own channels */
    const char *cmds[N][4] = {{"TYPE", name}, {"PTTL", name}, {"GET", fkey},
                              {"PUBSUB", "NUMSUB", chan}, {"GET", name}, {"HGETALL", name},
                              {"LLEN", qkey}, {"ZCARD", tkey}, {"PUBSUB", "NUMSUB", schan, lchan},
                              {"ZCARD", wkey}, {"PUBSUB", "NUMSUB", rwchan}};
    size_t lens[N][4] = {{4, name_len}, {4, name_len}, {3, fkl}, {6, 6, chl},
                         {3, name_len}, {7, name_len}, {4, qkl}, {5, tkl}, {6, 6, scl, lcl},
                         {5, wkl}, {6, 6, rwl}};
    int argc[N] = {2, 2, 2, 3, 2, 2, 2, 2, 4, 2, 3};
    for (int i = 0; i < N && !rc; i++) rc = dl_conn_append(conn, argc[i], cmds[i], lens[i], err);
    if (!rc) rc = dl_conn_flush(conn, deadline, err);
    redisReply *r[N] = {0};
    for (int i = 0; i < N && !rc; i++) rc = dl_conn_read(conn, deadline, &r[i], err);
    if (!rc && r[0]->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r[0], "TYPE", err);
    if (!rc) {
        const char *type = r[0]->type == REDIS_REPLY_STATUS ? r[0]->str : "none";
        long long v, queued = 0, leased = 0;
        info->exists = strcmp(type, "none") != 0;
        info->ttl_ms = dl_reply_int(r[1], &v) ? -2 : v;
        info->fence = (!dl_reply_int(r[2], &v) && v > 0) ? (uint64_t)v : 0;
        if (r[3]->type == REDIS_REPLY_ARRAY && r[3]->elements == 2 &&
            !dl_reply_int(r[3]->element[1], &v))
            info->waiters = v;
        if (dl_reply_int(r[6], &queued)) queued = 0;
        if (dl_reply_int(r[7], &leased)) leased = 0;
        if (!strcmp(type, "string") && r[4]->type == REDIS_REPLY_STRING) {
            if (!dl_reply_int(r[4], &v)) {
                /* a number: a semaphore's permits or a latch's count; a latch
                 * is told apart only while someone awaits it */
                long long sw = 0, lw = 0;
                if (r[8]->type == REDIS_REPLY_ARRAY && r[8]->elements == 4) {
                    if (dl_reply_int(r[8]->element[1], &sw)) sw = 0;
                    if (dl_reply_int(r[8]->element[3], &lw)) lw = 0;
                }
                info->kind = leased > 0   ? DLOCK_KIND_PERMIT_SEMAPHORE
                             : lw > sw    ? DLOCK_KIND_LATCH
                                          : DLOCK_KIND_SEMAPHORE;
                info->permits = v;
                info->leased = leased;
                info->waiters = sw + lw;
            } else if (plain_token(r[4]->str, r[4]->len)) {
                long long registered = 0;
                if (dl_reply_int(r[9], &registered)) registered = 0;
                info->kind = DLOCK_KIND_PLAIN;
                info->waiters += registered;
                info->holders = 1;
                info->hold_count = 1;
                snprintf(info->holder, sizeof info->holder, "%.*s", (int)r[4]->len, r[4]->str);
            }
        } else if (!strcmp(type, "hash") && r[5]->type == REDIS_REPLY_ARRAY &&
                   lock_hash(r[5])) {
            inspect_hash(r[5], queued, info);
            if (info->kind == DLOCK_KIND_FAIR) info->waiters += queued;
            /* read-write waiters listen on the read-write channel */
            if ((info->kind == DLOCK_KIND_READ || info->kind == DLOCK_KIND_WRITE) &&
                r[10]->type == REDIS_REPLY_ARRAY && r[10]->elements == 2 &&
                !dl_reply_int(r[10]->element[1], &v))
                info->waiters = v;
        }
    }
    for (int i = 0; i < N; i++)
        if (r[i]) freeReplyObject(r[i]);
    free(fkey);
    free(chan);
    free(qkey);
    free(tkey);
    free(schan);
    free(lchan);
    free(wkey);
    free(rwchan);
    return rc;
}

int dl_redis_inspect(dlock_client *c, const char *name, size_t name_len, dlock_info *info,
                     dl_err *err) {
    int64_t deadline = dl_cmd_deadline(c);
    dl_conn *conn = NULL;
    int rc = dl_pool_get_key(c, name, name_len, deadline, &conn, err);
    if (rc) return rc;
    rc = inspect_conn(conn, deadline, name, name_len, info, err);
    dl_pool_put(c, conn);
    return rc;
}

int dl_redis_force_unlock(dlock_client *c, const char *name, size_t name_len, int *existed,
                          dl_err *err) {
    int rc;
    size_t chl, wl, pl;
    char *chan = dl_derive_key("redisson_lock__channel:", name, name_len, "", &chl);
    char *waiters = dl_derive_key(DL_PLAIN_WAITERS_PREFIX, name, name_len, "", &wl);
    char *prefix = dl_derive_key("redisson_lock__channel:", name, name_len, ":", &pl);
    if (!chan || !waiters || !prefix) {
        free(chan), free(waiters), free(prefix);
        return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    }
    const char *keys[3] = {name, chan, waiters};
    size_t keylens[3] = {name_len, chl, wl};
    const char *args[1] = {prefix};
    size_t arglens[1] = {pl};
    int any = 0;
    size_t answered = 0;
    dl_err first = {0};
    /* RedLock: every node, or a stale copy would keep counting; else the
     * node holding the name */
    dl_node *nodes[DL_MAX_NODES];
    size_t count = dl_topo_name_nodes(c, name, name_len, nodes, DL_MAX_NODES);
    for (size_t i = 0; i < count; i++) {
        dl_node *node = nodes[i];
        int64_t deadline = dl_cmd_deadline(c);
        dl_conn *conn = NULL;
        redisReply *r = NULL;
        long long v = 0;
        dl_err e = {0};
        rc = dl_node_get(node, deadline, &conn, &e);
        if (!rc) {
            rc = dl_eval(conn, deadline, &dl_script_force_unlock, 3, keys, keylens, 1, args,
                         arglens, &r, &e);
            dl_node_put(conn);
        }
        if (!rc) rc = dl_reply_expect_int(r, "force-unlock", &v, &e);
        if (r) freeReplyObject(r);
        if (rc && !first.code) first = e;
        if (!rc) {
            answered++;
            any |= v == 1;
        }
    }
    free(chan);
    free(waiters);
    free(prefix);
    if (answered == 0 || answered < dl_topo_quorum(c)) {
        *err = first;
        return first.code;
    }
    *existed = any;
    return DLOCK_OK;
}

/* Keys dlock derives from lock names: not locks themselves. */
static int derived_key(const char *k, size_t n) {
    static const char *const prefixes[] = {"redisson_lock_token:", "redisson_lock_queue:",
                                           "redisson_lock_timeout:", "redisson_lock_lease:",
                                           DL_PLAIN_WAITERS_PREFIX, "icr:", DL_WHO_PREFIX,
                                           DL_SEM_CHANGE_PREFIX};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t pl = strlen(prefixes[i]);
        if (n >= pl && !memcmp(k, prefixes[i], pl)) return 1;
    }
    /* a read-write lock's per-hold timeout keys */
    static const char rw[] = ":rwlock_timeout:";
    for (size_t i = 0; i + sizeof rw - 1 <= n; i++)
        if (!memcmp(k + i, rw, sizeof rw - 1)) return 1;
    return 0;
}

int dlock_list(dlock_client *c, const char *pattern, dlock_list_fn fn, void *userdata) {
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!fn) return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "callback is NULL"});
    if (!(c->backend->caps & DL_CAP_LIST)) return dl_backend_unsupported(c, "list");
    if (!pattern || !*pattern) pattern = "*";
    int rc = DLOCK_OK, stop = 0;
    /* a cluster's keys are spread over its masters: scan each */
    size_t nodes = dl_topo_scan_nodes(c);
    if (c->unusable) rc = dl_seterr(&err, DLOCK_EINVAL, "client failed to open; free it");
    for (size_t ni = 0; ni < nodes && !rc && !stop; ni++) {
    char cursor[32] = "0";
    int done = 0;
    dl_conn *conn = NULL;
    rc = dl_node_get(c->nodes[ni], dl_cmd_deadline(c), &conn, &err);
    while (!rc && !stop && !done) {
        const char *argv[6] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
        size_t lens[6] = {4, strlen(cursor), 5, strlen(pattern), 5, 4};
        redisReply *r = NULL;
        int64_t deadline = dl_cmd_deadline(c);
        rc = dl_conn_command(conn, deadline, 6, argv, lens, &r, &err);
        if (rc) break;
        if (r->type == REDIS_REPLY_ERROR) {
            rc = dl_reply_error(r, "SCAN", &err);
        } else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                   r->element[0]->type != REDIS_REPLY_STRING ||
                   r->element[0]->len >= sizeof cursor ||
                   r->element[1]->type != REDIS_REPLY_ARRAY) {
            rc = dl_seterr(&err, DLOCK_EPROTO, "SCAN: unexpected reply");
        } else {
            memcpy(cursor, r->element[0]->str, r->element[0]->len);
            cursor[r->element[0]->len] = '\0';
            redisReply *keys = r->element[1];
            for (size_t i = 0; i < keys->elements && !rc && !stop; i++) {
                redisReply *k = keys->element[i];
                if (k->type != REDIS_REPLY_STRING || k->len == 0 || k->len > DLOCK_NAME_MAX ||
                    derived_key(k->str, k->len))
                    continue;
                dlock_info info;
                rc = inspect_conn(conn, deadline, k->str, k->len, &info, &err);
                if (!rc && info.kind != 0) stop = fn(k->str, k->len, &info, userdata) != 0;
            }
            if (!strcmp(cursor, "0")) done = 1;
        }
        freeReplyObject(r);
    }
    dl_pool_put(c, conn);
    }
    if (rc) return dl_client_fail(c, &err);
    dl_client_ok(c);
    return DLOCK_OK;
}

int dlock_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen) {
    if (!c) return DLOCK_EINVAL;
    dl_err err = {0};
    if (!what || !*what || !buf || buflen == 0)
        return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "server fact: bad arguments"});
    buf[0] = '\0';
    if (!strcmp(what, "backend")) {
        snprintf(buf, buflen, "%s", c->backend->name);
        dl_client_ok(c);
        return DLOCK_OK;
    }
    if (c->unusable)
        return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "client failed to open; free it"});
    if (!c->backend->server_fact) return dl_backend_unsupported(c, "server facts");
    if (c->backend->server_fact(c, what, buf, buflen, &err)) return dl_client_fail(c, &err);
    dl_client_ok(c);
    return DLOCK_OK;
}

/* "info:SECTION:FIELD" reads INFO; anything else is CONFIG GET. */
int dl_redis_server_fact(dlock_client *c, const char *what, char *buf, size_t buflen,
                         dl_err *errp) {
    dl_err err = {0};
    redisReply *r = NULL;
    int rc;
    if (!strncmp(what, "info:", 5)) {
        const char *sec = what + 5, *colon = strchr(sec, ':');
        if (!colon || !colon[1])
            return dl_seterr(errp, DLOCK_EINVAL, "server fact: use info:SECTION:FIELD");
        const char *argv[2] = {"INFO", sec};
        size_t lens[2] = {4, (size_t)(colon - sec)};
        rc = dl_client_command(c, 2, argv, lens, &r, &err);
        if (!rc && r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "INFO", &err);
        else if (!rc && r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS)
            rc = dl_seterr(&err, DLOCK_EPROTO, "INFO: unexpected reply");
        if (!rc) {
            const char *field = colon + 1;
            size_t fl = strlen(field);
            const char *p = r->str;
            rc = dl_seterr(&err, DLOCK_ESERVER, "INFO has no field '%.60s'", field);
            while (p && *p) {
                if (!strncmp(p, field, fl) && p[fl] == ':') {
                    const char *v = p + fl + 1, *e = strpbrk(v, "\r\n");
                    size_t vl = e ? (size_t)(e - v) : strlen(v);
                    snprintf(buf, buflen, "%.*s", (int)vl, v);
                    rc = DLOCK_OK;
                    break;
                }
                p = strchr(p, '\n');
                if (p) p++;
            }
        }
    } else {
        const char *argv[3] = {"CONFIG", "GET", what};
        size_t lens[3] = {6, 3, strlen(what)};
        rc = dl_client_command(c, 3, argv, lens, &r, &err);
        if (!rc && r->type == REDIS_REPLY_ERROR) rc = dl_reply_error(r, "CONFIG GET", &err);
        else if (!rc && (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
                         r->element[1]->type != REDIS_REPLY_STRING))
            rc = dl_seterr(&err, DLOCK_ESERVER, "CONFIG GET %.60s: no such setting", what);
        else if (!rc)
            snprintf(buf, buflen, "%.*s", (int)r->element[1]->len, r->element[1]->str);
    }
    if (r) freeReplyObject(r);
    if (rc) *errp = err;
    return rc;
}
