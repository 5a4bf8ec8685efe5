/* The async API's watchdog (include/dlock_async.h, "The watchdog") on real
 * event loops (tests/async_loop.c) and real servers. argv[1] is
 * "<case>_<loop>".
 *
 *   kept     DLOCK_WATCHDOG holds (every kind; 300 plain at once) outlive
 *            their lease many times over, renewed in batches (far fewer
 *            script calls than holds); a blocking client finds them held;
 *            an extend makes a hold an explicit-lease one; no loss told
 *   taken    a hold overwritten or deleted by another client is found
 *            lost (DLOCK_LOST_TAKEN) within a renewal period, once; its
 *            release is DLOCK_ELOST; a lost callback may free its handle
 *   cut      a holder behind a proxy that is frozen or killed: the lost
 *            callback (DLOCK_LOST_UNREACHABLE) runs before a blocking
 *            client trying every millisecond gets the lock
 *   restart  the server restarted empty under a hold: found lost; the
 *            client works again; a client freed with holds and a round
 *            out leaks nothing and leaves the holds to run out
 *   counter  exact-counter exclusion through sections three times as long
 *            as the watchdog lease: async and blocking watchdog holders
 *            mixed on one name, each a GET, a pause, a SET + 1
 *   permits  a DLOCK_WATCHDOG permit kept over 3 leases (a blocking client
 *            finds none available), renewed no more once released by id
 *            (no loss told after), made an explicit-lease one by a renewal
 *            (it runs out, no loss told); permits whose lease key is
 *            overwritten found lost (DLOCK_LOST_TAKEN) with their ids,
 *            once; a lost callback may free its handle
 *   pmcounter exact-counter exclusion through a permit semaphore of 1
 *            permit, watchdog permits held three leases each, async and
 *            blocking holders mixed; first with 2 permits, where the same
 *            check must fail (both first holders inside at once) */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "async_loop.h"

static dlock_async_client *wd_client(const char *url, int64_t lease_ms) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.watchdog_lease_ms = lease_ms;
    dlock_async_client *c = NULL;
    int rc = client_new_opts(&o, &c);
    ASSERT_MSG(rc == DLOCK_OK, "client: %s", dlock_async_errmsg(c));
    return c;
}

typedef struct lostrec {
    int calls, reason;
    int64_t at;
    int free_it; /* the callback frees the handle */
} lostrec;

static void on_lost(dlock_async_lock *l, int reason, void *ud) {
    lostrec *r = ud;
    r->calls++;
    r->reason = reason;
    r->at = th_now_ms();
    if (r->free_it) dlock_async_lock_free(l);
}

static long long evalsha_calls(redisContext *rc) {
    char *s = th_cmd_str(rc, "INFO commandstats");
    const char *p = strstr(s, "cmdstat_evalsha:calls=");
    long long n = p ? atoll(p + strlen("cmdstat_evalsha:calls=")) : 0;
    free(s);
    return n;
}

/* ---- kept ---- */

#define KEPT_LEASE 1500
#define MANY 300

