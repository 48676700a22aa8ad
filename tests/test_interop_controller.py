"""Issue 38: the real RocketMQ 5.3.3 controller as a test peer, and what it taught us.

Our brokers are to be members of a controller-mode cluster judged by the real controller, and
the codecs for its protocol are written from a spec sheet read from RocketMQ's source. These
tests pin what the real controller does, so those codecs rest on observation, not reading:

* one controller leads alone, and mqadmin says so;
* a transcript: two fake brokers of one broker set go through a broker's whole start-up (spec
  section 2.3) with raw RemotingCommands, one connection each (a broker's heartbeats mark it
  alive on the connection they came on; closing that connection marks it dead); the master
  adds the other to its SyncStateSet; the master's connection closes and the controller elects
  the other and tells it so (NOTIFY_BROKER_ROLE_CHANGED, to a listener of ours at the
  broker's address). Every code, header field and body the controller sends is asserted
  whole, read with no codec of ours (the fastjson reader only quotes the numeric keys);
* its refusals: a start-up out of order, a second APPLY_BROKER_ID, a dead master's election
  and alter, a cleaned set, a code it does not serve;
* three controllers: the leader is SIGKILLed, the survivors name a new one, and a follower
  answers CONTROLLER_NOT_LEADER;
* two real 5.3.3 brokers in controller mode: one becomes master, the other its slave in the
  SyncStateSet, the 5.3.3 Java client sends, the master is SIGKILLed and the slave is master.

What differs from the spec sheet is written up in docs/controller-mode-observed.md. The
timings printed (``-s``) are recorded in interop/README.md, never asserted.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
import trio

from conftest import wait_until
from trio_ha.remoting import RemotingClient, open_remoting_client, serve_remoting
from trio_ha.testing import free_broker_port
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.rocketmq import (
    CONTROLLER_GROUP,
    controller_leader,
    controller_metadata,
    program_lines,
    wait_for_controller_leader,
)
from trio_ha.wire.fastjson import read_json
from trio_ha.wire.remoting import JavaValue, RemotingCommand, RequestCode

pytestmark = pytest.mark.interop

CLIENT = "trioha.interop.Client"
CLUSTER = "CtlCluster"
BROKER_NAME = "broker-a"

# The controller's answers, by number (RocketMQ's ResponseCode 2000-2016): these tests pin the
# real peer, so they name no codec of ours.
SUCCESS = 0
CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
CONTROLLER_INVALID_REQUEST = 2005
CONTROLLER_BROKER_NOT_ALIVE = 2006
CONTROLLER_NOT_LEADER = 2007
CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
CONTROLLER_MASTER_STILL_EXIST = 2011
CONTROLLER_ELECT_MASTER_FAILED = 2012
CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
CONTROLLER_BROKER_ID_INVALID = 2014

#: mqadmin's cleanBrokerMetadata (RocketMQ's RequestCode.CLEAN_BROKER_DATA), which our
#: RequestCode does not name
CLEAN_BROKER_DATA = 1011

#: how long a fake broker's heartbeat says it stays alive without another (a real broker's
#: controllerHeartBeatTimeoutMills)
HEARTBEAT_TIMEOUT_MS = 10_000


def parsed(reply: RemotingCommand) -> Any:
    """A reply's fastjson body as Python values (numeric object keys become strings)."""
    return read_json(reply.body)


def millis() -> int:
    return int(time.time() * 1000)


async def call(client: RemotingClient, code: int,
               fields: Mapping[str, JavaValue | None] | None = None, body: bytes = b""
               ) -> RemotingCommand:
    return await client.invoke(RemotingCommand.request(code, fields, body), 10)


def elapsed_since(start: float) -> str:
    return f"{time.monotonic() - start:.1f} s"


# ---- one controller ---------------------------------------------------------------------------


