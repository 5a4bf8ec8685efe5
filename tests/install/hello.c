/* Built against the installed library through pkg-config by test_install.sh. */
#include <dlock.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (strcmp(dlock_version(), argc > 1 ? argv[1] : "") != 0) {
        fprintf(stderr, "version %s, expected %s\n", dlock_version(), argc > 1 ? argv[1] : "?");
        return 1;
    }
    dlock_options o;
    dlock_options_init(&o);
    o.url = argc > 2 ? argv[2] : NULL;
    dlock_client *c;
    if (dlock_client_new(&o, &c) != DLOCK_OK) {
        fprintf(stderr, "hello: %s\n", dlock_errmsg(c));
        dlock_client_free(c);
        return 1;
    }
    dlock_lock *l;
    uint64_t fence = 0;
    int rc = dlock_lock_new(c, "hello", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l);
    if (!rc) rc = dlock_acquire(l, DLOCK_NOWAIT, 5000, &fence);
    if (!rc) rc = dlock_release(l);
    printf("hello: %s, fence %llu\n", dlock_strerror(rc), (unsigned long long)fence);
    dlock_lock_free(l);
    dlock_client_free(c);
    return rc != DLOCK_OK;
}
