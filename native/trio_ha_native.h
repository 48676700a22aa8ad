/*
 * trio_ha native core: the few coarse calls on the hot paths (append, scan, flush, transfer).
 *
 * Every call works on caller-owned memory (a segment's mmap, a request body) and is one
 * call per record or per batch, so the Python side pays one crossing for a lot of bytes.
 * cffi releases the GIL around each call. All integers on disk are big-endian (RocketMQ's
 * Java ByteBuffer order); the record layout is RocketMQ 4.9's (docs/formats.md).
 *
 * Errors are negative return values, never exceptions or aborts: the store maps them to
 * RocketMQ's PutMessageStatus and a scan reports why it stopped.
 *
 * trio_ha_native.c implements it all as one translation unit made of one file per concern;
 * each section below names the file that holds its calls.
 */
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

/* Bumped whenever a signature or struct below changes; checked by trio_ha._backend. */
#define TH_NATIVE_VERSION 6

/* ---- error codes of the encoders ------------------------------------------------------- */
#define TH_ERR_NO_SPACE        -1  /* record(s) + the 8-byte blank do not fit before seg_size */
#define TH_ERR_BAD_ARGUMENT    -2  /* host length not 8/20, topic longer than 127 bytes, ... */
#define TH_ERR_BATCH_FORMAT    -3  /* a SEND_BATCH_MESSAGE item is malformed or truncated   */
#define TH_ERR_BODY_TOO_LARGE  -4  /* a body is longer than max_body_size                    */
#define TH_ERR_PROPS_TOO_LARGE -5  /* properties longer than 32767 bytes                     */
#define TH_ERR_TOO_MANY        -6  /* more batch items than out_cap                          */

/* ---- why a scan stopped ---------------------------------------------------------------- */
#define TH_STOP_END        0  /* reached `limit` exactly on a record boundary                */
#define TH_STOP_PARTIAL    1  /* the record at `end` runs past `limit` (or < 8 header bytes)  */
#define TH_STOP_BLANK      2  /* a blank (end-of-segment) record sits at `end`               */
#define TH_STOP_FULL       3  /* `out_cap` records were returned; call again from `end`      */
#define TH_STOP_BAD_MAGIC  4  /* neither a message magic nor the blank magic (includes 0)    */
#define TH_STOP_BAD_SIZE   5  /* TOTALSIZE out of range or fields disagree with it           */
#define TH_STOP_BAD_CRC    6  /* body CRC mismatch (only with TH_SCAN_CHECK_CRC)             */
#define TH_STOP_TORN       7  /* the record's last byte is 0: its tail never reached the file */

#define TH_SCAN_CHECK_CRC  1  /* verify BODYCRC of every record                              */
#define TH_SCAN_TAGS       2  /* fill tags_code from the TAGS property (Java String.hashCode) */

/* One decoded record header, as positions into the scanned buffer (no copies). */
typedef struct {
    int64_t phys_offset;        /* base_offset + position of the record                    */
    int64_t queue_offset;
    int64_t born_timestamp;
    int64_t store_timestamp;
    int64_t prepared_tx_offset;
    int64_t tags_code;          /* 0 unless TH_SCAN_TAGS and a non-empty TAGS property       */
    int32_t size;               /* TOTALSIZE                                                 */
    int32_t queue_id;
    int32_t flag;
    int32_t sys_flag;
    int32_t body_crc;           /* as stored                                                 */
    int32_t reconsume_times;
    uint32_t born_host_pos;     /* positions are relative to `buf`                           */
    uint32_t store_host_pos;
    uint32_t body_pos;
    uint32_t body_len;
    uint32_t topic_pos;
    uint32_t props_pos;
    uint16_t topic_len;
    uint16_t props_len;
    uint8_t born_host_len;      /* 8 (IPv4) or 20 (IPv6)                                     */
    uint8_t store_host_len;
    uint8_t version;            /* 1: magic 0xDAA320A7, 1-byte topic length; 2: 0xDAA320AB    */
    uint8_t crc_ok;             /* 1 ok, 0 mismatch (only with TH_STOP_BAD_CRC), 2 unchecked */
} th_record_info;

typedef struct {
    uint64_t end;    /* position just past the last whole valid record returned             */
    int32_t stop;    /* TH_STOP_*                                                            */
    int32_t size;    /* TOTALSIZE found at `end` when stop is PARTIAL/BLANK/BAD_*, else 0    */
} th_scan_result;

/* One consume-queue run: infos[first .. first+count) go to one queue, consecutive offsets. */
typedef struct {
    uint32_t first;  /* index (in the scan) of the run's first record */
    uint32_t count;  /* its records */
    uint32_t last;   /* index of its last record */
    uint32_t entry;  /* its entries are entries[entry .. entry + count) (20 bytes each) */
} th_cq_run;

