"""The PySpark data source ``trio_ha`` (pyspark.sql.datasource, Spark 4.x).

Batch: ``spark.read.format("trio_ha").load(STORE_DIR)``; streaming:
``spark.readStream.format("trio_ha").load(STORE_DIR)``. Register it first with
:func:`trio_ha.spark.register` (or ``spark.dataSource.register(TrioHaDataSource)``).
See ``trio_ha.spark`` for the schema and the options.

Streaming offsets are commitlog offsets, one per store directory:
``{"/abs/store/dir": 123456, ...}``. The latest offset is each store's confirmed end
(:func:`trio_ha.spark.store_files.confirmed_end`); a micro-batch ``[start, end)`` reads exactly
the records whose commitlog offset lies in it, and both ends are always record boundaries, so
a restart from a checkpoint neither skips nor repeats a record.
"""

from __future__ import annotations

import json

from pyspark.sql.datasource import (
    DataSource, DataSourceReader, DataSourceStreamReader, EqualTo, GreaterThan,
    GreaterThanOrEqual, In, InputPartition, LessThan, LessThanOrEqual,
)
from pyspark.sql.types import StructType

from .plan import Chunk, Filters, ReadOptions, parse_options, parse_time, plan, plan_store, with_filters
from .store_files import StoreDir, StoreError, TailState, confirmed_end

try:  # Spark 4.2+: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows, SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older Spark 4.x
    ReadAllAvailable = ReadMaxBytes = ReadMaxRows = ReadLimit = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

__all__ = ["TrioHaDataSource", "FORMAT", "schema"]

FORMAT = "trio_ha"


def schema() -> StructType:
    """The data source's schema as a Spark StructType (built without a session)."""
    from pyspark.sql import types as T

    from .batches import COLUMNS

    simple = {
        "STRING": T.StringType(), "INT": T.IntegerType(), "BIGINT": T.LongType(),
        "BINARY": T.BinaryType(), "BOOLEAN": T.BooleanType(), "TIMESTAMP": T.TimestampType(),
        "ARRAY<STRING NOT NULL>": T.ArrayType(T.StringType(), containsNull=False),
        "MAP<STRING, STRING NOT NULL>": T.MapType(T.StringType(), T.StringType(),
                                                  valueContainsNull=False),
    }
    return T.StructType([
        T.StructField(name, simple[ddl], nullable=nullable,
                      metadata={"comment": comment})
        for name, _, nullable, ddl, comment in COLUMNS
    ])


class ChunkPartition(InputPartition):
    """A picklable partition: one :class:`Chunk` (segment path, byte ranges, scan limit)."""

    def __init__(self, chunk: Chunk) -> None:
        super().__init__(chunk)


def _read(partition: ChunkPartition, opts: ReadOptions):
    from .batches import read_chunk  # executors import numpy/pyarrow only when reading
    return read_chunk(partition.value, opts)


_PUSHABLE = {"topic", "queue_id", "commitlog_offset", "store_timestamp"}


