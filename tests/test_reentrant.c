/* Reentrant locks: hold counts (dlock_lock_check), re-acquire increments,
 * release decrements, the Redisson hash layout, other owners excluded
 * meanwhile, and two threads of one client excluding each other. Also: a plain
 * handle that already holds refuses to re-acquire. */
#include "harness.h"

#include <pthread.h>
#include <stdlib.h>

#define NAME "re:lock"

static th_server *g_srv;
static dlock_client *g_client;

/* ---- another thread of the same client is excluded ---- */
static void *try_other_thread(void *arg)
{
    int *result = arg;
    dlock_lock *l = th_lock(g_client, NAME, DLOCK_KIND_REENTRANT);
    *result = dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL);
    if (*result == DLOCK_OK) dlock_release(l);
    dlock_lock_free(l);
    return NULL;
}

/* ---- two threads of one client: exact count ---- */
#define THREAD_ROUNDS 100
static void *incr_thread(void *arg)
{
    (void)arg;
    dlock_lock *l = th_lock(g_client, "re:threads", DLOCK_KIND_REENTRANT);
    redisContext *rc = th_redis(g_srv);
    for (int i = 0; i < THREAD_ROUNDS; i++) {
        ASSERT_LOK(l, dlock_acquire(l, 20000, 10000, NULL));
        /* re-enter once inside, as nested code would */
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL));
        ASSERT_EQ(th_cmd_int(rc, "INCR re:inside"), 1);
        char *v = th_cmd_str(rc, "GET re:counter");
        long long n = v ? atoll(v) : 0;
        free(v);
        if (i % 7 == 0) th_sleep_ms(1);
        th_cmd_ok(rc, "SET re:counter %lld", n + 1);
        ASSERT_EQ(th_cmd_int(rc, "DECR re:inside"), 0);
        ASSERT_LOK(l, dlock_release(l));
        ASSERT_EQ(dlock_lock_holding(l), 1);
        ASSERT_LOK(l, dlock_release(l));
        ASSERT_EQ(dlock_lock_holding(l), 0);
    }
    redisFree(rc);
    dlock_lock_free(l);
    return NULL;
}

static void check_count(dlock_lock *l, int want_held, int64_t want_count)
{
    int held = -1;
    int64_t count = -1;
    ASSERT_LOK(l, dlock_lock_check(l, &held, &count));
    ASSERT_EQ(held, want_held);
    ASSERT_EQ(count, want_count);
}

/* Two handles of one owner (client and thread) on one name share the
 * server's count: a release by one leaves the other's hold (the count it
 * leaves is a handle's, not a surplus to give back); a release that leaves a
 * surplus no handle holds (a hold reset after a failed release) gives it
 * back. */
