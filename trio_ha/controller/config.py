"""The controller server's settings, read from a RocketMQ-style ``controller.conf``.

RocketMQ's key names are kept where RocketMQ has the setting (``cm/ControllerConfig.java``), so
an operator's file carries over: ``scanNotActiveBrokerInterval``, ``enableElectUncleanMaster``,
``notifyBrokerRoleChanged``, ``electMasterMaxRetryCount``, ``controllerStorePath``,
``controllerType``, and the DLedger triple ``controllerDLegerGroup`` / ``controllerDLegerPeers``
/ ``controllerDLegerSelfId``. RocketMQ's DLedger controller serves brokers on its own peer's
port (dledger sets it from the self peer's address), so when ``listenPort`` is not given the
port is taken from the self peer in ``controllerDLegerPeers``: the quick-start files
(``n0-127.0.0.1:9878``) work unchanged, and so does an embedded controller in a name server's
file. Without either, 9878 (the quick-start port).

``controllerType`` picks the StateStore: ``journal`` (the default: a synced write-ahead file
under ``controllerStorePath``), ``etcd`` (several controllers) or ``memory`` (nothing
survives the process; tests). RocketMQ's own values (``DLedger``, ``jRaft``) name consensus
libraries we do not have; they are read as ``journal`` with a warning, since a RocketMQ file
that names one is a single controller's file here.

Keys of RocketMQ's that mean nothing here (thread pools, mapped file size, metrics exporters)
are accepted and named in one warning; unknown keys are an error naming the closest one.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ..config import ConfigError, check_keys, render_value
from ..remoting import RemotingLimits
from .etcd import EtcdKeys
from .etcd_client import parse_endpoints
from .rules import ControllerConfig

__all__ = [
    "CONTROLLER_FILE_KEYS",
    "DEFAULT_CONTROLLER_PORT",
    "RUNTIME_KEYS",
    "ControllerServerConfig",
    "StoreType",
    "updated_config",
]

log = logging.getLogger(__name__)

#: the quick-start controller port (``controllerDLegerPeers = n0-127.0.0.1:9878``)
DEFAULT_CONTROLLER_PORT = 9878


class StoreType(enum.Enum):
    JOURNAL = "journal"
    ETCD = "etcd"
    MEMORY = "memory"


def _int(key: str, raw: str, low: int, high: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise ConfigError(f"{key}={value} is outside [{low}, {high}]")
    return value


def _bool(key: str, raw: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise ConfigError(f"{key}={raw!r} is not true or false")
    return raw.lower() == "true"


def _store_type(key: str, raw: str) -> StoreType:
    if raw in ("DLedger", "jRaft"):
        log.warning("controller.conf: controllerType=%s is RocketMQ's consensus library; this "
                    "controller keeps its state in a journal instead (controllerType=journal)",
                    raw)
        return StoreType.JOURNAL
    try:
        return StoreType(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not one of journal, etcd, memory") from None


@attrs.frozen(kw_only=True)
class ControllerServerConfig:
    """Named ``ControllerServerConfig`` because ``ControllerConfig`` is the rules' own
    settings (``rules.ControllerConfig``), which ``rules_config`` derives from this."""

    listen_port: int = DEFAULT_CONTROLLER_PORT
    bind_address: str = "0.0.0.0"
    #: the address brokers are told to reach the leader at (GET_METADATA_INFO); default: the
    #: self peer's address, else ``bind_address:port`` (127.0.0.1 for a wildcard bind)
    advertised_address: str | None = None
    store_type: StoreType = StoreType.JOURNAL
    #: controllerStorePath; RocketMQ's default is ~/<type>Controller
    store_path: str = attrs.field(factory=lambda: os.path.expanduser("~/trioHAController"))
    #: scanNotActiveBrokerInterval, seconds: the longest the scan sleeps (it also wakes when
    #: the earliest heartbeat is due to expire: see service.py)
    scan_interval: float = 5.0
    enable_elect_unclean_master: bool = False
    notify_broker_role_changed: bool = True
    elect_master_max_retry_count: int = 3
    #: controllerDLegerGroup / controllerDLegerSelfId / controllerDLegerPeers, echoed by
    #: GET_METADATA_INFO as the real controller does
    group: str = "trio-ha"
    self_id: str = "n0"
    peers: str | None = None
    remoting: RemotingLimits = attrs.field(factory=RemotingLimits)
    #: metricsPort: GET /metrics on bind_address (0: the OS chooses); None: no metrics
    metrics_port: int | None = None
    #: controllerEtcdEndpoints (controllerType=etcd): etcd's client URLs
    etcd_endpoints: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    #: controllerEtcdKeyPrefix: this group of controllers' keys (records, election)
    etcd_keys: EtcdKeys = attrs.field(factory=EtcdKeys)
    #: controllerEtcdLeaseSeconds: the leader's lease TTL (how long a dead leader blocks)
    etcd_lease_seconds: int = 3
    #: aclEnable: the admin verbs and the brokers' verbs need a signature of an admin account
    #: of plain_acl.yml (docs/controller.md "ACL"); embedded, the name server's setting
    acl_enable: bool = False
    #: plainAclFile: where plain_acl.yml is (default: $ROCKETMQ_HOME/conf/plain_acl.yml)
    plain_acl_file: str | None = None

    def __attrs_post_init__(self) -> None:
        # checked here, not only when read from a file: a config built in code that names
        # etcd and no etcd would otherwise fail later, at the first connection
        if self.store_type is StoreType.ETCD and not self.etcd_endpoints:
            raise ConfigError("controllerType=etcd needs controllerEtcdEndpoints (etcd's "
                              "client URLs, host:port separated by ',' or ';')")
        if not 1 <= self.etcd_lease_seconds <= 3600:
            raise ConfigError(f"controllerEtcdLeaseSeconds={self.etcd_lease_seconds} is "
                              f"outside [1, 3600]")

    @property
    def rules_config(self) -> ControllerConfig:
        return ControllerConfig(enable_elect_unclean_master=self.enable_elect_unclean_master,
                                notify_broker_role_changed=self.notify_broker_role_changed)

    def self_peer_address(self) -> str | None:
        """The address of ``self_id`` in ``peers`` (``n0-host:port;n1-host:port``)."""
        for part in (self.peers or "").split(";"):
            name, sep, address = part.strip().partition("-")
            if sep and name == self.self_id and address:
                return address
        return None

    @classmethod
    def from_properties(cls, properties: Mapping[str, str], *, embedded: bool = False
                        ) -> ControllerServerConfig:
        """A ``controller.conf`` (RocketMQ's keys) as a config. ``embedded``: the properties
        are a name server's file; only the controller's keys are read, and ``listenPort``
        (the name server's) is not the controller's port."""
        if not embedded:
            ignored = check_keys(properties, CONTROLLER_FILE_KEYS, accepted=ROCKETMQ_KEYS)
            if ignored:
                log.warning("controller.conf: RocketMQ keys with no meaning here, ignored: %s",
                            ", ".join(ignored))
        values: dict[str, Any] = {}
        port: int | None = None
        for key, raw in properties.items():
            key, raw = key.strip(), str(raw).strip()
            if key == "listenPort" and not embedded or key == "controllerListenPort":
                port = _int(key, raw, 0, 65535)
            elif key == "bindAddress" and not embedded:
                values["bind_address"] = raw
            elif key == "controllerMetricsPort" or key == "metricsPort" and not embedded:
                values["metrics_port"] = _int(key, raw, 0, 65535)
            elif key == "controllerAdvertisedAddress":
                values["advertised_address"] = raw
            elif key == "controllerType":
                values["store_type"] = _store_type(key, raw)
            elif key == "controllerStorePath":
                values["store_path"] = os.path.expanduser(raw)
            elif key == "controllerDLegerGroup":
                values["group"] = raw
            elif key == "controllerDLegerSelfId":
                values["self_id"] = raw
            elif key == "controllerDLegerPeers":
                values["peers"] = raw
            elif key == "controllerEtcdEndpoints":
                values["etcd_endpoints"] = _endpoints(key, raw)
            elif key == "controllerEtcdKeyPrefix":
                values["etcd_keys"] = _etcd_keys(key, raw)
            elif key == "controllerEtcdLeaseSeconds":
                values["etcd_lease_seconds"] = _int(key, raw, 1, 3600)
            elif key == "aclEnable":
                values["acl_enable"] = _bool(key, raw)
            elif key == "plainAclFile":
                values["plain_acl_file"] = os.path.expanduser(raw)
            elif key in RUNTIME_KEYS:
                field, parse = RUNTIME_KEYS[key]
                values[field] = parse(key, raw)
        config = cls(**values)
        if port is None:
            peer = config.self_peer_address()
            if peer is not None:
                port = _int("controllerDLegerPeers", peer.rsplit(":", 1)[-1], 0, 65535)
        return attrs.evolve(config, listen_port=DEFAULT_CONTROLLER_PORT if port is None
                            else port)

    def to_properties(self) -> dict[str, str]:
        """GET_CONTROLLER_CONFIG: the settings under RocketMQ's keys (milliseconds where
        RocketMQ counts them so)."""
        values: dict[str, object] = {
            "listenPort": self.listen_port,
            "bindAddress": self.bind_address,
            "controllerType": self.store_type.value,
            "controllerStorePath": self.store_path,
            "scanNotActiveBrokerInterval": round(self.scan_interval * 1000),
            "enableElectUncleanMaster": self.enable_elect_unclean_master,
            "notifyBrokerRoleChanged": self.notify_broker_role_changed,
            "electMasterMaxRetryCount": self.elect_master_max_retry_count,
            "controllerDLegerGroup": self.group,
            "controllerDLegerSelfId": self.self_id,
            "controllerDLegerPeers": self.peers,
            "controllerAdvertisedAddress": self.advertised_address,
            "metricsPort": self.metrics_port,
            "controllerEtcdEndpoints": ",".join(self.etcd_endpoints) or None,
            "controllerEtcdKeyPrefix": self.etcd_keys.prefix,
            "controllerEtcdLeaseSeconds": self.etcd_lease_seconds,
            "aclEnable": self.acl_enable,
            "plainAclFile": self.plain_acl_file,
            "configBlackList": ";".join(CONFIG_BLACK_LIST),
        }
        rendered = {key: render_value(value) for key, value in values.items()}
        return {key: text for key, text in sorted(rendered.items()) if text is not None}


def _endpoints(key: str, raw: str) -> tuple[str, ...]:
    try:
        return parse_endpoints(raw)
    except ValueError as exc:
        raise ConfigError(f"{key}={raw!r}: {exc}") from None


def _etcd_keys(key: str, raw: str) -> EtcdKeys:
    try:
        return EtcdKeys(raw)
    except ValueError as exc:
        raise ConfigError(f"{key}={raw!r}: {exc}") from None


def _interval(key: str, raw: str) -> float:
    return _int(key, raw, 1, 3_600_000) / 1000


#: the keys UPDATE_CONTROLLER_CONFIG changes while the controller runs: key -> (field, parser)
RUNTIME_KEYS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "scanNotActiveBrokerInterval": ("scan_interval", _interval),
    "enableElectUncleanMaster": ("enable_elect_unclean_master", _bool),
    "notifyBrokerRoleChanged": ("notify_broker_role_changed", _bool),
    "electMasterMaxRetryCount": ("elect_master_max_retry_count",
                                 lambda k, r: _int(k, r, 1, 100)),
}

#: UPDATE_CONTROLLER_CONFIG refuses these with NO_PERMISSION (RocketMQ's configBlackList)
CONFIG_BLACK_LIST = ("configBlackList", "configStorePath", "controllerStorePath",
                     "controllerType", "controllerEtcdEndpoints", "controllerEtcdKeyPrefix",
                     "aclEnable", "plainAclFile")

#: the keys a controller.conf may set here (and, but listenPort/bindAddress, a name server's
#: file that embeds the controller)
CONTROLLER_FILE_KEYS = frozenset({
    "listenPort", "bindAddress", "controllerListenPort", "controllerAdvertisedAddress",
    "metricsPort", "controllerMetricsPort",
    "controllerType", "controllerStorePath", "controllerDLegerGroup", "controllerDLegerPeers",
    "controllerDLegerSelfId", "controllerEtcdEndpoints", "controllerEtcdKeyPrefix",
    "controllerEtcdLeaseSeconds", "aclEnable", "plainAclFile", *RUNTIME_KEYS,
})
_ROCKETMQ_KEY_LIST = """
    rocketmqHome configStorePath controllerThreadPoolNums controllerRequestThreadPoolQueueCapacity
    mappedFileSize isProcessReadEvent processReadEvent scanInactiveMasterInterval
    metricsExporterType metricsGrpcExporterTarget metricsGrpcExporterHeader
    metricGrpcExporterTimeOutInMills metricGrpcExporterIntervalInMills
    metricLoggingExporterIntervalInMills metricsPromExporterPort metricsPromExporterHost
    metricsLabel metricsInDelta configBlackList jRaftGroupId jRaftServerId jRaftInitConf
    jRaftControllerRPCAddr jRaftElectionTimeoutMs jRaftSnapshotIntervalSecs
    jRaftScanWaitTimeoutMs
"""
#: RocketMQ 5.3.3's other ControllerConfig keys: machinery we do not have
ROCKETMQ_KEYS = frozenset(_ROCKETMQ_KEY_LIST.split())


def updated_config(config: ControllerServerConfig, properties: Mapping[str, str]
                   ) -> ControllerServerConfig:
    """``config`` with ``properties`` applied; ConfigError naming the keys that cannot
    change while the controller runs, or are unknown."""
    bad = sorted(k for k in properties if k not in RUNTIME_KEYS)
    if bad:
        raise ConfigError(f"cannot change while the controller runs, or unknown: "
                          f"{', '.join(bad)}")
    changes = {RUNTIME_KEYS[k][0]: RUNTIME_KEYS[k][1](k, v) for k, v in properties.items()}
    return attrs.evolve(config, **changes)
