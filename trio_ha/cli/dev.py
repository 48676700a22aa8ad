"""``trio-ha dev-cluster``: a whole cluster on loopback, with a live status. Classic (a fixed
master and its slaves, all in this process) or, with ``--controller``, RocketMQ 5's
controller mode (the name server embeds the controller; brokers are child processes, so the
demo's SIGKILL of the master is real)."""

from __future__ import annotations

import functools
import os
import sys

import trio
import typer

from ._app import DEFAULT_DATA_DIR, app, run_until_interrupted
from .status import controller_lines, lag_text, puts_per_second


def _status_lines(snapshot: dict) -> list[str]:
    """One line per broker group from a ``status`` snapshot (for output that is not a
    terminal: a log, a pipe)."""
    groups: dict[str, list[dict]] = {}
    for broker in snapshot["brokers"]:
        groups.setdefault(broker["brokerName"], []).append(broker)
    lines = []
    for name, members in groups.items():
        parts = []
        for b in members:
            if b["brokerId"] == 0:
                parts.append(f"{name} {b['role']}: log {b['maxOffset']} B, "
                             f"{puts_per_second(b)} puts/s")
            else:
                parts.append(f"slave{b['brokerId']}: log {b['maxOffset']} B, "
                             f"{lag_text(b.get('lagBytes'))}, HA {b.get('haState', '?')}")
        lines.append(" | ".join(parts))
    if snapshot.get("controller") is not None:
        lines.extend(controller_lines(snapshot["controller"]))
    return lines


def _brokers_table(snapshot: dict):
    from rich.table import Table

    table = Table(title=f"dev cluster at {snapshot['time']}  (Ctrl-C stops it)",
                  header_style="bold")
    for column in ("broker", "role", "address", "log end", "puts/s", "replication"):
        table.add_column(column)
    for b in snapshot["brokers"]:
        if "slaves" in b:
            ha = ", ".join(f"slave acked {s['ackedOffset']}, {lag_text(s['lagBytes'])}"
                           for s in b["slaves"])
        elif "haState" in b:
            ha = f"{b['haState']}, {lag_text(b.get('lagBytes'))}"
            if b.get("divergence"):
                ha += f", DIVERGED: {b['divergence']}"
        else:
            ha = "no slave attached" if b["brokerId"] == 0 else ""
        table.add_row(f"{b['brokerName']}/{b['brokerId']}", b["role"], b["address"],
                      str(b["maxOffset"]), puts_per_second(b), ha)
    if snapshot.get("controller") is not None:
        table.caption = "\n".join(controller_lines(snapshot["controller"]))
    return table


