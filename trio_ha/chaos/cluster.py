"""The cluster a chaos run breaks: real ``trio-ha`` processes started from conf files.

Each node (``trio-ha namesrv``, ``trio-ha broker -c <node>.conf``) is a child in its own
process group (``start_new_session``), with its own store directory and log file under the
run directory, on ports chosen once and kept across restarts, so a node that comes back is
found where it was. A slave copies from its master through a :class:`FaultProxy` (its
``haMasterAddress`` is the proxy's), so the harness can stall, slow or cut the replication
stream at an exact byte.

In controller mode the name server may embed the controller (``enableControllerInNamesrv``,
from a conf file), and ``trio-ha controller -c <name>.conf`` processes are nodes too.

The nodes are the executable an operator runs, not an in-process stand-in: SIGKILL leaves
what a crash leaves, SIGSTOP freezes every thread of the node, and a restart runs recovery.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs

from .._errors import TrioHAError
from ..testing import free_broker_port

__all__ = ["ChaosNode", "NodeStartError", "node_command"]

#: how long a node may take to say it serves (recovery of a store included)
START_TIMEOUT = 60.0


class NodeStartError(TrioHAError, RuntimeError):
    """A node did not come up: its command, and the end of its log."""


def node_command() -> list[str]:
    """The ``trio-ha`` executable next to this interpreter, or the module form."""
    exe = Path(sys.executable).parent / "trio-ha"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "trio_ha.cli"]


@attrs.define(eq=False)
class ChaosNode:
    """One process of the cluster: how to start it, and the running process if any."""

    name: str
    #: the arguments after ``trio-ha`` (global options included)
    args: list[str]
    log_path: Path
    #: ``host:port`` clients (or brokers, for the name server) connect to
    addr: str
    #: the store directory (brokers only)
    store_dir: Path | None = None
    #: what the command runs under: ``ip netns exec <host>`` on a test host
    prefix: list[str] = attrs.field(factory=list)
    #: variables added to the node's environment (the clock shim's)
    env: dict[str, str] = attrs.field(factory=dict)
    process: subprocess.Popen | None = None
    paused: bool = False
    starts: int = 0
    #: a process that is not ``trio-ha`` (RocketMQ's own, a JVM): its whole command line,
    #: the regular expression of its readiness line, and its working directory. Its output
    #: goes to ``log_path`` (a JVM writes to stdout for as long as it lives: a pipe nobody
    #: reads would fill and stop it), where the readiness line is looked for.
    command: list[str] | None = None
    ready: str | None = None
    cwd: Path | None = None
    #: how long it may take to say it serves (a JVM's boot, a store's recovery)
    start_timeout: float = START_TIMEOUT

    @classmethod
    def broker(cls, run_dir: Path, name: str, properties: dict[str, str],
               *, log_level: str = "info", prefix: list[str] | None = None) -> ChaosNode:
        """A broker from ``properties`` (RocketMQ keys; listenPort and brokerIP1 fixed): its
        conf file is written under ``run_dir``."""
        conf = run_dir / f"{name}.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        log_path = run_dir / f"{name}.log"
        return cls(name, ["--log-level", log_level, "--log-file", str(log_path), "broker",
                          "-c", str(conf)], log_path,
                   f"{properties['brokerIP1']}:{properties['listenPort']}",
                   store_dir=Path(properties["storePathRootDir"]), prefix=prefix or [])

    @classmethod
    def namesrv(cls, run_dir: Path, *, host: str = "127.0.0.1", log_level: str = "info",
                prefix: list[str] | None = None,
                properties: dict[str, str] | None = None) -> ChaosNode:
        """A name server on a free port of ``host``; with ``properties`` (the embedded
        controller's keys, say) from a ``namesrv.conf`` written under ``run_dir``."""
        port = free_broker_port()
        log_path = run_dir / "namesrv.log"
        args = ["--log-level", log_level, "--log-file", str(log_path), "namesrv",
                "--port", str(port), "--bind", host]
        if properties:
            conf = run_dir / "namesrv.conf"
            conf.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
            args += ["-c", str(conf)]
        return cls("namesrv", args, log_path, f"{host}:{port}", prefix=prefix or [])

    @classmethod
    def controller(cls, run_dir: Path, name: str, properties: dict[str, str], *,
                   log_level: str = "info", prefix: list[str] | None = None) -> ChaosNode:
        """A ``trio-ha controller`` from ``properties`` (listenPort and bindAddress set):
        its conf file is written under ``run_dir``."""
        conf = run_dir / f"{name}.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        log_path = run_dir / f"{name}.log"
        return cls(name, ["--log-level", log_level, "--log-file", str(log_path), "controller",
                          "-c", str(conf)], log_path,
                   f"{properties['bindAddress']}:{properties['listenPort']}",
                   prefix=prefix or [])

    @classmethod
    def foreign(cls, name: str, command: list[str], *, log_path: Path, addr: str, ready: str,
                cwd: Path, store_dir: Path | None = None) -> ChaosNode:
        """A node that is not ``trio-ha`` (a RocketMQ server): ``command`` as it is, ready
        once its output matches ``ready``."""
        return cls(name, [], log_path, addr, store_dir=store_dir, command=command,
                   ready=ready, cwd=cwd)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float | None = None) -> None:
        """Start the node and return once it says it serves (blocking: run it in a thread)
        or ``timeout`` (its ``start_timeout`` by default) has passed."""
        timeout = self.start_timeout if timeout is None else timeout
        if self.running:
            raise RuntimeError(f"{self.name} is running")
        self.paused = False
        if self.command is not None:
            self._start_foreign(timeout)
            return
        # (``ip netns exec`` execs the node in its place: the pid, and so the process group
        # the signals go to, is the node's)
        self.process = subprocess.Popen(
            [*self.prefix, *node_command(), *self.args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True, env={**os.environ, **self.env} if self.env else None)
        self.starts += 1
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, left))
            line = self.process.stdout.readline() if ready else ""
            if "serving on" in line or "listening on" in line:
                return
            if not ready or not line:
                self.kill()
                raise NodeStartError(f"{self.name} did not start ({' '.join(self.args)}); "
                                     f"last words: {line.strip()!r}; log: {self.log_tail()}")

    def _start_foreign(self, timeout: float) -> None:
        assert self.command is not None and self.ready is not None
        if self.cwd is not None:
            self.cwd.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            offset = log.tell()
            self.process = subprocess.Popen(
                [*self.prefix, *self.command], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=self.cwd, start_new_session=True,
                env={**os.environ, **self.env} if self.env else None)
        self.starts += 1
        pattern = re.compile(self.ready)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # bounded by the deadline
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                if pattern.search(log.read().decode(errors="replace")):
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.kill()
        raise NodeStartError(f"{self.name} did not start ({' '.join(self.command[-3:])}); "
                             f"log: {self.log_tail()}")

    def log_tail(self, limit: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log)"

    def signal(self, signum: int) -> None:
        """``signum`` to the node's whole process group."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL (a crash: no ``finally`` runs, the abort file stays) and reap."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.signal(signal.SIGKILL)
        self.process.wait()
        self._close_pipe()
        self.paused = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a graceful stop) and wait; SIGKILL after ``timeout``. The exit status."""
        if self.process is None:
            return None
        if self.paused:
            self.resume()
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_pipe()
        return self.process.returncode

    def _close_pipe(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
