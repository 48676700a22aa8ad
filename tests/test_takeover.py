"""Issue 35, defect 1: nobody who merely reaches the name server, or the path between a slave
and its master, can take a broker name over.

RocketMQ 4.9's name server honours REGISTER_BROKER and UNREGISTER_BROKER from anyone: whoever
reaches the port can unregister a live master and register their own address in its place,
and every client route, and every slave that follows the name server, then points at them.
Here, with the name server's ``aclEnable``, both need an admin account's signature (our
broker signs with ``innerClientAuthenticationCredentials``), and even without ACL a live
registration can be changed only over the connection that made it. The HA handshake
(``haAuthSecret``) binds the slave's proof to the address it dialled, so a relay between a
real slave and a real master cannot pass it, and a slave never follows a master whose
authentication fails.
"""

from __future__ import annotations

import textwrap

import attrs
import trio
import trio.testing

from conftest import ha_of, ha_slave_of, wait_until
from test_ha import SEGMENT, master_config, slave_count
from trio_ha import Message as StoreMessage
from trio_ha import PutMessageStatus, open_store
from trio_ha.chaos import hostile
from trio_ha.chaos.hostile import receive_exactly
from trio_ha.client import Message, open_client_instance, open_producer
from trio_ha.config import BrokerRole, StoreConfig
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, open_cluster
from trio_ha.wire import ha_auth
from trio_ha.wire.acl import Credentials
from trio_ha.wire.ha import FRAME_HEADER, REPORT
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import ClusterInfo, KVTable

BROKER_ACCOUNT = Credentials("brokerAdmin", "broker-secret-key")
APP = Credentials("appAccount", "app-secret-key")
ACL_YAML = textwrap.dedent(f"""\
    accounts:
      - accessKey: {BROKER_ACCOUNT.access_key}
        secretKey: {BROKER_ACCOUNT.secret_key}
        admin: true
      - accessKey: {APP.access_key}
        secretKey: {APP.secret_key}
        admin: false
        defaultTopicPerm: PUB|SUB
        defaultGroupPerm: SUB
    """)
FAKE = "127.0.0.1:9"  # the attacker's "broker" (nothing listens there)


async def _master_of(namesrv: str, broker_name: str = "broker-a") -> str | None:
    async with open_remoting_client(namesrv) as client:
        reply = await client.invoke(
            RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO, {}), 5)
    data = ClusterInfo.decode(reply.body).broker_addr_table.get(broker_name)
    return data.broker_addrs.get(0) if data is not None else None


async def _ha_master_of(slave_addr: str) -> str:
    """The HA address the slave's client copies from (its runtime info)."""
    async with open_remoting_client(slave_addr) as client:
        reply = await client.invoke(
            RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5)
    return KVTable.decode(reply.body).table.get("haMasterAddress", "")


async def _sync_sends_are_acknowledged(namesrv: str, topic: str, count: int = 5) -> None:
    async with open_client_instance(namesrv, credentials=APP) as client, \
            open_producer(client, "takeoverProducers") as producer:
        for i in range(count):
            sent = await producer.send(Message(topic, f"m{i}".encode()))
            assert sent.send_status.name == "SEND_OK", sent


async def _attack_and_check(cluster, signer: Credentials | None = None) -> None:
    namesrv = cluster.namesrv_addr
    master = cluster.master.addr
    master_ha = cluster.master.started_addresses.ha_addr
    await wait_until(lambda: _ha_master_of(cluster.slave.addr), "the slave to follow its master")
    assert await _ha_master_of(cluster.slave.addr) == master_ha
    outcome = await hostile.broker_name_takeover(namesrv, "broker-a", fake_addr=FAKE,
                                                 fake_ha_addr=FAKE)
    assert "taken over" not in outcome.answers, outcome
    assert outcome.answers == {"NO_PERMISSION": 3}, outcome
    assert await _master_of(namesrv) == master
    if signer is not None:  # an account of the file, but not an admin one, is refused too
        request = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, {
            "brokerName": "broker-a", "brokerAddr": master, "brokerId": 0,
            "clusterName": "DefaultCluster"})
        async with open_remoting_client(namesrv, credentials=signer) as client:
            reply = await client.invoke(request, 5)
        assert reply.code == ResponseCode.NO_PERMISSION
        assert "needs an admin account" in (reply.remark or "")
        assert await _master_of(namesrv) == master
    # the slave still copies from the real master, so a SYNC send is acknowledged by it
    assert await _ha_master_of(cluster.slave.addr) == master_ha
    await _sync_sends_are_acknowledged(namesrv, "TakeoverTopic")


