/* The async API through Redis Sentinel (redis-sentinel:// URLs) on real
 * event loops (tests/async_loop.c): the case's server is the master, a
 * second server its replica, three sentinels watch them. argv[1] is
 * "<case>_<loop>".
 *
 *   basic     locks and a semaphore through the sentinels; a wait served
 *             by a blocking client's release; an exact counter (a
 *             deliberately non-atomic GET/SET under the lock) of async
 *             handles and a blocking thread; an unknown master name and
 *             sentinels that do not answer fail with DLOCK_EIO
 *   failover  SENTINEL FAILOVER while a lock is held and a waiter waits:
 *             the client follows the new master within about a second
 *             although the old one still answers as a master (a new
 *             acquire's key is on the new master), the holder's release
 *             reaches it and the waiter is served there
 *   crash     the master killed (and the sentinel asked first paused)
 *             while a lock is held and a waiter waits: the waiter rides
 *             out the outage and is served on the promoted replica once
 *             the holder's lease runs out there
 *   replicas  wait_replicas: an acquire and an extend acknowledged by the
 *             replica; with the replica stopped an acquire fails with
 *             DLOCK_EREPLICAS and is given back, an extend fails and keeps
 *             the shorter validity, a cancel during the WAIT gives back
 *             what the attempt won */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "async_loop.h"

#define NSENT 3
static pid_t sent_pid[NSENT];
static int sent_port[NSENT];
static char sent_dir[128];
static char url[512];
static th_server *replica;

static void stop_sentinels(void) {
    for (int i = 0; i < NSENT; i++) th_stop_pid(&sent_pid[i], SIGKILL, 2000);
    th_rm_rf(sent_dir);
}

/* The connections sentinel i has accepted so far (INFO stats), counting
 * the one asking. */
static long long sentinel_connections(int i) {
    redisContext *rc = redisConnect("127.0.0.1", sent_port[i]);
    ASSERT(rc && !rc->err);
    redisReply *r = th_cmd(rc, "INFO stats");
    const char *at = r->str ? strstr(r->str, "total_connections_received:") : NULL;
    ASSERT(at);
    long long n = atoll(at + strlen("total_connections_received:"));
    freeReplyObject(r);
    redisFree(rc);
    return n;
}

static int all_name(int port) {
    for (int i = 0; i < NSENT; i++)
        if (th_sentinel_master_port(sent_port[i]) != port) return 0;
    return 1;
}

/* A replica of m and three sentinels watching m; url set. */
static void sentinels(th_server *m) {
    if (system("command -v redis-sentinel >/dev/null 2>&1") != 0)
        th_skip("redis-sentinel is not installed");
    atexit(stop_sentinels);
    redisContext *rm = th_redis(m);
    th_cmd_ok(rm, "CONFIG SET repl-diskless-sync-delay 0");
    replica = th_server_start(NULL);
    redisContext *rr = th_redis(replica);
    th_cmd_ok(rr, "REPLICAOF 127.0.0.1 %d", th_server_port(m));
    ASSERT_EVENTUALLY(th_cmd_int(rm, "WAIT 1 100") == 1, 15000);
    redisFree(rr);
    redisFree(rm);
    snprintf(sent_dir, sizeof sent_dir, "/tmp/dlock-asent-XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(sent_dir));
    size_t off = (size_t)snprintf(url, sizeof url, "redis-sentinel://");
    for (int i = 0; i < NSENT; i++) {
        sent_port[i] = th_free_port();
        char conf[200];
        snprintf(conf, sizeof conf, "%s/s%d.conf", sent_dir, i);
        FILE *f = fopen(conf, "w");
        ASSERT_NOT_NULL(f);
        fprintf(f,
                "port %d\nbind 127.0.0.1\ndir %s\nlogfile %s/s%d.log\n"
                "sentinel monitor mymaster 127.0.0.1 %d 2\n"
                "sentinel down-after-milliseconds mymaster 1000\n"
                "sentinel failover-timeout mymaster 3000\n",
                sent_port[i], sent_dir, sent_dir, i, th_server_port(m));
        fclose(f);
        pid_t p = th_fork();
        if (p == 0) {
            execlp("redis-sentinel", "redis-sentinel", conf, (char *)NULL);
            _exit(127);
        }
        sent_pid[i] = p;
        off += (size_t)snprintf(url + off, sizeof url - off, "%s127.0.0.1:%d", i ? "," : "",
                                sent_port[i]);
    }
    snprintf(url + off, sizeof url - off, "/mymaster");
    for (int i = 0; i < NSENT; i++) ASSERT_EVENTUALLY(th_sentinel_ready(sent_port[i], NSENT), 20000);
    th_log("master %d, replica %d, sentinels up: %s", th_server_port(m),
           th_server_port(replica), url);
}

static dlock_async_client *sclient(void) {
    dlock_async_client *c = NULL;
    ASSERT_CODE(client_new(url, NULL, &c), DLOCK_OK);
    return c;
}

static dlock_client *bclient(void) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *b = NULL;
    ASSERT_CCODE(b, dlock_client_new(&o, &b), DLOCK_OK);
    return b;
}

