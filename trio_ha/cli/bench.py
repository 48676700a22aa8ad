"""``trio-ha bench ...``: the hot paths measured against this machine's limits."""

from __future__ import annotations

import json
import sys

import typer

from ._app import app, print_json_lines

bench_app = typer.Typer(
    no_args_is_help=True, help="Measure the hot paths against this machine's limits."
)
app.add_typer(bench_app, name="bench")


@bench_app.command("store")
def bench_store(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """Appends (single, batch), SYNC_FLUSH group commit and recovery scan rates, each next
    to this machine's limit measured in the same run. One JSON object per line."""
    from ..bench.store import run_store_benchmarks

    print_json_lines(run_store_benchmarks(dir, quick=quick))


@bench_app.command("replication")
def bench_replication(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """Slave catch-up throughput (32 KiB and 1 MiB frames) next to raw loopback transfer of
    a mapped file, and SYNC_MASTER put latency next to the loopback round trip."""
    from ..bench.replication import run_replication_benchmarks

    print_json_lines(run_replication_benchmarks(dir, quick=quick))


@bench_app.command("produce")
def bench_produce(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """1 KiB sends (single and batches of 32; 1 and 16 producers) to an ASYNC_MASTER and a
    SYNC_MASTER, each with a slave, in child processes; rates and p50/p99 latency next to
    the loopback round trip. One JSON object per line."""
    from ..bench.produce import run_produce_benchmarks

    print_json_lines(run_produce_benchmarks(dir, quick=quick))


@bench_app.command("restarts")
def bench_restarts(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """4 producers on a SYNC_MASTER (SYNC_FLUSH) + slave while the master is SIGKILLed and
    restarted 10 times: every answer by status, the share that said SLAVE_NOT_AVAILABLE (the
    slave not attached again yet), and how soon after each restart sends are SEND_OK again.
    One JSON object per line."""
    from ..bench.restarts import run_restart_benchmark

    print_json_lines(run_restart_benchmark(dir, quick=quick))


@bench_app.command("consume")
def bench_consume(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="smaller runs, for a smoke test"),
) -> None:
    """Pull rate (32 per pull, 4 queues concurrently) from a preloaded SYNC_MASTER and from
    its slave, in child processes, next to the loopback round trip. One JSON object per
    line."""
    from ..bench.consume import run_consume_benchmarks

    print_json_lines(run_consume_benchmarks(dir, quick=quick))


@bench_app.command("controller")
def bench_controller(
    dir: str = typer.Option(None, help="scratch directory (a temporary one by default)"),
    quick: bool = typer.Option(False, help="10 groups and short phases, for a smoke test"),
    store: str = typer.Option("journal", help="journal (one controller) or etcd (two "
                                              "controllers over a 3-member etcd cluster)"),
) -> None:
    """Our controller (a `trio-ha controller` child process) under 100 simulated broker
    groups of 3: heartbeats per second held at the broker interval and at ten times it, their
    answer latency, members shown dead or elections while all heartbeat, the controller's CPU
    per heartbeat, and the election time when 1 or 10 masters die or go silent at once. One
    JSON object per line."""
    from ..bench.controller import STORES, run_controller_benchmarks

    if store not in STORES:
        raise typer.BadParameter(f"one of {', '.join(STORES)}", param_hint="--store")
    print_json_lines(run_controller_benchmarks(dir, quick=quick, store=store))


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
    from ..bench.versus_rocketmq import format_table, run_versus_benchmarks

    rows = []
    for row in run_versus_benchmarks(dir, quick=quick, flush_types=tuple(flush)):
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(format_table(rows), file=sys.stderr, flush=True)



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
    from ..bench.spark import run_spark_benchmarks

    print_json_lines(run_spark_benchmarks(dir, size_gib=size_gib, passes=passes, master=master))
