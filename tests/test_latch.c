/* Countdown latch (Redisson RCountDownLatch layout): 8 waiter processes are
 * released when the count reaches zero and none before (each records the
 * count it reads at wake-up, which must be 0, and its wake-up time, which
 * must follow the last count_down); an await bound times out on time;
 * try_set / set / count_down / count semantics, the key and the messages
 * ("1" on a new count, "0" at zero) on
 * "redisson_countdownlatch__channel__{name}", braces added to names with a
 * hash tag of their own too, as Redisson does (a Redisson count-down wakes
 * a dlock waiter at once, a dlock one is heard on Redisson's channel); bad
 * input. */
/* Children free what they made and end with _exit(): the handles they
 * inherit from the parent would otherwise show as leaks under LeakSanitizer. */
#include "harness.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>

#define MARGIN 800
#define NWAITERS 8

#define ASSERT_LAOK(l, expr) TH_CODE_(expr, DLOCK_OK, dlock_latch_errmsg(l))
#define ASSERT_LACODE(l, expr, want) TH_CODE_(expr, want, dlock_latch_errmsg(l))

static dlock_latch *latch(dlock_client *c, const char *name)
{
    dlock_latch *l = NULL;
    ASSERT_CCODE(c, dlock_latch_new(c, name, DLOCK_CSTR, &l), DLOCK_OK);
    ASSERT_NOT_NULL(l);
    return l;
}

static int64_t count(dlock_latch *l)
{
    int64_t n = -999;
    ASSERT_LAOK(l, dlock_latch_count(l, &n));
    return n;
}

/* The next message on a subscribed raw connection: its payload (malloc'd). */
static char *next_message(redisContext *sub, const char *channel)
{
    void *m = NULL;
    ASSERT_EQ(redisGetReply(sub, &m), REDIS_OK);
    redisReply *r = m;
    ASSERT(r->type == REDIS_REPLY_ARRAY && r->elements == 3);
    ASSERT_STR_EQ(r->element[0]->str, "message");
    ASSERT_STR_EQ(r->element[1]->str, channel);
    char *p = strdup(r->element[2]->str);
    freeReplyObject(r);
    return p;
}

static void expect_message(redisContext *sub, const char *channel, const char *want)
{
    char *p = next_message(sub, channel);
    ASSERT_STR_EQ(p, want);
    free(p);
}

