/* Randomness for owner tokens, client ids and retry jitter: getrandom(2). */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "base.h"

int dl_random_bytes(void *buf, size_t len, dl_err *err) {
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return dl_seterr(err, DLOCK_ESYS, "getrandom failed: %s", strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    return DLOCK_OK;
}

int dl_random_hex(char *out, size_t nbytes, dl_err *err) {
    unsigned char raw[64];
    if (nbytes > sizeof raw) return dl_seterr(err, DLOCK_EINVAL, "token too long");
    int rc = dl_random_bytes(raw, nbytes, err);
    if (rc) return rc;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < nbytes; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[2 * nbytes] = '\0';
    return DLOCK_OK;
}

uint64_t dl_random_below(uint64_t n) {
    uint64_t v = 0;
    if (n == 0 || dl_random_bytes(&v, sizeof v, NULL) != DLOCK_OK) return 0;
    return v % n;
}
