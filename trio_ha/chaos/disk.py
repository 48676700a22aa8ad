"""Small disks: a node's store on a filesystem of its own that the harness can fill.

A full disk is a fault production stores meet (a neighbour's logs, a runaway retention
setting), and the failure is in the details: a segment that cannot be created, a consume
queue entry that cannot be written, a flush that fails, a write into a sparse mapping that
becomes SIGBUS. None of that can be provoked on the machine's real disk without harming
everything else on it, so each broker of a chaos run keeps its store on a tmpfs of its own
(a few hundred MiB, mounted by the harness), and :meth:`SmallDisk.fill` takes every free
byte with a ballast file (``posix_fallocate``, so the blocks are really taken, not promised)
until :meth:`SmallDisk.release` deletes it.

Mounting needs root; :func:`unavailable` says why not when it cannot be done, and the harness
then runs without disk faults and says so.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import attrs

from .._errors import TrioHAError

__all__ = ["SmallDisk", "SmallDiskError", "unavailable"]


class SmallDiskError(TrioHAError, RuntimeError):
    """Mounting, filling or unmounting failed: the command and its words."""


@functools.cache
def unavailable() -> str | None:
    """Why small disks cannot be mounted here, or None when they can (asked once per
    process: the probe mounts and unmounts a tmpfs)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    probe = Path(f"/tmp/trioha-disk-probe-{secrets.token_hex(3)}")
    probe.mkdir()
    try:
        SmallDisk.mount(probe, 1 << 20).unmount()
    except SmallDiskError as exc:
        return str(exc)
    finally:
        if not os.path.ismount(probe):
            probe.rmdir()
    return None


@attrs.define(eq=False)
class SmallDisk:
    """A tmpfs of ``size`` bytes mounted at ``path``."""

    path: Path
    size: int
    ballast: Path | None = None

    @classmethod
    def mount(cls, path: Path, size: int) -> SmallDisk:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755",
                               "trioha-chaos", str(path)], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise SmallDiskError(f"mount -t tmpfs at {path}: {done.stderr.strip()}")
        return cls(path, size)

    @property
    def free(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int = 0) -> int:
        """Take every free byte but ``leave`` (rounded to pages); the bytes taken."""
        if self.ballast is not None:
            raise SmallDiskError("the disk is already filled")
        ballast = self.path / f".ballast-{secrets.token_hex(3)}"
        fd = os.open(ballast, os.O_CREAT | os.O_WRONLY, 0o600)
        self.ballast = ballast
        taken = 0
        try:
            # Halve the request on ENOSPC: what the filesystem can give changes while the
            # node writes, so one exact figure would race it.
            want = max(0, self.free - leave)
            while want >= 4096:
                try:
                    os.posix_fallocate(fd, taken, want)
                except OSError:
                    want //= 2
                    continue
                taken += want
                want = max(0, self.free - leave)
        finally:
            os.close(fd)
        if self.free > leave + 1024 * 1024:  # (a fill that did not fill is no fault)
            raise SmallDiskError(f"{self.path} still has {self.free} bytes free after "
                                 f"taking {taken}")
        return taken

    def release(self) -> None:
        """Give the ballast's bytes back."""
        if self.ballast is not None:
            self.ballast.unlink(missing_ok=True)
            self.ballast = None

    def unmount(self, *, keep_files: bool = False) -> None:
        """Unmount; with ``keep_files``, what the disk held (the ballast aside) is copied to
        the directory underneath first, so a run's stores outlive their disks. The disk is
        unmounted even when the copy fails."""
        self.release()
        saved = None
        try:
            if keep_files:
                saved = self.path.with_name(f".{self.path.name}.saved-{secrets.token_hex(3)}")
                shutil.copytree(self.path, saved, symlinks=True)
        finally:
            done = subprocess.run(["umount", "-l", str(self.path)], capture_output=True,
                                  text=True, check=False)
        if done.returncode != 0:
            raise SmallDiskError(f"umount {self.path}: {done.stderr.strip()}")
        if saved is not None:
            shutil.rmtree(self.path)
            saved.rename(self.path)
