/* The library's clock: CLOCK_BOOTTIME for every lease, deadline and
 * timeout. It is monotonic, like CLOCK_MONOTONIC, and it also counts the time
 * the system spends suspended: the server's lease runs on during a suspend,
 * so a lease counted on CLOCK_MONOTONIC would still look valid after a
 * resume (dlock_lock_valid_ms over-reporting). Condition variables cannot use
 * it (pthread_condattr_setclock takes CLOCK_MONOTONIC or CLOCK_REALTIME): the
 * library's timed waits give them CLOCK_MONOTONIC timeouts relative to now
 * and re-check the time on this clock when they wake; poll(2) timeouts are
 * relative too. A kernel without CLOCK_BOOTTIME (before 2.6.39) gets
 * CLOCK_MONOTONIC. */
#include <errno.h>
#include <time.h>

#include "base.h"

int64_t dl_now_us(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_BOOTTIME, &ts) != 0) clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t dl_now_ms(void) { return dl_now_us() / 1000; }

void dl_sleep_ms(int64_t ms) {
    if (ms <= 0) return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

int64_t dl_deadline(int64_t ms) {
    if (ms < 0) return DL_INF_DEADLINE;
    int64_t now = dl_now_ms();
    if (ms > DL_INF_DEADLINE - now) return DL_INF_DEADLINE;
    return now + ms;
}

void dl_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* The deadline is on the library's clock, the condition variable on
 * CLOCK_MONOTONIC (the top of the file): the wait is the time left from now. */
void dl_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline) {
    if (deadline == DL_INF_DEADLINE) {
        pthread_cond_wait(cv, mu);
        return;
    }
    int64_t left = deadline - dl_now_ms();
    if (left <= 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(left / 1000);
    ts.tv_nsec += (long)(left % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}
