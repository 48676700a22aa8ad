"""Issue 38: the name server fences stale masters by data version, as RocketMQ 5 does (#6316,
``RouteInfoManager.registerBroker`` in 5.3.3), beside our refusal of a second classic master
(tests/test_second_master.py, tests/test_namesrv_admin.py).

A controller-mode broker registers with its master epoch as ``DataVersion.stateVersion``.
A registration for an id that a different live address holds with a greater stateVersion is
ignored (answered SUCCESS naming no master); a greater one takes the id; an equal one for id
0 is our classic refusal. The route table alone where it can be, and once over sockets.
"""

from typing import Any

import pytest

from trio_ha import _backend
from trio_ha.namesrv import MasterConflict, NamesrvConfig, RouteInfoManager, serve_namesrv
from trio_ha.remoting import open_remoting_client
from trio_ha.wire.metadata import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import RegisterBrokerBody, TopicRouteData


def topics(*names: str, epoch: int, counter: int = 1) -> TopicConfigSerializeWrapper:
    """A topic table whose data version carries ``epoch`` as its stateVersion."""
    return TopicConfigSerializeWrapper({n: TopicConfig(n, 4, 4) for n in names},
                                       DataVersion(counter, 1000 + counter, epoch))


class Table:
    """One broker name's registrations on a route table, at a time the test moves."""

    def __init__(self, expiry: float = 120.0) -> None:
        self.routes = RouteInfoManager(broker_expiry=expiry)
        self.now = 0.0

    def register(self, addr: str, broker_id: int, epoch: int, *names: str, ha: str | None = None,
                 **extra: Any):
        return self.routes.register_broker(
            cluster="c", broker_addr=addr, broker_name="b", broker_id=broker_id,
            ha_server_addr=ha or f"{addr}-ha", topics=topics(*(names or ("T",)), epoch=epoch),
            connection=None, now=self.now, **extra)

    @property
    def addrs(self) -> dict[int, str]:
        return dict(self.routes.broker_addr_table["b"][1])

    def route_addrs(self, topic: str = "T") -> dict[int, str]:
        route = self.routes.pick_route(topic)
        assert route is not None, f"no route of {topic}"
        (data,) = route.broker_datas
        return data.broker_addrs


def test_a_stale_master_cannot_take_id_0_back_after_a_failover():
    table = Table()
    table.register("a:1", 0, 1)
    table.register("b:1", 2, 1)  # the slave, controller id 2
    assert table.addrs == {0: "a:1", 2: "b:1"}

    # The controller elects b (epoch 2) while a still holds its connection (SIGSTOPped).
    table.now = 10.0
    promoted = table.register("b:1", 0, 2)
    assert promoted.fenced_by is None
    assert table.addrs == {0: "b:1"}  # <2,b> became <0,b>
    assert table.route_addrs() == {0: "b:1"}

    # a wakes up and registers as the master of epoch 1: ignored, as RocketMQ 5 does.
    table.now = 20.0
    stale = table.register("a:1", 0, 1, "T", "OnlyOnA")
    assert stale.fenced_by == "b:1"
    assert (stale.master_addr, stale.ha_server_addr) == (None, None)
    assert table.addrs == {0: "b:1"} and table.route_addrs() == {0: "b:1"}
    assert "a:1" not in table.routes.broker_live_table  # dropped, as RocketMQ drops it
    assert table.routes.pick_route("OnlyOnA") is None  # its topics made no route
    assert table.routes.data_version("b:1") == DataVersion(1, 1001, 2)

    # Demoted by the controller, a registers as a slave of epoch 2 and is told its master.
    table.now = 30.0
    slave = table.register("a:1", 3, 2)
    assert slave.fenced_by is None
    assert (slave.master_addr, slave.ha_server_addr) == ("b:1", "b:1-ha")
    assert table.addrs == {0: "b:1", 3: "a:1"}


def test_an_ignored_registration_loses_its_other_ids_first_as_in_rocketmq():
    """RocketMQ removes <otherId, sameAddr> before its version check, so a stale
    registration for id 0 from a listed slave takes the slave out of the routes too."""
    table = Table()
    table.register("b:1", 0, 3)
    table.register("a:1", 1, 3)
    ignored = table.register("a:1", 0, 2)
    assert ignored.fenced_by == "b:1"
    assert table.addrs == {0: "b:1"}
    assert "a:1" not in table.routes.broker_live_table


def test_every_broker_id_is_fenced_by_version_as_in_rocketmq():
    table = Table()
    table.register("m:1", 0, 4)
    table.register("s1:1", 1, 4)
    late = table.register("s2:1", 1, 3)  # an older epoch's claim on id 1
    assert late.fenced_by == "s1:1"
    assert table.addrs == {0: "m:1", 1: "s1:1"}
    newer = table.register("s2:1", 1, 5)  # a newer one takes it (a slave needs no refusal)
    assert newer.fenced_by is None and newer.master_addr == "m:1"
    assert table.addrs == {0: "m:1", 1: "s2:1"}


