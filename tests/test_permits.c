/* Permit-expirable semaphore (Redisson RPermitExpirableSemaphore layout):
 * ids and the "{name}:timeout" ZSET (expiries on the server's clock); release
 * by id, a wrong or expired id gives DLOCK_ENOTOWNER; renew; expired permits
 * come back by themselves; a SIGKILLed holder's permit comes back after its
 * lease (explicit and watchdog), and a waiter wakes at the expiry without any
 * message; watchdog permits survive 3 lease periods and expire after
 * dlock_permits_free; a permit is not handed out again in the millisecond
 * its lease expires in (its holder's validity may still run then); 8
 * processes on 2 permits never exceed 2; bad input. */
/* Children free what they made and end with _exit(): the handles they
 * inherit from the parent would otherwise show as leaks under LeakSanitizer. */
#include "harness.h"

#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MARGIN 800
#define WD_LEASE 600

#define ASSERT_POK(p, expr) TH_CODE_(expr, DLOCK_OK, dlock_permits_errmsg(p))
#define ASSERT_PCODE(p, expr, want) TH_CODE_(expr, want, dlock_permits_errmsg(p))

static dlock_permits *pm(dlock_client *c, const char *name)
{
    dlock_permits *p = NULL;
    ASSERT_CCODE(c, dlock_permits_new(c, name, DLOCK_CSTR, &p), DLOCK_OK);
    ASSERT_NOT_NULL(p);
    return p;
}

static int64_t avail(dlock_permits *p)
{
    int64_t n = -999;
    ASSERT_POK(p, dlock_permits_available(p, &n));
    return n;
}

static void init_permits(dlock_permits *p, int64_t n)
{
    int set = -1;
    ASSERT_POK(p, dlock_permits_try_set(p, n, &set));
    ASSERT_EQ(set, 1);
}

