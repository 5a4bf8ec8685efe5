/*
 * The randomized fault explorer (issue 19): a seed makes a schedule, the
 * schedule runs against real private servers, and a checker reads the
 * history afterwards.
 *
 *   test_explore --seed N          one seed, its schedule printed
 *   test_explore --seeds LIST      seeds (N or A-B, comma-separated), a table
 *                                  per topology and kind
 *   test_explore --long SECONDS    seeds from --from (default: the clock) on,
 *                                  until SECONDS have passed
 *   --plans: print the schedules only; --kind K / --topology T: only the
 *   seeds that draw that kind / topology; --async: only the seeds with
 *   async workers
 *   option: --stall-bound MS (the liveness bound); EXPLORE_DUMP=1 in the
 *   environment prints the whole history of a single seed
 * Exit 0 when every seed passed, 1 when one failed (its schedule and the
 * violations are printed; "--seed N" runs the same schedule again).
 *
 * The schedule is a function of the seed alone: splitmix64 (Steele, Lea,
 * Flood 2014: state += 0x9e3779b97f4a7c15, then the xor-shift-multiply
 * finalizer) seeded with N draws the topology, the workload, the workers'
 * parameters and the faults with their times; each worker draws its own
 * operations from splitmix64 seeded with N and its id. The timing of the
 * processes is the machine's, so a rerun makes the same decisions, not
 * necessarily the same interleaving.
 *
 * Topologies: one Redis without persistence, with RDB (the parent SAVEs at
 * drawn times; a restart loads the last snapshot), with AOF (appendfsync
 * always), each worker through a TCP proxy of its own (faultlib.h);
 * RedLock over 5 masters, with or without a fence server and passwords; a
 * primary with a replica (one seed in six, drawn from a stream of its own),
 * with or without wait_replicas, whose "restart" fault kills the primary
 * and promotes the replica (REPLICAOF NO ONE, every proxy switched to it);
 * in two replica seeds in three (a stream of their own) the replica's link
 * to the primary runs through a proxy too and is cut (every connection
 * reset, new ones left waiting) or frozen (nothing forwarded) once or twice
 * for 0.3 to 3 s.
 * Workloads (one per seed, on one name "x:0", or "x:0".."x:2" for multi):
 *   plain (plus a foreign client: raw SET NX PX, a DEL-if-equal release, no
 *   PUBLISH, as redis-py's Lock), reentrant (re-entry), fair, read/write
 *   (readers and writers), semaphore (1-3 permits), permit semaphore
 *   (leases), multi-lock (sets of 2-3 of three names, plain or reentrant),
 *   latch (one seed in eight that is not RedLock, drawn from a stream of its
 *   own: counters count down, awaiters await, in 1 to 3 rounds, each on a
 *   latch "x:<round>" of its own; latch_worker).
 *   Per worker: explicit leases or the watchdog, extends, waits of every
 *   form (try, timed, forever), and cancels (SIGUSR1, whose handler calls the
 *   async-signal-safe cancel).
 * Async workers (issue 24): in the seeds the async API supports (one Redis
 *   with or without persistence, the replica topology without
 *   wait_replicas; every kind but the multi-lock, which has no async call;
 *   not the foreign client), each worker is async one time in two, drawn
 *   from a stream of its own (the other draws keep their values; the
 *   schedule says "worker 1: async dlock, ..."). An async worker does the
 *   same operations through dlock_async.h on a bare poll loop of its own
 *   (dlock_async_fds, dlock_async_timeout, dlock_async_process): a shim
 *   (wlock, wobj) starts each operation and turns the loop until its
 *   callback ran, so the worker's logic is the blocking worker's; its work
 *   and pauses turn the loop too (w_sleep_ms: the watchdog renews from the
 *   loop's timer), its validity is dlock_async_lock_valid_ms, its lost
 *   callback (dlock_async_lock_on_lost) logs the same L line, and its cancel
 *   handler only writes to a pipe the loop polls, the loop then calling
 *   dlock_async_cancel / dlock_async_object_cancel on the acquire or await
 *   under way. The history does not tell the two APIs apart; a failing
 *   seed's report names its async workers' history ids.
 * Faults: SIGSTOP/SIGCONT of a worker (holder or waiter, as it happens),
 * SIGKILL of a worker (a fresh one replaces it), SIGKILL and restart of the
 * lock server (RedLock: 1 or 2 masters), SIGSTOP of the server (RedLock: 1
 * to 3 masters), a worker's link cut or frozen (RedLock: one master
 * stopped), a PSUBSCRIBE '*' client, a cancel; and, in half the seeds
 * (drawn from a stream of their own), 1 to 3 one-shot faults of a worker's
 * proxy on the next chunk that passes (faultlib.h): a request dropped, a
 * reply dropped (a pub/sub message too: a lost wake-up), a request sent
 * twice, a reply held back 0.3 to 2 s. On RedLock the same, on one
 * worker's link to one master (from a stream of their own too: the
 * workers reach the masters through proxies of their own, one per master,
 * in those seeds only).
 * Each fault logs itself in the history; the checker says which took effect
 * (a pause that hit no holder and no waiter did nothing; a one-shot fault
 * that fired while its worker acquired or held; which command its chunk
 * was, the checker tells from the chunk's first bytes only).
 *
 * History (the resource server's list "hist", faultlib.h), times are
 * CLOCK_MONOTONIC ms (one clock for every process):
 *   A w n wait t        worker w starts an acquire of name n (-1: a set),
 *                       wait_ms (-1 forever, 0 try)
 *   B w n tok valid t   w holds n: fencing token (0: none), validity in ms
 *                       (-1: no lease); a permit adds "end_us t_us": its
 *                       lease's end counted from before the A line, and
 *                       the time the acquire returned, in microseconds
 *   N w n tok t         a re-entry of the held n, its token
 *   V w n valid t       validity after an extend or after the work
 *   W w tok acc n       the fenced write (faultlib.h)
 *   S w n               the write skipped (validity too short)
 *   E w n t             the section on n ends (logged before the release)
 *   T w code t          the acquire ended without the lock (busy, timed out,
 *                       cancelled)
 *   X w code t msg      the acquire (or the client) failed
 *   R w n code          a release did not return DLOCK_OK
 *   O w n t             the release returned DLOCK_OK
 *   L w reason t        the lost callback ran
 *   parent: P w t (SIGSTOP) C w t (SIGCONT) K w t (SIGKILL) D w t (link
 *   cut) G w t / I w t (link frozen / unfrozen) Z mode t node
 *   (server killed, to restart: 0 empty, 1 RDB, 2 AOF) Y t node (it answers
 *   again) F t (SAVE) Q t (PSUBSCRIBE client) U w t (cancel sent) H t node /
 *   J t node (server SIGSTOP / SIGCONT); node: the RedLock master, else 0;
 *   m w t kind ms (a one-shot proxy fault armed: 0 drop request, 1 drop
 *   reply, 2 duplicate request, 3 delay reply by ms); the proxy: M w t kind
 *   chunk (it fired on that chunk)
 *   c t mode / h t (the replication link cut (mode 0) or frozen (1) / about
 *   to work again)
 *   latch: d w r t (a count-down of round r's latch sent), e w r code t msg
 *   (it returned), A w r wait t (an await), k w r t (it returned DLOCK_OK),
 *   T / X as above; parent: z r t / j r t (its zero of round r's latch after
 *   the run: begun / done)
 *
 * Checks:
 *   overlaps: two sections on one name at once (a reader with a reader is
 *     fine; a semaphore allows its permits), except when the earlier one was
 *     past its validity when the later began (paused or cut off past its
 *     lease), or a restart without persistence, or from a snapshot older
 *     than the hold, or a promotion without wait_replicas, came between
 *     them; those are counted as exempt; a semaphore restarted from a
 *     snapshot counts again the permits taken since and still out (their
 *     releases give them back once more): from the restart on, that many
 *     more holders are exempt;
 *   stale writes: a write accepted by the fenced resource with a token not
 *     above every token it accepted before (never exempt);
 *   stale replies: a call that failed with DLOCK_EPROTO (a reply of the
 *     wrong shape: the proxies never corrupt bytes, so it was an earlier
 *     command's reply read as this one's answer; never exempt);
 *   tokens: strictly increasing per name across the history (exclusive
 *     sections and re-entries), but after a restart that forgot the hold of
 *     the larger token (a snapshot's hold found again by its owner comes
 *     with its old token; the fence refuses it): exempt;
 *   short leases: an acquire that returned OK with less than half its lease
 *     left although nothing paused it (a multi-lock's early members); not
 *     for the fair lock, whose handed-over lease is counted, on purpose,
 *     from the waiter's last attempt (the grant's time is not known), nor
 *     for permits (no validity call: the worker counts the lease from the
 *     start of its wait);
 *   late lost callbacks: another client held before the holder's lost
 *     callback ran (unless it was stopped or the server forgot the hold);
 *   no quorum: a RedLock acquire failed with DLOCK_ENOQUORUM while at most
 *     two of the five masters were stopped or restarting during it;
 *   liveness: after a holder's end (its release returned, its death plus
 *     its lease, or its lease's end if it was stopped past it), the time to
 *     the next hold of that name during which some live waiter waited (not
 *     stopped, its link neither frozen nor cut, its wait not over). Above
 *     the bound it is a violation: by default DL_PLAIN_RECHECK_MS (2000),
 *     the backstop re-check every wait falls back on, which no handoff
 *     should need when every client publishes its releases; the worst is
 *     reported. A waiter whose own request or reply a one-shot fault hit
 *     is not live for MSG_STALL_MS after it (command timeout, outage
 *     pause, re-check), and no stall is measured within a lease plus
 *     MSG_STALL_MS after one hit a worker's acquire or hold (a lost acquire
 *     reply, or a doubled re-entry, leaves a hold nobody knows of until its
 *     lease ends). Read/write: a reader is not live while a writer stuck in
 *     its wait (stopped, its link frozen or cut, killed, or its wait failed)
 *     may hold it back by writer preference: the writer's entry in
 *     "{N}:write_waiters" refuses new readers until the writer runs again
 *     or the entry runs out, DL_RW_WAITER_MS (5000) after its last attempt,
 *     and nothing is published then (src/lock_rw.c; rw_held_back).
 *     Multi-lock: of the whole, as every two sets share a name: the time
 *     every name is free while a live waiter waits, up to the next hold of
 *     any name (multi_worst_stall);
 *   unacknowledged acquires: with wait_replicas, a lock acquire that began
 *     after the replication link was cut or frozen and returned OK before
 *     it worked again (nothing reached the replica: the library must fail
 *     with DLOCK_EREPLICAS or wait);
 *   awaits at count > 0: a latch await that returned DLOCK_OK while fewer
 *     count-downs had begun (plus requests doubled on counters' traffic)
 *     than the round's count, no restart without persistence before it
 *     (never exempt);
 *   latch liveness: once the round's count of count-downs returned OK (or
 *     the parent's zero is done), every live await of that latch returns
 *     within the bound (the same 2000 ms: DL_WAIT_RECHECK_MS, the backstop
 *     re-check of every wait); an await that timed out although the count
 *     was surely 0 before its deadline is one too;
 *   leftovers: at the end, with every client gone, a key without expiry
 *     other than the documented long-lived ones (fence counters
 *     "redisson_lock_token:*", a semaphore's counter).
 */
#include "faultlib.h"

#include "dlock_async.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* the library's named constants the checks derive from (src/lock_plain.c,
 * src/lock_fair.c): not public, mirrored here */
#define DL_PLAIN_RECHECK_MS 2000 /* = DL_WAIT_RECHECK_MS (src/services.h), latches too */
#define DL_BACKOFF_MAX_MS 2000 /* src/pool.c: a node's reconnect backoff after a failure */
#define DL_OUTAGE_PAUSE_MAX_MS 1000 /* src/wait.c: a wait's pause after a failure, at most */
#define DL_RW_WAITER_MS 5000 /* src/lock_rw.c: a waiting writer's entry, unless refreshed */
/* A worker whose client could not be made before the run ended exits 3 (a
 * violation) unless it started less than this before the end: two command
 * timeouts and a restart's worth of reconnecting */
#define LATE_START_MS 3000
#define CMD_TIMEOUT_MS 1000        /* the workers' command timeout */
/* a request or reply dropped (or a reply held back past the command
 * timeout): the command ends by its timeout, a wait then pauses and tries
 * again; a pub/sub message dropped: the waiter wakes at its backstop
 * re-check. The longest a worker hit by one of these may stall, by the
 * library's contract */
#define MSG_STALL_MS (CMD_TIMEOUT_MS + DL_OUTAGE_PAUSE_MAX_MS + DL_PLAIN_RECHECK_MS)

/* ------------------------------------------------------------------------ */
/* the PRNG                                                                 */

