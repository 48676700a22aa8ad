/*
 * The two hashes of stored bytes: CRC-32 (RocketMQ's BODYCRC, which the encoders write and
 * the scanner checks) and Java's String.hashCode over UTF-8 (the tags code of a consume-queue
 * entry, an index key's hash). Both must equal what the Java broker computes, bit for bit.
 */
#include "internal.h"

#include <zlib.h>

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

int32_t th_java_hash(const uint8_t *utf8, size_t len)
{
    return u32_to_i32(java_hash_update(0, utf8, len));
}
