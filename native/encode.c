/*
 * Record encoding: one message, or a SEND_BATCH_MESSAGE body's items, written as v1 records
 * straight into a segment's mapping (the put path). Each encoder checks the whole write
 * against seg_size before it touches seg, and publishes a record by storing its MAGIC last.
 */
#include "internal.h"

/* A SEND_BATCH_MESSAGE item: TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN (+ body), PROPSLEN. */
#define BATCH_ITEM_FIXED 22u

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
