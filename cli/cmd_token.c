/* `dlock acquire`, `dlock release`, `dlock extend`: plain locks held across
 * separate invocations, identified by their owner token. */
#include <getopt.h>
#include <inttypes.h>
#include <string.h>

#include "cmds.h"

const char help_acquire[] =
    "Usage: dlock acquire [--ttl DUR] [-n | -w DUR] [--label TEXT] [--json] NAME\n"
    "\n"
    "Acquires the plain lock NAME with a lease of --ttl and prints its owner\n"
    "token on stdout (with --json: {\"name\",\"token\",\"fence\",\"ttl_ms\"}). The\n"
    "lock is not renewed: it expires after the lease unless `dlock extend` renews\n"
    "it or `dlock release` releases it.\n"
    "\n"
    "Options:\n"
    "  --ttl DUR            lease (default 30s)\n"
    "  -n, --nonblock       fail at once if the lock is held (exit 1, see -E)\n"
    "  -w, --wait DUR       wait at most DUR (0: as -n; default: forever)\n"
    "  -E, --conflict-exit-code N\n"
    "                       exit code when -n or -w fails (default 1)\n"
    "  --kind plain         the only kind with tokens (the default)\n"
    "  --label TEXT         a label recorded with the hold, shown by status and\n"
    "                       list (at most 255 bytes, no control characters)\n"
    "\n"
    "Example:\n"
    "  token=$(dlock acquire --ttl 5m -n backup) || exit\n"
    "  ... ; dlock extend backup \"$token\" --ttl 5m; ...\n"
    "  dlock release backup \"$token\"\n";

const char help_release[] =
    "Usage: dlock release NAME TOKEN\n"
    "\n"
    "Releases the plain lock NAME if TOKEN (from `dlock acquire`) still owns it.\n"
    "A wrong or expired token changes nothing and exits with 81.\n";

const char help_extend[] =
    "Usage: dlock extend NAME TOKEN --ttl DUR\n"
    "\n"
    "Sets the lease of the plain lock NAME to DUR from now, if TOKEN (from\n"
    "`dlock acquire`) still owns it. A wrong or expired token changes nothing\n"
    "and exits with 81.\n"
    "\n"
    "Options:\n"
    "  --ttl DUR            the new lease (required)\n";

enum { OPT_TTL = OPT_FIRST_LOCAL_, OPT_KIND, OPT_LABEL };

