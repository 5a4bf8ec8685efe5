/* Queries and administration: dlock_is_locked, dlock_remaining_ttl,
 * dlock_inspect (free, plain, reentrant, waiters, foreign types), dlock_list
 * (locks only, pattern, binary names, early stop), dlock_force_unlock (wakes a
 * blocked waiter; the holder then sees DLOCK_ELOST), dlock_server_fact. */
#include "harness.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    dlock_client *c;
    const char *name;
    int rc;
    int64_t t_got;
    dlock_kind kind; /* 0: reentrant */
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;
    dlock_lock *l = th_lock(w->c, w->name, w->kind ? w->kind : DLOCK_KIND_REENTRANT);
    w->rc = dlock_acquire(l, 10000, 5000, NULL);
    w->t_got = th_now_ms();
    if (w->rc == DLOCK_OK) dlock_release(l);
    dlock_lock_free(l);
    return NULL;
}

#define MAX_SEEN 32
typedef struct {
    int n;
    char names[MAX_SEEN][64];
    size_t lens[MAX_SEEN];
    dlock_info infos[MAX_SEEN];
    int stop_after;
} seen_t;

static int on_item(const char *name, size_t len, const dlock_info *info, void *ud)
{
    seen_t *s = ud;
    if (s->n < MAX_SEEN && len < 64) {
        memcpy(s->names[s->n], name, len);
        s->names[s->n][len] = '\0';
        s->lens[s->n] = len;
        if (info) s->infos[s->n] = *info;
    }
    s->n++;
    return s->stop_after && s->n >= s->stop_after;
}

static int find(const seen_t *s, const char *name, size_t len)
{
    for (int i = 0; i < s->n && i < MAX_SEEN; i++)
        if (s->lens[i] == len && memcmp(s->names[i], name, len) == 0) return i;
    return -1;
}

