"""``trio-ha bench store``: append, group-commit and recovery rates against this machine's limits.

What runs (one JSON object per result, in this order):

1. limits, measured first in the same run (``trio_ha.bench.limits``): memcpy into a warm
   shared mapping (appends), 4 KiB write + fdatasync and store + msync (SYNC_FLUSH);
2. appends of 128 B, 1 KiB and 16 KiB bodies, single ``put_message`` and batches of 64 as
   "put_batch" (``put`` of a ``PutRequest.batch``, a pre-encoded SEND_BATCH_MESSAGE body: the
   broker's path), with ASYNC_FLUSH
   and SYNC_FLUSH, at 1 and 64 concurrent writer tasks; each run has a fresh store, a warm-up
   burst, waits for the allocator's spare segment, then is bounded by time and by bytes;
3. for comparison, ``put_messages`` (a list of 64 Message objects, encoded per call) with
   ASYNC_FLUSH;
4. recovery: a store of 1 KiB records is written and closed; sequential read of its commitlog
   files is the limit; the native scanner with CRC over all segments (as recovery calls it)
   is the figure; a reopen with the abort file present (crash recovery as it really runs) and
   one with the checkpoint and consume queues removed too (full rescan and re-dispatch) are
   reported beside it;
5. reads: what a pull costs the store — ``read_queue`` of 32 records (raw, as the broker
   serves them: views of the mapping) over one queue of 128 B, 1 KiB and 16 KiB records, with
   ``checkCRCOnRead`` on and off; best of several passes, next to the sequential read limit;
6. a summary of the issue's targets.

Message rates count messages (a batch of 64 counts 64); ``mb_per_s`` is body bytes,
``record_mb_per_s`` is commitlog bytes (what was copied into the mapping). Every append run
times each put (two clock reads per call) for its latency percentiles; with many writers a
put's latency includes waiting for the other writers' turns on the one event loop. Limits take
the best of several passes, and so does the recovery scan it is compared with. A benchmark reports
figures; it never asserts.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from collections.abc import Iterator

import attrs
import trio

from .. import _backend
from ..config import FlushDiskType, StoreConfig
from ..store import open_store
from ..store.recovery import RecoveryReport
from ..store.segments import SegmentQueue
from ..wire.layout import parse_segment_file_name
from . import limits
from .harness import (
    MB,
    TOPIC,
    WARM_SEGMENTS,
    GiB,
    MiB,
    Plan,
    RunState,
    common_fields,
    config_fields,
    drive_puts,
    fit_plan,
    latency_us,
    limit,
    make_put,
    scratch_directory,
    tidied,
    wait_spare_segment,
)

BODY_SIZES = (128, 1024, 16 * 1024)
FLUSHES = (FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH)
WRITERS = (1, 64)

TARGET_BATCH_MEMCPY_RATIO = 0.25
TARGET_SINGLE_1K_PER_S = 100_000
TARGET_RECOVERY_READ_RATIO = 0.5
TARGET_SYNC_SPEEDUP = 20.0


@attrs.define(kw_only=True)
class StorePlan(Plan):
    """How much work each part does. ``quick`` is for a smoke test (well under 30 s)."""

    segment_size: int
    run_seconds: float
    run_max_bytes: int
    warmup_seconds: float
    memcpy_bytes: int
    memcpy_map: int
    sync_seconds: float
    recovery_bytes: int
    #: records each read run writes first, then reads back
    read_bytes: int
    passes: int

    @classmethod
    def make(cls, quick: bool) -> StorePlan:
        if quick:
            return cls(quick=True, segment_size=32 * MiB, run_seconds=0.2,
                       run_max_bytes=96 * MiB, warmup_seconds=0.02, memcpy_bytes=512 * MiB,
                       memcpy_map=64 * MiB, sync_seconds=0.3, recovery_bytes=200 * MiB,
                       read_bytes=8 * MiB, passes=2)
        return cls(quick=False, segment_size=256 * MiB, run_seconds=2.5,
                   run_max_bytes=2 * GiB, warmup_seconds=0.2, memcpy_bytes=4 * GiB,
                   memcpy_map=256 * MiB, sync_seconds=2.0, recovery_bytes=3 * GiB // 2,
                   read_bytes=64 * MiB, passes=5)

    def fit_disk(self, free: int) -> None:
        """Keep the largest store below a third of the free space."""
        budget = free // 3
        largest = max(self.run_max_bytes, self.recovery_bytes) + 3 * self.segment_size
        if largest > budget:
            self.scaled_for_disk = True
            room = max(budget - 3 * self.segment_size, 16 * MiB)
            self.run_max_bytes = min(self.run_max_bytes, room)
            self.recovery_bytes = min(self.recovery_bytes, room)


# ---- appends --------------------------------------------------------------------------------


def _store_config(root: str, plan: StorePlan, flush: FlushDiskType) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=plan.segment_size,
        flush_disk_type=flush,
        warm_mapped_file_enable=WARM_SEGMENTS,
    )


async def _append_run(root: str, plan: StorePlan, flush: FlushDiskType, api: str, body_size: int,
                      writers: int, record_estimate: int) -> dict:
    config = _store_config(root, plan, flush)
    async with open_store(config) as store:
        put, per_put = make_put(store, api, body_size)
        # Warm-up on the same path (first calls, caches, dispatcher), then let the allocator
        # finish the spare segment so the timed run starts from the steady state.
        warm = RunState(plan.run_max_bytes // 16 // record_estimate,
                         time.perf_counter() + plan.warmup_seconds)
        await drive_puts(put, per_put, writers, warm, False)
        await store.wait_dispatched()
        spare_ready = await wait_spare_segment(store, 30)

        start_offset = store.commitlog.max_offset
        segments_before = store.statistics().segments
        gc.collect()
        state = RunState(max(per_put, plan.run_max_bytes // record_estimate), 0.0)
        started = time.perf_counter()
        state.deadline = started + plan.run_seconds
        await drive_puts(put, per_put, writers, state, True)
        elapsed = time.perf_counter() - started
        end_offset = store.commitlog.max_offset
        caught_up = time.perf_counter()
        await store.wait_dispatched()
        catchup = time.perf_counter() - caught_up
        stats = store.statistics()
    messages = state.ok * per_put
    result = {
        "messages": messages,
        "puts": state.ok,
        "failures": state.failed,
        "failure_statuses": state.statuses or None,
        "seconds": elapsed,
        "msgs_per_s": messages / elapsed,
        "puts_per_s": state.ok / elapsed,
        "mb_per_s": messages * body_size / elapsed / MB,
        "record_mb_per_s": (end_offset - start_offset) / elapsed / MB,
        "record_bytes": end_offset - start_offset,
        "segments_rolled": stats.segments - segments_before,
        "spare_ready_at_start": spare_ready,
        "dispatch_catchup_seconds": catchup,
    }
    result["latency_us"] = latency_us(state.latencies)
    return result


def _record_estimate(body_size: int) -> int:
    # 91 fixed bytes (IPv4 v1) + topic + the TAGS property; used only to bound the run
    return 91 + body_size + len(TOPIC) + len("TAGS\x01TagA")


# ---- reads --------------------------------------------------------------------------------

#: records per read, as a pull asks for (pullBatchSize's default)
READ_BATCH = 32


async def _read_run(root: str, plan: StorePlan, body_size: int, check: bool) -> dict:
    """read_queue of READ_BATCH over one queue of a store with checkCRCOnRead ``check``."""
    config = attrs.evolve(_store_config(root, plan, FlushDiskType.ASYNC_FLUSH),
                          check_crc_on_read=check)
    async with open_store(config) as store:
        put, per_put = make_put(store, "put_batch", body_size)
        state = RunState(plan.read_bytes // _record_estimate(body_size),
                         time.perf_counter() + 60)
        await drive_puts(put, per_put, 1, state, False)
        await store.wait_dispatched()
        end = store.max_queue_offset(TOPIC, 0)
        best = float("inf")
        records = size = 0
        for _ in range(plan.passes):
            records = size = 0
            started = time.perf_counter()
            for offset in range(0, end, READ_BATCH):
                read = store.read_queue(TOPIC, 0, offset, READ_BATCH, raw=True)
                records += len(read.records)
                size += sum(len(view) for view in read.spans)
            best = min(best, time.perf_counter() - started)
    reads = -(-end // READ_BATCH)
    return {"messages": records, "queue_messages": end, "reads": reads, "seconds": best,
            "us_per_read": best / reads * 1e6, "msgs_per_s": records / best,
            "mb_per_s": size / best / MB}


# ---- recovery -------------------------------------------------------------------------------


async def _write_recovery_store(config: StoreConfig, target_bytes: int) -> tuple[int, int]:
    async with open_store(config) as store:
        put, per_put = make_put(store, "put_batch", 1024)
        state = RunState(target_bytes // _record_estimate(1024), time.perf_counter() + 600)
        await drive_puts(put, per_put, 1, state, False)
        await store.wait_dispatched()
        return store.commitlog.max_offset, state.ok * per_put


def _scan_all(commitlog_dir: str, segment_size: int, flags: int) -> tuple[float, int, int]:
    """Map the segments afresh and scan them like recovery does; returns (seconds, records,
    bytes passed). Mapping happens before the clock starts; page faults happen inside it."""
    queue = SegmentQueue.load(commitlog_dir, segment_size)
    try:
        scanner = _backend.engine.scanner(4096)
        max_record = 4 * MiB + 64 * 1024
        records = 0
        passed = 0
        started = time.perf_counter()
        for segment in queue.segments:
            position = 0
            while True:
                result = scanner.scan(segment.handle, segment.size, position,
                                      segment.base_offset, flags, max_record)
                records += result.count
                position = result.end
                if result.stop != _backend.STOP_FULL:
                    break
            passed += position
            if result.stop != _backend.STOP_BLANK:
                break
        return time.perf_counter() - started, records, passed
    finally:
        queue.close()


async def _timed_reopen(config: StoreConfig) -> tuple[float, RecoveryReport]:
    started = time.perf_counter()
    async with open_store(config) as store:
        elapsed = time.perf_counter() - started
        report = store.recovery
    assert report is not None  # every open recovers
    return elapsed, report


# ---- the whole benchmark ---------------------------------------------------------------------


def run_store_benchmarks(directory: str | None = None, *, quick: bool = False) -> Iterator[dict]:
    """Run the store benchmarks in a scratch directory (inside ``directory`` if given) and
    yield one dict per result (floats to 5 significant digits). The scratch directory is
    removed at the end."""
    yield from tidied(_run(directory, quick))


def _run(directory: str | None, quick: bool) -> Iterator[dict]:
    plan = StorePlan.make(quick)
    begun = time.perf_counter()
    common = common_fields(quick)
    backend = common["backend"]
    with scratch_directory(directory, "store") as scratch:
        base = scratch.base
        fit_plan(plan, scratch)
        yield {
            "bench": "store.config", **config_fields(plan, scratch),
            "segment_size": plan.segment_size, "run_seconds": plan.run_seconds,
            "run_max_bytes": plan.run_max_bytes, "recovery_bytes": plan.recovery_bytes,
            "note": "other processes on this machine compete for its cores and disk; "
                    "loadavg says how busy it was",
        }

        # -- limits ---------------------------------------------------------------------------
        memcpy = limits.memcpy_into_mapping(
            base, map_size=plan.memcpy_map, total_bytes=plan.memcpy_bytes
        )
        yield {"bench": "limit.memcpy_into_mapping", **common, **memcpy,
               "note": "slice assignment of a bytes source into a warm MAP_SHARED file "
                       "mapping; first_touch is the same mapping's first write pass; "
                       "slice_1k is 1 KiB slice assignments from a Python loop; best pass"}
        sync_limit = limits.sync_rates(base, seconds=plan.sync_seconds)
        yield {"bench": "limit.sync", **common, **sync_limit,
               "note": "4 KiB pwrite + fdatasync, and 4 KiB store into a shared mapping + "
                       "msync (the store's call), on a preallocated, written scratch file"}
        memcpy_limit = limit("memcpy_into_warm_mapping", memcpy["mb_per_s"], "MB/s",
                              chunk_bytes=memcpy["chunk_bytes"])
        fdatasync_limit = limit("fdatasync_4k", sync_limit["fdatasync_per_s"], "ops/s",
                                 p50_us=sync_limit["fdatasync_p50_us"],
                                 msync_per_s=sync_limit.get("msync_per_s"))

        targets: list[dict] = []

        # -- appends --------------------------------------------------------------------------
        runs = [
            (flush, size, api, writers)
            for flush in FLUSHES
            for size in BODY_SIZES
            for api in ("put_message", "put_batch")
            for writers in WRITERS
        ] + [
            (FlushDiskType.ASYNC_FLUSH, size, "put_messages", writers)
            for size in BODY_SIZES
            for writers in WRITERS
        ]
        one_writer: dict[tuple, float] = {}
        for flush, size, api, writers in runs:
            root = os.path.join(base, "append")
            try:
                figures = trio.run(
                    _append_run, root, plan, flush, api, size, writers, _record_estimate(size)
                )
            finally:
                shutil.rmtree(root, ignore_errors=True)
            mode = {"put_message": "single", "put_batch": "batch64",
                    "put_messages": "batch64_put_messages"}[api]
            result = {
                "bench": "store.append", "body_size": size, "mode": mode, "api": api,
                "flush": flush.value, "writers": writers, **figures,
            }
            target = None
            meets = None
            if flush is FlushDiskType.ASYNC_FLUSH:
                result["limit"] = memcpy_limit
                result["ratio_to_limit"] = figures["record_mb_per_s"] / memcpy["mb_per_s"]
                result["ratio_basis"] = "record_mb_per_s / memcpy MB/s"
                result["ratio_to_limit_body"] = figures["mb_per_s"] / memcpy["mb_per_s"]
                if mode == "single":
                    result["secondary_limit"] = limit(
                        "python_1k_slice_assignments", memcpy["slice_1k_per_s"], "ops/s"
                    )
                if size == 1024 and mode == "batch64":
                    target = f"ratio_to_limit >= {TARGET_BATCH_MEMCPY_RATIO}"
                    meets = result["ratio_to_limit"] >= TARGET_BATCH_MEMCPY_RATIO
                elif size == 1024 and mode == "single":
                    target = f"msgs_per_s >= {TARGET_SINGLE_1K_PER_S}"
                    meets = figures["msgs_per_s"] >= TARGET_SINGLE_1K_PER_S
            else:
                result["limit"] = fdatasync_limit
                result["ratio_to_limit"] = figures["puts_per_s"] / sync_limit["fdatasync_per_s"]
                result["ratio_basis"] = "puts_per_s / fdatasync ops/s (above 1: group commit)"
                key = (size, api)
                if writers == 1:
                    one_writer[key] = figures["msgs_per_s"]
                elif key in one_writer and one_writer[key] > 0:
                    speedup = figures["msgs_per_s"] / one_writer[key]
                    result["speedup_vs_1_writer"] = speedup
                    if mode == "single":
                        target = f"speedup_vs_1_writer >= {TARGET_SYNC_SPEEDUP}"
                        meets = speedup >= TARGET_SYNC_SPEEDUP
            result["target"] = target
            result["meets_target"] = meets
            result["backend"] = backend
            if target is not None:
                targets.append({
                    "result": f"{size} B {mode} {flush.value} x{writers}",
                    "target": target, "meets": meets,
                })
            yield result

        # -- recovery -------------------------------------------------------------------------
        root = os.path.join(base, "recovery")
        config = _store_config(root, plan, FlushDiskType.ASYNC_FLUSH)
        try:
            started = time.perf_counter()
            log_end, written = trio.run(_write_recovery_store, config, plan.recovery_bytes)
            write_seconds = time.perf_counter() - started
            commitlog_dir = config.commitlog_dir
            paths = sorted(
                os.path.join(commitlog_dir, name) for name in os.listdir(commitlog_dir)
                if parse_segment_file_name(name) is not None
            )
            seq = limits.sequential_read(paths, passes=plan.passes)
            yield {"bench": "limit.sequential_read", **common, **seq}
            read_limit = limit("sequential_read_page_cache", seq["mb_per_s"], "MB/s",
                                page_cache="warm")

            passes = [_scan_all(commitlog_dir, plan.segment_size, _backend.SCAN_CHECK_CRC)
                      for _ in range(plan.passes)]
            seconds = min(p[0] for p in passes)
            records, passed = passes[0][1], passes[0][2]
            rate = passed / seconds / MB
            no_crc = _scan_all(commitlog_dir, plan.segment_size, 0)
            tags = _scan_all(commitlog_dir, plan.segment_size,
                             _backend.SCAN_CHECK_CRC | _backend.SCAN_TAGS)
            ratio = rate / seq["mb_per_s"]
            meets = ratio >= TARGET_RECOVERY_READ_RATIO
            target = f"ratio_to_limit >= {TARGET_RECOVERY_READ_RATIO}"
            targets.append({"result": "recovery scan (native scanner, CRC)", "target": target,
                            "meets": meets})
            yield {
                "bench": "store.recovery_scan", "body_size": 1024, "mode": "scanner_crc",
                "flush": None, "writers": None, "messages": records, "bytes": passed,
                "seconds": seconds, "passes_seconds": [p[0] for p in passes],
                "msgs_per_s": records / seconds, "mb_per_s": rate,
                "no_crc_mb_per_s": no_crc[2] / no_crc[0] / MB,
                "crc_and_tags_mb_per_s": tags[2] / tags[0] / MB,
                "segments": len(paths), "written_messages": written,
                "write_seconds": write_seconds,
                "limit": read_limit, "ratio_to_limit": ratio, "target": target,
                "meets_target": meets, "backend": backend,
                "note": "segments mapped afresh per pass (page cache warm, page tables "
                        "cold), scanned in 4096-record calls as recovery does; best pass, as for "
                        "the sequential read it is compared with",
            }

            abort = os.path.join(root, "abort")
            for variant in ("abnormal", "full_rebuild"):
                with open(abort, "wb"):
                    pass
                if variant == "full_rebuild":
                    os.unlink(os.path.join(root, "checkpoint"))
                    shutil.rmtree(os.path.join(root, "consumequeue"), ignore_errors=True)
                seconds, report = trio.run(_timed_reopen, config)
                scanned = report.end_offset - report.start_offset
                yield {
                    "bench": "store.recovery_reopen", "body_size": 1024,
                    "mode": variant, "flush": None, "writers": None,
                    "messages": report.records, "bytes": scanned, "seconds": seconds,
                    "msgs_per_s": report.records / seconds,
                    "mb_per_s": scanned / seconds / MB,
                    "recovery": {"abnormal": report.abnormal,
                                 "start_offset": report.start_offset,
                                 "end_offset": report.end_offset,
                                 "log_end_before": log_end,
                                 "stop_reason": report.stop_reason},
                    "limit": read_limit, "ratio_to_limit": scanned / seconds / MB / seq["mb_per_s"],
                    "target": None, "meets_target": None, "backend": backend,
                    "note": ("abort file present, checkpoint kept: crash recovery as it runs "
                             "(scan with CRC and tags from the checkpoint's segment, re-dispatch)"
                             if variant == "abnormal" else
                             "abort file present, checkpoint and consume queues removed: "
                             "every segment rescanned and every record re-dispatched"),
                }
        finally:
            shutil.rmtree(root, ignore_errors=True)

        # -- reads ----------------------------------------------------------------------------
        for size in BODY_SIZES:
            for check in (True, False):
                root = os.path.join(base, "reads")
                try:
                    run = trio.run(_read_run, root, plan, size, check)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                # With the check every record byte is read (its CRC): the sequential read
                # is its limit. Without it no record byte is touched (views): no limit.
                yield {
                    "bench": "store.read", "body_size": size, "mode": "read_queue_raw",
                    "check_crc_on_read": check, **run,
                    "limit": read_limit if check else None,
                    "ratio_to_limit": run["mb_per_s"] / read_limit["value"] if check else None,
                    "target": None, "meets_target": None, "backend": backend,
                    "note": f"MessageStore.read_queue(raw=True) of {READ_BATCH} from one "
                            "queue of a warm store, in order over the whole queue; best "
                            "pass; mb_per_s counts record bytes (views of the mapping: "
                            "without the check they are not read at all)",
                }

        yield {
            "bench": "store.summary", **common, "targets": targets,
            "all_met": all(t["meets"] for t in targets),
            "total_seconds": time.perf_counter() - begun, "loadavg": os.getloadavg(),
        }