def test_one_controller_leads_alone_and_mqadmin_shows_it(rocketmq5, tmp_path):
    port = free_broker_port()
    address = f"127.0.0.1:{port}"
    began = time.monotonic()
    controller = rocketmq5.start_controller(tmp_path / "ctl", port)
    try:
        booted = elapsed_since(began)
        assert controller_leader([address]) == address
        print(f"one controller: boot line after {booted}, leader after {elapsed_since(began)}")
        header = trio.run(controller_metadata, address)
        # isLeader is sent as a string, as every extFields value; peers ends with ";"
        assert header == {"group": CONTROLLER_GROUP, "controllerLeaderId": "n0",
                          "controllerLeaderAddress": address, "isLeader": "true",
                          "peers": f"n0:{address};"}
        out = rocketmq5.mqadmin(tmp_path / "adm", "getControllerMetaData", "-a", address)
        lines = [line for line in out.splitlines() if line.startswith("#")]
        assert lines == [f"#ControllerGroup\t{CONTROLLER_GROUP}", "#ControllerLeaderId\tn0",
                         f"#ControllerLeaderAddress\t{address}", f"#Peer:\tn0:{address}"], out
    finally:
        controller.kill()


# ---- the start-up transcript ------------------------------------------------------------------


@attrs.define(eq=False)
class FakeBroker:
    """One broker of the set as the controller sees it: a connection of its own (heartbeats
    on it keep it alive; its close is the broker's death) and, at ``address``, a listener of
    ours that collects what the controller sends there."""

    client: RemotingClient
    address: str
    notices: trio.MemoryReceiveChannel[RemotingCommand]
    broker_id: int = 0
    #: the heartbeats' scope: cancelled before the connection closes
    beating: trio.CancelScope | None = None

    def heartbeat_request(self) -> RemotingCommand:
        return RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, {
            "clusterName": CLUSTER, "brokerName": BROKER_NAME, "brokerAddr": self.address,
            "brokerId": self.broker_id, "epoch": 0, "maxOffset": 0, "confirmOffset": 0,
            "heartbeatTimeoutMills": HEARTBEAT_TIMEOUT_MS})

    async def beat(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                   ) -> None:
        """Oneway heartbeats every second, as a real broker sends them, until cancelled."""
        with trio.CancelScope() as self.beating:
            task_status.started()
            while True:
                await self.client.invoke_oneway(self.heartbeat_request())
                await trio.sleep(1)

    async def next_notice(self, timeout: float = 15.0) -> RemotingCommand:
        with trio.fail_after(timeout):
            return await self.notices.receive()


async def fake_broker(nursery: trio.Nursery, client: RemotingClient) -> FakeBroker:
    send, receive = trio.open_memory_channel[RemotingCommand](16)

    async def collect(request: RemotingCommand, connection: object) -> None:
        send.send_nowait(request)  # the controller's notices are oneway: no reply

    _, port = await nursery.start(functools.partial(serve_remoting, collect, 0,
                                                    host="127.0.0.1"))
    return FakeBroker(client, f"127.0.0.1:{port}", receive)


async def start_up(broker: FakeBroker, expected_id: int) -> RemotingCommand:
    """GET_NEXT_BROKER_ID, APPLY_BROKER_ID and REGISTER_BROKER for ``broker``, each answer
    asserted; returns the REGISTER answer (what depends on the set's state)."""
    names = {"clusterName": CLUSTER, "brokerName": BROKER_NAME}
    reply = await call(broker.client, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, names)
    assert (reply.code, reply.ext_fields) == (SUCCESS, {**names,
                                                        "nextBrokerId": str(expected_id)})
    assert reply.body == b""
    broker.broker_id = expected_id
    reply = await call(broker.client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
        **names, "appliedBrokerId": expected_id,
        "registerCheckCode": f"{broker.address};{millis()}"})
    assert (reply.code, reply.ext_fields, reply.body) == (SUCCESS, names, b"")
    return await call(broker.client, RequestCode.CONTROLLER_REGISTER_BROKER, {
        **names, "brokerId": expected_id, "brokerAddress": broker.address,
        "invokeTime": millis()})


async def replica_info(client: RemotingClient) -> RemotingCommand:
    return await call(client, RequestCode.CONTROLLER_GET_REPLICA_INFO,
                      {"brokerName": BROKER_NAME})


async def sync_state_data(client: RemotingClient) -> dict:
    reply = await call(client, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
                       body=json.dumps([BROKER_NAME]).encode())
    assert (reply.code, reply.ext_fields) == (SUCCESS, {}), reply
    return parsed(reply)


