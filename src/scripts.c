/* The Lua scripts, sent by EVALSHA with an EVAL fallback on NOSCRIPT.
 * Layouts follow ../shared/INTEROP.md: plain locks as redis-py/redsync,
 * reentrant locks as Redisson's RLock (+ RFencedLock's token counter). */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* KEYS: lock, fence counter. ARGV: token, lease ms.
 * -> {1, fence} acquired | {0, pttl} held by another */
dl_script dl_script_plain_acquire = {"plain_acquire",
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
    "return {1, redis.call('incr', KEYS[2])} end "
    "return {0, redis.call('pttl', KEYS[1])}", ""};

/* KEYS: lock, channel. ARGV: token. -> 1 released | 0 not ours */
dl_script dl_script_plain_release = {"plain_release",
    "if redis.pcall('get', KEYS[1]) == ARGV[1] then "
    "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '0'); return 1 end "
    "return 0", ""};

/* KEYS: lock. ARGV: token, lease ms. -> 1 extended | 0 not ours */
dl_script dl_script_plain_extend = {"plain_extend",
    "if redis.pcall('get', KEYS[1]) == ARGV[1] then "
    "redis.call('pexpire', KEYS[1], ARGV[2]); return 1 end return 0", ""};

/* KEYS: lock, fence counter. ARGV: lease ms, owner field.
 * -> {1, fence, holds} acquired or re-entered | {0, pttl} */
dl_script dl_script_reentrant_acquire = {"reentrant_acquire",
    "if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then "
    "local n = redis.call('hincrby', KEYS[1], ARGV[2], 1); "
    "redis.call('pexpire', KEYS[1], ARGV[1]); "
    "return {1, redis.call('incr', KEYS[2]), n} end "
    "return {0, redis.call('pttl', KEYS[1])}", ""};

/* KEYS: lock, channel. ARGV: lease ms, owner field.
 * -> -1 not held | 0 still held (count > 0) | 1 released */
dl_script dl_script_reentrant_release = {"reentrant_release",
    "if redis.pcall('hexists', KEYS[1], ARGV[2]) ~= 1 then return -1 end "
    "local n = redis.call('hincrby', KEYS[1], ARGV[2], -1); "
    "if n > 0 then redis.call('pexpire', KEYS[1], ARGV[1]); return 0 end "
    "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '0'); return 1", ""};

/* KEYS: lock. ARGV: owner field, lease ms. -> 1 extended | 0 not ours */
dl_script dl_script_reentrant_extend = {"reentrant_extend",
    "if redis.pcall('hexists', KEYS[1], ARGV[1]) == 1 then "
    "redis.call('pexpire', KEYS[1], ARGV[2]); return 1 end return 0", ""};

/* Watchdog batch. KEYS: locks. ARGV: lease ms, then per key: kind ('p' plain,
 * 'r' reentrant), owner. -> array of 1 renewed | 0 no longer ours */
dl_script dl_script_renew = {"renew",
    "local res = {} "
    "for i, key in ipairs(KEYS) do "
    "local kind, owner, ok = ARGV[2*i], ARGV[2*i+1], 0 "
    "if kind == 'p' then "
    "if redis.pcall('get', key) == owner then redis.call('pexpire', key, ARGV[1]); ok = 1 end "
    "elseif redis.pcall('hexists', key, owner) == 1 then "
    "redis.call('pexpire', key, ARGV[1]); ok = 1 end "
    "res[i] = ok end "
    "return res", ""};

/* KEYS: lock, channel. -> 1 deleted (waiters told) | 0 was free */
dl_script dl_script_force_unlock = {"force_unlock",
    "if redis.call('del', KEYS[1]) == 1 then "
    "redis.call('publish', KEYS[2], '0'); return 1 end return 0", ""};

static dl_script *const all_scripts[] = {
    &dl_script_plain_acquire, &dl_script_plain_release, &dl_script_plain_extend,
    &dl_script_reentrant_acquire, &dl_script_reentrant_release, &dl_script_reentrant_extend,
    &dl_script_renew, &dl_script_force_unlock,
};

static pthread_once_t scripts_once = PTHREAD_ONCE_INIT;

static void compute_shas(void) {
    for (size_t i = 0; i < sizeof all_scripts / sizeof all_scripts[0]; i++) {
        dl_script *s = all_scripts[i];
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int mdlen = 0;
        if (EVP_Digest(s->text, strlen(s->text), md, &mdlen, EVP_sha1(), NULL) != 1 ||
            mdlen != 20) {
            s->sha[0] = '\0'; /* EVALSHA of "" gives NOSCRIPT: EVAL is used */
            continue;
        }
        for (unsigned j = 0; j < 20; j++) snprintf(s->sha + 2 * j, 3, "%02x", md[j]);
    }
}

void dl_scripts_init(void) { pthread_once(&scripts_once, compute_shas); }

int dl_is_noscript(const redisReply *r) {
    return r && r->type == REDIS_REPLY_ERROR && r->len >= 8 && !strncmp(r->str, "NOSCRIPT", 8);
}

/* Queues EVALSHA/EVAL of s. */
static int eval_append(dl_conn *c, dl_script *s, int by_text, int nkeys, const char **keys,
                       const size_t *keylens, int nargs, const char **args,
                       const size_t *arglens, dl_err *err) {
    int argc = 3 + nkeys + nargs;
    const char *sv[40];
    size_t sl[40];
    const char **argv = sv;
    size_t *lens = sl;
    if (argc > 40) {
        argv = malloc(sizeof *argv * (size_t)argc);
        lens = malloc(sizeof *lens * (size_t)argc);
        if (!argv || !lens) {
            free(argv);
            free(lens);
            return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        }
    }
    char nk[16];
    int nkl = snprintf(nk, sizeof nk, "%d", nkeys);
    argv[0] = by_text ? "EVAL" : "EVALSHA";
    lens[0] = strlen(argv[0]);
    argv[1] = by_text ? s->text : s->sha;
    lens[1] = strlen(argv[1]);
    argv[2] = nk;
    lens[2] = (size_t)nkl;
    for (int i = 0; i < nkeys; i++) {
        argv[3 + i] = keys[i];
        lens[3 + i] = keylens[i];
    }
    for (int i = 0; i < nargs; i++) {
        argv[3 + nkeys + i] = args[i];
        lens[3 + nkeys + i] = arglens[i];
    }
    int rc = dl_conn_append(c, argc, argv, lens, err);
    if (argv != sv) {
        free(argv);
        free(lens);
    }
    return rc;
}

int dl_eval_append(dl_conn *c, dl_script *s, int nkeys, const char **keys,
                   const size_t *keylens, int nargs, const char **args, const size_t *arglens,
                   dl_err *err) {
    dl_scripts_init();
    return eval_append(c, s, 0, nkeys, keys, keylens, nargs, args, arglens, err);
}

int dl_eval(dl_conn *c, int64_t deadline, dl_script *s, int nkeys, const char **keys,
            const size_t *keylens, int nargs, const char **args, const size_t *arglens,
            redisReply **out, dl_err *err) {
    dl_scripts_init();
    for (int by_text = 0; by_text < 2; by_text++) {
        int rc = eval_append(c, s, by_text, nkeys, keys, keylens, nargs, args, arglens, err);
        if (!rc) rc = dl_conn_flush(c, deadline, err);
        if (!rc) rc = dl_conn_read(c, deadline, out, err);
        if (rc) return rc;
        if (!by_text && dl_is_noscript(*out)) {
            freeReplyObject(*out);
            *out = NULL;
            continue;
        }
        return DLOCK_OK;
    }
    return DLOCK_OK;
}