/* One stored item of a batch append. */
typedef struct {
    int64_t phys_offset;
    int32_t size;
    int32_t reserved;
} th_batch_entry;

uint32_t th_version(void); /* trio_ha_native.c */

/* ---- hash.c: CRC-32 and Java's string hash --------------------------------------------- */

/* CRC-32 (zlib polynomial) masked to 31 bits, as RocketMQ stores BODYCRC. Long inputs use
   carry-less multiplication (PCLMULQDQ / VPCLMULQDQ) when the CPU has it, zlib otherwise. */
uint32_t th_crc32(const uint8_t *buf, size_t len);

/* For tests and benchmarks. th_crc32_full is zlib.crc32(buf, crc): unmasked, chainable, by
   the same path th_crc32 and the encoders and scanner use. th_crc32_impl names that path:
   0 zlib, 1 PCLMULQDQ, 2 VPCLMULQDQ (AVX-512). th_crc32_select(impl) switches to impl, capped
   at the best this CPU has (-1: the best), and returns the one now in use. */
uint32_t th_crc32_full(uint32_t crc, const uint8_t *buf, size_t len);
int th_crc32_impl(void);
int th_crc32_select(int impl);

/* Java's String.hashCode over the UTF-16 code units of a UTF-8 string (RocketMQ tagsCode);
   each malformed UTF-8 byte counts as U+FFFD. */
int32_t th_java_hash(const uint8_t *utf8, size_t len);

/* ---- encode.c: records into a segment's mapping ---------------------------------------- */

/*
 * Encode one v1 record at seg[pos]. PHYSICALOFFSET = base_offset + pos. BODYCRC is computed
 * here. Writes only if record_size + 8 <= seg_size - pos (RocketMQ's END_FILE_MIN_BLANK_LENGTH
 * rule), otherwise returns TH_ERR_NO_SPACE and writes nothing. Returns the new position.
 * born_host/store_host are 4+4 or 16+4 bytes (address, big-endian port); the V6 sysflag bits
 * are set from their lengths.
 */
int64_t th_encode_record(uint8_t *seg, uint64_t seg_size, uint64_t pos, int64_t base_offset,
                         const uint8_t *topic, size_t topic_len,
                         const uint8_t *body, size_t body_len,
                         const uint8_t *props, size_t props_len,
                         int32_t queue_id, int32_t flag, int64_t queue_offset, int32_t sys_flag,
                         int64_t born_timestamp, const uint8_t *born_host, size_t born_host_len,
                         int64_t store_timestamp, const uint8_t *store_host, size_t store_host_len,
                         int32_t reconsume_times, int64_t prepared_tx_offset);

/*
 * Convert a SEND_BATCH_MESSAGE body (items of TOTALSIZE, MAGIC, BODYCRC, FLAG, 4-byte body
 * length + body, 2-byte properties length + properties) into consecutive v1 records at
 * seg[pos]: item i gets QUEUEOFFSET first_queue_offset + i; topic, queue, sysflag, hosts and
 * timestamps are shared. batch_props (may be empty) are appended to every item's properties,
 * with a \x02 between them when the item's own properties are non-empty and do not already
 * end in \x02. All items go in, or none: TH_ERR_NO_SPACE (nothing written) if the batch plus
 * the 8-byte blank rule does not fit. Fills out[0..n) and *count; returns the new position.
 */
int64_t th_encode_batch(uint8_t *seg, uint64_t seg_size, uint64_t pos, int64_t base_offset,
                        const uint8_t *items, size_t items_len,
                        const uint8_t *topic, size_t topic_len,
                        const uint8_t *batch_props, size_t batch_props_len,
                        int32_t queue_id, int64_t first_queue_offset, int32_t sys_flag,
                        int64_t born_timestamp, const uint8_t *born_host, size_t born_host_len,
                        int64_t store_timestamp, const uint8_t *store_host, size_t store_host_len,
                        uint64_t max_body_size,
                        th_batch_entry *out, size_t out_cap, size_t *count);

/* ---- scan.c: validating and describing records ----------------------------------------- */

/*
 * Walk records in buf[pos, limit): validate magic, sizes (TOTALSIZE must equal the size the
 * fields add up to, and be at most max_record), optionally the body CRC, and describe up to
 * out_cap records in out. Returns the number of records described; res says where and why it
 * stopped. Never reads at or past `limit`.
 */
size_t th_scan(const uint8_t *buf, uint64_t limit, uint64_t pos, int64_t base_offset,
               int32_t flags, uint32_t max_record,
               th_record_info *out, size_t out_cap, th_scan_result *res);

/* ---- consume_queue.c: runs of entries for the dispatcher ------------------------------- */

