/* Holder identity (dlock_client_set_identity): who holds a lock, kept beside
 * it while the hold lasts, for dlock_inspect_holder and `dlock status`.
 *
 *   STRING dlock_holder:{name}:<owner>   "host \t pid \t since \t label \t command"
 *                                        (since: Unix ms), expiring with the hold
 *
 * The key is written, renewed and deleted by one script (who_script) that
 * runs after the lock's own script, in the same write (dl_conn.post): no
 * round trip of its own. It reads the lock's layout to learn whether the
 * owner holds the lock at that moment, so the lock scripts, and the layouts
 * other clients share, stay as they are: a STRING equal to the owner (the
 * plain lock) or a HASH with the owner's field (reentrant, fair, read and
 * write locks). A key whose owner no longer holds is never shown (readers
 * check the lock first) and goes when its expiry comes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kinds.h"

#define WHO_FIELD_MAX 255 /* bytes kept of the label and of the command */

/* KEYS: lock, holder key. ARGV: owner, mode, lease ms, identity.
 * mode 'a' (a first hold): the key is set when the owner holds;
 * 'r' (re-entry): set unless there, else its expiry made the lease;
 * 'e' (extend): its expiry made the lease when the owner holds;
 * 'd' (release): deleted unless the owner still holds (re-entry count left).
 * mode 'w' (watchdog): KEYS: lock, holder key, lock, holder key...; ARGV[3]:
 * lease ms, ARGV[3 + i]: the owner of pair i; each holder key whose owner
 * holds gets the lease as its expiry. -> 0 */
static dl_script who_script = DL_SCRIPT("holder",
    "local function held(k, o) "
    "local t = redis.call('type', k).ok "
    "if t == 'string' then return redis.call('get', k) == o end "
    "if t == 'hash' then return redis.call('hexists', k, o) == 1 end "
    "return false end "
    "local m = ARGV[2] "
    "if m == 'w' then "
    "for i = 1, #KEYS, 2 do "
    "if held(KEYS[i], ARGV[3 + (i + 1) / 2]) then redis.call('pexpire', KEYS[i + 1], ARGV[3]) end "
    "end return 0 end "
    "local h = held(KEYS[1], ARGV[1]) "
    "if m == 'd' then if not h then redis.call('del', KEYS[2]) end "
    "elseif h then "
    "if m == 'a' then redis.call('set', KEYS[2], ARGV[4], 'PX', ARGV[3]) "
    "elseif m == 'e' or not redis.call('set', KEYS[2], ARGV[4], 'NX', 'PX', ARGV[3]) then "
    "redis.call('pexpire', KEYS[2], ARGV[3]) end end "
    "return 0");

/* Copies at most WHO_FIELD_MAX bytes of s to out, tabs and line breaks
 * (the record's separators) made spaces; returns the bytes written. */
static size_t field_copy(char *out, const char *s) {
    size_t n = 0;
    for (; s && s[n] && n < WHO_FIELD_MAX; n++)
        out[n] = (s[n] == '\t' || s[n] == '\n' || s[n] == '\r') ? ' ' : s[n];
    return n;
}

/* This process's command line, its arguments joined by spaces. */
static size_t own_command(char *out, size_t cap) {
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return 0;
    size_t n = fread(out, 1, cap, f);
    fclose(f);
    while (n > 0 && out[n - 1] == '\0') n--;
    for (size_t i = 0; i < n; i++)
        if (out[i] == '\0') out[i] = ' ';
    return n;
}

int dlock_client_set_identity(dlock_client *c, const char *command, const char *label) {
    if (!c) return DLOCK_EINVAL;
    if (!(c->backend->caps & DL_CAP_HOLDER) || dl_topo_fanout(c))
        return dl_client_fail(c, &(dl_err){DLOCK_ENOTSUP, "holder identity is recorded on a Redis "
                                                          "server, Sentinel or Cluster only"});
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "?");
    host[sizeof host - 1] = '\0';
    /* host \t label \t command; the pid and the time go between host and
     * label at each acquire (dl_who_post) */
    char cmd[WHO_FIELD_MAX + 1];
    size_t cl = 0;
    if (command) {
        cl = field_copy(cmd, command);
    } else {
        char raw[WHO_FIELD_MAX + 1];
        size_t rl = own_command(raw, WHO_FIELD_MAX);
        raw[rl] = '\0';
        cl = field_copy(cmd, raw);
    }
    cmd[cl] = '\0';
    char lab[WHO_FIELD_MAX + 1];
    lab[field_copy(lab, label)] = '\0';
    char hst[WHO_FIELD_MAX + 1];
    hst[field_copy(hst, host)] = '\0';
    size_t hl = strlen(hst), tl = strlen(lab) + 1 + cl;
    char *who = malloc(hl + 1 + tl + 1);
    if (!who) return dl_client_fail(c, &(dl_err){DLOCK_ENOMEM, "out of memory"});
    snprintf(who, hl + 1 + tl + 1, "%s\t%s\t%s", hst, lab, cmd);
    free(c->who);
    c->who = who;
    c->who_host_len = hl;
    dl_client_ok(c);
    return DLOCK_OK;
}

