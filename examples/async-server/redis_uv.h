/*
 * A hiredis async context on a libuv loop: the store's connection of the
 * async-server example (the locks have dlock's own adapter).
 *
 * hiredis 0.14 ships such an adapter (hiredis/adapters/libuv.h), but it
 * drops the poll errors libuv reports: a refused connect or a reset
 * connection then leaves its commands waiting forever. This one, as
 * hiredis 1.0's does, hands an error to hiredis as readiness for what it
 * waits for, and hiredis finds the error by reading or writing: its
 * commands end with a NULL reply. Header-only; on the loop's thread.
 */
#ifndef ASYNC_SERVER_REDIS_UV_H
#define ASYNC_SERVER_REDIS_UV_H

#include <hiredis/async.h>
#include <stdlib.h>
#include <uv.h>

typedef struct redis_uv {
    redisAsyncContext *ac; /* NULL once hiredis let it go */
    uv_poll_t poll;
    int events;            /* UV_READABLE | UV_WRITABLE that hiredis waits for */
} redis_uv;

static void redis_uv_on_poll(uv_poll_t *h, int status, int events) {
    redis_uv *p = h->data;
    if (status < 0) events = p->events; /* libuv has stopped the handle */
    if (p->ac && (events & UV_READABLE)) redisAsyncHandleRead(p->ac);
    if (p->ac && (events & UV_WRITABLE)) redisAsyncHandleWrite(p->ac);
}

static void redis_uv_set(redis_uv *p, int events) {
    p->events = events;
    if (events) uv_poll_start(&p->poll, events, redis_uv_on_poll);
    else uv_poll_stop(&p->poll);
}

static void redis_uv_add_read(void *d) { redis_uv_set(d, ((redis_uv *)d)->events | UV_READABLE); }
static void redis_uv_del_read(void *d) { redis_uv_set(d, ((redis_uv *)d)->events & ~UV_READABLE); }
static void redis_uv_add_write(void *d) { redis_uv_set(d, ((redis_uv *)d)->events | UV_WRITABLE); }
static void redis_uv_del_write(void *d) { redis_uv_set(d, ((redis_uv *)d)->events & ~UV_WRITABLE); }

static void redis_uv_free(uv_handle_t *h) { free(h->data); }

/* hiredis frees the context: the poll handle goes with its close callback */
static void redis_uv_cleanup(void *d) {
    redis_uv *p = d;
    p->ac = NULL;
    uv_close((uv_handle_t *)&p->poll, redis_uv_free);
}

/* Binds ac (just made by redisAsyncConnect) to loop: REDIS_OK or REDIS_ERR. */
static inline int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop) {
    redis_uv *p = calloc(1, sizeof *p);
    if (!p || ac->ev.data || uv_poll_init(loop, &p->poll, ac->c.fd)) {
        free(p);
        return REDIS_ERR;
    }
    p->ac = ac;
    p->poll.data = p;
    ac->ev.data = p;
    ac->ev.addRead = redis_uv_add_read;
    ac->ev.delRead = redis_uv_del_read;
    ac->ev.addWrite = redis_uv_add_write;
    ac->ev.delWrite = redis_uv_del_write;
    ac->ev.cleanup = redis_uv_cleanup;
    return REDIS_OK;
}

#endif
