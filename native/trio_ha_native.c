/*
 * trio_ha native core: record encoding, batch conversion, scanning and a few memory/file
 * helpers. The contract is trio_ha_native.h; the Python twin (trio_ha/_backend.py and
 * trio_ha/wire/record.py) is the oracle the tests hold this file against.
 *
 * Rules kept throughout: every multi-byte integer is read and written byte by byte in
 * big-endian order (no pointer casts, so no alignment or aliasing questions); every read in
 * th_scan is bounds-checked against the record's TOTALSIZE, which is itself checked against
 * `limit` first; the encoders check the whole write against seg_size before touching seg.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#ifndef _FILE_OFFSET_BITS
#define _FILE_OFFSET_BITS 64
#endif

#include "trio_ha_native.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <unistd.h>
#include <zlib.h>

/* ---- record layout constants (docs/formats.md; trio_ha/wire/layout.py) ----------------- */

#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define BLANK_MAGIC 0xCBD43194u
#define END_FILE_MIN_BLANK_LENGTH 8u

#define SYSFLAG_BORNHOST_V6 0x10
#define SYSFLAG_STOREHOST_V6 0x20

#define MAX_TOPIC_LENGTH 127u
#define MAX_PROPERTIES_LENGTH 32767u

/* TOTALSIZE .. BORNTIMESTAMP */
#define HEAD_SIZE 48u
/* Smallest v1 record: IPv4 hosts, empty body, topic and properties (record_size(0, 0, 0)). */
#define MIN_RECORD_SIZE 91u

/* A SEND_BATCH_MESSAGE item: TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN (+ body), PROPSLEN. */
#define BATCH_ITEM_FIXED 22u

#define WARM_PAGE 4096u

/* ---- big-endian helpers ----------------------------------------------------------------- */

static inline uint32_t rd_u32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
           (uint32_t)p[3];
}

