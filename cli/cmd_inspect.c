/* `dlock status`, `dlock list`, `dlock force-unlock`: looking at locks by
 * name, and the emergency exit. */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmds.h"

const char help_status[] =
    "Usage: dlock status [--json] NAME\n"
    "\n"
    "Shows the lock NAME: held or free, kind, holder(s), hold count, remaining\n"
    "lease, the last fencing token issued and the number of blocked waiters.\n"
    "Exits 0 whether the lock is held or free.\n"
    "Kinds: plain, reentrant, fair (and its queue length), read or write (the\n"
    "readers and whether a writer holds), permit-semaphore (available permits\n"
    "and permits out on lease), \"semaphore or latch\" (an integer: a\n"
    "semaphore's available permits or a latch's count; also an expirable\n"
    "semaphore with no permit out).\n"
    "State: free, held, not held (a semaphore or latch with no permit on lease)\n"
    "or not a lock (a key of another layout: see `dlock help list`).\n"
    "JSON: {\"name\",\"held\",\"kind\",\"layout\",\"holder\",\"holders\",\"hold_count\",\n"
    "\"ttl_ms\",\"fence\",\"waiters\"}; ttl_ms is -2 when free, -1 when held without expiry;\n"
    "fair adds \"queued\"; read and write add \"readers\", \"writer\" (true/false);\n"
    "permit-semaphore adds \"permits\", \"leased\"; \"semaphore or latch\" adds\n"
    "\"permits\", \"leased\" (0) and \"count\" (the same number as permits).\n";

const char help_list[] =
    "Usage: dlock list [--json] [PATTERN]\n"
    "\n"
    "Lists the locks on the server whose names match the glob PATTERN (default\n"
    "'*'), using SCAN (never KEYS): name, kind, remaining lease, number of\n"
    "holders and the (first) holder, followed by the kind's details (fair:\n"
    "queued=N; read/write: readers=N writer=yes|no; semaphores and latches:\n"
    "permits=N, leased=N). With --json: an array of objects as\n"
    "`dlock status --json` prints. -q leaves out the header line and the\n"
    "closing note on stderr.\n"
    "Only keys laid out as a lock or an object of dlock and the clients it\n"
    "shares Redis with are listed (its \"layout\" says which):\n"
    "  plain lock: a STRING holding an owner token: 32 hex digits (dlock,\n"
    "    redis-py, node-redlock), 16 bytes in base64 (redsync), a UUID, or a\n"
    "    UUID and a thread id joined by '-' or ':' (SimpleRedisLock);\n"
    "  reentrant and fair lock: a HASH whose fields are all <uuid>:<thread>\n"
    "    holding a positive count (Redisson RLock);\n"
    "  read-write lock: the same with a field mode = read|write and writer\n"
    "    fields <uuid>:<thread>:write (Redisson RReadWriteLock);\n"
    "  semaphore or latch: a STRING holding an integer (an application's\n"
    "    counter looks the same, and is listed).\n"
    "Any other key (other types, other values, fence counters, waiter\n"
    "queues) is left out.\n";

const char help_force_unlock[] =
    "Usage: dlock force-unlock [--yes] [--force] NAME\n"
    "\n"
    "DANGEROUS: deletes the lock NAME whoever holds it and wakes its waiters.\n"
    "The holder is not told and may still be in its critical section: use it\n"
    "only to clean up after a holder known to be dead. When stdin is a\n"
    "terminal, refuses unless --yes is given.\n"
    "Deletes only a key laid out as a lock (see `dlock help list`); a key of\n"
    "any other layout, and an integer (a semaphore's permits, a latch's count,\n"
    "or an application's counter: they look the same), is left alone with exit\n"
    "65 unless --force is given.\n"
    "\n"
    "Options:\n"
    "  -y, --yes            do it\n"
    "  -f, --force          delete NAME whatever its layout\n";

/* How inspect recognised a key: the layout of its kind (docs/cli.md). */
static const char *layout_of(const dlock_info *in)
{
    if (!in->exists)
        return "";
    switch (in->kind) {
    case DLOCK_KIND_PLAIN:
        return "STRING holding an owner token";
    case DLOCK_KIND_REENTRANT:
        return "HASH of <uuid>:<thread> hold counts";
    case DLOCK_KIND_FAIR:
        return "HASH of <uuid>:<thread> hold counts, with a waiting queue";
    case DLOCK_KIND_READ:
    case DLOCK_KIND_WRITE:
        return "HASH with mode read|write and <uuid>:<thread> hold counts";
    case DLOCK_KIND_SEMAPHORE:
        return "STRING holding an integer";
    case DLOCK_KIND_PERMIT_SEMAPHORE:
        return "STRING holding an integer, with permits on lease in {NAME}:timeout";
    case DLOCK_KIND_LATCH:
        return "STRING holding an integer, awaited on the latch channel";
    default:
        return "not a lock: a key of a layout dlock does not recognise";
    }
}

