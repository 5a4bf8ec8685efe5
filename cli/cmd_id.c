/* `dlock id next`: unique, roughly time-ordered 64-bit ids from the global
 * ID worker (a per-day Redis counter). */
#include <getopt.h>
#include <inttypes.h>
#include <string.h>

#include "cmds.h"

const char help_id[] =
    "Usage: dlock id next [-c COUNT] [PREFIX]\n"
    "\n"
    "Prints COUNT (default 1) unique ids, one per line. An id is\n"
    "(seconds since 2022-01-01 UTC) << 32 | n, where n comes from the Redis\n"
    "counter \"icr:PREFIX:YYYY:MM:DD\" (UTC day). PREFIX defaults to \"id\"; ids\n"
    "of different prefixes may be equal. With --json: a JSON array of decimal\n"
    "strings (ids exceed 2^53, the integers JavaScript keeps exact).\n"
    "\n"
    "Options:\n"
    "  -c, --count COUNT    how many ids (1 to 1000000); -n COUNT, the old\n"
    "                       spelling, still works with a warning\n";

int cmd_id(int argc, char **argv, cli_global *g)
{
    static const char *const cmd = "id";
    static const struct option longopts[] = {
        CLI_GLOBAL_LONGOPTS, {"count", required_argument, NULL, 'c'}, {NULL, 0, NULL, 0}};
    dlock_idworker_options wo;
    dlock_idworker *w = NULL;
    dlock_client *c = NULL;
    const char *prefix = "id";
    long count = 1, i;
    int opt, rc, code = 0, old_n = 0;
    uint64_t id;

    optind = 0;
    /* -n COUNT is the old spelling: everywhere else -n means "do not wait" */
    while ((opt = getopt_long(argc, argv, ":c:n:" CLI_GLOBAL_SHORTOPTS, longopts, NULL)) != -1) {
        if (opt == 'c' || opt == 'n') {
            if ((rc = cli_integer(cmd, "--count", optarg, 1, 1000000, &count)))
                return rc;
            old_n |= opt == 'n';
            continue;
        }
        if (!cli_default_opt(g, cmd, opt, argv, &code))
            return code;
    }
    if (old_n)
        cli_info(g, cmd, "-n COUNT is deprecated (-n means \"do not wait\" in the other "
                 "commands): use -c COUNT or --count COUNT");
    if (optind >= argc)
        return cli_usage(cmd, "missing subcommand (dlock id next [PREFIX])");
    if (strcmp(argv[optind], "next") != 0)
        return cli_usage(cmd, "unknown subcommand '%s' (dlock id next [PREFIX])", argv[optind]);
    if (optind + 1 < argc)
        prefix = argv[optind + 1];
    if (optind + 2 < argc)
        return cli_usage(cmd, "unexpected argument '%s'", argv[optind + 2]);
    if (!*prefix)
        return cli_usage(cmd, "the PREFIX is empty");
    if (strlen(prefix) > DLOCK_NAME_MAX)
        return cli_usage(cmd, "the PREFIX is longer than %d bytes", DLOCK_NAME_MAX);
    if ((code = cli_connect(g, cmd, 0, &c)))
        return code;

    memset(&wo, 0, sizeof wo);
    wo.batch = count > 1000 ? 1000 : count; /* one INCRBY per batch, none wasted */
    rc = dlock_idworker_new(c, prefix, &wo, &w);
    if (rc != DLOCK_OK) {
        cli_err(cmd, "cannot create the id worker: %s",
                dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        dlock_client_free(c);
        return cli_exit_code(rc, EXIT_INTERNAL);
    }
    if (g->json)
        fputc('[', stdout);
    for (i = 0; i < count; i++) {
        rc = dlock_idworker_next(w, &id);
        if (rc != DLOCK_OK) {
            const char *m = dlock_idworker_errmsg(w);
            cli_err(cmd, "cannot get an id: %s", m && *m ? m : dlock_strerror(rc));
            code = cli_exit_code(rc, EXIT_INTERNAL);
            break;
        }
        if (g->json)
            printf(i ? ",\"%" PRIu64 "\"" : "\"%" PRIu64 "\"", id);
        else
            printf("%" PRIu64 "\n", id);
    }
    if (g->json)
        fputs("]\n", stdout);
    dlock_idworker_free(w);
    dlock_client_free(c);
    return code;
}
