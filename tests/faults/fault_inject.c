/*
 * Fault-injection suite (issue 8).
 *
 * Workers (forked processes, each with its own dlock_client) take a lock, then
 * write to a protected resource. The resource is a private redis-server of its
 * own, never faulted: every event goes to one list "hist" there, so the list
 * order is a total order consistent with real time (the resource server runs
 * one command at a time). Events:
 *
 *   B w tok valid wall   worker w entered its critical section with token tok
 *                        (valid: dlock_lock_valid_ms() right after the acquire,
 *                        wall: the worker's time(NULL))
 *   W w tok acc          the write of that section; acc 1 accepted, 0 rejected
 *   V w tok valid        dlock_lock_valid_ms() after the work, before the write
 *   S w tok              the write was skipped (validity too short)
 *   E w tok              the section ended (logged before the release)
 *   K w                  the parent killed w (ends w's open section)
 *   X w code msg         an acquire (or client creation) failed with code
 *   T w                  an acquire timed out (not a failure)
 *   R w code             a release did not return DLOCK_OK
 *
 * The "fenced resource" is a Lua script that accepts a write only if its
 * token is strictly greater than every token it accepted before (each
 * critical section writes once, so an equal token is a second holder with the
 * same token: as stale as a lower one). The unfenced resource accepts all.
 *
 * The checker reads the whole history afterwards and reports every pair of
 * overlapping critical sections ([B, E or K] intervals of list positions) and
 * every accepted write whose token is not greater than one accepted before.
 *
 * Each scenario (argv[1]) has a fixed, bounded schedule and prints
 *   "<scenario>: ops N, faults F, overlaps O, stale writes accepted S"
 * followed by a details line. See docs/safety.md.
 */
#include "faultlib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LOCK_NAME "faults:res"
#define NODES 5

/* ------------------------------------------------------------------------ */
/* workers                                                                  */

typedef struct wparams {
    int id;
    const char *url;       /* the lock's URL */
    const char *fence_url; /* RedLock fence server, or NULL */
    const char *res_sock;  /* the resource server's unix socket */
    int rounds;            /* critical sections to complete */
    int fenced;            /* 1: the fenced resource, 0: unfenced */
    int64_t lease_ms, work_ms, wait_ms, run_ms, gap_ms;
    int64_t cmd_timeout_ms, conn_timeout_ms, node_timeout_ms;
} wparams;

static int run_worker(const wparams *p)
{
    redisContext *rc = fl_res_connect(p->res_sock);
    int64_t end = th_now_ms() + p->run_ms;
    dlock_options o;
    dlock_options_init(&o);
    o.url = p->url;
    o.fence_url = p->fence_url;
    o.command_timeout_ms = p->cmd_timeout_ms;
    o.connect_timeout_ms = p->conn_timeout_ms;
    o.node_timeout_ms = p->node_timeout_ms;
    dlock_client *c = NULL;
    for (;;) {
        int r = dlock_client_new(&o, &c);
        if (r == DLOCK_OK) break;
        fl_ev(rc, "X %d %d client_new: %s", p->id, r, c ? dlock_errmsg(c) : "");
        dlock_client_free(c);
        c = NULL;
        if (th_now_ms() > end) {
            redisFree(rc);
            return 3;
        }
        th_sleep_ms(50);
    }
    dlock_lock *l = NULL;
    if (dlock_lock_new(c, LOCK_NAME, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l) != DLOCK_OK) {
        dlock_client_free(c);
        redisFree(rc);
        return 4;
    }
    int done = 0;
    while (done < p->rounds) {
        int64_t left = end - th_now_ms();
        if (left <= 0) break;
        uint64_t tok = 0;
        int r = dlock_acquire(l, p->wait_ms < left ? p->wait_ms : left, p->lease_ms, &tok);
        if (r == DLOCK_ETIMEDOUT || r == DLOCK_EBUSY) {
            fl_ev(rc, "T %d", p->id);
            continue;
        }
        if (r != DLOCK_OK) {
            fl_ev(rc, "X %d %d %s", p->id, r, dlock_lock_errmsg(l));
            th_sleep_ms(30);
            continue;
        }
        int64_t valid = dlock_lock_valid_ms(l);
        fl_ev(rc, "B %d %llu %lld %lld", p->id, (unsigned long long)tok, (long long)valid,
           (long long)time(NULL));
        /* a careful client: skip work that could not finish within the lease */
        if (valid < p->work_ms + 50) {
            fl_ev(rc, "S %d %llu", p->id, (unsigned long long)tok);
        } else {
            th_sleep_ms(p->work_ms);
            fl_ev(rc, "V %d %llu %lld", p->id, (unsigned long long)tok,
               (long long)dlock_lock_valid_ms(l));
            fl_res_write(rc, "res:max", p->id, tok, p->fenced, "");
        }
        fl_ev(rc, "E %d %llu", p->id, (unsigned long long)tok);
        r = dlock_release(l);
        if (r != DLOCK_OK) fl_ev(rc, "R %d %d %s", p->id, r, dlock_lock_errmsg(l));
        /* DLOCK_EIO leaves the handle holding (a retry is possible, and the
         * next acquire on it would be DLOCK_EINVAL): retry a little, then
         * give the handle up (its lease runs out) */
        for (int k = 0; k < 3 && dlock_lock_holding(l); k++) {
            th_sleep_ms(50);
            dlock_release(l);
        }
        if (dlock_lock_holding(l)) {
            dlock_lock_free(l);
            l = NULL;
            if (dlock_lock_new(c, LOCK_NAME, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l) != DLOCK_OK) {
                dlock_client_free(c);
                redisFree(rc);
                return 4;
            }
        }
        done++;
        th_sleep_ms(p->gap_ms);
    }
    dlock_lock_free(l);
    dlock_client_free(c);
    redisFree(rc);
    return 0;
}

static pid_t spawn_worker(const wparams *p)
{
    pid_t pid = th_fork();
    if (pid == 0) exit(run_worker(p));
    return pid;
}

/* The same worker in a fresh process image (so that LD_PRELOAD applies):
 * argv "worker" followed by the parameters; env: extra NAME=VALUE strings. */
