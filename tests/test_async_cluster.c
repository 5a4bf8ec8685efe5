/* The async client on a Redis Cluster of 3 masters (started once per test
 * process, as tests/test_cluster.c does): locks of every kind on names
 * owned by different masters, excluded by and waiting for a blocking client
 * on the same cluster, woken by the release (sharded pub/sub on the
 * channel's master); an exact counter under the lock by async handles and
 * a blocking thread; a slot moved to another master under a pending request
 * and a waiter (MOVED followed, the waiter's channel subscribed again on
 * the new master); a name whose keys would span slots
 * refused; the multi-lock over names of the 3 masters and the ID worker
 * beside a blocking one (extras). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "async_loop.h"

#define NM 3
static pid_t pids[NM];
static char dir[128];
static int port[NM];
static char url[256];

static void stop_all(void) {
    for (int i = 0; i < NM; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
            pids[i] = 0;
        }
    if (dir[0]) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", dir);
        dir[0] = 0;
    }
}

static redisContext *raw(int p) {
    struct timeval tv = {2, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", p, tv);
    ASSERT(rc && !rc->err);
    return rc;
}

static int answers(int p) {
    struct timeval tv = {1, 0};
    redisContext *t = redisConnectWithTimeout("127.0.0.1", p, tv);
    int up = t && !t->err;
    if (t) redisFree(t);
    return up;
}

static int cluster_ok(int p) {
    redisContext *rc = raw(p);
    redisReply *r = redisCommand(rc, "CLUSTER INFO");
    int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
    if (r) freeReplyObject(r);
    redisFree(rc);
    return ok;
}

/* The port of the master that answers key without a redirect. */
static int owner_port(const char *key) {
    for (int i = 0; i < NM; i++) {
        redisContext *rc = raw(port[i]);
        redisReply *r = redisCommand(rc, "EXISTS %s", key);
        int mine = r && r->type == REDIS_REPLY_INTEGER;
        if (r) freeReplyObject(r);
        redisFree(rc);
        if (mine) return port[i];
    }
    return 0;
}

/* MOVED answers given so far by the master on port p. */
static long long moved_errors(int p) {
    redisContext *rc = raw(p);
    redisReply *r = redisCommand(rc, "INFO errorstats");
    ASSERT(r && r->type == REDIS_REPLY_STRING);
    const char *m = strstr(r->str, "errorstat_MOVED:count=");
    long long n = m ? atoll(m + strlen("errorstat_MOVED:count=")) : 0;
    freeReplyObject(r);
    redisFree(rc);
    return n;
}

/* Starts the cluster (skips when redis-server / redis-cli cannot make one). */
static void cluster_up(void) {
    if (system("redis-cli --version >/dev/null 2>&1") != 0)
        th_skip("redis-cli is not installed: no cluster can be made");
    FILE *v = popen("redis-server --version 2>/dev/null", "r");
    char line[256] = "";
    if (v) {
        if (!fgets(line, sizeof line, v)) line[0] = '\0';
        pclose(v);
    }
    const char *at = strstr(line, "v=");
    if (!at || atoi(at + 2) < 7)
        th_skip("redis-server is missing or older than 7 (sharded pub/sub): '%s'", line);
    snprintf(dir, sizeof dir, "/tmp/dlock-acluster-XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(dir));
    atexit(stop_all);
    char cmd[1024];
    size_t off = (size_t)snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
    size_t uo = (size_t)snprintf(url, sizeof url, "redis-cluster://");
    for (int i = 0; i < NM; i++) {
        port[i] = th_free_port();
        char sp[16], bus[16], d[200], lg[200];
        snprintf(sp, sizeof sp, "%d", port[i]);
        snprintf(bus, sizeof bus, "%d", th_free_port());
        snprintf(d, sizeof d, "%s/%d", dir, port[i]);
        mkdir(d, 0700);
        snprintf(lg, sizeof lg, "%s/%d.log", dir, port[i]);
        pid_t p = th_fork();
        if (p == 0) {
            execlp("redis-server", "redis-server", "--port", sp, "--cluster-port", bus, "--bind",
                   "127.0.0.1", "--dir", d, "--save", "", "--cluster-enabled", "yes",
                   "--logfile", lg, (char *)NULL);
            _exit(127);
        }
        pids[i] = p;
        off += (size_t)snprintf(cmd + off, sizeof cmd - off, " 127.0.0.1:%d", port[i]);
        uo += (size_t)snprintf(url + uo, sizeof url - uo, "%s127.0.0.1:%d", i ? "," : "",
                               port[i]);
    }
    for (int i = 0; i < NM; i++) ASSERT_EVENTUALLY(answers(port[i]), 10000);
    snprintf(cmd + off, sizeof cmd - off, " --cluster-yes >%s/create.log 2>&1", dir);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof cmd, "cat %s/create.log >&2", dir);
        if (system(cmd) != 0) th_log("no create.log");
        th_fail(__FILE__, __LINE__, "redis-cli --cluster create failed");
    }
    for (int i = 0; i < NM; i++) ASSERT_EVENTUALLY(cluster_ok(port[i]), 15000);
    th_log("cluster of %d masters up", NM);
}