/* ---- basic ---- */

static void on_obj(dlock_async_object *o, int code, int64_t value, void *ud) {
    (void)o;
    (void)value;
    res *r = ud;
    r->calls++;
    r->code = code;
    r->at = th_now_ms();
}

/* The exact counter: async handles and a blocking thread each add ROUNDS
 * to a Redis counter read and written apart (GET, a pause, SET) under the
 * lock "sc". */
enum { NA = 3, ROUNDS = 15 };
static atomic_int inside, overlaps;
static redisContext *crc; /* the async side's raw connection */
typedef struct worker {
    dlock_async_lock *l;
    res r;
    int done;
    long long seen;
} worker;
static worker wk[NA];

static void round_start(void *arg);
static void round_write(void *arg) {
    worker *w = arg;
    th_cmd_ok(crc, "SET sc:n %lld", w->seen + 1);
    atomic_fetch_sub(&inside, 1);
    w->r.calls = 0;
    START(dlock_async_release(w->l, on_done, &w->r));
    after(1, round_start, w);
}
static void on_acquired(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    (void)l;
    (void)fence;
    worker *w = ud;
    ASSERT_OK(code);
    if (atomic_fetch_add(&inside, 1) != 0) atomic_fetch_add(&overlaps, 1);
    char *v = th_cmd_str(crc, "GET sc:n");
    w->seen = v ? atoll(v) : 0;
    free(v);
    after(3, round_write, w);
}
static void round_start(void *arg) {
    worker *w = arg;
    if (w->r.calls == 0) { /* the release is still out */
        after(1, round_start, w);
        return;
    }
    ASSERT_OK(w->r.code);
    if (w->done == ROUNDS) return;
    w->done++;
    w->r.calls = 0;
    START(dlock_async_acquire(w->l, 10000, 5000, on_acquired, w));
}

static void *blocking_counter(void *arg) {
    th_server *m = arg;
    dlock_client *b = bclient();
    dlock_lock *l = th_lock(b, "sc", DLOCK_KIND_PLAIN);
    redisContext *rc = th_redis(m);
    for (int i = 0; i < ROUNDS; i++) {
        ASSERT_OK(dlock_acquire(l, 10000, 5000, NULL));
        if (atomic_fetch_add(&inside, 1) != 0) atomic_fetch_add(&overlaps, 1);
        char *v = th_cmd_str(rc, "GET sc:n");
        long long n = v ? atoll(v) : 0;
        free(v);
        th_sleep_ms(3);
        th_cmd_ok(rc, "SET sc:n %lld", n + 1);
        atomic_fetch_sub(&inside, 1);
        ASSERT_OK(dlock_release(l));
    }
    dlock_lock_free(l);
    redisFree(rc);
    dlock_client_free(b);
    return NULL;
}

