"""Ctrl-C on the command line, as an operator presses it: a real SIGINT to a real ``trio-ha``
process. Every command exits 130 with at most one line on stderr; ``produce`` and
``consume`` say how many messages got through, and that count is true."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from conftest import stop_processes

TOPIC = "CtrlCTopic"
#: the longest any wait below takes before the test gives up
WAIT = 60


def start(*args: str, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trio_ha.cli", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_lines(proc: subprocess.Popen, n: int, timeout: float = WAIT) -> list[str]:
    """The first ``n`` lines of ``proc``'s stdout, read straight from the pipe (a buffered
    readline would swallow lines that select then never reports)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while data.count(b"\n") < n:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"not {n} lines within {timeout} s: {data!r}"
        chunk = os.read(fd, 65536)
        assert chunk, f"stdout closed after {data!r}"
        data += chunk
    return data.decode().splitlines()[:n]


def read_line(proc: subprocess.Popen) -> str:
    return read_lines(proc, 1)[0] + "\n"


def interrupt(proc: subprocess.Popen) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        # Where is it stuck? SIGUSR1 makes the CLI print every thread's stack (faulthandler).
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running {WAIT} s after SIGINT; its stacks:\n{err[-6000:]}") from None
    return out, err  # (stdout from where the test stopped reading)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The name server address of a name server and an ASYNC_MASTER, each its own process
    (their logs go to files: stderr is what the tests look at)."""
    root = tmp_path_factory.mktemp("ctrl_c")
    procs: list[subprocess.Popen] = []
    try:
        procs.append(start("--log-file", str(root / "namesrv.log"), "namesrv", "--port", "0",
                           "--bind", "127.0.0.1", cwd=root))
        listening = re.fullmatch(r"name server listening on (\S+)\n", read_line(procs[0]))
        assert listening, "the name server did not start"
        conf = root / "broker.conf"
        conf.write_text(
            "brokerRole=ASYNC_MASTER\nlistenPort=0\nhaListenPort=0\nbindAddress=127.0.0.1\n"
            "haBindAddress=127.0.0.1\nbrokerIP1=127.0.0.1\nvipChannelEnable=false\n"
            f"storePathRootDir={root / 'store'}\nmappedFileSizeCommitLog=4194304\n"
            f"namesrvAddr={listening[1]}\n")
        procs.append(start("--log-file", str(root / "broker.log"), "broker", "-c", str(conf),
                           cwd=root))
        assert "serving on" in read_line(procs[1]), "the broker did not start"
        yield listening[1], root / "store"
    finally:
        stop_processes(procs)


def test_ctrl_c_on_produce_exits_130_with_one_line_saying_how_many_were_acknowledged(
        cluster, tmp_path):
    namesrv, store = cluster
    producer = start("produce", "-t", TOPIC, "-c", "100000000", "-n", namesrv, cwd=tmp_path)
    try:
        # it sends one at a time, round robin over the topic's queues: once a second queue
        # holds a message, the first message's answer has come back
        queues = store / "consumequeue" / TOPIC
        deadline = time.monotonic() + WAIT
        while not (queues.is_dir() and len(list(queues.iterdir())) >= 2):
            assert time.monotonic() < deadline, "nothing arrived at the broker"
            assert producer.poll() is None, producer.communicate()
            time.sleep(0.05)
        _, err = interrupt(producer)
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.communicate()
    assert producer.returncode == 130, err
    assert len(err.splitlines()) == 1, err
    said = re.fullmatch(r"trio-ha: interrupted: (\d+) of 100000000 messages acknowledged by "
                        r"the broker \(SEND_OK \d+\), 0 failed\n", err)
    assert said, err
    acknowledged = int(said[1])
    assert acknowledged > 0, err

    # the count is true: every acknowledged message is there (one more may have been stored
    # while its answer was cut off by the Ctrl-C)
    reader = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "consume", "-t", TOPIC, "-g", "ctrl_c_counter",
         "-q", "--idle-seconds", "3", "-n", namesrv],
        capture_output=True, text=True, timeout=WAIT, cwd=tmp_path)
    assert reader.returncode == 0, reader.stderr
    stored = re.search(r"consumed (\d+) messages", reader.stderr)
    assert stored, reader.stderr
    assert acknowledged <= int(stored[1]) <= acknowledged + 1


def test_ctrl_c_on_consume_exits_130_with_one_line_saying_how_many_were_consumed(
        cluster, tmp_path):
    namesrv, _ = cluster
    sent = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "produce", "-t", f"{TOPIC}2", "-c", "20", "-n",
         namesrv], capture_output=True, text=True, timeout=WAIT, cwd=tmp_path)
    assert sent.returncode == 0, sent.stderr
    # (its log at warning: the client's INFO line about its queues is not the interruption's)
    consumer = start("--log-level", "warning", "consume", "-t", f"{TOPIC}2", "-g", "ctrl_c_consumers",
                     "--idle-seconds", "600", "-n", namesrv, cwd=tmp_path)
    try:
        printed = read_lines(consumer, 20)  # all 20, then it waits for more
        assert all("message #" in line for line in printed), printed
        out, err = interrupt(consumer)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    assert consumer.returncode == 130, err
    assert err == f"trio-ha: interrupted: consumed 20 messages of {TOPIC}2 as ctrl_c_consumers\n"
    assert out == ""
    # and the group's offsets were committed on the way out: nothing is delivered again
    again = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "consume", "-t", f"{TOPIC}2", "-g",
         "ctrl_c_consumers", "-q", "--idle-seconds", "2", "-n", namesrv],
        capture_output=True, text=True, timeout=WAIT, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"consumed 0 messages of {TOPIC}2" in again.stderr


def test_ctrl_c_on_status_watch_exits_130_without_a_line(cluster, tmp_path):
    watcher = start("status", "--watch", "1", "-n", cluster[0], cwd=tmp_path)
    try:
        read_line(watcher)  # it is watching
        _, err = interrupt(watcher)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 130, err
    assert err == ""


def test_ctrl_c_on_a_name_server_stops_it_and_exits_130(tmp_path):
    namesrv = start("--log-file", str(tmp_path / "namesrv.log"), "namesrv", "--port", "0",
                    "--bind", "127.0.0.1", cwd=tmp_path)
    try:
        assert read_line(namesrv).startswith("name server listening on")
        out, err = interrupt(namesrv)
    finally:
        if namesrv.poll() is None:
            namesrv.kill()
            namesrv.communicate()
    assert namesrv.returncode == 130, err
    assert err == ""
    assert out.startswith("shutting down")


def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on(tmp_path):
    """``kill -USR1`` on a node that does not stop shows where it is (faulthandler), and
    the node keeps serving: it is a look, not a stop."""
    namesrv = start("--log-file", str(tmp_path / "namesrv.log"), "namesrv", "--port", "0",
                    "--bind", "127.0.0.1", cwd=tmp_path)
    try:
        assert read_line(namesrv).startswith("name server listening on")
        namesrv.send_signal(signal.SIGUSR1)
        assert namesrv.stderr is not None
        fd = namesrv.stderr.fileno()
        dumped = b""
        deadline = time.monotonic() + WAIT
        while b"Current thread" not in dumped:  # the dump, read as it comes (bounded)
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no stack dump within {WAIT} s: {dumped!r}"
            chunk = os.read(fd, 65536)
            assert chunk, f"stderr closed after {dumped!r}"
            dumped += chunk
        assert namesrv.poll() is None  # the dump did not stop the node: still serving
        _, err = interrupt(namesrv)
    finally:
        if namesrv.poll() is None:
            namesrv.kill()
            namesrv.communicate()
    assert namesrv.returncode == 130, err
    assert b"(most recent call first)" in dumped, dumped
