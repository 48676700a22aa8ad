"""Permission bits: RocketMQ's ``PermName``, as one ``enum.IntFlag``.

A topic's ``perm`` (in TopicConfig, QueueData and the route a name server answers) and a
broker's ``brokerPermission`` are these bits, ORed. READ lets consumers pull, WRITE lets
producers send, INHERIT marks a template topic (TBW102) whose settings an auto-created topic
copies, PRIORITY is carried but not acted on (RocketMQ does not act on it either).

The values travel as plain Java ints. ``Permission`` is an ``IntFlag``, so a member *is* that
int: it compares equal to it, ``json`` and our fastjson writer print it as the bare number
(``6``, never ``"Permission.WRITE|READ"``), and ``%d`` formats it as the number. Values read
from the wire stay plain ints: a peer may set bits we do not know, or send a negative number,
and a round trip must not change them (``Permission(-1)`` would become 15).
"""

from __future__ import annotations

import enum

__all__ = ["Permission", "readable", "writable"]


class Permission(enum.IntFlag):
    """``PermName``: the permission bits of a topic or a broker."""

    INHERIT = 0x1
    WRITE = 0x2
    READ = 0x4
    PRIORITY = 0x8


# The bits as plain ints, for the checks made on every send and pull: ``perm & Permission.WRITE``
# makes a new flag member through the enum machinery, fifty times a plain ``&``.
_WRITE = int(Permission.WRITE)
_READ = int(Permission.READ)


def writable(perm: int) -> bool:
    """Whether ``perm`` lets producers send (its WRITE bit)."""
    return bool(perm & _WRITE)


def readable(perm: int) -> bool:
    """Whether ``perm`` lets consumers pull (its READ bit)."""
    return bool(perm & _READ)
