"""The name server: brokers register, clients look up routes."""

from .routes import RouteInfoManager
from .server import NameServer, NamesrvConfig, serve_namesrv

__all__ = ["NameServer", "NamesrvConfig", "RouteInfoManager", "serve_namesrv"]
