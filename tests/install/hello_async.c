/* Built against the installed library through pkg-config by test_install.sh:
 * the async API's header, driven by the bare interface (poll). */
#include <dlock_async.h>
#include <poll.h>
#include <stdio.h>

static int state; /* 0 acquiring, 1 releasing, 2 done */
static int result = -1;

static void done(dlock_async_lock *l, int code, uint64_t fence, void *ud) {
    (void)ud;
    if (code != DLOCK_OK) {
        fprintf(stderr, "hello_async: %s\n", dlock_async_lock_errmsg(l));
        result = code;
        state = 2;
    } else if (state == 0) {
        printf("hello_async: acquired, fence %llu\n", (unsigned long long)fence);
        state = 1;
        if ((result = dlock_async_release(l, done, NULL)) != DLOCK_OK) state = 2;
    } else {
        result = DLOCK_OK;
        state = 2;
    }
}

int main(int argc, char **argv) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = argc > 1 ? argv[1] : NULL;
    dlock_async_client *c;
    dlock_async_lock *l;
    int rc = dlock_async_client_new(&o, NULL, &c);
    if (!rc) rc = dlock_async_lock_new(c, "hello-async", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l);
    if (!rc) rc = dlock_async_acquire(l, DLOCK_NOWAIT, 5000, done, NULL);
    while (!rc && state != 2) {
        dlock_async_pollfd f[8];
        struct pollfd p[8];
        int n = dlock_async_fds(c, f, 8);
        if (n > 8) n = 8; /* one server: 2 at most */
        for (int i = 0; i < n; i++) {
            p[i].fd = f[i].fd;
            p[i].events = (short)(((f[i].events & DLOCK_ASYNC_READ) ? POLLIN : 0) |
                                  ((f[i].events & DLOCK_ASYNC_WRITE) ? POLLOUT : 0));
        }
        poll(p, (nfds_t)n, (int)dlock_async_timeout(c));
        for (int i = 0; i < n && state != 2; i++) {
            if (!p[i].revents) continue;
            dlock_async_process(c, p[i].fd,
                                ((p[i].revents & (POLLIN | POLLERR | POLLHUP)) ? DLOCK_ASYNC_READ : 0) |
                                    ((p[i].revents & POLLOUT) ? DLOCK_ASYNC_WRITE : 0));
        }
        dlock_async_process(c, -1, 0);
        rc = result > 0 ? result : DLOCK_OK;
    }
    if (rc) fprintf(stderr, "hello_async: %s\n", dlock_async_errmsg(c));
    dlock_async_client_free(c);
    return rc != DLOCK_OK;
}
