"""Issue 15: authenticated replication (haAuthSecret, our extension). With the secret on both
ends they replicate as before; a peer without it, or with another, gets nothing and the node
keeps serving; the classic protocol (no secret) is unchanged (the interop suite replicates
with the real RocketMQ that way)."""

from __future__ import annotations

import struct

import pytest
import trio

from conftest import ha_of, ha_slave_of, wait_until
from test_ha import body, master_config, slave_config, slave_count
from trio_ha import Message, PutMessageStatus, open_store
from trio_ha.chaos.hostile import receive_exactly
from trio_ha.config import ConfigError
from trio_ha.store.ha.auth import HANDSHAKE_TIMEOUT
from trio_ha.store.ha.slave import HAClientState
from trio_ha.wire import ha_auth

SECRET = "correct horse battery staple"
OTHER = "a different long secret"


# ---- the handshake's bytes ---------------------------------------------------------------------


def test_each_side_proves_the_secret_over_both_fresh_nonces():
    key, master_nonce, slave_nonce = SECRET.encode(), b"m" * 32, b"s" * 32
    dialled = ha_auth.endpoint("127.0.0.1", 10912)
    assert ha_auth.read_hello(ha_auth.hello(master_nonce)) == master_nonce
    answer = ha_auth.slave_answer(key, master_nonce, slave_nonce, dialled)
    checked = ha_auth.check_slave_answer(key, master_nonce, answer, dialled)
    assert checked == ha_auth.SlaveAnswer(slave_nonce, dialled)
    proof = ha_auth.master_proof(key, slave_nonce, master_nonce, dialled)
    ha_auth.check_master_proof(key, slave_nonce, master_nonce, dialled, proof)
    # another secret, another challenge (a replayed answer), or the other side's label fail
    with pytest.raises(ha_auth.HAAuthError, match="does not know"):
        ha_auth.check_slave_answer(OTHER.encode(), master_nonce, answer, dialled)
    with pytest.raises(ha_auth.HAAuthError, match="does not know"):
        ha_auth.check_slave_answer(key, b"n" * 32, answer, dialled)
    with pytest.raises(ha_auth.HAAuthError, match="does not know"):
        ha_auth.check_master_proof(key, slave_nonce, master_nonce, dialled, answer[-32:])
    with pytest.raises(ha_auth.HAAuthError, match="does not speak|did not answer"):
        ha_auth.check_slave_answer(key, master_nonce, b"\x00" * ha_auth.SLAVE_ANSWER_SIZE,
                                   dialled)
    with pytest.raises(ha_auth.HAAuthError, match="did not open"):
        ha_auth.read_hello(struct.pack(">q", 0) + b"\x00" * 36)  # a classic report


def test_the_slaves_proof_names_the_address_it_dialled_and_a_master_elsewhere_refuses_it():
    """Issue 35: the proof covers the address the slave's socket is connected to; a master
    reached at another address (the slave dialled a relay) refuses it, naming both."""
    key, master_nonce, slave_nonce = SECRET.encode(), b"m" * 32, b"s" * 32
    relay, master = ha_auth.endpoint("127.0.0.1", 40001), ha_auth.endpoint("127.0.0.1", 10912)
    answer = ha_auth.slave_answer(key, master_nonce, slave_nonce, relay)
    with pytest.raises(ha_auth.HAAuthError,
                       match="dialled 127.0.0.1:40001.*reached this master at 127.0.0.1:10912"):
        ha_auth.check_slave_answer(key, master_nonce, answer, master)
    # the address is inside the proof: rewriting it breaks the proof
    forged = answer.replace(relay, master)
    with pytest.raises(ha_auth.HAAuthError, match="does not know"):
        ha_auth.check_slave_answer(key, master_nonce, forged, master)
    # IPv4 and its IPv6-mapped form are one address; IPv6 keeps its brackets in logs
    assert ha_auth.endpoint("::ffff:127.0.0.1", 5) == ha_auth.endpoint("127.0.0.1", 5)
    assert ha_auth.endpoint_text(ha_auth.endpoint("::1", 7)) == "[::1]:7"


