"""The broker's live ACL: ``plain_acl.yml`` loaded at start and reloaded when it changes.

RocketMQ's ``AclFileWatchService`` polls the file every 500 ms and reloads it when its MD5
changes; operators rely on editing the file without restarting the broker. We poll the same
way (a stat every ``interval``; the bytes are read and parsed only when size or mtime moved,
and swapped in only when they differ), because inotify is not everywhere the broker runs
(containers, network file systems) and one stat per half second costs nothing.

A file that fails to parse at start stops the broker (an operator who turned ACL on must not
get a broker without it). One that fails later is logged and the last good accounts stay:
a half-saved edit must neither open the broker nor lock every client out.
"""

from __future__ import annotations

import logging
import os

import attrs
import trio

from ..config import ConfigError
from ..wire.remoting import RemotingCommand
from .plain import ADMIN_CODES, MAX_FILE_BYTES, AclConfigError, PlainAcl

__all__ = ["AclFile", "acl_file_path"]

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


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


@attrs.define(eq=False)
class AclFile:
    """``plain_acl.yml`` at ``path``, its accounts in ``acl``."""

    path: str
    acl: PlainAcl
    _stamp: tuple[int, int] | None = None
    _text: bytes = b""
    #: reloads that took effect, and that failed (the last good accounts kept)
    reloads: int = 0
    failed_reloads: int = 0

    @classmethod
    def open(cls, path: str) -> AclFile:
        """Load ``path``; raises ``AclConfigError`` (naming the file) when it is missing or
        invalid."""
        stamp = _stamp(path)
        try:
            with open(path, "rb") as file:
                text = file.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise AclConfigError(f"aclEnable=true but the ACL file {path} cannot be read: "
                                 f"{exc.strerror or exc}") from None
        acl = PlainAcl.parse(text, path)
        log.info("ACL: %d account(s) from %s (%s)", len(acl.accounts), path,
                 ", ".join(sorted(acl.accounts)) or "none")
        return cls(path, acl, stamp, text)

    def check(self, request: RemotingCommand, peer_host: str,
              admin_codes: frozenset[int] = ADMIN_CODES) -> str | None:
        """``PlainAcl.check`` with the accounts loaded last."""
        return self.acl.check(request, peer_host, admin_codes)

    def reload_if_changed(self) -> bool:
        """Read the file again if its size or mtime moved; True when new accounts took
        effect."""
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return False
        try:
            with open(self.path, "rb") as file:
                text = file.read(MAX_FILE_BYTES + 1)
        except OSError as exc:  # tried again at the next look (a chmod moves no stamp)
            log.error("ACL: cannot read %s (%s): the last loaded accounts stay", self.path, exc)
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
                 ", ".join(sorted(acl.accounts)) or "none")
        return True

    async def watch(self, interval: float = WATCH_INTERVAL) -> None:
        """Reload the file whenever it changes, until cancelled."""
        while True:
            await trio.sleep(interval)
            await trio.to_thread.run_sync(self.reload_if_changed)