static pid_t exec_worker(const wparams *p, char *const *env_extra)
{
    char a[14][160];
    snprintf(a[0], 160, "%d", p->id);
    snprintf(a[1], 160, "%s", p->url);
    snprintf(a[2], 160, "%s", p->fence_url ? p->fence_url : "-");
    snprintf(a[3], 160, "%s", p->res_sock);
    snprintf(a[4], 160, "%d", p->rounds);
    snprintf(a[5], 160, "%d", p->fenced);
    snprintf(a[6], 160, "%lld", (long long)p->lease_ms);
    snprintf(a[7], 160, "%lld", (long long)p->work_ms);
    snprintf(a[8], 160, "%lld", (long long)p->wait_ms);
    snprintf(a[9], 160, "%lld", (long long)p->run_ms);
    snprintf(a[10], 160, "%lld", (long long)p->gap_ms);
    snprintf(a[11], 160, "%lld", (long long)p->cmd_timeout_ms);
    snprintf(a[12], 160, "%lld", (long long)p->conn_timeout_ms);
    snprintf(a[13], 160, "%lld", (long long)p->node_timeout_ms);
    pid_t pid = th_fork();
    if (pid == 0) {
        char *argv[17];
        argv[0] = "test_fault_inject";
        argv[1] = "worker";
        for (int i = 0; i < 14; i++) argv[2 + i] = a[i];
        argv[16] = NULL;
        for (char *const *e = env_extra; e && *e; e++) putenv(*e);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    return pid;
}

static int worker_main(int argc, char **argv)
{
    if (argc != 16) return 2;
    wparams p;
    memset(&p, 0, sizeof p);
    p.id = atoi(argv[2]);
    p.url = argv[3];
    p.fence_url = strcmp(argv[4], "-") ? argv[4] : NULL;
    p.res_sock = argv[5];
    p.rounds = atoi(argv[6]);
    p.fenced = atoi(argv[7]);
    p.lease_ms = atoll(argv[8]);
    p.work_ms = atoll(argv[9]);
    p.wait_ms = atoll(argv[10]);
    p.run_ms = atoll(argv[11]);
    p.gap_ms = atoll(argv[12]);
    p.cmd_timeout_ms = atoll(argv[13]);
    p.conn_timeout_ms = atoll(argv[14]);
    p.node_timeout_ms = atoll(argv[15]);
    return run_worker(&p);
}

static wparams defaults(int id, const char *url, const th_server *res)
{
    wparams p;
    memset(&p, 0, sizeof p);
    p.id = id;
    p.url = url;
    p.res_sock = th_server_sock(res);
    p.rounds = 1000;
    p.fenced = 1;
    p.lease_ms = 1500;
    p.work_ms = 30;
    p.wait_ms = 2000;
    p.run_ms = 5000;
    p.gap_ms = 5;
    p.cmd_timeout_ms = 500;
    p.conn_timeout_ms = 300;
    p.node_timeout_ms = 100;
    return p;
}

/* Every server a scenario starts, stopped at the end (no leaks under ASan). */
static th_server *g_srv[16];
static int g_nsrv;

static th_server *srv_start(const th_server_opts *o)
{
    ASSERT(g_nsrv < 16);
    return g_srv[g_nsrv++] = th_server_start(o);
}

/* ------------------------------------------------------------------------ */
/* the checker                                                              */

#define MAX_SECTIONS 4096
#define MAX_WORKERS 16

typedef struct section {
    int worker;
    unsigned long long tok;
    long b, e;
    long long valid, wall;
    long long valid2; /* V: validity after the work; -1 if none */
} section;

typedef struct result {
    int ops, faults, overlaps, stale;
    int accepted, rejected, skipped, errors, timeouts, release_errs;
    int err_by_code[DLOCK_CODE_LAST_ + 1];
    char first_err[DLOCK_CODE_LAST_ + 1][200];
    section s[MAX_SECTIONS];
} result;

static result g_res;

static void check(redisContext *rrc, const char *scenario, int faults, result *out)
{
    memset(out, 0, sizeof *out);
    out->faults = faults;
    redisReply *r = th_cmd(rrc, "LRANGE hist 0 -1");
    ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
    int open[MAX_WORKERS];
    for (int i = 0; i < MAX_WORKERS; i++) open[i] = -1;
    int have_max = 0;
    unsigned long long max = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const char *e = r->element[i]->str;
        char kind = e[0];
        int w = -1;
        unsigned long long tok = 0;
        long long a = 0, b = 0;
        int n = sscanf(e + 1, "%d %llu %lld %lld", &w, &tok, &a, &b);
        ASSERT_MSG(n >= 1 && w >= 0 && w < MAX_WORKERS, "bad event \"%s\"", e);
        switch (kind) {
        case 'B':
            ASSERT_MSG(open[w] < 0, "worker %d: two open sections", w);
            ASSERT(out->ops < MAX_SECTIONS);
            out->s[out->ops] = (section){w, tok, (long)i, -1, a, b, -1};
            open[w] = out->ops++;
            break;
        case 'W': {
            int acc = (int)a;
            if (acc) {
                out->accepted++;
                if (have_max && tok <= max) {
                    out->stale++;
                    printf("  stale write accepted: worker %d token %llu at #%zu (token %llu "
                           "accepted before)\n", w, tok, i, max);
                }
                if (!have_max || tok > max) max = tok;
                have_max = 1;
            } else {
                out->rejected++;
                printf("  write rejected by the fence: worker %d token %llu at #%zu "
                       "(highest %llu)\n", w, tok, i, max);
            }
            break;
        }
        case 'S': out->skipped++; break;
        case 'V':
            if (open[w] >= 0) out->s[open[w]].valid2 = a;
            break;
        case 'E':
        case 'K':
            if (open[w] >= 0) out->s[open[w]].e = (long)i;
            open[w] = -1;
            break;
        case 'X': {
            int code = (int)tok;
            out->errors++;
            if (code < 0 || code > DLOCK_CODE_LAST_) code = DLOCK_CODE_LAST_;
            if (out->err_by_code[code]++ == 0) {
                const char *msg = e + 2;
                for (int k = 0; k < 2 && msg; k++) { /* skip "w code " */
                    msg = strchr(msg, ' ');
                    if (msg) msg++;
                }
                snprintf(out->first_err[code], sizeof out->first_err[code], "%s",
                         msg ? msg : "");
            }
            break;
        }
        case 'T': out->timeouts++; break;
        case 'R': out->release_errs++; break;
        default: th_fail(__FILE__, __LINE__, "unknown event \"%s\"", e);
        }
    }
    long n_ev = (long)r->elements;
    freeReplyObject(r);
    for (int i = 0; i < out->ops; i++)
        if (out->s[i].e < 0) out->s[i].e = n_ev; /* still open at the end */
    for (int i = 0; i < out->ops; i++)
        for (int j = i + 1; j < out->ops; j++) {
            const section *x = &out->s[i], *y = &out->s[j];
            if (x->b < y->e && y->b < x->e) {
                out->overlaps++;
                printf("  overlap: worker %d token %llu [#%ld, #%ld] with worker %d token %llu "
                       "[#%ld, #%ld]\n", x->worker, x->tok, x->b, x->e, y->worker, y->tok,
                       y->b, y->e);
            }
        }
    printf("%s: ops %d, faults %d, overlaps %d, stale writes accepted %d\n", scenario, out->ops,
           out->faults, out->overlaps, out->stale);
    printf("  details: writes accepted %d, rejected %d, skipped %d; acquire errors %d, "
           "timeouts %d, release errors %d\n", out->accepted, out->rejected, out->skipped,
           out->errors, out->timeouts, out->release_errs);
    for (int k = 0; k <= DLOCK_CODE_LAST_; k++)
        if (out->err_by_code[k])
            printf("  errors %s (%d): %d, first: %s\n", dlock_strerror(k), k,
                   out->err_by_code[k], out->first_err[k]);
}

/* ------------------------------------------------------------------------ */
/* helpers for the parent                                                   */

/* 1 if some event of the history starts with prefix. */
static int hist_has(redisContext *rrc, const char *prefix)
{
    redisReply *r = th_cmd(rrc, "LRANGE hist 0 -1");
    int found = 0;
    for (size_t i = 0; i < r->elements && !found; i++)
        if (!strncmp(r->element[i]->str, prefix, strlen(prefix))) found = 1;
    freeReplyObject(r);
    return found;
}