/*
 * Group scanned records for the dispatcher. A run is a set of records, in scan order, with
 * equal topic bytes (compared in buf at topic_pos/topic_len) and queue id, whose queue
 * offsets are each one more than the previous one's; records of other queues may come in
 * between (producers interleave queues, so runs of adjacent records would mostly be of one
 * record, and the dispatcher's work is per run). A record joins the latest run of its queue
 * when its offset follows that run's last, and starts a new run (the queue's latest from then
 * on) otherwise. Records whose transaction type (sys_flag & 0xC) is PREPARED (0x4) or
 * ROLLBACK (0xC) are not indexed and belong to no run.
 *
 * Runs are written to runs in the order of their first records, at most runs_cap of them: a
 * record that would start a run beyond runs_cap stops the grouping there, and the runs
 * returned cover only the records before it (n records never make more than n runs). The
 * entries of run k are entries[20 * runs[k].entry ..] (phys_offset (8), size (4), tags_code
 * (8), big-endian), runs one after another; order[j] is the record whose entry is j-th.
 * table is scratch of table_size uint32s, a power of two at least 2 * n. Returns the number
 * of runs, or SIZE_MAX when table_size is not such a size.
 */
size_t th_cq_runs(const uint8_t *buf, const th_record_info *infos, size_t n,
                  uint8_t *entries, uint32_t *order, th_cq_run *runs, size_t runs_cap,
                  uint32_t *table, size_t table_size);

/* ---- consume_queue.c: reading a consume queue's records (a pull) ----------------------- */

/* What th_gather decided for one consume-queue entry (outcomes[i]). */
#define TH_GATHER_FOUND     0  /* its record is served                                        */
#define TH_GATHER_REMOVED   1  /* a blank entry, or its record is below the log's min offset   */
#define TH_GATHER_FILTERED  2  /* its tags_code is not in the filter                          */
#define TH_GATHER_ABSENT    3  /* its record is not wholly below readable_end (or size <= 0)   */
#define TH_GATHER_INVALID   4  /* its record failed the check of TH_GATHER_VERIFY             */

/* Why th_gather stopped: entries[0 .. res->entries) were decided, the next one was not. */
#define TH_GATHER_END       0  /* every entry given was decided                               */
#define TH_GATHER_COUNT     1  /* max_count records were found                                */
#define TH_GATHER_BYTES     2  /* the next record would take the records found past max_bytes */
#define TH_GATHER_SEGMENT   3  /* the next entry's record is not in this segment              */

/* Check every record before serving it: what th_scan with TH_SCAN_CHECK_CRC checks (magic,
   TOTALSIZE equal to the entry's size and to what the fields add up to, BODYCRC), plus
   PHYSICALOFFSET equal to its position, and topic, queue id and queue offset equal to the
   entry's (the queue's topic, queue_id, first_queue_offset + i). */
#define TH_GATHER_VERIFY    1

/* [pos, pos + len) within the segment. */
typedef struct {
    uint64_t pos;
    uint64_t len;
} th_span;

typedef struct {
    uint32_t entries;     /* entries decided: outcomes[0 .. entries)                        */
    uint32_t found;       /* records found: records[0 .. found)                             */
    uint32_t spans;       /* spans[0 .. spans): the records found, adjacent ones merged     */
    int32_t stop;         /* TH_GATHER_END .. TH_GATHER_SEGMENT                             */
    uint64_t bytes;       /* bytes of the records found                                     */
    int64_t last_phys;    /* commitlog offset of the last record found, -1 if none          */
    uint32_t problems;    /* entries REMOVED, ABSENT or INVALID                             */
    uint8_t last_problem; /* the outcome of the last of those (0 if none)                   */
} th_gather_result;

/*
 * Decide the consume-queue entries entries[0 .. n) (20 bytes each: commitlog offset 8, size
 * 4, tags code 8, big-endian) of one queue, in order, against one commitlog segment (seg,
 * seg_size bytes, first byte at log offset base_offset): the records to serve, as a pull does.
 * Entries whose records are below min_offset are REMOVED (whatever segment); with tag_codes
 * non-NULL, an entry whose tags code is none of tag_codes[0 .. n_tags) is FILTERED; a record
 * that is not wholly below readable_end is ABSENT. Found records are listed in records
 * (capacity max_count) and, adjacent ones merged, in spans (capacity max_count). Stops before
 * the entry that would make more than max_count records, or more than max_bytes of records
 * counting bytes_before (what earlier calls found for the same read; a read's first record is
 * always taken), or whose record lies in another segment.
 */