async def test_broker_name_takeover_by_unsigned_unregister_and_register_is_refused_with_acl_as_rocketmq_does_not(
        tmp_path):
    """With the name server's aclEnable, an unsigned UNREGISTER_BROKER of the live master,
    then REGISTER_BROKER of a fake master, or of the live master's own address with the
    attacker's HA address, are refused NO_PERMISSION (so is a non-admin account's); our
    brokers, signing with innerClientAuthenticationCredentials, register and serve."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL_YAML)
    config = ClusterConfig(
        data_dir=str(tmp_path / "data"), slaves=1,
        properties={"innerClientAuthenticationCredentials":
                    f'{{"accessKey":"{BROKER_ACCOUNT.access_key}",'
                    f'"secretKey":"{BROKER_ACCOUNT.secret_key}"}}',
                    "autoCreateTopicEnable": "true"},
        namesrv_properties={"aclEnable": "true", "plainAclFile": str(acl)})
    async with open_cluster(config) as cluster:
        await _attack_and_check(cluster, signer=APP)
        # the real master's own unregistration, signed, at shutdown, still goes through
        await cluster.master.stop()
        assert await _master_of(cluster.namesrv_addr) is None


async def test_broker_name_takeover_from_another_connection_is_refused_without_acl_as_rocketmq_does_not(
        tmp_path):
    """Without ACL a live registration belongs to the connection that made it: another
    connection can neither unregister it nor register a second master or the same address
    over it while that connection is open. Once the broker is gone, its name is free."""
    config = ClusterConfig(data_dir=str(tmp_path / "data"), slaves=1,
                           properties={"autoCreateTopicEnable": "true"})
    async with open_cluster(config) as cluster:
        await _attack_and_check(cluster)
        await cluster.master.stop()
        assert await _master_of(cluster.namesrv_addr) is None
        # the name is free now: a new master (here the attacker's) may take it
        outcome = await hostile.broker_name_takeover(
            cluster.namesrv_addr, "broker-a", fake_addr=FAKE, fake_ha_addr=FAKE)
        assert "nothing to take" in outcome.note
        with trio.fail_after(10):
            await cluster.master.start()
        assert await _master_of(cluster.namesrv_addr) == cluster.master.addr


# ---- a relay between a slave and its master (haAuthSecret) -------------------------------------


SECRET = "correct horse battery staple"


@attrs.define
class AckingRelay:
    """Plays slave to the real master with the real slave's handshake: it passes the
    handshake's bytes between them, then acknowledges every frame the master sends without
    storing it (a SYNC_MASTER would count that as a slave holding the bytes)."""

    master_ha: tuple[str, int]
    passed: int = 0
    refused: int = 0
    frames_acked: int = 0

    async def serve(self, stream: trio.SocketStream) -> None:
        try:
            async with stream, await trio.open_tcp_stream(*self.master_ha) as master:
                await self._relay(stream, master)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    async def _relay(self, slave: trio.SocketStream, master: trio.SocketStream) -> None:
        await slave.send_all(await receive_exactly(master, ha_auth.HELLO_SIZE, 5))
        answer = await receive_exactly(slave, ha_auth.SLAVE_ANSWER_SIZE, 5)
        await master.send_all(answer)
        proof = await receive_exactly(master, ha_auth.MASTER_PROOF_SIZE, 5)
        if len(proof) < ha_auth.MASTER_PROOF_SIZE:
            self.refused += 1  # the master closed: it refused the relayed proof
            return
        self.passed += 1
        await slave.send_all(proof)
        await master.send_all(await receive_exactly(slave, REPORT.size, 5))  # its first report
        for _ in range(10_000):  # bounded: the test ends long before
            header = await receive_exactly(master, FRAME_HEADER.size, 30)
            if len(header) < FRAME_HEADER.size:
                return
            offset, size = FRAME_HEADER.unpack(header)
            if len(await receive_exactly(master, size, 30)) < size:
                return
            if size:
                self.frames_acked += 1
                await master.send_all(REPORT.pack(offset + size))  # acked, never stored


async def test_a_relay_of_the_slaves_handshake_is_refused_and_a_sync_put_is_not_acknowledged_by_it(
        tmp_path, nursery):
    """A relay the slave dials (a name server could name it, a DNS entry could) passes the
    real slave's handshake to the real master, then acknowledges frames without storing
    them. The slave's proof names the relay's address, not the master's, so the master
    refuses it: no SYNC put is PUT_OK, and nothing was acknowledged."""
    async with open_store(master_config(tmp_path / "m", ha_auth_secret=SECRET,
                                        slave_timeout=500)) as master:
        assert master.ha_address is not None
        relay = AckingRelay(master.ha_address)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, relay.serve, listeners)
        port = listeners[0].socket.getsockname()[1]
        slave = StoreConfig(
            store_path_root_dir=str(tmp_path / "s"), mapped_file_size_commit_log=SEGMENT,
            mapped_file_size_consume_queue=20 * 200, broker_role=BrokerRole.SLAVE,
            ha_master_address=f"127.0.0.1:{port}", ha_reconnect_interval=100,
            ha_auth_secret=SECRET)
        async with open_store(slave):
            await wait_until(lambda: relay.refused + relay.passed >= 1,
                             "the slave's handshake through the relay")
            statuses = [(await master.put_message(StoreMessage("Relayed", b"x" * 100),
                                                  queue_id=0)).status for _ in range(5)]
        assert PutMessageStatus.PUT_OK not in statuses, statuses
        assert relay.passed == 0 and relay.frames_acked == 0
        assert ha_of(master).auth_failures >= 1


# ---- a slave that follows the name server (no haMasterAddress) ---------------------------------


def _wrong_proof(stream_sessions: list[int]) -> hostile.Script:
    """A rogue master's script: a well-formed hello, then a proof of nothing."""

    async def script(stream: trio.SocketStream, session: int) -> None:
        stream_sessions.append(session)
        await stream.send_all(ha_auth.hello(b"r" * ha_auth.NONCE_SIZE))
        await receive_exactly(stream, ha_auth.SLAVE_ANSWER_SIZE, 5)
        await stream.send_all(b"\0" * ha_auth.MASTER_PROOF_SIZE)
        await hostile.closed_by_node(stream, 5)

    return script


