"""RocketMQ remoting over trio: frames (see ``trio_ha.wire.remoting``) on real connections."""

from .answers import RequestError, not_supported
from .client import (
    PreparedRequest,
    RemotingClient,
    RemotingClientPool,
    RemotingConnectError,
    RemotingError,
    RemotingTimeout,
    open_client_pool,
    open_remoting_client,
)
from .connection import (
    RUN_IN_TASK,
    CloseReason,
    FastHandler,
    Handler,
    PendingReply,
    RemotingConnection,
    serve_connection,
)
from .limits import RemotingBudgets, RemotingLimits
from .server import RemotingServer, RemotingServerStatistics, serve_remoting

__all__ = [
    "RUN_IN_TASK", "CloseReason", "FastHandler", "Handler", "PendingReply", "PreparedRequest",
    "RemotingBudgets",
    "RemotingClient", "RemotingClientPool",
    "RemotingConnectError", "RemotingConnection", "RemotingError", "RemotingLimits",
    "RemotingServer", "RemotingServerStatistics", "RemotingTimeout", "RequestError",
    "not_supported", "open_client_pool", "open_remoting_client", "serve_connection",
    "serve_remoting",
]
