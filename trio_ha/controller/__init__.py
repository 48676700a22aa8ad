"""Our own controller (issue 39): RocketMQ 5's controller side of controller mode, so a broker
group fails over without a JVM. See docs/controller.md.

The rules (pure) and the StateStore protocol, and the server that performs them:
``serve_controller(ControllerServerConfig(...))`` in a nursery, or ``trio-ha controller``."""

from .config import ControllerServerConfig, StoreType
from .election import ElectionOutcome, elect
from .etcd import (
    ControllerLeadership,
    EtcdKeys,
    EtcdLeadership,
    EtcdStateStore,
    LeadershipLost,
    open_etcd_leadership,
)
from .etcd_client import (
    EtcdClient,
    EtcdConfig,
    EtcdError,
    EtcdRequestError,
    EtcdUnavailable,
    open_etcd_client,
    parse_endpoints,
)
from .journal import (
    CompactionFailed,
    CompactionInfo,
    Journal,
    JournalFailed,
    JournalLocked,
    JournalStatistics,
)
from .journal_format import JournalCorrupt
from .leadership import Leadership, SoleLeadership
from .liveness import BrokerIdentity, HeartbeatTable, LiveInfo
from .memory import MemoryStateStore
from .records import BrokerSetRecord, MemberRecord, RecordError, key_for
from .rules import (
    ControllerConfig,
    ControllerState,
    Decision,
    RecordChange,
    RoleChangeNotice,
    StoredSet,
    accept_heartbeat,
    alter_sync_state_set,
    apply_broker_id,
    clean_broker_data,
    controller_elect,
    elect_master,
    get_next_broker_id,
    get_replica_info,
    get_sync_state_data,
    on_broker_dead,
    register_broker,
    sets_to_reelect,
)
from .server import ControllerServer, serve_controller
from .service import ControllerService, ControllerStatistics, ControllerUnavailable
from .state_store import CommitConflict, StateStore, Versioned, Write

__all__ = [
    "ControllerLeadership",
    "EtcdClient",
    "EtcdConfig",
    "EtcdError",
    "EtcdKeys",
    "EtcdLeadership",
    "EtcdRequestError",
    "EtcdStateStore",
    "EtcdUnavailable",
    "LeadershipLost",
    "open_etcd_client",
    "open_etcd_leadership",
    "parse_endpoints",
    "CompactionFailed",
    "CompactionInfo",
    "Journal",
    "JournalCorrupt",
    "JournalFailed",
    "JournalLocked",
    "JournalStatistics",
    "BrokerIdentity",
    "BrokerSetRecord",
    "CommitConflict",
    "ControllerConfig",
    "ControllerServer",
    "ControllerServerConfig",
    "ControllerService",
    "ControllerState",
    "ControllerStatistics",
    "ControllerUnavailable",
    "Decision",
    "ElectionOutcome",
    "HeartbeatTable",
    "Leadership",
    "LiveInfo",
    "MemoryStateStore",
    "MemberRecord",
    "RecordChange",
    "RecordError",
    "RoleChangeNotice",
    "SoleLeadership",
    "StateStore",
    "StoreType",
    "StoredSet",
    "Versioned",
    "Write",
    "accept_heartbeat",
    "alter_sync_state_set",
    "apply_broker_id",
    "clean_broker_data",
    "controller_elect",
    "elect",
    "elect_master",
    "get_next_broker_id",
    "get_replica_info",
    "get_sync_state_data",
    "key_for",
    "on_broker_dead",
    "register_broker",
    "serve_controller",
    "sets_to_reelect",
]
