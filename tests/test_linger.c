/* Lingering subscriptions (wait.c, client.c): a plain or fair waiter that got
 * the lock returns without writing UNSUBSCRIBE; its connection goes back to
 * the pool still subscribed to the waiter's own channel. argv[1] picks the
 * part; in each, a waiter thread W (one thread throughout, so one fair owner)
 * waits while another client holds, then gets the lock on the release.
 *   reuse  fair lock, 5 handoffs to W: one SUBSCRIBE in all and no
 *          UNSUBSCRIBE (the later waits find W's channel still subscribed),
 *          and from the second on, W's wait is two acquire scripts: its first
 *          attempt (which already counts as made after subscribing) and the
 *          one that takes the grant up; fences rise
 *   plain  plain lock, 5 handoffs to W: a new token, so a new channel, per
 *          wait; the old one is unsubscribed in the same write as the new
 *          SUBSCRIBE: while W holds, exactly its current channel is
 *          subscribed; once W's client is freed, none
 *   pool   a client that keeps one idle connection: after the wait only the
 *          lingering connection is pooled; W's release unsubscribes it first
 *          and works, and nothing stays subscribed
 *   dead   the lingering connection is killed by the server (CLIENT KILL),
 *          then the server restarts: each next wait still gets the lock
 *   stale  a grant message on W's lingering fair channel from before its next
 *          wait ("granted:<old fence>", and a wake-up "0") is not taken for a
 *          grant: that wait times out while another client holds, and the
 *          holder is still the owner */
#include "harness.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME "linger:lock"
#define CHAN_PATTERN "redisson_lock__channel:{" NAME "}:*"
#define ROUNDS 5
/* DL_FAIR_KEEPALIVE_MS (lock_fair.c): a fair waiter comes back at least this
 * often to refresh its queue entry, each time with one acquire script */
#define KEEPALIVE_MS (5000 / 3)

/* ---- the waiter thread: runs commands from the main thread ---- */

typedef struct waiter {
    dlock_lock *l;
    int cmd[2], res[2]; /* main -> W ('a' wait_ms acquire, 'r' release, 'q'), W -> main */
    pthread_t th;
    char token[128];    /* the hold's token, copied by W after acquiring */
} waiter;

typedef struct wreq {
    char op;
    int64_t wait_ms;
} wreq;

typedef struct wres {
    int rc;
    uint64_t fence;
} wres;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    wreq q;
    while (read(w->cmd[0], &q, sizeof q) == (ssize_t)sizeof q && q.op != 'q') {
        wres r = {0, 0};
        if (q.op == 'a') {
            r.rc = dlock_acquire(w->l, q.wait_ms, 10000, &r.fence);
            if (r.rc == DLOCK_OK)
                snprintf(w->token, sizeof w->token, "%s", dlock_lock_token(w->l));
            else if (r.rc != DLOCK_ETIMEDOUT)
                th_log("W: acquire: %s: %s", dlock_strerror(r.rc), dlock_lock_errmsg(w->l));
        } else {
            r.rc = dlock_release(w->l);
            if (r.rc) th_log("W: release: %s: %s", dlock_strerror(r.rc), dlock_lock_errmsg(w->l));
        }
        if (write(w->res[1], &r, sizeof r) != (ssize_t)sizeof r) break;
    }
    return NULL;
}

static void waiter_start(waiter *w, dlock_lock *l)
{
    memset(w, 0, sizeof *w);
    w->l = l;
    ASSERT_EQ(pipe(w->cmd), 0);
    ASSERT_EQ(pipe(w->res), 0);
    ASSERT_EQ(pthread_create(&w->th, NULL, waiter_main, w), 0);
}

static void waiter_send(waiter *w, char op, int64_t wait_ms)
{
    wreq q = {op, wait_ms};
    ASSERT_EQ(write(w->cmd[1], &q, sizeof q), (ssize_t)sizeof q);
}

