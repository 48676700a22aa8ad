"""Where the broker's metadata files live, and how they are written and read back.

RocketMQ keeps a broker's tables as JSON files under ``<storePathRootDir>/config/``
(``topics.json``, ``consumerOffset.json``, ``subscriptionGroup.json``, ``delayOffset.json``;
the names are in ``trio_ha.wire.metadata``). A file is replaced the way RocketMQ's
``MixAll.string2File`` does it — new content to ``<file>.tmp``, the previous content to
``<file>.bak``, the tmp renamed over the file — with the fsyncs RocketMQ lacks, so a crash at
any point leaves the old or the new content under the file's name and the one before in its
``.bak``. Reading falls back to ``<file>.bak`` as RocketMQ's ``ConfigManager.load`` does, but
refuses to start with an empty table when both copies are damaged.

Everything here blocks on the file system: the managers call it from a worker thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar, overload

from ..._durable import fsync_dir, write_synced
from ..._errors import TrioHAError

__all__ = [
    "CONFIG_DIR_NAME",
    "MetadataLoadError",
    "atomic_write",
    "backup_previous",
    "config_dir_of",
    "install_tmp",
    "load_with_backup",
    "write_tmp",
]

log = logging.getLogger(__name__)

#: ``<storePathRootDir>/config``
CONFIG_DIR_NAME = "config"

T = TypeVar("T")


def config_dir_of(store_path_root_dir: str | os.PathLike[str]) -> str:
    """``<storePathRootDir>/config``, where RocketMQ keeps the metadata files."""
    return os.path.join(os.fspath(store_path_root_dir), CONFIG_DIR_NAME)


class MetadataLoadError(TrioHAError):
    """Neither a config file nor its ``.bak`` could be loaded. The message names both files and
    why each failed; the broker must not start with an empty table in place of a damaged one."""


def _tmp_path(path: str) -> str:
    return path + ".tmp"


def _bak_path(path: str) -> str:
    return path + ".bak"


def _read_or_none(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


# The three steps of atomic_write, public so that tests can stop between them (a crash).


def write_tmp(path: str, data: bytes) -> None:
    """Step 1: the new content to ``<path>.tmp``, fsync'ed. A ``.tmp`` left by a crash is
    simply overwritten (and never loaded)."""
    write_synced(_tmp_path(path), data)


def backup_previous(path: str) -> None:
    """Step 2: the current content to ``<path>.bak`` (through ``<path>.bak.tmp`` and a rename,
    so a crash here leaves the old ``.bak`` whole). An empty or missing current file is not
    backed up: it would only replace a useful ``.bak`` with nothing."""
    previous = _read_or_none(path)
    if not previous:
        return
    bak_tmp = _tmp_path(_bak_path(path))
    write_synced(bak_tmp, previous)
    os.replace(bak_tmp, _bak_path(path))


def install_tmp(path: str) -> None:
    """Step 3: rename ``<path>.tmp`` over ``<path>`` and fsync the directory. RocketMQ deletes
    the file first; ``os.replace`` is atomic on POSIX, so the file never goes missing."""
    os.replace(_tmp_path(path), path)
    fsync_dir(os.path.dirname(path))


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the file at ``path`` with ``data`` so that a crash at any point leaves either the
    old or the new content under ``path`` (and the previous content in ``<path>.bak``).

    RocketMQ's order (``MixAll.string2File``): content -> ``<path>.tmp``; previous content ->
    ``<path>.bak``; tmp renamed to ``<path>``; plus an fsync of each file written and of the
    directory after the rename. The directory must exist. Blocking: run it in a worker thread."""
    path = os.fspath(path)
    write_tmp(path, data)
    backup_previous(path)
    install_tmp(path)


@overload
def load_with_backup(path: str | os.PathLike[str], decode: None = None) -> bytes | None: ...
@overload
def load_with_backup(path: str | os.PathLike[str], decode: Callable[[bytes], T]) -> T | None: ...
def load_with_backup(
    path: str | os.PathLike[str], decode: Callable[[bytes], T] | None = None
) -> T | bytes | None:
    """Read a config file as RocketMQ's ``ConfigManager.load`` does: the file if it is present,
    non-empty and decodes, else ``<path>.bak``.

    Returns ``decode(content)`` (the raw bytes when ``decode`` is None), or None when there is
    nothing to load (neither file exists, or they are empty — what a fresh broker or an
    interrupted first write leaves). A ``ValueError`` from ``decode`` (every wire decode error is
    one) or an ``OSError`` reading the file makes it "bad"; if the file is bad and the backup is
    missing, empty or bad too, ``MetadataLoadError`` names both files and both reasons (unlike
    RocketMQ, which then starts with an empty table and overwrites the damaged file later). A
    ``<path>.tmp`` is never read: it may be a half-written file of a crashed write."""
    path = os.fspath(path)
    failures: list[str] = []
    damaged = False
    for candidate in (path, _bak_path(path)):
        try:
            data = _read_or_none(candidate)
        except OSError as exc:
            failures.append(f"{candidate}: cannot read: {exc}")
            damaged = True
            continue
        if data is None:
            failures.append(f"{candidate}: missing")
            continue
        if not data.strip():
            failures.append(f"{candidate}: empty")
            continue
        try:
            value = data if decode is None else decode(data)
        except ValueError as exc:
            failures.append(f"{candidate}: {exc}")
            damaged = True
            continue
        if candidate != path:
            log.warning("loaded %s from its backup (%s)", path, failures[0])
        return value
    if not damaged:
        return None
    raise MetadataLoadError(f"cannot load {path} or its backup: " + "; ".join(failures))
