/* Running Lua scripts: EVALSHA with an EVAL fallback on NOSCRIPT, and WAIT
 * for the replicas of what a connection wrote. The
 * scripts themselves live with the kind that uses them (lock_plain.c...). */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services.h"

static pthread_mutex_t sha_mu = PTHREAD_MUTEX_INITIALIZER;

static void sha1_hex(const char *text, char out[41]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    out[0] = '\0';
    if (EVP_Digest(text, strlen(text), md, &mdlen, EVP_sha1(), NULL) == 1 && mdlen == 20)
        for (unsigned j = 0; j < 20; j++) snprintf(out + 2 * j, 3, "%02x", md[j]);
}

/* The script's text for Redis Cluster's sharded pub/sub: every 'publish'
 * call made 'spublish', and every PUBSUB 'numsub' made 'shardnumsub' (a
 * sharded subscriber counts only there); NULL when out of memory (the
 * classic text is used then). */
static char *sharded_text(const char *text) {
    static const char *const from[] = {"'publish'", "'numsub'"};
    static const char *const to[] = {"'spublish'", "'shardnumsub'"};
    enum { NSUB = 2 };
    size_t n = strlen(text);
    for (int k = 0; k < NSUB; k++)
        for (const char *p = text; (p = strstr(p, from[k])); p += strlen(from[k]))
            n += strlen(to[k]) - strlen(from[k]);
    char *out = malloc(n + 1), *o = out;
    if (!out) return NULL;
    for (const char *p = text; *p;) {
        int k = 0;
        while (k < NSUB && strncmp(p, from[k], strlen(from[k]))) k++;
        if (k < NSUB) {
            memcpy(o, to[k], strlen(to[k]));
            o += strlen(to[k]);
            p += strlen(from[k]);
        } else {
            *o++ = *p++;
        }
    }
    *o = '\0';
    return out;
}

/* The script's SHA1 in hex, computed once (the sharded variant's too). ""
 * if the digest failed: EVALSHA then answers NOSCRIPT and EVAL is used. */
static const char *script_sha(dl_script *s, int sharded) {
    atomic_int *ready = sharded ? &s->sready : &s->ready;
    if (!atomic_load_explicit(ready, memory_order_acquire)) {
        pthread_mutex_lock(&sha_mu);
        if (!atomic_load_explicit(ready, memory_order_relaxed)) {
            if (sharded) {
                s->stext = sharded_text(s->text);
                sha1_hex(s->stext ? s->stext : s->text, s->ssha);
            } else {
                sha1_hex(s->text, s->sha);
            }
            atomic_store_explicit(ready, 1, memory_order_release);
        }
        pthread_mutex_unlock(&sha_mu);
    }
    return sharded ? s->ssha : s->sha;
}

static const char *script_text(dl_script *s, int sharded) {
    if (!sharded) return s->text;
    script_sha(s, 1);
    return s->stext ? s->stext : s->text;
}

int dl_is_noscript(const redisReply *r) {
    return r && r->type == REDIS_REPLY_ERROR && r->len >= 8 && !strncmp(r->str, "NOSCRIPT", 8);
}


