"""What every ``trio-ha bench`` command runs on: plans, scratch directories, result lines, run
budgets and the load that drives a store.

A benchmark here is a generator: it makes a :class:`Plan` (full size, or ``quick`` for a smoke
test, scaled down to the free disk), works in a :func:`scratch_directory` that is gone at the
end whatever happens, and yields one dict per result, the first being its configuration
(:func:`config_fields`). Its public ``run_*`` function passes those through :func:`tidied`,
which rounds the floats and, when the caller stops early (Ctrl-C, an error), closes the
generator so its cleanup runs. The CLI prints each result as one JSON line.

Inside a run, :class:`RunState` is the shared budget of the tasks that put or send (a count
and a deadline, whichever runs out first) and what came back; :func:`latency_us` turns the
timed calls into percentiles; :func:`limit` is the shape every result's limit takes.
:func:`make_put` and :func:`drive_puts` are the load the store and replication benchmarks
put on a store; :class:`CpuMeter` tells how many cores each process of a run used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator

import attrs
import trio

from .. import _backend
from ..wire.record import Message, encode_batch
from . import percentile_us, tidy

MB = 1_000_000
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

#: the topic, queues and batch size of the store load
TOPIC = "BenchTopic"
QUEUES = 8
BATCH = 64
#: The benchmarks warm each new segment (warmMapedFileEnable=true) as every earlier session's
#: figures did, so that figures stay comparable run to run: warming moves the first write
#: of each page out of the append path. It is off by default in brokers, as in RocketMQ.
WARM_SEGMENTS = True


@attrs.define(kw_only=True)
class Plan:
    """How much work a benchmark does. Each benchmark subclasses it with its sizes and a
    ``make(quick)`` constructor; ``fit_disk`` scales those sizes down to the free space."""

    #: a smoke test's sizes (each command well under a minute)
    quick: bool
    #: set when ``fit_disk`` had to shrink the plan
    scaled_for_disk: bool = False

    def fit_disk(self, free: int) -> None:
        """Shrink what is stored so that it fits in ``free`` bytes with room to spare."""


@attrs.frozen
class Scratch:
    """A benchmark's scratch directory and its ``logs`` subdirectory."""

    base: str
    logs: str


@contextlib.contextmanager
def scratch_directory(directory: str | None, what: str) -> Iterator[Scratch]:
    """A fresh ``trio-ha-bench-<what>-*`` directory (inside ``directory`` if given), removed
    with everything in it when the block ends."""
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
    base = tempfile.mkdtemp(prefix=f"trio-ha-bench-{what}-", dir=directory)
    try:
        logs = os.path.join(base, "logs")
        os.makedirs(logs)
        yield Scratch(base, logs)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def common_fields(quick: bool) -> dict:
    """The fields every result carries."""
    return {"backend": _backend.native_backend, "quick": quick}