static dlock_async_client *acluster(void) {
    dlock_async_client *c = NULL;
    int rc = client_new(url, NULL, &c);
    ASSERT_MSG(rc == DLOCK_OK, "cluster client: %s", dlock_async_errmsg(c));
    return c;
}

static dlock_client *bcluster(void) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    return c;
}

static dlock_async_lock *ahandle(dlock_async_client *c, const char *name, dlock_kind kind) {
    dlock_async_lock *l = NULL;
    int rc = dlock_async_lock_new(c, name, DLOCK_CSTR, kind, &l);
    ASSERT_MSG(rc == DLOCK_OK, "lock_new %s: %s", name, dlock_async_errmsg(c));
    return l;
}

/* n names "<prefix><i>" whose slots are owned by every master in turn */
static void spread_names(const char *prefix, char names[][32], int n) {
    int want = 0, i = 0;
    for (int k = 0; k < n; i++) {
        ASSERT(i < 10000);
        snprintf(names[k], 32, "%s%d", prefix, i);
        if (owner_port(names[k]) != port[want % NM]) continue;
        want++;
        k++;
    }
}

/* a blocking holder in a thread: holds name (kind) for hold_ms */
typedef struct bhold {
    const char *name;
    dlock_kind kind;
    int64_t hold_ms;
    atomic_int go;
    int64_t released_at;
} bhold;

