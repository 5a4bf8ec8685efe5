/* Multi-lock: all or nothing, and no deadlock between clients that list
 * overlapping sets in different orders. */
#include "harness.h"

#include <stdlib.h>
#include <unistd.h>

#define ROUNDS 120

/* Takes {A,B} (order 0) or {B,A} (order 1) ROUNDS times, each time doing a
 * non-atomic increment of a counter that both sets protect. */
static int child(const th_server *s, int order, dlock_kind kind_b)
{
    dlock_client *c = th_client(s, 2000);
    dlock_lock *a = th_lock(c, "multi:A", DLOCK_KIND_PLAIN);
    dlock_lock *b = th_lock(c, "multi:B", kind_b);
    dlock_lock *set[2] = {order ? b : a, order ? a : b};
    redisContext *rc = th_redis(s);
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t fences[2] = {0, 0};
        ASSERT_OK(dlock_multi_acquire(set, 2, 20000, 10000, fences));
        ASSERT_U64_GT(fences[0], 0);
        ASSERT_U64_GT(fences[1], 0);
        ASSERT_EQ(th_cmd_int(rc, "INCR multi:inside"), 1);
        char *v = th_cmd_str(rc, "GET multi:counter");
        long long n = v ? atoll(v) : 0;
        free(v);
        if (i % 5 == 0) usleep(300);
        th_cmd_ok(rc, "SET multi:counter %lld", n + 1);
        ASSERT_EQ(th_cmd_int(rc, "DECR multi:inside"), 0);
        ASSERT_OK(dlock_multi_release(set, 2));
    }
    redisFree(rc);
    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_client_free(c);
    return 0;
}

/* Issue 19, item 1: the first lock of a set that waits for a later one must
 * not come back with its lease run out. mB is held elsewhere for 1.5 s; the
 * set [mB, mA] (canonical order: mA first) waits 3 s with a lease of 1 s, so
 * mA's first lease ends at about 1 s, before mB is free. */
