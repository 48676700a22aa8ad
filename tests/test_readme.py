"""Every example in README.md, run as a reader would run it.

The Python blocks run one after another in one scratch directory (the Spark example reads the
store the embedding example wrote), with ``NAMESRV_ADDR`` pointing at a real cluster of
child processes. The tour (the ``bash`` block) runs in bash with the ``trio-ha`` executable on
PATH and the repository's ``conf/`` files copied in. The only edits are the ports: the
examples use RocketMQ's usual ones (9876, 10911...), and a test must take free ones.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: what each Python block must print, by a word of its first lines
EXPECTED_OUTPUT = {
    "open_pull_consumer": ["SEND_OK", "payment #9", "lag: 0"],
    "open_push_consumer": ["got disk 91% full tags urgent"],
    "open_store": ["PUT_OK", "b'order #1' new"],
    "serve_broker": ["broker serving on 127.0.0.1:"],
    "spark_session": ["Orders"],
}


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.S | re.M)


def spark_available() -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        if os.environ.get("TRIO_HA_REQUIRE_SPARK") == "1":
            raise
        return False
    return True


def test_the_readme_has_the_examples_this_test_runs():
    python = blocks("python")
    assert len(python) == len(EXPECTED_OUTPUT)
    for word in EXPECTED_OUTPUT:
        assert sum(word in block for block in python) >= 1, word
    assert len(blocks("bash")) == 1


def test_every_python_example_runs(tmp_path):
    config = ClusterConfig(data_dir=str(tmp_path / "cluster"), master_port=free_broker_port())
    env = {**os.environ}
    with ProcessCluster.start(config) as cluster:
        env["NAMESRV_ADDR"] = cluster.namesrv_addr
        for block in blocks("python"):
            word = next(w for w in EXPECTED_OUTPUT if w in block)
            if word == "spark_session" and not spark_available():
                continue  # pragma: no cover - only without the spark extra (see bin/test)
            done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{word} example failed:\n{done.stderr[-3000:]}"
            for expected in EXPECTED_OUTPUT[word]:
                assert expected in done.stdout, f"{word}: {expected!r} not in\n{done.stdout}"


def _free_ports(conf: Path, ports: dict[int, int]) -> None:
    text = conf.read_text()
    for old, new in ports.items():
        text = text.replace(str(old), str(new))
    conf.write_text(text)


def test_the_tour_runs_as_written(tmp_path):
    """Start a cluster from conf/, send, consume, SIGKILL the master, consume the rest from
    the slave, restart the master: every step exits 0 and says what the README says."""
    (script,) = blocks("bash")
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    namesrv_port = free_broker_port()
    ports = {9876: namesrv_port}
    for port in (10911, 10921):
        # listenPort, haListenPort (+1) and the VIP port (-2) of each broker
        free = free_broker_port()
        ports.update({port: free, port + 1: free + 1})
    for conf in (tmp_path / "conf").iterdir():
        _free_ports(conf, ports)
    script = script.replace("127.0.0.1:9876", f"127.0.0.1:{namesrv_port}")
    script = script.replace(" namesrv &", f" namesrv --port {namesrv_port} --bind 127.0.0.1 &")
    assert f"--port {namesrv_port}" in script
    # Stop whatever still runs if a step fails; wait for the nodes' clean stop at the end.
    wrapped = ("set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
               + script + "\nwait\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", wrapped], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    for said in ("sent 1000 to Orders", "{'SEND_OK': 1000}", "billing: lag 600 messages",
                 "sent 100 to Orders", "{'SEND_OK': 100}",
                 "order-1"):  # (query-msg-by-key found them)
        assert said in done.stdout, f"{said!r} not in\n{done.stdout[-4000:]}"
    for said in ("consumed 400 messages of Orders as billing",
                 "consumed 600 messages of Orders as billing"):
        assert said in done.stderr, f"{said!r} not in\n{done.stderr[-4000:]}"
    master_log = (tmp_path / "master.log").read_text()
    assert "recovered after a crash" in master_log  # the restart after SIGKILL
    assert not (tmp_path / "data" / "broker-a" / "abort").exists()  # the final clean stop

