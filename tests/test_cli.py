"""The command line as a newcomer meets it."""

import subprocess
import sys


def run_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", *args], capture_output=True, text=True, cwd=cwd,
        timeout=120,
    )


def test_demo_puts_restarts_and_reads_back(tmp_path):
    store = tmp_path / "demo"
    first = run_cli("store-demo", "--dir", str(store), "--count", "50", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "{'PUT_OK'}" in first.stdout and "DemoTopic/0 holds 50 messages" in first.stdout
    second = run_cli("store-demo", "--dir", str(store), "--count", "50", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "after a clean stop" in second.stdout
    assert "DemoTopic/0 holds 100 messages" in second.stdout
    assert "hello #99 from trio-ha" in second.stdout


def test_help_lists_commands(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("store-demo", "dev-cluster", "namesrv", "broker", "bench"):
        assert command in result.stdout


def test_dev_cluster_demo_round_trip_and_clean_stop(tmp_path):
    result = run_cli(
        "dev-cluster", "--dir", str(tmp_path / "dc"), "--namesrv-port", "0", "--master-port", "0",
        "--slave-port", "0", "--demo", "--duration", "2", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "produced 100 messages" in out and "['SEND_OK']" in out
    assert "consumed 100 messages back" in out
    assert "lag 0 B, HA transfer" in out
    assert "cluster stopped cleanly" in out
