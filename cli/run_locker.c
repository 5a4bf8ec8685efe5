/* `dlock run`: the locker thread, which alone acquires and releases the
 * locks, and the session checker, which asks about holds kept by a session.
 * (The threads and signals: cmd_run.c.) */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "run.h"

int64_t run_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void run_write_byte(int fd, char b)
{
    ssize_t r;
    do
        r = write(fd, &b, 1);
    while (r < 0 && errno == EINTR);
}

int run_read_byte(int fd, char *b)
{
    ssize_t r;
    do
        r = read(fd, b, 1);
    while (r < 0 && errno == EINTR);
    return r == 1 ? 0 : -1;
}

void run_copy_msg(char *dst, const char *src)
{
    snprintf(dst, MSG_MAX, "%s", src ? src : "");
}

/* The message of the first lock that has one (a multi-lock failure leaves
 * it on the lock that failed). */
const char *run_locks_errmsg(const locker *lk)
{
    size_t i;
    for (i = 0; i < lk->nlocks; i++) {
        const char *m = dlock_lock_errmsg(lk->locks[i]);
        if (m && *m)
            return m;
    }
    return "";
}

void *run_locker_main(void *arg)
{
    locker *lk = arg;
    int64_t t0 = run_now_us();
    char b;

    if (lk->permits) {
        int set = 0;
        lk->acquire_rc = dlock_permits_try_set(lk->permits, lk->limit, &set);
        if (lk->acquire_rc == DLOCK_OK)
            lk->acquire_rc =
                dlock_permits_acquire(lk->permits, lk->wait_ms, DLOCK_WATCHDOG, lk->permit_id);
        if (lk->acquire_rc != DLOCK_OK)
            run_copy_msg(lk->acquire_msg, dlock_permits_errmsg(lk->permits));
    } else if (lk->sem) {
        int set = 0;
        lk->acquire_rc = dlock_semaphore_try_set(lk->sem, lk->limit, &set);
        if (lk->acquire_rc == DLOCK_OK)
            lk->acquire_rc = dlock_semaphore_acquire(lk->sem, 1, lk->wait_ms);
        if (lk->acquire_rc != DLOCK_OK)
            run_copy_msg(lk->acquire_msg, dlock_semaphore_errmsg(lk->sem));
    } else if (lk->nlocks == 1) {
        lk->acquire_rc = dlock_acquire(lk->locks[0], lk->wait_ms, DLOCK_WATCHDOG, &lk->fence);
        if (lk->acquire_rc != DLOCK_OK)
            run_copy_msg(lk->acquire_msg, dlock_lock_errmsg(lk->locks[0]));
    } else {
        lk->acquire_rc =
            dlock_multi_acquire(lk->locks, lk->nlocks, lk->wait_ms, DLOCK_WATCHDOG, lk->fences);
        if (lk->acquire_rc == DLOCK_OK)
            lk->fence = lk->fences[0];
        else
            run_copy_msg(lk->acquire_msg, run_locks_errmsg(lk));
    }
    lk->took_us = run_now_us() - t0;
    run_write_byte(lk->done_pipe[1], 'a');
    if (lk->acquire_rc != DLOCK_OK)
        return NULL;
    (void)run_read_byte(lk->cmd_pipe[0], &b); /* a byte or EOF: release now */
    if (lk->permits) {
        lk->release_rc = dlock_permits_release(lk->permits, lk->permit_id);
        if (lk->release_rc != DLOCK_OK)
            run_copy_msg(lk->release_msg, dlock_permits_errmsg(lk->permits));
    } else if (lk->sem) {
        lk->release_rc = dlock_semaphore_release(lk->sem, 1);
        if (lk->release_rc != DLOCK_OK)
            run_copy_msg(lk->release_msg, dlock_semaphore_errmsg(lk->sem));
    } else {
        lk->release_rc = lk->nlocks == 1 ? dlock_release(lk->locks[0])
                                         : dlock_multi_release(lk->locks, lk->nlocks);
        if (lk->release_rc != DLOCK_OK)
            run_copy_msg(lk->release_msg, run_locks_errmsg(lk));
    }
    run_write_byte(lk->done_pipe[1], 'r');
    return NULL;
}

