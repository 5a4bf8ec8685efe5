/* The async multi-lock (dlock_async_multi_acquire, include/dlock_async.h)
 * on real event loops (libuv, libevent, the bare interface:
 * tests/async_loop.c) and a real server, beside blocking multi-locks on the
 * same names. argv[1] is "<case>_<loop>".
 *
 *   counter   two async sets overlapping in opposite orders (plain, write
 *             and reentrant members, two clients) and a blocking
 *             dlock_multi_acquire on an overlapping set in a thread, each
 *             round a non-atomic GET, pause, SET of a counter per key of
 *             its set: every count exact (a set held without all of its
 *             locks, or taken in the caller's order, would lose counts or
 *             deadlock)
 *   lease     the first member's lease (300 ms) runs out while the set
 *             waits for the second, held by a blocking client for 800 ms:
 *             the set is not returned with it run out (valid_ms about the
 *             lease, both keys on the server with their TTL, the
 *             owner-checked releases answer DLOCK_OK); DLOCK_WATCHDOG
 *             refused (DLOCK_ENOTSUP)
 *   midway    a set whose last member stays held elsewhere: with a wait,
 *             DLOCK_ETIMEDOUT and the members it took released (checked on
 *             the server) before the callback; DLOCK_NOWAIT: DLOCK_EBUSY
 *   cancel    dlock_async_multi_cancel of a set waiting on its second
 *             member: DLOCK_ECANCELED once, the first given back; a set
 *             pending when its client is freed: DLOCK_ECANCELED once,
 *             before the free returns
 *   badinput  n 0, NULL, a NULL member, the same handle twice, handles of
 *             two clients, NULL callback, a bad wait or lease: DLOCK_EINVAL
 *             and no callback; cancel with nothing pending, valid_ms and
 *             release of a set that holds nothing */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "async_loop.h"

static dlock_async_lock *klock(dlock_async_client *c, const char *name, dlock_kind kind) {
    dlock_async_lock *l = NULL;
    int rc = dlock_async_lock_new(c, name, DLOCK_CSTR, kind, &l);
    ASSERT_MSG(rc == DLOCK_OK, "lock_new: %s", dlock_async_errmsg(c));
    return l;
}

/* one set operation's outcome */
typedef struct mres {
    int calls;
    int code;
    uint64_t fences[4];
    int64_t at;
} mres;

static void on_multi(dlock_async_lock *const *locks, size_t n, int code, const uint64_t *fences,
                     void *ud) {
    (void)locks;
    mres *r = ud;
    r->calls++;
    r->code = code;
    r->at = th_now_ms();
    for (size_t i = 0; i < n && i < 4; i++) r->fences[i] = fences ? fences[i] : 0;
}

static void release_set(dlock_async_lock *const *set, size_t n) {
    mres r = {0};
    START(dlock_async_multi_release(set, n, on_multi, &r));
    RUN_UNTIL(r.calls > 0, 3000);
    ASSERT_CODE(r.code, DLOCK_OK);
}

/* ---- counter ---- */

#define ROUNDS 25
static redisContext *counter_rc;

typedef struct aset {
    dlock_async_lock *locks[3];
    const char *keys[3];
    size_t n;
    int done;
    long long seen[3];
} aset;

static void set_next(aset *a);

static void set_released(dlock_async_lock *const *locks, size_t n, int code,
                         const uint64_t *fences, void *ud) {
    (void)locks, (void)n, (void)fences;
    ASSERT_CODE(code, DLOCK_OK);
    aset *a = ud;
    if (++a->done < ROUNDS) set_next(a);
}

static void set_write(void *arg) {
    aset *a = arg;
    for (size_t i = 0; i < a->n; i++) {
        th_cmd_ok(counter_rc, "SET cnt:%s %lld", a->keys[i], a->seen[i] + 1);
        ASSERT_EQ(th_cmd_int(counter_rc, "DECR in:%s", a->keys[i]), 0);
    }
    START(dlock_async_multi_release(a->locks, a->n, set_released, a));
}

static void set_got(dlock_async_lock *const *locks, size_t n, int code, const uint64_t *fences,
                    void *ud) {
    (void)locks;
    aset *a = ud;
    ASSERT_MSG(code == DLOCK_OK, "multi acquire: %s", dlock_strerror(code));
    for (size_t i = 0; i < n; i++) {
        ASSERT_U64_GT(fences[i], 0);
        /* nobody else inside any of the set's keys */
        ASSERT_EQ(th_cmd_int(counter_rc, "INCR in:%s", a->keys[i]), 1);
        char *v = th_cmd_str(counter_rc, "GET cnt:%s", a->keys[i]);
        a->seen[i] = v ? atoll(v) : 0;
        free(v);
    }
    ASSERT_GT(dlock_async_multi_valid_ms(a->locks, a->n), 5000);
    after(1, set_write, a); /* the SETs a loop turn later, at least */
}

