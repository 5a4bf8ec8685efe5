/* The async lock's kinds: for each, the keys a handle names (derived once,
 * when the handle is made) and how each of its requests is built from them,
 * on the blocking kinds' own scripts (lock_plain.c, lock_reentrant.c,
 * lock_fair.c, lock_rw.c), so that async and blocking clients exclude each
 * other on one name and wake each other's waiters.
 *
 * A table of its own, not the blocking kinds' dl_kind_ops.call: those
 * describe a dlock_lock's calls from its fields (its dl_handle, kind_state,
 * the thread owner written into l->token, l->listening, the client's fair
 * wait, dl_owner_expect's count over the client's handles), and an async
 * request is built from a request's own state instead (its token, whether
 * it waits, whether it came after the subscription, the handle's holds when
 * it was sent), and must outlive its handle (a give back). Keeping a
 * dlock_lock inside every async handle to borrow those descriptions would
 * cost each handle the blocking handle's kilobyte and a copy of the request
 * state into it before every call.
 *
 * Owners: the plain lock's is a fresh token per acquire; every other kind's
 * is the handle's own random token (the write side's with ":write", as the
 * blocking write owner is its reader identity + ":write"), never
 * <client id>:<thread id>, which on one loop thread would make every handle
 * re-enter every other's hold. */
#include <stdlib.h>
#include <string.h>

#include "async.h"

/* The fair lock's thread wait time W: the client's
 * (dlock_async_client_set_fair_wait), read by each attempt; and the
 * waiter's keep-alive, a third of W up to the default's, as the blocking
 * fair lock's (lock_fair.c). */
static int64_t fair_w(const dl_aargs *a) {
    return a->fair_wait_ms > 0 ? a->fair_wait_ms : DLOCK_DEFAULT_FAIR_WAIT_MS;
}

static int64_t fair_keepalive(int64_t w) {
    return (w < DLOCK_DEFAULT_FAIR_WAIT_MS ? w : DLOCK_DEFAULT_FAIR_WAIT_MS) / 3;
}

/* what each kind's k->s[] holds */
enum { S_LOCK = 0, S_FENCE = 1 };
enum { PL_WAITERS = 2, PL_PREFIX };                     /* plain */
enum { RE_CHAN = 2 };                                   /* reentrant */
enum { FA_QUEUE = 2, FA_TIMEOUTS, FA_LEASES, FA_CHAN }; /* fair */
enum { RD_PREFIX = 2, RD_WAITERS, RD_CHAN, RD_BRACE };  /* read */
enum { WR_WAITERS = 2, WR_CHAN, WR_BRACE };             /* write */

#define KEY(c, i, k, j) ((c)->keys[i] = (k)->s[j], (c)->keylens[i] = (k)->len[j])
#define ARG(c, i, p, n) ((c)->args[i] = (p), (c)->arglens[i] = (n))

static size_t lease_arg(dl_acall *c, int64_t ms) { return dl_fmt_ll(c->lease, ms); }
static size_t expect_arg(dl_acall *c, int64_t n) { return dl_fmt_ll(c->expect, n); }

