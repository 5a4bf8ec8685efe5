/* A fixed amount of lock work, for counting the client's instructions with
 * callgrind (deterministic, unlike timings on a shared machine): two builds
 * of the library compared with bench/instr.sh, which runs this program with
 * two counts and takes the difference over the extra operations, so that
 * start-up and connection costs cancel out.
 *
 *   instr URL MODE N
 *
 * MODE: plain (acquire + release of a plain lock, 30 s lease), watchdog
 * (the same with DLOCK_WATCHDOG), reentrant (a reentrant lock), handoff (a
 * second thread waits for the lock while the first holds it, N hand-overs
 * each way). Exits 0 when every operation succeeded; a failure prints one
 * line and exits 1. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlock.h>

static int fail(const char *what, int rc) {
    fprintf(stderr, "instr: %s: %s\n", what, dlock_strerror(rc));
    return 1;
}

typedef struct {
    dlock_client *c;
    long n;
    int rc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int turn; /* 0: main holds next, 1: the waiter */
} handoff_ctx;

/* The waiter: n times, wait for the lock (the main thread holds it), then
 * hand it back. */
static void *waiter(void *arg) {
    handoff_ctx *x = arg;
    dlock_lock *l = NULL;
    int rc = dlock_lock_new(x->c, "instr:handoff", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l);
    for (long i = 0; !rc && i < x->n; i++) {
        pthread_mutex_lock(&x->mu);
        while (x->turn != 1) pthread_cond_wait(&x->cv, &x->mu);
        pthread_mutex_unlock(&x->mu);
        rc = dlock_acquire(l, DLOCK_WAIT_FOREVER, 30000, NULL);
        pthread_mutex_lock(&x->mu);
        x->turn = 0;
        pthread_cond_signal(&x->cv);
        pthread_mutex_unlock(&x->mu);
        if (!rc) rc = dlock_release(l);
    }
    dlock_lock_free(l);
    x->rc = rc;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: instr URL plain|watchdog|reentrant|handoff N\n");
        return 2;
    }
    const char *mode = argv[2];
    long n = atol(argv[3]);
    dlock_options o;
    dlock_options_init(&o);
    o.url = argv[1];
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    if (rc) return fail("client", rc);
    if (!strcmp(mode, "handoff")) {
        handoff_ctx x = {c, n, 0, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
        dlock_lock *l = NULL;
        rc = dlock_lock_new(c, "instr:handoff", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l);
        if (rc) return fail("lock", rc);
        pthread_t th;
        pthread_create(&th, NULL, waiter, &x);
        for (long i = 0; !rc && i < n; i++) {
            rc = dlock_acquire(l, DLOCK_WAIT_FOREVER, 30000, NULL);
            pthread_mutex_lock(&x.mu);
            x.turn = 1; /* the waiter starts waiting while this thread holds */
            pthread_cond_signal(&x.cv);
            pthread_mutex_unlock(&x.mu);
            /* let the waiter reach its wait: it subscribes and finds it held */
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
            if (!rc) rc = dlock_release(l);
            pthread_mutex_lock(&x.mu);
            while (x.turn != 0) pthread_cond_wait(&x.cv, &x.mu);
            pthread_mutex_unlock(&x.mu);
        }
        pthread_join(th, NULL);
        dlock_lock_free(l);
        dlock_client_free(c);
        if (rc) return fail("handoff", rc);
        return x.rc ? fail("waiter", x.rc) : 0;
    }
    dlock_kind kind = !strcmp(mode, "reentrant") ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN;
    int64_t lease = !strcmp(mode, "watchdog") ? DLOCK_WATCHDOG : 30000;
    dlock_lock *l = NULL;
    rc = dlock_lock_new(c, "instr:pairs", DLOCK_CSTR, kind, &l);
    if (rc) return fail("lock", rc);
    for (long i = 0; !rc && i < n; i++) {
        rc = dlock_acquire(l, DLOCK_NOWAIT, lease, NULL);
        if (!rc) rc = dlock_release(l);
    }
    dlock_lock_free(l);
    dlock_client_free(c);
    return rc ? fail(mode, rc) : 0;
}
