"""``trio-ha dev-cluster``: a whole cluster on loopback in one process, with a status line."""

from __future__ import annotations

import os
import sys

import trio
import typer

from ._app import DEFAULT_DATA_DIR, app, run_until_interrupted


async def _runtime_info(pool, address: str) -> dict[str, str]:
    from ..remoting import RemotingError
    from ..wire.remoting import RemotingCommand, RequestCode
    from ..wire.route import KVTable

    try:
        request = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        reply = await pool.invoke(address, request, 2)
        return KVTable.decode(reply.body).table
    except (RemotingError, ValueError):
        return {}


def _status_line(master: dict, slave: dict) -> str:
    master_end = int(master.get("commitLogMaxOffset", 0) or 0)
    slave_end = int(slave.get("commitLogMaxOffset", 0) or 0)
    return (
        f"master: log {master_end} B, {master.get('putTps', '0')} puts/s, "
        f"{master.get('msgPutTotalTodayNow', '0')} puts | slave: log {slave_end} B, "
        f"lag {max(0, master_end - slave_end)} B, HA {slave.get('haState', '?')}"
    )


@app.command("dev-cluster")
def dev_cluster(
    dir: str = typer.Option(os.path.join(DEFAULT_DATA_DIR, "dev-cluster"), help="data directory"),
    namesrv_port: int = typer.Option(9876, help="name server port"),
    master_port: int = typer.Option(10911, help="master broker port (HA on +1, VIP on -2)"),
    slave_port: int = typer.Option(10921, help="slave broker port"),
    demo: bool = typer.Option(False, help="run a produce/consume round trip first"),
    duration: float = typer.Option(0, help="stop after this many seconds (0: run until Ctrl-C)"),
) -> None:
    """A name server, a SYNC_MASTER and its SLAVE on loopback, with a status line."""
    from ..devcluster import serve_dev_cluster
    from ..remoting import open_client_pool

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cluster = await nursery.start(lambda task_status: serve_dev_cluster(
                dir, namesrv_port=namesrv_port, master_port=master_port,
                slave_port=slave_port, task_status=task_status))
            print(f"name server  {cluster.namesrv_addr}", flush=True)
            print(f"SYNC_MASTER  {cluster.master.broker_addr}  (HA {cluster.master.ha_addr})")
            print(f"SLAVE        {cluster.slave.broker_addr}  (HA {cluster.slave.ha_addr})")
            print(f"data under   {dir}", flush=True)
            if demo:
                from ..demo import round_trip

                await round_trip(cluster)
            async with open_client_pool() as pool:
                with trio.move_on_after(duration if duration > 0 else float("inf")):
                    while True:
                        master = await _runtime_info(pool, cluster.master.broker_addr)
                        slave = await _runtime_info(pool, cluster.slave.broker_addr)
                        end = "\n" if not sys.stdout.isatty() else "\r"
                        print(_status_line(master, slave), end=end, flush=True)
                        await trio.sleep(1)
            nursery.cancel_scope.cancel()
        print("\ncluster stopped cleanly", flush=True)

    run_until_interrupted(main)