static void plain_call(const dl_akeys *k, const dl_aargs *a, dl_acall *c) {
    KEY(c, 0, k, S_LOCK);
    ARG(c, 0, a->token, a->token_len);
    c->nkeys = 1, c->nargs = 2;
    switch (a->what) {
    case DL_AR_ATTEMPT: /* KEYS lock, fence, waiters; ARGV token, lease, recheck, registered */
        c->s = &dl_script_plain_acquire;
        KEY(c, 1, k, S_FENCE), KEY(c, 2, k, PL_WAITERS);
        c->nkeys = 3;
        ARG(c, 1, c->lease, lease_arg(c, a->lease_ms));
        if (a->queue) ARG(c, 2, DL_STR(DL_WAIT_RECHECK_MS), sizeof DL_STR(DL_WAIT_RECHECK_MS) - 1);
        else ARG(c, 2, "0", 1);
        ARG(c, 3, a->reg ? "1" : "0", 1);
        c->nargs = 4;
        break;
    case DL_AR_RELEASE: /* KEYS lock, waiters; ARGV token, prefix */
    case DL_AR_ABANDON:
        c->s = a->what == DL_AR_RELEASE ? &dl_script_plain_release : &dl_script_plain_abandon;
        KEY(c, 1, k, PL_WAITERS);
        c->nkeys = 2;
        ARG(c, 1, k->s[PL_PREFIX], k->len[PL_PREFIX]);
        break;
    default: /* extend: KEYS lock; ARGV token, lease */
        c->s = &dl_script_plain_extend;
        ARG(c, 1, c->lease, lease_arg(c, a->lease_ms));
        break;
    }
}

static void reentrant_call(const dl_akeys *k, const dl_aargs *a, dl_acall *c) {
    KEY(c, 0, k, S_LOCK);
    c->nkeys = 2, c->nargs = 2;
    switch (a->what) {
    case DL_AR_ATTEMPT: /* KEYS lock, fence; ARGV lease, owner */
        c->s = &dl_script_reentrant_acquire;
        KEY(c, 1, k, S_FENCE);
        ARG(c, 0, c->lease, lease_arg(c, a->lease_ms));
        ARG(c, 1, a->token, a->token_len);
        break;
    case DL_AR_RELEASE: /* KEYS lock, channel; ARGV lease ('0': unchanged), owner, expected */
        c->s = &dl_script_reentrant_release;
        KEY(c, 1, k, RE_CHAN);
        ARG(c, 0, "0", 1);
        ARG(c, 1, a->token, a->token_len);
        ARG(c, 2, c->expect, expect_arg(c, a->expect));
        c->nargs = 3;
        break;
    default: /* extend: KEYS lock; ARGV owner, lease */
        c->s = &dl_script_reentrant_extend;
        c->nkeys = 1;
        ARG(c, 0, a->token, a->token_len);
        ARG(c, 1, c->lease, lease_arg(c, a->lease_ms));
        break;
    }
}

static void fair_call(const dl_akeys *k, const dl_aargs *a, dl_acall *c) {
    for (int i = 0; i < 5; i++) KEY(c, i, k, i); /* lock, fence, queue, deadlines, leases */
    c->nkeys = 5;
    switch (a->what) {
    case DL_AR_ATTEMPT: /* ARGV lease, owner, mode, queue, W, keep-alive, joining, prefix */
        c->s = &dl_script_fair_acquire;
        ARG(c, 0, c->lease, lease_arg(c, a->lease_ms));
        ARG(c, 1, a->token, a->token_len);
        /* 'w': an attempt of an acquire that queued (it takes up a grant
         * it finds); 'r': a new acquire or a re-entry */
        ARG(c, 2, a->held > 0 || !a->reg ? "r" : "w", 1);
        ARG(c, 3, a->queue ? "1" : "0", 1);
        ARG(c, 4, c->wait, dl_fmt_ll(c->wait, fair_w(a)));
        ARG(c, 5, c->expect, dl_fmt_ll(c->expect, fair_keepalive(fair_w(a))));
        ARG(c, 6, a->joining ? "1" : "0", 1);
        ARG(c, 7, k->s[FA_CHAN], k->len[FA_CHAN]);
        c->nargs = 8;
        break;
    case DL_AR_RELEASE: /* ARGV prefix, lease ('0': unchanged), owner, expected */
        c->s = &dl_script_fair_release;
        ARG(c, 0, k->s[FA_CHAN], k->len[FA_CHAN]);
        ARG(c, 1, "0", 1);
        ARG(c, 2, a->token, a->token_len);
        ARG(c, 3, c->expect, expect_arg(c, a->expect));
        c->nargs = 4;
        break;
    case DL_AR_ABANDON: /* ARGV prefix, owner */
        c->s = &dl_script_fair_abandon;
        ARG(c, 0, k->s[FA_CHAN], k->len[FA_CHAN]);
        ARG(c, 1, a->token, a->token_len);
        c->nargs = 2;
        break;
    default: /* extend: KEYS lock; ARGV owner, lease */
        c->s = &dl_script_fair_extend;
        c->nkeys = 1;
        ARG(c, 0, a->token, a->token_len);
        ARG(c, 1, c->lease, lease_arg(c, a->lease_ms));
        c->nargs = 2;
        break;
    }
}

