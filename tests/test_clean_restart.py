"""Issue 36 defect 7: a clean restart keeps what it has and says nothing alarming.

Before: every clean restart deleted and rebuilt the index (``names records past the log's
end (0); rebuilding it``: the limit passed was the dispatcher's cursor, which recovery sets
back to the last segment's start, often 0), and every restart of an empty store logged a
WARNING that read like data loss (``deleting segment ... beyond offset 0``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from trio_ha import Message, StoreConfig, open_store

MiB = 1024 * 1024


def index_files(root: Path) -> dict[str, tuple[int, int]]:
    """Each index file's name -> (inode, mtime in ns)."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted((root / "index").iterdir())}


async def test_defect_7_a_clean_restart_does_not_rebuild_the_index(tmp_path, caplog):
    """A store with 3,000 indexed keys, stopped cleanly and opened again: its index file is
    the same file (name, inode, mtime), nothing was rebuilt or scanned for it, and every key
    is still found."""
    config = StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                         mapped_file_size_commit_log=4 * MiB, warm_mapped_file_enable=False)
    root = Path(config.store_path_root_dir)
    async with open_store(config) as store:
        for i in range(3000):
            assert (await store.put_message(Message("Keyed", b"m%d" % i, keys=f"k{i}"))).ok
        await store.wait_dispatched()
    before = index_files(root)
    assert before
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trio_ha"):
        async with open_store(config) as store:
            assert store.index is not None
            for i in (0, 1500, 2999):
                found = store.query_message("Keyed", f"k{i}", 4, 0, 2**62)
                assert len(found.records) == 1, i
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "rebuilding it" in line or "caught up" in line], lines
    assert index_files(root) == before


async def test_defect_7_restarting_an_empty_store_logs_no_warning(tmp_path, caplog):
    """An empty store opened a second time: no WARNING (before: ``recovery: deleting segment
    ... beyond offset 0``, as if data had been lost), and it takes puts as before."""
    config = StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                         mapped_file_size_commit_log=1 * MiB, warm_mapped_file_enable=False)
    async with open_store(config):
        pass
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="trio_ha"):
        async with open_store(config) as store:
            assert (await store.put_message(Message("After", b"x"))).ok
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []
    assert any("removing empty segment" in r.getMessage() for r in caplog.records)
    assert os.listdir(config.commitlog_dir) == ["0" * 20]
