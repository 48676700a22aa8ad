"""The broker's live ACL: ``plain_acl.yml`` loaded at start and reloaded when it changes.

RocketMQ's ``AclFileWatchService`` polls the file every 500 ms and reloads it when its MD5
changes; operators rely on editing the file without restarting the broker. We poll the same
way (a stat every ``interval``; the bytes are read and parsed only when the stat moved,
and swapped in only when they differ), because inotify is not everywhere the broker runs
(containers, network file systems) and one stat per half second costs nothing.

A file that fails to parse at start stops the broker (an operator who turned ACL on must not
get a broker without it). One that fails later is logged and the last good accounts stay:
a half-saved edit must neither open the broker nor lock every client out.

Reading must never hang the broker. The path may name a FIFO (whose open() waits for a
writer), a device, or a file on a mount that stopped answering. So the file is opened
non-blocking, must be a regular file once open (``fstat``), and is read up to
``MAX_FILE_BYTES`` + 1. The read and the parse run in a worker thread, one at a time, and
the accounts in use are swapped for the new ones only when the parse succeeded: requests
keep being checked against the old accounts meanwhile. That thread is abandoned, not waited
for, when the broker stops (a read stuck on a dead mount cannot hold up SIGTERM), and while
one is stuck no other starts (one line says so, once).
"""

from __future__ import annotations

import logging
import os
import stat as stat_mode

import attrs
import trio

from ..config import ConfigError
from ..wire.remoting import RemotingCommand
from .plain import ADMIN_CODES, MAX_FILE_BYTES, AclConfigError, PlainAcl
from .replay import ReplayGuard

__all__ = ["AclFile", "acl_file_path", "read_acl_file"]

log = logging.getLogger(__name__)

#: RocketMQ's AclFileWatchService period
WATCH_INTERVAL = 0.5


def acl_file_path(configured: str | None) -> str:
    """Where plain_acl.yml is: ``plainAclFile`` when configured, else RocketMQ's place,
    $ROCKETMQ_HOME/conf/plain_acl.yml; ConfigError when neither is known."""
    if configured:
        return configured
    home = os.environ.get("ROCKETMQ_HOME")
    if home:
        return os.path.join(home, "conf", "plain_acl.yml")
    raise ConfigError("aclEnable=true needs plainAclFile (the path of plain_acl.yml) or "
                      "$ROCKETMQ_HOME (RocketMQ's conf/plain_acl.yml under it)")


def read_acl_file(path: str) -> bytes:
    """The bytes of ``path``, read without ever waiting on a writer: opened non-blocking, a
    regular file only, at most ``MAX_FILE_BYTES`` + 1 bytes (``PlainAcl.parse`` refuses
    more). Raises ``OSError``, with a reason, for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat_mode.S_ISREG(mode):
            kind = "a FIFO" if stat_mode.S_ISFIFO(mode) else "a directory" \
                if stat_mode.S_ISDIR(mode) else "a device or socket"
            raise OSError(f"{kind}, not a regular file")
        chunks: list[bytes] = []
        left = MAX_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 256 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


#: the AccessKeys a load's log line names (a file of thousands makes one short line)
_NAMED = 10


def _some_names(acl: PlainAcl) -> str:
    names = sorted(acl.accounts)
    shown = ", ".join(names[:_NAMED]) or "none"
    return shown if len(names) <= _NAMED else f"{shown} and {len(names) - _NAMED} more"


def _stamp(path: str) -> tuple[int, ...] | None:
    """What says the file may have changed: its inode (replaced by a rename), size, mtime,
    and ctime (a chmod that makes an unreadable file readable moves only that)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


@attrs.define(eq=False)
class AclFile:
    """``plain_acl.yml`` at ``path``, its accounts in ``acl``."""

    path: str
    acl: PlainAcl
    _stamp: tuple[int, ...] | None = None
    _text: bytes = b""
    #: strict mode's replay guard (aclRequireFreshness), kept across reloads
    guard: ReplayGuard | None = None
    #: reloads that took effect, and that failed (the last good accounts kept)
    reloads: int = 0
    failed_reloads: int = 0
    #: a reload's worker thread has not returned yet (a read stuck on a dead mount)
    _reading: bool = False

    @classmethod
    def open(cls, path: str, guard: ReplayGuard | None = None) -> AclFile:
        """Load ``path``; raises ``AclConfigError`` (naming the file) when it is missing or
        invalid."""
        stamp = _stamp(path)
        try:
            text = read_acl_file(path)
        except OSError as exc:
            raise AclConfigError(f"aclEnable=true but the ACL file {path} cannot be read: "
                                 f"{exc.strerror or exc}") from None
        acl = PlainAcl.parse(text, path)
        log.info("ACL: %d account(s) from %s (%s)", len(acl.accounts), path,
                 _some_names(acl))
        return cls(path, acl, stamp, text, guard)

    def check(self, request: RemotingCommand, peer_host: str,
              admin_codes: frozenset[int] = ADMIN_CODES) -> str | None:
        """``PlainAcl.check`` with the accounts loaded last (and strict mode's guard)."""
        return self.acl.check(request, peer_host, admin_codes, self.guard)

    def reload_if_changed(self) -> bool:
        """Read the file again if its stamp (``_stamp``) moved; True when new accounts took
        effect. Blocking: a worker thread's."""
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return False
        try:
            text = read_acl_file(self.path)
        except OSError as exc:  # tried again when it changes again (or after a chmod)
            self._stamp = stamp
            log.error("ACL: cannot read %s (%s): the last loaded accounts stay", self.path,
                      exc.strerror or exc)
            self.failed_reloads += 1
            return False
        self._stamp = stamp
        if text == self._text:
            return False
        self._text = text
        try:
            acl = PlainAcl.parse(text, self.path)
        except AclConfigError as exc:
            log.error("ACL: %s; the last loaded accounts stay", exc)
            self.failed_reloads += 1
            return False
        self.acl = acl
        self.reloads += 1
        log.info("ACL: reloaded %s: %d account(s) (%s)", self.path, len(acl.accounts),
                 _some_names(acl))
        return True

    async def watch(self, interval: float = WATCH_INTERVAL) -> None:
        """Reload the file whenever it changes, until cancelled. Cancelling never waits for
        a reload in progress (its thread is left to finish, or not, on its own)."""
        while True:
            await trio.sleep(interval)
            if self._reading:
                continue  # the last read has not returned: said once, when it began to hang
            patience = max(10 * interval, 5.0)
            with trio.move_on_after(patience) as slow:
                await trio.to_thread.run_sync(self._reload_in_thread, abandon_on_cancel=True)
            if slow.cancelled_caught:
                log.error("ACL: reading %s has not returned in %.0f s (a hung mount?): the "
                          "last loaded accounts stay, and no reload starts until it returns",
                          self.path, patience)

    def _reload_in_thread(self) -> None:
        # set here, not by the caller: a call abandoned before its thread started (waiting
        # for a free worker) must not leave the flag set for ever
        self._reading = True
        try:
            self.reload_if_changed()
        finally:
            self._reading = False