static void wait_event(redisContext *rrc, const char *prefix, int64_t timeout_ms)
{
    int64_t dl = th_now_ms() + timeout_ms;
    while (!hist_has(rrc, prefix)) {
        ASSERT_MSG(th_now_ms() < dl, "no event \"%s\" within %lld ms", prefix,
                   (long long)timeout_ms);
        th_sleep_ms(2);
    }
}

static void wait_all(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++) {
        if (pids[i] <= 0) continue;
        int st = th_wait_child(pids[i], 30000);
        ASSERT_MSG(st == 0, "worker %d exited with status %d", i, st);
        pids[i] = 0;
    }
}

static void kill_worker(redisContext *rrc, pid_t *pid, int id)
{
    kill(*pid, SIGKILL);
    ASSERT_EQ(th_wait_child(*pid, 5000), 128 + SIGKILL);
    *pid = 0;
    th_cmd_ok(rrc, "RPUSH hist K%d", id); /* "K<id>": the checker reads " %d" after K */
}

/* ------------------------------------------------------------------------ */
/* (a) holder SIGKILLed while holding                                       */

static void sc_kill(void)
{
    th_server *ls = srv_start(NULL);
    th_server *res = srv_start(NULL);
    redisContext *rrc = th_redis(res);
    redisContext *lrc = th_redis(ls);
    pid_t pids[4] = {0};
    int faults = 0;

    wparams v = defaults(0, th_server_url(ls), res);
    v.rounds = 1;
    v.lease_ms = 1000;
    v.work_ms = 800;
    pids[0] = spawn_worker(&v);
    wait_event(rrc, "B 0 ", 5000);
    for (int i = 1; i <= 2; i++) {
        wparams w = defaults(i, th_server_url(ls), res);
        w.rounds = 3;
        w.lease_ms = 1000;
        w.work_ms = 20;
        w.gap_ms = 80;
        w.wait_ms = 4000;
        w.run_ms = 8000;
        pids[i] = spawn_worker(&w);
    }
    th_wait_subscribers(lrc, LOCK_NAME, 2, 5000); /* both blocked on the holder */
    kill_worker(rrc, &pids[0], 0);
    faults++;
    /* a second victim joins the queue and is killed once it holds */
    v.id = 3;
    pids[3] = spawn_worker(&v);
    wait_event(rrc, "B 3 ", 10000);
    kill_worker(rrc, &pids[3], 3);
    faults++;
    wait_all(pids, 4);
    check(rrc, "kill", faults, &g_res);
    ASSERT_EQ(g_res.overlaps, 0);
    ASSERT_EQ(g_res.stale, 0);
    ASSERT_EQ(g_res.ops, 2 + 6);
    ASSERT_EQ(g_res.accepted, 6);
    ASSERT(!hist_has(rrc, "E 0 ") && !hist_has(rrc, "E 3 ")); /* killed inside */
    redisFree(lrc);
    redisFree(rrc);
}

/* ------------------------------------------------------------------------ */
/* (b) holder SIGSTOPped longer than its lease, then SIGCONTed              */

static void sc_stop(int fenced)
{
    th_server *ls = srv_start(NULL);
    th_server *res = srv_start(NULL);
    redisContext *rrc = th_redis(res);
    pid_t pids[3] = {0};

    wparams v = defaults(0, th_server_url(ls), res);
    v.fenced = fenced;
    v.rounds = 1;
    v.lease_ms = 1000;
    v.work_ms = 400;
    pids[0] = spawn_worker(&v);
    wait_event(rrc, "B 0 ", 5000);
    kill(pids[0], SIGSTOP); /* a "GC pause" inside the critical section */
    int64_t stopped = th_now_ms();
    for (int i = 1; i <= 2; i++) {
        wparams w = defaults(i, th_server_url(ls), res);
        w.fenced = fenced;
        w.rounds = 2;
        w.lease_ms = 1000;
        w.work_ms = 20;
        w.gap_ms = 20;
        w.wait_ms = 4000;
        pids[i] = spawn_worker(&w);
    }
    /* the others get the lock once the lease ran out, and write */
    while (!hist_has(rrc, "W 1 ") && !hist_has(rrc, "W 2 ")) {
        ASSERT_MSG(th_now_ms() - stopped < 8000, "nobody took over the expired lease");
        th_sleep_ms(5);
    }
    int64_t paused = th_now_ms() - stopped;
    kill(pids[0], SIGCONT);
    th_log("holder stopped for %lld ms (lease 1000 ms)", (long long)paused);
    ASSERT_GE(paused, 900);
    wait_all(pids, 3);
    ASSERT(!hist_has(rrc, "W 0 1 1") || !fenced);
    check(rrc, fenced ? "stop_fenced" : "stop_unfenced", 1, &g_res);
    ASSERT_GE(g_res.overlaps, 1); /* the stopped holder overlapped its successor */
    if (fenced) {
        ASSERT_EQ(g_res.stale, 0);
        ASSERT_GE(g_res.rejected, 1); /* the late write was refused by its token */
    } else {
        ASSERT_GE(g_res.stale, 1); /* the checker finds the violation */
    }
    ASSERT(hist_has(rrc, "R 0 10 ")); /* its release said DLOCK_ELOST */
    redisFree(rrc);
}

/* ------------------------------------------------------------------------ */
/* (c) redis-server SIGKILLed and restarted                                  */

static void sc_restart(int aof)
{
    th_server_opts so = {aof, NULL};
    th_server *ls = srv_start(&so);
    th_server *res = srv_start(NULL);
    redisContext *rrc = th_redis(res);
    pid_t pids[3] = {0};
    for (int i = 0; i < 3; i++) {
        wparams w = defaults(i, th_server_url(ls), res);
        w.lease_ms = 2000;
        w.work_ms = 250;
        w.wait_ms = 2500;
        w.run_ms = 5500;
        pids[i] = spawn_worker(&w);
    }
    int faults = 0;
    for (int k = 0; k < 2; k++) {
        /* crash while somebody is inside: 2 s of run, then the holder's B */
        th_sleep_ms(k == 0 ? 800 : 1500);
        long n0 = (long)th_cmd_int(rrc, "LLEN hist");
        /* wait for a fresh B (a holder inside its 250 ms of work) */
        int64_t dl = th_now_ms() + 3000;
        for (;;) {
            redisReply *r = th_cmd(rrc, "LRANGE hist %ld -1", n0);
            int got = 0;
            for (size_t i = 0; i < r->elements; i++)
                if (r->element[i]->str[0] == 'B') got = 1;
            freeReplyObject(r);
            if (got || th_now_ms() > dl) break;
            th_sleep_ms(2);
        }
        th_server_restart(ls, SIGKILL);
        faults++;
        th_log("redis-server SIGKILLed and restarted (%s)", aof ? "AOF always" : "no persistence");
    }
    wait_all(pids, 3);
    check(rrc, aof ? "restart_aof" : "restart_nopersist", faults, &g_res);
    ASSERT_GE(g_res.ops, 6);
    if (aof) {
        ASSERT_EQ(g_res.overlaps, 0);
        ASSERT_EQ(g_res.stale, 0);
        ASSERT_EQ(g_res.rejected, 0);
    }
    /* without persistence: the restarted server forgot the held lock, so
     * overlaps are reported, not asserted (see docs/safety.md); but it also
     * forgot the fence counter, and the tokens must still grow (the counter
     * starts again at the server's clock, DL_LUA_FENCE): the fenced resource
     * may refuse a write only of a section that overlapped another (the
     * holder the restart robbed). Tokens that restarted at 1 made it refuse
     * every new holder's writes until the counter passed its old maximum. */
    if (!aof) ASSERT_GE(g_res.overlaps, g_res.rejected);
    redisFree(rrc);
}

