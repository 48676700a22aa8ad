"""`trio-ha bench replication --quick` runs end to end: every catch-up leaves a complete,
identical slave and every result carries its limit. (Benchmarks print figures; nothing here
asserts a duration or a rate.)"""

import json
import os
import subprocess
import sys


def test_bench_replication_quick_reports_results_with_limits(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "bench", "replication", "--quick",
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    names = {r["bench"] for r in results}
    assert {"replication.config", "limit.loopback_transfer", "limit.loopback_rtt",
            "limit.loopback_rtt_trio", "limit.memcpy_into_mapping", "replication.fill",
            "replication.catchup_warmup", "replication.catchup",
            "replication.sync_master", "replication.summary"} <= names
    assert results[-1]["bench"] == "replication.summary"

    transfers = [r for r in results if r["bench"] == "limit.loopback_transfer"]
    assert {(r["method"], r["chunk_bytes"]) for r in transfers} == {
        ("send", 32768), ("sendfile", 32768), ("send", 1 << 20), ("sendfile", 1 << 20)}
    assert all(r["mb_per_s"] > 0 for r in transfers)
    # and into a new file per pass, through its mapping and by splice: the floor of what a
    # slave pays per byte
    into_file = [r for r in results if r["bench"] == "limit.loopback_transfer_into_file"]
    assert {(r["method"], r["chunk_bytes"], r["receive"]) for r in into_file} == {
        (method, 1 << 20, receive)
        for method in ("send", "sendfile") for receive in ("recv_into", "splice")}
    assert all(r["mb_per_s"] > 0 and "new" in r["into"] for r in into_file)

    warmup = next(r for r in results if r["bench"] == "replication.catchup_warmup")
    assert warmup["failures"] == 0 and warmup["identical"], warmup
    assert warmup["bytes_copied"] == warmup["master_bytes"] > 0, warmup

    catchups = [r for r in results if r["bench"] == "replication.catchup"]
    assert {(r["transfer_method"], r["frame_bytes"], r["placement"]) for r in catchups} == {
        (method, frame, placement)
        for method in ("send", "sendfile")
        for frame in (32768, 1 << 20)
        for placement in ("separate_process", "in_process")
    }
    for r in catchups:
        assert r["failures"] == 0 and r["error"] is None, r
        assert r["caught_up"] and r["identical"], r
        assert r["master_bytes"] > 0 and r["bytes_copied"] == r["master_bytes"], r
        assert r["compared_bytes"] == r["master_bytes"], r
        assert r["limit"]["value"] > 0 and r["ratio_to_limit"] > 0
        assert r["into_file_limit"]["value"] > 0 and r["ratio_to_into_file_limit"] > 0
        assert isinstance(r["meets_target"], bool) == (r["frame_bytes"] == 1 << 20)
        spread = r["spread_mb_per_s"]  # the median pass, and the spread of all
        assert spread["min"] <= spread["median"] == r["mb_per_s"] <= spread["max"], r

    syncs = [r for r in results if r["bench"] == "replication.sync_master"]
    assert {(r["placement"], r["producers"]) for r in syncs} == {
        (placement, producers)
        for placement in ("separate_process", "in_process") for producers in (1, 16)
    }
    for r in syncs:
        assert r["failures"] == 0 and r["puts"] > 0, r
        assert r["slave"]["slave_connected"], r
        assert r["latency_us"]["p50"] > 0 and r["limit"]["value"] > 0
        assert isinstance(r["meets_target"], bool)

    summary = results[-1]
    assert len(summary["targets"]) == 4 and len(summary["embedded_targets"]) == 4
    assert isinstance(summary["all_met"], bool)
    # The scratch directory is gone.
    assert not [name for name in os.listdir(tmp_path) if name.startswith("trio-ha-bench")]