static void *bholder(void *arg) {
    bhold *b = arg;
    dlock_client *c = bcluster();
    dlock_lock *l = th_lock(c, b->name, b->kind);
    ASSERT_LOK(l, dlock_acquire(l, 5000, 10000, NULL));
    atomic_store(&b->go, 1);
    th_sleep_ms(b->hold_ms);
    b->released_at = th_now_ms();
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

/* Every kind on names of the 3 masters: an async hold excludes a blocking
 * client; a blocking hold makes an async acquire wait until its release;
 * connections to every master (slots beyond 2 in the adapter); a bad name
 * refused as the blocking API refuses it. */
static void t_kinds(th_server *s) {
    (void)s;
    cluster_up();
    dlock_async_client *c = acluster();
    dlock_client *b = bcluster();
    static const dlock_kind kinds[] = {DLOCK_KIND_PLAIN, DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR,
                                       DLOCK_KIND_WRITE, DLOCK_KIND_READ};
    char names[5][32];
    spread_names("ac:k:", names, 5);
    for (int i = 0; i < 5; i++) {
        dlock_async_lock *l = ahandle(c, names[i], kinds[i]);
        res r = {0};
        hold(l, 10000, &r);
        ASSERT(r.fence > 0);
        /* the blocking client on the same cluster is kept out (a read hold
         * is kept out by a writer: the blocking side takes the write lock) */
        dlock_lock *x = th_lock(b, names[i], kinds[i] == DLOCK_KIND_READ ? DLOCK_KIND_WRITE
                                                                          : kinds[i]);
        ASSERT_LCODE(x, dlock_acquire(x, DLOCK_NOWAIT, 1000, NULL), DLOCK_EBUSY);
        r = (res){0};
        START(dlock_async_release(l, on_done, &r));
        WAIT_DONE(r, 3000);
        ASSERT_MSG(r.code == DLOCK_OK, "release %s: %s", names[i], dlock_async_lock_errmsg(l));
        ASSERT_LOK(x, dlock_acquire(x, DLOCK_NOWAIT, 1000, NULL));
        ASSERT_LOK(x, dlock_release(x));
        dlock_lock_free(x);

        /* a blocking holder, the async acquire waits for its release */
        bhold bh = {.name = names[i], .kind = kinds[i] == DLOCK_KIND_READ ? DLOCK_KIND_WRITE
                                                                          : kinds[i],
                    .hold_ms = 400};
        pthread_t t;
        ASSERT_EQ(pthread_create(&t, NULL, bholder, &bh), 0);
        RUN_UNTIL(atomic_load(&bh.go), 5000);
        r = (res){0};
        START(dlock_async_acquire(l, 6000, 10000, on_done, &r));
        WAIT_DONE(r, 7000);
        pthread_join(t, NULL);
        ASSERT_MSG(r.code == DLOCK_OK, "wait %s: %s", names[i], dlock_async_lock_errmsg(l));
        ASSERT_MSG(r.at >= bh.released_at, "%s: acquired before the blocking release", names[i]);
        /* woken by the release's message on the channel's master (sharded
         * pub/sub), not by the 2 s backstop */
        ASSERT_MSG(r.at - bh.released_at < 1000, "%s: served %lld ms after the release",
                   names[i], (long long)(r.at - bh.released_at));
        r = (res){0};
        START(dlock_async_release(l, on_done, &r));
        WAIT_DONE(r, 3000);
        ASSERT_CODE(r.code, DLOCK_OK);
        dlock_async_lock_free(l);
    }
    /* one connection per master at least (and the subscribed one) */
    ASSERT_MSG(dlock_async_fds(c, NULL, 0) >= NM, "%d sockets", dlock_async_fds(c, NULL, 0));

    /* a name whose keys would hash to different slots */
    dlock_async_lock *bad = NULL;
    ASSERT_CODE(dlock_async_lock_new(c, "x{}y", DLOCK_CSTR, DLOCK_KIND_PLAIN, &bad),
                DLOCK_EINVAL);
    ASSERT(bad == NULL);
    ASSERT(strstr(dlock_async_errmsg(c), "Redis Cluster") != NULL);
    dlock_lock *bb = NULL;
    ASSERT_CODE(dlock_lock_new(b, "x{}y", DLOCK_CSTR, DLOCK_KIND_PLAIN, &bb), DLOCK_EINVAL);
    dlock_client_free(b);
    client_free(c);
}

/* ---- an exact counter ---- */

#define ROUNDS 15
static redisContext *ctr;
typedef struct worker {
    dlock_async_lock *l;
    int done, rounds;
    long long seen;
} worker;

static void w_acquired(dlock_async_lock *l, int code, uint64_t fence, void *ud);

static void w_released(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    (void)fence;
    worker *w = ud;
    ASSERT_MSG(code == DLOCK_OK, "release: %s", dlock_async_lock_errmsg(l));
    if (++w->rounds == ROUNDS) {
        w->done = 1;
        return;
    }
    START(dlock_async_acquire(l, 20000, 10000, w_acquired, w));
}

static void w_write(void *arg) {
    worker *w = arg;
    th_cmd_ok(ctr, "SET ac:counter %lld", w->seen + 1);
    START(dlock_async_release(w->l, w_released, w));
}

static void w_acquired(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    (void)fence;
    worker *w = ud;
    ASSERT_MSG(code == DLOCK_OK, "acquire: %s", dlock_async_lock_errmsg(l));
    char *v = th_cmd_str(ctr, "GET ac:counter");
    w->seen = v ? atoll(v) : 0;
    free(v);
    after(2, w_write, w); /* a loop turn or two inside the section */
}

static void *b_counter(void *arg) {
    const th_server *s = arg;
    dlock_client *c = bcluster();
    dlock_lock *l = th_lock(c, "ac:counter{x}", DLOCK_KIND_PLAIN);
    redisContext *rc = th_redis(s);
    for (int i = 0; i < ROUNDS; i++) {
        ASSERT_LOK(l, dlock_acquire(l, 20000, 10000, NULL));
        char *v = th_cmd_str(rc, "GET ac:counter");
        long long n = v ? atoll(v) : 0;
        free(v);
        th_sleep_ms(2);
        th_cmd_ok(rc, "SET ac:counter %lld", n + 1);
        ASSERT_LOK(l, dlock_release(l));
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

static void t_counter(th_server *s) {
    cluster_up();
    ctr = th_redis(s);
    th_cmd_ok(ctr, "SET ac:counter 0");
    dlock_async_client *c = acluster();
    enum { NW = 4 };
    worker w[NW];
    for (int i = 0; i < NW; i++) {
        w[i] = (worker){.l = ahandle(c, "ac:counter{x}", DLOCK_KIND_PLAIN)};
        START(dlock_async_acquire(w[i].l, 20000, 10000, w_acquired, &w[i]));
    }
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, b_counter, s), 0);
    RUN_UNTIL(w[0].done && w[1].done && w[2].done && w[3].done, 60000);
    pthread_join(t, NULL);
    char *v = th_cmd_str(ctr, "GET ac:counter");
    ASSERT_EQ(atoll(v), (long long)(NW + 1) * ROUNDS);
    free(v);
    for (int i = 0; i < NW; i++) dlock_async_lock_free(w[i].l);
    redisFree(ctr);
    client_free(c);
}

/* ---- a slot moved ---- */

static void move_slot(long long slot, int src, int dst) {
    redisContext *rs = raw(src), *rd = raw(dst);
    redisReply *sid = redisCommand(rs, "CLUSTER MYID"), *did = redisCommand(rd, "CLUSTER MYID");
    freeReplyObject(redisCommand(rd, "CLUSTER SETSLOT %lld IMPORTING %s", slot, sid->str));
    freeReplyObject(redisCommand(rs, "CLUSTER SETSLOT %lld MIGRATING %s", slot, did->str));
    for (;;) {
        redisReply *keys = redisCommand(rs, "CLUSTER GETKEYSINSLOT %lld 100", slot);
        size_t n = keys->elements;
        for (size_t k = 0; k < n; k++)
            freeReplyObject(redisCommand(rs, "MIGRATE 127.0.0.1 %d %s 0 5000", dst,
                                         keys->element[k]->str));
        freeReplyObject(keys);
        if (n == 0) break;
    }
    for (int i = 0; i < NM; i++) {
        redisContext *x = raw(port[i]);
        freeReplyObject(redisCommand(x, "CLUSTER SETSLOT %lld NODE %s", slot, did->str));
        redisFree(x);
    }
    freeReplyObject(sid);
    freeReplyObject(did);
    redisFree(rs);
    redisFree(rd);
}

/* The slot of a held lock moved to another master while an async waiter
 * waits on it (a blocking client holds it) and another async hold lives in
 * it: the waiter is served after the blocking release, through MOVED; the
 * async hold's release and a new acquire go to the new owner. */
static void t_moved(th_server *s) {
    (void)s;
    cluster_up();
    const char *name = "ac:moved", *name2 = "ac:moved2{ac:moved}";
    int src = owner_port(name), dst = src == port[0] ? port[1] : port[0];
    redisContext *rc = raw(src);
    redisReply *r = redisCommand(rc, "CLUSTER KEYSLOT %s", name);
    long long slot = r->integer;
    freeReplyObject(r);
    redisFree(rc);
    dlock_async_client *c = acluster();
    dlock_async_lock *other = ahandle(c, name2, DLOCK_KIND_PLAIN);
    res ro = {0};
    hold(other, 20000, &ro); /* the map knows the slot's owner now */
    bhold bh = {.name = name, .kind = DLOCK_KIND_PLAIN, .hold_ms = 2500};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, bholder, &bh), 0);
    RUN_UNTIL(atomic_load(&bh.go), 5000);
    dlock_async_lock *l = ahandle(c, name, DLOCK_KIND_PLAIN);
    res rw = {0};
    START(dlock_async_acquire(l, 8000, 10000, on_done, &rw));
    run_for(200);
    long long moved0 = moved_errors(src);
    move_slot(slot, src, dst);
    ASSERT_EQ(owner_port(name), dst);
    WAIT_DONE(rw, 9000);
    pthread_join(t, NULL);
    ASSERT_MSG(rw.code == DLOCK_OK, "waiter: %s", dlock_async_lock_errmsg(l));
    ASSERT(rw.at >= bh.released_at);
    /* woken by the release: its channel subscribed again on the new master
     * (without that, the backstop 2 and 4 s into the wait serves it later) */
    ASSERT_MSG(rw.at - bh.released_at < 1000, "served %lld ms after the release",
               (long long)(rw.at - bh.released_at));
    ASSERT_MSG(moved_errors(src) > moved0, "no MOVED answered by the old owner");
    /* the hold taken before the move is released on the new owner */
    ro = (res){0};
    START(dlock_async_release(other, on_done, &ro));
    WAIT_DONE(ro, 3000);
    ASSERT_MSG(ro.code == DLOCK_OK, "release after the move: %s", dlock_async_lock_errmsg(other));
    rc = raw(dst);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", name2), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", name), 1);
    redisFree(rc);
    res rr = {0};
    START(dlock_async_release(l, on_done, &rr));
    WAIT_DONE(rr, 3000);
    ASSERT_CODE(rr.code, DLOCK_OK);
    dlock_async_lock_free(l);
    dlock_async_lock_free(other);
    client_free(c);
}