/* Held: a lock that exists, or a semaphore with permits out on lease; an
 * idle semaphore, a latch and a key of another layout are not held. A
 * semaphore without leases cannot tell how many of its permits are out. */
static int is_held(const dlock_info *in)
{
    if (!in->exists)
        return 0;
    if (cli_is_lock_kind(in->kind))
        return 1;
    return in->kind == DLOCK_KIND_PERMIT_SEMAPHORE && in->leased > 0;
}

static const char *cli_state(const dlock_info *in)
{
    if (!in->exists)
        return "free";
    if (!in->kind)
        return "not a lock";
    return is_held(in) ? "held" : "not held";
}

static void json_info(FILE *f, const char *name, size_t name_len, const dlock_info *in)
{
    fputs("{\"name\":", f);
    cli_json_str(f, name, name_len);
    fprintf(f, ",\"held\":%s,\"kind\":", is_held(in) ? "true" : "false");
    if (in->exists && in->kind)
        fprintf(f, "\"%s\"", cli_kind_name(in->kind, 1));
    else
        fputs("null", f);
    fputs(",\"holder\":", f);
    if (in->holder[0])
        cli_json_str(f, in->holder, strnlen(in->holder, sizeof in->holder));
    else
        fputs("null", f);
    fputs(",\"layout\":", f);
    if (in->exists)
        cli_json_str(f, layout_of(in), strlen(layout_of(in)));
    else
        fputs("null", f);
    fprintf(f, ",\"holders\":%d,\"hold_count\":%lld,\"ttl_ms\":%lld,\"fence\":%" PRIu64
               ",\"waiters\":%lld",
            in->holders, (long long)in->hold_count, (long long)in->ttl_ms, in->fence,
            (long long)in->waiters);
    switch (in->kind) {
    case DLOCK_KIND_READ:
    case DLOCK_KIND_WRITE:
        fprintf(f, ",\"readers\":%lld,\"writer\":%s", (long long)in->readers,
                in->writer ? "true" : "false");
        break;
    case DLOCK_KIND_FAIR:
        fprintf(f, ",\"queued\":%lld", (long long)in->queued);
        break;
    case DLOCK_KIND_SEMAPHORE:
        /* a semaphore's permits or a latch's count: the library cannot tell */
        fprintf(f, ",\"permits\":%lld,\"leased\":%lld,\"count\":%lld", (long long)in->permits,
                (long long)in->leased, (long long)in->permits);
        break;
    case DLOCK_KIND_LATCH:
        fprintf(f, ",\"count\":%lld", (long long)in->permits);
        break;
    case DLOCK_KIND_PERMIT_SEMAPHORE:
        fprintf(f, ",\"permits\":%lld,\"leased\":%lld", (long long)in->permits,
                (long long)in->leased);
        break;
    default:
        break;
    }
    fputc('}', f);
}

/* Parses the options of status, list and force-unlock (--yes when yes is
 * not NULL); the positional arguments start at optind. */
static int parse_simple(int argc, char **argv, cli_global *g, const char *cmd, int *yes,
                        int *force, int *code)
{
    static const struct option longopts[] = {CLI_GLOBAL_LONGOPTS,
                                             {"yes", no_argument, NULL, 'y'},
                                             {"force", no_argument, NULL, 'f'},
                                             {NULL, 0, NULL, 0}};
    int opt;
    optind = 0;
    while ((opt = getopt_long(argc, argv, yes ? ":yf" CLI_GLOBAL_SHORTOPTS
                                              : ":" CLI_GLOBAL_SHORTOPTS,
                              longopts, NULL)) != -1) {
        if (opt == 'y' && yes) {
            *yes = 1;
            continue;
        }
        if (opt == 'f' && force) {
            *force = 1;
            continue;
        }
        if (opt == 'y' || opt == 'f') {
            *code = cli_usage(cmd, "unknown option '%s'", opt == 'y' ? "--yes" : "--force");
            return 0;
        }
        if (!cli_default_opt(g, cmd, opt, argv, code))
            return 0;
    }
    return 1;
}