static long long server_ms(redisContext *rc)
{
    redisReply *r = th_cmd(rc, "TIME");
    ASSERT(r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    long long ms = atoll(r->element[0]->str) * 1000 + atoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    return ms;
}

/* A permit id as the ZSET holds it (Redisson's layout): the 16 bytes the
 * API's 32 hex characters spell. */
static void raw_id(const char *hex, char raw[16])
{
    for (int i = 0; i < 16; i++) {
        unsigned v = 0;
        ASSERT_EQ(sscanf(hex + 2 * i, "%2x", &v), 1);
        raw[i] = (char)v;
    }
}

static long long zscore(redisContext *rc, const char *key, const char *id)
{
    char raw[16];
    raw_id(id, raw);
    char *s = th_cmd_str(rc, "ZSCORE %s %b", key, raw, (size_t)16);
    long long v = s ? atoll(s) : -1;
    free(s);
    return v;
}

static int is_hex_id(const char *id)
{
    if (strlen(id) != DLOCK_PERMIT_ID_LEN) return 0;
    for (const char *q = id; *q; q++)
        if (!((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f'))) return 0;
    return 1;
}

static void basics(dlock_client *c, redisContext *rc)
{
    dlock_permits *p = pm(c, "pm:basic");
    ASSERT_EQ(avail(p), 0);
    init_permits(p, 2);
    int set = -1;
    ASSERT_POK(p, dlock_permits_try_set(p, 7, &set));
    ASSERT_EQ(set, 0);
    ASSERT_EQ(avail(p), 2);

    char a[DLOCK_PERMIT_ID_LEN + 1], b[DLOCK_PERMIT_ID_LEN + 1], x[DLOCK_PERMIT_ID_LEN + 1];
    long long t0 = server_ms(rc);
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, 5000, a));
    ASSERT(is_hex_id(a));
    /* layout: the STRING holds what is left, the ZSET id -> expiry (server ms) */
    char *v = th_cmd_str(rc, "GET pm:basic");
    ASSERT_STR_EQ(v, "1");
    free(v);
    long long exp = zscore(rc, "{pm:basic}:timeout", a);
    ASSERT_GE(exp, t0 + 5000);
    ASSERT_LE(exp, server_ms(rc) + 5000);
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, 5000, b));
    ASSERT(strcmp(a, b) != 0);
    ASSERT_EQ(avail(p), 0);
    ASSERT_PCODE(p, dlock_permits_acquire(p, DLOCK_NOWAIT, 5000, x), DLOCK_EBUSY);
    ASSERT_STR_EQ(x, "");
    ASSERT(strlen(dlock_permits_errmsg(p)) > 0);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {pm:basic}:timeout"), 2);

    /* release by id; twice, or a wrong id: DLOCK_ENOTOWNER, nothing changes */
    ASSERT_POK(p, dlock_permits_release(p, a));
    ASSERT_EQ(avail(p), 1);
    ASSERT_PCODE(p, dlock_permits_release(p, a), DLOCK_ENOTOWNER);
    ASSERT(strlen(dlock_permits_errmsg(p)) > 0);
    ASSERT_PCODE(p, dlock_permits_release(p, "0123456789abcdef0123456789abcdef"), DLOCK_ENOTOWNER);
    ASSERT_EQ(avail(p), 1);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {pm:basic}:timeout"), 1);

    /* any handle (any client) may release a permit by id */
    dlock_permits *q = pm(c, "pm:basic");
    ASSERT_POK(q, dlock_permits_release(q, b));
    ASSERT_EQ(avail(p), 2);
    dlock_permits_free(q);

    /* renew: sets the expiry to lease from now on the server's clock */
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, 300, a));
    t0 = server_ms(rc);
    ASSERT_POK(p, dlock_permits_renew(p, a, 8000));
    exp = zscore(rc, "{pm:basic}:timeout", a);
    ASSERT_GE(exp, t0 + 8000);
    ASSERT_LE(exp, server_ms(rc) + 8000);
    ASSERT_PCODE(p, dlock_permits_renew(p, "0123456789abcdef0123456789abcdef", 1000),
                 DLOCK_ENOTOWNER);
    ASSERT_POK(p, dlock_permits_release(p, a));

    /* an expired permit comes back by itself; it can no longer be renewed
     * or released */
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, 200, a));
    ASSERT_EQ(avail(p), 1);
    ASSERT_EVENTUALLY(avail(p) == 2, 200 + MARGIN);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {pm:basic}:timeout"), 0);
    ASSERT_PCODE(p, dlock_permits_renew(p, a, 1000), DLOCK_ENOTOWNER);
    ASSERT_PCODE(p, dlock_permits_release(p, a), DLOCK_ENOTOWNER);
    ASSERT_EQ(avail(p), 2);

    /* add */
    ASSERT_POK(p, dlock_permits_add(p, 3));
    ASSERT_EQ(avail(p), 5);
    ASSERT_POK(p, dlock_permits_add(p, -5));
    ASSERT_EQ(avail(p), 0);
    ASSERT_PCODE(p, dlock_permits_acquire(p, DLOCK_NOWAIT, 1000, a), DLOCK_EBUSY);
    ASSERT_POK(p, dlock_permits_add(p, 1));
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, 1000, a));
    ASSERT_POK(p, dlock_permits_release(p, a));

    /* wrong types */
    th_cmd_ok(rc, "HSET pm:hash f 1");
    dlock_permits *h = pm(c, "pm:hash");
    ASSERT_PCODE(h, dlock_permits_acquire(h, DLOCK_NOWAIT, 1000, a), DLOCK_ESERVER);
    ASSERT_PCODE(h, dlock_permits_available(h, &(int64_t){0}), DLOCK_ESERVER);
    dlock_permits_free(h);
    dlock_permits_free(p);
    th_log("basics ok");
}