static void basics(const th_server *srv, dlock_client *c, redisContext *rc)
{
    const char *chan = "redisson_countdownlatch__channel__{la:basic}";
    redisContext *sub = th_redis(srv);
    struct timeval tv = {5, 0};
    redisSetTimeout(sub, tv);
    freeReplyObject(th_cmd(sub, "SUBSCRIBE %s", chan));

    dlock_latch *l = latch(c, "la:basic");
    ASSERT_EQ(count(l), 0); /* absent: zero */
    ASSERT_LAOK(l, dlock_latch_await(l, DLOCK_NOWAIT)); /* at zero: at once */
    ASSERT_LAOK(l, dlock_latch_await(l, 1000));
    int set = -1;
    ASSERT_LAOK(l, dlock_latch_try_set(l, 3, &set));
    ASSERT_EQ(set, 1);
    expect_message(sub, chan, "1");
    char *v = th_cmd_str(rc, "GET la:basic");
    ASSERT_STR_EQ(v, "3");
    free(v);
    ASSERT_LAOK(l, dlock_latch_try_set(l, 5, &set));
    ASSERT_EQ(set, 0); /* not at zero: unchanged */
    ASSERT_EQ(count(l), 3);
    ASSERT_LACODE(l, dlock_latch_await(l, DLOCK_NOWAIT), DLOCK_ETIMEDOUT);
    ASSERT(strlen(dlock_latch_errmsg(l)) > 0);
    ASSERT_LAOK(l, dlock_latch_count_down(l, 1));
    ASSERT_EQ(count(l), 2);
    ASSERT_LAOK(l, dlock_latch_count_down(l, 5)); /* not below zero */
    ASSERT_EQ(count(l), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS la:basic"), 0); /* deleted at zero */
    expect_message(sub, chan, "0");
    ASSERT_LAOK(l, dlock_latch_count_down(l, 1)); /* at zero: nothing */
    ASSERT_EQ(count(l), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS la:basic"), 0);

    /* set: unconditional; 0 deletes and wakes */
    ASSERT_LAOK(l, dlock_latch_set(l, 4));
    expect_message(sub, chan, "1");
    ASSERT_EQ(count(l), 4);
    ASSERT_LAOK(l, dlock_latch_set(l, 7));
    expect_message(sub, chan, "1");
    ASSERT_EQ(count(l), 7);
    ASSERT_LAOK(l, dlock_latch_count_down(l, 6));
    ASSERT_EQ(count(l), 1);
    ASSERT_LAOK(l, dlock_latch_set(l, 0));
    expect_message(sub, chan, "0");
    ASSERT_EQ(th_cmd_int(rc, "EXISTS la:basic"), 0);
    ASSERT_LAOK(l, dlock_latch_try_set(l, 2, &set)); /* at zero again: sets */
    ASSERT_EQ(set, 1);
    expect_message(sub, chan, "1");
    ASSERT_LAOK(l, dlock_latch_count_down(l, 1));
    ASSERT_LAOK(l, dlock_latch_count_down(l, 1));
    expect_message(sub, chan, "0");
    redisFree(sub);

    /* binary-safe names; a name with braces keeps them in the channel */
    dlock_latch *b = NULL;
    ASSERT_CCODE(c, dlock_latch_new(c, "la\0bin", 6, &b), DLOCK_OK);
    ASSERT_LAOK(b, dlock_latch_set(b, 2));
    redisReply *r = th_cmd(rc, "GET %b", "la\0bin", (size_t)6);
    ASSERT(r->type == REDIS_REPLY_STRING && !strcmp(r->str, "2"));
    freeReplyObject(r);
    dlock_latch_free(b);

    /* wrong types: server errors */
    th_cmd_ok(rc, "HSET la:hash f 1");
    dlock_latch *h = latch(c, "la:hash");
    ASSERT_LACODE(h, dlock_latch_count_down(h, 1), DLOCK_ESERVER);
    ASSERT_LACODE(h, dlock_latch_await(h, 100), DLOCK_ESERVER);
    int64_t n;
    ASSERT_LACODE(h, dlock_latch_count(h, &n), DLOCK_ESERVER);
    dlock_latch_free(h);
    /* a value that is not a count: the scripts refuse it and change nothing */
    th_cmd_ok(rc, "SET la:text abc");
    dlock_latch *x = latch(c, "la:text");
    ASSERT_LACODE(x, dlock_latch_count_down(x, 1), DLOCK_ESERVER);
    ASSERT(strstr(dlock_latch_errmsg(x), "not an integer") != NULL);
    set = 1;
    ASSERT_LACODE(x, dlock_latch_try_set(x, 3, &set), DLOCK_ESERVER);
    r = th_cmd(rc, "GET la:text");
    ASSERT(r->type == REDIS_REPLY_STRING && !strcmp(r->str, "abc"));
    freeReplyObject(r);
    dlock_latch_free(x);
    dlock_latch_free(l);
    th_log("basics ok");
}

static void bad_input(dlock_client *c)
{
    dlock_latch *l = NULL;
    int set;
    int64_t n;
    ASSERT_CODE(dlock_latch_new(NULL, "x", DLOCK_CSTR, &l), DLOCK_EINVAL);
    ASSERT_NULL(l);
    ASSERT_CODE(dlock_latch_new(c, NULL, DLOCK_CSTR, &l), DLOCK_EINVAL);
    ASSERT(strlen(dlock_errmsg(c)) > 0);
    ASSERT_CODE(dlock_latch_new(c, "", DLOCK_CSTR, &l), DLOCK_EINVAL);
    ASSERT_CODE(dlock_latch_new(c, "x", DLOCK_CSTR, NULL), DLOCK_EINVAL);
    ASSERT(strlen(dlock_errmsg(c)) > 0);
    ASSERT_CODE(dlock_latch_try_set(NULL, 1, &set), DLOCK_EINVAL);
    ASSERT_CODE(dlock_latch_set(NULL, 1), DLOCK_EINVAL);
    ASSERT_CODE(dlock_latch_count_down(NULL, 1), DLOCK_EINVAL);
    ASSERT_CODE(dlock_latch_await(NULL, 0), DLOCK_EINVAL);
    ASSERT_CODE(dlock_latch_count(NULL, &n), DLOCK_EINVAL);
    ASSERT(strlen(dlock_latch_errmsg(NULL)) > 0);
    dlock_latch_free(NULL);

    l = latch(c, "la:bad");
#define BAD(expr)                                                                        \
    do {                                                                                 \
        ASSERT_LACODE(l, expr, DLOCK_EINVAL);                                            \
        ASSERT_MSG(strlen(dlock_latch_errmsg(l)) > 0, "no message: %s", #expr);          \
    } while (0)
    BAD(dlock_latch_try_set(l, 0, &set));
    BAD(dlock_latch_try_set(l, -1, &set));
    BAD(dlock_latch_try_set(l, 1, NULL));
    BAD(dlock_latch_set(l, -1));
    BAD(dlock_latch_count_down(l, 0));
    BAD(dlock_latch_count_down(l, -3));
    BAD(dlock_latch_await(l, -2));
    BAD(dlock_latch_count(l, NULL));
    /* counts past 2^53 - 1: the scripts' numbers are doubles */
    BAD(dlock_latch_try_set(l, DLOCK_COUNT_MAX + 1, &set));
    BAD(dlock_latch_set(l, DLOCK_COUNT_MAX + 1));
    BAD(dlock_latch_count_down(l, DLOCK_COUNT_MAX + 1));
#undef BAD
    ASSERT_EQ(count(l), 0);
    dlock_latch_free(l);
    th_log("bad input ok");
}

static void bound(dlock_client *c, redisContext *rc)
{
    dlock_latch *l = latch(c, "la:bound");
    ASSERT_LAOK(l, dlock_latch_set(l, 1));
    int64_t t0 = th_now_ms();
    ASSERT_LACODE(l, dlock_latch_await(l, 300), DLOCK_ETIMEDOUT);
    int64_t took = th_now_ms() - t0;
    th_log("await bound of 300 ms gave up after %lld ms", (long long)took);
    ASSERT_GE(took, 290);
    ASSERT_LE(took, 300 + MARGIN);
    ASSERT(strlen(dlock_latch_errmsg(l)) > 0);
    ASSERT_EQ(th_numsub(rc, "redisson_countdownlatch__channel__{la:bound}"), 0);
    ASSERT_EQ(count(l), 1);
    /* a new count ("1") does not release a waiter; set(0) does */
    ASSERT_LAOK(l, dlock_latch_set(l, 0));
    dlock_latch_free(l);
}

/* Redisson's count-down (its RCountDownLatch script: DECR; at or below
 * zero DEL; at exactly zero PUBLISH "0" on its channel), run raw. */
static const char *RSN_COUNT_DOWN =
    "local v = redis.call('decr', KEYS[1]); "
    "if v <= 0 then redis.call('del', KEYS[1]) end; "
    "if v == 0 then redis.call('publish', KEYS[2], '0') end;";

typedef struct {
    const th_server *srv;
    const char *name;
    int rc;
    int64_t t_woke;
} awaiter;

static void *await_thread(void *arg)
{
    awaiter *a = arg;
    dlock_client *c = th_client(a->srv, 0);
    dlock_latch *l = latch(c, a->name);
    a->rc = dlock_latch_await(l, 10000);
    a->t_woke = th_now_ms();
    dlock_latch_free(l);
    dlock_client_free(c);
    return NULL;
}

/* Names with a hash tag of their own: the channel is still
 * "redisson_countdownlatch__channel__{" name "}", both ways. */
static void tagged(const th_server *srv, dlock_client *c, redisContext *rc)
{
    static const char *const names[] = {"la:{tag}:x", "{la}y", "a{b"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char chan[128];
        snprintf(chan, sizeof chan, "redisson_countdownlatch__channel__{%s}", names[i]);
        dlock_latch *l = latch(c, names[i]);
        /* Redisson counts down to zero: the dlock waiter wakes on its message */
        ASSERT_LAOK(l, dlock_latch_set(l, 2));
        awaiter a = {srv, names[i], -1, 0};
        pthread_t t;
        ASSERT_EQ(pthread_create(&t, NULL, await_thread, &a), 0);
        ASSERT_EVENTUALLY(th_numsub(rc, chan) == 1, 5000);
        redisReply *r = th_cmd(rc, "EVAL %s 2 %s %s", RSN_COUNT_DOWN, names[i], chan);
        freeReplyObject(r);
        th_sleep_ms(100);
        ASSERT_EQ(th_numsub(rc, chan), 1); /* 2 -> 1: still waiting */
        int64_t t_zero = th_now_ms();
        r = th_cmd(rc, "EVAL %s 2 %s %s", RSN_COUNT_DOWN, names[i], chan);
        freeReplyObject(r);
        ASSERT_EQ(pthread_join(t, NULL), 0);
        ASSERT_CODE(a.rc, DLOCK_OK);
        th_log("latch '%s': woken %lld ms after Redisson's count-down to zero (bound 10 s)",
               names[i], (long long)(a.t_woke - t_zero));
        ASSERT_LT(a.t_woke - t_zero, 2000);
        /* dlock's messages go to Redisson's channel */
        redisContext *sub = th_redis(srv);
        struct timeval tv = {5, 0};
        redisSetTimeout(sub, tv);
        freeReplyObject(th_cmd(sub, "SUBSCRIBE %s", chan));
        ASSERT_LAOK(l, dlock_latch_set(l, 1));
        expect_message(sub, chan, "1");
        ASSERT_LAOK(l, dlock_latch_count_down(l, 1));
        expect_message(sub, chan, "0");
        ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", names[i]), 0);
        redisFree(sub);
        dlock_latch_free(l);
    }
}

/* 8 waiter processes; three count_downs; all wake after the last, none
 * before, and each reads 0 at wake-up. */
static void waiters(const th_server *srv, redisContext *rc)
{
    const char *chan = "redisson_countdownlatch__channel__{la:gate}";
    dlock_client *c = th_client(srv, 0);
    dlock_latch *l = latch(c, "la:gate");
    int set = 0;
    ASSERT_LAOK(l, dlock_latch_try_set(l, 3, &set));
    ASSERT_EQ(set, 1);
    th_cmd_ok(rc, "DEL la:gate:woke");
    pid_t pids[NWAITERS];
    for (int i = 0; i < NWAITERS; i++) {
        pids[i] = th_fork();
        if (pids[i] == 0) {
            dlock_client *cc = th_client(srv, 0);
            dlock_latch *w = latch(cc, "la:gate");
            /* half wait forever, half with a bound */
            int code = dlock_latch_await(w, i % 2 ? DLOCK_WAIT_FOREVER : 15000);
            int64_t t = th_now_ms();
            if (code != DLOCK_OK) {
                fprintf(stderr, "waiter %d: %s: %s\n", i, dlock_strerror(code),
                        dlock_latch_errmsg(w));
                _exit(1);
            }
            int64_t n = -1;
            if (dlock_latch_count(w, &n) != DLOCK_OK) _exit(2);
            redisContext *r = th_redis(srv);
            th_cmd_int(r, "RPUSH la:gate:woke %lld:%lld", (long long)n, (long long)t);
            redisFree(r);
            dlock_latch_free(w);
            dlock_client_free(cc);
            _exit(0);
        }
    }
    ASSERT_EVENTUALLY(th_numsub(rc, chan) == NWAITERS, 10000);
    /* a new count announced ("1") wakes them to re-check only */
    ASSERT_LAOK(l, dlock_latch_set(l, 3));
    for (int k = 0; k < 2; k++) {
        ASSERT_LAOK(l, dlock_latch_count_down(l, 1));
        th_sleep_ms(150); /* time for a wrong wake-up to show */
        ASSERT_EQ(th_cmd_int(rc, "LLEN la:gate:woke"), 0);
    }
    ASSERT_EQ(count(l), 1);
    int64_t t_last = th_now_ms();
    ASSERT_LAOK(l, dlock_latch_count_down(l, 1));
    for (int i = 0; i < NWAITERS; i++) ASSERT_EQ(th_wait_child(pids[i], 10000), 0);
    redisReply *r = th_cmd(rc, "LRANGE la:gate:woke 0 -1");
    ASSERT(r->type == REDIS_REPLY_ARRAY);
    ASSERT_EQ(r->elements, NWAITERS);
    int64_t latest = 0;
    for (size_t i = 0; i < r->elements; i++) {
        long long n = -1, t = 0;
        ASSERT_EQ(sscanf(r->element[i]->str, "%lld:%lld", &n, &t), 2);
        ASSERT_EQ(n, 0);
        ASSERT_GE(t, t_last);
        if (t - t_last > latest) latest = t - t_last;
    }
    freeReplyObject(r);
    th_log("%d waiters released, the last %lld ms after the final count_down", NWAITERS,
           (long long)latest);
    ASSERT_LT(latest, 10000); /* woken: not at the end of a 15 s bound */
    ASSERT_EQ(th_numsub(rc, chan), 0);
    dlock_latch_free(l);
    dlock_client_free(c);
}

int main(void)
{
    th_init("latch");
    th_server *srv = th_server_start(NULL);
    dlock_client *c = th_client(srv, 0);
    redisContext *rc = th_redis(srv);
    bad_input(c);
    basics(srv, c, rc);
    bound(c, rc);
    tagged(srv, c, rc);
    waiters(srv, rc);
    redisFree(rc);
    dlock_client_free(c);
    th_server_stop(srv);
    th_log("ok");
    return 0;
}