def test_a_short_secret_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="at least 16"):
        master_config(tmp_path, ha_auth_secret="short")
    config = master_config(tmp_path, ha_auth_secret=SECRET)
    assert config.to_properties()["haAuthSecret"] == "<hidden>"
    assert SECRET not in repr(config)


# ---- master and slaves over loopback -----------------------------------------------------------


async def test_master_and_slave_with_the_secret_replicate_byte_for_byte(tmp_path):
    async with open_store(master_config(tmp_path / "m", ha_auth_secret=SECRET)) as master:
        async with open_store(slave_config(tmp_path / "s", master,
                                           ha_auth_secret=SECRET)) as slave:
            await wait_until(lambda: slave_count(master) == 1, "the slave to ack")
            results = [await master.put_message(Message("Auth", body(i)), queue_id=0)
                       for i in range(50)]
            assert {r.status for r in results} == {PutMessageStatus.PUT_OK}
            await wait_until(lambda: slave.max_commitlog_offset == master.max_commitlog_offset,
                             "the slave to catch up")
            stored = await slave.look_message_by_offset(results[-1].commitlog_offset)
            assert stored is not None and stored.body == body(49)


async def test_a_slave_without_the_secret_or_with_another_gets_nothing(tmp_path):
    """Neither a classic slave (no secret) nor one with the wrong secret receives a byte of
    the log; the master counts them refused and keeps serving its real slave."""
    async with open_store(master_config(tmp_path / "m", ha_auth_secret=SECRET)) as master:
        for i in range(20):
            await master.put_message(Message("Auth", body(i)), queue_id=0)
        async with open_store(slave_config(tmp_path / "good", master,
                                           ha_auth_secret=SECRET)) as good, \
                open_store(slave_config(tmp_path / "classic", master)) as classic, \
                open_store(slave_config(tmp_path / "wrong", master,
                                        ha_auth_secret=OTHER)) as wrong:
            await wait_until(lambda: good.max_commitlog_offset == master.max_commitlog_offset,
                             "the real slave to catch up")
            await wait_until(lambda: ha_of(master).auth_failures >= 4,
                             "both impostors to be refused, twice each")
            assert classic.max_commitlog_offset == 0 and wrong.max_commitlog_offset == 0
            assert slave_count(master) == 1
            # the master hangs up without saying why
            assert "during the handshake" in (ha_slave_of(wrong).last_error or "")
            result = await master.put_message(Message("Auth", b"after"), queue_id=0)
            assert result.status is PutMessageStatus.PUT_OK  # SYNC_MASTER: the real slave acked


async def test_a_slave_with_the_secret_takes_nothing_from_a_master_without_it(
        tmp_path, autojump_clock):
    """A classic master waits for the slave's report, which a slave with the secret never
    sends before the handshake: the slave gives up after HANDSHAKE_TIMEOUT, having written
    nothing, and tries again later."""
    async with open_store(master_config(tmp_path / "m")) as master:
        for i in range(20):
            await master.put_message(Message("Auth", body(i)), queue_id=0)
        async with open_store(slave_config(tmp_path / "s", master,
                                           ha_auth_secret=SECRET)) as slave:
            await trio.sleep(HANDSHAKE_TIMEOUT * 3)
            assert slave.max_commitlog_offset == 0
            assert ha_slave_of(slave).state in (HAClientState.BACKOFF,
                                             HAClientState.AUTHENTICATING)
            assert ha_slave_of(slave).last_error is not None  # a session ended
            assert slave_count(master) == 0  # the master never had a report


