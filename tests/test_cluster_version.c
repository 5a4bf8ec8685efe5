/* Cluster mode needs Redis 7 (sharded pub/sub: SSUBSCRIBE, SPUBLISH): the
 * decision made at connect on the INFO server text of a node
 * (dl_cluster_version_check, src/cluster.c), on version strings. The check
 * against a real Redis 7 cluster runs in test_cluster (it connects). */
#include "harness.h"

#include <string.h>

#include "topology.h" /* dl_cluster_version_check */

static void expect(const char *info, int want, const char *in_msg)
{
    dl_err err = {0, ""};
    int rc = dl_cluster_version_check(info, &err);
    ASSERT_MSG(rc == want, "%s: got %d (%s), want %d", info ? info : "(null)", rc, err.msg, want);
    if (want) {
        ASSERT_EQ(err.code, want);
        ASSERT_MSG(strstr(err.msg, "Redis 7") && strstr(err.msg, in_msg), "message: %s", err.msg);
    }
}

int main(void)
{
    th_init("cluster_version");
    const char *head = "# Server\r\nredis_version:";
    char buf[256];
    static const struct {
        const char *v;
        int want;
    } cases[] = {
        {"7.0.15", DLOCK_OK},  {"7.2.4", DLOCK_OK},      {"8.0.0", DLOCK_OK},
        {"10.1.2", DLOCK_OK},  {"7", DLOCK_OK},          {"6.2.14", DLOCK_ENOTSUP},
        {"6.0.0", DLOCK_ENOTSUP}, {"5.0.7", DLOCK_ENOTSUP}, {"3.2.12", DLOCK_ENOTSUP},
        {"0.1", DLOCK_ENOTSUP},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(buf, sizeof buf, "%s%s\r\nredis_git_sha1:00000000\r\nredis_mode:cluster\r\n",
                 head, cases[i].v);
        expect(buf, cases[i].want, cases[i].v);
    }
    /* the field anywhere in the section; the last line without CRLF */
    expect("# Server\r\nredis_git_sha1:0\r\nredis_version:6.2.6", DLOCK_ENOTSUP, "6.2.6");
    expect("# Server\r\nredis_version:7.0.0", DLOCK_OK, "");
    /* no version, or not a number: cannot be judged, let through */
    expect("# Server\r\nredis_mode:cluster\r\n", DLOCK_OK, "");
    expect("# Server\r\nredis_version:\r\n", DLOCK_OK, "");
    expect("# Server\r\nredis_version:unknown\r\n", DLOCK_OK, "");
    expect("", DLOCK_OK, "");
    expect(NULL, DLOCK_OK, "");
    th_log("ok");
    return 0;
}
