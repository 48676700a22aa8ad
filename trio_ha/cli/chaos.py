"""``trio-ha chaos ...``: fault-injection runs against real processes (see trio_ha.chaos)."""

from __future__ import annotations

import typer

from ._app import app

chaos_app = typer.Typer(
    no_args_is_help=True,
    help="Fault-injection runs: kill, pause and cut a real cluster under load and check that "
         "nothing acknowledged is lost; attack its ports with hostile input.",
)
app.add_typer(chaos_app, name="chaos")


@chaos_app.command("run")
def chaos_run(
    role: str = typer.Option("SYNC_MASTER", "--role", help="SYNC_MASTER or ASYNC_MASTER"),
    flush: str = typer.Option("SYNC_FLUSH", "--flush", help="SYNC_FLUSH or ASYNC_FLUSH"),
    slaves: int = typer.Option(1, "--slaves", min=1, max=2,
                               help="slaves of the master"),
    sync_acks: int = typer.Option(1, "--sync-acks", min=1, max=2,
                                  help="the master's haSyncAcks (slaves a SEND_OK waits for)"),
    seconds: float = typer.Option(120, "--seconds", min=10, help="how long the load runs"),
    minutes: float = typer.Option(None, "--minutes", min=0.2, help="the same, in minutes"),
    seed: int = typer.Option(1, "--seed", help="the fault schedule's seed (to replay a run)"),
    fault_interval: float = typer.Option(4.0, "--fault-interval", min=0.5,
                                         help="mean seconds between faults"),
    producers: int = typer.Option(2, "--producers", min=1, max=64,
                                  help="producers sending at once"),
    rate: float = typer.Option(40.0, "--rate", min=0.1, help="sends per second per producer"),
    ha_housekeeping_ms: int = typer.Option(
        3000, "--ha-housekeeping-ms", min=500,
        help="the brokers' haHousekeepingInterval (pauses last 1.2-2x it)"),
    kinds: str = typer.Option(
        None, "--kinds", help="the fault kinds, comma-separated (default: every kind this "
                              "machine can inject; see --list-kinds)"),
    network: str = typer.Option(
        "auto", "--network", help="hosts (a network namespace per node: partitions, loss), "
                                  "loopback (proxies on client links), or auto (hosts where "
                                  "they can be made)"),
    settle: float = typer.Option(8.0, "--settle", min=0,
                                 help="seconds the consumer goes on after the producers stop"),
    overlap: bool = typer.Option(False, "--overlap",
                                 help="let a fault start while others still last"),
    controller: str = typer.Option(
        None, "--controller", metavar="embedded|etcd|rocketmq",
        help="controller mode: the brokers take their roles from a controller that fails "
             "the master over (embedded: in the name server, its journal on disk; etcd: "
             "three trio-ha controllers over a 3-member etcd; rocketmq: RocketMQ 5.3.3's "
             "controller and brokers, on loopback). "
             "Faults on 'the master' land on the master of that moment"),
    replay: str = typer.Option(None, "--replay", metavar="RUN_DIR",
                               help="run an earlier run's configuration again (its seed, "
                                    "kinds and timing: the same faults at the same times)"),
    list_kinds: bool = typer.Option(False, "--list-kinds",
                                    help="list the fault kinds and whether each can be "
                                         "injected here, then exit"),
    dir: str = typer.Option(None, "--dir", help="run directory (a new temporary one by "
                                                "default; it is kept)"),
    as_json: bool = typer.Option(False, "--json", help="print the verdict as JSON"),
) -> None:
    """A cluster of trio-ha processes under load while faults are injected on a schedule
    from the seed; then every node is SIGKILLed at once and the history is checked against
    what the stores hold. Exit 0 only if every check passed."""
    import tempfile
    from pathlib import Path

    from ..chaos.plan import ChaosConfig, FaultKind, default_kinds
    from ..chaos.run import capabilities, replay_config, run_chaos

    if list_kinds:
        try:
            _, missing = capabilities(ChaosConfig(network=network, controller=controller,
                                                  kinds=tuple(FaultKind)))
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        for kind in FaultKind:
            why_not = missing.get(kind.value)
            print(f"{kind.value:26} {f'not here: {why_not}' if why_not else 'yes'}")
        return
    try:
        if replay:
            config = replay_config(Path(replay))
        else:
            chosen = (tuple(FaultKind(k.strip()) for k in kinds.split(",")) if kinds
                      else default_kinds(controller))
            config = ChaosConfig(role=role, flush=flush, slaves=slaves, sync_acks=sync_acks,
                                 seconds=minutes * 60 if minutes else seconds, seed=seed,
                                 fault_interval=fault_interval, producers=producers,
                                 rate=rate, ha_housekeeping_ms=ha_housekeeping_ms,
                                 kinds=chosen, overlap=overlap, network=network,
                                 settle_seconds=settle, controller=controller)
        capabilities(config)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None
    run_dir = Path(dir) if dir else Path(tempfile.mkdtemp(prefix="trio-ha-chaos-"))
    if run_dir.exists() and any(run_dir.iterdir()):
        raise typer.BadParameter(f"{run_dir} is not empty: a run needs a directory of its "
                                 f"own", param_hint="--dir")
    _show(run_chaos(config, run_dir), run_dir.resolve(), as_json)


def _show(verdict, run_dir, as_json: bool) -> None:
    import json

    if as_json:
        print(json.dumps(verdict.as_dict()))
    else:
        print(verdict.report())
        print(f"run directory: {run_dir}")
    if not verdict.passed:
        raise typer.Exit(1)


@chaos_app.command("check")
def chaos_check(
    run_dir: str = typer.Argument(..., help="the directory of an earlier run"),
    as_json: bool = typer.Option(False, "--json", help="print the verdict as JSON"),
) -> None:
    """Check an earlier run again from its directory: its history against its stores
    (recovered again). For a run that died before its verdict, or a checker that
    changed. Exit 0 only if every check passed."""
    from pathlib import Path

    from ..chaos.run import check_run

    path = Path(run_dir)
    for needed in ("config.json", "history.jsonl"):
        if not (path / needed).is_file():
            raise typer.BadParameter(f"{path} has no {needed}: not a chaos run directory")
    if not any((path / conf).is_file() for conf in ("master.conf", "broker0.conf")):
        raise typer.BadParameter(f"{path} has no broker conf files: not a chaos run directory")
    _show(check_run(path), path, as_json)
