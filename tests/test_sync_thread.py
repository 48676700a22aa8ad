"""The sync thread (``trio_ha.store.sync_thread``, ``th_sync_thread_*``): the commitlog's
msyncs off the event loop without the interpreter's lock (issue 11).

On real segments: ranges are synced in order and their bytes are the file's, msync's errors
come back as OSError and the thread goes on serving, a cancelled flush still waits for its
range (its segment stays held, the watermark tells no lie), stopping is final, and without
the native engine the same calls run in a worker thread.
"""

from __future__ import annotations

import errno
import os

import pytest
import trio

from trio_ha import _backend
from trio_ha.config import FlushDiskType, StoreConfig
from trio_ha.store import open_store
from trio_ha.store.segment import Segment
from trio_ha.store.sync_thread import SyncThread
from trio_ha.wire import record as rec

NATIVE = _backend.native_backend == "native"
needs_native = pytest.mark.skipif(
    not NATIVE and os.environ.get("TRIO_HA_REQUIRE_NATIVE") != "1",
    reason=f"native module not built ({_backend.native_unavailable_reason})",
)
SIZE = 1 << 20


def segment_with(tmp_path, data: bytes, at: int = 0) -> Segment:
    segment = Segment.create(str(tmp_path), 0, SIZE, warm=False)
    segment.write(at, data)
    return segment


def file_start(segment: Segment, n: int) -> bytes:
    with open(segment.path, "rb") as f:
        return f.read(n)


@needs_native
async def test_ranges_are_synced_in_order_on_the_native_thread(tmp_path):
    segment = segment_with(tmp_path, b"a" * 5000 + b"b" * 3000)
    thread = SyncThread.start()
    try:
        assert thread.native
        with segment.hold():
            await thread.sync([(segment, 0, 5000), (segment, 5000, 8000), (segment, 9, 9)])
        # the file holds what the mapping holds
        assert file_start(segment, 8000) == b"a" * 5000 + b"b" * 3000
        for _ in range(50):  # one range at a time, many times over
            await thread.sync([(segment, 0, 100)])
    finally:
        thread.close()
        segment.close()


@needs_native
async def test_an_msync_error_is_raised_and_the_thread_serves_on(tmp_path):
    segment = segment_with(tmp_path, b"x" * 100)
    thread = SyncThread.start()
    try:
        native = thread._thread
        assert native is not None
        # Page 0 is never mapped: msync fails with ENOMEM.
        native.submit(_backend.engine.ffi.cast("uint8_t *", 16), 0, 10)  # type: ignore[attr-defined]
        with pytest.raises(OSError, match="msync") as caught:
            await thread._wait_done(native)
        assert caught.value.errno == errno.ENOMEM
        await thread.sync([(segment, 0, 100)])  # and it goes on
    finally:
        thread.close()
        segment.close()


@needs_native
async def test_a_cancelled_sync_waits_for_its_range(tmp_path):
    """The range in progress is finished before the flush gives up: the thread is idle
    afterwards (a new range is accepted), and the caller sees the cancellation next."""
    segment = segment_with(tmp_path, b"y" * 4096)
    thread = SyncThread.start()
    try:
        with trio.CancelScope() as scope:
            scope.cancel()
            await thread.sync([(segment, 0, 4096)])
            await trio.lowlevel.checkpoint()  # the cancellation lands here
        assert scope.cancelled_caught
        native = thread._thread
        assert native is not None
        native.result()  # finished, not still running (which raises BlockingIOError)
        await thread.sync([(segment, 0, 10)])
    finally:
        thread.close()
        segment.close()


@needs_native
async def test_stopping_is_final_and_idempotent(tmp_path):
    segment = segment_with(tmp_path, b"z")
    thread = SyncThread.start()
    native = thread._thread
    assert native is not None
    thread.close()
    thread.close()
    with pytest.raises(RuntimeError):
        native.submit(segment.handle, 0, 1)
    segment.close()


@pytest.mark.parametrize("without", ["the native engine", "eventfd"])
async def test_a_worker_thread_syncs_without_the_native_thread(without, tmp_path, monkeypatch):
    """The Python engine has no sync thread, and eventfd is Linux's: either way the ranges
    go to a worker thread."""
    if without == "eventfd":
        monkeypatch.delattr(os, "eventfd")
    else:
        monkeypatch.setattr(_backend, "engine", _backend.python_engine)
    segment = segment_with(tmp_path, b"p" * 300)
    thread = SyncThread.start()
    try:
        assert not thread.native
        with segment.hold():
            await thread.sync([(segment, 0, 300)])
        assert file_start(segment, 300) == b"p" * 300
    finally:
        thread.close()
        segment.close()


async def test_sync_flush_puts_go_through_the_commitlogs_sync_thread(tmp_path):
    config = StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                         mapped_file_size_commit_log=SIZE,
                         flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with open_store(config) as store:
        for i in range(20):
            result = await store.put_message(rec.Message("T", b"m%d" % i), 0)
            assert result.status.name == "PUT_OK"
        commitlog = store.commitlog
        assert commitlog.flushed.value == commitlog.written.value
        assert commitlog._sync_thread is not None
        assert commitlog._sync_thread.native == NATIVE
    assert commitlog._sync_thread is None  # stopped with the store
