/* The async ID worker (dlock_async_idworker_*, include/dlock_async.h) on
 * real event loops (libuv, libevent, the bare interface:
 * tests/async_loop.c) and a real server, beside a blocking worker on the
 * same prefix. argv[1] is "<case>_<loop>".
 *
 *   inorder   300 nexts asked at once of a batch-1 worker while a blocking
 *             worker in a thread takes ids of the same prefix: callbacks in
 *             the order asked, ids increasing, all unique across both
 *             workers; the 300 share a few INCRBYs (commandstats), and no
 *             value is left over (the day's counter is the ids' count)
 *   batch     batch 50: 120 nexts use 3 blocks (the counter at 150), two
 *             workers' ids disjoint; a next asked from a callback
 *   overflow  the day's counter set to 2^32 - 4, five nexts: three ids (n up
 *             to 2^32 - 1, none lost), then DLOCK_EOVERFLOW for each next
 *             after, as the blocking worker says
 *   freeing   nexts pending when the worker is freed (one freeing it from
 *             its callback) and when the client is freed: each callback
 *             once, DLOCK_ECANCELED, in order; bad arguments */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "async_loop.h"

#define MANY 300
#define BLOCKING_IDS 300

typedef struct got {
    int calls;
    int code;
    uint64_t id;
    int order;
} got;

static int done_order;

static void on_id(dlock_async_idworker *w, int code, uint64_t id, void *ud) {
    (void)w;
    got *g = ud;
    g->calls++;
    g->code = code;
    g->id = id;
    g->order = done_order++;
}

static dlock_async_idworker *worker(dlock_async_client *c, const char *prefix, int64_t batch) {
    dlock_idworker_options o = {.batch = batch};
    dlock_async_idworker *w = NULL;
    int rc = dlock_async_idworker_new(c, prefix, &o, &w);
    ASSERT_MSG(rc == DLOCK_OK, "idworker_new: %s", dlock_async_errmsg(c));
    return w;
}

static void day_key(const char *prefix, char *buf, size_t len) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(buf, len, "icr:%s:%04d:%02d:%02d", prefix, tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday);
}

static long long cmd_calls(redisContext *rc, const char *cmd) {
    char *info = th_cmd_str(rc, "INFO commandstats");
    ASSERT_NOT_NULL(info);
    char key[64];
    snprintf(key, sizeof key, "cmdstat_%s:calls=", cmd);
    const char *p = strstr(info, key);
    long long n = p ? atoll(p + strlen(key)) : 0;
    free(info);
    return n;
}

static long long get_int(redisContext *rc, const char *key) {
    char *v = th_cmd_str(rc, "GET %s", key);
    long long n = v ? atoll(v) : -1;
    free(v);
    return n;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- inorder ---- */

static uint64_t blocking_ids[BLOCKING_IDS];

static void *blocking_worker(void *arg) {
    const th_server *s = arg;
    dlock_client *c = th_client(s, 0);
    dlock_idworker *w = NULL;
    ASSERT_OK(dlock_idworker_new(c, "ord", NULL, &w));
    for (int i = 0; i < BLOCKING_IDS; i++) {
        ASSERT_OK(dlock_idworker_next(w, &blocking_ids[i]));
        if (i) ASSERT_U64_GT(blocking_ids[i], blocking_ids[i - 1]);
    }
    dlock_idworker_free(w);
    dlock_client_free(c);
    return NULL;
}

static void t_inorder(th_server *s) {
    redisContext *rc = th_redis(s);
    th_cmd_ok(rc, "CONFIG RESETSTAT");
    dlock_async_client *c = client(s);
    dlock_async_idworker *w = worker(c, "ord", 1);
    static got g[MANY];
    memset(g, 0, sizeof g);
    done_order = 0;
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, blocking_worker, s), 0);
    for (int i = 0; i < MANY; i++) START(dlock_async_idworker_next(w, on_id, &g[i]));
    ASSERT_EQ(g[0].calls, 0); /* never from the call */
    RUN_UNTIL(g[MANY - 1].calls > 0, 5000);
    pthread_join(th, NULL);
    static uint64_t all[MANY + BLOCKING_IDS];
    for (int i = 0; i < MANY; i++) {
        ASSERT_EQ(g[i].calls, 1);
        ASSERT_MSG(g[i].code == DLOCK_OK, "next %d: %s", i, dlock_async_idworker_errmsg(w));
        ASSERT_EQ(g[i].order, i);
        if (i) ASSERT_U64_GT(g[i].id, g[i - 1].id);
        all[i] = g[i].id;
    }
    memcpy(all + MANY, blocking_ids, sizeof blocking_ids);
    qsort(all, MANY + BLOCKING_IDS, sizeof *all, cmp_u64);
    for (int i = 1; i < MANY + BLOCKING_IDS; i++) ASSERT_U64_GT(all[i], all[i - 1]);
    long long incrby = cmd_calls(rc, "incrby"), incr = cmd_calls(rc, "incr");
    th_log("300 nexts: %lld INCRBY, %lld INCR (%d of them the blocking worker's)", incrby, incr,
           BLOCKING_IDS);
    /* the blocking worker's batch 1 is an INCR per id; the async one's
     * nexts share their INCRBYs */
    ASSERT_LE(incrby + incr - BLOCKING_IDS, 5);
    /* batch 1: nothing reserved beyond the ids handed out (a day's change
     * during the test splits the count over two keys: not checked then) */
    char key[64];
    day_key("ord", key, sizeof key);
    long long n = get_int(rc, key);
    ASSERT_MSG(n == MANY + BLOCKING_IDS || th_cmd_int(rc, "DBSIZE") > 1, "counter %lld", n);
    /* ids after, from the block reserved by no one: a fresh INCRBY each */
    got one = {0};
    START(dlock_async_idworker_next(w, on_id, &one));
    RUN_UNTIL(one.calls > 0, 3000);
    ASSERT_CODE(one.code, DLOCK_OK);
    ASSERT_U64_GT(one.id, g[MANY - 1].id);
    dlock_async_idworker_free(w);
    client_free(c);
    redisFree(rc);
}

