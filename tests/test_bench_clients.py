"""`trio-ha bench produce --quick`, `bench consume --quick` and `bench restarts --quick` run end
to end against a name server, a master and a slave in child processes: every configuration is
reported, with no failures, next to the loopback round trip. (Benchmarks print figures;
nothing here asserts a duration or a rate.)"""

import json
import os
import subprocess
import sys


def _run(command: str, tmp_path) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "bench", command, "--quick", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    # The scratch directory (stores, logs) is gone, and so are the nodes.
    assert not [name for name in os.listdir(tmp_path) if name.startswith("trio-ha-bench")]
    return results


def _pid_gone(pid: int) -> bool:
    """No node process of ours runs under ``pid`` (a reused pid runs something else)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return b"trio_ha.testing.node" not in command or state == "Z"


def test_bench_produce_quick_reports_every_configuration(tmp_path):
    results = _run("produce", tmp_path)
    names = {r["bench"] for r in results}
    assert {"produce.config", "produce.cluster", "limit.loopback_rtt",
            "limit.loopback_rtt_trio", "produce.send", "produce.summary"} <= names
    assert results[0]["bench"] == "produce.config"
    assert results[-1]["bench"] == "produce.summary"

    clusters = [r for r in results if r["bench"] == "produce.cluster"]
    assert [c["master_role"] for c in clusters] == ["ASYNC_MASTER", "SYNC_MASTER"]
    for cluster in clusters:
        assert cluster["slave_connected"] and cluster["topic_routed"], cluster
    assert len([r for r in results if r["bench"] == "limit.loopback_rtt"]) == 2
    # what one wake-up costs each side, the floor under a per-message CPU figure
    for rtt in (r for r in results if r["bench"].startswith("limit.loopback_rtt")):
        sides = rtt["cpu_us_per_round_trip"]
        assert sides["this_process"] > 0 and sides["echo_process"] > 0, rtt

    sends = [r for r in results if r["bench"] == "produce.send"]
    assert sorted((r["master_role"], r["mode"], r["producers"], r["client_instances"])
                  for r in sends) == sorted(
        (role, mode, producers, instances)
        for role in ("ASYNC_MASTER", "SYNC_MASTER")
        for mode in ("single", "batch")
        for producers, instances in ((1, 1), (16, 1), (16, 4), (32, 1))
    )
    for r in sends:
        assert r["failures"] == 0 and r["failures_by_status"] is None, r
        assert r["messages"] > 0 and r["msgs_per_s"] > 0, r
        assert r["messages"] == r["sends"] * (32 if r["mode"] == "batch" else 1), r
        assert r["body_size"] == 1024 and r["slave"] is True
        assert r["latency_us"]["p50"] > 0 and r["latency_us"]["p99"] >= r["latency_us"]["p50"]
        assert r["limit"]["value"] > 0 and r["limit"]["p99_us"] > 0, r
        assert r["slave_caught_up"], r
        targeted = (r["master_role"], r["producers"], r["client_instances"]) == (
            "SYNC_MASTER", 16, 1)
        assert isinstance(r.get("meets_target"), bool) == targeted, r
        # the median pass, and the spread of every pass's rate around it
        spread = r["spread_msgs_per_s"]
        assert spread["min"] <= spread["median"] == r["msgs_per_s"] <= spread["max"], r
        assert set(r["cpu_us_per_msg"]) == {"client", "master", "slave"}, r
        assert all(v >= 0 for v in r["cpu_us_per_msg"].values()), r

    summary = results[-1]
    # issue 11: two rates, CPU per send of master, slave and client, one producer's p50
    assert [t["target"].split()[0] for t in summary["targets"]] == [
        "msgs_per_s", "msgs_per_s", "cpu_us_per_msg", "cpu_us_per_msg", "cpu_us_per_msg",
        "p50_us"]
    assert all(isinstance(t["meets"], bool) for t in summary["targets"])
    # beside each rate target, what 32 producers reach (the loop of 16 in flight runs in
    # rounds; more in flight shows the code's rate once the loop is not the bound)
    assert all(t["with_32_producers_msgs_per_s"] > 0 for t in summary["targets"][:2])
    assert all(t["limit_trio_cpu_us_per_wake"] > 0 for t in summary["targets"]
               if t["target"].startswith(("cpu_us_per_msg", "p50_us"))), summary["targets"]
    assert isinstance(summary["all_met"], bool)
    assert summary["failures"] == 0
    for cluster in clusters:
        assert _pid_gone(cluster["master"]["pid"]) and _pid_gone(cluster["slave"]["pid"])


def test_bench_consume_quick_reports_master_and_slave(tmp_path):
    results = _run("consume", tmp_path)
    names = {r["bench"] for r in results}
    assert {"consume.config", "consume.cluster", "consume.preload", "limit.loopback_rtt",
            "limit.loopback_rtt_trio", "consume.pull", "consume.stream",
            "consume.summary"} <= names
    assert results[-1]["bench"] == "consume.summary"

    cluster = next(r for r in results if r["bench"] == "consume.cluster")
    assert cluster["master_role"] == "SYNC_MASTER" and cluster["slave_connected"]
    preload = next(r for r in results if r["bench"] == "consume.preload")
    assert preload["failures"] == 0 and preload["messages"] > 0, preload
    assert preload["slave_has_all"], preload
    assert len(preload["queues"]) == 4
    assert sum(q["max"] - q["min"] for q in preload["queues"].values()) == preload["messages"]

    pulls = [r for r in results if r["bench"] == "consume.pull"]
    assert sorted(r["source"] for r in pulls) == ["master", "slave"]
    for r in pulls:
        assert r["failures"] == 0 and r["failures_by_status"] is None, r
        assert r["messages"] > 0 and r["msgs_per_s"] > 0, r
        assert r["queues_pulled"] == 4 and r["pull_batch"] == 32
        assert r["messages"] <= r["expected_messages"] == preload["messages"]
        # every pull went where it was meant to
        assert set(r["pulls_by_address"]) == {r["pulled_from"]}, r
        address = cluster["master" if r["source"] == "master" else "slave"]["addr"]
        assert r["pulled_from"] == address
        assert r["latency_us"]["p50"] > 0 and r["limit"]["value"] > 0
        assert isinstance(r.get("meets_target"), bool) == (r["source"] == "master")

    stream = next(r for r in results if r["bench"] == "consume.stream")
    assert stream["failures"] == 0 and stream["messages"] > 0, stream

    summary = results[-1]
    assert len(summary["targets"]) == 1 and isinstance(summary["all_met"], bool)
    assert summary["failures"] == 0
    assert _pid_gone(cluster["master"]["pid"]) and _pid_gone(cluster["slave"]["pid"])


def test_bench_restarts_quick_counts_every_answer_around_each_restart(tmp_path):
    """`trio-ha bench restarts --quick`: the master is killed and started again twice under
    four producers; every answer is counted by status, the SLAVE_NOT_AVAILABLE share is
    reported against issue 11's bound, and each restart has its timings."""
    config, result = _run("restarts", tmp_path)
    assert config["bench"] == "restarts.config" and config["kills"] == 2
    assert result["bench"] == "restarts.result"
    assert result["answered"] == sum(result["statuses"].values()) > 0
    assert set(result["statuses"]) <= {"SEND_OK", "SLAVE_NOT_AVAILABLE", "FLUSH_SLAVE_TIMEOUT",
                                       "FLUSH_DISK_TIMEOUT"}
    assert 0 <= result["slave_not_available_share"] <= 1
    assert isinstance(result["meets_target"], bool)
    assert len(result["restart_seconds"]) == len(result["first_send_ok_after_ready_ms"]) == 2
    assert all(s > 0 for s in result["restart_seconds"])
