/* The lease-renewal service: one thread per user that does what is due when
 * it is due (services.h, dl_renewer). Its users: the Redis watchdog
 * (watchdog.c), MySQL's table-mode renewal and etcd's keep-alive. */
#include <string.h>

#include "services.h"

static void *renewer_main(void *arg) {
    dl_renewer *r = arg;
    if (r->enter) r->enter(r->ctx);
    pthread_mutex_lock(r->mu);
    while (!r->stop) {
        r->woken = 0;
        int64_t next = r->round(r->ctx);
        if (r->stop) break;
        if (r->woken) continue; /* woken while round had mu unlocked */
        dl_cond_wait_until(&r->cv, r->mu, next);
    }
    pthread_mutex_unlock(r->mu);
    if (r->leave) r->leave(r->ctx);
    return NULL;
}

void dl_renewer_init(dl_renewer *r, pthread_mutex_t *mu, int64_t (*round)(void *ctx),
                     void (*enter)(void *ctx), void (*leave)(void *ctx), void *ctx) {
    memset(r, 0, sizeof *r);
    r->mu = mu;
    r->round = round;
    r->enter = enter;
    r->leave = leave;
    r->ctx = ctx;
    dl_cond_init(&r->cv);
}

int dl_renewer_start(dl_renewer *r, const char *what, dl_err *err) {
    if (r->started) return DLOCK_OK;
    int e = pthread_create(&r->th, NULL, renewer_main, r);
    if (e) return dl_seterr(err, DLOCK_ESYS, "cannot start %s: %s", what, strerror(e));
    r->started = 1;
    return DLOCK_OK;
}

void dl_renewer_wake(dl_renewer *r) {
    r->woken = 1;
    pthread_cond_signal(&r->cv);
}

int dl_renewer_is_self(const dl_renewer *r) {
    return r->started && pthread_equal(pthread_self(), r->th);
}

void dl_renewer_stop(dl_renewer *r) {
    pthread_mutex_lock(r->mu);
    int started = r->started;
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(r->mu);
    if (started) pthread_join(r->th, NULL);
    r->started = 0;
    pthread_cond_destroy(&r->cv);
}