/* ------------------------------------------------------------------------ */
/* (d) connections cut or stalled: a TCP proxy in a child process           */

static void sc_proxy(void)
{
    th_server *ls = srv_start(NULL);
    th_server *res = srv_start(NULL);
    redisContext *rrc = th_redis(res);
    fl_proxy px = fl_proxy_start(th_server_port(ls));
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", px.port);
    pid_t pids[3] = {0};
    for (int i = 0; i < 3; i++) {
        wparams w = defaults(i, url, res);
        w.lease_ms = 1500;
        w.work_ms = 40;
        w.wait_ms = 1500;
        w.run_ms = 6500;
        w.cmd_timeout_ms = 300;
        pids[i] = spawn_worker(&w);
    }
    int faults = 0;
    th_sleep_ms(800);
    fl_proxy_cmd(&px, 'D'); /* cut every connection */
    faults++;
    th_log("proxy: all connections cut");
    th_sleep_ms(1000);
    fl_proxy_cmd(&px, 'F'); /* stall: nothing forwarded, nothing accepted */
    faults++;
    th_log("proxy: frozen for 1200 ms");
    th_sleep_ms(1200);
    fl_proxy_cmd(&px, 'U');
    th_sleep_ms(800);
    fl_proxy_cmd(&px, 'F'); /* stall, then cut the stalled connections */
    faults++;
    th_sleep_ms(500);
    fl_proxy_cmd(&px, 'D');
    faults++;
    fl_proxy_cmd(&px, 'U');
    th_log("proxy: frozen 500 ms then cut");
    wait_all(pids, 3);
    fl_proxy_stop(&px);
    check(rrc, "proxy", faults, &g_res);
    ASSERT_EQ(g_res.overlaps, 0);
    ASSERT_EQ(g_res.stale, 0);
    ASSERT_EQ(g_res.rejected, 0);
    ASSERT_GE(g_res.errors + g_res.release_errs, 1); /* the faults were reported */
    ASSERT_GE(g_res.ops, 10);                        /* and work went on */
    redisFree(rrc);
}


/* A private server behind a proxy (fl_proxy): *url names the proxy, *lrc
 * reaches the server directly. */
static void proxied_server(th_server **ls, fl_proxy *px, char *url, size_t urllen,
                           redisContext **lrc)
{
    *ls = srv_start(NULL);
    *px = fl_proxy_start(th_server_port(*ls));
    snprintf(url, urllen, "redis://127.0.0.1:%d", px->port);
    *lrc = th_redis(*ls);
}

/* A client of url whose commands time out after cmd_ms. */
static dlock_client *client_at(const char *url, int64_t cmd_ms)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.command_timeout_ms = cmd_ms;
    dlock_client *c = NULL;
    ASSERT_EQ(dlock_client_new(&o, &c), DLOCK_OK);
    return c;
}

/* ------------------------------------------------------------------------ */
/* (d2) one request delivered twice (the proxy's one-shot '2'): the server
 * answers twice, and the extra reply must never be read as a later
 * command's answer. Found by the explorer (test_explore --seed 1): the
 * release after a doubled acquire read the acquire's second reply
 * ("unexpected reply"), and each later command its predecessor's.        */

static void sc_dup_request(void)
{
    th_server *ls;
    fl_proxy px;
    char url[64];
    redisContext *lrc;
    proxied_server(&ls, &px, url, sizeof url, &lrc);
    static const dlock_kind kinds[] = {DLOCK_KIND_PLAIN, DLOCK_KIND_REENTRANT};
    static const char *kname[] = {"plain", "reentrant"};
    int faults = 0;
    for (int ki = 0; ki < 2; ki++) {
        dlock_client *c = client_at(url, 500);
        dlock_lock *l = NULL;
        ASSERT_EQ(dlock_lock_new(c, "dup", DLOCK_CSTR, kinds[ki], &l), DLOCK_OK);
        /* a first pair: the connection is open and the script cached, so
         * the doubled chunk is one EVALSHA */
        uint64_t tok = 0, tok2 = 0;
        ASSERT_EQ(dlock_acquire(l, DLOCK_NOWAIT, 5000, &tok), DLOCK_OK);
        ASSERT_EQ(dlock_release(l), DLOCK_OK);
        fl_proxy_cmd(&px, '2');
        faults++;
        ASSERT_EQ(dlock_acquire(l, DLOCK_NOWAIT, 5000, &tok), DLOCK_OK);
        th_sleep_ms(50); /* the second reply is in by now */
        /* the release must not read the acquire's second reply: it finds
         * the connection out of step (DLOCK_EIO, nothing sent) or answers
         * from its own reply */
        int r = dlock_release(l);
        printf("dup_request %s: release after a doubled acquire: %d (%s)\n", kname[ki], r,
               r ? dlock_lock_errmsg(l) : "");
        ASSERT_MSG(r == DLOCK_OK || r == DLOCK_EIO, "release read a stale reply: %d (%s)", r,
                   dlock_lock_errmsg(l));
        if (r == DLOCK_EIO) ASSERT_EQ(dlock_release(l), DLOCK_OK); /* a new connection */
        ASSERT_EQ(dlock_lock_holding(l), 0);
        /* plain: gone. Reentrant: the second acquire counted twice on the
         * server (a doubled request is not idempotent); the count left runs
         * out with the lease */
        long long ex = th_cmd_int(lrc, "EXISTS dup");
        if (ki == 0) ASSERT_EQ(ex, 0);
        else ASSERT(th_cmd_int(lrc, "PTTL dup") <= 5000);
        th_cmd_int(lrc, "DEL dup");
        /* every later call answers from its own reply */
        for (int k = 0; k < 3; k++) {
            ASSERT_EQ(dlock_acquire(l, DLOCK_NOWAIT, 5000, &tok2), DLOCK_OK);
            ASSERT_GT(tok2, tok);
            tok = tok2;
            ASSERT_EQ(th_cmd_int(lrc, "EXISTS dup"), 1);
            ASSERT_EQ(dlock_release(l), DLOCK_OK);
            ASSERT_EQ(th_cmd_int(lrc, "EXISTS dup"), 0);
        }
        dlock_lock_free(l);
        dlock_client_free(c);
    }
    fl_proxy_stop(&px);
    printf("dup_request: ops 10, faults %d, overlaps 0, stale writes accepted 0\n", faults);
    redisFree(lrc);
}

/* ------------------------------------------------------------------------ */
/* (d2b) a release of a re-entered hold (count 2) whose request is doubled:
 * the copy must not take the count down a second time (which deleted the
 * hold while the handle still counted 1, and a second client then took the
 * lock). The release scripts of the counted kinds take the count the owner
 * should have before the release and change nothing below it.            */

