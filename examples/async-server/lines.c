/* The line server of lines.h: accept, read, split lines, reply in order. */
#define _POSIX_C_SOURCE 200809L /* uv.h needs POSIX types */

#include "lines.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct line_conn {
    uv_tcp_t tcp;            /* first: the handle's memory is the conn's */
    char buf[LINES_MAX];     /* bytes read, not yet handed over */
    size_t len;
    int busy, in_pump, reading, eof, dead, shutting, closed; /* dead: a read error */
    line_conn *prev, *next;  /* every open connection, for lines_stop */
};

static uv_loop_t *loop;
static uv_tcp_t listener;
static line_handler handler;
static line_conn *conns;
static int stopping;

static void pump(line_conn *c);

static void on_closed(uv_handle_t *h) {
    line_conn *c = (line_conn *)h;
    if (c->prev) c->prev->next = c->next; else conns = c->next;
    if (c->next) c->next->prev = c->prev;
    free(c);
}

static void close_conn(line_conn *c) {
    if (c->closed) return;
    c->closed = 1;
    uv_close((uv_handle_t *)&c->tcp, on_closed); /* cancels pending writes */
}

static void on_shutdown(uv_shutdown_t *s, int status) {
    (void)status;
    close_conn((line_conn *)s->handle);
    free(s);
}

/* Closes once the replies queued are written. */
static void finish_conn(line_conn *c) {
    if (c->closed || c->shutting) return;
    c->shutting = 1;
    uv_shutdown_t *s = malloc(sizeof *s);
    if (!s || uv_shutdown(s, (uv_stream_t *)&c->tcp, on_shutdown)) {
        free(s);
        close_conn(c);
    }
}

typedef struct { uv_write_t w; char data[]; } write_req;

static void on_write(uv_write_t *w, int status) {
    (void)status; /* a broken connection shows as a read error too */
    free(w);
}

void lines_reply(line_conn *c, const char *fmt, ...) {
    char line[201];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (c->closed || c->shutting || c->dead || n < 0) return;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    write_req *w = malloc(sizeof *w + (size_t)n);
    uv_buf_t b = uv_buf_init(w ? w->data : NULL, (unsigned)n);
    if (w) memcpy(w->data, line, (size_t)n);
    if (!w || uv_write(&w->w, (uv_stream_t *)&c->tcp, &b, 1, on_write)) {
        free(w);
        close_conn(c);
    }
}

void lines_next(line_conn *c) {
    c->busy = 0;
    if (!c->in_pump) pump(c); /* else the pump below it goes on */
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
    (void)hint;
    line_conn *c = (line_conn *)h;
    *b = uv_buf_init(c->buf + c->len, (unsigned)(sizeof c->buf - c->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    (void)b;
    line_conn *c = (line_conn *)s;
    if (n < 0) { /* EOF: the lines read are still served; an error: not */
        uv_read_stop(s);
        c->reading = 0;
        c->eof = 1;
        c->dead = n != UV_EOF;
    } else {
        c->len += (size_t)n;
    }
    pump(c);
}

/* Hands over the complete lines, one per lines_next, and reads only while
 * the connection is not busy; ends it when nothing more is to be served. */
static void pump(line_conn *c) {
    c->in_pump = 1;
    while (!c->busy && !c->shutting && !c->closed) {
        char *nl = stopping || c->dead ? NULL : memchr(c->buf, '\n', c->len);
        if (!nl) {
            int full = c->len == sizeof c->buf;
            if (c->dead) {
                close_conn(c);
            } else if (full || c->eof || stopping) {
                if (full && !stopping) lines_reply(c, "ERR line too long");
                finish_conn(c);
            } else if (!c->reading) {
                if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read)) close_conn(c);
                else c->reading = 1;
            }
            break;
        }
        char line[LINES_MAX];
        size_t n = (size_t)(nl - c->buf);
        memcpy(line, c->buf, n);
        line[n && line[n - 1] == '\r' ? n - 1 : n] = '\0';
        c->len -= n + 1;
        memmove(c->buf, nl + 1, c->len);
        c->busy = 1;
        handler(c, line); /* may call lines_next at once */
    }
    if (c->busy && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
    c->in_pump = 0;
}

static void on_connection(uv_stream_t *server, int status) {
    line_conn *c = status < 0 ? NULL : calloc(1, sizeof *c);
    if (!c) return; /* a failed accept; out of memory: the client stays pending */
    uv_tcp_init(loop, &c->tcp);
    c->next = conns;
    if (conns) conns->prev = c;
    conns = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp)) close_conn(c);
    else pump(c);
}

int lines_listen(uv_loop_t *l, int port, line_handler h) {
    struct sockaddr_in addr;
    struct sockaddr_storage bound;
    int len = sizeof bound, rc;
    loop = l;
    handler = h;
    uv_ip4_addr("127.0.0.1", port, &addr);
    uv_tcp_init(loop, &listener);
    if ((rc = uv_tcp_bind(&listener, (const struct sockaddr *)&addr, 0)) ||
        (rc = uv_listen((uv_stream_t *)&listener, 511, on_connection)) ||
        (rc = uv_tcp_getsockname(&listener, (struct sockaddr *)&bound, &len))) {
        uv_close((uv_handle_t *)&listener, NULL);
        return rc;
    }
    return ntohs(((struct sockaddr_in *)&bound)->sin_port);
}

void lines_stop(void) {
    if (stopping) return;
    stopping = 1;
    uv_close((uv_handle_t *)&listener, NULL);
    for (line_conn *c = conns; c; c = c->next) pump(c); /* busy ones: at lines_next */
}