int cmd_acquire(int argc, char **argv, cli_global *g)
{
    static const char *const cmd = "acquire";
    static const struct option longopts[] = {
        CLI_GLOBAL_LONGOPTS,
        {"ttl", required_argument, NULL, OPT_TTL},
        {"nonblock", no_argument, NULL, 'n'},
        {"wait", required_argument, NULL, 'w'},
        {"conflict-exit-code", required_argument, NULL, 'E'},
        {"kind", required_argument, NULL, OPT_KIND},
        {"label", required_argument, NULL, OPT_LABEL},
        {NULL, 0, NULL, 0}};
    int64_t ttl_ms = DLOCK_DEFAULT_WATCHDOG_MS, wait_ms = DLOCK_WAIT_FOREVER;
    int conflict = EXIT_CONFLICT_DEFAULT, opt, rc, code = 0;
    dlock_kind kind = DLOCK_KIND_PLAIN;
    char token[DLOCK_TOKEN_LEN + 1];
    uint64_t fence = 0;
    dlock_client *c = NULL;
    const char *name;
    long n;

    optind = 0;
    while ((opt = getopt_long(argc, argv, ":nw:E:" CLI_GLOBAL_SHORTOPTS, longopts, NULL)) !=
           -1) {
        switch (opt) {
        case OPT_TTL:
            if ((rc = cli_duration(cmd, "--ttl", optarg, 1, &ttl_ms)))
                return rc;
            break;
        case 'n':
            wait_ms = DLOCK_NOWAIT;
            break;
        case 'w':
            if ((rc = cli_duration(cmd, "--wait", optarg, 0, &wait_ms)))
                return rc;
            break;
        case 'E':
            if ((rc = cli_integer(cmd, "--conflict-exit-code", optarg, 0, 255, &n)))
                return rc;
            conflict = (int)n;
            break;
        case OPT_KIND:
            if ((rc = cli_kind(cmd, optarg, &kind)))
                return rc;
            if (kind != DLOCK_KIND_PLAIN)
                return cli_usage(cmd, "--kind: only plain locks have tokens; use "
                                      "'dlock run --kind %s'", optarg);
            break;
        case OPT_LABEL:
            if ((rc = cli_check_label(cmd, optarg)))
                return rc;
            g->label = optarg;
            break;
        default:
            if (!cli_default_opt(g, cmd, opt, argv, &code))
                return code;
        }
    }
    if (optind >= argc)
        return cli_usage(cmd, "missing lock NAME");
    if (optind + 1 < argc)
        return cli_usage(cmd, "unexpected argument '%s'", argv[optind + 1]);
    name = argv[optind];
    if ((rc = cli_check_name(cmd, name)))
        return rc;
    if ((code = cli_connect(g, cmd, 0, &c)))
        return code;
    if ((code = cli_set_identity(g, cmd, c, NULL))) {
        dlock_client_free(c);
        return code;
    }

    rc = dlock_acquire_token(c, name, DLOCK_CSTR, wait_ms, ttl_ms, token, &fence);
    if (rc == DLOCK_EBUSY) {
        cli_info(g, cmd, "lock '%s' is held by another owner", name);
        code = conflict;
    } else if (rc == DLOCK_ETIMEDOUT) {
        cli_info(g, cmd, "timed out waiting for lock '%s'", name);
        code = conflict;
    } else if (rc != DLOCK_OK) {
        cli_err(cmd, "cannot acquire lock '%s': %s", name,
                dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        code = cli_exit_code(rc, conflict);
    } else {
        if (g->json) {
            fputs("{\"name\":", stdout);
            cli_json_str(stdout, name, strlen(name));
            fputs(",\"token\":", stdout);
            cli_json_str(stdout, token, strlen(token));
            printf(",\"fence\":%" PRIu64 ",\"ttl_ms\":%lld}\n", fence, (long long)ttl_ms);
        } else {
            printf("%s\n", token);
        }
        if (g->verbose)
            cli_err(cmd, "acquired lock '%s' (fence %" PRIu64 ", lease %lld ms)", name, fence,
                    (long long)ttl_ms);
    }
    dlock_client_free(c);
    return code;
}

/* release and extend: NAME TOKEN [--ttl DUR] */
static int token_op(int argc, char **argv, cli_global *g, const char *cmd, int extend)
{
    static const struct option longopts[] = {
        CLI_GLOBAL_LONGOPTS, {"ttl", required_argument, NULL, OPT_TTL}, {NULL, 0, NULL, 0}};
    int64_t ttl_ms = 0;
    int opt, rc, code = 0;
    dlock_client *c = NULL;
    const char *name, *token;

    optind = 0;
    while ((opt = getopt_long(argc, argv, ":" CLI_GLOBAL_SHORTOPTS, longopts, NULL)) != -1) {
        if (opt == OPT_TTL) {
            if (!extend)
                return cli_usage(cmd, "unknown option '--ttl'");
            if ((rc = cli_duration(cmd, "--ttl", optarg, 1, &ttl_ms)))
                return rc;
            continue;
        }
        if (!cli_default_opt(g, cmd, opt, argv, &code))
            return code;
    }
    if (optind >= argc)
        return cli_usage(cmd, "missing lock NAME");
    if (optind + 1 >= argc)
        return cli_usage(cmd, "missing TOKEN");
    if (optind + 2 < argc)
        return cli_usage(cmd, "unexpected argument '%s'", argv[optind + 2]);
    name = argv[optind];
    token = argv[optind + 1];
    if ((rc = cli_check_name(cmd, name)))
        return rc;
    if (!*token)
        return cli_usage(cmd, "the TOKEN is empty");
    if (extend && ttl_ms == 0)
        return cli_usage(cmd, "missing --ttl DUR");
    if ((code = cli_connect(g, cmd, 0, &c)))
        return code;
    /* the release deletes the holder's record, the extend renews its expiry
     * with the lease's */
    if ((code = cli_set_identity(g, cmd, c, NULL))) {
        dlock_client_free(c);
        return code;
    }

    if (extend)
        rc = dlock_extend_token(c, name, DLOCK_CSTR, token, ttl_ms);
    else
        rc = dlock_release_token(c, name, DLOCK_CSTR, token);
    if (rc == DLOCK_ENOTOWNER) {
        cli_err(cmd, "the token does not own lock '%s' (wrong token, or the lease expired); "
                "nothing changed", name);
        code = EXIT_NOTOWNER;
    } else if (rc != DLOCK_OK) {
        cli_err(cmd, "cannot %s lock '%s': %s", cmd, name,
                dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        code = cli_exit_code(rc, EXIT_INTERNAL);
    } else {
        if (g->json) {
            fputs("{\"name\":", stdout);
            cli_json_str(stdout, name, strlen(name));
            if (extend)
                printf(",\"extended\":true,\"ttl_ms\":%lld}\n", (long long)ttl_ms);
            else
                fputs(",\"released\":true}\n", stdout);
        }
        if (g->verbose)
            cli_err(cmd, "%s lock '%s'", extend ? "extended" : "released", name);
    }
    dlock_client_free(c);
    return code;
}

int cmd_release(int argc, char **argv, cli_global *g)
{
    return token_op(argc, argv, g, "release", 0);
}

int cmd_extend(int argc, char **argv, cli_global *g)
{
    return token_op(argc, argv, g, "extend", 1);
}
