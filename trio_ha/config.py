"""Configuration values, named as RocketMQ names them.

Field names are RocketMQ's ``MessageStoreConfig`` names in snake_case, with RocketMQ's defaults,
so an operator's ``broker.conf`` maps over directly (``StoreConfig.from_properties``). Two rules
RocketMQ breaks and we keep: sizes are 64-bit and range-checked (a 25 GiB
``haSlaveFallbehindMax`` is not silently clamped, issue #2611), and an explicitly configured
value always wins over a derived default (issue #6537).
"""

from __future__ import annotations

import difflib
import enum
import os
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from ._errors import TrioHAError
from .wire.ha_auth import MIN_SECRET_LENGTH
from .wire.layout import (
    CQ_ENTRY_SIZE,
    DEFAULT_COMMITLOG_SEGMENT_SIZE,
    DEFAULT_CQ_ENTRIES_PER_FILE,
    DEFAULT_MAX_MESSAGE_SIZE,
    INT32_MAX,
    INT64_MAX,
)

__all__ = [
    "GiB", "MiB", "INT64_MAX", "FlushDiskType", "BrokerRole", "ConfigError", "StoreConfig",
    "parse_properties_text", "in_range", "camel_case", "parse_value", "parse_delay_levels",
    "DEFAULT_MESSAGE_DELAY_LEVEL",
]

GiB = 1024**3
MiB = 1024**2

