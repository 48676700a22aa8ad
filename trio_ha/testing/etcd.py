# pyright: strict
"""A real etcd cluster on loopback for tests: the replicated controller's store (issue 39).

The replicated controller keeps its state in etcd, so its tests need the real thing — a
3-member cluster whose members can be killed, paused and restarted — and no imitation of its
raft, its leases or its transactions. :class:`EtcdCluster` runs Debian's ``etcd`` (package
``etcd-server``, 3.4) as child processes, each in its own process group with its own data
directory and log file under a scratch directory, on ports chosen by
:func:`~trio_ha.testing.ports.free_broker_port` (below the ephemeral range, reserved, so a
restarted member finds its ports free again).

It is synchronous, like :class:`~trio_ha.testing.processes.ProcessCluster`: a fixture starts
it once per test module (three members take about a second), and a test that kills a member
wants it dead before its next line::

    with EtcdCluster.start(tmp_path / "etcd") as etcd:
        etcd.endpoints                 # ("http://127.0.0.1:p1", ...), for EtcdClient
        etcd.pause(1); etcd.resume(1)  # SIGSTOP / SIGCONT
        etcd.kill(2); etcd.restart(2)  # SIGKILL; same ports, same data
        etcd.heal()                    # every member running and the cluster healthy

Members still running when the interpreter exits are killed (a test that forgets one, or an
interrupted run, must not leave etcd holding ports on a 2-core machine).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path

import attrs

from .._errors import TrioHAError
from .ports import free_broker_port
from .processes import log_tail

__all__ = ["EtcdCluster", "EtcdMember", "EtcdNotInstalled", "etcd_binary"]

#: the members' raft timing. etcd's defaults (100 ms heartbeats, 1 s election timeout) suit
#: loopback; a member killed in a test is replaced as leader within about a second.
HEARTBEAT_MS = 100
ELECTION_MS = 1000


class EtcdNotInstalled(TrioHAError, RuntimeError):
    """No ``etcd`` executable here (Debian: ``apt-get install etcd-server``; bin/_setup.sh
    installs it where it can)."""


def etcd_binary() -> str:
    """The ``etcd`` executable: ``$TRIO_HA_ETCD`` or the one on PATH."""
    path = os.environ.get("TRIO_HA_ETCD") or shutil.which("etcd")
    if not path or not os.access(path, os.X_OK):
        raise EtcdNotInstalled("no etcd executable on PATH (install Debian's etcd-server, or "
                               "set TRIO_HA_ETCD)")
    return path


#: every member still running, killed at exit
_LIVE: weakref.WeakSet[EtcdMember] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for member in list(_LIVE):
        member.kill()


@attrs.define(eq=False)
class EtcdMember:
    """One etcd process: its name, ports and data directory stay across restarts."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self, binary: str, initial_cluster: str, *, new: bool) -> None:
        """Start the process (``new``: the cluster's first boot; else it rejoins with the
        data it has)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            binary, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", initial_cluster,
            "--initial-cluster-state", "new" if new else "existing",
            "--initial-cluster-token", "trio-ha-test",
            "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_MS),
            # A test writes kilobytes: no 2 GiB backend quota to check, no snapshot churn.
            "--snapshot-count", "10000", "--quota-backend-bytes", str(64 * 1024 * 1024),
        ]
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.paused = False
        _LIVE.add(self)

    def _signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL to its process group (a crash); waits until it is gone."""
        if self.process is None:
            return
        self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        self.paused = False
        _LIVE.discard(self)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (it closes its store), then SIGKILL after ``timeout`` seconds."""
        if self.process is None:
            return
        if self.paused:
            self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        _LIVE.discard(self)

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets but answers nothing (a hung machine)."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def healthy(self, timeout: float = 1.0) -> bool:
        """Its ``/health`` says true (3.4: it is serving and the cluster has a leader)."""
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=timeout) as reply:
                return json.loads(reply.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def tail(self) -> str:
        return log_tail(str(self.log_path)) or "(no output)"


@attrs.define(eq=False)
class EtcdCluster:
    """A running etcd cluster of child processes (see the module's docstring)."""

    binary: str
    root: Path
    members: list[EtcdMember]
    timeout: float = 30.0

    @classmethod
    def start(cls, root: str | os.PathLike[str], *, size: int = 3, timeout: float = 30.0,
              host: str = "127.0.0.1") -> EtcdCluster:
        """Start ``size`` members under ``root`` and wait (at most ``timeout`` seconds) until
        every one is healthy. Raises :class:`EtcdNotInstalled` without an etcd binary.
        ``host``: the address they listen on (the chaos harness's gateway on its test
        network, so that controllers on test hosts reach them)."""
        binary = etcd_binary()
        if size < 1:
            raise ValueError("an etcd cluster needs at least one member")
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        members: list[EtcdMember] = []
        for index in range(size):
            port = free_broker_port()  # reserves port - 2 .. port + 1: client and peer here
            members.append(EtcdMember(f"etcd{index}", port, port + 1, root / f"etcd{index}",
                                      root / f"etcd{index}.log", host))
        cluster = cls(binary, root, members, timeout)
        try:
            for member in members:
                member.spawn(binary, cluster.initial_cluster, new=True)
            cluster.wait_healthy()
        except BaseException:
            cluster.close()
            raise
        return cluster

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every member's client URL, for :class:`~trio_ha.controller.etcd_client.EtcdClient`."""
        return tuple(m.client_url for m in self.members)

    def wait_healthy(self, members: Sequence[EtcdMember] | None = None) -> None:
        """Wait until ``members`` (all running ones by default) report healthy; raise with
        their logs after ``timeout`` seconds or if one exits."""
        waiting = list(members if members is not None else
                       [m for m in self.members if m.running() and not m.paused])
        deadline = time.monotonic() + self.timeout
        while waiting:
            for member in list(waiting):
                if member.process is not None and member.process.poll() is not None:
                    raise RuntimeError(f"etcd member {member.name} exited with status "
                                       f"{member.process.returncode}: {member.tail()}")
                if member.healthy():
                    waiting.remove(member)
            if not waiting:
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"-- {m.name}: {m.tail()}" for m in waiting)
                raise TimeoutError(f"etcd not healthy within {self.timeout:g} s:\n{logs}")
            time.sleep(0.05)

    def kill(self, index: int) -> EtcdMember:
        """SIGKILL member ``index``."""
        member = self.members[index]
        member.kill()
        return member

    def restart(self, index: int) -> EtcdMember:
        """Start member ``index`` again (killing it first if it runs) with its data and
        ports, and wait until it is healthy."""
        member = self.members[index]
        member.kill()
        member.spawn(self.binary, self.initial_cluster, new=False)
        self.wait_healthy([member])
        return member

    def pause(self, index: int) -> EtcdMember:
        """SIGSTOP member ``index``."""
        member = self.members[index]
        member.pause()
        return member

    def resume(self, index: int) -> EtcdMember:
        member = self.members[index]
        member.resume()
        return member

    def heal(self) -> None:
        """Every member running and not paused, and all healthy: what a test sharing the
        cluster may assume when it begins."""
        for member in self.members:
            if member.paused:
                member.resume()
            if not member.running():
                member.spawn(self.binary, self.initial_cluster, new=False)
        self.wait_healthy(self.members)

    def close(self) -> None:
        """Stop every member."""
        for member in self.members:
            member.stop()