static void t_basic(th_server *s) {
    sentinels(s);
    redisContext *rm = th_redis(s);
    dlock_async_client *c = sclient();
    dlock_client *b = bclient();

    /* a lock through the sentinels: on the master */
    dlock_async_lock *l = alock(c, "sb");
    res r = {0};
    hold(l, 20000, &r);
    ASSERT(r.fence > 0);
    ASSERT_EQ(th_cmd_int(rm, "EXISTS sb"), 1);
    r = (res){0};
    START(dlock_async_release(l, on_done, &r));
    WAIT_DONE(r, 3000);
    ASSERT_OK(r.code);
    ASSERT_EQ(th_cmd_int(rm, "EXISTS sb"), 0);

    /* a wait served by a blocking client's release */
    dlock_lock *bl = th_lock(b, "sw", DLOCK_KIND_PLAIN);
    ASSERT_OK(dlock_acquire(bl, DLOCK_NOWAIT, 20000, NULL));
    dlock_async_lock *w = alock(c, "sw");
    res wr = {0};
    START(dlock_async_acquire(w, 8000, 20000, on_done, &wr));
    run_for(300);
    ASSERT_EQ(wr.calls, 0);
    int64_t released = th_now_ms();
    ASSERT_OK(dlock_release(bl));
    WAIT_DONE(wr, 3000);
    ASSERT_OK(wr.code);
    th_log("wait served %lld ms after the blocking release", (long long)(wr.at - released));
    ASSERT(wr.at - released < 1000);
    ASSERT_CODE(dlock_acquire(bl, DLOCK_NOWAIT, 20000, NULL), DLOCK_EBUSY);
    wr = (res){0};
    START(dlock_async_release(w, on_done, &wr));
    WAIT_DONE(wr, 3000);
    ASSERT_OK(wr.code);
    dlock_lock_free(bl);

    /* the watch asks every second on a connection it keeps: the sentinels
     * see no new connections while the client idles */
    long long before = 0, after_ = 0;
    for (int i = 0; i < NSENT; i++) before += sentinel_connections(i);
    run_for(3300);
    for (int i = 0; i < NSENT; i++) after_ += sentinel_connections(i);
    after_ -= NSENT; /* this check's own */
    th_log("connections the sentinels accepted over 3.3 s: %lld", after_ - before);
    ASSERT(after_ - before <= 1);

    /* a semaphore */
    dlock_async_object *sem = NULL;
    ASSERT_OK(dlock_async_semaphore_new(c, "ss", DLOCK_CSTR, &sem));
    res sr = {0};
    START(dlock_async_semaphore_try_set(sem, 1, on_obj, &sr));
    WAIT_DONE(sr, 3000);
    ASSERT_OK(sr.code);
    sr = (res){0};
    START(dlock_async_semaphore_acquire(sem, 1, DLOCK_NOWAIT, on_obj, &sr));
    WAIT_DONE(sr, 3000);
    ASSERT_OK(sr.code);
    sr = (res){0};
    START(dlock_async_semaphore_acquire(sem, 1, DLOCK_NOWAIT, on_obj, &sr));
    WAIT_DONE(sr, 3000);
    ASSERT_CODE(sr.code, DLOCK_EBUSY);
    dlock_async_object_free(sem);

    /* the exact counter, async and blocking mixed */
    crc = th_redis(s);
    for (int i = 0; i < NA; i++) {
        wk[i].l = alock(c, "sc");
        wk[i].r.calls = 1; /* "released": the first round starts */
        round_start(&wk[i]);
    }
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, blocking_counter, s), 0);
    RUN_UNTIL(wk[0].done == ROUNDS && wk[1].done == ROUNDS && wk[2].done == ROUNDS &&
                  wk[0].r.calls && wk[1].r.calls && wk[2].r.calls,
              60000);
    pthread_join(t, NULL);
    ASSERT_EQ(atomic_load(&overlaps), 0);
    char *n = th_cmd_str(rm, "GET sc:n");
    ASSERT_NOT_NULL(n);
    ASSERT_EQ(atoll(n), (NA + 1) * ROUNDS);
    free(n);
    redisFree(crc);

    /* an unknown master; sentinels that do not answer */
    const char *bad[2];
    char unknown[600], deaf[200];
    snprintf(unknown, sizeof unknown, "%.*s/nosuchmaster",
             (int)(strrchr(url, '/') - url), url);
    int p1 = th_free_port(), p2 = th_free_port();
    snprintf(deaf, sizeof deaf, "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d/mymaster", p1, p2);
    bad[0] = unknown;
    bad[1] = deaf;
    for (int i = 0; i < 2; i++) {
        dlock_async_client *bc = NULL;
        ASSERT_CODE(client_new(bad[i], NULL, &bc), DLOCK_OK);
        dlock_async_lock *bl2 = alock(bc, "sx");
        res br = {0};
        START(dlock_async_acquire(bl2, DLOCK_NOWAIT, 5000, on_done, &br));
        WAIT_DONE(br, 5000);
        ASSERT_CODE(br.code, DLOCK_EIO);
        th_log("%s: %s", bad[i], dlock_async_lock_errmsg(bl2));
        ASSERT(strstr(dlock_async_lock_errmsg(bl2), i ? "no sentinel could name"
                                                      : "knows no master named"));
        client_free(bc);
    }
    client_free(c);
    dlock_client_free(b);
    redisFree(rm);
}

