/*
 * What the consume queues need from scanned or stored records: th_cq_runs groups a scan's
 * records into the runs of entries the dispatcher appends (one write per run), th_gather
 * decides a queue's entries against a segment and lists the records a pull serves.
 */
#include "internal.h"

/* ---- runs of entries for the dispatcher ------------------------------------------------ */

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