/* "next:<ms>": the waiter ahead was granted the lock, come back in <ms>
 * (when a grant not taken up has run out), not now (lock_fair.c's
 * fair_message). Anything else ("granted:<fence>", Redisson's "0"): now. */
static int fair_message(const redisReply *msg, int64_t *ms) {
    static const char pfx[] = "next:";
    const size_t plen = sizeof pfx - 1;
    if (msg->type != REDIS_REPLY_STRING || msg->len <= plen || msg->len > plen + 9 ||
        memcmp(msg->str, pfx, plen) != 0)
        return 0;
    int64_t v = 0;
    for (size_t i = plen; i < msg->len; i++) {
        unsigned char ch = (unsigned char)msg->str[i];
        if (ch < '0' || ch > '9') return 0;
        v = v * 10 + (ch - '0');
    }
    *ms = v;
    return 1;
}

static void read_call(const dl_akeys *k, const dl_aargs *a, dl_acall *c) {
    KEY(c, 0, k, S_LOCK);
    c->nargs = 2;
    switch (a->what) {
    case DL_AR_ATTEMPT: /* KEYS lock, fence, timeout prefix, waiting writers; ARGV lease, owner */
        c->s = &dl_script_read_acquire;
        KEY(c, 1, k, S_FENCE), KEY(c, 2, k, RD_PREFIX), KEY(c, 3, k, RD_WAITERS);
        c->nkeys = 4;
        ARG(c, 0, c->lease, lease_arg(c, a->lease_ms));
        ARG(c, 1, a->token, a->token_len);
        break;
    case DL_AR_RELEASE: /* KEYS lock, channel, timeout prefix, "{N}"; ARGV owner, expected */
        c->s = &dl_script_read_release;
        KEY(c, 1, k, RD_CHAN), KEY(c, 2, k, RD_PREFIX), KEY(c, 3, k, RD_BRACE);
        c->nkeys = 4;
        ARG(c, 0, a->token, a->token_len);
        ARG(c, 1, c->expect, expect_arg(c, a->expect));
        break;
    default: /* extend: KEYS lock, timeout prefix, "{N}"; ARGV owner, lease */
        c->s = &dl_script_read_extend;
        KEY(c, 1, k, RD_PREFIX), KEY(c, 2, k, RD_BRACE);
        c->nkeys = 3;
        ARG(c, 0, a->token, a->token_len);
        ARG(c, 1, c->lease, lease_arg(c, a->lease_ms));
        break;
    }
}

