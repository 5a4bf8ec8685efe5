/* Holder identity (dlock_client_set_identity, dlock_inspect_holder): for
 * every lock kind, the holder named by dlock_inspect reads back host, pid,
 * since, label and command; the record lives with the hold: gone at release
 * (kept by a re-entry's inner release), renewed by extend and by the
 * watchdog past several leases, expired within a lease of a killed holder,
 * never written by an attempt that lost or by a client that records none,
 * and written again after the server's script cache is flushed. */
#include "harness.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LEASE 1000

static long long wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The holder's record, split: host, pid, since, label, command. */
typedef struct {
    char raw[1024];
    char *f[5];
    int n;
} record;

static void read_record(dlock_client *c, const char *name, record *r)
{
    dlock_info info;
    ASSERT_COK(c, dlock_inspect(c, name, DLOCK_CSTR, &info));
    ASSERT_MSG(info.exists && info.holder[0], "%s: not held", name);
    ASSERT_COK(c, dlock_inspect_holder(c, name, DLOCK_CSTR, info.holder, r->raw, sizeof r->raw));
    r->n = 0;
    char *p = r->raw;
    while (r->n < 5) {
        r->f[r->n++] = p;
        char *t = strchr(p, '\t');
        if (!t) break;
        *t = '\0';
        p = t + 1;
    }
}

/* The record of name's holder is ours: this host and pid, label and
 * command as set, since within [t0, now]. */
static void check_ours(dlock_client *c, const char *name, const char *label, const char *command,
                       long long t0)
{
    record r;
    read_record(c, name, &r);
    ASSERT_MSG(r.n == 5, "%s: record has %d fields", name, r.n);
    char host[256] = "";
    ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
    ASSERT_STR_EQ(r.f[0], host);
    ASSERT_EQ(atol(r.f[1]), (long)getpid());
    long long since = atoll(r.f[2]);
    ASSERT_GE(since, t0);
    ASSERT_LE(since, wall_ms());
    ASSERT_STR_EQ(r.f[3], label);
    ASSERT_STR_EQ(r.f[4], command);
}

static long long who_keys(redisContext *rc)
{
    redisReply *r = th_cmd(rc, "KEYS dlock_holder:*");
    ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
    long long n = (long long)r->elements;
    freeReplyObject(r);
    return n;
}

static void kinds(const th_server *s, redisContext *rc)
{
    dlock_client *c = th_client(s, LEASE);
    ASSERT_COK(c, dlock_client_set_identity(c, "sync\tjob\n--all", "nightly"));
    const dlock_kind ks[] = {DLOCK_KIND_PLAIN, DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR,
                             DLOCK_KIND_READ, DLOCK_KIND_WRITE};
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        char name[32];
        snprintf(name, sizeof name, "id:kind%zu", i);
        dlock_lock *l = th_lock(c, name, ks[i]);
        long long t0 = wall_ms();
        ASSERT_LOK(l, dlock_acquire(l, 1000, 5000, NULL));
        check_ours(c, name, "nightly", "sync job --all", t0);
        ASSERT_EQ(who_keys(rc), 1);
        /* the record's expiry follows the lease, extended */
        redisReply *k = th_cmd(rc, "KEYS dlock_holder:*");
        ASSERT_EQ(k->elements, 1);
        long long pttl = th_cmd_int(rc, "PTTL %s", k->element[0]->str);
        ASSERT_GT(pttl, 0);
        ASSERT_LE(pttl, 5000);
        ASSERT_LOK(l, dlock_extend(l, 30000));
        ASSERT_GT(th_cmd_int(rc, "PTTL %s", k->element[0]->str), 20000);
        freeReplyObject(k);
        ASSERT_LOK(l, dlock_release(l));
        ASSERT_EQ(who_keys(rc), 0);
        dlock_lock_free(l);
    }
    dlock_client_free(c);
}