/* ---- batch ---- */

static got chained;
static void on_chain(dlock_async_idworker *w, int code, uint64_t id, void *ud) {
    on_id(w, code, id, ud);
    /* a next asked from a callback */
    START(dlock_async_idworker_next(w, on_id, &chained));
}

static void t_batch(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_idworker *w = worker(c, "bat", 50), *w2 = worker(c, "bat", 50);
    static got g[120], h[10];
    memset(g, 0, sizeof g);
    memset(h, 0, sizeof h);
    memset(&chained, 0, sizeof chained);
    done_order = 0;
    for (int i = 0; i < 120; i++)
        START(dlock_async_idworker_next(w, i == 119 ? on_chain : on_id, &g[i]));
    for (int i = 0; i < 10; i++) START(dlock_async_idworker_next(w2, on_id, &h[i]));
    RUN_UNTIL(chained.calls > 0 && h[9].calls > 0, 5000);
    char key[64];
    day_key("bat", key, sizeof key);
    /* 120 + 1 from w in blocks of 120 (the nexts waiting) or 50, 10 from
     * w2's block of 50: the counter at a sum of those */
    long long n = get_int(rc, key);
    th_log("counter %lld", n);
    ASSERT_GE(n, 131);
    ASSERT_LE(n, 50 + 120 + 50);
    for (int i = 0; i < 120; i++) {
        ASSERT_CODE(g[i].code, DLOCK_OK);
        if (i) ASSERT_U64_GT(g[i].id, g[i - 1].id);
        for (int j = 0; j < 10; j++) ASSERT_MSG(g[i].id != h[j].id, "id twice: %d %d", i, j);
    }
    ASSERT_CODE(chained.code, DLOCK_OK);
    ASSERT_U64_GT(chained.id, g[119].id);
    /* w2's 10 are from one block of 50: their counter parts consecutive */
    for (int j = 1; j < 10; j++) {
        ASSERT_CODE(h[j].code, DLOCK_OK);
        ASSERT_EQ((long long)(h[j].id & 0xFFFFFFFFu), (long long)(h[j - 1].id & 0xFFFFFFFFu) + 1);
    }
    dlock_async_idworker_free(w);
    dlock_async_idworker_free(w2);
    client_free(c);
    redisFree(rc);
}

/* ---- overflow ---- */

