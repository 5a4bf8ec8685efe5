/* dlock benchmarks: shared helpers.
 *
 * The benchmark program (dlock_bench) is a set of scenarios run one after the
 * other against one redis-server that the driver (bench/run.sh) started. Each
 * scenario measures dlock beside a raw hiredis baseline in the same run, with
 * rounds alternating between the two so that machine noise hits both alike,
 * and records its figures as named metrics (printed as a table, optionally
 * written as JSON). Targets are checked on the metrics at the end and printed
 * as PASS/WARN lines; they are never asserted (these machines are noisy).
 *
 * Adding a scenario (issue 7's suite): write `int bench_<name>(bench_ctx *)`
 * in its own file, declare it here, add it to the table in main.c. Two
 * engines help: procs.c (K worker processes, persistent across rounds) and
 * rounds.c (in-process series in alternating rounds).
 */
#ifndef DLOCK_BENCH_H
#define DLOCK_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

typedef struct bench_ctx {
    const char *host;
    int port;
    int quick;          /* CI mode: short, asserts no timings */
    int verbose;
    const char *series; /* comma-separated series to run (NULL: all), for profiling */
    /* comma-separated ports of 5 further independent redis-servers on host,
     * for the redlock scenario (run.sh starts them); NULL: redlock skipped */
    const char *redlock_ports;
    /* comma-separated ports of a 3-master Redis Cluster on host, for the
     * cluster scenario (run.sh creates it); NULL: cluster skipped */
    const char *cluster_ports;
    /* NAME=URL,NAME=URL,... of the other backends (issue 9), for the backends
     * scenario (run.sh starts the servers); NULL: backends skipped */
    const char *backend_urls;
} bench_ctx;

/* 1 if series `name` is selected by ctx->series. */
int bench_series_on(const bench_ctx *ctx, const char *name);
/* 1 if name is in the comma-separated list (NULL list: everything). */
/* Reads exactly len bytes from fd, waiting at most timeout_ms for each
 * chunk; writes exactly len bytes. 0, or -1 on error, EOF or timeout. */
int bench_read_full(int fd, void *buf, size_t len, int timeout_ms);
int bench_write_full(int fd, const void *buf, size_t len);
/* Blocked waiters of lock name, as the server shows them: subscribers of its
 * unlock channel (reentrant) plus the plain lock's registered and the fair
 * lock's queued waiters subscribed to their own channel
 * "redisson_lock__channel:{name}:<id>" (a waiter that got the lock keeps its
 * channel subscribed a while, so a subscribed channel alone is no waiter).
 * -1 on a connection error. */
long long bench_lock_waiters(redisContext *rc, const char *name);
/* The contention scenarios' critical section, a read-modify-write that
 * only the lock protects: GET counter, then SET it to the value + 1, on rc.
 * 0, or -1 when a command failed. */
int bench_counter_step(redisContext *rc, const char *counter);
/* GET key as an integer: 0 when it is missing, -1 on a failure. */
long long bench_get_int(redisContext *rc, const char *key);
/* Forks with two pipes between parent and child (output flushed first).
 * In the child (*pid 0) fds[0] reads what the parent writes and fds[1]
 * writes what it reads; in the parent fds[0] writes to the child and fds[1]
 * reads from it. 0, or -1 (reported; nothing left open). */
int bench_fork_piped(pid_t *pid, int fds[2]);
int bench_in_list(const char *list, const char *name);

/* ---- time ---- */
int64_t bench_now_ns(void);                 /* CLOCK_MONOTONIC */
void bench_sleep_us(int64_t us);

/* ---- samples and statistics ---- */
typedef struct bench_samples {
    int64_t *v;         /* nanoseconds (or any unit) */
    size_t n, cap;
} bench_samples;

int bench_samples_add(bench_samples *s, int64_t v);   /* 0, or -1 out of memory */
int bench_samples_append(bench_samples *dst, const bench_samples *src);
void bench_samples_free(bench_samples *s);
/* q in [0,1], nearest-rank on a sorted copy; 0 when empty. Sorts s in place. */
int64_t bench_samples_quantile(bench_samples *s, double q);
int64_t bench_samples_max(const bench_samples *s);
double bench_median_d(const double *v, size_t n);    /* copies, does not reorder */
/* The series to run k-th (0..n-1) in round `round`: a Williams square, so
 * that over n rounds (2n for odd n) every series runs right after every
 * other one equally often. A plain rotation (k + round) % n always puts the
 * same series after the same one, and this kind of machine carries state
 * from one series into the next: in peer_pairs, where raw always ran right
 * after node-redlock, dlock read 0.79x raw twice; in this order, in the same
 * hour, 0.95x and 0.98x (docs/benchmarks.md). */
int bench_order(int round, int k, int n);

/* ---- metrics: every reported figure ---- */
/* scenario: "pairs", "handoff"...; series: "raw", "dlock", "dlock-reentrant"...;
 * name: "pairs_per_s", "p50_us"...; unit: "1/s", "us"... */
void bench_metric(const char *scenario, const char *series, const char *name, double value,
                  const char *unit);
/* Looks a metric up; returns 0 and sets *value when found, else -1. */
int bench_metric_get(const char *scenario, const char *series, const char *name, double *value);
/* Writes every metric and the context as a JSON document to path ("-": stdout). */
int bench_write_json(const char *path, const bench_ctx *ctx, const char *machine);
void bench_metrics_free(void);

/* ---- raw hiredis helpers ---- */
/* Connects with a 2 s timeout and TCP_NODELAY (hiredis sets it for TCP). NULL
 * with a message on stderr on failure. */
redisContext *bench_redis_connect(const bench_ctx *ctx);
/* Runs a command (argv, NUL-terminated strings) and returns the reply, or NULL
 * with a message on stderr. */