/* ---- failover ---- */

static void t_failover(th_server *s) {
    sentinels(s);
    int old_port = th_server_port(s), new_port = th_server_port(replica);
    dlock_async_client *c = sclient();
    dlock_async_lock *h = alock(c, "fa");
    res hr = {0};
    hold(h, 30000, &hr);
    dlock_async_lock *w = alock(c, "fa");
    res wr = {0};
    START(dlock_async_acquire(w, 15000, 30000, on_done, &wr));
    run_for(300);
    ASSERT_EQ(wr.calls, 0);
    redisContext *rr = th_redis(replica);
    ASSERT_EVENTUALLY(th_cmd_int(rr, "EXISTS fa") == 1, 3000); /* replicated */
    redisFree(rr);

    redisContext *rs = redisConnect("127.0.0.1", sent_port[0]);
    ASSERT(rs && !rs->err);
    th_cmd_ok(rs, "SENTINEL FAILOVER mymaster");
    redisFree(rs);
    RUN_UNTIL(all_name(new_port), 10000);
    int64_t failed_over = th_now_ms();
    /* (the sentinels close the promoted server's clients: connect after) */
    redisContext *rn = th_redis(replica);
    th_log("the sentinels name %d (was %d)", new_port, old_port);
    /* the old master still answers as one for a while (the sentinels
     * reconfigure it later): requests must not go there */
    redisContext *ro = th_redis(s);
    redisReply *role = th_cmd(ro, "ROLE");
    th_log("the old master's role now: %s", role->element[0]->str);
    freeReplyObject(role);

    run_for(2500); /* the watch asks every second */
    dlock_async_lock *n = alock(c, "fb");
    res nr = {0};
    START(dlock_async_acquire(n, 3000, 20000, on_done, &nr));
    WAIT_DONE(nr, 5000);
    ASSERT_OK(nr.code);
    ASSERT_EQ(th_cmd_int(rn, "EXISTS fb"), 1);
    th_log("an acquire %lld ms after the failover went to the new master",
           (long long)(th_now_ms() - failed_over));

    /* the holder's release reaches the new master; the waiter is served there */
    res rel = {0};
    int tries = 0;
    do {
        rel = (res){0};
        START(dlock_async_release(h, on_done, &rel));
        WAIT_DONE(rel, 5000);
        tries++;
    } while (rel.code == DLOCK_EIO && tries < 3);
    ASSERT_OK(rel.code);
    int64_t released = th_now_ms();
    WAIT_DONE(wr, 5000);
    ASSERT_OK(wr.code);
    th_log("the waiter was served %lld ms after the release", (long long)(wr.at - released));
    char *owner = th_cmd_str(rn, "GET fa");
    ASSERT_NOT_NULL(owner);
    free(owner);
    redisFree(ro);
    redisFree(rn);
    client_free(c);
}

/* ---- crash ---- */

static void t_crash(th_server *s) {
    sentinels(s);
    int new_port = th_server_port(replica);
    dlock_async_client *c = sclient();
    dlock_async_lock *h = alock(c, "fc");
    res hr = {0};
    hold(h, 2000, &hr); /* its lease runs out on the new master */
    dlock_async_lock *w = alock(c, "fc");
    res wr = {0};
    START(dlock_async_acquire(w, 20000, 20000, on_done, &wr));
    run_for(300);
    ASSERT_EQ(wr.calls, 0);
    redisContext *rr = th_redis(replica);
    ASSERT_EVENTUALLY(th_cmd_int(rr, "EXISTS fc") == 1, 3000); /* replicated */
    redisFree(rr);
    /* the sentinel asked first (it answered last) answers nothing now: each
     * question waits for it 500 ms, then asks the next */
    kill(sent_pid[0], SIGSTOP);
    th_server_halt(s, SIGKILL);
    int64_t killed = th_now_ms();
    RUN_UNTIL(wr.calls > 0, 20000);
    ASSERT_MSG(wr.code == DLOCK_OK, "%s", dlock_async_lock_errmsg(w));
    th_log("the waiter was served on the new master %lld ms after the master died",
           (long long)(wr.at - killed));
    ASSERT_EQ(th_sentinel_master_port(sent_port[1]), new_port);
    redisContext *rn = th_redis(replica);
    ASSERT_EQ(th_cmd_int(rn, "EXISTS fc"), 1);
    redisFree(rn);
    /* the released lock is gone from the new master */
    res rel = {0};
    START(dlock_async_release(w, on_done, &rel));
    WAIT_DONE(rel, 3000);
    ASSERT_OK(rel.code);
    rn = th_redis(replica);
    ASSERT_EQ(th_cmd_int(rn, "EXISTS fc"), 0);
    redisFree(rn);
    kill(sent_pid[0], SIGCONT);
    client_free(c);
}

