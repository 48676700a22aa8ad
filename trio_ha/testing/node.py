"""One node of a :class:`~trio_ha.testing.processes.ProcessCluster`, as a child process.

``python -m trio_ha.testing.node SPEC`` (SPEC: one JSON object) starts a name server
(``{"kind": "namesrv", "host": ..., "port": ...}``), a broker (``{"kind": "broker",
"properties": {...broker.conf keys...}}``) or a controller (``{"kind": "controller",
"properties": {...controller.conf keys...}}``), prints one JSON line once it serves (its
addresses and pid), and runs until its stdin closes or it gets SIGINT/SIGTERM, then stops
gracefully. Stopping on stdin's end means a parent that dies, even by SIGKILL, leaves no node
behind: the kernel closes the pipe.

Lines on stdin are commands: ``profile-start LABEL`` and ``profile-stop`` run cProfile over
the node's event loop between them and write ``<profile_dir>/<name>-<LABEL>.prof`` when the
spec names a ``profile_dir`` (without one they are ignored). Benchmarks use it to profile
the brokers over exactly the runs they measure.

The parent side is :mod:`trio_ha.testing.processes`; this module is only ever run.
"""

from __future__ import annotations

import cProfile
import json
import logging
import os
import signal
import sys

import trio

from ..broker import BrokerConfig, serve_broker
from ..controller.config import ControllerServerConfig
from ..controller.server import serve_controller
from ..namesrv import NamesrvConfig, serve_namesrv


class NodeProfiler:
    """cProfile over the windows the parent names on stdin."""

    def __init__(self, name: str, directory: str | None) -> None:
        self.name = name
        self.directory = directory
        self.profiler: cProfile.Profile | None = None
        self.label = ""

    def command(self, line: str) -> None:
        verb, _, label = line.strip().partition(" ")
        if self.directory is None:
            return
        if verb == "profile-start":
            self.stop()
            self.label = label or "run"
            self.profiler = cProfile.Profile()
            self.profiler.enable()
        elif verb == "profile-stop":
            self.stop()

    def stop(self) -> None:
        if self.profiler is None or self.directory is None:
            return
        self.profiler.disable()
        os.makedirs(self.directory, exist_ok=True)
        self.profiler.dump_stats(os.path.join(self.directory, f"{self.name}-{self.label}.prof"))
        self.profiler = None


async def serve_until_stopped(profiler: NodeProfiler) -> None:
    """Serve stdin's commands; return when stdin reaches its end or on SIGINT/SIGTERM."""
    async with trio.open_nursery() as nursery:

        async def stdin_commands() -> None:
            stream = trio.lowlevel.FdStream(os.dup(0))
            pending = b""
            async with stream:
                while data := await stream.receive_some(4096):
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        profiler.command(line.decode(errors="replace"))
            nursery.cancel_scope.cancel()

        async def signalled(signals) -> None:
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()

        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            nursery.start_soon(stdin_commands)
            nursery.start_soon(signalled, signals)
            await trio.sleep_forever()


async def serve_node(spec: dict) -> None:
    """Run the node ``spec`` describes until stopped (see the module's docstring)."""
    profiler = NodeProfiler(spec["name"], spec.get("profile_dir"))
    try:
        async with trio.open_nursery() as nursery:
            if spec["kind"] == "namesrv":
                host = spec.get("host", "127.0.0.1")
                _, port = await nursery.start(serve_namesrv, NamesrvConfig.from_properties({
                    "listenPort": str(spec.get("port", 0)), "bindAddress": host,
                    **spec.get("properties", {})}))
                info: dict[str, object] = {"addr": f"{host}:{port}"}
            elif spec["kind"] == "controller":
                properties = {"bindAddress": "127.0.0.1", "listenPort": "0",
                              **spec.get("properties", {})}
                config = ControllerServerConfig.from_properties(properties)
                host, port = await nursery.start(serve_controller, config)
                info = {"addr": f"{host}:{port}"}
            else:
                config = BrokerConfig.from_properties(spec["properties"])
                addresses = await nursery.start(serve_broker, config)
                info = {"addr": addresses.broker_addr, "ha_addr": addresses.ha_addr,
                        "vip_addr": addresses.vip_addr, "role": config.role.value,
                        "metrics_addr": addresses.metrics_addr}
            info["pid"] = os.getpid()
            print(json.dumps(info), flush=True)
            await serve_until_stopped(profiler)
            nursery.cancel_scope.cancel()
    finally:
        profiler.stop()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m trio_ha.testing.node SPEC_JSON", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    logging.basicConfig(level=spec.get("log_level", "WARNING"), stream=sys.stderr,
                        format=f"{spec['name']} %(levelname)s %(name)s: %(message)s")
    try:
        trio.run(serve_node, spec)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
