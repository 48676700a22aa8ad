"""The measured parts of ``trio-ha bench replication``: a master store filled, fresh slaves
catching up with it, a SYNC_MASTER acknowledging producers.

Each slave runs either in this process (the embedded case: one event loop and one GIL for
both sides) or in a child process (the real deployment: ``python -m
trio_ha.bench.replication_runs catchup-slave|follow-slave JSON``, which prints its figures as
one JSON line). :mod:`trio_ha.bench.replication` runs these in order and reads them against
the machine's limits.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import attrs
import trio

from ..config import BrokerRole, FlushDiskType, StoreConfig
from ..store import MessageStore, open_store
from ..testing.processes import child_env, log_tail
from ..wire.layout import segment_file_name
from .harness import (
    MB,
    WARM_SEGMENTS,
    GiB,
    MiB,
    Plan,
    RunState,
    drive_puts,
    latency_us,
    make_put,
    median_run,
    poll_until,
    wait_spare_segment,
)
from .loopback import child_command

PRODUCERS = (1, 16)
BODY_SIZE = 1024


@attrs.define(kw_only=True)
class ReplicationPlan(Plan):
    """How much work each part does. ``quick`` is for a smoke test (well under 30 s)."""

    segment_size: int
    catchup_bytes: int
    raw_bytes: int
    raw_passes: int
    rtt_count: int
    rtt_seconds: float
    sync_seconds: float
    sync_warmup_seconds: float
    catchup_passes: int
    memcpy_map: int
    memcpy_bytes: int
    sync_max_puts: int = 5_000_000

    @classmethod
    def make(cls, quick: bool) -> ReplicationPlan:
        if quick:
            return cls(quick=True, segment_size=32 * MiB, catchup_bytes=100 * MiB,
                       raw_bytes=100 * MiB, raw_passes=1, rtt_count=3000, rtt_seconds=0.3,
                       sync_seconds=1.0, sync_warmup_seconds=0.1, catchup_passes=1,
                       memcpy_map=64 * MiB, memcpy_bytes=256 * MiB)
        return cls(quick=False, segment_size=256 * MiB, catchup_bytes=GiB, raw_bytes=GiB,
                   raw_passes=3, rtt_count=50_000, rtt_seconds=2.0, sync_seconds=3.0,
                   sync_warmup_seconds=0.3, catchup_passes=3, memcpy_map=256 * MiB,
                   memcpy_bytes=GiB)

    @property
    def catchup_timeout(self) -> float:
        """Give up on a catch-up below 5 MB/s (a failure, reported as such)."""
        return max(30.0, self.catchup_bytes / (5 * MB))

    def fit_disk(self, free: int) -> None:
        """Master + one slave + the raw scratch file must stay below half the free space."""
        budget = free // 2
        needed = 2 * (self.catchup_bytes + 2 * self.segment_size) + self.raw_bytes
        if needed > budget:
            self.scaled_for_disk = True
            scale = budget / needed
            self.catchup_bytes = max(16 * MiB, int(self.catchup_bytes * scale))
            self.raw_bytes = max(16 * MiB, int(self.raw_bytes * scale))


# ---- stores ---------------------------------------------------------------------------------


def master_config(root: str, plan: ReplicationPlan, role: BrokerRole,
                  **overrides) -> StoreConfig:
    config = StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=plan.segment_size,
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        broker_role=role,
        ha_listen_port=0,
        ha_bind_address="127.0.0.1",
        ha_start_from_min_offset=True,
        warm_mapped_file_enable=WARM_SEGMENTS,
    )
    return attrs.evolve(config, **overrides)


def slave_config(root: str, segment_size: int, master_address: str) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=segment_size,
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        broker_role=BrokerRole.SLAVE,
        ha_master_address=master_address,
        ha_reconnect_interval=100,
    )


def _address(store) -> str:
    host, port = store.ha_address
    return f"{host}:{port}"


async def fill_master(config: StoreConfig, target_bytes: int, seconds: float) -> dict:
    """Append 64 x 1 KiB batches until the log holds ``target_bytes`` (bounded by time)."""
    async with open_store(config) as store:
        put, per_put = make_put(store, "put_batch", BODY_SIZE)
        commitlog = store.commitlog
        batches = failed = 0
        started = time.perf_counter()
        deadline = started + seconds
        while commitlog.max_offset < target_bytes and time.perf_counter() < deadline:
            result = await put(batches % 8)
            if result.status.name == "PUT_OK":
                batches += 1
            else:
                failed += 1
                if failed > 100:
                    break
        elapsed = time.perf_counter() - started
        await store.wait_dispatched()
        await store.flush()
        return {
            "bytes": commitlog.max_offset - commitlog.min_offset,
            "min_offset": commitlog.min_offset,
            "max_offset": commitlog.max_offset,
            "messages": batches * per_put,
            "failures": failed,
            "seconds": elapsed,
            "mb_per_s": (commitlog.max_offset - commitlog.min_offset) / elapsed / MB,
            "segments": store.statistics().segments,
        }


def _compare_logs(master_dir: str, slave_dir: str, start: int, end: int,
                  segment_size: int) -> tuple[bool, int, str | None]:
    """Byte-compare ``[start, end)`` of two commitlog directories (blocking). Returns
    (identical, bytes compared, first difference or None)."""
    compared = 0
    chunk = 8 * MiB
    base = start - start % segment_size
    while base < end:
        name = segment_file_name(base)
        m_path, s_path = os.path.join(master_dir, name), os.path.join(slave_dir, name)
        if not os.path.exists(s_path):
            return False, compared, f"slave has no segment {name}"
        lo = max(start, base) - base
        hi = min(end, base + segment_size) - base
        with open(m_path, "rb", buffering=0) as mf, open(s_path, "rb", buffering=0) as sf:
            pos = lo
            while pos < hi:
                n = min(chunk, hi - pos)
                a, b = os.pread(mf.fileno(), n, pos), os.pread(sf.fileno(), n, pos)
                if a != b:
                    return False, compared, f"bytes differ in segment {name} at [{pos}, {pos + n})"
                compared += n
                pos += n
        base += segment_size
    return True, compared, None


# ---- catch-up -------------------------------------------------------------------------------


async def _catchup_slave(config: StoreConfig, end: int, timeout: float) -> dict:
    """Open a fresh slave, wait until it holds the log up to ``end``. Runs in whichever process
    calls it (the master's, or a child's)."""
    cpu0 = time.process_time()
    started = time.perf_counter()
    wall0 = time.time()
    done = False
    marks: dict[str, float] = {}

    async def mark(name: str, offset: int) -> None:
        await written.wait_for(offset)
        marks[name] = time.perf_counter() - started

    async with open_store(config) as slave:
        opened = time.perf_counter()
        written = slave.commitlog.written
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                # Progress marks: the first byte (a fresh slave first creates and warms its
                # first segment), and 10% / 90% of the log for a steady-state rate.
                nursery.start_soon(mark, "first_byte", 1)
                nursery.start_soon(mark, "p10", end // 10)
                nursery.start_soon(mark, "p90", end * 9 // 10)
                await written.wait_for(end)
                done = True
        finished = time.perf_counter()
        cpu = time.process_time() - cpu0
        stats = slave.statistics()
        ha = stats.ha_slave
        assert ha is not None  # a slave store runs its HA client
        return {
            "caught_up": done,
            "seconds": finished - started,
            "open_seconds": opened - started,
            "connect_seconds": (ha.connected_since - wall0) if ha.connected_since else None,
            "first_byte_seconds": marks.get("first_byte"),
            "steady_mb_per_s": ((end * 9 // 10 - end // 10) / (marks["p90"] - marks["p10"]) / MB
                                if "p10" in marks and "p90" in marks
                                and marks["p90"] > marks["p10"] else None),
            "slave_min_offset": stats.min_commitlog_offset,
            "slave_max_offset": stats.max_commitlog_offset,
            "bytes_received": ha.bytes_received,
            "slave_state": ha.state,
            "slave_last_error": ha.last_error,
            "slave_divergence": ha.divergence,
            "slave_segments": stats.segments,
            "slave_cpu_seconds": cpu,
            "slave_dispatch_behind_bytes": stats.dispatch_behind_bytes,
        }


def _catchup_child_main(args: dict) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    config = slave_config(args["root"], args["segment_size"], args["master"])
    result = trio.run(_catchup_slave, config, args["end"], args["timeout"])
    print(json.dumps(result), flush=True)


async def run_catchups(config: StoreConfig, plan: ReplicationPlan, base: str,
                       expected_end: int, placements: tuple[str, ...],
                       passes: int) -> list[dict]:
    """Open the master with ``config``; ``passes`` times, for each placement, copy it to a
    fresh slave."""
    results = []
    async with open_store(config) as master:
        # the master's allocator is idle before the clock starts
        await wait_spare_segment(master, 60)
        commitlog = master.commitlog
        start, end = commitlog.min_offset, commitlog.max_offset
        address = _address(master)
        runs = [(index, placement) for index in range(passes) for placement in placements]
        for index, placement in runs:
            slave_root = os.path.join(base, f"slave-{placement}")
            shutil.rmtree(slave_root, ignore_errors=True)
            gc.collect()
            master_cpu0 = time.process_time()
            error = None
            figures: dict = {}
            seen: dict[object, Any] = {}
            try:
                async with trio.open_nursery() as nursery:
                    # Keep the master's connection objects: a child slave's connection is
                    # gone from the table by the time the child has exited.
                    nursery.start_soon(_collect_connections, master, seen)
                    if placement == "in_process":
                        figures = await _catchup_slave(
                            slave_config(slave_root, plan.segment_size, address), end,
                            plan.catchup_timeout,
                        )
                    else:
                        figures, error = await _run_child_catchup(
                            base, slave_root, plan, address, end
                        )
                    nursery.cancel_scope.cancel()
            except Exception as exc:  # reported, not raised: the next run still runs
                error = f"{type(exc).__name__}: {exc}"
            master_cpu = time.process_time() - master_cpu0
            bytes_sent = max((c.bytes_sent for c in seen.values()), default=None)
            identical, compared, difference = await trio.to_thread.run_sync(
                _compare_logs, config.commitlog_dir, os.path.join(slave_root, "commitlog"),
                start, end, plan.segment_size,
            )
            copied = figures.get("slave_max_offset", 0) - figures.get("slave_min_offset", 0)
            failures = sum([
                error is not None,
                end != expected_end,
                not figures.get("caught_up", False),
                figures.get("slave_last_error") is not None,
                figures.get("slave_divergence") is not None,
                not identical,
            ])
            results.append({
                "placement": placement, "pass": index, "master_bytes": end - start,
                "master_max_offset": end, "bytes_copied": copied,
                "identical": identical, "compared_bytes": compared, "difference": difference,
                "failures": failures, "error": error,
                "master_bytes_sent": bytes_sent,
                # In-process, the master's CPU time includes the slave's (one process).
                "master_process_cpu_seconds": master_cpu,
                **figures,
            })
            shutil.rmtree(slave_root, ignore_errors=True)
            # Let the master drop the connection to the closed slave before the next run.
            with trio.move_on_after(5):
                await poll_until(lambda: _no_connections(master), interval=0.01)
    return results


def with_rate(run: dict) -> dict:
    seconds = run.get("seconds") or 0.0
    ok = bool(seconds) and run.get("caught_up", False)
    open_seconds = run.get("open_seconds") or 0.0
    return {
        "mb_per_s": run["bytes_copied"] / seconds / MB if ok else 0.0,
        "transfer_mb_per_s": (run["bytes_copied"] / (seconds - open_seconds) / MB
                              if ok and seconds > open_seconds else None),
        **run,
    }


def median_catchup_pass(runs: list[dict]) -> dict:
    """The pass with the median rate among those without failures (the lower middle of an
    even count; the first pass if all failed) with the spread of their rates, every pass's
    rate and the failures of all passes. The limits it is compared with stay the
    best of their passes: a limit is what the machine can do, a run what we usually get."""
    runs = [with_rate(r) for r in runs]
    clean = [r for r in runs if r["failures"] == 0]
    middle, spread = median_run(clean or runs[:1], "mb_per_s")
    figure = dict(middle)
    figure["passes_mb_per_s"] = [r["mb_per_s"] for r in runs]
    figure["spread_mb_per_s"] = spread
    figure["failures"] = sum(r["failures"] for r in runs)
    figure["identical"] = all(r["identical"] for r in runs)
    figure["errors"] = [r["error"] for r in runs if r["error"]] or None
    return figure


def _no_connections(master: MessageStore) -> bool:
    ha = master.statistics().ha
    return ha is None or not ha.connections


async def _collect_connections(master, seen: dict) -> None:
    connections = master.ha_service.connections
    while True:
        seen.update(connections)
        await trio.sleep(0.005)


async def _run_child_catchup(base: str, slave_root: str, plan: ReplicationPlan, address: str,
                             end: int) -> tuple[dict, str | None]:
    out_path = os.path.join(base, "logs", "catchup-slave.stdout")
    err_path = os.path.join(base, "logs", "catchup-slave.stderr")
    command = child_command(
        "trio_ha.bench.replication_runs", "catchup-slave", root=slave_root, master=address,
        segment_size=plan.segment_size,
        end=end, timeout=plan.catchup_timeout,
    )
    proc = None
    async with await trio.open_file(out_path, "wb") as out, \
            await trio.open_file(err_path, "wb") as err:
        with trio.move_on_after(plan.catchup_timeout + 60):
            proc = await trio.run_process(command, stdout=out.wrapped, stderr=err.wrapped,
                                          check=False, env=child_env())
    if proc is None:
        return {}, "the slave process did not finish in time (killed)"
    lines = await _output_lines(out_path)
    if proc.returncode != 0 or not lines:
        return {}, (f"slave process exited with {proc.returncode}: "
                    f"{log_tail(err_path)}")
    return json.loads(lines[-1]), None


async def _output_lines(path: str) -> list[bytes]:
    """The non-blank lines a child wrote to ``path``."""
    data = await trio.Path(path).read_bytes()
    return [line for line in data.splitlines() if line.strip()]


# ---- SYNC_MASTER latency ----------------------------------------------------------------------


async def _follow_slave(config: StoreConfig, max_seconds: float) -> None:
    """Child: replicate until stdin closes (or ``max_seconds``), then report."""
    started = time.perf_counter()
    async with open_store(config) as slave:
        stdin = trio.lowlevel.FdStream(os.dup(0))
        async with stdin:
            with trio.move_on_after(max_seconds):
                while await stdin.receive_some(4096):
                    pass
        stats = slave.statistics()
        ha = stats.ha_slave
        assert ha is not None  # a slave store runs its HA client
        print(json.dumps({
            "seconds": time.perf_counter() - started,
            "slave_max_offset": stats.max_commitlog_offset,
            "bytes_received": ha.bytes_received,
            "slave_state": ha.state,
            "slave_last_error": ha.last_error,
            "cpu_seconds": time.process_time(),
        }), flush=True)


def _follow_child_main(args: dict) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    config = slave_config(args["root"], args["segment_size"], args["master"])
    trio.run(_follow_slave, config, args["max_seconds"])


async def _wait_for_ack(master, timeout: float) -> bool:
    def acked() -> bool:
        ha = master.statistics().ha
        return ha is not None and any(c.acked_offset is not None for c in ha.connections)

    with trio.move_on_after(timeout):
        await poll_until(acked, interval=0.005)
        return True
    return False


async def _producer_runs(master, plan: ReplicationPlan) -> list[dict]:
    put, per_put = make_put(master, "put_message", BODY_SIZE)
    warm = RunState(plan.sync_max_puts, time.perf_counter() + plan.sync_warmup_seconds)
    await drive_puts(put, per_put, max(PRODUCERS), warm, False)
    results = []
    for producers in PRODUCERS:
        gc.collect()
        start_offset = master.commitlog.max_offset
        cpu0 = time.process_time()
        state = RunState(plan.sync_max_puts, 0.0)
        started = time.perf_counter()
        state.deadline = started + plan.sync_seconds
        await drive_puts(put, per_put, producers, state, True)
        elapsed = time.perf_counter() - started
        results.append({
            "producers": producers, "puts": state.ok, "failures": state.failed,
            "failure_statuses": state.statuses or None, "seconds": elapsed,
            "puts_per_s": state.ok / elapsed,
            "mb_per_s": state.ok * BODY_SIZE / elapsed / MB,
            "record_bytes": master.commitlog.max_offset - start_offset,
            "master_process_cpu_seconds": time.process_time() - cpu0,
            "latency_us": latency_us(state.latencies),
            "warmup_puts": warm.ok, "warmup_failures": warm.failed,
        })
    return results


async def sync_master_run(base: str, plan: ReplicationPlan,
                          placement: str) -> tuple[list[dict], dict]:
    root = os.path.join(base, f"sync-master-{placement}")
    slave_root = os.path.join(base, f"sync-slave-{placement}")
    config = master_config(root, plan, BrokerRole.SYNC_MASTER)
    info: dict = {"placement": placement}
    async with open_store(config) as master:
        service = master.ha_service
        assert service is not None  # a master with ha_listen_port set
        await wait_spare_segment(master, 60)
        follower = slave_config(slave_root, plan.segment_size, _address(master))
        if placement == "in_process":
            async with open_store(follower) as slave:
                info["slave_connected"] = await _wait_for_ack(master, 30)
                results = await _producer_runs(master, plan)
                with trio.move_on_after(10):
                    await slave.commitlog.written.wait_for(master.commitlog.max_offset)
                info["slave_max_offset"] = slave.commitlog.max_offset
        else:
            err_path = os.path.join(base, "logs", "follow-slave.stderr")
            out_path = os.path.join(base, "logs", "follow-slave.stdout")
            command = child_command(
                "trio_ha.bench.replication_runs", "follow-slave", root=slave_root,
                master=_address(master),
                segment_size=plan.segment_size,
                max_seconds=60 + 4 * plan.sync_seconds + 2 * plan.sync_warmup_seconds,
            )
            async with await trio.open_file(out_path, "wb") as out, \
                    await trio.open_file(err_path, "wb") as err:
                proc = await trio.lowlevel.open_process(
                    command, stdin=subprocess.PIPE, stdout=out.wrapped, stderr=err.wrapped,
                    env=child_env(),
                )
            try:
                info["slave_connected"] = await _wait_for_ack(master, 30)
                results = await _producer_runs(master, plan)
                with trio.move_on_after(10):
                    await service.replicated.wait_for(master.commitlog.max_offset)
                assert proc.stdin is not None  # opened with stdin=PIPE
                await proc.stdin.aclose()
                with trio.move_on_after(30):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    with trio.CancelScope(shield=True):
                        await proc.wait()
            lines = await _output_lines(out_path)
            if lines:
                child = json.loads(lines[-1])
                info["slave_max_offset"] = child["slave_max_offset"]
                info["slave_cpu_seconds"] = child["cpu_seconds"]
                info["slave_last_error"] = child["slave_last_error"]
            else:
                info["slave_error"] = log_tail(err_path)
        info["master_max_offset"] = master.commitlog.max_offset
        info["replicated_offset"] = service.replicated.value
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(slave_root, ignore_errors=True)
    return results, info


# ---- child entry point ------------------------------------------------------------------------

ROLES = {
    "catchup-slave": _catchup_child_main,
    "follow-slave": _follow_child_main,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ROLES:
        print(f"usage: python -m trio_ha.bench.replication_runs {{{','.join(ROLES)}}} JSON",
              file=sys.stderr)
        return 2
    ROLES[argv[0]](json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
