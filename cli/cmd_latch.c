/* `dlock latch NAME set N | down [K] | await [-w DUR] | count`: a countdown
 * latch (Redisson RCountDownLatch layout) for shell scripts. */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmds.h"

const char help_latch[] =
    "Usage: dlock latch NAME set N\n"
    "       dlock latch NAME down [K]\n"
    "       dlock latch NAME await [-n | -w DUR] [-E N]\n"
    "       dlock latch NAME count\n"
    "\n"
    "A countdown latch (the Redisson RCountDownLatch layout): `set` sets the\n"
    "count to N (0 to 2^53 - 1; 0 opens the latch), `down` counts it down by K\n"
    "(default 1, never below zero), `await` waits until the count is zero\n"
    "(exit 0; the conflict code, 1, when -w runs out), `count` prints the\n"
    "count (0 when the latch is open or was never set). Waiters wake on the\n"
    "latch's pub/sub message, without polling. A latch whose key does not\n"
    "exist (never set, or counted down to zero: its key is deleted then) is\n"
    "open: `await` returns at once and says so on stderr (not with -q).\n"
    "With --json, `count` prints {\"name\",\"count\"}.\n"
    "\n"
    "Options:\n"
    "  -n, --nowait         await: look once (as -w 0)\n"
    "  -w, --wait DUR       await: wait at most DUR (0: look once; default: forever)\n"
    "  -E, --conflict-exit-code N\n"
    "                       await: exit code when -w runs out (default 1)\n";

#define CMD "latch"
#define COUNT_MAX DLOCK_COUNT_MAX /* 2^53 - 1 */

/* Parses a count argument in [lo, 2^53 - 1]. */
static int parse_count(const char *what, const char *s, long long lo, int64_t *v)
{
    char *end = NULL;
    long long x;
    if (*s < '0' || *s > '9')
        return cli_usage(CMD, "%s: expected a number from %lld to %lld, not '%s'", what, lo,
                         COUNT_MAX, s);
    x = strtoll(s, &end, 10);
    if (*end || x < lo || x > COUNT_MAX)
        return cli_usage(CMD, "%s: expected a number from %lld to %lld, not '%s'", what, lo,
                         COUNT_MAX, s);
    *v = x;
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cmd_latch(int argc, char **argv, cli_global *g)
{
    static const struct option longopts[] = {
        CLI_GLOBAL_LONGOPTS,
        {"wait", required_argument, NULL, 'w'},
        {"nowait", no_argument, NULL, 'n'},
        {"conflict-exit-code", required_argument, NULL, 'E'},
        {NULL, 0, NULL, 0}};
    enum { SET, DOWN, AWAIT, COUNT } op;
    static const char *const ops[] = {"set", "down", "await", "count"};
    int64_t wait_ms = DLOCK_WAIT_FOREVER, arg = 1, count = 0, t0;
    int opt, rc, code = 0, conflict = EXIT_CONFLICT_DEFAULT, wait_given = 0, e_given = 0;
    int absent = 0;
    dlock_info info;
    const char *name, *sub;
    dlock_client *c = NULL;
    dlock_latch *l = NULL;
    long n;

    optind = 0;
    /* no "+": options may follow the subcommand (dlock latch L await -w 5s) */
    while ((opt = getopt_long(argc, argv, ":nw:E:" CLI_GLOBAL_SHORTOPTS, longopts, NULL)) != -1) {
        if (opt == 'n') { /* as everywhere: do not wait */
            wait_ms = 0;
            wait_given = 1;
            continue;
        }
        if (opt == 'w') {
            if ((rc = cli_duration(CMD, "--wait", optarg, 0, &wait_ms)))
                return rc;
            wait_given = 1;
            continue;
        }
        if (opt == 'E') {
            if ((rc = cli_integer(CMD, "--conflict-exit-code", optarg, 0, 255, &n)))
                return rc;
            conflict = (int)n;
            e_given = 1;
            continue;
        }
        if (!cli_default_opt(g, CMD, opt, argv, &code))
            return code;
    }
    if (optind >= argc)
        return cli_usage(CMD, "missing latch NAME");
    name = argv[optind++];
    if ((rc = cli_check_name(CMD, name)))
        return rc;
    if (optind >= argc)
        return cli_usage(CMD, "missing subcommand (set N, down [K], await or count)");
    sub = argv[optind++];
    for (op = SET; op <= COUNT; op++)
        if (strcmp(sub, ops[op]) == 0)
            break;
    if (op > COUNT)
        return cli_usage(CMD, "unknown subcommand '%s' (set N, down [K], await or count)", sub);
    if (op == SET) {
        if (optind >= argc)
            return cli_usage(CMD, "set: missing the count N");
        if ((rc = parse_count("set", argv[optind++], 0, &arg)))
            return rc;
    } else if (op == DOWN && optind < argc) {
        if ((rc = parse_count("down", argv[optind++], 1, &arg)))
            return rc;
    }
    if (optind < argc)
        return cli_usage(CMD, "unexpected argument '%s'", argv[optind]);
    if (op != AWAIT && (wait_given || e_given))
        return cli_usage(CMD, "%s takes no -n, -w or -E (only await does)", sub);

    if (cli_is_redlock(g))
        return cli_usage(CMD, "latches do not work with RedLock (several --url)");
    if ((code = cli_connect(g, CMD, 0, &c)))
        return code;
    rc = dlock_latch_new(c, name, DLOCK_CSTR, &l);
    if (rc != DLOCK_OK) {
        cli_err(CMD, "%s", dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        dlock_client_free(c);
        return cli_exit_code(rc, EXIT_INTERNAL);
    }
    t0 = now_ms();
    switch (op) {
    case SET:
        rc = dlock_latch_set(l, arg);
        break;
    case DOWN:
        rc = dlock_latch_count_down(l, arg);
        break;
    case AWAIT:
        /* a latch's key exists only while its count is above zero: an
         * absent one opens at once, which a mistyped name would too */
        memset(&info, 0, sizeof info);
        absent = dlock_inspect(c, name, DLOCK_CSTR, &info) == DLOCK_OK && !info.exists;
        rc = dlock_latch_await(l, wait_ms);
        if (rc == DLOCK_OK && absent)
            cli_info(g, CMD, "latch '%s' does not exist (never set, or already counted down "
                     "to zero): open at once", name);
        break;
    case COUNT:
        rc = dlock_latch_count(l, &count);
        break;
    }
    if (rc == DLOCK_OK) {
        if (op == COUNT && g->json) {
            fputs("{\"name\":", stdout);
            cli_json_str(stdout, name, strlen(name));
            printf(",\"count\":%" PRId64 "}\n", count);
        } else if (op == COUNT) {
            printf("%" PRId64 "\n", count);
        } else if (op == AWAIT && g->verbose) {
            int64_t took = now_ms() - t0;
            cli_err(CMD, "latch '%s' is open (waited %lld.%03llds)", name,
                    (long long)(took / 1000), (long long)(took % 1000));
        }
    } else if (op == AWAIT && (rc == DLOCK_ETIMEDOUT || rc == DLOCK_EBUSY)) {
        cli_info(g, CMD, "timed out waiting for latch '%s' to reach zero", name);
        code = conflict;
    } else {
        const char *m = dlock_latch_errmsg(l);
        cli_err(CMD, "%s on latch '%s' failed: %s", sub, name, m && *m ? m : dlock_strerror(rc));
        code = cli_exit_code(rc, conflict);
    }
    dlock_latch_free(l);
    dlock_client_free(c);
    return code;
}