static void t_overflow(th_server *s) {
    redisContext *rc = th_redis(s);
    char key[64];
    day_key("ovf", key, sizeof key);
    th_cmd_ok(rc, "SET %s %llu", key, 0xFFFFFFFFULL - 3);
    dlock_async_client *c = client(s);
    dlock_async_idworker *w = worker(c, "ovf", 1);
    got g[5] = {{0}};
    done_order = 0;
    for (int i = 0; i < 5; i++) START(dlock_async_idworker_next(w, on_id, &g[i]));
    RUN_UNTIL(g[4].calls > 0, 3000);
    ASSERT_CODE(g[0].code, DLOCK_OK);
    ASSERT_CODE(g[1].code, DLOCK_OK);
    ASSERT_U64_EQ(g[0].id & 0xFFFFFFFFu, 0xFFFFFFFFULL - 2);
    ASSERT_U64_EQ(g[1].id & 0xFFFFFFFFu, 0xFFFFFFFFULL - 1);
    got last = {0};
    START(dlock_async_idworker_next(w, on_id, &last));
    RUN_UNTIL(last.calls > 0, 3000);
    /* n 2^32 - 1 is an id too (g[2]); after it, overflow */
    ASSERT_CODE(g[2].code, DLOCK_OK);
    ASSERT_U64_EQ(g[2].id & 0xFFFFFFFFu, 0xFFFFFFFFULL);
    ASSERT_CODE(g[3].code, DLOCK_EOVERFLOW);
    ASSERT_CODE(g[4].code, DLOCK_EOVERFLOW);
    ASSERT_CODE(last.code, DLOCK_EOVERFLOW);
    ASSERT_MSG(strstr(dlock_async_idworker_errmsg(w), "2^32-1") != NULL, "%s",
               dlock_async_idworker_errmsg(w));
    /* the blocking worker says the same */
    dlock_client *bc = th_client(s, 0);
    dlock_idworker *bw = NULL;
    ASSERT_OK(dlock_idworker_new(bc, "ovf", NULL, &bw));
    uint64_t id;
    ASSERT_CODE(dlock_idworker_next(bw, &id), DLOCK_EOVERFLOW);
    dlock_idworker_free(bw);
    dlock_client_free(bc);
    dlock_async_idworker_free(w);
    client_free(c);
    redisFree(rc);
}

/* ---- freeing ---- */

static dlock_async_idworker *to_free;
static void on_free_it(dlock_async_idworker *w, int code, uint64_t id, void *ud) {
    on_id(w, code, id, ud);
    dlock_async_idworker_free(to_free);
}

static void t_freeing(th_server *s) {
    dlock_async_client *c = client(s);
    dlock_async_idworker *w = worker(c, "fre", 1);
    got g[4] = {{0}};
    done_order = 0;
    for (int i = 0; i < 4; i++) START(dlock_async_idworker_next(w, on_id, &g[i]));
    dlock_async_idworker_free(w);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(g[i].calls, 1);
        ASSERT_CODE(g[i].code, DLOCK_ECANCELED);
        ASSERT_EQ(g[i].order, i);
    }
    /* freed from its own callback: the nexts behind end cancelled */
    w = to_free = worker(c, "fre", 1);
    got h[3] = {{0}};
    START(dlock_async_idworker_next(w, on_free_it, &h[0]));
    START(dlock_async_idworker_next(w, on_id, &h[1]));
    START(dlock_async_idworker_next(w, on_id, &h[2]));
    RUN_UNTIL(h[2].calls > 0, 3000);
    ASSERT_CODE(h[0].code, DLOCK_OK);
    ASSERT_CODE(h[1].code, DLOCK_ECANCELED);
    ASSERT_CODE(h[2].code, DLOCK_ECANCELED);
    run_for(50);
    ASSERT_EQ(h[0].calls + h[1].calls + h[2].calls, 3);
    /* bad arguments */
    dlock_async_idworker *x = NULL;
    dlock_idworker_options bad = {.batch = -1};
    ASSERT_CODE(dlock_async_idworker_new(NULL, "p", NULL, &x), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_idworker_new(c, NULL, NULL, &x), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_idworker_new(c, "p", NULL, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_idworker_new(c, "", NULL, &x), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_idworker_new(c, "p", &bad, &x), DLOCK_EINVAL);
    ASSERT_NULL(x);
    w = worker(c, "fre", 1);
    ASSERT_CODE(dlock_async_idworker_next(NULL, on_id, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_idworker_next(w, NULL, NULL), DLOCK_EINVAL);
    dlock_async_idworker_free(NULL);
    /* pending at client free (one waiting for its INCRBY) */
    got k[3] = {{0}};
    done_order = 0;
    for (int i = 0; i < 3; i++) START(dlock_async_idworker_next(w, on_id, &k[i]));
    loop_once();
    client_free(c);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(k[i].calls, 1);
        ASSERT_EQ(k[i].order, i);
    }
    for (int i = 0; i < 3; i++)
        ASSERT_MSG(k[i].code == DLOCK_OK || k[i].code == DLOCK_ECANCELED, "code %d", k[i].code);
}

int main(int argc, char **argv) {
    static const async_case cases[] = {
        {"inorder", t_inorder}, {"batch", t_batch}, {"overflow", t_overflow},
        {"freeing", t_freeing}, {NULL, NULL},
    };
    return async_main(argc, argv, "async_idworker", cases);
}
