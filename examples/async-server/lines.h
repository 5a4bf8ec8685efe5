/*
 * A small line-protocol TCP server on a libuv loop, the transport of the
 * async-server example (server.c has the locks; this has no dlock in it).
 *
 * Each connection's lines (up to '\n', a '\r' before it dropped, at most
 * LINES_MAX - 1 bytes) are handed to the handler ONE AT A TIME: after a
 * line, the connection is busy, and reads nothing more, until the program
 * calls lines_next for it, perhaps many loop turns later. So a
 * connection's replies come in the order of its requests, and a client
 * that pipelines waits in its own buffer. A connection closed by its
 * client stays valid until lines_next; its replies are then dropped.
 * All on the loop's thread.
 */
#ifndef ASYNC_SERVER_LINES_H
#define ASYNC_SERVER_LINES_H

#include <uv.h>

#define LINES_MAX 512

typedef struct line_conn line_conn;
typedef void (*line_handler)(line_conn *c, char *line);

/* Listens on 127.0.0.1:port (0: any free port). Returns the port, or a
 * negative libuv error code. */
int lines_listen(uv_loop_t *loop, int port, line_handler handler);

/* Queues one reply line to c ('\n' added; cut at 200 bytes). */
void lines_reply(line_conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The request of c's last line is over: the next line is served (maybe
 * from inside this call), or c closes if lines_stop was called. */
void lines_next(line_conn *c);

/* Stops listening and closes the idle connections (each after its replies
 * are written); a busy one closes at its lines_next. */
void lines_stop(void);

#endif