static void write_call(const dl_akeys *k, const dl_aargs *a, dl_acall *c) {
    KEY(c, 0, k, S_LOCK);
    c->nargs = 2;
    switch (a->what) {
    case DL_AR_ATTEMPT: /* KEYS lock, fence, waiting writers; ARGV lease, owner, queue */
        c->s = &dl_script_write_acquire;
        KEY(c, 1, k, S_FENCE), KEY(c, 2, k, WR_WAITERS);
        c->nkeys = 3;
        ARG(c, 0, c->lease, lease_arg(c, a->lease_ms));
        ARG(c, 1, a->token, a->token_len);
        ARG(c, 2, a->queue ? "1" : "0", 1);
        c->nargs = 3;
        break;
    case DL_AR_RELEASE: /* KEYS lock, channel, "{N}"; ARGV owner, lease ('0'), expected */
        c->s = &dl_script_write_release;
        KEY(c, 1, k, WR_CHAN), KEY(c, 2, k, WR_BRACE);
        c->nkeys = 3;
        ARG(c, 0, a->token, a->token_len);
        ARG(c, 1, "0", 1);
        ARG(c, 2, c->expect, expect_arg(c, a->expect));
        c->nargs = 3;
        break;
    case DL_AR_ABANDON: /* KEYS waiting writers, lock, channel; ARGV owner */
        c->s = &dl_script_write_abandon;
        KEY(c, 0, k, WR_WAITERS), KEY(c, 1, k, S_LOCK), KEY(c, 2, k, WR_CHAN);
        c->nkeys = 3;
        ARG(c, 0, a->token, a->token_len);
        c->nargs = 1;
        break;
    default: /* extend: KEYS lock, "{N}"; ARGV owner, lease */
        c->s = &dl_script_write_extend;
        KEY(c, 1, k, WR_BRACE);
        c->nkeys = 2;
        ARG(c, 0, a->token, a->token_len);
        ARG(c, 1, c->lease, lease_arg(c, a->lease_ms));
        break;
    }
}

/* The keys, as the blocking kinds derive them: (prefix, suffix) around the
 * name's hash tag, "" for none; a NULL prefix: the end of the list. The
 * read side's timeout prefix names its owner ("{N}:<owner>:rwlock_timeout"),
 * and is made in dl_akeys_new. */
struct dl_akeyspec {
    const char *pre, *suf;
};
typedef struct dl_akeyspec keyspec;

#define LOCK_KEYS {"", NULL}, {"redisson_lock_token:", ""}
static const keyspec plain_keys[] = {LOCK_KEYS, {DL_PLAIN_WAITERS_PREFIX, ""},
                                     {"redisson_lock__channel:", ":"}, {NULL, NULL}};
static const keyspec reentrant_keys[] = {LOCK_KEYS, {"redisson_lock__channel:", ""},
                                         {NULL, NULL}};
static const keyspec fair_keys[] = {LOCK_KEYS, {"redisson_lock_queue:", ""},
                                    {"redisson_lock_timeout:", ""},
                                    {"redisson_lock_lease:", ""},
                                    {"redisson_lock__channel:", ""}, {NULL, NULL}};
static const keyspec read_keys[] = {LOCK_KEYS, {"", ":<owner>:rwlock_timeout"},
                                    {"", ":write_waiters"},
                                    {"redisson_rwlock:", ""}, {"", ""}, {NULL, NULL}};
static const keyspec write_keys[] = {LOCK_KEYS, {"", ":write_waiters"},
                                     {"redisson_rwlock:", ""}, {"", ""}, {NULL, NULL}};

/* .chan: the slot of the channel waiters subscribe to (-1: the plain
 * waiter's own, prefix + its acquire's token; -2: the fair waiter's own,
 * "<prefix>:<owner>") */
static const dl_akind kinds[] = {
    {.kind = DLOCK_KIND_PLAIN, .fresh_owner = 1, .abandons = 1, .keys = plain_keys, .chan = -1,
     .call = plain_call, .ops = &dl_plain_ops},
    {.kind = DLOCK_KIND_REENTRANT, .counted = 1, .keys = reentrant_keys, .chan = RE_CHAN,
     .call = reentrant_call, .ops = &dl_reentrant_ops},
    {.kind = DLOCK_KIND_FAIR, .counted = 1, .abandons = 1,
     .keys = fair_keys, .chan = -2, .call = fair_call, .message = fair_message,
     .ops = &dl_fair_ops},
    {.kind = DLOCK_KIND_READ, .counted = 1, .keys = read_keys, .chan = RD_CHAN,
     .call = read_call, .ops = &dl_read_ops},
    {.kind = DLOCK_KIND_WRITE, .counted = 1, .abandons = 1, .keys = write_keys, .chan = WR_CHAN,
     .call = write_call, .ops = &dl_write_ops},
};

