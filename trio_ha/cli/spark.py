"""``trio-ha spark ...``: Spark jobs over store directories (needs the spark extra:
``pip install trio-ha[spark]``)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import typer

from ._app import app

if TYPE_CHECKING:  # pyspark is imported by the spark commands only
    from pyspark.sql import SparkSession

spark_app = typer.Typer(
    no_args_is_help=True,
    help="Spark jobs over store directories (local Spark session; needs the spark extra).",
)
app.add_typer(spark_app, name="spark")


def _spark(app_name: str, master: str | None) -> SparkSession:
    from ..spark import spark_session

    return spark_session(app_name, master)


@spark_app.command("stats")
def spark_stats(
    store_dirs: list[str] = typer.Argument(..., help="store directories (master or slave)"),
    out: str = typer.Option(
        "spark-stats", help="directory for queues.parquet, rate.parquet, rate.png"
    ),
    bucket: int = typer.Option(
        None, help="rate bucket in seconds (picked from the time span by default)"
    ),
    topic: list[str] = typer.Option(None, "--topic", help="only these topics (repeatable)"),
    master: str = typer.Option(None, help="Spark master (default local[2])"),
) -> None:
    """Per topic and queue: messages, bytes, first/last store time, rate, producer hosts;
    printed as a table and written as Parquet, with the rate over time plotted as PNG."""
    from ..spark.jobs import stats

    spark = _spark("trio-ha spark stats", master)
    options = {"topics": ",".join(topic)} if topic else None
    result = stats(spark, store_dirs, out=out, bucket_seconds=bucket, options=options)
    print(result.table())
    for name, path in result.files.items():
        print(f"{name}: {path}")


@spark_app.command("audit")
def spark_audit(
    master_dir: str = typer.Argument(..., help="the master's store directory"),
    slave_dir: str = typer.Argument(..., help="the slave's store directory"),
    range_mb: int = typer.Option(64, min=1, help="checksum range size in MiB"),
    master: str = typer.Option(None, help="Spark master (default local[2])"),
) -> None:
    """Prove the slave's commitlog is a byte prefix of the master's (per-segment and
    per-range checksums compared in Spark). Prints a JSON report; exit status 1 when it is
    not a prefix, naming the first differing offset."""
    from ..spark.jobs import audit

    spark = _spark("trio-ha spark audit", master)
    report = audit(spark, master_dir, slave_dir, range_bytes=range_mb << 20)
    print(json.dumps(report.as_dict(), indent=2))
    print(report.reason, file=sys.stderr)
    if not report.prefix:
        raise typer.Exit(1)


@spark_app.command("export")
def spark_export(
    store_dir: str = typer.Argument(..., help="store directory"),
    to: str = typer.Option(..., "--to", help="output directory"),
    format: str = typer.Option("parquet", "--format", help="parquet or json"),
    topic: list[str] = typer.Option(None, "--topic", help="only these topics (repeatable)"),
    since: str = typer.Option(None, help="store time lower bound (epoch ms or ISO 8601)"),
    checkpoint: str = typer.Option(None, help="checkpoint directory (default TO/_checkpoint)"),
    max_bytes_per_trigger: str = typer.Option(None, help="micro-batch size limit, e.g. 256m"),
    master: str = typer.Option(None, help="Spark master (default local[2])"),
) -> None:
    """Incremental export: a streaming query with a checkpoint, trigger available-now. Run
    it again to pick up where it stopped."""
    from ..spark.jobs import export

    if format not in ("parquet", "json"):
        raise typer.BadParameter("--format must be parquet or json")
    spark = _spark("trio-ha spark export", master)
    result = export(spark, store_dir, to, fmt=format, topics=topic or None, since=since,
                    checkpoint=checkpoint, max_bytes_per_trigger=max_bytes_per_trigger)
    print(json.dumps(result.as_dict()))