@pytest.mark.parametrize("epoch", [0, 7])
def test_the_same_state_version_keeps_the_classic_refusal_of_a_second_master(epoch):
    """stateVersion 0 is every classic broker; two controller-mode masters of one epoch are
    refused alike, and nothing of the refused one is recorded."""
    table = Table()
    table.register("m1:1", 0, epoch)
    table.register("s:1", 1, epoch)
    table.now = 100.0
    with pytest.raises(MasterConflict) as caught:
        table.register("m2:1", 0, epoch, "X")
    assert caught.value.live_master == "m1:1"
    assert table.addrs == {0: "m1:1", 1: "s:1"}
    assert "m2:1" not in table.routes.broker_live_table
    assert table.routes.pick_route("X") is None


def test_a_master_past_the_expiry_fences_nothing_and_is_not_named_to_slaves():
    table = Table(expiry=120.0)
    table.register("old:1", 0, 9)
    table.now = 121.0  # silent past the expiry, not yet swept
    slave = table.register("s:1", 1, 9)
    assert (slave.master_addr, slave.ha_server_addr) == (None, None)  # not a live master
    taken = table.register("new:1", 0, 1)  # a lower epoch, but the holder is gone
    assert taken.fenced_by is None
    assert table.addrs == {0: "new:1", 1: "s:1"}
    assert "old:1" not in table.routes.broker_live_table
    slave = table.register("s:1", 1, 9)
    assert (slave.master_addr, slave.ha_server_addr) == ("new:1", "new:1-ha")


def test_the_displaced_master_leaves_the_route_alone_when_it_disconnects():
    """The master of an older epoch stays in the live table (as in RocketMQ) without an
    entry; its connection closing or its expiry must not take the new master's id."""
    routes = RouteInfoManager(broker_expiry=120.0)
    # the table compares connections by identity only
    old_conn: Any = object()
    new_conn: Any = object()

    def register(addr: str, epoch: int, connection: Any, now: float):
        return routes.register_broker(
            cluster="c", broker_addr=addr, broker_name="b", broker_id=0,
            ha_server_addr=f"{addr}-ha", topics=topics("T", epoch=epoch), now=now,
            connection=connection)

    register("a:1", 1, old_conn, 0.0)
    register("b:1", 2, new_conn, 5.0)
    assert "a:1" in routes.broker_live_table
    assert routes.connection_closed(old_conn) == ["a:1"]
    assert routes.cluster_info().broker_addr_table["b"].broker_addrs == {0: "b:1"}
    route = routes.pick_route("T")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: "b:1"}


# ---- over sockets --------------------------------------------------------------------------


def register_request(addr: str, broker_id: int, epoch: int, *, compressed: bool = False
                     ) -> RemotingCommand:
    body = RegisterBrokerBody(topics("Fenced", epoch=epoch)).encode(compressed=compressed)
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
        "brokerName": "broker-a", "brokerAddr": addr, "clusterName": "DefaultCluster",
        "haServerAddr": addr.replace(":10911", ":10912"), "brokerId": broker_id,
        "compressed": compressed, "bodyCrc32": _backend.engine.crc32(body),
    }, body=body)


async def test_a_stale_master_is_answered_success_naming_no_master_over_sockets(nursery):
    _, port = await nursery.start(serve_namesrv, NamesrvConfig(
        listen_port=0, bind_address="127.0.0.1", kv_config_path=None))
    namesrv = f"127.0.0.1:{port}"
    old, new = "10.0.0.1:10911", "10.0.0.2:10911"
    async with open_remoting_client(namesrv) as old_master, \
            open_remoting_client(namesrv) as new_master, \
            open_remoting_client(namesrv) as other:
        first = await old_master.invoke(register_request(old, 0, 1), 5)
        assert first.code == ResponseCode.SUCCESS, first.remark
        # The promoted slave, as slave then master of epoch 2 (RocketMQ 5 brokers may send the
        # compressed body: the stateVersion is read from both forms).
        as_slave = await new_master.invoke(register_request(new, 2, 1), 5)
        assert as_slave.ext_fields.get("masterAddr") == old
        assert as_slave.ext_fields.get("haServerAddr") == "10.0.0.1:10912"
        promoted = await new_master.invoke(register_request(new, 0, 2, compressed=True), 5)
        assert promoted.code == ResponseCode.SUCCESS, promoted.remark

        stale = await old_master.invoke(register_request(old, 0, 1), 5)
        assert stale.code == ResponseCode.SUCCESS, stale.remark
        assert "masterAddr" not in stale.ext_fields and "haServerAddr" not in stale.ext_fields

        route = await other.invoke(RemotingCommand.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Fenced"}), 5)
        assert route.code == ResponseCode.SUCCESS, route.remark
        (data,) = TopicRouteData.decode(route.body).broker_datas
        assert data.broker_addrs == {0: new}

        # The old master, demoted, registers as a slave of epoch 2: told the live master.
        demoted = await old_master.invoke(register_request(old, 1, 2), 5)
        assert demoted.code == ResponseCode.SUCCESS, demoted.remark
        assert demoted.ext_fields.get("masterAddr") == new
        assert demoted.ext_fields.get("haServerAddr") == "10.0.0.2:10912"
        # and the classic rule still stands for an equal epoch
        rival = await other.invoke(register_request("10.0.0.3:10911", 0, 2), 5)
        assert rival.code == ResponseCode.NO_PERMISSION
        assert rival.ext_fields.get("masterAddr") == new