def config_fields(plan: Plan, scratch: Scratch) -> dict:
    """The fields of every benchmark's first (``*.config``) result that describe the
    machine and the run: how busy the machine was, whether the plan was shrunk."""
    return {
        **common_fields(plan.quick), "scratch_dir": scratch.base,
        "scaled_for_disk": plan.scaled_for_disk, "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }


def fit_plan(plan: Plan, scratch: Scratch) -> None:
    plan.fit_disk(shutil.disk_usage(scratch.base).free)


def tidied(results: Iterator[dict]) -> Iterator[dict]:
    """``results`` with floats rounded to 5 significant digits; closing it (also when the
    caller stops early) closes ``results`` (a generator), so its cleanup runs."""
    try:
        for result in results:
            yield tidy(result)
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()


def limit(name: str, value: float, unit: str, **extra) -> dict:
    """A physical limit a result is read against."""
    return {"name": name, "value": value, "unit": unit, **extra}


def median_run(runs: list[dict], key: str) -> tuple[dict, dict]:
    """The run with the median ``key`` (the lower middle of an even count) and the spread of
    ``key`` over ``runs`` ({"min", "median", "max"}). These machines swing by 2x from one
    minute to the next: the median of several passes says what a run is like, the spread how
    much the machine moved meanwhile."""
    ordered = sorted(runs, key=lambda r: r[key])
    middle = ordered[(len(ordered) - 1) // 2]
    values = [r[key] for r in runs]
    return middle, {"min": min(values), "median": middle[key], "max": max(values)}


def latency_us(latencies_ns: list[int]) -> dict:
    """Percentiles (microseconds) of call latencies measured in nanoseconds."""
    lat = sorted(latencies_ns)
    if not lat:
        return {"p50": None, "p99": None, "p999": None, "max": None, "samples": 0}
    return {
        "p50": percentile_us(lat, 0.5),
        "p99": percentile_us(lat, 0.99),
        "p999": percentile_us(lat, 0.999),
        "max": lat[-1] / 1000,
        "samples": len(lat),
    }


def count(table: dict[str, int], key: str) -> None:
    table[key] = table.get(key, 0) + 1


async def poll_until(predicate: Callable[[], object], *, interval: float) -> None:
    """Return once ``predicate()`` is true, checking every ``interval`` seconds. For state a
    benchmark sees from outside (a store's statistics, a connection table) that offers no
    event to wait on; bound it with a cancel scope."""
    while True:
        if predicate():
            return
        await trio.sleep(interval)


def trio_run(fn, *args):
    """``trio.run``, except that a Ctrl-C wrapped in exception groups by the nurseries it
    passed through comes out as a plain KeyboardInterrupt (the CLI exits 130 on it)."""
    try:
        return trio.run(fn, *args)
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            raise KeyboardInterrupt from group
        raise


class RunState:
    """The shared budget of one run's tasks (``remaining`` calls, or messages; and a
    deadline) and what came back: successes, failures by status, a few error texts, and
    each timed call's latency in nanoseconds."""

    def __init__(self, remaining: int, deadline: float) -> None:
        self.remaining = remaining
        self.deadline = deadline
        self.ok = 0
        self.failed = 0
        self.statuses: dict[str, int] = {}
        self.errors: list[str] = []
        self.latencies: list[int] = []

    def fail(self, status: str, error: str | None = None) -> None:
        """One failure with ``status`` (keeping the first three error texts)."""
        self.failed += 1
        count(self.statuses, status)
        if error is not None and len(self.errors) < 3:
            self.errors.append(error)


# ---- the store load -----------------------------------------------------------------------


def make_put(store, api: str, body_size: int) -> tuple[Callable[[int], Awaitable], int]:
    """A ``put(queue_id)`` returning the store call's coroutine (no wrapper coroutine of our
    own in the way), and how many messages one call stores. ``api``: ``put_message`` (one
    message), ``put_messages`` (a list of 64 Message objects) or ``put_batch`` (a
    pre-encoded batch of 64: the broker's path, one ``PutRequest.batch`` per put)."""
    from ..store import PutRequest  # (here: the other benchmarks' children never load it)

    body = os.urandom(body_size)
    if api == "put_message":
        message = Message(TOPIC, body, tags="TagA")
        put_message = store.put_message
        return (lambda queue_id: put_message(message, queue_id)), 1
    messages = [Message(TOPIC, body, tags="TagA") for _ in range(BATCH)]
    if api == "put_messages":
        put_messages = store.put_messages
        return (lambda queue_id: put_messages(messages, queue_id)), BATCH
    encoded = encode_batch(messages)
    put, batch = store.put, PutRequest.batch
    return (lambda queue_id: put(batch(TOPIC, queue_id, encoded))), BATCH


async def drive_puts(put, per_put: int, writers: int, state: RunState,
                     measure_latency: bool) -> None:
    """``writers`` tasks, each putting in a loop until the shared budget (in messages) or the
    deadline runs out."""
    clock = time.perf_counter
    clock_ns = time.perf_counter_ns
    latencies = state.latencies

    async def writer(index: int) -> None:
        queue_id = index % QUEUES
        while state.remaining > 0 and clock() < state.deadline:
            state.remaining -= per_put
            if measure_latency:
                t0 = clock_ns()
                result = await put(queue_id)
                latencies.append(clock_ns() - t0)
            else:
                result = await put(queue_id)
            status = result.status.name
            if status == "PUT_OK":
                state.ok += 1
            else:
                state.fail(status)

    async with trio.open_nursery() as nursery:
        for index in range(writers):
            nursery.start_soon(writer, index)


async def wait_spare_segment(store, timeout: float) -> bool:
    """Wait until the allocator has the next segment created and warmed, so a timed run
    starts from the steady state (a private attribute of the commitlog; a benchmark may
    look). False if it did not within ``timeout`` seconds."""
    ready = getattr(store.commitlog, "_spare_ready", None)
    if ready is None:
        return False
    with trio.move_on_after(timeout):
        await ready.wait()
        return True
    return False


# ---- CPU per process ------------------------------------------------------------------------

_CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICK


def machine_busy_seconds() -> float | None:
    """CPU seconds all processes of this machine have been busy since boot (``/proc/stat``:
    everything but idle and iowait), None where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    ticks = [int(v) for v in fields[1:]]
    return (sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)) / _CLOCK_TICK


class CpuMeter:
    """CPU seconds of this process, of named child processes and of the whole machine over
    an interval, as cores (CPU seconds / wall seconds). ``others`` is what the rest of the
    machine used meanwhile: on a shared machine, the cores the run did not get."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start()

    def start(self) -> None:
        self._wall = time.perf_counter()
        self._self = time.process_time()
        self._children = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._machine = machine_busy_seconds()

    def cores(self) -> dict:
        wall = time.perf_counter() - self._wall
        result: dict[str, float | None] = {"client": (time.process_time() - self._self) / wall}
        for name, pid in self.pids.items():
            now, before = cpu_seconds(pid), self._children[name]
            result[name] = (now - before) / wall if now is not None and before is not None else None
        result["total"] = sum(v for v in result.values() if v is not None)
        machine = machine_busy_seconds()
        if machine is not None and self._machine is not None:
            result["machine"] = (machine - self._machine) / wall
            result["others"] = max(0.0, result["machine"] - result["total"])
        return result
