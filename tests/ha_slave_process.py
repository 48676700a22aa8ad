"""Child process of the HA SIGKILL test (tests/test_ha_faults.py).

Usage: ``python tests/ha_slave_process.py STORE_DIR MASTER_ADDRESS``

Opens a SLAVE store at STORE_DIR replicating from MASTER_ADDRESS (``ip:port`` of the
master's HA listener), prints ``READY`` once ``open_store`` has yielded, and runs until it
is killed. If its stdin reaches end of file (the parent went away) it closes the store and
exits, so a crashed test run leaves no orphan behind.

``slave_config`` is imported by the parent too, so both sides agree on segment sizes and
intervals; so is ``master_config``, the master the HA-port tests (test_ha_hardening,
test_ha_slots) attack and replicate from.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# The package comes from the checkout this file lives in, whatever the working directory.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import trio  # noqa: E402

from trio_ha import BrokerRole, StoreConfig, open_store  # noqa: E402

SEGMENT = 64 * 1024


def master_config(root: str | os.PathLike[str], **overrides: Any) -> StoreConfig:
    """A SYNC_MASTER on a loopback HA port the OS picks, with this slave's segment sizes."""
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200, broker_role=BrokerRole.SYNC_MASTER,
        ha_listen_port=0, ha_bind_address="127.0.0.1", slave_timeout=300,
        # A frozen slave stays connected through a test: it still counts as worth
        # waiting for, so puts wait (and could be answered by a rogue's ack).
        ha_housekeeping_interval=30_000, ha_send_heartbeat_interval=100,
    )
    values.update(overrides)
    return StoreConfig(**values)


def slave_config(store_dir: str, master_address: str | None) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=str(store_dir),
        mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200,
        broker_role=BrokerRole.SLAVE,
        ha_master_address=master_address,
        ha_send_heartbeat_interval=100,
        ha_housekeeping_interval=1000,
        ha_reconnect_interval=100,
    )


async def _until_stdin_closes() -> None:
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with stdin:
        while await stdin.receive_some(4096):
            pass


async def main(store_dir: str, master_address: str) -> None:
    async with open_store(slave_config(store_dir, master_address)):
        os.write(sys.stdout.fileno(), b"READY\n")
        await _until_stdin_closes()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    trio.run(main, sys.argv[1], sys.argv[2])
