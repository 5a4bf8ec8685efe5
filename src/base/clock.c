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
