/* Durations for options and the CLI: "250ms", "1.5s", "30s", "5m", "1h", "2d";
 * a bare number means seconds. Parsed by hand: no locale, no exponent. */
#include <string.h>

#include "base.h"

#define DL_DURATION_MAX_MS (1LL << 53)

int dlock_parse_duration(const char *s, int64_t *ms) {
    if (!s || !ms) return DLOCK_EINVAL;
    const char *p = s;
    uint64_t whole = 0, frac = 0, scale = 1;
    int digits = 0, fdigits = 0;
    while (*p >= '0' && *p <= '9') {
        if (++digits > 16) return DLOCK_EINVAL;
        whole = whole * 10 + (uint64_t)(*p++ - '0');
    }
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9') {
            if (fdigits < 9) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                scale *= 10;
                fdigits++;
            }
            p++;
            digits++;
        }
        if (fdigits == 0) return DLOCK_EINVAL; /* "1." */
    }
    if (digits == 0) return DLOCK_EINVAL;
    uint64_t unit;
    if (*p == '\0' || strcmp(p, "s") == 0) unit = 1000;
    else if (strcmp(p, "ms") == 0) unit = 1;
    else if (strcmp(p, "m") == 0) unit = 60000;
    else if (strcmp(p, "h") == 0) unit = 3600000;
    else if (strcmp(p, "d") == 0) unit = 86400000;
    else return DLOCK_EINVAL;
    if (whole > (uint64_t)DL_DURATION_MAX_MS / unit) return DLOCK_EINVAL;
    uint64_t v = whole * unit;
    /* fraction: frac/scale of a unit, rounded to the nearest ms */
    uint64_t f = (frac * unit + scale / 2) / scale;
    v += f;
    if (v > (uint64_t)DL_DURATION_MAX_MS) return DLOCK_EINVAL;
    *ms = (int64_t)v;
    return DLOCK_OK;
}
