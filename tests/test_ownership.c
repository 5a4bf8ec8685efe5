/* Ownership: a release or extend by a non-owner is refused (DLOCK_ENOTOWNER)
 * and leaves the key intact; a release after the lease expired reports
 * DLOCK_ELOST and never deletes the new owner's lock (both kinds); the
 * lost-lease callback fires when the key is deleted behind the watchdog's back
 * (within ~lease/3 + margin) and dlock_lock_is_lost reports it. */
#include "harness.h"

#include <stdatomic.h>
#include <stdlib.h>

#define WD_LEASE 900

static atomic_int g_lost_calls;
static atomic_int g_lost_reason;
static atomic_llong g_lost_at;
static _Atomic(dlock_lock *) g_lost_lock;

static void on_lost(dlock_lock *l, int reason, void *ud)
{
    (void)ud;
    atomic_store(&g_lost_lock, l);
    atomic_store(&g_lost_reason, reason);
    atomic_store(&g_lost_at, (long long)th_now_ms());
    atomic_fetch_add(&g_lost_calls, 1);
}

static void token_ops(dlock_client *c, redisContext *rc)
{
    const char *name = "own:token";
    char token[DLOCK_TOKEN_LEN + 1];
    memset(token, 'x', sizeof token);
    ASSERT_COK(c, dlock_acquire_token(c, name, DLOCK_CSTR, DLOCK_NOWAIT, 10000, token, NULL));
    ASSERT_EQ(strlen(token), DLOCK_TOKEN_LEN);
    for (int i = 0; i < DLOCK_TOKEN_LEN; i++)
        ASSERT_MSG(strchr("0123456789abcdef", token[i]) != NULL, "token %s is not hex", token);
    char *v = th_cmd_str(rc, "GET %s", name);
    ASSERT_STR_EQ(v, token);
    free(v);

    /* wrong tokens: refused, key intact */
    char wrong[DLOCK_TOKEN_LEN + 1];
    memcpy(wrong, token, sizeof wrong);
    wrong[0] = wrong[0] == '0' ? '1' : '0';
    ASSERT_CCODE(c, dlock_release_token(c, name, DLOCK_CSTR, wrong), DLOCK_ENOTOWNER);
    int code = dlock_release_token(c, name, DLOCK_CSTR, "");
    ASSERT_MSG(code == DLOCK_EINVAL || code == DLOCK_ENOTOWNER, "empty token: %s",
               dlock_strerror(code));
    ASSERT_CCODE(c, dlock_release_token(c, name, DLOCK_CSTR, "0123456789abcdef0123456789abcdef"),
                 DLOCK_ENOTOWNER);
    ASSERT_CCODE(c, dlock_extend_token(c, name, DLOCK_CSTR, wrong, 60000), DLOCK_ENOTOWNER);
    v = th_cmd_str(rc, "GET %s", name);
    ASSERT_STR_EQ(v, token);
    free(v);
    ASSERT_LE(th_cmd_int(rc, "PTTL %s", name), 10000);

    /* a second token acquire is busy */
    char t2[DLOCK_TOKEN_LEN + 1];
    ASSERT_CCODE(c, dlock_acquire_token(c, name, DLOCK_CSTR, DLOCK_NOWAIT, 10000, t2, NULL),
                 DLOCK_EBUSY);

    /* a handle does not own a token lock either */
    dlock_lock *l = th_lock(c, name, DLOCK_KIND_PLAIN);
    ASSERT_LCODE(l, dlock_release(l), DLOCK_ENOTHELD);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 1000, NULL), DLOCK_EBUSY);
    dlock_lock_free(l);
    v = th_cmd_str(rc, "GET %s", name);
    ASSERT_STR_EQ(v, token);
    free(v);

    /* the owner extends and releases; after that the token owns nothing */
    ASSERT_COK(c, dlock_extend_token(c, name, DLOCK_CSTR, token, 60000));
    ASSERT_GT(th_cmd_int(rc, "PTTL %s", name), 10000);
    ASSERT_COK(c, dlock_release_token(c, name, DLOCK_CSTR, token));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", name), 0);
    ASSERT_CCODE(c, dlock_release_token(c, name, DLOCK_CSTR, token), DLOCK_ENOTOWNER);
    ASSERT_CCODE(c, dlock_extend_token(c, name, DLOCK_CSTR, token, 1000), DLOCK_ENOTOWNER);

    /* expired token: refused, and the next owner's key is untouched */
    ASSERT_COK(c, dlock_acquire_token(c, name, DLOCK_CSTR, DLOCK_NOWAIT, 200, token, NULL));
    ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS %s", name) == 0, 2000);
    ASSERT_COK(c, dlock_acquire_token(c, name, DLOCK_CSTR, DLOCK_NOWAIT, 10000, t2, NULL));
    ASSERT(strcmp(t2, token) != 0);
    ASSERT_CCODE(c, dlock_release_token(c, name, DLOCK_CSTR, token), DLOCK_ENOTOWNER);
    ASSERT_CCODE(c, dlock_extend_token(c, name, DLOCK_CSTR, token, 1000), DLOCK_ENOTOWNER);
    v = th_cmd_str(rc, "GET %s", name);
    ASSERT_STR_EQ(v, t2);
    free(v);
    ASSERT_COK(c, dlock_release_token(c, name, DLOCK_CSTR, t2));

    /* a reentrant (hash) lock is not a token lock: refused, untouched */
    dlock_lock *r = th_lock(c, "own:hash", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 10000, NULL));
    int rc_code = dlock_release_token(c, "own:hash", DLOCK_CSTR, dlock_lock_token(r));
    ASSERT_MSG(rc_code != DLOCK_OK, "release_token deleted a reentrant lock");
    ASSERT_EQ(th_cmd_int(rc, "EXISTS own:hash"), 1);
    ASSERT_LOK(r, dlock_release(r));
    dlock_lock_free(r);
}