static inline int32_t rd_i32(const uint8_t *p)
{
    /* uint32 -> int32 through memcpy: two's complement without implementation-defined
       conversion. */
    uint32_t u = rd_u32(p);
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline uint16_t rd_u16(const uint8_t *p)
{
    return (uint16_t)(((unsigned)p[0] << 8) | (unsigned)p[1]);
}

static inline int64_t rd_i64(const uint8_t *p)
{
    uint64_t u = ((uint64_t)rd_u32(p) << 32) | (uint64_t)rd_u32(p + 4);
    int64_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline void wr_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void wr_i32(uint8_t *p, int32_t v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    wr_u32(p, u);
}

static inline void wr_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void wr_i64(uint8_t *p, int64_t v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    wr_u32(p, (uint32_t)(u >> 32));
    wr_u32(p + 4, (uint32_t)u);
}

/* Wrapping int64 addition (base_offset + pos), defined for every input. */
static inline int64_t add_wrap(int64_t a, uint64_t b)
{
    uint64_t ua;
    memcpy(&ua, &a, sizeof ua);
    ua += b;
    int64_t r;
    memcpy(&r, &ua, sizeof r);
    return r;
}

/* ---- version, CRC, Java hash -------------------------------------------------------------- */

uint32_t th_version(void)
{
    return TH_NATIVE_VERSION;
}

/*
 * CRC-32 as zlib computes it (reflected polynomial 0xEDB88320, initial value and final xor
 * 0xFFFFFFFF). Long inputs go through carry-less multiplication (PCLMULQDQ, or VPCLMULQDQ on
 * 512-bit registers), chosen once at load time from what the CPU reports; inputs under 16
 * bytes and CPUs without the instructions use zlib.
 * Every path takes and returns zlib's running value, so they chain with each other freely.
 *
 * The folding method is the one of Intel's white paper "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction" (Gopal et al., 2009), derived here for the
 * reflected bit order:
 *
 *   A 16-byte block loaded little-endian holds the polynomial whose x^127 coefficient is bit
 *   0 of its first byte (bit k of the register <-> x^(127-k)). Moving a block A = L*x^64 + H
 *   (L: the low 64 register bits, the earlier bytes) D bits further on in the message means
 *   A*x^D = L*x^(D+64) + H*x^D == (L*K(D+32) + H*K(D-32)) * x^32 (mod P), with
 *   K(n) = x^n mod P. A carry-less product of reflected operands lands one degree short, so
 *   each constant is stored as reflect32(K(n)) << 1, a 33-bit value; the product of a 64-bit
 *   half with it is then exactly the 128-bit block to XOR into the one D bits later.
 *
 *   The last 128-bit block A gives the CRC as A*x^32 mod P: fold L by K(96) onto H*x^32
 *   (96 bits), fold the highest 32 bits of that by K(64) onto the rest (64 bits), reduce the
 *   64-bit U with Barrett: q = floor(floor(U / x^32) * mu / x^32) with mu = floor(x^64 / P),
 *   U mod P = low 32 bits of U + q*P.
 *
 * Constants (reflect32(x^n mod P) << 1, n named; checked against zlib by the tests):
 */
#define CRC_K(n) CRC_K_##n
#define CRC_K_2080 UINT64_C(0x11542778a) /* fold 2048 bits (4 x 512-bit lanes per step) */
#define CRC_K_2016 UINT64_C(0x1322d1430)
#define CRC_K_544 UINT64_C(0x154442bd4)  /* fold 512 bits (4 x 128-bit lanes per step) */
#define CRC_K_480 UINT64_C(0x1c6e41596)
#define CRC_K_416 UINT64_C(0x03db1ecdc)  /* fold 384 bits */
#define CRC_K_352 UINT64_C(0x174359406)
#define CRC_K_288 UINT64_C(0x0f1da05aa)  /* fold 256 bits */
#define CRC_K_224 UINT64_C(0x15a546366)
#define CRC_K_160 UINT64_C(0x1751997d0)  /* fold 128 bits */
#define CRC_K_96 UINT64_C(0x0ccaa009e)
#define CRC_K_64 UINT64_C(0x163cd6124)
#define CRC_MU UINT64_C(0x1f7011641)     /* reflect33(floor(x^64 / P)) */
#define CRC_POLY UINT64_C(0x1db710641)   /* reflect33(P) */

enum { CRC_IMPL_ZLIB = 0, CRC_IMPL_PCLMUL = 1, CRC_IMPL_VPCLMUL = 2 };

/* Where each path starts to pay, measured on an AVX-512 EPYC: PCLMULQDQ beats zlib's table
   loop from 16 bytes on (3x at 16, 5x at 128), VPCLMULQDQ beats PCLMULQDQ from 256 (2.4x at
   1 KiB). These are also the least the two functions accept. */
#ifndef CRC_PCLMUL_MIN
#define CRC_PCLMUL_MIN 16u
#endif
#ifndef CRC_VPCLMUL_MIN
#define CRC_VPCLMUL_MIN 256u
#endif

/* zlib's crc32 for any length (its length argument is a uInt). */
static uint32_t crc32_zlib(uint32_t crc, const uint8_t *buf, size_t len)
{
    uLong c = crc;
    while (len > 0) {
        uInt n = len > (size_t)0x40000000u ? (uInt)0x40000000u : (uInt)len;
        c = crc32(c, buf, n);
        buf += n;
        len -= n;
    }
    return (uint32_t)c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TH_CRC_VECTOR 1
#include <immintrin.h>

#define TARGET_PCLMUL __attribute__((target("pclmul,sse4.1")))
#define TARGET_VPCLMUL __attribute__((target("pclmul,sse4.1,avx512f,avx512vl,vpclmulqdq")))

/* The block x moved 128*m bits on (k holds K(D+32) low, K(D-32) high) XORed onto next. */
TARGET_PCLMUL static inline __m128i crc_fold128(__m128i x, __m128i k, __m128i next)
{
    __m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
    __m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

/* The raw CRC register (before the final inversion) of the message ending with block x. */
TARGET_PCLMUL static inline uint32_t crc_reduce128(__m128i x)
{
    const __m128i low32 = _mm_set_epi32(0, -1, 0, -1);
    /* 128 -> 96 bits: L*K(96) + H*x^32. H*x^32 is just H moved to the low end. */
    __m128i t = _mm_clmulepi64_si128(x, _mm_set_epi64x(0, (long long)CRC_K(96)), 0x00);
    t = _mm_xor_si128(t, _mm_srli_si128(x, 8));
    /* 96 -> 64 bits: the first 32 bits times K(64), onto the other 64. */
    __m128i u = _mm_clmulepi64_si128(_mm_and_si128(t, low32),
                                     _mm_set_epi64x(0, (long long)CRC_K(64)), 0x00);
    u = _mm_xor_si128(u, _mm_srli_si128(t, 4));
    /* Barrett: q = (first 32 bits of u) * mu, first 32 bits; then u + q*P, bits 32..63. */
    const __m128i poly_mu = _mm_set_epi64x((long long)CRC_MU, (long long)CRC_POLY);
    __m128i q = _mm_clmulepi64_si128(_mm_and_si128(u, low32), poly_mu, 0x10);
    q = _mm_and_si128(q, low32);
    __m128i r = _mm_xor_si128(u, _mm_clmulepi64_si128(q, poly_mu, 0x00));
    return (uint32_t)_mm_extract_epi32(r, 1);
}

/* pshufb controls for a variable byte shift: 16 + r + i picks byte i + r (a shift down by
   r bytes), r + i picks byte i + r - 16 (a shift up by 16 - r); 0x80 makes a zero byte. */
static const uint8_t crc_shift_table[48] = {
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
};

/*
 * Fold the remaining 16-byte blocks at p onto x, which covers the 16 bytes just before p,
 * and reduce. The message must hold at least 16 bytes before p: a last partial block of r
 * bytes T is handled by re-cutting the final 16 + r bytes (x then T) as A, the first r
 * bytes of x, and B, the rest of x followed by T: A moved 128 bits onto B. B's tail is read
 * from the message's last 16 bytes, which end exactly at the end of T.
 */
TARGET_PCLMUL static inline uint32_t crc_finish(__m128i x, const uint8_t *p, size_t len)
{
    const __m128i k128 = _mm_set_epi64x((long long)CRC_K(96), (long long)CRC_K(160));
    while (len >= 16) {
        x = crc_fold128(x, k128, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        len -= 16;
    }
    if (len) {
        const __m128i down = _mm_loadu_si128((const __m128i *)(crc_shift_table + 16 + len));
        const __m128i up = _mm_loadu_si128((const __m128i *)(crc_shift_table + len));
        const __m128i last = _mm_loadu_si128((const __m128i *)(p + len - 16));
        __m128i a = _mm_shuffle_epi8(x, up);
        __m128i b = _mm_blendv_epi8(_mm_shuffle_epi8(x, down), last, down);
        x = crc_fold128(a, k128, b);
    }
    return ~crc_reduce128(x);
}

/* len >= 16. */
TARGET_PCLMUL static uint32_t crc32_pclmul(uint32_t crc, const uint8_t *p, size_t len)
{
    /* The incoming register (zlib's value inverted) is XORed onto the first 32 bits. */
    const __m128i init = _mm_cvtsi32_si128((int)~crc);
    if (len < 64) {
        __m128i x = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), init);
        return crc_finish(x, p + 16, len - 16);
    }
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), init);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    len -= 64;
    const __m128i k512 = _mm_set_epi64x((long long)CRC_K(480), (long long)CRC_K(544));
    while (len >= 64) {
        x0 = crc_fold128(x0, k512, _mm_loadu_si128((const __m128i *)p));
        x1 = crc_fold128(x1, k512, _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = crc_fold128(x2, k512, _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = crc_fold128(x3, k512, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        len -= 64;
    }
    const __m128i k128 = _mm_set_epi64x((long long)CRC_K(96), (long long)CRC_K(160));
    x0 = crc_fold128(x0, k128, x1);
    x0 = crc_fold128(x0, k128, x2);
    x0 = crc_fold128(x0, k128, x3);
    return crc_finish(x0, p, len);
}

TARGET_VPCLMUL static inline __m512i crc_fold512(__m512i x, __m512i k, __m512i next)
{
    __m512i lo = _mm512_clmulepi64_epi128(x, k, 0x00);
    __m512i hi = _mm512_clmulepi64_epi128(x, k, 0x11);
    return _mm512_ternarylogic_epi64(lo, hi, next, 0x96); /* lo ^ hi ^ next */
}

/* len >= 256: four 512-bit accumulators, 256 bytes per step. */
TARGET_VPCLMUL static uint32_t crc32_vpclmul(uint32_t crc, const uint8_t *p, size_t len)
{
    const __m512i init = _mm512_inserti32x4(_mm512_setzero_si512(),
                                            _mm_cvtsi32_si128((int)~crc), 0);
    __m512i z0 = _mm512_xor_si512(_mm512_loadu_si512(p), init);
    __m512i z1 = _mm512_loadu_si512(p + 64);
    __m512i z2 = _mm512_loadu_si512(p + 128);
    __m512i z3 = _mm512_loadu_si512(p + 192);
    p += 256;
    len -= 256;
    const __m512i k2048 = _mm512_broadcast_i32x4(
        _mm_set_epi64x((long long)CRC_K(2016), (long long)CRC_K(2080)));
    while (len >= 256) {
        z0 = crc_fold512(z0, k2048, _mm512_loadu_si512(p));
        z1 = crc_fold512(z1, k2048, _mm512_loadu_si512(p + 64));
        z2 = crc_fold512(z2, k2048, _mm512_loadu_si512(p + 128));
        z3 = crc_fold512(z3, k2048, _mm512_loadu_si512(p + 192));
        p += 256;
        len -= 256;
    }
    const __m512i k512 = _mm512_broadcast_i32x4(
        _mm_set_epi64x((long long)CRC_K(480), (long long)CRC_K(544)));
    z0 = crc_fold512(z0, k512, z1);
    z0 = crc_fold512(z0, k512, z2);
    z0 = crc_fold512(z0, k512, z3);
    while (len >= 64) {
        z0 = crc_fold512(z0, k512, _mm512_loadu_si512(p));
        p += 64;
        len -= 64;
    }
    /* The four 128-bit lanes of z0 (lane 0 first in the message) onto the last one: lane i
       moves 128 * (3 - i) bits. Lane 3's constants are zero, so its product vanishes. */
    const __m512i klanes = _mm512_set_epi64(
        0, 0, (long long)CRC_K(96), (long long)CRC_K(160), (long long)CRC_K(224),
        (long long)CRC_K(288), (long long)CRC_K(352), (long long)CRC_K(416));
    __m512i s = _mm512_xor_si512(_mm512_clmulepi64_epi128(z0, klanes, 0x00),
                                 _mm512_clmulepi64_epi128(z0, klanes, 0x11));
    __m128i x = _mm_xor_si128(_mm512_extracti32x4_epi32(s, 0), _mm512_extracti32x4_epi32(s, 1));
    x = _mm_ternarylogic_epi64(x, _mm512_extracti32x4_epi32(s, 2),
                               _mm512_extracti32x4_epi32(z0, 3), 0x96);
    return crc_finish(x, p, len);
}

static int crc_detect(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("pclmul") || !__builtin_cpu_supports("sse4.1"))
        return CRC_IMPL_ZLIB;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("vpclmulqdq"))
        return CRC_IMPL_VPCLMUL;
    return CRC_IMPL_PCLMUL;
}
#else
static int crc_detect(void)
{
    return CRC_IMPL_ZLIB;
}
#endif

/* The best implementation this CPU has, and the one in use (lower only via th_crc32_select).
   Both are set before any caller can run (a constructor runs at dlopen). */
static int crc_best = CRC_IMPL_ZLIB;
static int crc_impl = CRC_IMPL_ZLIB;

__attribute__((constructor)) static void crc_init(void)
{
    crc_best = crc_detect();
    __atomic_store_n(&crc_impl, crc_best, __ATOMIC_RELAXED);
}

/* zlib.crc32(buf, crc) by the fastest path for this length. */
static uint32_t crc32_update(uint32_t crc, const uint8_t *buf, size_t len)
{
#ifdef TH_CRC_VECTOR
    int impl = __atomic_load_n(&crc_impl, __ATOMIC_RELAXED);
    if (impl >= CRC_IMPL_VPCLMUL && len >= CRC_VPCLMUL_MIN)
        return crc32_vpclmul(crc, buf, len);
    if (impl >= CRC_IMPL_PCLMUL && len >= CRC_PCLMUL_MIN)
        return crc32_pclmul(crc, buf, len);
#endif
    return crc32_zlib(crc, buf, len);
}

uint32_t th_crc32(const uint8_t *buf, size_t len)
{
    if (len == 0)
        return 0;
    return crc32_update(0, buf, len) & 0x7FFFFFFFu;
}

uint32_t th_crc32_full(uint32_t crc, const uint8_t *buf, size_t len)
{
    return crc32_update(crc, buf, len);
}

int th_crc32_impl(void)
{
    return __atomic_load_n(&crc_impl, __ATOMIC_RELAXED);
}

int th_crc32_select(int impl)
{
    if (impl < 0 || impl > crc_best)
        impl = crc_best;
    __atomic_store_n(&crc_impl, impl, __ATOMIC_RELAXED);
    return impl;
}

/*
 * Java String.hashCode of the UTF-16 form of a UTF-8 byte string. Malformed input is
 * replaced exactly as Python's bytes.decode("utf-8", "replace") does (the Unicode "maximal
 * subpart" practice): an invalid lead byte is one U+FFFD, and a valid lead followed by too
 * few valid continuation bytes is one U+FFFD for the valid prefix. Surrogate code points
 * (ED A0..BF) and overlongs (C0, C1, E0 80..9F, F0 80..8F) are invalid; above U+10FFFF too.
 */
static uint32_t java_hash_update(uint32_t h, const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t b = s[i];
        if (b < 0x80) {
            h = 31u * h + b;
            i++;
            continue;
        }
        size_t need;
        uint32_t lo = 0x80, hi = 0xBF, cp;
        if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
            cp = b & 0x1F;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            cp = b & 0x0F;
            if (b == 0xE0)
                lo = 0xA0;
            else if (b == 0xED)
                hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            cp = b & 0x07;
            if (b == 0xF0)
                lo = 0x90;
            else if (b == 0xF4)
                hi = 0x8F;
        } else {
            h = 31u * h + 0xFFFDu;
            i++;
            continue;
        }
        size_t k = 1;
        for (; k <= need; k++) {
            if (i + k >= n)
                break;
            uint32_t c = s[i + k];
            uint32_t l = k == 1 ? lo : 0x80, u = k == 1 ? hi : 0xBF;
            if (c < l || c > u)
                break;
            cp = (cp << 6) | (c & 0x3F);
        }
        if (k <= need) {
            /* bytes s[i .. i+k) are the maximal valid prefix: one replacement character */
            h = 31u * h + 0xFFFDu;
            i += k;
            continue;
        }
        i += need + 1;
        if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            h = 31u * h + (0xD800u | (v >> 10));
            h = 31u * h + (0xDC00u | (v & 0x3FF));
        } else {
            h = 31u * h + cp;
        }
    }
    return h;
}

