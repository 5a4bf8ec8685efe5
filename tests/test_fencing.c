/* Fencing tokens: strictly increasing across acquires of one handle, across
 * handles and kinds, and across processes (checked in lock-holding order
 * against the last token a protected resource saw); dlock_fence_current and
 * the counter key "redisson_lock_token:{name}" match. The counter's life
 * (DL_LUA_FENCE): a new counter starts at the server's clock in
 * microseconds and expires a day later; a lost counter (expired, or gone
 * with a restart without persistence) and one from before this scheme (a
 * small number, no expiry) give a token above every token before. */
#include "harness.h"

#include <stdlib.h>
#include <unistd.h>

#define NAME "fence:lock"
#define NPROC 4
#define ROUNDS 25
#define COUNTER_TTL_MS 86400000LL /* DL_FENCE_TTL_MS */

/* The server's clock in microseconds. */
static uint64_t server_us(redisContext *rc)
{
    redisReply *r = th_cmd(rc, "TIME");
    ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
    ASSERT_EQ(r->elements, 2);
    uint64_t us = strtoull(r->element[0]->str, NULL, 10) * 1000000 +
                  strtoull(r->element[1]->str, NULL, 10);
    freeReplyObject(r);
    return us;
}

static uint64_t current(dlock_client *c, const char *name)
{
    uint64_t f = 0;
    ASSERT_COK(c, dlock_fence_current(c, name, DLOCK_CSTR, &f));
    return f;
}

/* Each child acquires ROUNDS times; inside the lock it plays the protected
 * resource: the token must exceed the last one the resource accepted. */
static int child(const th_server *s)
{
    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, NAME, DLOCK_KIND_PLAIN);
    redisContext *rc = th_redis(s);
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t f = 0;
        ASSERT_LOK(l, dlock_acquire(l, 20000, 10000, &f));
        ASSERT_U64_EQ(dlock_lock_fence(l), f);
        char *last = th_cmd_str(rc, "GET fence:resource");
        uint64_t seen = last ? strtoull(last, NULL, 10) : 0;
        free(last);
        ASSERT_U64_GT(f, seen);
        ASSERT_U64_EQ(current(c, NAME), f);
        th_cmd_ok(rc, "SET fence:resource %llu", (unsigned long long)f);
        ASSERT_LOK(l, dlock_release(l));
        /* the handle remembers the latest token after release */
        ASSERT_U64_EQ(dlock_lock_fence(l), f);
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return 0;
}

