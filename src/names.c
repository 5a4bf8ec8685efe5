/* Lock names and the keys derived from them (Redisson's brace rule). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int dl_check_name(const char *name, size_t *len, dl_err *err) {
    if (!name) return dl_seterr(err, DLOCK_EINVAL, "lock name is NULL");
    if (*len == DLOCK_CSTR) *len = strlen(name);
    if (*len == 0) return dl_seterr(err, DLOCK_EINVAL, "lock name is empty");
    if (*len > DLOCK_NAME_MAX)
        return dl_seterr(err, DLOCK_ENAMETOOLONG,
                         "lock name is %zu bytes; the limit is %d", *len, DLOCK_NAME_MAX);
    return DLOCK_OK;
}

/* Derived keys are "prefix{N}suffix" for a name without '{' (they hash by
 * N, as the name does unless it has a '}': "a}b" hashes whole, "{a}b}" by
 * "a"), and "prefixNsuffix" for a name with one, which all hash by the
 * name's own tag only if it has a valid one ("x{}y", "open{": the whole
 * key hashes, prefix included). Checked by deriving one key of each shape. */
int dl_check_cluster_name(const dlock_client *c, const char *name, size_t len, dl_err *err) {
    if (!c->cluster) return DLOCK_OK;
    unsigned slot = dl_key_slot(name, len);
    size_t kl = 0;
    int same = 1;
    for (int i = 0; same && i < 2; i++) {
        char *k = dl_derive_key(i ? "" : "p:", name, len, i ? ":s" : "", &kl);
        if (!k) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        same = dl_key_slot(k, kl) == slot;
        free(k);
    }
    if (same) return DLOCK_OK;
    char nm[80];
    return dl_seterr(err, DLOCK_EINVAL,
                     "lock name '%s' cannot be used on a Redis Cluster: its keys would hash to "
                     "different slots (with '{' or '}' in it, a name needs a non-empty hash tag "
                     "such as 'order{42}')",
                     dl_name_msg(name, len, nm, sizeof nm));
}

static char *derive(const char *prefix, const char *name, size_t name_len, const char *suffix,
                    int braces, size_t *outlen) {
    size_t plen = strlen(prefix), slen = strlen(suffix);
    size_t n = plen + name_len + slen + (braces ? 2 : 0);
    char *k = malloc(n + 1);
    if (!k) return NULL;
    char *p = k;
    memcpy(p, prefix, plen);
    p += plen;
    if (braces) *p++ = '{';
    memcpy(p, name, name_len);
    p += name_len;
    if (braces) *p++ = '}';
    memcpy(p, suffix, slen);
    p += slen;
    *p = '\0';
    *outlen = n;
    return k;
}

char *dl_derive_key(const char *prefix, const char *name, size_t name_len, const char *suffix,
                    size_t *outlen) {
    return derive(prefix, name, name_len, suffix, memchr(name, '{', name_len) == NULL, outlen);
}

char *dl_latch_channel(const char *name, size_t name_len, size_t *outlen) {
    return derive(DL_LATCH_CHANNEL_PREFIX, name, name_len, "", 1, outlen);
}

/* Redisson's latch scripts name the channel among their KEYS, so a cluster
 * answers CROSSSLOT to them as to dlock's: such a latch name works on
 * neither client there. */
int dl_check_cluster_latch(const dlock_client *c, const char *name, size_t len,
                           const char *channel, size_t channel_len, dl_err *err) {
    if (!c->cluster) return DLOCK_OK;
    unsigned ks = dl_key_slot(name, len), cs = dl_key_slot(channel, channel_len);
    if (ks == cs) return DLOCK_OK;
    char nm[80];
    return dl_seterr(err, DLOCK_EINVAL,
                     "latch name '%s' cannot be used on a Redis Cluster: its channel "
                     DL_LATCH_CHANNEL_PREFIX "{name} (braces for every name, as Redisson's) "
                     "hashes to slot %u, the key to slot %u; use a name without '{'",
                     dl_name_msg(name, len, nm, sizeof nm), cs, ks);
}

const char *dl_name_msg(const char *name, size_t len, char *buf, size_t buflen) {
    size_t o = 0;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < len && o + 5 < buflen; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
            buf[o++] = (char)ch;
        } else if (ch >= 0x80) {
            buf[o++] = (char)ch; /* UTF-8 passes through */
        } else {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[ch >> 4];
            buf[o++] = hex[ch & 15];
        }
        if (i + 1 < len && o + 8 >= buflen) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
    }
    buf[o] = '\0';
    return buf;
}
