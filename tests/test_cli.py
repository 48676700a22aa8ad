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
