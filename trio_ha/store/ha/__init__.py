"""Master/slave replication of the commitlog over RocketMQ's classic HA protocol."""

from .master import HAMasterStatistics, HAService, SlaveConnectionStatistics
from .slave import HAClient, HASlaveStatistics

__all__ = [
    "HAClient", "HAMasterStatistics", "HASlaveStatistics", "HAService",
    "SlaveConnectionStatistics",
]
