/* Connecting: unix:// URLs (and ?db=N), redis:// with /db, $DLOCK_URL; password
 * auth against a --requirepass server: none or wrong -> DLOCK_EAUTH with a
 * message that never contains the password; right password from the options,
 * from the URL (percent-encoded), from $DLOCK_PASSWORD; precedence of the
 * options' password over the URL's; an ACL user. */
#include "harness.h"

#include <stdlib.h>

#define PW "s3cret@pw:x%"
#define PW_ENC "s3cret%40pw%3Ax%25"

static int connect_with(const char *url, const char *password, const char *user,
                        dlock_client **out)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.password = password;
    o.username = user;
    o.connect_timeout_ms = 2000;
    *out = NULL;
    return dlock_client_new(&o, out);
}

/* A client works: a lock taken through it is visible in db `db` on s. */
static void check_works(dlock_client *c, const th_server *s, int db, const char *name)
{
    ASSERT_COK(c, dlock_ping(c, NULL));
    dlock_lock *l = th_lock(c, name, DLOCK_KIND_PLAIN);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL));
    redisContext *rc = th_redis(s);
    th_cmd_ok(rc, "SELECT %d", db);
    char *v = th_cmd_str(rc, "GET %s", name);
    ASSERT_STR_EQ(v, dlock_lock_token(l));
    free(v);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", name), 0);
    redisFree(rc);
    dlock_lock_free(l);
}

static void expect_auth_failure(const char *url, const char *password, const char *user,
                                const char *secret)
{
    dlock_client *c = NULL;
    int rc = connect_with(url, password, user, &c);
    ASSERT_NOT_NULL(c);
    ASSERT_MSG(rc == DLOCK_EAUTH, "url %s user %s: got %d (%s), want DLOCK_EAUTH: %s", url,
               user ? user : "-", rc, dlock_strerror(rc), dlock_errmsg(c));
    ASSERT(dlock_errmsg(c)[0] != '\0');
    if (secret)
        ASSERT_MSG(strstr(dlock_errmsg(c), secret) == NULL, "password in the message: %s",
                   dlock_errmsg(c));
    dlock_client_free(c);
}

