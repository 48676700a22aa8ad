"""Our own controller (issue 39): RocketMQ 5's controller side of controller mode, so a broker
group fails over without a JVM. See docs/controller.md."""

from .state_store import CommitConflict, StateStore, Versioned, Write

__all__ = ["CommitConflict", "StateStore", "Versioned", "Write"]
