"""The command line as a newcomer meets it."""

import re
import select
import signal
import socket
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


def _first_line(proc: subprocess.Popen, timeout: float = 30) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output within {timeout} s"
    return proc.stdout.readline()


def test_namesrv_and_broker_commands_serve_until_sigterm(tmp_path):
    """`trio-ha namesrv` and `trio-ha broker -c broker.conf`, as an operator runs them: each
    says where it serves, serves there, and stops cleanly on SIGTERM."""
    procs = []

    def start(*args):
        proc = subprocess.Popen([sys.executable, "-m", "trio_ha.cli", *args], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    try:
        namesrv = start("namesrv", "--port", "0", "--bind", "127.0.0.1")
        listening = re.fullmatch(r"name server listening on (\S+):(\d+)\n", _first_line(namesrv))
        assert listening, "the name server did not say where it listens"
        conf = tmp_path / "broker.conf"
        conf.write_text(
            "brokerRole=SYNC_MASTER\nlistenPort=0\nbindAddress=127.0.0.1\n"
            f"haBindAddress=127.0.0.1\nstorePathRootDir={tmp_path / 'store'}\n"
            f"mappedFileSizeCommitLog=1048576\nnamesrvAddr=127.0.0.1:{listening[2]}\n"
        )
        broker = start("broker", "-c", str(conf))
        serving = re.fullmatch(r"broker broker-a \(SYNC_MASTER\) serving on 127\.0\.0\.1:(\d+), "
                               r"HA 127\.0\.0\.1:(\d+)\n", _first_line(broker))
        assert serving, "the broker did not say where it serves"
        for port in (listening[2], serving[1], serving[2]):
            socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
        for proc in (broker, namesrv):
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            assert "shutting down" in out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
