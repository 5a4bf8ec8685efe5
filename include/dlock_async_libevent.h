/*
 * The libevent adapter of dlock_async.h, header-only: libdlock does not
 * link libevent, the program that includes this does (-levent).
 *
 *   struct event_base *base = event_base_new();
 *   dlock_async_client *c;
 *   int rc = dlock_async_event_client_new(&opts, base, &c);
 *   ...                          // operations, event_base_dispatch(base)
 *   dlock_async_client_free(c);  // on the loop's thread
 *
 * Each watched socket is a persistent struct event, the client's timer an
 * evtimer; freed with the client. The table of slots grows as the client
 * asks for more (dlock_async.h, "Slots"). Contracts as dlock_async_client_new.
 */
#ifndef DLOCK_ASYNC_LIBEVENT_H
#define DLOCK_ASYNC_LIBEVENT_H

#include <event2/event.h>
#include <stdlib.h>

#include "dlock_async.h"

typedef struct dlock_async_ev {
    struct event_base *base;
    dlock_async_client *client;
    struct event **ev; /* by slot, nslots of them (NULL: not watched) */
    int *fd, *events;
    int nslots;
    struct event *timer;
} dlock_async_ev;

static void dlock_async_ev_on_io_(evutil_socket_t fd, short what, void *arg) {
    dlock_async_ev *a = (dlock_async_ev *)arg;
    int ev = ((what & EV_READ) ? DLOCK_ASYNC_READ : 0) | ((what & EV_WRITE) ? DLOCK_ASYNC_WRITE : 0);
    dlock_async_process(a->client, (int)fd, ev);
}

static void dlock_async_ev_on_timer_(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    dlock_async_process(((dlock_async_ev *)arg)->client, -1, 0);
}

/* Room for slot: 0, or -1 for want of memory. */
static int dlock_async_ev_grow_(dlock_async_ev *a, int slot) {
    if (slot < a->nslots) return 0;
    int n = a->nslots ? a->nslots : 2;
    while (n <= slot) n *= 2;
    struct event **e = (struct event **)realloc(a->ev, (size_t)n * sizeof *e);
    if (!e) return -1;
    a->ev = e;
    int *f = (int *)realloc(a->fd, (size_t)n * sizeof *f);
    if (!f) return -1;
    a->fd = f;
    int *w = (int *)realloc(a->events, (size_t)n * sizeof *w);
    if (!w) return -1;
    a->events = w;
    for (int i = a->nslots; i < n; i++) {
        a->ev[i] = NULL;
        a->fd[i] = -1;
        a->events[i] = 0;
    }
    a->nslots = n;
    return 0;
}

static int dlock_async_ev_watch_(void *data, int slot, int fd, int events) {
    dlock_async_ev *a = (dlock_async_ev *)data;
    if (slot < 0) return -1;
    if (slot < a->nslots && a->ev[slot] &&
        (a->fd[slot] != fd || a->events[slot] != events || !events)) {
        event_free(a->ev[slot]);
        a->ev[slot] = NULL;
        a->fd[slot] = -1;
    }
    if (!events) return 0;
    if (dlock_async_ev_grow_(a, slot)) return -1;
    if (a->ev[slot]) return 0;
    short what = (short)(EV_PERSIST | ((events & DLOCK_ASYNC_READ) ? EV_READ : 0) |
                         ((events & DLOCK_ASYNC_WRITE) ? EV_WRITE : 0));
    struct event *e = event_new(a->base, fd, what, dlock_async_ev_on_io_, a);
    if (!e) return -1;
    if (event_add(e, NULL)) {
        event_free(e);
        return -1;
    }
    a->ev[slot] = e;
    a->fd[slot] = fd;
    a->events[slot] = events;
    return 0;
}

static void dlock_async_ev_timer_(void *data, int64_t ms) {
    dlock_async_ev *a = (dlock_async_ev *)data;
    if (ms < 0) {
        event_del(a->timer);
        return;
    }
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    event_add(a->timer, &tv);
}

static void dlock_async_ev_cleanup_(void *data) {
    dlock_async_ev *a = (dlock_async_ev *)data;
    for (int i = 0; i < a->nslots; i++) (void)dlock_async_ev_watch_(a, i, -1, 0);
    event_free(a->timer);
    free(a->ev);
    free(a->fd);
    free(a->events);
    free(a);
}

/* dlock_async_client_new bound to base: same codes, and DLOCK_ENOMEM when
 * the adapter's memory or timer cannot be had (*out NULL then). */
static inline int dlock_async_event_client_new(const dlock_options *opts,
                                               struct event_base *base,
                                               dlock_async_client **out) {
    if (out) *out = NULL;
    if (!out || !base) return DLOCK_EINVAL;
    dlock_async_ev *a = (dlock_async_ev *)calloc(1, sizeof *a);
    if (!a) return DLOCK_ENOMEM;
    a->base = base;
    a->timer = evtimer_new(base, dlock_async_ev_on_timer_, a);
    if (!a->timer) {
        free(a);
        return DLOCK_ENOMEM;
    }
    dlock_async_adapter ad = {a, dlock_async_ev_watch_, dlock_async_ev_timer_,
                              dlock_async_ev_cleanup_};
    int rc = dlock_async_client_new(opts, &ad, out);
    if (!*out) {
        event_free(a->timer);
        free(a);
        return rc;
    }
    a->client = *out;
    return rc;
}

#endif