/* "dlock_holder:{name}:<owner>", malloc'd, its length in *len; NULL when
 * out of memory. */
static char *record_key(const char *name, size_t name_len, const char *owner, size_t owner_len,
                        size_t *len) {
    size_t pl = 0;
    char *k = dl_derive_key(DL_WHO_PREFIX, name, name_len, ":", &pl);
    char *full = k ? realloc(k, pl + owner_len + 1) : NULL;
    if (!full) {
        free(k);
        return NULL;
    }
    memcpy(full + pl, owner, owner_len);
    full[pl + owner_len] = '\0';
    *len = pl + owner_len;
    return full;
}

/* l's holder key for its current owner into l->who_key (made on first use). */
static int who_key(dlock_lock *l) {
    if (!l->who_key) {
        size_t pl = 0;
        char *p = dl_derive_key(DL_WHO_PREFIX, l->h.name, l->h.name_len, ":", &pl);
        if (!p) return -1;
        char *k = realloc(p, pl + sizeof l->token + 1);
        if (!k) {
            free(p);
            return -1;
        }
        l->who_key = k;
        l->who_prefix_len = pl;
    }
    memcpy(l->who_key + l->who_prefix_len, l->token, l->token_len);
    l->who_key_len = l->who_prefix_len + l->token_len;
    l->who_key[l->who_key_len] = '\0';
    return 0;
}

/* The record for l's hold starting now into l->who_val; its length, or -1. */
static int who_value(dlock_lock *l) {
    const dlock_client *c = l->h.c;
    struct timespec ts;
    /* the wall clock on purpose: "since" is a date for people to read, and
     * no lease or deadline is computed from it */
    clock_gettime(CLOCK_REALTIME, &ts);
    long long since = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    size_t need = strlen(c->who) + 2 * 24 + 3;
    if (need > l->who_val_cap) {
        char *v = realloc(l->who_val, need);
        if (!v) return -1;
        l->who_val = v;
        l->who_val_cap = need;
    }
    int n = snprintf(l->who_val, l->who_val_cap, "%.*s\t%ld\t%lld\t%s", (int)c->who_host_len,
                     c->who, (long)getpid(), since, c->who + c->who_host_len + 1);
    return n < 0 ? -1 : n;
}

int dl_who_inline(dlock_lock *l, const char **key, size_t *key_len, const char **value,
                  size_t *value_len) {
    if (!l->h.c->who || l->token_len == 0 || who_key(l)) return -1;
    *key = l->who_key;
    *key_len = l->who_key_len;
    if (value) {
        int n = who_value(l);
        if (n < 0) return -1;
        *value = l->who_val;
        *value_len = (size_t)n;
    }
    return 0;
}

dl_call *dl_who_post(dlock_lock *l, char mode, int64_t lease_ms) {
    const dlock_client *c = l->h.c;
    if (!c->who || l->ops->who_inline || l->token_len == 0 || who_key(l)) return NULL;
    dl_call *p = &l->who_post;
    memset(p, 0, sizeof *p);
    p->script = &who_script;
    p->nkeys = 2;
    p->keys[0] = l->h.name, p->keylens[0] = l->h.name_len;
    p->keys[1] = l->who_key, p->keylens[1] = l->who_key_len;
    l->who_mode[0] = mode;
    p->nargs = 3;
    p->args[0] = l->token, p->arglens[0] = l->token_len;
    p->args[1] = l->who_mode, p->arglens[1] = 1;
    p->args[2] = l->who_lease, p->arglens[2] = dl_fmt_ll(l->who_lease, lease_ms);
    if (mode == 'a' || mode == 'r') {
        int n = who_value(l);
        if (n < 0) return NULL;
        p->args[3] = l->who_val, p->arglens[3] = (size_t)n;
        p->nargs = 4;
    }
    return p;
}

