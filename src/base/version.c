/* The runtime version call; the numbers live in include/dlock.h. */
#include "base.h"


const char *dlock_version(void) {
    return DL_STR(DLOCK_VERSION_MAJOR) "." DL_STR(DLOCK_VERSION_MINOR) "." DL_STR(
        DLOCK_VERSION_PATCH);
}

unsigned dlock_version_num(void) { return DLOCK_VERSION_NUM; }