/* ASKING calls the master on port p has served. */
static long long asking_calls(int p) {
    redisContext *rc = raw(p);
    redisReply *r = redisCommand(rc, "INFO commandstats");
    ASSERT(r && r->type == REDIS_REPLY_STRING);
    const char *m = strstr(r->str, "cmdstat_asking:calls=");
    long long n = m ? atoll(m + strlen("cmdstat_asking:calls=")) : 0;
    freeReplyObject(r);
    redisFree(rc);
    return n;
}

/* ---- the synchronizer objects ---- */

typedef struct ores {
    int calls, code;
    int64_t value, at;
} ores;

static void on_obj(dlock_async_object *o, int code, int64_t value, void *ud) {
    (void)o;
    ores *r = ud;
    r->calls++;
    r->code = code;
    r->value = value;
    r->at = th_now_ms();
}

static dlock_async_object *aobj(dlock_async_client *c, dlock_kind kind, const char *name) {
    dlock_async_object *o = NULL;
    int rc = kind == DLOCK_KIND_SEMAPHORE ? dlock_async_semaphore_new(c, name, DLOCK_CSTR, &o)
             : kind == DLOCK_KIND_LATCH   ? dlock_async_latch_new(c, name, DLOCK_CSTR, &o)
                                          : dlock_async_permits_new(c, name, DLOCK_CSTR, &o);
    ASSERT_MSG(rc == DLOCK_OK, "object %s: %s", name, dlock_async_errmsg(c));
    return o;
}

