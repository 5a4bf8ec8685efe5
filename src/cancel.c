/* Cancelling a wait (dlock_lock_cancel, dlock_semaphore_cancel...): an
 * atomic counter tells a cancel of the operation under way from an earlier
 * one, and the handle's eventfd, polled beside the subscription while a wait
 * is under way, wakes it. */
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "services.h"

void dl_cancel_init(dl_cancel *x) {
    atomic_init(&x->gen, 0);
    atomic_init(&x->fd, -1);
    atomic_init(&x->busy, 0);
    x->own = -1;
    x->seen = 0;
}

void dl_cancel_destroy(dl_cancel *x) {
    atomic_store(&x->fd, -1);
    if (x->own < 0) return;
    /* a cancel that read the descriptor before the store writes to it
     * before its count drops: closing earlier could let the number be
     * reused and the write land in another file */
    while (atomic_load(&x->busy) > 0) sched_yield();
    close(x->own);
    x->own = -1;
}

static void cancel_request(dl_cancel *x) {
    atomic_fetch_add(&x->busy, 1);
    atomic_fetch_add(&x->gen, 1u);
    int fd = atomic_load(&x->fd);
    if (fd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(fd, &one, sizeof one); /* EAGAIN: it is readable anyway */
        (void)n;
    }
    atomic_fetch_sub(&x->busy, 1);
}

int dl_cancel_ask(dlock_client *c, dl_cancel *x) {
    if (!(c->backend->caps & DL_CAP_CANCEL)) return DLOCK_ENOTSUP;
    cancel_request(x);
    return DLOCK_OK;
}

void dl_cancel_note(dl_cancel *x) { x->seen = atomic_load(&x->gen); }

int dl_canceled(dl_cancel *x) { return atomic_load(&x->gen) != x->seen; }

int dl_cancel_begin(dl_cancel *x) {
    if (x->own < 0) x->own = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    atomic_store(&x->fd, x->own);
    return x->own;
}

void dl_cancel_end(dl_cancel *x) { atomic_store(&x->fd, -1); }

void dl_cancel_drain(dl_cancel *x) {
    int fd = atomic_load(&x->fd);
    uint64_t v;
    if (fd >= 0) {
        ssize_t n = read(fd, &v, sizeof v);
        (void)n;
    }
}

int dl_cancel_poll(dl_cancel *x, struct pollfd *fds, int n, int ms) {
    if (dl_canceled(x)) return -2;
    fds[n].fd = x->own;
    fds[n].events = POLLIN;
    fds[n].revents = 0;
    int r = poll(fds, (nfds_t)n + (x->own >= 0), ms);
    if (r > 0 && x->own >= 0 && fds[n].revents) {
        dl_cancel_drain(x);
        r--;
    }
    if (dl_canceled(x)) return -2;
    return r < 0 ? 0 : r;
}

int dl_cancel_poll_ask(dl_cancel *x, const int64_t *asked, struct pollfd *fds, int n, int ms) {
    if (!*asked) return x ? dl_cancel_poll(x, fds, n, ms) : poll(fds, (nfds_t)n, ms);
    int64_t again = *asked + DL_CANCEL_ASK_AGAIN_MS - dl_now_ms();
    if (again <= 0) return -2;
    if (ms < 0 || again < ms) ms = (int)again;
    int r = poll(fds, (nfds_t)n, ms);
    return r == 0 && dl_now_ms() >= *asked + DL_CANCEL_ASK_AGAIN_MS ? -2 : r;
}

int dl_cancel_nap(dl_cancel *x, int64_t ms) {
    int64_t end = dl_now_ms() + ms;
    struct pollfd p[1];
    for (;;) {
        int64_t left = end - dl_now_ms();
        if (left <= 0) return dl_canceled(x);
        if (dl_cancel_poll(x, p, 0, left > INT_MAX ? INT_MAX : (int)left) == -2) return 1;
    }
}

int dl_cancel_name_err(const char *name, size_t name_len, dl_err *err) {
    char nm[80];
    return dl_seterr(err, DLOCK_ECANCELED, "waiting for lock '%s' was cancelled",
                     dl_name_msg(name, name_len, nm, sizeof nm));
}