static void t_kept(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = wd_client(th_server_url(s), KEPT_LEASE);
    lostrec lost = {0};
    dlock_async_lock *p = alock(c, "wd-plain"), *r = NULL;
    ASSERT_OK(dlock_async_lock_new(c, "wd-re", DLOCK_CSTR, DLOCK_KIND_REENTRANT, &r));
    dlock_async_lock_on_lost(p, on_lost, &lost);
    dlock_async_lock_on_lost(r, on_lost, &lost);
    res rp = {0}, r1 = {0}, r2 = {0};
    hold(p, DLOCK_WATCHDOG, &rp);
    hold(r, DLOCK_WATCHDOG, &r1);
    hold(r, 100, &r2); /* a re-entry with a short lease stays kept */
    ASSERT_GT(rp.fence, 0);
    ASSERT_LE(th_cmd_int(rc, "PTTL wd-plain"), KEPT_LEASE);
    ASSERT_GT(th_cmd_int(rc, "PTTL wd-plain"), KEPT_LEASE - 500);
    /* the fair and the write lock's holds too (their kinds' renewals) */
    dlock_async_lock *fl = NULL, *wl = NULL, *rl = NULL;
    ASSERT_OK(dlock_async_lock_new(c, "wd-fair", DLOCK_CSTR, DLOCK_KIND_FAIR, &fl));
    ASSERT_OK(dlock_async_lock_new(c, "wd-rw", DLOCK_CSTR, DLOCK_KIND_WRITE, &wl));
    ASSERT_OK(dlock_async_lock_new(c, "wd-rd", DLOCK_CSTR, DLOCK_KIND_READ, &rl));
    dlock_async_lock_on_lost(fl, on_lost, &lost);
    dlock_async_lock_on_lost(wl, on_lost, &lost);
    dlock_async_lock_on_lost(rl, on_lost, &lost);
    res rf = {0}, rwr = {0}, rrd = {0};
    hold(fl, DLOCK_WATCHDOG, &rf);
    hold(wl, DLOCK_WATCHDOG, &rwr);
    hold(rl, DLOCK_WATCHDOG, &rrd);
    dlock_async_lock *m[MANY];
    res mr[MANY];
    memset(mr, 0, sizeof mr);
    for (int i = 0; i < MANY; i++) {
        char nm[24];
        snprintf(nm, sizeof nm, "wd-many%d", i);
        m[i] = alock(c, nm);
        dlock_async_lock_on_lost(m[i], on_lost, &lost);
        START(dlock_async_acquire(m[i], DLOCK_NOWAIT, DLOCK_WATCHDOG, on_done, &mr[i]));
    }
    RUN_UNTIL(calls(mr, MANY) == MANY, 5000);
    for (int i = 0; i < MANY; i++) ASSERT_CODE(mr[i].code, DLOCK_OK);

    /* three leases: each hold is renewed about nine times */
    long long before = evalsha_calls(rc);
    run_for(3 * KEPT_LEASE);
    long long used = evalsha_calls(rc) - before;
    th_log("%d holds over 3 leases: %lld script calls by SHA", MANY + 5, used);
    /* one call per script per 100 holds per round (some rounds go by EVAL
     * once per connection): 9 rounds of 8 calls at most, against 2,745 for
     * one call per hold */
    ASSERT_LT(used, 9 * 8 + 20);
    ASSERT_GT(used, 0);
    ASSERT_EQ(lost.calls, 0);
    ASSERT_GT(th_cmd_int(rc, "PTTL wd-plain"), KEPT_LEASE / 2);
    ASSERT_GT(th_cmd_int(rc, "PTTL wd-re"), KEPT_LEASE / 2);
    for (int i = 0; i < MANY; i++) ASSERT_GT(th_cmd_int(rc, "PTTL wd-many%d", i), 0);
    ASSERT_GT(th_cmd_int(rc, "PTTL wd-fair"), KEPT_LEASE / 2);
    ASSERT_GT(th_cmd_int(rc, "PTTL wd-rw"), KEPT_LEASE / 2);
    ASSERT_GT(th_cmd_int(rc, "PTTL wd-rd"), KEPT_LEASE / 2);
    /* a blocking writer finds the read hold kept */
    dlock_client *wc = th_client(s, 0);
    dlock_lock *bw = th_lock(wc, "wd-rd", DLOCK_KIND_WRITE);
    ASSERT_LCODE(bw, dlock_acquire(bw, DLOCK_NOWAIT, 1000, NULL), DLOCK_EBUSY);
    res frel = {0}, wrel = {0}, rdrel = {0};
    START(dlock_async_release(fl, on_done, &frel));
    START(dlock_async_release(wl, on_done, &wrel));
    START(dlock_async_release(rl, on_done, &rdrel));
    WAIT_DONE(frel, 3000);
    WAIT_DONE(wrel, 3000);
    WAIT_DONE(rdrel, 3000);
    ASSERT_CODE(frel.code, DLOCK_OK);
    ASSERT_CODE(wrel.code, DLOCK_OK);
    ASSERT_CODE(rdrel.code, DLOCK_OK);
    ASSERT_LOK(bw, dlock_acquire(bw, DLOCK_NOWAIT, 1000, NULL));
    ASSERT_LOK(bw, dlock_release(bw));
    dlock_lock_free(bw);
    dlock_client_free(wc);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS wd-fair"), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS wd-rw"), 0);
    ASSERT_GT(dlock_async_lock_valid_ms(p), KEPT_LEASE / 3);
    ASSERT_EQ(dlock_async_lock_is_lost(p), 0);

    /* a blocking client finds it held */
    dlock_client *bc = th_client(s, 0);
    dlock_lock *bl = th_lock(bc, "wd-plain", DLOCK_KIND_PLAIN);
    ASSERT_LCODE(bl, dlock_acquire(bl, DLOCK_NOWAIT, 1000, NULL), DLOCK_EBUSY);

    /* the reentrant hold: two releases end it */
    res rel = {0};
    START(dlock_async_release(r, on_done, &rel));
    WAIT_DONE(rel, 3000);
    ASSERT_CODE(rel.code, DLOCK_OK);
    run_for(KEPT_LEASE); /* still kept with one hold */
    ASSERT_GT(th_cmd_int(rc, "PTTL wd-re"), KEPT_LEASE / 2);
    memset(&rel, 0, sizeof rel);
    START(dlock_async_release(r, on_done, &rel));
    WAIT_DONE(rel, 3000);
    ASSERT_CODE(rel.code, DLOCK_OK);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS wd-re"), 0);

    /* an extend makes the plain hold an explicit-lease one: it runs out */
    res ext = {0};
    START(dlock_async_extend(p, 300, on_done, &ext));
    WAIT_DONE(ext, 3000);
    ASSERT_CODE(ext.code, DLOCK_OK);
    run_for(KEPT_LEASE / 3 + 400);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS wd-plain"), 0);
    ASSERT_EQ(dlock_async_lock_valid_ms(p), 0);
    memset(&rel, 0, sizeof rel);
    START(dlock_async_release(p, on_done, &rel));
    WAIT_DONE(rel, 3000);
    ASSERT_CODE(rel.code, DLOCK_ELOST);

    /* released holds are renewed no more, and no loss is told */
    res mrel[MANY];
    memset(mrel, 0, sizeof mrel);
    for (int i = 0; i < MANY; i++) START(dlock_async_release(m[i], on_done, &mrel[i]));
    RUN_UNTIL(calls(mrel, MANY) == MANY, 5000);
    for (int i = 0; i < MANY; i++) ASSERT_CODE(mrel[i].code, DLOCK_OK);
    before = evalsha_calls(rc);
    run_for(KEPT_LEASE);
    ASSERT_EQ(evalsha_calls(rc) - before, 0);
    ASSERT_EQ(lost.calls, 0);
    ASSERT_LOK(bl, dlock_acquire(bl, DLOCK_NOWAIT, 1000, NULL));
    ASSERT_LOK(bl, dlock_release(bl));
    dlock_lock_free(bl);
    dlock_client_free(bc);
    redisFree(rc);
    client_free(c);
}

