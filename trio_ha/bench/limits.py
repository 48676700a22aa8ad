"""Raw machine limits, measured in the same run as the benchmarks that are read against them.

* ``memcpy_into_mapping``: large slice assignments from a bytes source into a warm MAP_SHARED
  file mapping — the ceiling for appends, which are copies into a segment's mapping. Also the
  first-touch rate of the same mapping (what warming a new segment costs) and the rate of
  1 KiB slice assignments from Python (the per-call floor a Python-driven put cannot beat).
* ``sync_rates``: 4 KiB write + ``fdatasync`` in a loop on a preallocated scratch file (the
  ceiling for one SYNC_FLUSH writer without group commit), and the same through a shared
  mapping with ``msync`` (what the store actually calls).
* ``sequential_read``: ``os.readv`` of whole files into one preallocated buffer — the ceiling
  for a recovery scan of those files. Measured on files just written, so the page cache is
  warm: it is the memory-side ceiling, not the disk's.

All bandwidths are decimal MB/s (10**6 bytes) and GB/s (10**9); latencies in microseconds.
"""

from __future__ import annotations

import mmap
import os
import time

from .. import _backend
from . import percentile_us

MB = 1_000_000
GB = 1_000_000_000
MiB = 1 << 20
PAGE = mmap.PAGESIZE


def _scratch_file(directory: str, name: str, size: int) -> int:
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.unlink(path)  # the fd keeps it alive; nothing is left behind on any exit
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        pass
    return fd


def memcpy_into_mapping(
    directory: str,
    *,
    map_size: int = 256 * MiB,
    total_bytes: int = 4 * GB,
    chunk_size: int = 4 * MiB,
    record_size: int = 1024,
    record_seconds: float = 0.5,
    passes: int = 4,
) -> dict:
    """Copy about ``total_bytes`` in ``chunk_size`` slice assignments into a warm shared
    mapping of a ``map_size`` scratch file, wrapping around, in ``passes`` timed passes; the
    best pass is the figure. Returns a dict of figures."""
    map_size -= map_size % chunk_size
    fd = _scratch_file(directory, "memcpy.scratch", map_size)
    mm = mmap.mmap(fd, map_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        zeros = bytes(chunk_size)
        started = time.perf_counter()
        for pos in range(0, map_size, chunk_size):  # first touch: fault every page in
            mm[pos : pos + chunk_size] = zeros
        first_touch = time.perf_counter() - started
        source = os.urandom(chunk_size)
        # Several passes; the best is the limit (a busy neighbour can only make a pass
        # slower, and a lower limit would flatter the ratios read against it).
        per_pass = max(map_size, total_bytes // passes)
        rates = []
        done = 0
        for _ in range(passes):
            done = 0
            started = time.perf_counter()
            while done < per_pass:
                for pos in range(0, map_size, chunk_size):
                    mm[pos : pos + chunk_size] = source
                done += map_size
            rates.append(done / (time.perf_counter() - started))
        copied = done * passes

        # 1 KiB slice assignments from a Python loop, walking the warm mapping.
        small = os.urandom(record_size)
        n = 0
        limit = map_size - record_size
        pos = 0
        started = time.perf_counter()
        deadline = started + record_seconds
        while True:
            for _ in range(4096):
                mm[pos : pos + record_size] = small
                pos += record_size
                if pos > limit:
                    pos = 0
            n += 4096
            if time.perf_counter() >= deadline:
                break
        small_elapsed = time.perf_counter() - started
    finally:
        mm.close()
        os.close(fd)
    best = max(rates)
    return {
        "gb_per_s": best / GB,
        "mb_per_s": best / MB,
        "passes_gb_per_s": [rate / GB for rate in rates],
        "bytes": copied,
        "chunk_bytes": chunk_size,
        "map_bytes": map_size,
        "first_touch_gb_per_s": map_size / first_touch / GB,
        "slice_1k_per_s": n / small_elapsed,
        "slice_1k_mb_per_s": n * record_size / small_elapsed / MB,
    }


def sync_rates(directory: str, *, seconds: float = 2.0, file_size: int = 64 * MiB) -> dict:
    """4 KiB pwrite + fdatasync, and 4 KiB store into a mapping + msync, each in a loop for
    ``seconds``, at successive offsets of a preallocated, already-written scratch file."""
    fd = _scratch_file(directory, "sync.scratch", file_size)
    try:
        zeros = bytes(MiB)
        for pos in range(0, file_size, MiB):  # allocate blocks for real: overwrites only
            os.pwrite(fd, zeros, pos)
        os.fsync(fd)
        block = os.urandom(PAGE)

        def loop(op) -> tuple[int, float, list[int]]:
            latencies = []
            pos = 0
            started = time.perf_counter()
            deadline = started + seconds
            while True:
                t0 = time.perf_counter_ns()
                op(pos)
                latencies.append(time.perf_counter_ns() - t0)
                pos = (pos + PAGE) % file_size
                if time.perf_counter() >= deadline:
                    break
            return len(latencies), time.perf_counter() - started, latencies

        def write_sync(pos: int) -> None:
            os.pwrite(fd, block, pos)
            os.fdatasync(fd)

        n, elapsed, lat = loop(write_sync)
        lat.sort()
        result = {
            "fdatasync_per_s": n / elapsed,
            "fdatasync_p50_us": percentile_us(lat, 0.5),
            "fdatasync_p99_us": percentile_us(lat, 0.99),
            "fdatasync_ops": n,
            "seconds": elapsed,
        }

        mm = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        engine = _backend.engine
        handle = engine.handle_for(mm)
        try:
            def store_msync(pos: int) -> None:
                mm[pos : pos + PAGE] = block
                engine.msync(handle, pos, PAGE)

            try:
                n, elapsed, lat = loop(store_msync)
            except NotImplementedError:  # the Python engine has no msync
                n = 0
            if n:
                lat.sort()
                result.update(
                    msync_per_s=n / elapsed,
                    msync_p50_us=percentile_us(lat, 0.5),
                    msync_p99_us=percentile_us(lat, 0.99),
                )
        finally:
            engine.release_handle(handle)
            mm.close()
    finally:
        os.close(fd)
    return result


def sequential_read(paths: list[str], *, passes: int = 3, buffer_size: int = 8 * MiB) -> dict:
    """Read every file start to end with ``os.readv`` into one preallocated buffer,
    ``passes`` times; the best pass is the figure."""
    buffer = bytearray(buffer_size)
    view = memoryview(buffer)
    rates = []
    total = 0
    for _ in range(passes):
        total = 0
        started = time.perf_counter()
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                while True:
                    n = os.readv(fd, [view])
                    if n <= 0:
                        break
                    total += n
            finally:
                os.close(fd)
        rates.append(total / (time.perf_counter() - started) / MB)
    return {
        "mb_per_s": max(rates),
        "passes_mb_per_s": rates,
        "bytes": total,
        "files": len(paths),
        "buffer_bytes": buffer_size,
        "page_cache": "warm (files just written; memory-side ceiling, not the disk's)",
    }
