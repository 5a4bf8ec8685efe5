/* Worker processes for the multi-process scenarios (contention, rwlock).
 *
 * bench_procs_start forks K children; each runs spec->setup (its own dlock
 * client and hiredis connection: nothing is shared across fork), says ready,
 * then waits for rounds. A round is (start, end) on CLOCK_MONOTONIC: every
 * child sleeps until start, runs spec->op until end, and sends back its
 * operation count, the time its last operation finished and, if asked, the
 * wait of every operation. Processes persist across rounds, so per-process
 * totals add up over the whole measured time.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define PIPE_TIMEOUT_MS 60000
#define MAX_WAITS_PER_ROUND 2000000

typedef struct round_cmd {
    char op; /* 'r' round, 'q' quit */
    int64_t start_ns, end_ns;
} round_cmd;

typedef struct round_res {
    int32_t status;
    int64_t ops, finish_ns, nwaits;
} round_res;

static int child_main(const bench_ctx *ctx, const bench_procs_spec *spec, int idx, int cmd_fd,
                      int res_fd) {
    void *state = NULL;
    int failed = spec->setup(ctx, idx, &state) != 0;
    char ready = failed ? 'f' : 'r';
    if (bench_write_full(res_fd, &ready, 1) || failed) {
        if (state) spec->teardown(state);
        return 1;
    }
    bench_samples waits = {0};
    for (;;) {
        round_cmd cmd;
        if (bench_read_full(cmd_fd, &cmd, sizeof cmd, -1) || cmd.op != 'r') break;
        waits.n = 0;
        round_res res;
        memset(&res, 0, sizeof res); /* padding too: it goes down a pipe */
        bench_sleep_us((cmd.start_ns - bench_now_ns()) / 1000);
        int64_t now = bench_now_ns();
        while (!res.status && now < cmd.end_ns) {
            int64_t w = 0;
            if (spec->op(state, &w)) {
                res.status = 1;
                break;
            }
            res.ops++;
            if (spec->record_waits && waits.n < MAX_WAITS_PER_ROUND &&
                bench_samples_add(&waits, w))
                res.status = 1;
            now = bench_now_ns();
        }
        res.finish_ns = now;
        res.nwaits = spec->record_waits ? (int64_t)waits.n : 0;
        if (bench_write_full(res_fd, &res, sizeof res)) break;
        if (res.nwaits && bench_write_full(res_fd, waits.v, (size_t)res.nwaits * sizeof *waits.v))
            break;
        if (res.status) failed = 1;
    }
    bench_samples_free(&waits);
    spec->teardown(state);
    return failed;
}

int bench_procs_start(const bench_ctx *ctx, const bench_procs_spec *spec, int k,
                      bench_procs *p) {
    memset(p, 0, sizeof *p);
    p->pid = calloc((size_t)k, sizeof *p->pid);
    p->wfd = calloc((size_t)k, sizeof *p->wfd);
    p->rfd = calloc((size_t)k, sizeof *p->rfd);
    if (!p->pid || !p->wfd || !p->rfd) {
        fprintf(stderr, "dlock_bench: out of memory\n");
        bench_procs_stop(p, 1);
        return -1;
    }
    int failed = 0;
    for (int i = 0; i < k && !failed; i++) {
        int a2b[2], b2a[2];
        if (pipe(a2b)) {
            failed = 1;
            break;
        }
        if (pipe(b2a)) {
            close(a2b[0]);
            close(a2b[1]);
            failed = 1;
            break;
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            perror("dlock_bench: fork");
            close(a2b[0]), close(a2b[1]), close(b2a[0]), close(b2a[1]);
            failed = 1;
            break;
        }
        if (pid == 0) {
            close(a2b[1]);
            close(b2a[0]);
            /* the pipes of the siblings forked before: not ours */
            for (int j = 0; j < p->k; j++) {
                close(p->wfd[j]);
                close(p->rfd[j]);
            }
            _exit(child_main(ctx, spec, i, a2b[0], b2a[1]));
        }
        close(a2b[0]);
        close(b2a[1]);
        p->pid[i] = pid;
        p->wfd[i] = a2b[1];
        p->rfd[i] = b2a[0];
        p->k = i + 1;
    }
    for (int i = 0; i < p->k && !failed; i++) {
        char ready = 0;
        if (bench_read_full(p->rfd[i], &ready, 1, PIPE_TIMEOUT_MS) || ready != 'r') {
            fprintf(stderr, "dlock_bench: worker process %d failed to start\n", i);
            failed = 1;
        }
    }
    if (failed) {
        bench_procs_stop(p, 1);
        return -1;
    }
    return 0;
}

int bench_procs_round(bench_procs *p, int64_t start_ns, int64_t end_ns, int64_t *ops,
                      int64_t *finish_ns, bench_samples *waits) {
    round_cmd cmd;
    memset(&cmd, 0, sizeof cmd);
    cmd.op = 'r';
    cmd.start_ns = start_ns;
    cmd.end_ns = end_ns;
    for (int i = 0; i < p->k; i++)
        if (bench_write_full(p->wfd[i], &cmd, sizeof cmd)) return -1;
    int failed = 0;
    int timeout = (int)((end_ns - bench_now_ns()) / 1000000) + PIPE_TIMEOUT_MS;
    for (int i = 0; i < p->k; i++) {
        round_res res;
        if (bench_read_full(p->rfd[i], &res, sizeof res, timeout)) {
            fprintf(stderr, "dlock_bench: worker process %d did not report\n", i);
            return -1;
        }
        if (res.status) {
            fprintf(stderr, "dlock_bench: worker process %d failed in the round\n", i);
            failed = 1;
        }
        ops[i] = res.ops;
        finish_ns[i] = res.finish_ns;
        for (int64_t j = 0; j < res.nwaits; j++) {
            int64_t w;
            if (bench_read_full(p->rfd[i], &w, sizeof w, PIPE_TIMEOUT_MS)) return -1;
            if (waits && bench_samples_add(waits, w)) failed = 1;
        }
    }
    return failed ? -1 : 0;
}

int bench_procs_stop(bench_procs *p, int kill_it) {
    int failed = 0;
    round_cmd q;
    memset(&q, 0, sizeof q);
    q.op = 'q';
    for (int i = 0; i < p->k; i++) {
        bench_write_full(p->wfd[i], &q, sizeof q);
        close(p->wfd[i]);
        close(p->rfd[i]);
        if (kill_it) kill(p->pid[i], SIGTERM);
    }
    for (int i = 0; i < p->k; i++) {
        int status = 0;
        while (waitpid(p->pid[i], &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status)) failed = 1;
    }
    free(p->pid);
    free(p->wfd);
    free(p->rfd);
    memset(p, 0, sizeof *p);
    return failed ? -1 : 0;
}
