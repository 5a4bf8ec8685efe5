/* Sentinel: while the client has a connection to the master, the sentinels
 * are asked every DL_AWATCH_MS, on a socket of their own (a slot of its own) kept open
 * to the sentinel that answered last, which master they name (Redisson's
 * sentinel scan does the same each second); when it is another (a failover), the connections to
 * the old one are closed: their requests end with DLOCK_EIO (an acquire
 * that may wait rides it out, lock.c) and the next connection asks the
 * sentinels again (pipe.c). The old master may go on answering as one for
 * seconds after the failover (until the sentinels reconfigure it); this
 * bounds how long requests still go to it, as the blocking client's
 * once-a-second question does (src/sentinel.c). */
#include <stdlib.h>
#include <string.h>

#include "async.h"

#define DL_AWATCH_MS 1000

/* The connections to a master other than the one named last close. */
static void close_stale(dl_aclient *c) {
    dl_apipe *all[2] = {&c->cmd, &c->subs.pipe};
    dl_err err;
    dl_seterr(&err, DLOCK_EIO, "the sentinels named another master (a failover)");
    for (int i = 0; i < 2; i++)
        if (all[i]->conn && all[i]->gen != c->ep_gen) dl_apipe_fail(all[i], &err);
}

static int connected(const dl_aclient *c) { return c->cmd.conn || c->subs.pipe.conn; }

static void arm(dl_aclient *c, int64_t at) {
    if (dl_atimer_arm(&c->loop, &c->wtimer, at)) {
        /* no room for the timer: the question is not asked until the next
         * connection is named; each connection still asks first */
        dl_atimer_stop(&c->loop, &c->wtimer);
    }
}

static void stop_probe(dl_aclient *c) {
    dl_aloop_want(&c->loop, c->wslot, -1, 0);
    dl_aprobe_stop(&c->wprobe);
}

static void update(dl_aclient *c) {
    if (c->wprobe.conn)
        dl_aloop_want(&c->loop, c->wslot, c->wprobe.conn->fd, dl_aprobe_events(&c->wprobe));
}

/* Asks the next sentinel of this round, or ends the round. */
static void ask(dl_aclient *c) {
    dl_err err;
    stop_probe(c);
    c->wasking = 0;
    if (!connected(c) || dl_aprobe_start(c->sent, &c->wprobe, c->connect_timeout_ms, &err)) {
        /* no connection to watch, or no sentinel answered: the next
         * connection asks anyway */
        if (connected(c)) arm(c, dl_now_ms() + DL_AWATCH_MS);
        return;
    }
    c->wasking = 1;
    update(c);
    arm(c, c->wprobe.deadline);
}

static void on_timer(dl_atimer *t) {
    dl_aclient *c = t->arg;
    dl_err err;
    if (c->wprobe.conn && c->wasking) {
        if (dl_aprobe_timed_out(c->sent, &c->wprobe)) ask(c);
        else arm(c, c->wprobe.deadline);
    } else if (!connected(c)) {
        stop_probe(c); /* nothing to watch: asked again at the next connection */
    } else if (c->wprobe.conn &&
               !dl_aprobe_repeat(c->sent, &c->wprobe, c->connect_timeout_ms, &err)) {
        /* the sentinel that answered last, on the connection kept */
        c->wasking = 1;
        update(c);
        arm(c, c->wprobe.deadline);
    } else {
        stop_probe(c);
        memset(&c->wprobe, 0, sizeof c->wprobe);
        ask(c);
    }
}

void dl_awatch_io(dl_aclient *c, int events) {
    char *host = NULL;
    int port = 0;
    dl_err err;
    if (!c->wasking) {
        /* a kept connection is readable only when the sentinel closed it
         * (or says what it was not asked): let it go, the next question
         * opens another */
        stop_probe(c);
        return;
    }
    int r = dl_aprobe_io(c->sent, &c->wprobe, events, &host, &port, &err);
    if (r == 0) {
        update(c);
        return;
    }
    if (r == -1) {
        ask(c);
        return;
    }
    c->wasking = 0;
    if (r == 1) {
        update(c); /* kept, watched for its close */
    } else {
        stop_probe(c);
    }
    if (r == 1 && (!c->ep.host || strcmp(c->ep.host, host) != 0 || c->ep.port != port)) {
        free(c->ep.host);
        c->ep.host = host;
        c->ep.port = port;
        c->ep_gen++;
        close_stale(c);
    } else if (r == 1) {
        free(host);
    }
    if (connected(c)) arm(c, dl_now_ms() + DL_AWATCH_MS);
    else stop_probe(c), dl_atimer_stop(&c->loop, &c->wtimer);
}

static void named(dl_aclient *c) {
    close_stale(c);
    if (!c->wtimer.idx) arm(c, dl_now_ms() + DL_AWATCH_MS);
}

void dl_awatch_init(dl_aclient *c) {
    c->named = named;
    c->wtimer.fn = on_timer;
    c->wtimer.arg = c;
}

void dl_awatch_close(dl_aclient *c) {
    if (!c->sent) return;
    stop_probe(c);
    dl_atimer_stop(&c->loop, &c->wtimer);
}
