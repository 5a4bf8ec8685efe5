/* The async API's failures and ends (include/dlock_async.h) on real event
 * loops (tests/async_loop.c) and real servers. argv[1] is "<case>_<loop>".
 *
 *   cancel   cancel and free with operations pending: each callback once,
 *            nothing left in the waiter registry, a wake passed on; the
 *            client freed from a callback
 *   restart  the server killed with operations pending: an extend and a
 *            short wait end once with an error, longer waits wait on and
 *            are served one at a time after the restart; a paused
 *            server's wait tries again until its deadline, and the acquire
 *            it ran when it thawed is given back; the client works again
 *   badinput distinct codes for bad arguments, URLs, kinds and leases;
 *            AUTH refused and accepted, an ACL user from the URL; unix://
 *   dupreply a request the network sends twice (a proxy doubles it): its
 *            second reply, read with the first, is not taken for the reply
 *            of a request queued by the first's callback (found by the
 *            fault explorer's async workers, issue 24) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "async_loop.h"

/* ---- cancel and free ---- */

static dlock_async_client *freeing;

/* a callback that cancels cancel_on_done's operation */
static dlock_async_lock *cancel_on_done;
static void cancel_cb(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    on_done(l, code, fence, ud);
    ASSERT_OK(dlock_async_cancel(cancel_on_done));
}

/* a callback that frees its client */
static void free_client_cb(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    on_done(l, code, fence, ud);
    forget(freeing);
    dlock_async_client_free(freeing);
}

