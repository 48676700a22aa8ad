"""The ``trio-ha`` command line."""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import trio
import typer

from . import _backend
from .config import FlushDiskType, StoreConfig
from .store import open_store
from .wire.record import Message

if TYPE_CHECKING:  # pyspark is imported by the spark commands only
    from pyspark.sql import SparkSession

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__,
                  context_settings={"help_option_names": ["-h", "--help"]})


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        print(f"trio-ha {__version__} (record engine: {_backend.native_backend})")
        raise typer.Exit()


#: show the traceback of an expected failure too (``--debug``)
_DEBUG = False


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print the version and exit"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks of expected failures"),
) -> None:
    """The ``trio-ha`` command line."""
    global _DEBUG
    _DEBUG = debug


def _leaves(exc: BaseException) -> Iterable[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _expected_failure(exc: BaseException) -> str | None:
    """The one line to print for a failure an operator causes and can fix (a store in use, a
    port taken, no room or no permission, a bad setting), or None for anything else."""
    from .config import ConfigError
    from .store import StoreLockedError

    for leaf in _leaves(exc):
        if isinstance(leaf, (StoreLockedError, ConfigError)):
            return str(leaf)
        if isinstance(leaf, OSError) and leaf.errno in _OPERATOR_ERRNOS:
            if leaf.filename is not None:
                return f"{leaf.strerror}: {leaf.filename}"
            return leaf.strerror or str(leaf)
    return None
bench_app = typer.Typer(
    no_args_is_help=True, help="Measure the hot paths against this machine's limits."
)
app.add_typer(bench_app, name="bench")

DEFAULT_DATA_DIR = os.path.join(os.getcwd(), "data")
#: errnos of failures an operator fixes (a port taken, no room, no permission, read-only)
_OPERATOR_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES, errno.EPERM,
                              errno.ENOSPC, errno.EROFS, errno.EMFILE, errno.ENOENT,
                              errno.ENOTDIR})


async def _demo(root: str, count: int) -> None:
    config = StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=1024 * 1024,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
    )
    print(f"trio-ha store demo  (record engine: {_backend.native_backend}, store: {root})")
    async with open_store(config) as store:
        report = store.recovery
        assert report is not None  # an open store has recovered
        print(f"opened: recovery {'after a crash' if report.abnormal else 'after a clean stop'}, "
              f"log ends at {report.end_offset} ({report.records} records verified)")
        before = store.max_queue_offset("DemoTopic", 0)
        started = time.perf_counter()
        results = []
        for i in range(count):
            body = f"hello #{before + i} from trio-ha".encode()
            results.append(await store.put_message(
                Message("DemoTopic", body, tags="demo", keys=f"key-{before + i}"), queue_id=0
            ))
        elapsed = time.perf_counter() - started
        statuses = {r.status.name for r in results}
        print(f"put {count} messages with SYNC_FLUSH in {elapsed * 1000:.1f} ms: {statuses}; "
              f"first msgId {results[0].msg_id}")
    print("closed cleanly; reopening to read back ...")
    async with open_store(config) as store:
        total = store.max_queue_offset("DemoTopic", 0)
        messages = await store.get_messages("DemoTopic", 0, max(0, total - 3), 3)
        for m in messages:
            print(f"  queue offset {m.queue_offset} @ commitlog {m.commitlog_offset}: "
                  f"{m.body.decode()!r} tags={m.tags} keys={m.keys} crc_ok={m.crc_ok}")
        print(f"DemoTopic/0 holds {total} messages; commitlog "
              f"[{store.min_commitlog_offset}, {store.max_commitlog_offset})")


@app.command("store-demo")
def store_demo(
    dir: str = typer.Option(os.path.join(DEFAULT_DATA_DIR, "demo-store"), help="store directory"),
    count: int = typer.Option(1000, min=1, max=1_000_000, help="messages to put"),
) -> None:
    """Put messages into an embedded store, close it, reopen it and read them back."""
    trio.run(_demo, dir, count)


@app.command()
def namesrv(
    port: int = typer.Option(9876, help="listen port (RocketMQ's default 9876)"),
    bind: str = typer.Option("0.0.0.0", help="interface to bind"),
) -> None:
    """Run a name server until Ctrl-C."""
    from .namesrv import NamesrvConfig, serve_namesrv

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            host, bound = await nursery.start(
                serve_namesrv, NamesrvConfig(listen_port=port, bind_address=bind)
            )
            print(f"name server listening on {host}:{bound}", flush=True)

    _run_until_interrupted(main)


#: the keys ``-m`` prints (RocketMQ's "important" configuration, and ours)
_IMPORTANT_KEYS = (
    "brokerClusterName", "brokerName", "brokerId", "brokerRole", "flushDiskType",
    "namesrvAddr", "brokerIP1", "listenPort", "haListenPort", "storePathRootDir",
    "mappedFileSizeCommitLog",
)


