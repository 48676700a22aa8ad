"""`trio-ha bench store --quick` runs end to end and reports every result with its limit.
(Benchmarks print figures; nothing here asserts a duration or a rate.)"""

import json
import subprocess
import sys


def test_bench_store_quick_reports_results_with_limits(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "bench", "store", "--quick", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    names = {r["bench"] for r in results}
    assert {"limit.memcpy_into_mapping", "limit.sync", "limit.sequential_read",
            "store.append", "store.recovery_scan", "store.read", "store.summary"} <= names
    appends = [r for r in results if r["bench"] == "store.append"]
    assert {r["body_size"] for r in appends} == {128, 1024, 16384}
    assert {r["flush"] for r in appends} == {"ASYNC_FLUSH", "SYNC_FLUSH"}
    assert {r["writers"] for r in appends} == {1, 64}
    for r in appends:
        assert r["failures"] == 0 and r["messages"] > 0
        assert r["limit"]["value"] > 0 and r["ratio_to_limit"] > 0
    reads = [r for r in results if r["bench"] == "store.read"]
    assert {(r["body_size"], r["check_crc_on_read"]) for r in reads} == {
        (size, check) for size in (128, 1024, 16384) for check in (True, False)}
    for r in reads:  # every record of the queue read back, none refused
        assert r["messages"] == r["queue_messages"] > 0 and r["us_per_read"] > 0
        if r["check_crc_on_read"]:
            assert r["limit"]["value"] > 0 and r["ratio_to_limit"] > 0