@app.command("dev-cluster")
def dev_cluster(
    dir: str = typer.Option(os.path.join(DEFAULT_DATA_DIR, "dev-cluster"), help="data directory"),
    namesrv_port: int = typer.Option(9876, help="name server port"),
    master_port: int = typer.Option(10911, help="master broker port (HA on +1, VIP on -2); "
                                                "group g adds 100 g"),
    slave_port: int = typer.Option(10921, help="first slave's port (the second's is +10)"),
    slaves: int | None = typer.Option(None, "--slaves", min=0, max=2,
                                      help="slaves per broker group (default 1; 2 with "
                                           "--controller)"),
    async_master: bool = typer.Option(False, "--async-master",
                                      help="ASYNC_MASTER (replicate in the background) instead "
                                           "of SYNC_MASTER"),
    sync_flush: bool = typer.Option(False, "--sync-flush",
                                    help="SYNC_FLUSH: a send is answered once on disk"),
    broker_groups: int = typer.Option(1, "--broker-groups", min=1, max=26,
                                      help="broker groups (broker-a, broker-b...) behind the "
                                           "name server; topics spread across them"),
    demo: bool = typer.Option(False, help="run a produce/consume round trip first (with "
                                          "--controller: the failover demo)"),
    duration: float = typer.Option(0, help="stop after this many seconds (0: run until Ctrl-C)"),
    controller: bool = typer.Option(
        False, "--controller",
        help="controller mode (RocketMQ 5): the name server embeds the controller, each group "
             "is a master and two slaves in child processes that take their roles from it"),
    controller_port: int = typer.Option(9878, help="the embedded controller's port "
                                                   "(with --controller)"),
) -> None:
    """A name server and broker groups (by default one SYNC_MASTER and its SLAVE) on
    loopback, with a live status table; with --controller, a controller-mode cluster."""
    from ..devcluster import serve_dev_cluster
    from .status import cluster_status

    if controller:
        if async_master or sync_flush:
            raise typer.BadParameter("the controller names the roles: --async-master and "
                                     "--sync-flush are for the classic cluster",
                                     param_hint="--controller")
        slaves = 2 if slaves is None else slaves
        if demo and slaves < 1:
            raise typer.BadParameter("the failover demo needs a slave to elect",
                                     param_hint="--slaves")
        _controller_cluster(dir, namesrv_port, controller_port, master_port, slave_port, slaves,
                            broker_groups, demo, duration)
        return
    slaves = 1 if slaves is None else slaves
    role = "ASYNC_MASTER" if async_master else "SYNC_MASTER"
    flush = "SYNC_FLUSH" if sync_flush else "ASYNC_FLUSH"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cluster = await nursery.start(functools.partial(
                serve_dev_cluster, dir, groups=broker_groups, slaves=slaves, master_role=role,
                flush_disk_type=flush,
                namesrv_port=namesrv_port, master_port=master_port, slave_port=slave_port))
            print(f"name server  {cluster.namesrv_addr}", flush=True)
            for i, group in enumerate(cluster.groups):
                name = f"broker-{chr(ord('a') + i)}"
                print(f"{role:<12} {group.master.broker_addr}  (HA {group.master.ha_addr})  "
                      f"{name}, {flush}")
                for slave in group.slaves:
                    print(f"SLAVE        {slave.broker_addr}  (HA {slave.ha_addr})  {name}")
            print(f"data under   {dir}", flush=True)
            if demo:
                from ..demo import round_trip

                await round_trip(cluster)
            with trio.move_on_after(duration if duration > 0 else float("inf")):
                await _show_status(cluster.namesrv_addr, cluster_status)
            nursery.cancel_scope.cancel()
        print("\ncluster stopped cleanly", flush=True)

    run_until_interrupted(main)


def _controller_cluster(dir: str, namesrv_port: int, controller_port: int, master_port: int,
                        slave_port: int, slaves: int, groups: int, demo: bool,
                        duration: float) -> None:
    """``dev-cluster --controller``: the cluster, the failover demo if asked, the status."""
    from ..devcluster import serve_controller_dev_cluster
    from .status import cluster_status

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cluster = await nursery.start(functools.partial(
                serve_controller_dev_cluster, dir, groups=groups, slaves=slaves,
                namesrv_port=namesrv_port, controller_port=controller_port,
                master_port=master_port, slave_port=slave_port))
            print(f"name server  {cluster.namesrv_addr}  (embedded controller "
                  f"{cluster.controller_addr}, its journal under {dir}/controller)", flush=True)
            for broker in cluster.brokers:
                print(f"broker       {broker.addr}  {broker.broker_name}, pid {broker.pid}, "
                      f"conf {broker.conf_path}", flush=True)
            print(f"data under   {dir}  (broker logs in {dir}/logs); roles come from the "
                  "controller", flush=True)
            if demo:
                from ..demo import failover

                await failover(cluster)
            with trio.move_on_after(duration if duration > 0 else float("inf")):
                await _show_status(cluster.namesrv_addr, functools.partial(
                    cluster_status, controllers=[cluster.controller_addr]))
            nursery.cancel_scope.cancel()
        print("\ncluster stopped cleanly", flush=True)

    run_until_interrupted(main)


async def _show_status(namesrv_addr: str, cluster_status) -> None:
    """Refresh the status every second: a live table on a terminal, lines otherwise."""
    from ..client import MQError

    async def snapshot() -> dict | None:
        try:
            return await cluster_status(namesrv_addr)
        except (MQError, OSError):
            return None

    if not sys.stdout.isatty():
        while True:
            snap = await snapshot()
            if snap is not None:
                for line in _status_lines(snap):
                    print(line, flush=True)
            await trio.sleep(1)
    from rich.live import Live

    with Live(auto_refresh=False) as live:
        while True:
            snap = await snapshot()
            if snap is not None:
                live.update(_brokers_table(snap), refresh=True)
            await trio.sleep(1)
