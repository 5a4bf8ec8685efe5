/* libFuzzer target: reply handling (issue 8).
 *
 * A fake server (a thread in this process, on a unix socket in a private temp
 * directory) answers PING with +PONG, so that dlock_client_new() succeeds,
 * and every other command with the next piece of the fuzz input: arbitrary
 * bytes where a script result, a status, a SCAN page or a pub/sub
 * confirmation is expected. Pieces are separated by "\n~~\n"; after the last
 * piece the server shuts its side down, so every call ends promptly (EIO).
 * A piece that is not whole replies, or a client silent for IDLE_MS while
 * pieces remain (it waits for a message or for the rest of a reply), also
 * ends the input, on every connection of it.
 *
 * Speed: an input is a real client on a real socket with a server thread, so
 * it costs a client creation, a few round trips and thread hand-offs (well
 * under a millisecond), not the microseconds of the pure parsing targets.
 * Two things once made it a hundred times slower and must not come back: a
 * call left waiting out its timeout (the cuts above), and an input that does
 * not free all it allocated before it returns (the server thread freeing a
 * connection's reader after the input ended): libFuzzer then suspects a leak
 * and runs a whole leak check for that input.
 *
 * Input: byte 0 picks the operation, the rest are the replies.
 * The target checks the API contract: return codes are valid dlock_codes,
 * messages are one line, nothing crashes, leaks or hangs. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include "dlock.h"

#define DELIM "\n~~\n"
#define DELIM_LEN 4
#define MAX_CONNS 32
#define IDLE_MS 2

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_closed = PTHREAD_COND_INITIALIZER;
static int g_open; /* connections the server thread has not closed yet */
static const uint8_t *g_data; /* the current input; NULL between inputs */
static size_t g_size, g_off;
static unsigned g_gen; /* input number: connections of an older input get nothing */
static char g_dir[64], g_sock[128], g_url[160];
static int g_lfd = -1;

/* Copies the next reply piece of generation gen into *out (malloc'd).
 * Returns 1 with a piece (*last set when it is the last), 0 when none. */