static void t_cancel(th_server *s) {
    redisContext *rc = th_redis(s);
    dlock_async_client *c = client(s);
    dlock_async_lock *h = alock(c, "cx");
    res hr = {0};
    hold(h, 20000, &hr);
    enum { N = 10 };
    dlock_async_lock *w[N];
    res wr[N];
    memset(wr, 0, sizeof wr);
    for (int i = 0; i < N; i++) {
        w[i] = alock(c, "cx");
        START(dlock_async_acquire(w[i], i % 2 ? 20000 : DLOCK_WAIT_FOREVER, 20000, on_done,
                                  &wr[i]));
    }
    /* cancel one at once (its attempt is still out), the others once registered */
    ASSERT_OK(dlock_async_cancel(w[0]));
    ASSERT_EQ(wr[0].calls, 1);
    ASSERT_CODE(wr[0].code, DLOCK_ECANCELED);
    ASSERT(strstr(dlock_async_lock_errmsg(w[0]), "cancelled"));
    ASSERT_CODE(dlock_async_cancel(w[0]), DLOCK_ENOTHELD);
    RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{cx}") == N - 1, 5000);
    for (int i = 1; i < N / 2; i++) ASSERT_OK(dlock_async_cancel(w[i]));
    run_for(200);
    ASSERT_EQ(th_cmd_int(rc, "ZCARD dlock_waiters:{cx}"), N - N / 2);
    /* a freed handle's wait ends once too */
    dlock_async_lock_free(w[N / 2]);
    ASSERT_EQ(wr[N / 2].calls, 1);
    ASSERT_CODE(wr[N / 2].code, DLOCK_ECANCELED);

    /* a blocking waiter behind them; the async waiters are cancelled by
     * the client's free, the holder's lease stays: the blocking waiter
     * gets the lock at its end, or when the holder's key goes */
    res rel = {0};
    START(dlock_async_release(h, on_done, &rel)); /* pending at the free */
    forget(c);
    dlock_async_client_free(c);
    for (int i = 0; i < 3; i++) loop_once();
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(wr[i].calls, 1);
        ASSERT_CODE(wr[i].code, DLOCK_ECANCELED);
    }
    ASSERT_EQ(rel.calls, 1);
    ASSERT_CODE(rel.code, DLOCK_ECANCELED);
    ASSERT_EQ(hr.calls, 1);
    /* what the server has left: the registry expires 6 s after the last
     * attempt at most; entries of dead waiters are skipped by a release */
    ASSERT_LE(th_cmd_int(rc, "ZCARD dlock_waiters:{cx}"), N);

    /* a woken waiter that is cancelled passes the wake on: a blocking
     * waiter behind it gets the lock at the release, not at the backstop */
    th_cmd_ok(rc, "DEL cx dlock_waiters:{cx}");
    c = client(s);
    dlock_async_lock *h2 = alock(c, "cy"), *w2 = alock(c, "cy");
    res h2r = {0}, w2r = {0}, r2 = {0};
    START(dlock_async_acquire(h2, DLOCK_NOWAIT, 20000, on_done, &h2r));
    WAIT_DONE(h2r, 3000);
    START(dlock_async_acquire(w2, DLOCK_WAIT_FOREVER, 20000, on_done, &w2r));
    RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{cy}") == 1, 3000);
    blocker b = {.s = s, .name = "cy", .hold_ms = 0};
    pthread_t th;
    pthread_create(&th, NULL, blocking_holder, &b);
    RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{cy}") == 2, 3000);
    /* the cancel from the release's callback: the wake is in flight, or
     * the attempt it caused is (its reply may be read with the release's,
     * and is then an orphan whose lock is given back) */
    cancel_on_done = w2;
    START(dlock_async_release(h2, cancel_cb, &r2));
    WAIT_DONE(r2, 3000);
    ASSERT_CODE(r2.code, DLOCK_OK);
    ASSERT_EQ(w2r.calls, 1);
    ASSERT_CODE(w2r.code, DLOCK_ECANCELED);
    int64_t t0 = th_now_ms();
    while (!atomic_load(&b.go)) loop_once();
    pthread_join(th, NULL);
    th_log("wake passed on in %lld ms", (long long)(b.acquired_at - t0));
    ASSERT_LT(b.acquired_at - t0, 1000);
    client_free(c);

    /* the client freed from a callback (a release's, then a cancel's),
     * with operations pending: each ends once */
    for (int how = 0; how < 2; how++) {
        c = client(s);
        freeing = c;
        dlock_async_lock *fh = alock(c, "cz"), *fw[3];
        res fhr = {0}, fwr[3], frel = {0};
        memset(fwr, 0, sizeof fwr);
        hold(fh, 20000, &fhr);
        for (int i = 0; i < 3; i++) {
            fw[i] = alock(c, "cz");
            START(dlock_async_acquire(fw[i], DLOCK_WAIT_FOREVER, 20000,
                                      how == 1 && i == 0 ? free_client_cb : on_done, &fwr[i]));
        }
        RUN_UNTIL(th_cmd_int(rc, "ZCARD dlock_waiters:{cz}") == 3, 3000);
        if (how == 0) {
            START(dlock_async_release(fh, free_client_cb, &frel));
            RUN_UNTIL(frel.calls == 1, 3000);
            ASSERT_CODE(frel.code, DLOCK_OK);
        } else {
            ASSERT_OK(dlock_async_cancel(fw[0]));
        }
        for (int i = 0; i < 3; i++) {
            ASSERT_EQ(fwr[i].calls, 1);
            ASSERT_CODE(fwr[i].code, DLOCK_ECANCELED);
        }
        for (int i = 0; i < 3; i++) loop_once(); /* the adapter's handles close */
        th_cmd_ok(rc, "DEL cz dlock_waiters:{cz}");
    }
    redisFree(rc);
}

/* ---- restart ---- */

/* the winner among waiters served after an outage: counts, releases */
static int rs_holders, rs_max, rs_served;
static void rs_won(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    on_done(l, code, fence, ud);
    if (code != DLOCK_OK) return;
    rs_served++;
    if (++rs_holders > rs_max) rs_max = rs_holders;
    rs_holders--;
    res *r = ud;
    r->calls = 0; /* counted again by the release */
    ASSERT_OK(dlock_async_release(l, on_done, r));
}

