/* One script on several servers at once (RedLock): every request is sent
 * before any answer is awaited, and all answers are awaited in one poll()
 * loop under one deadline, so a slow or dead node costs at most the
 * deadline, never its sum over the nodes. New connections are opened in the
 * same loop (dl_conn_open_start): each request goes out as soon as its own
 * connection is up, behind its AUTH and SELECT, so a node that is slow to
 * connect or to authenticate (a frozen one) holds up no other. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>

#include "services.h"

_Thread_local dl_err dl_fanout_refused;

#define DL_FANOUT_MAX 64

size_t dl_fanout_eval(dl_conn **conns, size_t n, int64_t deadline, dl_script *s, int nkeys,
                      const char **keys, const size_t *keylens, int nargs, const char **args,
                      const size_t *arglens, redisReply **replies, unsigned char *unanswered) {
    struct pollfd pfd[DL_FANOUT_MAX];
    size_t at[DL_FANOUT_MAX];
    int pending[DL_FANOUT_MAX] = {0};
    int by_text[DL_FANOUT_MAX] = {0};
    size_t answered = 0, npending = 0;
    const dl_eval_req q = {.s = s, .nkeys = nkeys, .nargs = nargs, .keys = keys,
                           .keylens = keylens, .args = args, .arglens = arglens};
    if (n > DL_FANOUT_MAX) n = DL_FANOUT_MAX;
    for (size_t i = 0; i < n; i++) {
        replies[i] = NULL;
        if (unanswered) unanswered[i] = 0;
        if (!conns[i]) continue;
        dl_err err;
        /* a connection still connecting sends its request (behind its AUTH
         * and SELECT) once connected */
        if (dl_eval_queue(conns[i], &q, 0, &err) ||
            (!conns[i]->connecting && dl_conn_flush(conns[i], deadline, &err))) {
            conns[i]->broken = 1;
            continue;
        }
        pending[i] = 1;
        npending++;
    }
    while (npending > 0) {
        /* take what has arrived */
        for (size_t i = 0; i < n; i++) {
            if (!pending[i] || conns[i]->connecting) continue;
            redisReply *r = NULL;
            dl_err err;
            if (dl_conn_poll_reply(conns[i], &r, &err)) {
                pending[i] = 0;
                npending--;
                continue;
            }
            if (!r) continue;
            if (conns[i]->handshake > 0) {
                /* AUTH or SELECT of a new connection: refused, the node
                 * does not count */
                conns[i]->handshake--;
                int refused = r->type == REDIS_REPLY_ERROR;
                dl_err e = {0};
                if (refused && dl_reply_error(r, "AUTH", &e) == DLOCK_EAUTH) dl_fanout_refused = e;
                freeReplyObject(r);
                if (refused) {
                    conns[i]->broken = 1;
                    pending[i] = 0;
                    npending--;
                }
                i--; /* more may have arrived */
                continue;
            }
            if (dl_eval_fallback(conns[i], &q, &by_text[i], &r, &err) ||
                (!r && dl_conn_flush(conns[i], deadline, &err))) {
                conns[i]->broken = 1;
                pending[i] = 0;
                npending--;
                continue;
            }
            if (!r) continue; /* sent again by text: its reply is the next */
            replies[i] = r;
            pending[i] = 0;
            npending--;
            answered++;
        }
        if (npending == 0) break;
        int64_t left = deadline - dl_now_ms();
        if (left <= 0) break;
        nfds_t np = 0;
        for (size_t i = 0; i < n; i++) {
            if (!pending[i]) continue;
            pfd[np].fd = conns[i]->fd;
            pfd[np].events = conns[i]->connecting ? POLLOUT : POLLIN;
            pfd[np].revents = 0;
            at[np] = i;
            np++;
        }
        int k = poll(pfd, np, left > 1000000 ? 1000000 : (int)left);
        if (k < 0 && errno != EINTR) break;
        for (nfds_t j = 0; k > 0 && j < np; j++) {
            dl_conn *c = conns[at[j]];
            if (!c->connecting || !pfd[j].revents) continue;
            dl_err err;
            if (dl_conn_connected(c, &err) || dl_conn_flush(c, deadline, &err)) {
                c->broken = 1;
                pending[at[j]] = 0;
                npending--;
            }
        }
    }
    /* a request without an answer leaves its connection out of step */
    for (size_t i = 0; i < n; i++) {
        if (!pending[i]) continue;
        conns[i]->broken = 1;
        if (unanswered && !conns[i]->connecting) unanswered[i] = 1;
    }
    return answered;
}

void dl_fanout_chase(dl_conn *c, dl_script *s, int nkeys, const char **keys,
                     const size_t *keylens, int nargs, const char **args, const size_t *arglens) {
    dl_err err;
    c->olen = 0; /* the request before went out whole */
    const dl_eval_req q = {.s = s, .nkeys = nkeys, .nargs = nargs, .keys = keys,
                           .keylens = keylens, .args = args, .arglens = arglens};
    if (dl_eval_queue(c, &q, 1, &err)) return;
    size_t off = 0;
    while (off < c->olen) {
        long k = c->ops->write(c, c->obuf + off, c->olen - off);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        break; /* a command cut short never runs: the server sees it end with the connection */
    }
    c->olen = 0;
    c->broken = 1;
}
