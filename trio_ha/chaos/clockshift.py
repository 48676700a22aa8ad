"""Clock jumps for one child process: its wall clock moves, the machine's does not.

Why: a broker reads the wall clock for what it stamps (store and born timestamps, index file
names, log lines) while its timeouts run on the monotonic clock. An operator's NTP step or a
VM resumed after hours moves the first and not the second, and the chaos harness needs to
make that happen to one node of a running cluster: forward or backward, at a chosen moment,
without root, without touching the other nodes, and without a hook in the product code.

How: ``clockshift.c``, next to this module, is an ``LD_PRELOAD`` shim that interposes libc's
``clock_gettime`` (the wall clocks only: CLOCK_REALTIME, _COARSE and CLOCK_TAI),
``gettimeofday`` and ``time``, and adds an offset read from an 8-byte file that it maps
shared at its first call. The harness changes the offset by writing the file through its own
mapping; the node's next clock read sees it, with no system call and no signal. CPython's
``time.time()``, ``time.time_ns()`` and ``datetime.now()`` read ``clock_gettime
(CLOCK_REALTIME)`` through the dynamic linker, so they move; ``time.monotonic()`` and
``time.perf_counter()`` (trio's clock) do not. Statically linked code and direct system calls
are out of its reach, and so are the times the kernel keeps itself (file mtimes).

Use::

    shift = ClockShift.build(run_dir)          # compiles once per source (cached by hash)
    clock = shift.for_node("slave1")           # offset file at 0
    subprocess.Popen(cmd, env={**os.environ, **clock.env()})
    clock.jump(+3600)                          # the node is an hour ahead from now on
    clock.reset()

Children of the node inherit the shim and the file, so they move with it. The file must
exist before the node starts (``for_node`` creates it) and must never be truncated below 8
bytes while a node maps it (the reader would take SIGBUS): reuse it, do not recreate it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import mmap
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

from .._errors import TrioHAError

__all__ = ["ENV_FILE", "ClockShift", "ClockShiftUnavailable", "NodeClock", "available"]

#: the variable that names a process's offset file (read by the shim, once)
ENV_FILE = "TRIO_HA_CLOCK_SHIFT_FILE"
#: the offset: one signed 64-bit count of nanoseconds, native byte order, at byte 0
OFFSET_SIZE = 8
#: how the shim is built (after the compiler; the source comes on stdin)
CFLAGS = ("-O2", "-Wall", "-Wextra", "-shared", "-fPIC")
LIBS = ("-ldl", "-lpthread")
#: how long a build may take
BUILD_TIMEOUT = 120.0

_NODE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class ClockShiftUnavailable(TrioHAError, RuntimeError):
    """The shim cannot be used here: no compiler, a failed build (with the compiler's
    message), a platform without ``LD_PRELOAD``, or a path ``LD_PRELOAD`` cannot carry."""


def _compiler() -> list[str]:
    """``$CC`` (it may carry arguments, as in ``ccache gcc``) or ``cc``."""
    return shlex.split(os.environ.get("CC") or "cc")


def _source() -> bytes:
    return importlib.resources.files("trio_ha.chaos").joinpath("clockshift.c").read_bytes()


@attrs.frozen
class ClockShift:
    """The built shim: a shared object that any number of nodes preload."""

    library: Path

    @classmethod
    def build(cls, work_dir: Path) -> ClockShift:
        """Compile ``clockshift.c`` into ``work_dir/libclockshift-<hash>.so``, or reuse the
        one there: the hash covers the source, the compiler and the flags. Safe against a
        concurrent build of the same file (each writes its own and renames it into place).
        ``work_dir`` is where ``for_node`` puts the offset files too."""
        if not sys.platform.startswith("linux"):
            raise ClockShiftUnavailable(f"LD_PRELOAD interposition needs Linux, not "
                                        f"{sys.platform}")
        source = _source()
        compiler = _compiler()
        if not compiler:
            raise ClockShiftUnavailable("CC is set to nothing")
        key = b"\0".join([source, *(arg.encode() for arg in (*compiler, *CFLAGS, *LIBS))])
        work_dir = Path(work_dir).resolve()
        library = work_dir / f"libclockshift-{hashlib.sha256(key).hexdigest()[:16]}.so"
        if any(c in str(library) for c in ": \t\n"):
            # LD_PRELOAD splits its value on colons and white space
            raise ClockShiftUnavailable(f"LD_PRELOAD cannot name {library}: choose a "
                                        f"directory without colons or spaces in its path")
        if library.is_file():
            return cls(library)
        work_dir.mkdir(parents=True, exist_ok=True)
        partial = library.with_name(f".{library.name}.{os.getpid()}.tmp")
        # "-x c -": the source on stdin, so a package installed anywhere (even zipped) builds
        command = [*compiler, *CFLAGS, "-o", str(partial), "-x", "c", "-", "-x", "none", *LIBS]
        try:
            done = subprocess.run(command, input=source, capture_output=True,
                                  timeout=BUILD_TIMEOUT, check=False)
        except FileNotFoundError:
            raise ClockShiftUnavailable(f"no C compiler: {compiler[0]!r} not found "
                                        f"(set CC to choose one)") from None
        except subprocess.TimeoutExpired:
            partial.unlink(missing_ok=True)
            raise ClockShiftUnavailable(f"{shlex.join(command)} took more than "
                                        f"{BUILD_TIMEOUT:g} s") from None
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            message = done.stderr.decode(errors="replace").strip()
            raise ClockShiftUnavailable(f"{shlex.join(command)} failed "
                                        f"(exit {done.returncode}): {message}")
        os.replace(partial, library)
        return cls(library)

    def for_node(self, name: str) -> NodeClock:
        """The clock of node ``name``: its offset file, next to the library, at 0. An
        existing file is set to 0 in place (a node that still maps it sees the reset)."""
        if not _NODE_NAME.fullmatch(name):
            raise ValueError(f"a node name for a file name, not {name!r}")
        clock = NodeClock(name, self.library, self.library.parent / f"clock-{name}.offset")
        fd = os.open(clock.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if os.fstat(fd).st_size < OFFSET_SIZE:
                os.ftruncate(fd, OFFSET_SIZE)  # zeros: the offset 0
        finally:
            os.close(fd)
        clock.reset()
        return clock


@attrs.frozen
class NodeClock:
    """One node's wall-clock offset: the environment that gives it to a process, and the
    moves that change it while the process runs."""

    name: str
    library: Path
    #: the offset file (``ENV_FILE`` names it to the node)
    path: Path

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The variables to add to the node's environment: ``LD_PRELOAD`` (the shim after
        what ``base``, by default this process's environment, already preloads) and
        ``ENV_FILE``."""
        base = os.environ if base is None else base
        preload = base.get("LD_PRELOAD", "").split()
        preload = [p for entry in preload for p in entry.split(":") if p]
        if str(self.library) not in preload:
            preload.append(str(self.library))
        return {"LD_PRELOAD": " ".join(preload), ENV_FILE: str(self.path)}

    @property
    def offset_ns(self) -> int:
        """The node's wall clock minus the machine's, nanoseconds."""
        with _mapped_offset(self.path) as slot:
            return slot[0]

    @property
    def offset(self) -> float:
        """The node's wall clock minus the machine's, seconds."""
        return self.offset_ns / 1e9

    def jump(self, seconds: float) -> None:
        """Move the node's wall clock by ``seconds`` (forward if positive, backward if
        negative) from where it is; its next clock read sees the move."""
        self.set_offset_ns(self.offset_ns + round(seconds * 1e9))

    def set_offset(self, seconds: float) -> None:
        """Put the node's wall clock ``seconds`` away from the machine's."""
        self.set_offset_ns(round(seconds * 1e9))

    def set_offset_ns(self, offset: int) -> None:
        """Put the node's wall clock ``offset`` nanoseconds away from the machine's."""
        if not -(2**63) <= offset < 2**63:
            raise ValueError(f"a clock offset of {offset} ns does not fit in 64 bits "
                             f"(about 292 years each way)")
        with _mapped_offset(self.path) as slot:
            # One store of 8 aligned bytes, so the node never reads half of the old offset
            # and half of the new: the mapping starts on a page, and a memoryview of format
            # "q" assigns an item with a fixed-size 8-byte memcpy (PACK_SINGLE in CPython's
            # Objects/memoryobject.c), which compiles to one 64-bit move; aligned 64-bit
            # stores are single-copy atomic on x86-64 and AArch64, and the shim's load is an
            # atomic one. (struct.pack_into("<q", ...) would not do: it writes the standard
            # sizes into the buffer a byte at a time.)
            slot[0] = offset

    def reset(self) -> None:
        """Back to the machine's wall clock."""
        self.set_offset_ns(0)


@contextlib.contextmanager
def _mapped_offset(path: Path) -> Iterator[memoryview]:
    """The offset file mapped shared, as a one-item memoryview of format ``q``; the views
    are released before the mapping closes (mmap refuses to close under a live view)."""
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), OFFSET_SIZE) as mapped, \
            memoryview(mapped) as raw, raw.cast("q") as slot:
        yield slot


@functools.cache
def available() -> str | None:
    """None when the shim can be used here (Linux, and it builds), else why not."""
    with tempfile.TemporaryDirectory(prefix="clockshift-") as scratch:
        try:
            ClockShift.build(Path(scratch))
        except ClockShiftUnavailable as exc:
            return str(exc)
    return None