static void t_restart(th_server *s) {
    dlock_async_client *c = client(s);
    enum { W = 5 };
    dlock_async_lock *h = alock(c, "rs"), *w[W + 1];
    res hr = {0}, wr[W + 1], ex = {0};
    memset(wr, 0, sizeof wr);
    hold(h, 60000, &hr);
    /* five waiters that outlast the outage (three for ever), one that does
     * not (1.5 s) */
    for (int i = 0; i <= W; i++) {
        w[i] = alock(c, "rs");
        int64_t wait = i < 3 ? DLOCK_WAIT_FOREVER : i < W ? 30000 : 1500;
        START(dlock_async_acquire(w[i], wait, 5000, rs_won, &wr[i]));
    }
    run_for(200);
    START(dlock_async_extend(h, 60000, on_done, &ex));
    int64_t t_kill = th_now_ms();
    th_server_halt(s, SIGKILL);
    /* the extend ends; the waiters wait on, as blocking waits do: the one
     * whose wait ends during the outage ends then, with the failure */
    RUN_UNTIL(ex.calls == 1 && wr[W].calls == 1, 5000);
    ASSERT_CODE(ex.code, DLOCK_EIO);
    ASSERT_MSG(wr[W].code == DLOCK_EIO, "short waiter: %s (%s)", dlock_strerror(wr[W].code),
               dlock_async_lock_errmsg(w[W]));
    th_log("short waiter ended %lld ms after the kill: %s", (long long)(wr[W].at - t_kill),
           dlock_async_lock_errmsg(w[W]));
    ASSERT_GE(wr[W].at - t_kill, 1000);
    run_for(1000);
    ASSERT_EQ(calls(wr, W), 0);
    /* while it is down: a try-once fails clearly, at once or by callback */
    res down = {0};
    int rc = dlock_async_acquire(w[W], DLOCK_NOWAIT, 1000, on_done, &down);
    if (rc == DLOCK_OK) {
        WAIT_DONE(down, 3000);
        rc = down.code;
    }
    ASSERT_CODE(rc, DLOCK_EIO);
    th_server_resume(s);
    /* the server restarted empty: the waiters are served one at a time,
     * each releasing at once; the first within a pause (1 s) or so */
    int64_t t_up = th_now_ms();
    RUN_UNTIL(rs_served == W, 8000);
    RUN_UNTIL(calls(wr, W) == W, 3000); /* the releases */
    th_log("after the restart: %d waiters served in %lld ms", rs_served,
           (long long)(th_now_ms() - t_up));
    ASSERT_EQ(rs_max, 1);
    for (int i = 0; i < W; i++) ASSERT_CODE(wr[i].code, DLOCK_OK);
    /* a server that stops answering: the request's deadline (the command
     * timeout, 2 s here) ends it, by the client's own timer */
    res up = {0};
    START(dlock_async_extend(h, 1000, on_done, &up)); /* reconnects: the server is empty */
    WAIT_DONE(up, 3000);
    ASSERT_CODE(up.code, DLOCK_ELOST);
    /* the restarted server's script cache has the acquire script again, so
     * that the thawed server below runs it (rather than answer NOSCRIPT) */
    dlock_async_lock *warm = alock(c, "warm");
    res wr1 = {0}, wr2 = {0};
    hold(warm, 1000, &wr1);
    START(dlock_async_release(warm, on_done, &wr2));
    WAIT_DONE(wr2, 3000);
    th_server_pause(s);
    int64_t t1 = th_now_ms();
    res hung2 = {0};
    START(dlock_async_acquire(w[3], 5000, 30000, on_done, &hung2));
    WAIT_DONE(hung2, 9000);
    th_server_unpause(s);
    /* the wait tried again over new connections until its deadline (each
     * attempt ended by the command timeout, 2 s here), then ended with the
     * failure */
    ASSERT_CODE(hung2.code, DLOCK_EIO);
    th_log("hung server: %s after %lld ms", dlock_async_lock_errmsg(w[3]),
           (long long)(hung2.at - t1));
    ASSERT_GE(hung2.at - t1, 4900);
    ASSERT_LT(hung2.at - t1, 8500);
    /* the thawed server runs the attempts it had read (from connections
     * closed meanwhile, some behind a give back): the lock may be taken for
     * 30 s by an acquire that was reported failed */
    redisContext *raw = th_redis(s);
    run_for(300);
    th_log("after the thaw the lock is %s", th_cmd_int(raw, "EXISTS rs") ? "held" : "free");
    /* the client works again, and a 30 s hold of the acquire reported
     * failed is given back first on the new connection (else: EBUSY) */
    res again = {0};
    START(dlock_async_acquire(w[1], DLOCK_NOWAIT, 5000, on_done, &again));
    WAIT_DONE(again, 3000);
    ASSERT_MSG(again.code == DLOCK_OK, "after restart: %s", dlock_async_lock_errmsg(w[1]));
    redisFree(raw);
    res rel = {0};
    START(dlock_async_release(w[1], on_done, &rel));
    WAIT_DONE(rel, 3000);
    ASSERT_CODE(rel.code, DLOCK_OK);
    ASSERT_EQ(hr.calls, 1);
    ASSERT_EQ(up.calls + hung2.calls + again.calls + rel.calls, 4);
    client_free(c);
}

