"""RocketMQ remoting over trio: frames (see ``trio_ha.wire.remoting``) on real connections."""

from .client import (
    RemotingClient,
    RemotingClientPool,
    RemotingConnectError,
    RemotingError,
    RemotingTimeout,
    open_client_pool,
    open_remoting_client,
)
from .server import RemotingConnection, not_supported, serve_connection, serve_remoting

__all__ = [
    "RemotingClient", "RemotingClientPool", "RemotingConnectError", "RemotingConnection",
    "RemotingError", "RemotingTimeout", "not_supported", "open_client_pool",
    "open_remoting_client", "serve_connection", "serve_remoting",
]
