/* TLS (rediss://) against redis-server's own TLS port, with a CA and
 * certificates made here by openssl: verification on by default, a wrong CA
 * refused with DLOCK_ETLS, a client certificate sent when the server asks for
 * one, the host name checked, and tls_insecure for tests. */
#include "harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdarg.h>

static pid_t server;
static char dir[128];

static void stop_all(void)
{
    if (server > 0) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
        server = 0;
    }
    if (dir[0]) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", dir);
        dir[0] = 0;
    }
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    ASSERT_MSG(system(cmd) == 0, "command failed: %s", cmd);
}

static char path[8][256];
static const char *file(int i, const char *name)
{
    snprintf(path[i], sizeof path[i], "%s/%s", dir, name);
    return path[i];
}

static int open_with(dlock_options *o, dlock_client **c)
{
    *c = NULL;
    return dlock_client_new(o, c);
}

int main(void)
{
    th_init("tls");
    if (system("command -v openssl >/dev/null 2>&1") != 0) th_skip("openssl is not installed");
    snprintf(dir, sizeof dir, "/tmp/dlock-tls-XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(dir));
    atexit(stop_all);

    /* a CA, another CA, and server + client certificates from the first */
    for (int i = 0; i < 2; i++)
        sh("cd %s && openssl req -x509 -newkey rsa:2048 -noenc -days 2 -subj /CN=%s -keyout %s.key "
           "-out %s.crt >/dev/null 2>&1",
           dir, i ? "other" : "ca", i ? "other" : "ca", i ? "other" : "ca");
    sh("cd %s && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext", dir);
    for (int i = 0; i < 2; i++) {
        const char *n = i ? "client" : "server";
        sh("cd %s && openssl req -newkey rsa:2048 -noenc -subj /CN=localhost -keyout %s.key -out "
           "%s.csr >/dev/null 2>&1 && openssl x509 -req -days 2 -in %s.csr -CA ca.crt -CAkey ca.key "
           "-CAcreateserial -extfile san.ext -out %s.crt >/dev/null 2>&1",
           dir, n, n, n, n);
    }

    int port = th_free_port();
    char sport[16];
    snprintf(sport, sizeof sport, "%d", port);
    server = th_fork();
    if (server == 0) {
        execlp("redis-server", "redis-server", "--port", "0", "--tls-port", sport, "--bind",
               "127.0.0.1", "--tls-cert-file", file(0, "server.crt"), "--tls-key-file",
               file(1, "server.key"), "--tls-ca-cert-file", file(2, "ca.crt"), "--dir", dir,
               "--save", "", "--logfile", file(3, "redis.log"), (char *)NULL);
        _exit(127);
    }

    char url[128], url_host[128];
    snprintf(url, sizeof url, "rediss://127.0.0.1:%d", port);
    snprintf(url_host, sizeof url_host, "rediss://localhost:%d", port);
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.tls_ca_file = file(4, "ca.crt");
    o.tls_cert_file = file(5, "client.crt");
    o.tls_key_file = file(6, "client.key");
    o.connect_timeout_ms = 1000;
    dlock_client *c = NULL;
    /* wait for the server: the first clean open */
    int64_t until = th_now_ms() + 10000;
    int rc;
    while ((rc = open_with(&o, &c)) != DLOCK_OK && th_now_ms() < until) {
        dlock_client_free(c);
        c = NULL;
        th_sleep_ms(50);
    }
    ASSERT_CCODE(c, rc, DLOCK_OK);

    /* locks work over TLS, waiting included (an explicit lease: the child
     * is forked below, and a process must not fork while its watchdog thread
     * may hold a lock, the allocator's included) */
    dlock_lock *l = th_lock(c, "tls:lock", DLOCK_KIND_REENTRANT);
    uint64_t fence = 0;
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 20000, &fence));
    ASSERT_U64_GT(fence, 0);
    pid_t w = th_fork();
    if (w == 0) {
        dlock_client *wc = NULL;
        ASSERT_CCODE(wc, open_with(&o, &wc), DLOCK_OK);
        dlock_lock *wl = th_lock(wc, "tls:lock", DLOCK_KIND_REENTRANT);
        int64_t t0 = th_now_ms();
        ASSERT_LOK(wl, dlock_acquire(wl, 10000, 5000, NULL));
        int fast = th_now_ms() - t0 < 5000;
        dlock_lock_free(wl);
        dlock_client_free(wc);
        _exit(fast ? 0 : 3);
    }
    th_sleep_ms(300);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_wait_child(w, 15000), 0);
    int64_t rtt = 0;
    ASSERT_COK(c, dlock_ping(c, &rtt));
    dlock_lock_free(l);
    dlock_client_free(c);

    /* the host name in the URL must match the certificate: localhost does */
    o.url = url_host;
    ASSERT_CCODE(c, open_with(&o, &c), DLOCK_OK);
    dlock_client_free(c);
    /* ...a name the certificate does not carry does not */
    o.url = url;
    o.tls_server_name = "db.example.net";
    ASSERT_CCODE(c, open_with(&o, &c), DLOCK_ETLS);
    th_log("wrong name: %s", dlock_errmsg(c));
    dlock_client_free(c);
    o.tls_server_name = NULL;

    /* a wrong CA is refused */
    o.tls_ca_file = file(4, "other.crt");
    ASSERT_CCODE(c, open_with(&o, &c), DLOCK_ETLS);
    ASSERT(strstr(dlock_errmsg(c), "certificate verify failed") != NULL);
    th_log("wrong CA: %s", dlock_errmsg(c));
    dlock_client_free(c);
    /* ...unless verification is switched off (tests only) */
    o.tls_insecure = 1;
    ASSERT_CCODE(c, open_with(&o, &c), DLOCK_OK);
    dlock_client_free(c);
    o.tls_insecure = 0;
    o.tls_ca_file = file(4, "ca.crt");

    /* no client certificate: the server closes the connection */
    o.tls_cert_file = o.tls_key_file = NULL;
    rc = open_with(&o, &c);
    ASSERT(rc == DLOCK_EIO || rc == DLOCK_ETLS);
    dlock_client_free(c);
    /* half a client certificate is a bad argument */
    o.tls_cert_file = file(5, "client.crt");
    ASSERT_CCODE(c, open_with(&o, &c), DLOCK_EINVAL);
    dlock_client_free(c);
    /* a missing CA file is reported */
    o.tls_key_file = file(6, "client.key");
    o.tls_ca_file = "/nonexistent/ca.crt";
    ASSERT_CCODE(c, open_with(&o, &c), DLOCK_ETLS);
    dlock_client_free(c);
    /* plain redis:// to the TLS port fails cleanly, within the timeout */
    char plain[128];
    snprintf(plain, sizeof plain, "redis://127.0.0.1:%d", port);
    o.url = plain;
    o.command_timeout_ms = 1000;
    int64_t t0 = th_now_ms();
    rc = open_with(&o, &c);
    ASSERT_NE(rc, DLOCK_OK);
    ASSERT_LT(th_now_ms() - t0, 3000);
    dlock_client_free(c);
    th_log("ok");
    return 0;
}