def replica(broker: FakeBroker, alive: bool) -> dict:
    return {"alive": alive, "brokerAddress": broker.address, "brokerId": broker.broker_id,
            "brokerName": BROKER_NAME}


async def transcript(controller: str) -> None:
    await wait_for_controller_leader([controller])
    # the nursery (listeners, heartbeats) ends before the connections close
    async with open_remoting_client(controller) as first_client, \
            open_remoting_client(controller) as second_client, trio.open_nursery() as nursery:
        first = await fake_broker(nursery, first_client)
        second = await fake_broker(nursery, second_client)

        # An unknown broker set has no replica info.
        reply = await replica_info(first.client)
        assert reply.code == CONTROLLER_BROKER_METADATA_NOT_EXIST, reply
        assert reply.ext_fields == {}

        # -- the first broker: an id, registered, alive, and master by its own election
        reply = await start_up(first, 1)
        assert (reply.code, reply.ext_fields) == (SUCCESS, {"clusterName": CLUSTER,
                                                            "brokerName": BROKER_NAME})
        assert parsed(reply) == {"syncStateSet": [], "syncStateSetEpoch": 0}
        await nursery.start(first.beat)
        # A heartbeat that asks for an answer gets one, from any controller.
        reply = await first.client.invoke(first.heartbeat_request(), 10)
        assert (reply.code, reply.remark, reply.ext_fields, reply.body) == (
            SUCCESS, "Heart beat success", {}, b"")

        reply = await call(first.client, RequestCode.CONTROLLER_ELECT_MASTER, {
            "clusterName": CLUSTER, "brokerName": BROKER_NAME, "brokerId": 1,
            "designateElect": False, "invokeTime": millis()})
        assert (reply.code, reply.ext_fields) == (SUCCESS, {
            "masterBrokerId": "1", "masterAddress": first.address, "masterEpoch": "1",
            "syncStateSetEpoch": "1"})
        # brokerAddrs is keyed by the broker id, unquoted: fastjson's habit
        assert f'"brokerAddrs":{{1:"{first.address}"}}' in reply.body.decode(), reply.body
        assert parsed(reply) == {
            "brokerMemberGroup": {"brokerAddrs": {"1": first.address},
                                  "brokerName": BROKER_NAME, "cluster": CLUSTER},
            "syncStateSet": [1]}
        # ...and the controller tells the alive members (here, the master itself)
        notice = await first.next_notice()
        assert (notice.code, notice.is_oneway, notice.ext_fields) == (
            RequestCode.NOTIFY_BROKER_ROLE_CHANGED, True, {
                "masterAddress": first.address, "masterBrokerId": "1", "masterEpoch": "1",
                "syncStateSetEpoch": "1"})
        assert parsed(notice) == {"syncStateSet": [1], "syncStateSetEpoch": 1}

        # -- the second broker: the next id; its register answer names the live master
        reply = await start_up(second, 2)
        assert (reply.code, reply.ext_fields) == (SUCCESS, {
            "clusterName": CLUSTER, "brokerName": BROKER_NAME, "masterBrokerId": "1",
            "masterAddress": first.address, "masterEpoch": "1", "syncStateSetEpoch": "1"})
        assert parsed(reply) == {"syncStateSet": [1], "syncStateSetEpoch": 1}
        await nursery.start(second.beat)

        async def second_alive() -> dict | None:
            data = await sync_state_data(second.client)
            info = data["replicasInfoTable"][BROKER_NAME]
            return data if info["notInSyncReplicas"] == [replica(second, True)] else None

        # its oneway heartbeats reach the controller
        data = await wait_until(second_alive, "the second broker alive", interval=0.2)
        assert data == {"replicasInfoTable": {BROKER_NAME: {
            "inSyncReplicas": [replica(first, True)], "masterAddress": first.address,
            "masterBrokerId": 1, "masterEpoch": 1, "notInSyncReplicas": [replica(second, True)],
            "syncStateSetEpoch": 1}}}

        reply = await replica_info(second.client)
        assert (reply.code, reply.ext_fields) == (SUCCESS, {
            "masterBrokerId": "1", "masterAddress": first.address, "masterEpoch": "1"})
        assert parsed(reply) == {"syncStateSet": [1], "syncStateSetEpoch": 1}

        # -- the master adds the second broker to its SyncStateSet
        def alter(members: list[int], epoch: int) -> RemotingCommand:
            return RemotingCommand.request(
                RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                {"brokerName": BROKER_NAME, "masterBrokerId": 1, "masterEpoch": 1,
                 "invokeTime": millis()},
                json.dumps({"syncStateSet": members, "syncStateSetEpoch": epoch}).encode())

        reply = await first.client.invoke(alter([1, 2], 1), 10)
        assert (reply.code, reply.ext_fields) == (SUCCESS, {"newSyncStateSetEpoch": "2"})
        assert parsed(reply) == {"syncStateSet": [1, 2], "syncStateSetEpoch": 2}
        # the same set again is refused before the stale epoch is looked at
        reply = await first.client.invoke(alter([1, 2], 1), 10)
        assert (reply.code, reply.ext_fields) == (CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, {
            "newSyncStateSetEpoch": "0"}), reply
        # a changed set with a stale epoch is fenced
        reply = await first.client.invoke(alter([1], 1), 10)
        assert (reply.code, reply.ext_fields) == (CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH, {
            "newSyncStateSetEpoch": "0"}), reply

        # -- the master's connection closes: the controller elects the second broker at once
        assert first.beating is not None
        first.beating.cancel()
        closed = time.monotonic()
        await first.client.aclose()
        notice = await second.next_notice()
        print(f"transcript: notice to the new master {elapsed_since(closed)} after the close")
        assert (notice.code, notice.is_oneway, notice.ext_fields) == (
            RequestCode.NOTIFY_BROKER_ROLE_CHANGED, True, {
                "masterAddress": second.address, "masterBrokerId": "2", "masterEpoch": "2",
                "syncStateSetEpoch": "3"})
        assert parsed(notice) == {"syncStateSet": [2], "syncStateSetEpoch": 3}
        reply = await replica_info(second.client)
        assert (reply.code, reply.ext_fields) == (SUCCESS, {
            "masterBrokerId": "2", "masterAddress": second.address, "masterEpoch": "2"})
        assert parsed(reply) == {"syncStateSet": [2], "syncStateSetEpoch": 3}
        # The old master is no longer alive, and out of the set.
        data = await sync_state_data(second.client)
        assert data["replicasInfoTable"][BROKER_NAME]["notInSyncReplicas"] == [
            replica(first, False)]

        # The new master asking again: it is still master (2011), with the set only.
        reply = await call(second.client, RequestCode.CONTROLLER_ELECT_MASTER, {
            "clusterName": CLUSTER, "brokerName": BROKER_NAME, "brokerId": 2,
            "designateElect": False, "invokeTime": millis()})
        assert (reply.code, reply.ext_fields) == (CONTROLLER_MASTER_STILL_EXIST, {
            "masterBrokerId": "2", "masterAddress": second.address, "masterEpoch": "2",
            "syncStateSetEpoch": "3"})
        assert parsed(reply) == {"syncStateSet": [2]}
        nursery.cancel_scope.cancel()


