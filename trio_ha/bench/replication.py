"""``trio-ha bench replication``: slave catch-up and SYNC_MASTER latency against loopback limits.

What runs (one JSON object per result, in this order):

1. limits, measured in the same run, between this process and a child process (two
   processes, so both vCPUs can work); the round trips just before the SYNC_MASTER runs they
   are read against, the rest first:

   * ``limit.loopback_transfer``: a file of the catch-up's size, written and mapped, sent over a
     loopback TCP socket to a child that ``recv_into``'s a preallocated buffer: ``send`` of
     memoryview slices of the mapping, and ``os.sendfile``, each in 1 MiB and 32 KiB pieces
     (the two frame sizes the catch-up uses); blocking sockets; best of several passes; the
     clock runs from the first send to the receiver's one-byte "all received";
   * ``limit.loopback_rtt``: 8-byte ping-pong with TCP_NODELAY between two processes, blocking
     sockets (the raw round trip), and the same between two Trio processes (what an event
     loop adds on each side);
   * ``limit.memcpy_into_mapping`` (``trio_ha.bench.limits``): its first-touch figure is what a
     fresh slave pays on every page of the segments it creates, a secondary limit;

2. catch-up: a master store (ASYNC_MASTER) is filled with 1 KiB records through ``put_batch``
   up to at least 1 GiB (quick: 100 MiB) and flushed; then, for each transfer method (``send``,
   ``sendfile``) and frame size (``ha_transfer_batch_size`` 32 KiB and 1 MiB) the master is
   reopened with that configuration and a fresh, empty slave copies everything
   (``ha_start_from_min_offset``): in a separate process (the real deployment: its own
   interpreter, its own core) and in the master's process (the embedded case: one event loop
   and one GIL for both sides), alternately, for a few passes; the best pass is the figure, as
   for the limits. The clock runs from the slave's ``open_store`` call until its ``written``
   watermark reaches the master's end. After every pass the slave's commitlog is compared byte
   for byte with the master's. One catch-up runs before all of them and is reported apart
   (``replication.catchup_warmup``): on a VM the first use of fresh memory is slow, and that
   cost would otherwise fall on whichever configuration runs first;

3. SYNC_MASTER (after the round trips above): a fresh SYNC_MASTER (ASYNC_FLUSH) master with
   one slave (separate process, and in-process), 1 and then 16 concurrent producer tasks doing
   ``put_message`` of 1 KiB bodies for a fixed time; every put is timed; p50/p99 latency and
   puts/s, next to the round trips;

4. a summary of the issue's targets (evaluated on the separate-process runs, the real
   deployment; the in-process figures are reported beside them as ``embedded_targets``).

Bandwidths are decimal MB/s (10**6 bytes); latencies in microseconds. A benchmark reports
figures; it never asserts. Child processes are this module run with ``python -m`` and a role.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import mmap
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import attrs
import trio

import trio_ha

from .. import _backend
from ..config import BrokerRole, FlushDiskType, StoreConfig
from ..store import open_store
from . import limits, percentile, tidy
from .store import _drive, _make_put, _RunState, _wait_spare

MB = 1_000_000
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

TRANSFER_METHODS = ("send", "sendfile")
FRAME_SIZES = (32 * KiB, MiB)
PLACEMENTS = ("separate_process", "in_process")
PRODUCERS = (1, 16)
BODY_SIZE = 1024
PING_SIZE = 8

TARGET_CATCHUP_RATIO = 0.6
TARGET_SYNC_P50_RTT_RATIO = 3.0
TARGET_PRODUCER_SCALING = 8.0


class _Plan:
    """How much work each part does. ``quick`` is for a smoke test (well under 30 s)."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        if quick:
            self.segment_size = 32 * MiB
            self.catchup_bytes = 100 * MiB
            self.raw_bytes = 100 * MiB
            self.raw_passes = 1
            self.rtt_count = 3000
            self.rtt_seconds = 0.3
            self.sync_seconds = 1.0
            self.sync_warmup_seconds = 0.1
            self.catchup_passes = 1
            self.memcpy_map = 64 * MiB
            self.memcpy_bytes = 256 * MiB
        else:
            self.segment_size = 256 * MiB
            self.catchup_bytes = GiB
            self.raw_bytes = GiB
            self.raw_passes = 3
            self.rtt_count = 50_000
            self.rtt_seconds = 2.0
            self.sync_seconds = 3.0
            self.sync_warmup_seconds = 0.3
            self.catchup_passes = 2
            self.memcpy_map = 256 * MiB
            self.memcpy_bytes = GiB
        self.sync_max_puts = 5_000_000
        self.scaled_for_disk = False

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