async def test_a_slave_following_the_name_server_stays_with_its_master_when_the_named_one_fails_authentication(
        tmp_path, nursery, caplog):
    """The name server names another master at every registration, one that fails the
    handshake: the slave keeps copying from the master it had (SYNC puts stay PUT_OK), tries
    the other once, not once per reconnect, and says so in one line; the metadata sync's
    master does not move either. A master that passes the handshake is followed."""
    from trio_ha.broker.config import BrokerConfig
    from trio_ha.broker.registration import Registration

    sessions: list[int] = []
    rogue = hostile.RogueHAMaster(_wrong_proof(sessions))
    await nursery.start(rogue.serve)
    assert rogue.address is not None
    async with open_store(master_config(tmp_path / "m", ha_auth_secret=SECRET)) as master:
        assert master.ha_address is not None
        master_ha = "{}:{}".format(*master.ha_address)
        slave_config = StoreConfig(
            store_path_root_dir=str(tmp_path / "s"), mapped_file_size_commit_log=SEGMENT,
            mapped_file_size_consume_queue=20 * 200, broker_role=BrokerRole.SLAVE,
            ha_reconnect_interval=100, ha_auth_secret=SECRET)
        async with open_store(slave_config) as slave:
            registration = Registration(  # only its answer-following part is used here
                BrokerConfig(broker_id=1, store=slave_config), "127.0.0.1:2", None,
                None, None, ha_client=slave.ha_client)  # type: ignore[arg-type]
            registration._follow_master("127.0.0.1:1", master_ha)
            await wait_until(lambda: slave_count(master) == 1, "the slave to follow its master")
            caplog.clear()
            for _ in range(50):  # what the name server says at every registration
                registration._follow_master("127.0.0.1:9", rogue.address)
                await trio.sleep(0.02)
            await wait_until(lambda: sessions, "the slave to try the named master")
            await trio.sleep(0.5)  # time in which a following slave would have redialled
            await trio.testing.wait_all_tasks_blocked()  # and what was due in it has run
            stats = ha_slave_of(slave)
            assert stats.master_address == master_ha
            assert registration.master_addr == "127.0.0.1:1"
            results = [await master.put_message(StoreMessage("Followed", b"x"), queue_id=0)
                       for _ in range(5)]
            assert {r.status for r in results} == {PutMessageStatus.PUT_OK}
            # a master that does pass the handshake is followed, metadata sync and all
            async with open_store(master_config(tmp_path / "m2", ha_auth_secret=SECRET)) as new:
                assert new.ha_address is not None
                new_ha = "{}:{}".format(*new.ha_address)
                registration._follow_master("127.0.0.1:3", new_ha)
                await wait_until(lambda: ha_slave_of(slave).master_address == new_ha,
                                 "the slave to follow the master that proved itself")
                assert registration.master_addr == "127.0.0.1:3"
    assert len(sessions) == 1, sessions
    lines = [r.getMessage() for r in caplog.records if "not following" in r.getMessage()]
    assert len(lines) == 1 and rogue.address in lines[0] and master_ha in lines[0], lines


