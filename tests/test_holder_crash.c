/* SIGKILL of a holder frees the lock within one lease: a child process holds
 * the lock (explicit 1 s lease, or watchdog with watchdog_lease_ms = 1000) and
 * is killed; a waiter then gets the lock within lease + margin. Both kinds. */
#include "harness.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#define LEASE 1000
#define MARGIN 800

static void holder(const th_server *s, const char *name, dlock_kind kind, int watchdog, int fd)
{
    dlock_client *c = th_client(s, LEASE);
    dlock_lock *l = th_lock(c, name, kind);
    ASSERT_LOK(l, dlock_acquire(l, 5000, watchdog ? DLOCK_WATCHDOG : LEASE, NULL));
    char b = 'H';
    ASSERT_EQ(write(fd, &b, 1), 1);
    for (;;) pause(); /* killed here, holding */
}

static void scenario(const th_server *s, const char *name, dlock_kind kind, int watchdog)
{
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = th_fork();
    if (pid == 0) {
        close(p[0]);
        holder(s, name, kind, watchdog, p[1]);
    }
    close(p[1]);
    struct pollfd pfd = {p[0], POLLIN, 0};
    ASSERT_EQ(poll(&pfd, 1, 10000), 1);
    char b = 0;
    ASSERT_EQ(read(p[0], &b, 1), 1);
    ASSERT_EQ(b, 'H');
    close(p[0]);

    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, name, kind);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    if (watchdog) {
        /* outlive one lease first, so the watchdog has renewed it */
        th_sleep_ms(LEASE + 200);
        ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    }
    int64_t t_kill = th_now_ms();
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(th_wait_child(pid, 5000), 128 + SIGKILL);
    ASSERT_LOK(l, dlock_acquire(l, 10000, 5000, NULL));
    int64_t took = th_now_ms() - t_kill;
    th_log("%s (%s, %s): waiter had it %lld ms after SIGKILL", name,
           kind == DLOCK_KIND_PLAIN ? "plain" : "reentrant", watchdog ? "watchdog" : "1 s lease",
           (long long)took);
    ASSERT_LE(took, LEASE + MARGIN);
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);
    dlock_client_free(c);
}

int main(void)
{
    th_init("holder_crash");
    th_server *s = th_server_start(NULL);
    scenario(s, "crash:plain", DLOCK_KIND_PLAIN, 0);
    scenario(s, "crash:plain:wd", DLOCK_KIND_PLAIN, 1);
    scenario(s, "crash:re", DLOCK_KIND_REENTRANT, 0);
    scenario(s, "crash:re:wd", DLOCK_KIND_REENTRANT, 1);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
