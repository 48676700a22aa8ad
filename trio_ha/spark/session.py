"""A local Spark session set up for this project's machines, with ``trio_ha`` registered."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark_session", "register"]


def register(spark: SparkSession, *, pushdown: bool = True) -> None:
    """Register the ``trio_ha`` format with ``spark`` (idempotent). With ``pushdown`` (the
    default) Spark filters on topic, queue_id, commitlog_offset and store_timestamp reach the
    reader; this sets ``spark.sql.python.filterPushdown.enabled=true`` for the session."""
    from .source import TrioHaDataSource, TrioHaPushdownDataSource

    if pushdown:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
        spark.dataSource.register(TrioHaPushdownDataSource)
    else:
        spark.dataSource.register(TrioHaDataSource)


def spark_session(
    app_name: str = "trio-ha",
    master: str | None = None,
    *,
    driver_memory: str = "4g",
    progress: bool = True,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """``SparkSession.builder...getOrCreate()`` with what a local session needs here:

    * Spark binds to the machine's external address unless told otherwise, so
      ``SPARK_LOCAL_IP``, the driver host and the bind address are all 127.0.0.1;
    * the Python workers run this interpreter (``PYSPARK_PYTHON``), so they import the same
      trio_ha and native module;
    * the session time zone is UTC (timestamps print as stored: epoch milliseconds);
    * the web UI is off (no port to collide on) but the console progress bar is on, so long
      jobs show their stages;
    * Arrow's per-access bounds and null checks are off in the JVM
      (``arrow.enable_unsafe_memory_access``): Spark turns every Arrow batch a Python data
      source yields into rows, and those checks were a large part of that cost.

    ``master`` defaults to ``$TRIO_HA_SPARK_MASTER`` or ``local[2]``. Starting the JVM takes
    about ten seconds; later calls return the same session.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    master = master or os.environ.get("TRIO_HA_SPARK_MASTER") or "local[2]"
    java_options = ("-Darrow.enable_unsafe_memory_access=true "
                    "-Darrow.enable_null_check_for_get=false")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true" if progress else "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", java_options)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