/* ---- taken ---- */

#define TAKEN_LEASE 900

static void t_taken(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = wd_client(th_server_url(s), TAKEN_LEASE);
    dlock_async_lock *p = alock(c, "tk-plain"), *r = NULL, *f = alock(c, "tk-free");
    ASSERT_OK(dlock_async_lock_new(c, "tk-re", DLOCK_CSTR, DLOCK_KIND_REENTRANT, &r));
    lostrec lp = {0}, lr = {0}, lf = {.free_it = 1};
    dlock_async_lock_on_lost(p, on_lost, &lp);
    dlock_async_lock_on_lost(r, on_lost, &lr);
    dlock_async_lock_on_lost(f, on_lost, &lf);
    res a = {0}, b = {0}, d = {0};
    hold(p, DLOCK_WATCHDOG, &a);
    hold(r, DLOCK_WATCHDOG, &b);
    hold(f, DLOCK_WATCHDOG, &d);
    run_for(TAKEN_LEASE / 2);
    /* another client writes over the plain hold, deletes the reentrant one */
    int64_t t = th_now_ms();
    th_cmd_ok(rc, "SET tk-plain intruder PX 60000");
    th_cmd_int(rc, "DEL tk-re");
    th_cmd_int(rc, "DEL tk-free");
    RUN_UNTIL(lp.calls && lr.calls && lf.calls, 3000);
    th_log("taken: told %lld and %lld ms after the overwrite", (long long)(lp.at - t),
           (long long)(lr.at - t));
    /* within a renewal period (and some slack for a loaded machine) */
    ASSERT_LT(lp.at - t, TAKEN_LEASE / 3 + 400);
    ASSERT_EQ(lp.reason, DLOCK_LOST_TAKEN);
    ASSERT_EQ(lr.reason, DLOCK_LOST_TAKEN);
    ASSERT_EQ(lf.reason, DLOCK_LOST_TAKEN);
    ASSERT_EQ(dlock_async_lock_is_lost(p), 1);
    ASSERT_EQ(dlock_async_lock_valid_ms(p), 0);
    ASSERT_EQ(dlock_async_lock_valid_ms(r), 0);
    /* told once: renewed no more */
    run_for(TAKEN_LEASE);
    ASSERT_EQ(lp.calls, 1);
    ASSERT_EQ(lr.calls, 1);
    ASSERT_EQ(lf.calls, 1);
    /* the intruder's key is left alone */
    char *v = th_cmd_str(rc, "GET tk-plain");
    ASSERT_STR_EQ(v, "intruder");
    free(v);
    res rel = {0};
    START(dlock_async_release(p, on_done, &rel));
    WAIT_DONE(rel, 3000);
    ASSERT_CODE(rel.code, DLOCK_ELOST);
    ASSERT_EQ(dlock_async_lock_is_lost(p), 0);
    /* a reentrant handle found lost takes the lock again */
    res again = {0};
    hold(r, DLOCK_WATCHDOG, &again);
    ASSERT_EQ(dlock_async_lock_is_lost(r), 0);
    run_for(TAKEN_LEASE);
    ASSERT_GT(th_cmd_int(rc, "PTTL tk-re"), TAKEN_LEASE / 3);
    ASSERT_EQ(lr.calls, 1);
    redisFree(rc);
    client_free(c);
}