int cmd_status(int argc, char **argv, cli_global *g)
{
    static const char *const cmd = "status";
    dlock_client *c = NULL;
    dlock_info in;
    const char *name;
    int rc, code = 0;
    char ttl[32];

    if (!parse_simple(argc, argv, g, cmd, NULL, NULL, &code))
        return code;
    if (optind >= argc)
        return cli_usage(cmd, "missing lock NAME");
    if (optind + 1 < argc)
        return cli_usage(cmd, "unexpected argument '%s'", argv[optind + 1]);
    name = argv[optind];
    if ((rc = cli_check_name(cmd, name)))
        return rc;
    if ((code = cli_connect(g, cmd, 0, &c)))
        return code;
    memset(&in, 0, sizeof in);
    rc = dlock_inspect(c, name, DLOCK_CSTR, &in);
    if (rc != DLOCK_OK) {
        cli_err(cmd, "cannot inspect lock '%s': %s", name,
                dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        dlock_client_free(c);
        return cli_exit_code(rc, EXIT_INTERNAL);
    }
    if (g->json) {
        json_info(stdout, name, strlen(name), &in);
        fputc('\n', stdout);
    } else {
        cli_fmt_ttl(ttl, sizeof ttl, in.ttl_ms);
        fputs("name:       ", stdout);
        cli_text(stdout, name, strlen(name));
        printf("\nstate:      %s\n", cli_state(&in));
        if (in.exists && !in.kind) {
            printf("layout:     %s\nttl:        %s\n", layout_of(&in), ttl);
        } else if (in.exists && (in.kind == DLOCK_KIND_SEMAPHORE || in.kind == DLOCK_KIND_LATCH ||
                          in.kind == DLOCK_KIND_PERMIT_SEMAPHORE)) {
            printf("kind:       %s\nlayout:     %s\nttl:        %s\n", cli_kind_name(in.kind, 1),
                   layout_of(&in), ttl);
            if (in.kind == DLOCK_KIND_LATCH)
                printf("count:      %lld\n", (long long)in.permits);
            else if (in.kind == DLOCK_KIND_SEMAPHORE)
                printf("permits:    %lld (a latch: its count)\nleased:     %lld\n",
                       (long long)in.permits, (long long)in.leased);
            else
                printf("permits:    %lld\nleased:     %lld\n", (long long)in.permits,
                       (long long)in.leased);
        } else if (in.exists) {
            printf("kind:       %s\nlayout:     %s\n", cli_kind_name(in.kind, 1), layout_of(&in));
            fputs("holder:     ", stdout);
            cli_text(stdout, in.holder, strnlen(in.holder, sizeof in.holder));
            printf("\nholders:    %d\nhold count: %lld\nttl:        %s\n", in.holders,
                   (long long)in.hold_count, ttl);
            if (in.kind == DLOCK_KIND_READ || in.kind == DLOCK_KIND_WRITE)
                printf("readers:    %lld\nwriter:     %s\n", (long long)in.readers,
                       in.writer ? "yes" : "no");
            else if (in.kind == DLOCK_KIND_FAIR)
                printf("queued:     %lld\n", (long long)in.queued);
        }
        printf("fence:      %" PRIu64 "\nwaiters:    %lld\n", in.fence, (long long)in.waiters);
    }
    dlock_client_free(c);
    return 0;
}

typedef struct list_ctx {
    const cli_global *g;
    size_t n;
    FILE *json; /* --json: the array, written out once the listing is whole */
} list_ctx;

static int list_one(const char *name, size_t name_len, const dlock_info *in, void *ud)
{
    list_ctx *lc = ud;
    if (lc->g->json) {
        fputs(lc->n ? ",\n  " : "\n  ", lc->json);
        json_info(lc->json, name, name_len, in);
    } else {
        char ttl[32];
        int w;
        cli_fmt_ttl(ttl, sizeof ttl, in->ttl_ms);
        cli_text(stdout, name, name_len);
        w = name_len < 32 ? (int)(32 - name_len) : 1;
        printf("%*s%-18s %10s %7d  ", w, "", cli_kind_name(in->kind, in->exists), ttl,
               in->holders);
        cli_text(stdout, in->holder, strnlen(in->holder, sizeof in->holder));
        switch (in->kind) {
        case DLOCK_KIND_FAIR:
            printf("%squeued=%lld", in->holder[0] ? "  " : "", (long long)in->queued);
            break;
        case DLOCK_KIND_READ:
        case DLOCK_KIND_WRITE:
            printf("%sreaders=%lld writer=%s", in->holder[0] ? "  " : "",
                   (long long)in->readers, in->writer ? "yes" : "no");
            break;
        case DLOCK_KIND_SEMAPHORE:
        case DLOCK_KIND_PERMIT_SEMAPHORE:
            printf("permits=%lld leased=%lld", (long long)in->permits, (long long)in->leased);
            break;
        case DLOCK_KIND_LATCH:
            printf("count=%lld", (long long)in->permits);
            break;
        default:
            break;
        }
        fputc('\n', stdout);
    }
    lc->n++;
    return 0;
}

int cmd_list(int argc, char **argv, cli_global *g)
{
    static const char *const cmd = "list";
    dlock_client *c = NULL;
    const char *pattern = NULL;
    list_ctx lc;
    int rc, code = 0;

    if (!parse_simple(argc, argv, g, cmd, NULL, NULL, &code))
        return code;
    if (optind < argc)
        pattern = argv[optind];
    if (optind + 1 < argc)
        return cli_usage(cmd, "unexpected argument '%s'", argv[optind + 1]);
    if (pattern && !*pattern)
        return cli_usage(cmd, "the PATTERN is empty");
    if ((code = cli_connect(g, cmd, 0, &c)))
        return code;
    lc.g = g;
    lc.n = 0;
    lc.json = NULL;
    char *buf = NULL;
    size_t buflen = 0;
    if (g->json && !(lc.json = open_memstream(&buf, &buflen))) {
        cli_err(cmd, "out of memory");
        dlock_client_free(c);
        return EXIT_OSERR;
    }
    if (g->json)
        fputs("[", lc.json);
    else if (!g->quiet)
        printf("%-31s %-18s %10s %7s  %s\n", "NAME", "KIND", "TTL", "HOLDERS",
               "HOLDER / DETAILS");
    rc = dlock_list(c, pattern, list_one, &lc);
    if (g->json) {
        fputs(lc.n ? "\n]\n" : "]\n", lc.json);
        if (fclose(lc.json) != 0 && rc == DLOCK_OK) {
            free(buf);
            cli_err(cmd, "out of memory");
            dlock_client_free(c);
            return EXIT_OSERR;
        }
        /* on failure the error object stands for the partial array */
        if (rc == DLOCK_OK)
            fwrite(buf, 1, buflen, stdout);
        free(buf);
    }
    if (rc == DLOCK_OK)
        cli_info(g, cmd,
                 "%zu shown: keys laid out as locks, semaphores or latches; keys of other "
                 "layouts are left out ('dlock help list')",
                 lc.n);
    if (rc != DLOCK_OK) {
        cli_err(cmd, "cannot list locks: %s",
                dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        code = cli_exit_code(rc, EXIT_INTERNAL);
    }
    dlock_client_free(c);
    return code;
}

int cmd_force_unlock(int argc, char **argv, cli_global *g)
{
    static const char *const cmd = "force-unlock";
    dlock_client *c = NULL;
    const char *name;
    int rc, code = 0, yes = 0, force = 0, existed = 0;
    dlock_info in;

    if (!parse_simple(argc, argv, g, cmd, &yes, &force, &code))
        return code;
    if (optind >= argc)
        return cli_usage(cmd, "missing lock NAME");
    if (optind + 1 < argc)
        return cli_usage(cmd, "unexpected argument '%s'", argv[optind + 1]);
    name = argv[optind];
    if ((rc = cli_check_name(cmd, name)))
        return rc;
    if (!yes && isatty(STDIN_FILENO)) {
        cli_err(cmd, "refusing to delete lock '%s' whoever holds it without --yes", name);
        return EXIT_USAGE;
    }
    if ((code = cli_connect(g, cmd, 0, &c)))
        return code;
    if (!force) {
        /* only what is laid out as a lock; a backend that cannot inspect
         * keeps only locks under its names */
        memset(&in, 0, sizeof in);
        rc = dlock_inspect(c, name, DLOCK_CSTR, &in);
        if (rc != DLOCK_OK && rc != DLOCK_ENOTSUP) {
            cli_err(cmd, "cannot inspect '%s': %s", name,
                    dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
            dlock_client_free(c);
            return cli_exit_code(rc, EXIT_INTERNAL);
        }
        if (rc == DLOCK_OK && in.exists && !cli_is_lock_kind(in.kind)) {
            if (in.kind)
                cli_err(cmd,
                        "'%s' holds an integer: a %s's count, or an application's counter; "
                        "not deleted (--force deletes it anyway)",
                        name, in.kind == DLOCK_KIND_LATCH ? "latch" : "semaphore");
            else
                cli_err(cmd,
                        "'%s' is not a lock (a key of a layout dlock does not recognise); "
                        "not deleted (--force deletes it anyway)",
                        name);
            dlock_client_free(c);
            return EXIT_DATAERR;
        }
    }
    rc = dlock_force_unlock(c, name, DLOCK_CSTR, &existed);
    if (rc != DLOCK_OK) {
        cli_err(cmd, "cannot force-unlock '%s': %s", name,
                dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        code = cli_exit_code(rc, EXIT_INTERNAL);
    } else if (g->json) {
        fputs("{\"name\":", stdout);
        cli_json_str(stdout, name, strlen(name));
        printf(",\"existed\":%s}\n", existed ? "true" : "false");
    } else {
        cli_info(g, cmd, existed ? "deleted lock '%s'" : "lock '%s' was not held", name);
    }
    dlock_client_free(c);
    return code;
}
