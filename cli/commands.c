/* dlock(1)'s commands: the table of commands and their help, dispatch,
 * global options, `help` and `version` (cli_main). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"

#define GLOBAL_OPTIONS_HELP                                                            \
    "Global options (before or after the command name):\n"                             \
    "  --url URL            server: redis://[user[:password]@]host[:port][/db],\n"     \
    "                       rediss://... (TLS), unix:///path/to/socket[?db=N],\n"      \
    "                       redlock://NODE,NODE,..., redis-sentinel://host:port,\n"    \
    "                       .../MASTER, redis-cluster://host:port,...; other\n"       \
    "                       backends: zk://, etcd://, postgres://, mysql:// (default:\n" \
    "                       $DLOCK_URL, else redis://127.0.0.1:6379). Given several\n" \
    "                       times (each redis://host:port[/db]): RedLock over them\n"  \
    "  --password-file FILE read the password from FILE's first line (default:\n"       \
    "                       $DLOCK_PASSWORD)\n"                                         \
    "  --timeout DUR        connect and command timeout (default 2s / 5s)\n"            \
    "  -v, --verbose        say more on stderr\n"                                       \
    "  -q, --quiet          say nothing on stderr but errors\n"                         \
    "  --json               print data as JSON (status, list, acquire, doctor...)\n"    \
    "  -h, --help           this help\n" \
    "More global options (several servers, replicas, TLS):\n"                      \
    "  --fence-url URL      RedLock: the one server whose counter issues fencing\n"    \
    "                       tokens (strictly increasing)\n"                            \
    "  --wait-replicas N    after each acquire, wait until N replicas have it, else\n"  \
    "                       release it and fail (exit 75); not with RedLock\n"         \
    "  --wait-replicas-timeout DUR  how long to wait for them (default 1s)\n"          \
    "  --fair-wait DUR      fair lock: how long a queued waiter keeps its place\n"    \
    "                       (default 5s); a queue shared with Redisson clients\n"     \
    "                       needs their fairLockWaitTimeout (Redisson's default 5m)\n" \
    "  --fail-fast          a wait ends (exit 69) when the server fails or stops\n"   \
    "                       answering; by default it reconnects until -w runs out\n"  \
    "  --tls-ca-file FILE, --tls-ca-dir DIR  CAs to verify a rediss:// server with\n"  \
    "                       (default: the system's)\n"                                 \
    "  --tls-cert FILE --tls-key FILE  client certificate and its key\n"               \
    "  --tls-server-name NAME  the name the server certificate must carry (and SNI)\n" \
    "  --tls-insecure       do not verify the server certificate (tests only!)\n"

static const char help_overview[] =
    "Usage: dlock [GLOBAL OPTIONS] COMMAND [OPTIONS] [ARGS]\n"
    "\n"
    "Distributed locks on Redis for shell scripts and cron jobs.\n"
    "\n"
    "Commands:\n"
    "  run NAME COMMAND [ARGS...]   run a command while holding the lock NAME\n"
    "  run NAME -c 'SHELL STRING'   the same, through /bin/sh -c\n"
    "  run -s|-x NAME ...           the same, under the read / write side of NAME\n"
    "  run --limit N NAME ...       the same, at most N at once (semaphore NAME)\n"
    "  run --also NAME2 NAME ...    the same, holding NAME and NAME2\n"
    "  acquire NAME                 take a lock with a lease; print its token\n"
    "  release NAME TOKEN           release a lock taken by acquire\n"
    "  extend NAME TOKEN --ttl DUR  renew the lease of a lock taken by acquire\n"
    "  status NAME                  show who holds a lock\n"
    "  list [PATTERN]               list the locks on the server\n"
    "  force-unlock NAME            delete a lock whoever holds it (dangerous)\n"
    "  doctor                       check that the server is safe for locks\n"
    "  id next [PREFIX] [-c COUNT]  print unique ids from the global id worker\n"
    "  latch NAME set N | down [K] | await [-w DUR] | count\n"
    "                               a countdown latch\n"
    "  version                      print the version\n"
    "  help [COMMAND]               print the help of a command\n"
    "\n" GLOBAL_OPTIONS_HELP
    "\n"
    "Durations: 250ms, 1.5s, 30s, 5m, 1h, 2d; a bare number means seconds.\n"
    "Exit codes: 0 ok (run: the command's status), 1 lock busy (-E), 64 usage,\n"
    "65 not a lock (force-unlock without --force),\n"
    "66 password or TLS file unreadable, 69 server unavailable, 70 internal error,\n"
    "71 system error, 75 too few replicas acknowledged, 76 TLS failed,\n"
    "77 authentication refused, 78 doctor found a FAIL,\n"
    "80 lock lost while running, 81 not the owner, 126/127 command not\n"
    "executable / not found, 128+N command killed by signal N.\n"
    "See dlock(1) for details.\n";

static const char help_version[] =
    "Usage: dlock version [--json]\n"
    "\n"
    "Prints the version of the tool and of the dlock library it uses.\n";

static const char help_help[] =
    "Usage: dlock help [COMMAND]\n"
    "\n"
    "Prints the help of COMMAND, or the overview.\n";

static int cmd_version(int argc, char **argv, cli_global *g);
int cli_default_opt(cli_global *g, const char *cmd, int opt, char *const *argv, int *code)
{
    int rc = cli_common_opt(g, cmd, opt, argv);
    if (rc == CLI_WANT_HELP) {
        cli_print_help(stdout, cmd);
        *code = 0;
        return 0;
    }
    if (rc == -1) {
        *code = cli_usage(cmd, "unknown option");
        return 0;
    }
    if (rc) {
        *code = rc;
        return 0;
    }
    return 1;
}

static int cmd_help(int argc, char **argv, cli_global *g);

static const struct {
    const char *name;
    cli_cmd_fn fn;
    const char *help;
} commands[] = {
    {"run", cmd_run, help_run},
    {"acquire", cmd_acquire, help_acquire},
    {"release", cmd_release, help_release},
    {"extend", cmd_extend, help_extend},
    {"status", cmd_status, help_status},
    {"list", cmd_list, help_list},
    {"force-unlock", cmd_force_unlock, help_force_unlock},
    {"doctor", cmd_doctor, help_doctor},
    {"id", cmd_id, help_id},
    {"latch", cmd_latch, help_latch},
    {"version", cmd_version, help_version},
    {"help", cmd_help, help_help},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

int cli_print_help(FILE *f, const char *cmd)
{
    size_t i;
    if (!cmd) {
        fputs(help_overview, f);
        return 0;
    }
    for (i = 0; i < NCOMMANDS; i++) {
        if (strcmp(commands[i].name, cmd) == 0) {
            fputs(commands[i].help, f);
            if (commands[i].fn != cmd_help && commands[i].fn != cmd_version)
                fputs("\nGlobal options (--url, --password-file, --timeout, -v, -q, --json,\n"
                      "--tls-*, ...) go before or after the command: see 'dlock help'.\n",
                      f);
            return 0;
        }
    }
    return -1;
}

static int cmd_help(int argc, char **argv, cli_global *g)
{
    (void)g;
    if (argc > 2)
        return cli_usage("help", "too many arguments");
    if (argc == 2 && strcmp(argv[1], "--help") != 0 && strcmp(argv[1], "-h") != 0) {
        if (cli_print_help(stdout, argv[1]) != 0)
            return cli_usage("help", "unknown command '%s'", argv[1]);
        return 0;
    }
    if (argc == 2)
        return cli_print_help(stdout, "help"), 0;
    cli_print_help(stdout, NULL);
    return 0;
}

static int cmd_version(int argc, char **argv, cli_global *g)
{
    static const struct option longopts[] = {CLI_GLOBAL_LONGOPTS, {NULL, 0, NULL, 0}};
    int opt, rc;
    optind = 0;
    while ((opt = getopt_long(argc, argv, ":" CLI_GLOBAL_SHORTOPTS, longopts, NULL)) != -1) {
        rc = cli_common_opt(g, "version", opt, argv);
        if (rc == CLI_WANT_HELP)
            return cli_print_help(stdout, "version"), 0;
        if (rc)
            return rc;
    }
    if (optind < argc)
        return cli_usage("version", "unexpected argument '%s'", argv[optind]);
    if (g->json)
        printf("{\"version\":\"%s\",\"library\":\"%s\"}\n", PROJECT_VERSION, dlock_version());
    else
        printf("dlock %s (library %s)\n", PROJECT_VERSION, dlock_version());
    return 0;
}

/* Whether --json is among the arguments, when the parsing stopped at a
 * usage error before reaching it; not past "--", nor in `run`'s arguments,
 * which may be the command's own. */
