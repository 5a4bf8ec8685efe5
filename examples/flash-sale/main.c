/*
 * flash-sale: the seeds' story in one run.
 *
 * A voucher with little stock, many users, several service instances (worker
 * processes, each with a few threads) and a real SQL database. The same buy
 * attempts are replayed under five strategies, each from fresh stock:
 *
 *   none        check stock, then decrement: oversells, duplicate orders
 *   local       the same inside a per-process mutex: still oversells
 *   dlock       per-user and per-voucher dlock locks: correct
 *   optimistic  UPDATE ... WHERE stock > 0 + UNIQUE (user, voucher): correct
 *   fenced      dlock + the fencing token checked by the database write:
 *               correct even when a holder pauses past its lease
 *
 * See docs/flash-sale.md.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flash_sale.h"

#define MAX_WORKERS 256
#define EXIT_WRONG 1
#define EXIT_SETUP 2

const char *const mode_names[M_COUNT] = {"none", "local", "dlock", "optimistic", "fenced"};

typedef struct result {
    enum mode m;
    long long orders, stock_left, oversold, duplicates, expected, errors, stale, lost, retries;
    double seconds, throughput, p99_ms;
    int ok, must_be_ok;
} result;

/* ---- cleanup, also from a signal handler (only async-signal-safe calls) ---- */
static pid_t g_pids[MAX_WORKERS];
static tempredis g_redis = {.pid = -1};
static char g_dir[1024];
static char g_files[6][PATH_MAX + 16];
static int g_nfiles;

static void cleanup_now(int from_signal) {
    for (int i = 0; i < MAX_WORKERS; i++)
        if (g_pids[i] > 0) kill(g_pids[i], SIGKILL);
    for (int i = 0; i < MAX_WORKERS; i++)
        if (g_pids[i] > 0) {
            waitpid(g_pids[i], NULL, 0);
            g_pids[i] = 0;
        }
    if (g_redis.pid > 0) {
        if (from_signal) {
            kill(g_redis.pid, SIGKILL);
            waitpid(g_redis.pid, NULL, 0);
            g_redis.pid = -1;
        } else {
            tempredis_stop(&g_redis);
        }
    }
    for (int i = 0; i < g_nfiles; i++) unlink(g_files[i]);
    g_nfiles = 0;
    if (g_dir[0]) {
        rmdir(g_dir);
        g_dir[0] = '\0';
    }
}

static void on_signal(int sig) {
    cleanup_now(1);
    static const char msg[] = "flash-sale: interrupted; temporary server and files removed\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(128 + sig);
}

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("flash-sale: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cleanup_now(0);
    exit(EXIT_SETUP);
}

/* ---- arguments ---- */
static void usage(FILE *f) {
    fputs(
        "usage: flash-sale [options]\n"
        "\n"
        "Replays one flash sale (many users, little stock, several service processes)\n"
        "under five strategies and shows which ones oversell or let a user order twice.\n"
        "\n"
        "  --url URL           Redis to use (default: a throwaway redis-server on a free\n"
        "                      port, stopped and removed at the end)\n"
        "  --redis-server PATH redis-server binary for the throwaway server\n"
        "  --db DB             database: sqlite (default: a temporary file), sqlite:PATH\n"
        "                      or mysql://user:pass@host:port/db (MariaDB or MySQL over\n"
        "                      TCP, one connection per worker thread); the tables\n"
        "                      vouchers and orders are dropped and recreated\n",
        f);
    if (!store_have_mysql())
        fputs("                      (mysql:// is not built in this version)\n", f);
    fputs(
        "  --workers P         worker processes (default 8)\n"
        "  --threads T         threads per worker process (default 2)\n"
        "  --attempts B        buy attempts in all (default 2000)\n"
        "  --users U           distinct users (default 300); a user clicks 1-4 times\n"
        "  --vouchers V        vouchers on sale (default 1, the seeds' single voucher)\n"
        "  --stock S           stock of each voucher (default 100)\n"
        "  --mode M            run only M: none, local, dlock, optimistic or fenced\n"
        "  --window-us N       business logic time between check and act (default 2000)\n"
        "  --pause-holder      the lock holder that sees the last unit pauses past its\n"
        "                      lease (as in a GC pause); dlock then oversells, fenced not\n"
        "  --seed N            seed of the attempt plan (default 42)\n"
        "  --json              print one JSON object on stdout instead of the table\n"
        "  --help              this text\n"
        "\n"
        "Exit status: 0 when every mode that must be correct (dlock, optimistic, fenced;\n"
        "dlock not with --pause-holder) was; 1 when one was not; 2 on bad input or a\n"
        "setup failure.\n",
        f);
}

