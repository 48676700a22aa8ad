"""The broker: store, replication, remoting processors, metadata and registration."""

from .broker import Broker, BrokerAddresses
from .config import BrokerConfig
from .serve import serve_broker

__all__ = ["Broker", "BrokerAddresses", "BrokerConfig", "serve_broker"]
