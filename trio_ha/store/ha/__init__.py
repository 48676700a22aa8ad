"""Master/slave replication of the commitlog over RocketMQ's classic HA protocol: the
master's HA service (``master``), the slave's HA client (``slave``), the transports both are
written against (``transfer``), and the group transfer SYNC_MASTER puts wait on
(``group_transfer``)."""

from .group_transfer import GroupTransferService
from .master import HAConnectionState, HAMasterStatistics, HAService, SlaveConnectionStatistics
from .slave import HAClient, HAClientState, HASlaveStatistics
from .transfer import HATransport, SocketTransport, StreamTransport

__all__ = [
    "GroupTransferService", "HAClient", "HAClientState", "HAConnectionState",
    "HAMasterStatistics", "HASlaveStatistics", "HAService", "HATransport",
    "SlaveConnectionStatistics", "SocketTransport", "StreamTransport",
]