def test_a_broker_set_starts_up_and_fails_over_in_raw_commands(controller5):
    trio.run(transcript, controller5)


async def refusals(controller: str) -> None:
    """What the controller answers to requests out of order or incomplete: each answer's
    code, remark, header and body, as a broker would get them."""
    names = {"clusterName": CLUSTER, "brokerName": BROKER_NAME}
    address = "127.0.0.1:1"  # nothing listens there: no notice is awaited here

    async def ask(code: int, fields: Mapping[str, JavaValue | None] | None = None,
                  body: bytes = b"") -> tuple[int, str | None, dict[str, str], bytes]:
        reply = await call(client, code, fields, body)
        return reply.code, reply.remark, reply.ext_fields, reply.body

    async with open_remoting_client(controller) as client:
        # A new set's first id must be 1.
        assert await ask(RequestCode.CONTROLLER_APPLY_BROKER_ID, {
            **names, "appliedBrokerId": 2, "registerCheckCode": f"{address};1"}) == (
            CONTROLLER_BROKER_ID_INVALID, f"Broker-set: {BROKER_NAME} hasn't been registered "
            "in controller, but broker try to apply brokerId: 2", names, b"")
        # Nothing before APPLY_BROKER_ID: not REGISTER, not ELECT_MASTER.
        assert await ask(RequestCode.CONTROLLER_REGISTER_BROKER, {
            **names, "brokerId": 1, "brokerAddress": address, "invokeTime": millis()}) == (
            CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
            f"Broker-set: {BROKER_NAME} hasn't been registered in controller", names, b"")
        assert await ask(RequestCode.CONTROLLER_ELECT_MASTER, {
            **names, "brokerId": 1, "designateElect": False, "invokeTime": millis()}) == (
            CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, "Broker hasn't been registered", {}, b"")
        # A heartbeat without the broker's controller id is refused, if an answer is asked.
        assert await ask(RequestCode.BROKER_HEARTBEAT, {**names, "brokerAddr": address}) == (
            CONTROLLER_INVALID_REQUEST, "Heart beat with empty brokerId", {}, b"")

        # APPLY_BROKER_ID again with the same check code is accepted; with another, refused.
        apply = {**names, "appliedBrokerId": 1, "registerCheckCode": f"{address};1"}
        assert await ask(RequestCode.CONTROLLER_APPLY_BROKER_ID, apply) == (
            SUCCESS, None, names, b"")
        assert await ask(RequestCode.CONTROLLER_APPLY_BROKER_ID, apply) == (
            SUCCESS, None, names, b"")
        assert await ask(RequestCode.CONTROLLER_APPLY_BROKER_ID, {
            **apply, "registerCheckCode": "127.0.0.1:2;1"}) == (
            CONTROLLER_BROKER_ID_INVALID,
            f"Fail to apply brokerId: 1 in broker-set: {BROKER_NAME}", names, b"")
        assert await ask(RequestCode.CONTROLLER_REGISTER_BROKER, {
            **names, "brokerId": 3, "brokerAddress": "127.0.0.1:3", "invokeTime": millis()}
        ) == (CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
              f"BrokerId: 3 hasn't been registered in broker-set: {BROKER_NAME}", names, b"")
        # Before any election the replica info has a masterEpoch and no master fields.
        assert await ask(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                         {"brokerName": BROKER_NAME}) == (
            SUCCESS, None, {"masterEpoch": "0"}, b'{"syncStateSet":[],"syncStateSetEpoch":0}')

        # The first election takes the asker even if it never sent a heartbeat, and
        # designateElect (@CFNotNull) may be left out: its Java default is false.
        code, _, header, _ = await ask(RequestCode.CONTROLLER_ELECT_MASTER, {
            **names, "brokerId": 1, "invokeTime": millis()})
        assert (code, header) == (SUCCESS, {"masterBrokerId": "1", "masterAddress": address,
                                            "masterEpoch": "1", "syncStateSetEpoch": "1"})
        # A master that is not alive is not "still master" (2011): the election fails.
        assert await ask(RequestCode.CONTROLLER_ELECT_MASTER, {
            **names, "brokerId": 1, "designateElect": False, "invokeTime": millis()}) == (
            CONTROLLER_ELECT_MASTER_FAILED, "Failed to elect a new master", {}, b"")
        # ...nor can it alter its set.
        assert await ask(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
            "brokerName": BROKER_NAME, "masterBrokerId": 1, "masterEpoch": 1,
            "invokeTime": millis()}, b'{"syncStateSet":[1,2],"syncStateSetEpoch":1}') == (
            CONTROLLER_BROKER_NOT_ALIVE, "Rejecting alter syncStateSet request because the "
            "replicas {1} don't alive", {"newSyncStateSetEpoch": "0"}, b"")
        # GET_SYNC_STATE_DATA leaves out names it does not know.
        code, _, header, body = await ask(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, None,
                                          json.dumps([BROKER_NAME, "nope"]).encode())
        assert (code, header, list(read_json(body)["replicasInfoTable"])) == (
            SUCCESS, {}, [BROKER_NAME])
        # Cleaning a dead broker's id empties the set, and the set is forgotten.
        assert await ask(CLEAN_BROKER_DATA, {
            **names, "brokerControllerIdsToClean": "1", "isCleanLivingBroker": False,
            "invokeTime": millis()}) == (SUCCESS, None, {}, b"")
        assert await ask(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                         {"brokerName": BROKER_NAME}) == (
            CONTROLLER_BROKER_METADATA_NOT_EXIST, "Broker metadata is not existed", {}, b"")
        # A code it does not serve: REQUEST_CODE_NOT_SUPPORTED (3), remark with a blank first.
        assert await ask(9999) == (3, " request type 9999 not supported", {}, b"")


