"""Loopback limits between two processes: what the kernel and an idle peer allow.

A benchmark of replication or of a client against a broker is read against the same thing
measured on the same machine in the same run, between this process and a child process (two
processes, so both cores can work, as in the deployment measured):

* :func:`raw_transfer`: a mapped file sent over a loopback TCP socket to a child that
  ``recv_into``'s a preallocated buffer, with ``send`` of memoryview slices or
  ``os.sendfile``, in a given chunk size; blocking sockets; best of several passes; the clock
  runs from the first send to the receiver's one-byte "all received";
* :func:`raw_rtt`: 8-byte ping-pong with TCP_NODELAY, blocking sockets (the raw round trip);
* :func:`trio_rtt`: the same between two Trio processes (what an event loop adds on each
  side); :func:`round_trip_limit` puts both into the limit a latency is read against.

Both ping-pongs also say what a round trip costs in CPU on each side (``cpu_us_per_round_trip``:
this process's and the echoing child's CPU over the timed part, per round trip). Each side
is woken once per round trip, so this is the price of one wake-up with a read and a write on
this machine — kernel and, for trio, the event loop — the floor under every per-message CPU
figure of a node that wakes once per message (on a VM, tens of microseconds).

The children are this module run with ``python -m`` and a role (``sink``, ``echo``,
``echo-trio``); :class:`Children` starts them and kills what is left at the end.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import trio

from .. import _backend
from ..store import open_splice_pipe
from ..testing.processes import child_env
from .harness import MB, MiB, cpu_seconds, latency_us, limit, trio_run

PING_SIZE = 8


def child_command(module: str, role: str, **args) -> list[str]:
    """``python -m <module> <role> JSON``: how the benchmarks start their child processes."""
    return [sys.executable, "-m", module, role, json.dumps(args)]


class Children:
    """Blocking child processes of the limit measurements (``python -m <module> <role>
    JSON``, each printing the port it listens on); all killed at the end."""

    def __init__(self, logs: str, module: str = "trio_ha.bench.loopback") -> None:
        self.logs = logs
        self.module = module
        self.procs: list[subprocess.Popen] = []
        self.roles: dict[int, str] = {}

    def start(self, role: str, **args) -> subprocess.Popen:
        with open(os.path.join(self.logs, f"{role}-{len(self.procs)}.stderr"), "wb") as stderr:
            proc = subprocess.Popen(  # the child keeps its own descriptor of the log
                child_command(self.module, role, **args), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=stderr, env=child_env(),
            )
        self.procs.append(proc)
        self.roles[proc.pid] = role
        return proc

    def read_port(self, proc: subprocess.Popen, timeout: float) -> int:
        """The port the child prints once it listens."""
        stdout = proc.stdout
        assert stdout is not None  # started with stdout=PIPE
        ready, _, _ = select.select([stdout], [], [], timeout)
        line = stdout.readline() if ready else b""
        if not line.strip():
            raise RuntimeError(f"child {self.roles.get(proc.pid)} did not start "
                               f"(no port within {timeout} s)")
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

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---- raw loopback transfer of a mapped file ---------------------------------------------------


def make_raw_file(directory: str, size: int) -> str:
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


def raw_transfer(children: Children, path: str, size: int, *, method: str, chunk: int,
                 passes: int, timeout: float, into_file: str | None = None,
                 receive: str = "recv_into") -> dict:
    """Send ``size`` bytes of the mapped file at ``path`` to a receiving child ``passes``
    times, in ``chunk`` pieces, with ``method`` (``send`` of memoryview slices of the mapping,
    or ``sendfile``). Returns the best pass and all of them.

    The child receives into a reused 1 MiB buffer, or with ``into_file`` into a new file of
    that path for each pass, sized and its blocks reserved as the store makes a segment:
    what any slave pays to put received bytes into new file pages (page allocation and first
    touch), without a store's own work. ``receive`` is how: ``recv_into`` the file's shared
    mapping, in order, or ``splice`` from the socket through a pipe into the file (the
    catching-up slave's way)."""
    proc = children.start("sink", total=size, passes=passes, timeout=timeout,
                          into_file=into_file, receive=receive)
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
        "into": ("a reused 1 MiB buffer" if not into_file
                 else "a new mapped file per pass" if receive == "recv_into"
                 else "a new file per pass, by splice"),
    }


def _sink_main(args: dict) -> None:
    """Child: accept ``passes`` connections, receive ``total`` bytes each into a
    preallocated buffer (or a new file, ``into_file``, by ``receive``), answer one byte."""
    total, passes, timeout = args["total"], args["passes"], args["timeout"]
    into_file = args.get("into_file")
    by_splice = args.get("receive") == "splice"
    buffer = memoryview(bytearray(MiB))
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(timeout)
        print(server.getsockname()[1], flush=True)
        for _ in range(passes):
            conn, _ = server.accept()
            with conn:
                conn.settimeout(timeout)
                if into_file is None:
                    _receive(conn, total, buffer)
                elif by_splice:
                    with _new_file(into_file, total) as fd:
                        _splice_into(conn, total, fd, timeout)
                else:
                    with _new_mapped_file(into_file, total) as mapping:
                        view = memoryview(mapping)
                        try:
                            _receive(conn, total, view)
                        finally:
                            view.release()
                conn.sendall(b"\x01")


