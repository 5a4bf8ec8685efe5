/* Allocation-failure injection: the main paths are run again and again, with
 * the 1st, 2nd, 3rd... allocation failing (this executable's malloc family
 * interposes the C library's, hiredis' allocations included). Every run must
 * end with DLOCK_OK or a clean DLOCK_ENOMEM: no crash, and every allocation
 * of the run freed. Not built with sanitizers, which bring their own
 * allocator. */
#include "harness.h"

#include <stdlib.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static __thread int in_hook;
static long nalloc;     /* allocations counted since arming */
static long fail_at;    /* the allocation that fails (1-based); 0: none */
static long live;       /* allocations not freed yet, since arming */
static int armed;
static long injected;

static int should_fail(void)
{
    if (!armed || in_hook) return 0;
    long n = __atomic_add_fetch(&nalloc, 1, __ATOMIC_SEQ_CST);
    if (n == fail_at) {
        __atomic_add_fetch(&injected, 1, __ATOMIC_SEQ_CST);
        return 1;
    }
    return 0;
}

/* Every block carries a header so that free can tell whether it was made
 * while armed (and so counts against "live"). */
#define HDR 16
static void *wrap(void *raw, int counted)
{
    if (!raw) return NULL;
    *(long *)raw = counted ? 0x5eed : 0;
    if (counted) __atomic_add_fetch(&live, 1, __ATOMIC_SEQ_CST);
    return (char *)raw + HDR;
}

void *malloc(size_t n)
{
    if (should_fail()) return NULL;
    return wrap(__libc_malloc(n + HDR), armed && !in_hook);
}

void *calloc(size_t a, size_t b)
{
    if (b && a > (size_t)-1 / b - HDR) return NULL;
    if (should_fail()) return NULL;
    return wrap(__libc_calloc(1, a * b + HDR), armed && !in_hook);
}

void free(void *p)
{
    if (!p) return;
    char *raw = (char *)p - HDR;
    if (*(long *)raw == 0x5eed) __atomic_sub_fetch(&live, 1, __ATOMIC_SEQ_CST);
    __libc_free(raw);
}

void *realloc(void *p, size_t n)
{
    if (!p) return malloc(n);
    if (n == 0) {
        free(p);
        return NULL;
    }
    if (should_fail()) return NULL;
    char *raw = (char *)p - HDR;
    char *nr = __libc_realloc(raw, n + HDR);
    return nr ? nr + HDR : NULL; /* keeps its header, so its "counted" mark */
}

static void arm(long k)
{
    nalloc = 0;
    live = 0;
    fail_at = k;
    armed = 1;
}

static void disarm(void) { armed = 0; }

static int ok_or_oom(int rc) { return rc == DLOCK_OK || rc == DLOCK_ENOMEM; }

/* One pass over the main paths; returns 1 if an injected failure was seen. */
static void scenario(const th_server *s, redisContext *rc, int watchdog, long k, long *total)
{
    long before = injected;
    arm(k);
    dlock_options o;
    dlock_options_init(&o);
    o.url = th_server_url(s);
    o.watchdog_lease_ms = 600;
    dlock_client *c = NULL;
    int r = dlock_client_new(&o, &c);
    ASSERT_MSG(ok_or_oom(r), "k=%ld client_new: %d %s", k, r, c ? dlock_errmsg(c) : "");
    if (r == DLOCK_OK) {
        dlock_lock *l = NULL;
        r = dlock_lock_new(c, "alloc:lock", DLOCK_CSTR,
                           watchdog ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN, &l);
        ASSERT_MSG(ok_or_oom(r), "k=%ld lock_new: %d", k, r);
        if (r == DLOCK_OK) {
            r = dlock_acquire(l, 200, watchdog ? DLOCK_WATCHDOG : 5000, NULL);
            ASSERT_MSG(ok_or_oom(r) || r == DLOCK_ETIMEDOUT, "k=%ld acquire: %d %s", k, r,
                       dlock_lock_errmsg(l));
            if (r == DLOCK_OK) {
                int held;
                int64_t cnt;
                r = dlock_lock_check(l, &held, &cnt);
                ASSERT_MSG(ok_or_oom(r), "k=%ld check: %d %s", k, r, dlock_lock_errmsg(l));
                r = dlock_release(l);
                ASSERT_MSG(ok_or_oom(r), "k=%ld release: %d %s", k, r, dlock_lock_errmsg(l));
            }
            dlock_info info;
            r = dlock_inspect(c, "alloc:lock", DLOCK_CSTR, &info);
            ASSERT_MSG(ok_or_oom(r), "k=%ld inspect: %d %s", k, r, dlock_errmsg(c));
            char tok[DLOCK_TOKEN_LEN + 1];
            r = dlock_acquire_token(c, "alloc:tok", DLOCK_CSTR, 0, 5000, tok, NULL);
            ASSERT_MSG(ok_or_oom(r), "k=%ld acquire_token: %d %s", k, r, dlock_errmsg(c));
            if (r == DLOCK_OK) {
                r = dlock_release_token(c, "alloc:tok", DLOCK_CSTR, tok);
                ASSERT_MSG(ok_or_oom(r), "k=%ld release_token: %d %s", k, r, dlock_errmsg(c));
            }
            dlock_lock_free(l);
        }
    }
    dlock_client_free(c);
    long count = nalloc, leaked = live;
    disarm();
    if (k >= 0) ASSERT_MSG(leaked == 0, "k=%ld: %ld allocation(s) not freed", k, leaked);
    *total = count;
    /* an OOM after the server ran a script can leave its lock behind until
     * the lease ends: clear it for the next pass */
    freeReplyObject(redisCommand(rc, "DEL alloc:lock alloc:tok"));
    (void)before;
}

static void scenario_warm(const th_server *s, redisContext *rc, int watchdog)
{
    long total;
    live = 0;
    scenario(s, rc, watchdog, -1, &total);
}

int main(void)
{
    th_init("alloc");
    th_server *s = th_server_start(NULL);
    redisContext *rc = th_redis(s);
    for (int watchdog = 0; watchdog < 2; watchdog++) {
        long total = 0, k = 1;
        /* a first pass does the one-time initialisations that stay for the
         * process's life (OpenSSL's tables, the resolver's modules, script
         * digests); the second counts a pass's own allocations */
        scenario_warm(s, rc, watchdog);
        scenario(s, rc, watchdog, 0, &total);
        long clean = total;
        ASSERT_GT(clean, 10);
        for (k = 1; k <= clean + 5; k++) scenario(s, rc, watchdog, k, &total);
        th_log("%s: %ld allocations, each failed in turn: clean ENOMEM every time",
               watchdog ? "reentrant + watchdog" : "plain", clean);
    }
    ASSERT_GT(injected, 20);
    redisFree(rc);
    th_server_stop(s);
    th_log("ok (%ld failures injected)", injected);
    return 0;
}
