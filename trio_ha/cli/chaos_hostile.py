"""``trio-ha chaos hostile``: attack a real cluster's ports with hostile input while a good
client uses it, then verify its stores (see trio_ha.chaos.hostile_run)."""

from __future__ import annotations

import json

import typer

from .chaos import chaos_app


@chaos_app.command("hostile")
def chaos_hostile(
    seconds: float = typer.Option(60.0, min=1.0, help="how long the attacks and the fuzzer run"),
    seed: int = typer.Option(0, help="seeds the fuzzer and the attacks' random bytes"),
    connections: int = typer.Option(
        2000, min=10, help="connections each connection flood opens"),
    max_stall: float = typer.Option(
        15.0, min=0.1, help="the longest the good client may go without a successful send"),
    data_dir: str = typer.Option(
        None, help="where the cluster's stores and logs go (kept); by default a temporary "
                   "directory, removed after a run that passed"),
    as_json: bool = typer.Option(False, "--json", help="print the report as one JSON object"),
) -> None:
    """Start a name server, a SYNC_MASTER, a SLAVE and a victim slave (child processes); run
    every hostile-input attack (non-reading clients, partial frames, slowloris, abandoned
    long polls, bad frames, connection floods, invalid input, metadata floods, HA report
    floods, rogue HA slaves and master) and a seeded fuzzer of mutated frames for SECONDS,
    while a good producer and consumer keep working; then stop the nodes and verify every
    store. Exit status 0 only if every node stayed up and stopped cleanly, the good client
    kept working and every store verifies clean; 1 otherwise, naming what failed."""
    from ..chaos.hostile_run import HostilePlan, run_hostile

    report = run_hostile(HostilePlan(seconds=seconds, seed=seed, connections=connections,
                                     max_stall=max_stall, data_dir=data_dir))
    print(json.dumps(report.as_json()) if as_json else report.human(), flush=True)
    if not report.passed:
        raise typer.Exit(1)