def _limit(name: str, value: float, unit: str, **extra) -> dict:
    return {"name": name, "value": value, "unit": unit, **extra}


def _latency_us(latencies_ns: list[int]) -> dict:
    lat = sorted(latencies_ns)
    if not lat:
        return {"p50": None, "p99": None, "p999": None, "max": None, "samples": 0}
    return {
        "p50": percentile(lat, 0.5) / 1000,
        "p99": percentile(lat, 0.99) / 1000,
        "p999": percentile(lat, 0.999) / 1000,
        "max": lat[-1] / 1000,
        "samples": len(lat),
    }


def _trio_run(fn, *args):
    """``trio.run``, except that a Ctrl-C wrapped in exception groups by the nurseries it
    passed through comes out as a plain KeyboardInterrupt (the CLI exits 130 on it)."""
    try:
        return trio.run(fn, *args)
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            raise KeyboardInterrupt from group
        raise


# ---- child processes --------------------------------------------------------------------------


def _child_command(role: str, **args) -> list[str]:
    return [sys.executable, "-m", "trio_ha.bench.replication", role, json.dumps(args)]


def _child_env() -> dict:
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(trio_ha.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent, env.get("PYTHONPATH")) if p
    )
    return env


class _Children:
    """Blocking child processes of the limit measurements; all killed at the end."""

    def __init__(self, logs: str) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen] = []

    def start(self, role: str, **args) -> subprocess.Popen:
        stderr = open(os.path.join(self.logs, f"{role}-{len(self.procs)}.stderr"), "wb")
        try:
            proc = subprocess.Popen(
                _child_command(role, **args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=stderr, env=_child_env(),
            )
        finally:
            stderr.close()
        self.procs.append(proc)
        return proc

    @staticmethod
    def read_port(proc: subprocess.Popen, timeout: float) -> int:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else b""
        if not line.strip():
            raise RuntimeError(f"child {proc.args[3]} did not start (no port within {timeout} s)")
        return int(line)

    def finish(self, proc: subprocess.Popen, timeout: float = 30.0) -> int:
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs.clear()


def _stderr_tail(path: str, limit: int = 2000) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    text = data.decode(errors="replace").strip()
    return text[-limit:] if text else None


# ---- limits: raw loopback transfer of a mapped file ---------------------------------------------


def _make_raw_file(directory: str, size: int) -> str:
    """A file of ``size`` random-ish bytes, written through and synced (so writeback does not
    compete with the measurement) and left in the page cache."""
    path = os.path.join(directory, "raw-transfer.scratch")
    chunk = os.urandom(4 * MiB)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pos = 0
        while pos < size:
            n = min(len(chunk), size - pos)
            os.pwrite(fd, chunk[:n], pos)
            pos += n
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return path


def _set_send_timeout(sock: socket.socket, seconds: float) -> None:
    """A kernel-side bound on each blocking send (sendfile included); the socket stays
    blocking, the fastest way to drive it."""
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                    struct.pack("ll", whole, int((seconds - whole) * 1e6)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                    struct.pack("ll", whole, int((seconds - whole) * 1e6)))


def raw_transfer(children: _Children, path: str, size: int, *, method: str, chunk: int,
                 passes: int, timeout: float) -> dict:
    """Send ``size`` bytes of the mapped file at ``path`` to a receiving child ``passes``
    times, in ``chunk`` pieces, with ``method`` (``send`` of memoryview slices of the mapping,
    or ``sendfile``). Returns the best pass and all of them."""
    proc = children.start("sink", total=size, passes=passes, timeout=timeout)
    port = children.read_port(proc, 30)
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    rates = []
    try:
        view = memoryview(mm)
        try:
            for _ in range(passes):
                with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                    sock.settimeout(None)
                    _set_send_timeout(sock, timeout)
                    started = time.perf_counter()
                    pos = 0
                    if method == "send":
                        while pos < size:
                            end = min(pos + chunk, size)
                            sock.sendall(view[pos:end])
                            pos = end
                    else:
                        out = sock.fileno()
                        while pos < size:
                            sent = os.sendfile(out, fd, pos, min(chunk, size - pos))
                            if sent == 0:
                                raise BrokenPipeError("sendfile sent nothing: receiver gone")
                            pos += sent
                    if sock.recv(1) != b"\x01":
                        raise RuntimeError("the receiver did not confirm the transfer")
                    elapsed = time.perf_counter() - started
                rates.append(size / elapsed / MB)
        finally:
            view.release()
    finally:
        mm.close()
        os.close(fd)
        children.finish(proc)
    return {
        "mb_per_s": max(rates),
        "passes_mb_per_s": rates,
        "bytes": size,
        "chunk_bytes": chunk,
        "method": method,
    }


def _sink_main(args: dict) -> None:
    """Child: accept ``passes`` connections, receive ``total`` bytes each into a
    preallocated buffer, answer one byte."""
    total, passes, timeout = args["total"], args["passes"], args["timeout"]
    buffer = memoryview(bytearray(MiB))
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(timeout)
        print(server.getsockname()[1], flush=True)
        for _ in range(passes):
            conn, _ = server.accept()
            with conn:
                conn.settimeout(timeout)
                got = 0
                while got < total:
                    n = conn.recv_into(buffer, min(len(buffer), total - got))
                    if n == 0:
                        raise SystemExit(f"sender closed after {got} of {total} bytes")
                    got += n
                conn.sendall(b"\x01")


# ---- limits: loopback round trip --------------------------------------------------------------


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


def raw_rtt(children: _Children, *, count: int, seconds: float, timeout: float) -> dict:
    """8-byte ping-pong with TCP_NODELAY against an echoing child, blocking sockets."""
    proc = children.start("echo", timeout=timeout)
    port = children.read_port(proc, 30)
    latencies: list[int] = []
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)
            _set_send_timeout(sock, timeout)
            ping = b"p" * PING_SIZE
            view = memoryview(bytearray(PING_SIZE))
            clock = time.perf_counter_ns
            for _ in range(min(200, count)):  # warm-up: connection, caches, scheduler
                sock.sendall(ping)
                _recv_exactly(sock, view)
            deadline = time.perf_counter() + seconds
            while len(latencies) < count and time.perf_counter() < deadline:
                t0 = clock()
                sock.sendall(ping)
                _recv_exactly(sock, view)
                latencies.append(clock() - t0)
    finally:
        children.finish(proc)
    lat = _latency_us(latencies)
    return {"p50_us": lat["p50"], "p99_us": lat["p99"], "p999_us": lat["p999"],
            "round_trips": lat["samples"], "kind": "blocking sockets, two processes"}


