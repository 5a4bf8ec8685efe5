/* The event loops of the async API's tests, and their shared helpers
 * (async_loop.h). */
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "async_loop.h"

#ifdef DLOCK_TEST_HAVE_UV
#include "dlock_async_libuv.h"
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
#include "dlock_async_libevent.h"
#endif

/* ---- the loop under test ---- */

enum { LOOP_UV, LOOP_EVENT, LOOP_BARE };
static int loop_kind;
static dlock_async_client *bare_clients[64];
static int nbare;
#ifdef DLOCK_TEST_HAVE_UV
static uv_loop_t uvl;
static uv_timer_t uv_guard;
static void uv_noop(uv_timer_t *t) { (void)t; }
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
static struct event_base *evb;
static struct event *ev_guard;
static void ev_noop(evutil_socket_t fd, short w, void *a) { (void)fd, (void)w, (void)a; }
#endif

/* the test's own timers: run after each loop turn */
typedef struct ttimer {
    int64_t at;
    void (*fn)(void *);
    void *arg;
} ttimer;
static ttimer timers[4096];
static int ntimers;

void after(int64_t ms, void (*fn)(void *), void *arg) {
    ASSERT(ntimers < (int)(sizeof timers / sizeof timers[0]));
    timers[ntimers++] = (ttimer){th_now_ms() + ms, fn, arg};
}

static void loop_init(void) {
#ifdef DLOCK_TEST_HAVE_UV
    if (loop_kind == LOOP_UV) {
        ASSERT(uv_loop_init(&uvl) == 0);
        uv_timer_init(&uvl, &uv_guard);
        uv_timer_start(&uv_guard, uv_noop, 5, 5);
    }
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
    if (loop_kind == LOOP_EVENT) {
        evb = event_base_new();
        ASSERT(evb);
        ev_guard = event_new(evb, -1, EV_PERSIST, ev_noop, NULL);
        struct timeval tv = {0, 5000};
        event_add(ev_guard, &tv);
    }
#endif
}

void loop_once(void) {
#ifdef DLOCK_TEST_HAVE_UV
    if (loop_kind == LOOP_UV) uv_run(&uvl, UV_RUN_ONCE);
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
    if (loop_kind == LOOP_EVENT) event_base_loop(evb, EVLOOP_ONCE);
#endif
    if (loop_kind == LOOP_BARE) {
        struct pollfd p[64];
        dlock_async_client *owner[64];
        int n = 0;
        int64_t wait = 5;
        for (int i = 0; i < nbare; i++) {
            if (!bare_clients[i]) continue;
            dlock_async_pollfd f[64];
            int k = dlock_async_fds(bare_clients[i], f, 64 - n);
            ASSERT_MSG(k <= 64 - n, "the bare loop has room for 64 sockets, not %d", n + k);
            for (int j = 0; j < k; j++) {
                p[n].fd = f[j].fd;
                p[n].events = (short)(((f[j].events & DLOCK_ASYNC_READ) ? POLLIN : 0) |
                                      ((f[j].events & DLOCK_ASYNC_WRITE) ? POLLOUT : 0));
                p[n].revents = 0;
                owner[n++] = bare_clients[i];
            }
            int64_t t = dlock_async_timeout(bare_clients[i]);
            if (t >= 0 && t < wait) wait = t;
        }
        poll(p, (nfds_t)n, (int)wait);
        for (int i = 0; i < n; i++) {
            if (!p[i].revents) continue;
            /* a callback of an earlier fd may have freed its client */
            int live = 0;
            for (int j = 0; j < nbare; j++) live |= bare_clients[j] == owner[i];
            if (!live) continue;
            int ev = ((p[i].revents & (POLLIN | POLLERR | POLLHUP)) ? DLOCK_ASYNC_READ : 0) |
                     ((p[i].revents & POLLOUT) ? DLOCK_ASYNC_WRITE : 0);
            dlock_async_process(owner[i], p[i].fd, ev);
        }
        for (int i = 0; i < nbare; i++)
            if (bare_clients[i] && dlock_async_timeout(bare_clients[i]) == 0)
                dlock_async_process(bare_clients[i], -1, 0);
    }
    int64_t now = th_now_ms();
    for (int i = 0; i < ntimers;) {
        if (timers[i].at > now) {
            i++;
            continue;
        }
        ttimer t = timers[i];
        timers[i] = timers[--ntimers];
        t.fn(t.arg);
    }
}