/* ---- cut ---- */

#define CUT_LEASE 1000

typedef struct taker {
    const th_server *s;
    const char *name;
    atomic_llong start;  /* th_now_ms when to begin; 0: not yet */
    atomic_llong got_at; /* when it got the lock; -1: never */
} taker;

/* Tries the lock every millisecond for 3 leases once told to start. */
static void *take_soon(void *arg) {
    taker *t = arg;
    dlock_client *c = th_client(t->s, 0);
    dlock_lock *w = th_lock(c, t->name, DLOCK_KIND_PLAIN);
    while (!atomic_load(&t->start)) th_sleep_ms(1);
    long long got = -1;
    while (th_now_ms() - atomic_load(&t->start) < 3 * CUT_LEASE) {
        int rc = dlock_acquire(w, DLOCK_NOWAIT, 5000, NULL);
        if (rc == DLOCK_OK) {
            got = th_now_ms();
            ASSERT_LOK(w, dlock_release(w));
            break;
        }
        ASSERT_LCODE(w, rc, DLOCK_EBUSY);
        th_sleep_ms(1);
    }
    atomic_store(&t->got_at, got);
    dlock_lock_free(w);
    dlock_client_free(c);
    return NULL;
}

static void cut_off(th_server *s, pid_t proxy, int pport, int sig, const char *name) {
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", pport);
    dlock_async_client *c = wd_client(url, CUT_LEASE);
    dlock_async_lock *h = alock(c, name);
    lostrec lost = {0};
    dlock_async_lock_on_lost(h, on_lost, &lost);
    res a = {0};
    hold(h, DLOCK_WATCHDOG, &a);
    taker t = {.s = s, .name = name};
    atomic_store(&t.got_at, 0);
    pthread_t th;
    pthread_create(&th, NULL, take_soon, &t);
    run_for(CUT_LEASE / 2); /* a renewal or so */
    ASSERT_EQ(kill(proxy, sig), 0);
    int64_t t_cut = th_now_ms();
    atomic_store(&t.start, t_cut);
    RUN_UNTIL(atomic_load(&t.got_at) != 0, 4 * CUT_LEASE);
    pthread_join(th, NULL);
    long long got = atomic_load(&t.got_at);
    th_log("%s (proxy %s): lost callback %lld ms after the cut, another client acquired after "
           "%lld ms (%lld ms later)",
           name, sig == SIGKILL ? "killed" : "frozen", (long long)(lost.at - t_cut),
           got - (long long)t_cut, got - (long long)lost.at);
    ASSERT_GT(got, 0);
    ASSERT_EQ(lost.calls, 1);
    ASSERT_EQ(lost.reason, DLOCK_LOST_UNREACHABLE);
    ASSERT_LT(lost.at, got);
    ASSERT_EQ(dlock_async_lock_valid_ms(h), 0);
    if (sig == SIGSTOP) kill(proxy, SIGKILL);
    th_wait_child(proxy, 5000);
    client_free(c);
}

static void t_cut(th_server *s) {
    /* the proxies first: no thread may exist at a fork */
    int kport = 0, fport = 0;
    pid_t killed = th_proxy_start(th_server_port(s), &kport);
    pid_t frozen = th_proxy_start(th_server_port(s), &fport);
    cut_off(s, killed, kport, SIGKILL, "cut-killed");
    cut_off(s, frozen, fport, SIGSTOP, "cut-frozen");
}

/* ---- restart ---- */

