"""Issue 36, defect 3: a slave ahead of its master must not advise wiping itself.

An empty broker registered under the brokerName of a master that died (or a master that lost
its disk) makes the healthy slave diverge. The slave then holds the only good copy, so its
error line names both possibilities, says to keep its store and check the master first, and
points at the ``trio-ha`` commands that do each step; those commands run as advised, and a
restart (the advised way to try again) reports the divergence again, losing nothing."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import trio

from conftest import ha_slave_of, wait_until
from trio_ha import BrokerRole, Message, StoreConfig, open_store
from trio_ha.store import MessageStore
from trio_ha.store.ha.slave import divergence_advice

SEGMENT = 64 * 1024


def store_config(root, **overrides: Any) -> StoreConfig:
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200)
    values.update(overrides)
    return StoreConfig(**values)


def master_config(root) -> StoreConfig:
    return store_config(root, broker_role=BrokerRole.ASYNC_MASTER, ha_listen_port=0,
                        ha_bind_address="127.0.0.1", ha_start_from_min_offset=True)


def slave_config(root, master: MessageStore) -> StoreConfig:
    assert master.ha_address is not None
    host, port = master.ha_address
    return store_config(root, broker_role=BrokerRole.SLAVE, ha_master_address=f"{host}:{port}",
                        ha_reconnect_interval=100)


async def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(120):
        return await trio.run_process([sys.executable, "-m", "trio_ha.cli", *args],
                                      capture_stdout=True, capture_stderr=True, check=False)


def advice_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "trio_ha.store.ha.slave" and r.levelno == logging.ERROR]


def check_safe_advice(line: str, slave_dir: str) -> None:
    # Both possibilities, the master named first as the likely culprit.
    assert "the master is the wrong one" in line and "empty" in line, line
    assert "the master is right" in line, line
    assert "only good copy" in line, line
    # Keep the slave; check the master first; cut the slave last, after a copy and a dry run.
    assert f"KEEP THIS SLAVE'S STORE ({slave_dir})" in line, line
    assert "wipe this slave's store and restart" not in line, line
    inspect = line.index("trio-ha store inspect")
    copy = line.index(f"cp -a {slave_dir}")
    dry_run = line.index(f"trio-ha store truncate {slave_dir} --to")
    assert inspect < copy < dry_run, line
    assert "--dry-run" in line[dry_run:], line
    # Nothing an operator could not type: no Python calls.
    assert "clear_divergence()" not in line, line


async def test_divergence_advice_can_destroy_the_only_good_copy(tmp_path, caplog):
    """The slave of a SIGKILLed master meets an empty broker under the master's address."""
    caplog.set_level(logging.ERROR, logger="trio_ha.store.ha.slave")
    slave_dir = str(tmp_path / "slave")
    async with open_store(master_config(tmp_path / "master")) as master:
        async with open_store(slave_config(slave_dir, master)) as slave:
            for i in range(50):
                await master.put_message(Message("Precious", b"only copy %d" % i))
            await slave.wait_dispatched(master.max_commitlog_offset)
            slave_end = slave.max_commitlog_offset
    async with open_store(master_config(tmp_path / "impostor")) as impostor:
        for attempt in range(2):  # the advised way to try again is a restart
            async with open_store(slave_config(slave_dir, impostor)) as slave:
                await wait_until(lambda: ha_slave_of(slave).state == "diverged",
                                 "the slave to report the divergence")
                stats = ha_slave_of(slave)
                assert stats.divergence is not None
                assert str(slave_end) in stats.divergence
                assert "the master is the wrong one" in stats.divergence
                assert "answered at 0, as an empty master does" in stats.divergence
                assert "only good copy" in stats.divergence
                assert slave.max_commitlog_offset == slave_end  # nothing overwritten
            lines = advice_lines(caplog)
            assert len(lines) == attempt + 1, lines
            check_safe_advice(lines[-1], slave_dir)
    # The steps it names run as written: the slave's store is inspected and a dry run of
    # the cut says what it would do, changing nothing (the empty master's log ends at 0).
    inspect = await cli("store", "inspect", slave_dir)
    assert inspect.returncode == 0, inspect.stderr
    dry = await cli("store", "truncate", slave_dir, "--to", "0", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert b"nothing was changed" in dry.stdout
    async with open_store(store_config(slave_dir)) as kept:
        assert kept.max_commitlog_offset == slave_end


def test_divergence_advice_names_both_possibilities_for_a_shorter_master():
    why, advice = divergence_advice("10.0.0.1:10912", 3970931, 1048576, "/data/slave")
    assert "answered at 1048576)" in why and "empty master" not in why
    check_safe_advice(f"{why}. {advice}", "/data/slave")
    # A slave behind the master's retained log: the master holds everything newer, so
    # starting the slave afresh loses nothing the master still has; still no wipe in place.
    why, advice = divergence_advice("10.0.0.1:10912", 1000, 1048576, "/data/slave")
    assert "gone from the master" in why
    assert "mv /data/slave /data/slave.old" in advice