static int parse_int(const char *opt, const char *s, long min, long max) {
    if (!s) die("%s needs a value (see --help)", opt);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        die("%s: '%s' is not a whole number in %ld..%ld", opt, s, min, max);
    return (int)v;
}

/* hides the user and password of a URL (for messages); the last '@' ends
 * them, as a password may hold an unencoded '@' */
static void redact(const char *url, char *buf, size_t len) {
    const char *scheme = strstr(url, "://");
    const char *at = strrchr(url, '@');
    if (scheme && at && at > scheme)
        snprintf(buf, len, "%.*s***%s", (int)(scheme + 3 - url), url, at);
    else
        snprintf(buf, len, "%s", url);
}

/* ---- the attempt plan ---- */
static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Users click "buy" 1-4 times in quick succession (the seeds' test sends many
 * requests of one user at once). Returns the orders a correct run places:
 * per voucher, min(stock, users who tried it). */
static long long make_plan(const config *cfg, shared *sh, uint64_t seed) {
    rng_state = seed ? seed : 42;
    int i = 0;
    while (i < cfg->attempts) {
        int u = (int)(rnd() % (uint64_t)cfg->users) + 1;
        int v = (int)(rnd() % (uint64_t)cfg->vouchers) + 1;
        int clicks = 1 + (int)(rnd() % 4);
        for (int k = 0; k < clicks && i < cfg->attempts; k++, i++) {
            sh->user[i] = u;
            sh->voucher[i] = v;
        }
    }
    uint64_t *pairs = malloc(sizeof *pairs * (size_t)cfg->attempts);
    if (!pairs) die("out of memory");
    for (i = 0; i < cfg->attempts; i++)
        pairs[i] = (uint64_t)sh->voucher[i] << 32 | (uint32_t)sh->user[i];
    qsort(pairs, (size_t)cfg->attempts, sizeof *pairs, cmp_u64);
    long long expected = 0, distinct = 0;
    uint64_t cur = UINT64_MAX;
    for (i = 0; i < cfg->attempts; i++) {
        uint64_t v = pairs[i] >> 32;
        if (v != cur) {
            if (cur != UINT64_MAX) expected += distinct < cfg->stock ? distinct : cfg->stock;
            cur = v;
            distinct = 0;
        }
        if (i == 0 || pairs[i] != pairs[i - 1]) distinct++;
    }
    expected += distinct < cfg->stock ? distinct : cfg->stock;
    free(pairs);
    return expected;
}

/* ---- one mode ---- */
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void progress(const char *name, long done, long total, int tty) {
    if (!tty) return;
    int width = 30, fill = total ? (int)(done * width / total) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
    bar[width] = '\0';
    fprintf(stderr, "\r  %-10s [%s] %7ld/%ld", name, bar, done, total);
    fflush(stderr);
}

