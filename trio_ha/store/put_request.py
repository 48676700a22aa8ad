"""PutRequest: one put, as a value.

Everything a put says about its record travels in one frozen object: the broker builds it
once per send from the request it read, and hands it to ``MessageStore.append_now`` (from
the reader's round) or ``MessageStore.put`` (from a task). There is one put path in the store
and one shape of put above it, so a new field is added here and in the encoder, not to six
signatures and a dictionary of keywords.

A request is either one message, whose PROPERTIES field is already encoded (what a producer
sent, or what the broker re-stores), or an encoded SEND_BATCH_MESSAGE body that the native
batch encoder converts item by item, with the batch's own properties added to each item.

The class is built on the broker's send path for every message, positionally (so the order
of its fields is part of its interface), with no validators and no converters. Why a
``NamedTuple`` and not the project's usual ``attrs.frozen``: both are immutable values, but a
frozen attrs class sets each of its twelve fields through ``object.__setattr__``, which costs
three times a tuple's construction, and on this path that difference outweighed what the
single put path saved (docs/performance.md, *Store appends*). Treat it as a record of named
fields: nothing indexes it or iterates it. The store checks what it must (topic, queue,
sizes) when it appends, where a bad value becomes a refused put with its reason rather than
an exception in the broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..wire import record as rec


class PutRequest(NamedTuple):
    topic: str
    queue_id: int
    #: the message's body, or a SEND_BATCH_MESSAGE body (``is_batch``)
    body: bytes
    #: the message's encoded PROPERTIES field; for a batch, the properties added to each item
    properties: bytes = b""
    is_batch: bool = False
    flag: int = 0
    #: the record's sysFlag (a batch is never transactional)
    sys_flag: int = 0
    #: ms since the epoch; None: the store's clock at the append
    born_timestamp: int | None = None
    #: "host:port" of the producer; None: the store's own address
    born_host: str | None = None
    reconsume_times: int = 0
    #: a committed transaction's half message (its commitlog offset); 0 otherwise
    prepared_transaction_offset: int = 0
    #: False: answer once the record is appended, whatever the store promises beyond that
    #: (RocketMQ's WAIT property)
    wait_store_msg_ok: bool = True

    @classmethod
    def of_message(cls, message: rec.Message, queue_id: int = 0) -> PutRequest:
        """``message`` (its properties encoded now) for queue ``queue_id`` of its topic."""
        return cls(
            message.topic, queue_id, message.body, message.encoded_properties(), False,
            message.flag, message.sys_flag, message.born_timestamp, message.born_host,
            message.reconsume_times, message.prepared_transaction_offset,
            message.properties.get(rec.PROPERTY_WAIT_STORE_MSG_OK) != "false",
        )

    @classmethod
    def batch(
        cls,
        topic: str,
        queue_id: int,
        body: bytes,
        *,
        batch_properties: bytes = b"",
        sys_flag: int = 0,
        born_host: str | None = None,
        born_timestamp: int | None = None,
        wait_store_msg_ok: bool = True,
    ) -> PutRequest:
        """An encoded SEND_BATCH_MESSAGE ``body`` for one queue: all of it or nothing, with
        consecutive queue and commitlog offsets."""
        return cls(topic, queue_id, body, batch_properties, True, 0, sys_flag, born_timestamp,
                   born_host, 0, 0, wait_store_msg_ok)

    @classmethod
    def of_messages(cls, messages: Sequence[rec.Message], queue_id: int = 0) -> PutRequest:
        """``messages``, all of one topic and none transactional (the caller checks), as one
        batch (raises ValueError when they cannot be encoded as one)."""
        first = messages[0]
        return cls.batch(
            first.topic, queue_id, rec.encode_batch(messages), born_host=first.born_host,
            born_timestamp=first.born_timestamp,
            wait_store_msg_ok=all(
                m.properties.get(rec.PROPERTY_WAIT_STORE_MSG_OK) != "false" for m in messages
            ),
        )