static void shared_owner(dlock_client *c, redisContext *rc)
{
    dlock_lock *a = th_lock(c, "re:shared", DLOCK_KIND_REENTRANT);
    dlock_lock *b = th_lock(c, "re:shared", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(b, dlock_acquire(b, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(b, dlock_acquire(b, DLOCK_NOWAIT, 5000, NULL));
    char *v = th_cmd_str(rc, "HGET re:shared %s", dlock_lock_token(a));
    ASSERT_STR_EQ(v, "3");
    free(v);
    ASSERT_LOK(a, dlock_release(a));
    ASSERT_EQ(dlock_lock_holding(a), 0);
    v = th_cmd_str(rc, "HGET re:shared %s", dlock_lock_token(b));
    ASSERT_STR_EQ(v, "2"); /* b's two holds stay */
    free(v);
    ASSERT_LOK(b, dlock_release(b));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS re:shared"), 1);
    /* a surplus: the owner's count raised behind the handles' backs */
    th_cmd_int(rc, "HINCRBY re:shared %s 2", dlock_lock_token(b));
    ASSERT_LOK(b, dlock_release(b));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS re:shared"), 0);
    dlock_lock_free(a);
    dlock_lock_free(b);
}

int main(void)
{
    th_init("reentrant");
    g_srv = th_server_start(NULL);
    g_client = th_client(g_srv, 0);
    dlock_client *other = th_client(g_srv, 0);
    redisContext *rc = th_redis(g_srv);

    shared_owner(g_client, rc);

    dlock_lock *l = th_lock(g_client, NAME, DLOCK_KIND_REENTRANT);
    ASSERT_EQ(dlock_lock_kind(l), DLOCK_KIND_REENTRANT);
    ASSERT_STR_EQ(dlock_lock_token(l), "");
    check_count(l, 0, 0);

    /* first hold */
    uint64_t f1 = 0, f2 = 0, f3 = 0;
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 2000, &f1));
    ASSERT_EQ(dlock_lock_holding(l), 1);
    check_count(l, 1, 1);

    /* the Redisson layout: HASH NAME, field "<client uuid>:<thread id>" = count */
    const char *token = dlock_lock_token(l);
    const char *id = dlock_client_id(g_client);
    ASSERT_NOT_NULL(id);
    ASSERT_EQ(strlen(id), 36);
    ASSERT_MSG(strncmp(token, id, strlen(id)) == 0 && token[strlen(id)] == ':' &&
                   token[strlen(id) + 1] != '\0',
               "token \"%s\" is not \"<client id %s>:<thread id>\"", token, id);
    char *type = th_cmd_str(rc, "TYPE %s", NAME);
    ASSERT_STR_EQ(type, "hash");
    free(type);
    char *cnt = th_cmd_str(rc, "HGET %s %s", NAME, token);
    ASSERT_STR_EQ(cnt, "1");
    free(cnt);

    /* re-entry: count 2, then 3; the lease is refreshed; fences still grow */
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 8000, &f2));
    ASSERT_U64_GT(f2, f1);
    check_count(l, 1, 2);
    long long pttl = th_cmd_int(rc, "PTTL %s", NAME);
    ASSERT_GT(pttl, 2000);
    ASSERT_LE(pttl, 8000);
    ASSERT_LOK(l, dlock_acquire(l, 1000, 8000, &f3));
    ASSERT_U64_GT(f3, f2);
    check_count(l, 1, 3);
    cnt = th_cmd_str(rc, "HGET %s %s", NAME, dlock_lock_token(l));
    ASSERT_STR_EQ(cnt, "3");
    free(cnt);

    /* another client's handle is excluded, try-once and with a short wait */
    dlock_lock *lo = th_lock(other, NAME, DLOCK_KIND_REENTRANT);
    ASSERT_LCODE(lo, dlock_acquire(lo, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_EQ(dlock_lock_holding(lo), 0);
    int64_t t0 = th_now_ms();
    ASSERT_LCODE(lo, dlock_acquire(lo, 300, 5000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_GE(th_now_ms() - t0, 250);
    ASSERT_LCODE(lo, dlock_release(lo), DLOCK_ENOTHELD);
    check_count(lo, 0, 0);

    /* another thread of the same client is excluded (different thread id) */
    pthread_t t;
    int result = -1;
    ASSERT_EQ(pthread_create(&t, NULL, try_other_thread, &result), 0);
    ASSERT_EQ(pthread_join(t, NULL), 0);
    ASSERT_CODE(result, DLOCK_EBUSY);

    /* releases decrement; the lock stays held until the last one */
    ASSERT_LOK(l, dlock_release(l));
    check_count(l, 1, 2);
    ASSERT_EQ(dlock_lock_holding(l), 1);
    ASSERT_LCODE(lo, dlock_acquire(lo, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(l, dlock_release(l));
    check_count(l, 1, 1);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", NAME), 1);
    ASSERT_LOK(l, dlock_release(l));
    check_count(l, 0, 0);
    ASSERT_EQ(dlock_lock_holding(l), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", NAME), 0);
    ASSERT_STR_EQ(dlock_lock_token(l), "");
    ASSERT_LCODE(l, dlock_release(l), DLOCK_ENOTHELD);

    /* now the other client gets it */
    ASSERT_LOK(lo, dlock_acquire(lo, DLOCK_NOWAIT, 5000, NULL));
    check_count(lo, 1, 1);
    check_count(l, 0, 0);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LOK(lo, dlock_release(lo));
    dlock_lock_free(lo);

    /* freeing a handle that holds several times releases all holds */
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL));
    dlock_lock_free(l);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", NAME), 0);

    /* a plain handle that already holds refuses to re-acquire */
    dlock_lock *p = th_lock(g_client, "re:plain", DLOCK_KIND_PLAIN);
    ASSERT_LOK(p, dlock_acquire(p, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LCODE(p, dlock_acquire(p, DLOCK_NOWAIT, 5000, NULL), DLOCK_EINVAL);
    ASSERT_EQ(dlock_lock_holding(p), 1);
    check_count(p, 1, 1);
    ASSERT_LOK(p, dlock_release(p));
    check_count(p, 0, 0);
    /* freeing a plain handle that holds releases it too */
    ASSERT_LOK(p, dlock_acquire(p, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS re:plain"), 1);
    dlock_lock_free(p);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS re:plain"), 0);

    /* two threads of one client exclude each other on a reentrant lock */
    pthread_t th[2];
    for (int i = 0; i < 2; i++) ASSERT_EQ(pthread_create(&th[i], NULL, incr_thread, NULL), 0);
    for (int i = 0; i < 2; i++) ASSERT_EQ(pthread_join(th[i], NULL), 0);
    char *v = th_cmd_str(rc, "GET re:counter");
    ASSERT_STR_EQ(v, "200");
    free(v);

    redisFree(rc);
    dlock_client_free(other);
    dlock_client_free(g_client);
    th_server_stop(g_srv);
    th_log("ok");
    return 0;
}