static int json_asked(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0 || strcmp(argv[i], "run") == 0)
            return 0;
        if (strcmp(argv[i], "--json") == 0)
            return 1;
    }
    return 0;
}

static int cli_main_(int argc, char **argv, cli_global *gp, const char **cmd);

int cli_main(int argc, char **argv)
{
    cli_global g;
    const char *cmd = NULL;
    memset(&g, 0, sizeof g);
    int rc = cli_main_(argc, argv, &g, &cmd);
    /* --json: a failure is one JSON object too, so a script never parses
     * empty input; a failure after the data was written (doctor's FAIL) has
     * printed no message and writes nothing more. `run` prints no data (its
     * stdout is the command's, and so is its status) */
    if (rc != 0 && (g.json || json_asked(argc, argv)) && cli_have_error() &&
        !(cmd && strcmp(cmd, "run") == 0)) {
        cli_json_error(stdout, rc);
        if (fflush(stdout) != 0)
            cli_err(NULL, "cannot write the output");
    }
    return rc;
}

static int cli_main_(int argc, char **argv, cli_global *gp, const char **cmd)
{
    static const struct option longopts[] = {
        CLI_GLOBAL_LONGOPTS, {"version", no_argument, NULL, 'V'}, {NULL, 0, NULL, 0}};
    cli_global *g = gp;
    const char *name;
    int opt, rc;
    size_t i;

    opterr = 0;
    /* "+": stop at the command name; the command parses the rest. */
    while ((opt = getopt_long(argc, argv, "+:V" CLI_GLOBAL_SHORTOPTS, longopts, NULL)) != -1) {
        if (opt == 'V')
            return cmd_version(1, argv, g);
        rc = cli_common_opt(g, NULL, opt, argv);
        if (rc == CLI_WANT_HELP) {
            cli_print_help(stdout, NULL);
            return 0;
        }
        if (rc)
            return rc;
    }
    if (optind >= argc)
        return cli_usage(NULL, "missing command");
    name = argv[optind];
    for (i = 0; i < NCOMMANDS; i++) {
        if (strcmp(commands[i].name, name) == 0) {
            *cmd = commands[i].name;
            rc = commands[i].fn(argc - optind, argv + optind, g);
            if (fflush(stdout) != 0 && rc == 0) {
                cli_err(NULL, "cannot write the output");
                rc = EXIT_OSERR;
            }
            return rc;
        }
    }
    return cli_usage(NULL, "unknown command '%s'", name);
}