static void reentry_extend_busy(const th_server *s, redisContext *rc)
{
    dlock_client *c = th_client(s, LEASE);
    ASSERT_COK(c, dlock_client_set_identity(c, NULL, NULL));
    dlock_lock *l = th_lock(c, "id:re", DLOCK_KIND_REENTRANT);
    long long t0 = wall_ms();
    ASSERT_LOK(l, dlock_acquire(l, 0, 2000, NULL));
    record r1;
    read_record(c, "id:re", &r1);
    ASSERT_EQ(r1.n, 5);
    ASSERT_STR_EQ(r1.f[3], "");
    /* NULL command: this process's command line */
    ASSERT_MSG(strstr(r1.f[4], "test_identity") != NULL, "command '%s'", r1.f[4]);
    th_sleep_ms(20);
    ASSERT_LOK(l, dlock_acquire(l, 0, 2000, NULL)); /* re-entry keeps "since" */
    record r2;
    read_record(c, "id:re", &r2);
    ASSERT_STR_EQ(r2.f[2], r1.f[2]);
    ASSERT_GE(atoll(r2.f[2]), t0);
    ASSERT_LOK(l, dlock_release(l)); /* one hold left: the record stays */
    ASSERT_EQ(who_keys(rc), 1);
    ASSERT_LOK(l, dlock_extend(l, 30000)); /* its expiry follows the lease */
    char *key = NULL;
    {
        redisReply *k = th_cmd(rc, "KEYS dlock_holder:*");
        ASSERT_EQ(k->elements, 1);
        key = strdup(k->element[0]->str);
        freeReplyObject(k);
    }
    ASSERT_GT(th_cmd_int(rc, "PTTL %s", key), 20000);
    /* a second client's attempt that loses writes nothing */
    dlock_client *c2 = th_client(s, LEASE);
    ASSERT_COK(c2, dlock_client_set_identity(c2, "other", "other"));
    dlock_lock *l2 = th_lock(c2, "id:re", DLOCK_KIND_REENTRANT);
    ASSERT_LCODE(l2, dlock_acquire(l2, 0, 2000, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(l2, dlock_acquire(l2, 300, 2000, NULL), DLOCK_ETIMEDOUT);
    ASSERT_EQ(who_keys(rc), 1);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(who_keys(rc), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", key), 0);
    free(key);
    dlock_lock_free(l2);
    dlock_client_free(c2);
    dlock_lock_free(l);
    dlock_client_free(c);
}

/* The watchdog keeps the record for as long as the hold, over three leases,
 * also after the script cache was flushed (the identity script's text is
 * sent again); a client that records no identity writes no record. */
static void watchdog_and_flush(const th_server *s, redisContext *rc)
{
    dlock_client *c = th_client(s, LEASE);
    ASSERT_COK(c, dlock_client_set_identity(c, "wd", "wd"));
    dlock_lock *a = th_lock(c, "id:wd:a", DLOCK_KIND_PLAIN);
    dlock_lock *b = th_lock(c, "id:wd:b", DLOCK_KIND_REENTRANT);
    long long t0 = wall_ms();
    ASSERT_LOK(a, dlock_acquire(a, 0, DLOCK_WATCHDOG, NULL));
    ASSERT_LOK(b, dlock_acquire(b, 0, DLOCK_WATCHDOG, NULL));
    th_cmd_ok(rc, "SCRIPT FLUSH");
    th_sleep_ms(3 * LEASE);
    ASSERT(!dlock_lock_is_lost(a) && !dlock_lock_is_lost(b));
    check_ours(c, "id:wd:a", "wd", "wd", t0);
    check_ours(c, "id:wd:b", "wd", "wd", t0);
    th_cmd_ok(rc, "SCRIPT FLUSH");
    ASSERT_LOK(a, dlock_release(a));
    ASSERT_LOK(b, dlock_release(b));
    ASSERT_EQ(who_keys(rc), 0);
    /* SCRIPT FLUSH before an acquire: the identity script's text follows */
    th_cmd_ok(rc, "SCRIPT FLUSH");
    ASSERT_LOK(a, dlock_acquire(a, 0, 5000, NULL));
    check_ours(c, "id:wd:a", "wd", "wd", t0);
    ASSERT_LOK(a, dlock_release(a));
    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_client_free(c);

    dlock_client *plain = th_client(s, LEASE);
    dlock_lock *l = th_lock(plain, "id:none", DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL));
    record r;
    read_record(plain, "id:none", &r);
    ASSERT_STR_EQ(r.raw, "");
    ASSERT_EQ(who_keys(rc), 0);
    dlock_lock_free(l);
    dlock_client_free(plain);
}

/* A holder killed while holding: its record goes within a lease. */
static void killed_holder(const th_server *s, redisContext *rc)
{
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = th_fork();
    if (pid == 0) {
        close(p[0]);
        dlock_client *c = th_client(s, LEASE);
        ASSERT_COK(c, dlock_client_set_identity(c, "doomed", NULL));
        dlock_lock *l = th_lock(c, "id:killed", DLOCK_KIND_PLAIN);
        ASSERT_LOK(l, dlock_acquire(l, 0, DLOCK_WATCHDOG, NULL));
        char ch = 'H';
        ASSERT_EQ(write(p[1], &ch, 1), 1);
        for (;;) pause();
    }
    close(p[1]);
    char ch = 0;
    ASSERT_EQ(read(p[0], &ch, 1), 1);
    close(p[0]);
    dlock_client *c = th_client(s, LEASE);
    record r;
    read_record(c, "id:killed", &r);
    ASSERT_EQ(r.n, 5);
    ASSERT_EQ(atol(r.f[1]), (long)pid);
    ASSERT_STR_EQ(r.f[4], "doomed");
    kill(pid, SIGKILL);
    ASSERT_EQ(th_wait_child(pid, 5000), 128 + SIGKILL);
    int64_t until = th_now_ms() + LEASE + 1500;
    while (who_keys(rc) > 0 && th_now_ms() < until) th_sleep_ms(50);
    ASSERT_EQ(who_keys(rc), 0);
    dlock_client_free(c);
}

static void bad_calls(const th_server *s)
{
    ASSERT_EQ(dlock_client_set_identity(NULL, NULL, NULL), DLOCK_EINVAL);
    dlock_client *c = th_client(s, LEASE);
    char buf[64];
    ASSERT_EQ(dlock_inspect_holder(c, NULL, 0, "x", buf, sizeof buf), DLOCK_EINVAL);
    ASSERT_EQ(dlock_inspect_holder(c, "n", DLOCK_CSTR, NULL, buf, sizeof buf), DLOCK_EINVAL);
    ASSERT_EQ(dlock_inspect_holder(c, "n", DLOCK_CSTR, "x", buf, 0), DLOCK_EINVAL);
    ASSERT_CCODE(c, dlock_inspect_holder(c, "", DLOCK_CSTR, "x", buf, sizeof buf), DLOCK_EINVAL);
    ASSERT_COK(c, dlock_inspect_holder(c, "n", DLOCK_CSTR, "nobody", buf, sizeof buf));
    ASSERT_STR_EQ(buf, "");
    dlock_client_free(c);
    /* RedLock records none */
    char url[256];
    snprintf(url, sizeof url, "redlock://127.0.0.1:%d", th_server_port(s));
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *rl = NULL;
    ASSERT_COK(rl, dlock_client_new(&o, &rl));
    ASSERT_CCODE(rl, dlock_client_set_identity(rl, NULL, NULL), DLOCK_ENOTSUP);
    dlock_client_free(rl);
}

int main(void)
{
    th_init("identity");
    th_server *s = th_server_start(NULL);
    redisContext *rc = th_redis(s);
    kinds(s, rc);
    reentry_extend_busy(s, rc);
    watchdog_and_flush(s, rc);
    killed_holder(s, rc);
    bad_calls(s);
    redisFree(rc);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