static void run_mode(const config *cfg, shared *sh, enum mode m, long long expected, result *res) {
    char err[512];
    if (store_reset(cfg->db, cfg->vouchers, cfg->stock, m == M_OPTIMISTIC, err, sizeof err))
        die("%s", err);
    atomic_store(&sh->next, 0);
    atomic_store(&sh->done, 0);
    atomic_store(&sh->ready, 0);
    atomic_store(&sh->go, 0);
    atomic_store(&sh->pause_claimed, 0);
    atomic_store(&sh->stale, 0);
    atomic_store(&sh->errors, 0);
    atomic_store(&sh->lost, 0);
    atomic_store(&sh->retries, 0);
    atomic_store(&sh->fatal, 0);
    atomic_store(&sh->end_us, 0);
    atomic_store(&sh->errmsg_set, 0);
    sh->errmsg[0] = '\0';
    memset(sh->outcome, 0, (size_t)cfg->attempts);

    int tty = isatty(2);
    const char *name = mode_names[m];
    if (!tty)
        fprintf(stderr, "flash-sale: mode %s: %d processes x %d threads, %d attempts\n", name,
                cfg->workers, cfg->threads, cfg->attempts);
    fflush(NULL);
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    for (int i = 0; i < cfg->workers; i++) {
        sigprocmask(SIG_BLOCK, &block, &old);
        pid_t pid = fork();
        if (pid == 0) {
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGHUP, SIG_DFL);
            sigprocmask(SIG_SETMASK, &old, NULL);
            exit(worker_main(cfg, sh, m, i)); /* exit: leak checkers see workers too */
        }
        if (pid > 0) g_pids[i] = pid;
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (pid < 0) die("fork: %s", strerror(errno));
    }
    /* start together once every thread has its connections */
    int want = cfg->workers * cfg->threads;
    int64_t t_setup = now_us();
    while (atomic_load(&sh->ready) < want && !atomic_load(&sh->fatal)) {
        for (int i = 0; i < cfg->workers; i++) {
            int st;
            if (g_pids[i] > 0 && waitpid(g_pids[i], &st, WNOHANG) == g_pids[i]) {
                g_pids[i] = 0;
                atomic_store(&sh->fatal, 1);
            }
        }
        if (now_us() - t_setup > 30000000) {
            atomic_store(&sh->fatal, 1);
            break;
        }
        usleep(1000);
    }
    int64_t t0 = now_us();
    atomic_store(&sh->go, 1);
    int running = cfg->workers, bad = 0;
    while (running > 0) {
        for (int i = 0; i < cfg->workers; i++) {
            int st;
            if (g_pids[i] > 0 && waitpid(g_pids[i], &st, WNOHANG) == g_pids[i]) {
                g_pids[i] = 0;
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
            }
        }
        running = 0;
        for (int i = 0; i < cfg->workers; i++) running += g_pids[i] > 0;
        progress(name, atomic_load(&sh->done), cfg->attempts, tty);
        if (running) usleep(50000);
    }
    int64_t t1 = atomic_load(&sh->end_us);
    if (t1 < t0) t1 = now_us();
    if (tty) fprintf(stderr, "  %.2f s\n", (double)(t1 - t0) / 1e6);
    if (atomic_load(&sh->fatal) || bad)
        die("mode %s: %s", name, sh->errmsg[0] ? sh->errmsg : "a worker process failed");

    store_stats st;
    if (store_stats_read(cfg->db, cfg->stock, &st, err, sizeof err)) die("%s", err);
    memset(res, 0, sizeof *res);
    res->m = m;
    res->orders = st.orders;
    res->stock_left = st.stock_left;
    res->oversold = st.oversold;
    res->duplicates = st.duplicates;
    res->expected = expected;
    res->errors = atomic_load(&sh->errors);
    res->stale = atomic_load(&sh->stale);
    res->lost = atomic_load(&sh->lost);
    res->retries = atomic_load(&sh->retries);
    res->seconds = (double)(t1 - t0) / 1e6;
    res->throughput = res->seconds > 0 ? cfg->attempts / res->seconds : 0;
    float *lat = malloc(sizeof *lat * (size_t)cfg->attempts);
    if (!lat) die("out of memory");
    memcpy(lat, sh->latency_us, sizeof *lat * (size_t)cfg->attempts);
    qsort(lat, (size_t)cfg->attempts, sizeof *lat, cmp_float);
    size_t k = (size_t)((cfg->attempts * 99 + 99) / 100); /* ceil(0.99 n) */
    res->p99_ms = lat[k > 0 ? k - 1 : 0] / 1000.0;
    free(lat);
    long long total = (long long)cfg->vouchers * cfg->stock;
    res->ok = res->oversold == 0 && res->duplicates == 0 && res->stock_left >= 0 &&
              res->orders + res->stock_left == total && res->errors == 0 &&
              res->orders == res->expected && st.dup_ids == 0;
    res->must_be_ok = m == M_OPTIMISTIC || m == M_FENCED || (m == M_DLOCK && !cfg->pause_holder);
    if (res->errors && sh->errmsg[0])
        fprintf(stderr, "flash-sale: mode %s: %lld attempts failed; first: %s\n", name,
                res->errors, sh->errmsg);
    if (!tty)
        fprintf(stderr, "flash-sale: mode %s: done in %.2f s\n", name, res->seconds);
}

