"""Clock jumps for one process (``trio_ha.chaos.clockshift``): a real child under the
``LD_PRELOAD`` shim sees its wall clock move when the harness writes the offset, through
every way CPython reads it, while its monotonic clocks and timed waits stay as they were.

Every check brackets a child's reading between two readings of the same clock taken here,
before and after the request, so none depends on how fast the machine is."""

from __future__ import annotations

import datetime
import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from trio_ha.chaos.clockshift import ENV_FILE, ClockShift, ClockShiftUnavailable, NodeClock

#: what one request to a child may take (start-up included)
ANSWER_TIMEOUT = 30.0
#: how far a wall reading may stray from the bracket (time() has whole seconds)
SLACK = 1.0

def _cannot(reason: str) -> None:
    # (CI sets TRIO_HA_REQUIRE_CHAOS=1: there the shim must build, never skip)
    if os.environ.get("TRIO_HA_REQUIRE_CHAOS") == "1":
        pytest.fail(f"TRIO_HA_REQUIRE_CHAOS=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


if not sys.platform.startswith("linux"):
    _cannot("LD_PRELOAD interposition is Linux's")
if shutil.which(shlex.split(os.environ.get("CC") or "cc")[0]) is None:
    _cannot("no C compiler to build the shim with")

#: the child: one JSON object of clock readings per line read on stdin. It reads the wall
#: clock the ways CPython does (time, time_ns, datetime.now, clock_gettime) and the libc
#: calls the shim also covers (time, gettimeofday, through ctypes); and before answering it
#: waits with timeouts (an Event, a Lock, a thread's sleep, so the GIL changes hands): were
#: any of them timed on the wall clock, a shifted clock would stall or rush them.
CHILD = r"""
import ctypes, datetime, json, sys, threading, time

libc = ctypes.CDLL(None)
libc.time.restype = ctypes.c_int64
libc.time.argtypes = [ctypes.c_void_p]

class Timeval(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("usec", ctypes.c_long)]

for line in sys.stdin:
    threading.Event().wait(0.01)
    lock = threading.Lock()
    lock.acquire()
    assert not lock.acquire(timeout=0.01)
    sleeper = threading.Thread(target=time.sleep, args=(0.01,))
    sleeper.start()
    sleeper.join()
    tv = Timeval()
    assert libc.gettimeofday(ctypes.byref(tv), None) == 0
    zone = (ctypes.c_int * 2)()  # (the time zone alone: a NULL tv the shim must not touch)
    assert libc.gettimeofday(None, ctypes.byref(zone)) == 0
    print(json.dumps({
        "time": time.time(),
        "time_ns": time.time_ns() / 1e9,
        "datetime.now": datetime.datetime.now().timestamp(),
        "datetime.now(utc)": datetime.datetime.now(datetime.timezone.utc).timestamp(),
        "CLOCK_REALTIME": time.clock_gettime(time.CLOCK_REALTIME),
        "CLOCK_REALTIME_COARSE": time.clock_gettime(5),  # (no constant in the time module)
        "CLOCK_TAI": time.clock_gettime(time.CLOCK_TAI),
        "libc time": libc.time(None),
        "libc gettimeofday": tv.sec + tv.usec / 1e6,
        "monotonic": time.monotonic(),
        "perf_counter": time.perf_counter(),
        "CLOCK_BOOTTIME": time.clock_gettime(time.CLOCK_BOOTTIME),
    }), flush=True)
"""

#: the child's readings that must move with the offset, and this process's reading of the
#: same clock
WALL = {
    "time": time.time, "time_ns": time.time, "datetime.now": time.time,
    "datetime.now(utc)": time.time, "CLOCK_REALTIME": time.time,
    "CLOCK_REALTIME_COARSE": time.time, "libc time": time.time,
    "libc gettimeofday": time.time,
    "CLOCK_TAI": lambda: time.clock_gettime(time.CLOCK_TAI),
}
#: the readings that must not (system-wide clocks: the child's equals ours); perf_counter
#: is trio's clock, CLOCK_MONOTONIC in CPython on Linux
STEADY = {
    "monotonic": time.monotonic, "perf_counter": time.perf_counter,
    "CLOCK_BOOTTIME": lambda: time.clock_gettime(time.CLOCK_BOOTTIME),
}


@pytest.fixture
def shift(tmp_path) -> ClockShift:
    return ClockShift.build(tmp_path / "clockshift")


class Child:
    """The child process, asked for readings one line at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})

    def ask(self) -> dict[str, float]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("?\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], ANSWER_TIMEOUT)
        line = self.process.stdout.readline() if ready else ""
        assert line, f"the child did not answer: {self.stop()}"
        return json.loads(line)

    def stop(self) -> str:
        """Kill the child (if it runs) and return what it wrote on stderr."""
        if self.process.poll() is None:
            self.process.kill()
        _, err = self.process.communicate(timeout=ANSWER_TIMEOUT)
        return err


def check_offset(child: Child, offset: float) -> dict[str, float]:
    """Ask the child, and check its wall clocks read ``offset`` seconds from ours and its
    steady clocks read ours."""
    before = {name: clock() for name, clock in {**WALL, **STEADY}.items()}
    got = child.ask()
    after = {name: clock() for name, clock in {**WALL, **STEADY}.items()}
    assert set(got) == set(before)
    for name in WALL:
        assert before[name] + offset - SLACK <= got[name] <= after[name] + offset + SLACK, (
            name, offset, got[name] - after[name])
    for name in STEADY:
        assert before[name] <= got[name] <= after[name], (name, before[name], got[name])
    return got


def test_the_wall_clock_of_a_running_child_jumps_and_its_monotonic_clock_does_not(shift):
    clock = shift.for_node("broker-a")
    assert clock.offset == 0.0
    child = Child(clock.env())
    try:
        check_offset(child, 0.0)
        clock.jump(3600)
        assert clock.offset == 3600.0
        check_offset(child, 3600.0)
        clock.jump(-7200)
        assert clock.offset == -3600.0
        check_offset(child, -3600.0)
        clock.jump(0.25)  # a fraction of a second, with a negative total
        assert clock.offset_ns == -3599_750_000_000
        check_offset(child, -3599.75)
        clock.reset()
        assert clock.offset == 0.0
        check_offset(child, 0.0)
    finally:
        err = child.stop()
    assert "Traceback" not in err, err


def test_nodes_move_apart(shift):
    """Each node has its own offset: moving one leaves the other where it is."""
    ahead, behind = shift.for_node("ahead"), shift.for_node("behind")
    children = [Child(ahead.env()), Child(behind.env())]
    try:
        ahead.jump(600)
        behind.jump(-600)
        check_offset(children[0], 600.0)
        check_offset(children[1], -600.0)
    finally:
        for child in children:
            child.stop()


@pytest.mark.parametrize("problem", ["missing", "empty", "directory", "unset"])
def test_without_a_usable_offset_file_the_shim_adds_nothing(shift, tmp_path, problem):
    """The shim never breaks a process: no file, a file too short to hold an offset (a
    mapping past its end would raise SIGBUS), a path it cannot map, no variable."""
    env = shift.for_node("n1").env()
    if problem == "missing":
        env[ENV_FILE] = str(tmp_path / "missing.offset")
    elif problem == "empty":
        (tmp_path / "empty.offset").write_bytes(b"")
        env[ENV_FILE] = str(tmp_path / "empty.offset")
    elif problem == "directory":
        env[ENV_FILE] = str(tmp_path)
    else:
        del env[ENV_FILE]
    child = Child(env)
    try:
        check_offset(child, 0.0)
    finally:
        err = child.stop()
    assert "Traceback" not in err, err


def test_a_build_is_reused(tmp_path):
    first = ClockShift.build(tmp_path)
    built = first.library.stat()
    again = ClockShift.build(tmp_path)
    assert again.library == first.library and first.library.name.startswith("libclockshift-")
    reused = again.library.stat()
    assert (reused.st_ino, reused.st_mtime_ns) == (built.st_ino, built.st_mtime_ns)
    assert [p.name for p in tmp_path.iterdir()] == [first.library.name]  # no leftovers


def test_a_failed_build_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "cc -include no-such-header-for-clockshift.h")
    with pytest.raises(ClockShiftUnavailable, match="no-such-header-for-clockshift.h"):
        ClockShift.build(tmp_path)
    monkeypatch.setenv("CC", "no-such-compiler-for-clockshift")
    with pytest.raises(ClockShiftUnavailable, match="no C compiler"):
        ClockShift.build(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_environment_appends_to_ld_preload(shift):
    clock = shift.for_node("n1")
    env = clock.env({"LD_PRELOAD": "/opt/a.so:/opt/b.so"})
    assert env == {"LD_PRELOAD": f"/opt/a.so /opt/b.so {shift.library}",
                   ENV_FILE: str(clock.path)}
    assert clock.env(env) == env  # not twice
    assert clock.env({})["LD_PRELOAD"] == str(shift.library)


def test_a_node_clock_made_again_is_reset_in_place(shift):
    """``for_node`` on an existing file sets it to 0 in the same file, so a node that still
    maps it sees the reset."""
    clock = shift.for_node("n1")
    clock.jump(-30)
    inode = clock.path.stat().st_ino
    again = shift.for_node("n1")
    assert again == clock and again.offset == 0.0 and clock.path.stat().st_ino == inode
    with pytest.raises(ValueError, match="a node name"):
        shift.for_node("../n1")
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        clock.jump(300 * 365 * 86400)  # beyond 64-bit nanoseconds


def test_a_trio_ha_command_logs_on_the_shifted_clock(shift, tmp_path):
    """The real executable under the shim, a day ahead: its log lines (JSON, UTC) carry
    tomorrow's time."""
    clock: NodeClock = shift.for_node("demo")
    clock.jump(86400)
    before = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "--log-format", "json", "--log-level", "info",
         "store-demo", "--dir", str(tmp_path / "store"), "--count", "1"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **clock.env()})
    after = time.time()
    assert done.returncode == 0, done.stderr[-3000:]
    stamps = [datetime.datetime.fromisoformat(json.loads(line)["time"]).timestamp()
              for line in done.stderr.splitlines() if line.startswith("{")]
    assert stamps, done.stderr[-3000:]
    for stamp in stamps:
        assert before + 86400 - SLACK <= stamp <= after + 86400 + SLACK, stamp - after