void run_for(int64_t ms) {
    int64_t until = th_now_ms() + ms;
    while (th_now_ms() < until) loop_once();
}

int client_new(const char *url, const char *password, dlock_async_client **out) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.password = password;
    return client_new_opts(&o, out);
}

int client_new_opts(dlock_options *opts, dlock_async_client **out) {
    dlock_options o = *opts;
    if (!o.command_timeout_ms) o.command_timeout_ms = 2000;
    if (!o.connect_timeout_ms) o.connect_timeout_ms = 1000;
    int rc = DLOCK_EINVAL;
#ifdef DLOCK_TEST_HAVE_UV
    if (loop_kind == LOOP_UV) rc = dlock_async_uv_client_new(&o, &uvl, out);
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
    if (loop_kind == LOOP_EVENT) rc = dlock_async_event_client_new(&o, evb, out);
#endif
    if (loop_kind == LOOP_BARE) {
        rc = dlock_async_client_new(&o, NULL, out);
        if (*out) {
            ASSERT(nbare < (int)(sizeof bare_clients / sizeof *bare_clients));
            bare_clients[nbare++] = *out;
        }
    }
    return rc;
}

/* ---- a client whose shipped adapter is told spread-out slots ---- */

static struct {
    dlock_async_adapter inner; /* the shipped adapter's */
    int offset;
    int *fail;
    int *room;                 /* the shipped adapter's table size */
} sp;

static int spread_watch(void *data, int slot, int fd, int events) {
    (void)data;
    if (events && sp.fail && *sp.fail > 0 && --*sp.fail == 0) {
        /* as a failed watch must: the slot watches nothing */
        (void)sp.inner.watch(sp.inner.data, slot + sp.offset, fd, 0);
        return -1;
    }
    return sp.inner.watch(sp.inner.data, slot + sp.offset, fd, events);
}
static void spread_timer(void *data, int64_t ms) {
    (void)data;
    sp.inner.timer(sp.inner.data, ms);
}
static void spread_cleanup(void *data) {
    (void)data;
    sp.room = NULL;
    sp.inner.cleanup(sp.inner.data);
}

int client_new_spread(const char *url, int offset, int *fail, dlock_async_client **out) {
    *out = NULL;
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.command_timeout_ms = 2000;
    o.connect_timeout_ms = 1000;
    if (loop_kind == LOOP_BARE) return client_new_opts(&o, out);
    ASSERT(!sp.room); /* one at a time */
    sp.offset = offset;
    sp.fail = fail;
    int rc = DLOCK_EINVAL;
    dlock_async_adapter ad = {NULL, spread_watch, spread_timer, spread_cleanup};
#ifdef DLOCK_TEST_HAVE_UV
    if (loop_kind == LOOP_UV) {
        /* dlock_async_uv_client_new's steps, with the adapter wrapped */
        dlock_async_uv *a = calloc(1, sizeof *a);
        uv_timer_t *t = calloc(1, sizeof *t);
        ASSERT(a && t && uv_timer_init(&uvl, t) == 0);
        t->data = a;
        a->loop = &uvl;
        a->timer = t;
        sp.inner = (dlock_async_adapter){a, dlock_async_uv_watch_, dlock_async_uv_timer_,
                                         dlock_async_uv_cleanup_};
        sp.room = &a->nslots;
        rc = dlock_async_client_new(&o, &ad, out);
        ASSERT(*out);
        a->client = *out;
    }
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
    if (loop_kind == LOOP_EVENT) {
        dlock_async_ev *a = calloc(1, sizeof *a);
        ASSERT(a);
        a->base = evb;
        a->timer = evtimer_new(evb, dlock_async_ev_on_timer_, a);
        ASSERT(a->timer);
        sp.inner = (dlock_async_adapter){a, dlock_async_ev_watch_, dlock_async_ev_timer_,
                                         dlock_async_ev_cleanup_};
        sp.room = &a->nslots;
        rc = dlock_async_client_new(&o, &ad, out);
        ASSERT(*out);
        a->client = *out;
    }
#endif
    return rc;
}

