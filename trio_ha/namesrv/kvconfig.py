"""The name server's KV config (RocketMQ's KVConfigManager): namespaced key/value pairs that
operators set with mqadmin (``updateKvConfig``, ``deleteKvConfig``, ``updateOrderConf``) and
that clients and brokers read back.

RocketMQ keeps them in memory and rewrites ``kvConfigPath`` (``~/namesrv/kvConfig.json``) after
every change, so they outlive a restart; the file is fastjson's
``{"configTable":{namespace:{key:value}}}``. So do we, with two differences: the write goes to a
temporary file that is synced and then renamed over the old one (RocketMQ's ``string2File``
deletes the old file before renaming, and a crash in between loses the table), and a file that
is not valid JSON stops the name server with an error naming it, where RocketMQ stops it with
fastjson's stack trace. ``path=None`` keeps the table in memory only.

One namespace matters to RocketMQ itself: ``ORDER_TOPIC_CONFIG`` (topic -> ``broker:queues;...``)
is returned to brokers when they register, and in routes when ``orderMessageEnable`` is on.
"""

from __future__ import annotations

import contextlib
import logging
import os

import attrs
import trio

from ..config import ConfigError
from ..wire.errors import RouteDecodeError
from ..wire.route import KVConfigTable, KVTable

__all__ = [
    "DEFAULT_KV_CONFIG_PATH",
    "NAMESPACE_ORDER_TOPIC_CONFIG",
    "KVConfigFileError",
    "KVConfigManager",
]

log = logging.getLogger(__name__)

#: RocketMQ's default ``kvConfigPath``
DEFAULT_KV_CONFIG_PATH = os.path.join(os.path.expanduser("~"), "namesrv", "kvConfig.json")
#: the namespace of order-topic configs (RocketMQ's NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG)
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"
#: the largest kvConfig.json read at startup
MAX_KV_CONFIG_FILE = 64 * 1024 * 1024


class KVConfigFileError(ConfigError):
    """The KV config file exists but cannot be read or is not the table RocketMQ writes."""


def _write_synced(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: a synced temporary file renamed over it, then the
    directory synced, so a crash leaves the old table or the new one."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@attrs.define(eq=False)
class KVConfigManager:
    """namespace -> key -> value, written to ``path`` after every change (if it has one)."""

    path: str | None = None
    table: dict[str, dict[str, str]] = attrs.field(factory=dict)
    _write_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    @classmethod
    def load(cls, path: str | None) -> KVConfigManager:
        """The table in ``path`` (empty if there is no file). Blocking: run it in a thread.
        Raises ``KVConfigFileError`` for a file that cannot be read or decoded."""
        if path is None:
            return cls(None)
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_KV_CONFIG_FILE + 1)
        except FileNotFoundError:
            return cls(path)
        except OSError as exc:
            raise KVConfigFileError(f"kvConfigPath {path}: cannot read it: "
                                    f"{exc.strerror or exc}") from exc
        if len(data) > MAX_KV_CONFIG_FILE:
            raise KVConfigFileError(f"kvConfigPath {path}: larger than {MAX_KV_CONFIG_FILE} bytes")
        if not data.strip():
            return cls(path)  # RocketMQ reads an empty file as no table
        try:
            decoded = KVConfigTable.decode(data)
        except RouteDecodeError as exc:
            raise KVConfigFileError(f"kvConfigPath {path}: not a KV config table: {exc}") from None
        log.info("namesrv: loaded the KV config from %s (%d namespaces)", path,
                 len(decoded.config_table))
        return cls(path, {ns: dict(kv) for ns, kv in decoded.config_table.items()})

    # ---- reading ---------------------------------------------------------------------------

    def get(self, namespace: str, key: str) -> str | None:
        return self.table.get(namespace, {}).get(key)

    def namespace(self, namespace: str) -> KVTable | None:
        """GET_KVLIST_BY_NAMESPACE: the namespace's pairs, or None if it has none."""
        entries = self.table.get(namespace)
        return KVTable(dict(entries)) if entries is not None else None

    # ---- changing --------------------------------------------------------------------------

    async def put(self, namespace: str, key: str, value: str) -> None:
        """Set ``key`` in ``namespace`` and write the file."""
        previous = self.table.setdefault(namespace, {}).get(key)
        self.table[namespace][key] = value
        log.info("namesrv: KV config %s %s.%s = %r", "updated" if previous is not None
                 else "created", namespace, key, value)
        await self.persist()

    async def delete(self, namespace: str, key: str) -> None:
        """Remove ``key`` from ``namespace`` (nothing if absent) and write the file. An emptied
        namespace stays, as in RocketMQ (its list is then ``{}``, not "not found")."""
        entries = self.table.get(namespace)
        if entries is not None and entries.pop(key, None) is not None:
            log.info("namesrv: KV config %s.%s deleted", namespace, key)
        await self.persist()

    async def persist(self) -> None:
        """Write the table now (in a worker thread). Writes never overlap, and each writes the
        table as it is when its turn comes, so the last one leaves the newest table. An
        OSError (no room, no permission) propagates: the caller answers the request with it."""
        if self.path is None:
            await trio.lowlevel.checkpoint()
            return
        path = self.path
        async with self._write_lock:
            data = KVConfigTable({ns: dict(kv) for ns, kv in self.table.items()}).encode()
            try:
                await trio.to_thread.run_sync(_write_synced, path, data,
                                              abandon_on_cancel=False)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(path + ".tmp")
                raise