static void sc_dup_release(void)
{
    th_server *ls;
    fl_proxy px;
    char url[64];
    redisContext *lrc;
    proxied_server(&ls, &px, url, sizeof url, &lrc);
    static const dlock_kind kinds[] = {DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR, DLOCK_KIND_WRITE,
                                       DLOCK_KIND_READ};
    static const char *kname[] = {"reentrant", "fair", "write", "read"};
    int ops = 0;
    for (int ki = 0; ki < 4; ki++) {
        dlock_client *c = client_at(url, 500);
        dlock_client *other = client_at(th_server_url(ls), 500); /* around the proxy */
        char name[32];
        snprintf(name, sizeof name, "duprel-%s", kname[ki]);
        dlock_lock *l = NULL, *rival = NULL;
        ASSERT_EQ(dlock_lock_new(c, name, DLOCK_CSTR, kinds[ki], &l), DLOCK_OK);
        ASSERT_EQ(dlock_lock_new(other, name, DLOCK_CSTR, DLOCK_KIND_WRITE == kinds[ki] ||
                                 DLOCK_KIND_READ == kinds[ki] ? DLOCK_KIND_WRITE : kinds[ki],
                                 &rival), DLOCK_OK);
        /* a first pair: the scripts cached, so the doubled chunk is one EVALSHA */
        ASSERT_EQ(dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL), DLOCK_OK);
        ASSERT_EQ(dlock_release(l), DLOCK_OK);
        ASSERT_EQ(dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL), DLOCK_OK);
        ASSERT_EQ(dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL), DLOCK_OK); /* count 2 */
        fl_proxy_cmd(&px, '2');
        int r = dlock_release(l);
        th_sleep_ms(50); /* the copy is in by now */
        ops += 5;
        printf("dup_release %s: release of count 2, doubled: %d (%s)\n", kname[ki], r,
               r ? dlock_lock_errmsg(l) : "");
        ASSERT_EQ(r, DLOCK_OK);
        /* still held by l: the rival is refused, the server counts 1 */
        int rr = dlock_acquire(rival, DLOCK_NOWAIT, 10000, NULL);
        ASSERT_MSG(rr == DLOCK_EBUSY, "%s: a second client took the lock after a doubled "
                   "release of a re-entered hold: %d", kname[ki], rr);
        int held = 0;
        int64_t n = 0;
        ASSERT_EQ(dlock_lock_check(l, &held, &n), DLOCK_OK);
        ASSERT_EQ(held, 1);
        ASSERT_EQ(n, 1);
        ASSERT_EQ(dlock_release(l), DLOCK_OK);
        ASSERT_EQ(dlock_acquire(rival, DLOCK_NOWAIT, 10000, NULL), DLOCK_OK);
        ASSERT_EQ(dlock_release(rival), DLOCK_OK);
        ASSERT_EQ(th_cmd_int(lrc, "EXISTS %s", name), 0);
        ops += 5;
        dlock_lock_free(rival);
        dlock_lock_free(l);
        dlock_client_free(other);
        dlock_client_free(c);
    }
    fl_proxy_stop(&px);
    printf("dup_release: ops %d, faults 4, overlaps 0, stale writes accepted 0\n", ops);
    redisFree(lrc);
}

/* ------------------------------------------------------------------------ */
/* (d2c) a handle freed while its release fails (the link frozen), then a new
 * handle of the same owner (client and thread) on the same name: it
 * re-enters the hold left on the server, and its release must end that hold
 * too (the lock free at once). Found by the explorer (test_explore --seed
 * 1771: after a restart a worker's freed handle left a count its next
 * handles kept re-entering, each release renewing its lease; the worker
 * took the lock 15 times in a row while 5 waiters saw it held, and it stayed
 * held 3 s after the worker's last release).                              */

static void sc_free_holding(void)
{
    th_server *ls;
    fl_proxy px;
    char url[64];
    redisContext *lrc;
    proxied_server(&ls, &px, url, sizeof url, &lrc);
    static const dlock_kind kinds[] = {DLOCK_KIND_REENTRANT, DLOCK_KIND_FAIR, DLOCK_KIND_WRITE};
    static const char *kname[] = {"reentrant", "fair", "write"};
    for (int ki = 0; ki < 3; ki++) {
        dlock_client *c = client_at(url, 300);
        dlock_client *other = client_at(th_server_url(ls), 300); /* around the proxy */
        char name[32];
        snprintf(name, sizeof name, "freeheld-%s", kname[ki]);
        dlock_lock *a = NULL, *b = NULL, *rival = NULL;
        ASSERT_EQ(dlock_lock_new(c, name, DLOCK_CSTR, kinds[ki], &a), DLOCK_OK);
        ASSERT_EQ(dlock_lock_new(other, name, DLOCK_CSTR, kinds[ki], &rival), DLOCK_OK);
        ASSERT_EQ(dlock_acquire(a, DLOCK_NOWAIT, 10000, NULL), DLOCK_OK);
        fl_proxy_cmd(&px, 'F');
        dlock_lock_free(a); /* its release times out: the hold stays on the server */
        fl_proxy_cmd(&px, 'U');
        fl_proxy_cmd(&px, 'D'); /* and the frozen connections go */
        ASSERT_EQ(th_cmd_int(lrc, "EXISTS %s", name), 1);
        ASSERT_EQ(dlock_lock_new(c, name, DLOCK_CSTR, kinds[ki], &b), DLOCK_OK);
        for (int round = 0; round < 2; round++) {
            ASSERT_EQ(dlock_acquire(b, DLOCK_NOWAIT, 10000, NULL), DLOCK_OK);
            int r = dlock_release(b);
            ASSERT_MSG(r == DLOCK_OK, "%s: release: %d (%s)", kname[ki], r, dlock_lock_errmsg(b));
            long long ex = th_cmd_int(lrc, "EXISTS %s", name);
            printf("free_holding %s: round %d, after the new handle's release the lock %s\n",
                   kname[ki], round, ex ? "is still held" : "is free");
            ASSERT_MSG(ex == 0, "%s: the freed handle's hold outlived the owner's release "
                       "(round %d)", kname[ki], round);
            ASSERT_EQ(dlock_acquire(rival, DLOCK_NOWAIT, 10000, NULL), DLOCK_OK);
            ASSERT_EQ(dlock_release(rival), DLOCK_OK);
        }
        dlock_lock_free(b);
        dlock_lock_free(rival);
        dlock_client_free(other);
        dlock_client_free(c);
    }
    fl_proxy_stop(&px);
    printf("free_holding: ops 18, faults 3, overlaps 0, stale writes accepted 0\n");
    redisFree(lrc);
}

/* ------------------------------------------------------------------------ */
/* (d3) a semaphore's release or add whose request is doubled, dropped, or
 * whose reply is dropped: counted exactly once. The Redisson layout is a
 * bare counter; each change carries an id the script counts once, and a
 * change whose reply was lost is sent again with the same id. Found by the
 * explorer (test_explore --seed 348: a doubled release made a semaphore of
 * 1 permit hold 2, and two workers held at once).                         */

/* GET of an integer-valued string key; -1 if it is missing */
static long long get_ll(redisContext *rc, const char *key)
{
    redisReply *r = redisCommand(rc, "GET %s", key);
    ASSERT(r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_NIL));
    long long v = r->type == REDIS_REPLY_NIL ? -1 : atoll(r->str);
    freeReplyObject(r);
    return v;
}

