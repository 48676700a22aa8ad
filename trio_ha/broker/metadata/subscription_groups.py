"""``subscriptionGroup.json``: the consumer groups this broker serves, and how.

RocketMQ's SubscriptionGroupManager: group name -> ``SubscriptionGroupConfig`` (RocketMQ 4.9
defaults: consume enabled, from min, broadcast allowed, 1 retry queue, 16 retries, broker 0,
slow-consume broker 1), with a DataVersion bumped on every change. A group appears when a
consumer first pulls or heartbeats (``autoCreateSubscriptionGroup``), through
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, and on a slave by copying the master's table. RocketMQ's
system groups are added at startup where the file lacks them.

Clients name groups freely, so the table has a cap (``maxSubscriptionGroupNums``, which
RocketMQ lacks): beyond it no group is created, on demand or by request, and the broker answers
as for a group that does not exist. A slave takes its master's table whole, cap or not: the
master bounded it.

Groups created on demand are what a hostile client floods the table with (ten heartbeats
naming 10,000 groups each), so on-demand creation stops short of the cap, leaving a tenth of
it (``AUTO_CREATE_RESERVE``) to the groups an operator creates; and a caller may name a
*creator* (the broker names the connection a heartbeat came on), each of which creates at most
``max_auto_created_per_creator`` (``maxAutoCreateSubscriptionGroupNumsPerClient``) groups.
Groups that exist are found whatever the bounds.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import ClassVar

import attrs

from trio_ha.ratelog import RateLimitedLog
from trio_ha.wire.layout import INT32_MAX, INT64_MAX
from trio_ha.wire.metadata import (
    SUBSCRIPTION_GROUP_JSON,
    DataVersion,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    decode_subscription_groups,
    encode_subscription_groups,
)

from .config_file import VersionedTable, now_ms
from .files import load_with_backup
from .validation import MAX_QUEUE_NUMS, InvalidMetadataError, MetadataLimitError, check_group

__all__ = [
    "AUTO_CREATE_RESERVE",
    "DEFAULT_MAX_AUTO_CREATED_PER_CLIENT",
    "DEFAULT_MAX_SUBSCRIPTION_GROUPS",
    "SYSTEM_CONSUMER_GROUPS",
    "SYS_CONSUMER_GROUP_PREFIX",
    "SubscriptionGroupManager",
]

log = logging.getLogger(__name__)

#: groups RocketMQ's SubscriptionGroupManager creates at startup (``init()``)
SYSTEM_CONSUMER_GROUPS = (
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONS-HTTP-PROXY",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
)
#: ``MixAll.CID_SYS_RMQ_SYS_PREFIX`` (``isSysConsumerGroup``): created on demand even with
#: auto-creation off
SYS_CONSUMER_GROUP_PREFIX = "CID_RMQ_SYS_"
#: ``maxSubscriptionGroupNums``' default: far more groups than a broker serves, few enough that
#: the table and its file stay small (a group is about 300 bytes of JSON)
DEFAULT_MAX_SUBSCRIPTION_GROUPS = 10_000
#: the share of ``maxSubscriptionGroupNums`` on-demand creation leaves to operators' requests
AUTO_CREATE_RESERVE = 0.1
#: ``maxAutoCreateSubscriptionGroupNumsPerClient``' default: groups one client (connection)
#: may create on demand; a real client consumes for a handful of groups
DEFAULT_MAX_AUTO_CREATED_PER_CLIENT = 256


@attrs.define(eq=False)
class SubscriptionGroupManager(VersionedTable[SubscriptionGroupWrapper, SubscriptionGroupConfig]):
    """``subscriptionGroup.json``. ``auto_create`` is ``autoCreateSubscriptionGroup``,
    ``max_groups`` is ``maxSubscriptionGroupNums``."""

    file_name: ClassVar[str] = SUBSCRIPTION_GROUP_JSON

    auto_create: bool = attrs.field(default=True, kw_only=True)
    max_groups: int = attrs.field(default=DEFAULT_MAX_SUBSCRIPTION_GROUPS, kw_only=True)
    max_auto_created_per_creator: int = attrs.field(
        default=DEFAULT_MAX_AUTO_CREATED_PER_CLIENT, kw_only=True)
    #: the cap was reached and said so in the log; cleared when the table is below it again
    _full_logged: bool = attrs.field(default=False, init=False)
    #: creator -> groups it created on demand (forgotten with the creator: a connection)
    _created_by: weakref.WeakKeyDictionary[object, int] = attrs.field(
        factory=weakref.WeakKeyDictionary, init=False)
    _refusals: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log), init=False)

    @classmethod
    def load(
        cls,
        config_dir: str | os.PathLike[str],
        *,
        auto_create: bool = True,
        max_groups: int = DEFAULT_MAX_SUBSCRIPTION_GROUPS,
        max_auto_created_per_creator: int = DEFAULT_MAX_AUTO_CREATED_PER_CLIENT,
        clock: Callable[[], int] = now_ms,
    ) -> SubscriptionGroupManager:
        """Read ``<config_dir>/subscriptionGroup.json`` (or its backup) and add the system
        groups it lacks (one DataVersion bump if any). Blocking. Raises ``MetadataLoadError``
        if both copies are damaged."""
        path = os.path.join(os.fspath(config_dir), cls.file_name)
        loaded = load_with_backup(path, decode_subscription_groups)
        if loaded is None:
            loaded = SubscriptionGroupWrapper({}, DataVersion(0, clock()))
        manager = cls(
            path,
            dict(loaded.subscription_group_table),
            loaded.data_version,
            clock=clock,
            auto_create=auto_create,
            max_groups=max_groups,
            max_auto_created_per_creator=max_auto_created_per_creator,
        )
        missing = [name for name in SYSTEM_CONSUMER_GROUPS if name not in manager._table]
        for name in missing:
            manager._table[name] = SubscriptionGroupConfig(name)
        if missing:
            manager._bump()
        return manager

    def find_or_create(self, group: str, *, creator: object | None = None
                       ) -> SubscriptionGroupConfig | None:
        """``findSubscriptionGroupConfig``: the group's config; a missing group is created with
        the defaults when auto-creation is on or the name starts with ``CID_RMQ_SYS_`` (bumping
        the DataVersion), the table is below the on-demand bound (``auto_create_limit``) and
        ``creator`` (if named) has created fewer than ``max_auto_created_per_creator``, else
        None (the caller answers SUBSCRIPTION_GROUP_NOT_EXIST; ``why_not_created`` says why).
        Raises ``InvalidMetadataError`` for a name outside RocketMQ's group charset."""
        check_group(group)
        config = self._table.get(group)
        if config is not None:
            return config
        if not (self.auto_create or group.startswith(SYS_CONSUMER_GROUP_PREFIX)):
            return None
        if self._full(self.auto_create_limit):
            return None
        if creator is not None:
            created = self._created_by.get(creator, 0)
            if created >= self.max_auto_created_per_creator:
                return None
            self._created_by[creator] = created + 1
        config = self._table[group] = SubscriptionGroupConfig(group)
        self._bump()
        log.info("auto-created subscription group %s", group)
        return config

    @property
    def auto_create_limit(self) -> int:
        """The table size at which on-demand creation stops (below ``max_groups``, so that
        an operator can still create groups; the same for a small table)."""
        return self.max_groups - int(self.max_groups * AUTO_CREATE_RESERVE)

    def created_by(self, creator: object) -> int:
        """How many groups ``creator`` created on demand."""
        return self._created_by.get(creator, 0)

    def log_refusal(self, who: str, count: int, creator: object | None = None) -> None:
        """One line (rate-limited: a client can repeat it at will) for ``count`` groups
        ``who`` named that were not created."""
        self._refusals.log(logging.WARNING, "refused", "subscription groups: %s named %d "
                           "new group(s), not created: %s", who, count,
                           self.why_not_created(creator))

    def why_not_created(self, creator: object | None = None) -> str:
        """Why ``find_or_create`` returned None for a group: the remark's explanation."""
        if len(self._table) >= self.max_groups:
            return f"the broker holds maxSubscriptionGroupNums={self.max_groups} groups"
        if self.auto_create and len(self._table) >= self.auto_create_limit:
            return (f"the broker holds {len(self._table)} groups, the most it creates on demand "
                    f"(the rest of maxSubscriptionGroupNums={self.max_groups} is left to "
                    f"UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)")
        if (self.auto_create and creator is not None
                and self.created_by(creator) >= self.max_auto_created_per_creator):
            return (f"this client created maxAutoCreateSubscriptionGroupNumsPerClient="
                    f"{self.max_auto_created_per_creator} groups already")
        return "autoCreateSubscriptionGroup is off"

    def update(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig | None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: store ``config``, bump the DataVersion; returns
        the previous config, if any. Raises ``InvalidMetadataError`` for a bad name or retry
        queue count, ``MetadataLimitError`` for a new group beyond ``max_groups``."""
        check_group(config.group_name)
        for key, value, high in (
            ("retryQueueNums", config.retry_queue_nums, MAX_QUEUE_NUMS),
            ("retryMaxTimes", config.retry_max_times, INT32_MAX),
            ("brokerId", config.broker_id, INT64_MAX),
            ("whichBrokerWhenConsumeSlowly", config.which_broker_when_consume_slowly, INT64_MAX),
        ):
            if not 0 <= value <= high:
                raise InvalidMetadataError(
                    f"group {config.group_name}: {key} must be in 0..{high}, got {value}")
        old = self._table.get(config.group_name)
        if old is None and self._full(self.max_groups):
            raise MetadataLimitError(
                f"subscription group {config.group_name} not created: {self.why_not_created()}"
            )
        self._table[config.group_name] = config
        self._bump()
        return old

    def delete(self, group: str) -> bool:
        """DELETE_SUBSCRIPTIONGROUP: bumps the DataVersion if the group existed."""
        if self._table.pop(group, None) is None:
            return False
        self._bump()
        return True

    def _full(self, limit: int) -> bool:
        """Whether the table is at ``limit``; says so in the log once per time it fills (a
        flood of new names must not become a flood of log lines)."""
        full = len(self._table) >= limit
        if full and not self._full_logged:
            if limit < self.max_groups:
                log.warning("subscription groups: the table holds %d groups; no more are "
                            "created on demand (the rest of maxSubscriptionGroupNums=%d is "
                            "left to operators)", limit, self.max_groups)
            else:
                log.warning("subscription groups: the table holds maxSubscriptionGroupNums=%d "
                            "groups; no more are created", self.max_groups)
        self._full_logged = full
        return full

    def wrapper(self) -> SubscriptionGroupWrapper:
        """``subscriptionGroup.json`` and the GET_ALL_SUBSCRIPTIONGROUP_CONFIG body."""
        return self.snapshot()

    def replace_from_master(self, wrapper: SubscriptionGroupWrapper) -> bool:
        """Slave sync: take the master's table and version if its DataVersion differs."""
        if wrapper.data_version == self._version:
            return False
        self._table = dict(wrapper.subscription_group_table)
        self._version = wrapper.data_version
        self._dirty = True
        return True

    def snapshot(self) -> SubscriptionGroupWrapper:
        return SubscriptionGroupWrapper(dict(self._table), self._version)

    @staticmethod
    def encode_snapshot(snapshot: SubscriptionGroupWrapper) -> bytes:
        return encode_subscription_groups(snapshot)
