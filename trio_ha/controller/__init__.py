"""Our own controller (issue 39): RocketMQ 5's controller side of controller mode, so a broker
group fails over without a JVM. See docs/controller.md."""

from .etcd import (
    EtcdClient,
    EtcdConfig,
    EtcdError,
    EtcdKeys,
    EtcdLeadership,
    EtcdRequestError,
    EtcdStateStore,
    EtcdUnavailable,
    LeadershipLost,
    open_etcd_client,
    open_etcd_leadership,
    parse_endpoints,
)
from .state_store import CommitConflict, StateStore, Versioned, Write

__all__ = [
    "CommitConflict",
    "EtcdClient",
    "EtcdConfig",
    "EtcdError",
    "EtcdKeys",
    "EtcdLeadership",
    "EtcdRequestError",
    "EtcdStateStore",
    "EtcdUnavailable",
    "LeadershipLost",
    "StateStore",
    "Versioned",
    "Write",
    "open_etcd_client",
    "open_etcd_leadership",
    "parse_endpoints",
]
