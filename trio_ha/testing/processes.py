"""A cluster of real processes: a name server, a master and its slaves, each a child process.

Some things only real processes show: a master killed with SIGKILL (no ``finally`` runs, the
abort file stays), brokers that do not share one GIL, CPU time per process. A
:class:`ProcessCluster` runs the cluster a :class:`~trio_ha.testing.cluster.ClusterConfig`
describes — the same brokers as the in-process :func:`~trio_ha.testing.cluster.open_cluster`
— with every node in its own interpreter (``python -m trio_ha.testing.node``: it prints its
addresses as one JSON line once it serves, and stops gracefully when its stdin closes).

It is synchronous on purpose: a benchmark keeps one cluster across many ``trio.run`` calls,
and a test that kills a node wants it dead before its next line. Use it as a context
manager; leaving it stops the brokers first (they unregister), then the name server, and
kills whatever has not stopped within the grace period::

    with ProcessCluster.start(ClusterConfig(data_dir=str(tmp_path))) as cluster:
        ...  # cluster.namesrv_addr, cluster.master.addr, cluster.slave.addr
        cluster.master.kill()                  # SIGKILL
        cluster.restart(cluster.master)        # same ports, same store

Each node's stderr goes to ``<log_dir>/<name>.log`` (``<data_dir>/logs`` by default); a node
that fails to start raises with the end of that log.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

import attrs

import trio_ha

from ..broker import BrokerAddresses
from .cluster import ClusterAddresses, ClusterConfig, pinned_ports, restartable
from .ports import free_broker_port

__all__ = ["NodeProcess", "ProcessCluster", "child_env", "log_tail"]

#: the module each node runs (``python -m``)
NODE_MODULE = "trio_ha.testing.node"


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child, with this ``trio_ha`` first on PYTHONPATH
    (so a child of a source checkout runs the same code as its parent)."""
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(trio_ha.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def log_tail(path: str, limit: int = 2000) -> str | None:
    """The last ``limit`` characters of a log file, or None when it is empty or missing."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    text = data.decode(errors="replace").strip()
    return text[-limit:] if text else None


@attrs.define(eq=False)
class NodeProcess:
    """One node in a child process: its spec (what it runs), the process and what it
    reported once it served (``addr``; a broker's ``ha_addr``, ``vip_addr``, ``role``;
    ``pid``)."""

    name: str
    spec: dict
    process: subprocess.Popen
    log_path: str
    info: dict = attrs.field(factory=dict)
    #: seconds from the spawn to its first line
    started_seconds: float = 0.0

    @classmethod
    def start(cls, name: str, spec: dict, *, log_dir: str, timeout: float = 60.0,
              env: Mapping[str, str] | None = None) -> NodeProcess:
        """Spawn the node and wait (at most ``timeout`` seconds) until it serves."""
        spec = {"name": name, **spec}
        log_path = os.path.join(log_dir, f"{name}.log")
        command = [sys.executable, "-m", NODE_MODULE, json.dumps(spec)]
        started = time.perf_counter()
        with open(log_path, "ab") as log:  # the child keeps its own descriptor
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=log, env=child_env(env))
        node = cls(name, spec, process, log_path)
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        line = process.stdout.readline() if ready else b""
        if not line.strip():
            node.stop(timeout=5)
            raise RuntimeError(f"node {name} did not start within {timeout:g} s: "
                               f"{log_tail(log_path)}")
        node.info = json.loads(line)
        node.started_seconds = time.perf_counter() - started
        return node

    @property
    def addr(self) -> str:
        """``host:port`` clients connect to."""
        return self.info["addr"]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def addresses(self) -> BrokerAddresses:
        """A broker's addresses, as ``serve_broker`` reports them."""
        return BrokerAddresses(self.info["addr"], self.info.get("vip_addr"),
                               self.info.get("ha_addr"))

    def poll(self) -> int | None:
        """Its exit status, or None while it runs."""
        return self.process.poll()

    def check(self) -> None:
        """Raise if the node has exited."""
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"node {self.name} exited with status {code}: "
                               f"{log_tail(self.log_path)}")

    def start_profile(self, label: str) -> None:
        """Ask the node to profile until :meth:`stop_profile` (when it has a profile_dir)."""
        self._command(f"profile-start {label}")

    def stop_profile(self) -> None:
        self._command("profile-stop")

    def _command(self, line: str) -> None:
        """One line to the node's stdin; ignored if it has gone."""
        stdin = self.process.stdin
        try:
            assert stdin is not None
            stdin.write(line.encode() + b"\n")
            stdin.flush()
        except (OSError, ValueError):
            pass

    def close_stdin(self) -> None:
        """Tell the node to stop (it stops gracefully when its stdin closes)."""
        stdin = self.process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                stdin.close()

    def wait(self, timeout: float) -> None:
        """Wait until it has exited; kill it after ``timeout`` seconds."""
        try:
            self.process.wait(max(0.1, timeout))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def stop(self, timeout: float = 20.0) -> None:
        """Stop gracefully (close stdin and wait), killing it after ``timeout`` seconds."""
        self.close_stdin()
        self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: no cleanup runs (a crash)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.wait(10)
        self.close_stdin()


