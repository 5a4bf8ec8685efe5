/* Shared helpers of the dlock command-line tool: exit codes, global options,
 * messages, connecting, and output formatting (text escaping and JSON).
 * The tool is a client of the public API (<dlock.h>) only. */
#ifndef DLOCK_CLI_UTIL_H
#define DLOCK_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <dlock.h>

/* ---- exit codes (documented in docs/dlock.1 and docs/cli.md) ---- */
enum {
    EXIT_CONFLICT_DEFAULT = 1, /* -n / -w: the lock was not had (see -E) */
    EXIT_USAGE = 64,           /* EX_USAGE: bad option, argument or URL */
    EXIT_DATAERR = 65,         /* EX_DATAERR: force-unlock: the key is not a lock (no --force) */
    EXIT_NOINPUT = 66,         /* EX_NOINPUT: the password file cannot be read */
    EXIT_UNAVAILABLE = 69,     /* EX_UNAVAILABLE: server unreachable or refused */
    EXIT_INTERNAL = 70,        /* EX_SOFTWARE: internal or protocol error */
    EXIT_OSERR = 71,           /* EX_OSERR: fork, pipe... failed */
    EXIT_TEMPFAIL = 75,        /* EX_TEMPFAIL: too few replicas acknowledged (--wait-replicas) */
    EXIT_PROTOCOL = 76,        /* EX_PROTOCOL: TLS handshake or certificate check failed */
    EXIT_NOPERM = 77,          /* EX_NOPERM: authentication refused */
    EXIT_CONFIG = 78,          /* EX_CONFIG: `doctor` found a FAIL */
    EXIT_LOST = 80,            /* run: the lock was lost while the command ran */
    EXIT_NOTOWNER = 81,        /* release/extend: the token does not own the lock */
    EXIT_CANNOT_EXEC = 126,    /* run: the command cannot be executed */
    EXIT_NOT_FOUND = 127       /* run: the command was not found */
};

/* ---- global options ---- */
#define CLI_MAX_URLS 32        /* --url given several times: RedLock nodes */
typedef struct cli_global {
    const char *url;           /* --url, else NULL ($DLOCK_URL / default) */
    const char *urls[CLI_MAX_URLS]; /* every --url, in order */
    int nurls;
    const char *fence_url;     /* --fence-url (RedLock) */
    int wait_replicas;         /* --wait-replicas N */
    int64_t wait_replicas_timeout_ms; /* --wait-replicas-timeout, 0: library default */
    int64_t fair_wait_ms;      /* --fair-wait, 0: library default */
    int fail_fast;             /* --fail-fast: a wait ends at a connection failure */
    const char *label;         /* run / acquire --label: recorded with the holds, or NULL */
    const char *tls_ca_file, *tls_ca_dir, *tls_cert, *tls_key, *tls_server_name;
    int tls_insecure;
    int tls_any;               /* 1 if any --tls-* option was given */
    const char *password_file; /* --password-file */
    int64_t timeout_ms;        /* --timeout, 0: library defaults */
    int64_t connect_timeout_ms;/* if set, overrides timeout_ms for connecting */
    int verbose;
    int quiet;
    int json;
} cli_global;

/* getopt_long() codes of the global long options (beyond any char). */
enum {
    OPT_URL = 1000,
    OPT_PASSWORD_FILE,
    OPT_TIMEOUT,
    OPT_JSON,
    OPT_FENCE_URL,
    OPT_WAIT_REPLICAS,
    OPT_WAIT_REPLICAS_TIMEOUT,
    OPT_TLS_CA_FILE,
    OPT_TLS_CA_DIR,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_TLS_SERVER_NAME,
    OPT_TLS_INSECURE,
    OPT_FAIR_WAIT,
    OPT_FAIL_FAST,
    OPT_FIRST_LOCAL_ = 1100 /* commands number their own long options from here */
};

/* The global options, for splicing into each command's struct option array. */
#define CLI_GLOBAL_LONGOPTS                                   \
    {"url", required_argument, NULL, OPT_URL},                \
    {"password-file", required_argument, NULL, OPT_PASSWORD_FILE}, \
    {"timeout", required_argument, NULL, OPT_TIMEOUT},        \
    {"verbose", no_argument, NULL, 'v'},                      \
    {"quiet", no_argument, NULL, 'q'},                        \
    {"json", no_argument, NULL, OPT_JSON},                    \
    {"fence-url", required_argument, NULL, OPT_FENCE_URL},    \
    {"wait-replicas", required_argument, NULL, OPT_WAIT_REPLICAS}, \
    {"wait-replicas-timeout", required_argument, NULL, OPT_WAIT_REPLICAS_TIMEOUT}, \
    {"tls-ca-file", required_argument, NULL, OPT_TLS_CA_FILE}, \
    {"tls-ca-dir", required_argument, NULL, OPT_TLS_CA_DIR},  \
    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},      \
    {"tls-key", required_argument, NULL, OPT_TLS_KEY},        \
    {"tls-server-name", required_argument, NULL, OPT_TLS_SERVER_NAME}, \
    {"tls-insecure", no_argument, NULL, OPT_TLS_INSECURE},    \
    {"fair-wait", required_argument, NULL, OPT_FAIR_WAIT},    \
    {"fail-fast", no_argument, NULL, OPT_FAIL_FAST},          \
    {"help", no_argument, NULL, 'h'}