static int next_piece(unsigned gen, char **out, size_t *n, int *last)
{
    int ok = 0;
    pthread_mutex_lock(&g_mu);
    if (gen == g_gen && g_data && g_off <= g_size) {
        const uint8_t *p = g_data + g_off;
        size_t left = g_size - g_off, len = left;
        for (size_t i = 0; i + DELIM_LEN <= left; i++)
            if (!memcmp(p + i, DELIM, DELIM_LEN)) {
                len = i;
                break;
            }
        *out = malloc(len ? len : 1);
        if (*out) {
            memcpy(*out, p, len);
            *n = len;
            ok = 1;
        }
        g_off += len + DELIM_LEN; /* > g_size after the last piece */
        *last = g_off > g_size;
    }
    pthread_mutex_unlock(&g_mu);
    return ok;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

typedef struct fconn {
    int fd;
    unsigned gen;
    int done; /* last piece sent: ignore further commands */
    redisReader *rd;
} fconn;

static void fconn_close(fconn *c)
{
    close(c->fd);
    redisReaderFree(c->rd);
    c->fd = -1;
    c->rd = NULL;
    pthread_mutex_lock(&g_mu);
    g_open--;
    pthread_cond_broadcast(&g_closed);
    pthread_mutex_unlock(&g_mu);
}

/* 1 when buf[0..n) parses as zero or more complete replies. The reader
 * has no object functions: it checks the syntax and builds nothing, so an
 * array header of a billion elements costs nothing here either. */
static int whole_replies(const char *buf, size_t n)
{
    redisReader *r = redisReaderCreateWithFunctions(NULL);
    if (!r) return 0;
    int ok = redisReaderFeed(r, buf, n) == REDIS_OK;
    while (ok) {
        void *rep = NULL;
        if (redisReaderGetReply(r, &rep) != REDIS_OK) {
            ok = 0;
            break;
        }
        if (!rep) break; /* no objects: a reply is its type, never NULL */
    }
    /* bytes left in the buffer: an incomplete reply */
    if (ok && r->len > r->pos) ok = 0;
    redisReaderFree(r);
    return ok;
}

/* Marks generation gen's pieces as used up; returns 1 (the piece just sent
 * is the last one). */
static int end_input(unsigned gen)
{
    pthread_mutex_lock(&g_mu);
    if (gen == g_gen) g_off = g_size + 1;
    pthread_mutex_unlock(&g_mu);
    return 1;
}

/* Answers every complete command buffered on c; 0 when c must be closed. */
static int serve(fconn *c)
{
    for (;;) {
        void *rep = NULL;
        if (redisReaderGetReply(c->rd, &rep) != REDIS_OK) return 0;
        if (!rep) return 1;
        redisReply *r = rep;
        int ping = r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
                   r->element[0]->type == REDIS_REPLY_STRING &&
                   !strcasecmp(r->element[0]->str, "PING");
        freeReplyObject(r);
        if (ping) {
            send_all(c->fd, "+PONG\r\n", 7);
            continue;
        }
        if (c->done) continue;
        char *piece;
        size_t n;
        int last;
        if (!next_piece(c->gen, &piece, &n, &last)) return 0;
        send_all(c->fd, piece, n);
        /* A piece that is not whole replies would leave the client waiting
         * for the rest until its command timeout: end the input there. */
        if (!last && !whole_replies(piece, n)) last = end_input(c->gen);
        free(piece);
        if (last) {
            shutdown(c->fd, SHUT_WR); /* the client reads EOF after the piece */
            c->done = 1;
        }
    }
}

static void *server_main(void *arg)
{
    (void)arg;
    fconn conns[MAX_CONNS];
    int nc = 0;
    for (;;) {
        struct pollfd pf[1 + MAX_CONNS];
        pf[0] = (struct pollfd){g_lfd, POLLIN, 0};
        for (int i = 0; i < nc; i++) pf[1 + i] = (struct pollfd){conns[i].fd, POLLIN, 0};
        /* A client that sends nothing for IDLE_MS while the input still has
         * pieces is waiting (for a message, a holder's expiry or the rest
         * of a reply): end the input there, as if its pieces were used up.
         * A real wait would otherwise cost the call's whole timeout on every
         * such input (tens of ms), and the target would explore little. */
        int live = 0;
        for (int i = 0; i < nc; i++) live |= !conns[i].done;
        int n = poll(pf, (nfds_t)(1 + nc), live ? IDLE_MS : -1);
        if (n < 0) continue;
        if (n == 0) {
            pthread_mutex_lock(&g_mu);
            if (g_data) g_off = g_size + 1;
            pthread_mutex_unlock(&g_mu);
        }
        for (int i = 0; i < nc; i++) {
            if (!pf[1 + i].revents) continue;
            char buf[8192];
            ssize_t r = read(conns[i].fd, buf, sizeof buf);
            if (r <= 0 || redisReaderFeed(conns[i].rd, buf, (size_t)r) != REDIS_OK ||
                !serve(&conns[i]))
                fconn_close(&conns[i]);
        }
        /* Once the input's last piece went out, every connection of that
         * input reads EOF too (a subscribed one would otherwise wait for a
         * message until the call's own deadline). */
        pthread_mutex_lock(&g_mu);
        unsigned cur = g_gen;
        int used_up = g_data && g_off > g_size;
        pthread_mutex_unlock(&g_mu);
        int m = 0;
        for (int i = 0; i < nc; i++) {
            if (conns[i].fd < 0) continue;
            if (used_up && conns[i].gen == cur && !conns[i].done) {
                shutdown(conns[i].fd, SHUT_WR);
                conns[i].done = 1;
            }
            conns[m++] = conns[i];
        }
        nc = m;
        if (pf[0].revents & POLLIN) {
            int fd = accept(g_lfd, NULL, NULL);
            if (fd >= 0 && nc < MAX_CONNS) {
                pthread_mutex_lock(&g_mu);
                unsigned gen = g_gen;
                g_open++;
                pthread_mutex_unlock(&g_mu);
                conns[nc++] = (fconn){fd, gen, 0, redisReaderCreate()};
            } else if (fd >= 0) {
                close(fd);
            }
        }
    }
    return NULL;
}

static void cleanup(void)
{
    unlink(g_sock);
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || strlen(tmp) > 40) tmp = "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/dlfz-XXXXXX", tmp);
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_sock, sizeof g_sock, "%s/s.sock", g_dir);
    snprintf(g_url, sizeof g_url, "unix://%s", g_sock);
    g_lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(g_sock) >= sizeof a.sun_path) abort();
    memcpy(a.sun_path, g_sock, strlen(g_sock) + 1);
    if (g_lfd < 0 || bind(g_lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(g_lfd, 64) != 0)
        abort();
    atexit(cleanup);
    pthread_t t;
    if (pthread_create(&t, NULL, server_main, NULL) != 0) abort();
    pthread_detach(t);
    return 0;
}

