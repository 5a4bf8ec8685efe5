/* Numbers and ids: the decimal formatter of the hot paths, the thread id. */
#include <sys/syscall.h>
#include <unistd.h>

#include "base.h"

size_t dl_fmt_ll(char *buf, long long v) {
    /* no snprintf: this runs for every lease and count on the hot path */
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    char tmp[24];
    size_t n = 0, k = 0;
    do tmp[n++] = (char)('0' + u % 10), u /= 10;
    while (u);
    if (v < 0) buf[k++] = '-';
    while (n) buf[k++] = tmp[--n];
    buf[k] = '\0';
    return k;
}

long dl_thread_id(void) { return (long)syscall(SYS_gettid); }