#: an attrs validator: (instance, attribute, value) -> None, raising ConfigError
_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(enum.Enum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


class ConfigError(TrioHAError, ValueError):
    """A configuration value is missing, malformed or out of range."""


def in_range(low: int, high: int = INT64_MAX) -> _Validator:
    """An attrs validator: an int (not a bool) within [low, high], else ConfigError."""
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{config_key(attribute.name)} must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ConfigError(f"{config_key(attribute.name)}={value} is outside [{low}, {high}]")

    return check


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    in_range(1)(instance, attribute, value)


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    in_range(0)(instance, attribute, value)


def _cq_entries(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value % CQ_ENTRY_SIZE:
        raise ConfigError(
            f"{config_key(attribute.name)}={value} must be a multiple of {CQ_ENTRY_SIZE}")


#: settings GET_BROKER_CONFIG must not reveal
_SECRET_FIELDS = frozenset({"ha_auth_secret"})
def _ha_auth_secret(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and len(value) < MIN_SECRET_LENGTH:
        raise ConfigError(f"haAuthSecret must be at least {MIN_SECRET_LENGTH} characters: a "
                          "shorter one could be guessed from one recorded handshake")


def _not_below_sync_acks(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    # attrs runs validators once every field is set, so the other field is there.
    if value < instance.ha_sync_acks:
        raise ConfigError(
            f"{config_key(attribute.name)}={value} is below "
            f"{config_key('ha_sync_acks')}={instance.ha_sync_acks}: no put could ever get its acks"
        )


def _transfer_method(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in ("send", "sendfile"):
        raise ConfigError(f"{config_key(attribute.name)} must be 'send' or 'sendfile', "
                          f"got {value!r}")


#: RocketMQ's ``messageDelayLevel`` default: the delay of levels 1, 2, ... of a DELAY message
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: the most delay levels a ``messageDelayLevel`` may name
MAX_DELAY_LEVELS = 64
_DELAY_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """``messageDelayLevel`` ("1s 5s ... 2h") as milliseconds per level (level n at index
    n - 1), as RocketMQ's ``parseDelayLevel`` reads it: space-separated numbers with a unit of
    s, m, h or d. RocketMQ logs a bad entry and starts without delays; here it is an error."""
    levels = []
    for item in text.split():
        unit = _DELAY_UNITS.get(item[-1:])
        number = item[:-1]
        if unit is None or not number.isdigit() or int(number) <= 0:
            raise ConfigError(
                f"messageDelayLevel: {item!r} is not a positive number followed by s, m, h or d"
            )
        levels.append(int(number) * unit)
    if not 1 <= len(levels) <= MAX_DELAY_LEVELS:
        raise ConfigError(f"messageDelayLevel must name 1 to {MAX_DELAY_LEVELS} levels, "
                          f"got {len(levels)}")
    return tuple(levels)


def _delay_levels(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{config_key(attribute.name)} must be a string, got {value!r}")
    parse_delay_levels(value)


def config_key(name: str) -> str:
    """A field's key as an operator writes it in a properties file (``flush_disk_type`` ->
    ``flushDiskType``, RocketMQ's spelling where it differs): what an error must name."""
    for key, field in _RENAMED.items():
        if field == name:
            return key
    return camel_case(name)


def camel_case(name: str) -> str:
    """``flush_disk_type`` -> ``flushDiskType``: a field's key in a RocketMQ properties file."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# RocketMQ spells a few names differently from a plain camelCase of ours.
_RENAMED = {
    "checkCRCOnRecover": "check_crc_on_recover",
    "checkCRCOnRead": "check_crc_on_read",
    "flushIntervalConsumeQueue": "flush_interval_consume_queue",
    "osPageCacheBusyTimeOutMills": "os_page_cache_busy_timeout_mills",
    "warmMapedFileEnable": "warm_mapped_file_enable",
}


def render_value(value: object) -> str | None:
    """A config value as a Java properties file holds it (None: left out, as RocketMQ's
    ``MixAll.object2Properties`` leaves out nulls)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


@attrs.frozen(kw_only=True)
class StoreConfig:
    """Everything a store needs to know. Times are milliseconds unless named otherwise."""

    store_path_root_dir: str = attrs.field(
        default=os.path.join(os.path.expanduser("~"), "store")
    )
    #: commitlog directory; ``<store_path_root_dir>/commitlog`` when unset
    store_path_commit_log: str | None = None
    #: the epoch file of controller mode (storePathEpochFile);
    #: ``<store_path_root_dir>/epochFileCheckpoint`` when unset
    store_path_epoch_file: str | None = None
    mapped_file_size_commit_log: int = attrs.field(
        default=DEFAULT_COMMITLOG_SEGMENT_SIZE, validator=in_range(4096)
    )
    mapped_file_size_consume_queue: int = attrs.field(
        default=DEFAULT_CQ_ENTRIES_PER_FILE * CQ_ENTRY_SIZE,
        validator=[in_range(CQ_ENTRY_SIZE), _cq_entries],
    )
    flush_disk_type: FlushDiskType = attrs.field(
        default=FlushDiskType.ASYNC_FLUSH, converter=FlushDiskType
    )
    flush_interval_commit_log: int = attrs.field(default=500, validator=_positive)
    flush_commit_log_least_pages: int = attrs.field(default=4, validator=_non_negative)
    flush_commit_log_thorough_interval: int = attrs.field(default=10_000, validator=_positive)
    flush_interval_consume_queue: int = attrs.field(default=1000, validator=_positive)
    flush_consume_queue_least_pages: int = attrs.field(default=2, validator=_non_negative)
    flush_consume_queue_thorough_interval: int = attrs.field(
        default=60_000, validator=_positive
    )
    sync_flush_timeout: int = attrs.field(default=5000, validator=_positive)
    #: waiting SYNC_FLUSH / SYNC_MASTER puts each service (group commit, group transfer)
    #: holds, and again as many in its request channel; puts beyond wait to get in
    sync_request_channel_capacity: int = attrs.field(default=1024, validator=in_range(1, 2**20))
    #: how long a put may wait for the next commitlog segment before CREATE_MAPEDFILE_FAILED
    allocate_timeout: int = attrs.field(default=5000, validator=_positive)
    #: hours a commitlog segment is kept after its last write
    file_reserved_time: int = attrs.field(default=72, validator=_positive)
    #: hour(s) of day, ";"-separated, when expired files are deleted without disk pressure
    delete_when: str = "04"
    disk_max_used_space_ratio: int = attrs.field(default=75, validator=in_range(10, 95))
    #: above this percentage of its filesystem used, the store refuses puts
    #: (SERVICE_NOT_AVAILABLE) until it falls below again; RocketMQ's
    #: rocketmq.broker.diskSpaceWarningLevelRatio (0.90), here a percentage
    disk_space_warning_level_ratio: int = attrs.field(default=90, validator=in_range(10, 100))
    clean_resource_interval: int = attrs.field(default=10_000, validator=_positive)
    delete_commit_log_files_interval: int = attrs.field(default=100, validator=_non_negative)
    #: body size limit (4 MiB), as RocketMQ's maxMessageSize
    max_message_size: int = attrs.field(
        default=DEFAULT_MAX_MESSAGE_SIZE, validator=in_range(1, INT32_MAX)
    )
    check_crc_on_recover: bool = True
    #: recovery replaces a damaged record by filler and keeps the records after it when
    #: they chain (docs/formats.md, 'Recovery'); false: the log ends at the first damaged
    #: record, as RocketMQ's
    skip_corrupt_records_on_recover: bool = True
    #: pulls and lookups check each record (structure, BODYCRC, PHYSICALOFFSET, and for a
    #: pull the queue and queue offset its entry promised) before serving it
    check_crc_on_read: bool = True
    #: write every page of a new segment in a worker thread before appends reach it. Off by
    #: default, as in RocketMQ: warming writes each whole segment (1 GiB by default) once
    #: more, which an embedded store or a broker that just started pays up front
    warm_mapped_file_enable: bool = False
    #: ``ip:port`` recorded as STOREHOST in every record (brokerIP1:listenPort)
    store_host: str = "127.0.0.1:10911"
    broker_role: BrokerRole = attrs.field(default=BrokerRole.ASYNC_MASTER, converter=BrokerRole)
    #: RocketMQ 5's controller mode (the broker's enableControllerMode, read from the same
    #: key): the HA port speaks the AutoSwitch protocol (store/ha/autoswitch_master.py) and a
    #: slave copies with the AutoSwitch client; false: the classic protocol
    enable_controller_mode: bool = False
    os_page_cache_busy_timeout_mills: int = attrs.field(default=1000, validator=_positive)
    #: index every message by key (KEYS, UNIQ_KEY) in ``<root>/index`` for QUERY_MESSAGE
    message_index_enable: bool = True
    #: slots and entries of one index file (RocketMQ's defaults: a 420 MB sparse file)
    max_hash_slot_num: int = attrs.field(default=5_000_000, validator=in_range(1, 100_000_000))
    max_index_num: int = attrs.field(default=20_000_000, validator=in_range(2, 100_000_000))
    #: the most messages one query by key returns
    max_msgs_num_batch: int = attrs.field(default=64, validator=in_range(1, 65536))
    #: the delay of each level a DELAY message may name (level n is the n-th entry); the
    #: dispatcher writes a delayed message's delivery time into its consume-queue entry
    message_delay_level: str = attrs.field(
        default=DEFAULT_MESSAGE_DELAY_LEVEL, validator=_delay_levels
    )

    # ---- HA (docs/ha-protocol.md, 'Timers and settings') ---------------------------------
    #: where the HA service listens; 0 lets the OS choose (``store.ha_address`` tells); None:
    #: no HA listener (an embedded store). A broker derives listenPort + 1 only when this is
    #: not configured (RocketMQ #6537).
    ha_listen_port: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(in_range(0, 65535))
    )
    #: interface the HA service binds (RocketMQ binds every interface)
    ha_bind_address: str = "0.0.0.0"
    #: ``ip:port`` of the master's HA service, for a slave
    ha_master_address: str | None = None
    ha_send_heartbeat_interval: int = attrs.field(default=5000, validator=_positive)
    ha_housekeeping_interval: int = attrs.field(default=20_000, validator=_positive)
    #: the largest frame body the master sends; a frame carries what is ready up to it.
    #: RocketMQ's default is 32 KiB, which holds a catching-up slave to a fifth of what 1 MiB
    #: frames reach (``trio-ha bench replication``); 1 MiB is well inside the 4 MiB read buffer
    #: of RocketMQ's own slaves. An explicit haTransferBatchSize wins.
    ha_transfer_batch_size: int = attrs.field(default=MiB, validator=in_range(1, 64 * MiB))
    #: 64-bit: a 25 GiB gap is 25 GiB, not a silently clamped int (RocketMQ #2611)
    ha_slave_fallbehind_max: int = attrs.field(default=256 * MiB, validator=_positive)
    #: how long a SYNC_MASTER put waits for slave acks before FLUSH_SLAVE_TIMEOUT
    slave_timeout: int = attrs.field(default=3000, validator=_positive)
    #: slave acks a SYNC_MASTER put needs (RocketMQ 4.9: any one slave)
    ha_sync_acks: int = attrs.field(default=1, validator=in_range(1, 64))
    #: an empty slave copies from the master's first segment instead of its last (RocketMQ's
    #: classic master starts it at the last segment; older data never reaches it)
    ha_start_from_min_offset: bool = False
    #: how frame bodies leave the master: "sendfile" or "send" (memoryview slices of the
    #: mapping); both copy nothing in Python. sendfile is the default because it won 7 of 8
    #: catch-up runs with 1 MiB frames in ``trio-ha bench replication`` on this machine kind.
    ha_transfer_method: str = attrs.field(default="sendfile", validator=_transfer_method)
    #: a slave's HA client tries again after a failed session: first after
    #: ha_reconnect_min_interval, then after twice the last wait, at most ha_reconnect_interval
    #: for the first ha_reconnect_fast_period of an outage, and beyond it at most
    #: ha_reconnect_max_interval (never below ha_reconnect_interval); from the minimum again
    #: once a session has had a frame from its master. So a slave is attached again within
    #: about ha_reconnect_interval of a restarted master's return (before the producers' own
    #: retries: with 160 ms, 4.5 % of the sends in one `bench restarts` run met the restarted
    #: SYNC_MASTER first and were answered SLAVE_NOT_AVAILABLE), while a master that stays
    #: down sees one connect per ha_reconnect_max_interval, not 25 a second. RocketMQ 4.9
    #: waits 5 s every time: set the first two to 5000 for its behaviour.
    ha_reconnect_min_interval: int = attrs.field(default=20, validator=_positive)
    ha_reconnect_interval: int = attrs.field(default=40, validator=_positive)
    ha_reconnect_fast_period: int = attrs.field(default=10_000, validator=in_range(0, 86_400_000))
    ha_reconnect_max_interval: int = attrs.field(default=2000, validator=in_range(1, 3_600_000))
    #: HA connections a master serves at once; it closes any beyond at once (RocketMQ has no
    #: limit: every connection costs two tasks and a frame per put, docs/ha-protocol.md); at
    #: least ha_sync_acks
    ha_max_connections: int = attrs.field(
        default=16, validator=[in_range(1, 65535), _not_below_sync_acks]
    )
    #: a secret shared by a master and its slaves: with it, both ends prove they know it
    #: before any offset or log byte moves (our extension, trio_ha.wire.ha_auth; a classic
    #: RocketMQ peer cannot replicate with such a node). None: the classic protocol
    ha_auth_secret: str | None = attrs.field(default=None, repr=False,
                                             validator=_ha_auth_secret)


    # ---- controller mode (docs/controller-mode.md) -----------------------------------------
    #: in controller mode, a SYNC_MASTER put is acknowledged only once every member of the
    #: in-sync replica set has it. RocketMQ's default is false, which lets a failover truncate
    #: messages already answered SEND_OK (docs/differences.md); ours is true
    all_ack_in_sync_state_set: bool = True
    #: with all_ack_in_sync_state_set false: how many replicas (the master counts) must have
    #: a put before it is acknowledged
    in_sync_replicas: int = attrs.field(default=1, validator=in_range(1, 64))
    #: a master whose in-sync set is smaller than this refuses puts
    min_in_sync_replicas: int = attrs.field(default=1, validator=in_range(1, 64))
    #: a slave that has not caught up with the master for this long (ms) leaves the in-sync set
    ha_max_time_slave_not_catchup: int = attrs.field(default=15_000, validator=_positive)

    @property
    def delay_levels(self) -> tuple[int, ...]:
        """``message_delay_level`` in milliseconds per level (level n at index n - 1)."""
        return parse_delay_levels(self.message_delay_level)

    @property
    def commitlog_dir(self) -> str:
        return self.store_path_commit_log or os.path.join(self.store_path_root_dir, "commitlog")

    @property
    def epoch_file_path(self) -> str:
        return self.store_path_epoch_file or os.path.join(self.store_path_root_dir,
                                                          "epochFileCheckpoint")

    @classmethod
    def from_properties(cls, properties: Mapping[str, str] | str, **overrides: Any) -> StoreConfig:
        """Build a config from RocketMQ's camelCase keys (a mapping, or the text of a
        ``broker.conf``). Keys that are not store settings are ignored: a broker.conf also
        holds broker and network settings. ``overrides`` (snake_case) win over the file."""
        if isinstance(properties, str):
            properties = parse_properties_text(properties)
        fields = attrs.fields_dict(cls)
        by_camel = {camel_case(name): name for name in fields}
        by_camel.update(_RENAMED)
        hints = typing.get_type_hints(cls)
        # Each value is parsed to its field's type below; attrs validates the result.
        values: dict[str, Any] = {}
        for key, raw in properties.items():
            name = by_camel.get(key.strip())
            if name is None:
                continue
            values[name] = parse_value(name, hints[name], str(raw).strip())
        values.update(overrides)
        return cls(**values)

    @classmethod
    def property_keys(cls) -> set[str]:
        """The properties-file keys ``from_properties`` reads."""
        return {camel_case(name) for name in attrs.fields_dict(cls)} | set(_RENAMED)

    def to_properties(self) -> dict[str, str]:
        """Every setting under RocketMQ's key, as text (GET_BROKER_CONFIG's body); a secret
        shows only that it is set."""
        renamed = {name: key for key, name in _RENAMED.items()}
        out = {}
        for name in attrs.fields_dict(type(self)):
            value = getattr(self, name)
            if name in _SECRET_FIELDS and value is not None:
                value = "<hidden>"
            text = render_value(value)
            if text is not None:
                out[renamed.get(name, camel_case(name))] = text
        return out


def parse_value(name: str, hint: Any, raw: str) -> object:
    """``raw`` as the field's type hint says (int, bool, an enum, str, or optional ones)."""
    if hint == (int | None):
        hint = int
    try:
        if hint is bool:
            if raw.lower() not in ("true", "false"):
                raise ValueError(raw)
            return raw.lower() == "true"
        if hint is int:
            return int(raw)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return hint(raw.upper())
    except ValueError:
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            expected = "one of " + ", ".join(str(member.value) for member in hint)
        else:
            expected = "true or false" if hint is bool else "an integer" if hint is int else ""
        raise ConfigError(f"{config_key(name)}: cannot parse {raw!r}"
                          + (f" (expected {expected})" if expected else "")) from None
    return raw or None if hint == (str | None) else raw


def parse_properties_text(text: str) -> dict[str, str]:
    """Java-properties-style ``key=value`` lines; ``#`` and ``!`` start comments."""
    result: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        if not sep:
            raise ConfigError(f"line {number}: expected key=value, got {line!r}")
        result[key.strip()] = value.strip()
    return result


def check_keys(properties: Mapping[str, str], known: Iterable[str], *,
               accepted: Iterable[str] = (), unsupported: Mapping[str, str] | None = None
               ) -> list[str]:
    """Check the keys of a node's properties file: raises ConfigError for unknown keys (all
    of them, each with the closest known or accepted one: a typo is caught at start, not
    replaced by a default) and for an ``unsupported`` feature switched on (key -> why); returns the
    ``accepted`` keys present (RocketMQ's, meaning nothing here), sorted."""
    known = set(known)
    accepted = set(accepted)
    ignored = []
    unknown: list[str] = []
    for raw_key, value in properties.items():
        key = raw_key.strip()
        reason = (unsupported or {}).get(key)
        if reason is not None and str(value).strip().lower() == "true":
            raise ConfigError(f"{key}=true: {reason}")
        if key in known:
            continue
        if key in accepted:
            ignored.append(key)
            continue
        close = difflib.get_close_matches(key, sorted(known | accepted), n=1, cutoff=0.7)
        unknown.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if unknown:  # all of them at once: an operator fixes the file in one go
        raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    return sorted(ignored)