static void bad_input(dlock_client *c)
{
    dlock_permits *p = NULL;
    char id[DLOCK_PERMIT_ID_LEN + 1];
    int set;
    int64_t n;
    ASSERT_CODE(dlock_permits_new(NULL, "x", DLOCK_CSTR, &p), DLOCK_EINVAL);
    ASSERT_NULL(p);
    ASSERT_CODE(dlock_permits_new(c, NULL, 0, &p), DLOCK_EINVAL);
    ASSERT(strlen(dlock_errmsg(c)) > 0);
    ASSERT_CODE(dlock_permits_new(c, "x", 0, &p), DLOCK_EINVAL);
    ASSERT_CODE(dlock_permits_new(c, "x", DLOCK_CSTR, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_permits_acquire(NULL, 0, 1000, id), DLOCK_EINVAL);
    ASSERT_CODE(dlock_permits_release(NULL, "0123456789abcdef0123456789abcdef"), DLOCK_EINVAL);
    ASSERT_CODE(dlock_permits_renew(NULL, "0123456789abcdef0123456789abcdef", 10), DLOCK_EINVAL);
    ASSERT_CODE(dlock_permits_available(NULL, &n), DLOCK_EINVAL);
    ASSERT_CODE(dlock_permits_try_set(NULL, 1, &set), DLOCK_EINVAL);
    ASSERT_CODE(dlock_permits_add(NULL, 1), DLOCK_EINVAL);
    ASSERT(strlen(dlock_permits_errmsg(NULL)) > 0);
    dlock_permits_free(NULL);

    p = pm(c, "pm:bad");
#define BAD(expr)                                                                        \
    do {                                                                                 \
        ASSERT_PCODE(p, expr, DLOCK_EINVAL);                                             \
        ASSERT_MSG(strlen(dlock_permits_errmsg(p)) > 0, "no message: %s", #expr);        \
    } while (0)
    BAD(dlock_permits_acquire(p, 0, 1000, NULL));
    BAD(dlock_permits_acquire(p, 0, -1, id));
    BAD(dlock_permits_acquire(p, -2, 1000, id));
    BAD(dlock_permits_release(p, NULL));
    BAD(dlock_permits_release(p, "short"));
    BAD(dlock_permits_release(p, "0123456789abcdef0123456789abcdeg"));
    BAD(dlock_permits_release(p, "0123456789abcdef0123456789abcdef0"));
    BAD(dlock_permits_renew(p, NULL, 1000));
    BAD(dlock_permits_renew(p, "0123456789abcdef0123456789abcdef", 0));
    BAD(dlock_permits_renew(p, "0123456789abcdef0123456789abcdef", -5));
    BAD(dlock_permits_try_set(p, -1, &set));
    BAD(dlock_permits_try_set(p, 1, NULL));
    BAD(dlock_permits_available(p, NULL));
    /* counts past 2^53 - 1: the scripts' numbers are doubles */
    BAD(dlock_permits_try_set(p, DLOCK_COUNT_MAX + 1, &set));
    BAD(dlock_permits_add(p, DLOCK_COUNT_MAX + 1));
    BAD(dlock_permits_add(p, -DLOCK_COUNT_MAX - 1));
#undef BAD
    ASSERT_EQ(avail(p), 0);
    dlock_permits_free(p);
    th_log("bad input ok");
}

/* A child takes the only permit (explicit lease or watchdog) and is killed;
 * a waiter that started before the kill gets it within lease + margin, woken
 * by the expiry (nothing is published). */
static void crash(const th_server *srv, redisContext *rc, const char *name, int watchdog)
{
    const int64_t lease = watchdog ? WD_LEASE : 1000;
    dlock_client *c = th_client(srv, WD_LEASE);
    dlock_permits *p = pm(c, name);
    init_permits(p, 1);
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = th_fork();
    if (pid == 0) {
        close(fds[0]);
        dlock_client *cc = th_client(srv, WD_LEASE);
        dlock_permits *h = pm(cc, name);
        char id[DLOCK_PERMIT_ID_LEN + 1];
        ASSERT_POK(h, dlock_permits_acquire(h, 5000, watchdog ? DLOCK_WATCHDOG : lease, id));
        char b = 'H';
        ASSERT_EQ(write(fds[1], &b, 1), 1);
        for (;;) pause(); /* killed here, holding */
    }
    close(fds[1]);
    struct pollfd pfd = {fds[0], POLLIN, 0};
    ASSERT_EQ(poll(&pfd, 1, 10000), 1);
    char b = 0;
    ASSERT_EQ(read(fds[0], &b, 1), 1);
    close(fds[0]);
    char id[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_PCODE(p, dlock_permits_acquire(p, DLOCK_NOWAIT, 5000, id), DLOCK_EBUSY);
    if (watchdog) {
        /* renewed past its first lease while the holder lives */
        ASSERT_PCODE(p, dlock_permits_acquire(p, 2 * WD_LEASE, 5000, id), DLOCK_ETIMEDOUT);
    }
    int64_t t_kill = th_now_ms();
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_POK(p, dlock_permits_acquire(p, 10000, 5000, id));
    int64_t took = th_now_ms() - t_kill;
    ASSERT_EQ(th_wait_child(pid, 5000), 128 + SIGKILL);
    th_log("%s: the killed holder's permit (lease %lld ms%s) was had %lld ms after SIGKILL",
           name, (long long)lease, watchdog ? ", watchdog" : "", (long long)took);
    ASSERT_LE(took, lease + MARGIN);
    ASSERT_EQ(th_numsub(rc, "redisson_sc:{pm:crash}"), 0);
    ASSERT_POK(p, dlock_permits_release(p, id));
    ASSERT_EQ(avail(p), 1);
    dlock_permits_free(p);
    dlock_client_free(c);
}

/* Watchdog permits outlive 3 lease periods; released, a waiter has it at
 * once; after dlock_permits_free they expire within one lease. */
static void watchdog(const th_server *srv, redisContext *rc)
{
    dlock_client *c = th_client(srv, WD_LEASE);
    dlock_client *o = th_client(srv, WD_LEASE);
    dlock_permits *p = pm(c, "pm:wd");
    dlock_permits *w = pm(o, "pm:wd");
    init_permits(p, 2);
    char a[DLOCK_PERMIT_ID_LEN + 1], b[DLOCK_PERMIT_ID_LEN + 1], x[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, DLOCK_WATCHDOG, a));
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, DLOCK_WATCHDOG, b));
    ASSERT_GT(dlock_permits_valid_ms(p, a), 0);
    ASSERT_LE(dlock_permits_valid_ms(p, a), WD_LEASE);
    ASSERT_EQ(dlock_permits_valid_ms(w, a), 0); /* not taken through w */
    long long t0 = server_ms(rc);
    long long e0 = zscore(rc, "{pm:wd}:timeout", a);
    ASSERT_LE(e0, t0 + WD_LEASE);
    /* another client waits 3 leases in vain: both permits stay renewed */
    int64_t s0 = th_now_ms();
    ASSERT_PCODE(w, dlock_permits_acquire(w, 3 * WD_LEASE, 5000, x), DLOCK_ETIMEDOUT);
    ASSERT_GE(th_now_ms() - s0, 3 * WD_LEASE - 10);
    ASSERT_GT(zscore(rc, "{pm:wd}:timeout", a), e0);
    ASSERT_GT(zscore(rc, "{pm:wd}:timeout", b), e0);
    ASSERT_EQ(avail(w), 0);
    /* renewed: still valid after 3 leases, by at most the lease */
    ASSERT_GT(dlock_permits_valid_ms(p, a), 0);
    ASSERT_LE(dlock_permits_valid_ms(p, a), WD_LEASE);

    /* release by id stops the renewal of that one and frees it */
    ASSERT_POK(p, dlock_permits_release(p, a));
    ASSERT_EQ(dlock_permits_valid_ms(p, a), 0);
    ASSERT_POK(w, dlock_permits_acquire(w, DLOCK_NOWAIT, 5000, x));
    ASSERT_POK(w, dlock_permits_release(w, x));

    /* an explicit renew turns a watchdog permit into an explicit lease */
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, DLOCK_WATCHDOG, a));
    ASSERT_POK(p, dlock_permits_renew(p, a, 300));
    ASSERT_GT(dlock_permits_valid_ms(p, a), 0);
    ASSERT_LE(dlock_permits_valid_ms(p, a), 300);
    ASSERT_POK(w, dlock_permits_acquire(w, 300 + MARGIN + WD_LEASE, 5000, x));
    ASSERT_EQ(dlock_permits_valid_ms(p, a), 0); /* its lease ran out */
    ASSERT_GT(dlock_permits_valid_ms(w, x), 4000); /* explicit lease of 5 s */
    ASSERT_LE(dlock_permits_valid_ms(w, x), 5000);
    ASSERT_PCODE(p, dlock_permits_release(p, a), DLOCK_ENOTOWNER);
    ASSERT_POK(w, dlock_permits_release(w, x));

    /* free: b is no longer renewed and comes back within one lease */
    char y[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_POK(w, dlock_permits_acquire(w, DLOCK_NOWAIT, 5000, y)); /* the other one */
    ASSERT_EQ(avail(w), 0);
    int64_t t_free = th_now_ms();
    dlock_permits_free(p);
    ASSERT_POK(w, dlock_permits_acquire(w, 5000, 5000, x));
    int64_t took = th_now_ms() - t_free;
    th_log("a freed handle's watchdog permit came back %lld ms after the free", (long long)took);
    ASSERT_LE(took, WD_LEASE + MARGIN);
    ASSERT_POK(w, dlock_permits_release(w, x));
    ASSERT_POK(w, dlock_permits_release(w, y));
    ASSERT_EQ(avail(w), 2);
    dlock_permits_free(w);
    dlock_client_free(o);
    dlock_client_free(c);
    th_log("watchdog ok");
}

