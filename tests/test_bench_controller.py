"""`trio-ha bench controller --quick` runs end to end, with the journal store and over etcd,
and its rows are well formed and agree with each other. (Benchmarks print figures; nothing
here asserts a duration, a rate or a latency: only counts and the outcome of each election.)"""

import json
import subprocess
import sys
from collections import defaultdict

import pytest

from trio_ha.bench.controller import run_controller_benchmarks

REPLICAS = 3


def _run(tmp_path, store: str) -> dict[str, list[dict]]:
    proc = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "bench", "controller", "--quick",
         "--dir", str(tmp_path), "--store", store],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows: dict[str, list[dict]] = defaultdict(list)
    for line in proc.stdout.splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["bench"]].append(row)
    return rows


def _check(rows: dict[str, list[dict]], store: str, controllers: int) -> None:
    assert set(rows) == {"controller.config", "controller.start", "controller.setup",
                         "controller.heartbeats", "controller.quiet", "controller.election",
                         "controller.summary"}
    (config,) = rows["controller.config"]
    groups, brokers = config["groups"], config["groups"] * REPLICAS
    assert config["store"] == store and config["quick"] and config["brokers"] == brokers
    (start,) = rows["controller.start"]
    assert len(start["controllers"]) == controllers

    # every broker registered; every set got a master and then all three members in sync
    (setup,) = rows["controller.setup"]
    assert setup["failures"] == 0 and setup["brokers"] == brokers
    assert setup["masters"] == groups and setup["sets_of_three_in_sync"] == groups
    requests = setup["requests"]
    for code, expected in (("CONTROLLER_GET_NEXT_BROKER_ID", brokers),
                           ("CONTROLLER_APPLY_BROKER_ID", brokers),
                           ("CONTROLLER_REGISTER_BROKER", brokers),
                           ("CONTROLLER_ELECT_MASTER", groups),
                           ("CONTROLLER_ALTER_SYNC_STATE_SET", groups),
                           ("BROKER_HEARTBEAT", brokers)):
        tally = requests[code]
        assert tally["sent"] == tally["ok"] == expected, (code, tally)
        assert tally["latency_us"]["samples"] == expected

    # heartbeats: every one sent is accounted for, by every controller
    phases = {row["phase"]: row for row in rows["controller.heartbeats"]}
    assert set(phases) == {"steady", "steady-oneway", "stress"}
    for row in phases.values():
        assert row["oneway"] is (row["phase"] == "steady-oneway")
        assert row["brokers_heartbeating"] == brokers
        assert len(row["by_controller"]) == controllers
        for tally in row["by_controller"].values():
            if row["oneway"]:  # no answers: what the controller counted is what it held
                assert tally["ok"] == tally["refused"] == 0
                assert tally["latency_us"]["samples"] == 0
                assert tally["failed"] == 0 and tally["received_in_phase"] > 0
                assert tally["received_by_controller"] >= tally["received_in_phase"]
                continue
            assert tally["ok"] > 0
            assert tally["sent"] == tally["ok"] + tally["refused"] + tally["failed"]
            assert tally["latency_us"]["samples"] == tally["ok"] + tally["refused"]
            # a heartbeat the controller answered, it received
            assert tally["received_by_controller"] >= tally["ok"] + tally["refused"]
            # an answer later than the 1 s interval is also later than 100 ms
            assert tally["late_over_interval"] <= tally["late_over_100ms"]
        polls = row["polls"]
        assert polls["sent"] == polls["ok"] + polls["refused"] + polls["failed"]
        assert row["liveness_samples"] >= 0 and row["members_seen_dead"] >= 0
    assert {row["phase"] for row in rows["controller.quiet"]} == {"before-setup", "with-sets"}
    for row in rows["controller.quiet"]:
        roles = {"leader", "follower"} if controllers == 2 else {"leader"}
        assert roles <= set(row["cpu_cores"])
        if controllers == 2:
            assert row["follower_cpu_ms_per_follow_round"] >= 0

    # each election round: every stopped master replaced by a live in-sync member, and the
    # old master back as a slave afterwards
    rounds = [(row["how"], row["masters_stopped"]) for row in rows["controller.election"]]
    assert rounds == [tuple(r) for r in config["election_rounds"]]
    for row in rows["controller.election"]:
        k = row["masters_stopped"]
        assert row["groups"] == row["elected"] == row["elected_from_live_in_sync"] == k, row
        assert row["restored"] == k
        assert len(row["readable_ms"]["all"]) == k
        assert row["notified"] <= k

    (summary,) = rows["controller.summary"]
    assert summary["elections_complete"] is True
    assert isinstance(summary["meets"], bool)
    assert summary["offered_per_s"] > 0


def test_bench_controller_quick_journal(tmp_path):
    _check(_run(tmp_path, "journal"), "journal", controllers=1)


def test_bench_controller_quick_etcd(tmp_path, etcd_installed):
    _check(_run(tmp_path, "etcd"), "etcd", controllers=2)


def test_bench_controller_refuses_an_unknown_store(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "bench", "controller", "--quick",
         "--dir", str(tmp_path), "--store", "zookeeper"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and "--store" in proc.stderr
    results = run_controller_benchmarks(str(tmp_path), quick=True, store="zookeeper")
    with pytest.raises(ValueError, match="journal, etcd"):
        next(results)