static int32_t u32_to_i32(uint32_t u)
{
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

int32_t th_java_hash(const uint8_t *utf8, size_t len)
{
    return u32_to_i32(java_hash_update(0, utf8, len));
}

/* ---- encoding ------------------------------------------------------------------------------ */

/* TOTALSIZE of a v1 record (docs/formats.md, 'Commitlog record'), in 64 bits so nothing can
   overflow. */
static inline uint64_t v1_record_size(uint64_t body_len, uint64_t topic_len, uint64_t props_len,
                                      uint64_t born_host_len, uint64_t store_host_len)
{
    return HEAD_SIZE + born_host_len + 8 + store_host_len + 4 + 8 + 4 + body_len + 1 +
           topic_len + 2 + props_len;
}

static inline int host_len_ok(size_t n)
{
    return n == 8 || n == 20;
}

/* Does a record (or batch) of `need` bytes plus the 8-byte blank fit in seg[pos, seg_size)? */
static inline int fits(uint64_t seg_size, uint64_t pos, uint64_t need)
{
    if (pos > seg_size)
        return 0;
    uint64_t room = seg_size - pos;
    return need <= room && room - need >= END_FILE_MIN_BLANK_LENGTH;
}

/* Everything a record shares with its batch siblings. */
typedef struct {
    const uint8_t *topic;
    size_t topic_len;
    int32_t queue_id;
    int32_t sys_flag; /* V6 bits already merged in */
    int64_t born_timestamp;
    const uint8_t *born_host;
    size_t born_host_len;
    int64_t store_timestamp;
    const uint8_t *store_host;
    size_t store_host_len;
} record_common;

/*
 * Write one v1 record of `size` bytes at dst (the caller checked the room). props2 is
 * appended to props1 (used for batch items: item props, optional \x02, batch props).
 */
/* Make a fully written record valid: its MAGIC is the last store, after a release fence. */
static void publish_record(uint8_t *dst)
{
    __atomic_thread_fence(__ATOMIC_RELEASE);
    wr_u32(dst + 4, MAGIC_V1);
}

static void write_record(uint8_t *dst, uint32_t size, const record_common *c, int32_t flag,
                         int64_t queue_offset, int64_t phys_offset, int32_t reconsume_times,
                         int64_t prepared_tx_offset, const uint8_t *body, size_t body_len,
                         const uint8_t *props1, size_t props1_len, int add_separator,
                         const uint8_t *props2, size_t props2_len)
{
    uint8_t *p = dst;
    wr_u32(p, size);
    /* MAGIC stays 0 until the whole record is in place (publish_record): a process killed
       half-way through this copy leaves a record that no scan accepts, even when the torn
       part is outside what BODYCRC covers (topic, properties). */
    wr_u32(p + 4, 0);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    wr_u32(p + 8, th_crc32(body, body_len));
    wr_i32(p + 12, c->queue_id);
    wr_i32(p + 16, flag);
    wr_i64(p + 20, queue_offset);
    wr_i64(p + 28, phys_offset);
    wr_i32(p + 36, c->sys_flag);
    wr_i64(p + 40, c->born_timestamp);
    p += HEAD_SIZE;
    memcpy(p, c->born_host, c->born_host_len);
    p += c->born_host_len;
    wr_i64(p, c->store_timestamp);
    p += 8;
    memcpy(p, c->store_host, c->store_host_len);
    p += c->store_host_len;
    wr_i32(p, reconsume_times);
    wr_i64(p + 4, prepared_tx_offset);
    wr_u32(p + 12, (uint32_t)body_len);
    p += 16;
    if (body_len)
        memcpy(p, body, body_len);
    p += body_len;
    *p++ = (uint8_t)c->topic_len;
    if (c->topic_len)
        memcpy(p, c->topic, c->topic_len);
    p += c->topic_len;
    size_t props_len = props1_len + (add_separator ? 1 : 0) + props2_len;
    wr_u16(p, (uint16_t)props_len);
    p += 2;
    if (props1_len)
        memcpy(p, props1, props1_len);
    p += props1_len;
    if (add_separator)
        *p++ = 0x02;
    if (props2_len)
        memcpy(p, props2, props2_len);
}

static int32_t merge_v6_flags(int32_t sys_flag, size_t born_host_len, size_t store_host_len)
{
    /* The host fields decide the V6 bits (as the broker sets them): a stale bit from the
       caller would make the record unreadable, so both bits are derived, never trusted. */
    sys_flag &= ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6);
    if (born_host_len == 20)
        sys_flag |= SYSFLAG_BORNHOST_V6;
    if (store_host_len == 20)
        sys_flag |= SYSFLAG_STOREHOST_V6;
    return sys_flag;
}