/* A waiter wakes on a release (message), not at the end of its wait. */
/* What the lost-permit callback saw (it runs on the watchdog thread). */
typedef struct lost_seen {
    atomic_int calls;
    atomic_int reason;
    char id[DLOCK_PERMIT_ID_LEN + 1]; /* the first call's; published by calls */
} lost_seen;

static void on_permit_lost(dlock_permits *p, const char *id, int reason, void *userdata)
{
    (void)p;
    lost_seen *seen = userdata;
    if (atomic_load(&seen->calls) == 0) memcpy(seen->id, id, DLOCK_PERMIT_ID_LEN + 1);
    atomic_store(&seen->reason, reason);
    atomic_fetch_add(&seen->calls, 1);
}

/* A watchdog permit whose lease ran out on the server (as after the server
 * was unreachable for a lease): the callback names it, once; the handle's
 * other watchdog permit stays renewed; the lost one's release answers
 * DLOCK_ENOTOWNER and it is back in the pool. A removed callback is not
 * called. */
static void lost(const th_server *srv, redisContext *rc)
{
    dlock_client *c = th_client(srv, WD_LEASE);
    dlock_permits *p = pm(c, "pm:lost");
    init_permits(p, 2);
    lost_seen seen;
    memset(&seen, 0, sizeof seen);
    atomic_init(&seen.calls, 0);
    atomic_init(&seen.reason, 0);
    dlock_permits_on_lost(p, on_permit_lost, &seen);
    char a[DLOCK_PERMIT_ID_LEN + 1], b[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, DLOCK_WATCHDOG, a));
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, DLOCK_WATCHDOG, b));
    char ra[16];
    raw_id(a, ra);
    th_cmd_ok(rc, "ZADD {pm:lost}:timeout XX 1 %b", ra, (size_t)16); /* its lease over */
    ASSERT_EVENTUALLY(atomic_load(&seen.calls) >= 1, WD_LEASE + MARGIN);
    ASSERT_STR_EQ(seen.id, a);
    ASSERT_EQ(atomic_load(&seen.reason), DLOCK_LOST_TAKEN);
    ASSERT_EQ(dlock_permits_valid_ms(p, a), 0);
    ASSERT_GT(dlock_permits_valid_ms(p, b), 0);
    /* two more renewals of b: no second call */
    long long eb = zscore(rc, "{pm:lost}:timeout", b);
    ASSERT_EVENTUALLY(zscore(rc, "{pm:lost}:timeout", b) > eb, 10 * WD_LEASE);
    eb = zscore(rc, "{pm:lost}:timeout", b);
    ASSERT_EVENTUALLY(zscore(rc, "{pm:lost}:timeout", b) > eb, 10 * WD_LEASE);
    ASSERT_EQ(atomic_load(&seen.calls), 1);
    ASSERT_PCODE(p, dlock_permits_release(p, a), DLOCK_ENOTOWNER);
    ASSERT_EQ(avail(p), 1); /* a came back to the pool; b is out */
    ASSERT_POK(p, dlock_permits_release(p, b));

    dlock_permits_on_lost(p, NULL, NULL);
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, DLOCK_WATCHDOG, a));
    raw_id(a, ra);
    th_cmd_ok(rc, "ZADD {pm:lost}:timeout XX 1 %b", ra, (size_t)16);
    th_sleep_ms(WD_LEASE / 3 + MARGIN / 2);
    ASSERT_EQ(atomic_load(&seen.calls), 1);
    ASSERT_PCODE(p, dlock_permits_release(p, a), DLOCK_ENOTOWNER);
    ASSERT_EQ(avail(p), 2);
    dlock_permits_free(p);
    dlock_client_free(c);
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A watchdog permit on a frozen server: dlock_permits_valid_ms reaches 0
 * within a lease of the freeze and no later than the server's expiry of the
 * permit (the server's clock is this machine's wall clock). */