def test_the_controller_refuses_requests_out_of_order(controller5):
    trio.run(refusals, controller5)


# ---- three controllers ------------------------------------------------------------------------


async def follower_answers(follower: str, leader: str, leader_id: str, peers: str) -> None:
    async def knows_the_leader() -> dict[str, str] | None:
        header = await controller_metadata(follower)
        return header if header.get("controllerLeaderId") == leader_id else None

    # The follower voted, but learns who won from the leader's first heartbeat.
    header = await wait_until(knows_the_leader, "the follower naming the new leader",
                              interval=0.2)
    assert header == {"group": CONTROLLER_GROUP, "controllerLeaderId": leader_id,
                      "controllerLeaderAddress": leader, "isLeader": "false", "peers": peers}
    async with open_remoting_client(follower) as client:
        reply = await call(client, RequestCode.CONTROLLER_REGISTER_BROKER, {
            "clusterName": CLUSTER, "brokerName": BROKER_NAME, "brokerId": 1,
            "brokerAddress": "127.0.0.1:1", "invokeTime": millis()})
        assert (reply.code, reply.remark, reply.ext_fields) == (
            CONTROLLER_NOT_LEADER, "The controller is not in leader state", {})
        # A heartbeat is every controller's own business: a follower takes it.
        reply = await call(client, RequestCode.BROKER_HEARTBEAT, {
            "clusterName": CLUSTER, "brokerName": BROKER_NAME, "brokerAddr": "127.0.0.1:1",
            "brokerId": 1, "heartbeatTimeoutMills": HEARTBEAT_TIMEOUT_MS})
        assert (reply.code, reply.remark, reply.ext_fields) == (
            SUCCESS, "Heart beat success", {})