#define OSTART(expr) ASSERT_CODE(expr, DLOCK_OK)
#define OWAIT(r) RUN_UNTIL((r).calls > 0, 5000)

/* A semaphore, a latch and a permit semaphore on names of different
 * masters: an async waiter woken within 1 s by a blocking client's release
 * or count-down (sharded pub/sub); the blocking client kept out by an async
 * permit; a latch name whose channel would hash elsewhere refused. */
static void t_objects(th_server *s) {
    (void)s;
    cluster_up();
    dlock_async_client *c = acluster();
    dlock_client *b = bcluster();
    char names[3][32];
    spread_names("ac:o:", names, 3);

    /* semaphore of 1: an async holder, an async waiter, a blocking release */
    dlock_async_object *s1 = aobj(c, DLOCK_KIND_SEMAPHORE, names[0]);
    dlock_async_object *s2 = aobj(c, DLOCK_KIND_SEMAPHORE, names[0]);
    ores r = {0}, w = {0};
    OSTART(dlock_async_semaphore_try_set(s1, 1, on_obj, &r));
    OWAIT(r);
    ASSERT_EQ(r.value, 1);
    r = (ores){0};
    OSTART(dlock_async_semaphore_acquire(s1, 1, DLOCK_NOWAIT, on_obj, &r));
    OWAIT(r);
    ASSERT_CODE(r.code, DLOCK_OK);
    OSTART(dlock_async_semaphore_acquire(s2, 1, 5000, on_obj, &w));
    run_for(300);
    ASSERT_EQ(w.calls, 0);
    dlock_semaphore *bs = NULL;
    ASSERT_CODE(dlock_semaphore_new(b, names[0], DLOCK_CSTR, &bs), DLOCK_OK);
    ASSERT_CODE(dlock_semaphore_acquire(bs, 1, DLOCK_NOWAIT), DLOCK_EBUSY);
    int64_t t0 = th_now_ms();
    ASSERT_CODE(dlock_semaphore_release(bs, 1), DLOCK_OK);
    OWAIT(w);
    ASSERT_CODE(w.code, DLOCK_OK);
    ASSERT_MSG(w.at - t0 < 1000, "semaphore waiter served %lld ms after the release",
               (long long)(w.at - t0));
    dlock_semaphore_free(bs);

    /* latch: an async await, a blocking count-down */
    dlock_async_object *la = aobj(c, DLOCK_KIND_LATCH, names[1]);
    r = (ores){0};
    OSTART(dlock_async_latch_try_set(la, 2, on_obj, &r));
    OWAIT(r);
    ASSERT_EQ(r.value, 1);
    w = (ores){0};
    OSTART(dlock_async_latch_await(la, 5000, on_obj, &w));
    run_for(300);
    ASSERT_EQ(w.calls, 0);
    dlock_latch *bl = NULL;
    ASSERT_CODE(dlock_latch_new(b, names[1], DLOCK_CSTR, &bl), DLOCK_OK);
    ASSERT_CODE(dlock_latch_count_down(bl, 1), DLOCK_OK);
    run_for(200);
    ASSERT_EQ(w.calls, 0);
    t0 = th_now_ms();
    ASSERT_CODE(dlock_latch_count_down(bl, 1), DLOCK_OK);
    OWAIT(w);
    ASSERT_CODE(w.code, DLOCK_OK);
    ASSERT_MSG(w.at - t0 < 1000, "latch waiter served %lld ms after the count-down",
               (long long)(w.at - t0));
    dlock_latch_free(bl);

    /* permit semaphore of 1: an async permit keeps the blocking client out */
    dlock_async_object *pm = aobj(c, DLOCK_KIND_PERMIT_SEMAPHORE, names[2]);
    r = (ores){0};
    OSTART(dlock_async_permits_try_set(pm, 1, on_obj, &r));
    OWAIT(r);
    r = (ores){0};
    OSTART(dlock_async_permits_acquire(pm, DLOCK_NOWAIT, 10000, on_obj, &r));
    OWAIT(r);
    ASSERT_MSG(r.code == DLOCK_OK, "permit: %s", dlock_async_object_errmsg(pm));
    char id[64];
    snprintf(id, sizeof id, "%s", dlock_async_permits_id(pm));
    dlock_permits *bp = NULL;
    char bid[64];
    ASSERT_CODE(dlock_permits_new(b, names[2], DLOCK_CSTR, &bp), DLOCK_OK);
    ASSERT_CODE(dlock_permits_acquire(bp, DLOCK_NOWAIT, 1000, bid), DLOCK_EBUSY);
    r = (ores){0};
    OSTART(dlock_async_permits_release(pm, id, on_obj, &r));
    OWAIT(r);
    ASSERT_CODE(r.code, DLOCK_OK);
    ASSERT_CODE(dlock_permits_acquire(bp, DLOCK_NOWAIT, 1000, bid), DLOCK_OK);
    ASSERT_CODE(dlock_permits_release(bp, bid), DLOCK_OK);
    dlock_permits_free(bp);

    /* a latch name whose channel hashes elsewhere: refused by both APIs */
    dlock_async_object *bad = NULL;
    ASSERT_CODE(dlock_async_latch_new(c, "l{t}", DLOCK_CSTR, &bad), DLOCK_EINVAL);
    dlock_latch *bbad = NULL;
    ASSERT_CODE(dlock_latch_new(b, "l{t}", DLOCK_CSTR, &bbad), DLOCK_EINVAL);

    dlock_async_object_free(s1);
    dlock_async_object_free(s2);
    dlock_async_object_free(la);
    dlock_async_object_free(pm);
    dlock_client_free(b);
    client_free(c);
}

