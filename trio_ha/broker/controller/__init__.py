"""Controller mode (RocketMQ 5): the broker takes its id and role from a controller.

``identity`` keeps the id the controller granted (``brokerIdentity``), ``replicas`` holds the
pure rules of what a broker does with what it hears about its set, and ``link`` is the trio
adapter that talks to the controllers and performs those rules on the broker.
"""

from .identity import BrokerIdentity, IdentityError, IdentityFiles, PendingIdentity
from .link import ControllerError, ControllerLink, RoleTarget
from .replicas import (
    AskElection,
    BecomeMaster,
    BecomeSlave,
    MasterView,
    NewSyncStateSet,
    ReplicaState,
    RoleDecision,
)

__all__ = [
    "AskElection", "BecomeMaster", "BecomeSlave", "BrokerIdentity", "ControllerError",
    "ControllerLink", "IdentityError", "IdentityFiles", "MasterView", "NewSyncStateSet",
    "PendingIdentity", "ReplicaState", "RoleDecision", "RoleTarget",
]