/* ---- output ---- */
static void verdict(const result *r, const config *cfg, char *buf, size_t len) {
    char why[256] = "";
    size_t n = 0;
    long long total = (long long)cfg->vouchers * cfg->stock;
#define WHY(...) n += (size_t)snprintf(why + n, n < sizeof why ? sizeof why - n : 0, __VA_ARGS__)
    if (r->oversold) WHY("%soversold %lld", n ? ", " : "", r->oversold);
    if (r->duplicates) WHY("%s%lld duplicate orders", n ? ", " : "", r->duplicates);
    if (r->orders + r->stock_left != total) WHY("%sstock and orders disagree", n ? ", " : "");
    if (r->errors) WHY("%s%lld failed attempts", n ? ", " : "", r->errors);
    if (!r->oversold && r->orders < r->expected)
        WHY("%sundersold %lld", n ? ", " : "", r->expected - r->orders);
#undef WHY
    if (r->ok && r->must_be_ok)
        snprintf(buf, len, "correct%s", r->stale ? " (stale write rejected)" : "");
    else if (r->ok)
        snprintf(buf, len, "correct this time (the race did not show)");
    else if (!r->must_be_ok)
        snprintf(buf, len, "WRONG as expected: %s (%s)", why,
                 r->m == M_DLOCK ? "holder paused past its lease, no fencing"
                                 : "no lock across processes");
    else
        snprintf(buf, len, "FAILED: %s", why);
}

static void print_table(const result *rs, int n, const config *cfg) {
    printf("\n%d processes x %d threads, %d attempts by %d users, %d voucher%s x stock %d\n\n",
           cfg->workers, cfg->threads, cfg->attempts, cfg->users, cfg->vouchers,
           cfg->vouchers == 1 ? "" : "s", cfg->stock);
    printf("%-10s %7s %10s %8s %10s %11s %8s  %s\n", "mode", "orders", "stock left", "oversold",
           "duplicates", "attempts/s", "p99 ms", "verdict");
    for (int i = 0; i < n; i++) {
        char v[400];
        verdict(&rs[i], cfg, v, sizeof v);
        printf("%-10s %7lld %10lld %8lld %10lld %11.0f %8.2f  %s\n", mode_names[rs[i].m],
               rs[i].orders, rs[i].stock_left, rs[i].oversold, rs[i].duplicates,
               rs[i].throughput, rs[i].p99_ms, v);
    }
    for (int i = 0; i < n; i++)
        if (rs[i].stale)
            printf("\n%s: %lld write%s with a stale fencing token rejected by the database\n",
                   mode_names[rs[i].m], rs[i].stale, rs[i].stale == 1 ? "" : "s");
    for (int i = 0; i < n; i++)
        if (rs[i].retries)
            printf("\n%s: %lld transaction%s rolled back by the database as deadlock victim%s "
                   "and run again\n",
                   mode_names[rs[i].m], rs[i].retries, rs[i].retries == 1 ? "" : "s",
                   rs[i].retries == 1 ? "" : "s");
}

static void print_json(const result *rs, int n, const config *cfg) {
    printf("{\"modes\": [");
    for (int i = 0; i < n; i++) {
        const result *r = &rs[i];
        printf("%s{\"mode\": \"%s\", \"orders\": %lld, \"stock_left\": %lld, \"oversold\": %lld, "
               "\"duplicates\": %lld, \"throughput\": %.1f, \"p99_ms\": %.3f, \"ok\": %s, "
               "\"must_be_ok\": %s, \"expected_orders\": %lld, \"errors\": %lld, "
               "\"stale_rejected\": %lld, \"retries\": %lld, \"seconds\": %.3f}",
               i ? ", " : "", mode_names[r->m], r->orders, r->stock_left, r->oversold,
               r->duplicates, r->throughput, r->p99_ms, r->ok ? "true" : "false",
               r->must_be_ok ? "true" : "false", r->expected, r->errors, r->stale, r->retries,
               r->seconds);
    }
    printf("], \"workers\": %d, \"threads\": %d, \"attempts\": %d, \"users\": %d, "
           "\"vouchers\": %d, \"stock\": %d, \"pause_holder\": %s}\n",
           cfg->workers, cfg->threads, cfg->attempts, cfg->users, cfg->vouchers, cfg->stock,
           cfg->pause_holder ? "true" : "false");
}

