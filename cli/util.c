/* Shared helpers of the dlock command-line tool. */
#include "util.h"
#include "cmds.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- messages ---- */

static void vmsg(const char *cmd, const char *fmt, va_list ap)
{
    if (cmd)
        fprintf(stderr, "dlock %s: ", cmd);
    else
        fputs("dlock: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* The last message of cli_err, cli_usage or cli_info, for the JSON error
 * object (cli_json_error). */
static char last_error[1024];

static void keep_error(const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof last_error, fmt, ap);
}

void cli_err(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(cmd, fmt, ap);
    va_end(ap);
    va_start(ap, fmt);
    keep_error(fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int cli_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(cmd, fmt, ap);
    va_end(ap);
    va_start(ap, fmt);
    keep_error(fmt, ap);
    va_end(ap);
    if (cmd)
        fprintf(stderr, " (try 'dlock help %s')\n", cmd);
    else
        fputs(" (try 'dlock help')\n", stderr);
    return EXIT_USAGE;
}

void cli_json_error(FILE *f, int code)
{
    fputs("{\"error\":", f);
    cli_json_str(f, last_error, strlen(last_error));
    fprintf(f, ",\"code\":%d}\n", code);
}

int cli_have_error(void) { return last_error[0] != '\0'; }

void cli_info(const cli_global *g, const char *cmd, const char *fmt, ...)
{
    va_list ap;
    /* kept for the JSON error object, quiet or not: a busy lock is told
     * this way */
    va_start(ap, fmt);
    keep_error(fmt, ap);
    va_end(ap);
    if (g->quiet)
        return;
    va_start(ap, fmt);
    vmsg(cmd, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- global options ---- */

int cli_common_opt(cli_global *g, const char *cmd, int opt, char *const *argv)
{
    switch (opt) {
    case OPT_URL:
        if (!*optarg)
            return cli_usage(cmd, "--url: empty URL");
        if (g->nurls >= CLI_MAX_URLS)
            return cli_usage(cmd, "--url: at most %d URLs", CLI_MAX_URLS);
        g->url = optarg;
        g->urls[g->nurls++] = optarg;
        return 0;
    case OPT_FENCE_URL:
        if (!*optarg)
            return cli_usage(cmd, "--fence-url: empty URL");
        if (strncmp(optarg, "redis://", 8) != 0 && strncmp(optarg, "rediss://", 9) != 0 &&
            strncmp(optarg, "unix://", 7) != 0)
            return cli_usage(cmd, "--fence-url: expected a redis:// URL of one server, not '%s'",
                             optarg);
        g->fence_url = optarg;
        return 0;
    case OPT_WAIT_REPLICAS: {
        long n = 0;
        int rc = cli_integer(cmd, "--wait-replicas", optarg, 0, 1000, &n);
        if (!rc)
            g->wait_replicas = (int)n;
        return rc;
    }
    case OPT_FAIR_WAIT:
        return cli_duration(cmd, "--fair-wait", optarg, 1, &g->fair_wait_ms);
    case OPT_FAIL_FAST:
        g->fail_fast = 1;
        return 0;
    case OPT_WAIT_REPLICAS_TIMEOUT:
        return cli_duration(cmd, "--wait-replicas-timeout", optarg, 1,
                            &g->wait_replicas_timeout_ms);
    case OPT_TLS_CA_FILE:
    case OPT_TLS_CA_DIR:
    case OPT_TLS_CERT:
    case OPT_TLS_KEY:
    case OPT_TLS_SERVER_NAME: {
        static const char *const names[] = {"--tls-ca-file", "--tls-ca-dir", "--tls-cert",
                                            "--tls-key", "--tls-server-name"};
        const char **slot[] = {&g->tls_ca_file, &g->tls_ca_dir, &g->tls_cert, &g->tls_key,
                               &g->tls_server_name};
        int i = opt - OPT_TLS_CA_FILE;
        if (!*optarg)
            return cli_usage(cmd, "%s: empty argument", names[i]);
        *slot[i] = optarg;
        g->tls_any = 1;
        return 0;
    }
    case OPT_TLS_INSECURE:
        g->tls_insecure = 1;
        g->tls_any = 1;
        return 0;
    case OPT_PASSWORD_FILE:
        g->password_file = optarg;
        return 0;
    case OPT_TIMEOUT:
        return cli_duration(cmd, "--timeout", optarg, 1, &g->timeout_ms);
    case 'v':
        g->verbose = 1;
        return 0;
    case 'q':
        g->quiet = 1;
        return 0;
    case OPT_JSON:
        g->json = 1;
        return 0;
    case 'h':
        return CLI_WANT_HELP;
    case '?':
        if (optopt > 0 && optopt < 256)
            return cli_usage(cmd, "unknown option '-%c'", optopt);
        if (optopt > 0 && optind > 0 && strncmp(argv[optind - 1], "--", 2) == 0 &&
            strchr(argv[optind - 1], '=')) {
            const char *a = argv[optind - 1];
            return cli_usage(cmd, "option '%.*s' takes no argument", (int)(strchr(a, '=') - a),
                             a);
        }
        return cli_usage(cmd, "unknown option '%s'", argv[optind - 1]);
    case ':':
        if (optind > 0 && strncmp(argv[optind - 1], "--", 2) == 0)
            return cli_usage(cmd, "option '%s' needs an argument", argv[optind - 1]);
        if (optopt > 0 && optopt < 256)
            return cli_usage(cmd, "option '-%c' needs an argument", optopt);
        return cli_usage(cmd, "option '%s' needs an argument", argv[optind - 1]);
    default:
        return -1;
    }
}

/* ---- argument parsing ---- */

int cli_duration(const char *cmd, const char *opt, const char *s, int64_t min_ms, int64_t *ms)
{
    int64_t v = 0;
    if (dlock_parse_duration(s, &v) != DLOCK_OK)
        return cli_usage(cmd, "%s: bad duration '%s' (examples: 250ms, 1.5s, 30s, 5m, 1h)",
                         opt, s);
    if (v < min_ms) {
        if (min_ms > 0)
            return cli_usage(cmd, "%s: must be more than zero, not '%s'", opt, s);
        return cli_usage(cmd, "%s: bad duration '%s'", opt, s);
    }
    *ms = v;
    return 0;
}

int cli_integer(const char *cmd, const char *opt, const char *s, long lo, long hi, long *v)
{
    char *end = NULL;
    long x;
    errno = 0;
    x = strtol(s, &end, 10);
    if (!*s || *end || errno || x < lo || x > hi)
        return cli_usage(cmd, "%s: expected a number from %ld to %ld, not '%s'", opt, lo, hi,
                         s);
    *v = x;
    return 0;
}

int cli_check_name(const char *cmd, const char *name)
{
    size_t n = strlen(name);
    if (n == 0)
        return cli_usage(cmd, "the lock name is empty");
    if (n > DLOCK_NAME_MAX)
        return cli_usage(cmd, "the lock name is %zu bytes long; the limit is %d", n,
                         DLOCK_NAME_MAX);
    return 0;
}

int cli_check_label(const char *cmd, const char *label)
{
    size_t n = strlen(label), i;
    if (n > CLI_LABEL_MAX)
        return cli_usage(cmd, "--label: %zu bytes long; the limit is %d", n, CLI_LABEL_MAX);
    for (i = 0; i < n; i++)
        if ((unsigned char)label[i] < 0x20 || label[i] == 0x7F)
            return cli_usage(cmd, "--label: no tabs, line breaks or other control characters");
    return 0;
}

int cli_kind(const char *cmd, const char *s, dlock_kind *kind)
{
    if (strcmp(s, "plain") == 0)
        *kind = DLOCK_KIND_PLAIN;
    else if (strcmp(s, "reentrant") == 0)
        *kind = DLOCK_KIND_REENTRANT;
    else if (strcmp(s, "fair") == 0)
        *kind = DLOCK_KIND_FAIR;
    else if (strcmp(s, "read") == 0)
        *kind = DLOCK_KIND_READ;
    else if (strcmp(s, "write") == 0)
        *kind = DLOCK_KIND_WRITE;
    else
        return cli_usage(cmd, "--kind: unknown kind '%s' (plain, reentrant, fair, read or write)",
                         s);
    return 0;
}

int cli_is_lock_kind(int kind)
{
    return kind == DLOCK_KIND_PLAIN || kind == DLOCK_KIND_REENTRANT || kind == DLOCK_KIND_FAIR ||
           kind == DLOCK_KIND_READ || kind == DLOCK_KIND_WRITE;
}

const char *cli_kind_name(int kind, int exists)
{
    if (!exists)
        return "free";
    switch (kind) {
    case DLOCK_KIND_PLAIN:
        return "plain";
    case DLOCK_KIND_REENTRANT:
        return "reentrant";
    case DLOCK_KIND_FAIR:
        return "fair";
    case DLOCK_KIND_READ:
        return "read";
    case DLOCK_KIND_WRITE:
        return "write";
    case DLOCK_KIND_SEMAPHORE:
        /* the library cannot tell a semaphore from a latch (both an integer
         * STRING), nor from an expirable semaphore with no permit out */
        return "semaphore or latch";
    case DLOCK_KIND_PERMIT_SEMAPHORE:
        return "permit-semaphore";
    case DLOCK_KIND_LATCH:
        return "latch";
    default:
        return "other";
    }
}

/* ---- connecting ---- */

int cli_exit_code(int code, int conflict)
{
    switch (code) {
    case DLOCK_OK:
        return 0;
    case DLOCK_EBUSY:
    case DLOCK_ETIMEDOUT:
        return conflict;
    case DLOCK_EINVAL:
    case DLOCK_ENAMETOOLONG:
    case DLOCK_ENOTSUP:
        return EXIT_USAGE;
    case DLOCK_EIO:
    case DLOCK_ESERVER:
    case DLOCK_ENOQUORUM:
        return EXIT_UNAVAILABLE;
    case DLOCK_EREPLICAS:
        return EXIT_TEMPFAIL;
    case DLOCK_ETLS:
        return EXIT_PROTOCOL;
    case DLOCK_EAUTH:
        return EXIT_NOPERM;
    case DLOCK_ENOTOWNER:
        return EXIT_NOTOWNER;
    case DLOCK_ELOST:
        return EXIT_LOST;
    default:
        return EXIT_INTERNAL;
    }
}

/* Reads the first line of path into a malloc'd string. */
#define PASSWORD_MAX 4096

static int read_password(const char *cmd, const char *path, char **out)
{
    FILE *f = fopen(path, "r");
    char *line;
    ssize_t n = 0;
    int saved, ch = EOF;
    if (!f) {
        cli_err(cmd, "cannot read password file '%s': %s", path, strerror(errno));
        return EXIT_NOINPUT;
    }
    line = malloc(PASSWORD_MAX + 1);
    if (!line) {
        fclose(f);
        cli_err(cmd, "out of memory");
        return EXIT_INTERNAL;
    }
    /* the first line, at most PASSWORD_MAX bytes: an endless file
     * (/dev/zero) must not take all memory */
    errno = 0;
    while (n <= PASSWORD_MAX && (ch = getc(f)) != EOF && ch != '\n') line[n++] = (char)ch;
    saved = ferror(f) ? errno : 0;
    fclose(f);
    if (n > PASSWORD_MAX) {
        free(line);
        cli_err(cmd, "password file '%s': first line longer than %d bytes", path, PASSWORD_MAX);
        return EXIT_NOINPUT;
    }
    line[n] = '\0';
    if (n == 0 && (saved || ch == EOF)) {
        free(line);
        if (saved) {
            cli_err(cmd, "cannot read password file '%s': %s", path, strerror(saved));
            return EXIT_NOINPUT;
        }
        cli_err(cmd, "password file '%s' is empty", path);
        return EXIT_NOINPUT;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    if (n == 0) {
        free(line);
        cli_err(cmd, "password file '%s' is empty", path);
        return EXIT_NOINPUT;
    }
    *out = line;
    return 0;
}

/* Builds "redlock://NODE,NODE,..." from several --url values (each
 * redis://[user[:password]@]host[:port][/db]) into a malloc'd string. */
static int build_redlock_url(const cli_global *g, const char *cmd, char **out)
{
    size_t len = 11, i;
    char *u, *p;
    for (i = 0; i < (size_t)g->nurls; i++) {
        const char *a = g->urls[i], *rest = a + 8;
        if (strncmp(a, "redis://", 8) != 0)
            return cli_usage(cmd, "--url: with several --url, each must be "
                                  "redis://[user:password@]host:port[/db], not '%s'", a);
        if (!*rest || *rest == '/' || *rest == ':' || rest[strcspn(rest, ",?# \t")] ||
            rest[strlen(rest) - 1] == '@')
            return cli_usage(cmd, "--url: bad RedLock node '%s' (expected "
                                  "redis://[user:password@]host:port[/db]; a ',' in a password "
                                  "must be written %%2C)", a);
        len += strlen(rest) + 1;
    }
    u = malloc(len);
    if (!u) {
        cli_err(cmd, "out of memory");
        return EXIT_INTERNAL;
    }
    p = u + sprintf(u, "redlock://");
    for (i = 0; i < (size_t)g->nurls; i++)
        p += sprintf(p, "%s%s", i ? "," : "", g->urls[i] + 8);
    *out = u;
    return 0;
}

int cli_set_identity(const cli_global *g, const char *cmd, dlock_client *c, const char *command)
{
    int rc = dlock_client_set_identity(c, command, g->label && *g->label ? g->label : NULL);
    if (rc == DLOCK_OK || rc == DLOCK_ENOTSUP)
        return 0;
    cli_err(cmd, "cannot record the holder's identity: %s",
            dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
    return cli_exit_code(rc, EXIT_INTERNAL);
}

int cli_is_redlock(const cli_global *g)
{
    const char *url = g->url ? g->url : getenv("DLOCK_URL");
    return g->nurls > 1 || (url && strncmp(url, "redlock://", 10) == 0);
}

/* Checks that a file given to a --tls-* option can be read (66 if not). */
static int check_readable(const char *cmd, const char *opt, const char *path, int dir)
{
    if (!path)
        return 0;
    if (access(path, dir ? (R_OK | X_OK) : R_OK) != 0) {
        cli_err(cmd, "%s: cannot read '%s': %s", opt, path, strerror(errno));
        return EXIT_NOINPUT;
    }
    return 0;
}

/* The checks of the global options that need all of them (done before
 * connecting). *redlock receives a malloc'd redlock:// URL for several
 * --url values. */
static int check_global(const cli_global *g, const char *cmd, char **redlock)
{
    const char *url = g->url ? g->url : getenv("DLOCK_URL");
    int rc = 0, is_redlock;

    *redlock = NULL;
    if (g->nurls > 1) {
        if ((rc = build_redlock_url(g, cmd, redlock)))
            return rc;
        url = *redlock;
    }
    if (!url || !*url)
        url = "redis://127.0.0.1:6379";
    is_redlock = strncmp(url, "redlock://", 10) == 0;
    if (g->fence_url && !is_redlock)
        rc = cli_usage(cmd, "--fence-url is for RedLock: give several --url values or a "
                            "redlock:// URL");
    else if (g->wait_replicas && is_redlock)
        rc = cli_usage(cmd, "--wait-replicas does not work with RedLock (several --url)");
    else if (g->wait_replicas_timeout_ms && !g->wait_replicas)
        rc = cli_usage(cmd, "--wait-replicas-timeout needs --wait-replicas N");
    else if (g->tls_any && strncmp(url, "rediss://", 9) != 0)
        rc = cli_usage(cmd, "the --tls-* options need a rediss:// URL (one server)");
    else if (!g->tls_cert != !g->tls_key)
        rc = cli_usage(cmd, "--tls-cert and --tls-key go together");
    else if (!(rc = check_readable(cmd, "--tls-ca-file", g->tls_ca_file, 0)) &&
             !(rc = check_readable(cmd, "--tls-ca-dir", g->tls_ca_dir, 1)) &&
             !(rc = check_readable(cmd, "--tls-cert", g->tls_cert, 0)))
        rc = check_readable(cmd, "--tls-key", g->tls_key, 0);
    if (rc) {
        free(*redlock);
        *redlock = NULL;
    }
    return rc;
}

int cli_connect(const cli_global *g, const char *cmd, int64_t watchdog_ms, dlock_client **out)
{
    dlock_options o;
    char *password = NULL, *redlock = NULL;
    dlock_client *c = NULL;
    int rc;

    *out = NULL;
    if ((rc = check_global(g, cmd, &redlock)))
        return rc;
    if (g->password_file) {
        rc = read_password(cmd, g->password_file, &password);
        if (rc) {
            free(redlock);
            return rc;
        }
    }
    dlock_options_init(&o);
    o.url = redlock ? redlock : g->url;
    o.fence_url = g->fence_url;
    o.wait_replicas = g->wait_replicas;
    o.wait_replicas_timeout_ms = g->wait_replicas_timeout_ms;
    o.tls_ca_file = g->tls_ca_file;
    o.tls_ca_dir = g->tls_ca_dir;
    o.tls_cert_file = g->tls_cert;
    o.tls_key_file = g->tls_key;
    o.tls_server_name = g->tls_server_name;
    o.tls_insecure = g->tls_insecure;
    o.password = password;
    o.connect_timeout_ms = g->connect_timeout_ms ? g->connect_timeout_ms : g->timeout_ms;
    o.command_timeout_ms = g->timeout_ms;
    o.watchdog_lease_ms = watchdog_ms;
    o.max_idle_connections = 2;
#ifdef DLOCK_CLI_FUZZ
    cli_fuzz_redirect(&o); /* the fuzz target points every valid URL at a dead address */
#endif
    rc = dlock_client_new(&o, &c);
    free(redlock);
    if (password) {
        explicit_bzero(password, strlen(password));
        free(password);
    }
    if (rc != DLOCK_OK) {
        const char *msg = c ? dlock_errmsg(c) : "";
        if (!msg || !*msg)
            msg = dlock_strerror(rc);
        if (rc == DLOCK_EINVAL)
            cli_err(cmd, "%s", msg);
        else if (rc == DLOCK_EIO || rc == DLOCK_ENOQUORUM)
            cli_err(cmd, "server unavailable: %s", msg);
        else if (rc == DLOCK_EAUTH)
            cli_err(cmd, "authentication refused: %s", msg);
        else if (rc == DLOCK_ETLS)
            cli_err(cmd, "TLS failed: %s", msg);
        else if (rc == DLOCK_ENOTSUP)
            cli_err(cmd, "not supported: %s", msg);
        else
            cli_err(cmd, "cannot connect: %s", msg);
        dlock_client_free(c);
        return cli_exit_code(rc, EXIT_INTERNAL);
    }
    /* the library checks the range and that the backend has fair locks */
    if (g->fair_wait_ms && (rc = dlock_client_set_fair_wait(c, g->fair_wait_ms)) != DLOCK_OK) {
        cli_err(cmd, "--fair-wait: %s", dlock_errmsg(c));
        dlock_client_free(c);
        return rc == DLOCK_EINVAL ? EXIT_USAGE : cli_exit_code(rc, EXIT_INTERNAL);
    }
    if (g->fail_fast) (void)dlock_client_set_fail_fast(c, 1); /* fails only on NULL */
    *out = c;
    return 0;
}

/* ---- output ---- */

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t need, i;
    uint32_t cp;
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) {
        need = 2;
        cp = s[0] & 0x1F;
    } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        need = 3;
        cp = s[0] & 0x0F;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        need = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (n < need)
        return 0;
    for (i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((need == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (need == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return need;
}

void cli_json_str(FILE *f, const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    fputc('"', f);
    while (i < len) {
        unsigned char ch = s[i];
        size_t n;
        switch (ch) {
        case '"':
            fputs("\\\"", f);
            i++;
            continue;
        case '\\':
            fputs("\\\\", f);
            i++;
            continue;
        case '\n':
            fputs("\\n", f);
            i++;
            continue;
        case '\r':
            fputs("\\r", f);
            i++;
            continue;
        case '\t':
            fputs("\\t", f);
            i++;
            continue;
        default:
            break;
        }
        if (ch < 0x20 || ch == 0x7F) {
            fprintf(f, "\\u%04x", ch);
            i++;
            continue;
        }
        n = utf8_len(s + i, len - i);
        if (n == 0) {
            fprintf(f, "\\u%04x", ch); /* not UTF-8: the byte as a code point */
            i++;
            continue;
        }
        fwrite(s + i, 1, n, f);
        i += n;
    }
    fputc('"', f);
}

void cli_text(FILE *f, const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i;
    for (i = 0; i < len; i++) {
        if (s[i] == '\\')
            fputs("\\\\", f);
        else if (s[i] < 0x20 || s[i] == 0x7F)
            fprintf(f, "\\x%02x", s[i]);
        else
            fputc(s[i], f);
    }
}

void cli_fmt_ttl(char *buf, size_t len, int64_t ttl_ms)
{
    if (ttl_ms == -2)
        snprintf(buf, len, "-");
    else if (ttl_ms < 0)
        snprintf(buf, len, "none");
    else
        snprintf(buf, len, "%lld.%03llds", (long long)(ttl_ms / 1000),
                 (long long)(ttl_ms % 1000));
}