/* ---- replicas ---- */

static void t_replicas(th_server *s) {
    sentinels(s);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.wait_replicas = 1;
    o.wait_replicas_timeout_ms = 300;
    dlock_async_client *c = NULL;
    ASSERT_CODE(client_new_opts(&o, &c), DLOCK_OK);
    redisContext *rm = th_redis(s), *rr = th_redis(replica);

    /* acknowledged: on the replica when the acquire returns */
    dlock_async_lock *l = alock(c, "sr");
    res r = {0};
    hold(l, 20000, &r);
    ASSERT_EQ(th_cmd_int(rr, "EXISTS sr"), 1);
    r = (res){0};
    START(dlock_async_extend(l, 30000, on_done, &r));
    WAIT_DONE(r, 3000);
    ASSERT_OK(r.code);
    ASSERT(th_cmd_int(rr, "PTTL sr") > 20000);

    /* the replica stopped: an acquire fails and is given back, an extend
     * fails and the hold keeps the shorter validity */
    th_server_pause(replica);
    dlock_async_lock *m = alock(c, "sr2");
    r = (res){0};
    START(dlock_async_acquire(m, DLOCK_NOWAIT, 20000, on_done, &r));
    WAIT_DONE(r, 3000);
    ASSERT_CODE(r.code, DLOCK_EREPLICAS);
    th_log("%s", dlock_async_lock_errmsg(m));
    ASSERT(strstr(dlock_async_lock_errmsg(m), "only 0 of 1 replicas"));
    ASSERT_EQ(dlock_async_lock_valid_ms(m), 0);
    RUN_UNTIL(th_cmd_int(rm, "EXISTS sr2") == 0, 2000);
    int64_t before = dlock_async_lock_valid_ms(l);
    r = (res){0};
    START(dlock_async_extend(l, 60000, on_done, &r));
    WAIT_DONE(r, 3000);
    ASSERT_CODE(r.code, DLOCK_EREPLICAS);
    ASSERT(dlock_async_lock_valid_ms(l) > 0 && dlock_async_lock_valid_ms(l) <= before);

    /* cancelled while it waits for the replicas: what it won is given back */
    dlock_async_lock *k = alock(c, "sr4");
    r = (res){0};
    START(dlock_async_acquire(k, DLOCK_NOWAIT, 20000, on_done, &r));
    RUN_UNTIL(th_cmd_int(rm, "EXISTS sr4") == 1, 2000); /* the attempt ran */
    run_for(100); /* its reply read: the WAIT (300 ms) is out */
    ASSERT_EQ(r.calls, 0);
    ASSERT_OK(dlock_async_cancel(k));
    ASSERT_CODE(r.code, DLOCK_ECANCELED);
    RUN_UNTIL(th_cmd_int(rm, "EXISTS sr4") == 0, 2000);

    /* the replica back: acquires succeed again */
    th_server_unpause(replica);
    r = (res){0};
    START(dlock_async_acquire(m, 2000, 20000, on_done, &r));
    WAIT_DONE(r, 3000);
    ASSERT_OK(r.code);
    ASSERT_EQ(th_cmd_int(rr, "EXISTS sr2"), 1);
    redisFree(rm);
    redisFree(rr);
    client_free(c);
}

static const async_case cases[] = {{"basic", t_basic},       {"failover", t_failover},
                                   {"crash", t_crash},       {"replicas", t_replicas},
                                   {NULL, NULL}};

int main(int argc, char **argv) { return async_main(argc, argv, "async_sentinel", cases); }