static void t_restart(th_server *s) {
    dlock_async_client *c = wd_client(th_server_url(s), 900);
    dlock_async_lock *h = alock(c, "rs");
    lostrec lost = {0};
    dlock_async_lock_on_lost(h, on_lost, &lost);
    res a = {0};
    hold(h, DLOCK_WATCHDOG, &a);
    run_for(300);
    th_server_restart(s, SIGKILL); /* no persistence: the hold is gone */
    RUN_UNTIL(lost.calls == 1, 3000);
    th_log("restart: lost (%s)", lost.reason == DLOCK_LOST_TAKEN ? "taken" : "unreachable");
    ASSERT(lost.reason == DLOCK_LOST_TAKEN || lost.reason == DLOCK_LOST_UNREACHABLE);
    res rel = {0};
    START(dlock_async_release(h, on_done, &rel));
    WAIT_DONE(rel, 3000);
    ASSERT_CODE(rel.code, DLOCK_ELOST);
    /* the client works again, and keeps a new hold */
    memset(&a, 0, sizeof a);
    hold(h, DLOCK_WATCHDOG, &a);
    run_for(1200);
    ASSERT_EQ(lost.calls, 1);
    redisContext *rc = th_redis(s);
    ASSERT_GT(th_cmd_int(rc, "PTTL rs"), 0);

    /* freed with holds and a round out: nothing leaks; the holds run out */
    dlock_async_client *f = wd_client(th_server_url(s), 300);
    enum { N = 150 };
    dlock_async_lock *l[N];
    res lr[N];
    memset(lr, 0, sizeof lr);
    for (int i = 0; i < N; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "rs%d", i);
        l[i] = alock(f, nm);
        START(dlock_async_acquire(l[i], DLOCK_NOWAIT, DLOCK_WATCHDOG, on_done, &lr[i]));
    }
    RUN_UNTIL(calls(lr, N) == N, 3000);
    for (int i = 0; i < N; i++) ASSERT_CODE(lr[i].code, DLOCK_OK);
    run_for(250);
    client_free(f);
    th_sleep_ms(400);
    for (int i = 0; i < N; i++) ASSERT_EQ(th_cmd_int(rc, "EXISTS rs%d", i), 0);
    redisFree(rc);
    client_free(c);
}

/* ---- counter ---- */

#define CT_LEASE 300         /* the watchdog lease, renewed every 100 ms */
#define CT_SECTION 900       /* each section: three leases */
#define CT_ASYNC 3
#define CT_BLOCKING 2
#define CT_ROUNDS 2

typedef struct ctworker {
    dlock_async_lock *l;
    redisContext *rc;
    long long seen;
    int done, in;
    lostrec lost;
} ctworker;
static ctworker ctw[CT_ASYNC];
static atomic_int ct_inside, ct_overlap;
static void ct_next(ctworker *w);

static void ct_released(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)l, (void)f;
    ctworker *w = ud;
    ASSERT_CODE(code, DLOCK_OK);
    if (++w->done < CT_ROUNDS) ct_next(w);
}

/* the section's end: write what was read + 1, leave, release */
static void ct_write(void *arg) {
    ctworker *w = arg;
    ASSERT_GT(dlock_async_lock_valid_ms(w->l), 0);
    th_cmd_ok(w->rc, "SET wdcounter %lld", w->seen + 1);
    atomic_fetch_sub(&ct_inside, 1);
    START(dlock_async_release(w->l, ct_released, w));
}

static void ct_got(dlock_async_lock *l, int code, uint64_t f, void *ud) {
    (void)l, (void)f;
    ctworker *w = ud;
    ASSERT_CODE(code, DLOCK_OK);
    if (atomic_fetch_add(&ct_inside, 1) != 0) atomic_store(&ct_overlap, 1);
    char *v = th_cmd_str(w->rc, "GET wdcounter");
    w->seen = v ? atoll(v) : 0;
    free(v);
    after(CT_SECTION, ct_write, w); /* the loop turns meanwhile: renewals */
}

static void ct_next(ctworker *w) {
    START(dlock_async_acquire(w->l, DLOCK_WAIT_FOREVER, DLOCK_WATCHDOG, ct_got, w));
}

static void *ct_thread(void *arg) {
    const th_server *s = arg;
    dlock_client *c = th_client(s, CT_LEASE);
    dlock_lock *l = th_lock(c, "wdcounter-lock", DLOCK_KIND_PLAIN);
    redisContext *rc = th_redis(s);
    for (int i = 0; i < CT_ROUNDS; i++) {
        ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, DLOCK_WATCHDOG, NULL));
        if (atomic_fetch_add(&ct_inside, 1) != 0) atomic_store(&ct_overlap, 1);
        char *v = th_cmd_str(rc, "GET wdcounter");
        long long n = v ? atoll(v) : 0;
        free(v);
        th_sleep_ms(CT_SECTION);
        ASSERT_GT(dlock_lock_valid_ms(l), 0);
        th_cmd_ok(rc, "SET wdcounter %lld", n + 1);
        atomic_fetch_sub(&ct_inside, 1);
        ASSERT_LOK(l, dlock_release(l));
    }
    redisFree(rc);
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

