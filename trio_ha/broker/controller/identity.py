"""Which member of its broker set this broker is: the ``brokerIdentity`` files.

In controller mode a broker's id within its set is handed out by the controller once and then
kept for the life of the store: a restarted broker must come back as the member it was, or
the controller would count it twice and its epochs would belong to someone else. RocketMQ
keeps it in two small text files in ``storePathRootDir``, and so do we, in its format, so a
store moves between RocketMQ and trio_ha with its identity:

- ``brokerIdentity``: ``<cluster>#<brokerName>#<id>``, written once the controller granted
  the id;
- ``brokerIdentity-temp``: ``<cluster>#<brokerName>#<id>#<registerCheckCode>``, written
  before the broker asks to apply an id (APPLY_BROKER_ID), so a broker that crashes between
  asking and hearing the answer asks again with the same check code, which the controller
  accepts as the same claimant.

RocketMQ writes them in place; a crash mid-write leaves a file it cannot parse and a broker
that never registers. We write a temporary file, fsync it and rename it over the old one, so
either file is whole. A file naming another cluster or broker name than the configuration is
an error that names both (RocketMQ logs it and retries forever, issue #7704): the operator
moved a store or changed brokerName, and must say which is right.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from ..._durable import fsync_dir, replace_synced
from ..._errors import TrioHAError

__all__ = ["IDENTITY_FILE", "TEMP_IDENTITY_FILE", "BrokerIdentity", "IdentityError",
           "IdentityFiles", "PendingIdentity"]

IDENTITY_FILE = "brokerIdentity"
TEMP_IDENTITY_FILE = "brokerIdentity-temp"


class IdentityError(TrioHAError):
    """An identity file cannot be read, or names another broker set than the config."""


@attrs.frozen
class BrokerIdentity:
    """This broker's place in its set, granted by the controller."""

    cluster: str
    broker_name: str
    broker_id: int

    def text(self) -> str:
        return f"{self.cluster}#{self.broker_name}#{self.broker_id}"


@attrs.frozen
class PendingIdentity:
    """An id asked for but not yet known to be granted, with the code that proves a retry
    comes from the same broker (``<brokerAddr>;<millis>``)."""

    cluster: str
    broker_name: str
    broker_id: int
    register_check_code: str

    def text(self) -> str:
        return f"{self.cluster}#{self.broker_name}#{self.broker_id}#{self.register_check_code}"

    def granted(self) -> BrokerIdentity:
        return BrokerIdentity(self.cluster, self.broker_name, self.broker_id)


def _parse(path: Path, text: str, parts: int) -> list[str]:
    fields = text.strip().split("#")
    # The check code holds a ';' but no '#'; names hold neither (RocketMQ's name rules).
    if len(fields) != parts or not all(fields[:2]):
        shape = "#".join(["cluster", "brokerName", "id", "checkCode"][:parts])
        raise IdentityError(f"{path}: not {shape}: {text!r:.80}")
    try:
        int(fields[2])
    except ValueError:
        raise IdentityError(f"{path}: the broker id {fields[2]!r:.20} is not a number") from None
    return fields


@attrs.define(eq=False)
class IdentityFiles:
    """The two files of one store. Blocking I/O: call from a worker thread."""

    directory: Path = attrs.field(converter=Path)
    cluster: str
    broker_name: str

    @property
    def identity_path(self) -> Path:
        return self.directory / IDENTITY_FILE

    @property
    def pending_path(self) -> Path:
        return self.directory / TEMP_IDENTITY_FILE

    def _read(self, path: Path) -> str | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise IdentityError(f"{path}: cannot read: {exc}") from None
        return text if text.strip() else None

    def _check(self, path: Path, cluster: str, broker_name: str) -> None:
        if (cluster, broker_name) != (self.cluster, self.broker_name):
            raise IdentityError(
                f"{path} belongs to cluster {cluster!r}, broker {broker_name!r}, but this broker "
                f"is configured as cluster {self.cluster!r}, broker {self.broker_name!r}: fix "
                "brokerClusterName/brokerName, or remove the file (and cleanBrokerMetadata on "
                "the controller) to join as a new member")

    def load(self) -> BrokerIdentity | None:
        """The granted identity, or None when the controller has not granted one yet."""
        text = self._read(self.identity_path)
        if text is None:
            return None
        cluster, name, broker_id = _parse(self.identity_path, text, 3)
        self._check(self.identity_path, cluster, name)
        return BrokerIdentity(cluster, name, int(broker_id))

    def load_pending(self) -> PendingIdentity | None:
        text = self._read(self.pending_path)
        if text is None:
            return None
        cluster, name, broker_id, code = _parse(self.pending_path, text, 4)
        self._check(self.pending_path, cluster, name)
        return PendingIdentity(cluster, name, int(broker_id), code)

    def save_pending(self, pending: PendingIdentity) -> None:
        replace_synced(str(self.pending_path), pending.text().encode())

    def drop_pending(self) -> None:
        try:
            self.pending_path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(str(self.directory))

    def save(self, identity: BrokerIdentity) -> None:
        """Record a granted id, then forget the pending claim (in that order: a crash between
        leaves both, and ``load`` prefers the granted one)."""
        replace_synced(str(self.identity_path), identity.text().encode())
        self.drop_pending()