const dl_akind *dl_akind_of(dlock_kind kind) {
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (kinds[i].kind == kind) return &kinds[i];
    return NULL;
}

void dl_akeys_unref(dl_akeys *k) {
    if (k && --k->refs <= 0) free(k);
}

/* One allocation for the keys, the owner and the channel: a handle per
 * wait is the async API's memory per wait (bench async_waits). */
dl_akeys *dl_akeys_new(const dl_akind *kind, const char *name, size_t len, dl_err *err) {
    char owner[DLOCK_TOKEN_LEN + 7];
    size_t owner_len = 0;
    if (!kind->fresh_owner) { /* the handle's owner: a random token (write: + ":write") */
        if (dl_random_hex(owner, DLOCK_TOKEN_LEN / 2, err)) return NULL;
        owner_len = DLOCK_TOKEN_LEN;
        if (kind->kind == DLOCK_KIND_WRITE) {
            memcpy(owner + owner_len, ":write", 7);
            owner_len += 6;
        }
    }
    char *tmp[DL_AKEYS_MAX] = {0}; /* derived keys (NULL: the name itself) */
    size_t tl[DL_AKEYS_MAX] = {0}, total = owner_len + 1;
    int n = 0, ok = 1;
    for (; kind->keys[n].pre; n++) {
        const keyspec *ks = &kind->keys[n];
        if (!ks->suf) { /* the name itself */
            tl[n] = len;
        } else if (kind->kind == DLOCK_KIND_READ && n == RD_PREFIX) {
            char suf[DLOCK_TOKEN_LEN + 32];
            snprintf(suf, sizeof suf, ":%.*s:rwlock_timeout", (int)owner_len, owner);
            ok &= (tmp[n] = dl_derive_key("", name, len, suf, &tl[n])) != NULL;
        } else {
            ok &= (tmp[n] = dl_derive_key(ks->pre, name, len, ks->suf, &tl[n])) != NULL;
        }
        total += tl[n] + 1;
    }
    /* the waiter's own channel: plain, prefix + the acquire's token; fair,
     * "redisson_lock__channel:{N}:<owner>"; else one of the keys */
    size_t chan_len = kind->chan == -1   ? tl[PL_PREFIX] + DLOCK_TOKEN_LEN
                      : kind->chan == -2 ? tl[FA_CHAN] + 1 + owner_len
                                         : 0;
    dl_akeys *k = ok ? calloc(1, sizeof *k + total + (chan_len ? chan_len + 1 : 0)) : NULL;
    if (k) {
        k->refs = 1;
        k->kind = kind;
        char *p = k->buf;
        for (int i = 0; i < n; i++) {
            k->s[i] = p;
            memcpy(p, tmp[i] ? tmp[i] : name, tl[i]);
            k->len[i] = (uint32_t)tl[i];
            p += tl[i] + 1;
        }
        k->owner = p;
        memcpy(p, owner, owner_len);
        k->owner_len = (uint32_t)owner_len;
        p += owner_len + 1;
        if (kind->chan == -1) {
            k->chan = p;
            memcpy(p, k->s[PL_PREFIX], tl[PL_PREFIX]); /* the token: dl_akeys_token */
        } else if (kind->chan == -2) {
            k->chan = p;
            snprintf(p, chan_len + 1, "%s:%s", k->s[FA_CHAN], k->owner);
        } else {
            k->chan = k->s[kind->chan];
            chan_len = tl[kind->chan];
        }
        k->chan_len = (uint32_t)chan_len;
    }
    for (int i = 0; i < n; i++) free(tmp[i]);
    if (!k) dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return k;
}

void dl_akeys_token(dl_akeys *k, const char *token) {
    if (k->kind->chan == -1) memcpy(k->chan + k->len[PL_PREFIX], token, DLOCK_TOKEN_LEN);
}
