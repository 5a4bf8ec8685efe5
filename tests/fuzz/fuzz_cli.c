/* libFuzzer target: the command-line tool's argument parsing and dispatch
 * (issue 8).
 *
 * The input is split on NUL bytes into argv (a trailing NUL ends the last
 * argument; "dlock" is prepended as argv[0]) and given to cli_main(), the
 * whole tool, in-process. The tool's sources are compiled into this target
 * with -DDLOCK_CLI_FUZZ, which (1) leaves out main(), (2) makes `run` stop
 * before forking (it is never reached anyway: see 3) and (3) calls
 * cli_fuzz_redirect() below just before dlock_client_new(): every URL that
 * parses (--url, several --url, $DLOCK_URL, --fence-url) is replaced by one
 * of the same kind (single / TLS / unix / RedLock with as many nodes /
 * Sentinel / Cluster) pointing at a TCP port bound here but never listened on
 * (connection refused) or a unix socket in a directory that does not exist.
 * So nothing is ever locked, no name is looked up, and every command that
 * gets past its argument checks ends with "server unavailable" (69) or a
 * configuration error. URLs that do not parse are passed unchanged: the
 * library refuses them before connecting.
 *
 * Checks: the exit code is one that can happen without a server (0, 64, 66,
 * 69, 76, or `run`'s 126 and 127 for a command it cannot run, found before
 * it connects: see allowed_code()), no file descriptor leaks, no crash, no
 * leak. The target restores the signal mask after each input (`run` blocks
 * its signals on purpose and leaves them blocked until the process exits).
 *
 * Arguments that name device or kernel files (/dev/... but /dev/null, /proc,
 * /sys) are refused: `--password-file /dev/zero` would read forever. */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cmds.h"
#include "kinds.h" /* dl_backend_for */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_ARGS 64
#define MAX_NODES 8

static int g_port;           /* bound, never listened on */
static char g_url[64];       /* redis://127.0.0.1:PORT, also $DLOCK_URL */
static char g_main_url[512]; /* the replacement of o->url */
static char g_fence_url[128];

static void init_once(void)
{
    if (g_port) return;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        abort();
    g_port = ntohs(a.sin_port); /* fd stays open: the port stays ours, refusing */
    snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", g_port);
    setenv("DLOCK_URL", g_url, 1);
    unsetenv("DLOCK_PASSWORD");
    unsetenv("POSIXLY_CORRECT");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    init_once();
    return 0;
}

/* The replacement of a URL that parses; NULL leaves it as it is. */
static const char *redirect(const char *url, char *buf, size_t len)
{
    /* another backend (postgres://, mysql://): the same scheme, refused port */
    const dl_backend *b = dl_backend_for(url);
    if (b) {
        snprintf(buf, len, "%s127.0.0.1:%d/db", b->schemes[0], g_port);
        return buf;
    }
    dl_target t;
    dl_err err;
    memset(&err, 0, sizeof err);
    if (dl_target_parse(url, &t, &err) != DLOCK_OK) return NULL;
    size_t n = 0;
    switch (t.mode) {
    case DL_MODE_REDLOCK:
        n = (size_t)snprintf(buf, len, "redlock://");
        for (size_t i = 0; i < t.neps && i < MAX_NODES && n < len; i++)
            n += (size_t)snprintf(buf + n, len - n, "%s127.0.0.1:%d", i ? "," : "", g_port);
        break;
    case DL_MODE_SENTINEL:
        snprintf(buf, len, "redis-sentinel://127.0.0.1:%d/m", g_port);
        break;
    case DL_MODE_CLUSTER:
        snprintf(buf, len, "redis-cluster://127.0.0.1:%d", g_port);
        break;
    default:
        if (t.eps[0].path)
            snprintf(buf, len, "unix:///nonexistent-dlock-fuzz/s.sock");
        else
            snprintf(buf, len, "%s://127.0.0.1:%d", t.eps[0].tls ? "rediss" : "redis", g_port);
        break;
    }
    dl_target_clear(&t);
    return buf;
}

void cli_fuzz_redirect(dlock_options *o)
{
    const char *url = o->url ? o->url : getenv("DLOCK_URL");
    const char *r;
    if (url && *url && (r = redirect(url, g_main_url, sizeof g_main_url))) o->url = r;
    if (o->fence_url) {
        dl_endpoint ep;
        dl_err err;
        memset(&err, 0, sizeof err);
        if (dl_url_parse(o->fence_url, &ep, &err) == DLOCK_OK) {
            if (ep.path)
                snprintf(g_fence_url, sizeof g_fence_url, "unix:///nonexistent-dlock-fuzz/f.sock");
            else
                snprintf(g_fence_url, sizeof g_fence_url, "%s://127.0.0.1:%d",
                         ep.tls ? "rediss" : "redis", g_port);
            dl_endpoint_clear(&ep);
            o->fence_url = g_fence_url;
        }
    }
}

/* Without a server only these can happen: 0 (help, version), 64 usage,
 * 66 unreadable password or TLS file, 69 unavailable, 76 TLS set-up failed
 * (e.g. a certificate file that is not PEM). 1 / -E codes, 75, 77, 78, 80,
 * 81 and 126/127 all need an answer from a server or a started child. */
static int allowed_code(int rc)
{
    return rc == 0 || rc == 64 || rc == 66 || rc == 69 || rc == 76 || rc == 126 || rc == 127;
}

static int risky_path(const char *a)
{
    const char *d = strstr(a, "/dev/");
    while (d) {
        if (strncmp(d, "/dev/null", 9) != 0) return 1;
        d = strstr(d + 1, "/dev/");
    }
    return strstr(a, "/proc") || strstr(a, "/sys");
}

static int lowest_free_fd(void)
{
    int fd = dup(0);
    if (fd >= 0) close(fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init_once();
    if (size > 8192) return 0;
    char *buf = malloc(size + 1);
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    argv[argc++] = (char *)"dlock";
    for (size_t off = 0; off < size;) {
        if (argc > MAX_ARGS) {
            free(buf);
            return 0;
        }
        argv[argc++] = buf + off;
        off += strlen(buf + off) + 1;
    }
    argv[argc] = NULL;
    for (int i = 1; i < argc; i++)
        if (risky_path(argv[i])) {
            free(buf);
            return 0;
        }

    sigset_t mask;
    pthread_sigmask(SIG_SETMASK, NULL, &mask);
    int fd_before = lowest_free_fd();
    optind = 0; /* a fresh getopt, as at the start of a process */
    int rc = cli_main(argc, argv);
    fflush(stdout);
    pthread_sigmask(SIG_SETMASK, &mask, NULL);
    if (getenv("DLOCK_FUZZ_VERBOSE")) fprintf(stderr, "  -> exit %d\n", rc);
    if (!allowed_code(rc)) {
        fprintf(stderr, "fuzz_cli: unexpected exit code %d\n", rc);
        abort();
    }
    if (lowest_free_fd() != fd_before) abort(); /* a descriptor leaked */
    free(buf);
    return 0;
}
