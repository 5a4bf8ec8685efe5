/* Mutual exclusion across processes: 8 forked processes x 150 rounds of
 * acquire / non-atomic GET+SET increment / release on one lock; the final value
 * must be exact. argv[1]: "plain" or "reentrant". Also checks, with an atomic
 * INCR/DECR of an "inside" counter, that no two processes are ever inside the
 * critical section together. */
#include "harness.h"

#include <stdlib.h>
#include <unistd.h>

#define NPROC 8
#define ROUNDS 150
#define LOCK_NAME "mutex:lock"

static int child(const th_server *s, dlock_kind kind, int idx)
{
    /* a client of its own, made after fork */
    dlock_client *c = th_client(s, 2000);
    dlock_lock *l = th_lock(c, LOCK_NAME, kind);
    redisContext *rc = th_redis(s);
    unsigned seed = (unsigned)getpid() * 2654435761u;
    uint64_t last_fence = 0;
    for (int i = 0; i < ROUNDS; i++) {
        /* half the processes use the watchdog, half an explicit lease */
        int64_t lease = (idx % 2) ? DLOCK_WATCHDOG : 10000;
        uint64_t fence = 0;
        ASSERT_LOK(l, dlock_acquire(l, 30000, lease, &fence));
        ASSERT_U64_GT(fence, last_fence);
        last_fence = fence;
        ASSERT_EQ(th_cmd_int(rc, "INCR mutex:inside"), 1);
        char *v = th_cmd_str(rc, "GET mutex:counter");
        long long n = v ? atoll(v) : 0;
        free(v);
        if (rand_r(&seed) % 4 == 0) usleep(200 + rand_r(&seed) % 800);
        th_cmd_ok(rc, "SET mutex:counter %lld", n + 1);
        ASSERT_EQ(th_cmd_int(rc, "DECR mutex:inside"), 0);
        ASSERT_LOK(l, dlock_release(l));
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return 0;
}

int main(int argc, char **argv)
{
    th_init("mutex");
    dlock_kind kind = DLOCK_KIND_PLAIN;
    if (argc > 1 && strcmp(argv[1], "reentrant") == 0) kind = DLOCK_KIND_REENTRANT;
    else if (argc > 1 && strcmp(argv[1], "plain") != 0) th_fail(__FILE__, __LINE__, "bad variant %s", argv[1]);
    th_log("kind %s: %d processes x %d rounds", kind == DLOCK_KIND_PLAIN ? "plain" : "reentrant",
           NPROC, ROUNDS);

    th_server *s = th_server_start(NULL);
    /* the fence counter starts far ahead of the server's clock (8e15 us:
     * the year 2223), where DL_LUA_FENCE counts on by one, so that it can
     * be checked exactly */
    const uint64_t floor = 8000000000000000ULL;
    redisContext *rc = th_redis(s);
    th_cmd_ok(rc, "SET redisson_lock_token:{%s} %llu", LOCK_NAME, (unsigned long long)floor);
    pid_t pids[NPROC];
    int64_t t0 = th_now_ms();
    /* fork before this process makes any client (no threads at fork time) */
    for (int i = 0; i < NPROC; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) exit(child(s, kind, i));
    }
    int failed = 0;
    for (int i = 0; i < NPROC; i++) {
        int st = th_wait_child(pids[i], 75000);
        if (st != 0) {
            fprintf(stderr, "child %d exited with status %d\n", i, st);
            failed++;
        }
    }
    ASSERT_EQ(failed, 0);
    th_log("all rounds done in %lld ms", (long long)(th_now_ms() - t0));

    char *v = th_cmd_str(rc, "GET mutex:counter");
    ASSERT_NOT_NULL(v);
    ASSERT_EQ(atoll(v), NPROC * ROUNDS);
    free(v);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", LOCK_NAME), 0);

    /* the fence counter was bumped once per acquire */
    dlock_client *c = th_client(s, 0);
    uint64_t fence = 0;
    ASSERT_COK(c, dlock_fence_current(c, LOCK_NAME, DLOCK_CSTR, &fence));
    ASSERT_U64_EQ(fence, floor + (uint64_t)NPROC * ROUNDS);
    dlock_client_free(c);
    redisFree(rc);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
