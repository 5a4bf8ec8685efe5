/* Redis Cluster with 3 masters (redis-cli --cluster create): lock names spread
 * over every slot owner, watchdog renewal per slot, waiters woken through
 * sharded pub/sub, a multi-lock across slots, and a slot migrated (ASK, then
 * MOVED) while processes contend for a lock in it: the counter stays exact. */
#include "harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NM 3
static pid_t pids[8];
static int npids;
static char dir[128];
static int port[NM];
static char url[256];

static void stop_all(void)
{
    for (int i = 0; i < npids; i++)
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

static redisContext *raw(int p)
{
    struct timeval tv = {2, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", p, tv);
    ASSERT(rc && !rc->err);
    return rc;
}

static int cluster_ok(int p)
{
    redisContext *rc = raw(p);
    redisReply *r = redisCommand(rc, "CLUSTER INFO");
    int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
    if (r) freeReplyObject(r);
    redisFree(rc);
    return ok;
}

static long long slot_of(const char *key)
{
    redisContext *rc = raw(port[0]);
    redisReply *r = redisCommand(rc, "CLUSTER KEYSLOT %s", key);
    long long s = r->integer;
    freeReplyObject(r);
    redisFree(rc);
    return s;
}

/* The port of the master owning slot. */
/* MOVED answers given so far by the master on port p (INFO errorstats). */
static long long moved_errors(int p)
{
    redisContext *rc = raw(p);
    redisReply *r = redisCommand(rc, "INFO errorstats");
    ASSERT(r && r->type == REDIS_REPLY_STRING);
    const char *m = strstr(r->str, "errorstat_MOVED:count=");
    long long n = m ? atoll(m + strlen("errorstat_MOVED:count=")) : 0;
    freeReplyObject(r);
    redisFree(rc);
    return n;
}

static int owner_of(long long slot)
{
    for (int i = 0; i < NM; i++) {
        redisContext *rc = raw(port[i]);
        redisReply *r = redisCommand(rc, "CLUSTER COUNTKEYSINSLOT %lld", slot);
        redisReply *m = redisCommand(rc, "CLUSTER MYID");
        redisReply *n = redisCommand(rc, "CLUSTER NODES");
        int mine = 0;
        /* a line "<myid> ... master ... <ranges>" lists the slot ranges */
        for (char *line = n->str; line && *line;) {
            char *end = strchr(line, '\n');
            if (!strncmp(line, m->str, m->len)) {
                char *p = line;
                for (int f = 0; f < 8 && p; f++) p = strchr(p + 1, ' ');
                while (p && *p == ' ') {
                    long lo, hi;
                    p++;
                    if (sscanf(p, "%ld-%ld", &lo, &hi) == 2) {
                        if (slot >= lo && slot <= hi) mine = 1;
                    } else if (sscanf(p, "%ld", &lo) == 1 && lo == slot) {
                        mine = 1;
                    }
                    p = strchr(p, ' ');
                    if (end && p > end) break;
                }
            }
            line = end ? end + 1 : NULL;
        }
        freeReplyObject(r);
        freeReplyObject(m);
        freeReplyObject(n);
        redisFree(rc);
        if (mine) return port[i];
    }
    return 0;
}

static int answers(int p)
{
    struct timeval tv = {1, 0};
    redisContext *t = redisConnectWithTimeout("127.0.0.1", p, tv);
    int up = t && !t->err;
    if (t) redisFree(t);
    return up;
}

static int count_cb(const char *name, size_t len, const dlock_info *info, void *ud)
{
    (void)name, (void)len, (void)info;
    ++*(int *)ud;
    return 0;
}

static dlock_client *cl_client(int64_t wd)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.watchdog_lease_ms = wd;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    return c;
}

/* A contender: acquire / non-atomic increment on a plain server / release
 * until stop_ms; exits with the number of rounds done (<= 250). */
static int contender(const th_server *counter, int64_t stop_ms)
{
    dlock_client *c = cl_client(2000);
    dlock_lock *l = th_lock(c, "cl:mig", DLOCK_KIND_PLAIN);
    redisContext *rc = th_redis(counter);
    int rounds = 0;
    while (th_now_ms() < stop_ms && rounds < 250) {
        int r = dlock_acquire(l, 10000, 5000, NULL);
        if (r != DLOCK_OK) {
            /* a failure is allowed (reported, nothing held); an overlap is not */
            th_sleep_ms(5);
            continue;
        }
        ASSERT_EQ(th_cmd_int(rc, "INCR cl:inside"), 1);
        char *v = th_cmd_str(rc, "GET cl:counter");
        long long n = v ? atoll(v) : 0;
        free(v);
        usleep(200);
        th_cmd_ok(rc, "SET cl:counter %lld", n + 1);
        ASSERT_EQ(th_cmd_int(rc, "DECR cl:inside"), 0);
        int rr = dlock_release(l);
        ASSERT_MSG(rr == DLOCK_OK, "release: %s", dlock_lock_errmsg(l));
        rounds++;
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return rounds;
}

/* Moves slot from master src to dst: IMPORTING / MIGRATING, every key, then
 * the new owner told to every master. during_ms: a pause while the slot is
 * half-moved (clients meet ASK and TRYAGAIN). */
static void move_slot(long long slot, int src, int dst, int during_ms)
{
    redisContext *rs = raw(src), *rd = raw(dst);
    redisReply *sid = redisCommand(rs, "CLUSTER MYID"), *did = redisCommand(rd, "CLUSTER MYID");
    freeReplyObject(redisCommand(rd, "CLUSTER SETSLOT %lld IMPORTING %s", slot, sid->str));
    freeReplyObject(redisCommand(rs, "CLUSTER SETSLOT %lld MIGRATING %s", slot, did->str));
    if (during_ms) th_sleep_ms(during_ms);
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

/* Subscribers of the shard channel ch on the master rc talks to. */
static long long shard_subscribers(redisContext *rc, const char *ch)
{
    redisReply *r = redisCommand(rc, "PUBSUB SHARDNUMSUB %s", ch);
    long long n = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
        n = r->element[1]->integer;
    if (r) freeReplyObject(r);
    return n;
}

/* Moves slot from src to dst while a waiter child (it writes th_now_ms()
 * at the end of its wait to rfd) waits, then calls release(arg); returns
 * how long after the release the child stopped waiting. */
static int64_t moved_then_released(long long slot, int src, int dst, pid_t child, int rfd,
                                   int (*release)(void *), void *arg, int64_t *t_rel_out)
{
    move_slot(slot, src, dst, 0);
    th_sleep_ms(300); /* the waiter has followed the slot, or not */
    int64_t t_rel = th_now_ms(), t_end = 0;
    if (t_rel_out) *t_rel_out = t_rel;
    ASSERT_EQ(release(arg), DLOCK_OK);
    ASSERT_EQ(read(rfd, &t_end, sizeof t_end), (ssize_t)sizeof t_end);
    close(rfd);
    ASSERT_EQ(th_wait_child(child, 20000), 0);
    th_log("slot %lld moved from %d to %d; the waiter was done %lld ms after the release", slot,
           src, dst, (long long)(t_end - t_rel));
    return t_end - t_rel;
}

/* A child that waits (15 s at most) for one permit of the semaphore `name`
 * (sem) or for the plain lock `name`, writes th_now_ms() at the end of its
 * wait to *rfd's pipe, gives back what it got and exits 0 if it got it. */
static pid_t spawn_waiter(int sem, const char *name, int *rfd)
{
    int tp[2];
    ASSERT_EQ(pipe(tp), 0);
    pid_t pid = th_fork();
    if (pid) {
        close(tp[1]);
        *rfd = tp[0];
        return pid;
    }
    close(tp[0]);
    dlock_client *c = cl_client(0);
    dlock_lock *l = sem ? NULL : th_lock(c, name, DLOCK_KIND_PLAIN);
    dlock_semaphore *s = NULL;
    if (sem && dlock_semaphore_new(c, name, DLOCK_CSTR, &s) != DLOCK_OK) _exit(3);
    int rc = sem ? dlock_semaphore_acquire(s, 1, 15000) : dlock_acquire(l, 15000, 5000, NULL);
    int64_t t = th_now_ms();
    if (write(tp[1], &t, sizeof t) != (ssize_t)sizeof t) _exit(2);
    if (rc == DLOCK_OK) rc = sem ? dlock_semaphore_release(s, 1) : dlock_release(l);
    if (rc != DLOCK_OK)
        th_log("waiter on %s: %s: %s", name, dlock_strerror(rc),
               sem ? dlock_semaphore_errmsg(s) : dlock_lock_errmsg(l));
    dlock_lock_free(l);
    dlock_semaphore_free(s);
    dlock_client_free(c);
    _exit(rc == DLOCK_OK ? 0 : 1);
}

static int release_lock(void *l) { return dlock_release(l); }
static int release_permit(void *s) { return dlock_semaphore_release(s, 1); }

/* Another master than p. */
static int other_master(int p)
{
    for (int i = 0; i < NM; i++)
        if (port[i] != p) return port[i];
    return 0;
}

int main(void)
{
    th_init("cluster");
    snprintf(dir, sizeof dir, "/tmp/dlock-cluster-XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(dir));
    atexit(stop_all);
    th_server *counter = th_server_start(NULL);

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
        pids[npids++] = p;
        off += (size_t)snprintf(cmd + off, sizeof cmd - off, " 127.0.0.1:%d", port[i]);
        uo += (size_t)snprintf(url + uo, sizeof url - uo, "%s127.0.0.1:%d", i ? "," : "", port[i]);
    }
    for (int i = 0; i < NM; i++) ASSERT_EVENTUALLY(answers(port[i]), 10000);
    snprintf(cmd + off, sizeof cmd - off, " --cluster-yes >%s/create.log 2>&1", dir);
    ASSERT_EQ(system(cmd), 0);
    for (int i = 0; i < NM; i++) ASSERT_EVENTUALLY(cluster_ok(port[i]), 15000);
    th_log("cluster of %d masters up", NM);

    /* 1. many names over all masters, held by the watchdog for 3 leases */
    dlock_client *c = cl_client(600);
    /* with holder identity records: written with the acquire and renewed by
     * the watchdog's batches slot by slot, beside each lock */
    ASSERT_COK(c, dlock_client_set_identity(c, "cluster test", "cl"));
    dlock_client *other = cl_client(0);
    enum { NLOCKS = 120 };
    dlock_lock *locks[NLOCKS];
    int per_owner[NM] = {0};
    for (int i = 0; i < NLOCKS; i++) {
        char name[32];
        snprintf(name, sizeof name, "cl:lock:%d", i);
        locks[i] = th_lock(c, name, i % 2 ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN);
        ASSERT_LOK(locks[i], dlock_acquire(locks[i], DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL));
        int o = owner_of(slot_of(name));
        for (int k = 0; k < NM; k++) per_owner[k] += port[k] == o;
    }
    for (int k = 0; k < NM; k++) ASSERT_GT(per_owner[k], 10);
    th_sleep_ms(2000);
    for (int i = 0; i < NLOCKS; i++) {
        char name[32];
        snprintf(name, sizeof name, "cl:lock:%d", i);
        dlock_lock *x = th_lock(other, name, i % 2 ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN);
        ASSERT_LCODE(x, dlock_acquire(x, DLOCK_NOWAIT, 1000, NULL), DLOCK_EBUSY);
        dlock_lock_free(x);
        ASSERT_EQ(dlock_lock_is_lost(locks[i]), 0);
    }
    int listed = 0;
    ASSERT_COK(other, dlock_list(other, "cl:lock:*", count_cb, &listed));
    ASSERT_EQ(listed, NLOCKS);
    for (int i = 0; i < NLOCKS; i++) {
        char name[32], rec[512];
        snprintf(name, sizeof name, "cl:lock:%d", i);
        dlock_info info;
        ASSERT_COK(other, dlock_inspect(other, name, DLOCK_CSTR, &info));
        ASSERT_COK(other, dlock_inspect_holder(other, name, DLOCK_CSTR, info.holder, rec, sizeof rec));
        ASSERT_MSG(strstr(rec, "\tcl\tcluster test") != NULL, "%s: record '%s'", name, rec);
        ASSERT_LOK(locks[i], dlock_release(locks[i]));
        dlock_lock_free(locks[i]);
        ASSERT_COK(other, dlock_inspect_holder(other, name, DLOCK_CSTR, info.holder, rec, sizeof rec));
        ASSERT_STR_EQ(rec, "");
    }
    th_log("%d locks over %d/%d/%d slots owners kept and released", NLOCKS, per_owner[0],
           per_owner[1], per_owner[2]);
    /* children are forked below: a process must not fork while a watchdog
     * thread runs (it may hold a lock, the allocator's included); a fresh
     * client has none until a watchdog lock is taken */
    dlock_client_free(c);
    c = cl_client(600);

    /* 2. a waiter is woken by the release through sharded pub/sub */
    dlock_lock *h = th_lock(c, "cl:wake", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 20000, NULL));
    pid_t w = th_fork();
    if (w == 0) {
        dlock_client *wc = cl_client(0);
        dlock_lock *wl = th_lock(wc, "cl:wake", DLOCK_KIND_REENTRANT);
        int64_t t0 = th_now_ms();
        ASSERT_LOK(wl, dlock_acquire(wl, 15000, 5000, NULL));
        int64_t took = th_now_ms() - t0;
        ASSERT_LOK(wl, dlock_release(wl));
        dlock_lock_free(wl);
        dlock_client_free(wc);
        _exit(took < 5000 ? 0 : 3);
    }
    th_sleep_ms(400);
    ASSERT_LOK(h, dlock_release(h));
    ASSERT_EQ(th_wait_child(w, 20000), 0);

    /* 3. a multi-lock across slots */
    dlock_lock *ma = th_lock(c, "cl:multi:a", DLOCK_KIND_PLAIN);
    dlock_lock *mb = th_lock(c, "cl:multi:b", DLOCK_KIND_PLAIN);
    ASSERT_NE(slot_of("cl:multi:a"), slot_of("cl:multi:b"));
    dlock_lock *set[2] = {ma, mb};
    dlock_lock *ob = th_lock(other, "cl:multi:b", DLOCK_KIND_PLAIN);
    ASSERT_LOK(ob, dlock_acquire(ob, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_CODE(dlock_multi_acquire(set, 2, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_EQ(dlock_lock_holding(ma), 0);
    ASSERT_LOK(ob, dlock_release(ob));
    ASSERT_OK(dlock_multi_acquire(set, 2, 1000, 5000, NULL));
    ASSERT_OK(dlock_multi_release(set, 2));

    /* 4. a slot migrated while 4 processes contend for a lock in it */
    long long slot = slot_of("cl:mig");
    int src = owner_of(slot), dst = other_master(src);
    int64_t stop = th_now_ms() + 3500;
    pid_t kids[4];
    for (int i = 0; i < 4; i++) {
        kids[i] = th_fork();
        if (kids[i] == 0) _exit(contender(counter, stop));
    }
    th_sleep_ms(600);
    move_slot(slot, src, dst, 300); /* contenders meet ASK and TRYAGAIN meanwhile */
    th_log("slot %lld moved from %d to %d under load", slot, src, dst);
    int total = 0;
    for (int i = 0; i < 4; i++) {
        int st = th_wait_child(kids[i], 60000);
        ASSERT_LT(st, 251);
        total += st;
    }
    redisContext *crc = th_redis(counter);
    char *v = th_cmd_str(crc, "GET cl:counter");
    ASSERT_NOT_NULL(v);
    ASSERT_EQ(atoll(v), total);
    ASSERT_GT(total, 20);
    free(v);
    ASSERT_EQ(owner_of(slot), dst);
    th_log("%d rounds across the migration, counter exact", total);

    /* 5. a waiter follows its lock's slot to the new master: the release
     * there (its shard's SPUBLISH) wakes it at once. It used to stay
     * subscribed on the old master and hear nothing until its re-check (up
     * to 2 s later). */
    long long fslot = slot_of("cl:follow");
    int fsrc = owner_of(fslot), fdst = other_master(fsrc);
    dlock_lock *fh = th_lock(other, "cl:follow", DLOCK_KIND_PLAIN);
    ASSERT_LOK(fh, dlock_acquire(fh, DLOCK_NOWAIT, 30000, NULL));
    int rfd = -1;
    int64_t t_spawn = th_now_ms();
    pid_t fw = spawn_waiter(0, "cl:follow", &rfd);
    redisContext *fs = raw(fsrc);
    ASSERT_EVENTUALLY(th_cmd_int(fs, "ZCARD dlock_waiters:{cl:follow}") == 1, 5000);
    redisFree(fs);
    /* its first re-check comes DL_PLAIN_RECHECK_MS (2 s) after its latest
     * attempt at the soonest: done before then, the release woke it (told
     * when the move left time for it: a loaded machine can stretch it) */
    int64_t t_rel = 0;
    int64_t after = moved_then_released(fslot, fsrc, fdst, fw, rfd, release_lock, fh, &t_rel);
    if (t_rel + 500 < t_spawn + 2000) ASSERT_LT(t_rel + after, t_spawn + 2000);
    else th_log("the move took too long to tell a wake from a re-check");
    dlock_lock_free(fh);

    /* 6. the same for a semaphore waiter, which has no re-check at all: left
     * on the old master it slept until its deadline */
    long long sslot = slot_of("cl:sem");
    int ssrc = owner_of(sslot), sdst = other_master(ssrc);
    dlock_semaphore *ss = NULL;
    ASSERT_COK(other, dlock_semaphore_new(other, "cl:sem", DLOCK_CSTR, &ss));
    int was_set = 0;
    ASSERT_OK(dlock_semaphore_try_set(ss, 0, &was_set));
    ASSERT_EQ(was_set, 1);
    pid_t sw = spawn_waiter(1, "cl:sem", &rfd);
    redisContext *ssr = raw(ssrc);
    ASSERT_EVENTUALLY(shard_subscribers(ssr, "redisson_sc:{cl:sem}") == 1, 5000);
    redisFree(ssr);
    /* woken, not at its 15 s deadline */
    ASSERT_LT(moved_then_released(sslot, ssrc, sdst, sw, rfd, release_permit, ss, NULL),
              5000);
    dlock_semaphore_free(ss);

    /* 7. names with a hash tag of their own (only the first '{' counts):
     * the client computes the server's slot, so no command meets MOVED;
     * names whose keys would not share a slot are refused up front (they
     * met CROSSSLOT from the server: "x{}y" hashes whole, its fence key
     * "redisson_lock_token:x{}y" too, prefix included) */
    static const char *const tagged[] = {"{user:42}:order", "order:{user:42}", "a{b}c{d}",
                                         "}{tag}",         "{{tag}}",        "{t}"};
    static const char *const split[] = {"x{}y", "{}{z}", "open{only", "a}b", "{}"};
    for (size_t i = 0; i < sizeof split / sizeof split[0]; i++) {
        dlock_lock *sl = NULL;
        ASSERT_CCODE(c, dlock_lock_new(c, split[i], DLOCK_CSTR, DLOCK_KIND_PLAIN, &sl),
                     DLOCK_EINVAL);
        ASSERT(strstr(dlock_errmsg(c), "hash tag") != NULL);
        dlock_semaphore *ssm = NULL;
        ASSERT_CCODE(c, dlock_semaphore_new(c, split[i], DLOCK_CSTR, &ssm), DLOCK_EINVAL);
        ASSERT_CCODE(c, dlock_force_unlock(c, split[i], DLOCK_CSTR, NULL), DLOCK_EINVAL);
    }
    th_log("names whose keys would split over slots refused: %s", dlock_errmsg(c));
    const size_t ntagged = sizeof tagged / sizeof tagged[0];
    long long moved0 = 0;
    for (int i = 0; i < NM; i++) moved0 += moved_errors(port[i]);
    for (size_t i = 0; i < ntagged; i++) {
        dlock_lock *tl = th_lock(c, tagged[i], DLOCK_KIND_REENTRANT);
        ASSERT_LOK(tl, dlock_acquire(tl, DLOCK_NOWAIT, 5000, NULL));
        /* the lock's hash is on the master that owns the name's slot */
        redisContext *orc = raw(owner_of(slot_of(tagged[i])));
        ASSERT_EQ(th_cmd_int(orc, "EXISTS %s", tagged[i]), 1);
        redisFree(orc);
        ASSERT_LOK(tl, dlock_release(tl));
        dlock_lock_free(tl);
    }
    /* the synchronizers on those names: the semaphores' keys and channels
     * keep the name's tag; the latch's channel is
     * "redisson_countdownlatch__channel__{" name "}" for every name (as
     * Redisson's), which splits a tagged name from its channel: refused */
    int latch_refused = 0;
    for (size_t i = 0; i < ntagged; i++) {
        dlock_semaphore *ts = NULL;
        ASSERT_COK(c, dlock_semaphore_new(c, tagged[i], DLOCK_CSTR, &ts));
        int was = 0;
        ASSERT_OK(dlock_semaphore_try_set(ts, 1, &was));
        ASSERT_OK(dlock_semaphore_acquire(ts, 1, DLOCK_NOWAIT));
        ASSERT_OK(dlock_semaphore_release(ts, 1));
        dlock_semaphore_free(ts);
        dlock_permits *tp = NULL;
        ASSERT_COK(c, dlock_permits_new(c, tagged[i], DLOCK_CSTR, &tp));
        ASSERT_OK(dlock_permits_try_set(tp, 1, &was));
        char pid[DLOCK_PERMIT_ID_LEN + 1];
        ASSERT_OK(dlock_permits_acquire(tp, DLOCK_NOWAIT, 5000, pid));
        ASSERT_OK(dlock_permits_release(tp, pid));
        dlock_permits_free(tp);
        redisContext *orc = raw(owner_of(slot_of(tagged[i])));
        ASSERT_EQ(th_cmd_int(orc, "DEL %s", tagged[i]), 1); /* the count was on the owner */
        redisFree(orc);
        char chan[128];
        snprintf(chan, sizeof chan, "redisson_countdownlatch__channel__{%s}", tagged[i]);
        dlock_latch *tla = NULL;
        int lrc = dlock_latch_new(c, tagged[i], DLOCK_CSTR, &tla);
        if (slot_of(chan) != slot_of(tagged[i])) {
            ASSERT_CODE(lrc, DLOCK_EINVAL);
            ASSERT(strstr(dlock_errmsg(c), "latch name") != NULL);
            ASSERT(strstr(dlock_errmsg(c), "slot") != NULL);
            latch_refused++;
        } else {
            ASSERT_CODE(lrc, DLOCK_OK);
            dlock_latch_free(tla);
        }
    }
    th_log("%d of %zu tagged latch names refused: %s", latch_refused, ntagged, dlock_errmsg(c));
    ASSERT_GE(latch_refused, (int)ntagged - 1);
    dlock_latch *pla = NULL; /* without braces: key and channel share the slot */
    ASSERT_COK(c, dlock_latch_new(c, "cl:latch", DLOCK_CSTR, &pla));
    ASSERT_OK(dlock_latch_set(pla, 1));
    ASSERT_OK(dlock_latch_count_down(pla, 1));
    ASSERT_OK(dlock_latch_await(pla, DLOCK_NOWAIT));
    dlock_latch_free(pla);
    long long moved1 = 0;
    for (int i = 0; i < NM; i++) moved1 += moved_errors(port[i]);
    th_log("%zu hash-tagged names taken and released on their slot owners, MOVED answers: %lld",
           ntagged, moved1 - moved0);
    ASSERT_EQ(moved1 - moved0, 0);

    redisFree(crc);
    dlock_lock_free(h);
    dlock_lock_free(ma);
    dlock_lock_free(mb);
    dlock_lock_free(ob);
    dlock_client_free(c);
    dlock_client_free(other);
    th_server_stop(counter);
    th_log("ok");
    return 0;
}
