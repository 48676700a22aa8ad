/*
 * trio_ha native core: the one translation unit of the cffi module trio_ha._native.
 *
 * The code lives in one file per concern, included below: hash.c (CRC-32, Java's string
 * hash), encode.c (records into a segment), scan.c (validating and describing records),
 * consume_queue.c (dispatch runs, a pull's records), index.c (index files), files.c (msync,
 * the sync thread, warming, zeroing, fallocate) and transfer.c (sendfile, splice). This file
 * joins them into one unit, so the compiler sees what it saw when they were one file: the
 * helpers one part lends another (th_crc32 to the encoders and the scanner, parse_record to
 * th_gather) are inlined across parts as before, with the same flags and no link-time
 * optimisation (native/build_native.py says more). The contract is trio_ha_native.h; what
 * the parts share is internal.h; the Python twin (trio_ha/_backend/_python.py and
 * trio_ha/wire/record.py) is the oracle the tests hold this code against.
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

#include "internal.h"

uint32_t th_version(void)
{
    return TH_NATIVE_VERSION;
}

#include "hash.c"
#include "encode.c"
#include "scan.c"
#include "consume_queue.c"
#include "index.c"
#include "files.c"
#include "transfer.c"
