/* Redis Sentinel: 1 master + 1 replica + 3 sentinels. The client finds the
 * master through the sentinels; with wait_replicas a lock acquired before
 * SENTINEL FAILOVER is still held on the new master, the client follows the
 * failover, and a replica that does not acknowledge makes the acquire fail
 * (and release). */
#include "harness.h"

#include <pthread.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define NSENT 3
static pid_t pids[16];
static int npids;
static char dir[128];

static void stop_all(void)
{
    for (int i = 0; i < npids; i++) {
        if (pids[i] <= 0) continue;
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

static pid_t spawn(char *const argv[])
{
    pid_t p = th_fork();
    if (p == 0) {
        execvp(argv[0], argv);
        _exit(127);
    }
    pids[npids++] = p;
    return p;
}

static redisContext *raw(int port)
{
    struct timeval tv = {1, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", port, tv);
    ASSERT(rc && !rc->err);
    return rc;
}

static int reply_has(int port, const char *cmd, const char *needle)
{
    struct timeval tv = {1, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!rc || rc->err) {
        if (rc) redisFree(rc);
        return 0;
    }
    redisReply *r = redisCommand(rc, cmd);
    int found = 0;
    if (r && r->type == REDIS_REPLY_STRING) found = strstr(r->str, needle) != NULL;
    if (r && r->type == REDIS_REPLY_ARRAY)
        for (size_t i = 0; i < r->elements; i++)
            if (r->element[i]->type == REDIS_REPLY_STRING && strstr(r->element[i]->str, needle))
                found = 1;
    if (r) freeReplyObject(r);
    redisFree(rc);
    return found;
}

/* An acquire that stays in flight on a paused master (another test step
 * fails over meanwhile); its outcome does not matter. */
static void *in_flight(void *arg)
{
    dlock_lock *l = th_lock(arg, "sl:t1", DLOCK_KIND_PLAIN);
    if (dlock_acquire(l, DLOCK_NOWAIT, 30000, NULL) == DLOCK_OK) dlock_release(l);
    dlock_lock_free(l);
    return NULL;
}

int main(void)
{
    th_init("sentinel");
    if (system("command -v redis-sentinel >/dev/null 2>&1") != 0)
        th_skip("redis-sentinel is not installed");
    snprintf(dir, sizeof dir, "/tmp/dlock-sentinel-XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(dir));
    atexit(stop_all);

    int pm = th_free_port(), pr = th_free_port();
    char spm[16], spr[16], logm[200], logr[200];
    snprintf(spm, sizeof spm, "%d", pm);
    snprintf(spr, sizeof spr, "%d", pr);
    snprintf(logm, sizeof logm, "%s/m.log", dir);
    snprintf(logr, sizeof logr, "%s/r.log", dir);
    char *m_argv[] = {"redis-server", "--port", spm, "--bind", "127.0.0.1", "--dir", dir,
                      "--dbfilename", "m.rdb", "--save", "", "--repl-diskless-sync-delay", "0",
                      "--logfile", logm, NULL};
    pid_t master_pid = spawn(m_argv);
    char *r_argv[] = {"redis-server", "--port", spr, "--bind", "127.0.0.1", "--dir", dir,
                      "--dbfilename", "r.rdb", "--save", "", "--repl-diskless-sync-delay", "0",
                      "--logfile", logr, "--replicaof", "127.0.0.1", spm, NULL};
    pid_t replica_pid = spawn(r_argv);
    ASSERT_EVENTUALLY(reply_has(pr, "INFO replication", "master_link_status:up"), 15000);

    int sp[NSENT];
    char url[512];
    size_t off = (size_t)snprintf(url, sizeof url, "redis-sentinel://");
    for (int i = 0; i < NSENT; i++) {
        sp[i] = th_free_port();
        char conf[200];
        snprintf(conf, sizeof conf, "%s/s%d.conf", dir, i);
        FILE *f = fopen(conf, "w");
        ASSERT_NOT_NULL(f);
        fprintf(f,
                "port %d\nbind 127.0.0.1\ndir %s\nlogfile %s/s%d.log\n"
                "sentinel monitor mymaster 127.0.0.1 %d 2\n"
                "sentinel down-after-milliseconds mymaster 1000\n"
                "sentinel failover-timeout mymaster 3000\n",
                sp[i], dir, dir, i, pm);
        fclose(f);
        char *s_argv[] = {"redis-sentinel", conf, NULL};
        spawn(s_argv);
        off += (size_t)snprintf(url + off, sizeof url - off, "%s127.0.0.1:%d", i ? "," : "", sp[i]);
    }
    snprintf(url + off, sizeof url - off, "/mymaster");
    for (int i = 0; i < NSENT; i++) ASSERT_EVENTUALLY(th_sentinel_ready(sp[i], NSENT), 20000);
    th_log("master %d, replica %d, sentinels up", pm, pr);

    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.wait_replicas = 1;
    o.wait_replicas_timeout_ms = 500;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    dlock_options o2 = o;
    o2.wait_replicas = 0;
    dlock_client *other = NULL;
    ASSERT_CCODE(other, dlock_client_new(&o2, &other), DLOCK_OK);

    /* a replica that does not acknowledge: the acquire fails and is undone */
    dlock_lock *l = th_lock(c, "sl:lock", DLOCK_KIND_PLAIN);
    kill(replica_pid, SIGSTOP);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 30000, NULL), DLOCK_EREPLICAS);
    ASSERT(strstr(dlock_lock_errmsg(l), "0 of 1 replicas") != NULL);
    redisContext *rm = raw(pm);
    redisReply *r = redisCommand(rm, "EXISTS sl:lock");
    ASSERT_EQ(r->integer, 0);
    freeReplyObject(r);
    kill(replica_pid, SIGCONT);

    /* acquired and acknowledged; then the master fails over */
    uint64_t fence = 0;
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 60000, &fence));
    redisContext *rs = raw(sp[0]);
    r = redisCommand(rs, "SENTINEL FAILOVER mymaster");
    ASSERT(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    for (int i = 0; i < NSENT; i++) ASSERT_EVENTUALLY(th_sentinel_master_port(sp[i]) == pr, 20000);
    th_log("failed over to %d", pr);

    /* the lock is on the new master, and both clients follow it there */
    redisContext *rr = raw(pr);
    r = redisCommand(rr, "GET sl:lock");
    ASSERT(r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, dlock_lock_token(l)));
    freeReplyObject(r);
    dlock_lock *l2 = th_lock(other, "sl:lock", DLOCK_KIND_PLAIN);
    int held = 0;
    int64_t cnt = 0;
    /* a call may fail while the old master still answers as master; the
     * client asks the sentinels again and lands on the new one */
    ASSERT_EVENTUALLY(dlock_lock_check(l, &held, &cnt) == DLOCK_OK && held == 1 &&
                          dlock_acquire(l2, DLOCK_NOWAIT, 5000, NULL) == DLOCK_EBUSY,
                      15000);
    ASSERT_LOK(l, dlock_release(l));
    r = redisCommand(rr, "EXISTS sl:lock");
    ASSERT_EQ(r->integer, 0);
    freeReplyObject(r);
    ASSERT_LOK(l2, dlock_acquire(l2, DLOCK_NOWAIT, 5000, &fence));
    ASSERT_LOK(l2, dlock_release(l2));

    /* A command in flight on the old master when the client follows a
     * failover: its connection must not go back to the pool, or later
     * acquires run on the old master (writable for a while after a forced
     * failover) while other clients use the new one (before the fix: two
     * clients held sl:y). */
    {
        dlock_lock *w = th_lock(other, "sl:warm", DLOCK_KIND_PLAIN);
        ASSERT_LOK(w, dlock_acquire(w, DLOCK_NOWAIT, 1000, NULL));
        ASSERT_LOK(w, dlock_release(w));
        r = redisCommand(rr, "CLIENT PAUSE 3500 WRITE"); /* pr is the master now */
        freeReplyObject(r);
        th_sleep_ms(200);
        pthread_t th;
        ASSERT_EQ(pthread_create(&th, NULL, in_flight, other), 0);
        th_sleep_ms(200);
        r = redisCommand(rs, "SENTINEL FAILOVER mymaster");
        ASSERT(r && r->type == REDIS_REPLY_STATUS);
        freeReplyObject(r);
        for (int i = 0; i < NSENT; i++) ASSERT_EVENTUALLY(th_sentinel_master_port(sp[i]) == pm, 20000);
        th_log("failed over back to %d with a command in flight on %d", pm, pr);
        th_sleep_ms(1200); /* the client's next refresh is due */
        dlock_lock *b = th_lock(other, "sl:b", DLOCK_KIND_PLAIN);
        ASSERT_EVENTUALLY(dlock_acquire(b, DLOCK_NOWAIT, 30000, NULL) == DLOCK_OK, 15000);
        ASSERT_LOK(b, dlock_release(b));
        pthread_join(th, NULL);
        dlock_lock *y = th_lock(other, "sl:y", DLOCK_KIND_PLAIN);
        ASSERT_LOK(y, dlock_acquire(y, DLOCK_NOWAIT, 30000, NULL));
        dlock_client *fresh = NULL;
        ASSERT_CCODE(fresh, dlock_client_new(&o2, &fresh), DLOCK_OK);
        dlock_lock *y2 = th_lock(fresh, "sl:y", DLOCK_KIND_PLAIN);
        int rc2 = dlock_acquire(y2, DLOCK_NOWAIT, 30000, NULL);
        redisContext *rn = raw(pm);
        r = redisCommand(rn, "PTTL sl:y");
        th_log("after the failover: sl:y on the new master PTTL %lld; another client: %s",
               r->integer, dlock_strerror(rc2));
        ASSERT_GT(r->integer, 0);
        freeReplyObject(r);
        redisFree(rn);
        ASSERT_EQ(rc2, DLOCK_EBUSY);
        ASSERT_LOK(y, dlock_release(y));
        dlock_lock_free(w);
        dlock_lock_free(b);
        dlock_lock_free(y);
        dlock_lock_free(y2);
        dlock_client_free(fresh);
    }

    /* bad input */
    dlock_options bad = o;
    bad.url = "redis-sentinel://127.0.0.1:1/";
    dlock_client *bc = NULL;
    ASSERT_CODE(dlock_client_new(&bad, &bc), DLOCK_EINVAL);
    dlock_client_free(bc);
    bad.url = url;
    snprintf(url + off, sizeof url - off, "/nosuchmaster");
    ASSERT_CODE(dlock_client_new(&bad, &bc), DLOCK_EIO);
    ASSERT(strstr(dlock_errmsg(bc), "nosuchmaster") != NULL);
    dlock_client_free(bc);

    dlock_lock_free(l);
    dlock_lock_free(l2);
    dlock_client_free(c);
    dlock_client_free(other);
    redisFree(rm);
    redisFree(rs);
    redisFree(rr);
    (void)master_pid;
    th_log("ok");
    return 0;
}
