/* Running Lua scripts: EVALSHA with an EVAL fallback on NOSCRIPT. The
 * scripts themselves live with the kind that uses them (lock_plain.c...). */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static pthread_mutex_t sha_mu = PTHREAD_MUTEX_INITIALIZER;

/* The script's SHA1 in hex, computed once. "" if the digest failed: EVALSHA
 * then answers NOSCRIPT and EVAL is used. */
static const char *script_sha(dl_script *s) {
    if (atomic_load_explicit(&s->ready, memory_order_acquire)) return s->sha;
    pthread_mutex_lock(&sha_mu);
    if (!atomic_load_explicit(&s->ready, memory_order_relaxed)) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int mdlen = 0;
        if (EVP_Digest(s->text, strlen(s->text), md, &mdlen, EVP_sha1(), NULL) == 1 &&
            mdlen == 20) {
            for (unsigned j = 0; j < 20; j++) snprintf(s->sha + 2 * j, 3, "%02x", md[j]);
        } else {
            s->sha[0] = '\0';
        }
        atomic_store_explicit(&s->ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&sha_mu);
    return s->sha;
}

int dl_is_noscript(const redisReply *r) {
    return r && r->type == REDIS_REPLY_ERROR && r->len >= 8 && !strncmp(r->str, "NOSCRIPT", 8);
}

size_t dl_fmt_ll(char *buf, long long v) { return (size_t)snprintf(buf, 24, "%lld", v); }

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
    char nk[24];
    argv[0] = by_text ? "EVAL" : "EVALSHA";
    lens[0] = strlen(argv[0]);
    argv[1] = by_text ? s->text : script_sha(s);
    lens[1] = strlen(argv[1]);
    argv[2] = nk;
    lens[2] = dl_fmt_ll(nk, nkeys);
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
    return eval_append(c, s, 0, nkeys, keys, keylens, nargs, args, arglens, err);
}

int dl_eval_append_text(dl_conn *c, dl_script *s, int nkeys, const char **keys,
                        const size_t *keylens, int nargs, const char **args,
                        const size_t *arglens, dl_err *err) {
    return eval_append(c, s, 1, nkeys, keys, keylens, nargs, args, arglens, err);
}

int dl_eval(dl_conn *c, int64_t deadline, dl_script *s, int nkeys, const char **keys,
            const size_t *keylens, int nargs, const char **args, const size_t *arglens,
            redisReply **out, dl_err *err) {
    *out = NULL;
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
        break;
    }
    return DLOCK_OK;
}

int dl_client_eval(dlock_client *c, dl_script *s, int nkeys, const char **keys,
                   const size_t *keylens, int nargs, const char **args, const size_t *arglens,
                   redisReply **out, dl_err *err) {
    int64_t deadline = dl_cmd_deadline(c);
    dl_conn *conn = NULL;
    int rc = dl_pool_get(c, deadline, &conn, err);
    if (rc) return rc;
    rc = dl_eval(conn, deadline, s, nkeys, keys, keylens, nargs, args, arglens, out, err);
    dl_pool_put(c, conn);
    return rc;
}

int dl_reply_expect_int(redisReply *r, const char *what, long long *v, dl_err *err) {
    if (r->type == REDIS_REPLY_ERROR) return dl_reply_error(r, what, err);
    if (dl_reply_int(r, v)) return dl_seterr(err, DLOCK_EPROTO, "%s: unexpected reply", what);
    return DLOCK_OK;
}
