/* RedLock over 5 independent masters: mutual exclusion across processes,
 * availability with a minority down, a clean "no quorum" with a majority
 * down, a frozen master costing at most the node timeout, watchdog renewal on
 * a majority, and fencing tokens from a designated counter server. */
#include "harness.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#define NODES 5
#define NPROC 8
#define ROUNDS 40
#define NODE_TIMEOUT 250

static th_server *srv[NODES];
static char url[1024];

static dlock_client *rl_client(int64_t wd_lease, const char *fence_url)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.watchdog_lease_ms = wd_lease;
    o.node_timeout_ms = NODE_TIMEOUT;
    o.fence_url = fence_url;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    ASSERT_CCODE(c, rc, DLOCK_OK);
    return c;
}

static int child(const th_server *counter_srv, int idx)
{
    dlock_client *c = rl_client(2000, NULL);
    dlock_lock *l = th_lock(c, "rl:lock", idx % 2 ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN);
    (void)idx;
    redisContext *rc = th_redis(counter_srv);
    for (int i = 0; i < ROUNDS; i++) {
        ASSERT_LOK(l, dlock_acquire(l, 30000, 5000, NULL));
        ASSERT_EQ(th_cmd_int(rc, "INCR rl:inside"), 1);
        char *v = th_cmd_str(rc, "GET rl:counter");
        long long n = v ? atoll(v) : 0;
        free(v);
        if (i % 4 == 0) usleep(500);
        th_cmd_ok(rc, "SET rl:counter %lld", n + 1);
        ASSERT_EQ(th_cmd_int(rc, "DECR rl:inside"), 0);
        ASSERT_LOK(l, dlock_release(l));
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return 0;
}

static int on_every_node(const char *key)
{
    int n = 0;
    for (int i = 0; i < NODES; i++) {
        redisContext *rc = th_redis(srv[i]);
        n += th_cmd_int(rc, "EXISTS %s", key) == 1;
        redisFree(rc);
    }
    return n;
}

/* SCRIPT FLUSH on nodes [from, to): their EVALSHA answers NOSCRIPT. */
static void flush_scripts(int from, int to)
{
    for (int i = from; i < to; i++) {
        redisContext *rc = th_redis(srv[i]);
        th_cmd_ok(rc, "SCRIPT FLUSH");
        redisFree(rc);
    }
}

/* The hold count of owner field tok of the hash key on node i ("" if none). */
static long long count_on(int i, const char *key, const char *tok)
{
    redisContext *rc = th_redis(srv[i]);
    char *v = th_cmd_str(rc, "HGET %s %s", key, tok);
    long long n = v ? atoll(v) : 0;
    free(v);
    redisFree(rc);
    return n;
}

/* Normal clients connected to the server of rc (rc's own included). */
static long long clients_on(redisContext *rc)
{
    char *v = th_cmd_str(rc, "CLIENT LIST TYPE normal");
    long long n = 0;
    for (char *p = v; p && *p; p++) n += *p == '\n';
    free(v);
    return n;
}

/* Issue 19, item 2: a re-entry that reaches fewer than a majority undoes
 * only what it did, node by node. Three masters stop answering during the
 * re-entry, two answer it. Rounds 0-2: the three are frozen (SIGSTOP); they
 * run what they read once they thaw. Rounds 3-5: they postpone scripts
 * (CLIENT PAUSE WRITE, 400 ms) and drop a postponed request whose connection
 * closes: the re-entry, given up on at the node timeout (250 ms), never runs
 * there, but a clean-up sent afterwards on another connection did (it used
 * to delete the hold there: released on every node). Either way the original
 * hold (count 1) must be left on every node, so that no one else can take
 * the lock while the handle says it holds. */
static void failed_reentry(void)
{
    dlock_client *c = rl_client(0, NULL);
    dlock_lock *r = th_lock(c, "rl:re", DLOCK_KIND_REENTRANT);
    for (int round = 0; round < 6; round++) {
        int freeze = round < 3;
        ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 8000, NULL));
        char tok[128];
        snprintf(tok, sizeof tok, "%s", dlock_lock_token(r));
        for (int i = 0; i < NODES; i++) ASSERT_EQ(count_on(i, "rl:re", tok), 1);
        redisContext *paused[NODES] = {0};
        for (int i = 2; i < NODES; i++) {
            if (freeze) {
                th_server_pause(srv[i]);
            } else {
                paused[i] = th_redis(srv[i]);
                th_cmd_ok(paused[i], "CLIENT PAUSE 400 WRITE");
            }
        }
        ASSERT_LCODE(r, dlock_acquire(r, DLOCK_NOWAIT, 8000, NULL), DLOCK_ENOQUORUM);
        if (freeze)
            for (int i = 2; i < NODES; i++) th_server_unpause(srv[i]);
        ASSERT_EQ(dlock_lock_holding(r), 1);
        ASSERT_GT(dlock_lock_valid_ms(r), 5000);
        /* what the three nodes got has run (or been dropped): a thawed
         * node, once the client's connections to it (all given up on) are
         * gone; a paused one, once a write of ours postponed after them
         * has run */
        for (int i = 2; i < NODES; i++) {
            redisContext *rc = paused[i] ? paused[i] : th_redis(srv[i]);
            if (freeze) ASSERT_EVENTUALLY(clients_on(rc) == 1, 3000);
            else th_cmd_ok(rc, "SET rl:after-pause 1");
            redisFree(rc);
        }
        int counts[NODES];
        for (int i = 0; i < NODES; i++) counts[i] = (int)count_on(i, "rl:re", tok);
        th_log("failed re-entry, round %d (%s): counts %d %d %d %d %d", round,
               freeze ? "SIGSTOP" : "CLIENT PAUSE", counts[0], counts[1], counts[2], counts[3],
               counts[4]);
        /* another client (made now: its pool's connections would count
         * above) cannot take the lock */
        dlock_client *c2 = rl_client(0, NULL);
        dlock_lock *o = th_lock(c2, "rl:re", DLOCK_KIND_REENTRANT);
        ASSERT_LCODE(o, dlock_acquire(o, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
        for (int i = 0; i < NODES; i++) ASSERT_EQ(counts[i], 1);
        /* one release ends the hold everywhere */
        ASSERT_LOK(r, dlock_release(r));
        ASSERT_EQ(dlock_lock_holding(r), 0);
        ASSERT_EQ(on_every_node("rl:re"), 0);
        ASSERT_LOK(o, dlock_acquire(o, DLOCK_NOWAIT, 5000, NULL));
        ASSERT_LOK(o, dlock_release(o));
        dlock_lock_free(o);
        dlock_client_free(c2);
    }
    dlock_lock_free(r);
    dlock_client_free(c);
}

/* A release that leaves the hold on a minority says "still held" only when
 * a majority still holds: a reentrant hold counted twice, then gone from
 * nodes 2, 3 and 4. The release leaves it (count 1) on nodes 0 and 1 only:
 * the hold is over (DLOCK_ELOST; another client takes the lock), and the
 * handle must not say it still holds (it did: more "still" answers than "released" ones).
 * (A node left at count 1 instead, as if it had missed the re-entry, keeps
 * its count: a release's script changes nothing below the count the owner
 * should have, so that hold would still be on a majority.) */
static void release_without_majority(void)
{
    dlock_client *c = rl_client(0, NULL);
    dlock_client *c2 = rl_client(0, NULL);
    dlock_lock *r = th_lock(c, "rl:maj", DLOCK_KIND_REENTRANT);
    dlock_lock *o = th_lock(c2, "rl:maj", DLOCK_KIND_PLAIN);
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 8000, NULL));
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 8000, NULL));
    char tok[128];
    snprintf(tok, sizeof tok, "%s", dlock_lock_token(r));
    for (int i = 0; i < NODES; i++) ASSERT_EQ(count_on(i, "rl:maj", tok), 2);
    redisContext *rc = NULL;
    for (int i = 2; i < NODES; i++) {
        rc = th_redis(srv[i]);
        th_cmd_int(rc, "DEL rl:maj");
        redisFree(rc);
    }
    /* two "still held", three "not held": the hold was lost */
    ASSERT_LCODE(r, dlock_release(r), DLOCK_ELOST);
    ASSERT_EQ(dlock_lock_holding(r), 0);
    ASSERT_EQ(dlock_lock_valid_ms(r), 0);
    ASSERT_LOK(o, dlock_acquire(o, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(o, dlock_release(o));
    for (int i = 0; i < 2; i++) {
        rc = th_redis(srv[i]);
        th_cmd_int(rc, "DEL rl:maj");
        redisFree(rc);
    }
    dlock_lock_free(r);
    dlock_lock_free(o);
    dlock_client_free(c);
    dlock_client_free(c2);
}

/* Issue 19, item 7: one frozen master (SIGSTOP) behind a password. Its
 * connect succeeds (the kernel accepts for it) and its AUTH is never
 * answered; connections used to be opened one after another under the
 * deadline the requests then used, so that AUTH used it all up and the
 * others were never asked ("0 of 5 nodes answered"). Opened at once, each
 * request sent when its own connection is up, every acquire of a free lock
 * succeeds, and within one fan-out: NODE_TIMEOUT for the frozen node's
 * answer or connect, plus scheduling slack. */
static void frozen_master_with_password(void)
{
    th_server_opts so = {.requirepass = "s3cret"};
    th_server *ps[NODES];
    char purl[1024];
    size_t off = (size_t)snprintf(purl, sizeof purl, "redlock://");
    for (int i = 0; i < NODES; i++) {
        ps[i] = th_server_start(&so);
        off += (size_t)snprintf(purl + off, sizeof purl - off, "%s:s3cret@127.0.0.1:%d",
                                i ? "," : "", th_server_port(ps[i]));
    }
    dlock_options o;
    dlock_options_init(&o);
    o.url = purl;
    o.node_timeout_ms = NODE_TIMEOUT;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    dlock_lock *l = th_lock(c, "rl:frozen", DLOCK_KIND_PLAIN);
    th_server_pause(ps[0]);
    int64_t worst = 0;
    for (int i = 0; i < 40; i++) {
        int64_t t0 = th_now_ms();
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL));
        int64_t took = th_now_ms() - t0;
        if (took > worst) worst = took;
        ASSERT_LT(took, NODE_TIMEOUT + 150);
        ASSERT_LOK(l, dlock_release(l));
    }
    th_log("40 acquires with a frozen master behind a password: all held, worst %lld ms",
           (long long)worst);
    th_server_unpause(ps[0]);
    dlock_lock_free(l);
    dlock_client_free(c);
    for (int i = 0; i < NODES; i++) th_server_stop(ps[i]);
}