void dl_who_renewal_clear(dl_who_renewal *w) {
    if (w->owned)
        for (size_t i = 0; i < w->n; i++) free(w->owned[i]);
    free(w->owned);
    free(w->keys);
    free(w->keylens);
    free(w->args);
    free(w->arglens);
    memset(w, 0, sizeof *w);
}

int dl_who_renewal_make(dl_who_renewal *w, const char *const *locks, const size_t *locklens,
                        const char *const *owners, const size_t *ownerlens, size_t n,
                        int64_t lease_ms, dl_err *err) {
    memset(w, 0, sizeof *w);
    w->n = n;
    w->keys = calloc(2 * n, sizeof *w->keys);
    w->keylens = calloc(2 * n, sizeof *w->keylens);
    w->args = calloc(3 + n, sizeof *w->args);
    w->arglens = calloc(3 + n, sizeof *w->arglens);
    w->owned = calloc(n, sizeof *w->owned);
    if (!w->keys || !w->keylens || !w->args || !w->arglens || !w->owned) goto oom;
    w->args[0] = "", w->arglens[0] = 0;
    w->args[1] = "w", w->arglens[1] = 1;
    w->args[2] = w->lease, w->arglens[2] = dl_fmt_ll(w->lease, lease_ms);
    for (size_t i = 0; i < n; i++) {
        size_t kl = 0;
        w->owned[i] = record_key(locks[i], locklens[i], owners[i], ownerlens[i], &kl);
        if (!w->owned[i]) goto oom;
        w->keys[2 * i] = locks[i], w->keylens[2 * i] = locklens[i];
        w->keys[2 * i + 1] = w->owned[i], w->keylens[2 * i + 1] = kl;
        w->args[3 + i] = owners[i], w->arglens[3 + i] = ownerlens[i];
    }
    w->q = (dl_eval_req){.s = &who_script, .nkeys = (int)(2 * n), .nargs = (int)(3 + n),
                         .keys = w->keys, .keylens = w->keylens, .args = w->args,
                         .arglens = w->arglens};
    return DLOCK_OK;
oom:
    dl_who_renewal_clear(w);
    return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
}

int dlock_inspect_holder(dlock_client *c, const char *name, size_t name_len, const char *owner,
                         char *buf, size_t len) {
    if (!c || !name || !owner || !buf || len == 0) return DLOCK_EINVAL;
    buf[0] = '\0';
    if (name_len == DLOCK_CSTR) name_len = strlen(name);
    dl_err err = {0};
    if (!(c->backend->caps & DL_CAP_HOLDER) || dl_topo_fanout(c))
        return dl_client_fail(c, &(dl_err){DLOCK_ENOTSUP, "holder identity is recorded on a Redis "
                                                          "server, Sentinel or Cluster only"});
    if (name_len == 0) return dl_client_fail(c, &(dl_err){DLOCK_EINVAL, "empty lock name"});
    if (name_len > DLOCK_NAME_MAX)
        return dl_client_fail(c, &(dl_err){DLOCK_ENAMETOOLONG, "lock name too long"});
    size_t kl = 0;
    char *key = record_key(name, name_len, owner, strlen(owner), &kl);
    if (!key) return dl_client_fail(c, &(dl_err){DLOCK_ENOMEM, "out of memory"});
    int64_t deadline = dl_cmd_deadline(c);
    dl_conn *conn = NULL;
    int rc = dl_pool_get_key(c, key, kl, deadline, &conn, &err);
    if (!rc) {
        const char *argv[2] = {"GET", key};
        size_t lens[2] = {3, kl};
        redisReply *r = NULL;
        rc = dl_conn_command(conn, deadline, 2, argv, lens, &r, &err);
        dl_pool_put(c, conn);
        if (!rc && r->type == REDIS_REPLY_STRING)
            snprintf(buf, len, "%.*s", (int)r->len, r->str);
        else if (!rc && r->type == REDIS_REPLY_ERROR)
            rc = dl_reply_error(r, "holder identity", &err);
        if (r) freeReplyObject(r);
    }
    free(key);
    if (rc) return dl_client_fail(c, &err);
    dl_client_ok(c);
    return DLOCK_OK;
}
