"""Read options, and planning: which byte ranges of which segments a read covers.

A read of one store directory covers the commitlog offsets ``[lo, hi)``: ``hi`` is the
confirmed end (batch reads) or the end offset of a micro-batch (streaming). The range is cut
into :class:`Chunk` values — one Spark partition each — that never cross a segment and start
on record boundaries, so a 1 GiB segment becomes many tasks. Boundaries come from the consume
queues when they exist (20 bytes per message instead of the data itself: cheap on a cold
store) and from the native scanner otherwise; every boundary taken from a consume queue is
checked against the commitlog (magic and stored PHYSICALOFFSET) before it is used.

Pushdown:

* topics / queue ids (options): with consume queues, only the byte ranges holding entries of
  the chosen queues are read (neighbouring entries merged), plus whatever lies past the
  dispatcher's progress. Such a read returns consume-queue messages: records that are never
  dispatched (PREPARED and ROLLBACK transaction records) are left out on every path, so the
  rows do not depend on pruning. Spark's own filters on topic / queue_id are applied to rows
  in the executor (exact, nothing left out) without consume-queue pruning;
* store-time range: store timestamps rise with the commitlog offset (the store takes them
  inside its put lock), so the range is narrowed by binary search over known boundaries
  (segment starts, consume-queue entries), reading one record header per probe. Rows are
  always filtered exactly in the executor too, so pruning only skips work.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from .. import _backend
from .store_files import (
    DEFAULT_MAX_RECORD,
    MappedSegment,
    Segment,
    StoreDir,
    StoreError,
    confirmed_end,
    dispatch_end,
    iter_scan,
    queue_entry_count,
    queue_files,
    read_queue_file,
    read_queue_offsets,
)

T = TypeVar("T")

__all__ = ["Filters", "ReadOptions", "Chunk", "plan_store", "parse_options", "parse_time"]

MiB = 1 << 20
#: how many of the largest consume queues are read to find split points
SPLIT_QUEUES = 16
#: selected entries closer than this are read as one range
MERGE_GAP = 256 * 1024


@dataclass(frozen=True)
class Filters:
    topics: frozenset | None = None
    queue_ids: frozenset | None = None
    start_offset: int | None = None  # commitlog_offset >= start_offset
    end_offset: int | None = None  # commitlog_offset < end_offset
    since_ms: int | None = None  # store_timestamp >= since
    until_ms: int | None = None  # store_timestamp < until
    #: the topics/queue_ids options: read through the consume queues, so only messages that
    #: are in a queue (never PREPARED or ROLLBACK transaction records) — on every path, so
    #: the result does not depend on how ranges were pruned
    queue_pushdown: bool = False

    @property
    def selects_queues(self) -> bool:
        return self.topics is not None or self.queue_ids is not None

    def merge(self, other: Filters) -> Filters:
        """Both sets of conditions at once (intersection)."""
        def both(a: T | None, b: T | None, pick: Callable[[T, T], T]) -> T | None:
            if a is None:
                return b
            if b is None:
                return a
            return pick(a, b)
        return Filters(
            both(self.topics, other.topics, lambda a, b: a & b),
            both(self.queue_ids, other.queue_ids, lambda a, b: a & b),
            both(self.start_offset, other.start_offset, max),
            both(self.end_offset, other.end_offset, min),
            both(self.since_ms, other.since_ms, max),
            both(self.until_ms, other.until_ms, min),
            self.queue_pushdown or other.queue_pushdown,
        )


@dataclass(frozen=True)
class ReadOptions:
    paths: tuple = ()
    filters: Filters = field(default_factory=Filters)
    verify_crc: bool = True
    on_corrupt: str = "fail"  # or "emit"
    include_body: bool = True
    decompress_body: bool = True
    partition_bytes: int = 128 * MiB
    batch_rows: int = 8192
    max_record: int = DEFAULT_MAX_RECORD
    use_consume_queues: bool = True
    time_prune_slack_ms: int = 60_000
    merge_gap_bytes: int = MERGE_GAP
    # streaming
    starting_offsets: str = "earliest"
    max_bytes_per_trigger: int | None = None
    max_records_per_trigger: int | None = None
    fail_on_data_loss: bool = True


@dataclass(frozen=True)
class Chunk:
    """One partition: records of one segment starting in the ``ranges`` (positions in the
    segment; each range starts on a record boundary; records are taken while they start
    before the range's stop). ``limit`` is where confirmed data ends in the segment."""

    store_dir: str
    path: str
    base: int
    limit: int
    ranges: tuple

    @property
    def nbytes(self) -> int:
        return sum(b - a for a, b in self.ranges)


# ---- options ------------------------------------------------------------------------------


def parse_time(value: object) -> int | None:
    """Epoch milliseconds from an int, a digit string, or ISO 8601 text (naive = UTC)."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, _dt.datetime):
        dt = value
    else:
        text = str(value).strip()
        if text.lstrip("-").isdigit():
            return int(text)
        dt = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=_dt.UTC)
    return int(dt.timestamp() * 1000)


def _parse_list(value: object) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        return [str(v) for v in value]
    text = str(value).strip()
    if not text:
        return []
    if text.startswith("["):
        return [str(v) for v in json.loads(text)]
    return [part.strip() for part in text.split(",") if part.strip()]


def _parse_bool(value: object, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _parse_size(value: object) -> int | None:
    if value is None or value == "":
        return None
    text = str(value).strip().lower()
    units = {"k": 1 << 10, "kb": 1 << 10, "m": MiB, "mb": MiB, "g": 1 << 30, "gb": 1 << 30}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


OPTION_NAMES = {
    "path", "paths", "topics", "topic", "queue_ids", "start_offset", "end_offset", "since",
    "until", "verify_crc", "on_corrupt", "include_body", "decompress_body", "partition_bytes",
    "batch_rows",
    "max_record_size", "use_consume_queues", "time_prune_slack_ms", "starting_offsets",
    "max_bytes_per_trigger", "max_records_per_trigger", "fail_on_data_loss", "merge_gap_bytes",
}


def parse_options(options: Mapping[str, Any]) -> ReadOptions:
    """ReadOptions from Spark's (case-insensitive, string-valued) options."""
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    unknown = sorted(set(opts) - OPTION_NAMES)
    if unknown:
        raise ValueError(f"unknown trio_ha option(s): {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(OPTION_NAMES))}")
    paths = []
    if opts.get("path"):
        paths.append(opts["path"])
    if opts.get("paths"):
        paths.extend(_parse_list(opts["paths"]) or [])
    topics = _parse_list(opts.get("topics"))
    if opts.get("topic"):
        topics = (topics or []) + [opts["topic"]]
    queue_ids = _parse_list(opts.get("queue_ids"))
    merge_gap = _parse_size(opts.get("merge_gap_bytes"))
    filters = Filters(
        topics=frozenset(topics) if topics is not None else None,
        queue_ids=frozenset(int(q) for q in queue_ids) if queue_ids is not None else None,
        start_offset=(
            int(opts["start_offset"]) if opts.get("start_offset") not in (None, "") else None
        ),
        end_offset=(
            int(opts["end_offset"]) if opts.get("end_offset") not in (None, "") else None
        ),
        since_ms=parse_time(opts.get("since")),
        until_ms=parse_time(opts.get("until")),
        queue_pushdown=topics is not None or queue_ids is not None,
    )
    on_corrupt = str(opts.get("on_corrupt", "fail")).lower()
    if on_corrupt not in ("fail", "emit"):
        raise ValueError(f"on_corrupt must be 'fail' or 'emit', got {on_corrupt!r}")
    result = ReadOptions(
        paths=tuple(os.path.abspath(os.path.expanduser(p)) for p in dict.fromkeys(paths)),
        filters=filters,
        verify_crc=_parse_bool(opts.get("verify_crc"), True),
        on_corrupt=on_corrupt,
        include_body=_parse_bool(opts.get("include_body"), True),
        decompress_body=_parse_bool(opts.get("decompress_body"), True),
        partition_bytes=_parse_size(opts.get("partition_bytes")) or 128 * MiB,
        batch_rows=int(opts.get("batch_rows") or 8192),
        max_record=_parse_size(opts.get("max_record_size")) or DEFAULT_MAX_RECORD,
        use_consume_queues=_parse_bool(opts.get("use_consume_queues"), True),
        time_prune_slack_ms=int(opts.get("time_prune_slack_ms") or 60_000),
        merge_gap_bytes=MERGE_GAP if merge_gap is None else merge_gap,
        starting_offsets=str(opts.get("starting_offsets") or "earliest"),
        max_bytes_per_trigger=_parse_size(opts.get("max_bytes_per_trigger")),
        max_records_per_trigger=(int(opts["max_records_per_trigger"])
                                 if opts.get("max_records_per_trigger") else None),
        fail_on_data_loss=_parse_bool(opts.get("fail_on_data_loss"), True),
    )
    if result.batch_rows < 1 or result.partition_bytes < 4096:
        raise ValueError("batch_rows must be >= 1 and partition_bytes >= 4096")
    return result


# ---- planning -------------------------------------------------------------------------------


class _Planner:
    """Planning state for one store and one call: mapped segments and known boundaries."""

    def __init__(self, store: StoreDir, segments: list[Segment], opts: ReadOptions) -> None:
        self.store = store
        self.segments = segments
        self.opts = opts
        self._mapped: dict[int, MappedSegment] = {}
        self._cands: np.ndarray | None = None
        self._checked: dict[int, bool] = {}

    def close(self) -> None:
        for m in self._mapped.values():
            m.close()
        self._mapped.clear()

    def segment_of(self, offset: int) -> Segment | None:
        for seg in self.segments:
            if seg.base <= offset < seg.end:
                return seg
        return None

    def mapped(self, seg: Segment) -> MappedSegment:
        m = self._mapped.get(seg.base)
        if m is None:
            m = self._mapped[seg.base] = MappedSegment(seg)
        return m

    def valid(self, offset: int) -> bool:
        """Whether ``offset`` is a record start (cached)."""
        ok = self._checked.get(offset)
        if ok is None:
            seg = self.segment_of(offset)
            ok = seg is not None and self.mapped(seg).is_record_start(offset - seg.base)
            self._checked[offset] = ok
        return ok

    def candidates(self, lo: int, hi: int) -> np.ndarray:
        """Claimed record starts in [lo, hi) from the largest consume queues (unchecked)."""
        if self._cands is None:
            cands = [np.array([s.base for s in self.segments], np.int64)]
            if self.opts.use_consume_queues and self.store.consumequeue_dir:
                queues = self.store.queues()
                queues.sort(key=lambda q: queue_entry_count(q[2]), reverse=True)
                for _, _, directory in queues[:SPLIT_QUEUES]:
                    cands.append(read_queue_offsets(directory))
            c = np.sort(np.concatenate(cands))
            if len(c):
                c = c[np.concatenate(([True], c[1:] != c[:-1]))]
            self._cands = c
        c = self._cands
        return c[(c >= lo) & (c < hi)]

    def store_time(self, offset: int) -> int | None:
        seg = self.segment_of(offset)
        if seg is None:
            return None
        m = self.mapped(seg)
        row, _ = m.record_at(offset - seg.base, m.size, self.opts.max_record)
        return None if row is None else int(row["store_timestamp"])

    def exact_align(self, x: int, hi: int) -> int:
        """The first record start at or after ``x`` (``hi`` if none before it)."""
        seg = self.segment_of(x)
        if seg is None or x >= hi:
            return min(max(x, 0), hi) if seg is None else hi
        if x == seg.base:
            return x
        cands = self.candidates(seg.base, x + 1)
        start = seg.base
        for c in cands[::-1]:
            if self.valid(int(c)):
                start = int(c)
                break
        if start == x:
            return x
        m = self.mapped(seg)
        limit = min(m.size, hi - seg.base)
        for arr, res in iter_scan(m, start - seg.base, limit, flags=0,
                                  max_record=self.opts.max_record):
            if len(arr):
                k = np.searchsorted(arr["phys_offset"], x)
                if k < len(arr):
                    return int(arr["phys_offset"][k])
            if res.stop != _backend.STOP_FULL:
                end = seg.base + res.end
                if res.stop == _backend.STOP_BLANK:
                    return min(seg.end, hi)
                return min(max(end, x), hi)
        return hi  # pragma: no cover

    def split_points(self, seg: Segment, a: int, b: int) -> list[int]:
        """Record starts in (a, b) about ``partition_bytes`` apart (offsets)."""
        step = self.opts.partition_bytes
        if b - a <= step * 5 // 4:
            return []
        targets = np.arange(a + step, b - step // 4, step, dtype=np.int64)
        if not len(targets):
            return []
        cands = self.candidates(a + 1, b)
        points: list[int] = []
        if len(cands):
            idx = np.searchsorted(cands, targets)
            for i in np.unique(idx):
                j = int(i)
                while j < len(cands) and not self.valid(int(cands[j])):
                    j += 1
                if j < len(cands):
                    points.append(int(cands[j]))
        points = sorted(set(points))
        # Too few found (no consume queues, or they lag): scan the segment's headers.
        if len(points) < len(targets) // 2:
            m = self.mapped(seg)
            starts = []
            limit = min(m.size, b - seg.base)
            for arr, _res in iter_scan(m, a - seg.base, limit, flags=0,
                                       max_record=self.opts.max_record):
                if len(arr):
                    starts.append(arr["phys_offset"])
            if starts:
                allpos = np.concatenate(starts)
                idx = np.unique(np.searchsorted(allpos, targets))
                points = sorted({int(allpos[i]) for i in idx if i < len(allpos)} - {a})
        return [p for p in points if a < p < b]

    def narrow_by_time(self, lo: int, hi: int) -> tuple[int, int]:
        f = self.opts.filters
        if f.since_ms is None and f.until_ms is None:
            return lo, hi
        slack = self.opts.time_prune_slack_ms
        cands = [int(c) for c in self.candidates(lo, hi) if self.valid(int(c))]
        if not cands or cands[0] != lo:
            cands.insert(0, lo)
        times: dict[int, int] = {}

        def ts(i: int) -> int:
            if i not in times:
                t = self.store_time(cands[i])
                times[i] = t if t is not None else -(1 << 62)
            return times[i]

        if f.since_ms is not None:
            since = f.since_ms - slack
            # the last candidate with ts < since: records before it are all older
            low, high = 0, len(cands)
            while low < high:
                mid = (low + high) // 2
                if ts(mid) < since:
                    low = mid + 1
                else:
                    high = mid
            if low > 0:
                lo = max(lo, cands[low - 1])
        if f.until_ms is not None:
            until = f.until_ms + slack
            low, high = 0, len(cands)
            while low < high:
                mid = (low + high) // 2
                if ts(mid) < until:
                    low = mid + 1
                else:
                    high = mid
            if low < len(cands):
                hi = min(hi, cands[low])
        return lo, max(lo, hi)


def _chunks_of_region(p: _Planner, store_path: str, lo: int, hi: int, data_end: int) -> list[Chunk]:
    out = []
    for seg in p.segments:
        a, b = max(lo, seg.base), min(hi, seg.end)
        if a >= b:
            continue
        limit = min(seg.size, data_end - seg.base)
        cuts = [a] + p.split_points(seg, a, b) + [b]
        for x, y in itertools.pairwise(cuts):
            out.append(Chunk(store_path, seg.path, seg.base, limit,
                             ((x - seg.base, y - seg.base),)))
    return out


def _chunks_of_entries(p: _Planner, store_path: str, offsets: np.ndarray, sizes: np.ndarray,
                       data_end: int) -> list[Chunk]:
    """Chunks covering the given records (sorted by offset), merging near neighbours."""
    out = []
    step = p.opts.partition_bytes
    for seg in p.segments:
        sel = (offsets >= seg.base) & (offsets < seg.end)
        if not sel.any():
            continue
        starts = offsets[sel] - seg.base
        ends = starts + sizes[sel]
        limit = min(seg.size, data_end - seg.base)
        ranges: list[list[int]] = []
        chunk_bytes = 0
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            if ranges and s - ranges[-1][1] <= p.opts.merge_gap_bytes and chunk_bytes < step:
                chunk_bytes += e - ranges[-1][1]
                ranges[-1][1] = e
                continue
            if ranges and chunk_bytes >= step:
                out.append(Chunk(store_path, seg.path, seg.base, limit,
                                 tuple(tuple(r) for r in ranges)))
                ranges, chunk_bytes = [], 0
            ranges.append([s, e])
            chunk_bytes += e - s
        if ranges:
            out.append(Chunk(store_path, seg.path, seg.base, limit,
                             tuple(tuple(r) for r in ranges)))
    return out


def _selected_entries(p: _Planner, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    f = p.opts.filters
    offs, sizes = [], []
    for topic, qid, directory in p.store.queues():
        if f.topics is not None and topic not in f.topics:
            continue
        if f.queue_ids is not None and qid not in f.queue_ids:
            continue
        for _, path in queue_files(directory):
            entries = read_queue_file(path)
            if not len(entries):
                continue
            o = entries["offset"].astype(np.int64)
            s = entries["size"].astype(np.int64)
            keep = (o >= lo) & (o < hi)
            offs.append(o[keep])
            sizes.append(s[keep])
    if not offs:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    o = np.concatenate(offs)
    s = np.concatenate(sizes)
    order = np.argsort(o, kind="stable")
    o, s = o[order], s[order]
    o, first = np.unique(o, return_index=True)
    return o, s[first]


def plan_store(store: StoreDir, opts: ReadOptions, lo: int | None = None,
               hi: int | None = None, data_end: int | None = None) -> list[Chunk]:
    """The chunks that read the records of ``store`` with offsets in ``[lo, hi)`` (``hi``:
    the confirmed end by default) that can match ``opts.filters``."""
    segments = store.segments()
    if not segments:
        return []
    if data_end is None:
        data_end = confirmed_end(store, max_record=opts.max_record).end
    if hi is None:
        hi = data_end
    hi = min(hi, data_end)
    lo = segments[0].base if lo is None else max(lo, segments[0].base)
    f = opts.filters
    p = _Planner(store, segments, opts)
    try:
        if f.end_offset is not None:
            hi = min(hi, f.end_offset)  # a stop, not a boundary: records start before it
        if f.start_offset is not None and f.start_offset > lo:
            lo = p.exact_align(f.start_offset, hi)
        if lo >= hi:
            return []
        if opts.time_prune_slack_ms >= 0:
            lo, hi = p.narrow_by_time(lo, hi)
            if lo >= hi:
                return []
        if f.queue_pushdown and opts.use_consume_queues and store.consumequeue_dir:
            dend = dispatch_end(store)
            chunks = []
            if dend > lo:
                o, s = _selected_entries(p, lo, min(hi, dend))
                chunks += _chunks_of_entries(p, store.path, o, s, data_end)
            if dend < hi:
                tail_lo = max(lo, dend)
                tail_lo = p.exact_align(tail_lo, hi) if tail_lo > lo else lo
                chunks += _chunks_of_region(p, store.path, tail_lo, hi, data_end)
            return chunks
        return _chunks_of_region(p, store.path, lo, hi, data_end)
    finally:
        p.close()


def plan(opts: ReadOptions) -> list[Chunk]:
    """Chunks for a batch read of every store directory in ``opts.paths``."""
    if not opts.paths:
        raise StoreError("no store directory given: load(STORE_DIR) or option paths")
    out = []
    for path in opts.paths:
        out += plan_store(StoreDir(path), opts)
    return out


def with_filters(opts: ReadOptions, extra: Filters) -> ReadOptions:
    return replace(opts, filters=opts.filters.merge(extra))