#define CLI_GLOBAL_SHORTOPTS "vqh"

/* Handles one getopt_long() result if it is a global option, an unknown
 * option or a missing argument.
 * Returns -1 when opt is none of these (the caller handles it), 0 when
 * handled, or an exit code (usage error, or -2 for --help: the caller prints
 * its help and exits 0). argv is the vector given to getopt_long. */
#define CLI_WANT_HELP (-2)
int cli_common_opt(cli_global *g, const char *cmd, int opt, char *const *argv);

/* ---- messages: one line on stderr, prefixed "dlock: " / "dlock CMD: " ---- */
void cli_err(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "dlock CMD: <msg> (try 'dlock help CMD')" and returns EXIT_USAGE. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* With --json, a failure writes {"error": MESSAGE, "code": EXIT CODE} on
 * stdout instead of the data: MESSAGE is the last one of cli_err, cli_usage
 * or cli_info (printed or, under -q, not). cli_have_error: 1 once there is
 * one. */
void cli_json_error(FILE *f, int code);
int cli_have_error(void);
/* Verbose/info line on stderr unless quiet. */
void cli_info(const cli_global *g, const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- argument parsing ---- */
/* Parses a duration option; min_ms is the smallest value allowed (0 or 1).
 * Returns 0 or EXIT_USAGE (message printed). */
int cli_duration(const char *cmd, const char *opt, const char *s, int64_t min_ms, int64_t *ms);
/* Parses a decimal integer in [lo, hi]. Returns 0 or EXIT_USAGE. */
int cli_integer(const char *cmd, const char *opt, const char *s, long lo, long hi, long *v);
/* Checks a lock name (1..DLOCK_NAME_MAX bytes). Returns 0 or EXIT_USAGE. */
int cli_check_name(const char *cmd, const char *name);
/* Checks a --label TEXT: at most CLI_LABEL_MAX bytes, no control bytes
 * (tabs and line breaks would be changed by the record's format). "" is
 * no label. Returns 0 or EXIT_USAGE. */
#define CLI_LABEL_MAX 255
int cli_check_label(const char *cmd, const char *label);
/* Parses --kind. Returns 0 or EXIT_USAGE. */
int cli_kind(const char *cmd, const char *s, dlock_kind *kind);
const char *cli_kind_name(int kind, int exists);
/* 1 for the kinds of locks (plain, reentrant, fair, read, write), 0 for
 * semaphores, latches and keys of other layouts (kind 0). */
int cli_is_lock_kind(int kind);

/* ---- connecting ---- */
/* Reads the password file (if any), creates and connects the client.
 * watchdog_ms: the client's watchdog lease (0: default).
 * Returns 0, or an exit code after printing one line. */
int cli_connect(const cli_global *g, const char *cmd, int64_t watchdog_ms, dlock_client **out);
/* Makes c record who holds the locks it takes (dlock_client_set_identity):
 * command (NULL: dlock's own command line) and g->label. A client that
 * cannot (RedLock, the backends other than Redis) records none, silently.
 * Every command that takes, renews or releases a lock calls it: a renewal or
 * release without it would leave the record's expiry behind the lock's.
 * Returns 0, or an exit code after printing one line. */
int cli_set_identity(const cli_global *g, const char *cmd, dlock_client *c, const char *command);
/* 1 if the client would be a RedLock one (several --url, or redlock://). */
int cli_is_redlock(const cli_global *g);
/* Maps a library code to an exit code (conflict: the code for EBUSY/ETIMEDOUT). */
int cli_exit_code(int code, int conflict);

#ifdef DLOCK_CLI_FUZZ
/* Fuzz builds only (tests/fuzz/fuzz_cli.c defines it): called by cli_connect()
 * just before dlock_client_new(), to replace o->url and o->fence_url, when
 * they parse, by addresses of the same kind where nothing listens. */
void cli_fuzz_redirect(dlock_options *o);
#endif

/* ---- output ---- */
/* Writes bytes as a JSON string (with quotes). Invalid UTF-8 bytes are
 * written as \u00XX so the output is always valid JSON. */
void cli_json_str(FILE *f, const char *s, size_t len);
/* Writes bytes for a human: printable as is, control bytes as \xNN. */
void cli_text(FILE *f, const char *s, size_t len);
/* Formats milliseconds as "1.500s" / "-" (free) / "none" (no expiry). */
void cli_fmt_ttl(char *buf, size_t len, int64_t ttl_ms);

#endif