def _echo_main(args: dict) -> None:
    """Child: echo 8-byte pings on one connection until it closes (blocking sockets)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(args["timeout"])
        print(server.getsockname()[1], flush=True)
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(args["timeout"])
            view = memoryview(bytearray(PING_SIZE))
            while True:
                try:
                    _recv_exactly(conn, view)
                except ConnectionError:
                    return
                conn.sendall(view)


async def _trio_recv_exactly(sock, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = await sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


def trio_rtt(children: _Children, *, count: int, seconds: float, timeout: float) -> dict:
    """The same ping-pong between two Trio processes (trio sockets on both sides)."""
    proc = children.start("echo-trio", timeout=timeout)
    port = children.read_port(proc, 30)

    async def client() -> list[int]:
        latencies: list[int] = []
        with trio.fail_after(timeout):
            sock = trio.socket.socket()
            with sock:
                await sock.connect(("127.0.0.1", port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                ping = b"p" * PING_SIZE
                view = memoryview(bytearray(PING_SIZE))
                clock = time.perf_counter_ns
                for _ in range(min(200, count)):
                    await sock.send(ping)
                    await _trio_recv_exactly(sock, view)
                deadline = time.perf_counter() + seconds
                while len(latencies) < count and time.perf_counter() < deadline:
                    t0 = clock()
                    await sock.send(ping)
                    await _trio_recv_exactly(sock, view)
                    latencies.append(clock() - t0)
        return latencies

    try:
        latencies = _trio_run(client)
    finally:
        children.finish(proc)
    lat = _latency_us(latencies)
    return {"p50_us": lat["p50"], "p99_us": lat["p99"], "p999_us": lat["p999"],
            "round_trips": lat["samples"], "kind": "trio sockets, two processes"}


def _echo_trio_main(args: dict) -> None:
    async def main() -> None:
        with trio.fail_after(args["timeout"]):
            server = trio.socket.socket()
            with server:
                await server.bind(("127.0.0.1", 0))
                server.listen(1)
                print(server.getsockname()[1], flush=True)
                conn, _ = await server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            view = memoryview(bytearray(PING_SIZE))
            with trio.move_on_after(args["timeout"]):
                while True:
                    try:
                        await _trio_recv_exactly(conn, view)
                    except ConnectionError:
                        return
                    await conn.send(view)

    trio.run(main)


# ---- stores ---------------------------------------------------------------------------------


def _master_config(root: str, plan: _Plan, role: BrokerRole, **overrides) -> StoreConfig:
    values = dict(
        store_path_root_dir=root,
        mapped_file_size_commit_log=plan.segment_size,
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        broker_role=role,
        ha_listen_port=0,
        ha_bind_address="127.0.0.1",
        ha_start_from_min_offset=True,
    )
    values.update(overrides)
    return StoreConfig(**values)


def _slave_config(root: str, segment_size: int, master_address: str) -> StoreConfig:
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


async def _fill_master(config: StoreConfig, target_bytes: int, seconds: float) -> dict:
    """Append 64 x 1 KiB batches until the log holds ``target_bytes`` (bounded by time)."""
    async with open_store(config) as store:
        put, per_put = _make_put(store, "put_batch", BODY_SIZE)
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
        name = f"{base:020d}"
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
        result = {
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
    return result


def _catchup_child_main(args: dict) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    config = _slave_config(args["root"], args["segment_size"], args["master"])
    result = trio.run(_catchup_slave, config, args["end"], args["timeout"])
    print(json.dumps(result), flush=True)


async def _run_catchups(config: StoreConfig, plan: _Plan, base: str, expected_end: int,
                        placements: tuple[str, ...], passes: int) -> list[dict]:
    """Open the master with ``config``; ``passes`` times, for each placement, copy it to a
    fresh slave."""
    results = []
    async with open_store(config) as master:
        await _wait_spare(master, 60)  # the master's allocator is idle before the clock starts
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
            seen: dict[int, object] = {}
            try:
                async with trio.open_nursery() as nursery:
                    # Keep the master's connection objects: a child slave's connection is
                    # gone from the table by the time the child has exited.
                    nursery.start_soon(_collect_connections, master, seen)
                    if placement == "in_process":
                        figures = await _catchup_slave(
                            _slave_config(slave_root, plan.segment_size, address), end,
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
                while master.statistics().ha.connections:
                    await trio.sleep(0.01)
    return results


def _with_rate(run: dict) -> dict:
    seconds = run.get("seconds")
    ok = bool(seconds) and run.get("caught_up", False)
    open_seconds = run.get("open_seconds") or 0.0
    return {
        "mb_per_s": run["bytes_copied"] / seconds / MB if ok else 0.0,
        "transfer_mb_per_s": (run["bytes_copied"] / (seconds - open_seconds) / MB
                              if ok and seconds > open_seconds else None),
        **run,
    }


def _best_pass(runs: list[dict]) -> dict:
    """The fastest pass without failures (the first pass if all failed), with every pass's
    rate and the failures of all passes."""
    runs = [_with_rate(r) for r in runs]
    clean = [r for r in runs if r["failures"] == 0]
    best = dict(max(clean, key=lambda r: r["mb_per_s"]) if clean else runs[0])
    best["passes_mb_per_s"] = [r["mb_per_s"] for r in runs]
    best["failures"] = sum(r["failures"] for r in runs)
    best["identical"] = all(r["identical"] for r in runs)
    best["errors"] = [r["error"] for r in runs if r["error"]] or None
    return best


async def _collect_connections(master, seen: dict) -> None:
    connections = master.ha_service.connections
    while True:
        seen.update(connections)
        await trio.sleep(0.005)


async def _run_child_catchup(base: str, slave_root: str, plan: _Plan, address: str,
                             end: int) -> tuple[dict, str | None]:
    out_path = os.path.join(base, "logs", "catchup-slave.stdout")
    err_path = os.path.join(base, "logs", "catchup-slave.stderr")
    command = _child_command(
        "catchup-slave", root=slave_root, master=address, segment_size=plan.segment_size,
        end=end, timeout=plan.catchup_timeout,
    )
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        with trio.move_on_after(plan.catchup_timeout + 60) as scope:
            proc = await trio.run_process(command, stdout=out, stderr=err, check=False,
                                          env=_child_env())
    if scope.cancelled_caught:
        return {}, "the slave process did not finish in time (killed)"
    with open(out_path, "rb") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        return {}, (f"slave process exited with {proc.returncode}: "
                    f"{_stderr_tail(err_path)}")
    return json.loads(lines[-1]), None


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
        print(json.dumps({
            "seconds": time.perf_counter() - started,
            "slave_max_offset": stats.max_commitlog_offset,
            "bytes_received": stats.ha_slave.bytes_received,
            "slave_state": stats.ha_slave.state,
            "slave_last_error": stats.ha_slave.last_error,
            "cpu_seconds": time.process_time(),
        }), flush=True)


def _follow_child_main(args: dict) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    config = _slave_config(args["root"], args["segment_size"], args["master"])
    trio.run(_follow_slave, config, args["max_seconds"])


async def _wait_for_ack(master, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        while not any(c.acked_offset is not None for c in master.statistics().ha.connections):
            await trio.sleep(0.005)
        return True
    return False


async def _producer_runs(master, plan: _Plan) -> list[dict]:
    put, per_put = _make_put(master, "put_message", BODY_SIZE)
    warm = _RunState(plan.sync_max_puts, time.perf_counter() + plan.sync_warmup_seconds)
    await _drive(put, per_put, max(PRODUCERS), warm, False)
    results = []
    for producers in PRODUCERS:
        gc.collect()
        start_offset = master.commitlog.max_offset
        cpu0 = time.process_time()
        state = _RunState(plan.sync_max_puts, 0.0)
        started = time.perf_counter()
        state.deadline = started + plan.sync_seconds
        await _drive(put, per_put, producers, state, True)
        elapsed = time.perf_counter() - started
        results.append({
            "producers": producers, "puts": state.ok, "failures": state.failed,
            "failure_statuses": state.statuses or None, "seconds": elapsed,
            "puts_per_s": state.ok / elapsed,
            "mb_per_s": state.ok * BODY_SIZE / elapsed / MB,
            "record_bytes": master.commitlog.max_offset - start_offset,
            "master_process_cpu_seconds": time.process_time() - cpu0,
            "latency_us": _latency_us(state.latencies),
            "warmup_puts": warm.ok, "warmup_failures": warm.failed,
        })
    return results


async def _sync_master_run(base: str, plan: _Plan, placement: str) -> tuple[list[dict], dict]:
    root = os.path.join(base, f"sync-master-{placement}")
    slave_root = os.path.join(base, f"sync-slave-{placement}")
    config = _master_config(root, plan, BrokerRole.SYNC_MASTER)
    info: dict = {"placement": placement}
    async with open_store(config) as master:
        await _wait_spare(master, 60)
        slave_config = _slave_config(slave_root, plan.segment_size, _address(master))
        if placement == "in_process":
            async with open_store(slave_config) as slave:
                info["slave_connected"] = await _wait_for_ack(master, 30)
                results = await _producer_runs(master, plan)
                with trio.move_on_after(10):
                    await slave.commitlog.written.wait_for(master.commitlog.max_offset)
                info["slave_max_offset"] = slave.commitlog.max_offset
        else:
            err_path = os.path.join(base, "logs", "follow-slave.stderr")
            out_path = os.path.join(base, "logs", "follow-slave.stdout")
            command = _child_command(
                "follow-slave", root=slave_root, master=_address(master),
                segment_size=plan.segment_size,
                max_seconds=60 + 4 * plan.sync_seconds + 2 * plan.sync_warmup_seconds,
            )
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                proc = await trio.lowlevel.open_process(
                    command, stdin=subprocess.PIPE, stdout=out, stderr=err, env=_child_env()
                )
            try:
                info["slave_connected"] = await _wait_for_ack(master, 30)
                results = await _producer_runs(master, plan)
                with trio.move_on_after(10):
                    await master.ha_service.replicated.wait_for(master.commitlog.max_offset)
                await proc.stdin.aclose()
                with trio.move_on_after(30):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    with trio.CancelScope(shield=True):
                        await proc.wait()
            with open(out_path, "rb") as f:
                lines = [line for line in f.read().splitlines() if line.strip()]
            if lines:
                child = json.loads(lines[-1])
                info["slave_max_offset"] = child["slave_max_offset"]
                info["slave_cpu_seconds"] = child["cpu_seconds"]
                info["slave_last_error"] = child["slave_last_error"]
            else:
                info["slave_error"] = _stderr_tail(err_path)
        info["master_max_offset"] = master.commitlog.max_offset
        info["replicated_offset"] = master.ha_service.replicated.value
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(slave_root, ignore_errors=True)
    return results, info


# ---- the whole benchmark ---------------------------------------------------------------------


def run_replication_benchmarks(directory: str | None = None, *, quick: bool = False
                               ) -> Iterator[dict]:
    """Run the replication benchmarks in a scratch directory (inside ``directory`` if given)
    and yield one dict per result (floats to 5 significant digits). The scratch directory and
    every child process are gone at the end, also on error."""
    with contextlib.closing(_run(directory, quick)) as results:
        for result in results:
            yield tidy(result)


def _run(directory: str | None, quick: bool) -> Iterator[dict]:
    plan = _Plan(quick)
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
    base = tempfile.mkdtemp(prefix="trio-ha-bench-replication-", dir=directory)
    logs = os.path.join(base, "logs")
    os.makedirs(logs)
    children = _Children(logs)
    begun = time.perf_counter()
    backend = _backend.native_backend
    common = {"backend": backend, "quick": quick}
    try:
        plan.fit_disk(shutil.disk_usage(base).free)
        yield {
            "bench": "replication.config", **common, "scratch_dir": base,
            "segment_size": plan.segment_size, "catchup_bytes": plan.catchup_bytes,
            "raw_bytes": plan.raw_bytes, "sync_seconds": plan.sync_seconds,
            "scaled_for_disk": plan.scaled_for_disk, "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "note": "master in this process; 'separate_process' slaves and the limits' peers "
                    "are child processes (python -m trio_ha.bench.replication <role>); other "
                    "processes on this machine compete for its cores, loadavg says how busy",
        }

        # -- limits ---------------------------------------------------------------------------
        raw_path = _make_raw_file(base, plan.raw_bytes)
        raw: dict[tuple[str, int], dict] = {}
        try:
            for chunk in FRAME_SIZES[::-1]:
                for method in TRANSFER_METHODS:
                    figures = raw_transfer(children, raw_path, plan.raw_bytes, method=method,
                                           chunk=chunk, passes=plan.raw_passes, timeout=60)
                    raw[method, chunk] = figures
                    yield {
                        "bench": "limit.loopback_transfer", **common, **figures,
                        "note": ("send of memoryview slices of a MAP_SHARED mapping"
                                 if method == "send" else "os.sendfile from the file")
                        + " to a child process recv_into'ing a preallocated 1 MiB buffer; "
                          "blocking sockets; file in the page cache; best pass",
                    }
        finally:
            os.unlink(raw_path)
        memcpy = limits.memcpy_into_mapping(
            base, map_size=plan.memcpy_map, total_bytes=plan.memcpy_bytes, passes=2,
            record_seconds=0.05,
        )
        yield {"bench": "limit.memcpy_into_mapping", **common, **memcpy,
               "note": "trio_ha.bench.limits: slice assignment into a warm MAP_SHARED file "
                       "mapping (best pass); first_touch is the same mapping's first write "
                       "pass, what a fresh slave pays on every page of its new segments"}
        first_touch_limit = _limit("first_touch_of_new_mapping",
                                   memcpy["first_touch_gb_per_s"] * 1000, "MB/s",
                                   warm_memcpy_mb_per_s=memcpy["mb_per_s"])

        def transfer_limit(chunk: int) -> dict:
            send, sendfile = raw["send", chunk]["mb_per_s"], raw["sendfile", chunk]["mb_per_s"]
            return _limit(
                f"loopback_faster_raw_{'1MiB' if chunk == MiB else '32KiB'}",
                max(send, sendfile), "MB/s", send_mmap_slices=send, sendfile=sendfile,
                faster="send" if send >= sendfile else "sendfile",
            )

        targets: list[dict] = []
        embedded_targets: list[dict] = []

        # -- catch-up -------------------------------------------------------------------------
        master_root = os.path.join(base, "master")
        fill_config = _master_config(master_root, plan, BrokerRole.ASYNC_MASTER)
        try:
            fill = _trio_run(_fill_master, fill_config, plan.catchup_bytes,
                            max(60.0, plan.catchup_bytes / (10 * MB)))
            yield {"bench": "replication.fill", **common, **fill,
                   "note": "64 x 1 KiB put_batch into the master (ASYNC_MASTER, ASYNC_FLUSH), "
                           "then dispatched and flushed; the store every catch-up copies"}
            # One catch-up first, reported apart: the first run after the fill pays for
            # memory this machine has not touched yet (slow first touch on a VM), which would
            # otherwise land on whichever configuration happens to run first.
            warm_config = attrs.evolve(fill_config, ha_transfer_method="send",
                                       ha_transfer_batch_size=MiB)
            warm = _trio_run(_run_catchups, warm_config, plan, base, fill["max_offset"],
                            ("separate_process",), 1)
            yield {
                "bench": "replication.catchup_warmup", "transfer_method": "send",
                "frame_bytes": MiB, **_with_rate(warm[0]), "backend": backend,
                "note": "a first catch-up, not used for targets: it absorbs first-touch costs "
                        "of memory the machine has not used yet",
            }
            catchup_1mib: dict[tuple[str, str], float] = {}
            for method in TRANSFER_METHODS:
                for frame in FRAME_SIZES:
                    config = attrs.evolve(fill_config, ha_transfer_method=method,
                                          ha_transfer_batch_size=frame)
                    runs = _trio_run(_run_catchups, config, plan, base, fill["max_offset"],
                                    PLACEMENTS, plan.catchup_passes)
                    limit = transfer_limit(frame)
                    for placement in PLACEMENTS:
                        run = _best_pass([r for r in runs if r["placement"] == placement])
                        rate = run["mb_per_s"]
                        ratio = rate / limit["value"]
                        target = meets = None
                        if frame == MiB:
                            target = f"ratio_to_limit >= {TARGET_CATCHUP_RATIO}"
                            meets = ratio >= TARGET_CATCHUP_RATIO and run["failures"] == 0
                            catchup_1mib[placement, method] = rate
                            entry = {"result": f"catch-up 1 MiB frames, {method}, {placement}",
                                     "target": target, "meets": meets,
                                     "mb_per_s": rate, "limit_mb_per_s": limit["value"],
                                     "ratio": ratio}
                            (targets if placement == "separate_process"
                             else embedded_targets).append(entry)
                        yield {
                            "bench": "replication.catchup",
                            "transfer_method": method, "frame_bytes": frame,
                            **run,
                            "limit": limit, "ratio_to_limit": ratio,
                            "ratio_to_raw_send": rate / raw["send", frame]["mb_per_s"],
                            "ratio_to_raw_sendfile": rate / raw["sendfile", frame]["mb_per_s"],
                            "secondary_limit": first_touch_limit,
                            "target": target, "meets_target": meets, "backend": backend,
                            "note": ("slave in a child process (the real deployment)"
                                     if placement == "separate_process" else
                                     "slave in the master's process: one event loop and one "
                                     "GIL for both sides (the embedded case)")
                            + "; clock from the slave's open_store to its written watermark "
                              "reaching the master's end; mb_per_s = bytes_copied / seconds; "
                              "best of the passes (as the limits), failures summed over all; "
                              "slave_cpu_seconds counts its threads too (segment warming, "
                              "flushes); secondary_limit: a fresh slave writes every page of "
                              "its new segments for the first time",
                        }
        finally:
            shutil.rmtree(master_root, ignore_errors=True)

        # -- SYNC_MASTER latency ----------------------------------------------------------------
        # The round trips are measured right before the puts they are compared with: on a VM
        # the wake-up latency of an idle vCPU changes with how busy the machine is.
        rtt = raw_rtt(children, count=plan.rtt_count, seconds=plan.rtt_seconds, timeout=60)
        yield {"bench": "limit.loopback_rtt", **common, **rtt,
               "note": "8-byte ping-pong, TCP_NODELAY, this process and a child"}
        rtt_trio = trio_rtt(children, count=plan.rtt_count, seconds=plan.rtt_seconds,
                            timeout=60)
        yield {"bench": "limit.loopback_rtt_trio", **common, **rtt_trio,
               "note": "the same ping-pong, trio sockets in both processes"}

        rtt_limit = _limit("loopback_rtt_p50", rtt["p50_us"], "us",
                           p99_us=rtt["p99_us"], trio_p50_us=rtt_trio["p50_us"],
                           trio_p99_us=rtt_trio["p99_us"])
        for placement in PLACEMENTS:
            runs, info = _trio_run(_sync_master_run, base, plan, placement)
            one = runs[0]["puts_per_s"] if runs and runs[0]["producers"] == 1 else None
            for run in runs:
                p50 = run["latency_us"]["p50"]
                result = {
                    "bench": "replication.sync_master", "placement": placement,
                    "flush": "ASYNC_FLUSH", "body_size": BODY_SIZE, **run,
                    "slave": info, "limit": rtt_limit,
                    "ratio_to_limit": (p50 / rtt["p50_us"]) if p50 else None,
                    "ratio_basis": "latency p50 / raw loopback RTT p50",
                    "ratio_to_trio_rtt": (p50 / rtt_trio["p50_us"]) if p50 else None,
                }
                checks = []
                if run["producers"] == 1:
                    target = f"ratio_to_limit <= {TARGET_SYNC_P50_RTT_RATIO}"
                    meets = (result["ratio_to_limit"] is not None
                             and result["ratio_to_limit"] <= TARGET_SYNC_P50_RTT_RATIO
                             and run["failures"] == 0)
                    checks.append(("SYNC_MASTER p50 latency, 1 producer", target, meets,
                                   {"p50_us": p50, "rtt_p50_us": rtt["p50_us"],
                                    "ratio": result["ratio_to_limit"]}))
                else:
                    scaling = run["puts_per_s"] / one if one else None
                    result["scaling_vs_1_producer"] = scaling
                    target = f"scaling_vs_1_producer >= {TARGET_PRODUCER_SCALING}"
                    meets = (scaling is not None and scaling >= TARGET_PRODUCER_SCALING
                             and run["failures"] == 0)
                    checks.append((f"SYNC_MASTER {run['producers']} producers vs 1", target,
                                   meets, {"puts_per_s": run["puts_per_s"],
                                           "one_producer_puts_per_s": one,
                                           "ratio": scaling}))
                result["target"] = target
                result["meets_target"] = meets
                result["backend"] = backend
                result["note"] = (
                    ("slave in a child process (the real deployment)"
                     if placement == "separate_process" else
                     "slave in the master's process (embedded)")
                    + "; SYNC_MASTER + ASYNC_FLUSH; each put_message timed from call to "
                      "return (slave ack); producers are tasks on the master's event loop"
                )
                for name, tgt, ok, figures in checks:
                    entry = {"result": f"{name}, {placement}", "target": tgt, "meets": ok,
                             **figures}
                    (targets if placement == "separate_process" else embedded_targets).append(
                        entry)
                yield result

        faster = {}
        for placement in PLACEMENTS:
            send = catchup_1mib.get((placement, "send"))
            sendfile = catchup_1mib.get((placement, "sendfile"))
            if send is not None and sendfile is not None:
                faster[placement] = "send" if send >= sendfile else "sendfile"
        yield {
            "bench": "replication.summary", **common, "targets": targets,
            "all_met": all(t["meets"] for t in targets),
            "embedded_targets": embedded_targets,
            "embedded_all_met": all(t["meets"] for t in embedded_targets),
            "faster_transfer_method_1MiB": faster,
            "raw_faster_1MiB": transfer_limit(MiB)["faster"],
            "rtt_p50_us": rtt["p50_us"], "trio_rtt_p50_us": rtt_trio["p50_us"],
            "total_seconds": time.perf_counter() - begun, "loadavg": os.getloadavg(),
        }
    finally:
        children.close()
        shutil.rmtree(base, ignore_errors=True)


# ---- child entry point ------------------------------------------------------------------------

_ROLES = {
    "sink": _sink_main,
    "echo": _echo_main,
    "echo-trio": _echo_trio_main,
    "catchup-slave": _catchup_child_main,
    "follow-slave": _follow_child_main,
}


def _child_main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in _ROLES:
        print(f"usage: python -m trio_ha.bench.replication {{{','.join(_ROLES)}}} JSON",
              file=sys.stderr)
        return 2
    _ROLES[argv[0]](json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