int main(void)
{
    th_init("admin");
    th_server *s = th_server_start(NULL);
    dlock_client *c = th_client(s, 0);
    dlock_client *other = th_client(s, 0);
    redisContext *rc = th_redis(s);

    /* a free lock */
    dlock_info info;
    memset(&info, 0x5a, sizeof info);
    ASSERT_COK(c, dlock_inspect(c, "adm:free", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 0);
    ASSERT_EQ(info.kind, 0);
    ASSERT_EQ(info.ttl_ms, -2);
    ASSERT_U64_EQ(info.fence, 0);
    ASSERT_EQ(info.hold_count, 0);
    ASSERT_EQ(info.holders, 0);
    ASSERT_STR_EQ(info.holder, "");
    int locked = -1;
    ASSERT_COK(c, dlock_is_locked(c, "adm:free", DLOCK_CSTR, &locked));
    ASSERT_EQ(locked, 0);
    int64_t ttl = 0;
    ASSERT_COK(c, dlock_remaining_ttl(c, "adm:free", DLOCK_CSTR, &ttl));
    ASSERT_EQ(ttl, -2);

    /* a plain lock */
    dlock_lock *p = th_lock(c, "adm:plain", DLOCK_KIND_PLAIN);
    uint64_t fp = 0;
    ASSERT_LOK(p, dlock_acquire(p, DLOCK_NOWAIT, 8000, &fp));
    ASSERT_COK(c, dlock_inspect(c, "adm:plain", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.kind, DLOCK_KIND_PLAIN);
    ASSERT_GT(info.ttl_ms, 0);
    ASSERT_LE(info.ttl_ms, 8000);
    ASSERT_U64_EQ(info.fence, fp);
    ASSERT_EQ(info.hold_count, 1);
    ASSERT_EQ(info.holders, 1);
    ASSERT_STR_EQ(info.holder, dlock_lock_token(p));
    ASSERT_EQ(info.waiters, 0);
    ASSERT_COK(c, dlock_is_locked(c, "adm:plain", DLOCK_CSTR, &locked));
    ASSERT_EQ(locked, 1);
    ASSERT_COK(c, dlock_remaining_ttl(c, "adm:plain", DLOCK_CSTR, &ttl));
    ASSERT_GT(ttl, 0);
    ASSERT_LE(ttl, 8000);

    /* a reentrant lock held twice, with a blocked waiter */
    dlock_lock *r = th_lock(c, "adm:re", DLOCK_KIND_REENTRANT);
    uint64_t fr = 0;
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 20000, &fr));
    waiter w = {other, "adm:re", -1, 0};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, wait_thread, &w), 0);
    th_wait_subscribers(rc, "adm:re", 1, 5000);
    ASSERT_COK(c, dlock_inspect(c, "adm:re", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.kind, DLOCK_KIND_REENTRANT);
    ASSERT_GT(info.ttl_ms, 10000);
    ASSERT_U64_EQ(info.fence, fr);
    ASSERT_EQ(info.hold_count, 2);
    ASSERT_EQ(info.holders, 1);
    ASSERT_STR_EQ(info.holder, dlock_lock_token(r));
    ASSERT_GE(info.waiters, 1);

    /* force unlock wakes the waiter; the holder then finds its lease lost */
    th_sleep_ms(100);
    int existed = 0;
    int64_t t_force = th_now_ms();
    ASSERT_COK(c, dlock_force_unlock(c, "adm:re", DLOCK_CSTR, &existed));
    ASSERT_EQ(existed, 1);
    ASSERT_EQ(pthread_join(t, NULL), 0);
    ASSERT_CODE(w.rc, DLOCK_OK);
    th_log("force_unlock: waiter had it %lld ms later (holder lease 20 s)",
           (long long)(w.t_got - t_force));
    ASSERT_LT(w.t_got - t_force, 10000); /* woken: not at the end of the 20 s lease */
    ASSERT_LCODE(r, dlock_release(r), DLOCK_ELOST);
    ASSERT_COK(c, dlock_force_unlock(c, "adm:re", DLOCK_CSTR, &existed));
    ASSERT_EQ(existed, 0);
    ASSERT_COK(c, dlock_force_unlock(c, "adm:re", DLOCK_CSTR, NULL));

    /* a plain and a fair lock with one blocked waiter each: these waiters
     * listen on channels of their own, and are counted from the plain
     * lock's registry and the fair lock's queue */
    for (int k = 0; k < 2; k++) {
        dlock_kind kind = k ? DLOCK_KIND_FAIR : DLOCK_KIND_PLAIN;
        const char *nm = k ? "adm:fairw" : "adm:plainw";
        dlock_lock *hl = th_lock(c, nm, kind);
        ASSERT_LOK(hl, dlock_acquire(hl, DLOCK_NOWAIT, 20000, NULL));
        ASSERT_COK(c, dlock_inspect(c, nm, DLOCK_CSTR, &info));
        ASSERT_EQ(info.waiters, 0);
        waiter w2 = {other, nm, -1, 0, kind};
        pthread_t t2;
        ASSERT_EQ(pthread_create(&t2, NULL, wait_thread, &w2), 0);
        th_wait_subscribers(rc, nm, 1, 5000);
        ASSERT_COK(c, dlock_inspect(c, nm, DLOCK_CSTR, &info));
        ASSERT_EQ(info.kind, (int)kind);
        ASSERT_EQ(info.waiters, 1);
        if (k) ASSERT_EQ(info.queued, 1);
        ASSERT_LOK(hl, dlock_release(hl));
        ASSERT_EQ(pthread_join(t2, NULL), 0);
        ASSERT_CODE(w2.rc, DLOCK_OK);
        dlock_lock_free(hl);
    }

    /* foreign keys */
    th_cmd_ok(rc, "RPUSH adm:list a b");
    ASSERT_COK(c, dlock_inspect(c, "adm:list", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.kind, 0);
    th_cmd_ok(rc, "SET adm:noexpiry sometoken");
    ASSERT_COK(c, dlock_remaining_ttl(c, "adm:noexpiry", DLOCK_CSTR, &ttl));
    ASSERT_EQ(ttl, -1);
    ASSERT_COK(c, dlock_inspect(c, "adm:noexpiry", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.ttl_ms, -1);
    ASSERT_EQ(info.kind, 0); /* "sometoken" is no client's owner token */
    /* redis-py's Lock without a timeout: uuid1().hex and no expiry */
    th_cmd_ok(rc, "SET adm:pylock 9f1c2b8a6e4d11efa1b20242ac120002");
    ASSERT_COK(c, dlock_inspect(c, "adm:pylock", DLOCK_CSTR, &info));
    ASSERT_EQ(info.kind, DLOCK_KIND_PLAIN);
    ASSERT_EQ(info.ttl_ms, -1);
    /* an application's HASH, and one that has a "mode" but foreign fields */
    th_cmd_ok(rc, "HSET adm:user name bob age 7");
    ASSERT_COK(c, dlock_inspect(c, "adm:user", DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.kind, 0);
    th_cmd_ok(rc, "HSET adm:moded mode read reader 1");
    ASSERT_COK(c, dlock_inspect(c, "adm:moded", DLOCK_CSTR, &info));
    ASSERT_EQ(info.kind, 0);

    /* listing: locks only (not fence counters, not lists) */
    static const char bin[] = "adm:bin\0x";
    dlock_lock *b = NULL;
    ASSERT_COK(c, dlock_lock_new(c, bin, sizeof bin - 1, DLOCK_KIND_REENTRANT, &b));
    ASSERT_LOK(b, dlock_acquire(b, DLOCK_NOWAIT, 20000, NULL));
    ASSERT_LOK(r, dlock_acquire(r, DLOCK_NOWAIT, 20000, NULL));
    seen_t seen;
    memset(&seen, 0, sizeof seen);
    ASSERT_COK(c, dlock_list(c, "adm:*", on_item, &seen));
    /* adm:plain, adm:re, adm:bin\0x, adm:pylock; not adm:noexpiry, adm:user,
     * adm:moded, adm:list */
    ASSERT_EQ(seen.n, 4);
    int ip = find(&seen, "adm:plain", 9);
    int ir = find(&seen, "adm:re", 6);
    int ib = find(&seen, bin, sizeof bin - 1);
    ASSERT_GE(ip, 0);
    ASSERT_GE(ir, 0);
    ASSERT_GE(ib, 0);
    ASSERT_GE(find(&seen, "adm:pylock", 10), 0);
    ASSERT_LT(find(&seen, "adm:noexpiry", 12), 0);
    ASSERT_LT(find(&seen, "adm:user", 8), 0);
    ASSERT_LT(find(&seen, "adm:list", 8), 0);
    ASSERT_EQ(seen.infos[ip].kind, DLOCK_KIND_PLAIN);
    ASSERT_STR_EQ(seen.infos[ip].holder, dlock_lock_token(p));
    ASSERT_EQ(seen.infos[ir].kind, DLOCK_KIND_REENTRANT);
    ASSERT_EQ(seen.infos[ir].hold_count, 1);
    ASSERT_EQ(seen.infos[ib].kind, DLOCK_KIND_REENTRANT);

    /* NULL pattern: everything that looks like a lock; never a fence counter */
    memset(&seen, 0, sizeof seen);
    ASSERT_COK(c, dlock_list(c, NULL, on_item, &seen));
    ASSERT_GE(seen.n, 4);
    for (int i = 0; i < seen.n && i < MAX_SEEN; i++)
        ASSERT_MSG(strncmp(seen.names[i], "redisson_lock_token:", 20) != 0,
                   "listed a fence counter: %s", seen.names[i]);
    ASSERT_GE(th_cmd_int(rc, "EXISTS redisson_lock_token:{adm:plain}"), 1);

    /* the callback can stop the listing */
    memset(&seen, 0, sizeof seen);
    seen.stop_after = 1;
    ASSERT_COK(c, dlock_list(c, "adm:*", on_item, &seen));
    ASSERT_EQ(seen.n, 1);

    /* no match */
    memset(&seen, 0, sizeof seen);
    ASSERT_COK(c, dlock_list(c, "nothing:here:*", on_item, &seen));
    ASSERT_EQ(seen.n, 0);

    ASSERT_LOK(b, dlock_release(b));
    ASSERT_LOK(r, dlock_release(r));
    ASSERT_LOK(p, dlock_release(p));
    dlock_lock_free(b);
    dlock_lock_free(r);
    dlock_lock_free(p);

    /* server facts */
    char buf[64];
    ASSERT_COK(c, dlock_server_fact(c, "maxmemory-policy", buf, sizeof buf));
    ASSERT_STR_EQ(buf, "noeviction");
    ASSERT_COK(c, dlock_server_fact(c, "info:replication:role", buf, sizeof buf));
    ASSERT_STR_EQ(buf, "master");

    redisFree(rc);
    dlock_client_free(other);
    dlock_client_free(c);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
