"""trio_ha for Spark: a PySpark data source over RocketMQ store directories, and jobs.

Never imports trio: executors load only this package, ``trio_ha.wire`` and the record engine
(``trio_ha._backend`` and its native module). Needs the ``spark`` extra
(``pip install trio-ha[spark]``: pyspark 4.x, pyarrow, numpy, pandas, matplotlib).

Use::

    from trio_ha.spark import spark_session          # or register(spark) on your own session
    spark = spark_session()
    df = spark.read.format("trio_ha").option("topics", "Orders,Payments").load("/data/store")
    stream = spark.readStream.format("trio_ha").load("/data/store")

Input: one or more store directories — ours or a real RocketMQ 4.9 broker's, a master's or a
slave's, live or stopped (``load(path)``, ``load([p1, p2])`` or option ``paths``). A
directory holding ``commitlog/`` is a store root; a bare commitlog directory works too
(without consume-queue pushdown).

Schema (stable; ``SCHEMA_DDL``; one row per message record, blank records never appear):

==============================  ==========================  ==================================
column                          type                        meaning
==============================  ==========================  ==================================
topic                           string not null
queue_id                        int not null
queue_offset                    bigint not null             offset in the consume queue
commitlog_offset                bigint not null             byte offset of the record
size                            int not null                TOTALSIZE
body                            binary                      null when include_body=false
body_crc                        int not null                BODYCRC as stored
crc_ok                          boolean                     null when verify_crc=false
tags                            string                      TAGS property
keys                            array<string> not null      KEYS split on spaces
uniq_key                        string                      UNIQ_KEY property
properties                      map<string,string> not null all properties
flag, sys_flag                  int not null
born_timestamp, store_timestamp timestamp not null          (epoch ms, shown in UTC)
born_host, store_host           string not null             "ip:port" ("[v6]:port")
reconsume_times                 int not null
prepared_transaction_offset     bigint not null
msg_id                          string not null             offsetMsgId (store host + offset)
store_dir                       string not null             absolute store directory
==============================  ==========================  ==================================

Options (all optional):

* ``topics`` (comma list or JSON list), ``queue_ids``: pushed down through the consume
  queues (only byte ranges holding those queues' entries are read); such a read returns
  consume-queue messages, so PREPARED and ROLLBACK transaction records (never dispatched to
  a queue) are not included;
* ``start_offset``, ``end_offset``: commitlog offset range ``[start, end)``;
* ``since``, ``until``: store-time range ``[since, until)`` (epoch ms or ISO 8601, UTC when
  naive), pushed down by binary search over segment starts and consume-queue entries
  (``time_prune_slack_ms``, default 60000, allows for a clock that stepped back);
* ``verify_crc`` (true): check every body CRC; ``on_corrupt`` (``fail``): a CRC mismatch
  fails the read naming the commitlog offset; ``emit`` returns the record with
  ``crc_ok = false`` instead. A structurally broken record (bad magic or size) inside the
  confirmed range always fails the read, naming its offset;
* ``include_body`` (true): false leaves ``body`` null (much less data);
* ``decompress_body`` (true): a body its producer compressed (``sys_flag`` bit 0: RocketMQ's
  clients zlib bodies over 4 KiB) is inflated, so ``body`` is what was sent; false gives
  the stored bytes (``sys_flag`` says which rows are compressed either way). One that does
  not inflate fails the read naming its offset (``on_corrupt=emit``: stored bytes);
* ``partition_bytes`` (128m): target partition size; ``batch_rows`` (8192): Arrow batch
  size; ``max_record_size`` (4 MiB + 128 KiB): largest valid record;
* ``use_consume_queues`` (true): false ignores consume queues (reads every byte);
  ``merge_gap_bytes`` (256k): with topic/queue pushdown, selected records closer than this
  are read as one range;
* streaming: ``starting_offsets`` (``earliest`` | ``latest`` | JSON ``{"dir": offset}``),
  ``max_bytes_per_trigger``, ``max_records_per_trigger``, ``fail_on_data_loss`` (true).

Spark filters on ``topic`` and ``queue_id`` are applied in the executor, before the rows reach
the JVM (exact: nothing that matches is left out); filters on ``commitlog_offset`` and
``store_timestamp`` are pushed down like the options (offset and time ranges).

Never emitted: anything at or past a store's confirmed end — the last whole record whose
body CRC matches and whose stored PHYSICALOFFSET is its own offset — so a partial record at
the tail of a live store is left for a later read. On a slave that end is what has been
replicated; on a live master, what is on disk (page cache included) approximates the flushed
end.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "spark_session": "trio_ha.spark.session",
    "register": "trio_ha.spark.session",
    "TrioHaDataSource": "trio_ha.spark.source",
    "FORMAT": "trio_ha.spark.source",
    "schema": "trio_ha.spark.source",
    "SCHEMA_DDL": "trio_ha.spark.batches",
    "ARROW_SCHEMA": "trio_ha.spark.batches",
    "read_arrow": "trio_ha.spark.local",
    "confirmed_end": "trio_ha.spark.store_files",
    "StoreDir": "trio_ha.spark.store_files",
    "CorruptRecordError": "trio_ha.spark.store_files",
    "StoreError": "trio_ha.spark.store_files",
    "stats": "trio_ha.spark.jobs",
    "audit": "trio_ha.spark.jobs",
    "export": "trio_ha.spark.jobs",
}

if TYPE_CHECKING:  # what the lazy names are, for a type checker (kept in step with _EXPORTS)
    from .batches import ARROW_SCHEMA, SCHEMA_DDL
    from .jobs import audit, export, stats
    from .local import read_arrow
    from .session import register, spark_session
    from .source import FORMAT, TrioHaDataSource, schema
    from .store_files import CorruptRecordError, StoreDir, StoreError, confirmed_end

__all__ = [
    "ARROW_SCHEMA", "FORMAT", "SCHEMA_DDL", "CorruptRecordError", "StoreDir", "StoreError",
    "TrioHaDataSource", "audit", "confirmed_end", "export", "read_arrow", "register", "schema",
    "spark_session", "stats",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trio_ha.spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