static void sc_dup_semaphore(void)
{
    th_server *ls;
    fl_proxy px;
    char url[64];
    redisContext *lrc;
    proxied_server(&ls, &px, url, sizeof url, &lrc);
    dlock_client *c = client_at(url, 500);
    dlock_semaphore *s = NULL;
    ASSERT_EQ(dlock_semaphore_new(c, "dupsem", DLOCK_CSTR, &s), DLOCK_OK);
    int set = 0;
    ASSERT_EQ(dlock_semaphore_try_set(s, 1, &set), DLOCK_OK);
    ASSERT_EQ(set, 1);
    /* the scripts cached: a doubled chunk is one EVALSHA */
    ASSERT_EQ(dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT), DLOCK_OK);
    ASSERT_EQ(dlock_semaphore_release(s, 1), DLOCK_OK);
    static const char faults[] = {'2', 'r', 'p'};
    static const char *fname[] = {"doubled request", "dropped request", "dropped reply"};
    int ops = 0;
    for (int f = 0; f < 3; f++) {
        for (int add = 0; add < 2; add++) {
            /* take the permit, then give it back through the fault */
            ASSERT_EQ(dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT), DLOCK_OK);
            ASSERT_EQ(get_ll(lrc, "dupsem"), 0);
            fl_proxy_cmd(&px, faults[f]);
            int r = add ? dlock_semaphore_add(s, 1) : dlock_semaphore_release(s, 1);
            ops += 2;
            th_sleep_ms(50); /* a doubled copy is in by now */
            long long v = get_ll(lrc, "dupsem");
            printf("dup_semaphore: %s of a %s: %d (%s), count %lld\n", add ? "add" : "release",
                   fname[f], r, r ? dlock_semaphore_errmsg(s) : "", v);
            ASSERT_MSG(r == DLOCK_OK, "%s of a %s: %d (%s)", add ? "add" : "release", fname[f], r,
                       dlock_semaphore_errmsg(s));
            ASSERT_MSG(v == 1, "%s of a %s: the count is %lld, not 1", add ? "add" : "release",
                       fname[f], v);
            /* a second holder is refused */
            ASSERT_EQ(dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT), DLOCK_OK);
            ASSERT_EQ(dlock_semaphore_acquire(s, 1, DLOCK_NOWAIT), DLOCK_EBUSY);
            ASSERT_EQ(dlock_semaphore_release(s, 1), DLOCK_OK);
            ops += 3;
        }
    }
    /* each change left one id key, and it expires */
    long long pttl = th_cmd_int(lrc, "PTTL dlock_semchg:{dupsem}:00");
    ASSERT_EQ(pttl, -2);
    redisReply *k = redisCommand(lrc, "KEYS dlock_semchg:*");
    ASSERT(k && k->type == REDIS_REPLY_ARRAY && k->elements >= 12);
    for (size_t i = 0; i < k->elements; i++) {
        redisReply *t = redisCommand(lrc, "PTTL %b", k->element[i]->str, k->element[i]->len);
        ASSERT(t && t->type == REDIS_REPLY_INTEGER && t->integer > 0 && t->integer <= 60000);
        freeReplyObject(t);
    }
    freeReplyObject(k);
    dlock_semaphore_free(s);
    dlock_client_free(c);
    fl_proxy_stop(&px);
    printf("dup_semaphore: ops %d, faults 6, overlaps 0, stale writes accepted 0\n", ops);
    redisFree(lrc);
}

/* ------------------------------------------------------------------------ */
/* (e) RedLock over 5 masters                                               */

typedef struct rl {
    th_server *node[NODES];
    char url[512];
} rl;

static void rl_start(rl *r)
{
    size_t off = (size_t)snprintf(r->url, sizeof r->url, "redlock://");
    for (int i = 0; i < NODES; i++) {
        r->node[i] = srv_start(NULL);
        off += (size_t)snprintf(r->url + off, sizeof r->url - off, "%s127.0.0.1:%d",
                                i ? "," : "", th_server_port(r->node[i]));
    }
}

static void sc_redlock_minority(void)
{
    rl r;
    rl_start(&r);
    th_server *res = srv_start(NULL);
    redisContext *rrc = th_redis(res);
    pid_t pids[3] = {0};
    for (int i = 0; i < 3; i++) {
        wparams w = defaults(i, r.url, res);
        w.lease_ms = 1000;
        w.work_ms = 30;
        w.wait_ms = 1500;
        w.run_ms = 6500;
        pids[i] = spawn_worker(&w);
    }
    int faults = 0;
    th_sleep_ms(700);
    th_server_halt(r.node[0], SIGKILL);
    th_server_halt(r.node[1], SIGKILL);
    faults += 2;
    th_log("nodes 0 and 1 killed");
    th_sleep_ms(1600); /* restarted (empty) only after the longest lease: the rule */
    th_server_resume(r.node[0]);
    th_server_resume(r.node[1]);
    th_log("nodes 0 and 1 restarted (empty, after the lease)");
    th_sleep_ms(600);
    th_server_pause(r.node[2]);
    th_server_pause(r.node[3]);
    faults += 2;
    th_log("nodes 2 and 3 frozen (SIGSTOP) for 1500 ms");
    th_sleep_ms(1500);
    th_server_unpause(r.node[2]);
    th_server_unpause(r.node[3]);
    wait_all(pids, 3);
    check(rrc, "redlock_minority", faults, &g_res);
    ASSERT_EQ(g_res.overlaps, 0);
    ASSERT_EQ(g_res.stale, 0);
    ASSERT_GE(g_res.ops, 10);
    /* the token is the largest of the majority's counters: a node restarted
     * empty, then left out of a majority, must not make the tokens fall back
     * (RedLock nodes' counters follow the clock, one machine's here:
     * DL_LUA_FENCE). With counters of their own ages, the resource refused
     * 6 legitimate writes in this schedule. */
    ASSERT_EQ(g_res.rejected, 0);
    redisFree(rrc);
}

static void sc_redlock_majority(void)
{
    rl r;
    rl_start(&r);
    th_server *res = srv_start(NULL);
    redisContext *rrc = th_redis(res);
    pid_t pids[2] = {0};
    for (int i = 0; i < 2; i++) {
        wparams w = defaults(i, r.url, res);
        w.lease_ms = 1000;
        w.work_ms = 30;
        w.wait_ms = 600;
        w.run_ms = 7000;
        w.gap_ms = 20;
        pids[i] = spawn_worker(&w);
    }
    int faults = 0;
    th_sleep_ms(600);
    for (int i = 0; i < 3; i++) th_server_halt(r.node[i], SIGKILL);
    faults += 3;
    th_log("nodes 0, 1, 2 killed (majority lost)");
    th_sleep_ms(1500);
    for (int i = 0; i < 3; i++) th_server_resume(r.node[i]);
    th_log("nodes 0, 1, 2 restarted (empty, after the lease)");
    /* clients probe masters the quorum needs every 100 ms (their backoff
     * alone would keep them away up to 2 s); the wait leaves both phases
     * apart */
    th_sleep_ms(2200);
    for (int i = 2; i < 5; i++) th_server_pause(r.node[i]);
    faults += 3;
    th_log("nodes 2, 3, 4 frozen (majority lost) for 1200 ms");
    th_sleep_ms(1200);
    for (int i = 2; i < 5; i++) th_server_unpause(r.node[i]);
    wait_all(pids, 2);
    check(rrc, "redlock_majority", faults, &g_res);
    ASSERT_EQ(g_res.overlaps, 0);
    ASSERT_EQ(g_res.stale, 0);
    ASSERT_EQ(g_res.rejected, 0); /* as in redlock_minority */
    ASSERT_GE(g_res.err_by_code[DLOCK_ENOQUORUM], 1);
    /* the only failures are clean "no quorum" errors */
    ASSERT_EQ(g_res.errors, g_res.err_by_code[DLOCK_ENOQUORUM]);
    redisFree(rrc);
}