static void lease_of_the_set(const th_server *s)
{
    dlock_client *c = th_client(s, 0);
    dlock_client *other = th_client(s, 0);
    dlock_client *third = th_client(s, 0);
    dlock_lock *ma = th_lock(c, "multi:mA", DLOCK_KIND_PLAIN);
    dlock_lock *mb = th_lock(c, "multi:mB", DLOCK_KIND_PLAIN);
    dlock_lock *ob = th_lock(other, "multi:mB", DLOCK_KIND_PLAIN);
    dlock_lock *ta = th_lock(third, "multi:mA", DLOCK_KIND_PLAIN);
    dlock_lock *tb = th_lock(third, "multi:mB", DLOCK_KIND_PLAIN);
    dlock_lock *set[2] = {mb, ma};
    redisContext *rc = th_redis(s);
    ASSERT_LOK(ob, dlock_acquire(ob, DLOCK_NOWAIT, 1500, NULL));
    int64_t t0 = th_now_ms();
    ASSERT_LOK(ma, dlock_multi_acquire(set, 2, 3000, 1000, NULL));
    int64_t took = th_now_ms() - t0;
    int64_t va = dlock_lock_valid_ms(ma), vb = dlock_lock_valid_ms(mb);
    int64_t valid = dlock_multi_valid_ms(set, 2);
    th_log("set of 2 after %lld ms of waiting: valid %lld ms, mA %lld, mB %lld",
           (long long)took, (long long)valid, (long long)va, (long long)vb);
    ASSERT_GE(took, 1400);
    /* every lock of the set is held: a third client takes neither */
    ASSERT_LCODE(ta, dlock_acquire(ta, DLOCK_NOWAIT, 1000, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(tb, dlock_acquire(tb, DLOCK_NOWAIT, 1000, NULL), DLOCK_EBUSY);
    /* ...for about the whole lease: the least of the two, both close to 1 s
     * (the bound leaves the round trips since the acquire) */
    ASSERT_GT(valid, 700);
    ASSERT_LE(valid, 1000);
    /* the least of the two (read just after them) */
    ASSERT_LE(valid, va < vb ? va : vb);
    ASSERT_GE(valid, (va < vb ? va : vb) - 50);
    ASSERT_GT(va, 700);
    ASSERT_GT(th_cmd_int(rc, "PTTL multi:mA"), 700);
    ASSERT_GT(th_cmd_int(rc, "PTTL multi:mB"), 700);
    ASSERT_OK(dlock_multi_release(set, 2));
    ASSERT_EQ(dlock_multi_valid_ms(set, 2), 0);

    /* watchdog locks: mA is renewed while the set waits, but taken over by
     * someone else meanwhile (its key replaced by hand); the set must not
     * come back with it: it waits for mA again and holds it when it returns */
    dlock_client *wc = th_client(s, 600);
    dlock_lock *wa = th_lock(wc, "multi:mA", DLOCK_KIND_PLAIN);
    dlock_lock *wb = th_lock(wc, "multi:mB", DLOCK_KIND_PLAIN);
    dlock_lock *wset[2] = {wa, wb};
    ASSERT_LOK(ob, dlock_acquire(ob, DLOCK_NOWAIT, 1200, NULL));
    pid_t pid = th_fork();
    if (pid == 0) {
        redisContext *crc = th_redis(s);
        th_sleep_ms(300);
        th_cmd_ok(crc, "SET multi:mA someone PX 1500");
        redisFree(crc);
        _exit(0);
    }
    t0 = th_now_ms();
    ASSERT_LOK(wa, dlock_multi_acquire(wset, 2, 4000, DLOCK_WATCHDOG, NULL));
    took = th_now_ms() - t0;
    ASSERT_EQ(th_wait_child(pid, 5000), 0);
    th_log("watchdog set with mA taken over meanwhile: held after %lld ms, valid %lld ms",
           (long long)took, (long long)dlock_multi_valid_ms(wset, 2));
    char *owner = th_cmd_str(rc, "GET multi:mA");
    ASSERT_STR_EQ(owner, dlock_lock_token(wa));
    free(owner);
    ASSERT_GE(took, 1600); /* "someone" held mA until about 1.8 s */
    ASSERT_GT(dlock_multi_valid_ms(wset, 2), 300);
    ASSERT_LCODE(ta, dlock_acquire(ta, DLOCK_NOWAIT, 1000, NULL), DLOCK_EBUSY);
    ASSERT_OK(dlock_multi_release(wset, 2));

    redisFree(rc);
    dlock_lock_free(wa);
    dlock_lock_free(wb);
    dlock_client_free(wc);
    dlock_lock_free(ma);
    dlock_lock_free(mb);
    dlock_lock_free(ob);
    dlock_lock_free(ta);
    dlock_lock_free(tb);
    dlock_client_free(c);
    dlock_client_free(other);
    dlock_client_free(third);
}

int main(void)
{
    th_init("multilock");
    th_server *s = th_server_start(NULL);

    /* four processes, two in each order; kinds mixed (plain A, reentrant B) */
    pid_t pids[4];
    for (int i = 0; i < 4; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) _exit(child(s, i % 2, DLOCK_KIND_REENTRANT));
    }
    for (int i = 0; i < 4; i++) ASSERT_EQ(th_wait_child(pids[i], 60000), 0);
    redisContext *rc = th_redis(s);
    char *v = th_cmd_str(rc, "GET multi:counter");
    ASSERT_NOT_NULL(v);
    ASSERT_EQ(atoll(v), 4 * ROUNDS);
    free(v);

    /* all or nothing: B held elsewhere, so taking {A, B} takes neither */
    dlock_client *c = th_client(s, 0);
    dlock_lock *a = th_lock(c, "multi:A", DLOCK_KIND_PLAIN);
    dlock_lock *b = th_lock(c, "multi:B", DLOCK_KIND_PLAIN);
    dlock_lock *b2 = th_lock(c, "multi:B", DLOCK_KIND_PLAIN);
    ASSERT_OK(dlock_acquire(b2, DLOCK_NOWAIT, 10000, NULL));
    dlock_lock *set[2] = {a, b};
    ASSERT_CODE(dlock_multi_acquire(set, 2, DLOCK_NOWAIT, 10000, NULL), DLOCK_EBUSY);
    ASSERT_EQ(dlock_lock_holding(a), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS multi:A"), 0);
    int64_t t0 = th_now_ms();
    ASSERT_CODE(dlock_multi_acquire(set, 2, 300, 10000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_GE(th_now_ms() - t0, 250);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS multi:A"), 0);
    /* once B is free the set is taken */
    ASSERT_OK(dlock_release(b2));
    ASSERT_OK(dlock_multi_acquire(set, 2, 1000, DLOCK_WATCHDOG, NULL));
    ASSERT_EQ(dlock_lock_holding(a) && dlock_lock_holding(b), 1);
    ASSERT_OK(dlock_multi_release(set, 2));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS multi:A multi:B"), 0);

    /* the read and write sides of one name in one set, listed read first:
     * the write side is taken first (the canonical order), then the read
     * side as a downgrade of the same owner; in the listed order the read
     * hold would keep the owner's own write out until the wait ran out */
    dlock_lock *rd = th_lock(c, "multi:rw", DLOCK_KIND_READ);
    dlock_lock *wr = th_lock(c, "multi:rw", DLOCK_KIND_WRITE);
    dlock_lock *rw[2] = {rd, wr};
    uint64_t fences[2] = {0, 0};
    t0 = th_now_ms();
    ASSERT_OK(dlock_multi_acquire(rw, 2, 2000, 10000, fences));
    ASSERT_LT(th_now_ms() - t0, 2000); /* not a wait run out */
    ASSERT_EQ(dlock_lock_holding(rd) && dlock_lock_holding(wr), 1);
    ASSERT(fences[0] > 0 && fences[1] > 0);
    dlock_client *c2 = th_client(s, 0);
    dlock_lock *ord = th_lock(c2, "multi:rw", DLOCK_KIND_READ);
    dlock_lock *owr = th_lock(c2, "multi:rw", DLOCK_KIND_WRITE);
    ASSERT_CODE(dlock_acquire(ord, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_CODE(dlock_acquire(owr, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_OK(dlock_multi_release(rw, 2));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS multi:rw"), 0);
    ASSERT_OK(dlock_acquire(owr, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_OK(dlock_release(owr));
    dlock_lock_free(ord);
    dlock_lock_free(owr);
    dlock_client_free(c2);
    dlock_lock_free(rd);
    dlock_lock_free(wr);

    lease_of_the_set(s);

    /* bad input */
    ASSERT_EQ(dlock_multi_valid_ms(NULL, 2), 0);
    ASSERT_EQ(dlock_multi_valid_ms(set, 0), 0);
    ASSERT_CODE(dlock_multi_acquire(NULL, 2, 0, 1000, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_multi_acquire(set, 0, 0, 1000, NULL), DLOCK_EINVAL);
    dlock_lock *dup[2] = {a, a};
    ASSERT_CODE(dlock_multi_acquire(dup, 2, 0, 1000, NULL), DLOCK_EINVAL);
    dlock_lock *withnull[2] = {a, NULL};
    ASSERT_CODE(dlock_multi_acquire(withnull, 2, 0, 1000, NULL), DLOCK_EINVAL);
    ASSERT_EQ(dlock_lock_holding(a), 0);
    ASSERT_CODE(dlock_multi_release(NULL, 1), DLOCK_EINVAL);

    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_lock_free(b2);
    dlock_client_free(c);
    redisFree(rc);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
