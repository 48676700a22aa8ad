"""Reading store directories into Arrow without Spark (same planner, same batches)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .batches import ARROW_SCHEMA, read_chunk
from .plan import parse_options, plan

__all__ = ["read_arrow"]


def read_arrow(*paths: str, **options: Any) -> pa.Table:
    """All records of the store directories as one Arrow table, with the data source's
    schema and options (``read_arrow(dir, topics="A,B", verify_crc=False)``)."""
    opts = parse_options({"paths": list(paths), **options})
    batches: list[pa.RecordBatch] = []
    for chunk in plan(opts):
        batches.extend(read_chunk(chunk, opts))
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
