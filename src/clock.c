/* Monotonic time: every lease computation uses CLOCK_MONOTONIC. */
#include <errno.h>
#include <time.h>

#include "internal.h"

int64_t dl_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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