static void t_counter(th_server *s) {
    redisContext *rc = th_redis(s);
    th_cmd_ok(rc, "SET wdcounter 0");
    dlock_async_client *c = wd_client(th_server_url(s), CT_LEASE);
    pthread_t th[CT_BLOCKING];
    for (int i = 0; i < CT_BLOCKING; i++) pthread_create(&th[i], NULL, ct_thread, s);
    for (int i = 0; i < CT_ASYNC; i++) {
        ctw[i].l = alock(c, "wdcounter-lock");
        ctw[i].rc = th_redis(s);
        dlock_async_lock_on_lost(ctw[i].l, on_lost, &ctw[i].lost);
        ct_next(&ctw[i]);
    }
    int want = (CT_ASYNC + CT_BLOCKING) * CT_ROUNDS;
    int64_t dl = th_now_ms() + want * CT_SECTION * 3 + 10000;
    for (;;) {
        int all = 1;
        for (int i = 0; i < CT_ASYNC; i++) all &= ctw[i].done == CT_ROUNDS;
        if (all) break;
        ASSERT_LT(th_now_ms(), dl);
        loop_once();
    }
    for (int i = 0; i < CT_BLOCKING; i++) pthread_join(th[i], NULL);
    char *tv = th_cmd_str(rc, "GET wdcounter");
    long long total = atoll(tv);
    free(tv);
    th_log("counter %lld, want %d (sections of %d ms, leases of %d ms)", total, want,
           CT_SECTION, CT_LEASE);
    ASSERT_EQ(atomic_load(&ct_overlap), 0);
    ASSERT_EQ(total, want);
    for (int i = 0; i < CT_ASYNC; i++) {
        ASSERT_EQ(ctw[i].lost.calls, 0);
        redisFree(ctw[i].rc);
    }
    redisFree(rc);
    client_free(c);
}

/* ---- permits ---- */

#define PM_LEASE 300

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

/* runs an operation started by expr to its end */
#define RUN_OP(r, expr)                                                                       \
    do {                                                                                      \
        memset(&(r), 0, sizeof(r));                                                           \
        START(expr);                                                                          \
        RUN_UNTIL((r).calls > 0, 5000);                                                       \
        ASSERT_EQ((r).calls, 1);                                                              \
    } while (0)

typedef struct pmlost {
    int calls, reason;
    char id[DLOCK_PERMIT_ID_LEN + 1];
    int64_t at;
    int free_it; /* the callback frees the handle */
} pmlost;

static void on_pm_lost(dlock_async_object *o, const char *id, int reason, void *ud) {
    pmlost *r = ud;
    r->calls++;
    r->reason = reason;
    snprintf(r->id, sizeof r->id, "%s", id);
    r->at = th_now_ms();
    if (r->free_it) dlock_async_object_free(o);
}

static dlock_async_object *apermits(dlock_async_client *c, const char *name) {
    dlock_async_object *o = NULL;
    ASSERT_MSG(dlock_async_permits_new(c, name, DLOCK_CSTR, &o) == DLOCK_OK, "%s",
               dlock_async_errmsg(c));
    return o;
}