static int g_verbose = -1; /* $DLOCK_FUZZ_VERBOSE: print every call's result */

static void check_code(int rc, const char *msg)
{
    if (g_verbose < 0) g_verbose = getenv("DLOCK_FUZZ_VERBOSE") != NULL;
    if (g_verbose) fprintf(stderr, "  -> %d (%s) %s\n", rc, dlock_strerror(rc), msg ? msg : "");
    if (rc < 0 || rc >= DLOCK_CODE_LAST_) abort();
    if (msg && strchr(msg, '\n')) abort();
    /* a real failure always says what happened */
    if (rc != DLOCK_OK && rc != DLOCK_EBUSY && rc != DLOCK_ETIMEDOUT && msg && !msg[0]) abort();
}

static int list_cb(const char *name, size_t len, const dlock_info *info, void *ud)
{
    (void)name;
    (void)len;
    (void)info;
    return ++*(int *)ud >= 50;
}

/* The call first, then its message (argument evaluation order is unspecified). */
#define CHK(expr, msg)                                                                   \
    do {                                                                                 \
        int chk_rc_ = (expr);                                                            \
        check_code(chk_rc_, (msg));                                                      \
    } while (0)

static void run_op(dlock_client *c, unsigned op)
{
    static const dlock_kind kinds[] = {DLOCK_KIND_PLAIN, DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR,
                                       DLOCK_KIND_READ, DLOCK_KIND_WRITE};
    dlock_lock *l = NULL;
    uint64_t fence = 0;
    int rc;
    switch (op % 10) {
    case 0: /* try once, then release: the acquire and release script results */
    case 1: /* a short wait: SUBSCRIBE confirmation and messages */
    case 2: /* the other kinds' scripts */
        rc = dlock_lock_new(c, "fz", DLOCK_CSTR, kinds[(op / 10) % 5], &l);
        check_code(rc, dlock_errmsg(c));
        if (rc) break;
        rc = dlock_acquire(l, op % 10 == 1 ? 30 : DLOCK_NOWAIT, 1000, &fence);
        check_code(rc, dlock_lock_errmsg(l));
        if (rc == DLOCK_OK) {
            if (!dlock_lock_holding(l)) abort();
            if (dlock_lock_valid_ms(l) > 1000) abort();
            if (op % 10 == 2) CHK(dlock_extend(l, 2000), dlock_lock_errmsg(l));
            CHK(dlock_release(l), dlock_lock_errmsg(l));
        } else if (rc != DLOCK_EIO && dlock_lock_holding(l)) {
            abort(); /* "on any non-OK return nothing is held" */
        }
        dlock_lock_free(l);
        break;
    case 3: {
        dlock_info info;
        CHK(dlock_inspect(c, "fz", DLOCK_CSTR, &info), dlock_errmsg(c));
        break;
    }
    case 4: {
        char token[DLOCK_TOKEN_LEN + 1];
        rc = dlock_acquire_token(c, "fz", DLOCK_CSTR, DLOCK_NOWAIT, 1000, token, &fence);
        check_code(rc, dlock_errmsg(c));
        if (rc == DLOCK_OK) {
            if (strlen(token) != DLOCK_TOKEN_LEN) abort();
            CHK(dlock_extend_token(c, "fz", DLOCK_CSTR, token, 2000), dlock_errmsg(c));
            CHK(dlock_release_token(c, "fz", DLOCK_CSTR, token), dlock_errmsg(c));
        }
        break;
    }
    case 5: {
        int locked;
        int64_t ttl, rtt;
        CHK(dlock_is_locked(c, "fz", DLOCK_CSTR, &locked), dlock_errmsg(c));
        CHK(dlock_remaining_ttl(c, "fz", DLOCK_CSTR, &ttl), dlock_errmsg(c));
        CHK(dlock_fence_current(c, "fz", DLOCK_CSTR, &fence), dlock_errmsg(c));
        CHK(dlock_ping(c, &rtt), dlock_errmsg(c));
        break;
    }
    case 6: {
        int n = 0;
        CHK(dlock_list(c, "fz*", list_cb, &n), dlock_errmsg(c));
        break;
    }
    case 7: {
        char buf[64];
        CHK(dlock_server_fact(c, "maxmemory-policy", buf, sizeof buf), dlock_errmsg(c));
        CHK(dlock_server_fact(c, "info:replication:role", buf, sizeof buf),
                   dlock_errmsg(c));
        int existed;
        CHK(dlock_force_unlock(c, "fz", DLOCK_CSTR, &existed), dlock_errmsg(c));
        break;
    }
    case 8: {
        dlock_semaphore *s = NULL;
        if (dlock_semaphore_new(c, "fz", DLOCK_CSTR, &s)) break;
        int64_t permits;
        rc = dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT);
        check_code(rc, dlock_semaphore_errmsg(s));
        if (rc == DLOCK_OK) CHK(dlock_semaphore_release(s, 1), dlock_semaphore_errmsg(s));
        CHK(dlock_semaphore_available(s, &permits), dlock_semaphore_errmsg(s));
        dlock_semaphore_free(s);
        break;
    }
    default: {
        dlock_latch *lt = NULL;
        if (dlock_latch_new(c, "fz", DLOCK_CSTR, &lt)) break;
        int64_t count;
        CHK(dlock_latch_count(lt, &count), dlock_latch_errmsg(lt));
        CHK(dlock_latch_count_down(lt, 1), dlock_latch_errmsg(lt));
        CHK(dlock_latch_await(lt, 20), dlock_latch_errmsg(lt));
        dlock_latch_free(lt);
        break;
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_lfd < 0) LLVMFuzzerInitialize(NULL, NULL);
    if (size < 1) return 0;
    pthread_mutex_lock(&g_mu);
    g_gen++;
    g_data = data + 1;
    g_size = size - 1;
    g_off = 0;
    pthread_mutex_unlock(&g_mu);

    dlock_options o;
    dlock_options_init(&o);
    o.url = g_url;
    o.connect_timeout_ms = 200;
    o.command_timeout_ms = 25;
    dlock_client *c = NULL;
    int rc = dlock_client_new(&o, &c);
    check_code(rc, c ? dlock_errmsg(c) : NULL);
    /* every input ends with the server closing: a wait would take that for
     * an outage and try again until its deadline (test_faults covers it) */
    if (rc == DLOCK_OK) check_code(dlock_client_set_fail_fast(c, 1), dlock_errmsg(c));
    if (rc == DLOCK_OK) run_op(c, data[0]);
    dlock_client_free(c);

    /* The client closed its sockets; wait (bounded) until the server thread
     * has seen every EOF and freed what it held for them, so that an input
     * frees all it allocated. libFuzzer takes an imbalance for a possible
     * leak and runs a whole leak check each time, at a few ms an input. */
    pthread_mutex_lock(&g_mu);
    g_data = NULL;
    g_gen++;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 200 * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    while (g_open > 0 && pthread_cond_timedwait(&g_closed, &g_mu, &until) == 0)
        ;
    pthread_mutex_unlock(&g_mu);
    return 0;
}