/* A slot half migrated (MIGRATING / IMPORTING, its keys not moved yet): a
 * read of a key of that slot on neither master is sent on with ASKING to
 * the importing one (ASK); a lock acquire there (a script of several keys
 * on neither side) meets TRYAGAIN until the migration ends, and its wait
 * goes on until then; the hold taken before is released on the new master
 * after (MOVED). */
static void t_ask(th_server *s) {
    (void)s;
    cluster_up();
    const char *lname = "ac:askl", *held = "h{ac:askl}", *fresh = "f{ac:askl}";
    int src = owner_port(lname), dst = src == port[0] ? port[1] : port[0];
    redisContext *rs = raw(src), *rd = raw(dst);
    redisReply *r = redisCommand(rs, "CLUSTER KEYSLOT %s", lname);
    long long slot = r->integer;
    freeReplyObject(r);
    dlock_async_client *c = acluster();
    dlock_async_lock *a = ahandle(c, held, DLOCK_KIND_PLAIN);
    dlock_async_lock *f = ahandle(c, fresh, DLOCK_KIND_PLAIN);
    res ra = {0}, rf = {0};
    hold(a, 20000, &ra); /* its key on src, the map knows src */
    redisReply *sid = redisCommand(rs, "CLUSTER MYID"), *did = redisCommand(rd, "CLUSTER MYID");
    freeReplyObject(redisCommand(rd, "CLUSTER SETSLOT %lld IMPORTING %s", slot, sid->str));
    freeReplyObject(redisCommand(rs, "CLUSTER SETSLOT %lld MIGRATING %s", slot, did->str));
    /* ASK: a GET of the absent latch answered by dst after ASKING */
    long long ask0 = asking_calls(dst);
    dlock_async_object *la = NULL;
    ASSERT_CODE(dlock_async_latch_new(c, lname, DLOCK_CSTR, &la), DLOCK_OK);
    ores lo = {0};
    ASSERT_CODE(dlock_async_latch_count(la, on_obj, &lo), DLOCK_OK);
    RUN_UNTIL(lo.calls > 0, 3000);
    ASSERT_MSG(lo.code == DLOCK_OK, "latch count: %s", dlock_async_object_errmsg(la));
    ASSERT_EQ(lo.value, 0);
    ASSERT_MSG(asking_calls(dst) > ask0, "no ASKING on the importing master");
    /* a lock acquire in the slot waits for the end of the migration */
    START(dlock_async_acquire(f, 8000, 20000, on_done, &rf));
    run_for(600);
    ASSERT_EQ(rf.calls, 0);
    /* the migration ends: the held key moved, the slot given to dst */
    redisReply *keys = redisCommand(rs, "CLUSTER GETKEYSINSLOT %lld 100", slot);
    for (size_t k = 0; k < keys->elements; k++)
        freeReplyObject(redisCommand(rs, "MIGRATE 127.0.0.1 %d %s 0 5000", dst,
                                     keys->element[k]->str));
    freeReplyObject(keys);
    for (int i = 0; i < NM; i++) {
        redisContext *x = raw(port[i]);
        freeReplyObject(redisCommand(x, "CLUSTER SETSLOT %lld NODE %s", slot, did->str));
        redisFree(x);
    }
    int64_t t_end = th_now_ms();
    WAIT_DONE(rf, 8000);
    ASSERT_MSG(rf.code == DLOCK_OK, "acquire across the migration: %s",
               dlock_async_lock_errmsg(f));
    ASSERT(rf.at >= t_end);
    ASSERT_EQ(th_cmd_int(rd, "EXISTS %s", fresh), 1);
    ASSERT_EQ(th_cmd_int(rd, "EXISTS %s", held), 1);
    ra = (res){0};
    START(dlock_async_release(a, on_done, &ra));
    WAIT_DONE(ra, 3000);
    ASSERT_MSG(ra.code == DLOCK_OK, "release after the migration: %s",
               dlock_async_lock_errmsg(a));
    rf = (res){0};
    START(dlock_async_release(f, on_done, &rf));
    WAIT_DONE(rf, 3000);
    ASSERT_CODE(rf.code, DLOCK_OK);
    ASSERT_EQ(th_cmd_int(rd, "EXISTS %s", fresh), 0);
    ASSERT_EQ(th_cmd_int(rd, "EXISTS %s", held), 0);
    freeReplyObject(sid);
    freeReplyObject(did);
    redisFree(rs);
    redisFree(rd);
    dlock_async_object_free(la);
    dlock_async_lock_free(a);
    dlock_async_lock_free(f);
    client_free(c);
}

