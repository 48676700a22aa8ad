"""The broker: store, replication, remoting processors, metadata and registration."""

from .broker import Broker, BrokerAddresses, serve_broker
from .config import BrokerConfig

__all__ = ["Broker", "BrokerAddresses", "BrokerConfig", "serve_broker"]
