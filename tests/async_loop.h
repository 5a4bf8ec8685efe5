/* The event loops the async API's tests run on (tests/test_async.c,
 * tests/test_async_faults.c): libuv ("uv"), libevent ("event") or the bare
 * interface driven by poll(2) ("bare"), picked by the test's argument
 * "<case>_<loop>"; a loop whose library was not found at build time skips.
 * Beside them, the helpers both use: clients bound to the loop, operations'
 * outcomes counted, timers of the test's own, a blocking holder thread. */
#ifndef DLOCK_TEST_ASYNC_LOOP_H
#define DLOCK_TEST_ASYNC_LOOP_H

#include <stdatomic.h>

#include "dlock_async.h"
#include "harness.h"

/* Runs the loop one turn (at most about 5 ms when nothing happens), then
 * the test's timers that are due. */
void loop_once(void);
void run_for(int64_t ms);
/* fn(arg) from a loop turn ms from now. */
void after(int64_t ms, void (*fn)(void *), void *arg);

#define RUN_UNTIL(cond, ms)                                                              \
    do {                                                                                 \
        int64_t ru_dl_ = th_now_ms() + (ms);                                             \
        while (!(cond)) {                                                                \
            if (th_now_ms() > ru_dl_)                                                    \
                th_fail(__FILE__, __LINE__, "not true within %d ms: %s", (int)(ms), #cond); \
            loop_once();                                                                 \
        }                                                                                \
    } while (0)

/* A client on the loop under test (command timeout 2 s, connect 1 s). */
int client_new(const char *url, const char *password, dlock_async_client **out);
/* The same with every option of opts (timeouts 0: those above). */
int client_new_opts(dlock_options *opts, dlock_async_client **out);
/* A client on the loop under test whose shipped adapter (libuv's,
 * libevent's) is told slot + offset for each slot of the library, so that
 * its table must grow past offset; fail (may be NULL): when *fail > 0, each
 * watch with events counts it down, and the one that brings it to 0 fails
 * (the adapter refuses it). Bare: a plain client. One such client at a
 * time. */
int client_new_spread(const char *url, int offset, int *fail, dlock_async_client **out);
/* The size of the spread client's adapter table (-1: bare, or freed). */
int spread_room(void);
/* 1 on the bare loop. */
int loop_is_bare(void);
/* A client of s; fails the test if it cannot be made. */
dlock_async_client *client(const th_server *s);
/* The loop stops driving c (a bare loop's list), then c is freed. */
void forget(dlock_async_client *c);
void client_free(dlock_async_client *c);
/* A plain handle; fails the test if it cannot be made. */
dlock_async_lock *alock(dlock_async_client *c, const char *name);

/* one operation's outcome */
typedef struct res {
    int calls;     /* how many times the callback ran */
    int code;
    uint64_t fence;
    int64_t at;    /* when (th_now_ms) */
} res;

/* The callback that records an outcome in its res (udata). */
void on_done(dlock_async_lock *l, int code, uint64_t fence, void *ud);
/* The callbacks run in all over n outcomes. */
int calls(const res *r, int n);
#define START(expr) ASSERT_CODE(expr, DLOCK_OK)
#define WAIT_DONE(r, ms) RUN_UNTIL((r).calls > 0, ms)

/* try-once acquire of l, which must succeed */
void hold(dlock_async_lock *l, int64_t lease_ms, res *r);

/* A blocking plain holder in a thread of its own: acquires name (waiting),
 * sets go, holds hold_ms, releases. */
typedef struct blocker {
    const th_server *s;
    const char *name;
    int64_t hold_ms;     /* acquire at once, hold this long, release */
    int64_t released_at, acquired_at;
    atomic_int go;         /* set once it holds (its times are read after the join) */
} blocker;
void *blocking_holder(void *arg);

/* The test's cases: argv[1] is "<case>_<loop>". */
typedef struct async_case {
    const char *name;
    void (*run)(th_server *s);
} async_case;
/* Picks the loop and the case (cases ends with a NULL name), starts a
 * server, runs it, checks that the loop closes clean. */
int async_main(int argc, char **argv, const char *name, const async_case *cases);

#endif
