/* `dlock run` inside (cmd_run.c): its options, the state it shares with the
 * locker thread (run_locker.c), and the command's process tree
 * (run_child.c). The threads and signals are described in cmd_run.c. */
#ifndef DLOCK_CLI_RUN_H
#define DLOCK_CLI_RUN_H

#include <signal.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "cmds.h"

#define LOST_SESSION 101 /* our own reason: a session-kept hold's check said not held */
#define LOST_UNANSWERED 102 /* ... or got no answer */
/* How often a hold kept by a session (MySQL GET_LOCK, PostgreSQL advisory
 * locks: no lease, no renewal, nothing that calls back) is asked about. */
#define SESSION_CHECK_MS 1000
/* A validity this long is a session's (it never runs out by itself). */
#define SESSION_VALID_MS (100LL * 365 * 24 * 3600 * 1000)
#define MSG_MAX 256
#define MAX_ALSO 64

typedef struct run_opts {
    int64_t wait_ms;
    int conflict;
    int64_t ttl_ms;
    dlock_kind kind;
    const char *kind_opt; /* the option that set kind ("--kind", "-s", "-x"), or NULL */
    int64_t kill_after_ms;
    const char *shell; /* -c */
    const char *name;
    char **argv;       /* COMMAND [ARGS...] (NULL with -c) */
    long limit;        /* --limit N, 0: none */
    const char *also[MAX_ALSO]; /* --also NAME2... */
    size_t nalso;
} run_opts;

/* State shared with the locker thread (hand-offs go through the pipes). */
typedef struct locker {
    dlock_lock **locks; /* NAME, then the --also locks (none with --limit) */
    size_t nlocks;
    uint64_t *fences;   /* one per lock */
    dlock_permits *permits; /* --limit */
    dlock_semaphore *sem;   /* --limit where permits belong to a session (ZooKeeper) */
    int64_t limit;
    char permit_id[DLOCK_PERMIT_ID_LEN + 1];
    int64_t wait_ms;
    int acquire_rc;
    uint64_t fence;     /* NAME's fencing token */
    int64_t took_us;
    char acquire_msg[MSG_MAX];
    int release_rc;
    char release_msg[MSG_MAX];
    int cmd_pipe[2];  /* main -> locker: "release now" (or EOF) */
    int done_pipe[2]; /* locker -> main: 'a' acquire done, 'r' release done */
    /* the session checker (session_main) */
    int check_stop[2]; /* main -> checker: stop (a byte, or EOF) */
    int lost_fd;       /* checker -> main: the reason, as the lost callbacks */
    atomic_int session_lost; /* 1 + the index of the lock it found lost, 0 none */
    /* locks kept by a session, set before the checker starts: while it runs
     * it alone touches those handles (a check may mark one lost) */
    unsigned char session_kept[MAX_ALSO + 1];
} locker;

typedef struct child_setup {
    const run_opts *o;
    char **env;
    sigset_t oldmask;
    struct sigaction oldpipe;
    pid_t parent;
    int errfd;  /* write end of the exec-error pipe (close-on-exec) */
    int tty;    /* the terminal whose foreground the command takes, or -1 */
    int pdeath; /* no reaper: SIGTERM the command itself when dlock dies */
} child_setup;

/* ---- run_locker.c: the locker thread and the session checker ---- */
int64_t run_now_us(void);
void run_write_byte(int fd, char b);
int run_read_byte(int fd, char *b);
void run_copy_msg(char *dst, const char *src);
const char *run_locks_errmsg(const locker *lk);
void *run_locker_main(void *arg);
int run_readable_within(int fd, int ms);
int run_give_up_waiting(locker *lk);
void *run_session_main(void *arg);
void run_on_lost(dlock_lock *l, int reason, void *userdata);
void run_on_permit_lost(dlock_permits *p, const char *id, int reason, void *userdata);
void run_on_sem_lost(dlock_semaphore *s, int reason, void *userdata);

/* ---- run_child.c: the command and its process tree ---- */
int run_exec_check(const char *file);
char **run_child_env(const char *name, uint64_t fence, const char *permit);
void run_free_env(char **env);
void run_child_exec(const child_setup *cs);
int run_group_alive(pid_t pg);
int run_signal_tree(pid_t pg, pid_t skip, int sig);
void run_sleep_ms(long ms);
pid_t run_start_reaper(const run_opts *o, int *fd);

#endif