/* Queues EVALSHA/EVAL of s. */
static int eval_append(dl_conn *c, dl_script *s, int by_text, int nkeys,
                       const char *const *keys, const size_t *keylens, int nargs,
                       const char *const *args, const size_t *arglens, dl_err *err) {
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
    int sharded = dl_sharded(c);
    argv[0] = by_text ? "EVAL" : "EVALSHA";
    lens[0] = strlen(argv[0]);
    argv[1] = by_text ? script_text(s, sharded) : script_sha(s, sharded);
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

static inline int queue(dl_conn *c, const dl_eval_req *q, int by_text, dl_err *err) {
    if (q->pre) {
        const char *pre = q->pre;
        size_t len = strlen(pre);
        int rc = dl_conn_append(c, 1, &pre, &len, err);
        if (rc) return rc;
    }
    return eval_append(c, q->s, by_text, q->nkeys, q->keys, q->keylens, q->nargs, q->args,
                       q->arglens, err);
}

int dl_eval_queue(dl_conn *c, const dl_eval_req *q, int by_text, dl_err *err) {
    return queue(c, q, by_text, err);
}

/* *r's request goes again by text: *r freed and NULL. */
static int resend(dl_conn *c, const dl_eval_req *q, int *by_text, redisReply **r, dl_err *err) {
    freeReplyObject(*r);
    *r = NULL;
    *by_text = 1;
    return queue(c, q, 1, err);
}

static int fallback(dl_conn *c, const dl_eval_req *q, int *by_text, redisReply **r,
                    dl_err *err) {
    if (*by_text || !dl_is_noscript(*r)) return DLOCK_OK;
    return resend(c, q, by_text, r, err);
}

int dl_eval_fallback(dl_conn *c, const dl_eval_req *q, int *by_text, redisReply **r,
                     dl_err *err) {
    return fallback(c, q, by_text, r, err);
}

/* q's reply, its pre's read and dropped first. */
static inline int read_one(dl_conn *c, int64_t deadline, const dl_eval_req *q, redisReply **out,
                           dl_err *err) {
    if (q->pre) {
        redisReply *ok = NULL;
        int rc = dl_conn_read(c, deadline, &ok, err);
        if (ok) freeReplyObject(ok);
        if (rc) return rc;
    }
    return dl_conn_read(c, deadline, out, err);
}

int dl_eval_read_all(dl_conn *c, int64_t deadline, const dl_eval_req *q, size_t n,
                     redisReply **out, dl_err *err) {
    int rc = DLOCK_OK, again = 0, prev_again = 0;
    size_t i = 0;
    for (; i < n; i++) {
        out[i] = NULL;
        rc = read_one(c, deadline, &q[i], &out[i], err);
        if (rc) break;
        /* the with_prev request read the state of a run that did not happen */
        int by_text = 0;
        rc = q[i].with_prev && prev_again ? resend(c, &q[i], &by_text, &out[i], err)
                                          : fallback(c, &q[i], &by_text, &out[i], err);
        if (rc) break;
        prev_again = by_text;
        again |= by_text;
    }
    if (rc) {
        for (i++; i < n; i++) out[i] = NULL;
    } else if (again) {
        rc = dl_conn_flush(c, deadline, err);
        for (i = 0; i < n && !rc; i++)
            if (!out[i]) rc = read_one(c, deadline, &q[i], &out[i], err);
    }
    if (rc) c->broken = 1; /* replies unread, or requests queued and not sent */
    return rc;
}

/* One EVALSHA (EVAL on NOSCRIPT) on c, in the same write after pre (ASKING,
 * PING) when pre is not NULL, and before c->post when there is one (which
 * is then cleared: it goes with one call). */
static int eval_on(dl_conn *c, const char *pre, int64_t deadline, dl_script *s, int nkeys,
                   const char **keys, const size_t *keylens, int nargs, const char **args,
                   const size_t *arglens, redisReply **out, dl_err *err) {
    *out = NULL;
    dl_call *post = c->post;
    c->post = NULL;
    dl_eval_req q[2];
    q[0] = (dl_eval_req){.s = s, .pre = pre, .nkeys = nkeys, .nargs = nargs, .keys = keys,
                         .keylens = keylens, .args = args, .arglens = arglens};
    if (!post) { /* one request: dl_eval_read_all's work for n = 1, shorter */
        int by_text = 0;
        int rc = queue(c, &q[0], 0, err);
        if (!rc) rc = dl_conn_flush(c, deadline, err);
        if (rc) return rc;
        rc = read_one(c, deadline, &q[0], out, err);
        if (!rc) rc = fallback(c, &q[0], &by_text, out, err);
        if (!rc && by_text) {
            rc = dl_conn_flush(c, deadline, err);
            if (!rc) rc = read_one(c, deadline, &q[0], out, err);
        }
        if (rc) {
            if (*out) freeReplyObject(*out);
            *out = NULL;
            c->broken = 1; /* a reply unread, or a request queued and not sent */
        }
        return rc;
    }
    size_t n = 1;
    if (post)
        q[n++] = (dl_eval_req){.s = post->script, .with_prev = 1, .nkeys = post->nkeys,
                               .nargs = post->nargs, .keys = post->keys,
                               .keylens = post->keylens, .args = post->args,
                               .arglens = post->arglens};
    int rc = DLOCK_OK;
    for (size_t i = 0; i < n && !rc; i++) rc = queue(c, &q[i], 0, err);
    if (!rc) rc = dl_conn_flush(c, deadline, err);
    if (rc) return rc;
    redisReply *r[2];
    rc = dl_eval_read_all(c, deadline, q, n, r, err);
    if (post && r[1]) freeReplyObject(r[1]);
    /* the main reply stands whatever becomes of the post's: a record lost
     * costs the record, never the call (the connection is dropped; err,
     * which tells the post's failure, is not read on success) */
    if (r[0]) {
        *out = r[0];
        return DLOCK_OK;
    }
    return rc;
}

int dl_eval(dl_conn *c, int64_t deadline, dl_script *s, int nkeys, const char **keys,
            const size_t *keylens, int nargs, const char **args, const size_t *arglens,
            redisReply **out, dl_err *err) {
    return dl_eval_opt(c, deadline, 0, s, nkeys, keys, keylens, nargs, args, arglens, out, err);
}

typedef struct {
    dl_conn *first;            /* the connection the call began on */
    dl_call *post;             /* goes along when the call is redirected */
    const char *pre;
    int64_t deadline;
    dl_script *s;
    int nkeys, nargs;
    const char **keys, **args;
    const size_t *keylens, *arglens;
} eval_ctx;

/* The call again on conn, where a redirection sent it. With wait_replicas,
 * the WAIT goes there too: WAIT counts a connection's own writes, and the
 * first connection, which wrote nothing, would find every replica up to
 * date. */
static int eval_redirected(void *ctx, dl_conn *conn, int asking, redisReply **out, dl_err *err) {
    eval_ctx *x = ctx;
    dlock_client *cl = x->first->node->client;
    conn->post = x->post;
    int rc = eval_on(conn, asking ? "ASKING" : x->pre, x->deadline, x->s, x->nkeys, x->keys,
                     x->keylens, x->nargs, x->args, x->arglens, out, err);
    conn->post = NULL;
    if (!rc && cl->wait_replicas > 0 && *out && (*out)->type != REDIS_REPLY_ERROR) {
        long long acks = 0;
        dl_err werr = {0};
        x->first->redirect_acks =
            dl_conn_wait_replicas(cl, conn, cl->wait_replicas_timeout_ms, 0, &acks, &werr) ? 0
                                                                                          : acks;
    }
    return rc;
}

int dl_eval_opt(dl_conn *c, int64_t deadline, int opts, dl_script *s, int nkeys,
                const char **keys, const size_t *keylens, int nargs, const char **args,
                const size_t *arglens, redisReply **out, dl_err *err) {
    eval_ctx x = {.first = c, .post = c->post, .pre = opts & DL_EVAL_PING_FIRST ? "PING" : NULL,
                  .deadline = deadline, .s = s, .nkeys = nkeys, .nargs = nargs, .keys = keys,
                  .args = args, .keylens = keylens, .arglens = arglens};
    c->redirect_acks = -1;
    int rc = eval_on(c, x.pre, deadline, s, nkeys, keys, keylens, nargs, args, arglens, out, err);
    dlock_client *cl = c->node ? c->node->client : NULL;
    /* Redis Cluster: follow MOVED and ASK, wait out TRYAGAIN (a multi-key
     * script while its slot migrates) */
    if (!rc && cl)
        rc = dl_follow_redirects(cl, c->node, deadline, eval_redirected, &x, out, err);
    return rc;
}

int dl_client_eval(dlock_client *c, dl_script *s, int nkeys, const char **keys,
                   const size_t *keylens, int nargs, const char **args, const size_t *arglens,
                   redisReply **out, dl_err *err) {
    int64_t deadline = dl_cmd_deadline(c);
    dl_conn *conn = NULL;
    int rc = nkeys > 0 ? dl_pool_get_key(c, keys[0], keylens[0], deadline, &conn, err)
                       : dl_pool_get(c, deadline, &conn, err);
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

/* WAIT for c->wait_replicas replicas on conn (or the count already taken
 * where a redirected write went: dl_eval_opt). WAIT counts the replicas that
 * acknowledged this connection's own latest write. */
int dl_conn_wait_replicas(const dlock_client *c, dl_conn *conn, int64_t timeout_ms,
                          int64_t io_deadline, long long *acks, dl_err *err) {
    char n[24], ms[24];
    if (conn->redirect_acks >= 0) { /* waited for where the write went */
        *acks = conn->redirect_acks;
        conn->redirect_acks = -1;
        return DLOCK_OK;
    }
    if (timeout_ms < 1) timeout_ms = 1;
    const char *argv[3] = {"WAIT", n, ms};
    size_t lens[3] = {4, dl_fmt_ll(n, c->wait_replicas), dl_fmt_ll(ms, timeout_ms)};
    redisReply *r = NULL;
    *acks = 0;
    if (!io_deadline) io_deadline = dl_deadline(timeout_ms + c->command_timeout_ms);
    int rc = dl_conn_command(conn, io_deadline, 3, argv, lens, &r, err);
    if (!rc) rc = dl_reply_expect_int(r, "WAIT", acks, err);
    if (r) freeReplyObject(r);
    return rc;
}
