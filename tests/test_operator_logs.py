"""Issue 36, defect 8: what a node's log says to an operator.

A name server's log is not a list of every connection (855 of 874 lines during one
``status --watch 1`` were connection open/close lines), yet keeps them at DEBUG and says at
INFO that connections come and go; a node stopped by SIGTERM or Ctrl-C says so in its
``--log-file``, where before its lines just ended, as after a crash."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

import pytest

from conftest import wait_until
from trio_ha.namesrv import NamesrvConfig, serve_namesrv
from trio_ha.remoting import open_remoting_client
from trio_ha.wire.remoting import RemotingCommand, RequestCode

CONNECTIONS = 60


def connection_lines(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("trio_ha.remoting") and r.levelno == level
            and (" connected to " in r.getMessage() or "remoting: closing" in r.getMessage())]


async def test_connection_lines_drown_the_name_servers_log_as_in_rocketmq(nursery, caplog):
    caplog.set_level(logging.DEBUG, logger="trio_ha.remoting")
    _, port = await nursery.start(serve_namesrv,
                                  NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
    for _ in range(CONNECTIONS):  # a tool that polls: connect, ask, hang up
        async with open_remoting_client(f"127.0.0.1:{port}") as client:
            await client.invoke(RemotingCommand.request(
                RequestCode.GET_BROKER_CLUSTER_INFO, {}), 5)
    # Every connection was served, so every "connected" line is written.
    opened = [line for line in connection_lines(caplog, logging.INFO) if " connected to " in line]
    assert len(opened) == 1, f"{len(opened)} INFO lines for {CONNECTIONS} connections"
    await wait_until(
        lambda: sum("remoting: closing" in line
                    for line in connection_lines(caplog, logging.DEBUG)) >= CONNECTIONS,
        "the server to see every connection closed")
    # Each open and close is still there for whoever debugs ...
    debug = connection_lines(caplog, logging.DEBUG)
    assert sum(" connected to " in line for line in debug) == CONNECTIONS - 1, debug[:3]
    # ... but the operator's level says once that connections come, not 120 times.
    info = [line for level in (logging.INFO, logging.WARNING)
            for line in connection_lines(caplog, level)]
    assert len(info) == 1 and " connected to " in info[0], info


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_clean_stop_writes_nothing_to_the_log_file(tmp_path, signum):
    log_file = tmp_path / "namesrv.log"
    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"kvConfigPath={tmp_path / 'kvConfig.json'}\n")
    with subprocess.Popen(
            [sys.executable, "-m", "trio_ha.cli", "--log-file", str(log_file), "namesrv",
             "-c", str(conf), "--port", "0", "--bind", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as node:
        try:
            deadline = time.monotonic() + 60
            while "name server listening" not in (log_file.read_text()
                                                  if log_file.exists() else ""):
                assert node.poll() is None, node.communicate()[1]
                assert time.monotonic() < deadline, "the name server did not start"
                time.sleep(0.05)
            node.send_signal(signum)
            code = node.wait(timeout=60)
        finally:
            if node.poll() is None:
                node.kill()
            node.communicate()
    assert code == (0 if signum == signal.SIGTERM else 130), code
    lines = log_file.read_text().splitlines()
    started = next(i for i, line in enumerate(lines) if "name server listening" in line)
    after = lines[started + 1:]
    assert any("INFO" in line and "name server: stopping" in line for line in after), lines
    assert "INFO" in lines[-1] and "name server stopped cleanly" in lines[-1], lines
