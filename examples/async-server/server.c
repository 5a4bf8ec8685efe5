/*
 * async-server: a flash-sale shop served by several processes, each ONE
 * thread running a libuv loop, which serializes the purchases of an item
 * across all of them with dlock's async locks (include/dlock_async.h).
 *
 * Protocol, one request per line; a connection's replies come in order:
 *   BUY <item> <user>   ->  OK <unit>    unit <unit> (1..stock) of <item> is yours
 *                           SOLDOUT
 *                           ERR <why>
 * Store, in the Redis server that also holds the locks:
 *   shop:stock:<item>    the units left (a number; set up by whoever runs the sale)
 *   shop:orders:<item>   a list, one "<unit>:<user>:<server>" per sale
 *
 * A purchase is a deliberately NON-ATOMIC read-modify-write: GET the stock,
 * pause on a libuv timer (--pause-ms) while other requests of this process
 * and of the others run, then SET stock - 1 and RPUSH the order. Under the
 * lock "shop:<item>" that is safe. With --unsafe (no lock) buyers that
 * overlap read the same stock and sell the same unit twice: the driver
 * (driver.py) shows the oversell.
 *
 * Every request has its own lock handle, and hundreds may wait at once on
 * the loop: a wait costs a small struct, not a thread.
 *
 * lines.c is the transport (a line server on the loop), redis_uv.h binds the
 * store's hiredis connection to the loop; this file has the locks, the
 * store and the requests.
 * Build: examples/CMakeLists.txt, or
 *   cc server.c lines.c $(pkg-config --cflags --libs dlock libuv hiredis) -o async-server
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r; and uv.h needs POSIX types */

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlock_async_libuv.h>

#include "lines.h"
#include "redis_uv.h"

#define NAME_MAX_LEN 64  /* item and user names: [A-Za-z0-9_.-]{1,64} */
#define WRITE_MARGIN_MS 100 /* the least validity a hold must have left to write */

static struct {
    const char *name;           /* --name, written into each order */
    char redis_host[128];
    int redis_port, port, unsafe;
    int64_t pause_ms, lease_ms, wait_ms;
} cfg = {"s1", "127.0.0.1", 6379, 7000, 0, 10, 2000, 10000};

typedef struct request request;

struct request {
    line_conn *c;           /* busy until end_request calls lines_next */
    char item[NAME_MAX_LEN + 1], user[NAME_MAX_LEN + 1];
    dlock_async_lock *lock; /* NULL with --unsafe */
    int waiting;            /* the acquire is pending (a shutdown cancels it) */
    int held;               /* the acquire succeeded: release when done */
    int writes, write_failed; /* store replies still to come; one failed */
    long long unit;         /* the stock read, which is the unit sold */
    uv_timer_t pause;       /* the pause between GET and SET; freed on close */
    request *prev, *next;   /* srv.live */
};

static struct {
    uv_loop_t *loop;
    uv_signal_t sigterm, sigint;
    dlock_async_client *locks;
    redisAsyncContext *store; /* NULL once lost or closed */
    request *live;            /* requests in flight */
    int live_n, started, draining, finished;
    long long requests, ok, soldout, err, lost, peak;
} srv;

/* ---- a request's end ---- */

static void maybe_exit(void);
static redisAsyncContext *store(void);

static void free_request(uv_handle_t *h) { free(h->data); }

/* The request is over: the connection serves its next line. */
static void end_request(request *r) {
    if (r->prev) r->prev->next = r->next; else srv.live = r->next;
    if (r->next) r->next->prev = r->prev;
    srv.live_n--;
    uv_close((uv_handle_t *)&r->pause, free_request);
    lines_next(r->c);
    maybe_exit();
}

static void on_released(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    (void)fence;
    request *r = ud;
    /* DLOCK_ELOST: the lease had run out before the release, so what was
     * written under it may not have been exclusive (docs/design.md) */
    if (code == DLOCK_ELOST) srv.lost++;
    if (code != DLOCK_OK)
        fprintf(stderr, "async-server %s: release of %s: %s\n", cfg.name, r->item,
                dlock_async_lock_errmsg(l));
    dlock_async_lock_free(l); /* allowed in its own callback */
    end_request(r);
}