/* A crafted schedule: A holds on exactly {0, 1, 2} (3 and 4 down); node 2
 * crashes and comes back empty; 3 and 4 come back empty; B asks. With the
 * restart inside A's TTL, {2, 3, 4} is a majority that never heard of A.
 * delayed: node 2 stays down until A's lease has run out. */
static void sc_redlock_restart(int delayed)
{
    rl r;
    rl_start(&r);
    th_server *res = srv_start(NULL);
    redisContext *rrc = th_redis(res);
    const char *name = delayed ? "redlock_delayed" : "redlock_restart";
    pid_t pids[2] = {0};
    th_server_halt(r.node[3], SIGKILL);
    th_server_halt(r.node[4], SIGKILL);
    wparams a = defaults(0, r.url, res);
    a.rounds = 1;
    a.lease_ms = 3000;
    a.work_ms = 1500; /* inside its validity: a careful holder */
    pids[0] = spawn_worker(&a);
    wait_event(rrc, "B 0 ", 5000);
    int64_t t_acq = th_now_ms();
    th_server_halt(r.node[2], SIGKILL);
    int faults = 3;
    if (!delayed) {
        th_server_resume(r.node[2]); /* restarted at once, without its keys */
        th_log("node 2 crashed and restarted at once (no persistence)");
    }
    th_server_resume(r.node[3]);
    th_server_resume(r.node[4]);
    wparams b = defaults(1, r.url, res);
    b.rounds = 1;
    b.lease_ms = 3000;
    b.work_ms = 50;
    b.wait_ms = 6000;
    b.run_ms = 8000;
    pids[1] = spawn_worker(&b);
    if (delayed) {
        th_sleep_ms(t_acq + a.lease_ms + 200 - th_now_ms());
        th_server_resume(r.node[2]);
        th_log("node 2 restarted %lld ms after A's acquire (lease %lld ms)",
               (long long)(th_now_ms() - t_acq), (long long)a.lease_ms);
    }
    wait_all(pids, 2);
    check(rrc, name, faults, &g_res);
    ASSERT_EQ(g_res.ops, 2);
    if (delayed) {
        ASSERT_EQ(g_res.overlaps, 0);
        ASSERT_EQ(g_res.stale, 0);
    } else {
        ASSERT_EQ(g_res.overlaps, 1); /* the documented hazard, found by the checker */
        /* B's token is above A's (a fresh counter starts at the clock; equal
         * tokens before that): the fence refuses A's late write */
        ASSERT_EQ(g_res.stale, 0);
        ASSERT_EQ(g_res.rejected, 1);
    }
    redisFree(rrc);
}

/* ------------------------------------------------------------------------ */
/* (f) the client's wall clock jumps (libfaketime)                          */

static const char *faketime_lib(void)
{
    static const char *cands[] = {
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
    };
    const char *env = getenv("DLOCK_FAKETIME_LIB");
    if (env && access(env, R_OK) == 0) return env;
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++)
        if (access(cands[i], R_OK) == 0) return cands[i];
    return NULL;
}

static void write_spec(const char *path, const char *spec)
{
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    ASSERT_NOT_NULL(f);
    fprintf(f, "%s\n", spec);
    ASSERT_EQ(fclose(f), 0);
    ASSERT_EQ(rename(tmp, path), 0);
}

/* mono = 0: the real-life case, the wall clock jumps and CLOCK_MONOTONIC does
 * not (DONT_FAKE_MONOTONIC=1); asserted. mono = 1: libfaketime also moves
 * CLOCK_MONOTONIC (its default), which no kernel does; reported only. */
static void sc_clock(int mono)
{
    const char *lib = faketime_lib();
    if (!lib)
        th_skip("libfaketime not found (apt-get install faketime, or set DLOCK_FAKETIME_LIB)");
    th_server *ls = srv_start(NULL);
    th_server *res = srv_start(NULL);
    redisContext *rrc = th_redis(res);
    char spec[300];
    snprintf(spec, sizeof spec, "%s/faketime.spec", th_server_dir(res));
    write_spec(spec, "+0");
    static char e_pre[400], e_file[400];
    snprintf(e_pre, sizeof e_pre, "LD_PRELOAD=%s", lib);
    snprintf(e_file, sizeof e_file, "FAKETIME_TIMESTAMP_FILE=%s", spec);
    /* ASan wants to be first in the library list: LD_PRELOAD breaks that */
    char *env[] = {e_pre, e_file, "FAKETIME_NO_CACHE=1",
                   "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0",
                   mono ? NULL : "DONT_FAKE_MONOTONIC=1", NULL};
    pid_t pids[2] = {0};
    wparams f = defaults(0, th_server_url(ls), res);
    f.lease_ms = 1000;
    f.work_ms = 300;
    f.wait_ms = 1500;
    f.run_ms = 4500;
    f.rounds = 12;
    /* with a faked CLOCK_MONOTONIC the worker's own run bound jumps too */
    if (mono) f.run_ms = 4LL * 86400 * 1000;
    pids[0] = exec_worker(&f, env);
    wparams n = f;
    n.id = 1;
    n.run_ms = 4500;
    pids[1] = spawn_worker(&n);
    int faults = 0;
    const char *jumps[] = {"+1h", "-2d", "+0"};
    for (int k = 0; k < 3; k++) {
        /* each jump lands inside one of worker 0's critical sections */
        th_sleep_ms(300);
        long n0 = (long)th_cmd_int(rrc, "LLEN hist");
        int64_t dl = th_now_ms() + 5000;
        for (int got = 0; !got;) {
            redisReply *r = th_cmd(rrc, "LRANGE hist %ld -1", n0);
            for (size_t i = 0; i < r->elements; i++)
                if (!strncmp(r->element[i]->str, "B 0 ", 4)) got = 1;
            freeReplyObject(r);
            ASSERT_MSG(got || th_now_ms() < dl, "worker 0 did not enter a section in 5 s");
            if (!got) th_sleep_ms(2);
        }
        th_sleep_ms(100);
        write_spec(spec, jumps[k]);
        faults++;
        th_log("faked wall clock of worker 0 jumped to %s", jumps[k]);
    }
    for (int i = 0; i < 2; i++) {
        int st = th_wait_child(pids[i], 30000);
        ASSERT_MSG(mono || st == 0, "worker %d exited with status %d", i, st);
        if (st != 0) th_log("worker %d exited with status %d", i, st);
    }
    check(rrc, mono ? "clock_mono" : "clock", faults, &g_res);
    long long wmin = 0, wmax = 0, vmin = 0, vmax = 0, v2min = 0, v2max = 0;
    int n0 = 0;
    for (int i = 0; i < g_res.ops; i++) {
        const section *s = &g_res.s[i];
        if (s->worker != 0) continue;
        if (!n0++) {
            wmin = wmax = s->wall;
            vmin = vmax = s->valid;
            v2min = v2max = s->valid2;
        }
        if (s->valid2 < v2min) v2min = s->valid2;
        if (s->valid2 > v2max) v2max = s->valid2;
        if (s->wall < wmin) wmin = s->wall;
        if (s->wall > wmax) wmax = s->wall;
        if (s->valid < vmin) vmin = s->valid;
        if (s->valid > vmax) vmax = s->valid;
    }
    printf("  faked worker: %d sections, its wall clock spanned %lld s, validity after "
           "acquire %lld..%lld ms, after %lld ms of work %lld..%lld ms (lease %lld)\n", n0,
           wmax - wmin, vmin, vmax, (long long)f.work_ms, v2min, v2max, (long long)f.lease_ms);
    if (!mono) {
        ASSERT_GE(wmax - wmin, 3600);      /* the jumps were in effect */
        ASSERT_GE(n0, 3);
        ASSERT_GT(vmin, f.lease_ms - 300); /* leases unaffected */
        ASSERT_LE(vmax, f.lease_ms);
        ASSERT_GT(v2min, f.lease_ms - f.work_ms - 300); /* across the jumps too */
        ASSERT_LE(v2max, f.lease_ms - f.work_ms);
        ASSERT_EQ(g_res.overlaps, 0);
        ASSERT_EQ(g_res.stale, 0);
        ASSERT_EQ(g_res.errors, 0);
    }
    redisFree(rrc);
}