static void valid_frozen(th_server *srv, redisContext *rc)
{
    dlock_client *c = th_client(srv, WD_LEASE);
    dlock_permits *p = pm(c, "pm:frozen");
    init_permits(p, 1);
    char a[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, DLOCK_WATCHDOG, a));
    th_sleep_ms(WD_LEASE / 2); /* a renewal or two */
    int64_t t0 = th_now_ms();
    th_server_pause(srv);
    /* where valid_ms says the hold ends, on the wall clock (no renewal is
     * confirmed from here on) */
    int64_t zero_at = wall_ms() + dlock_permits_valid_ms(p, a);
    while (dlock_permits_valid_ms(p, a) > 0 && th_now_ms() - t0 < WD_LEASE + MARGIN)
        th_sleep_ms(1);
    int64_t took = th_now_ms() - t0;
    th_server_unpause(srv);
    long long exp = zscore(rc, "{pm:frozen}:timeout", a);
    th_log("frozen server: valid_ms reached 0 after %lld ms, %lld ms before the server's expiry",
           (long long)took, exp - (long long)zero_at);
    ASSERT_EQ(dlock_permits_valid_ms(p, a), 0);
    ASSERT_LE(took, WD_LEASE + 5);
    /* 2 ms: three clocks (monotonic, wall, the server's TIME) read in ms */
    ASSERT_LE(zero_at, exp + 2);
    dlock_permits_free(p);
    dlock_client_free(c);
}