int64_t th_encode_record(uint8_t *seg, uint64_t seg_size, uint64_t pos, int64_t base_offset,
                         const uint8_t *topic, size_t topic_len,
                         const uint8_t *body, size_t body_len,
                         const uint8_t *props, size_t props_len,
                         int32_t queue_id, int32_t flag, int64_t queue_offset, int32_t sys_flag,
                         int64_t born_timestamp, const uint8_t *born_host, size_t born_host_len,
                         int64_t store_timestamp, const uint8_t *store_host, size_t store_host_len,
                         int32_t reconsume_times, int64_t prepared_tx_offset)
{
    if (topic_len > MAX_TOPIC_LENGTH || !host_len_ok(born_host_len) ||
        !host_len_ok(store_host_len))
        return TH_ERR_BAD_ARGUMENT;
    if (props_len > MAX_PROPERTIES_LENGTH)
        return TH_ERR_PROPS_TOO_LARGE;
    if (body_len > (size_t)INT32_MAX)
        return TH_ERR_BAD_ARGUMENT;
    uint64_t size = v1_record_size(body_len, topic_len, props_len, born_host_len, store_host_len);
    if (size > (uint64_t)INT32_MAX)
        return TH_ERR_BAD_ARGUMENT; /* TOTALSIZE is a Java int */
    if (!fits(seg_size, pos, size))
        return TH_ERR_NO_SPACE;
    record_common c = {
        .topic = topic, .topic_len = topic_len, .queue_id = queue_id,
        .sys_flag = merge_v6_flags(sys_flag, born_host_len, store_host_len),
        .born_timestamp = born_timestamp, .born_host = born_host,
        .born_host_len = born_host_len, .store_timestamp = store_timestamp,
        .store_host = store_host, .store_host_len = store_host_len,
    };
    write_record(seg + pos, (uint32_t)size, &c, flag, queue_offset, add_wrap(base_offset, pos),
                 reconsume_times, prepared_tx_offset, body, body_len, props, props_len, 0,
                 NULL, 0);
    publish_record(seg + pos);
    return (int64_t)(pos + size);
}

/* One parsed SEND_BATCH_MESSAGE item. */
typedef struct {
    int32_t flag;
    const uint8_t *body;
    uint32_t body_len;
    const uint8_t *props;
    uint32_t props_len;
} batch_item;

/*
 * Parse the item at items[off, items_len) as wire.record.decode_batch does. Returns the
 * offset just past it, or 0 on a malformed/truncated item (an item is never empty).
 */
static size_t parse_batch_item(const uint8_t *items, size_t items_len, size_t off,
                               batch_item *it)
{
    if (items_len - off < BATCH_ITEM_FIXED)
        return 0;
    const uint8_t *p = items + off;
    int32_t size = rd_i32(p);
    int32_t body_len = rd_i32(p + 16);
    if (body_len < 0 || (uint64_t)body_len + BATCH_ITEM_FIXED > items_len - off)
        return 0;
    uint32_t props_len = rd_u16(p + 20 + (size_t)body_len);
    uint64_t item_len = (uint64_t)BATCH_ITEM_FIXED + (uint64_t)body_len + props_len;
    if (item_len > items_len - off || size < 0 || (uint64_t)size != item_len)
        return 0;
    it->flag = rd_i32(p + 12);
    it->body = p + 20;
    it->body_len = (uint32_t)body_len;
    it->props = p + 22 + (size_t)body_len;
    it->props_len = props_len;
    return off + (size_t)item_len;
}

static inline int needs_separator(const batch_item *it, size_t batch_props_len)
{
    return batch_props_len > 0 && it->props_len > 0 && it->props[it->props_len - 1] != 0x02;
}

int64_t th_encode_batch(uint8_t *seg, uint64_t seg_size, uint64_t pos, int64_t base_offset,
                        const uint8_t *items, size_t items_len,
                        const uint8_t *topic, size_t topic_len,
                        const uint8_t *batch_props, size_t batch_props_len,
                        int32_t queue_id, int64_t first_queue_offset, int32_t sys_flag,
                        int64_t born_timestamp, const uint8_t *born_host, size_t born_host_len,
                        int64_t store_timestamp, const uint8_t *store_host, size_t store_host_len,
                        uint64_t max_body_size,
                        th_batch_entry *out, size_t out_cap, size_t *count)
{
    if (count)
        *count = 0;
    if (topic_len > MAX_TOPIC_LENGTH || !host_len_ok(born_host_len) ||
        !host_len_ok(store_host_len))
        return TH_ERR_BAD_ARGUMENT;

    /* Pass 1: the wire format of every item, and how many there are. */
    size_t n = 0;
    batch_item it;
    for (size_t off = 0; off < items_len; n++) {
        off = parse_batch_item(items, items_len, off, &it);
        if (off == 0)
            return TH_ERR_BATCH_FORMAT;
    }
    if (n == 0)
        return TH_ERR_BATCH_FORMAT;
    if (n > out_cap)
        return TH_ERR_TOO_MANY;

    /* Pass 2: per-item limits (in item order, body before properties) and the total size. */
    uint64_t total = 0;
    for (size_t off = 0; off < items_len;) {
        off = parse_batch_item(items, items_len, off, &it);
        if (it.body_len > max_body_size)
            return TH_ERR_BODY_TOO_LARGE;
        uint64_t props_len = (uint64_t)it.props_len + batch_props_len +
                             (needs_separator(&it, batch_props_len) ? 1 : 0);
        if (props_len > MAX_PROPERTIES_LENGTH)
            return TH_ERR_PROPS_TOO_LARGE;
        /* A record's properties never end in 0: recovery would take it for a torn one. */
        uint8_t last = batch_props_len ? batch_props[batch_props_len - 1]
                                       : (it.props_len ? it.props[it.props_len - 1] : 1);
        if (last == 0)
            return TH_ERR_BATCH_FORMAT;
        uint64_t size = v1_record_size(it.body_len, topic_len, props_len, born_host_len,
                                       store_host_len);
        if (size > (uint64_t)INT32_MAX)
            return TH_ERR_BODY_TOO_LARGE; /* TOTALSIZE is a Java int */
        total += size;
    }
    if (!fits(seg_size, pos, total))
        return TH_ERR_NO_SPACE;

    /* Pass 3: write. Nothing above wrote, so every error left seg untouched. */
    record_common c = {
        .topic = topic, .topic_len = topic_len, .queue_id = queue_id,
        .sys_flag = merge_v6_flags(sys_flag, born_host_len, store_host_len),
        .born_timestamp = born_timestamp, .born_host = born_host,
        .born_host_len = born_host_len, .store_timestamp = store_timestamp,
        .store_host = store_host, .store_host_len = store_host_len,
    };
    size_t i = 0;
    for (size_t off = 0; off < items_len; i++) {
        off = parse_batch_item(items, items_len, off, &it);
        int sep = needs_separator(&it, batch_props_len);
        uint64_t props_len = (uint64_t)it.props_len + batch_props_len + (sep ? 1 : 0);
        uint32_t size = (uint32_t)v1_record_size(it.body_len, topic_len, props_len,
                                                 born_host_len, store_host_len);
        int64_t phys = add_wrap(base_offset, pos);
        write_record(seg + pos, size, &c, it.flag, add_wrap(first_queue_offset, i), phys, 0, 0,
                     it.body, it.body_len, it.props, it.props_len, sep, batch_props,
                     batch_props_len);
        out[i].phys_offset = phys;
        out[i].size = (int32_t)size;
        out[i].reserved = 0;
        pos += size;
    }
    /* Publish in order: a kill part-way leaves a whole prefix of the batch, never a hole. */
    for (size_t k = 0; k < i; k++)
        publish_record(seg + ((uint64_t)out[k].phys_offset - (uint64_t)base_offset));
    if (count)
        *count = i;
    return (int64_t)pos;
}