/* ---- the multi-lock and the ID worker on a cluster ---- */

static void on_set(dlock_async_lock *const *locks, size_t n, int code, const uint64_t *fences,
                   void *ud) {
    (void)locks, (void)n, (void)fences;
    res *r = ud;
    r->calls++;
    r->code = code;
    r->at = th_now_ms();
}

typedef struct idgot {
    int calls, code;
    uint64_t id;
} idgot;

static void on_cid(dlock_async_idworker *w, int code, uint64_t id, void *ud) {
    (void)w;
    idgot *g = ud;
    g->calls++;
    g->code = code;
    g->id = id;
}

/* A set of names on the 3 masters, one held by a blocking client for a
 * while: the set waits for it and holds every name, each key on its
 * master; released. ID workers, async and blocking, on one prefix: ids
 * increasing and all distinct, the day's counter (on its master) their
 * count. */
static void t_extras(th_server *s) {
    (void)s;
    cluster_up();
    dlock_async_client *c = acluster();
    char names[3][32];
    spread_names("ac:m:", names, 3);
    dlock_async_lock *set[3] = {ahandle(c, names[0], DLOCK_KIND_PLAIN),
                                ahandle(c, names[1], DLOCK_KIND_REENTRANT),
                                ahandle(c, names[2], DLOCK_KIND_WRITE)};
    bhold bh = {.name = names[1], .kind = DLOCK_KIND_REENTRANT, .hold_ms = 400};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, bholder, &bh), 0);
    RUN_UNTIL(atomic_load(&bh.go), 5000);
    res r = {0};
    START(dlock_async_multi_acquire(set, 3, 5000, 10000, on_set, &r));
    WAIT_DONE(r, 6000);
    pthread_join(t, NULL);
    ASSERT_CODE(r.code, DLOCK_OK);
    ASSERT(r.at >= bh.released_at);
    ASSERT_GT(dlock_async_multi_valid_ms(set, 3), 5000);
    for (int i = 0; i < 3; i++) {
        redisContext *x = raw(owner_port(names[i]));
        ASSERT_EQ(th_cmd_int(x, "EXISTS %s", names[i]), 1);
        redisFree(x);
    }
    r = (res){0};
    START(dlock_async_multi_release(set, 3, on_set, &r));
    WAIT_DONE(r, 3000);
    ASSERT_CODE(r.code, DLOCK_OK);

    dlock_async_idworker *w = NULL;
    ASSERT_CODE(dlock_async_idworker_new(c, "acid", NULL, &w), DLOCK_OK);
    static idgot g[20];
    for (int i = 0; i < 20; i++) START(dlock_async_idworker_next(w, on_cid, &g[i]));
    RUN_UNTIL(g[19].calls > 0, 3000);
    dlock_client *b = bcluster();
    dlock_idworker *bw = NULL;
    ASSERT_OK(dlock_idworker_new(b, "acid", NULL, &bw));
    uint64_t all[40];
    for (int i = 0; i < 20; i++) {
        ASSERT_MSG(g[i].code == DLOCK_OK, "next: %s", dlock_async_idworker_errmsg(w));
        if (i) ASSERT_U64_GT(g[i].id, g[i - 1].id);
        all[i] = g[i].id;
        ASSERT_OK(dlock_idworker_next(bw, &all[20 + i]));
    }
    for (int i = 0; i < 40; i++)
        for (int j = 0; j < i; j++) ASSERT_MSG(all[i] != all[j], "id twice: %d %d", i, j);
    dlock_idworker_free(bw);
    dlock_client_free(b);
    dlock_async_idworker_free(w);
    client_free(c);
}

int main(int argc, char **argv) {
    static const async_case cases[] = {
        {"kinds", t_kinds},     {"counter", t_counter}, {"moved", t_moved},
        {"objects", t_objects}, {"ask", t_ask},         {"extras", t_extras},
        {NULL, NULL},
    };
    return async_main(argc, argv, "async_cluster", cases);
}
