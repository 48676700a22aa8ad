"""Child process of the HA SIGKILL test (tests/test_ha_faults.py).

Usage: ``python tests/ha_slave_process.py STORE_DIR MASTER_ADDRESS``

Opens a SLAVE store at STORE_DIR replicating from MASTER_ADDRESS (``ip:port`` of the
master's HA listener), prints ``READY`` once ``open_store`` has yielded, and runs until it
is killed. If its stdin reaches end of file (the parent went away) it closes the store and
exits, so a crashed test run leaves no orphan behind.

``slave_config`` is imported by the parent too, so both sides agree on segment sizes and
intervals.
"""

from __future__ import annotations

import os
import sys

# The package comes from the checkout this file lives in, whatever the working directory.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import trio  # noqa: E402

from trio_ha import BrokerRole, StoreConfig, open_store  # noqa: E402

SEGMENT = 64 * 1024


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