/* ---- bad input ---- */

/* A try-once acquire by a new client of url: its code. The message must
 * not contain secret (when not NULL). */
static int try_url(const char *url, const char *password, const char *secret) {
    dlock_async_client *c = NULL;
    ASSERT_OK(client_new(url, password, &c));
    dlock_async_lock *l = alock(c, "try-url");
    res r = {0};
    START(dlock_async_acquire(l, 0, 1000, on_done, &r));
    WAIT_DONE(r, 3000);
    th_log("%s: %s", dlock_strerror(r.code), dlock_async_lock_errmsg(l));
    ASSERT(!secret || !strstr(dlock_async_lock_errmsg(l), secret));
    client_free(c);
    return r.code;
}

static void t_badinput(th_server *s) {
    dlock_async_client *c = NULL;
    ASSERT_CODE(dlock_async_client_new(NULL, NULL, NULL), DLOCK_EINVAL);
    ASSERT_CODE(client_new("redis://127.0.0.1:notaport", NULL, &c), DLOCK_EINVAL);
    ASSERT(*dlock_async_errmsg(c));
    client_free(c);
    const char *unsupported[] = {"rediss://127.0.0.1:6379",
                                 "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
                                 "zk://127.0.0.1:2181"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        c = NULL;
        ASSERT_CODE(client_new(unsupported[i], NULL, &c), DLOCK_ENOTSUP);
        th_log("%s: %s", unsupported[i], dlock_async_errmsg(c));
        /* an unusable client refuses its operations */
        dlock_async_lock *l = NULL;
        ASSERT_CODE(dlock_async_lock_new(c, "x", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
        client_free(c);
    }
    /* options the async client cannot honour are refused, not ignored */
    for (int i = 0; i < 3; i++) {
        dlock_options o;
        dlock_options_init(&o);
        o.url = th_server_url(s);
        if (i == 0) { /* on one server or through Sentinel it is honoured */
            o.url = "redis-cluster://127.0.0.1:1";
            o.wait_replicas = 1;
        }
        if (i == 1) o.fence_url = th_server_url(s);
        if (i == 2) o.tls_ca_file = "/etc/ssl/certs/ca-certificates.crt";
        c = NULL;
        ASSERT_CODE(dlock_async_client_new(&o, NULL, &c), DLOCK_ENOTSUP);
        th_log("option %d: %s", i, dlock_async_errmsg(c));
        ASSERT(*dlock_async_errmsg(c));
        client_free(c);
    }
    {
        dlock_options o;
        dlock_options_init(&o);
        o.url = th_server_url(s);
        o.wait_replicas = -1;
        c = NULL;
        ASSERT_CODE(dlock_async_client_new(&o, NULL, &c), DLOCK_EINVAL);
        client_free(c);
    }
    c = client(s);
    dlock_async_lock *l = NULL;
    ASSERT_CODE(dlock_async_lock_new(NULL, "x", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_lock_new(c, "x", DLOCK_CSTR, DLOCK_KIND_PLAIN, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_lock_new(c, "", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_lock_new(c, NULL, 3, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    static char big[DLOCK_NAME_MAX + 2];
    memset(big, 'n', sizeof big - 1);
    ASSERT_CODE(dlock_async_lock_new(c, big, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l),
                DLOCK_ENAMETOOLONG);
    ASSERT_CODE(dlock_async_lock_new(c, "x", DLOCK_CSTR, DLOCK_KIND_SEMAPHORE, &l), DLOCK_ENOTSUP);
    ASSERT_CODE(dlock_async_lock_new(c, "x", DLOCK_CSTR, (dlock_kind)99, &l), DLOCK_ENOTSUP);
    l = alock(c, "bad");
    res r = {0};
    ASSERT_CODE(dlock_async_acquire(NULL, 0, 1000, on_done, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_acquire(l, 0, 1000, NULL, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_acquire(l, -2, 1000, on_done, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_acquire(l, 0, -5, on_done, &r), DLOCK_EINVAL);
    /* the watchdog's lease: at least 30 ms, as the blocking client's */
    dlock_options wo;
    dlock_options_init(&wo);
    wo.url = th_server_url(s);
    dlock_async_client *wc = NULL;
    wo.watchdog_lease_ms = 10;
    ASSERT_CODE(client_new_opts(&wo, &wc), DLOCK_EINVAL);
    ASSERT(strstr(dlock_async_errmsg(wc), "watchdog lease"));
    client_free(wc);
    wo.watchdog_lease_ms = -1;
    ASSERT_CODE(client_new_opts(&wo, &wc), DLOCK_EINVAL);
    client_free(wc);
    ASSERT_CODE(dlock_async_release(NULL, on_done, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_release(l, on_done, &r), DLOCK_ENOTHELD);
    ASSERT_CODE(dlock_async_extend(l, 1000, on_done, &r), DLOCK_ENOTHELD);
    ASSERT_CODE(dlock_async_cancel(NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_cancel(l), DLOCK_ENOTHELD);
    START(dlock_async_acquire(l, 0, 1000, on_done, &r));
    /* one operation per handle at a time */
    ASSERT_CODE(dlock_async_acquire(l, 0, 1000, on_done, &r), DLOCK_EINVAL);
    ASSERT_CODE(dlock_async_release(l, on_done, &r), DLOCK_EINVAL);
    WAIT_DONE(r, 3000);
    ASSERT_CODE(r.code, DLOCK_OK);
    ASSERT_EQ(r.calls, 1);
    ASSERT_CODE(dlock_async_acquire(l, 0, 1000, on_done, &r), DLOCK_EINVAL); /* holds */
    ASSERT_CODE(dlock_async_extend(l, 0, on_done, &r), DLOCK_EINVAL);
    dlock_async_lock_free(l); /* releases its hold */
    redisContext *rc = th_redis(s);
    RUN_UNTIL(th_cmd_int(rc, "EXISTS bad") == 0, 3000);
    dlock_async_lock_free(NULL);
    dlock_async_client_free(NULL);
    dlock_async_process(NULL, -1, 0);
    ASSERT_EQ(dlock_async_timeout(NULL), -1);
    client_free(c);

    /* nothing listens: the callback tells */
    int port = th_free_port();
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    ASSERT_OK(client_new(url, NULL, &c));
    l = alock(c, "x");
    memset(&r, 0, sizeof r);
    int code = dlock_async_acquire(l, 0, 1000, on_done, &r);
    if (!code) {
        WAIT_DONE(r, 3000);
        code = r.code;
    }
    ASSERT_CODE(code, DLOCK_EIO);
    th_log("refused: %s", dlock_async_lock_errmsg(l));
    client_free(c);

    /* an ACL user and password from the URL */
    redisContext *arc = th_redis(s);
    th_cmd_ok(arc, "ACL SETUSER alice on >al1ce ~* &* +@all");
    char aurl[96];
    snprintf(aurl, sizeof aurl, "redis://alice:al1ce@127.0.0.1:%d", th_server_port(s));
    ASSERT_CODE(try_url(aurl, NULL, NULL), DLOCK_OK);
    snprintf(aurl, sizeof aurl, "redis://alice:nope@127.0.0.1:%d", th_server_port(s));
    ASSERT_CODE(try_url(aurl, NULL, NULL), DLOCK_EAUTH);
    redisFree(arc);

    /* AUTH: refused (never naming the password), then accepted; and a
     * unix socket */
    th_server_opts so = {.requirepass = "s3cret"};
    th_server *ps = th_server_start(&so);
    ASSERT_CODE(try_url(th_server_url(ps), "wrong", "wrong"), DLOCK_EAUTH);
    ASSERT_CODE(try_url(th_server_unix_url(ps), "s3cret", NULL), DLOCK_OK);
    th_server_stop(ps);
    redisFree(rc);
}

/* Slots beyond the two of one server: the shipped adapters grow their
 * tables (the library's slots 0 and 1 told as 40 and 41), a waiter on the
 * subscribed connection there is woken by the release; dlock_async_fds
 * tells how many sockets there are and writes only as many as it has room
 * for; a watch the adapter refuses ends the request with DLOCK_ENOMEM at
 * once (not at its deadline), and the next request opens a new connection. */
static void t_slots(th_server *s) {
    dlock_async_client *c = NULL;
    ASSERT_CODE(client_new_spread(th_server_url(s), 40, NULL, &c), DLOCK_OK);
    dlock_async_lock *a = alock(c, "slots"), *b = alock(c, "slots");
    res ra = {0}, rb = {0}, rr = {0};
    hold(a, 10000, &ra);
    START(dlock_async_acquire(b, 5000, 10000, on_done, &rb));
    run_for(300); /* b registered, its channel subscribed */
    ASSERT_EQ(rb.calls, 0);
    dlock_async_pollfd f[2] = {{-7, -7}, {-7, -7}};
    ASSERT_EQ(dlock_async_fds(c, NULL, 0), 2);
    ASSERT_EQ(dlock_async_fds(c, f, 1), 2);
    ASSERT(f[0].fd >= 0 && f[0].events != 0);
    ASSERT(f[1].fd == -7 && f[1].events == -7); /* beyond cap: untouched */
    ASSERT_EQ(dlock_async_fds(c, f, 2), 2);
    ASSERT(f[1].fd >= 0 && f[1].fd != f[0].fd);
    if (!loop_is_bare()) ASSERT(spread_room() > 41);
    int64_t t0 = th_now_ms();
    START(dlock_async_release(a, on_done, &rr));
    WAIT_DONE(rb, 3000);
    ASSERT_CODE(rb.code, DLOCK_OK);
    /* by the release's wake-up on slot 41, not the 2 s backstop */
    ASSERT_MSG(rb.at - t0 < 1000, "served %lld ms after the release",
               (long long)(rb.at - t0));
    ASSERT_CODE(rr.code, DLOCK_OK);
    rr = (res){0};
    START(dlock_async_release(b, on_done, &rr));
    WAIT_DONE(rr, 3000);
    ASSERT_CODE(rr.code, DLOCK_OK);
    dlock_async_lock_free(a);
    dlock_async_lock_free(b);
    client_free(c);
    ASSERT_EQ(spread_room(), -1); /* the adapter cleaned up */
    if (loop_is_bare()) {
        th_log("bare: no adapter to refuse a watch");
        return;
    }

    /* the command connection's first watch refused */
    int fail = 1;
    ASSERT_CODE(client_new_spread(th_server_url(s), 40, &fail, &c), DLOCK_OK);
    a = alock(c, "slots");
    ra = (res){0};
    t0 = th_now_ms();
    START(dlock_async_acquire(a, DLOCK_NOWAIT, 10000, on_done, &ra));
    WAIT_DONE(ra, 3000);
    ASSERT_EQ(fail, 0);
    ASSERT_MSG(ra.code == DLOCK_ENOMEM, "code %d: %s", ra.code, dlock_async_lock_errmsg(a));
    ASSERT_MSG(ra.at - t0 < 500, "told %lld ms later", (long long)(ra.at - t0));
    ASSERT_EQ(dlock_async_fds(c, NULL, 0), 0); /* the connection closed */
    ra = (res){0};
    hold(a, 10000, &ra); /* a new connection, watched */
    rr = (res){0};
    START(dlock_async_release(a, on_done, &rr));
    WAIT_DONE(rr, 3000);
    ASSERT_CODE(rr.code, DLOCK_OK);
    dlock_async_lock_free(a);
    client_free(c);
}

/* ---- a request sent twice ---- */

/* A proxy thread for one connection: 127.0.0.1:port to the server; when
 * dup_next is set, the next chunk from the client goes to the server twice,
 * in one write (the server then answers both at once). */
typedef struct dproxy {
    int lfd, to_port;
    atomic_int dup_next, stop;
    pthread_t th;
} dproxy;

static void *dproxy_run(void *arg) {
    dproxy *d = arg;
    int cfd = accept(d->lfd, NULL, NULL);
    ASSERT(cfd >= 0);
    int sfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->to_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT(connect(sfd, (struct sockaddr *)&a, sizeof a) == 0);
    static char buf[65536], two[131072];
    while (!atomic_load(&d->stop)) {
        struct pollfd pf[2] = {{.fd = cfd, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        if (poll(pf, 2, 50) <= 0) continue;
        if (pf[0].revents) {
            ssize_t n = read(cfd, buf, sizeof buf);
            if (n <= 0) break;
            if (atomic_exchange(&d->dup_next, 0)) {
                memcpy(two, buf, (size_t)n);
                memcpy(two + n, buf, (size_t)n);
                ASSERT(write(sfd, two, (size_t)(2 * n)) == 2 * n);
            } else {
                ASSERT(write(sfd, buf, (size_t)n) == n);
            }
        }
        if (pf[1].revents) {
            ssize_t n = read(sfd, buf, sizeof buf);
            if (n <= 0) break;
            ASSERT(write(cfd, buf, (size_t)n) == n);
        }
    }
    close(cfd);
    close(sfd);
    return NULL;
}

static int dproxy_start(dproxy *d, int to_port) {
    memset(d, 0, sizeof *d);
    d->to_port = to_port;
    d->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT(bind(d->lfd, (struct sockaddr *)&a, sizeof a) == 0);
    ASSERT(listen(d->lfd, 4) == 0);
    socklen_t al = sizeof a;
    ASSERT(getsockname(d->lfd, (struct sockaddr *)&a, &al) == 0);
    ASSERT(pthread_create(&d->th, NULL, dproxy_run, d) == 0);
    return ntohs(a.sin_port);
}

static dlock_async_lock *dup_b;
static res dup_rb;

/* a's acquire ended: b's starts from its callback, queued behind the
 * second copy of a's request */
static void dup_a_done(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    on_done(l, code, fence, ud);
    START(dlock_async_acquire(dup_b, DLOCK_NOWAIT, 5000, on_done, &dup_rb));
}

static void t_dupreply(th_server *s) {
    /* y held by a blocking client */
    dlock_client *bc = th_client(s, 0);
    dlock_lock *by = th_lock(bc, "dup:y", DLOCK_KIND_REENTRANT);
    ASSERT_LOK(by, dlock_acquire(by, DLOCK_NOWAIT, 30000, NULL));

    dproxy d;
    int port = dproxy_start(&d, th_server_port(s));
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    dlock_async_client *c = NULL;
    ASSERT_CODE(client_new(url, NULL, &c), DLOCK_OK);
    dlock_async_lock *a = NULL;
    ASSERT_CODE(dlock_async_lock_new(c, "dup:x", DLOCK_CSTR, DLOCK_KIND_REENTRANT, &a), DLOCK_OK);
    ASSERT_CODE(dlock_async_lock_new(c, "dup:y", DLOCK_CSTR, DLOCK_KIND_REENTRANT, &dup_b),
                DLOCK_OK);
    /* the scripts loaded, the connection open */
    res r0 = {0}, r1 = {0};
    hold(a, 5000, &r0);
    START(dlock_async_release(a, on_done, &r1));
    WAIT_DONE(r1, 3000);
    ASSERT_CODE(r1.code, DLOCK_OK);

    /* a's acquire sent twice: a re-entrant owner's second copy re-enters,
     * so both replies say "acquired"; b's request (y, held by another)
     * must not read the second one */
    res ra = {0};
    atomic_store(&d.dup_next, 1);
    START(dlock_async_acquire(a, DLOCK_NOWAIT, 5000, dup_a_done, &ra));
    WAIT_DONE(dup_rb, 5000);
    ASSERT_CODE(ra.code, DLOCK_OK);
    ASSERT_MSG(dup_rb.code != DLOCK_OK, "b acquired y, held by another client: it read the "
               "second reply of a's doubled request");
    ASSERT_EQ(dup_rb.calls, 1);
    /* y is still the blocking client's */
    ASSERT(dlock_lock_valid_ms(by) > 0);
    ASSERT_LOK(by, dlock_release(by));

    atomic_store(&d.stop, 1);
    client_free(c);
    pthread_join(d.th, NULL);
    close(d.lfd);
    dlock_lock_free(by);
    dlock_client_free(bc);
}

int main(int argc, char **argv) {
    static const async_case cases[] = {
        {"cancel", t_cancel}, {"restart", t_restart},   {"badinput", t_badinput},
        {"slots", t_slots},   {"dupreply", t_dupreply}, {NULL, NULL},
    };
    return async_main(argc, argv, "async_faults", cases);
}
