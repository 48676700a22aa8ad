/*
 * The index files: RocketMQ's IndexFile.putKey for every key (UNIQ_KEY, each of KEYS) of a
 * scanned run of records, so a message can be found by key.
 */
#include "internal.h"

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