def test_inner_client_credentials_are_checked_json_and_never_shown():
    """innerClientAuthenticationCredentials (RocketMQ 5's key): a JSON object with both keys,
    else a one-line start error that does not quote the value; GET_BROKER_CONFIG and repr
    hide it."""
    import pytest

    from trio_ha.broker.config import BrokerConfig
    from trio_ha.config import ConfigError

    good = '{"accessKey":"brokerAdmin","secretKey":"s3cret-value"}'
    config = BrokerConfig.from_properties({"innerClientAuthenticationCredentials": good})
    assert config.inner_client_credentials == Credentials("brokerAdmin", "s3cret-value")
    assert config.to_properties()["innerClientAuthenticationCredentials"] == "<hidden>"
    assert "s3cret-value" not in repr(config)
    for bad in ('{"accessKey":"only-the-key"}', "s3cret-value", '["a","b"]',
                '{"accessKey":"","secretKey":"x"}'):
        with pytest.raises(ConfigError, match="innerClientAuthenticationCredentials") as caught:
            BrokerConfig.from_properties({"innerClientAuthenticationCredentials": bad})
        assert "s3cret-value" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_live_registration_is_changed_only_by_its_connection_or_account_until_it_expires():
    """The route table's rule: another connection (with no or other credentials) can neither
    unregister a live address nor register it again; the same account can, from anywhere;
    once the registration expired, anyone can."""
    import pytest

    from trio_ha.namesrv import RegistrationHeld, RouteInfoManager

    owner, intruder = object(), object()  # the table compares connections by identity only
    routes = RouteInfoManager(broker_expiry=120)

    def register(connection, now, principal=None, ha="m:2"):
        return routes.register_broker(cluster="c", broker_addr="m:1", broker_name="b",
                                      broker_id=0, ha_server_addr=ha, topics=None,
                                      connection=connection, now=now,
                                      principal=principal)

    def unregister(connection, now, principal=None):
        routes.unregister_broker(broker_addr="m:1", broker_name="b", broker_id=0,
                                 connection=connection, principal=principal,
                                 now=now)

    register(owner, 0, principal="brokerAdmin")
    with pytest.raises(RegistrationHeld, match="UNREGISTER_BROKER of m:1 refused"):
        unregister(intruder, 10)
    with pytest.raises(RegistrationHeld, match="registration of m:1 refused"):
        register(intruder, 10, ha="attacker:2")
    with pytest.raises(RegistrationHeld):
        unregister(intruder, 10, principal="someoneElse")
    assert routes.broker_live_table["m:1"].ha_server_addr == "m:2"
    register(intruder, 20, principal="brokerAdmin")  # the same account, a new connection
    unregister(owner, 30, principal="brokerAdmin")
    assert "b" not in routes.broker_addr_table
    register(owner, 40)
    unregister(intruder, 40 + 121)  # expired: no longer held
    assert "b" not in routes.broker_addr_table