@app.command()
def broker(
    config_file: str = typer.Option(..., "-c", "--config", help="RocketMQ broker.conf"),
    namesrv_addr: str | None = typer.Option(
        None, "-n", "--namesrv-addr",
        help="name servers, 'host:port;host:port' (wins over the file's namesrvAddr, which "
             "wins over $NAMESRV_ADDR)"),
    print_config: bool = typer.Option(False, "-p", "--print-config",
                                      help="print every setting and exit"),
    print_important: bool = typer.Option(False, "-m", "--print-important",
                                         help="print the main settings and exit"),
) -> None:
    """Run a broker (store, replication, remoting) from a RocketMQ-style broker.conf."""
    from .broker import BrokerConfig, serve_broker
    from .config import ConfigError, parse_properties_text

    try:
        with open(config_file) as f:
            text = f.read()
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {config_file}: {exc.strerror}",
                                 param_hint="--config") from None
    try:
        properties = parse_properties_text(text)
        if namesrv_addr is not None:
            properties["namesrvAddr"] = namesrv_addr
        elif "namesrvAddr" not in properties and os.environ.get("NAMESRV_ADDR"):
            properties["namesrvAddr"] = os.environ["NAMESRV_ADDR"]
        config = BrokerConfig.from_properties(properties)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    if print_config or print_important:
        settings = config.to_properties()
        for key in sorted(settings) if print_config else _IMPORTANT_KEYS:
            if key in settings:
                print(f"{key}={settings[key]}")
        raise typer.Exit()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(serve_broker, config)
            print(f"broker {config.broker_name} ({config.role.value}) serving on "
                  f"{addresses.broker_addr}, HA {addresses.ha_addr}", flush=True)

    _run_until_interrupted(main)


async def _runtime_info(pool, address: str) -> dict[str, str]:
    from .remoting import RemotingError
    from .wire.remoting import RemotingCommand, RequestCode
    from .wire.route import KVTable

    try:
        request = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        reply = await pool.invoke(address, request, 2)
        return KVTable.decode(reply.body).table
    except (RemotingError, ValueError):
        return {}


def _status_line(master: dict, slave: dict) -> str:
    master_end = int(master.get("commitLogMaxOffset", 0) or 0)
    slave_end = int(slave.get("commitLogMaxOffset", 0) or 0)
    return (
        f"master: log {master_end} B, {master.get('putTps', '0')} puts/s, "
        f"{master.get('msgPutTotalTodayNow', '0')} puts | slave: log {slave_end} B, "
        f"lag {max(0, master_end - slave_end)} B, HA {slave.get('haState', '?')}"
    )


@app.command("dev-cluster")
def dev_cluster(
    dir: str = typer.Option(os.path.join(DEFAULT_DATA_DIR, "dev-cluster"), help="data directory"),
    namesrv_port: int = typer.Option(9876, help="name server port"),
    master_port: int = typer.Option(10911, help="master broker port (HA on +1, VIP on -2)"),
    slave_port: int = typer.Option(10921, help="slave broker port"),
    demo: bool = typer.Option(False, help="run a produce/consume round trip first"),
    duration: float = typer.Option(0, help="stop after this many seconds (0: run until Ctrl-C)"),
) -> None:
    """A name server, a SYNC_MASTER and its SLAVE on loopback, with a status line."""
    from .devcluster import serve_dev_cluster
    from .remoting import open_client_pool

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cluster = await nursery.start(lambda task_status: serve_dev_cluster(
                dir, namesrv_port=namesrv_port, master_port=master_port,
                slave_port=slave_port, task_status=task_status))
            print(f"name server  {cluster.namesrv_addr}", flush=True)
            print(f"SYNC_MASTER  {cluster.master.broker_addr}  (HA {cluster.master.ha_addr})")
            print(f"SLAVE        {cluster.slave.broker_addr}  (HA {cluster.slave.ha_addr})")
            print(f"data under   {dir}", flush=True)
            if demo:
                from .demo import round_trip

                await round_trip(cluster)
            async with open_client_pool() as pool:
                with trio.move_on_after(duration if duration > 0 else float("inf")):
                    while True:
                        master = await _runtime_info(pool, cluster.master.broker_addr)
                        slave = await _runtime_info(pool, cluster.slave.broker_addr)
                        end = "\n" if not sys.stdout.isatty() else "\r"
                        print(_status_line(master, slave), end=end, flush=True)
                        await trio.sleep(1)
            nursery.cancel_scope.cancel()
        print("\ncluster stopped cleanly", flush=True)

    _run_until_interrupted(main)


def _print_json_lines(results: Iterable[dict[str, Any]]) -> None:
    """A benchmark's results, one JSON object per line, each as soon as it is measured."""
    for result in results:
        print(json.dumps(result), flush=True)