/* ---- scanning ------------------------------------------------------------------------------ */

/*
 * The last non-empty value of property `name`, as decode_properties reads properties: split on
 * \x02, split each chunk at its first \x01, drop chunks with an empty name or value, the last
 * wins. \x01 and \x02 are ASCII, so they never sit inside a replaced UTF-8 sequence and the
 * split can be done on bytes; names compare byte for byte. NULL when there is none.
 */
static const uint8_t *property_value(const uint8_t *props, size_t len, const char *name,
                                     size_t name_len, size_t *value_len)
{
    const uint8_t *value = NULL;
    size_t start = 0;
    while (start <= len) {
        const uint8_t *chunk = props + start;
        size_t rest = len - start;
        const uint8_t *sep2 = rest ? memchr(chunk, 0x02, rest) : NULL;
        size_t chunk_len = sep2 ? (size_t)(sep2 - chunk) : rest;
        if (chunk_len >= 3) {
            const uint8_t *sep1 = memchr(chunk, 0x01, chunk_len);
            if (sep1) {
                size_t nlen = (size_t)(sep1 - chunk);
                size_t vlen = chunk_len - nlen - 1;
                if (nlen == name_len && vlen > 0 && memcmp(chunk, name, name_len) == 0) {
                    value = sep1 + 1;
                    *value_len = vlen;
                }
            }
        }
        if (!sep2)
            break;
        start += chunk_len + 1;
    }
    return value;
}

/* The TAGS property's hash (Java String.hashCode), 0 when there is none. */
static int64_t tags_code_of(const uint8_t *props, size_t len)
{
    size_t value_len = 0;
    const uint8_t *value = property_value(props, len, "TAGS", 4, &value_len);
    return value ? (int64_t)th_java_hash(value, value_len) : 0;
}

/* ---- index files --------------------------------------------------------------------------- */

#define IDX_HEADER_SIZE 40
#define IDX_ENTRY_SIZE 20

/* RocketMQ's IndexFile.putKey; the header fields live in *h until the caller writes them. */
typedef struct {
    int64_t begin_ts, end_ts, begin_phy, end_phy;
    int32_t slot_count, index_count;
} idx_header;

static void index_put_key(uint8_t *idx, uint32_t slot_num, idx_header *h, uint32_t hash,
                          int64_t phys, int64_t store_ts)
{
    int32_t key_hash = u32_to_i32(hash);
    if (key_hash < 0)
        key_hash = key_hash == INT32_MIN ? 0 : -key_hash; /* Math.abs, then < 0 -> 0 */
    uint8_t *slot = idx + IDX_HEADER_SIZE + (uint64_t)((uint32_t)key_hash % slot_num) * 4;
    int32_t prev = rd_i32(slot);
    if (prev <= 0 || prev > h->index_count)
        prev = 0;
    int64_t diff = 0;
    if (h->begin_ts > 0) {
        diff = (store_ts - h->begin_ts) / 1000;
        if (diff > INT32_MAX)
            diff = INT32_MAX;
        else if (diff < 0)
            diff = 0;
    }
    uint8_t *entry = idx + IDX_HEADER_SIZE + (uint64_t)slot_num * 4 +
                     (uint64_t)h->index_count * IDX_ENTRY_SIZE;
    wr_i32(entry, key_hash);
    wr_i64(entry + 4, phys);
    wr_i32(entry + 12, (int32_t)diff);
    wr_i32(entry + 16, prev);
    wr_i32(slot, h->index_count);
    if (h->index_count <= 1) {
        h->begin_phy = phys;
        h->begin_ts = store_ts;
    }
    if (prev == 0)
        h->slot_count++;
    h->index_count++;
    h->end_phy = phys;
    h->end_ts = store_ts;
}

size_t th_index_put(uint8_t *idx, uint32_t slot_num, uint32_t index_num, const uint8_t *seg,
                    const th_record_info *infos, size_t n)
{
    if (slot_num == 0 || index_num < 2)
        return 0;
    idx_header h = {rd_i64(idx), rd_i64(idx + 8), rd_i64(idx + 16), rd_i64(idx + 24),
                    rd_i32(idx + 32), rd_i32(idx + 36)};
    if (h.index_count <= 0)
        h.index_count = 1;
    size_t done = 0;
    for (; done < n; done++) {
        const th_record_info *r = &infos[done];
        if ((r->sys_flag & 0xC) == 0xC)
            continue; /* ROLLBACK: not indexed */
        const uint8_t *props = seg + r->props_pos;
        size_t uniq_len = 0, keys_len = 0;
        const uint8_t *uniq = property_value(props, r->props_len, "UNIQ_KEY", 8, &uniq_len);
        const uint8_t *keys = property_value(props, r->props_len, "KEYS", 4, &keys_len);
        size_t nkeys = uniq ? 1 : 0;
        for (size_t k = 0; keys && k < keys_len; k++)
            if (keys[k] != ' ' && (k == 0 || keys[k - 1] == ' '))
                nkeys++;
        if (nkeys == 0)
            continue;
        uint64_t room = (uint64_t)index_num - (uint64_t)h.index_count;
        if (nkeys > room && h.index_count > 1)
            break; /* the next file takes this record */
        uint32_t topic_hash = java_hash_update(0, seg + r->topic_pos, r->topic_len);
        topic_hash = java_hash_update(topic_hash, (const uint8_t *)"#", 1);
        size_t put = 0;
        if (uniq && put < room) {
            index_put_key(idx, slot_num, &h, java_hash_update(topic_hash, uniq, uniq_len),
                          r->phys_offset, r->store_timestamp);
            put++;
        }
        size_t k = 0;
        while (keys && k < keys_len && put < room) {
            while (k < keys_len && keys[k] == ' ')
                k++;
            size_t start = k;
            while (k < keys_len && keys[k] != ' ')
                k++;
            if (k > start) {
                index_put_key(idx, slot_num, &h,
                              java_hash_update(topic_hash, keys + start, k - start),
                              r->phys_offset, r->store_timestamp);
                put++;
            }
        }
    }
    wr_i64(idx, h.begin_ts);
    wr_i64(idx + 8, h.end_ts);
    wr_i64(idx + 16, h.begin_phy);
    wr_i64(idx + 24, h.end_phy);
    wr_i32(idx + 32, h.slot_count);
    wr_i32(idx + 36, h.index_count);
    return done;
}