static void t_permits(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = wd_client(th_server_url(s), PM_LEASE);
    dlock_async_object *o = apermits(c, "wdpm"), *f = apermits(c, "wdpm");
    pmlost lo = {0}, lf = {.free_it = 1};
    dlock_async_object_on_lost(o, on_pm_lost, &lo);
    dlock_async_object_on_lost(f, on_pm_lost, &lf);
    dlock_client *bc = th_client(s, 0);
    dlock_permits *bp = NULL;
    ASSERT_OK(dlock_permits_new(bc, "wdpm", DLOCK_CSTR, &bp));
    int set = 0;
    ASSERT_OK(dlock_permits_try_set(bp, 1, &set));
    ores r;
    char id[DLOCK_PERMIT_ID_LEN + 1], bid[DLOCK_PERMIT_ID_LEN + 1];

    /* kept over three leases: the blocking client finds no permit, and
     * none comes back by expiry */
    RUN_OP(r, dlock_async_permits_acquire(o, DLOCK_NOWAIT, DLOCK_WATCHDOG, on_obj, &r));
    ASSERT_OK(r.code);
    snprintf(id, sizeof id, "%s", dlock_async_permits_id(o));
    ASSERT_LE(th_cmd_int(rc, "EVAL %s 1 {wdpm}:timeout",
                         "local t = redis.call('time') "
                         "local s = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES') "
                         "return tonumber(s[2]) - (t[1] * 1000 + math.floor(t[2] / 1000))"),
              PM_LEASE);
    run_for(3 * PM_LEASE + 100);
    int64_t av = -1;
    ASSERT_OK(dlock_permits_available(bp, &av)); /* returns expired ones first */
    ASSERT_EQ(av, 0);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD {wdpm}:timeout"), 1);
    ASSERT_CODE(dlock_permits_acquire(bp, DLOCK_NOWAIT, 1000, bid), DLOCK_EBUSY);
    ASSERT_EQ(lo.calls, 0);
    /* released by id: renewed no more (a renewal would find it gone and
     * tell it lost) */
    RUN_OP(r, dlock_async_permits_release(o, id, on_obj, &r));
    ASSERT_OK(r.code);
    long long before = evalsha_calls(rc);
    run_for(PM_LEASE + 100);
    ASSERT_EQ(evalsha_calls(rc) - before, 0);
    ASSERT_EQ(lo.calls, 0);
    ASSERT_OK(dlock_permits_available(bp, &av));
    ASSERT_EQ(av, 1);

    /* an explicit renewal makes it an explicit-lease permit: it runs out,
     * and no loss is told */
    RUN_OP(r, dlock_async_permits_acquire(o, DLOCK_NOWAIT, DLOCK_WATCHDOG, on_obj, &r));
    ASSERT_OK(r.code);
    snprintf(id, sizeof id, "%s", dlock_async_permits_id(o));
    RUN_OP(r, dlock_async_permits_renew(o, id, 200, on_obj, &r));
    ASSERT_OK(r.code);
    run_for(PM_LEASE + 200);
    ASSERT_OK(dlock_permits_available(bp, &av));
    ASSERT_EQ(av, 1);
    ASSERT_EQ(lo.calls, 0);

    /* taken: two watchdog permits (two handles), their lease key
     * overwritten by another client */
    ASSERT_OK(dlock_permits_add(bp, 1));
    char id2[DLOCK_PERMIT_ID_LEN + 1], id3[DLOCK_PERMIT_ID_LEN + 1];
    RUN_OP(r, dlock_async_permits_acquire(o, DLOCK_NOWAIT, DLOCK_WATCHDOG, on_obj, &r));
    ASSERT_OK(r.code);
    snprintf(id2, sizeof id2, "%s", dlock_async_permits_id(o));
    RUN_OP(r, dlock_async_permits_acquire(f, DLOCK_NOWAIT, DLOCK_WATCHDOG, on_obj, &r));
    ASSERT_OK(r.code);
    snprintf(id3, sizeof id3, "%s", dlock_async_permits_id(f));
    run_for(PM_LEASE / 2);
    ASSERT_EQ(lo.calls + lf.calls, 0);
    int64_t t = th_now_ms();
    th_cmd_ok(rc, "SET {wdpm}:timeout intruder");
    RUN_UNTIL(lo.calls && lf.calls, 3000);
    th_log("permits taken: told %lld and %lld ms after the overwrite", (long long)(lo.at - t),
           (long long)(lf.at - t));
    ASSERT_LT(lo.at - t, PM_LEASE / 3 + 400);
    ASSERT_EQ(lo.reason, DLOCK_LOST_TAKEN);
    ASSERT_EQ(lf.reason, DLOCK_LOST_TAKEN);
    ASSERT_STR_EQ(lo.id, id2);
    ASSERT_STR_EQ(lf.id, id3);
    run_for(PM_LEASE); /* told once: renewed no more */
    ASSERT_EQ(lo.calls, 1);
    ASSERT_EQ(lf.calls, 1);
    char *v = th_cmd_str(rc, "GET {wdpm}:timeout");
    ASSERT_STR_EQ(v, "intruder");
    free(v);
    th_cmd_int(rc, "DEL {wdpm}:timeout");
    RUN_OP(r, dlock_async_permits_release(o, id2, on_obj, &r));
    ASSERT_CODE(r.code, DLOCK_ENOTOWNER);
    dlock_permits_free(bp);
    dlock_client_free(bc);
    redisFree(rc);
    client_free(c);
}

/* ---- pmcounter ---- */

#define PC_LEASE 200   /* the watchdog lease, renewed every ~67 ms */
#define PC_SECTION 600 /* each section: three leases */
#define PC_ASYNC 2
#define PC_BLOCKING 1

typedef struct pcworker {
    dlock_async_object *o;
    redisContext *rc;
    long long seen;
    int done;
    pmlost lost;
    char id[DLOCK_PERMIT_ID_LEN + 1];
} pcworker;
static pcworker pcw[PC_ASYNC];
static atomic_int pc_inside, pc_overlap;
static const char *pc_name;

static void pc_released(dlock_async_object *o, int code, int64_t v, void *ud) {
    (void)o, (void)v;
    pcworker *w = ud;
    ASSERT_CODE(code, DLOCK_OK);
    w->done = 1;
}

static void pc_write(void *arg) {
    pcworker *w = arg;
    th_cmd_ok(w->rc, "SET %s-counter %lld", pc_name, w->seen + 1);
    atomic_fetch_sub(&pc_inside, 1);
    START(dlock_async_permits_release(w->o, w->id, pc_released, w));
}

static void pc_got(dlock_async_object *o, int code, int64_t v, void *ud) {
    (void)v;
    pcworker *w = ud;
    ASSERT_CODE(code, DLOCK_OK);
    snprintf(w->id, sizeof w->id, "%s", dlock_async_permits_id(o));
    if (atomic_fetch_add(&pc_inside, 1) != 0) atomic_store(&pc_overlap, 1);
    char *s = th_cmd_str(w->rc, "GET %s-counter", pc_name);
    w->seen = s ? atoll(s) : 0;
    free(s);
    after(PC_SECTION, pc_write, w); /* the loop turns meanwhile: renewals */
}