/* ------------------------------------------------------------------------ */
/* fence_late: RedLock with a fence server; A's link to the fence server is
 * frozen right after A reached a majority, past A's 1 s lease; B takes the
 * lock meanwhile and gets its token; then A's link thaws. A's acquire must
 * not return OK: its validity ran out before its token came, and a token
 * issued then is above the current holder's (before the fix: DLOCK_OK with
 * dlock_lock_valid_ms() 0 and a token above B's). */

static dlock_lock *g_fl_a;
static int g_fl_rc;
static uint64_t g_fl_fence;

static void *fence_late_a(void *arg)
{
    (void)arg;
    g_fl_rc = dlock_acquire(g_fl_a, DLOCK_NOWAIT, 1000, &g_fl_fence);
    return NULL;
}

static dlock_client *fence_late_client(const char *url, const char *fence_url)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.node_timeout_ms = 100;
    o.fence_url = fence_url;
    o.command_timeout_ms = 5000;
    dlock_client *c = NULL;
    ASSERT_CCODE(c, dlock_client_new(&o, &c), DLOCK_OK);
    return c;
}

static void sc_fence_late(void)
{
    char url[512];
    size_t off = (size_t)snprintf(url, sizeof url, "redlock://");
    th_server *m[3];
    for (int i = 0; i < 3; i++) {
        m[i] = srv_start(NULL);
        off += (size_t)snprintf(url + off, sizeof url - off, "%s127.0.0.1:%d", i ? "," : "",
                                th_server_port(m[i]));
    }
    th_server *fs = srv_start(NULL);
    fl_proxy px = fl_proxy_start(th_server_port(fs));
    char furl[64];
    snprintf(furl, sizeof furl, "redis://127.0.0.1:%d", px.port);
    dlock_client *ca = fence_late_client(url, furl);
    dlock_client *cb = fence_late_client(url, th_server_url(fs));
    g_fl_a = th_lock(ca, "fl", DLOCK_KIND_PLAIN);
    dlock_lock *lb = th_lock(cb, "fl", DLOCK_KIND_PLAIN);
    uint64_t f0 = 0;
    ASSERT_LOK(g_fl_a, dlock_acquire(g_fl_a, DLOCK_NOWAIT, 1000, &f0)); /* a pooled link */
    ASSERT_LOK(g_fl_a, dlock_release(g_fl_a));
    fl_proxy_cmd(&px, 'F');
    int64_t t0 = th_now_ms();
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, fence_late_a, NULL), 0);
    redisContext *r0 = th_redis(m[0]);
    ASSERT_EVENTUALLY(th_cmd_int(r0, "EXISTS fl") == 1, 5000);
    redisFree(r0);
    uint64_t fb = 0;
    int rcb;
    while ((rcb = dlock_acquire(lb, DLOCK_NOWAIT, 10000, &fb)) != DLOCK_OK) {
        ASSERT_LT(th_now_ms() - t0, 8000);
        th_sleep_ms(20);
    }
    th_log("B holds at +%lld ms, token %llu", (long long)(th_now_ms() - t0),
           (unsigned long long)fb);
    th_sleep_ms(200);
    fl_proxy_cmd(&px, 'U');
    pthread_join(th, NULL);
    th_log("A's acquire: %s (%s) at +%lld ms, token %llu, valid %lld ms", dlock_strerror(g_fl_rc),
           dlock_lock_errmsg(g_fl_a), (long long)(th_now_ms() - t0),
           (unsigned long long)g_fl_fence, (long long)dlock_lock_valid_ms(g_fl_a));
    ASSERT_NE(g_fl_rc, DLOCK_OK);
    ASSERT_EQ(dlock_lock_holding(g_fl_a), 0);
    int held = 0;
    ASSERT_LOK(lb, dlock_lock_check(lb, &held, NULL));
    ASSERT_EQ(held, 1);
    /* the next token is above B's */
    ASSERT_LOK(lb, dlock_release(lb));
    uint64_t f2 = 0;
    ASSERT_LOK(g_fl_a, dlock_acquire(g_fl_a, 3000, 1000, &f2));
    ASSERT_U64_GT(f2, fb);
    ASSERT_LOK(g_fl_a, dlock_release(g_fl_a));
    dlock_lock_free(g_fl_a);
    dlock_lock_free(lb);
    dlock_client_free(ca);
    dlock_client_free(cb);
    fl_proxy_stop(&px);
    printf("fence_late: ops 3, faults 1, overlaps 0, stale writes accepted 0\n");
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "worker")) return worker_main(argc, argv);
    const char *v = argc >= 2 ? argv[1] : "";
    th_init(v[0] ? v : "faults");
    signal(SIGPIPE, SIG_IGN);
    if (!strcmp(v, "kill")) sc_kill();
    else if (!strcmp(v, "stop_fenced")) sc_stop(1);
    else if (!strcmp(v, "stop_unfenced")) sc_stop(0);
    else if (!strcmp(v, "restart_aof")) sc_restart(1);
    else if (!strcmp(v, "restart_nopersist")) sc_restart(0);
    else if (!strcmp(v, "proxy")) sc_proxy();
    else if (!strcmp(v, "dup_request")) sc_dup_request();
    else if (!strcmp(v, "dup_semaphore")) sc_dup_semaphore();
    else if (!strcmp(v, "dup_release")) sc_dup_release();
    else if (!strcmp(v, "free_holding")) sc_free_holding();
    else if (!strcmp(v, "fence_late")) sc_fence_late();
    else if (!strcmp(v, "redlock_minority")) sc_redlock_minority();
    else if (!strcmp(v, "redlock_majority")) sc_redlock_majority();
    else if (!strcmp(v, "redlock_restart")) sc_redlock_restart(0);
    else if (!strcmp(v, "redlock_delayed")) sc_redlock_restart(1);
    else if (!strcmp(v, "clock")) sc_clock(0);
    else if (!strcmp(v, "clock_mono")) sc_clock(1);
    else {
        fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
        return 2;
    }
    for (int i = 0; i < g_nsrv; i++) th_server_stop(g_srv[i]);
    return 0;
}
