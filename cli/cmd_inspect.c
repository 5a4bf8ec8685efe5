/* `dlock status`, `dlock list`, `dlock force-unlock`: looking at locks by
 * name, and the emergency exit. */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
    "Who holds it, when the holder recorded it (dlock run, acquire and doctor\n"
    "do; other clients through dlock_client_set_identity): host, pid (of the\n"
    "dlock process: for acquire, one that has exited), command, since (UTC and\n"
    "age) and label. The record is the key dlock_holder:{NAME}:<holder>, which\n"
    "expires and is deleted with the hold.\n"
    "JSON: {\"name\",\"held\",\"kind\",\"layout\",\"holder\",\"identity\",\"holders\",\n"
    "\"hold_count\",\"ttl_ms\",\"fence\",\"waiters\"}; identity is null or {\"host\",\"pid\",\n"
    "\"command\",\"since_ms\" (Unix ms),\"label\"} (null: unknown or none; \"raw\": the\n"
    "record, when it is not one this version reads); ttl_ms is -2 when free, -1\n"
    "when held without expiry;\n"
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
    "permits=N, leased=N) and, when that holder recorded who it is,\n"
    "\"by HOST:PID [LABEL] COMMAND\" (see `dlock help status`); one line per\n"
    "lock. With --json: an array of objects as\n"
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

/* The identity the holder recorded (dlock_inspect_holder): tab-separated
 * host, pid, since (Unix ms), label and command; later versions may add
 * fields after these, which are ignored. Parsed defensively: a missing or
 * malformed field is unknown (length 0, or -1 for the numbers), and `bad`
 * says the record is not the one this version writes, so that status shows
 * it raw as well. */
enum { ID_HOST, ID_PID, ID_SINCE, ID_LABEL, ID_COMMAND, ID_FIELDS };
typedef struct identity {
    char raw[2048];
    const char *f[ID_FIELDS];
    size_t flen[ID_FIELDS];
    long long pid;      /* -1: unknown */
    long long since_ms; /* -1: unknown */
    int bad;
} identity;

