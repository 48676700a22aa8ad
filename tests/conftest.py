"""Fixtures and helpers shared by the suite.

``wait_until`` is imported by the tests that poll (``from conftest import wait_until``), not
a fixture: module-level helpers of those tests call it too, and a plain function needs no
plumbing to get there.
"""

import inspect
import os
from typing import Any

import pytest
import trio

from trio_ha import FlushDiskType, StoreConfig


async def wait_until(predicate, what: str, *, timeout: float = 10.0, interval: float = 0.01):
    """Call ``predicate`` (a function, or an async function) every ``interval`` seconds until
    it returns something true, and return that; fail the test, naming ``what`` was awaited,
    if ``timeout`` seconds pass first. For what has no event to wait on (another process's
    state, a server's tables seen from outside); where a ``trio.Event`` or a watermark
    exists, wait on it instead."""
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await trio.sleep(interval)
    pytest.fail(f"gave up after {timeout:g} s waiting for {what}")


@pytest.fixture
def make_config(tmp_path):
    """A StoreConfig in a temporary directory, with small segments so tests cross many."""

    def make(**overrides) -> StoreConfig:
        values: dict[str, Any] = dict(
            store_path_root_dir=str(tmp_path / "store"),
            mapped_file_size_commit_log=64 * 1024,
            mapped_file_size_consume_queue=20 * 100,
            flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        )
        values.update(overrides)
        return StoreConfig(**values)

    return make


@pytest.fixture
def store_dir(tmp_path):
    path = tmp_path / "store"
    os.makedirs(path, exist_ok=True)
    return path
