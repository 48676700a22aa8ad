"""Asking the controllers of a chaos run who leads them and who is master.

In controller mode a fault that targets "the master" lands on whoever the controller elected
when the fault begins, and the checker needs to know when the master changed. Both come from
the controllers themselves, over RocketMQ's own requests, as an operator's tool would ask:

- CONTROLLER_GET_REPLICA_INFO: the broker set's master (address, epoch) and in-sync set.
  Only the leading controller answers it with SUCCESS (the others say NOT_LEADER), so the
  first controller that answers it is the leader's word;
- CONTROLLER_GET_METADATA_INFO: whether the controller asked leads (``isLeader``).

Every question has a short timeout and goes to each controller in turn: a controller that is
down, paused or cut off (the faults of the run) is skipped, and when none answers the caller
is told so (None) and keeps what it knew.
"""

from __future__ import annotations

import contextlib

import attrs
import trio

from ..remoting import RemotingError, open_remoting_client
from ..wire.controller import SyncStateSet
from ..wire.errors import WireError
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode

__all__ = ["ASK_TIMEOUT", "SetView", "leader_index", "replica_view"]

#: how long one controller has to answer one question (a cut-off one never does)
ASK_TIMEOUT = 1.0


@attrs.frozen
class SetView:
    """The broker set as the leading controller sees it."""

    master_address: str | None
    epoch: int
    in_sync: int


async def _ask(address: str, command: RemotingCommand) -> RemotingCommand | None:
    with trio.move_on_after(ASK_TIMEOUT * 2):
        with contextlib.suppress(RemotingError, OSError, WireError):
            async with open_remoting_client(address, connect_timeout=ASK_TIMEOUT) as client:
                return await client.invoke(command, ASK_TIMEOUT)
    return None


async def replica_view(controllers: list[str], broker_name: str) -> SetView | None:
    """What the leading controller says of ``broker_name`` (None: no controller answered)."""
    for address in controllers:
        reply = await _ask(address, RemotingCommand.request(
            RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": broker_name}))
        if reply is None or reply.code != ResponseCode.SUCCESS:
            continue
        fields = reply.ext_fields
        members = 0
        if reply.body:
            with contextlib.suppress(WireError):
                members = len(SyncStateSet.decode(reply.body).members)
        master = fields.get("masterAddress") or None
        try:
            epoch = int(fields.get("masterEpoch", 0))
        except ValueError:
            epoch = 0
        return SetView(master, epoch, members)
    return None


async def leader_index(controllers: list[str]) -> int | None:
    """Which of ``controllers`` says it leads (None: none answered so)."""
    for index, address in enumerate(controllers):
        reply = await _ask(address, RemotingCommand.request(
            RequestCode.CONTROLLER_GET_METADATA_INFO))
        if (reply is not None and reply.code == ResponseCode.SUCCESS
                and reply.ext_fields.get("isLeader") == "true"):
            return index
    return None