/*
 * Decode the record buf[pos, pos + size) (the caller checked pos + size <= limit and
 * size >= MIN_RECORD_SIZE) into *i. Returns 0 if its fields do not add up to TOTALSIZE, -1
 * if they do but the record is torn (see below).
 * Every read is at an offset below `size`, checked before it is made. The *_pos fields are
 * uint32 (th_record_info): buffers past 4 GiB would wrap them, segments are at most 1 GiB.
 */
static int parse_record(const uint8_t *buf, uint64_t pos, uint32_t size, uint32_t magic,
                        int64_t base_offset, int32_t flags, th_record_info *i)
{
    const uint8_t *r = buf + pos;
    const uint64_t end = size; /* offsets below are relative to r */
    i->size = rd_i32(r);
    i->body_crc = rd_i32(r + 8);
    i->queue_id = rd_i32(r + 12);
    i->flag = rd_i32(r + 16);
    i->queue_offset = rd_i64(r + 20);
    i->sys_flag = rd_i32(r + 36);
    i->born_timestamp = rd_i64(r + 40);
    uint64_t born_len = (i->sys_flag & SYSFLAG_BORNHOST_V6) ? 20 : 8;
    uint64_t store_len = (i->sys_flag & SYSFLAG_STOREHOST_V6) ? 20 : 8;
    uint64_t p = HEAD_SIZE;
    i->born_host_pos = (uint32_t)(pos + p);
    i->born_host_len = (uint8_t)born_len;
    p += born_len;
    if (p + 8 + store_len + 16 > end)
        return 0;
    i->store_timestamp = rd_i64(r + p);
    p += 8;
    i->store_host_pos = (uint32_t)(pos + p);
    i->store_host_len = (uint8_t)store_len;
    p += store_len;
    i->reconsume_times = rd_i32(r + p);
    i->prepared_tx_offset = rd_i64(r + p + 4);
    int32_t body_len = rd_i32(r + p + 12);
    p += 16;
    if (body_len < 0 || p + (uint64_t)body_len > end)
        return 0;
    const uint64_t body_off = p;
    i->body_pos = (uint32_t)(pos + p);
    i->body_len = (uint32_t)body_len;
    p += (uint64_t)body_len;
    uint64_t topic_len;
    if (magic == MAGIC_V1) {
        i->version = 1;
        if (p + 1 > end)
            return 0;
        topic_len = r[p];
        p += 1;
    } else {
        i->version = 2;
        if (p + 2 > end)
            return 0;
        topic_len = rd_u16(r + p);
        p += 2;
    }
    i->topic_pos = (uint32_t)(pos + p);
    i->topic_len = (uint16_t)topic_len;
    p += topic_len;
    if (p + 2 > end)
        return 0;
    uint64_t props_len = rd_u16(r + p);
    p += 2;
    const uint64_t props_off = p;
    i->props_pos = (uint32_t)(pos + p);
    i->props_len = (uint16_t)props_len;
    p += props_len;
    if (p != end)
        return 0;
    /* A whole record never ends in a 0 byte: its last byte is its properties' last (a value's
       character or the 0x02 separator) or, without properties, its topic's last. A 0 there is
       the tail of a record that never reached the file (zero-filled segment) while its header
       did: a slave killed after a replication frame was cut inside the record, or a lost
       page. BODYCRC cannot see it when only properties (or topic) bytes are missing. */
    if (props_len ? r[end - 1] == 0 : (topic_len && r[props_off - 3] == 0))
        return -1;
    i->phys_offset = add_wrap(base_offset, pos);
    i->tags_code = 0;
    if ((flags & TH_SCAN_TAGS) && props_len)
        i->tags_code = tags_code_of(r + props_off, props_len);
    if (flags & TH_SCAN_CHECK_CRC) {
        uint32_t crc = th_crc32(r + body_off, (size_t)body_len);
        i->crc_ok = (i->body_crc >= 0 && crc == (uint32_t)i->body_crc) ? 1 : 0;
    } else {
        i->crc_ok = 2;
    }
    return 1;
}

static size_t scan_stop(th_scan_result *res, size_t n, uint64_t end, int32_t stop, int32_t size)
{
    res->end = end;
    res->stop = stop;
    res->size = size;
    return n;
}

size_t th_scan(const uint8_t *buf, uint64_t limit, uint64_t pos, int64_t base_offset,
               int32_t flags, uint32_t max_record,
               th_record_info *out, size_t out_cap, th_scan_result *res)
{
    size_t n = 0;
    for (;;) {
        if (pos == limit)
            return scan_stop(res, n, pos, TH_STOP_END, 0);
        if (n >= out_cap)
            return scan_stop(res, n, pos, TH_STOP_FULL, 0);
        if (pos > limit || limit - pos < 8)
            return scan_stop(res, n, pos, TH_STOP_PARTIAL, 0);
        const uint8_t *r = buf + pos;
        int32_t size = rd_i32(r);
        uint32_t magic = rd_u32(r + 4);
        if (magic == BLANK_MAGIC)
            return scan_stop(res, n, pos, TH_STOP_BLANK, size);
        if (magic != MAGIC_V1 && magic != MAGIC_V2)
            return scan_stop(res, n, pos, TH_STOP_BAD_MAGIC, size);
        if (size < (int32_t)MIN_RECORD_SIZE || (uint32_t)size > max_record)
            return scan_stop(res, n, pos, TH_STOP_BAD_SIZE, size);
        if ((uint64_t)size > limit - pos)
            return scan_stop(res, n, pos, TH_STOP_PARTIAL, size);
        th_record_info *info = &out[n];
        int parsed = parse_record(buf, pos, (uint32_t)size, magic, base_offset, flags, info);
        if (parsed == 0)
            return scan_stop(res, n, pos, TH_STOP_BAD_SIZE, size);
        if (parsed < 0)
            return scan_stop(res, n, pos, TH_STOP_TORN, size);
        if (info->crc_ok == 0) /* described in out[n] but not counted */
            return scan_stop(res, n, pos, TH_STOP_BAD_CRC, size);
        n++;
        pos += (uint64_t)size;
    }
}

/* ---- consume-queue runs ---------------------------------------------------------------- */

#define TX_TYPE_MASK 0xC
#define TX_PREPARED 0x4
#define TX_ROLLBACK 0xC
#define CQ_ENTRY_SIZE 20u

/* Is r of the same queue (topic bytes and queue id) as q? */
static inline int cq_same_queue(const uint8_t *buf, const th_record_info *q,
                                const th_record_info *r)
{
    return r->queue_id == q->queue_id && r->topic_len == q->topic_len &&
           memcmp(buf + r->topic_pos, buf + q->topic_pos, r->topic_len) == 0;
}

#define CQ_NO_RUN UINT32_MAX