void th_gather(const uint8_t *seg, uint64_t seg_size, int64_t base_offset,
               int64_t min_offset, int64_t readable_end,
               const uint8_t *entries, size_t n,
               const int64_t *tag_codes, size_t n_tags,
               const uint8_t *topic, size_t topic_len, int32_t queue_id,
               int64_t first_queue_offset, int32_t flags, uint32_t max_record,
               size_t max_count, uint64_t max_bytes, uint64_t bytes_before,
               uint8_t *outcomes, th_span *records, th_span *spans, th_gather_result *res);

/* ---- index.c: index files -------------------------------------------------------------- */

/*
 * Put the keys of the records infos[0, n) of `seg` into the index file `idx` (RocketMQ's
 * IndexFile, big-endian: a 40-byte header - beginTimestamp, endTimestamp, beginPhyOffset,
 * endPhyOffset, hashSlotCount, indexCount - then slot_num 4-byte slots, then index_num
 * 20-byte entries of keyHash, phyOffset, timeDiff seconds and the previous entry of the slot).
 * A record's keys are "<topic>#<UNIQ_KEY>" and "<topic>#<k>" for each space-separated KEYS
 * value k; a rolled-back transaction has none. The caller sized `idx` to
 * 40 + 4 * slot_num + 20 * index_num bytes. A record whose keys do not all fit is left for the
 * next file (unless the file is empty: then as many as fit go in). Returns the number of
 * records done, n when all fit.
 */
size_t th_index_put(uint8_t *idx, uint32_t slot_num, uint32_t index_num, const uint8_t *seg,
                    const th_record_info *infos, size_t n);

/* ---- files.c: memory and files --------------------------------------------------------- */

/* msync(MS_SYNC) of [addr, addr + len), widened to whole pages. 0 or -errno. */
int th_msync(uint8_t *addr, size_t len);

/* A sync thread: a thread of its own that msyncs one range at a time, and never takes the
   interpreter's lock. th_msync from a Python worker thread needs that lock to start and again
   to report, and on a busy event loop the handoffs cost more than the msync (issue 11); this
   thread is told of a range under its own mutex and says it is done by adding 1 to the
   eventfd `done_fd`, which the event loop waits on.
   th_sync_thread_start: NULL (errno set) when the thread cannot start.
   th_sync_thread_submit: 0, or -EBUSY while a range is in progress (one at a time).
   th_sync_thread_result: the finished range's 0 or -errno from msync; -EBUSY while running.
   th_sync_thread_stop: lets the range in progress finish, joins the thread, frees it. */
typedef struct th_sync_thread th_sync_thread;
th_sync_thread *th_sync_thread_start(int done_fd);
int th_sync_thread_submit(th_sync_thread *t, uint8_t *addr, size_t len);
int th_sync_thread_result(th_sync_thread *t);
void th_sync_thread_stop(th_sync_thread *t);

/* Fault in every page of [addr, addr+len) writable so later appends do not fault, without
   changing the contents: madvise(MADV_POPULATE_WRITE), or where that is refused (a kernel
   before 5.14: EINVAL) one locked read-modify-write of a byte per page. 0 or -errno (-EFAULT:
   a page could not be backed, e.g. past the end of the file, where a store gets SIGBUS). */
int th_warm(uint8_t *addr, size_t len);

/* For tests: nonzero makes th_warm skip MADV_POPULATE_WRITE and touch the pages itself. */
void th_warm_force_touch(int on);

/* memset(addr, 0, len): zeroing a truncated tail without holding the GIL. */
void th_zero(uint8_t *addr, size_t len);

/* posix_fallocate(fd, offset, len): reserve blocks so a full disk fails here, not as SIGBUS
   on a store into the mapping. 0 or an errno value. */
int th_fallocate(int fd, int64_t offset, int64_t len);

/* ---- transfer.c: between a segment file and a socket ----------------------------------- */

/* Non-blocking sendfile(out_fd, in_fd, &offset, count): bytes sent, or -errno (-EAGAIN when
   the socket is full). */
int64_t th_sendfile(int out_fd, int in_fd, int64_t offset, size_t count);

/* Receive up to `count` bytes from the socket `sock_fd` into the file `file_fd` at `offset`
   without passing them through user space: splice(2) socket -> pipe -> file, the pipe
   (`pipe_r`, `pipe_w`, empty on entry and on return) owned by the caller. Stops when `count`
   bytes moved, the socket has no more ready, or the peer closed. Returns the bytes now in
   the file, 0 when the peer closed, or -errno (-EAGAIN: nothing ready; -EINVAL: the socket
   cannot be spliced, nothing was taken from it). A file that refuses splice gets the bytes
   by read and pwrite instead, so nothing taken from the socket is ever left in the pipe but
   on a failing pwrite (then -errno: the connection is beyond use). */
int64_t th_splice_to_file(int sock_fd, int pipe_r, int pipe_w, int file_fd, int64_t offset,
                          size_t count);