def _push(filters, opts: ReadOptions) -> tuple[ReadOptions, list]:
    """Fold Spark's pushed filters on topic, queue_id, commitlog_offset and store_timestamp
    into the read's filters. Returns (new options, filters Spark must still evaluate)."""
    extra = Filters()
    rest = []
    for f in filters:
        attribute = getattr(f, "attribute", None)
        col = attribute[0] if attribute is not None and len(attribute) == 1 else None
        value = getattr(f, "value", None)
        got = None
        try:
            if col == "topic" and isinstance(f, EqualTo) and isinstance(value, str):
                got = Filters(topics=frozenset([value]))
            elif col == "topic" and isinstance(f, In) and all(isinstance(v, str) for v in value):
                got = Filters(topics=frozenset(value))
            elif col == "queue_id" and isinstance(f, EqualTo) and isinstance(value, int):
                got = Filters(queue_ids=frozenset([value]))
            elif col == "queue_id" and isinstance(f, In) and all(isinstance(v, int) for v in value):
                got = Filters(queue_ids=frozenset(value))
            elif col == "commitlog_offset" and isinstance(value, int):
                if isinstance(f, EqualTo):
                    got = Filters(start_offset=value, end_offset=value + 1)
                elif isinstance(f, GreaterThan):
                    got = Filters(start_offset=value + 1)
                elif isinstance(f, GreaterThanOrEqual):
                    got = Filters(start_offset=value)
                elif isinstance(f, LessThan):
                    got = Filters(end_offset=value)
                elif isinstance(f, LessThanOrEqual):
                    got = Filters(end_offset=value + 1)
            elif col == "store_timestamp" and value is not None and not isinstance(f, In):
                ms = parse_time(value)
                # Spark timestamps are microseconds; the store keeps milliseconds: a bound
                # between two milliseconds is rounded so the row test stays exact.
                micros = _micros(value)
                if isinstance(f, EqualTo) and micros % 1000 == 0:
                    got = Filters(since_ms=ms, until_ms=ms + 1)
                elif isinstance(f, GreaterThanOrEqual):
                    got = Filters(since_ms=-(-micros // 1000))
                elif isinstance(f, GreaterThan):
                    got = Filters(since_ms=micros // 1000 + 1)
                elif isinstance(f, LessThan):
                    got = Filters(until_ms=-(-micros // 1000))
                elif isinstance(f, LessThanOrEqual):
                    got = Filters(until_ms=micros // 1000 + 1)
        except (TypeError, ValueError):
            got = None
        if got is None:
            rest.append(f)
        else:
            extra = extra.merge(got)
    return with_filters(opts, extra), rest


def _micros(value) -> int:
    import datetime as dt
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return int(parse_time(value)) * 1000


class TrioHaReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self):
        return [ChunkPartition(c) for c in plan(self.opts)]

    def read(self, partition):
        return _read(partition, self.opts)


class TrioHaPushdownReader(TrioHaReader):
    """The reader with Spark filter pushdown (needs
    ``spark.sql.python.filterPushdown.enabled=true``, which :func:`register` sets)."""

    def pushFilters(self, filters):
        self.opts, rest = _push(filters, self.opts)
        return rest


class TrioHaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over commitlog offsets; see the module docstring."""

    def __init__(self, opts: ReadOptions) -> None:
        if not opts.paths:
            raise StoreError("no store directory given: load(STORE_DIR) or option paths")
        self.opts = opts
        self._tails: dict[str, TailState] = {}
        self._target: dict | None = None

    # -- offsets ---------------------------------------------------------------------------
    def _ends(self) -> dict:
        out = {}
        for path in self.opts.paths:
            tail = confirmed_end(StoreDir(path), max_record=self.opts.max_record,
                                 previous=self._tails.get(path))
            self._tails[path] = tail
            out[path] = tail.end
        return out

    def initialOffset(self) -> dict:
        start = self.opts.starting_offsets.strip()
        if start == "latest":
            return self._ends()
        if start == "earliest":
            out = {}
            for path in self.opts.paths:
                segments = StoreDir(path).segments()
                out[path] = segments[0].base if segments else 0
            return out
        given = json.loads(start)
        return {path: int(given.get(path, 0)) for path in self.opts.paths}

    def getDefaultReadLimit(self):
        if ReadMaxBytes is not None and self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        if ReadMaxRows is not None and self.opts.max_records_per_trigger:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        ends = dict(self._target) if self._target is not None else self._ends()
        if start is None or limit is None or (ReadAllAvailable is not None
                                               and isinstance(limit, ReadAllAvailable)):
            return {p: max(ends[p], int(start.get(p, 0))) if start else ends[p] for p in ends}
        from .store_files import advance
        max_bytes = getattr(limit, "max_bytes", None)
        max_rows = getattr(limit, "max_rows", None)
        out = {}
        share = max(1, len(ends))
        for path, end in ends.items():
            begin = int(start.get(path, 0))
            if begin >= end:
                out[path] = begin
                continue
            out[path] = advance(StoreDir(path), begin, end, self.opts.max_record,
                                max_bytes=max_bytes // share if max_bytes else None,
                                max_records=max_rows // share if max_rows else None)
        return out

    def reportLatestOffset(self):
        return self._ends()

    def partitions(self, start: dict, end: dict):
        out = []
        for path in self.opts.paths:
            lo, hi = int(start.get(path, 0)), int(end.get(path, 0))
            if hi <= lo:
                continue
            store = StoreDir(path)
            segments = store.segments()
            first = segments[0].base if segments else hi
            if lo < first:
                if self.opts.fail_on_data_loss:
                    raise StoreError(
                        f"{path}: offsets [{lo}, {first}) were deleted (retention) before this "
                        "query read them; set fail_on_data_loss=false to skip them")
                lo = first
            out += [ChunkPartition(c) for c in plan_store(store, self.opts, lo, hi, data_end=hi)]
        return out

    def read(self, partition):
        return _read(partition, self.opts)

    def commit(self, end: dict) -> None:
        pass


class TrioHaDataSource(DataSource):
    """``format("trio_ha")``: records of RocketMQ store directories (ours or a real
    broker's, master or slave). Options are listed in ``trio_ha.spark``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options) -> None:
        super().__init__(options)
        self.parsed = parse_options(options)

    def schema(self):
        return schema()

    def reader(self, schema):
        return TrioHaReader(self.parsed)

    def streamReader(self, schema):
        return TrioHaStreamReader(self.parsed)


class TrioHaPushdownDataSource(TrioHaDataSource):
    """``trio_ha`` with Spark filter pushdown on topic, queue_id, commitlog_offset and
    store_timestamp; :func:`trio_ha.spark.register` registers this one and turns on
    ``spark.sql.python.filterPushdown.enabled`` (Spark refuses a reader that implements
    pushdown while that setting is off, so plain ``TrioHaDataSource`` does without)."""

    def reader(self, schema):
        return TrioHaPushdownReader(self.parsed)