int main(void)
{
    th_init("connect");
    th_server *s = th_server_start(NULL);
    dlock_client *c = NULL;

    /* unix socket */
    ASSERT_CCODE(c, connect_with(th_server_unix_url(s), NULL, NULL, &c), DLOCK_OK);
    check_works(c, s, 0, "conn:unix");
    dlock_client_free(c);
    char url[300];
    snprintf(url, sizeof url, "%s?db=3", th_server_unix_url(s));
    ASSERT_CCODE(c, connect_with(url, NULL, NULL, &c), DLOCK_OK);
    check_works(c, s, 3, "conn:unix:db3");
    dlock_client_free(c);

    /* TCP with a db */
    snprintf(url, sizeof url, "%s/2", th_server_url(s));
    ASSERT_CCODE(c, connect_with(url, NULL, NULL, &c), DLOCK_OK);
    check_works(c, s, 2, "conn:tcp:db2");
    dlock_client_free(c);

    /* $DLOCK_URL when the options give none */
    setenv("DLOCK_URL", th_server_url(s), 1);
    ASSERT_CCODE(c, dlock_client_new(NULL, &c), DLOCK_OK);
    check_works(c, s, 0, "conn:env");
    dlock_client_free(c);
    unsetenv("DLOCK_URL");

    /* the client id is UUID-shaped and differs between clients */
    dlock_client *c1 = th_client(s, 0), *c2 = th_client(s, 0);
    const char *id1 = dlock_client_id(c1), *id2 = dlock_client_id(c2);
    ASSERT_EQ(strlen(id1), 36);
    ASSERT(id1[8] == '-' && id1[13] == '-' && id1[18] == '-' && id1[23] == '-');
    ASSERT(strcmp(id1, id2) != 0);
    int64_t rtt = -1;
    ASSERT_COK(c1, dlock_ping(c1, &rtt));
    ASSERT_GE(rtt, 0);
    ASSERT_LT(rtt, 1000000);
    dlock_client_free(c1);
    dlock_client_free(c2);
    th_server_stop(s);

    /* password-protected server */
    th_server_opts so = {0, PW};
    s = th_server_start(&so);
    char tcp[128], withpw[256];
    snprintf(tcp, sizeof tcp, "%s", th_server_url(s));
    expect_auth_failure(tcp, NULL, NULL, NULL);
    expect_auth_failure(tcp, "wrong-Passw0rd-xyz", NULL, "wrong-Passw0rd-xyz");
    expect_auth_failure(th_server_unix_url(s), "wrong-Passw0rd-xyz", NULL, "wrong-Passw0rd-xyz");
    snprintf(withpw, sizeof withpw, "redis://:%s@127.0.0.1:%d", "urlWrongPw123",
             th_server_port(s));
    expect_auth_failure(withpw, NULL, NULL, "urlWrongPw123");

    ASSERT_CCODE(c, connect_with(tcp, PW, NULL, &c), DLOCK_OK);
    check_works(c, s, 0, "conn:pw:opt");
    dlock_client_free(c);

    snprintf(withpw, sizeof withpw, "redis://:%s@127.0.0.1:%d", PW_ENC, th_server_port(s));
    ASSERT_CCODE(c, connect_with(withpw, NULL, NULL, &c), DLOCK_OK);
    check_works(c, s, 0, "conn:pw:url");
    dlock_client_free(c);

    /* the options' password wins over the URL's */
    snprintf(withpw, sizeof withpw, "redis://:%s@127.0.0.1:%d", "urlWrongPw123",
             th_server_port(s));
    ASSERT_CCODE(c, connect_with(withpw, PW, NULL, &c), DLOCK_OK);
    dlock_client_free(c);

    /* $DLOCK_PASSWORD, used when neither options nor URL have one */
    setenv("DLOCK_PASSWORD", PW, 1);
    ASSERT_CCODE(c, connect_with(tcp, NULL, NULL, &c), DLOCK_OK);
    check_works(c, s, 0, "conn:pw:env");
    dlock_client_free(c);
    ASSERT_CCODE(c, connect_with(th_server_unix_url(s), NULL, NULL, &c), DLOCK_OK);
    dlock_client_free(c);
    setenv("DLOCK_PASSWORD", "envWrongPw456", 1);
    expect_auth_failure(tcp, NULL, NULL, "envWrongPw456");
    /* ... and the options' password beats the environment */
    ASSERT_CCODE(c, connect_with(tcp, PW, NULL, &c), DLOCK_OK);
    dlock_client_free(c);
    unsetenv("DLOCK_PASSWORD");

    /* an ACL user, from the options and from the URL */
    redisContext *rc = th_redis(s);
    th_cmd_ok(rc, "ACL SETUSER alice on >alicePw99 ~* &* +@all");
    ASSERT_CCODE(c, connect_with(tcp, "alicePw99", "alice", &c), DLOCK_OK);
    check_works(c, s, 0, "conn:acl:opt");
    dlock_client_free(c);
    snprintf(withpw, sizeof withpw, "redis://alice:alicePw99@127.0.0.1:%d", th_server_port(s));
    ASSERT_CCODE(c, connect_with(withpw, NULL, NULL, &c), DLOCK_OK);
    check_works(c, s, 0, "conn:acl:url");
    dlock_client_free(c);
    expect_auth_failure(tcp, "badAlicePw", "alice", "badAlicePw");
    /* a user without the right to run scripts: refused as EAUTH (NOPERM) */
    th_cmd_ok(rc, "ACL SETUSER bob on >bobPw77 ~* &* +@all -@scripting");
    ASSERT_CCODE(c, connect_with(tcp, "bobPw77", "bob", &c), DLOCK_OK);
    dlock_lock *l = th_lock(c, "conn:noperm", DLOCK_KIND_PLAIN);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 1000, NULL), DLOCK_EAUTH);
    ASSERT_EQ(dlock_lock_holding(l), 0);
    dlock_lock_free(l);
    dlock_client_free(c);
    redisFree(rc);

    th_server_stop(s);
    th_log("ok");
    return 0;
}
