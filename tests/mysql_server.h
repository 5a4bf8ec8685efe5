/* A private mariadbd for the MySQL backend tests (SERVERS.md, section 4),
 * shared by test_backend_mysql.c and test_backend_mysql_table.c: one server
 * per test binary, started in a temporary directory on a free 127.0.0.1
 * port, database testdb, user 'test'@'127.0.0.1' (password "secret"). It is
 * always stopped and its directory removed (atexit; the harness SIGKILLs it
 * on a signal or timeout, and it dies with the test through
 * PR_SET_PDEATHSIG). start_server() exits 77 when mariadbd is missing.
 * Include once, after harness.h. */
#ifndef DLOCK_TEST_MYSQL_SERVER_H
#define DLOCK_TEST_MYSQL_SERVER_H

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[64];
static char g_sock[128];
static int g_port;
static volatile pid_t g_mysqld;
static pid_t g_owner;
static char g_url[256];
static char g_tools[4][256]; /* mariadbd, mariadb-install-db, mariadb-admin, mariadb */

__attribute__((unused)) static int find_tool(const char *name, char *out, size_t outlen) {
    const char *path = getenv("PATH");
    char buf[2048];
    snprintf(buf, sizeof buf, "%s:/usr/sbin:/usr/bin:/usr/local/sbin:/usr/local/bin",
             path ? path : "");
    for (char *save = NULL, *p = strtok_r(buf, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
        snprintf(out, outlen, "%s/%s", p, name);
        if (access(out, X_OK) == 0) return 1;
    }
    return 0;
}

/* Runs argv (output to g_dir/log); returns its exit status. */
__attribute__((unused)) static int run(char *const argv[], int64_t timeout_ms) {
    pid_t pid = th_fork();
    if (pid == 0) {
        char log[128];
        snprintf(log, sizeof log, "%s/cmd.log", g_dir);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return th_wait_child(pid, timeout_ms);
}

__attribute__((unused)) static int sql_root(const char *sql) {
    char sock[160];
    snprintf(sock, sizeof sock, "--socket=%s", g_sock);
    char *argv[] = {g_tools[3], "--no-defaults", sock, "-u", "root", "-e", (char *)sql, NULL};
    return run(argv, 20000);
}

__attribute__((unused)) static void stop_server(void) {
    if (getpid() != g_owner) return;
    th_stop_pid(&g_mysqld, SIGTERM, 20000);
    th_rm_rf(g_dir);
}

__attribute__((unused)) static void start_server(void) {
    const char *names[4] = {"mariadbd", "mariadb-install-db", "mariadb-admin", "mariadb"};
    for (int i = 0; i < 4; i++)
        if (!find_tool(names[i], g_tools[i], sizeof g_tools[i]))
            th_skip("%s is not installed (Debian: mariadb-server, mariadb-client)", names[i]);
    snprintf(g_dir, sizeof g_dir, "/tmp/dlock-my.XXXXXX");
    if (!mkdtemp(g_dir)) th_fail(__FILE__, __LINE__, "mkdtemp: %s", strerror(errno));
    g_owner = getpid();
    atexit(stop_server);
    char datadir[128], sock[160], port[32], pidf[128], errl[128];
    snprintf(datadir, sizeof datadir, "--datadir=%s/data", g_dir);
    snprintf(g_sock, sizeof g_sock, "%s/sock", g_dir);
    snprintf(sock, sizeof sock, "--socket=%s", g_sock);
    snprintf(pidf, sizeof pidf, "--pid-file=%s/pid", g_dir);
    snprintf(errl, sizeof errl, "--log-error=%s/err.log", g_dir);
    char *inst[] = {g_tools[1], "--no-defaults", "--user=root", datadir, "--skip-test-db",
                    "--innodb-log-file-size=16M", NULL};
    int64_t t0 = th_now_ms();
    ASSERT_MSG(run(inst, 60000) == 0, "mariadb-install-db failed (see %s/cmd.log)", g_dir);
    for (int attempt = 0; attempt < 3; attempt++) {
        g_port = th_free_port();
        snprintf(port, sizeof port, "--port=%d", g_port);
        pid_t pid = th_fork();
        if (pid == 0) {
            int nul = open("/dev/null", O_RDWR);
            if (nul >= 0) {
                dup2(nul, 0);
                dup2(nul, 1);
                dup2(nul, 2);
            }
            execl(g_tools[0], g_tools[0], "--no-defaults", "--user=root", datadir, sock, port,
                  "--bind-address=127.0.0.1", pidf, errl, "--skip-name-resolve",
                  "--innodb-log-file-size=16M", (char *)NULL);
            _exit(127);
        }
        g_mysqld = pid;
        char *ping[] = {g_tools[2], "--no-defaults", sock, "-u", "root", "ping", NULL};
        int up = 0;
        for (int i = 0; i < 300 && !up; i++) {
            if (waitpid(pid, NULL, WNOHANG) == pid) {
                g_mysqld = 0;
                break;
            }
            up = run(ping, 10000) == 0;
            if (!up) th_sleep_ms(100);
        }
        if (up) break;
        if (g_mysqld) {
            kill(g_mysqld, SIGKILL);
            waitpid(g_mysqld, NULL, 0);
            g_mysqld = 0;
        }
    }
    ASSERT_MSG(g_mysqld > 0, "mariadbd did not start (see %s/err.log)", g_dir);
    ASSERT_EQ(sql_root("CREATE DATABASE testdb; "
                       "CREATE USER 'test'@'127.0.0.1' IDENTIFIED BY 'secret'; "
                       "GRANT ALL ON testdb.* TO 'test'@'127.0.0.1'"),
              0);
    snprintf(g_url, sizeof g_url, "mysql://test:secret@127.0.0.1:%d/testdb", g_port);
    th_log("mariadbd on 127.0.0.1:%d in %s, ready in %lld ms", g_port, g_dir,
           (long long)(th_now_ms() - t0));
}

#endif