static uint64_t sm_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi] */
static int64_t rr(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(sm_next(s) % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------------------------ */
/* the plan                                                                 */

/* K_LATCH is not in the main stream's kind draw (make_plan): a stream of its
 * own picks it, so that the other seeds keep their kinds */
enum { K_PLAIN, K_REENTRANT, K_FAIR, K_RW, K_SEM, K_PERMITS, K_MULTI, K_LATCH, K_N };
static const char *KIND_NAME[K_N] = {"plain", "reentrant", "fair", "rw",
                                     "semaphore", "permits", "multi", "latch"};
enum { T_NONE, T_RDB, T_AOF, T_REDLOCK, T_REPLICA, T_N };
static const char *TOPO_NAME[T_N] = {"redis", "redis-rdb", "redis-aof", "redlock", "replica"};
#define NODES 5
/* F_DROPREQ..F_DELAYREP in the order of the proxy's one-shot kinds
 * (faultlib.h: 0 drop request, 1 drop reply, 2 duplicate request, 3 delay
 * reply) */
enum { F_PAUSE, F_KILL, F_RESTART, F_PSUB, F_CANCEL, F_SAVE, F_SRVPAUSE, F_CUT, F_FREEZE,
       F_DROPREQ, F_DROPREP, F_DUPREQ, F_DELAYREP, F_REPLCUT, F_REPLFREEZE, F_N };
static const char *FAULT_NAME[F_N] = {"pause", "kill", "restart", "psubscribe", "cancel",
                                      "save", "server-pause", "link-cut", "link-freeze",
                                      "drop-request", "drop-reply", "dup-request", "delay-reply",
                                      "repl-cut", "repl-freeze"};
static int msg_fault(int type) { return type >= F_DROPREQ && type <= F_DELAYREP; }

enum { R_DLOCK, R_FOREIGN, R_READER, R_WRITER, R_COUNTER, R_AWAITER };

#define MAX_W 6
#define MAX_IDS 24
#define MAX_F 12
#define NAMES 3

typedef struct wspec {
    int role;
    int64_t lease;     /* 0: the watchdog */
    int64_t work_max;  /* work per section: 5..work_max ms */
    int reenter_pct, extend_pct, try_pct, forever_pct;
    int long_pct; /* watchdog sections that work for about the lease */
    int async;    /* the worker uses the async API (async_eligible) */
} wspec;

typedef struct fault {
    int64_t at, dur;
    int type, target;
    int node; /* a one-shot fault on RedLock: the master whose link it is on */
} fault;

typedef struct plan {
    uint64_t seed;
    int topo, kind, nw, permits, mkind;
    int fence, pass; /* RedLock: a fence server; passwords on the masters */
    int wr;          /* replica: wait_replicas 1 */
    int rounds;      /* latch: 1 to 3 latches "x:0".., one per round */
    int64_t count[NAMES]; /* latch: each round's initial count */
    int64_t run_ms, wd_ms;
    wspec w[MAX_W];
    int nf;
    fault f[MAX_F];
} plan;

static int kind_names(const plan *p) { return p->kind == K_MULTI ? NAMES : 1; }

/* what the async API (dlock_async.h) supports: one Redis (through its
 * proxy), the replica topology without wait_replicas (refused there), not
 * RedLock; every kind but the multi-lock (no async call); not the foreign
 * client */
static int async_eligible(const plan *p, const wspec *w)
{
    if (p->topo == T_REDLOCK || (p->topo == T_REPLICA && p->wr)) return 0;
    return p->kind != K_MULTI && w->role != R_FOREIGN;
}

static void make_plan(uint64_t seed, plan *p)
{
    memset(p, 0, sizeof *p);
    uint64_t s = seed;
    p->seed = seed;
    p->topo = (int)rr(&s, 0, T_REPLICA - 1);
    p->kind = (int)rr(&s, 0, K_MULTI);
    p->fence = (int)rr(&s, 0, 1);
    p->pass = (int)rr(&s, 0, 1);
    if (p->topo == T_REDLOCK) { /* the kinds RedLock has */
        static const int rk[] = {K_PLAIN, K_REENTRANT, K_MULTI};
        p->kind = rk[p->kind % 3];
    }
    p->nw = (int)rr(&s, 3, MAX_W);
    p->permits = p->kind == K_SEM || p->kind == K_PERMITS ? (int)rr(&s, 1, 3) : 1;
    p->mkind = (int)rr(&s, 0, 1); /* multi: plain or reentrant members */
    p->run_ms = rr(&s, 3000, 5000);
    p->wd_ms = rr(&s, 1500, 4000);
    for (int i = 0; i < p->nw; i++) {
        wspec *w = &p->w[i];
        w->role = R_DLOCK;
        if (p->kind == K_PLAIN && i == p->nw - 1 && rr(&s, 0, 1) && p->topo != T_REDLOCK)
            w->role = R_FOREIGN;
        if (p->kind == K_RW) w->role = rr(&s, 0, 1) ? R_READER : R_WRITER;
        /* semaphore permits have no lease */
        w->lease = p->kind == K_SEM || rr(&s, 0, 2) == 0 ? 0 : rr(&s, 600, 4000);
        if (w->role == R_FOREIGN && w->lease == 0) w->lease = 2000;
        w->work_max = rr(&s, 10, 250);
        w->reenter_pct = (int)rr(&s, 0, 50);
        w->extend_pct = (int)rr(&s, 0, 30);
        w->try_pct = (int)rr(&s, 0, 40);
        /* a semaphore whose permits leak (a killed holder), or whose counter
         * a restart lost, never comes back: no forever waits there */
        w->forever_pct = (int)rr(&s, 0, 40);
        if (p->kind == K_SEM || p->kind == K_PERMITS) w->forever_pct = 0;
        w->long_pct = (int)rr(&s, 0, 30);
    }
    /* a primary with a replica: drawn from a stream of its own, so that the
     * other seeds keep their schedules */
    uint64_t s2 = seed ^ 0x5851f42d4c957f2dULL;
    if (rr(&s2, 0, 5) == 0) {
        p->topo = T_REPLICA;
        p->wr = (int)rr(&s2, 0, 1);
        if (p->kind == K_SEM || p->kind == K_PERMITS) p->kind = K_PLAIN;
        for (int i = 0; i < p->nw; i++)
            if (p->w[i].role == R_FOREIGN) p->w[i].role = R_DLOCK;
    }
    p->nf = (int)rr(&s, 1, 5);
    for (int i = 0; i < p->nf; i++) {
        fault *f = &p->f[i];
        int t = (int)rr(&s, 0, 99);
        f->type = t < 28 ? F_PAUSE : t < 44 ? F_KILL : t < 55 ? F_RESTART : t < 63 ? F_PSUB
                : t < 72 ? F_CANCEL : t < 78 ? F_SRVPAUSE : t < 86 ? F_CUT : F_FREEZE;
        if (f->type == F_RESTART && p->topo == T_RDB && i + 1 < MAX_F) {
            /* a snapshot some time before */
            fault *sv = &p->f[i];
            sv->type = F_SAVE;
            sv->at = rr(&s, 100, p->run_ms - 600);
            sv->dur = 0;
            f = &p->f[++i];
            f->type = F_RESTART;
            f->at = sv->at + rr(&s, 50, 1500);
            if (f->at > p->run_ms - 200) f->at = p->run_ms - 200;
            p->nf = i + 1 > p->nf ? i + 1 : p->nf;
            continue;
        }
        f->at = rr(&s, 200, p->run_ms - 200);
        f->target = (int)rr(&s, 0, p->nw - 1);
        f->dur = f->type == F_PAUSE || f->type == F_FREEZE ? rr(&s, 100, 4500)
                 : f->type == F_SRVPAUSE ? rr(&s, 100, 1500) : 0;
    }
    /* single requests or replies dropped, duplicated or delayed by a
     * worker's proxy: in half the seeds, 1 to 3 of them, drawn from a stream
     * of their own (the other faults keep their schedules). RedLock draws
     * its own below */
    uint64_t s3 = seed ^ 0x2545f4914f6cdd1dULL;
    if (p->topo != T_REDLOCK && rr(&s3, 0, 1)) {
        int k = (int)rr(&s3, 1, 3);
        for (int i = 0; i < k && p->nf < MAX_F; i++) {
            fault *f = &p->f[p->nf++];
            f->type = F_DROPREQ + (int)rr(&s3, 0, 3);
            f->at = rr(&s3, 200, p->run_ms - 200);
            f->target = (int)rr(&s3, 0, p->nw - 1);
            f->dur = f->type == F_DELAYREP ? rr(&s3, 300, 2000) : 0;
        }
    }
    /* the replication link between primary and replica (it runs through a
     * proxy of its own then) cut or frozen for 0.3 to 3 s: in two replica
     * seeds in three, 1 or 2 of them, drawn from a stream of their own. The
     * stream's constant is one under which CI's replica seed (6) draws
     * none */
    uint64_t s5 = seed ^ 0x3d9c172411e20b8fULL;
    if (p->topo == T_REPLICA && rr(&s5, 0, 2) > 0) {
        int k = (int)rr(&s5, 1, 2);
        for (int i = 0; i < k && p->nf < MAX_F; i++) {
            fault *f = &p->f[p->nf++];
            f->type = rr(&s5, 0, 1) ? F_REPLFREEZE : F_REPLCUT;
            f->at = rr(&s5, 200, p->run_ms - 200);
            f->dur = rr(&s5, 300, 3000);
        }
    }
    /* one-shot proxy faults on RedLock: in half the RedLock seeds, 1 to 3,
     * each on one worker's link to one master (the workers reach every
     * master through proxies of their own then), drawn from a stream of
     * their own. The stream's constant is one under which none of CI's
     * RedLock seeds draws one */
    uint64_t s6 = seed ^ 0xcdcc69292f45e678ULL;
    if (p->topo == T_REDLOCK && rr(&s6, 0, 1)) {
        int k = (int)rr(&s6, 1, 3);
        for (int i = 0; i < k && p->nf < MAX_F; i++) {
            fault *f = &p->f[p->nf++];
            f->type = F_DROPREQ + (int)rr(&s6, 0, 3);
            f->at = rr(&s6, 200, p->run_ms - 200);
            f->target = (int)rr(&s6, 0, p->nw - 1);
            f->node = (int)rr(&s6, 0, NODES - 1);
            f->dur = f->type == F_DELAYREP ? rr(&s6, 300, 2000) : 0;
        }
    }
    /* the latch: one seed in eight of those that are not RedLock (a latch
     * is one key on one server), drawn from a stream of its own; the
     * workers keep their drawn waits and work times, their roles are drawn
     * here: worker 0 counts down, worker 1 awaits, the others one in three
     * counts down. The run is cut into 1 to 3 rounds, each on a latch of its
     * own ("x:<round>", its count set by the parent before the run).
     * The stream's constant is one under which no seed of CI's batches
     * (tests/faults/CMakeLists.txt) draws a latch */
    uint64_t s4 = seed ^ 0x3fc1ea36f17fd374ULL;
    if (p->topo != T_REDLOCK && rr(&s4, 0, 7) == 0) {
        p->kind = K_LATCH;
        p->permits = 1;
        p->rounds = (int)rr(&s4, 1, NAMES);
        int64_t pct[NAMES];
        for (int r = 0; r < p->rounds; r++) pct[r] = rr(&s4, 40, 100);
        double rate = 0; /* count-downs per ms, without faults */
        for (int i = 0; i < p->nw; i++) {
            wspec *w = &p->w[i];
            w->role = i == 0 ? R_COUNTER : i == 1 ? R_AWAITER
                      : rr(&s4, 0, 2) == 0 ? R_COUNTER : R_AWAITER;
            /* the semaphores drew no forever waits */
            if (!w->forever_pct) w->forever_pct = (int)rr(&s4, 0, 40);
            if (w->role == R_COUNTER) rate += 2.0 / (double)(5 + w->work_max + 4);
        }
        /* each round's count: what the counters count down in 40% to 100%
         * of the round (so awaiters wait for most of it), at least 1 */
        for (int r = 0; r < p->rounds; r++) {
            p->count[r] = (int64_t)((double)p->run_ms / p->rounds * rate * (double)pct[r] / 100);
            if (p->count[r] < 1) p->count[r] = 1;
        }
    }
    /* async workers: in the seeds the async API supports (async_eligible),
     * about half the workers, each drawn from a stream of its own */
    uint64_t s7 = seed ^ 0x7a5e3c1bd2f49e61ULL;
    for (int i = 0; i < p->nw; i++)
        p->w[i].async = async_eligible(p, &p->w[i]) && rr(&s7, 0, 1);
}

/* the seed has async workers */
static int plan_async(const plan *p)
{
    for (int i = 0; i < p->nw; i++)
        if (p->w[i].async) return 1;
    return 0;
}

static void print_plan(const plan *p)
{
    printf("seed %llu: topology %s, kind %s%s, %d workers, run %lld ms, watchdog lease %lld ms",
           (unsigned long long)p->seed, TOPO_NAME[p->topo], KIND_NAME[p->kind],
           p->kind == K_MULTI ? (p->mkind ? " (reentrant)" : " (plain)") : "", p->nw,
           (long long)p->run_ms, (long long)p->wd_ms);
    if (p->kind == K_SEM || p->kind == K_PERMITS) printf(", %d permits", p->permits);
    if (p->topo == T_REDLOCK)
        printf(", %s, %s", p->fence ? "fence server" : "no fence server",
               p->pass ? "passwords" : "no passwords");
    if (p->topo == T_REPLICA) printf(", wait_replicas %d", p->wr);
    if (p->kind == K_LATCH) {
        printf(", %d round%s, count%s", p->rounds, p->rounds > 1 ? "s" : "", p->rounds > 1 ? "s" : "");
        for (int r = 0; r < p->rounds; r++) printf(" %lld", (long long)p->count[r]);
    }
    printf("\n");
    static const char *role[] = {"dlock", "foreign", "reader", "writer", "counter", "awaiter"};
    for (int i = 0; i < p->nw; i++) {
        const wspec *w = &p->w[i];
        if (p->kind == K_LATCH) {
            if (w->role == R_COUNTER)
                printf("  worker %d: %scounter, pause 5..%lld ms\n", i, w->async ? "async " : "",
                       (long long)w->work_max);
            else
                printf("  worker %d: %sawaiter, try %d%%, forever %d%%\n", i,
                       w->async ? "async " : "", w->try_pct, w->forever_pct);
            continue;
        }
        printf("  worker %d: %s%s, lease %s%lld ms, work <= %lld ms, re-entry %d%%, extend %d%%, "
               "try %d%%, forever %d%%\n", i, w->async ? "async " : "", role[w->role],
               w->lease ? "" : "watchdog ",
               (long long)(w->lease ? w->lease : p->wd_ms), (long long)w->work_max,
               w->reenter_pct, w->extend_pct, w->try_pct, w->forever_pct);
    }
    for (int i = 0; i < p->nf; i++) {
        const fault *f = &p->f[i];
        printf("  fault at %lld ms: %s", (long long)f->at, FAULT_NAME[f->type]);
        if (f->type == F_PAUSE || f->type == F_KILL || f->type == F_CANCEL ||
            f->type == F_CUT || f->type == F_FREEZE || msg_fault(f->type))
            printf(" of worker slot %d", f->target);
        if (p->topo == T_REDLOCK && msg_fault(f->type)) printf(" on node %d", f->node);
        if (f->dur) printf(" for %lld ms", (long long)f->dur);
        printf("\n");
    }
}

/* ------------------------------------------------------------------------ */
/* workers                                                                  */

typedef struct wctx {
    const plan *p;
    int slot, id;
    const char *url, *res_sock;
    int port;
    int64_t end; /* no new acquire after this */
    const char *fence_url, *password;
    int wait_replicas;
} wctx;

/* ------------------------------------------------------------------------ */
/* the worker's handles: blocking or async                                  */

/* An async worker (wspec.async) does the same operations through the async
 * API (dlock_async.h), on a bare loop of its own: each operation is started
 * and the loop turned (poll on dlock_async_fds, at most dlock_async_timeout,
 * then dlock_async_process) until its callback ran, so that it looks
 * blocking to the worker's logic below; every wait of the worker (its work,
 * its pauses) turns the loop too, as the async watchdog renews from the
 * loop's timer. A cancel (SIGUSR1) must not call the async API from the
 * handler: the handler writes a byte to a pipe the loop polls (poll returns
 * EINTR or the pipe is readable), and the loop cancels the pending acquire
 * or await. */
static dlock_async_client *g_ac;       /* the async worker's client, else NULL */
static volatile sig_atomic_t g_async;  /* this worker is async */
static int g_cpipe[2] = {-1, -1};      /* the cancel's self-pipe */
static dlock_async_lock *g_apl;        /* the acquire a cancel ends */
static dlock_async_object *g_apo;      /* the object acquire / await a cancel ends */

/* one turn of the bare loop, sleeping at most max_ms */
static void a_turn(int64_t max_ms)
{
    /* one server: 2 sockets; the replica topology's promotion moves the
     * proxies, not the client: still 2 (room for more, and never beyond) */
    enum { ROOM = 8 };
    dlock_async_pollfd f[ROOM];
    struct pollfd pf[ROOM + 1];
    int n = dlock_async_fds(g_ac, f, ROOM);
    if (n > ROOM) n = ROOM;
    for (int i = 0; i < n; i++) {
        pf[i].fd = f[i].fd;
        pf[i].events = (short)(((f[i].events & DLOCK_ASYNC_READ) ? POLLIN : 0) |
                               ((f[i].events & DLOCK_ASYNC_WRITE) ? POLLOUT : 0));
        pf[i].revents = 0;
    }
    pf[n].fd = g_cpipe[0];
    pf[n].events = POLLIN;
    pf[n].revents = 0;
    int64_t t = dlock_async_timeout(g_ac);
    if (t < 0 || t > max_ms) t = max_ms;
    if (t < 0) t = 0;
    int k = poll(pf, (nfds_t)n + 1, (int)t);
    if (k < 0 && errno != EINTR) return;
    char b[16];
    if (read(g_cpipe[0], b, sizeof b) > 0) { /* a cancel came */
        if (g_apl) dlock_async_cancel(g_apl);
        if (g_apo) dlock_async_object_cancel(g_apo);
    }
    for (int i = 0; k > 0 && i < n; i++) {
        if (!pf[i].revents) continue;
        int ev = ((pf[i].revents & (POLLIN | POLLERR | POLLHUP)) ? DLOCK_ASYNC_READ : 0) |
                 ((pf[i].revents & POLLOUT) ? DLOCK_ASYNC_WRITE : 0);
        dlock_async_process(g_ac, pf[i].fd, ev);
    }
    if (dlock_async_timeout(g_ac) == 0) dlock_async_process(g_ac, -1, 0);
}

/* the worker's sleep: an async worker turns its loop meanwhile */
static void w_sleep_ms(int64_t ms)
{
    if (!g_ac) {
        th_sleep_ms(ms);
        return;
    }
    int64_t until = th_now_ms() + ms;
    for (int64_t now = th_now_ms(); now < until; now = th_now_ms()) a_turn(until - now);
}

/* an async operation's outcome, filled by its callback */
typedef struct aop {
    int done, code;
    uint64_t fence;
    int64_t value;
} aop;

static void a_lock_done(dlock_async_lock *l, int code, uint64_t fence, void *ud)
{
    (void)l;
    aop *o = ud;
    o->code = code;
    o->fence = fence;
    o->done = 1;
}

static void a_obj_done(dlock_async_object *ob, int code, int64_t value, void *ud)
{
    (void)ob;
    aop *o = ud;
    o->code = code;
    o->value = value;
    o->done = 1;
}

/* the loop turned until the operation started (started: the start call's
 * code) ended; its code */
static int a_wait(aop *o, int started)
{
    if (started != DLOCK_OK) return started;
    while (!o->done) a_turn(1000);
    return o->code;
}

/* the lost-lease callback logs "L w t" on a resource connection of its own
 * (it runs on the client's watchdog thread; an async worker's on its loop) */
static redisContext *g_cbrc;
static int g_cbid;
static volatile sig_atomic_t g_lost;
static volatile sig_atomic_t g_wd_hold; /* the hold is the watchdog's (not extended) */

static void on_lost(dlock_lock *l, int reason, void *ud)
{
    (void)l;
    (void)ud;
    g_lost = 1;
    if (g_wd_hold) fl_ev(g_cbrc, "L %d %d %lld", g_cbid, reason, (long long)th_now_ms());
}

static void a_on_lost(dlock_async_lock *l, int reason, void *ud)
{
    (void)l;
    (void)ud;
    g_lost = 1;
    if (g_wd_hold) fl_ev(g_cbrc, "L %d %d %lld", g_cbid, reason, (long long)th_now_ms());
}

static dlock_lock *volatile g_cl[NAMES];
static dlock_semaphore *volatile g_cs;
static dlock_permits *volatile g_cp;
static dlock_latch *volatile g_clt;

static void on_usr1(int sig)
{
    (void)sig;
    if (g_async) {
        int e = errno;
        if (write(g_cpipe[1], "c", 1) < 0) { /* full: a cancel is pending already */
        }
        errno = e;
        return;
    }
    for (int i = 0; i < NAMES; i++)
        if (g_cl[i]) dlock_lock_cancel(g_cl[i]);
    if (g_cs) dlock_semaphore_cancel(g_cs);
    if (g_cp) dlock_permits_cancel(g_cp);
    if (g_clt) dlock_latch_cancel(g_clt);
}

/* a lock handle of either API; holds: the async hold count (the async API
 * has no dlock_lock_holding: a failed release leaves it holding, as the
 * blocking handle does) */
typedef struct wlock {
    dlock_lock *b;
    dlock_async_lock *a;
    int holds;
} wlock;

static int wl_new(dlock_client *c, const char *nm, dlock_kind k, wlock *h)
{
    memset(h, 0, sizeof *h);
    if (g_ac) {
        if (dlock_async_lock_new(g_ac, nm, DLOCK_CSTR, k, &h->a) != DLOCK_OK) return 4;
        dlock_async_lock_on_lost(h->a, a_on_lost, NULL);
        return 0;
    }
    if (dlock_lock_new(c, nm, DLOCK_CSTR, k, &h->b) != DLOCK_OK) return 4;
    dlock_lock_on_lost(h->b, on_lost, NULL);
    return 0;
}

static void wl_free(wlock *h)
{
    dlock_lock_free(h->b);
    dlock_async_lock_free(h->a);
    memset(h, 0, sizeof *h);
}

/* an acquire a cancel may end */
static int wl_acquire(wlock *h, int64_t wait, int64_t lease, uint64_t *tok)
{
    if (!h->a) {
        g_cl[0] = h->b;
        int r = dlock_acquire(h->b, wait, lease, tok);
        g_cl[0] = NULL;
        return r;
    }
    aop o = {0};
    char b[16];
    while (read(g_cpipe[0], b, sizeof b) > 0) { /* a cancel before the acquire: none */
    }
    g_apl = h->a;
    int r = a_wait(&o, dlock_async_acquire(h->a, wait, lease, a_lock_done, &o));
    g_apl = NULL;
    if (r == DLOCK_OK) h->holds++;
    if (tok) *tok = r == DLOCK_OK ? o.fence : 0;
    return r;
}

/* a re-entry: no cancel */
static int wl_reenter(wlock *h, int64_t lease, uint64_t *tok)
{
    if (!h->a) return dlock_acquire(h->b, DLOCK_NOWAIT, lease, tok);
    aop o = {0};
    int r = a_wait(&o, dlock_async_acquire(h->a, DLOCK_NOWAIT, lease, a_lock_done, &o));
    if (r == DLOCK_OK) h->holds++;
    *tok = r == DLOCK_OK ? o.fence : 0;
    return r;
}

static int wl_release(wlock *h)
{
    if (!h->a) return dlock_release(h->b);
    aop o = {0};
    int r = a_wait(&o, dlock_async_release(h->a, a_lock_done, &o));
    if (r == DLOCK_OK && h->holds > 0) h->holds--;
    else if (r == DLOCK_ELOST || r == DLOCK_ENOTHELD) h->holds = 0;
    return r;
}

static int wl_extend(wlock *h, int64_t lease)
{
    if (!h->a) return dlock_extend(h->b, lease);
    aop o = {0};
    int r = a_wait(&o, dlock_async_extend(h->a, lease, a_lock_done, &o));
    if (r == DLOCK_ELOST) h->holds = 0;
    return r;
}

static int64_t wl_valid(const wlock *h)
{
    return h->a ? dlock_async_lock_valid_ms(h->a) : dlock_lock_valid_ms(h->b);
}

static int wl_holding(const wlock *h) { return h->a ? h->holds > 0 : dlock_lock_holding(h->b); }

static const char *wl_errmsg(const wlock *h)
{
    return h->a ? dlock_async_lock_errmsg(h->a) : dlock_lock_errmsg(h->b);
}

/* a semaphore, permit semaphore or latch handle of either API */
typedef struct wobj {
    dlock_semaphore *s;
    dlock_permits *p;
    dlock_latch *l;
    dlock_async_object *a;
} wobj;

/* kind: K_SEM, K_PERMITS or K_LATCH */
static int wo_new(dlock_client *c, int kind, const char *nm, wobj *h)
{
    memset(h, 0, sizeof *h);
    int r;
    if (g_ac)
        r = kind == K_SEM       ? dlock_async_semaphore_new(g_ac, nm, DLOCK_CSTR, &h->a)
            : kind == K_PERMITS ? dlock_async_permits_new(g_ac, nm, DLOCK_CSTR, &h->a)
                                : dlock_async_latch_new(g_ac, nm, DLOCK_CSTR, &h->a);
    else
        r = kind == K_SEM       ? dlock_semaphore_new(c, nm, DLOCK_CSTR, &h->s)
            : kind == K_PERMITS ? dlock_permits_new(c, nm, DLOCK_CSTR, &h->p)
                                : dlock_latch_new(c, nm, DLOCK_CSTR, &h->l);
    return r == DLOCK_OK ? 0 : 4;
}

static void wo_free(wobj *h)
{
    dlock_semaphore_free(h->s);
    dlock_permits_free(h->p);
    dlock_latch_free(h->l);
    dlock_async_object_free(h->a);
    memset(h, 0, sizeof *h);
}

static const char *wo_errmsg(const wobj *h)
{
    return h->a ? dlock_async_object_errmsg(h->a)
           : h->s ? dlock_semaphore_errmsg(h->s)
           : h->p ? dlock_permits_errmsg(h->p)
                  : dlock_latch_errmsg(h->l);
}

/* an async object operation a cancel may end (cancel) or not */
static int wo_wait(wobj *h, aop *o, int started, int cancel)
{
    if (cancel) {
        char b[16];
        while (read(g_cpipe[0], b, sizeof b) > 0) {
        }
        g_apo = h->a;
    }
    int r = a_wait(o, started);
    g_apo = NULL;
    return r;
}

/* semaphore: one permit */
static int wo_sem_acquire(wobj *h, int64_t wait)
{
    if (!h->a) {
        g_cs = h->s;
        int r = dlock_semaphore_acquire(h->s, 1, wait);
        g_cs = NULL;
        return r;
    }
    aop o = {0};
    return wo_wait(h, &o, dlock_async_semaphore_acquire(h->a, 1, wait, a_obj_done, &o), 1);
}

static int wo_sem_release(wobj *h)
{
    if (!h->a) return dlock_semaphore_release(h->s, 1);
    aop o = {0};
    return wo_wait(h, &o, dlock_async_semaphore_release(h->a, 1, a_obj_done, &o), 0);
}

/* permit semaphore: id gets the permit's id */
static int wo_permit_acquire(wobj *h, int64_t wait, int64_t lease, char *id)
{
    if (!h->a) {
        g_cp = h->p;
        int r = dlock_permits_acquire(h->p, wait, lease, id);
        g_cp = NULL;
        return r;
    }
    aop o = {0};
    int r = wo_wait(h, &o, dlock_async_permits_acquire(h->a, wait, lease, a_obj_done, &o), 1);
    snprintf(id, DLOCK_PERMIT_ID_LEN + 1, "%s", r == DLOCK_OK ? dlock_async_permits_id(h->a) : "");
    return r;
}

static int wo_permit_release(wobj *h, const char *id)
{
    if (!h->a) return dlock_permits_release(h->p, id);
    aop o = {0};
    return wo_wait(h, &o, dlock_async_permits_release(h->a, id, a_obj_done, &o), 0);
}

static int wo_count_down(wobj *h)
{
    if (!h->a) return dlock_latch_count_down(h->l, 1);
    aop o = {0};
    return wo_wait(h, &o, dlock_async_latch_count_down(h->a, 1, a_obj_done, &o), 0);
}

static int wo_await(wobj *h, int64_t wait)
{
    if (!h->a) {
        g_clt = h->l;
        int r = dlock_latch_await(h->l, wait);
        g_clt = NULL;
        return r;
    }
    aop o = {0};
    return wo_wait(h, &o, dlock_async_latch_await(h->a, wait, a_obj_done, &o), 1);
}

static void name_of(int n, char *buf, size_t len) { snprintf(buf, len, "x:%d", n); }

static int64_t draw_wait(uint64_t *s, const wspec *w)
{
    int64_t k = rr(s, 0, 99);
    if (k < w->try_pct) return DLOCK_NOWAIT;
    if (k < w->try_pct + w->forever_pct) return DLOCK_WAIT_FOREVER;
    return rr(s, 50, 2500);
}

/* the work of a section on name n, then its fenced write. A watchdog
 * section may be long (half to twice the watchdog lease), done in slices
 * by a careful holder: it stops once dlock_lock_valid_ms() is 0 or the lost
 * callback ran, and logs its validity every 250 ms. */
static void work_and_write(redisContext *rc, const wctx *x, uint64_t *s, wlock *l, int n,
                           uint64_t tok, int write, int long_work)
{
    if (long_work && l) {
        int64_t until = th_now_ms() + rr(s, x->p->wd_ms / 2, 2 * x->p->wd_ms), next_v = 0;
        while (th_now_ms() < until && !g_lost) {
            int64_t v = wl_valid(l);
            if (v <= 0) break;
            if (th_now_ms() >= next_v) {
                fl_ev(rc, "V %d %d %lld %lld", x->id, n, (long long)v, (long long)th_now_ms());
                next_v = th_now_ms() + 250;
            }
            w_sleep_ms(20);
        }
    } else {
        w_sleep_ms(rr(s, 5, x->p->w[x->slot].work_max));
    }
    if (!write) return;
    int64_t valid = l ? wl_valid(l) : 1000;
    fl_ev(rc, "V %d %d %lld %lld", x->id, n, (long long)valid, (long long)th_now_ms());
    if (valid < 50) {
        fl_ev(rc, "S %d %d", x->id, n);
        return;
    }
    char key[32], tag[8];
    snprintf(key, sizeof key, "res:max:%d", n);
    snprintf(tag, sizeof tag, "%d", n);
    fl_res_write(rc, key, x->id, tok, 1, tag);
}

/* How much earlier than its logged deadline (the monotonic ms before its SET
 * was sent, plus the lease) the server may end a foreign hold: Redis expires
 * a key on its own wall clock, a millisecond at a time, and the two clocks'
 * ticks need not line up. The overlap check allows it for foreign holds
 * only (dlock's validity keeps a margin of its own). */
#define FOREIGN_SLACK_MS 2

static void foreign_worker(const wctx *x, redisContext *rc, uint64_t *s)
{
    const wspec *w = &x->p->w[x->slot];
    redisContext *fc = NULL;
    static const char *DEL =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
        "return 0";
    while (th_now_ms() < x->end) {
        if (!fc) {
            struct timeval tv = {0, 300000};
            fc = redisConnectWithTimeout("127.0.0.1", x->port, tv);
            if (!fc || fc->err) {
                if (fc) redisFree(fc);
                fc = NULL;
                th_sleep_ms(50);
                continue;
            }
            redisSetTimeout(fc, tv);
        }
        int64_t wait = draw_wait(s, w);
        if (wait < 0) wait = 3000;
        char tok[40];
        snprintf(tok, sizeof tok, "foreign-%d-%llu", x->id, (unsigned long long)sm_next(s));
        int64_t t0 = th_now_ms();
        fl_ev(rc, "A %d 0 %lld %lld", x->id, (long long)wait, (long long)t0);
        int got = 0, dead = 0;
        for (;;) {
            int64_t ts = th_now_ms();
            redisReply *r = redisCommand(fc, "SET x:0 %s NX PX %lld", tok, (long long)w->lease);
            if (!r) {
                dead = 1;
                break;
            }
            got = r->type == REDIS_REPLY_STATUS;
            freeReplyObject(r);
            if (got) {
                fl_ev(rc, "B %d 0 0 %lld %lld", x->id, (long long)(w->lease - (th_now_ms() - ts)),
                      (long long)th_now_ms());
                break;
            }
            if (th_now_ms() - t0 >= wait) break;
            th_sleep_ms(20);
        }
        if (dead) {
            fl_ev(rc, "X %d %d %lld foreign: %s", x->id, DLOCK_EIO, (long long)th_now_ms(),
                  fc->errstr);
            redisFree(fc);
            fc = NULL;
            continue;
        }
        if (!got) {
            fl_ev(rc, "T %d %d %lld", x->id, DLOCK_ETIMEDOUT, (long long)th_now_ms());
            continue;
        }
        th_sleep_ms(rr(s, 5, w->work_max));
        fl_ev(rc, "E %d 0 %lld", x->id, (long long)th_now_ms());
        redisReply *r = redisCommand(fc, "EVAL %s 1 x:0 %s", DEL, tok);
        if (!r) {
            fl_ev(rc, "R %d 0 %d", x->id, DLOCK_EIO);
            redisFree(fc);
            fc = NULL;
        } else {
            fl_ev(rc, "O %d 0 %lld", x->id, (long long)th_now_ms());
            freeReplyObject(r);
        }
        th_sleep_ms(rr(s, 0, 30));
    }
    if (fc) redisFree(fc);
}

/* The latch workload. The run is cut into p->rounds equal rounds, round r
 * on latch "x:<r>" (its count set by the parent before the run, and set to
 * 0 by the parent after it, so that forever waits end). A counter counts
 * the current round's latch down by 1 after a pause of 5..work_max ms, and
 * goes on past zero (a count-down at zero changes nothing). An awaiter
 * awaits the current round's latch with a drawn wait (try, timed, forever),
 * cancels included.
 * How the count is observed: not read from the server (a read races with
 * the count-downs). Each count-down logs "d w r t" before it is sent and
 * "e w r code t" when it returned, so the checker knows, at each position of
 * the history, an upper bound of the count-downs the server may have applied
 * (those begun, plus one per doubled request on a counter's traffic) and a
 * lower bound (those that returned DLOCK_OK): the count is surely above 0
 * while the upper bound is below the round's count, and surely 0 once the
 * lower bound reaches it. An await logs "A w r wait t", then "k w r t"
 * (DLOCK_OK), "T w code t" (timed out, cancelled) or "X w code t msg". */
static int latch_worker(const wctx *x, redisContext *rc, uint64_t *s, dlock_client *c)
{
    const plan *p = x->p;
    const wspec *w = &p->w[x->slot];
    wobj lt[NAMES];
    memset(lt, 0, sizeof lt);
    char nm[16];
    for (int r = 0; r < p->rounds; r++) {
        name_of(r, nm, sizeof nm);
        if (wo_new(c, K_LATCH, nm, &lt[r])) return 4;
    }
    int64_t start = x->end - p->run_ms;
    while (th_now_ms() < x->end) {
        if (w->role == R_COUNTER) w_sleep_ms(rr(s, 5, w->work_max));
        int64_t now = th_now_ms();
        if (now >= x->end) break;
        int r = (int)((now - start) * p->rounds / p->run_ms);
        if (r < 0) r = 0;
        if (r >= p->rounds) r = p->rounds - 1;
        if (w->role == R_COUNTER) {
            fl_ev(rc, "d %d %d %lld", x->id, r, (long long)now);
            int rc2 = wo_count_down(&lt[r]);
            fl_ev(rc, "e %d %d %d %lld %s", x->id, r, rc2, (long long)th_now_ms(),
                  rc2 ? wo_errmsg(&lt[r]) : "");
            if (rc2) w_sleep_ms(30);
            continue;
        }
        int64_t wait = draw_wait(s, w);
        fl_ev(rc, "A %d %d %lld %lld", x->id, r, (long long)wait, (long long)now);
        int rc2 = wo_await(&lt[r], wait);
        now = th_now_ms();
        if (rc2 == DLOCK_OK) {
            fl_ev(rc, "k %d %d %lld", x->id, r, (long long)now);
        } else if (rc2 == DLOCK_ETIMEDOUT || rc2 == DLOCK_ECANCELED) {
            fl_ev(rc, "T %d %d %lld", x->id, rc2, (long long)now);
        } else {
            fl_ev(rc, "X %d %d %lld %s", x->id, rc2, (long long)now, wo_errmsg(&lt[r]));
            w_sleep_ms(30);
        }
        w_sleep_ms(rr(s, 0, 30));
    }
    for (int r = 0; r < p->rounds; r++) wo_free(&lt[r]);
    return 0;
}

static int run_worker(const wctx *x)
{
    const plan *p = x->p;
    const wspec *w = &p->w[x->slot];
    uint64_t s = p->seed * 1000003ULL + (uint64_t)x->id * 0x632be59bd9b4e019ULL + 1;
    redisContext *rc = fl_res_connect(x->res_sock);
    if (w->role == R_FOREIGN) {
        foreign_worker(x, rc, &s);
        redisFree(rc);
        return 0;
    }
    g_cbrc = fl_res_connect(x->res_sock);
    g_cbid = x->id;
    if (w->async) {
        if (pipe(g_cpipe) != 0) return 4;
        for (int i = 0; i < 2; i++) fcntl(g_cpipe[i], F_SETFL, fcntl(g_cpipe[i], F_GETFL) | O_NONBLOCK);
        g_async = 1;
    }
    /* the cancel handler runs on this thread only: the client's threads
     * start with SIGUSR1 blocked */
    sigset_t us, old;
    sigemptyset(&us);
    sigaddset(&us, SIGUSR1);
    sigprocmask(SIG_BLOCK, &us, &old);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);

    dlock_options o;
    dlock_options_init(&o);
    o.url = x->url;
    o.command_timeout_ms = CMD_TIMEOUT_MS;
    o.connect_timeout_ms = 500;
    o.watchdog_lease_ms = p->wd_ms;
    o.fence_url = x->fence_url;
    o.password = x->password;
    o.wait_replicas = x->wait_replicas;
    /* a node's answer under a loaded machine: more than the 50 ms default */
    o.node_timeout_ms = 250;
    dlock_client *c = NULL;
    int64_t started = th_now_ms();
    /* the async client connects at its first operation: made at once (it
     * takes no node_timeout_ms; fence_url, password and wait_replicas are
     * only set where workers are not async) */
    if (w->async && dlock_async_client_new(&o, NULL, &g_ac) != DLOCK_OK) {
        fl_ev(rc, "X %d %d %lld async client_new: %s", x->id, DLOCK_EINVAL, (long long)th_now_ms(),
              dlock_async_errmsg(g_ac));
        return 4;
    }
    while (!g_ac) {
        int r = dlock_client_new(&o, &c);
        if (r == DLOCK_OK) break;
        fl_ev(rc, "X %d %d %lld client_new: %s", x->id, r, (long long)th_now_ms(),
              c ? dlock_errmsg(c) : "");
        dlock_client_free(c);
        c = NULL;
        if (th_now_ms() > x->end) {
            redisFree(rc);
            /* a worker started (in place of a killed one) too near the end
             * to outlast one server outage did nothing: not a failure */
            return x->end - started > LATE_START_MS ? 3 : 0;
        }
        th_sleep_ms(50);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (p->kind == K_LATCH) {
        int lr = latch_worker(x, rc, &s, c);
        dlock_client_free(c);
        dlock_async_client_free(g_ac);
        redisFree(rc);
        redisFree(g_cbrc);
        return lr;
    }

    int nn = kind_names(p);
    wlock l[NAMES];
    memset(l, 0, sizeof l);
    wobj ob;
    memset(&ob, 0, sizeof ob);
    int sem = p->kind == K_SEM;
    char nm[16];
    dlock_kind k = p->kind == K_REENTRANT ? DLOCK_KIND_REENTRANT
                   : p->kind == K_FAIR    ? DLOCK_KIND_FAIR
                   : p->kind == K_RW      ? (w->role == R_READER ? DLOCK_KIND_READ : DLOCK_KIND_WRITE)
                   : p->kind == K_MULTI   ? (p->mkind ? DLOCK_KIND_REENTRANT : DLOCK_KIND_PLAIN)
                                          : DLOCK_KIND_PLAIN;
    if (p->kind == K_SEM || p->kind == K_PERMITS) {
        if (wo_new(c, p->kind, "x:0", &ob)) return 4;
    } else {
        for (int i = 0; i < nn; i++) {
            name_of(i, nm, sizeof nm);
            if (wl_new(c, nm, k, &l[i])) return 4;
        }
    }
    int reentrant = k == DLOCK_KIND_REENTRANT || k == DLOCK_KIND_FAIR || k == DLOCK_KIND_READ ||
                    k == DLOCK_KIND_WRITE;
    int fenced = p->kind != K_SEM && p->kind != K_PERMITS && w->role != R_READER;
    while (th_now_ms() < x->end) {
        int64_t wait = draw_wait(&s, w);
        int64_t lease = w->lease;
        int64_t t0_us = th_now_us(), t0 = t0_us / 1000;
        if (p->kind == K_SEM || p->kind == K_PERMITS) {
            fl_ev(rc, "A %d 0 %lld %lld", x->id, (long long)wait, (long long)t0);
            char id[DLOCK_PERMIT_ID_LEN + 1];
            int r;
            if (sem)
                r = wo_sem_acquire(&ob, wait);
            else
                r = wo_permit_acquire(&ob, wait, lease, id);
            int64_t now_us = th_now_us(), now = now_us / 1000;
            if (r != DLOCK_OK) {
                if (r == DLOCK_EBUSY || r == DLOCK_ETIMEDOUT || r == DLOCK_ECANCELED)
                    fl_ev(rc, "T %d %d %lld", x->id, r, (long long)now);
                else
                    fl_ev(rc, "X %d %d %lld %s", x->id, r, (long long)now,
                          wo_errmsg(&ob));
                if (r != DLOCK_EBUSY && r != DLOCK_ETIMEDOUT && r != DLOCK_ECANCELED)
                    w_sleep_ms(30);
                continue;
            }
            /* a permit's validity: its lease from just before the request;
             * in microseconds too, for the overlap check (the ms times,
             * rounded down, leave a millisecond in which it cannot tell) */
            int64_t pl = lease ? lease : p->wd_ms;
            if (sem)
                fl_ev(rc, "B %d 0 0 -1 %lld", x->id, (long long)now);
            else
                fl_ev(rc, "B %d 0 0 %lld %lld %lld %lld", x->id, (long long)(pl - (now - t0)),
                      (long long)now, (long long)(t0_us + pl * 1000), (long long)now_us);
            w_sleep_ms(rr(&s, 5, w->work_max));
            fl_ev(rc, "E %d 0 %lld", x->id, (long long)th_now_ms());
            r = sem ? wo_sem_release(&ob) : wo_permit_release(&ob, id);
            if (r != DLOCK_OK) fl_ev(rc, "R %d 0 %d", x->id, r);
            else fl_ev(rc, "O %d 0 %lld", x->id, (long long)th_now_ms());
            w_sleep_ms(rr(&s, 0, 30));
            continue;
        }
        /* locks: one name, or a set of 2-3 of the three */
        wlock *set[NAMES];
        int idx[NAMES], ns = 0;
        if (p->kind == K_MULTI) {
            int want = (int)rr(&s, 2, 3);
            int skip = want == 3 ? -1 : (int)rr(&s, 0, 2);
            for (int i = 0; i < NAMES; i++)
                if (i != skip) idx[ns++] = i;
            if (rr(&s, 0, 1)) { /* the caller's order does not matter */
                int t = idx[0];
                idx[0] = idx[ns - 1];
                idx[ns - 1] = t;
            }
        } else {
            idx[ns++] = 0;
        }
        for (int i = 0; i < ns; i++) set[i] = &l[idx[i]];
        fl_ev(rc, "A %d %d %lld %lld", x->id, p->kind == K_MULTI ? -1 : 0, (long long)wait,
              (long long)t0);
        uint64_t toks[NAMES] = {0};
        int r;
        if (p->kind == K_MULTI) { /* blocking only: no async multi-lock */
            dlock_lock *bs[NAMES];
            for (int i = 0; i < ns; i++) g_cl[i] = bs[i] = set[i]->b;
            r = dlock_multi_acquire(bs, (size_t)ns, wait, lease, toks);
            for (int i = 0; i < ns; i++) g_cl[i] = NULL;
        } else {
            r = wl_acquire(set[0], wait, lease, &toks[0]);
        }
        int64_t now = th_now_ms();
        if (r != DLOCK_OK) {
            if (r == DLOCK_EBUSY || r == DLOCK_ETIMEDOUT || r == DLOCK_ECANCELED)
                fl_ev(rc, "T %d %d %lld", x->id, r, (long long)now);
            else
                fl_ev(rc, "X %d %d %lld %s", x->id, r, (long long)now, wl_errmsg(set[0]));
            if (r != DLOCK_EBUSY && r != DLOCK_ETIMEDOUT && r != DLOCK_ECANCELED) w_sleep_ms(30);
            continue;
        }
        g_wd_hold = lease == 0;
        for (int i = 0; i < ns; i++)
            fl_ev(rc, "B %d %d %llu %lld %lld", x->id, idx[i], (unsigned long long)toks[i],
                  (long long)wl_valid(set[i]), (long long)now);
        /* a re-entry */
        int reentered = 0;
        if (reentrant && ns == 1 && rr(&s, 0, 99) < w->reenter_pct) {
            uint64_t t2 = 0;
            int r2 = wl_reenter(set[0], lease, &t2);
            if (r2 == DLOCK_OK) {
                reentered = 1;
                fl_ev(rc, "N %d 0 %llu %lld", x->id, (unsigned long long)t2,
                      (long long)th_now_ms());
            } else {
                fl_ev(rc, "X %d %d %lld re-entry: %s", x->id, r2, (long long)th_now_ms(),
                      wl_errmsg(set[0]));
            }
        }
        /* an extend */
        if (ns == 1 && rr(&s, 0, 99) < w->extend_pct) {
            int64_t nl = lease ? lease : p->wd_ms;
            int r2 = wl_extend(set[0], nl);
            if (r2 == DLOCK_OK)
                fl_ev(rc, "V %d 0 %lld %lld", x->id, (long long)wl_valid(set[0]),
                      (long long)th_now_ms());
            else
                fl_ev(rc, "R %d 0 %d extend", x->id, r2);
            if (r2 == DLOCK_OK && !lease) {
                lease = nl; /* no longer a watchdog lock */
                g_wd_hold = 0;
            }
        }
        g_lost = 0;
        int long_work = lease == 0 && ns == 1 && rr(&s, 0, 99) < w->long_pct;
        work_and_write(rc, x, &s, set[0], idx[0], toks[0], fenced, long_work);
        for (int i = 1; i < ns; i++) {
            int64_t v = wl_valid(set[i]);
            fl_ev(rc, "V %d %d %lld %lld", x->id, idx[i], (long long)v, (long long)th_now_ms());
            if (v >= 50) {
                char key[32], tag[8];
                snprintf(key, sizeof key, "res:max:%d", idx[i]);
                snprintf(tag, sizeof tag, "%d", idx[i]);
                fl_res_write(rc, key, x->id, toks[i], 1, tag);
            } else {
                fl_ev(rc, "S %d %d", x->id, idx[i]);
            }
        }
        if (reentered) {
            int r2 = wl_release(set[0]);
            if (r2 != DLOCK_OK) fl_ev(rc, "R %d 0 %d inner", x->id, r2);
        }
        for (int i = 0; i < ns; i++)
            fl_ev(rc, "E %d %d %lld", x->id, idx[i], (long long)th_now_ms());
        if (p->kind == K_MULTI) {
            dlock_lock *bs[NAMES];
            for (int i = 0; i < ns; i++) bs[i] = set[i]->b;
            r = dlock_multi_release(bs, (size_t)ns);
        } else {
            r = wl_release(set[0]);
        }
        if (r != DLOCK_OK) fl_ev(rc, "R %d %d %d %s", x->id, idx[0], r, wl_errmsg(set[0]));
        else
            for (int i = 0; i < ns; i++)
                fl_ev(rc, "O %d %d %lld", x->id, idx[i], (long long)th_now_ms());
        /* a handle left holding (DLOCK_EIO): give it up, its lease runs out */
        for (int i = 0; i < ns; i++) {
            while (wl_holding(set[i])) {
                if (wl_release(set[i]) == DLOCK_OK) continue;
                wl_free(set[i]);
                name_of(idx[i], nm, sizeof nm);
                if (wl_new(c, nm, k, &l[idx[i]])) return 4;
                break;
            }
        }
        w_sleep_ms(rr(&s, 0, 30));
    }
    for (int i = 0; i < nn; i++) wl_free(&l[i]);
    wo_free(&ob);
    dlock_client_free(c);
    dlock_async_client_free(g_ac);
    redisFree(rc);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* the checker                                                              */

#define MAX_SEC 8192
#define MAX_ATT 16384

typedef struct sec {
    int w, n, role;
    uint64_t tok;
    long b, e;                 /* list positions */
    int64_t bt, et, deadline;  /* mono ms; deadline -1: no lease */
    int64_t end_us, bt_us;     /* a permit: its lease's end and bt in µs; -1: not logged */
    int64_t valid0;
    int killed, relfail, has_lease;
    int64_t rel_t;  /* the release returned OK; 0 if it did not */
    int64_t lost_t; /* the lost callback ran; 0 if it did not */
} sec;

typedef struct att {
    int w, n;
    int64_t wait, at, et;
    long a, e;
    int result; /* 'B' (latch: returned DLOCK_OK), 'T', 'X', 'K', 0 open */
    int code;
    int cd; /* latch: a count-down (else an await) */
} att;

typedef struct evt {
    char c;
    long pos;
    int w, mode;
    int64_t t;
    int64_t dur; /* m: the delay of a reply held back */
    int node;    /* m on RedLock: the master */
} evt;

typedef struct stats {
    long seeds, ops, faults, effective, overlaps, exempt, stale, tokens, shortv, live,
        slow, leftover, stuck, errors, lostlate, tokens_exempt, noquorum, proto, early, unacked,
        async_seeds, async_fail; /* seeds with async workers, those of them that failed */
    int64_t worst_stall;
    long by_fault[F_N], by_fault_eff[F_N];
} stats;

static sec g_s[MAX_SEC];
static att g_a[MAX_ATT];
static evt g_f[256];
static char g_fdesc[256][52]; /* a fired one-shot fault's chunk (M) */
static int64_t g_stall_bound = DL_PLAIN_RECHECK_MS;

typedef struct wrole {
    int role;
    int64_t lease; /* 0 watchdog */
    int async;     /* the worker uses the async API */
} wrole;

static void stat_add(stats *a, const stats *b)
{
    a->seeds += b->seeds;
    a->ops += b->ops;
    a->faults += b->faults;
    a->effective += b->effective;
    a->overlaps += b->overlaps;
    a->exempt += b->exempt;
    a->stale += b->stale;
    a->tokens += b->tokens;
    a->shortv += b->shortv;
    a->live += b->live;
    a->slow += b->slow;
    a->leftover += b->leftover;
    a->stuck += b->stuck;
    a->errors += b->errors;
    a->lostlate += b->lostlate;
    a->noquorum += b->noquorum;
    a->proto += b->proto;
    a->early += b->early;
    a->unacked += b->unacked;
    a->tokens_exempt += b->tokens_exempt;
    a->async_seeds += b->async_seeds;
    a->async_fail += b->async_fail;
    if (b->worst_stall > a->worst_stall) a->worst_stall = b->worst_stall;
    for (int i = 0; i < F_N; i++) {
        a->by_fault[i] += b->by_fault[i];
        a->by_fault_eff[i] += b->by_fault_eff[i];
    }
}

/* w stopped (SIGSTOP), its link frozen, or its link cut (for a command
 * timeout) during [from, to]? */
static int paused_in(int nf, int w, int64_t from, int64_t to, long *pos_from)
{
    (void)pos_from;
    for (int i = 0; i < nf; i++) {
        char c = g_f[i].c;
        if ((c != 'P' && c != 'G' && c != 'D') || g_f[i].w != w) continue;
        int64_t p0 = g_f[i].t, p1 = INT64_MAX;
        if (c == 'D') {
            p1 = p0;
        } else {
            for (int j = i + 1; j < nf; j++)
                if ((g_f[j].c == (c == 'P' ? 'C' : 'I') || g_f[j].c == 'K') && g_f[j].w == w) {
                    p1 = g_f[j].t;
                    break;
                }
        }
        /* a link cut or frozen: then the client's reconnect backoff */
        if (c != 'P' && p1 != INT64_MAX) p1 += DL_BACKOFF_MAX_MS;
        if (p0 <= to && p1 >= from) return 1;
    }
    return 0;
}

static int g_wr; /* the seed's wait_replicas */

/* a server stopped, restarting or saving, or (with wait_replicas, whose
 * acquires fail then) the replication link cut or frozen, during [from,
 * to] */
static int server_fault_in(int nf, int64_t from, int64_t to)
{
    for (int i = 0; i < nf; i++) {
        char c = g_f[i].c;
        if (c == 'c' && g_wr) {
            int64_t p1 = INT64_MAX;
            for (int j = i + 1; j < nf; j++)
                if (g_f[j].c == 'h') {
                    p1 = g_f[j].t + DL_BACKOFF_MAX_MS;
                    break;
                }
            if (g_f[i].t <= to && p1 >= from) return 1;
            continue;
        }
        if (c != 'Z' && c != 'H' && c != 'F') continue;
        int64_t p1 = g_f[i].t + 200; /* a SAVE: a short stop */
        if (c != 'F') {
            p1 = INT64_MAX;
            for (int j = i + 1; j < nf; j++)
                if (g_f[j].c == (c == 'Z' ? 'Y' : 'J')) {
                    p1 = g_f[j].t;
                    break;
                }
        }
        /* a restart or a stop: then the clients' reconnect backoff */
        if (c != 'F' && p1 != INT64_MAX) p1 += DL_BACKOFF_MAX_MS;
        if (g_f[i].t <= to && p1 >= from - 200) return 1;
    }
    return 0;
}

/* a one-shot proxy fault fired (M) on w's traffic (w < 0: anyone's), at a
 * time t with t <= to and t + slack >= from */
static int msg_fired_in(int nf, int w, int64_t from, int64_t to, int64_t slack)
{
    for (int i = 0; i < nf; i++)
        if (g_f[i].c == 'M' && (w < 0 || g_f[i].w == w) && g_f[i].t <= to &&
            g_f[i].t + slack >= from)
            return 1;
    return 0;
}

/* the server forgot a hold taken at position a before position b: a
 * restart (from its kill Z to its answering again Y) after a and before b,
 * without persistence, or from a snapshot taken before a */

static int forgot_between(int nf, int topo, long a, long b)
{
    for (int i = 0; i < nf; i++) {
        if (g_f[i].c != 'Z' || g_f[i].pos > b) continue;
        long up = LONG_MAX;
        for (int j = i + 1; j < nf; j++)
            if (g_f[j].c == 'Y') {
                up = g_f[j].pos;
                break;
            }
        if (up < a) continue;
        if (topo == T_NONE || topo == T_REDLOCK) return 1;
        if (topo == T_REPLICA && !g_wr) return 1; /* a promotion, not waited for */
        if (topo == T_RDB) {
            long save = -1;
            for (int j = 0; j < i; j++)
                if (g_f[j].c == 'F') save = g_f[j].pos;
            if (save < a) return 1;
        }
    }
    return 0;
}

/* a one-shot proxy fault fired on a worker's traffic while it acquired or
 * held, within that worker's lease plus MSG_STALL_MS before to, and not
 * after to; not a pub/sub message (it carries no hold), nor a reply held
 * back for less than the command timeout (it arrives, in step) */
static int ghost_in(int nf, int na, int ns, const wrole *roles, const plan *p, int64_t from,
                    int64_t to)
{
    for (int i = 0; i < nf; i++) {
        if (g_f[i].c != 'M') continue;
        if (strstr(g_fdesc[i], "message||")) continue;
        if (g_f[i].mode == F_DELAYREP - F_DROPREQ) {
            int64_t dur = 0;
            for (int j = i - 1; j >= 0; j--)
                if (g_f[j].c == 'm' && g_f[j].w == g_f[i].w && g_f[j].mode == g_f[i].mode) {
                    dur = g_f[j].dur;
                    break;
                }
            if (dur < CMD_TIMEOUT_MS) continue;
        }
        int w = g_f[i].w;
        int64_t tm = g_f[i].t;
        int64_t lease = roles[w].lease ? roles[w].lease : p->wd_ms;
        if (tm > to || tm + lease + MSG_STALL_MS < from) continue;
        for (int k = 0; k < na; k++)
            if (g_a[k].w == w && g_a[k].at <= tm && g_a[k].et >= tm) return 1;
        for (int k = 0; k < ns; k++)
            if (g_s[k].w == w && g_s[k].bt <= tm && g_s[k].et + 50 >= tm) return 1;
    }
    return 0;
}

/* read/write: the times new readers of name n may be refused, by writer
 * preference (src/lock_rw.c), for a writer that can neither take the lock
 * nor give up. A waiting writer's entry in "{N}:write_waiters" lasts
 * DL_RW_WAITER_MS from its latest attempt; readers that find it are told to
 * come back when it runs out (DL_WAIT_RECHECK_MS at most), and nothing is
 * published when it does. A writer that waits live takes the lock (and its
 * release publishes) or gives up (its abandon publishes); one stopped, cut
 * off, frozen or killed in its wait, or whose wait failed (its abandon
 * skipped on a broken connection), does neither: its entry holds readers
 * back until it resumes or the entry runs out, at most DL_RW_WAITER_MS
 * after its last attempt, itself before the fault. Into bw (at most max
 * windows [from, to]); returns how many. */
static int rw_held_back(int nf, int na, const wrole *roles, int n, int64_t (*bw)[2], int max)
{
    int nb = 0;
    for (int k = 0; k < na && nb < max; k++) {
        const att *a = &g_a[k];
        if (a->n != n || a->wait == 0 || a->cd || roles[a->w].role != R_WRITER) continue;
        if (a->result == 'X') {
            bw[nb][0] = a->et;
            bw[nb][1] = a->et + DL_RW_WAITER_MS;
            nb++;
        }
        for (int i = 0; i < nf && nb < max; i++) {
            char c = g_f[i].c;
            if ((c != 'P' && c != 'G' && c != 'D' && c != 'K') || g_f[i].w != a->w) continue;
            int64_t t0 = g_f[i].t, t1 = t0 + DL_RW_WAITER_MS;
            if (t0 < a->at || t0 > a->et) continue;
            if (c != 'K') {
                /* until it runs again: stopped (SIGCONT), frozen (unfrozen)
                 * or cut off, then its reconnect backoff */
                int64_t up = c == 'D' ? t0 : INT64_MAX;
                for (int j = i + 1; j < nf && up == INT64_MAX; j++)
                    if (g_f[j].w == a->w && (g_f[j].c == (c == 'P' ? 'C' : 'I') ||
                                              g_f[j].c == 'K')) {
                        if (g_f[j].c != 'K') up = g_f[j].t;
                        else break; /* killed: the entry stays until it runs out */
                    }
                if (c != 'P' && up != INT64_MAX) up += DL_BACKOFF_MAX_MS;
                if (up < t1) t1 = up;
            }
            bw[nb][0] = t0;
            bw[nb][1] = t1;
            nb++;
        }
    }
    return nb;
}

/* multi-lock liveness. Sets of 2 or 3 of the three names always share a
 * name, so every hold keeps every other set out, and the check is of the
 * whole: a stall is a time during which some live waiter waits (its whole
 * attempt neither stopped, cut off, frozen nor hit by a one-shot fault of
 * its own), no section is open on any name, and no worker that may hold
 * part of a set unseen is stopped, killed, cut off or frozen in its
 * attempt (its partial holds keep the others out until they run out: at
 * most the longest lease after the fault, plus the reconnect backoff). A
 * stall ends at the next hold of any name. Because sets are taken in one
 * canonical order, the partial holder furthest along waits for a lock
 * nobody holds, so a stall lasts only as long as a lost wake-up would (the
 * backstop re-check). Not measured across a server fault or a proxy fault
 * that may have left a hold (ghost_in), nor within the longest lease after
 * a restart from a snapshot. Returns the worst stall; *seg_at is where
 * the worst began. */
static int64_t multi_worst_stall(int nf, int na, int ns, const wrole *roles, const plan *p,
                                 int64_t max_lease, int64_t *seg_at)
{
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int k = 0; k < na; k++) {
        if (g_a[k].at < lo) lo = g_a[k].at;
        if (g_a[k].at > hi) hi = g_a[k].at;
        if (g_a[k].et > hi) hi = g_a[k].et;
    }
    for (int k = 0; k < ns; k++) {
        if (g_s[k].bt < lo) lo = g_s[k].bt;
        if (g_s[k].et > hi) hi = g_s[k].et;
        if (g_s[k].rel_t > hi) hi = g_s[k].rel_t;
    }
    *seg_at = 0;
    if (lo == INT64_MAX || hi <= lo) return 0;
    size_t len = (size_t)(hi - lo) + 2;
    int *busy = calloc(len, sizeof *busy), *live = calloc(len, sizeof *live);
    char *excl = calloc(len, 1), *prog = calloc(len, 1);
    ASSERT(busy && live && excl && prog);
#define IX(t) ((size_t)((t) < lo ? 0 : (t) > hi ? hi - lo + 1 : (t) - lo))
    for (int k = 0; k < ns; k++) {
        const sec *x = &g_s[k];
        int64_t lease = roles[x->w].lease ? roles[x->w].lease : p->wd_ms, end;
        if (x->killed) {
            end = roles[x->w].lease && x->deadline >= 0 ? x->deadline : x->et + lease;
            if (end < x->et) end = x->et;
        } else if (x->relfail || (x->e >= 0 && !x->rel_t && x->et > 0)) {
            end = x->et + lease; /* given up with its hold: it runs out */
        } else if (x->rel_t) {
            end = x->deadline >= 0 && x->deadline < x->rel_t ? x->deadline : x->rel_t;
        } else {
            end = hi + 1; /* open at the end */
        }
        busy[IX(x->bt)]++;
        busy[IX(end)]--;
        prog[IX(x->bt)] = 1;
    }
    for (int k = 0; k < na; k++) {
        const att *a = &g_a[k];
        if (a->wait == 0 || roles[a->w].role == R_FOREIGN) continue;
        int64_t to = a->et >= 0 ? a->et : hi + 1;
        if (to <= a->at) continue;
        if (paused_in(nf, a->w, a->at, to, NULL)) continue;
        if (msg_fired_in(nf, a->w, a->at, to, MSG_STALL_MS)) continue;
        live[IX(a->at)]++;
        live[IX(to)]--;
    }
    for (int i = 0; i < nf; i++) {
        char c = g_f[i].c;
        if (c != 'P' && c != 'G' && c != 'D' && c != 'K') continue;
        int w = g_f[i].w;
        int64_t t0 = g_f[i].t, t1 = t0 + max_lease + DL_BACKOFF_MAX_MS;
        int in_attempt = 0;
        for (int k = 0; k < na && !in_attempt; k++)
            if (g_a[k].w == w && g_a[k].at <= t0 && (g_a[k].et < 0 || g_a[k].et >= t0))
                in_attempt = 1;
        if (!in_attempt) continue;
        if (c == 'P' || c == 'G')
            for (int j = i + 1; j < nf; j++)
                if ((g_f[j].c == (c == 'P' ? 'C' : 'I') || g_f[j].c == 'K') && g_f[j].w == w) {
                    if (g_f[j].t + DL_BACKOFF_MAX_MS < t1) t1 = g_f[j].t + DL_BACKOFF_MAX_MS;
                    break;
                }
        for (size_t t = IX(t0); t <= IX(t1) && t < len; t++) excl[t] = 1;
    }
    int64_t worst = 0;
    int nbusy = 0, nlive = 0;
    int64_t start = -1;
    for (size_t t = 0; t < len; t++) {
        nbusy += busy[t];
        nlive += live[t];
        int cond = nlive > 0 && nbusy <= 0 && !excl[t] && !prog[t];
        if (cond && start < 0) start = (int64_t)t;
        if ((!cond || t + 1 == len) && start >= 0) {
            int64_t from = lo + start, to = lo + (int64_t)t;
            int64_t stall = to - from;
            int exempt = server_fault_in(nf, from, to) || ghost_in(nf, na, ns, roles, p, from, to);
            for (int k = 0; k < nf && p->topo == T_RDB && !exempt; k++)
                if (g_f[k].c == 'Y' && to >= g_f[k].t && from <= g_f[k].t + max_lease) exempt = 1;
            if (!exempt && stall > worst) {
                worst = stall;
                *seg_at = from;
            }
            start = -1;
        }
    }
#undef IX
    free(busy);
    free(live);
    free(excl);
    free(prog);
    return worst;
}

static int cmp_iv(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static int conflict(const plan *p, const sec *x, const sec *y)
{
    if (p->kind == K_RW) return x->role == R_WRITER || y->role == R_WRITER;
    return 1;
}

/* checks the history; fills st; returns 1 if the seed failed */
static int check(redisContext *rrc, const plan *p, const wrole *roles, int nids, stats *st,
                 int verbose)
{
    redisReply *r = th_cmd(rrc, "LRANGE hist 0 -1");
    ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
    int ns = 0, na = 0, nf = 0;
    int open_s[MAX_IDS][NAMES], open_a[MAX_IDS];
    for (int i = 0; i < MAX_IDS; i++) {
        open_a[i] = -1;
        for (int j = 0; j < NAMES; j++) open_s[i][j] = -1;
    }
    uint64_t last_tok[NAMES] = {0}, max_acc[NAMES] = {0};
    long last_tok_pos[NAMES] = {0}; /* where last_tok was logged */
    int have_acc[NAMES] = {0};
    /* the latch (latch_worker): per round, count-downs begun and returned
     * OK so far, the parent's final zero begun; requests doubled on a
     * counter's traffic so far; where the count surely reached 0 */
    long cd_begun[NAMES] = {0}, cd_ok[NAMES] = {0}, cd_dup = 0;
    int zero_begun[NAMES] = {0}, lost_key = 0;
    long zero_pos[NAMES];
    int64_t zero_t[NAMES];
    for (int k = 0; k < NAMES; k++) {
        zero_pos[k] = -1;
        zero_t[k] = 0;
    }
    int fail = 0;
    char first_err[200] = "";
    if (verbose && getenv("EXPLORE_DUMP"))
        for (size_t i = 0; i < r->elements; i++) printf("  #%zu %s\n", i, r->element[i]->str);
    for (size_t i = 0; i < r->elements; i++) {
        const char *e = r->element[i]->str;
        char c = e[0];
        long long v[5] = {0};
        int n = sscanf(e + 1, "%lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4]);
        int w = (int)v[0];
        if (c == 'm' || c == 'M') { /* w t kind (dur | chunk) */
            ASSERT(nf < 256);
            g_fdesc[nf][0] = '\0';
            if (c == 'M') {
                const char *d = e;
                for (int sp = 0; sp < 4 && d; sp++) {
                    d = strchr(d, ' ');
                    if (d) d++;
                }
                snprintf(g_fdesc[nf], sizeof g_fdesc[nf], "%s", d ? d : "");
            }
            g_f[nf++] = (evt){c, (long)i, w, (int)v[2], v[1], c == 'm' ? v[3] : 0,
                              c == 'm' && n >= 5 ? (int)v[4] : 0};
            if (c == 'M' && v[2] == F_DUPREQ - F_DROPREQ && w >= 0 && w < MAX_IDS &&
                roles[w].role == R_COUNTER)
                cd_dup++;
            continue;
        }
        if (strchr("PCKUDGI", c)) {
            ASSERT(nf < 256);
            g_f[nf++] = (evt){c, (long)i, w, 0, v[1], 0};
            if (c == 'K') { /* ends w's open sections and attempt */
                for (int k = 0; k < NAMES; k++)
                    if (open_s[w][k] >= 0) {
                        sec *x = &g_s[open_s[w][k]];
                        x->e = (long)i;
                        x->et = v[1];
                        x->killed = 1;
                        open_s[w][k] = -1;
                    }
                if (open_a[w] >= 0) {
                    g_a[open_a[w]].result = 'K';
                    g_a[open_a[w]].e = (long)i;
                    g_a[open_a[w]].et = v[1];
                    open_a[w] = -1;
                }
            }
            continue;
        }
        if (c == 'c' || c == 'h') { /* the replication link cut (t mode) or healed (t) */
            ASSERT(nf < 256);
            g_f[nf++] = (evt){c, (long)i, 0, c == 'c' ? (int)v[1] : 0, (int64_t)v[0], 0};
            continue;
        }
        if (c == 'z' || c == 'j') { /* the parent's final zero of latch v[0]: begun, done */
            int rd = (int)v[0];
            ASSERT(rd >= 0 && rd < NAMES);
            if (c == 'z') zero_begun[rd] = 1;
            else if (zero_pos[rd] < 0) {
                zero_pos[rd] = (long)i;
                zero_t[rd] = v[1];
            }
            continue;
        }
        if (strchr("ZYFQHJ", c)) {
            ASSERT(nf < 256);
            /* one Redis without persistence: a restart loses the latches
             * (an absent latch is at 0) */
            if (c == 'Z' && p->topo == T_NONE) lost_key = 1;
            /* the node (RedLock) is the last field: it goes in w */
            if (c == 'Z') g_f[nf++] = (evt){c, (long)i, (int)v[2], (int)v[0], (int64_t)v[1], 0};
            else g_f[nf++] = (evt){c, (long)i, (int)v[1], 0, v[0], 0};
            continue;
        }
        ASSERT_MSG(n >= 1 && w >= 0 && w < MAX_IDS, "bad event \"%s\"", e);
        switch (c) {
        case 'A':
        case 'd':
            ASSERT(na < MAX_ATT);
            if (c == 'A') g_a[na] = (att){w, (int)v[1], v[2], v[3], -1, (long)i, -1, 0, 0, 0};
            else g_a[na] = (att){w, (int)v[1], 0, v[2], -1, (long)i, -1, 0, 0, 1};
            if (c == 'd') {
                ASSERT(v[1] >= 0 && v[1] < NAMES);
                cd_begun[v[1]]++;
            }
            open_a[w] = na++;
            break;
        case 'e': { /* w round code t: a count-down returned */
            int rd = (int)v[1];
            ASSERT(rd >= 0 && rd < NAMES);
            if (open_a[w] >= 0) {
                att *a = &g_a[open_a[w]];
                a->result = v[2] == DLOCK_OK ? 'B' : 'X';
                a->code = (int)v[2];
                a->e = (long)i;
                a->et = v[3];
                open_a[w] = -1;
            }
            if (v[2] == DLOCK_EPROTO) {
                st->proto++;
                fail = 1;
                printf("  VIOLATION stale reply: worker %d's count-down at #%zu read a reply "
                       "that was not its own (%s)\n", w, i, e);
            }
            if (v[2] != DLOCK_OK) {
                st->errors++;
                if (!first_err[0]) snprintf(first_err, sizeof first_err, "%s", e);
                break;
            }
            if (++cd_ok[rd] >= p->count[rd] && zero_pos[rd] < 0) {
                zero_pos[rd] = (long)i;
                zero_t[rd] = v[3];
            }
            break;
        }
        case 'k': { /* w round t: an await returned DLOCK_OK */
            int rd = (int)v[1];
            ASSERT(rd >= 0 && rd < NAMES);
            if (open_a[w] >= 0) {
                att *a = &g_a[open_a[w]];
                a->result = 'B';
                a->e = (long)i;
                a->et = v[2];
                open_a[w] = -1;
            }
            /* surely above 0: fewer count-downs may have been applied than
             * the count, and neither the parent's zero nor a restart that
             * lost the key came before */
            long most = cd_begun[rd] + cd_dup;
            if (!zero_begun[rd] && !lost_key && most < p->count[rd]) {
                st->early++;
                fail = 1;
                printf("  VIOLATION await at count > 0: worker %d's await of latch %d returned "
                       "DLOCK_OK at #%zu, with at most %ld of %lld count-downs applied\n", w, rd,
                       i, most, (long long)p->count[rd]);
            }
            break;
        }
        case 'B': {
            int nm = (int)v[1];
            ASSERT(nm >= 0 && nm < NAMES && ns < MAX_SEC);
            sec *x = &g_s[ns];
            memset(x, 0, sizeof *x);
            x->w = w;
            x->n = nm;
            x->role = roles[w].role;
            x->tok = (uint64_t)v[2];
            x->valid0 = v[3];
            x->bt = v[4];
            x->b = (long)i;
            x->e = -1;
            x->has_lease = v[3] >= 0;
            x->deadline = v[3] >= 0 ? v[4] + v[3] : -1;
            long long u0 = -1, u1 = -1;
            if (sscanf(e + 1, "%*s %*s %*s %*s %*s %lld %lld", &u0, &u1) != 2)
                u0 = u1 = -1;
            x->end_us = u0;
            x->bt_us = u1;
            open_s[w][nm] = ns++;
            if (open_a[w] >= 0) {
                att *a = &g_a[open_a[w]];
                if (a->result == 0) {
                    a->result = 'B';
                    a->e = (long)i;
                    a->et = v[4];
                }
                /* short validity: OK with less than half the lease left */
                int64_t lease = roles[w].lease ? roles[w].lease : p->wd_ms;
                /* a reply held back (or lost, then asked again) is a
                 * slow network, as a pause is */
                if (x->has_lease && p->kind != K_FAIR && p->kind != K_PERMITS &&
                    x->valid0 * 2 < lease && !paused_in(nf, w, a->at, v[4], NULL) &&
                    !server_fault_in(nf, a->at, v[4]) && !msg_fired_in(nf, w, a->at, v[4], 0)) {
                    st->shortv++;
                    fail = 1;
                    printf("  VIOLATION short lease: worker %d got name %d at #%zu with %lld ms "
                           "left of a %lld ms lease (acquire took %lld ms, not paused)\n", w, nm,
                           i, v[3], (long long)lease, (long long)(v[4] - a->at));
                }
            }
            /* RedLock without a fence server: tokens are the largest of the
             * majority's counters, not linearizable (dlock.h) */
            if (x->tok && x->role != R_READER && (p->topo != T_REDLOCK || p->fence)) {
                /* a worker stopped (or its link frozen or cut) between the
                 * grant and this log line: later holders may come first */
                int late = open_a[w] >= 0 && paused_in(nf, w, g_a[open_a[w]].at, v[4], NULL);
                /* a restart that forgot the hold of the larger token came
                 * between: a snapshot's hold (its token with it) may be
                 * found again by its owner (the fence refuses its writes) */
                if (x->tok <= last_tok[nm] && forgot_between(nf, p->topo, last_tok_pos[nm], (long)i))
                    late = 1;
                if (x->tok <= last_tok[nm] && late) {
                    st->tokens_exempt++;
                } else if (x->tok <= last_tok[nm]) {
                    st->tokens++;
                    fail = 1;
                    printf("  VIOLATION token not increasing: worker %d token %llu on name %d at "
                           "#%zu after %llu\n", w, (unsigned long long)x->tok, nm, i,
                           (unsigned long long)last_tok[nm]);
                }
                if (x->tok > last_tok[nm]) {
                    last_tok[nm] = x->tok;
                    last_tok_pos[nm] = (long)i;
                }
            }
            break;
        }
        case 'N': {
            int nm = (int)v[1];
            uint64_t t = (uint64_t)v[2];
            if (t && roles[w].role != R_READER && (p->topo != T_REDLOCK || p->fence)) {
                if (t <= last_tok[nm] && forgot_between(nf, p->topo, last_tok_pos[nm], (long)i)) {
                    st->tokens_exempt++;
                } else if (t <= last_tok[nm]) {
                    st->tokens++;
                    fail = 1;
                    printf("  VIOLATION token not increasing: re-entry of worker %d token %llu at "
                           "#%zu after %llu\n", w, (unsigned long long)t, i,
                           (unsigned long long)last_tok[nm]);
                }
                if (t > last_tok[nm]) {
                    last_tok[nm] = t;
                    last_tok_pos[nm] = (long)i;
                }
            }
            break;
        }
        case 'V': {
            int nm = (int)v[1];
            if (nm >= 0 && nm < NAMES && open_s[w][nm] >= 0 && v[2] > 0) {
                sec *x = &g_s[open_s[w][nm]];
                if (x->has_lease && v[3] + v[2] > x->deadline) x->deadline = v[3] + v[2];
            }
            break;
        }
        case 'W': {
            int nm = n >= 4 ? (int)v[3] : 0;
            uint64_t t = (uint64_t)v[1];
            if (v[2] == 1) {
                if (have_acc[nm] && t <= max_acc[nm]) {
                    st->stale++;
                    fail = 1;
                    printf("  VIOLATION stale write accepted: worker %d token %llu on name %d at "
                           "#%zu (token %llu accepted before)\n", w, (unsigned long long)t, nm, i,
                           (unsigned long long)max_acc[nm]);
                }
                if (!have_acc[nm] || t > max_acc[nm]) max_acc[nm] = t;
                have_acc[nm] = 1;
            } else if (verbose) {
                printf("  write rejected by the fence: worker %d token %llu on name %d at #%zu\n",
                       w, (unsigned long long)t, nm, i);
            }
            break;
        }
        case 'E': {
            int nm = (int)v[1];
            if (open_s[w][nm] >= 0) {
                g_s[open_s[w][nm]].e = (long)i;
                g_s[open_s[w][nm]].et = v[2];
                open_s[w][nm] = -1;
            }
            break;
        }
        case 'R': {
            int nm = (int)v[1];
            if (v[2] == DLOCK_EPROTO) {
                st->proto++;
                fail = 1;
                printf("  VIOLATION stale reply: worker %d's release or extend at #%zu read a "
                       "reply that was not its own (%s)\n", w, i, e);
            }
            /* the last section of w on nm: its release failed */
            for (int k = ns - 1; k >= 0; k--)
                if (g_s[k].w == w && g_s[k].n == nm) {
                    g_s[k].relfail = 1;
                    break;
                }
            break;
        }
        case 'T':
        case 'X':
            if (c == 'X' && v[1] == DLOCK_ENOQUORUM && p->topo == T_REDLOCK && open_a[w] >= 0) {
                /* no quorum although a majority of masters was up the whole
                 * attempt (safety.md: a frozen or dead minority costs
                 * nothing) */
                int64_t from = g_a[open_a[w]].at - 300, to = v[2];
                int down = 0;
                for (int nd = 0; nd < NODES; nd++) {
                    int hit = 0;
                    for (int k = 0; k < nf && !hit; k++) {
                        char fc = g_f[k].c;
                        if ((fc != 'H' && fc != 'Z') || g_f[k].w != nd) continue;
                        int64_t e1 = INT64_MAX;
                        for (int j = k + 1; j < nf; j++)
                            if (g_f[j].c == (fc == 'H' ? 'J' : 'Y') && g_f[j].w == nd) {
                                e1 = g_f[j].t + 300;
                                break;
                            }
                        if (g_f[k].t <= to && e1 >= from) hit = 1;
                    }
                    down += hit;
                }
                if (down <= (NODES - 1) / 2 && !paused_in(nf, w, from, to, NULL)) {
                    st->noquorum++;
                    fail = 1;
                    printf("  VIOLATION no quorum: worker %d's acquire at #%zu failed with "
                           "DLOCK_ENOQUORUM while %d of %d masters were up (%s)\n", w, i,
                           NODES - down, NODES, e);
                }
            }
            /* the proxies never corrupt bytes: a reply of the wrong shape
             * is an earlier command's, read as this one's answer */
            if (c == 'X' && v[1] == DLOCK_EPROTO) {
                st->proto++;
                fail = 1;
                printf("  VIOLATION stale reply: worker %d at #%zu read a reply that was not its "
                       "own (%s)\n", w, i, e);
            }
            if (c == 'X') {
                st->errors++;
                if (!first_err[0]) snprintf(first_err, sizeof first_err, "%s", e);
            }
            if (open_a[w] >= 0 && g_a[open_a[w]].result == 0) {
                att *a = &g_a[open_a[w]];
                a->result = c;
                a->code = (int)v[1];
                a->e = (long)i;
                a->et = v[2];
                open_a[w] = -1;
            }
            break;
        case 'O':
        case 'L':
            for (int k = ns - 1; k >= 0; k--)
                if (g_s[k].w == w && (c == 'L' || g_s[k].n == (int)v[1])) {
                    if (c == 'O') g_s[k].rel_t = v[2];
                    else if (!g_s[k].lost_t) g_s[k].lost_t = v[2];
                    break;
                }
            break;
        case 'S': break;
        default: th_fail(__FILE__, __LINE__, "unknown event \"%s\"", e);
        }
    }
    long nev = (long)r->elements;
    int64_t tend = th_now_ms();
    freeReplyObject(r);
    for (int i = 0; i < ns; i++)
        if (g_s[i].e < 0) {
            g_s[i].e = nev;
            g_s[i].et = tend;
        }
    for (int i = 0; i < na; i++)
        if (g_a[i].e < 0) {
            g_a[i].e = nev;
            g_a[i].et = tend;
        }
    st->ops = p->kind == K_LATCH ? na : ns;

    /* faults that took effect */
    for (int i = 0; i < nf; i++) {
        evt *f = &g_f[i];
        int type = -1, eff = 0;
        const char *what = "";
        char whatbuf[200];
        switch (f->c) {
        case 'm': {
            /* armed: did it fire (M), and on what? A chunk lost, doubled or
             * held back while the worker had an acquire or a hold in flight
             * took effect; the checker cannot tell which command the chunk
             * was beyond its first bytes, nor a chunk's effect on a
             * connection the worker was not waiting on */
            type = F_DROPREQ + f->mode;
            int m = -1;
            for (int j = i + 1; j < nf && m < 0; j++) {
                if (g_f[j].w != f->w || g_f[j].mode != f->mode) continue;
                if (g_f[j].c == 'm') break; /* re-armed before it fired: one shot */
                if (g_f[j].c == 'M') m = j;
            }
            if (m < 0) {
                what = "never fired (no chunk passed)";
                break;
            }
            int64_t tm = g_f[m].t;
            what = whatbuf;
            for (int k = 0; k < na && !eff; k++) {
                const att *a = &g_a[k];
                if (a->w != f->w || a->at > tm || a->et < tm) continue;
                eff = 1;
                char res[48];
                if (a->result == 'B')
                    snprintf(res, sizeof res, "%s", p->kind == K_LATCH ? "it returned OK"
                                                                       : "it acquired");
                else if (a->result == 'T' || a->result == 'X')
                    snprintf(res, sizeof res, "it ended with %s %d",
                             a->result == 'T' ? "no lock" : "error", a->code);
                else snprintf(res, sizeof res, "its end not logged");
                snprintf(whatbuf, sizeof whatbuf, "fired %lld ms later during %s (%s) on \"%s\"",
                         (long long)(tm - f->t),
                         p->kind != K_LATCH ? "an acquire" : a->cd ? "a count-down" : "an await",
                         res, g_fdesc[m]);
            }
            for (int k = 0; k < ns && !eff; k++) {
                const sec *x = &g_s[k];
                if (x->w != f->w || x->bt > tm || x->et + 50 < tm) continue;
                eff = 1;
                snprintf(whatbuf, sizeof whatbuf, "fired %lld ms later during a hold (release %s) "
                         "on \"%s\"", (long long)(tm - f->t),
                         x->relfail ? "failed" : x->rel_t ? "ok" : "not logged", g_fdesc[m]);
            }
            if (!eff)
                snprintf(whatbuf, sizeof whatbuf, "fired %lld ms later with nothing in flight on "
                         "\"%s\"", (long long)(tm - f->t), g_fdesc[m]);
            break;
        }
        case 'P':
        case 'K':
        case 'D':
        case 'G':
            type = f->c == 'P' ? F_PAUSE : f->c == 'K' ? F_KILL : f->c == 'D' ? F_CUT : F_FREEZE;
            for (int k = 0; k < ns && !eff; k++)
                if (g_s[k].w == f->w && g_s[k].b < f->pos && g_s[k].e >= f->pos) {
                    eff = 1;
                    what = "hit a holder";
                }
            for (int k = 0; k < na && !eff; k++)
                if (g_a[k].w == f->w && g_a[k].a < f->pos && g_a[k].e >= f->pos) {
                    eff = 1;
                    what = p->kind != K_LATCH ? "hit a waiter"
                           : g_a[k].cd ? "hit a count-down" : "hit an await";
                }
            /* a counter stopped, cut off or killed between two count-downs
             * holds the count back while a latch is not yet at 0 */
            for (int k = 0; p->kind == K_LATCH && k < p->rounds && !eff; k++)
                if (f->w >= 0 && f->w < MAX_IDS && roles[f->w].role == R_COUNTER &&
                    zero_pos[k] > f->pos) {
                    eff = 1;
                    what = "held a counter back";
                }
            break;
        case 'U':
            type = F_CANCEL;
            for (int k = 0; k < na && !eff; k++)
                if (g_a[k].w == f->w && g_a[k].a < f->pos && g_a[k].e > f->pos &&
                    g_a[k].result == 'T' && g_a[k].code == DLOCK_ECANCELED) {
                    eff = 1;
                    what = "cancelled a wait";
                }
            break;
        case 'Z':
        case 'H':
            type = f->c == 'Z' ? F_RESTART : F_SRVPAUSE;
            for (int k = 0; k < ns && !eff; k++)
                if (g_s[k].b < f->pos && g_s[k].e > f->pos) {
                    eff = 1;
                    what = "while held";
                }
            for (int k = 0; k < na && !eff; k++)
                if (g_a[k].a < f->pos && g_a[k].e > f->pos) {
                    eff = 1;
                    what = "while waited for";
                }
            break;
        case 'c': {
            /* the replication link cut or frozen: it took effect when an
             * acquire ran or a hold was kept while it was (with
             * wait_replicas, the acquire cannot be acknowledged) */
            type = f->mode ? F_REPLFREEZE : F_REPLCUT;
            long hp = nev;
            for (int j = i + 1; j < nf; j++)
                if (g_f[j].c == 'h') {
                    hp = g_f[j].pos;
                    break;
                }
            int nrep = 0, nacq = 0, nheld = 0;
            for (int k = 0; k < na; k++)
                if (!g_a[k].cd && g_a[k].a < hp && g_a[k].e > f->pos) {
                    nacq++;
                    if (g_a[k].result == 'X' && g_a[k].code == DLOCK_EREPLICAS) nrep++;
                }
            for (int k = 0; k < ns; k++)
                if (g_s[k].b < hp && g_s[k].e > f->pos) nheld++;
            eff = nacq || nheld;
            snprintf(whatbuf, sizeof whatbuf, "%d acquire(s) during it (%d failed with "
                     "DLOCK_EREPLICAS), %d hold(s) kept", nacq, nrep, nheld);
            what = whatbuf;
            break;
        }
        case 'F':
            type = F_SAVE;
            for (int k = i + 1; k < nf && !eff; k++)
                if (g_f[k].c == 'Z') {
                    eff = 1;
                    what = "restarted from";
                }
            break;
        case 'Q':
            type = F_PSUB;
            for (int k = 0; k < ns && !eff; k++)
                if (g_s[k].e > f->pos && g_s[k].e < nev) {
                    eff = 1;
                    what = "releases published to it";
                }
            for (int k = 0; p->kind == K_LATCH && k < p->rounds && !eff; k++)
                if (zero_pos[k] > f->pos) {
                    eff = 1;
                    what = "a latch's zero published to it";
                }
            break;
        default: break;
        }
        if (type < 0) continue;
        st->faults++;
        st->by_fault[type]++;
        if (eff) {
            st->effective++;
            st->by_fault_eff[type]++;
        }
        if (verbose) {
            char who[32] = "";
            if (f->c == 'm' && p->topo == T_REDLOCK)
                snprintf(who, sizeof who, " of worker %d on node %d", f->w, f->node);
            else if (strchr("PKDGUm", f->c)) snprintf(who, sizeof who, " of worker %d", f->w);
            else if (p->topo == T_REDLOCK && f->c != 'Q')
                snprintf(who, sizeof who, " of node %d", f->w);
            printf("  fault #%ld %s%s: %s\n", f->pos, FAULT_NAME[type], who,
                   eff ? what : "no effect");
        }
    }

    /* wait_replicas: an acquire that began after the replication link was
     * cut or frozen and returned OK before it worked again was not
     * acknowledged by the replica (nothing passed), yet the library must
     * not return OK then (DLOCK_EREPLICAS, or wait) */
    for (int i = 0; p->wr && p->kind != K_LATCH && i < nf; i++) {
        if (g_f[i].c != 'c') continue;
        long hp = nev;
        for (int j = i + 1; j < nf; j++)
            if (g_f[j].c == 'h') {
                hp = g_f[j].pos;
                break;
            }
        for (int k = 0; k < na; k++) {
            const att *a = &g_a[k];
            if (a->cd || a->result != 'B' || a->a < g_f[i].pos || a->e > hp) continue;
            st->unacked++;
            fail = 1;
            printf("  VIOLATION unacknowledged acquire: worker %d's acquire from #%ld returned OK "
                   "at #%ld while the replication link was %s (#%ld to #%ld)\n", a->w, a->a,
                   a->e, g_f[i].mode ? "frozen" : "cut", g_f[i].pos, hp);
        }
    }

    /* overlaps */
    if (p->kind == K_SEM || p->kind == K_PERMITS) {
        /* a semaphore restarted from a snapshot (RDB) gets back the count
         * the snapshot had: the permits taken after it and still out at
         * the restart are counted again, and given back once more by
         * their holders' releases (permits have no owner: dlock.h). Each
         * such restart allows that many more holders from it on (exempt) */
        long infl_pos[MAX_F];
        int infl_n[MAX_F], ninfl = 0;
        for (int i = 0; p->kind == K_SEM && p->topo == T_RDB && i < nf && ninfl < MAX_F; i++) {
            if (g_f[i].c != 'Z') continue;
            long save = -1; /* the SAVE before the run */
            for (int k = 0; k < i; k++)
                if (g_f[k].c == 'F') save = g_f[k].pos;
            int out = 0;
            for (int k = 0; k < ns; k++)
                if (g_s[k].b > save && g_s[k].b < g_f[i].pos && g_s[k].e > g_f[i].pos) out++;
            infl_pos[ninfl] = g_f[i].pos;
            infl_n[ninfl++] = out;
        }
        for (int j = 0; j < ns; j++) {
            const sec *y = &g_s[j];
            int cnt = 1, ex = 0, extra = 0;
            for (int k = 0; k < ninfl; k++)
                if (infl_pos[k] < y->b) extra += infl_n[k];
            for (int i = 0; i < j; i++) {
                const sec *x = &g_s[i];
                if (!(x->e > y->b)) continue;
                /* x past its validity when y began. The ms times are
                 * rounded down: x's lease ends in its deadline's ms or
                 * later, y was granted before its bt's ms ended, so a bt
                 * equal to the deadline may be no overlap at all. A
                 * permit's B line has both in microseconds: past once y's
                 * time reached x's lease end */
                int past = x->deadline >= 0 && x->deadline < y->bt;
                if (x->end_us >= 0 && y->bt_us >= 0) past = x->end_us <= y->bt_us;
                if (past || forgot_between(nf, p->topo, x->b, y->b))
                    ex = 1;
                else
                    cnt++;
            }
            if (cnt > p->permits && cnt <= p->permits + extra) {
                st->exempt++;
            } else if (cnt > p->permits) {
                st->overlaps++;
                fail = 1;
                printf("  VIOLATION overlap: %d holders of %d permits when worker %d began at "
                       "#%ld\n", cnt, p->permits, y->w, y->b);
            } else if (ex && cnt + 1 > p->permits) {
                st->exempt++;
            }
        }
    } else {
        for (int i = 0; i < ns; i++)
            for (int j = i + 1; j < ns; j++) {
                const sec *x = &g_s[i], *y = &g_s[j];
                if (x->n != y->n || !(x->b < y->e && y->b < x->e) || !conflict(p, x, y))
                    continue;
                if (x->w == y->w) continue; /* one handle set: impossible, not a conflict */
                /* a foreign hold's deadline is its send time plus the lease,
                 * with no margin: the server, on its own millisecond clock,
                 * may end it FOREIGN_SLACK_MS before the deadline's tick */
                int64_t slack = x->role == R_FOREIGN ? FOREIGN_SLACK_MS : 0;
                if ((x->deadline >= 0 && x->deadline - slack < y->bt) ||
                    forgot_between(nf, p->topo, x->b, y->b)) {
                    st->exempt++;
                    if (verbose)
                        printf("  exempt overlap: worker %d token %llu [#%ld, #%ld] and worker "
                               "%d token %llu [#%ld, #%ld] (%s)\n", x->w,
                               (unsigned long long)x->tok, x->b, x->e, y->w,
                               (unsigned long long)y->tok, y->b, y->e,
                               x->deadline >= 0 && x->deadline < y->bt
                                   ? "the first was past its lease"
                                   : "the server forgot the hold");
                    continue;
                }
                st->overlaps++;
                fail = 1;
                printf("  VIOLATION overlap on name %d: worker %d token %llu [#%ld, #%ld] "
                       "(valid %lld) with worker %d token %llu [#%ld, #%ld] (%lld ms after)\n",
                       x->n, x->w, (unsigned long long)x->tok, x->b, x->e,
                       (long long)x->valid0, y->w, (unsigned long long)y->tok, y->b, y->e,
                       (long long)(y->bt - x->bt));
            }
    }

    /* the lost callback ran before another client held (item 9's contract:
     * it runs before the server can expire the hold), unless the holder was
     * stopped or the server forgot the hold, or the holder had already ended
     * its section and called release (the callback tells a holder to stop:
     * it had; a release whose reply is held back past the lease's due time
     * gets the callback, while the server already let the next one in) */
    for (int i = 0; i < ns; i++) {
        const sec *x = &g_s[i];
        if (!x->lost_t) continue;
        for (int j = 0; j < ns; j++) {
            const sec *y = &g_s[j];
            if (y->n != x->n || y->w == x->w || y->b <= x->b || y->bt >= x->lost_t) continue;
            if (x->e > 0 && y->b > x->e) continue;
            if (!conflict(p, x, y)) continue;
            if (forgot_between(nf, p->topo, x->b, y->b)) continue;
            int pz = 0;
            for (int k = 0; k < nf; k++)
                if (g_f[k].c == 'P' && g_f[k].w == x->w && g_f[k].pos > x->b &&
                    g_f[k].t < x->lost_t)
                    pz = 1;
            if (pz) continue;
            st->lostlate++;
            fail = 1;
            printf("  VIOLATION lost callback late: worker %d's hold of name %d (from #%ld) was "
                   "taken by worker %d at #%ld, %lld ms before its lost callback ran\n", x->w,
                   x->n, x->b, y->w, y->b, (long long)(x->lost_t - y->bt));
            break;
        }
    }

    /* liveness */
    /* read/write: a name is freed when its last holder of either side
     * leaves ("others still holding" below); not the multi-lock, whose
     * attempts are of a set, not a name */
    int live_kind = p->kind == K_PLAIN || p->kind == K_REENTRANT || p->kind == K_FAIR ||
                    p->kind == K_SEM || p->kind == K_PERMITS || p->kind == K_RW;
    int64_t sem_leak_t = INT64_MAX; /* a semaphore's permits leak with a killed holder */
    if (p->kind == K_SEM) {
        for (int i = 0; i < ns; i++)
            if (g_s[i].killed && g_s[i].et < sem_leak_t) sem_leak_t = g_s[i].et;
        for (int i = 0; i < nf; i++)
            if (g_f[i].c == 'Z' && p->topo != T_AOF && g_f[i].t < sem_leak_t)
                sem_leak_t = g_f[i].t;
    }
    int64_t max_lease = p->wd_ms;
    for (int i = 0; i < MAX_IDS; i++)
        if (roles[i].lease > max_lease) max_lease = roles[i].lease;
    for (int i = 0; live_kind && i < ns; i++) {
        const sec *x = &g_s[i];
        if (x->role == R_FOREIGN || x->e >= nev) continue;
        int64_t tf;
        if (x->relfail) {
            continue;
        } else if (x->killed) {
            int64_t lease = roles[x->w].lease ? roles[x->w].lease : p->wd_ms;
            if (p->kind == K_SEM) continue;
            tf = roles[x->w].lease && x->deadline >= 0 ? x->deadline : x->et + lease;
            if (tf < x->et) tf = x->et;
        } else {
            if (!x->rel_t) continue;
            tf = x->rel_t;
            /* paused or cut off past its lease: free when the lease ran out */
            if (x->deadline >= 0 && x->deadline < tf) tf = x->deadline;
        }
        if (tf >= sem_leak_t) continue;
        /* others still holding at tf: not freed */
        int held = 0;
        for (int k = 0; k < ns; k++) {
            const sec *o = &g_s[k];
            if (k == i || o->n != x->n) continue;
            int64_t oend = o->killed ? o->et + (roles[o->w].lease ? roles[o->w].lease : p->wd_ms)
                                     : o->et;
            if (o->bt <= tf && oend > tf) held++;
        }
        if (held >= p->permits) continue;
        /* the stall: the time from tf to the next hold during which some
         * live waiter waited (not stopped, its link neither frozen nor cut,
         * from its arrival, tf at the earliest, to the end of its wait) */
        int64_t tn = INT64_MAX;
        for (int k = 0; k < ns; k++)
            if (g_s[k].n == x->n && g_s[k].bt >= tf && g_s[k].bt < tn) tn = g_s[k].bt;
        static int64_t iv[2 * MAX_ATT][2];
        /* read/write: a reader refused for a writer stuck in its wait
         * waits by the policy, not for a wake-up (rw_held_back) */
        static int64_t bw[MAX_ATT][2];
        int nb = p->kind == K_RW ? rw_held_back(nf, na, roles, x->n, bw, MAX_ATT) : 0;
        if (nb) qsort(bw, (size_t)nb, sizeof bw[0], cmp_iv);
        int niv = 0, nw = 0;
        for (int k = 0; k < na; k++) {
            const att *a = &g_a[k];
            if (a->n != x->n || a->wait == 0 || roles[a->w].role == R_FOREIGN) continue;
            int64_t from = a->at > tf ? a->at : tf, to = a->et < tn ? a->et : tn;
            if (to <= from) continue;
            if (paused_in(nf, a->w, a->at, to, NULL)) continue;
            /* a request or reply of its own lost, doubled or held back */
            if (msg_fired_in(nf, a->w, a->at, to, MSG_STALL_MS)) continue;
            int counted = 0;
            for (int b = 0; roles[a->w].role == R_READER && b < nb && from < to; b++) {
                if (bw[b][1] <= from || bw[b][0] >= to) continue;
                if (bw[b][0] > from && niv < 2 * MAX_ATT) {
                    iv[niv][0] = from;
                    iv[niv][1] = bw[b][0];
                    niv++;
                    counted = 1;
                }
                from = bw[b][1];
            }
            if (from < to && niv < 2 * MAX_ATT) {
                iv[niv][0] = from;
                iv[niv][1] = to;
                niv++;
                counted = 1;
            }
            if (counted && a->at <= tf) nw++;
        }
        if (!niv) continue;
        qsort(iv, (size_t)niv, sizeof iv[0], cmp_iv);
        int64_t stall = 0, cs = iv[0][0], ce = iv[0][1];
        for (int k = 1; k < niv; k++) {
            if (iv[k][0] > ce) {
                stall += ce - cs;
                cs = iv[k][0];
                ce = iv[k][1];
            } else if (iv[k][1] > ce) {
                ce = iv[k][1];
            }
        }
        stall += ce - cs;
        if (server_fault_in(nf, tf, tf + stall)) continue;
        /* an acquire whose reply was lost (a try, or an attempt a wait
         * could not settle), or whose request was doubled (a reentrant
         * count one too high), leaves a hold nobody knows of until its
         * lease ends */
        if (ghost_in(nf, na, ns, roles, p, tf, tf + stall)) {
            if (verbose)
                printf("  liveness not checked after #%ld: a proxy fault may have left a hold "
                       "(%lld ms)\n", x->e, (long long)stall);
            continue;
        }
        /* a restart from a snapshot brings back the holds it had, held by
         * nobody until their leases run out */
        int ghost = 0;
        for (int k = 0; k < nf && p->topo == T_RDB; k++)
            if (g_f[k].c == 'Y' && tf >= g_f[k].t && tf <= g_f[k].t + max_lease) ghost = 1;
        if (ghost) continue;
        if (stall > st->worst_stall) st->worst_stall = stall;
        if (stall > 1000) st->slow++;
        if (stall > g_stall_bound) {
            st->live++;
            fail = 1;
            printf("  VIOLATION liveness: name %d freed by worker %d at #%ld%s, %d live waiter(s) "
                   "then, %lld ms of live waiting before the next hold (bound %lld)\n", x->n,
                   x->w, x->e, x->killed ? " (killed, after its lease)" : "", nw,
                   (long long)stall, (long long)g_stall_bound);
        }
    }
    if (p->kind == K_MULTI) {
        int64_t at = 0, stall = multi_worst_stall(nf, na, ns, roles, p, max_lease, &at);
        if (stall > st->worst_stall) st->worst_stall = stall;
        if (stall > 1000) st->slow++;
        if (stall > g_stall_bound) {
            st->live++;
            fail = 1;
            printf("  VIOLATION liveness: every name free from %lld ms (run clock) while a live "
                   "multi-lock waiter waited, %lld ms before the next hold (bound %lld)\n",
                   (long long)at, (long long)stall, (long long)g_stall_bound);
        }
    }
    /* the latch: once the count surely reached 0 (the round's count of
     * count-downs returned OK, or the parent's zero after the run), every
     * live await of that latch returns, with DLOCK_OK, within the bound: the
     * zero's message wakes it, a lost message is made good by the backstop
     * re-check (DL_WAIT_RECHECK_MS, the same 2000 ms as the locks' bound).
     * Not live: a stopped awaiter, its link frozen or cut, or a one-shot
     * fault on its own traffic (MSG_STALL_MS), a server stopped or
     * restarted meanwhile. The count may come back above 0 after a restart
     * from a snapshot or a promotion (a latch is not waited for): after
     * such a restart neither is checked. An await that timed out although
     * the count was surely 0 before its deadline (before its start: a try)
     * is a violation as well, counted with the liveness ones. */
    for (int k = 0; p->kind == K_LATCH && k < na; k++) {
        const att *a = &g_a[k];
        int rd = a->n;
        if (a->cd || a->result == 'K' || rd < 0 || rd >= p->rounds || zero_pos[rd] < 0) continue;
        if (a->e < zero_pos[rd]) continue; /* it ended before the zero */
        int back = 0;
        for (int j = 0; j < nf; j++)
            if (g_f[j].c == 'Z' && (p->topo == T_RDB || p->topo == T_REPLICA) &&
                g_f[j].pos > zero_pos[rd] && g_f[j].pos < a->e)
                back = 1;
        if (back) continue;
        int64_t from = a->at > zero_t[rd] ? a->at : zero_t[rd];
        int64_t stall = a->et - from;
        if (stall < 0) stall = 0;
        int timed_out = a->result == 'T' && a->code == DLOCK_ETIMEDOUT &&
                        (a->wait == 0 ? zero_pos[rd] < a->a
                                      : a->wait > 0 && zero_t[rd] < a->at + a->wait);
        if (paused_in(nf, a->w, a->at, a->et, NULL) ||
            msg_fired_in(nf, a->w, a->at, a->et, MSG_STALL_MS) ||
            server_fault_in(nf, from, a->et))
            continue;
        if (stall > st->worst_stall) st->worst_stall = stall;
        if (stall > 1000) st->slow++;
        if (stall > g_stall_bound || timed_out) {
            st->live++;
            fail = 1;
            printf("  VIOLATION liveness: worker %d's await of latch %d (from #%ld, wait %lld) "
                   "%s at #%ld, %lld ms after the count surely reached 0 at #%ld (bound %lld)\n",
                   a->w, rd, a->a, (long long)a->wait,
                   a->result == 'B' ? "returned OK" : a->result == 'T' ? "timed out or was cancelled"
                                                                       : "failed",
                   a->e, (long long)stall, zero_pos[rd], (long long)g_stall_bound);
        }
    }
    (void)nids;
    if (first_err[0] && verbose) printf("  first acquire error: %s\n", first_err);
    return fail;
}

/* keys without an expiry that nothing documents as long-lived */
static int leftovers(redisContext *lrc, const plan *p)
{
    redisReply *r = th_cmd(lrc, "KEYS *");
    int bad = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const char *k = r->element[i]->str;
        if (!strncmp(k, "redisson_lock_token:", 20)) continue;          /* fence counters */
        /* a semaphore's counter; a permit semaphore's lease set keeps the
         * entries of permits whose holders died (returned by the next call
         * on it): both Redisson's layout */
        if ((p->kind == K_SEM || p->kind == K_PERMITS) && !strcmp(k, "x:0")) continue;
        if (p->kind == K_PERMITS && !strcmp(k, "{x:0}:timeout")) continue;
        long long ttl = th_cmd_int(lrc, "PTTL %s", k);
        if (ttl == -1) {
            bad++;
            printf("  VIOLATION leftover key without expiry: %s\n", k);
        }
    }
    freeReplyObject(r);
    return bad;
}

/* ------------------------------------------------------------------------ */
/* one seed                                                                 */

/* RedLock with one-shot faults: worker id reaches each master through a
 * proxy of its own (logging to the resource as id); url gets their list */
static void rl_proxies(fl_proxy *npx, th_server *const *node, const char *res_sock, int id,
                       char *url, size_t len)
{
    size_t off = (size_t)snprintf(url, len, "redlock://");
    for (int nd = 0; nd < NODES; nd++) {
        npx[nd] = fl_proxy_start_log(th_server_port(node[nd]), th_server_port(node[nd]),
                                     res_sock, id);
        off += (size_t)snprintf(url + off, len - off, "%s127.0.0.1:%d", nd ? "," : "",
                                npx[nd].port);
    }
}

typedef struct sched {
    int64_t at;
    int what; /* 0 fault, 1 SIGCONT worker, 2 server unpause, 3 link unfreeze, 4 the
               * replication link healed */
    int i;
} sched;

static int cmp_sched(const void *a, const void *b)
{
    const sched *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

static int run_seed(uint64_t seed, int verbose, stats *st)
{
    plan p;
    make_plan(seed, &p);
    memset(st, 0, sizeof *st);
    st->seeds = 1;
    if (verbose) print_plan(&p);
    int rl = p.topo == T_REDLOCK;
    th_server *node[NODES] = {0}, *fence = NULL, *ls;
    static char rlurl[512];
    if (rl) {
        th_server_opts no = {0, p.pass ? "explore-secret" : NULL};
        size_t off = (size_t)snprintf(rlurl, sizeof rlurl, "redlock://");
        for (int i = 0; i < NODES; i++) {
            node[i] = th_server_start(&no);
            off += (size_t)snprintf(rlurl + off, sizeof rlurl - off, "%s127.0.0.1:%d",
                                    i ? "," : "", th_server_port(node[i]));
        }
        if (p.fence) fence = th_server_start(&no); /* one password for all */
        ls = node[0];
    } else {
        th_server_opts so = {p.topo == T_AOF, NULL};
        ls = th_server_start(&so);
    }
    th_server *replica = NULL;
    g_wr = p.wr;
    /* the replication link through a proxy, when the seed cuts or freezes it */
    fl_proxy rpx = {0};
    int repl_faults = 0;
    for (int i = 0; i < p.nf; i++)
        if (p.f[i].type == F_REPLCUT || p.f[i].type == F_REPLFREEZE) repl_faults = 1;
    if (p.topo == T_REPLICA) {
        replica = th_server_start(NULL);
        redisContext *rc = th_redis(replica);
        if (repl_faults) rpx = fl_proxy_start(th_server_port(ls));
        th_cmd_ok(rc, "REPLICAOF 127.0.0.1 %d", repl_faults ? rpx.port : th_server_port(ls));
        int64_t dl = th_now_ms() + 10000;
        for (;;) {
            char *info = th_cmd_str(rc, "INFO replication");
            int up = info && strstr(info, "master_link_status:up");
            free(info);
            if (up) break;
            ASSERT_MSG(th_now_ms() < dl, "the replica did not sync in 10 s");
            th_sleep_ms(20);
        }
        redisFree(rc);
    }
    th_server *primary0 = ls;
    th_server *res = th_server_start(NULL);
    redisContext *rrc = th_redis(res);
    redisContext *lrc = th_redis(ls);
    if (p.kind == K_SEM || p.kind == K_PERMITS) th_cmd_ok(lrc, "SET x:0 %d", p.permits);
    for (int r = 0; p.kind == K_LATCH && r < p.rounds; r++)
        th_cmd_ok(lrc, "SET x:%d %lld", r, (long long)p.count[r]);
    if (p.kind == K_LATCH && replica) /* the replica has the counts before any promotion */
        ASSERT_EQ(th_cmd_int(lrc, "WAIT 1 5000"), 1);
    if (p.topo == T_RDB) th_cmd_ok(lrc, "SAVE");

    /* each worker reaches the lock server through a proxy of its own, so
     * that one worker's link can be cut or frozen */
    fl_proxy px[MAX_IDS];
    static char urls[MAX_IDS][64];
    for (int id = 0; id < MAX_IDS; id++) px[id].pid = 0;
    /* RedLock with one-shot faults: a proxy per worker and master */
    static fl_proxy npx[MAX_IDS][NODES];
    static char rlurls[MAX_IDS][512];
    memset(npx, 0, sizeof npx);
    int rl_os = 0;
    for (int i = 0; rl && i < p.nf; i++)
        if (msg_fault(p.f[i].type)) rl_os = 1;
    pid_t pid[MAX_IDS] = {0};
    int slot_id[MAX_W];
    wrole roles[MAX_IDS];
    memset(roles, 0, sizeof roles);
    int nids = 0;
    int64_t t0 = th_now_ms();
    wctx cx[MAX_IDS];
    for (int i = 0; i < p.nw; i++) {
        int id = nids++;
        if (!rl) {
            px[id] = fl_proxy_start_log(th_server_port(ls),
                                        th_server_port(replica ? replica : ls),
                                        th_server_sock(res), id);
            snprintf(urls[id], sizeof urls[id], "redis://127.0.0.1:%d", px[id].port);
        }
        if (rl_os) rl_proxies(npx[id], node, th_server_sock(res), id, rlurls[id], sizeof rlurls[id]);
        cx[id] = (wctx){&p, i, id, rl ? (rl_os ? rlurls[id] : rlurl) : urls[id], th_server_sock(res),
                        rl ? 0 : px[id].port, t0 + p.run_ms,
                        fence ? th_server_url(fence) : NULL,
                        rl && p.pass ? "explore-secret" : NULL, p.wr};
        roles[id] = (wrole){p.w[i].role, p.w[i].lease, p.w[i].async};
        slot_id[i] = id;
        pid[id] = th_fork();
        if (pid[id] == 0) _exit(run_worker(&cx[id]));
    }
    sched q[3 * MAX_F];
    memset(q, 0, sizeof q);
    int nq = 0;
    for (int i = 0; i < p.nf; i++) q[nq++] = (sched){p.f[i].at, 0, i};
    qsort(q, (size_t)nq, sizeof q[0], cmp_sched);
    redisContext *psub = NULL;
    int paused[MAX_IDS] = {0}, frozen[MAX_IDS] = {0}, srv_paused = 0, repl_cut = 0;
    for (int k = 0; k < nq; k++) {
        int64_t d = t0 + q[k].at - th_now_ms();
        if (d > 0) th_sleep_ms(d);
        int64_t now = th_now_ms();
        if (q[k].what == 1) {
            int id = q[k].i;
            if (pid[id] > 0 && paused[id]) {
                kill(pid[id], SIGCONT);
                paused[id] = 0;
                fl_ev(rrc, "C %d %lld", id, (long long)now);
            }
            continue;
        }
        if (q[k].what == 4) { /* logged before the link works again */
            fl_ev(rrc, "h %lld", (long long)now);
            fl_proxy_cmd(&rpx, 'U');
            repl_cut = 0;
            continue;
        }
        if (q[k].what == 3) {
            int id = q[k].i;
            frozen[id] = 0;
            fl_proxy_cmd(&px[id], 'U');
            fl_ev(rrc, "I %d %lld", id, (long long)now);
            continue;
        }
        if (q[k].what == 2) {
            for (int nd = 0; nd < NODES; nd++)
                if ((q[k].i & (1 << nd)) && (srv_paused & (1 << nd))) {
                    th_server_unpause(rl ? node[nd] : ls);
                    srv_paused &= ~(1 << nd);
                    fl_ev(rrc, "J %lld %d", (long long)th_now_ms(), nd);
                }
            continue;
        }
        const fault *f = &p.f[q[k].i];
        int id = slot_id[f->target];
        int type = f->type;
        if (rl && (type == F_CUT || type == F_FREEZE)) type = F_SRVPAUSE; /* one node */
        switch (type) {
        case F_PAUSE:
            if (pid[id] <= 0 || paused[id]) break;
            fl_ev(rrc, "P %d %lld", id, (long long)now);
            kill(pid[id], SIGSTOP);
            paused[id] = 1;
            /* insert the SIGCONT in order */
            if (nq < 3 * MAX_F) {
                q[nq++] = (sched){q[k].at + f->dur, 1, id};
                qsort(q + k + 1, (size_t)(nq - k - 1), sizeof q[0], cmp_sched);
            }
            break;
        case F_KILL:
            if (pid[id] <= 0 || nids >= MAX_IDS) break;
            fl_ev(rrc, "K %d %lld", id, (long long)now);
            kill(pid[id], SIGKILL);
            th_wait_child(pid[id], 5000);
            pid[id] = 0;
            paused[id] = 0;
            { /* a fresh worker takes the slot */
                int nid = nids++;
                cx[nid] = cx[id];
                cx[nid].id = nid;
                if (!rl) {
                    /* after a promotion ls is the new primary; before
                     * one, the replica is where 'S' switches to */
                    px[nid] = fl_proxy_start_log(
                        th_server_port(ls), th_server_port(replica ? replica : ls),
                        th_server_sock(res), nid);
                    snprintf(urls[nid], sizeof urls[nid], "redis://127.0.0.1:%d", px[nid].port);
                    cx[nid].url = urls[nid];
                    cx[nid].port = px[nid].port;
                } else if (rl_os) {
                    rl_proxies(npx[nid], node, th_server_sock(res), nid, rlurls[nid],
                               sizeof rlurls[nid]);
                    cx[nid].url = rlurls[nid];
                }
                roles[nid] = roles[id];
                slot_id[f->target] = nid;
                pid[nid] = th_fork();
                if (pid[nid] == 0) _exit(run_worker(&cx[nid]));
            }
            break;
        case F_RESTART:
            if (rl) { /* 1 or 2 masters, restarted empty at once */
                for (int j = 0; j <= f->target % 2; j++) {
                    int nd = (f->target + j) % NODES;
                    if (srv_paused & (1 << nd)) {
                        th_server_unpause(node[nd]);
                        srv_paused &= ~(1 << nd);
                        fl_ev(rrc, "J %lld %d", (long long)th_now_ms(), nd);
                    }
                    if (nd == 0) redisFree(lrc);
                    fl_ev(rrc, "Z 0 %lld %d", (long long)th_now_ms(), nd);
                    th_server_restart(node[nd], SIGKILL);
                    fl_ev(rrc, "Y %lld %d", (long long)th_now_ms(), nd);
                    if (nd == 0) lrc = th_redis(ls);
                }
                break;
            }
            if (srv_paused) {
                th_server_unpause(ls);
                srv_paused = 0;
                fl_ev(rrc, "J %lld 0", (long long)th_now_ms());
            }
            if (replica) { /* the primary dies; its replica is promoted */
                if (ls == replica) break;
                fl_ev(rrc, "Z 3 %lld 0", (long long)now);
                redisFree(lrc);
                th_server_halt(ls, SIGKILL);
                ls = replica;
                lrc = th_redis(ls);
                th_cmd_ok(lrc, "REPLICAOF NO ONE");
                for (int j = 0; j < nids; j++)
                    if (px[j].pid > 0) fl_proxy_cmd(&px[j], 'S');
                fl_ev(rrc, "Y %lld 0", (long long)th_now_ms());
                if (psub) {
                    redisFree(psub);
                    psub = th_redis(ls);
                    redisReply *rp = redisCommand(psub, "PSUBSCRIBE *");
                    if (rp) freeReplyObject(rp);
                }
                break;
            }
            redisFree(lrc);
            fl_ev(rrc, "Z %d %lld 0", p.topo == T_NONE ? 0 : p.topo == T_RDB ? 1 : 2,
                  (long long)now);
            th_server_restart(ls, SIGKILL);
            fl_ev(rrc, "Y %lld 0", (long long)th_now_ms());
            lrc = th_redis(ls);
            if (psub) { /* its connection died with the server */
                redisFree(psub);
                psub = th_redis(ls);
                redisReply *rp = redisCommand(psub, "PSUBSCRIBE *");
                if (rp) freeReplyObject(rp);
            }
            break;
        case F_SAVE:
            if (srv_paused) break;
            /* logged first: a hold logged after it may be missing from
             * the snapshot (counted as forgotten), one logged before is in */
            fl_ev(rrc, "F %lld", (long long)now);
            th_cmd_ok(lrc, "SAVE");
            break;
        case F_PSUB:
            if (psub || (srv_paused & 1)) break; /* it could not subscribe now */
            psub = th_redis(ls);
            {
                redisReply *rp = redisCommand(psub, "PSUBSCRIBE *");
                ASSERT_NOT_NULL(rp);
                freeReplyObject(rp);
            }
            fl_ev(rrc, "Q %lld", (long long)now);
            break;
        case F_CANCEL:
            if (pid[id] <= 0 || paused[id] || roles[id].role == R_FOREIGN) break;
            fl_ev(rrc, "U %d %lld", id, (long long)now);
            kill(pid[id], SIGUSR1);
            break;
        case F_CUT:
            if (rl) break;
            fl_ev(rrc, "D %d %lld", id, (long long)now);
            fl_proxy_cmd(&px[id], 'D');
            break;
        case F_FREEZE:
            if (rl || frozen[id]) break;
            fl_ev(rrc, "G %d %lld", id, (long long)now);
            fl_proxy_cmd(&px[id], 'F');
            frozen[id] = 1;
            if (nq < 3 * MAX_F) {
                q[nq++] = (sched){q[k].at + f->dur, 3, id};
                qsort(q + k + 1, (size_t)(nq - k - 1), sizeof q[0], cmp_sched);
            }
            break;
        case F_DROPREQ:
        case F_DROPREP:
        case F_DUPREQ:
        case F_DELAYREP:
            /* armed now, fired on the next chunk that passes in that
             * direction (the proxy logs "M" then) */
            {
                /* RedLock: the worker's proxy to that master */
                fl_proxy *tp = rl ? (rl_os ? &npx[id][f->node] : NULL) : &px[id];
                if (!tp || tp->pid <= 0) break;
                fl_ev(rrc, "m %d %lld %d %lld %d", id, (long long)now, type - F_DROPREQ,
                      (long long)f->dur, rl ? f->node : 0);
                if (type == F_DELAYREP) fl_proxy_delay(tp, (int)f->dur);
                else fl_proxy_cmd(tp, type == F_DROPREQ ? 'r' : type == F_DROPREP ? 'p' : '2');
            }
            break;
        case F_REPLCUT:
        case F_REPLFREEZE:
            /* the replica's link to the primary: cut (every connection
             * reset, and new ones left unanswered: the proxy accepts
             * nothing while frozen, so the replica's reconnect waits) or
             * frozen (nothing forwarded; the primary still counts the
             * replica as connected, its WAIT times out). Logged once in
             * place ("c t 0|1"), healed after dur ("h t", then the proxy
             * forwards again, the replica catches up). Nothing after a
             * promotion (no replica left) */
            if (ls == replica || repl_cut || rpx.pid <= 0) break;
            if (type == F_REPLCUT) fl_proxy_cmd(&rpx, 'D');
            fl_proxy_cmd(&rpx, 'F');
            fl_ev(rrc, "c %lld %d", (long long)th_now_ms(), type == F_REPLFREEZE);
            repl_cut = 1;
            if (nq < 3 * MAX_F) {
                q[nq++] = (sched){q[k].at + f->dur, 4, 0};
                qsort(q + k + 1, (size_t)(nq - k - 1), sizeof q[0], cmp_sched);
            }
            break;
        case F_SRVPAUSE: {
            /* RedLock: 1 to 3 masters (3: the majority), or one for a
             * link fault */
            int cnt = !rl ? 1 : f->type != F_SRVPAUSE ? 1 : 1 + f->target % 3, mask = 0;
            int64_t dur = f->type == F_CUT ? 300 : f->dur;
            for (int j = 0; j < cnt; j++) {
                int nd = rl ? (f->target + 2 * j) % NODES : 0;
                if (srv_paused & (1 << nd)) continue;
                fl_ev(rrc, "H %lld %d", (long long)th_now_ms(), nd);
                th_server_pause(rl ? node[nd] : ls);
                srv_paused |= 1 << nd;
                mask |= 1 << nd;
            }
            if (mask && nq < 3 * MAX_F) {
                q[nq++] = (sched){q[k].at + dur, 2, mask};
                qsort(q + k + 1, (size_t)(nq - k - 1), sizeof q[0], cmp_sched);
            }
            break;
        }
        }
    }
    for (int nd = 0; nd < NODES; nd++)
        if (srv_paused & (1 << nd)) {
            th_server_unpause(rl ? node[nd] : ls);
            fl_ev(rrc, "J %lld %d", (long long)th_now_ms(), nd);
        }
    if (repl_cut) {
        fl_ev(rrc, "h %lld", (long long)th_now_ms());
        fl_proxy_cmd(&rpx, 'U');
    }
    for (int id = 0; id < nids; id++) {
        if (pid[id] > 0 && paused[id]) {
            kill(pid[id], SIGCONT);
            fl_ev(rrc, "C %d %lld", id, (long long)th_now_ms());
        }
        if (frozen[id]) {
            fl_proxy_cmd(&px[id], 'U');
            fl_ev(rrc, "I %d %lld", id, (long long)th_now_ms());
        }
    }
    /* the latch: after the run, the parent counts every round's latch to 0
     * (as dlock_latch_set 0 does: DEL, PUBLISH "0"), so that forever awaits
     * end; "z" before, "j" after */
    if (p.kind == K_LATCH) {
        int64_t d = t0 + p.run_ms - th_now_ms();
        if (d > 0) th_sleep_ms(d);
        for (int r = 0; r < p.rounds; r++) {
            fl_ev(rrc, "z %d %lld", r, (long long)th_now_ms());
            redisReply *zr = redisCommand(lrc, "EVAL %s 2 x:%d redisson_countdownlatch__channel__{x:%d}",
                                          "redis.call('del', KEYS[1]) "
                                          "redis.call('publish', KEYS[2], '0') return 1",
                                          r, r);
            ASSERT_MSG(zr && zr->type == REDIS_REPLY_INTEGER, "the latch's final zero failed");
            freeReplyObject(zr);
            fl_ev(rrc, "j %d %lld", r, (long long)th_now_ms());
        }
    }
    /* every worker ends: a forever wait must be served once the others
     * stop (leases of killed holders run out) */
    int64_t grace = t0 + p.run_ms + 20000;
    for (int id = 0; id < nids; id++) {
        if (pid[id] <= 0) continue;
        for (;;) {
            siginfo_t si;
            memset(&si, 0, sizeof si);
            /* WNOWAIT: th_wait_child reaps it (the harness forgets it then) */
            if (waitid(P_PID, (id_t)pid[id], &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                si.si_pid == pid[id]) {
                int stt = th_wait_child(pid[id], 1000);
                if (stt != 0) {
                    printf("  VIOLATION worker %d exited with status %d\n", id, stt);
                    st->stuck++;
                }
                break;
            }
            if (th_now_ms() > grace) {
                printf("  VIOLATION worker %d still running 20 s after the run (stuck)\n", id);
                st->stuck++;
                kill(pid[id], SIGKILL);
                th_wait_child(pid[id], 5000);
                break;
            }
            th_sleep_ms(10);
        }
        pid[id] = 0;
    }
    if (psub) redisFree(psub);
    for (int id = 0; id < nids; id++)
        if (px[id].pid > 0) fl_proxy_stop(&px[id]);
    for (int id = 0; id < nids; id++)
        for (int nd = 0; nd < NODES; nd++)
            if (npx[id][nd].pid > 0) fl_proxy_stop(&npx[id][nd]);
    if (rpx.pid > 0) fl_proxy_stop(&rpx);
    int fail = check(rrc, &p, roles, nids, st, verbose);
    st->leftover = leftovers(lrc, &p);
    for (int nd = 1; rl && nd < NODES; nd++) {
        redisContext *nc = th_redis(node[nd]);
        st->leftover += leftovers(nc, &p);
        redisFree(nc);
    }
    if (st->leftover || st->stuck) fail = 1;
    int nasync = 0;
    char async_ids[128] = "";
    for (int id = 0; id < nids; id++)
        if (roles[id].async) {
            size_t len = strlen(async_ids);
            snprintf(async_ids + len, sizeof async_ids - len, "%s%d", nasync++ ? ", " : "", id);
        }
    st->async_seeds = nasync > 0;
    st->async_fail = nasync > 0 && fail;
    printf("seed %llu %s %s: ops %ld, faults %ld (%ld took effect), overlaps %ld (exempt %ld), "
           "stale writes accepted %ld, stale replies %ld, tokens not increasing %ld, short leases "
           "%ld, late lost callbacks %ld, no quorum %ld, unacknowledged acquires %ld, awaits at "
           "count > 0 %ld, liveness %ld, "
           "worst stall %lld ms, leftover keys %ld, acquire errors %ld, async workers %d, %lld s: "
           "%s\n",
           (unsigned long long)seed, TOPO_NAME[p.topo], KIND_NAME[p.kind], st->ops, st->faults,
           st->effective, st->overlaps, st->exempt, st->stale, st->proto, st->tokens, st->shortv,
           st->lostlate, st->noquorum, st->unacked, st->early, st->live, (long long)st->worst_stall,
           st->leftover, st->errors, nasync,
           (long long)((th_now_ms() - t0) / 1000), fail ? "FAIL" : "ok");
    /* the workers of the history's ids (a replacement has an id of its own)
     * that used the async API */
    if (fail && nasync) printf("  async workers (history ids): %s\n", async_ids);
    if (fail && !verbose) {
        print_plan(&p);
        printf("  rerun: test_explore --seed %llu\n", (unsigned long long)seed);
    }
    redisFree(lrc);
    redisFree(rrc);
    if (rl) {
        for (int nd = 0; nd < NODES; nd++) th_server_stop(node[nd]);
        th_server_stop(fence);
    } else {
        th_server_stop(primary0);
        th_server_stop(replica);
    }
    th_server_stop(res);
    return fail;
}

/* ------------------------------------------------------------------------ */

static stats g_tab[T_N][K_N];

static void print_table(void)
{
    printf("\n| topology | kind | seeds | operations | faults (took effect) | overlaps "
           "(exempt) | stale writes accepted | stale replies | tokens not increasing | short "
           "leases | late lost callbacks | no quorum | unacknowledged acquires | awaits at count > 0 | "
           "liveness | worst stall ms |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    stats all;
    memset(&all, 0, sizeof all);
    for (int t = 0; t < T_N; t++)
        for (int k = 0; k < K_N; k++) {
            stats *s = &g_tab[t][k];
            if (!s->seeds) continue;
            stat_add(&all, s);
            printf("| %s | %s | %ld | %ld | %ld (%ld) | %ld (%ld) | %ld | %ld | %ld | %ld | %ld | "
                   "%ld | %ld | %ld | %ld | %lld |\n", TOPO_NAME[t], KIND_NAME[k], s->seeds, s->ops,
                   s->faults, s->effective, s->overlaps, s->exempt, s->stale, s->proto, s->tokens,
                   s->shortv, s->lostlate, s->noquorum, s->unacked, s->early, s->live,
                   (long long)s->worst_stall);
        }
    printf("| all | all | %ld | %ld | %ld (%ld) | %ld (%ld) | %ld | %ld | %ld | %ld | %ld | %ld | "
           "%ld | %ld | %ld | %lld |\n", all.seeds, all.ops, all.faults, all.effective,
           all.overlaps, all.exempt, all.stale, all.proto, all.tokens, all.shortv, all.lostlate,
           all.noquorum, all.unacked, all.early, all.live, (long long)all.worst_stall);
    printf("\nfaults that took effect:");
    for (int i = 0; i < F_N; i++)
        printf(" %s %ld/%ld%s", FAULT_NAME[i], all.by_fault_eff[i], all.by_fault[i],
               i + 1 < F_N ? "," : "\n");
    printf("seeds with async workers: %ld (failed: %ld)\n", all.async_seeds, all.async_fail);
}

static void usage(void)
{
    fprintf(stderr, "usage: test_explore --seed N | --seeds LIST | --long SECONDS [--from N]\n"
                    "       [--kind K] [--topology T] [--async] [--stall-bound MS] [--plans]\n"
                    "  LIST: N or A-B, comma-separated (1-6,9,12-14)\n");
    exit(2);
}

static int find_name(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    fprintf(stderr, "unknown name \"%s\"\n", s);
    usage();
    return -1;
}

#define MAX_LIST 100000

int main(int argc, char **argv)
{
    static uint64_t list[MAX_LIST];
    size_t nl = 0;
    int have = 0, plans = 0, want_kind = -1, want_topo = -1, want_async = 0;
    int64_t long_s = 0;
    uint64_t from = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "--seed") || !strcmp(argv[i], "--seeds")) && i + 1 < argc) {
            have = !strcmp(argv[i], "--seed") ? 1 : 2;
            for (char *p = argv[++i]; *p;) {
                char *end;
                uint64_t x = strtoull(p, &end, 10), y = x;
                if (end == p) usage();
                if (*end == '-') {
                    p = end + 1;
                    y = strtoull(p, &end, 10);
                    if (end == p || y < x) usage();
                }
                for (uint64_t k = x; k <= y && nl < MAX_LIST; k++) list[nl++] = k;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') usage();
            }
        } else if (!strcmp(argv[i], "--long") && i + 1 < argc) {
            long_s = atoll(argv[++i]);
            have = 3;
        } else if (!strcmp(argv[i], "--plans")) {
            plans = 1;
        } else if (!strcmp(argv[i], "--from") && i + 1 < argc) {
            from = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--kind") && i + 1 < argc) {
            want_kind = find_name(KIND_NAME, K_N, argv[++i]);
        } else if (!strcmp(argv[i], "--topology") && i + 1 < argc) {
            want_topo = find_name(TOPO_NAME, T_N, argv[++i]);
        } else if (!strcmp(argv[i], "--async")) {
            want_async = 1;
        } else if (!strcmp(argv[i], "--stall-bound") && i + 1 < argc) {
            g_stall_bound = atoll(argv[++i]);
        } else {
            usage();
        }
    }
    if (!have || (have != 3 && !nl)) usage();
    if (plans) {
        for (size_t k = 0; k < nl; k++) {
            plan p;
            make_plan(list[k], &p);
            if ((want_kind < 0 || p.kind == want_kind) && (want_topo < 0 || p.topo == want_topo) &&
                (!want_async || plan_async(&p)))
                print_plan(&p);
        }
        return 0;
    }
    /* the harness's alarm: generous, a stuck seed still ends */
    if (!getenv("DLOCK_TEST_TIMEOUT")) {
        char t[32];
        snprintf(t, sizeof t, "%lld", (long long)(have == 3 ? long_s + 120 : (long long)nl * 45 + 60));
        setenv("DLOCK_TEST_TIMEOUT", t, 1);
    }
    th_init("explore");
    signal(SIGPIPE, SIG_IGN);
    long nfail = 0;
    char failed_list[2048] = "";
    size_t fl_len = 0;
    int64_t t_end = th_now_ms() + long_s * 1000;
    for (size_t k = 0;; k++) {
        uint64_t s;
        if (have == 3) {
            if (th_now_ms() >= t_end) break;
            s = from + k;
        } else {
            if (k >= nl) break;
            s = list[k];
        }
        plan p;
        make_plan(s, &p);
        if ((want_kind >= 0 && p.kind != want_kind) || (want_topo >= 0 && p.topo != want_topo) ||
            (want_async && !plan_async(&p)))
            continue;
        stats st;
        int f = run_seed(s, have == 1, &st);
        stat_add(&g_tab[p.topo][p.kind], &st);
        if (f) {
            nfail++;
            if (fl_len + 24 < sizeof failed_list)
                fl_len += (size_t)snprintf(failed_list + fl_len, sizeof failed_list - fl_len,
                                           "%s%llu", nfail > 1 ? "," : "", (unsigned long long)s);
        }
        fflush(stdout);
    }
    if (have != 1) {
        print_table();
        printf("failing seeds: %ld%s%s\n", nfail, nfail ? ": " : "", failed_list);
    }
    return nfail ? 1 : 0;
}