redisReply *bench_redis_cmd(redisContext *rc, int argc, const char **argv);
/* Fills out with 2*nbytes hex characters from a fast PRNG (not for security:
 * the raw baseline's token; dlock uses getrandom). */
void bench_fast_hex(char *out, size_t nbytes);

/* ---- worker processes (procs.c): contention, rwlock ---- */
typedef struct bench_procs_spec {
    /* in the child: its own connections; *state for op and teardown */
    int (*setup)(const bench_ctx *ctx, int idx, void **state);
    /* one operation; 0 or -1 (message on stderr); *wait_ns: its wait */
    int (*op)(void *state, int64_t *wait_ns);
    void (*teardown)(void *state);
    int record_waits;   /* send every operation's wait back */
} bench_procs_spec;

typedef struct bench_procs {
    int k;
    pid_t *pid;
    int *wfd, *rfd;
} bench_procs;

/* Forks k workers and waits until each ran setup. 0, or -1 (all stopped). */
int bench_procs_start(const bench_ctx *ctx, const bench_procs_spec *spec, int k,
                      bench_procs *p);
/* One round: every worker runs op from start_ns until end_ns (monotonic).
 * ops[i], finish_ns[i]: worker i's count and end; waits (may be NULL) gets
 * every wait. 0, or -1 when a worker failed. */
int bench_procs_round(bench_procs *p, int64_t start_ns, int64_t end_ns, int64_t *ops,
                      int64_t *finish_ns, bench_samples *waits);
/* Stops and reaps the workers (kill_it: SIGTERM too). -1 if one failed. */
int bench_procs_stop(bench_procs *p, int kill_it);

/* ---- peer workers (peers.c): another program driven by a line protocol
 * on its stdin / stdout (the scripts in bench/peers: "hello ..." or "skip <reason>" at
 * start, "clock" -> "clock <CLOCK_MONOTONIC ns>", then the scenario's
 * commands) ---- */
typedef struct bench_peer {
    pid_t pid;
    int wfd, rfd;
    char *buf;
    size_t len, cap, consumed;
    int64_t offset; /* worker clock - driver clock */
} bench_peer;

/* The directory of the worker scripts ($DLOCK_BENCH_PEERS_DIR or the
 * source tree's bench/peers). */
const char *bench_peers_dir(void);
/* Starts argv (argv[0] looked up in PATH) with pipes on its stdin and
 * stdout; an exec failure makes the worker say "skip cannot run ...". 0 or
 * -1. */
int bench_peer_exec(bench_peer *p, char *const argv[]);
/* Sends one line (printf format, newline added). 0 or -1. */
int bench_peer_send(bench_peer *p, const char *fmt, ...);
/* The next line (valid until the next call), NULL on timeout or EOF. */
char *bench_peer_line(bench_peer *p, int timeout_ms);
/* Measures the worker's clock offset (15 "clock" exchanges, the closest
 * kept; 0 within its uncertainty, else printed with what). 0 or -1. */
int bench_peer_clock(bench_peer *p, const char *what);
/* Sends "quit", waits up to 3 s, then SIGKILL; frees the buffer. */
void bench_peer_stop(bench_peer *p);
/* Parses a worker's "ok <a> <b> <v> <v> ..." line (l may be NULL: -1):
 * the v (microseconds) go to out as ns when out is not NULL. 0, or -1 when
 * l is no such line. */
int bench_peer_parse_ok(char *l, long long *a, long long *b, bench_samples *out);

/* ---- in-process series in alternating rounds (rounds.c) ---- */
typedef struct bench_rounds_spec {
    const char *scenario;
    int nseries;
    const char *const *series;  /* series names */
    int base;                   /* ratios are against this series */
    const char *rate_name;      /* metric of the rate: "pairs_per_s", "ids_per_s" */
    int rounds, warmup;         /* rounds; operations before each timed run */
    int64_t round_ns;           /* time per series per round */
    /* one operation of series s; *ns its latency; 0 or -1 */
    int (*op)(void *state, int s, int64_t *ns);
    void *state;
} bench_rounds_spec;

/* Runs, prints the table, records rate (median, min, max), p50/p99/max
 * latency, ratio_to_<base> (median per-round ratio) and p50_ratio. */
int bench_rounds_run(const bench_ctx *ctx, const bench_rounds_spec *spec);

/* ---- output ---- */
void bench_fmt_num(char *buf, size_t len, double v);  /* 5,512 / 260.4 */

/* ---- scenarios ---- */
int bench_ping(bench_ctx *ctx);
int bench_pairs(bench_ctx *ctx);
int bench_handoff(bench_ctx *ctx);
int bench_handoff_fair(bench_ctx *ctx);   /* in handoff.c: the same method */
int bench_contention(bench_ctx *ctx);
int bench_rwlock(bench_ctx *ctx);
int bench_semaphore(bench_ctx *ctx);
int bench_redlock(bench_ctx *ctx);
int bench_cluster(bench_ctx *ctx);
int bench_idworker(bench_ctx *ctx);
/* issue 7: peers.c and extra.c */
int bench_peer_pairs(bench_ctx *ctx);
int bench_peer_handoff(bench_ctx *ctx);
int bench_peer_contention(bench_ctx *ctx);
int bench_redis_benchmark(bench_ctx *ctx);
int bench_watchdog(bench_ctx *ctx);
int bench_memory(bench_ctx *ctx);
int bench_server_time(bench_ctx *ctx);
/* issue 9: backends.c */
int bench_backends(bench_ctx *ctx);
/* issue 24: async.c, the async API */
int bench_async_waits(bench_ctx *ctx);
int bench_async_pairs(bench_ctx *ctx);
int bench_async_handoff(bench_ctx *ctx);

#endif