/* A handle whose lease expired and whose lock was taken by another owner. */
static void expired_release(dlock_client *c, dlock_client *other, redisContext *rc,
                            const char *name, dlock_kind kind)
{
    dlock_lock *a = th_lock(c, name, kind);
    dlock_lock *b = th_lock(other, name, kind);
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 250, NULL));
    ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS %s", name) == 0, 2000);
    ASSERT_LOK(b, dlock_acquire(b, DLOCK_NOWAIT, 10000, NULL));
    ASSERT_EQ(dlock_lock_holding(a), 1); /* a still believes (no round trip) */
    int held = 1;
    ASSERT_LOK(a, dlock_lock_check(a, &held, NULL));
    ASSERT_EQ(held, 0);
    ASSERT_LCODE(a, dlock_extend(a, 5000), DLOCK_ELOST);
    ASSERT_EQ(dlock_lock_holding(a), 0);
    ASSERT_EQ(dlock_lock_is_lost(a), 1);
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ENOTHELD);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", name), 1);
    ASSERT_LOK(b, dlock_lock_check(b, &held, NULL));
    ASSERT_EQ(held, 1);
    ASSERT_LOK(b, dlock_release(b));

    /* same, released directly (not extended) */
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 250, NULL));
    ASSERT_EQ(dlock_lock_is_lost(a), 0);
    ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS %s", name) == 0, 2000);
    ASSERT_LOK(b, dlock_acquire(b, DLOCK_NOWAIT, 10000, NULL));
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);
    ASSERT_EQ(dlock_lock_holding(a), 0);
    ASSERT_EQ(dlock_lock_is_lost(a), 1);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", name), 1);
    ASSERT_LOK(b, dlock_lock_check(b, &held, NULL));
    ASSERT_EQ(held, 1);
    ASSERT_LOK(b, dlock_release(b));

    /* expired and nobody took it: still ELOST */
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 250, NULL));
    ASSERT_EVENTUALLY(th_cmd_int(rc, "EXISTS %s", name) == 0, 2000);
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);
    dlock_lock_free(b);
    dlock_lock_free(a);
}

static void lost_callback(dlock_client *c, dlock_client *other, redisContext *rc,
                          const char *name, dlock_kind kind, int take_over)
{
    atomic_store(&g_lost_calls, 0);
    atomic_store(&g_lost_lock, (dlock_lock *)NULL);
    int ud = 42;
    dlock_lock *l = th_lock(c, name, kind);
    dlock_lock_on_lost(l, on_lost, &ud);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    /* survive a renewal first */
    th_sleep_ms(WD_LEASE / 2);
    ASSERT_EQ(atomic_load(&g_lost_calls), 0);
    ASSERT_EQ(dlock_lock_is_lost(l), 0);
    int64_t t_del = th_now_ms();
    ASSERT_EQ(th_cmd_int(rc, "DEL %s", name), 1);
    dlock_lock *o = NULL;
    if (take_over) {
        o = th_lock(other, name, kind);
        ASSERT_LOK(o, dlock_acquire(o, DLOCK_NOWAIT, 10000, NULL));
    }
    ASSERT_EVENTUALLY(atomic_load(&g_lost_calls) > 0, WD_LEASE / 3 + 1000);
    int64_t took = (int64_t)atomic_load(&g_lost_at) - t_del;
    th_log("%s: lost callback %lld ms after DEL (lease %d)", name, (long long)took, WD_LEASE);
    ASSERT_LE(took, WD_LEASE / 3 + 700);
    ASSERT(atomic_load(&g_lost_lock) == l);
    ASSERT_EQ(atomic_load(&g_lost_reason), DLOCK_LOST_TAKEN);
    ASSERT_EQ(dlock_lock_is_lost(l), 1);
    /* called once per loss */
    th_sleep_ms(WD_LEASE / 2);
    ASSERT_EQ(atomic_load(&g_lost_calls), 1);
    ASSERT_LCODE(l, dlock_release(l), DLOCK_ELOST);
    if (o) {
        int held = 0;
        ASSERT_LOK(o, dlock_lock_check(o, &held, NULL));
        ASSERT_EQ(held, 1);
        ASSERT_LOK(o, dlock_release(o));
        dlock_lock_free(o);
    }
    /* a new acquire clears the flag */
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_EQ(dlock_lock_is_lost(l), 0);
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_on_lost(l, NULL, NULL);
    dlock_lock_free(l);
}

int main(void)
{
    th_init("ownership");
    th_server *s = th_server_start(NULL);
    dlock_client *c = th_client(s, WD_LEASE);
    dlock_client *other = th_client(s, WD_LEASE);
    redisContext *rc = th_redis(s);

    token_ops(c, rc);
    expired_release(c, other, rc, "own:exp:plain", DLOCK_KIND_PLAIN);
    expired_release(c, other, rc, "own:exp:re", DLOCK_KIND_REENTRANT);
    lost_callback(c, other, rc, "own:lost:plain", DLOCK_KIND_PLAIN, 0);
    lost_callback(c, other, rc, "own:lost:re", DLOCK_KIND_REENTRANT, 1);
    lost_callback(c, other, rc, "own:lost:plain2", DLOCK_KIND_PLAIN, 1);

    redisFree(rc);
    dlock_client_free(other);
    dlock_client_free(c);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
