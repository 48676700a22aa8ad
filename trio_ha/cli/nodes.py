"""The commands that run one node: ``namesrv``, ``broker``, ``controller`` and ``store-demo``
(embedded).

A node logs its start (the servers do, as they bind) and its stop (here, around the run): an
operator reading ``--log-file`` must see that a node was stopped on purpose and stopped
cleanly, not only that its lines end — which is also what a crash looks like.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

import trio
import typer

from .. import _backend
from ..config import FlushDiskType, StoreConfig
from ..store import open_store
from ..wire.record import Message
from ._app import DEFAULT_DATA_DIR, app, run_until_interrupted
from ._failures import EXIT_INTERRUPTED, one_line

log = logging.getLogger(__name__)


async def _demo(root: str, count: int) -> None:
    config = StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=1024 * 1024,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
    )
    print(f"trio-ha store demo  (record engine: {_backend.native_backend}, store: {root})")
    async with open_store(config) as store:
        report = store.recovery
        assert report is not None  # an open store has recovered
        print(f"opened: recovery {'after a crash' if report.abnormal else 'after a clean stop'}, "
              f"log ends at {report.end_offset} ({report.records} records verified)")
        before = store.max_queue_offset("DemoTopic", 0)
        started = time.perf_counter()
        results = []
        for i in range(count):
            body = f"hello #{before + i} from trio-ha".encode()
            results.append(await store.put_message(
                Message("DemoTopic", body, tags="demo", keys=f"key-{before + i}"), queue_id=0
            ))
        elapsed = time.perf_counter() - started
        statuses = {r.status.name for r in results}
        print(f"put {count} messages with SYNC_FLUSH in {elapsed * 1000:.1f} ms: {statuses}; "
              f"first msgId {results[0].msg_id}")
    print("closed cleanly; reopening to read back ...")
    async with open_store(config) as store:
        total = store.max_queue_offset("DemoTopic", 0)
        messages = await store.get_messages("DemoTopic", 0, max(0, total - 3), 3)
        for m in messages:
            print(f"  queue offset {m.queue_offset} @ commitlog {m.commitlog_offset}: "
                  f"{m.body.decode()!r} tags={m.tags} keys={m.keys} crc_ok={m.crc_ok}")
        print(f"DemoTopic/0 holds {total} messages; commitlog "
              f"[{store.min_commitlog_offset}, {store.max_commitlog_offset})")


@app.command("store-demo")
def store_demo(
    dir: str = typer.Option(os.path.join(DEFAULT_DATA_DIR, "demo-store"), help="store directory"),
    count: int = typer.Option(1000, min=1, max=1_000_000, help="messages to put"),
) -> None:
    """Put messages into an embedded store, close it, reopen it and read them back."""
    trio.run(_demo, dir, count)


async def _until_stopped(what: str) -> None:
    """Wait in a node's nursery until the node is stopped; then say so, once, before the
    graceful shutdown (draining, final flush) begins."""
    try:
        await trio.sleep_forever()
    except trio.Cancelled:
        log.info("%s: stopping", what)
        raise


def _run_node(what: str, main: Callable[[], Awaitable[None]]) -> None:
    """``run_until_interrupted(main)``, with a line in the log for how the node ended."""
    try:
        run_until_interrupted(main)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:
            log.info("%s stopped cleanly (interrupted)", what)
        raise
    except Exception as exc:
        # The app's group prints the failure on stderr; a --log-file gets it too (on stderr
        # the line would be there twice).
        if any(isinstance(h, logging.FileHandler) for h in logging.getLogger().handlers):
            log.error("%s stopped: %s", what, one_line(exc) or f"{type(exc).__name__}: {exc}")
        raise
    log.info("%s stopped cleanly", what)


def _read_properties(path: str) -> dict[str, str]:
    """A properties file as a mapping; a missing or unreadable file or a bad line is one
    clear error (exit 2, as for any bad option)."""
    from ..config import ConfigError, parse_properties_text

    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror}",
                                 param_hint="--config") from None
    try:
        return parse_properties_text(text)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None


class _Settings(Protocol):
    def to_properties(self) -> Mapping[str, object]: ...


C = TypeVar("C", bound=_Settings)


def _node_config(config_file: str | None, options: dict[str, object | None],
                 parse: Callable[[dict[str, str]], C], print_config: bool) -> C:
    """A node's config: its properties file with the options given on the command line over
    it, parsed by ``parse``; a bad one is one clear error (exit 2). With ``print_config``,
    every setting is printed and the command exits."""
    from ..config import ConfigError

    properties = _read_properties(config_file) if config_file is not None else {}
    properties.update({key: str(value) for key, value in options.items() if value is not None})
    try:
        config = parse(properties)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    if print_config:
        for key, value in config.to_properties().items():
            print(f"{key}={value}")
        raise typer.Exit()
    return config


@app.command()
def namesrv(
    config_file: str | None = typer.Option(None, "-c", "--config",
                                           help="RocketMQ namesrv.conf (options win over it)"),
    port: int | None = typer.Option(None, help="listen port (RocketMQ's default 9876)"),
    bind: str | None = typer.Option(None, help="interface to bind (default 0.0.0.0)"),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=0, max=65535,
        help="serve Prometheus metrics at http://BIND:PORT/metrics (0: any free port)"),
    print_config: bool = typer.Option(False, "-p", "--print-config",
                                      help="print every setting and exit"),
) -> None:
    """Run a name server until Ctrl-C."""
    from ..namesrv import NamesrvConfig, serve_namesrv

    config = _node_config(config_file, {"listenPort": port, "bindAddress": bind,
                                        "metricsPort": metrics_port},
                          NamesrvConfig.from_properties, print_config)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            host, bound = await nursery.start(serve_namesrv, config)
            if config.controller is not None:
                print(f"controller (embedded) listening on {config.controller.bind_address}:"
                      f"{config.controller.listen_port}", flush=True)
            print(f"name server listening on {host}:{bound}", flush=True)
            await _until_stopped("name server")

    _run_node("name server", main)


@app.command()
def controller(
    config_file: str | None = typer.Option(
        None, "-c", "--config", help="RocketMQ controller.conf (options win over it)"),
    port: int | None = typer.Option(None, help="listen port (default: the self peer's port "
                                               "of controllerDLegerPeers, else 9878)"),
    bind: str | None = typer.Option(None, help="interface to bind (default 0.0.0.0)"),
    print_config: bool = typer.Option(False, "-p", "--print-config",
                                      help="print every setting and exit"),
) -> None:
    """Run a controller (RocketMQ 5's controller mode) until Ctrl-C."""
    from ..controller.config import ControllerServerConfig
    from ..controller.server import serve_controller

    config = _node_config(config_file, {"listenPort": port, "bindAddress": bind},
                          ControllerServerConfig.from_properties, print_config)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            host, bound = await nursery.start(serve_controller, config)
            print(f"controller listening on {host}:{bound}", flush=True)
            await _until_stopped("controller")

    _run_node("controller", main)


#: the keys ``-m`` prints (RocketMQ's "important" configuration, and ours)
_IMPORTANT_KEYS = (
    "brokerClusterName", "brokerName", "brokerId", "brokerRole", "flushDiskType",
    "namesrvAddr", "brokerIP1", "listenPort", "haListenPort", "storePathRootDir",
    "mappedFileSizeCommitLog",
)


@app.command()
def broker(
    config_file: str = typer.Option(..., "-c", "--config", help="RocketMQ broker.conf"),
    namesrv_addr: str | None = typer.Option(
        None, "-n", "--namesrv-addr",
        help="name servers, 'host:port;host:port' (wins over the file's namesrvAddr, which "
             "wins over $NAMESRV_ADDR)"),
    print_config: bool = typer.Option(False, "-p", "--print-config",
                                      help="print every setting and exit"),
    print_important: bool = typer.Option(False, "-m", "--print-important",
                                         help="print the main settings and exit"),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=0, max=65535,
        help="serve Prometheus metrics at http://bindAddress:PORT/metrics (0: any free port; "
             "wins over the file's metricsPort)"),
) -> None:
    """Run a broker (store, replication, remoting) from a RocketMQ-style broker.conf."""
    from ..broker import BrokerConfig, serve_broker
    from ..config import ConfigError

    properties = _read_properties(config_file)
    if metrics_port is not None:
        properties["metricsPort"] = str(metrics_port)
    try:
        if namesrv_addr is not None:
            properties["namesrvAddr"] = namesrv_addr
        elif "namesrvAddr" not in properties and os.environ.get("NAMESRV_ADDR"):
            properties["namesrvAddr"] = os.environ["NAMESRV_ADDR"]
        config = BrokerConfig.from_properties(properties)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    if print_config or print_important:
        settings = config.to_properties()
        for key in sorted(settings) if print_config else _IMPORTANT_KEYS:
            if key in settings:
                print(f"{key}={settings[key]}")
        raise typer.Exit()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(serve_broker, config)
            print(f"broker {config.broker_name} ({config.role.value}) serving on "
                  f"{addresses.broker_addr}, HA {addresses.ha_addr}"
                  + (f", metrics http://{addresses.metrics_addr}/metrics"
                     if addresses.metrics_addr else ""), flush=True)
            await _until_stopped(f"broker {config.broker_name}")

    _run_node(f"broker {config.broker_name}", main)
