import os

import pytest

from trio_ha import FlushDiskType, StoreConfig


@pytest.fixture
def make_config(tmp_path):
    """A StoreConfig in a temporary directory, with small segments so tests cross many."""

    def make(**overrides) -> StoreConfig:
        values = dict(
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