/* Answers the client, then gives the lock back (the answer need not wait
 * for the release: the store is already written). */
static void done(request *r, const char *fmt, ...) {
    char line[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (!strncmp(line, "OK", 2)) srv.ok++;
    else if (!strcmp(line, "SOLDOUT")) srv.soldout++;
    else srv.err++;
    lines_reply(r->c, "%s", line);
    if (r->held && dlock_async_release(r->lock, on_released, r) == DLOCK_OK) return;
    dlock_async_lock_free(r->lock); /* also: a release that could not start */
    end_request(r);
}

/* ---- the purchase: lock, GET, pause, SET + RPUSH, release ---- */

/* The reply to one of the two writes; the request goes on at the last. */
static void on_written(redisAsyncContext *ac, void *reply, void *ud) {
    (void)ac;
    request *r = ud;
    redisReply *rep = reply;
    if (!rep || rep->type == REDIS_REPLY_ERROR) r->write_failed = 1;
    if (--r->writes > 0) return;
    if (r->write_failed)
        done(r, "ERR store write failed");
    else
        done(r, "OK %lld", r->unit);
}

static void on_pause(uv_timer_t *t) {
    request *r = t->data;
    /* The lease is the hold's contract: write only while it surely runs for
     * a while yet (a stalled process fails the request instead of writing
     * unprotected). The pause is far shorter than the lease, so this fails
     * only after a stall; work that could outlast the lease would call
     * dlock_async_extend first. (A stall right after this check is still
     * possible: a store that must never take a stale write checks the
     * acquire's fencing token, see docs/flash-sale.md.) */
    if (r->lock && dlock_async_lock_valid_ms(r->lock) < WRITE_MARGIN_MS) {
        done(r, "ERR lease ran out, nothing sold");
        return;
    }
    /* Two commands pipelined on one connection, each with a callback that
     * will run (a NULL reply if the connection goes): r lives until both
     * have. */
    redisAsyncContext *db = store();
    if (db && redisAsyncCommand(db, on_written, r, "SET shop:stock:%s %lld", r->item,
                                r->unit - 1) == REDIS_OK)
        r->writes++;
    if (r->writes && redisAsyncCommand(db, on_written, r, "RPUSH shop:orders:%s %lld:%s:%s",
                                       r->item, r->unit, r->user, cfg.name) == REDIS_OK)
        r->writes++;
    else
        r->write_failed = 1;
    if (!r->writes) done(r, "ERR store unavailable");
}

static void on_stock(redisAsyncContext *ac, void *reply, void *ud) {
    (void)ac;
    request *r = ud;
    redisReply *rep = reply;
    char *end = NULL;
    if (rep && rep->type == REDIS_REPLY_STRING) r->unit = strtoll(rep->str, &end, 10);
    if (!rep || rep->type == REDIS_REPLY_ERROR)
        done(r, "ERR store read failed");
    else if (rep->type == REDIS_REPLY_NIL)
        done(r, "ERR no such item");
    else if (!end || *end || end == rep->str)
        done(r, "ERR bad stock");
    else if (r->unit <= 0)
        done(r, "SOLDOUT");
    else /* the unsafe window: others read the same stock while this one sleeps */
        uv_timer_start(&r->pause, on_pause, (uint64_t)cfg.pause_ms, 0);
}

static void read_stock(request *r) {
    redisAsyncContext *db = store();
    if (!db || redisAsyncCommand(db, on_stock, r, "GET shop:stock:%s", r->item) != REDIS_OK)
        done(r, "ERR store unavailable");
}

static void on_locked(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    (void)fence;
    request *r = ud;
    r->waiting = 0;
    r->held = code == DLOCK_OK;
    if (code == DLOCK_OK)
        read_stock(r);
    else if (code == DLOCK_ETIMEDOUT)
        done(r, "ERR busy, try again");
    else if (code == DLOCK_ECANCELED)
        done(r, "ERR shutting down");
    else
        done(r, "ERR lock: %s", dlock_async_lock_errmsg(l));
}

static int valid_name(const char *s) {
    size_t n = strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-");
    return n > 0 && n <= NAME_MAX_LEN && !s[n];
}

/* One line of a client (lines.h): answered at once, or a request started,
 * which ends with end_request. */
static void handle_line(line_conn *c, char *line) {
    char *save, *cmd = strtok_r(line, " \r", &save);
    char *item = strtok_r(NULL, " \r", &save), *user = strtok_r(NULL, " \r", &save);
    request *r = NULL;
    if (!cmd || strcmp(cmd, "BUY") || !item || !user || strtok_r(NULL, " \r", &save))
        lines_reply(c, "ERR usage: BUY <item> <user>");
    else if (!valid_name(item) || !valid_name(user))
        lines_reply(c, "ERR names are 1 to %d of A-Z a-z 0-9 _ . -", NAME_MAX_LEN);
    else if (!(r = calloc(1, sizeof *r)))
        lines_reply(c, "ERR out of memory");
    if (!r) {
        lines_next(c);
        return;
    }
    r->c = c;
    strcpy(r->item, item);
    strcpy(r->user, user);
    uv_timer_init(srv.loop, &r->pause);
    r->pause.data = r;
    r->next = srv.live;
    if (srv.live) srv.live->prev = r;
    srv.live = r;
    srv.requests++;
    if (++srv.live_n > srv.peak) srv.peak = srv.live_n;
    if (cfg.unsafe) {
        read_stock(r);
        return;
    }

    /* A handle per request: two handles of one client exclude each other,
     * and a handle has one operation at a time. The wait is bounded, the
     * lease (2 s) far longer than the work (one pause and two round trips). */
    char name[NAME_MAX_LEN + 8];
    snprintf(name, sizeof name, "shop:%s", item);
    int rc = dlock_async_lock_new(srv.locks, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &r->lock);
    if (rc == DLOCK_OK) {
        rc = dlock_async_acquire(r->lock, cfg.wait_ms, cfg.lease_ms, on_locked, r);
        /* DLOCK_OK: on_locked runs later, exactly once (never from here) */
        if (rc == DLOCK_OK)
            r->waiting = 1;
        else
            done(r, "ERR lock: %s", dlock_async_lock_errmsg(r->lock));
    } else {
        done(r, "ERR lock: %s", dlock_async_errmsg(srv.locks));
    }
}

/* ---- start and stop ---- */

/* SIGTERM or SIGINT: stop accepting, end the waits (a cancelled acquire's
 * callback runs inside dlock_async_cancel and answers "ERR shutting down"),
 * let the requests past their acquire finish, then free the lock client and
 * close the store: uv_run returns once every handle is closed. */
static void on_signal(uv_signal_t *s, int signum) {
    (void)s, (void)signum;
    if (srv.draining) return;
    srv.draining = 1;
    lines_stop();
    uv_close((uv_handle_t *)&srv.sigterm, NULL); /* a second signal: the default, death */
    uv_close((uv_handle_t *)&srv.sigint, NULL);
    for (request *r = srv.live, *next; r; r = next) {
        next = r->next;
        if (r->waiting) dlock_async_cancel(r->lock);
    }
    maybe_exit();
}

static void maybe_exit(void) {
    if (!srv.draining || srv.live || srv.finished) return;
    srv.finished = 1;
    dlock_async_client_free(srv.locks); /* nothing pending: no callback runs */
    srv.locks = NULL;
    if (srv.store) redisAsyncDisconnect(srv.store);
}

static void on_store_connect(const redisAsyncContext *ac, int status) {
    if (status != REDIS_OK) {
        fprintf(stderr, "async-server %s: cannot reach Redis at %s:%d: %s\n", cfg.name,
                cfg.redis_host, cfg.redis_port, ac->errstr);
        srv.store = NULL; /* hiredis frees it; the commands queued get a NULL reply */
        if (!srv.started) exit(1);
        return;
    }
    if (srv.started++) return;
    /* the line the driver waits for */
    printf("async-server %s: listening on 127.0.0.1:%d, %s\n", cfg.name, cfg.port,
           cfg.unsafe ? "UNSAFE (no lock)" : "a lock per item");
    fflush(stdout);
}

static void on_store_disconnect(const redisAsyncContext *ac, int status) {
    if (status != REDIS_OK)
        fprintf(stderr, "async-server %s: lost Redis: %s\n", cfg.name, ac->errstr);
    srv.store = NULL; /* hiredis frees it; requests in flight got a NULL reply */
}

/* The store's connection: opened at start, and again by the next request
 * after it was lost (as the lock client reopens its own). NULL: none. */
static redisAsyncContext *store(void) {
    if (srv.store || srv.draining) return srv.store;
    redisAsyncContext *ac = redisAsyncConnect(cfg.redis_host, cfg.redis_port);
    if (!ac || ac->err || redis_uv_attach(ac, srv.loop) != REDIS_OK) {
        if (ac) redisAsyncFree(ac);
        return NULL;
    }
    redisAsyncSetConnectCallback(ac, on_store_connect);
    redisAsyncSetDisconnectCallback(ac, on_store_disconnect);
    return srv.store = ac;
}

static int64_t num_arg(const char *opt, const char *v, int64_t lo, int64_t hi) {
    char *end;
    long long n = v ? strtoll(v, &end, 10) : 0;
    if (!v || *end || end == v || n < lo || n > hi) {
        fprintf(stderr, "async-server: %s needs a number in %lld..%lld\n", opt, (long long)lo,
                (long long)hi);
        exit(2);
    }
    return n;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--unsafe")) { cfg.unsafe = 1; continue; }
        if (!strcmp(a, "--port")) cfg.port = (int)num_arg(a, v, 0, 65535);
        else if (!strcmp(a, "--pause-ms")) cfg.pause_ms = num_arg(a, v, 0, 60000);
        else if (!strcmp(a, "--lease-ms")) cfg.lease_ms = num_arg(a, v, 1, 3600000);
        else if (!strcmp(a, "--wait-ms")) cfg.wait_ms = num_arg(a, v, 0, 3600000);
        else if (!strcmp(a, "--name") && v && valid_name(v)) cfg.name = v;
        else if (!strcmp(a, "--redis") && v && strchr(v, ':') &&
                 sscanf(v, "%127[^:]:%d", cfg.redis_host, &cfg.redis_port) == 2) {
        } else {
            fprintf(stderr, "usage: async-server [--redis HOST:PORT] [--port N (0: any)] "
                            "[--name NAME] [--pause-ms N] [--lease-ms N] [--wait-ms N] "
                            "[--unsafe]\n");
            return 2;
        }
        i++;
    }
    if (cfg.lease_ms < cfg.pause_ms + 4 * WRITE_MARGIN_MS) {
        fprintf(stderr, "async-server: --lease-ms must exceed --pause-ms by %d\n",
                4 * WRITE_MARGIN_MS);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a client gone shows as a write error */
    srv.loop = uv_default_loop();

    /* the locks: one async client for the whole process, on this loop */
    char url[200];
    snprintf(url, sizeof url, "redis://%s:%d", cfg.redis_host, cfg.redis_port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    if (dlock_async_uv_client_new(&o, srv.loop, &srv.locks) != DLOCK_OK) {
        fprintf(stderr, "async-server: %s\n", dlock_async_errmsg(srv.locks));
        return 1;
    }
    /* the store: a hiredis async connection on the same loop */
    if (!store()) {
        fprintf(stderr, "async-server: cannot connect to Redis\n");
        return 1;
    }

    int port = lines_listen(srv.loop, cfg.port, handle_line);
    if (port < 0) {
        fprintf(stderr, "async-server: cannot listen on port %d: %s\n", cfg.port,
                uv_strerror(port));
        return 1;
    }
    cfg.port = port;
    uv_signal_init(srv.loop, &srv.sigterm);
    uv_signal_init(srv.loop, &srv.sigint);
    uv_signal_start(&srv.sigterm, on_signal, SIGTERM);
    uv_signal_start(&srv.sigint, on_signal, SIGINT);

    uv_run(srv.loop, UV_RUN_DEFAULT); /* until on_signal has closed everything */
    printf("async-server %s: %lld requests: %lld OK, %lld SOLDOUT, %lld ERR; at most %lld in "
           "flight at once; %lld leases lost\n",
           cfg.name, srv.requests, srv.ok, srv.soldout, srv.err, srv.peak, srv.lost);
    return uv_loop_close(srv.loop) != 0;
}