/* A decimal number of at most 18 digits (no sign, no spaces), else -1. */
static long long parse_decimal(const char *s, size_t n)
{
    long long v = 0;
    size_t i;
    if (n == 0 || n > 18)
        return -1;
    for (i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static void parse_identity(identity *id)
{
    const char *p = id->raw;
    int n = 0;
    memset(id->f, 0, sizeof id->f);
    memset(id->flen, 0, sizeof id->flen);
    while (n < ID_FIELDS) {
        const char *tab = strchr(p, '\t');
        id->f[n] = p;
        id->flen[n] = tab ? (size_t)(tab - p) : strlen(p);
        n++;
        if (!tab)
            break;
        p = tab + 1;
    }
    id->pid = id->f[ID_PID] ? parse_decimal(id->f[ID_PID], id->flen[ID_PID]) : -1;
    if (id->pid == 0)
        id->pid = -1;
    id->since_ms = id->f[ID_SINCE] ? parse_decimal(id->f[ID_SINCE], id->flen[ID_SINCE]) : -1;
    id->bad = n < ID_FIELDS || id->flen[ID_HOST] == 0 || id->pid < 0 || id->since_ms < 0;
}

/* Reads the identity of in's holder into *id. Returns 1 when there is one,
 * 0 when there is none: no lock held, no record (the holder records none,
 * or its hold just ended), or a client that cannot read records (RedLock,
 * the backends other than Redis); a failure is told on stderr, once per
 * run (*warned), and counts as none, so that status and list still show
 * the lock (an ACL may deny the record's key). */
static int read_identity(dlock_client *c, const char *cmd, const char *name, size_t name_len,
                         const dlock_info *in, identity *id, int *warned)
{
    int rc;
    id->raw[0] = '\0';
    if (!in->exists || !cli_is_lock_kind(in->kind) || !in->holder[0])
        return 0;
    rc = dlock_inspect_holder(c, name, name_len, in->holder, id->raw, sizeof id->raw);
    if (rc == DLOCK_ENOTSUP)
        return 0;
    if (rc != DLOCK_OK) {
        if (!*warned)
            cli_err(cmd, "warning: cannot read the holder's identity: %s",
                    dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        *warned = 1;
        id->raw[0] = '\0';
        return 0;
    }
    if (!id->raw[0])
        return 0;
    parse_identity(id);
    return 1;
}

/* Writes field i of id as a JSON string, or null when empty. */
static void json_field(FILE *f, const identity *id, int i)
{
    if (id->f[i] && id->flen[i])
        cli_json_str(f, id->f[i], id->flen[i]);
    else
        fputs("null", f);
}

static void json_identity(FILE *f, const identity *id)
{
    if (!id || !id->raw[0]) {
        fputs("null", f);
        return;
    }
    fputs("{\"host\":", f);
    json_field(f, id, ID_HOST);
    fputs(",\"pid\":", f);
    if (id->pid >= 0)
        fprintf(f, "%lld", id->pid);
    else
        fputs("null", f);
    fputs(",\"command\":", f);
    json_field(f, id, ID_COMMAND);
    fputs(",\"since_ms\":", f);
    if (id->since_ms >= 0)
        fprintf(f, "%lld", id->since_ms);
    else
        fputs("null", f);
    fputs(",\"label\":", f);
    json_field(f, id, ID_LABEL);
    if (id->bad) {
        fputs(",\"raw\":", f);
        cli_json_str(f, id->raw, strlen(id->raw));
    }
    fputc('}', f);
}

/* "2026-11-25T14:03:07Z (12 s ago)", or the raw milliseconds when they
 * make no date. */
static void fmt_since(char *buf, size_t len, long long since_ms)
{
    struct timespec now;
    struct tm tm;
    time_t t = (time_t)(since_ms / 1000);
    char date[32], age[48];
    long long d, s;
    clock_gettime(CLOCK_REALTIME, &now);
    d = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000 - since_ms;
    s = (d < 0 ? -d : d) / 1000;
    if (!gmtime_r(&t, &tm) || strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) {
        snprintf(buf, len, "%lld ms since 1970", since_ms);
        return;
    }
    if (s < 60)
        snprintf(age, sizeof age, "%lld s", s);
    else if (s < 3600)
        snprintf(age, sizeof age, "%lld min %lld s", s / 60, s % 60);
    else if (s < 86400)
        snprintf(age, sizeof age, "%lld h %lld min", s / 3600, s % 3600 / 60);
    else
        snprintf(age, sizeof age, "%lld d %lld h", s / 86400, s % 86400 / 3600);
    if (d < 0)
        snprintf(buf, len, "%s (%s ahead of this host's clock)", date, age);
    else
        snprintf(buf, len, "%s (%s ago)", date, age);
}

/* status: one line per known field of the identity. */
static void text_identity(FILE *f, const identity *id)
{
    static const char *const labels[ID_FIELDS] = {"host:       ", "pid:        ", "since:      ",
                                                  "label:      ", "command:    "};
    static const int order[] = {ID_HOST, ID_PID, ID_COMMAND, ID_SINCE, ID_LABEL};
    size_t k;
    char since[160];
    for (k = 0; k < sizeof order / sizeof order[0]; k++) {
        int i = order[k];
        if (!id->f[i] || !id->flen[i])
            continue;
        if ((i == ID_PID && id->pid < 0) || (i == ID_SINCE && id->since_ms < 0))
            continue;
        fputs(labels[i], f);
        if (i == ID_SINCE) {
            fmt_since(since, sizeof since, id->since_ms);
            fputs(since, f);
        } else {
            cli_text(f, id->f[i], id->flen[i]);
        }
        fputc('\n', f);
    }
    if (id->bad) {
        fputs("record:     ", f);
        cli_text(f, id->raw, strlen(id->raw));
        fputs("  (not the host, pid, since, label, command this version reads)\n", f);
    }
}

/* list: "by HOST:PID [LABEL] COMMAND", unknown parts as '?' or left out. */
static void text_identity_short(FILE *f, const identity *id)
{
    fputs("by ", f);
    if (id->flen[ID_HOST])
        cli_text(f, id->f[ID_HOST], id->flen[ID_HOST]);
    else
        fputc('?', f);
    if (id->pid >= 0)
        fprintf(f, ":%lld", id->pid);
    else
        fputs(":?", f);
    if (id->f[ID_LABEL] && id->flen[ID_LABEL]) {
        fputs(" [", f);
        cli_text(f, id->f[ID_LABEL], id->flen[ID_LABEL]);
        fputc(']', f);
    }
    if (id->f[ID_COMMAND] && id->flen[ID_COMMAND]) {
        fputc(' ', f);
        cli_text(f, id->f[ID_COMMAND], id->flen[ID_COMMAND]);
    }
}

static void json_info(FILE *f, const char *name, size_t name_len, const dlock_info *in,
                      const identity *id)
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
    fputs(",\"identity\":", f);
    json_identity(f, id);
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
    identity id;
    const char *name;
    int rc, code = 0, has_id, warned = 0;
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
    has_id = read_identity(c, cmd, name, strlen(name), &in, &id, &warned);
    if (g->json) {
        json_info(stdout, name, strlen(name), &in, has_id ? &id : NULL);
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
            fputc('\n', stdout);
            if (has_id)
                text_identity(stdout, &id);
            printf("holders:    %d\nhold count: %lld\nttl:        %s\n", in.holders,
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
    dlock_client *c;
    int warned; /* a holder's identity could not be read (told once) */
    size_t n;
    FILE *json; /* --json: the array, written out once the listing is whole */
} list_ctx;

static int list_one(const char *name, size_t name_len, const dlock_info *in, void *ud)
{
    list_ctx *lc = ud;
    identity id;
    /* a second round trip per held lock, on another of the client's
     * connections (the listing keeps its own) */
    int has_id = read_identity(lc->c, "list", name, name_len, in, &id, &lc->warned);
    if (lc->g->json) {
        fputs(lc->n ? ",\n  " : "\n  ", lc->json);
        json_info(lc->json, name, name_len, in, has_id ? &id : NULL);
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
        if (has_id) {
            fputs("  ", stdout);
            text_identity_short(stdout, &id);
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
    lc.c = c;
    lc.warned = 0;
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