def test_three_controllers_name_a_new_leader_when_the_leader_is_killed(rocketmq5, tmp_path):
    ports = [free_broker_port() for _ in range(3)]
    addresses = [f"127.0.0.1:{port}" for port in ports]
    peers = "".join(f"n{i}:{address};" for i, address in enumerate(addresses))
    began = time.monotonic()
    controllers = rocketmq5.start_controllers(tmp_path, ports)
    try:
        booted = elapsed_since(began)
        leader = controller_leader(addresses, timeout=60)
        print(f"three controllers: boot lines after {booted}, "
              f"leader after {elapsed_since(began)}")
        killed = time.monotonic()
        controllers[addresses.index(leader)].kill()
        survivors = [address for address in addresses if address != leader]
        new_leader = controller_leader(survivors, timeout=60)
        print(f"three controllers: new leader {elapsed_since(killed)} after the SIGKILL")
        [follower] = [address for address in survivors if address != new_leader]
        trio.run(follower_answers, follower, new_leader, f"n{addresses.index(new_leader)}",
                 peers)
    finally:
        for controller in controllers:
            controller.kill()


# ---- two real brokers -------------------------------------------------------------------------


async def _replica_info_at(controller: str) -> RemotingCommand:
    async with open_remoting_client(controller) as client:
        return await replica_info(client)


def master_of(controller: str) -> tuple[str | None, list[int]]:
    """The broker set's master address (None: none) and SyncStateSet, by GET_REPLICA_INFO."""
    reply = trio.run(_replica_info_at, controller)
    if reply.code != SUCCESS:
        return None, []
    return reply.ext_fields.get("masterAddress"), sorted(parsed(reply)["syncStateSet"])


