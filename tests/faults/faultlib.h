/*
 * Shared by the fault-injection suite (fault_inject.c) and the randomized
 * explorer (explore.c): the protected resource and the TCP proxy.
 *
 * The resource is a private redis-server of its own, never faulted. Every
 * event of a run goes to one list "hist" there, so the list order is a total
 * order consistent with real time (the server runs one command at a time).
 * The fenced write accepts a token only if it is strictly greater than every
 * token accepted before under the same max key (each critical section writes
 * once, so an equal token is a second holder with the same token: as stale
 * as a lower one); the unfenced write accepts all. Both log
 * "W <worker> <token> <1 accepted | 0 rejected>[ <tag>]".
 *
 * The proxy forwards 127.0.0.1:<port> to an upstream port from a child
 * process, driven by one-byte commands: 'D' cut (reset) every connection,
 * 'F' freeze (forward and accept nothing), 'U' unfreeze, 'S' switch to the
 * alternate upstream (and cut every connection), 'Q' quit; and one-shot
 * faults on the next chunk that passes in one direction, on whichever
 * connection it comes: 'r' drop the next request chunk (client to server),
 * 'p' drop the next reply chunk (server to client), '2' send the next
 * request chunk twice, 'L' (fl_proxy_delay) hold the next reply chunk back
 * for a number of ms (that connection's later replies queue behind it).
 * A chunk is what one read() returned. With one command in flight per
 * connection (the library's connections carry one request at a time) a
 * request chunk is one request and a reply chunk is one reply, or one
 * pub/sub message on a subscribed connection: a dropped message is a lost
 * wake-up. A dropped or duplicated chunk leaves that connection's RESP
 * stream out of step with its requests, which is the point: the client must
 * notice, by its command timeout or a protocol error, and never take a stale
 * reply for a newer command's answer.
 * A proxy started with fl_proxy_start_log logs each one-shot fault when it
 * fires on the resource ("M <id> <t> <kind> <chunk>", kind 0 drop request,
 * 1 drop reply, 2 duplicate request, 3 delay reply; chunk: its first bytes,
 * CR and LF as '|', other unprintable bytes as '.').
 */
#ifndef DLOCK_FAULTLIB_H
#define DLOCK_FAULTLIB_H

#include "harness.h"

/* A connection to the resource server's unix socket; exits 2 if it cannot. */
redisContext *fl_res_connect(const char *sock);
/* RPUSH hist <formatted event> (newlines become spaces); exits 2 on I/O error. */
void fl_ev(redisContext *rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The write of a critical section with token tok, fenced (1) or not (0),
 * against the highest token accepted under max_key; tag ("" for none) is
 * appended to the W event. Returns 1 if accepted. */
int fl_res_write(redisContext *rc, const char *max_key, int id, uint64_t tok, int fenced,
                 const char *tag);

typedef struct fl_proxy {
    pid_t pid;
    int port;
    int cmd_w, ack_r;
} fl_proxy;

fl_proxy fl_proxy_start(int upstream);
/* With an alternate upstream for 'S' (a promoted replica). */
fl_proxy fl_proxy_start_alt(int upstream, int alt);
/* Logging each one-shot fault as it fires to the resource at res_sock, as
 * worker id. */
fl_proxy fl_proxy_start_log(int upstream, int alt, const char *res_sock, int id);
/* Sends one command and waits for its acknowledgement. */
void fl_proxy_cmd(fl_proxy *px, char c);
/* Holds the next reply chunk back for ms (1..60000). */
void fl_proxy_delay(fl_proxy *px, int ms);
void fl_proxy_stop(fl_proxy *px);

#endif
