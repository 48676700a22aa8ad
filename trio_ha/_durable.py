"""Writing small files so that a crash leaves the old content or the new, never a mix.

Several of the store's and the broker's own files are rewritten whole: the epoch file, the
truncation intent, the ``brokerIdentity`` files, the metadata tables. Each write goes to a
tmp file, is fsync'ed, renamed over the old one, and the directory is fsync'ed so that the
rename itself survives a power loss. One implementation, here, for all of them.
"""

from __future__ import annotations

import errno
import os

__all__ = ["fsync_dir", "replace_synced", "write_synced"]


def write_synced(path: str, data: bytes) -> None:
    """``data`` into ``path`` (created or truncated), fsync'ed before returning."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_synced(path: str, data: bytes) -> None:
    """``data`` under ``path`` atomically and durably: tmp file, fsync, rename, fsync the
    directory. A tmp file a crash leaves is overwritten by the next write and never read."""
    tmp = path + ".tmp"
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def fsync_dir(directory: str) -> None:
    """Make a rename or unlink in ``directory`` durable (a no-op where the file system
    refuses to fsync a directory)."""
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)
