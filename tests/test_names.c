/* Lock names and arguments with a server: binary-safe names (spaces, %, NUL
 * bytes inside, UTF-8, braces) lock and unlock correctly for both kinds and for
 * the name-based calls; DLOCK_NAME_MAX is accepted and DLOCK_NAME_MAX + 1
 * gives DLOCK_ENAMETOOLONG; empty names, unknown kinds, NULL arguments and bad
 * leases give DLOCK_EINVAL. */
#include "harness.h"

#include <stdlib.h>

typedef struct {
    const char *name;
    size_t len;
} bname;

static void check_name(dlock_client *c, dlock_client *other, redisContext *rc, const char *name,
                       size_t len, dlock_kind kind)
{
    dlock_lock *l = NULL;
    ASSERT_COK(c, dlock_lock_new(c, name, len, kind, &l));
    size_t got_len = 0;
    const char *got = dlock_lock_name(l, &got_len);
    ASSERT_EQ(got_len, len);
    ASSERT(memcmp(got, name, len) == 0);
    ASSERT_EQ(dlock_lock_kind(l), kind);

    uint64_t f = 0;
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 10000, &f));
    /* the key is exactly the name's bytes */
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %b", name, len), 1);
    long long pttl = th_cmd_int(rc, "PTTL %b", name, len);
    ASSERT_GT(pttl, 0);
    /* the fence counter is redisson_lock_token:{name} */
    uint64_t cur = 0;
    ASSERT_COK(c, dlock_fence_current(c, name, len, &cur));
    ASSERT_U64_EQ(cur, f);
    int locked = 0;
    ASSERT_COK(c, dlock_is_locked(c, name, len, &locked));
    ASSERT_EQ(locked, 1);
    int64_t ttl = 0;
    ASSERT_COK(c, dlock_remaining_ttl(c, name, len, &ttl));
    ASSERT_GT(ttl, 0);
    dlock_info info;
    ASSERT_COK(c, dlock_inspect(c, name, len, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.kind, kind);

    /* a prefix of the name, or the name with its NUL-cut C-string view, is another lock */
    if (len > 1) {
        dlock_lock *p = NULL;
        ASSERT_COK(other, dlock_lock_new(other, name, len - 1, kind, &p));
        ASSERT_LOK(p, dlock_acquire(p, DLOCK_NOWAIT, 10000, NULL));
        ASSERT_LOK(p, dlock_release(p));
        dlock_lock_free(p);
    }
    dlock_lock *o = NULL;
    ASSERT_COK(other, dlock_lock_new(other, name, len, kind, &o));
    ASSERT_LCODE(o, dlock_acquire(o, DLOCK_NOWAIT, 10000, NULL), DLOCK_EBUSY);

    ASSERT_LOK(l, dlock_release(l));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %b", name, len), 0);
    ASSERT_LOK(o, dlock_acquire(o, DLOCK_NOWAIT, 10000, NULL));
    int existed = 0;
    ASSERT_COK(c, dlock_force_unlock(c, name, len, &existed));
    ASSERT_EQ(existed, 1);
    ASSERT_LCODE(o, dlock_release(o), DLOCK_ELOST);
    dlock_lock_free(o);
    dlock_lock_free(l);

    if (kind == DLOCK_KIND_PLAIN) {
        char tok[DLOCK_TOKEN_LEN + 1];
        ASSERT_COK(c, dlock_acquire_token(c, name, len, DLOCK_NOWAIT, 10000, tok, NULL));
        char *v = th_cmd_str(rc, "GET %b", name, len);
        ASSERT_STR_EQ(v, tok);
        free(v);
        ASSERT_COK(c, dlock_extend_token(c, name, len, tok, 20000));
        ASSERT_COK(c, dlock_release_token(c, name, len, tok));
        ASSERT_EQ(th_cmd_int(rc, "EXISTS %b", name, len), 0);
    }
}

