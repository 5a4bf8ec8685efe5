/*
 * The libuv adapter of dlock_async.h, header-only: libdlock does not link
 * libuv, the program that includes this does (-luv).
 *
 *   uv_loop_t *loop = uv_default_loop();
 *   dlock_async_client *c;
 *   int rc = dlock_async_uv_client_new(&opts, loop, &c);
 *   ...                          // operations, uv_run(loop, ...)
 *   dlock_async_client_free(c);  // on the loop's thread
 *   uv_run(loop, UV_RUN_NOWAIT); // lets the adapter's handles close
 *
 * Each watched socket is a uv_poll_t, the client's timer a uv_timer_t,
 * allocated here and freed by their close callbacks; the table of slots
 * grows as the client asks for more (dlock_async.h, "Slots"). Contracts as
 * dlock_async_client_new.
 */
#ifndef DLOCK_ASYNC_LIBUV_H
#define DLOCK_ASYNC_LIBUV_H

#include <stdlib.h>
#include <uv.h>

#include "dlock_async.h"

typedef struct dlock_async_uv {
    uv_loop_t *loop;
    dlock_async_client *client;
    uv_poll_t **poll; /* by slot, nslots of them (NULL: not watched) */
    int *fd;
    int nslots;
    uv_timer_t *timer;
} dlock_async_uv;

static void dlock_async_uv_free_handle_(uv_handle_t *h) { free(h); }

static void dlock_async_uv_on_poll_(uv_poll_t *h, int status, int events) {
    dlock_async_uv *a = (dlock_async_uv *)h->data;
    int ev = 0;
    if (status < 0) ev = DLOCK_ASYNC_READ | DLOCK_ASYNC_WRITE; /* the library finds the error */
    if (events & UV_READABLE) ev |= DLOCK_ASYNC_READ;
    if (events & UV_WRITABLE) ev |= DLOCK_ASYNC_WRITE;
    int fd = -1;
    uv_fileno((uv_handle_t *)h, &fd);
    dlock_async_process(a->client, fd, ev);
}

static void dlock_async_uv_on_timer_(uv_timer_t *t) {
    dlock_async_uv *a = (dlock_async_uv *)t->data;
    dlock_async_process(a->client, -1, 0);
}

/* Room for slot: 0, or -1 for want of memory. */
static int dlock_async_uv_grow_(dlock_async_uv *a, int slot) {
    if (slot < a->nslots) return 0;
    int n = a->nslots ? a->nslots : 2;
    while (n <= slot) n *= 2;
    uv_poll_t **p = (uv_poll_t **)realloc(a->poll, (size_t)n * sizeof *p);
    if (!p) return -1;
    a->poll = p;
    int *f = (int *)realloc(a->fd, (size_t)n * sizeof *f);
    if (!f) return -1;
    a->fd = f;
    for (int i = a->nslots; i < n; i++) {
        a->poll[i] = NULL;
        a->fd[i] = -1;
    }
    a->nslots = n;
    return 0;
}

static int dlock_async_uv_watch_(void *data, int slot, int fd, int events) {
    dlock_async_uv *a = (dlock_async_uv *)data;
    if (slot < 0) return -1;
    if (slot < a->nslots && a->poll[slot] && (a->fd[slot] != fd || !events)) {
        uv_poll_stop(a->poll[slot]);
        uv_close((uv_handle_t *)a->poll[slot], dlock_async_uv_free_handle_);
        a->poll[slot] = NULL;
        a->fd[slot] = -1;
    }
    if (!events) return 0;
    if (dlock_async_uv_grow_(a, slot)) return -1;
    if (!a->poll[slot]) {
        uv_poll_t *h = (uv_poll_t *)calloc(1, sizeof *h);
        if (!h) return -1;
        if (uv_poll_init(a->loop, h, fd)) {
            free(h);
            return -1;
        }
        h->data = a;
        a->poll[slot] = h;
        a->fd[slot] = fd;
    }
    int uvev = ((events & DLOCK_ASYNC_READ) ? UV_READABLE : 0) |
               ((events & DLOCK_ASYNC_WRITE) ? UV_WRITABLE : 0);
    if (uv_poll_start(a->poll[slot], uvev, dlock_async_uv_on_poll_)) {
        /* the slot watches nothing on a failure */
        uv_close((uv_handle_t *)a->poll[slot], dlock_async_uv_free_handle_);
        a->poll[slot] = NULL;
        a->fd[slot] = -1;
        return -1;
    }
    return 0;
}

static void dlock_async_uv_timer_(void *data, int64_t ms) {
    dlock_async_uv *a = (dlock_async_uv *)data;
    if (ms < 0) {
        uv_timer_stop(a->timer);
        return;
    }
    /* libuv's clock is cached per loop turn: refresh it, or a short timer
     * set late in a turn fires early by that turn's length */
    uv_update_time(a->loop);
    uv_timer_start(a->timer, dlock_async_uv_on_timer_, (uint64_t)ms, 0);
}

static void dlock_async_uv_cleanup_(void *data) {
    dlock_async_uv *a = (dlock_async_uv *)data;
    for (int i = 0; i < a->nslots; i++) (void)dlock_async_uv_watch_(a, i, -1, 0);
    uv_timer_stop(a->timer);
    uv_close((uv_handle_t *)a->timer, dlock_async_uv_free_handle_);
    free(a->poll);
    free(a->fd);
    free(a);
}

/* dlock_async_client_new bound to loop: same codes, and DLOCK_ENOMEM when
 * the adapter's memory or timer cannot be had (*out NULL then). */
static inline int dlock_async_uv_client_new(const dlock_options *opts, uv_loop_t *loop,
                                            dlock_async_client **out) {
    if (out) *out = NULL;
    if (!out || !loop) return DLOCK_EINVAL;
    dlock_async_uv *a = (dlock_async_uv *)calloc(1, sizeof *a);
    uv_timer_t *t = (uv_timer_t *)calloc(1, sizeof *t);
    if (!a || !t || uv_timer_init(loop, t)) {
        free(a);
        free(t);
        return DLOCK_ENOMEM;
    }
    t->data = a;
    a->loop = loop;
    a->timer = t;
    dlock_async_adapter ad = {a, dlock_async_uv_watch_, dlock_async_uv_timer_,
                              dlock_async_uv_cleanup_};
    int rc = dlock_async_client_new(opts, &ad, out);
    if (!*out) { /* no client to clean the adapter up */
        uv_close((uv_handle_t *)t, dlock_async_uv_free_handle_);
        free(a);
        return rc;
    }
    a->client = *out;
    return rc;
}

#endif