/* A majority of nodes that refuse the client's credentials (their password
 * changed after the client opened) is an authentication failure, not "did
 * not answer". */
static void majority_refuses_auth(void)
{
    redisContext *r[NODES];
    for (int i = 0; i < NODES; i++) {
        r[i] = th_redis(srv[i]);
        th_cmd_ok(r[i], "CONFIG SET requirepass rl-old");
    }
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.password = "rl-old";
    o.node_timeout_ms = NODE_TIMEOUT;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    dlock_lock *l = th_lock(c, "rl:auth", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(l, dlock_release(l));
    for (int i = 0; i < 3; i++) {
        th_cmd_ok(r[i], "CONFIG SET requirepass rl-new");
        th_cmd_int(r[i], "CLIENT KILL TYPE normal SKIPME yes"); /* the pooled connections */
    }
    /* the first try may find the pooled connections closed (no answer);
     * the next ones connect afresh and are refused */
    int rc = dlock_acquire(l, 1000, 5000, NULL);
    th_log("majority refusing AUTH: %s: %s", dlock_strerror(rc), dlock_lock_errmsg(l));
    ASSERT_LCODE(l, rc, DLOCK_EAUTH);
    for (int i = 0; i < NODES; i++) {
        th_cmd_ok(r[i], "CONFIG SET requirepass %s", "");
        redisFree(r[i]);
    }
    dlock_lock_free(l);
    dlock_client_free(c);
}

int main(void)
{
    th_init("redlock");
    size_t off = (size_t)snprintf(url, sizeof url, "redlock://");
    for (int i = 0; i < NODES; i++) {
        srv[i] = th_server_start(NULL);
        off += (size_t)snprintf(url + off, sizeof url - off, "%s127.0.0.1:%d", i ? "," : "",
                                th_server_port(srv[i]));
    }
    th_server *counter = th_server_start(NULL); /* the protected resource */

    /* mutual exclusion: 8 processes, plain and reentrant mixed per process
     * (different names would not exclude: both kinds use "rl:lock", so they
     * are run one kind per phase) */
    pid_t pids[NPROC];
    for (int i = 0; i < NPROC; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) _exit(child(counter, 0));
    }
    for (int i = 0; i < NPROC; i++) ASSERT_EQ(th_wait_child(pids[i], 60000), 0);
    redisContext *crc = th_redis(counter);
    char *v = th_cmd_str(crc, "GET rl:counter");
    ASSERT_NOT_NULL(v);
    ASSERT_EQ(atoll(v), NPROC * ROUNDS);
    free(v);
    th_log("mutual exclusion: %d x %d rounds exact", NPROC, ROUNDS);

    failed_reentry();
    frozen_master_with_password();
    release_without_majority();
    majority_refuses_auth();

    dlock_client *c = rl_client(600, NULL);
    dlock_lock *a = th_lock(c, "rl:a", DLOCK_KIND_PLAIN);
    dlock_lock *b = th_lock(c, "rl:a", DLOCK_KIND_PLAIN);

    /* acquired on every node, excluded, released everywhere */
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_EQ(on_every_node("rl:a"), NODES);
    ASSERT_GT(dlock_lock_valid_ms(a), 4000);
    ASSERT_LCODE(b, dlock_acquire(b, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(b, dlock_acquire(b, 200, 5000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_LOK(a, dlock_extend(a, 8000));
    /* valid for the lease less RedLock's drift, as after an acquire */
    ASSERT_LE(dlock_lock_valid_ms(a), 8000 - (8000 / 100 + 2));
    ASSERT_GT(dlock_lock_valid_ms(a), 7000);
    ASSERT_LOK(a, dlock_release(a));
    ASSERT_EQ(on_every_node("rl:a"), 0);

    /* the script cache flushed on a majority, then on every node: each node
     * that answers NOSCRIPT gets the script's text, in the same fan-out */
    flush_scripts(0, 3);
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_EQ(on_every_node("rl:a"), NODES);
    flush_scripts(0, NODES);
    ASSERT_LOK(a, dlock_extend(a, 8000));
    ASSERT_GT(dlock_lock_valid_ms(a), 7000);
    flush_scripts(2, NODES);
    ASSERT_LOK(a, dlock_release(a));
    ASSERT_EQ(on_every_node("rl:a"), 0);

    /* dlock_lock_check asks every node: held while a majority has our token */
    redisContext *r0 = th_redis(srv[0]);
    redisContext *r1 = th_redis(srv[1]);
    redisContext *r2 = th_redis(srv[2]);
    int held = -1;
    int64_t cnt = -1;
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(a, dlock_lock_check(a, &held, &cnt));
    ASSERT_EQ(held, 1);
    ASSERT_EQ(cnt, 1);
    ASSERT_LOK(b, dlock_lock_check(b, &held, &cnt));
    ASSERT_EQ(held, 0);
    ASSERT_EQ(cnt, 0);
    th_cmd_int(r0, "DEL rl:a");
    th_cmd_int(r1, "DEL rl:a");
    ASSERT_LOK(a, dlock_lock_check(a, &held, &cnt)); /* 3 of 5 */
    ASSERT_EQ(held, 1);
    th_cmd_int(r2, "DEL rl:a");
    ASSERT_LOK(a, dlock_lock_check(a, &held, &cnt)); /* 2 of 5 */
    ASSERT_EQ(held, 0);
    ASSERT_EQ(cnt, 0);
    /* the release deletes what is left and says the hold was lost */
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);
    ASSERT_EQ(on_every_node("rl:a"), 0);
    ASSERT_EQ(dlock_lock_holding(a), 0);

    /* a lock held on only a minority of nodes does not count: b takes it */
    th_cmd_ok(r0, "SET rl:a someone PX 10000");
    th_cmd_ok(r1, "SET rl:a someone PX 10000");
    ASSERT_LOK(b, dlock_acquire(b, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(b, dlock_release(b));
    /* ...but on a majority it does, and the failed attempt leaves nothing */
    th_cmd_ok(r2, "SET rl:a someone PX 10000");
    ASSERT_LCODE(b, dlock_acquire(b, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_EQ(on_every_node("rl:a"), 3);
    for (int i = 0; i < 3; i++) th_cmd_int(i == 0 ? r0 : i == 1 ? r1 : r2, "DEL rl:a");

    /* the watchdog renews on a majority: held for 3 lease periods, each
     * renewal valid for the lease less the drift (600 - 8 ms), never more */
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
    int64_t t0 = th_now_ms(), most = 0;
    while (th_now_ms() - t0 < 2000) {
        ASSERT_LCODE(b, dlock_acquire(b, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
        for (int i = 0; i < 50; i++) {
            int64_t valid = dlock_lock_valid_ms(a);
            if (valid > most) most = valid;
            th_sleep_ms(2);
        }
    }
    th_log("watchdog on RedLock: most validity seen %lld ms (lease 600)", (long long)most);
    ASSERT_LE(most, 600 - (600 / 100 + 2));
    ASSERT_GT(most, 400);
    ASSERT_EQ(dlock_lock_is_lost(a), 0);
    ASSERT_LOK(a, dlock_release(a));

    /* a frozen master costs at most about the node timeout */
    kill(th_server_pid(srv[4]), SIGSTOP);
    t0 = th_now_ms();
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 5000, NULL));
    int64_t took = th_now_ms() - t0;
    th_log("acquire with one frozen master: %lld ms", (long long)took);
    ASSERT_LT(took, 8 * NODE_TIMEOUT);
    ASSERT_LOK(a, dlock_release(a));
    kill(th_server_pid(srv[4]), SIGCONT);

    /* two masters down: still acquires */
    th_server_halt(srv[3], SIGKILL);
    th_server_halt(srv[4], SIGKILL);
    ASSERT_LOK(a, dlock_acquire(a, 1000, 5000, NULL));
    /* three down: a check cannot tell (it says so), and nor can the next
     * acquire: a clean "no quorum", within the wait bound */
    th_server_halt(srv[2], SIGKILL);
    ASSERT_LCODE(a, dlock_lock_check(a, &held, &cnt), DLOCK_ENOQUORUM);
    /* the release cannot tell either: deleted where it could be, the
     * handle still holds (a retry once the nodes are back deletes the rest) */
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ENOQUORUM);
    ASSERT_EQ(dlock_lock_holding(a), 1);
    ASSERT_EQ(th_cmd_int(r0, "EXISTS rl:a") + th_cmd_int(r1, "EXISTS rl:a"), 0);
    t0 = th_now_ms();
    ASSERT_LCODE(b, dlock_acquire(b, 300, 5000, NULL), DLOCK_ENOQUORUM);
    took = th_now_ms() - t0;
    ASSERT_LT(took, 1500);
    ASSERT(strstr(dlock_lock_errmsg(b), "no quorum") != NULL);
    ASSERT(strstr(dlock_lock_errmsg(b), "2 of 5") != NULL);
    /* 3.3 s of failures: the down masters' reconnect backoff (50 ms doubling
     * to 2 s) reaches its cap, so that it still has more than a second to
     * run when they are back */
    t0 = th_now_ms();
    while (th_now_ms() - t0 < 3300) {
        ASSERT_LCODE(b, dlock_acquire(b, DLOCK_NOWAIT, 5000, NULL), DLOCK_ENOQUORUM);
        th_sleep_ms(50);
    }
    th_server_resume(srv[2]);
    th_server_resume(srv[3]);
    th_server_resume(srv[4]);
    /* the same client counts them again as soon as the quorum needs them (a
     * probe every 100 ms), not after its backoff: it used to fail here */
    t0 = th_now_ms();
    ASSERT_LOK(b, dlock_acquire(b, 1000, 5000, NULL));
    took = th_now_ms() - t0;
    th_log("acquire right after three masters came back: %lld ms", (long long)took);
    /* taken within its 1 s wait (the backoff outlasts it); bounded by that
     * wait and a round of node timeouts */
    ASSERT_LT(took, 1000 + 4 * NODE_TIMEOUT);
    ASSERT_LOK(b, dlock_release(b));
    /* a's release again: the masters came back empty, nothing of it is
     * left: the hold was lost */
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);
    ASSERT_EQ(dlock_lock_holding(a), 0);

    /* fencing tokens from one designated counter server: strictly increasing
     * across clients */
    dlock_client *f1 = rl_client(0, th_server_url(counter));
    dlock_client *f2 = rl_client(0, th_server_url(counter));
    dlock_lock *fa = th_lock(f1, "rl:fenced", DLOCK_KIND_PLAIN);
    dlock_lock *fb = th_lock(f2, "rl:fenced", DLOCK_KIND_REENTRANT);
    uint64_t last = 0;
    for (int i = 0; i < 10; i++) {
        dlock_lock *l = i % 2 ? fb : fa;
        uint64_t fence = 0;
        ASSERT_LOK(l, dlock_acquire(l, 2000, 5000, &fence));
        ASSERT_U64_GT(fence, last);
        last = fence;
        ASSERT_LOK(l, dlock_release(l));
    }
    char *fv = th_cmd_str(crc, "GET redisson_lock_token:{rl:fenced}");
    ASSERT_NOT_NULL(fv);
    ASSERT_EQ(atoll(fv), (long long)last);
    free(fv);

    /* token operations and force unlock reach every node */
    char token[DLOCK_TOKEN_LEN + 1];
    /* c saw three nodes down and reconnects to them only after its backoff
     * (at most 2 s): a fresh client sees all five at once */
    dlock_lock_free(a);
    dlock_lock_free(b);
    b = NULL;
    dlock_client_free(c);
    c = rl_client(600, NULL);
    a = th_lock(c, "rl:a", DLOCK_KIND_PLAIN);
    ASSERT_COK(c, dlock_acquire_token(c, "rl:t", DLOCK_CSTR, 0, 5000, token, NULL));
    ASSERT_EQ(on_every_node("rl:t"), NODES);
    ASSERT_CCODE(c, dlock_release_token(c, "rl:t", DLOCK_CSTR, "0123456789abcdef0123456789abcdef"),
                 DLOCK_ENOTOWNER);
    ASSERT_COK(c, dlock_extend_token(c, "rl:t", DLOCK_CSTR, token, 9000));
    ASSERT_COK(c, dlock_release_token(c, "rl:t", DLOCK_CSTR, token));
    ASSERT_EQ(on_every_node("rl:t"), 0);
    ASSERT_LOK(a, dlock_acquire(a, 0, 5000, NULL));
    int existed = 0;
    ASSERT_COK(c, dlock_force_unlock(c, "rl:a", DLOCK_CSTR, &existed));
    ASSERT_EQ(existed, 1);
    ASSERT_EQ(on_every_node("rl:a"), 0);
    ASSERT_LCODE(a, dlock_release(a), DLOCK_ELOST);

    /* kinds without a RedLock form say so */
    dlock_lock *fair = th_lock(c, "rl:fair", DLOCK_KIND_FAIR);
    ASSERT_LCODE(fair, dlock_acquire(fair, 0, 5000, NULL), DLOCK_ENOTSUP);
    /* a lease too short for the node timeout is refused */
    ASSERT_LCODE(a, dlock_acquire(a, 0, 200, NULL), DLOCK_EINVAL);

    dlock_lock_free(fair);
    dlock_lock_free(fa);
    dlock_lock_free(fb);
    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_client_free(f1);
    dlock_client_free(f2);
    dlock_client_free(c);
    redisFree(r0);
    redisFree(r1);
    redisFree(r2);
    redisFree(crc);
    for (int i = 0; i < NODES; i++) th_server_stop(srv[i]);
    th_server_stop(counter);
    th_log("ok");
    return 0;
}