size_t th_cq_runs(const uint8_t *buf, const th_record_info *infos, size_t n,
                  uint8_t *entries, uint32_t *order, th_cq_run *runs, size_t runs_cap,
                  uint32_t *table, size_t table_size)
{
    if (n == 0)
        return 0;
    if (table_size < 2 * n || (table_size & (table_size - 1)) != 0)
        return SIZE_MAX;
    /* Pass 1: each record's run, found through an open-addressed table of each queue's
       latest run (at most n queues in a table of 2n slots or more: it never fills). order[i]
       holds record i's run meanwhile. */
    memset(table, 0xff, table_size * sizeof *table);
    size_t mask = table_size - 1;
    size_t count = 0;
    size_t stop = n;
    for (size_t i = 0; i < n; i++) {
        const th_record_info *r = &infos[i];
        int32_t tx = r->sys_flag & TX_TYPE_MASK;
        if (tx == TX_PREPARED || tx == TX_ROLLBACK) {
            order[i] = CQ_NO_RUN;
            continue;
        }
        uint32_t h = 2166136261u; /* FNV-1a of the topic bytes, then the queue id */
        for (uint32_t k = 0; k < r->topic_len; k++)
            h = (h ^ buf[r->topic_pos + k]) * 16777619u;
        h = (h ^ (uint32_t)r->queue_id) * 16777619u;
        size_t slot = h & mask;
        while (table[slot] != CQ_NO_RUN &&
               !cq_same_queue(buf, &infos[runs[table[slot]].last], r))
            slot = (slot + 1) & mask;
        if (table[slot] != CQ_NO_RUN) {
            th_cq_run *run = &runs[table[slot]];
            const th_record_info *last = &infos[run->last];
            if (last->queue_offset != INT64_MAX && r->queue_offset == last->queue_offset + 1) {
                run->count++;
                run->last = (uint32_t)i;
                order[i] = table[slot];
                continue;
            }
        }
        if (count == runs_cap) {
            stop = i;
            break;
        }
        runs[count].first = runs[count].last = (uint32_t)i;
        runs[count].count = 1;
        table[slot] = (uint32_t)count;
        order[i] = (uint32_t)count;
        count++;
    }
    /* Pass 2: the runs' entries one after another. The table now holds each record's run
       (its first n slots) and each run's next free entry (the count after them). */
    memcpy(table, order, stop * sizeof *table);
    uint32_t *next = table + n;
    uint32_t at = 0;
    for (size_t k = 0; k < count; k++) {
        runs[k].entry = next[k] = at;
        at += runs[k].count;
    }
    for (size_t i = 0; i < stop; i++) {
        uint32_t k = table[i];
        if (k == CQ_NO_RUN)
            continue;
        uint32_t j = next[k]++;
        const th_record_info *r = &infos[i];
        uint8_t *e = entries + CQ_ENTRY_SIZE * (size_t)j;
        wr_i64(e, r->phys_offset);
        wr_i32(e + 8, r->size);
        wr_i64(e + 12, r->tags_code);
        order[j] = (uint32_t)i;
    }
    return count;
}

/* ---- reading a consume queue's records (a pull) ---------------------------------------- */

#define CQ_BLANK_SIZE INT32_MAX

static int tag_wanted(int64_t code, const int64_t *tag_codes, size_t n_tags)
{
    for (size_t k = 0; k < n_tags; k++)
        if (tag_codes[k] == code)
            return 1;
    return 0;
}

/* Is the record at seg[at, at + size) (inside the segment) the one to serve? */
static int gather_verify(const uint8_t *seg, uint64_t at, uint32_t size, int64_t base_offset,
                         uint32_t max_record, const uint8_t *topic, size_t topic_len,
                         int32_t queue_id, int64_t queue_offset)
{
    if (size < MIN_RECORD_SIZE || size > max_record)
        return 0;
    const uint8_t *r = seg + at;
    if ((uint32_t)rd_i32(r) != size)
        return 0;
    uint32_t magic = rd_u32(r + 4);
    if (magic != MAGIC_V1 && magic != MAGIC_V2)
        return 0;
    th_record_info info;
    if (parse_record(seg, at, size, magic, base_offset, TH_SCAN_CHECK_CRC, &info) <= 0)
        return 0;
    return info.crc_ok == 1 && rd_i64(r + 28) == add_wrap(base_offset, at) &&
           info.queue_id == queue_id && info.queue_offset == queue_offset &&
           info.topic_len == topic_len && memcmp(seg + info.topic_pos, topic, topic_len) == 0;
}

static void gather_problem(th_gather_result *res, uint8_t *outcomes, size_t i, uint8_t outcome)
{
    outcomes[i] = outcome;
    res->problems++;
    res->last_problem = outcome;
}

void th_gather(const uint8_t *seg, uint64_t seg_size, int64_t base_offset,
               int64_t min_offset, int64_t readable_end,
               const uint8_t *entries, size_t n,
               const int64_t *tag_codes, size_t n_tags,
               const uint8_t *topic, size_t topic_len, int32_t queue_id,
               int64_t first_queue_offset, int32_t flags, uint32_t max_record,
               size_t max_count, uint64_t max_bytes, uint64_t bytes_before,
               uint8_t *outcomes, th_span *records, th_span *spans, th_gather_result *res)
{
    memset(res, 0, sizeof *res);
    res->last_phys = -1;
    res->stop = TH_GATHER_END;
    size_t i = 0;
    for (; i < n; i++) {
        if (res->found >= max_count) {
            res->stop = TH_GATHER_COUNT;
            break;
        }
        const uint8_t *e = entries + (size_t)CQ_ENTRY_SIZE * i;
        int64_t phys = rd_i64(e);
        int32_t size = rd_i32(e + 8);
        int64_t tags = rd_i64(e + 12);
        if (size == CQ_BLANK_SIZE || phys < min_offset) {
            gather_problem(res, outcomes, i, TH_GATHER_REMOVED);
            continue;
        }
        if (tag_codes != NULL && !tag_wanted(tags, tag_codes, n_tags)) {
            outcomes[i] = TH_GATHER_FILTERED;
            continue;
        }
        if ((res->found > 0 || bytes_before > 0) && size > 0 &&
            bytes_before + res->bytes + (uint64_t)size > max_bytes) {
            res->stop = TH_GATHER_BYTES;
            break;
        }
        if (phys < base_offset || (uint64_t)(phys - base_offset) >= seg_size) {
            res->stop = TH_GATHER_SEGMENT;
            break;
        }
        uint64_t at = (uint64_t)(phys - base_offset);
        if (size <= 0 || phys > readable_end - 8 || (int64_t)size > readable_end - phys ||
            (uint64_t)size > seg_size - at) {
            gather_problem(res, outcomes, i, TH_GATHER_ABSENT);
            continue;
        }
        if ((flags & TH_GATHER_VERIFY) &&
            !gather_verify(seg, at, (uint32_t)size, base_offset, max_record, topic, topic_len,
                           queue_id, first_queue_offset + (int64_t)i)) {
            gather_problem(res, outcomes, i, TH_GATHER_INVALID);
            continue;
        }
        outcomes[i] = TH_GATHER_FOUND;
        records[res->found].pos = at;
        records[res->found].len = (uint64_t)size;
        res->found++;
        if (res->spans > 0 && spans[res->spans - 1].pos + spans[res->spans - 1].len == at) {
            spans[res->spans - 1].len += (uint64_t)size;
        } else {
            spans[res->spans].pos = at;
            spans[res->spans].len = (uint64_t)size;
            res->spans++;
        }
        res->bytes += (uint64_t)size;
        res->last_phys = phys;
    }
    res->entries = (uint32_t)i;
}

/* ---- memory and files ---------------------------------------------------------------------- */

