/*
 * Scanning: walking the records of a buffer, checking each (magic, sizes, torn tail, BODYCRC)
 * and describing it as positions into the buffer, for recovery, the dispatcher, the Spark
 * reader and pull responses. Every read is bounds-checked against the record's TOTALSIZE,
 * itself checked against `limit` first.
 */
#include "internal.h"

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