/* A signal came while the locker waits: cancel its wait, so that it leaves
 * the lock's queue or waiter registry (and gives back a lock handed to it
 * meanwhile) instead of leaving a dead entry that others wait behind. If the
 * acquire won the race, release. Bounded by CANCEL_GRACE_MS per step. If a
 * cancel is refused (DLOCK_ENOTSUP), dlock just exits. 1 when the locker
 * thread has said its last word (it returns right after: join it). */
#define CANCEL_GRACE_MS 5000
int run_readable_within(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    int n;
    do
        n = poll(&p, 1, ms);
    while (n < 0 && errno == EINTR);
    return n > 0;
}

int run_give_up_waiting(locker *lk)
{
    char b;
    if (lk->permits) {
        if (dlock_permits_cancel(lk->permits) != DLOCK_OK)
            return 0;
    } else if (lk->sem) {
        if (dlock_semaphore_cancel(lk->sem) != DLOCK_OK)
            return 0;
    } else {
        for (size_t i = 0; i < lk->nlocks; i++)
            if (dlock_lock_cancel(lk->locks[i]) != DLOCK_OK)
                return 0; /* refused: just exit */
    }
    if (!run_readable_within(lk->done_pipe[0], CANCEL_GRACE_MS) ||
        run_read_byte(lk->done_pipe[0], &b))
        return 0;
    if (lk->acquire_rc != DLOCK_OK)
        return 1;
    run_write_byte(lk->cmd_pipe[1], 'r');
    return run_readable_within(lk->done_pipe[0], CANCEL_GRACE_MS) &&
           run_read_byte(lk->done_pipe[0], &b) == 0;
}

/* The session checker: a hold kept by a session (MySQL GET_LOCK, PostgreSQL
 * advisory locks: no lease, no renewal, nothing that calls back) is lost
 * with its session, which tells nobody; this thread asks the server every
 * SESSION_CHECK_MS, apart from the supervising loop (a check can take up to
 * the command timeout when the server does not answer, and signals must be
 * forwarded meanwhile). It reads the handles only; the locker thread is
 * idle while the command runs, and the checker is stopped before the
 * release. */
void *run_session_main(void *arg)
{
    locker *lk = arg;
    for (;;) {
        if (run_readable_within(lk->check_stop[0], SESSION_CHECK_MS))
            return NULL;
        for (size_t i = 0; i < lk->nlocks; i++) {
            if (!lk->session_kept[i])
                continue;
            int held = 0, rc = dlock_lock_check(lk->locks[i], &held, NULL);
            if (rc == DLOCK_OK && held)
                continue;
            atomic_store(&lk->session_lost, (int)i + 1); /* before the pipe's byte */
            run_write_byte(lk->lost_fd, (char)(rc == DLOCK_OK || rc == DLOCK_ELOST
                                                   ? LOST_SESSION
                                                   : LOST_UNANSWERED));
            return NULL;
        }
    }
}

/* The lost-lease callback (watchdog thread): only a pipe write. */
void run_on_lost(dlock_lock *l, int reason, void *userdata)
{
    int fd = *(const int *)userdata;
    (void)l;
    run_write_byte(fd, (char)reason);
}

/* The lost-permit callbacks (--limit; watchdog or session thread): the same. */
void run_on_permit_lost(dlock_permits *p, const char *id, int reason, void *userdata)
{
    int fd = *(const int *)userdata;
    (void)p, (void)id;
    run_write_byte(fd, (char)reason);
}

void run_on_sem_lost(dlock_semaphore *s, int reason, void *userdata)
{
    int fd = *(const int *)userdata;
    (void)s;
    run_write_byte(fd, (char)reason);
}

