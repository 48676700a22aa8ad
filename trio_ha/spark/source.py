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

import datetime as dt
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

# Spark 4.2+ (the spark extra requires it): admission control and Trigger.AvailableNow for
# Python stream readers.
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .plan import (
    Chunk,
    Filters,
    ReadOptions,
    parse_options,
    parse_time,
    plan,
    plan_store,
    with_filters,
)
from .store_files import StoreDir, StoreError, TailState, advance, confirmed_end

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


def _read(partition: InputPartition, opts: ReadOptions) -> Iterator[Any]:
    from .batches import read_chunk  # executors import numpy/pyarrow only when reading

    if not isinstance(partition, ChunkPartition):
        raise TypeError(f"not a trio_ha partition: {partition!r}")
    return read_chunk(partition.value, opts)


_PUSHABLE = {"topic", "queue_id", "commitlog_offset", "store_timestamp"}


def _push(filters: Sequence[Filter], opts: ReadOptions) -> tuple[ReadOptions, list[Filter]]:
    """Fold Spark's pushed filters on topic, queue_id, commitlog_offset and store_timestamp
    into the read's filters. Returns (new options, filters Spark must still evaluate)."""
    extra = Filters()
    rest: list[Filter] = []
    for f in filters:
        attribute = getattr(f, "attribute", None)
        col = attribute[0] if attribute is not None and len(attribute) == 1 else None
        value = getattr(f, "value", None)
        got = None
        try:
            if col == "topic" and isinstance(f, EqualTo) and isinstance(value, str):
                got = Filters(topics=frozenset([value]))
            elif col == "topic" and isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                got = Filters(topics=frozenset(f.value))
            elif col == "queue_id" and isinstance(f, EqualTo) and isinstance(value, int):
                got = Filters(queue_ids=frozenset([value]))
            elif col == "queue_id" and isinstance(f, In) and all(
                isinstance(v, int) for v in f.value
            ):
                got = Filters(queue_ids=frozenset(f.value))
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
                if isinstance(f, EqualTo) and ms is not None and micros % 1000 == 0:
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


def _micros(value: object) -> int:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    ms = parse_time(value)
    if ms is None:
        raise ValueError("an empty time bound")
    return ms * 1000


class TrioHaReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        return [ChunkPartition(c) for c in plan(self.opts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition, self.opts)


class TrioHaPushdownReader(TrioHaReader):
    """The reader with Spark filter pushdown (needs
    ``spark.sql.python.filterPushdown.enabled=true``, which :func:`register` sets)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.opts, rest = _push(filters, self.opts)
        return rest


class TrioHaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over commitlog offsets; see the module docstring."""

    def __init__(self, opts: ReadOptions) -> None:
        if not opts.paths:
            raise StoreError("no store directory given: load(STORE_DIR) or option paths")
        self.opts = opts
        self._tails: dict[str, TailState] = {}
        self._target: dict[str, int] | None = None

    # -- offsets ---------------------------------------------------------------------------
    def _ends(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for path in self.opts.paths:
            tail = confirmed_end(StoreDir(path), max_record=self.opts.max_record,
                                 previous=self._tails.get(path))
            self._tails[path] = tail
            out[path] = tail.end
        return out

    def initialOffset(self) -> dict[str, int]:
        start = self.opts.starting_offsets.strip()
        if start == "latest":
            return self._ends()
        if start == "earliest":
            out: dict[str, int] = {}
            for path in self.opts.paths:
                segments = StoreDir(path).segments()
                out[path] = segments[0].base if segments else 0
            return out
        given = json.loads(start)
        return {path: int(given.get(path, 0)) for path in self.opts.paths}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        if self.opts.max_records_per_trigger:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends()

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        ends = dict(self._target) if self._target is not None else self._ends()
        if start is None or limit is None or isinstance(limit, ReadAllAvailable):
            return {p: max(ends[p], int(start.get(p, 0))) if start else ends[p] for p in ends}
        max_bytes = getattr(limit, "max_bytes", None)
        max_rows = getattr(limit, "max_rows", None)
        out: dict[str, int] = {}
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

    def reportLatestOffset(self) -> dict[str, int]:
        return self._ends()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
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

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition, self.opts)

    def commit(self, end: dict[str, int]) -> None:
        pass


class TrioHaDataSource(DataSource):
    """``format("trio_ha")``: records of RocketMQ store directories (ours or a real
    broker's, master or slave). Options are listed in ``trio_ha.spark``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = parse_options(options)

    def schema(self) -> StructType:
        return schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return TrioHaReader(self.parsed)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TrioHaStreamReader(self.parsed)


class TrioHaPushdownDataSource(TrioHaDataSource):
    """``trio_ha`` with Spark filter pushdown on topic, queue_id, commitlog_offset and
    store_timestamp; :func:`trio_ha.spark.register` registers this one and turns on
    ``spark.sql.python.filterPushdown.enabled`` (Spark refuses a reader that implements
    pushdown while that setting is off, so plain ``TrioHaDataSource`` does without)."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return TrioHaPushdownReader(self.parsed)