int main(void)
{
    th_init("names");
    th_server *s = th_server_start(NULL);
    dlock_client *c = th_client(s, 0);
    dlock_client *other = th_client(s, 0);
    redisContext *rc = th_redis(s);

    static const char nul_inside[] = "a\0b";
    static const char nul_lead[] = "\0lead";
    static const char bin[] = "\x01\xff\x7f\r\n*3$";
    bname names[] = {
        {"with space", DLOCK_CSTR},
        {"100%s%n%d", DLOCK_CSTR},
        {nul_inside, 3},
        {nul_lead, 5},
        {"\xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x94\x92", DLOCK_CSTR},
        {"{braced}name", DLOCK_CSTR},
        {"x", DLOCK_CSTR},
        {bin, sizeof bin - 1},
        {"-- \"quoted\" 'q' \\ ", DLOCK_CSTR},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t len = names[i].len == DLOCK_CSTR ? strlen(names[i].name) : names[i].len;
        check_name(c, other, rc, names[i].name, len, DLOCK_KIND_PLAIN);
        check_name(c, other, rc, names[i].name, len, DLOCK_KIND_REENTRANT);
    }
    /* the NUL-inside lock and its C-string view ("a") are different locks */
    dlock_lock *a = NULL, *ab = NULL;
    ASSERT_COK(c, dlock_lock_new(c, nul_inside, DLOCK_CSTR, DLOCK_KIND_PLAIN, &a));
    ASSERT_COK(c, dlock_lock_new(c, nul_inside, 3, DLOCK_KIND_PLAIN, &ab));
    ASSERT_LOK(a, dlock_acquire(a, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LOK(ab, dlock_acquire(ab, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_EQ(th_cmd_int(rc, "EXISTS a"), 1);
    ASSERT_LOK(a, dlock_release(a));
    ASSERT_LOK(ab, dlock_release(ab));
    dlock_lock_free(a);
    dlock_lock_free(ab);
    th_log("%zu binary names x 2 kinds", sizeof names / sizeof names[0]);

    /* the length limit */
    char *big = malloc(DLOCK_NAME_MAX + 2);
    ASSERT_NOT_NULL(big);
    memset(big, 'n', DLOCK_NAME_MAX + 1);
    big[DLOCK_NAME_MAX + 1] = '\0';
    dlock_lock *l = (dlock_lock *)NULL;
    ASSERT_CCODE(c, dlock_lock_new(c, big, DLOCK_NAME_MAX + 1, DLOCK_KIND_PLAIN, &l),
                 DLOCK_ENAMETOOLONG);
    ASSERT(dlock_errmsg(c)[0] != '\0');
    ASSERT_CCODE(c, dlock_lock_new(c, big, DLOCK_CSTR, DLOCK_KIND_REENTRANT, &l),
                 DLOCK_ENAMETOOLONG);
    int locked;
    int64_t ttl;
    uint64_t fence;
    dlock_info info;
    char tok[DLOCK_TOKEN_LEN + 1];
    ASSERT_CODE(dlock_is_locked(c, big, DLOCK_NAME_MAX + 1, &locked), DLOCK_ENAMETOOLONG);
    ASSERT_CODE(dlock_remaining_ttl(c, big, DLOCK_NAME_MAX + 1, &ttl), DLOCK_ENAMETOOLONG);
    ASSERT_CODE(dlock_fence_current(c, big, DLOCK_NAME_MAX + 1, &fence), DLOCK_ENAMETOOLONG);
    ASSERT_CODE(dlock_inspect(c, big, DLOCK_NAME_MAX + 1, &info), DLOCK_ENAMETOOLONG);
    ASSERT_CODE(dlock_force_unlock(c, big, DLOCK_NAME_MAX + 1, NULL), DLOCK_ENAMETOOLONG);
    ASSERT_CODE(dlock_acquire_token(c, big, DLOCK_NAME_MAX + 1, 0, 1000, tok, NULL),
                DLOCK_ENAMETOOLONG);
    ASSERT_CODE(dlock_release_token(c, big, DLOCK_NAME_MAX + 1, "t"), DLOCK_ENAMETOOLONG);
    ASSERT_CODE(dlock_extend_token(c, big, DLOCK_NAME_MAX + 1, "t", 1000), DLOCK_ENAMETOOLONG);

    /* empty names */
    ASSERT_CCODE(c, dlock_lock_new(c, "", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    ASSERT_CCODE(c, dlock_lock_new(c, "abc", 0, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    ASSERT_CODE(dlock_is_locked(c, "", DLOCK_CSTR, &locked), DLOCK_EINVAL);
    ASSERT_CODE(dlock_remaining_ttl(c, "", 0, &ttl), DLOCK_EINVAL);
    ASSERT_CODE(dlock_fence_current(c, "", 0, &fence), DLOCK_EINVAL);
    ASSERT_CODE(dlock_inspect(c, "", 0, &info), DLOCK_EINVAL);
    ASSERT_CODE(dlock_force_unlock(c, "", 0, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_acquire_token(c, "", 0, 0, 1000, tok, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_release_token(c, "", 0, "t"), DLOCK_EINVAL);
    ASSERT_CODE(dlock_extend_token(c, "", 0, "t", 1000), DLOCK_EINVAL);

    /* other bad arguments on a live client */
    ASSERT_CCODE(c, dlock_lock_new(c, NULL, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    ASSERT_CCODE(c, dlock_lock_new(c, NULL, 3, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    ASSERT_CCODE(c, dlock_lock_new(c, "k", DLOCK_CSTR, (dlock_kind)0, &l), DLOCK_EINVAL);
    /* semaphores and latches are reported by dlock_inspect, but are no lock kinds */
    ASSERT_CCODE(c, dlock_lock_new(c, "k", DLOCK_CSTR, DLOCK_KIND_SEMAPHORE, &l), DLOCK_EINVAL);
    ASSERT_CCODE(c, dlock_lock_new(c, "k", DLOCK_CSTR, (dlock_kind)99, &l), DLOCK_EINVAL);
    ASSERT_CCODE(c, dlock_lock_new(c, "k", DLOCK_CSTR, DLOCK_KIND_PLAIN, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_is_locked(c, NULL, 1, &locked), DLOCK_EINVAL);
    ASSERT_CODE(dlock_is_locked(c, "k", DLOCK_CSTR, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_remaining_ttl(c, "k", DLOCK_CSTR, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_fence_current(c, "k", DLOCK_CSTR, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_inspect(c, "k", DLOCK_CSTR, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_acquire_token(c, "k", DLOCK_CSTR, 0, 1000, NULL, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_acquire_token(c, "k", DLOCK_CSTR, 0, 0, tok, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_acquire_token(c, "k", DLOCK_CSTR, 0, -5, tok, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_release_token(c, "k", DLOCK_CSTR, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_extend_token(c, "k", DLOCK_CSTR, NULL, 1000), DLOCK_EINVAL);
    ASSERT_CODE(dlock_list(c, NULL, NULL, NULL), DLOCK_EINVAL);
    char buf[8];
    ASSERT_CODE(dlock_server_fact(c, NULL, buf, sizeof buf), DLOCK_EINVAL);
    ASSERT_CODE(dlock_server_fact(c, "maxmemory-policy", NULL, 8), DLOCK_EINVAL);
    dlock_idworker *w = NULL;
    ASSERT_CODE(dlock_idworker_new(c, NULL, NULL, &w), DLOCK_EINVAL);
    ASSERT_CODE(dlock_idworker_new(c, "p", NULL, NULL), DLOCK_EINVAL);

    l = th_lock(c, "args", DLOCK_KIND_PLAIN);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, -5, NULL), DLOCK_EINVAL);
    ASSERT_LCODE(l, dlock_acquire(l, -2, 1000, NULL), DLOCK_EINVAL);
    ASSERT_EQ(dlock_lock_holding(l), 0);
    ASSERT_EQ(th_cmd_int(rc, "EXISTS args"), 0);
    ASSERT_LCODE(l, dlock_lock_check(l, NULL, NULL), DLOCK_EINVAL);
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL));
    ASSERT_LCODE(l, dlock_extend(l, 0), DLOCK_EINVAL);
    ASSERT_LCODE(l, dlock_extend(l, -1), DLOCK_EINVAL);
    ASSERT_EQ(dlock_lock_holding(l), 1);
    ASSERT_LOK(l, dlock_release(l));
    dlock_lock_free(l);

    /* exactly DLOCK_NAME_MAX works, for every call */
    big[DLOCK_NAME_MAX] = '\0';
    check_name(c, other, rc, big, DLOCK_NAME_MAX, DLOCK_KIND_PLAIN);
    check_name(c, other, rc, big, DLOCK_NAME_MAX, DLOCK_KIND_REENTRANT);
    free(big);

    redisFree(rc);
    dlock_client_free(other);
    dlock_client_free(c);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