static void set_next(aset *a) {
    START(dlock_async_multi_acquire(a->locks, a->n, 20000, 10000, set_got, a));
}

static void *blocking_sets(void *arg) {
    const th_server *s = arg;
    dlock_client *c = th_client(s, 0);
    dlock_lock *set[2] = {th_lock(c, "mc", DLOCK_KIND_REENTRANT),
                          th_lock(c, "mb", DLOCK_KIND_WRITE)};
    const char *keys[2] = {"mc", "mb"};
    redisContext *rc = th_redis(s);
    for (int i = 0; i < ROUNDS; i++) {
        ASSERT_OK(dlock_multi_acquire(set, 2, 20000, 10000, NULL));
        long long seen[2];
        for (int k = 0; k < 2; k++) {
            ASSERT_EQ(th_cmd_int(rc, "INCR in:%s", keys[k]), 1);
            char *v = th_cmd_str(rc, "GET cnt:%s", keys[k]);
            seen[k] = v ? atoll(v) : 0;
            free(v);
        }
        usleep(1000);
        for (int k = 0; k < 2; k++) {
            th_cmd_ok(rc, "SET cnt:%s %lld", keys[k], seen[k] + 1);
            ASSERT_EQ(th_cmd_int(rc, "DECR in:%s", keys[k]), 0);
        }
        ASSERT_OK(dlock_multi_release(set, 2));
    }
    redisFree(rc);
    dlock_lock_free(set[0]);
    dlock_lock_free(set[1]);
    dlock_client_free(c);
    return NULL;
}

static long long count_of(const char *key) {
    char *v = th_cmd_str(counter_rc, "GET cnt:%s", key);
    long long n = v ? atoll(v) : -1;
    free(v);
    return n;
}

static void t_counter(th_server *s) {
    counter_rc = th_redis(s);
    dlock_async_client *c1 = client(s), *c2 = client(s);
    /* opposite orders: {ma, mb} and {mc, mb, ma}; the blocking set {mc, mb} */
    aset a = {.locks = {klock(c1, "ma", DLOCK_KIND_PLAIN), klock(c1, "mb", DLOCK_KIND_WRITE)},
              .keys = {"ma", "mb"},
              .n = 2};
    aset b = {.locks = {klock(c2, "mc", DLOCK_KIND_REENTRANT), klock(c2, "mb", DLOCK_KIND_WRITE),
                        klock(c2, "ma", DLOCK_KIND_PLAIN)},
              .keys = {"mc", "mb", "ma"},
              .n = 3};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, blocking_sets, s), 0);
    set_next(&a);
    set_next(&b);
    RUN_UNTIL(a.done == ROUNDS && b.done == ROUNDS, 30000);
    pthread_join(th, NULL);
    th_log("counts ma %lld mb %lld mc %lld", count_of("ma"), count_of("mb"), count_of("mc"));
    ASSERT_EQ(count_of("ma"), 2 * ROUNDS);
    ASSERT_EQ(count_of("mb"), 3 * ROUNDS);
    ASSERT_EQ(count_of("mc"), 2 * ROUNDS);
    ASSERT_EQ(th_cmd_int(counter_rc, "EXISTS ma mb mc"), 0);
    client_free(c1);
    client_free(c2);
    redisFree(counter_rc);
}

/* ---- lease ---- */

static void lease_once(th_server *s, int64_t lease_ms) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    /* canonical order: la first, then lb */
    dlock_async_lock *set[2] = {klock(c, "lb", DLOCK_KIND_PLAIN),
                                klock(c, "la", DLOCK_KIND_REENTRANT)};
    blocker bl = {.s = s, .name = "lb", .hold_ms = 800};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, blocking_holder, &bl), 0);
    while (!atomic_load(&bl.go)) th_sleep_ms(1);
    mres r = {0};
    int64_t t0 = th_now_ms();
    START(dlock_async_multi_acquire(set, 2, 3000, lease_ms, on_multi, &r));
    RUN_UNTIL(r.calls > 0, 5000);
    pthread_join(th, NULL);
    ASSERT_CODE(r.code, DLOCK_OK);
    ASSERT_U64_GT(r.fences[0], 0);
    ASSERT_U64_GT(r.fences[1], 0);
    int64_t took = r.at - t0, v = dlock_async_multi_valid_ms(set, 2);
    int64_t want = lease_ms == DLOCK_WATCHDOG ? 300 : lease_ms;
    th_log("lease %lld: took %lld ms, valid %lld ms", (long long)lease_ms, (long long)took,
           (long long)v);
    ASSERT_GE(took, 700);
    /* la's first lease ended at ~300 ms: the set's is whole again */
    ASSERT_GT(v, want / 2);
    long long ta = th_cmd_int(rc, "PTTL la"), tb = th_cmd_int(rc, "PTTL lb");
    ASSERT_GT(ta, 0);
    ASSERT_GT(tb, 0);
    if (lease_ms != DLOCK_WATCHDOG) ASSERT_GT(ta, lease_ms / 2);
    /* the owner-checked releases find both the set's */
    release_set(set, 2);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS la lb"), 0);
    client_free(c);
    redisFree(rc);
}

