"""The name server: brokers register, clients look up routes, operators keep KV config."""

from .kvconfig import KVConfigFileError, KVConfigManager
from .routes import MasterConflict, RegistrationHeld, RouteInfoManager
from .server import NameServer, NamesrvConfig, serve_namesrv

__all__ = [
    "KVConfigFileError",
    "KVConfigManager",
    "MasterConflict",
    "NameServer",
    "NamesrvConfig",
    "RegistrationHeld",
    "RouteInfoManager",
    "serve_namesrv",
]