static wres waiter_result(waiter *w)
{
    wres r;
    ASSERT_EQ(read(w->res[0], &r, sizeof r), (ssize_t)sizeof r);
    return r;
}

static void waiter_stop(waiter *w)
{
    waiter_send(w, 'q', 0);
    ASSERT_EQ(pthread_join(w->th, NULL), 0);
    close(w->cmd[0]), close(w->cmd[1]), close(w->res[0]), close(w->res[1]);
}

/* ---- server views ---- */

static long long stat_calls(redisContext *rc, const char *cmd)
{
    char *info = th_cmd_str(rc, "INFO commandstats");
    char key[64];
    snprintf(key, sizeof key, "cmdstat_%s:calls=", cmd);
    const char *p = info ? strstr(info, key) : NULL;
    long long n = p ? atoll(p + strlen(key)) : 0;
    free(info);
    return n;
}

/* The waiter channels of NAME subscribed now. */
static long long own_channels(redisContext *rc)
{
    redisReply *r = th_cmd(rc, "PUBSUB CHANNELS %s", CHAN_PATTERN);
    long long n = r->type == REDIS_REPLY_ARRAY ? (long long)r->elements : -1;
    freeReplyObject(r);
    return n;
}

/* One handoff: holder h takes the lock, W waits (wait_ms), h releases once W
 * is seen waiting; returns W's result. */
static wres handoff(redisContext *rc, dlock_lock *h, waiter *w)
{
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 10000, NULL));
    waiter_send(w, 'a', 10000);
    th_wait_subscribers(rc, NAME, 1, 5000);
    ASSERT_LOK(h, dlock_release(h));
    return waiter_result(w);
}

static void release_w(waiter *w)
{
    waiter_send(w, 'r', 0);
    ASSERT_EQ(waiter_result(w).rc, DLOCK_OK);
}

/* The parts' cast: a raw connection, the holder h (its own client) and the
 * waiter thread W (its own client), on NAME of kind. */
typedef struct cast {
    redisContext *rc;
    dlock_client *hc, *wc;
    dlock_lock *h;
    waiter w;
} cast;

static void cast_start(cast *k, th_server *s, dlock_kind kind)
{
    k->rc = th_redis(s);
    k->hc = th_client(s, 0);
    k->wc = th_client(s, 0);
    k->h = th_lock(k->hc, NAME, kind);
    waiter_start(&k->w, th_lock(k->wc, NAME, kind));
}

/* Stops W and frees everything; once W's client is gone, so are its
 * lingering subscriptions. */
static void cast_stop(cast *k)
{
    waiter_stop(&k->w);
    dlock_lock_free(k->w.l);
    dlock_client_free(k->wc);
    redisContext *rc = k->rc;
    ASSERT_EVENTUALLY(own_channels(rc) == 0, 2000);
    dlock_lock_free(k->h);
    dlock_client_free(k->hc);
    redisFree(rc);
}

/* ---- parts ---- */

