/* Redis Cluster with a replica per master (redis-cli --cluster create
 * --cluster-replicas 1) and wait_replicas: an acquire redirected to another
 * master (MOVED, after its slot moved there) returns OK only if that
 * master's replica has it. The script runs on the new master's connection;
 * WAIT must count that connection's write, not the old master's, where the
 * client wrote nothing and so every replica "has" it at once (before the
 * fix: DLOCK_OK with the new master's replica stopped). */
#include "harness.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NN 6 /* 3 masters, 3 replicas */

static pid_t pids[NN];
static int port[NN];
static char dir[128];

static void stop_all(void)
{
    for (int i = 0; i < NN; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGCONT);
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

static int answers(int p)
{
    struct timeval tv = {1, 0};
    redisContext *t = redisConnectWithTimeout("127.0.0.1", p, tv);
    int up = t && !t->err;
    if (t) redisFree(t);
    return up;
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

/* 1 when the node on port p is a master. */
static int is_master(int p)
{
    redisContext *rc = raw(p);
    redisReply *r = redisCommand(rc, "ROLE");
    int m = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
            !strcmp(r->element[0]->str, "master");
    freeReplyObject(r);
    redisFree(rc);
    return m;
}

/* The port of the replica of the master on port p (0: none yet). */
static int replica_of(int p)
{
    redisContext *rc = raw(p);
    redisReply *r = redisCommand(rc, "INFO replication");
    const char *s = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "slave0:") : NULL;
    const char *pp = s ? strstr(s, "port=") : NULL;
    int rp = pp ? atoi(pp + 5) : 0;
    if (s && !strstr(s, "state=online")) rp = 0;
    freeReplyObject(r);
    redisFree(rc);
    return rp;
}

static int pid_of_port(int p)
{
    for (int i = 0; i < NN; i++)
        if (port[i] == p) return pids[i];
    return 0;
}

/* Moves slot from master src to dst (no key in it), told to every master. */
static void move_slot(long long slot, int src, int dst, const int *masters)
{
    redisContext *rs = raw(src), *rd = raw(dst);
    redisReply *sid = redisCommand(rs, "CLUSTER MYID"), *did = redisCommand(rd, "CLUSTER MYID");
    freeReplyObject(redisCommand(rd, "CLUSTER SETSLOT %lld IMPORTING %s", slot, sid->str));
    freeReplyObject(redisCommand(rs, "CLUSTER SETSLOT %lld MIGRATING %s", slot, did->str));
    for (int i = 0; i < 3; i++) {
        redisContext *x = raw(masters[i]);
        freeReplyObject(redisCommand(x, "CLUSTER SETSLOT %lld NODE %s", slot, did->str));
        redisFree(x);
    }
    freeReplyObject(sid);
    freeReplyObject(did);
    redisFree(rs);
    redisFree(rd);
}

/* The port of the master owning the slot of key, asked of node p. */
static int owner_port(int p, const char *key)
{
    redisContext *rc = raw(p);
    redisReply *r = redisCommand(rc, "GET %s", key);
    int owner = p;
    if (r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "MOVED", 5)) {
        const char *colon = strrchr(r->str, ':');
        owner = colon ? atoi(colon + 1) : 0;
    }
    freeReplyObject(r);
    redisFree(rc);
    return owner;
}

int main(void)
{
    th_init("cluster_replicas");
    snprintf(dir, sizeof dir, "/tmp/dlock-clrep-XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(dir));
    atexit(stop_all);
    char cmd[1024];
    size_t off = (size_t)snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
    for (int i = 0; i < NN; i++) {
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
                   "--cluster-node-timeout", "60000", "--logfile", lg, (char *)NULL);
            _exit(127);
        }
        pids[i] = p;
        off += (size_t)snprintf(cmd + off, sizeof cmd - off, " 127.0.0.1:%d", port[i]);
    }
    for (int i = 0; i < NN; i++) ASSERT_EVENTUALLY(answers(port[i]), 10000);
    snprintf(cmd + off, sizeof cmd - off,
             " --cluster-replicas 1 --cluster-yes >%s/create.log 2>&1", dir);
    int created = system(cmd);
    if (created != 0) { /* why, before the directory goes */
        char show[300];
        snprintf(show, sizeof show, "cat %s/create.log %s/*.log >&2", dir, dir);
        if (system(show) != 0) th_log("no cluster logs to show");
    }
    ASSERT_EQ(created, 0);
    for (int i = 0; i < NN; i++) ASSERT_EVENTUALLY(cluster_ok(port[i]), 20000);
    int masters[3], nm = 0;
    for (int i = 0; i < NN; i++)
        if (is_master(port[i])) {
            ASSERT_LT(nm, 3);
            masters[nm++] = port[i];
        }
    ASSERT_EQ(nm, 3);
    for (int i = 0; i < 3; i++) ASSERT_EVENTUALLY(replica_of(masters[i]) != 0, 20000);
    th_log("cluster of 3 masters with a replica each up");
    /* every replica acknowledges a write (the first after the cluster
     * formed can take longer than the test's WAIT timeout) */
    for (int i = 0; i < 3; i++) {
        redisContext *d = raw(masters[i]);
        long long acks = 0;
        char warm[32];
        int n = 0;
        do snprintf(warm, sizeof warm, "clrep:warm:%d", n++);
        while (owner_port(masters[i], warm) != masters[i]);
        for (int k = 0; k < 20 && acks < 1; k++) {
            redisReply *st = redisCommand(d, "SET %s 1", warm);
            ASSERT(st && st->type == REDIS_REPLY_STATUS);
            freeReplyObject(st);
            redisReply *w = redisCommand(d, "WAIT 1 1000");
            acks = w->integer;
            freeReplyObject(w);
        }
        ASSERT_EQ(acks, 1);
        redisFree(d);
    }

    char url[256];
    snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d", masters[0]);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.wait_replicas = 1;
    o.wait_replicas_timeout_ms = 500;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    const char *name = "clrep:lock";
    int src = owner_port(masters[0], name);
    int dst = src == masters[0] ? masters[1] : masters[0];
    dlock_lock *l = th_lock(c, name, DLOCK_KIND_PLAIN);
    /* the client learns the slot's owner (src) */
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(l, dlock_release(l));
    redisContext *rk = raw(src);
    redisReply *kr = redisCommand(rk, "CLUSTER KEYSLOT %s", name);
    long long slot = kr->integer;
    freeReplyObject(kr);
    redisFree(rk);
    move_slot(slot, src, dst, masters);
    ASSERT_EQ(owner_port(src, name), dst);
    /* the new owner's replica stopped: nothing written there is acknowledged */
    int rep = replica_of(dst);
    ASSERT_NE(rep, 0);
    pid_t rpid = pid_of_port(rep);
    ASSERT_NE(rpid, 0);
    kill(rpid, SIGSTOP);
    int rc = dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL);
    th_log("acquire redirected to a master whose replica is stopped: %s (%s)",
           dlock_strerror(rc), dlock_lock_errmsg(l));
    kill(rpid, SIGCONT);
    ASSERT_EQ(rc, DLOCK_EREPLICAS);
    ASSERT_EQ(dlock_lock_holding(l), 0);
    /* with the replica back, the same acquire goes through */
    ASSERT_EVENTUALLY(replica_of(dst) != 0, 20000);
    ASSERT_LOK(l, dlock_acquire(l, 5000, 5000, NULL));
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_client_free(c);
    th_log("ok");
    return 0;
}
