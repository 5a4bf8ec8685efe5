/* The README's C quick start, whole: take a lock, work under it, release it.
 * Build: cc quickstart.c $(pkg-config --cflags --libs dlock) -o quickstart
 * Run:   DLOCK_URL=redis://127.0.0.1:6379 ./quickstart */
#include <dlock.h>
#include <stdint.h>
#include <stdio.h>

int main(void) {
    dlock_client *c;
    if (dlock_client_new(NULL, &c) != DLOCK_OK) { /* $DLOCK_URL or redis://127.0.0.1:6379 */
        fprintf(stderr, "dlock: %s\n", dlock_errmsg(c));
        dlock_client_free(c);
        return 1;
    }
    dlock_lock *lock;
    if (dlock_lock_new(c, "order:voucher:42", DLOCK_CSTR, DLOCK_KIND_PLAIN, &lock) != DLOCK_OK) {
        fprintf(stderr, "dlock: %s\n", dlock_errmsg(c));
        dlock_client_free(c);
        return 1;
    }

    uint64_t fence;
    int rc = dlock_acquire(lock, 5000 /* wait up to 5 s */, DLOCK_WATCHDOG, &fence);
    if (rc == DLOCK_OK) {
        /* critical section; hand `fence` to the resource you write to */
        printf("holding the lock, fencing token %llu\n", (unsigned long long)fence);
        rc = dlock_release(lock);
        if (rc != DLOCK_OK) fprintf(stderr, "dlock: %s\n", dlock_lock_errmsg(lock));
    } else if (rc == DLOCK_ETIMEDOUT) {
        fprintf(stderr, "someone else held the lock for 5 s\n");
    } else {
        fprintf(stderr, "dlock: %s\n", dlock_lock_errmsg(lock));
    }
    dlock_lock_free(lock);
    dlock_client_free(c);
    return rc == DLOCK_OK ? 0 : 1;
}