static void part_reuse(th_server *s)
{
    cast k;
    cast_start(&k, s, DLOCK_KIND_FAIR);
    redisContext *rc = k.rc;
    uint64_t last = 0;
    long long sub0 = stat_calls(rc, "subscribe"), unsub0 = stat_calls(rc, "unsubscribe");
    for (int round = 0; round < ROUNDS; round++) {
        long long ev0 = stat_calls(rc, "evalsha") + stat_calls(rc, "eval");
        int64_t t0 = th_now_ms();
        wres r = handoff(rc, k.h, &k.w);
        int64_t waited = th_now_ms() - t0;
        ASSERT_EQ(r.rc, DLOCK_OK);
        ASSERT_U64_GT(r.fence, last);
        last = r.fence;
        /* held by W, and W's channel still subscribed */
        ASSERT_EQ(own_channels(rc), 1);
        ASSERT_EQ(th_cmd_int(rc, "LLEN redisson_lock_queue:{%s}", NAME), 0);
        release_w(&k.w);
        long long scripts = stat_calls(rc, "evalsha") + stat_calls(rc, "eval") - ev0;
        th_log("round %d: fence %llu, %lld scripts (holder's acquire and release, W's "
               "attempts and release) in a %lld ms wait", round, (unsigned long long)r.fence,
               scripts, (long long)waited);
        /* h: acquire + release; W: its attempt(s), the one taking the grant
         * up, and its release. The first wait subscribes after its first
         * attempt and tries again; the later ones were subscribed all along:
         * one attempt and the take-up, plus one keep-alive attempt per
         * KEEPALIVE_MS the wait lasted (none in a wait shorter than that; a
         * slow scheduler can stretch it). One more when the previous
         * round's grant message was left unread on the lingering connection
         * (W's own attempt had taken that grant up before it read the
         * message): this wait reads it first and tries once for nothing. */
        if (round > 0) {
            ASSERT_GE(scripts, 5);
            ASSERT_LE(scripts, 6 + waited / KEEPALIVE_MS);
        }
    }
    ASSERT_EQ(stat_calls(rc, "subscribe") - sub0, 1);
    ASSERT_EQ(stat_calls(rc, "unsubscribe") - unsub0, 0);
    cast_stop(&k);
}

static void part_plain(th_server *s)
{
    cast k;
    cast_start(&k, s, DLOCK_KIND_PLAIN);
    redisContext *rc = k.rc;
    long long sub0 = stat_calls(rc, "subscribe"), unsub0 = stat_calls(rc, "unsubscribe");
    for (int round = 0; round < ROUNDS; round++) {
        wres r = handoff(rc, k.h, &k.w);
        ASSERT_EQ(r.rc, DLOCK_OK);
        /* exactly W's current channel: the old ones were unsubscribed */
        redisReply *c = th_cmd(rc, "PUBSUB CHANNELS %s", CHAN_PATTERN);
        ASSERT_EQ(c->type, REDIS_REPLY_ARRAY);
        ASSERT_EQ(c->elements, 1);
        char want[256];
        snprintf(want, sizeof want, "redisson_lock__channel:{%s}:%s", NAME, k.w.token);
        ASSERT_STR_EQ(c->element[0]->str, want);
        freeReplyObject(c);
        ASSERT_EQ(th_subscribers(rc, NAME), 0); /* it holds: no waiter */
        release_w(&k.w);
    }
    ASSERT_EQ(stat_calls(rc, "subscribe") - sub0, ROUNDS);
    ASSERT_EQ(stat_calls(rc, "unsubscribe") - unsub0, ROUNDS - 1);
    cast_stop(&k);
}

static void part_pool(th_server *s)
{
    redisContext *rc = th_redis(s);
    dlock_client *hc = th_client(s, 0);
    dlock_options o;
    dlock_options_init(&o);
    o.url = th_server_url(s);
    o.max_idle_connections = 1;
    dlock_client *wc = NULL;
    ASSERT_EQ(dlock_client_new(&o, &wc), DLOCK_OK);
    for (int k = 0; k < 2; k++) {
        dlock_kind kind = k ? DLOCK_KIND_FAIR : DLOCK_KIND_PLAIN;
        dlock_lock *h = th_lock(hc, NAME, kind);
        waiter w;
        waiter_start(&w, th_lock(wc, NAME, kind));
        wres r = handoff(rc, h, &w);
        ASSERT_EQ(r.rc, DLOCK_OK);
        ASSERT_EQ(own_channels(rc), 1);
        /* the only pooled connection is the lingering one: W's release
         * unsubscribes it, then releases on it */
        release_w(&w);
        ASSERT_EQ(own_channels(rc), 0);
        ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", NAME), 0);
        /* and the next round trip on it is an ordinary one */
        ASSERT_LOK(w.l, dlock_acquire(w.l, DLOCK_NOWAIT, 5000, NULL));
        ASSERT_LOK(w.l, dlock_release(w.l));
        waiter_stop(&w);
        dlock_lock_free(w.l);
        dlock_lock_free(h);
    }
    dlock_client_free(wc);
    dlock_client_free(hc);
    redisFree(rc);
}

