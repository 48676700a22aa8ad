"""The trio client library: producer, pull consumer and admin over RocketMQ remoting.

Works with this project's broker and name server and with RocketMQ 4.x ones::

    from trio_ha.client import open_producer, open_pull_consumer, Message

    async with open_producer("127.0.0.1:9876", "my-producers") as producer:
        result = await producer.send(Message("orders", b"...", tags="TagA", keys="k1"))

    async with open_pull_consumer("127.0.0.1:9876", "my-consumers") as consumer:
        async with consumer.messages("orders", subscription="TagA || TagB") as stream:
            async for message in stream:
                ...

Or let a push consumer call a listener for each message (``open_push_consumer``: concurrent
or orderly, failed messages retried through the broker).

With ACL on at the broker, give the instance an account and every request goes out signed,
as the Java client's ``AclClientRPCHook`` signs them::

    async with open_client_instance("127.0.0.1:9876",
                                    credentials=Credentials("myAccessKey", "mySecretKey")):
        ...

Producers, consumers and admins opened on one ``open_client_instance(...)`` share its client
id, connections, route cache and heartbeat, as Java clients share an ``MQClientInstance``.
"""

from ..wire.acl import Credentials
from ..wire.record import Message, StoredMessage
from .admin import Admin, open_admin
from .consumer import MessageStream, PullConsumer, PullResult, PullStatus, open_pull_consumer
from .instance import (
    ClientConfig,
    ClientInstance,
    MessageQueue,
    MQBrokerError,
    MQClientError,
    MQError,
    open_client_instance,
)
from .producer import (
    Producer,
    SendResult,
    SendStatus,
    TransactionSendResult,
    TransactionState,
    open_producer,
)
from .push import ConsumeLater, PushConsumer, PushConsumerStatistics, open_push_consumer

__all__ = [
    "Admin", "ClientConfig", "ClientInstance", "ConsumeLater", "Credentials", "MQBrokerError",
    "MQClientError",
    "MQError", "Message", "MessageQueue", "MessageStream", "Producer", "PullConsumer",
    "PullResult", "PullStatus", "PushConsumer", "PushConsumerStatistics", "SendResult",
    "SendStatus", "StoredMessage", "TransactionSendResult", "TransactionState", "open_admin",
    "open_client_instance", "open_producer", "open_pull_consumer", "open_push_consumer",
]
