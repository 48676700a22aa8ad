"""The two controller-mode requests a broker answers (``admin.HANDLERS`` routes them here).

- NOTIFY_BROKER_ROLE_CHANGED (1008), from a controller after an election: handed to the
  controller link's deciding task (``link.ControllerLink.role_notice``), which acts on it only
  if its master epoch is newer than the one the broker acted on last. Answered at once: the
  controller sends it one-way-ish (it ignores the answer) and a role change may take seconds.
- GET_BROKER_EPOCH_CACHE (1007), from mqadmin's ``getBrokerEpoch``: the store's epoch history
  with each entry's end (the next one's start; the open last one ends at Java's
  Long.MAX_VALUE, as RocketMQ's master reports it) and the log end.

A broker not in controller mode answers both as RocketMQ's does: SYSTEM_ERROR.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...remoting import RemotingConnection
from ...wire.controller import EpochEntryCacheBody, EpochEntryView
from ...wire.errors import WireError
from ...wire.layout import INT64_MAX
from ...wire.remoting import RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["broker_epoch_cache", "notify_role_changed"]

#: RocketMQ's remark (with its trailing space) for a classic broker
ONLY_CONTROLLER_MODE = "this request only for controllerMode "


def notify_role_changed(broker: Broker, request: RemotingCommand,
                        connection: RemotingConnection) -> RemotingCommand:
    link = broker.controller_link
    if link is None:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                           remark=ONLY_CONTROLLER_MODE)
    try:
        link.role_notice(request)
    except WireError as exc:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                           remark=str(exc)[:256])
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS)


def broker_epoch_cache(broker: Broker, request: RemotingCommand,
                       connection: RemotingConnection) -> RemotingCommand:
    if broker.controller_link is None:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                           remark=ONLY_CONTROLLER_MODE)
    epochs = broker.store.epochs
    entries = list(epochs.entries) if epochs is not None else []
    views = tuple(
        EpochEntryView(entry.epoch, entry.start_offset,
                       entries[i + 1].start_offset if i + 1 < len(entries) else INT64_MAX)
        for i, entry in enumerate(entries))
    body = EpochEntryCacheBody(broker.config.broker_cluster_name, broker.config.broker_name,
                               broker.registration.broker_id, views,
                               broker.store.commitlog.max_offset)
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body.encode())
