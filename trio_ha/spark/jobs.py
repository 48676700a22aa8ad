"""Spark jobs over store directories: ``stats``, ``audit`` and ``export``.

Each takes a SparkSession (``trio_ha.spark.spark_session()`` makes one) and returns plain
Python values; ``trio-ha spark ...`` wraps them for the command line. Long jobs show Spark's
console progress bar.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _backend
from ..wire import layout
from .store_files import DEFAULT_MAX_RECORD, MappedSegment, Segment, StoreDir, confirmed_end

if TYPE_CHECKING:  # pyspark is imported when a job runs, not when this module loads
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["stats", "audit", "export", "StatsResult", "AuditResult", "ExportResult"]

#: what the jobs take for "the store directories": one path or several
Paths = str | Sequence[str]

_NICE_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600,
                 43200, 86400)


def _source(
    spark: SparkSession, paths: Sequence[str], options: dict[str, Any] | None = None
) -> DataFrame:
    from .session import register

    register(spark)
    reader = spark.read.format("trio_ha")
    for key, value in (options or {}).items():
        if value is not None:
            reader = reader.option(key, value if isinstance(value, str) else str(value))
    return reader.load(list(paths) if len(paths) > 1 else paths[0])


def _time_span(paths: Iterable[str]) -> tuple[int | None, int | None]:
    """First and last store timestamps of the stores, read from the files (two headers)."""
    first = last = None
    for path in paths:
        store = StoreDir(path)
        segments = store.segments()
        if not segments:
            continue
        tail = confirmed_end(store)
        with MappedSegment(segments[0]) as m:
            row, _ = m.record_at(0, m.size, 1 << 30)
            if row is not None:
                t = int(row["store_timestamp"])
                first = t if first is None else min(first, t)
        if tail.last_offset >= 0:
            for seg in segments:
                if seg.base <= tail.last_offset < seg.end:
                    with MappedSegment(seg) as m:
                        row, _ = m.record_at(tail.last_offset - seg.base, m.size, 1 << 30)
                        if row is not None:
                            t = int(row["store_timestamp"])
                            last = t if last is None else max(last, t)
    return first, last


def pick_bucket(first_ms: int | None, last_ms: int | None, buckets: int = 120) -> int:
    """A round bucket width in seconds giving about ``buckets`` points over the span."""
    if first_ms is None or last_ms is None:
        return 60
    span = max(1.0, (last_ms - first_ms) / 1000)
    want = span / buckets
    for b in _NICE_BUCKETS:
        if b >= want:
            return b
    return _NICE_BUCKETS[-1]


@dataclass
class StatsResult:
    queues: list  # one dict per (store_dir, topic, queue_id)
    rate: list  # one dict per (topic, bucket start), each message counted once
    bucket_seconds: int
    out: str | None = None
    files: dict = field(default_factory=dict)
    #: the messages and bytes of all the stores, each message counted once however many
    #: stores hold it (a master and its slave hold the same ones); None: the queues' sums
    messages: int | None = None
    bytes: int | None = None

    def table(self) -> str:
        """The per-queue figures as a text table."""
        multi = len({q["store_dir"] for q in self.queues}) > 1
        head = (["store_dir"] if multi else []) + [
            "topic", "queue", "messages", "bytes", "first_store_time", "last_store_time",
            "msg/s", "producer_hosts"]
        rows = []
        for q in self.queues:
            rows.append(([q["store_dir"]] if multi else []) + [
                q["topic"], str(q["queue_id"]), f"{q['messages']:,}", f"{q['bytes']:,}",
                _fmt_ms(q["first_store_ms"]), _fmt_ms(q["last_store_ms"]),
                f"{q['rate_per_s']:.1f}", ",".join(q["producer_hosts"])])
        total_m = self.messages if self.messages is not None else sum(
            q["messages"] for q in self.queues)
        total_b = self.bytes if self.bytes is not None else sum(q["bytes"] for q in self.queues)
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
                  for i, h in enumerate(head)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)),
                 "  ".join("-" * w for w in widths)]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        if multi:
            stores = len({q["store_dir"] for q in self.queues})
            lines.append(f"{len(self.queues)} queues in {stores} stores; {total_m:,} distinct "
                         f"messages, {total_b:,} bytes (a message several stores hold, as a "
                         "master and its slave do, counted once); rate buckets of "
                         f"{self.bucket_seconds} s")
        else:
            lines.append(f"{len(self.queues)} queues, {total_m:,} messages, {total_b:,} bytes; "
                         f"rate buckets of {self.bucket_seconds} s")
        return "\n".join(lines)


def _fmt_ms(ms: int | None) -> str:
    import datetime as dt

    if ms is None:
        return "-"
    when = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def stats(spark: SparkSession, paths: Paths, *, out: str | None = None,
          bucket_seconds: int | None = None, options: dict[str, Any] | None = None) -> StatsResult:
    """Per topic and queue: messages, bytes, first/last store time, mean rate, producer hosts;
    and messages per second over time per topic. One scan (bodies are not read). With
    ``out``: ``queues.parquet``, ``rate.parquet`` and ``rate.png`` are written there.

    The queue figures are per store directory. The rate and the totals count each message
    once (by msg_id: the store host and commitlog offset, which a slave's copy shares with
    its master's): over a master's and its slave's stores a sum would count every message
    twice. So over several stores the rate takes a second scan, which drops the copies."""
    from pyspark.sql import functions as F

    dirs = _abspaths(paths)
    first, last = _time_span(dirs)
    bucket = bucket_seconds or pick_bucket(first, last)
    opts = {"include_body": "false", **(options or {})}
    df = _source(spark, dirs, opts)
    ms = F.unix_millis("store_timestamp")
    fine = (
        df.withColumn("bucket_ms", F.floor(ms / (bucket * 1000)) * (bucket * 1000))
        .withColumn("producer", F.regexp_extract("born_host", r"^(.*):\d+$", 1))
        .groupBy("store_dir", "topic", "queue_id", "bucket_ms")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes"),
             F.min(ms).alias("first_ms"), F.max(ms).alias("last_ms"),
             F.collect_set("producer").alias("hosts"))
    ).cache()
    try:
        queues_df = (
            fine.groupBy("store_dir", "topic", "queue_id")
            .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"),
                 F.min("first_ms").alias("first_store_ms"), F.max("last_ms").alias("last_store_ms"),
                 F.array_sort(F.array_distinct(F.flatten(F.collect_list("hosts")))).alias("producer_hosts"))
            .withColumn("rate_per_s", F.col("messages") / F.greatest(
                (F.col("last_store_ms") - F.col("first_store_ms")) / 1000.0, F.lit(1.0)))
            .orderBy("store_dir", "topic", "queue_id")
        )
        if len(dirs) > 1:  # stores may hold copies of one another's messages
            per_topic = (
                df.dropDuplicates(["msg_id"])
                .withColumn("bucket_ms", F.floor(ms / (bucket * 1000)) * (bucket * 1000))
                .groupBy("topic", "bucket_ms")
                .agg(F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes"))
            )
        else:
            per_topic = fine.groupBy("topic", "bucket_ms").agg(
                F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
        rate_df = (
            per_topic
            .withColumn("messages_per_s", F.col("messages") / float(bucket))
            .withColumn("bucket_start", F.timestamp_millis("bucket_ms"))
            .orderBy("topic", "bucket_ms")
        )
        queues = [r.asDict(recursive=True) for r in queues_df.collect()]
        rate = [r.asDict(recursive=True) for r in rate_df.collect()]
        result = StatsResult(queues, rate, bucket, out,
                             messages=sum(int(r["messages"]) for r in rate),
                             bytes=sum(int(r["bytes"] or 0) for r in rate))
        if out:
            os.makedirs(out, exist_ok=True)
            qpath = os.path.join(out, "queues.parquet")
            rpath = os.path.join(out, "rate.parquet")
            queues_df.write.mode("overwrite").parquet(qpath)
            rate_df.write.mode("overwrite").parquet(rpath)
            png = os.path.join(out, "rate.png")
            from .plot import plot_rate

            plot_rate(rate, bucket, png)
            result.files = {"queues": qpath, "rate": rpath, "plot": png}
        return result
    finally:
        fine.unpersist()


# ---- audit ----------------------------------------------------------------------------------


@dataclass
class AuditResult:
    prefix: bool
    master_dir: str
    slave_dir: str
    compared_from: int
    compared_to: int
    master_end: int
    slave_end: int
    segments: int
    ranges: int
    bytes_compared: int
    mismatched_segments: list
    first_difference: int | None
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def _abspaths(paths: Paths) -> list[str]:
    return [os.path.abspath(p) for p in ([paths] if isinstance(paths, str) else paths)]


def _segment_data_length(task: tuple[str, str, int, int, int]) -> tuple[str, int, int]:
    """(side, base, length): how many bytes of the segment hold data — up to and including
    the 8-byte blank record that closes a full segment (what follows it is never compared:
    RocketMQ leaves it unspecified), or to the end of the last whole record."""
    side, path, base, size, max_record = task
    with MappedSegment(Segment(path, base, size)) as m:
        scanner = _backend.engine.scanner(65536)
        pos = 0
        while True:
            res = scanner.scan(m.handle, m.size, pos, base, 0, max_record)
            if res.stop == _backend.STOP_FULL:
                pos = res.end
                continue
            if res.stop == _backend.STOP_BLANK:
                # the blank record itself is TOTALSIZE and MAGIC
                return side, base, min(m.size, res.end + layout.RECORD_START.size)
            return side, base, res.end


def _range_digest(task: tuple[str, str, int, int, int]) -> tuple[str, int, int, int, str]:
    """(side, base, start, length, hex digest) of ``length`` bytes at ``start`` (a commitlog
    offset) in a segment; a short file digests what it has and reports the shorter length."""
    side, path, base, start, length = task
    with open(path, "rb") as f:
        f.seek(start - base)
        data = f.read(length)
    return side, base, start, len(data), hashlib.blake2b(data, digest_size=16).hexdigest()


def _first_difference(
    m_path: str, m_base: int, s_path: str, s_base: int, start: int, length: int
) -> int | None:
    import numpy as np

    with open(m_path, "rb") as f:
        f.seek(start - m_base)
        a = np.frombuffer(f.read(length), np.uint8)
    with open(s_path, "rb") as f:
        f.seek(start - s_base)
        b = np.frombuffer(f.read(length), np.uint8)
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    if len(diff):
        return start + int(diff[0])
    if len(a) != len(b):
        return start + n
    return None


def audit(spark: SparkSession, master_dir: str, slave_dir: str, *, range_bytes: int = 64 << 20,
          max_record: int | None = None) -> AuditResult:
    """Prove that ``slave_dir``'s commitlog is a byte prefix of ``master_dir``'s.

    Over the offsets both hold (from the later first segment to the slave's confirmed end),
    Spark computes, on both sides, each segment's data length (through its blank record) and
    a BLAKE2b checksum of every ``range_bytes`` range; the checksums are joined and compared
    in Spark, per range and per segment. The first differing range is then compared byte by
    byte to name the first differing offset."""
    from pyspark.sql import functions as F

    max_record = max_record or DEFAULT_MAX_RECORD
    master, slave = StoreDir(master_dir), StoreDir(slave_dir)
    m_segs = {s.base: s for s in master.segments()}
    s_segs = {s.base: s for s in slave.segments()}
    m_end = confirmed_end(master, max_record=max_record).end
    s_end = confirmed_end(slave, max_record=max_record).end
    start = max(min(m_segs, default=0), min(s_segs, default=0))
    to = min(s_end, m_end)
    sc = spark.sparkContext

    def result(prefix: bool, first: int | None, reason: str, segs: int = 0, ranges: int = 0,
               compared: int = 0, bad: Sequence[str] = ()) -> AuditResult:
        return AuditResult(prefix, master.path, slave.path, start, to, m_end, s_end, segs,
                           ranges, compared, list(bad), first, reason)

    common = sorted(b for b in s_segs if b in m_segs and s_segs[b].end > start and b < to)
    missing = [b for b in s_segs if b not in m_segs and b < s_end and s_segs[b].end > start]
    if missing:
        return result(False, min(missing),
                      f"the master has no segment {layout.segment_file_name(min(missing))}")
    tasks = []
    for b in common:
        tasks.append(("master", m_segs[b].path, b, m_segs[b].size, max_record))
        tasks.append(("slave", s_segs[b].path, b, s_segs[b].size, max_record))
    sc.setJobDescription("audit: segment data lengths")
    lengths = (
        sc.parallelize(tasks, max(1, min(len(tasks), 64))).map(_segment_data_length).collect()
    )
    seg_len: dict[int, int] = {}
    for _side, base, length in lengths:
        seg_len[base] = max(seg_len.get(base, 0), length)
    digest_tasks = []
    for b in common:
        lo = max(start, b)
        hi = min(to, b + seg_len[b])
        for r in range(lo, hi, range_bytes):
            n = min(range_bytes, hi - r)
            digest_tasks.append(("master", m_segs[b].path, b, r, n))
            digest_tasks.append(("slave", s_segs[b].path, b, r, n))
    if not digest_tasks:
        ok = s_end <= m_end
        return result(ok, None if ok else m_end,
                      "nothing to compare" if ok else "the slave is longer than the master",
                      len(common))
    sc.setJobDescription("audit: range checksums")
    rdd = sc.parallelize(digest_tasks, max(1, min(len(digest_tasks), 256))).map(_range_digest)
    sums = spark.createDataFrame(
        rdd, "side string, segment long, offset long, length long, digest string"
    )
    m = sums.filter("side = 'master'").select("segment", "offset", F.col("length").alias("m_len"),
                                              F.col("digest").alias("m_digest"))
    s = sums.filter("side = 'slave'").select("segment", "offset", F.col("length").alias("s_len"),
                                             F.col("digest").alias("s_digest"))
    joined = m.join(s, ["segment", "offset"], "full_outer").cache()
    try:
        sc.setJobDescription("audit: compare")
        same = (F.col("m_digest") == F.col("s_digest")) & (F.col("m_len") == F.col("s_len"))
        bad_ranges = joined.filter(~F.coalesce(same, F.lit(False)))

        def segment_digest(column: str) -> Column:
            """One digest of a segment's range digests, in offset order."""
            ordered = F.array_sort(F.collect_list(F.struct("offset", column)))
            return F.sha2(F.concat_ws("", F.transform(ordered, lambda x: x[column])), 256)

        per_segment = joined.groupBy("segment").agg(
            segment_digest("m_digest").alias("m"), segment_digest("s_digest").alias("s")
        )
        bad_segments = sorted(r["segment"] for r in per_segment.filter("m <> s").collect())
        first_bad = bad_ranges.agg(F.min("offset").alias("o")).collect()[0]["o"]
        counts = joined.agg(F.count(F.lit(1)).alias("n"), F.sum("s_len").alias("b")).collect()[0]
    finally:
        joined.unpersist()
    n_ranges, compared = int(counts["n"]), int(counts["b"] or 0)
    if first_bad is not None:
        seg = max(b for b in common if b <= first_bad)
        first = _first_difference(m_segs[seg].path, seg, s_segs[seg].path, seg, first_bad,
                                  min(range_bytes, to - first_bad))
        first = first if first is not None else first_bad
        return result(False, first,
                      f"the slave differs from the master at commitlog offset {first}",
                      len(common), n_ranges, compared,
                      [layout.segment_file_name(b) for b in bad_segments])
    if s_end > m_end:
        return result(False, m_end, f"the slave holds records past the master's end {m_end}",
                      len(common), n_ranges, compared)
    return result(True, None, f"the slave is a byte prefix of the master up to {to}",
                  len(common), n_ranges, compared)


# ---- export ---------------------------------------------------------------------------------


@dataclass
class ExportResult:
    path: str
    checkpoint: str
    format: str
    batches: int
    rows: int
    end_offsets: dict

    def as_dict(self) -> dict:
        return asdict(self)


def export(spark: SparkSession, store_dir: Paths, to: str, *, fmt: str = "parquet",
           topics: str | Sequence[str] | None = None, since: object = None,
           checkpoint: str | None = None, options: dict[str, Any] | None = None,
           max_bytes_per_trigger: str | int | None = None) -> ExportResult:
    """Incremental export: a streaming query (trigger available-now) from the store to files
    at ``to``, with its checkpoint (``<to>/_checkpoint`` by default). Run it again later and
    it continues exactly where the last run stopped — including after an interruption: the
    file sink's log commits each micro-batch once."""
    from .plan import parse_time
    from .session import register

    if fmt not in ("parquet", "json"):
        raise ValueError(f"format must be parquet or json, got {fmt!r}")
    register(spark)
    paths = _abspaths(store_dir)
    to = os.path.abspath(to)
    checkpoint = os.path.abspath(checkpoint) if checkpoint else os.path.join(to, "_checkpoint")
    reader = spark.readStream.format("trio_ha")
    if topics:
        reader = reader.option("topics", ",".join([topics] if isinstance(topics, str) else topics))
    if since is not None:
        reader = reader.option("since", str(parse_time(since)))
    if max_bytes_per_trigger:
        reader = reader.option("max_bytes_per_trigger", str(max_bytes_per_trigger))
    for key, value in (options or {}).items():
        reader = reader.option(key, str(value))
    if len(paths) == 1:
        df = reader.load(paths[0])
    else:  # a stream reader's load takes one path; the option takes a JSON list
        df = reader.option("paths", json.dumps(paths)).load()
    query = (df.writeStream.format(fmt).option("path", to).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).queryName("trio-ha-export")
             .start())
    try:
        query.awaitTermination()
    finally:
        if query.isActive:
            query.stop()
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) or p.get("sources")]
    rows = sum(int(p.get("numInputRows", 0)) for p in progress)
    batches = sum(1 for p in progress if int(p.get("numInputRows", 0)) > 0)
    end = {}
    for p in progress:
        for src in p.get("sources", []):
            if src.get("endOffset"):
                end = src["endOffset"]
    if isinstance(end, str):
        end = json.loads(end)
    return ExportResult(to, checkpoint, fmt, batches, rows, end)
