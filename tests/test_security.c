/* Security: a user restricted by ACL to a key prefix can lock within it and
 * gets a clear DLOCK_EAUTH (NOPERM) outside it; owner tokens are 128 random
 * bits, unique, and neither guessing nor replaying an old token releases or
 * extends someone else's lock. */
#include "harness.h"

#include <pthread.h>

#include <ctype.h>
#include <stdlib.h>

static int is_hex32(const char *t)
{
    if (strlen(t) != DLOCK_TOKEN_LEN) return 0;
    for (const char *p = t; *p; p++)
        if (!isxdigit((unsigned char)*p) || isupper((unsigned char)*p)) return 0;
    return 1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

static int g_fair_rc = -1;

/* A fair waiter (test_security's handoff step). */
static void *fair_waiter(void *arg)
{
    g_fair_rc = dlock_acquire(arg, 10000, 30000, NULL);
    return NULL;
}

int main(void)
{
    th_init("security");
    th_server *s = th_server_start(NULL);
    redisContext *rc = th_redis(s);

    /* ---- ACL: the rules a user needs for the locks named "app:*" ---- */
    th_cmd_ok(rc, "ACL SETUSER app on >appSecret42 resetkeys resetchannels"
                  " ~app:* ~redisson_lock_token:{app:* ~redisson_lock__channel:{app:*"
                  " ~dlock_waiters:{app:* &redisson_lock__channel:{app:*"
                  " -@all +@connection +@read +@write +@scripting +@pubsub -@dangerous");
    char url[256];
    snprintf(url, sizeof url, "redis://app:appSecret42@127.0.0.1:%d", th_server_port(s));
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    dlock_lock *in = th_lock(c, "app:orders", DLOCK_KIND_PLAIN);
    uint64_t fence = 0;
    ASSERT_LOK(in, dlock_acquire(in, DLOCK_NOWAIT, 5000, &fence));
    ASSERT_U64_GT(fence, 0);
    ASSERT_LOK(in, dlock_release(in));
    /* without +time (the recipe before fence counters followed the clock)
     * the counter is a plain INCR from 1; with it, every token is
     * max(counter + 1, the server's clock in us) (DL_LUA_FENCE). Neither
     * expires. */
    ASSERT_U64_EQ(fence, 1);
    ASSERT_EQ(th_cmd_int(rc, "PTTL redisson_lock_token:{app:orders}"), -1);
    /* ... and a counter INCR cannot count on, without the clock: the acquire
     * fails with nothing held (the script wrote the lock before it found out,
     * and the library gives it back; before: held for its lease by nobody) */
    th_cmd_ok(rc, "SET redisson_lock_token:{app:bad} abc");
    dlock_lock *badl = th_lock(c, "app:bad", DLOCK_KIND_PLAIN);
    dlock_lock *badr = th_lock(c, "app:bad2", DLOCK_KIND_REENTRANT);
    th_cmd_ok(rc, "SET redisson_lock_token:{app:bad2} abc");
    ASSERT_LCODE(badl, dlock_acquire(badl, DLOCK_NOWAIT, 5000, NULL), DLOCK_ESERVER);
    th_log("a bad counter without the clock: %s", dlock_lock_errmsg(badl));
    ASSERT_LCODE(badr, dlock_acquire(badr, DLOCK_NOWAIT, 5000, NULL), DLOCK_ESERVER);
    ASSERT_EQ(dlock_lock_holding(badl), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS app:bad"), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS app:bad2"), 0);
    dlock_lock_free(badl);
    dlock_lock_free(badr);
    /* the fair lock's handoff under the same conditions: the release
     * completes and holds nothing (before: it deleted the lock, then failed,
     * and the handle still counted its validity), and the waiter, whose
     * client may read the clock, takes the lock */
    {
        th_cmd_ok(rc, "ACL SETUSER app ~redisson_lock_queue:{app:* ~redisson_lock_timeout:{app:*"
                      " ~redisson_lock_lease:{app:*");
        dlock_lock *fa = th_lock(c, "app:fair", DLOCK_KIND_FAIR);
        dlock_client *cw = th_client(s, 0);
        dlock_lock *fw = th_lock(cw, "app:fair", DLOCK_KIND_FAIR);
        ASSERT_LOK(fa, dlock_acquire(fa, DLOCK_NOWAIT, 30000, NULL));
        pthread_t bg;
        ASSERT_EQ(pthread_create(&bg, NULL, fair_waiter, fw), 0);
        ASSERT_EVENTUALLY(th_cmd_int(rc, "LLEN redisson_lock_queue:{app:fair}") == 1, 5000);
        th_sleep_ms(100);
        th_cmd_ok(rc, "SET redisson_lock_token:{app:fair} abc");
        int frc = dlock_release(fa);
        th_log("fair release with no token to hand over: %s (%s), valid %lld ms", dlock_strerror(frc),
               dlock_lock_errmsg(fa), (long long)dlock_lock_valid_ms(fa));
        ASSERT_LOK(fa, frc);
        ASSERT_EQ(dlock_lock_holding(fa), 0);
        ASSERT_EQ(dlock_lock_valid_ms(fa), 0);
        pthread_join(bg, NULL);
        ASSERT_LOK(fw, g_fair_rc);
        th_cmd_ok(rc, "ACL SETUSER app resetkeys ~app:* ~redisson_lock_token:{app:*"
                      " ~redisson_lock__channel:{app:* ~dlock_waiters:{app:*");
        ASSERT_LOK(fw, dlock_release(fw));
        dlock_lock_free(fa);
        dlock_lock_free(fw);
        dlock_client_free(cw);
    }
    th_cmd_ok(rc, "ACL SETUSER app +time");
    ASSERT_LOK(in, dlock_acquire(in, DLOCK_NOWAIT, 5000, &fence));
    ASSERT_U64_GT(fence, 1000000000000000ULL);
    ASSERT_EQ(th_cmd_int(rc, "PTTL redisson_lock_token:{app:orders}"), -1);
    ASSERT_LOK(in, dlock_release(in));
    /* waiting works too: the unlock channel is allowed */
    dlock_lock *in2 = th_lock(c, "app:orders", DLOCK_KIND_PLAIN);
    ASSERT_LOK(in, dlock_acquire(in, DLOCK_NOWAIT, 300, NULL));
    int64_t t0 = th_now_ms();
    ASSERT_LOK(in2, dlock_acquire(in2, 3000, 5000, NULL));
    ASSERT_LT(th_now_ms() - t0, 2500);
    ASSERT_LOK(in2, dlock_release(in2));
    /* outside the prefix: a clear refusal, nothing written */
    dlock_lock *out = th_lock(c, "billing:run", DLOCK_KIND_PLAIN);
    ASSERT_LCODE(out, dlock_acquire(out, DLOCK_NOWAIT, 5000, NULL), DLOCK_EAUTH);
    ASSERT(strstr(dlock_lock_errmsg(out), "NOPERM") != NULL);
    th_log("outside the prefix: %s", dlock_lock_errmsg(out));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS billing:run"), 0);
    /* a wrong password is refused, and never repeated in the message */
    snprintf(url, sizeof url, "redis://app:notTheSecret77@127.0.0.1:%d", th_server_port(s));
    dlock_client *bad = NULL;
    ASSERT_CCODE(bad, dlock_client_new(&o, &bad), DLOCK_EAUTH);
    ASSERT(strstr(dlock_errmsg(bad), "notTheSecret77") == NULL);
    dlock_client_free(bad);
    dlock_lock_free(in);
    dlock_lock_free(in2);
    dlock_lock_free(out);
    dlock_client_free(c);

    /* ---- tokens: 128 random bits, all different ---- */
    dlock_client *a = th_client(s, 0);
    dlock_client *b = th_client(s, 0);
    enum { N = 500 };
    static char tokens[N][DLOCK_TOKEN_LEN + 1];
    for (int i = 0; i < N; i++) {
        ASSERT_COK(a, dlock_acquire_token(a, "sec:t", DLOCK_CSTR, 0, 5000, tokens[i], NULL));
        ASSERT(is_hex32(tokens[i]));
        ASSERT_COK(a, dlock_release_token(a, "sec:t", DLOCK_CSTR, tokens[i]));
    }
    qsort(tokens, N, sizeof tokens[0], cmp_str);
    for (int i = 1; i < N; i++) ASSERT(strcmp(tokens[i - 1], tokens[i]) != 0);
    /* client ids (the reentrant owner prefix) differ too */
    ASSERT(strcmp(dlock_client_id(a), dlock_client_id(b)) != 0);

    /* guessing: random tokens never release or extend the holder's lock */
    char held[DLOCK_TOKEN_LEN + 1];
    ASSERT_COK(a, dlock_acquire_token(a, "sec:g", DLOCK_CSTR, 0, 10000, held, NULL));
    for (int i = 0; i < 300; i++) {
        char guess[DLOCK_TOKEN_LEN + 1];
        ASSERT_COK(b, dlock_acquire_token(b, "sec:other", DLOCK_CSTR, 0, 1000, guess, NULL));
        ASSERT_COK(b, dlock_release_token(b, "sec:other", DLOCK_CSTR, guess));
        ASSERT_CCODE(b, dlock_release_token(b, "sec:g", DLOCK_CSTR, guess), DLOCK_ENOTOWNER);
        ASSERT_CCODE(b, dlock_extend_token(b, "sec:g", DLOCK_CSTR, guess, 60000), DLOCK_ENOTOWNER);
    }
    /* near misses: the holder's token with one character changed */
    for (int i = 0; i < DLOCK_TOKEN_LEN; i++) {
        char near[DLOCK_TOKEN_LEN + 1];
        memcpy(near, held, sizeof near);
        near[i] = near[i] == '0' ? '1' : '0';
        ASSERT_CCODE(b, dlock_release_token(b, "sec:g", DLOCK_CSTR, near), DLOCK_ENOTOWNER);
    }
    char *v = th_cmd_str(rc, "GET sec:g");
    ASSERT_STR_EQ(v, held);
    free(v);
    ASSERT(th_cmd_int(rc, "PTTL sec:g") <= 10000);

    /* replay: an old owner's token is worthless once the lock changed hands */
    ASSERT_COK(a, dlock_release_token(a, "sec:g", DLOCK_CSTR, held));
    char next[DLOCK_TOKEN_LEN + 1];
    ASSERT_COK(b, dlock_acquire_token(b, "sec:g", DLOCK_CSTR, 0, 10000, next, NULL));
    ASSERT_CCODE(a, dlock_release_token(a, "sec:g", DLOCK_CSTR, held), DLOCK_ENOTOWNER);
    ASSERT_CCODE(a, dlock_extend_token(a, "sec:g", DLOCK_CSTR, held, 60000), DLOCK_ENOTOWNER);
    v = th_cmd_str(rc, "GET sec:g");
    ASSERT_STR_EQ(v, next);
    free(v);
    /* ...and a handle whose lease was taken over cannot renew it either */
    dlock_lock *h = th_lock(a, "sec:h", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 200, NULL));
    th_sleep_ms(300);
    dlock_lock *h2 = th_lock(b, "sec:h", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(h2, dlock_acquire(h2, DLOCK_NOWAIT, 10000, NULL));
    ASSERT_LCODE(h, dlock_extend(h, 60000), DLOCK_ELOST);
    ASSERT_LCODE(h, dlock_release(h), DLOCK_ENOTHELD);
    int held2 = 0;
    ASSERT_LOK(h2, dlock_lock_check(h2, &held2, NULL));
    ASSERT_EQ(held2, 1);

    dlock_lock_free(h);
    dlock_lock_free(h2);
    dlock_client_free(a);
    dlock_client_free(b);
    redisFree(rc);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