int main(void)
{
    th_init("fencing");
    th_server *s = th_server_start(NULL);

    /* processes first (no client, so no threads, in this process at fork) */
    redisContext *rc = th_redis(s);
    uint64_t t_before = server_us(rc);
    pid_t pids[NPROC];
    for (int i = 0; i < NPROC; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) exit(child(s));
    }
    for (int i = 0; i < NPROC; i++) ASSERT_EQ(th_wait_child(pids[i], 40000), 0);

    dlock_client *c = th_client(s, 0);
    uint64_t t_after = server_us(rc);
    uint64_t after_children = current(c, NAME);
    /* the first token was the server's clock at the first acquire; every
     * later one the counter + 1 */
    uint64_t first = after_children - ((uint64_t)NPROC * ROUNDS - 1);
    ASSERT_U64_GT(first, t_before);
    ASSERT_U64_GT(t_after, first);
    /* the counter expires a day after it was created */
    long long pttl = th_cmd_int(rc, "PTTL redisson_lock_token:{%s}", NAME);
    ASSERT_GT(pttl, COUNTER_TTL_MS - 120000);
    ASSERT_GE(COUNTER_TTL_MS, pttl);

    /* the counter key is redisson_lock_token:{name} */
    char *raw = th_cmd_str(rc, "GET redisson_lock_token:{%s}", NAME);
    ASSERT_NOT_NULL(raw);
    ASSERT_U64_EQ(strtoull(raw, NULL, 10), after_children);
    free(raw);

    /* one handle: strictly increasing, dlock_lock_fence and current match */
    dlock_lock *l = th_lock(c, NAME, DLOCK_KIND_PLAIN);
    ASSERT_U64_EQ(dlock_lock_fence(l), 0);
    uint64_t prev = after_children;
    for (int i = 0; i < 20; i++) {
        uint64_t f = 0;
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &f));
        ASSERT_U64_GT(f, prev);
        ASSERT_U64_EQ(dlock_lock_fence(l), f);
        ASSERT_U64_EQ(current(c, NAME), f);
        prev = f;
        ASSERT_LOK(l, dlock_release(l));
    }

    /* a failed try does not hand out a token, and busy leaves the counter */
    dlock_lock *l2 = th_lock(c, NAME, DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &prev));
    uint64_t f_busy = 12345;
    ASSERT_LCODE(l2, dlock_acquire(l2, DLOCK_NOWAIT, 5000, &f_busy), DLOCK_EBUSY);
    ASSERT_U64_EQ(current(c, NAME), prev);
    ASSERT_LOK(l, dlock_release(l));
    uint64_t f = 0;
    ASSERT_LOK(l2, dlock_acquire(l2, DLOCK_NOWAIT, 5000, &f));
    ASSERT_U64_GT(f, prev);
    prev = f;
    ASSERT_LOK(l2, dlock_release(l2));
    dlock_lock_free(l2);
    dlock_lock_free(l);

    /* reentrant: every acquire, re-entry included, bumps the counter */
    dlock_lock *r = th_lock(c, "fence:re", DLOCK_KIND_REENTRANT);
    ASSERT_U64_EQ(current(c, "fence:re"), 0);
    uint64_t a = 0, b = 0, d = 0;
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 5000, &a));
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 5000, &b));
    ASSERT_U64_GT(b, a);
    ASSERT_U64_EQ(current(c, "fence:re"), b);
    ASSERT_LOK(r, dlock_release(r));
    ASSERT_LOK(r, dlock_release(r));
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 5000, &d));
    ASSERT_U64_GT(d, b);
    ASSERT_LOK(r, dlock_release(r));
    dlock_lock_free(r);

    /* token acquire hands out fences too */
    char token[DLOCK_TOKEN_LEN + 1];
    uint64_t ft = 0;
    ASSERT_COK(c, dlock_acquire_token(c, NAME, DLOCK_CSTR, DLOCK_NOWAIT, 5000, token, &ft));
    ASSERT_U64_GT(ft, prev);
    ASSERT_COK(c, dlock_release_token(c, NAME, DLOCK_CSTR, token));

    /* a name never locked has counter 0 */
    ASSERT_U64_EQ(current(c, "fence:never"), 0);

    /* the counter lost (expired, or gone with a restart without
     * persistence): the next token is still above every token before */
    l = th_lock(c, NAME, DLOCK_KIND_PLAIN);
    prev = ft;
    ASSERT_EQ(th_cmd_int(rc, "DEL redisson_lock_token:{%s}", NAME), 1);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &f));
    ASSERT_U64_GT(f, prev);
    ASSERT_LOK(l, dlock_release(l));
    prev = f;

    /* a counter from before (a small number, no expiry; RFencedLock's own
     * INCRs start there too) is raised to the clock and given its expiry */
    th_cmd_ok(rc, "SET redisson_lock_token:{%s} 1000", NAME);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &f));
    ASSERT_U64_GT(f, prev);
    ASSERT_GT(th_cmd_int(rc, "PTTL redisson_lock_token:{%s}", NAME), 0);
    ASSERT_LOK(l, dlock_release(l));
    /* an INCR by another client (RFencedLock) keeps the order and expiry */
    ASSERT_EQ(th_cmd_int(rc, "INCR redisson_lock_token:{%s}", NAME), (long long)f + 1);
    ASSERT_GT(th_cmd_int(rc, "PTTL redisson_lock_token:{%s}", NAME), 0);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, &prev));
    ASSERT_U64_EQ(prev, f + 2);
    ASSERT_LOK(l, dlock_release(l));

    /* every kind's acquire script takes its token the same way: a fresh
     * counter starts at the clock (the fair lock's direct handoff is in
     * test_fair; RedLock's fence_url counter in test_redlock) */
    static const int kinds[] = {DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR, DLOCK_KIND_READ,
                                DLOCK_KIND_WRITE};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        dlock_lock *k = th_lock(c, "fence:kind", kinds[i]);
        uint64_t t0 = server_us(rc), fk = 0;
        ASSERT_LOK(k, dlock_acquire(k, DLOCK_NOWAIT, 5000, &fk));
        ASSERT_U64_GT(fk, t0 - 1);
        ASSERT_U64_GT(server_us(rc) + 1, fk);
        ASSERT_LOK(k, dlock_release(k));
        ASSERT_EQ(th_cmd_int(rc, "DEL redisson_lock_token:{fence:kind}"), 1);
        dlock_lock_free(k);
    }
    dlock_lock_free(l);

    redisFree(rc);
    dlock_client_free(c);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
