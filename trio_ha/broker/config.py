"""Broker configuration: RocketMQ's BrokerConfig names, and the store's, from one broker.conf.

``BrokerConfig.from_properties(text)`` reads a RocketMQ ``broker.conf``: broker keys land here,
store keys in ``.store`` (a StoreConfig). Derived values follow RocketMQ — the HA port is
listenPort + 1, a master's brokerId is 0, STOREHOST is brokerIP1:listenPort — except that an
explicitly configured value always wins (RocketMQ 4.9.8 overwrites a configured haListenPort,
issue #6537). An unknown key is an error (``config_keys``: a typo is not a default).
"""

from __future__ import annotations

import json
import logging
import typing
from collections.abc import Mapping
from typing import Any

import attrs

from .._sockets import local_address
from ..config import (
    BrokerRole,
    ConfigError,
    MiB,
    StoreConfig,
    camel_case,
    in_range,
    parse_properties_text,
    parse_value,
    render_value,
)
from ..remoting.tls import TLS_KEYS, TlsClientConfig, TlsServerConfig, tls_settings
from ..wire.acl import Credentials
from ..wire.metadata import DEFAULT_TOPIC_QUEUE_NUMS
from ..wire.permission import Permission
from .clients import DEFAULT_MAX_PRODUCER_GROUPS
from .config_keys import check_keys
from .metadata import (
    DEFAULT_MAX_AUTO_CREATED_PER_CLIENT,
    DEFAULT_MAX_CONSUMER_OFFSETS,
    DEFAULT_MAX_SUBSCRIPTION_GROUPS,
)
from .metadata.validation import MAX_PERMISSION, MAX_QUEUE_NUMS
from .queue_locks import DEFAULT_MAX_LOCKS_PER_CLIENT, DEFAULT_MAX_LOCKS_PER_GROUP, MAX_LOCKS

log = logging.getLogger(__name__)


def _namesrv_addr(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """Each ``;``-separated address is ``host:port`` with a port in 1..65535, so a typo is a
    start-up error rather than a broker that serves and registers nowhere."""
    if value is None:
        return
    for address in (a.strip() for a in str(value).split(";")):
        if not address:
            continue
        host, sep, port = address.rpartition(":")
        if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"namesrvAddr: {address!r} is not host:port (a port in 1..65535)")

