/* Lock names, the keys derived from them (Redisson's brace rule) and their
 * Redis Cluster hash slots. */
#include <stdlib.h>
#include <string.h>

#include "base.h"

int dl_check_name(const char *name, size_t *len, dl_err *err) {
    if (!name) return dl_seterr(err, DLOCK_EINVAL, "lock name is NULL");
    if (*len == DLOCK_CSTR) *len = strlen(name);
    if (*len == 0) return dl_seterr(err, DLOCK_EINVAL, "lock name is empty");
    if (*len > DLOCK_NAME_MAX)
        return dl_seterr(err, DLOCK_ENAMETOOLONG,
                         "lock name is %zu bytes; the limit is %d", *len, DLOCK_NAME_MAX);
    return DLOCK_OK;
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

/* CRC16-CCITT (XMODEM), as the Redis Cluster specification defines the key
 * hash: polynomial 0x1021, initial value 0. */
static uint16_t crc16(const char *buf, size_t len) {
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++) crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned dl_key_slot(const char *key, size_t len) {
    /* the hash tag: the part between the first '{' and the next '}', if not empty */
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1) {
            key = open + 1;
            len = (size_t)(close - open - 1);
        }
    }
    return crc16(key, len) & (DL_SLOTS - 1);
}

/* Derived keys are "prefix{N}suffix" for a name without '{' (they hash by
 * N, as the name does unless it has a '}': "a}b" hashes whole, "{a}b}" by
 * "a"), and "prefixNsuffix" for a name with one, which all hash by the
 * name's own tag only if it has a valid one ("x{}y", "open{": the whole
 * key hashes, prefix included). Checked by deriving one key of each shape. */
int dl_name_keys_one_slot(const char *name, size_t len) {
    unsigned slot = dl_key_slot(name, len);
    size_t kl = 0;
    for (int i = 0; i < 2; i++) {
        char *k = dl_derive_key(i ? "" : "p:", name, len, i ? ":s" : "", &kl);
        if (!k) return -1;
        int same = dl_key_slot(k, kl) == slot;
        free(k);
        if (!same) return 0;
    }
    return 1;
}