static void wake_on_release(const th_server *srv, redisContext *rc)
{
    dlock_client *c = th_client(srv, 0);
    dlock_permits *p = pm(c, "pm:wake");
    init_permits(p, 1);
    char a[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_POK(p, dlock_permits_acquire(p, DLOCK_NOWAIT, 20000, a));
    th_cmd_ok(rc, "DEL pm:wake:got");
    pid_t pid = th_fork();
    if (pid == 0) {
        dlock_client *cc = th_client(srv, 0);
        dlock_permits *h = pm(cc, "pm:wake");
        char id[DLOCK_PERMIT_ID_LEN + 1];
        if (dlock_permits_acquire(h, 10000, 5000, id) != DLOCK_OK) _exit(1);
        redisContext *r2 = th_redis(srv);
        th_cmd_ok(r2, "SET pm:wake:got %lld", (long long)th_now_ms());
        redisFree(r2);
        int code = dlock_permits_release(h, id);
        dlock_permits_free(h);
        dlock_client_free(cc);
        _exit(code == DLOCK_OK ? 0 : 2);
    }
    ASSERT_EVENTUALLY(th_numsub(rc, "redisson_sc:{pm:wake}") == 1, 5000);
    int64_t t_rel = th_now_ms();
    ASSERT_POK(p, dlock_permits_release(p, a));
    ASSERT_EQ(th_wait_child(pid, 10000), 0);
    char *v = th_cmd_str(rc, "GET pm:wake:got");
    ASSERT_NOT_NULL(v);
    int64_t got = atoll(v);
    free(v);
    th_log("waiter had the permit %lld ms after the release (holder lease 20 s)",
           (long long)(got - t_rel));
    ASSERT_LT(got - t_rel, 5000); /* woken: not at the end of its 10 s wait */
    dlock_permits_free(p);
    dlock_client_free(c);
}

/* The library's clock (dl_now_ms, src/base/clock.c), in microseconds. */
static int64_t boot_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The millisecond a permit's lease expires in is still its holder's. An
 * expiry is the server's TIME rounded down to the ms plus the lease (E), and
 * the holder counts its lease from just before its request on its own
 * clock; a permit handed out again at server time E (rather than from E + 1
 * on) goes up to 1 ms before the holder's validity has run out. Round after
 * round on a 1-permit semaphore, a blocking client takes the permit with a
 * lease of 2 ms, just after a tick of the library's clock (the worst case
 * for its validity: a request sent early in a millisecond), and a second
 * client spins taking it without waiting. When the spinner has it:
 *   - the first holder's dlock_permits_valid_ms must be 0 (an overlap
 *     otherwise). Whether the old rule could be caught this way depends on
 *     the fractional ms between CLOCK_REALTIME (the server's TIME) and
 *     CLOCK_BOOTTIME (the library's), a constant of the machine: the window
 *     is that fraction wide, for requests sent early enough in their ms;
 *   - the server's TIME, read after the grant, must be past E: the grant
 *     was at E + 1 at the earliest (deterministic: the spinner's first
 *     attempt in ms E, which the old rule granted, is answered and TIME
 *     read within that ms in most rounds);
 * and the spinner must take the permit in E + 1 in a good share of the
 * rounds (the spin is fast enough to meet the edge at all). */
static void expiry_edge(const th_server *srv, redisContext *rc)
{
    dlock_client *ca = th_client(srv, WD_LEASE), *cb = th_client(srv, WD_LEASE);
    dlock_permits *a = pm(ca, "pm:edge"), *b = pm(cb, "pm:edge");
    init_permits(a, 1);
    struct timespec rt, bt;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_BOOTTIME, &bt);
    int64_t off_us = ((int64_t)rt.tv_sec - bt.tv_sec) * 1000000 + (rt.tv_nsec - bt.tv_nsec) / 1000;
    long rounds = 0, overlaps = 0, at_expiry = 0, next_ms = 0, later = 0, spins = 0;
    int64_t worst_left = 0;
    int64_t end = th_now_ms() + 1500;
    while (th_now_ms() < end) {
        char ida[DLOCK_PERMIT_ID_LEN + 1], idb[DLOCK_PERMIT_ID_LEN + 1];
        int64_t tick = (boot_us() / 1000 + 1) * 1000;
        while (boot_us() < tick) {
        }
        ASSERT_POK(a, dlock_permits_acquire(a, 1000, 2, ida));
        long long exp = zscore(rc, "{pm:edge}:timeout", ida); /* no script: not reclaimed */
        ASSERT_GT(exp, 0);
        int64_t give_up = th_now_ms() + 2000;
        int r;
        while ((r = dlock_permits_acquire(b, DLOCK_NOWAIT, 5000, idb)) == DLOCK_EBUSY) {
            spins++;
            ASSERT_MSG(th_now_ms() < give_up, "a 2 ms permit still out after 2 s");
        }
        ASSERT_POK(b, r);
        int64_t left = dlock_permits_valid_ms(a, ida);
        long long now = server_ms(rc);
        if (left > 0) overlaps++;
        if (left > worst_left) worst_left = left;
        if (now <= exp) at_expiry++;
        else if (now == exp + 1) next_ms++;
        else later++;
        ASSERT_POK(b, dlock_permits_release(b, idb));
        rounds++;
    }
    th_log("expiry edge: %ld rounds (%ld spins), the spinner had the permit with the first "
           "holder still valid in %ld (up to %lld ms left), server time at or before the "
           "expiry in %ld, in the ms after it in %ld, later in %ld (realtime - boottime: "
           "%lld.%03lld ms)",
           rounds, spins, overlaps, (long long)worst_left, at_expiry, next_ms, later,
           (long long)(off_us / 1000), (long long)(off_us % 1000));
    ASSERT_EQ(overlaps, 0);
    ASSERT_EQ(at_expiry, 0);
    ASSERT_GE(rounds, 50);
    ASSERT_GE(next_ms * 4, rounds);
    dlock_permits_free(a);
    dlock_permits_free(b);
    dlock_client_free(ca);
    dlock_client_free(cb);
}

/* 8 processes on 2 permits (watchdog leases): never more than 2 at once. */
static void concurrency(const th_server *srv, redisContext *rc)
{
    enum { N = 8, PERMITS = 2, ROUNDS = 4 };
    static const char *enter_lua =
        "local v = redis.call('incr', KEYS[1]) "
        "if v > tonumber(redis.call('get', KEYS[2]) or '0') then redis.call('set', KEYS[2], v) end "
        "return v";
    dlock_client *c = th_client(srv, 0);
    dlock_permits *p = pm(c, "pm:conc");
    init_permits(p, PERMITS);
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) {
            dlock_client *cc = th_client(srv, WD_LEASE);
            dlock_permits *h = pm(cc, "pm:conc");
            redisContext *r = th_redis(srv);
            for (int k = 0; k < ROUNDS; k++) {
                char id[DLOCK_PERMIT_ID_LEN + 1];
                int code = dlock_permits_acquire(h, 15000, DLOCK_WATCHDOG, id);
                if (code != DLOCK_OK) {
                    fprintf(stderr, "holder %d: %s: %s\n", i, dlock_strerror(code),
                            dlock_permits_errmsg(h));
                    _exit(1);
                }
                redisReply *e = th_cmd(r, "EVAL %s 2 pm:conc:cur pm:conc:max", enter_lua);
                freeReplyObject(e);
                th_sleep_ms(30);
                th_cmd_int(r, "DECR pm:conc:cur");
                if (dlock_permits_release(h, id) != DLOCK_OK) _exit(3);
            }
            redisFree(r);
            dlock_permits_free(h);
            dlock_client_free(cc);
            _exit(0);
        }
    }
    for (int i = 0; i < N; i++) ASSERT_EQ(th_wait_child(pids[i], 20000), 0);
    char *mx = th_cmd_str(rc, "GET pm:conc:max");
    ASSERT_NOT_NULL(mx);
    long long maxseen = atoll(mx);
    free(mx);
    th_log("%d processes on %d expirable permits: at most %lld at once", N, PERMITS, maxseen);
    ASSERT_EQ(maxseen, PERMITS);
    ASSERT_EQ(avail(p), PERMITS);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {pm:conc}:timeout"), 0);
    dlock_permits_free(p);
    dlock_client_free(c);
}