static void *pc_thread(void *arg) {
    const th_server *s = arg;
    dlock_client *c = th_client(s, PC_LEASE);
    dlock_permits *p = NULL;
    ASSERT_OK(dlock_permits_new(c, pc_name, DLOCK_CSTR, &p));
    redisContext *rc = th_redis(s);
    char id[DLOCK_PERMIT_ID_LEN + 1];
    ASSERT_OK(dlock_permits_acquire(p, DLOCK_WAIT_FOREVER, DLOCK_WATCHDOG, id));
    if (atomic_fetch_add(&pc_inside, 1) != 0) atomic_store(&pc_overlap, 1);
    char *v = th_cmd_str(rc, "GET %s-counter", pc_name);
    long long n = v ? atoll(v) : 0;
    free(v);
    th_sleep_ms(PC_SECTION);
    ASSERT_GT(dlock_permits_valid_ms(p, id), 0);
    th_cmd_ok(rc, "SET %s-counter %lld", pc_name, n + 1);
    atomic_fetch_sub(&pc_inside, 1);
    ASSERT_OK(dlock_permits_release(p, id));
    redisFree(rc);
    dlock_permits_free(p);
    dlock_client_free(c);
    return NULL;
}

/* Every holder once through a section under the permit semaphore name of
 * permits permits: the counter at the end. */
static long long pc_run(th_server *s, const char *name, int permits) {
    redisContext *rc = th_redis(s);
    pc_name = name;
    atomic_store(&pc_inside, 0);
    atomic_store(&pc_overlap, 0);
    th_cmd_ok(rc, "SET %s-counter 0", name);
    th_cmd_ok(rc, "SET %s %d", name, permits);
    dlock_async_client *c = wd_client(th_server_url(s), PC_LEASE);
    pthread_t th[PC_BLOCKING];
    for (int i = 0; i < PC_BLOCKING; i++) pthread_create(&th[i], NULL, pc_thread, s);
    memset(pcw, 0, sizeof pcw);
    for (int i = 0; i < PC_ASYNC; i++) {
        pcw[i].o = apermits(c, name);
        pcw[i].rc = th_redis(s);
        dlock_async_object_on_lost(pcw[i].o, on_pm_lost, &pcw[i].lost);
        START(dlock_async_permits_acquire(pcw[i].o, DLOCK_WAIT_FOREVER, DLOCK_WATCHDOG, pc_got,
                                          &pcw[i]));
    }
    int64_t dl = th_now_ms() + (PC_ASYNC + PC_BLOCKING) * PC_SECTION * 3 + 10000;
    for (;;) {
        int all = 1;
        for (int i = 0; i < PC_ASYNC; i++) all &= pcw[i].done;
        if (all) break;
        ASSERT_LT(th_now_ms(), dl);
        loop_once();
    }
    for (int i = 0; i < PC_BLOCKING; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < PC_ASYNC; i++) {
        ASSERT_EQ(pcw[i].lost.calls, 0);
        redisFree(pcw[i].rc);
    }
    char *tv = th_cmd_str(rc, "GET %s-counter", name);
    long long total = atoll(tv);
    free(tv);
    redisFree(rc);
    client_free(c);
    return total;
}

static void t_pmcounter(th_server *s) {
    int want = PC_ASYNC + PC_BLOCKING;
    /* 2 permits: the first two holders are inside at once, and both write
     * 1 (the check below can fail) */
    long long total = pc_run(s, "pmc2", 2);
    th_log("2 permits: counter %lld, want %d, overlap %d", total, want,
           atomic_load(&pc_overlap));
    ASSERT_EQ(atomic_load(&pc_overlap), 1);
    ASSERT_LT(total, want);
    /* 1 permit: exclusion, each section three watchdog leases long */
    total = pc_run(s, "pmc1", 1);
    th_log("1 permit: counter %lld, want %d (sections of %d ms, leases of %d ms)", total, want,
           PC_SECTION, PC_LEASE);
    ASSERT_EQ(atomic_load(&pc_overlap), 0);
    ASSERT_EQ(total, want);
}

static const async_case cases[] = {
    {"kept", t_kept},
    {"taken", t_taken},
    {"cut", t_cut},
    {"restart", t_restart},
    {"counter", t_counter},
    {"permits", t_permits},
    {"pmcounter", t_pmcounter},
    {NULL, NULL},
};

int main(int argc, char **argv) { return async_main(argc, argv, "async_watchdog", cases); }