def wait_for_master(controller: str, address: str, members: int, timeout: float) -> None:
    """Until ``address`` is master with ``members`` brokers in its SyncStateSet."""
    deadline = time.monotonic() + timeout
    while True:  # bounded by the deadline
        master, in_sync = master_of(controller)
        if master == address and len(in_sync) == members:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{address} not master of {members} within {timeout:g} s: "
                        f"master {master}, SyncStateSet {in_sync}")
        time.sleep(0.2)


def sync_state_set(rocketmq5, run_dir, controller: str) -> dict[str, str]:
    """mqadmin getSyncStateSet's ``#key\\tvalue`` lines."""
    out = rocketmq5.mqadmin(run_dir, "getSyncStateSet", "-a", controller, "-b", BROKER_NAME)
    return dict(line[1:].split("\t", 1) for line in out.splitlines()
                if line.startswith("#") and "\t" in line)


def test_two_real_brokers_fail_over_under_the_real_controller(rocketmq5, tmp_path):
    ns_port, ctl_port, a_port, b_port = (free_broker_port() for _ in range(4))
    namesrv_addr, controller = f"127.0.0.1:{ns_port}", f"127.0.0.1:{ctl_port}"
    a_addr, b_addr = f"127.0.0.1:{a_port}", f"127.0.0.1:{b_port}"
    processes = []

    def broker(name: str, port: int):
        began = time.monotonic()
        process = rocketmq5.start_broker(tmp_path / name, {
            "brokerClusterName": CLUSTER, "brokerName": BROKER_NAME, "listenPort": port,
            "namesrvAddr": namesrv_addr, "enableControllerMode": True,
            "controllerAddr": controller, "haSendHeartbeatInterval": 1000,
            "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE, "maxHashSlotNum": 1000,
            "maxIndexNum": 4000}, name=name)
        processes.append(process)
        print(f"real brokers: {name} boot line after {elapsed_since(began)}")
        return process

    try:
        processes.append(rocketmq5.start_namesrv(tmp_path / "ns", ns_port))
        processes.append(rocketmq5.start_controller(tmp_path / "ctl", ctl_port))
        controller_leader([controller])
        began = time.monotonic()
        first = broker("a", a_port)
        wait_for_master(controller, a_addr, 1, 60)
        print(f"real brokers: a master {elapsed_since(began)} after it was started")
        began = time.monotonic()
        broker("b", b_port)
        wait_for_master(controller, a_addr, 2, 90)
        print(f"real brokers: b in the SyncStateSet {elapsed_since(began)} after it was started")
        shown = sync_state_set(rocketmq5, tmp_path / "adm1", controller)
        assert (shown["brokerName"], shown["MasterBrokerId"], shown["MasterAddr"],
                shown["SyncStateSetNums"]) == (BROKER_NAME, "1", a_addr, "2"), shown

        out = rocketmq5.run_program(tmp_path / "producer1", CLIENT, "produce", "--namesrv",
                                    namesrv_addr, "--topic", "CtlT", "--count", 10)
        assert program_lines(out)[-1] == {"done": True, "count": 10, "errors": 0}, out[-3000:]

        killed = time.monotonic()
        first.kill()
        wait_for_master(controller, b_addr, 1, 60)
        print(f"real brokers: b master {elapsed_since(killed)} after a's SIGKILL")
        shown = sync_state_set(rocketmq5, tmp_path / "adm2", controller)
        assert (shown["MasterBrokerId"], shown["MasterAddr"], shown["MasterEpoch"],
                shown["SyncStateSetNums"]) == ("2", b_addr, "2", "1"), shown
        # A new producer (a fresh route) sends to the new master.
        out = rocketmq5.run_program(tmp_path / "producer2", CLIENT, "produce", "--namesrv",
                                    namesrv_addr, "--topic", "CtlT", "--count", 10)
        lines = program_lines(out)
        assert lines[-1] == {"done": True, "count": 10, "errors": 0}, out[-3000:]
        assert {line.get("brokerName") for line in lines[:-1]} == {BROKER_NAME}, lines
        print(f"real brokers: 10 sends answered {elapsed_since(killed)} after a's SIGKILL")
    finally:
        for process in reversed(processes):
            process.kill()