def _receive(conn: socket.socket, total: int, target: memoryview) -> None:
    """``total`` bytes into ``target``: in order if it holds them all, else over and over
    into its start; at most 1 MiB per call."""
    got = 0
    while got < total:
        at = got if len(target) >= total else 0
        n = conn.recv_into(target[at:at + min(MiB, total - got)])
        if n == 0:
            raise SystemExit(f"sender closed after {got} of {total} bytes")
        got += n


def _splice_into(conn: socket.socket, total: int, fd: int, timeout: float) -> None:
    """``total`` bytes from ``conn`` into the file ``fd`` from its start, as a catching-up
    slave receives them (``splice_to_file``: socket -> pipe -> file). ``conn`` has a timeout,
    so its descriptor is non-blocking: an empty socket is waited for with poll."""
    pipe = open_splice_pipe()
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    try:
        got = 0
        while got < total:
            n = _backend.engine.splice_to_file(conn.fileno(), pipe, fd, got, total - got)
            if n == -errno.EAGAIN:
                if not poller.poll(timeout * 1000):
                    raise SystemExit(f"nothing received for {timeout} s after {got} of "
                                     f"{total} bytes")
                continue
            if n < 0:
                raise OSError(-n, f"splice: {os.strerror(-n)}")
            if n == 0:
                raise SystemExit(f"sender closed after {got} of {total} bytes")
            got += n
    finally:
        for end in pipe:
            os.close(end)


@contextlib.contextmanager
def _new_file(path: str, size: int) -> Iterator[int]:
    """A new file of ``size`` bytes with its blocks reserved (as ``Segment.create`` makes a
    commitlog segment, unwarmed as a slave's are), open read-write; removed after."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        yield fd
    finally:
        os.close(fd)
        os.unlink(path)


@contextlib.contextmanager
def _new_mapped_file(path: str, size: int) -> Iterator[mmap.mmap]:
    """``_new_file``, mapped shared."""
    with _new_file(path, size) as fd, mmap.mmap(
            fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mapping:
        yield mapping


# ---- limits: loopback round trip --------------------------------------------------------------


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


def raw_rtt(children: Children, *, count: int, seconds: float, timeout: float) -> dict:
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
            cpu = _CpuClock(proc.pid)
            deadline = time.perf_counter() + seconds
            while len(latencies) < count and time.perf_counter() < deadline:
                t0 = clock()
                sock.sendall(ping)
                _recv_exactly(sock, view)
                latencies.append(clock() - t0)
            cpu.stop()
    finally:
        children.finish(proc)
    lat = latency_us(latencies)
    return {"p50_us": lat["p50"], "p99_us": lat["p99"], "p999_us": lat["p999"],
            "round_trips": lat["samples"], "cpu_us_per_round_trip": cpu.per(len(latencies)),
            "kind": "blocking sockets, two processes"}


class _CpuClock:
    """CPU seconds of this process and of the child ``pid`` between ``start`` and ``stop``
    (the child's from /proc: None where there is none)."""

    def __init__(self, pid: int, *, started: bool = True) -> None:
        self.pid = pid
        self.ours = self.theirs = None
        self._ours0 = 0.0
        self._theirs0: float | None = None
        if started:
            self.start()

    def start(self) -> None:
        self._ours0 = time.process_time()
        self._theirs0 = cpu_seconds(self.pid)

    def stop(self) -> None:
        self.ours = time.process_time() - self._ours0
        theirs = cpu_seconds(self.pid)
        if theirs is not None and self._theirs0 is not None:
            self.theirs = theirs - self._theirs0

    def per(self, round_trips: int) -> dict[str, float | None]:
        def each(seconds: float | None) -> float | None:
            return seconds / round_trips * 1e6 if seconds is not None and round_trips else None
        return {"this_process": each(self.ours), "echo_process": each(self.theirs)}


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


def trio_rtt(children: Children, *, count: int, seconds: float, timeout: float) -> dict:
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
                cpu.start()
                deadline = time.perf_counter() + seconds
                while len(latencies) < count and time.perf_counter() < deadline:
                    t0 = clock()
                    await sock.send(ping)
                    await _trio_recv_exactly(sock, view)
                    latencies.append(clock() - t0)
                cpu.stop()
        return latencies

    cpu = _CpuClock(proc.pid, started=False)
    try:
        latencies = trio_run(client)
    finally:
        children.finish(proc)
    lat = latency_us(latencies)
    return {"p50_us": lat["p50"], "p99_us": lat["p99"], "p999_us": lat["p999"],
            "round_trips": lat["samples"], "cpu_us_per_round_trip": cpu.per(len(latencies)),
            "kind": "trio sockets, two processes"}


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


def round_trip_limit(rtt: dict, rtt_trio: dict) -> dict:
    """The limit a latency is read against: the raw round trip's p50, with the trio one."""
    return limit("loopback_rtt_p50", rtt["p50_us"], "us", p99_us=rtt["p99_us"],
                 trio_p50_us=rtt_trio["p50_us"], trio_p99_us=rtt_trio["p99_us"],
                 cpu_us_per_wake=rtt["cpu_us_per_round_trip"]["this_process"],
                 trio_cpu_us_per_wake=rtt_trio["cpu_us_per_round_trip"]["this_process"])


# ---- child entry point ------------------------------------------------------------------------

ROLES = {
    "sink": _sink_main,
    "echo": _echo_main,
    "echo-trio": _echo_trio_main,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ROLES:
        print(f"usage: python -m trio_ha.bench.loopback {{{','.join(ROLES)}}} JSON",
              file=sys.stderr)
        return 2
    ROLES[argv[0]](json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