static void part_dead(th_server *s)
{
    dlock_client *hc = th_client(s, 0), *wc = th_client(s, 0);
    dlock_lock *h = th_lock(hc, NAME, DLOCK_KIND_FAIR);
    waiter w;
    waiter_start(&w, th_lock(wc, NAME, DLOCK_KIND_FAIR));
    for (int round = 0; round < 3; round++) {
        redisContext *rc = th_redis(s);
        wres r = handoff(rc, h, &w);
        ASSERT_EQ(r.rc, DLOCK_OK);
        release_w(&w);
        ASSERT_EQ(own_channels(rc), 1);
        if (round == 0) {
            /* the server drops the lingering connection */
            ASSERT_GE(th_cmd_int(rc, "CLIENT KILL TYPE pubsub"), 1);
            th_sleep_ms(100);
        } else if (round == 1) {
            redisFree(rc);
            th_server_restart(s, SIGKILL);
            th_sleep_ms(100);
            continue;
        }
        redisFree(rc);
    }
    waiter_stop(&w);
    dlock_lock_free(w.l);
    dlock_lock_free(h);
    dlock_client_free(wc);
    dlock_client_free(hc);
}

static void part_stale(th_server *s)
{
    cast k;
    cast_start(&k, s, DLOCK_KIND_FAIR);
    redisContext *rc = k.rc;
    dlock_lock *h = k.h;
    for (int i = 0; i < 3; i++) { /* the counter moves past 1 */
        ASSERT_EQ(handoff(rc, h, &k.w).rc, DLOCK_OK);
        release_w(&k.w);
    }
    redisReply *c = th_cmd(rc, "PUBSUB CHANNELS %s", CHAN_PATTERN);
    ASSERT_EQ(c->type, REDIS_REPLY_ARRAY);
    ASSERT_EQ(c->elements, 1);
    char chan[256];
    snprintf(chan, sizeof chan, "%s", c->element[0]->str);
    freeReplyObject(c);
    /* messages that sit unread on W's lingering connection */
    ASSERT_EQ(th_cmd_int(rc, "PUBLISH %s granted:1", chan), 1);
    ASSERT_EQ(th_cmd_int(rc, "PUBLISH %s 0", chan), 1);
    uint64_t hf = 0;
    ASSERT_LOK(h, dlock_acquire(h, DLOCK_NOWAIT, 10000, &hf));
    waiter_send(&k.w, 'a', 300);
    wres r = waiter_result(&k.w);
    ASSERT_EQ(r.rc, DLOCK_ETIMEDOUT);
    redisReply *o = th_cmd(rc, "HGETALL %s", NAME);
    ASSERT_EQ(o->elements, 2);
    ASSERT_STR_EQ(o->element[0]->str, dlock_lock_token(h));
    freeReplyObject(o);
    ASSERT_LOK(h, dlock_release(h));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s redisson_lock_queue:{%s}", NAME, NAME), 0);
    cast_stop(&k);
}

int main(int argc, char **argv)
{
    const char *part = argc > 1 ? argv[1] : "reuse";
    th_init("linger");
    th_server *s = th_server_start(NULL);
    if (!strcmp(part, "reuse")) part_reuse(s);
    else if (!strcmp(part, "plain")) part_plain(s);
    else if (!strcmp(part, "pool")) part_pool(s);
    else if (!strcmp(part, "dead")) part_dead(s);
    else if (!strcmp(part, "stale")) part_stale(s);
    else th_fail(__FILE__, __LINE__, "unknown part %s", part);
    th_server_stop(s);
    return 0;
}