/* A renewal through another handle never shortens a permit's lease the
 * holder counts on (before: renew(id, 300 ms) cut a 20 s permit, and a
 * third client took the only permit while the holder counted 19 s); and a
 * count a foreign client broke fails the call before an expired permit is
 * taken back (before: it was dropped from the lease set, its permit lost). */
static void shared_renew(th_server *srv, redisContext *rc)
{
    dlock_client *c1 = th_client(srv, 0), *c2 = th_client(srv, 0), *c3 = th_client(srv, 0);
    dlock_permits *p1 = pm(c1, "pm:shared"), *p2 = pm(c2, "pm:shared"), *p3 = pm(c3, "pm:shared");
    init_permits(p1, 1);
    char id[DLOCK_PERMIT_ID_LEN + 1], id3[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_POK(p1, dlock_permits_acquire(p1, DLOCK_NOWAIT, 20000, id));
    ASSERT_POK(p2, dlock_permits_renew(p2, id, 300));
    th_sleep_ms(500);
    int64_t v = dlock_permits_valid_ms(p1, id);
    int rc3 = dlock_permits_acquire(p3, DLOCK_NOWAIT, 1000, id3);
    th_log("permit renewed for 300 ms by another handle: the holder counts %lld ms, a third "
           "client: %s", (long long)v, dlock_strerror(rc3));
    ASSERT_GT(v, 15000);
    ASSERT_EQ(rc3, DLOCK_EBUSY);
    ASSERT_POK(p1, dlock_permits_release(p1, id));

    /* an expired permit and a broken count */
    ASSERT_POK(p1, dlock_permits_acquire(p1, DLOCK_NOWAIT, 200, id));
    th_sleep_ms(300);
    th_cmd_ok(rc, "SET pm:shared abc");
    int64_t n = 0;
    ASSERT_PCODE(p2, dlock_permits_available(p2, &n), DLOCK_ESERVER);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {pm:shared}:timeout"), 1); /* still there */
    th_cmd_ok(rc, "SET pm:shared 0");
    ASSERT_EQ(avail(p2), 1); /* taken back now */
    dlock_permits_free(p1);
    dlock_permits_free(p2);
    dlock_permits_free(p3);
    dlock_client_free(c1);
    dlock_client_free(c2);
    dlock_client_free(c3);
}

int main(void)
{
    th_init("permits");
    th_server *srv = th_server_start(NULL);
    dlock_client *c = th_client(srv, 0);
    redisContext *rc = th_redis(srv);
    bad_input(c);
    basics(c, rc);
    wake_on_release(srv, rc);
    crash(srv, rc, "pm:crash", 0);
    th_cmd_ok(rc, "DEL pm:crash {pm:crash}:timeout");
    crash(srv, rc, "pm:crash", 1);
    watchdog(srv, rc);
    lost(srv, rc);
    valid_frozen(srv, rc);
    expiry_edge(srv, rc);
    concurrency(srv, rc);
    shared_renew(srv, rc);
    redisFree(rc);
    dlock_client_free(c);
    th_server_stop(srv);
    th_log("ok");
    return 0;
}
