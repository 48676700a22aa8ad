"""The store directory's lock: one open store per directory, across processes and within one.

Two stores appending to the same files would interleave records and corrupt both, so opening
takes an exclusive POSIX lock on ``<root>/lock`` (released by the kernel if the process dies,
so a crash never leaves a stale lock behind). POSIX locks do not exclude the process that
holds them, so the directories open in this process are also remembered here.

A broker takes the lock before anything else it does with the store directory (binding its
ports, reading its config files, writing the ``abort`` file): a second broker started on the
same directory by mistake must stop before it has touched anything (``StoreLock.acquire``,
then ``open_store(config, lock=...)``).
"""

from __future__ import annotations

import fcntl
import os

import attrs

from .._errors import TrioHAError

#: directories open in this process (a POSIX lock does not exclude its own process)
_open_roots: set[str] = set()


class StoreLockedError(TrioHAError, RuntimeError):
    """The store directory is already open (in this or another process)."""


def lock_root(root: str) -> int:
    """Lock the store directory ``root``; returns the lock file's descriptor."""
    if root in _open_roots:
        raise StoreLockedError(f"store {root} is already open in this process")
    path = os.path.join(root, "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        os.close(fd)
        raise StoreLockedError(
            f"store {root} is in use by another process (its lock file {path} is locked)"
        ) from None
    os.pwrite(fd, b"lock", 0)
    _open_roots.add(root)
    return fd


def unlock_root(root: str, fd: int) -> None:
    _open_roots.discard(root)
    if fd >= 0:
        os.close(fd)  # closing the descriptor releases the POSIX lock


@attrs.define(eq=False)
class StoreLock:
    """The held lock of one store directory (``StoreLock.acquire``), until ``release``."""

    root: str
    _fd: int = attrs.field(alias="fd")

    @classmethod
    def acquire(cls, store_dir: str) -> StoreLock:
        """Make the directory if it is missing and lock it; StoreLockedError when it is in
        use. Blocking (it may create the directory): run it in a worker thread."""
        root = os.path.realpath(store_dir)
        os.makedirs(root, exist_ok=True)
        return cls(root, fd=lock_root(root))

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        """Let the directory go (idempotent)."""
        if self._fd >= 0:
            unlock_root(self.root, self._fd)
            self._fd = -1
