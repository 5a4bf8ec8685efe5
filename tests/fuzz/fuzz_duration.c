/* libFuzzer target: dlock_parse_duration() on arbitrary text (issue 8).
 * Checks the contract too: DLOCK_OK or DLOCK_EINVAL, and an OK result lies in
 * 0..2^53 ms. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    int64_t ms = -12345;
    int rc = dlock_parse_duration(s, &ms);
    if (rc != DLOCK_OK && rc != DLOCK_EINVAL) abort();
    if (rc == DLOCK_OK && (ms < 0 || ms > ((int64_t)1 << 53))) abort();
    /* NULL arguments are refused, never dereferenced */
    if (dlock_parse_duration(s, NULL) != DLOCK_EINVAL) abort();
    free(s);
    return 0;
}