int main(int argc, char **argv) {
    config cfg = {.workers = 8, .threads = 2, .attempts = 2000, .users = 300, .vouchers = 1,
                  .stock = 100, .window_us = 2000};
    const char *url = NULL, *db = NULL, *redis_bin = NULL;
    int json = 0, only = -1;
    uint64_t seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE() (i++, v ? v : (die("%s needs a value (see --help)", a), ""))
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--url")) url = TAKE();
        else if (!strcmp(a, "--db")) db = TAKE();
        else if (!strcmp(a, "--redis-server")) redis_bin = TAKE();
        else if (!strcmp(a, "--workers")) cfg.workers = parse_int(a, TAKE(), 1, MAX_WORKERS);
        else if (!strcmp(a, "--threads")) cfg.threads = parse_int(a, TAKE(), 1, 64);
        else if (!strcmp(a, "--attempts")) cfg.attempts = parse_int(a, TAKE(), 1, 10000000);
        else if (!strcmp(a, "--users")) cfg.users = parse_int(a, TAKE(), 1, 100000000);
        else if (!strcmp(a, "--vouchers")) cfg.vouchers = parse_int(a, TAKE(), 1, 100000);
        else if (!strcmp(a, "--stock")) cfg.stock = parse_int(a, TAKE(), 1, 1000000000);
        else if (!strcmp(a, "--window-us")) cfg.window_us = parse_int(a, TAKE(), 0, 1000000);
        else if (!strcmp(a, "--seed")) seed = (uint64_t)parse_int(a, TAKE(), 1, INT_MAX);
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--pause-holder")) cfg.pause_holder = 1;
        else if (!strcmp(a, "--mode")) {
            const char *name = TAKE();
            for (int m = 0; m < M_COUNT; m++)
                if (!strcmp(name, mode_names[m])) only = m;
            if (only < 0)
                die("--mode: unknown mode '%s' (none, local, dlock, optimistic, fenced)", name);
        } else {
            fprintf(stderr, "flash-sale: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return EXIT_SETUP;
        }
#undef TAKE
    }
    if ((long long)cfg.vouchers * cfg.stock > INT_MAX)
        die("--vouchers x --stock must stay below %d", INT_MAX);
    cfg.voucher_lease_ms = cfg.pause_holder ? 1000 : 10000;
    cfg.user_lease_ms = 15000;
    cfg.pause_ms = 2500;
    cfg.lock_wait_ms = 30000;
    cfg.verbose = !json;

    /* database choice before starting anything */
    char dbpath[PATH_MAX], dblabel[PATH_MAX + 32];
    int temp_db = 0, mysql = 0;
    if (!db || !strcmp(db, "sqlite") || !strcmp(db, "sqlite:")) {
        temp_db = 1;
    } else if (store_is_mysql(db)) {
        if (!store_have_mysql())
            die("--db %.*s...: MySQL/MariaDB support is not built in this version (built "
                "without libmariadb); use the default SQLite database",
                (int)(strchr(db, ':') - db + 3), db);
        mysql = 1;
        if (strlen(db) >= sizeof dbpath) die("--db: URL too long");
        snprintf(dbpath, sizeof dbpath, "%s", db);
        char safe[PATH_MAX];
        redact(db, safe, sizeof safe);
        snprintf(dblabel, sizeof dblabel, "MySQL/MariaDB %s", safe);
    } else if (!strncmp(db, "sqlite://", 9)) {
        snprintf(dbpath, sizeof dbpath, "%s", db + 9);
    } else if (!strncmp(db, "sqlite:", 7)) {
        snprintf(dbpath, sizeof dbpath, "%s", db + 7);
    } else if (strstr(db, "://")) {
        die("--db: unsupported database URL '%.*s...' (sqlite:PATH or mysql://...)",
            (int)(strstr(db, "://") - db + 3), db);
    } else {
        snprintf(dbpath, sizeof dbpath, "%s", db);
    }
    if (!temp_db && !dbpath[0]) die("--db: empty SQLite path");

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    const char *tmp = getenv("TMPDIR");
    if (tmp && strlen(tmp) > 900) tmp = NULL;
    snprintf(g_dir, sizeof g_dir, "%s/flash-sale.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        int e = errno;
        g_dir[0] = '\0';
        die("cannot create a temporary directory: %s", strerror(e));
    }
    snprintf(g_files[g_nfiles++], sizeof g_files[0], "%s/redis.log", g_dir);
    snprintf(g_files[g_nfiles++], sizeof g_files[0], "%s/dump.rdb", g_dir);
    if (temp_db) {
        snprintf(dbpath, sizeof dbpath, "%s/flash-sale.db", g_dir);
        snprintf(g_files[g_nfiles++], sizeof g_files[0], "%s", dbpath);
        snprintf(g_files[g_nfiles++], sizeof g_files[0], "%s-wal", dbpath);
        snprintf(g_files[g_nfiles++], sizeof g_files[0], "%s-shm", dbpath);
    }
    cfg.db = dbpath;
    if (!mysql) snprintf(dblabel, sizeof dblabel, "SQLite %s", dbpath);
    cfg.db_label = dblabel;

    char err[600];
    /* the database must be usable before Redis is started */
    if (store_reset(cfg.db, cfg.vouchers, cfg.stock, 0, err, sizeof err)) die("%s", err);

    if (url) {
        cfg.redis_url = url;
        dlock_options o;
        dlock_options_init(&o);
        o.url = url;
        dlock_client *c = NULL;
        int rc = dlock_client_new(&o, &c);
        if (rc == DLOCK_OK) rc = dlock_ping(c, NULL);
        if (rc) {
            char safe[256];
            redact(url, safe, sizeof safe);
            snprintf(err, sizeof err, "cannot use Redis at %s: %s", safe,
                     c ? dlock_errmsg(c) : dlock_strerror(rc));
            dlock_client_free(c);
            die("%s", err);
        }
        dlock_client_free(c);
    } else {
        if (tempredis_start(redis_bin, g_dir, &g_redis, err, sizeof err)) die("%s", err);
        cfg.redis_url = g_redis.url;
    }

    /* shared memory: header + arrays */
    size_t n = (size_t)cfg.attempts;
    size_t off_user = (sizeof(shared) + 15) & ~(size_t)15;
    size_t off_voucher = off_user + n * sizeof(int32_t);
    size_t off_lat = off_voucher + n * sizeof(int32_t);
    size_t off_out = off_lat + n * sizeof(float);
    size_t total = off_out + n;
    void *mem = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) die("mmap %zu bytes: %s", total, strerror(errno));
    shared *sh = mem;
    memset(sh, 0, sizeof *sh);
    sh->user = (int32_t *)((char *)mem + off_user);
    sh->voucher = (int32_t *)((char *)mem + off_voucher);
    sh->latency_us = (float *)((char *)mem + off_lat);
    sh->outcome = (int8_t *)((char *)mem + off_out);
    long long expected = make_plan(&cfg, sh, seed);

    if (!json) {
        char safe[256];
        redact(cfg.redis_url, safe, sizeof safe);
        fprintf(stderr, "flash-sale: Redis %s%s, %s%s\n", safe, url ? "" : " (throwaway)",
                cfg.db_label, temp_db ? " (temporary)" : "");
    }
    result rs[M_COUNT];
    int nres = 0;
    for (int m = 0; m < M_COUNT; m++) {
        if (only >= 0 && m != only) continue;
        run_mode(&cfg, sh, (enum mode)m, expected, &rs[nres++]);
    }
    munmap(mem, total);

    if (json) print_json(rs, nres, &cfg);
    else print_table(rs, nres, &cfg);
    fflush(stdout);
    cleanup_now(0);
    for (int i = 0; i < nres; i++)
        if (rs[i].must_be_ok && !rs[i].ok) return EXIT_WRONG;
    return 0;
}