@attrs.define(eq=False)
class ProcessCluster:
    """A running cluster of child processes (see the module's docstring)."""

    config: ClusterConfig
    log_dir: str
    namesrv: NodeProcess
    master: NodeProcess
    slaves: list[NodeProcess]
    timeout: float = 60.0
    env: Mapping[str, str] | None = None

    @classmethod
    def start(cls, config: ClusterConfig, *, log_dir: str | None = None, timeout: float = 60.0,
              profile_dir: str | None = None,
              env: Mapping[str, str] | None = None) -> ProcessCluster:
        """Start the name server, then the master, then the slaves, each once the previous
        one serves (at most ``timeout`` seconds each). ``profile_dir``: where nodes write
        the profiles asked for with :meth:`NodeProcess.start_profile`; ``env``: extra
        environment for the nodes."""
        log_dir = log_dir or os.path.join(config.data_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
        started: list[NodeProcess] = []
        common = {"profile_dir": profile_dir}
        # Nodes left to choose (port 0) get their ports now, below the ephemeral range, so that
        # ``restart`` finds them free again (``restartable``).
        host = config.host
        try:
            namesrv = NodeProcess.start("namesrv", {
                "kind": "namesrv", "host": host,
                "port": config.namesrv_port or free_broker_port(host),
                "properties": dict(config.namesrv_properties), **common,
            }, log_dir=log_dir, timeout=timeout, env=env)
            started.append(namesrv)
            for broker_id in range(config.slaves + 1):
                name = "master" if broker_id == 0 else f"slave{broker_id}"
                properties = restartable(config.broker_properties(broker_id, namesrv.addr), host)
                started.append(NodeProcess.start(name, {
                    "kind": "broker", "properties": properties, **common,
                }, log_dir=log_dir, timeout=timeout, env=env))
        except BaseException:
            for node in reversed(started):
                node.stop(timeout=10)
            raise
        return cls(config, log_dir, namesrv, started[1], started[2:], timeout, env)

    def __enter__(self) -> ProcessCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr

    @property
    def slave(self) -> NodeProcess:
        """The first slave."""
        if not self.slaves:
            raise LookupError("this cluster has no slave")
        return self.slaves[0]

    @property
    def brokers(self) -> list[NodeProcess]:
        return [self.master, *self.slaves]

    @property
    def nodes(self) -> list[NodeProcess]:
        return [self.namesrv, *self.brokers]

    @property
    def addresses(self) -> ClusterAddresses:
        return ClusterAddresses(self.namesrv.addr, self.master.addresses,
                                tuple(slave.addresses for slave in self.slaves),
                                self.config.data_dir)

    def check(self) -> None:
        """Raise if a node has exited."""
        for node in self.nodes:
            node.check()

    def restart(self, node: NodeProcess) -> NodeProcess:
        """Stop ``node`` if it runs (gracefully) and start it again on the same ports and
        store; the cluster holds the new process from then on."""
        if node.poll() is None:
            node.stop()
        spec = dict(node.spec)
        if spec["kind"] == "broker":
            spec["properties"] = pinned_ports(spec["properties"], node.addresses)
        else:
            spec["port"] = int(node.addr.rsplit(":", 1)[1])
        fresh = NodeProcess.start(node.name, spec, log_dir=self.log_dir, timeout=self.timeout,
                                  env=self.env)
        if node is self.namesrv:
            self.namesrv = fresh
        elif node is self.master:
            self.master = fresh
        else:
            self.slaves[self.slaves.index(node)] = fresh
        return fresh

    def stop(self, *nodes: NodeProcess, timeout: float = 20.0) -> None:
        """Stop ``nodes`` gracefully, all at once (each is killed if it has not stopped
        within ``timeout`` seconds)."""
        for node in nodes:
            node.close_stdin()
        deadline = time.monotonic() + timeout
        for node in nodes:
            node.wait(deadline - time.monotonic())

    def close(self) -> None:
        """Stop every node: the brokers first (they unregister), then the name server."""
        self.stop(*self.brokers)
        self.stop(self.namesrv)