int spread_room(void) { return sp.room ? *sp.room : -1; }

int loop_is_bare(void) { return loop_kind == LOOP_BARE; }

dlock_async_client *client(const th_server *s) {
    dlock_async_client *c = NULL;
    int rc = client_new(th_server_url(s), NULL, &c);
    ASSERT_MSG(rc == DLOCK_OK, "client: %s", dlock_async_errmsg(c));
    return c;
}

void client_free(dlock_async_client *c) {
    forget(c);
    dlock_async_client_free(c);
    /* let the adapter's handles close */
    for (int i = 0; i < 3; i++) loop_once();
}

dlock_async_lock *alock(dlock_async_client *c, const char *name) {
    dlock_async_lock *l = NULL;
    int rc = dlock_async_lock_new(c, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l);
    ASSERT_MSG(rc == DLOCK_OK, "lock_new: %s", dlock_async_errmsg(c));
    return l;
}

void on_done(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    (void)l;
    res *r = ud;
    r->calls++;
    r->code = code;
    r->fence = fence;
    r->at = th_now_ms();
}

int calls(const res *r, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += r[i].calls;
    return k;
}

/* try-once acquire of l, which must succeed */
void hold(dlock_async_lock *l, int64_t lease_ms, res *r) {
    START(dlock_async_acquire(l, DLOCK_NOWAIT, lease_ms, on_done, r));
    WAIT_DONE(*r, 3000);
    ASSERT_MSG(r->code == DLOCK_OK, "hold: %s", dlock_async_lock_errmsg(l));
}

void forget(dlock_async_client *c) {
    for (int i = 0; i < nbare; i++)
        if (bare_clients[i] == c) bare_clients[i] = NULL;
}

void *blocking_holder(void *arg) {
    blocker *b = arg;
    dlock_client *c = th_client(b->s, 0);
    dlock_lock *l = th_lock(c, b->name, DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_WAIT_FOREVER, 10000, NULL));
    b->acquired_at = th_now_ms();
    atomic_store(&b->go, 1);
    th_sleep_ms(b->hold_ms);
    b->released_at = th_now_ms();
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_client_free(c);
    return NULL;
}

int async_main(int argc, char **argv, const char *name, const async_case *cases) {
    th_init(name);
    if (argc < 2) th_fail(__FILE__, __LINE__, "usage: test_%s CASE_LOOP", name);
    char what[64];
    snprintf(what, sizeof what, "%s", argv[1]);
    char *us = strrchr(what, '_');
    ASSERT(us);
    *us = '\0';
    const char *lp = us + 1;
    if (!strcmp(lp, "uv")) {
#ifndef DLOCK_TEST_HAVE_UV
        th_skip("libuv was not found at build time (install libuv1-dev)");
#endif
        loop_kind = LOOP_UV;
    } else if (!strcmp(lp, "event")) {
#ifndef DLOCK_TEST_HAVE_EVENT
        th_skip("libevent was not found at build time (install libevent-dev)");
#endif
        loop_kind = LOOP_EVENT;
    } else {
        loop_kind = LOOP_BARE;
    }
    th_server *s = th_server_start(NULL);
    loop_init();
    const async_case *k = cases;
    while (k->name && strcmp(k->name, what)) k++;
    if (!k->name) th_fail(__FILE__, __LINE__, "unknown case %s", what);
    k->run(s);
#ifdef DLOCK_TEST_HAVE_UV
    if (loop_kind == LOOP_UV) {
        uv_close((uv_handle_t *)&uv_guard, NULL);
        uv_run(&uvl, UV_RUN_NOWAIT);
        ASSERT_EQ(uv_loop_close(&uvl), 0); /* every handle of the adapter closed */
    }
#endif
#ifdef DLOCK_TEST_HAVE_EVENT
    if (loop_kind == LOOP_EVENT) {
        event_free(ev_guard);
        event_base_free(evb);
    }
#endif
    th_server_stop(s);
    th_log("ok");
    return 0;
}