static uintptr_t page_size(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (uintptr_t)ps : (uintptr_t)4096;
}

int th_msync(uint8_t *addr, size_t len)
{
    uintptr_t ps = page_size();
    uintptr_t a = (uintptr_t)addr;
    uintptr_t start = a & ~(ps - 1);
    size_t span = len + (size_t)(a - start);
    if (msync((void *)start, span, MS_SYNC) != 0)
        return -errno;
    return 0;
}

struct th_sync_thread {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int done_fd;
    int stop;    /* set by th_sync_thread_stop */
    int busy;    /* a range is submitted and not finished */
    uint8_t *addr;
    size_t len;
    int result;
};

static void *sync_thread_main(void *arg)
{
    th_sync_thread *t = arg;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->stop && !(t->busy && t->addr != NULL))
            pthread_cond_wait(&t->wake, &t->lock);
        if (t->busy && t->addr != NULL) {
            uint8_t *addr = t->addr;
            size_t len = t->len;
            t->addr = NULL;
            pthread_mutex_unlock(&t->lock);
            int rc = th_msync(addr, len);
            pthread_mutex_lock(&t->lock);
            t->result = rc;
            t->busy = 0;
            uint64_t one = 1;
            /* An eventfd write fails only on counter overflow, which 2^64 - 1 ranges cannot
               reach; a lost wake-up would leave the flush waiting, never the data unsynced. */
            ssize_t w = write(t->done_fd, &one, sizeof one);
            (void)w;
            continue;
        }
        if (t->stop)
            break;
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

th_sync_thread *th_sync_thread_start(int done_fd)
{
    th_sync_thread *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->done_fd = done_fd;
    int rc = pthread_mutex_init(&t->lock, NULL);
    if (rc == 0) {
        rc = pthread_cond_init(&t->wake, NULL);
        if (rc == 0) {
            rc = pthread_create(&t->thread, NULL, sync_thread_main, t);
            if (rc == 0)
                return t;
            pthread_cond_destroy(&t->wake);
        }
        pthread_mutex_destroy(&t->lock);
    }
    free(t);
    errno = rc;
    return NULL;
}

int th_sync_thread_submit(th_sync_thread *t, uint8_t *addr, size_t len)
{
    pthread_mutex_lock(&t->lock);
    if (t->busy) {
        pthread_mutex_unlock(&t->lock);
        return -EBUSY;
    }
    t->busy = 1;
    t->addr = addr;
    t->len = len;
    t->result = 0;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);
    return 0;
}

int th_sync_thread_result(th_sync_thread *t)
{
    pthread_mutex_lock(&t->lock);
    int rc = t->busy ? -EBUSY : t->result;
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void th_sync_thread_stop(th_sync_thread *t)
{
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* Linux 5.14+; the value is fixed by the kernel ABI, older headers lack the name. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static int warm_force_touch; /* test hook: th_warm_force_touch */

void th_warm_force_touch(int on)
{
    __atomic_store_n(&warm_force_touch, on ? 1 : 0, __ATOMIC_RELAXED);
}

/*
 * The fallback: a locked OR of zero into one byte of each 4096-byte page, never outside
 * [addr, addr + len) -- the first at addr itself, then at each page boundary. A locked
 * read-modify-write faults the page in writable like any store, but cannot lose a
 * concurrent write to the same byte, and leaves the contents as they were.
 */
static void warm_touch(uint8_t *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr;
    size_t first_boundary = (size_t)((WARM_PAGE - (a & (WARM_PAGE - 1))) & (WARM_PAGE - 1));
    volatile uint8_t *v = addr;
    __atomic_fetch_or(&v[0], 0, __ATOMIC_RELAXED);
    for (size_t off = first_boundary == 0 ? WARM_PAGE : first_boundary; off < len;
         off += WARM_PAGE)
        __atomic_fetch_or(&v[off], 0, __ATOMIC_RELAXED);
}

int th_warm(uint8_t *addr, size_t len)
{
    if (len == 0)
        return 0;
    uintptr_t ps = page_size();
    uintptr_t a = (uintptr_t)addr;
    uintptr_t start = a & ~(ps - 1);
    size_t span = len + (size_t)(a - start);
    if (!__atomic_load_n(&warm_force_touch, __ATOMIC_RELAXED)) {
        /* The kernel allocates and maps every page of the span (the whole pages the range
           overlaps) in one call, as if each had been written, but writes nothing. */
        if (madvise((void *)start, span, MADV_POPULATE_WRITE) == 0)
            return 0;
        int err = errno;
        /* These mean a store would fault fatally too (SIGBUS/SIGSEGV): report, do not touch.
           Anything else (EINVAL: a kernel before 5.14 or a mapping it cannot populate,
           EINTR, EAGAIN) falls back to touching the pages. */
        if (err == EFAULT || err == ENOMEM
#ifdef EHWPOISON
            || err == EHWPOISON
#endif
        )
            return -err;
    }
    warm_touch(addr, len);
    (void)madvise((void *)start, span, MADV_WILLNEED);
    return 0;
}

void th_zero(uint8_t *addr, size_t len)
{
    if (len)
        memset(addr, 0, len);
}

int th_fallocate(int fd, int64_t offset, int64_t len)
{
    return posix_fallocate(fd, (off_t)offset, (off_t)len);
}

int64_t th_sendfile(int out_fd, int in_fd, int64_t offset, size_t count)
{
    off_t off = (off_t)offset;
    ssize_t n = sendfile(out_fd, in_fd, &off, count);
    if (n < 0)
        return -(int64_t)errno;
    return (int64_t)n;
}

/* The `left` bytes in the pipe into the file at `offset` by copying: for a file system
   whose files take no splice. 0, or -errno. */
static int64_t drain_pipe_by_copy(int pipe_r, int file_fd, int64_t offset, size_t left)
{
    uint8_t buffer[64 * 1024];
    while (left) {
        ssize_t got = read(pipe_r, buffer, left < sizeof buffer ? left : sizeof buffer);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -EIO; /* fewer bytes than were spliced in: never a "try again" */
        for (ssize_t put = 0; put < got;) {
            ssize_t n = pwrite(file_fd, buffer + put, (size_t)(got - put), (off_t)offset);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return n < 0 ? -(int64_t)errno : -EIO;
            put += n;
            offset += n;
        }
        left -= (size_t)got;
    }
    return 0;
}

int64_t th_splice_to_file(int sock_fd, int pipe_r, int pipe_w, int file_fd, int64_t offset,
                          size_t count)
{
    size_t moved = 0;
    while (moved < count) {
        ssize_t in = splice(sock_fd, NULL, pipe_w, NULL, count - moved,
                            SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (in < 0 && errno == EINTR)
            continue;
        if (in < 0 && moved)
            break; /* report the bytes moved; the next call meets the condition again */
        if (in < 0)
            return -(int64_t)errno;
        if (in == 0)
            break; /* the peer closed */
        size_t left = (size_t)in;
        while (left) {
            loff_t at = (loff_t)(offset + (int64_t)moved);
            ssize_t out = splice(pipe_r, NULL, file_fd, &at, left, SPLICE_F_MOVE);
            if (out < 0 && errno == EINTR)
                continue;
            if (out <= 0) {
                int64_t rc = drain_pipe_by_copy(pipe_r, file_fd, offset + (int64_t)moved, left);
                if (rc < 0)
                    return rc;
                out = (ssize_t)left;
            }
            moved += (size_t)out;
            left -= (size_t)out;
        }
    }
    return (int64_t)moved;
}
