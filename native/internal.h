/*
 * What the parts of the native core share (the parts are the .c files beside this one; they
 * are compiled together as one translation unit by trio_ha_native.c, never one by one).
 *
 * The record layout's constants, the big-endian readers and writers, and the declarations of
 * the few static functions one part lends another. They stay static on purpose: in one unit
 * the compiler inlines them across parts exactly as it did when the parts were one file, and
 * the module exports nothing but the th_* calls of trio_ha_native.h.
 */
#ifndef TRIO_HA_NATIVE_INTERNAL_H
#define TRIO_HA_NATIVE_INTERNAL_H

#include "trio_ha_native.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* ---- big-endian helpers ---------------------------------------------------------------- */

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

static inline int32_t u32_to_i32(uint32_t u)
{
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* ---- lent from one part to another ----------------------------------------------------- */

/* hash.c: Java String.hashCode continued over more UTF-8 bytes (the index hashes a key as
   topic, "#", key without joining them). */
static uint32_t java_hash_update(uint32_t h, const uint8_t *s, size_t n);

/* scan.c: the last non-empty value of a property (the index reads UNIQ_KEY and KEYS). */
static const uint8_t *property_value(const uint8_t *props, size_t len, const char *name,
                                     size_t name_len, size_t *value_len);

/* scan.c: decode and check one record (th_gather verifies the records it serves with it). */
static int parse_record(const uint8_t *buf, uint64_t pos, uint32_t size, uint32_t magic,
                        int64_t base_offset, int32_t flags, th_record_info *i);

#endif