static void t_lease(th_server *s) {
    lease_once(s, 300);
    /* DLOCK_WATCHDOG is refused: checked on the client only, a member the
     * server forgot passed until the next renewal */
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_lock *set[2] = {klock(c, "wb", DLOCK_KIND_PLAIN), klock(c, "wa", DLOCK_KIND_FAIR)};
    mres r = {0};
    ASSERT_CODE(dlock_async_multi_acquire(set, 2, 3000, DLOCK_WATCHDOG, on_multi, &r),
                DLOCK_ENOTSUP);
    ASSERT(strstr(dlock_async_errmsg(c), "DLOCK_WATCHDOG"));
    run_for(100);
    ASSERT_EQ(r.calls, 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS wa wb"), 0);
    client_free(c);
    redisFree(rc);
}

/* ---- midway ---- */

static void t_midway(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_client *bc = th_client(s, 0);
    dlock_lock *bz = th_lock(bc, "xz", DLOCK_KIND_PLAIN);
    ASSERT_LOK(bz, dlock_acquire(bz, DLOCK_NOWAIT, 10000, NULL));
    dlock_async_client *c = client(s);
    dlock_async_lock *set[3] = {klock(c, "xz", DLOCK_KIND_PLAIN),
                                klock(c, "xy", DLOCK_KIND_REENTRANT),
                                klock(c, "xx", DLOCK_KIND_WRITE)};
    mres r = {0};
    START(dlock_async_multi_acquire(set, 3, 300, 10000, on_multi, &r));
    /* xx and xy are taken, then the set waits for xz */
    RUN_UNTIL(th_cmd_int(rc, "EXISTS xx xy") == 2, 2000);
    RUN_UNTIL(r.calls > 0, 3000);
    ASSERT_CODE(r.code, DLOCK_ETIMEDOUT);
    /* released before the callback */
    ASSERT_EQ(th_cmd_int(rc, "EXISTS xx xy"), 0);
    ASSERT_EQ(dlock_async_multi_valid_ms(set, 3), 0);
    ASSERT_MSG(strstr(dlock_async_lock_errmsg(set[0]), "xz") != NULL, "message: %s",
               dlock_async_lock_errmsg(set[0]));
    /* try once */
    memset(&r, 0, sizeof r);
    START(dlock_async_multi_acquire(set, 3, DLOCK_NOWAIT, 10000, on_multi, &r));
    RUN_UNTIL(r.calls > 0, 3000);
    ASSERT_CODE(r.code, DLOCK_EBUSY);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS xx xy"), 0);
    /* the handles are free again: the set is taken once xz is released */
    ASSERT_LOK(bz, dlock_release(bz));
    memset(&r, 0, sizeof r);
    START(dlock_async_multi_acquire(set, 3, DLOCK_NOWAIT, 10000, on_multi, &r));
    RUN_UNTIL(r.calls > 0, 3000);
    ASSERT_CODE(r.code, DLOCK_OK);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS xx xy xz"), 3);
    release_set(set, 3);
    ASSERT_EQ(r.calls, 1);
    dlock_lock_free(bz);
    dlock_client_free(bc);
    client_free(c);
    redisFree(rc);
}

/* ---- cancel ---- */

static void t_cancel(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_client *bc = th_client(s, 0);
    dlock_lock *bz = th_lock(bc, "cz", DLOCK_KIND_PLAIN);
    ASSERT_LOK(bz, dlock_acquire(bz, DLOCK_NOWAIT, 10000, NULL));
    dlock_async_client *c = client(s);
    dlock_async_lock *set[2] = {klock(c, "cz", DLOCK_KIND_PLAIN), klock(c, "cx", DLOCK_KIND_PLAIN)};
    mres r = {0};
    START(dlock_async_multi_acquire(set, 2, DLOCK_WAIT_FOREVER, 10000, on_multi, &r));
    RUN_UNTIL(th_cmd_int(rc, "EXISTS cx") == 1, 2000);
    run_for(50);
    ASSERT_EQ(r.calls, 0);
    ASSERT_CODE(dlock_async_multi_cancel(set, 2), DLOCK_OK);
    RUN_UNTIL(r.calls > 0, 2000);
    ASSERT_CODE(r.code, DLOCK_ECANCELED);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS cx"), 0);
    run_for(100);
    ASSERT_EQ(r.calls, 1);
    ASSERT_CODE(dlock_async_multi_cancel(set, 2), DLOCK_ENOTHELD);
    /* pending when the client is freed */
    memset(&r, 0, sizeof r);
    START(dlock_async_multi_acquire(set, 2, DLOCK_WAIT_FOREVER, 10000, on_multi, &r));
    RUN_UNTIL(th_cmd_int(rc, "EXISTS cx") == 1, 2000);
    ASSERT_EQ(r.calls, 0);
    client_free(c);
    ASSERT_EQ(r.calls, 1);
    ASSERT_CODE(r.code, DLOCK_ECANCELED);
    ASSERT_LOK(bz, dlock_release(bz));
    dlock_lock_free(bz);
    dlock_client_free(bc);
    redisFree(rc);
}

/* ---- badinput ---- */

static void t_badinput(th_server *s) {
    dlock_async_client *c = client(s), *c2 = client(s);
    dlock_async_lock *a = klock(c, "ba", DLOCK_KIND_PLAIN), *b = klock(c, "bb", DLOCK_KIND_PLAIN);
    dlock_async_lock *o = klock(c2, "bo", DLOCK_KIND_PLAIN);
    mres r = {0};
    dlock_async_lock *twice[2] = {a, a}, *two[2] = {a, o}, *withnull[2] = {a, NULL},
                     *ok[2] = {a, b};
    ASSERT_CODE(dlock_async_multi_acquire(ok, 0, 100, 1000, on_multi, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_multi_acquire(NULL, 2, 100, 1000, on_multi, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_multi_acquire(withnull, 2, 100, 1000, on_multi, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_multi_acquire(twice, 2, 100, 1000, on_multi, &r), DLOCK_EINVAL);
    ASSERT_MSG(strstr(dlock_async_errmsg(c), "twice") != NULL, "%s", dlock_async_errmsg(c));
    ASSERT_CODE(dlock_async_multi_acquire(two, 2, 100, 1000, on_multi, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_multi_acquire(ok, 2, 100, 1000, NULL, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_multi_acquire(ok, 2, -2, 1000, on_multi, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_multi_acquire(ok, 2, 100, -1, on_multi, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_multi_cancel(ok, 2), DLOCK_ENOTHELD);
    ASSERT_CODE(dlock_async_multi_cancel(NULL, 2), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_multi_release(twice, 2, on_multi, &r), DLOCK_EINVAL);
    /* nothing held: no release could start */
    ASSERT_CODE(dlock_async_multi_release(ok, 2, on_multi, &r), DLOCK_ENOTHELD);
    ASSERT_EQ(dlock_async_multi_valid_ms(NULL, 2), 0);
    ASSERT_EQ(dlock_async_multi_valid_ms(ok, 0), 0);
    ASSERT_EQ(dlock_async_multi_valid_ms(withnull, 2), 0);
    run_for(50);
    ASSERT_EQ(r.calls, 0);
    /* a member with an operation pending: the first refuses the start, a
     * later one fails the set midway, the first given back */
    dlock_async_lock *b2 = klock(c2, "bb", DLOCK_KIND_PLAIN);
    res hr = {0}, wr = {0};
    hold(b2, 10000, &hr);
    START(dlock_async_acquire(b, DLOCK_WAIT_FOREVER, 10000, on_done, &wr));
    ASSERT_CODE(dlock_async_multi_acquire(ok, 2, 100, 1000, on_multi, &r), DLOCK_OK);
    RUN_UNTIL(r.calls > 0, 2000);
    ASSERT_CODE(r.code, DLOCK_EINVAL);
    ASSERT_EQ(dlock_async_multi_valid_ms(ok, 1), 0);
    redisContext *rc = th_redis(s);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS ba"), 0);
    redisFree(rc);
    ASSERT_EQ(wr.calls, 0);
    ASSERT_CODE(dlock_async_cancel(b), DLOCK_OK);
    ASSERT_CODE(wr.code, DLOCK_ECANCELED);
    client_free(c);
    client_free(c2);
}

int main(int argc, char **argv) {
    static const async_case cases[] = {
        {"counter", t_counter}, {"lease", t_lease},         {"midway", t_midway},
        {"cancel", t_cancel},   {"badinput", t_badinput},   {NULL, NULL},
    };
    return async_main(argc, argv, "async_multi", cases);
}