def _inner_credentials(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """RocketMQ 5's ``innerClientAuthenticationCredentials``: a JSON object with the
    ``accessKey`` and ``secretKey`` of the account this broker signs its own requests with."""
    if value is not None:
        parse_inner_credentials(value)


def parse_inner_credentials(text: str) -> Credentials:
    """The account of an ``innerClientAuthenticationCredentials`` value; ConfigError (never
    quoting the value: it holds a secret) when it is not a JSON object with both keys."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ConfigError('innerClientAuthenticationCredentials is not JSON: write '
                          '{"accessKey":"...","secretKey":"..."}') from None
    access_key = data.get("accessKey") if isinstance(data, dict) else None
    secret_key = data.get("secretKey") if isinstance(data, dict) else None
    if not (isinstance(access_key, str) and access_key.strip()
            and isinstance(secret_key, str) and secret_key.strip()):
        raise ConfigError('innerClientAuthenticationCredentials needs "accessKey" and '
                          '"secretKey", both non-empty text')
    return Credentials(access_key.strip(), secret_key.strip())


#: BrokerConfig fields that are not one broker.conf key each
_NOT_KEYS = frozenset({"store", "tls_server", "tls_client"})

#: settings GET_BROKER_CONFIG must not reveal
_SECRET_FIELDS = frozenset({"inner_client_authentication_credentials"})

#: a broker's HA port, when not configured, is listenPort + 1 (RocketMQ's default)
HA_PORT_OFFSET = 1
#: RocketMQ's "VIP" channel listens on listenPort - 2
VIP_PORT_OFFSET = 2


@attrs.frozen(kw_only=True)
class BrokerConfig:
    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    #: 0 for a master; a slave needs > 0; -1 in controller mode (the controller gives the id)
    broker_id: int = attrs.field(default=0, validator=in_range(-1))
    #: the address clients are given (and STOREHOST in records); from a broker.conf without
    #: it: bindAddress when that is one address, else this host's first non-loopback one
    #: (``local_address``, as RocketMQ picks it)
    broker_ip1: str = "127.0.0.1"
    #: the address slaves are given for HA (brokerIP1 when unset)
    broker_ip2: str | None = None
    listen_port: int = attrs.field(default=10911, validator=in_range(0, 65535))
    bind_address: str = "0.0.0.0"
    #: name servers, "host:port;host:port"
    #: name servers, ``host:port;host:port`` (each checked when the config is made)
    namesrv_addr: str | None = attrs.field(default=None, validator=_namesrv_addr)
    register_name_server_period: int = attrs.field(default=30_000, validator=in_range(1))
    #: each registration call's bound (ms): at most a minute, two registration periods
    register_broker_timeout_mills: int = attrs.field(default=6000, validator=in_range(1, 60_000))
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    # Caps on what clients make the broker keep (trio_ha's keys; RocketMQ has no such limits).
    #: subscription groups: none is created beyond it, on demand or by request
    max_subscription_group_nums: int = attrs.field(
        default=DEFAULT_MAX_SUBSCRIPTION_GROUPS, validator=in_range(1)
    )
    #: subscription groups one client (one connection) may create on demand (heartbeats);
    #: on-demand creation also stops at nine tenths of maxSubscriptionGroupNums
    max_auto_create_subscription_group_nums_per_client: int = attrs.field(
        default=DEFAULT_MAX_AUTO_CREATED_PER_CLIENT, validator=in_range(0, 1_000_000)
    )
    #: consumer offsets (topic, group, queue) in all: commits of new ones beyond it are refused
    max_consumer_offset_nums: int = attrs.field(
        default=DEFAULT_MAX_CONSUMER_OFFSETS, validator=in_range(1)
    )
    #: producer groups heartbeats may register (in memory): more are ignored
    max_producer_group_nums: int = attrs.field(
        default=DEFAULT_MAX_PRODUCER_GROUPS, validator=in_range(1)
    )
    #: queue locks (LOCK_BATCH_MQ) held in all, per consumer group, and per client (the
    #: locks taken through one connection): beyond one, a request gets only what fits
    max_queue_lock_nums: int = attrs.field(default=MAX_LOCKS, validator=in_range(1))
    max_queue_lock_nums_per_group: int = attrs.field(
        default=DEFAULT_MAX_LOCKS_PER_GROUP, validator=in_range(1)
    )
    max_queue_lock_nums_per_client: int = attrs.field(
        default=DEFAULT_MAX_LOCKS_PER_CLIENT, validator=in_range(1)
    )
    default_topic_queue_nums: int = attrs.field(
        default=DEFAULT_TOPIC_QUEUE_NUMS, validator=in_range(1, MAX_QUEUE_NUMS)
    )
    broker_permission: int = attrs.field(
        default=Permission.READ | Permission.WRITE, validator=in_range(0, MAX_PERMISSION)
    )
    long_polling_enable: bool = True
    #: how long a pull waits without long polling (ms): at most the 30 s a client waits for
    #: a suspended pull's answer
    short_polling_time_mills: int = attrs.field(default=1000, validator=in_range(1, 30_000))
    slave_read_enable: bool = False
    access_message_in_memory_max_ratio: int = attrs.field(default=40, validator=in_range(0, 100))
    #: what one pull returns at most: messages (at most a client's largest pull batch, 1024),
    #: and bytes (at least 1 KiB, so a pull moves more than a header; at most 8 MiB, well
    #: inside the 16 MiB frame a RocketMQ client reads)
    max_transfer_count_on_message_in_memory: int = attrs.field(
        default=32, validator=in_range(1, 1024)
    )
    max_transfer_bytes_on_message_in_memory: int = attrs.field(
        default=256 * 1024, validator=in_range(1024, 8 * MiB)
    )
    flush_consumer_offset_interval: int = attrs.field(default=5000, validator=in_range(1))
    #: also listen on listenPort - 2 (RocketMQ's "VIP" channel)
    vip_channel_enable: bool = True
    #: RocketMQ's plain ACL (trio_ha.acl): every request is checked against plain_acl.yml
    acl_enable: bool = False
    #: where plain_acl.yml is (our key; RocketMQ reads $ROCKETMQ_HOME/conf/plain_acl.yml,
    #: which is the default here too)
    plain_acl_file: str | None = None
    #: the ACL account this broker signs its own requests with (registration with the name
    #: servers, a slave's metadata sync): RocketMQ 5's key, a JSON object
    #: ``{"accessKey":"...","secretKey":"..."}``; GET_BROKER_CONFIG shows it hidden
    inner_client_authentication_credentials: str | None = attrs.field(
        default=None, repr=False, validator=_inner_credentials)
    #: ACL strict mode (ours, trio_ha.acl.replay): a signed request must carry our client's
    #: seal (its request code, a time within aclFreshnessWindowSeconds, a nonce not seen in
    #: that window); RocketMQ's clients, which cannot seal, are refused
    acl_require_freshness: bool = False
    acl_freshness_window_seconds: int = attrs.field(default=300, validator=in_range(1, 3600))
    #: strict mode: the nonces remembered at once (about 200 bytes each); more sealed requests
    #: than this in one window are refused, never a nonce forgotten early
    acl_nonce_cache_size: int = attrs.field(default=1_000_000,
                                            validator=in_range(1_000, 50_000_000))
    #: remoting connections idle this long are closed
    server_channel_max_idle_time_seconds: int = attrs.field(default=120, validator=in_range(1))
    #: remoting limits (docs/remoting.md, "Limits and bad input"): reply bytes waiting on one
    #: connection at which its requests are no longer read, and below which they are again
    #: (RocketMQ's Netty water marks; Netty's own defaults, 64/32 KiB, apply when they are 0)
    write_buffer_high_water_mark: int = attrs.field(default=4 * MiB, validator=in_range(1))
    write_buffer_low_water_mark: int = attrs.field(default=1 * MiB, validator=in_range(0))
    #: reply bytes waiting on all connections at which no requests are read
    server_write_buffer_total_bytes: int = attrs.field(default=256 * MiB, validator=in_range(1))
    #: a connection whose replies make no progress for this long is closed
    server_write_timeout_seconds: int = attrs.field(default=30, validator=in_range(1))
    #: bytes of unfinished request frames beyond each connection's first 64 KiB, all together
    server_read_buffer_total_bytes: int = attrs.field(default=128 * MiB, validator=in_range(1))
    #: a request frame begun must arrive whole within this long
    server_request_timeout_seconds: int = attrs.field(default=30, validator=in_range(1))
    #: connections per remoting listener, within what the fd limit allows; more are refused
    server_max_connections: int = attrs.field(default=10_000, validator=in_range(1))
    #: requests running at once on one connection; beyond it its requests are not read
    server_max_in_flight_requests: int = attrs.field(default=4096, validator=in_range(1))
    #: at shutdown, how long connections may take to finish before they are closed
    #: (RocketMQ 5's name; it waits 30 s, and only with enableShutdownGracefully)
    shutdown_wait_time_seconds: int = attrs.field(default=5, validator=in_range(0))
    #: how often a slave copies topics, offsets and groups from its master (ms)
    slave_sync_interval: int = attrs.field(default=10_000, validator=in_range(1))
    #: refuse transactional (half) messages
    reject_transaction_message: bool = False
    #: transactions: how often the master checks undecided half messages, how old one must
    #: be to be checked, and how many checks before it is given up (ms, ms, count)
    transaction_check_interval: int = attrs.field(default=60_000, validator=in_range(1))
    transaction_time_out: int = attrs.field(default=6000, validator=in_range(0))
    transaction_check_max: int = attrs.field(default=15, validator=in_range(1, 10_000))
    #: the Prometheus endpoint's port (trio_ha's key): GET /metrics on bindAddress; 0 lets the
    #: OS choose (tests); unset (None, the default) serves no metrics
    metrics_port: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(in_range(0, 65535))
    )
    # ---- controller mode (docs/controller-mode.md) -----------------------------------------
    #: the broker takes its role and id from a controller (RocketMQ 5): brokerId and
    #: brokerRole in the file are ignored
    enable_controller_mode: bool = False
    #: the controllers, ``host:port`` separated by ``;``
    controller_addr: str | None = attrs.field(default=None, validator=_namesrv_addr)
    #: among equally fresh replicas, the controller elects the lowest priority first
    broker_election_priority: int = attrs.field(default=2**31 - 1, validator=in_range(0))
    #: how often (ms) the broker asks the controller leader who its master is
    sync_broker_metadata_period: int = attrs.field(default=5000, validator=in_range(100))
    #: how often (ms) a master checks whether its in-sync set should shrink or grow
    check_sync_state_set_period: int = attrs.field(default=5000, validator=in_range(100))
    #: how often (ms) the broker asks its controllers which of them leads, once found
    sync_controller_metadata_period: int = attrs.field(default=10_000, validator=in_range(100))
    #: the controllers declare this broker dead after this long (ms) without a heartbeat
    controller_heart_beat_timeout_mills: int = attrs.field(default=10_000,
                                                           validator=in_range(1000))
    #: how often (ms) the broker heartbeats to every controller
    broker_heartbeat_interval: int = attrs.field(default=1000, validator=in_range(100))
    store: StoreConfig = attrs.field(factory=StoreConfig)
    #: TLS on the broker's ports, and on its own connections (registration, slave sync):
    #: RocketMQ's ``tls.*`` keys, in broker.conf or the ``tls.config.file`` it names
    tls_server: TlsServerConfig = attrs.field(factory=TlsServerConfig)
    tls_client: TlsClientConfig = attrs.field(factory=TlsClientConfig)

    def __attrs_post_init__(self) -> None:
        if self.enable_controller_mode:
            if not self.controller_addresses:
                raise ConfigError("enableControllerMode needs controllerAddr (host:port;...)")
            if self.write_buffer_low_water_mark > self.write_buffer_high_water_mark:
                raise ConfigError(
                    "writeBufferLowWaterMark must not exceed writeBufferHighWaterMark")
            return  # the controller gives the id and the role
        if self.store.broker_role is BrokerRole.SLAVE and self.broker_id == 0:
            raise ConfigError("a SLAVE needs brokerId > 0 (0 is the master's id)")
        if self.store.broker_role is not BrokerRole.SLAVE and self.broker_id != 0:
            raise ConfigError(f"a master has brokerId 0, not {self.broker_id}")
        if self.write_buffer_low_water_mark > self.write_buffer_high_water_mark:
            raise ConfigError("writeBufferLowWaterMark must not exceed writeBufferHighWaterMark")

    def to_properties(self) -> dict[str, str]:
        """Every setting, the store's too, under RocketMQ's keys (GET_BROKER_CONFIG)."""
        special = {"broker_ip1": "brokerIP1", "broker_ip2": "brokerIP2"}
        out = self.store.to_properties()
        for name in attrs.fields_dict(type(self)):
            if name in _NOT_KEYS:
                continue
            value = getattr(self, name)
            if name in _SECRET_FIELDS and value is not None:
                value = "<hidden>"
            text = render_value(value)
            if text is not None:
                out[special.get(name, camel_case(name))] = text
        return dict(sorted(out.items()))

    @property
    def inner_client_credentials(self) -> Credentials | None:
        """The account of ``innerClientAuthenticationCredentials``, or None."""
        text = self.inner_client_authentication_credentials
        return None if text is None else parse_inner_credentials(text)

    @property
    def role(self) -> BrokerRole:
        return self.store.broker_role

    @property
    def broker_addr(self) -> str:
        return f"{self.broker_ip1}:{self.listen_port}"

    @property
    def ha_server_addr(self) -> str:
        return f"{self.broker_ip2 or self.broker_ip1}:{self.store.ha_listen_port}"

    @property
    def controller_addresses(self) -> list[str]:
        return [a.strip() for a in (self.controller_addr or "").split(";") if a.strip()]

    @property
    def namesrv_addresses(self) -> list[str]:
        return [a.strip() for a in (self.namesrv_addr or "").split(";") if a.strip()]

    @classmethod
    def property_fields(cls) -> dict[str, str]:
        """RocketMQ key -> field name, for this class's own fields (not the store's)."""
        fields = {camel_case(name): name for name in attrs.fields_dict(cls)
                  if name not in _NOT_KEYS}
        fields["brokerIP1"] = "broker_ip1"
        fields["brokerIP2"] = "broker_ip2"
        return fields

    @classmethod
    def from_properties(
        cls, properties: Mapping[str, str] | str, *, store_overrides: Mapping | None = None,
        **overrides,
    ) -> BrokerConfig:
        """Read a RocketMQ broker.conf (text or mapping). ``overrides`` (snake_case) and
        ``store_overrides`` win over the file."""
        if isinstance(properties, str):
            properties = parse_properties_text(properties)
        hints = typing.get_type_hints(cls)
        by_camel = cls.property_fields()
        ignored = check_keys(properties,
                             set(by_camel) | StoreConfig.property_keys() | TLS_KEYS)
        if ignored:
            log.warning("broker.conf: RocketMQ keys with no meaning here, ignored: %s",
                        ", ".join(ignored))
        values: dict[str, Any] = {}
        for key, raw in properties.items():
            name = by_camel.get(key.strip())
            if name is not None:
                values[name] = parse_value(name, hints[name], str(raw).strip())
        values.update(overrides)
        # brokerRole says whether this is a master; RocketMQ forces a master's id to 0.
        store = StoreConfig.from_properties(properties)
        listen_port = values.get("listen_port", 10911)
        if "broker_ip1" not in values:
            bind = values.get("bind_address", "0.0.0.0")
            values["broker_ip1"] = bind if bind not in ("0.0.0.0", "::", "") else local_address()
        broker_ip1 = values["broker_ip1"]
        derived: dict[str, Any] = {}
        if "haListenPort" not in properties:
            derived["ha_listen_port"] = 0 if listen_port == 0 else listen_port + HA_PORT_OFFSET
        if "storeHost" not in properties:
            derived["store_host"] = f"{broker_ip1}:{listen_port}"
        controller_mode = bool(values.get("enable_controller_mode"))
        if controller_mode:
            # RocketMQ ignores both in controller mode: the broker starts fenced, as a store
            # that takes no puts, with no id, until the controller names its role.
            values["broker_id"] = -1
            derived["broker_role"] = BrokerRole.SLAVE
        derived.update(store_overrides or {})
        store = attrs.evolve(store, **derived)
        if not controller_mode and store.broker_role is not BrokerRole.SLAVE:
            values["broker_id"] = 0
        tls = tls_settings(properties)
        if str(properties.get("useTLS", "")).strip().lower() == "true":  # NettyClientConfig's
            tls.setdefault("tls.enable", "true")
        return cls(store=store, tls_server=TlsServerConfig.from_settings(tls),
                   tls_client=TlsClientConfig.from_settings(tls), **values)
