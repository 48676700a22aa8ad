"""Issue 35, defect 3 and defect 5's last point: reloading plain_acl.yml never blocks the
broker (a FIFO or a stuck mount in its place, SIGTERM meanwhile), a revoked secret stops
working once a good file is read, and a file of megabytes is refused before it is parsed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import trio
import yaml

from conftest import wait_until
from trio_ha.acl import AclFile
from trio_ha.acl import plain as plain_acl
from trio_ha.wire.acl import Credentials, sign
from trio_ha.wire.remoting import RemotingCommand, RequestCode


def acl_yaml(secret: str) -> str:
    return textwrap.dedent(f"""\
        accounts:
          - accessKey: operator
            secretKey: {secret}
            admin: true
        """)


def read_request(secret: str) -> RemotingCommand:
    return sign(RemotingCommand.request(RequestCode.GET_TOPIC_CONFIG, {"topic": "T"}),
                Credentials("operator", secret))


def replace_file(path, text: str) -> None:
    """As an editor saves: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


def unwedge(fifo_link) -> None:
    """Open the FIFO for writing, once: a reader stuck in open() (the defect) gets EOF."""
    try:
        os.close(os.open(fifo_link, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waits on it (the fix)


async def test_a_fifo_in_place_of_plain_acl_yml_does_not_wedge_the_reload_and_a_later_edit_revokes_the_old_secret(
        tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(acl_yaml("old-secret"))
    live = AclFile.open(str(path))
    assert live.check(read_request("old-secret"), "127.0.0.1") is None
    fifo, keep = tmp_path / "fifo", tmp_path / "fifo-link"
    os.mkfifo(fifo)
    os.link(fifo, keep)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(live.watch, 0.02)
        try:
            os.replace(fifo, path)
            # the reload runs in a worker thread: nothing to wait on but its counters
            await wait_until(lambda: live.failed_reloads, "a failed reload (not one stuck on "
                             "the FIFO)", timeout=5)
            assert live.failed_reloads == 1
            replace_file(path, acl_yaml("new-secret"))
            await wait_until(lambda: live.reloads, "the good file's reload", timeout=5)
        finally:
            unwedge(keep)
            nursery.cancel_scope.cancel()
    assert "signature does not match" in (live.check(read_request("old-secret"), "h") or "")
    assert live.check(read_request("new-secret"), "127.0.0.1") is None


def test_sigterm_stops_a_broker_whose_plain_acl_yml_became_a_fifo(tmp_path):
    """A real broker process: its plain_acl.yml replaced by a FIFO no one writes, then
    SIGTERM. The broker says in one line that it cannot read the file, and stops."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(acl_yaml("old-secret"))
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerRole=ASYNC_MASTER\nlistenPort=0\nbindAddress=127.0.0.1\n"
        f"haBindAddress=127.0.0.1\nstorePathRootDir={tmp_path / 'store'}\n"
        f"mappedFileSizeCommitLog=1048576\naclEnable=true\nplainAclFile={acl}\n")
    fifo, keep = tmp_path / "fifo", tmp_path / "fifo-link"
    os.mkfifo(fifo)
    os.link(fifo, keep)
    log_path = tmp_path / "broker.err"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "trio_ha.cli", "broker", "-c", str(conf)],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        assert "serving on" in proc.stdout.readline()
        os.replace(fifo, acl)
        ends = time.monotonic() + 5
        while time.monotonic() < ends and "not a regular file" not in log_path.read_text():
            time.sleep(0.05)  # the broker looks every 0.5 s; main says nothing, so bounded
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM did not stop the broker: its ACL reload is stuck")
        assert proc.returncode == 0, log_path.read_text()[-2000:]
        lines = [line for line in log_path.read_text().splitlines() if "plain_acl.yml" in line
                 and "a FIFO, not a regular file" in line]
        assert len(lines) == 1, lines  # one line, not one per look
    finally:
        unwedge(keep)
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def many_accounts(size: int) -> str:
    """A valid plain_acl.yml of about ``size`` bytes (accounts with their own perms)."""
    entries, total, i = ["accounts:"], 0, 0
    while total < size:
        entry = (f"  - accessKey: account{i:07d}\n    secretKey: secret{i:08d}\n"
                 f"    defaultTopicPerm: DENY\n    topicPerms:\n      - topic{i}=PUB|SUB\n")
        entries.append(entry)
        total += len(entry)
        i += 1
    return "\n".join(entries) + "\n"


def test_a_4mb_plain_acl_yml_is_refused_before_parsing_and_the_old_accounts_keep_serving(
        tmp_path):
    """RocketMQ's loader and ours before took a 4 MB file whole (24 s of pure-Python YAML
    under the GIL, 317 MiB). The cap is 1 MiB now, and PyYAML's C loader parses."""
    path = tmp_path / "plain_acl.yml"
    path.write_text(acl_yaml("old-secret"))
    live = AclFile.open(str(path))
    replace_file(path, many_accounts(4_000_000))
    assert live.reload_if_changed() is False
    assert live.failed_reloads == 1
    assert live.check(read_request("old-secret"), "127.0.0.1") is None
    # just under the cap is taken
    replace_file(path, acl_yaml("new-secret") + "#" * (plain_acl.MAX_FILE_BYTES - 200) + "\n")
    assert live.reload_if_changed() is True
    assert live.check(read_request("new-secret"), "127.0.0.1") is None
    if yaml.__with_libyaml__:
        assert plain_acl._YAML_LOADER is yaml.CSafeLoader


async def test_stopping_never_waits_for_a_reload_stuck_in_its_read(tmp_path, monkeypatch):
    """A read stuck on a dead mount, stood in for by one that waits on an event (a hung mount
    cannot be made here): cancelling the watch (what SIGTERM does) returns at once, the
    worker thread left to finish on its own."""
    import threading

    from trio_ha.acl import watch as watch_module

    path = tmp_path / "plain_acl.yml"
    path.write_text(acl_yaml("old-secret"))
    live = AclFile.open(str(path))
    started, release = threading.Event(), threading.Event()

    def stuck_read(_path: str) -> bytes:
        started.set()
        release.wait(15)
        return b""

    monkeypatch.setattr(watch_module, "read_acl_file", stuck_read)
    replace_file(path, acl_yaml("new-secret"))
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(live.watch, 0.02)
                assert await trio.to_thread.run_sync(started.wait, 5)
                nursery.cancel_scope.cancel()
        assert live.check(read_request("old-secret"), "127.0.0.1") is None
    finally:
        release.set()