def _run_until_interrupted(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` until SIGINT/SIGTERM, then let it shut down gracefully."""

    async def runner() -> None:
        async with trio.open_nursery() as nursery:

            async def run_main() -> None:
                await main()
                nursery.cancel_scope.cancel()

            nursery.start_soon(run_main)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    print("shutting down ...", flush=True)
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(runner)
    except BaseException as exc:  # a failure to start, or one while serving
        line = None if _DEBUG or isinstance(exc, KeyboardInterrupt) else _expected_failure(exc)
        if line is None:
            raise
        print(f"trio-ha: {line}", file=sys.stderr)
        raise typer.Exit(1) from None


@bench_app.command("store")
def bench_store(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """Appends (single, batch), SYNC_FLUSH group commit and recovery scan rates, each next
    to this machine's limit measured in the same run. One JSON object per line."""
    from .bench.store import run_store_benchmarks

    _print_json_lines(run_store_benchmarks(dir, quick=quick))


@bench_app.command("replication")
def bench_replication(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """Slave catch-up throughput (32 KiB and 1 MiB frames) next to raw loopback transfer of
    a mapped file, and SYNC_MASTER put latency next to the loopback round trip."""
    from .bench.replication import run_replication_benchmarks

    _print_json_lines(run_replication_benchmarks(dir, quick=quick))


@bench_app.command("produce")
def bench_produce(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """1 KiB sends (single and batches of 32; 1 and 16 producers) to an ASYNC_MASTER and a
    SYNC_MASTER, each with a slave, in child processes; rates and p50/p99 latency next to
    the loopback round trip. One JSON object per line."""
    from .bench.produce import run_produce_benchmarks

    _print_json_lines(run_produce_benchmarks(dir, quick=quick))


@bench_app.command("restarts")
def bench_restarts(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """4 producers on a SYNC_MASTER (SYNC_FLUSH) + slave while the master is SIGKILLed and
    restarted 10 times: every answer by status, the share that said SLAVE_NOT_AVAILABLE (the
    slave not attached again yet), and how soon after each restart sends are SEND_OK again.
    One JSON object per line."""
    from .bench.restarts import run_restart_benchmark

    _print_json_lines(run_restart_benchmark(dir, quick=quick))


@bench_app.command("consume")
def bench_consume(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """Pull rate (32 per pull, 4 queues concurrently) from a preloaded SYNC_MASTER and from
    its slave, in child processes, next to the loopback round trip. One JSON object per
    line."""
    from .bench.consume import run_consume_benchmarks

    _print_json_lines(run_consume_benchmarks(dir, quick=quick))


@bench_app.command("versus-rocketmq")
def bench_versus_rocketmq(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
    flush: list[str] = typer.Option(
        ["SYNC_FLUSH", "ASYNC_FLUSH"], help="flushDiskType(s) to run (repeat the option)"),
) -> None:
    """One Java load generator against a real RocketMQ 4.9.7 cluster and against ours
    (name server, SYNC_MASTER, SLAVE each): single sends from 1 and 16 threads, batches of
    32, pulls from master and slave; each rate next to RocketMQ's with the ratio, latency and
    CPU per message. JSON lines, then the table (on stderr). Needs java, javac and mvn."""
    from .bench.versus_rocketmq import format_table, run_versus_benchmarks

    rows = []
    for row in run_versus_benchmarks(dir, quick=quick, flush_types=tuple(flush)):
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(format_table(rows), file=sys.stderr, flush=True)


# ---- Spark (needs the spark extra: pip install trio-ha[spark]) ----------------------------

spark_app = typer.Typer(
    no_args_is_help=True,
    help="Spark jobs over store directories (local Spark session; needs the spark extra).",
)
app.add_typer(spark_app, name="spark")


def _spark(app_name: str, master: str | None) -> SparkSession:
    from .spark import spark_session

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
    from .spark.jobs import stats

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
    from .spark.jobs import audit

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
    from .spark.jobs import export

    if format not in ("parquet", "json"):
        raise typer.BadParameter("--format must be parquet or json")
    spark = _spark("trio-ha spark export", master)
    result = export(spark, store_dir, to, fmt=format, topics=topic or None, since=since,
                    checkpoint=checkpoint, max_bytes_per_trigger=max_bytes_per_trigger)
    print(json.dumps(result.as_dict()))


@bench_app.command("spark")
def bench_spark(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default; an "
                                       "existing store there is reused)"),
    size_gib: float = typer.Option(2.0, min=0.01, help="store size in GiB"),
    passes: int = typer.Option(3, min=1, help="timed passes per read (best counts)"),
    master: str = typer.Option("local[2]", help="Spark master"),
) -> None:
    """Spark reading a store of 1 KiB messages (rows/s, MB/s) next to the raw sequential
    read of the same files and to Spark reading the same rows from Parquet. One JSON object
    per line."""
    from .bench.spark import run_spark_benchmarks

    _print_json_lines(run_spark_benchmarks(dir, size_gib=size_gib, passes=passes, master=master))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