async def test_a_bogus_master_that_answers_the_hello_with_a_wrong_proof_feeds_nothing(
        tmp_path, nursery):
    """A fake master sends a well-formed hello, takes the slave's answer, then proves
    nothing (it has no secret) and sends log-looking bytes: the slave closes before it
    reads them and its log stays empty."""
    received = []

    async def fake_master(stream: trio.SocketStream) -> None:
        try:
            await fake_session(stream)
        except trio.BrokenResourceError:
            pass  # the slave hung up on us: what it should do

    async def fake_session(stream: trio.SocketStream) -> None:
        await stream.send_all(ha_auth.hello(b"f" * 32))
        data = await receive_exactly(stream, ha_auth.SLAVE_ANSWER_SIZE, HANDSHAKE_TIMEOUT)
        if len(data) < ha_auth.SLAVE_ANSWER_SIZE:
            return
        received.append(data)
        await stream.send_all(b"\x00" * 32 + b"\x00" * 12 + b"record bytes" * 100)
        await stream.receive_some(1024)  # until the slave hangs up

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, fake_master, listeners)
    port = listeners[0].socket.getsockname()[1]

    class FakeAddress:
        ha_address = ("127.0.0.1", port)

    async with open_store(slave_config(tmp_path / "s", FakeAddress(),  # type: ignore[arg-type]
                                       ha_auth_secret=SECRET)) as slave:
        await wait_until(lambda: received and ha_slave_of(slave).last_error is not None,
                         "the slave to answer and give up")
        assert "does not know haAuthSecret" in (ha_slave_of(slave).last_error or "")
        assert slave.max_commitlog_offset == 0


async def test_a_sync_master_and_its_slave_configured_by_broker_conf_replicate_with_it(
        tmp_path):
    """``haAuthSecret`` in broker.conf: a SYNC_MASTER's SEND_OK means the slave had the
    bytes, which it could only get through the handshake."""
    from trio_ha.client import Message as ClientMessage
    from trio_ha.client import open_admin, open_client_instance, open_producer
    from trio_ha.testing import ClusterConfig, open_cluster

    config = ClusterConfig(data_dir=str(tmp_path), master_role="SYNC_MASTER",
                           properties={"haAuthSecret": SECRET})
    async with open_cluster(config) as cluster:
        async with open_client_instance(cluster.namesrv_addr) as client, \
                open_admin(client) as admin, open_producer(client, "g") as producer:
            await admin.create_topic("AuthT", 2, cluster="DefaultCluster")
            statuses = []

            async def replicated() -> bool:  # SLAVE_NOT_AVAILABLE until the slave attached
                result = await producer.send(ClientMessage("AuthT", b"replicated"))
                statuses.append(result.send_status.name)
                return result.send_status.name == "SEND_OK"

            await wait_until(replicated, "a SEND_OK (the slave attached through the handshake)",
                             timeout=20, interval=0.05)
            assert set(statuses) <= {"SLAVE_NOT_AVAILABLE", "SEND_OK"}, statuses


async def test_silent_peers_in_the_handshake_cannot_take_a_real_slaves_place(tmp_path):
    """haMaxConnections silent connections (each may wait HANDSHAKE_TIMEOUT) fill the
    handshake budget, not the connections' one: a real slave still gets in at once."""
    async with open_store(master_config(tmp_path / "m", ha_auth_secret=SECRET,
                                        ha_max_connections=2)) as master:
        assert master.ha_address is not None
        silent = [await trio.open_tcp_stream(*master.ha_address) for _ in range(2)]
        async with open_store(slave_config(tmp_path / "s", master,
                                           ha_auth_secret=SECRET)) as slave:
            await master.put_message(Message("Auth", b"through"), queue_id=0)
            # in before the silent ones' handshakes could have timed out
            await wait_until(
                lambda: slave.max_commitlog_offset == master.max_commitlog_offset,
                "the real slave to catch up", timeout=HANDSHAKE_TIMEOUT - 1)
        for stream in silent:
            await stream.aclose()
