"""Issue 39: ACL on the controller (``aclEnable`` in controller.conf, or the name server's
setting for an embedded controller). The admin verbs and the brokers' own verbs need the
signature of an admin account of plain_acl.yml; unsigned, wrongly signed or non-admin
requests are answered NO_PERMISSION and change nothing (a refused heartbeat is dropped);
reads stay open. Our brokers in controller mode sign with innerClientAuthenticationCredentials
and fail over as without ACL; real mqadmin (5.3.3) signs with conf/tools.yml."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from conftest import wait_until
from test_controller_bad_input import A1, A2, CLUSTER, NAME, Seen, call, seen
from test_interop_controller_brokers import (
    BROKER_NAME,
    broker_spec,
    send_some,
    wait_master,
)
from test_interop_controller_brokers import CLUSTER as BROKERS_CLUSTER
from trio_ha.acl import AclConfigError
from trio_ha.controller.config import ControllerServerConfig, StoreType
from trio_ha.controller.liveness import BrokerIdentity
from trio_ha.controller.server import ACL_CHECKED_CODES
from trio_ha.namesrv.server import NamesrvConfig
from trio_ha.remoting import RemotingClient, open_remoting_client
from trio_ha.testing import RunningController, free_broker_port, open_controller
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.processes import NodeProcess, child_env
from trio_ha.wire.acl import ACCESS_KEY, SIGNATURE, Credentials, request_signature
from trio_ha.wire.controller import BrokerReplicasInfo, SyncStateSet, encode_broker_names
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

ADMIN = Credentials("rocketmq2", "12345678")
READER = Credentials("reader01", "reader-secret")
WRONG = Credentials("rocketmq2", "not-the-secret")
STRANGER = Credentials("nobody00", "12345678")

ACL_YAML = textwrap.dedent("""\
    accounts:
      - accessKey: rocketmq2
        secretKey: 12345678
        admin: true
      - accessKey: reader01
        secretKey: reader-secret
        admin: false
        defaultTopicPerm: PUB|SUB
        defaultGroupPerm: SUB
    """)


def acl_file(tmp_path: Path) -> str:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    return str(path)


def acl_config(tmp_path: Path) -> ControllerServerConfig:
    return ControllerServerConfig(listen_port=0, bind_address="127.0.0.1",
                                  store_type=StoreType.MEMORY, acl_enable=True,
                                  plain_acl_file=acl_file(tmp_path))


@contextlib.asynccontextmanager
async def clients(ctl: RunningController) -> AsyncIterator[dict[str, RemotingClient]]:
    """A connection per way of signing: admin, reader, wrong secret, unknown key, unsigned."""
    accounts = {"admin": ADMIN, "reader": READER, "wrong": WRONG, "stranger": STRANGER,
                "unsigned": None}
    async with contextlib.AsyncExitStack() as stack:
        yield {name: await stack.enter_async_context(
            open_remoting_client(ctl.address, credentials=credentials))
            for name, credentials in accounts.items()}


def requests() -> list[RemotingCommand]:
    """One request of every checked code, each one that would change something if allowed."""
    def request(code: int, fields: dict | None = None, body: bytes = b"") -> RemotingCommand:
        return RemotingCommand.request(code, fields, body)

    return [
        request(RequestCode.CONTROLLER_APPLY_BROKER_ID, {
            "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": 3,
            "registerCheckCode": "127.0.0.1:10003;1"}),
        request(RequestCode.CONTROLLER_REGISTER_BROKER, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerId": 2,
            "brokerAddress": "127.0.0.1:6666"}),
        request(RequestCode.CONTROLLER_ELECT_MASTER, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerId": 2,
            "designateElect": "true"}),
        request(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
            "brokerName": NAME, "masterBrokerId": 1, "masterEpoch": 1},
            SyncStateSet(frozenset({1}), 2).encode()),
        request(RequestCode.CLEAN_BROKER_DATA, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerControllerIdsToClean": "2",
            "isCleanLivingBroker": "true"}),
        request(RequestCode.UPDATE_CONTROLLER_CONFIG, body=b"electMasterMaxRetryCount=9"),
        request(RequestCode.GET_CONTROLLER_CONFIG),
        request(RequestCode.BROKER_HEARTBEAT, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerAddr": A2, "brokerId": 2,
            "heartbeatTimeoutMills": 60_000}),
    ]


async def admin_set(ctl: RunningController, admin: RemotingClient, b1: RemotingClient,
                    b2: RemotingClient) -> None:
    """Brokers 1 and 2 of NAME joined and heartbeating (signed), 1 master, both in sync."""
    for client, broker_id, address in ((b1, 1, A1), (b2, 2, A2)):
        applied = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
            "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": broker_id,
            "registerCheckCode": f"{address};1"})
        assert applied.code == ResponseCode.SUCCESS, applied
        registered = await call(client, RequestCode.CONTROLLER_REGISTER_BROKER, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerId": broker_id,
            "brokerAddress": address})
        assert registered.code == ResponseCode.SUCCESS, registered
        await client.invoke_oneway(RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerAddr": address,
            "brokerId": broker_id, "heartbeatTimeoutMills": 60_000}, oneway=True))
    await wait_until(lambda: ctl.service.live.is_alive(
        BrokerIdentity(CLUSTER, NAME, 2), trio.current_time()), "broker 2 heard")
    elected = await call(b1, RequestCode.CONTROLLER_ELECT_MASTER, {
        "clusterName": CLUSTER, "brokerName": NAME, "brokerId": 1, "designateElect": False})
    assert elected.code == ResponseCode.SUCCESS, elected
    grown = await call(b1, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
        "brokerName": NAME, "masterBrokerId": 1, "masterEpoch": 1},
        SyncStateSet(frozenset({1, 2}), 1).encode())
    assert grown.code == ResponseCode.SUCCESS, grown


IN_SYNC = Seen(1, 1, frozenset({1, 2}), 2, ((1, A1), (2, A2)))


async def test_signed_admin_works_and_everything_else_is_refused_changing_nothing(tmp_path):
    async with open_controller(acl_config(tmp_path)) as ctl, clients(ctl) as by, \
            open_remoting_client(ctl.address, credentials=ADMIN) as b1, \
            open_remoting_client(ctl.address, credentials=ADMIN) as b2:
        assert {r.code for r in requests()} == ACL_CHECKED_CODES
        await admin_set(ctl, by["admin"], b1, b2)
        assert await seen(by["unsigned"]) == IN_SYNC  # reads are open
        commits = ctl.service.statistics().commits
        live = {i: ctl.service.live.get(BrokerIdentity(CLUSTER, NAME, i)) for i in (1, 2)}
        for who in ("unsigned", "wrong", "stranger", "reader"):
            for request in requests():
                if request.code == RequestCode.BROKER_HEARTBEAT:
                    await by[who].invoke_oneway(RemotingCommand.request(
                        request.code, request.ext_fields, oneway=True))
                    continue
                reply = await by[who].invoke(request, 5)
                assert reply.code == ResponseCode.NO_PERMISSION, (who, request.code, reply)
                assert reply.remark
        # the refused heartbeats were dropped (broker 2's entry is still its own connection's)
        await call(by["admin"], RequestCode.CONTROLLER_GET_METADATA_INFO)
        assert {i: ctl.service.live.get(BrokerIdentity(CLUSTER, NAME, i))
                for i in (1, 2)} == live
        assert ctl.service.statistics().commits == commits
        assert ctl.service.config.elect_master_max_retry_count == 3
        assert await seen(by["unsigned"]) == IN_SYNC
        assert ctl.service.state.sets[NAME].record.next_broker_id == 3
        # the open reads, for every account and none
        for who, client in by.items():
            for code, fields, body in (
                    (RequestCode.CONTROLLER_GET_METADATA_INFO, None, b""),
                    (RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": NAME}, b""),
                    (RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, None,
                     encode_broker_names([NAME])),
                    (RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                     {"clusterName": CLUSTER, "brokerName": NAME}, b"")):
                reply = await call(client, code, fields, body)
                assert reply.code == ResponseCode.SUCCESS, (who, code, reply)
        # the admin account's admin verbs are served
        shown = await call(by["admin"], RequestCode.GET_CONTROLLER_CONFIG)
        assert shown.code == ResponseCode.SUCCESS
        assert "aclEnable=true" in shown.body.decode()
        updated = await call(by["admin"], RequestCode.UPDATE_CONTROLLER_CONFIG,
                             body=b"electMasterMaxRetryCount=4")
        assert updated.code == ResponseCode.SUCCESS, updated
        assert ctl.service.config.elect_master_max_retry_count == 4
        # ACL cannot be turned off over the wire (configBlackList)
        off = await call(by["admin"], RequestCode.UPDATE_CONTROLLER_CONFIG,
                         body=b"aclEnable=false")
        assert off.code == ResponseCode.NO_PERMISSION, off
        switched = await call(by["admin"], RequestCode.CONTROLLER_ELECT_MASTER, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerId": 2,
            "designateElect": True})
        assert switched.code == ResponseCode.SUCCESS, switched
        assert (await seen(by["unsigned"])).master == 2


async def test_the_acl_settings_are_read_and_a_missing_file_stops_the_start(tmp_path):
    path = acl_file(tmp_path)
    config = ControllerServerConfig.from_properties({"aclEnable": "true", "plainAclFile": path})
    assert (config.acl_enable, config.plain_acl_file) == (True, path)
    assert config.to_properties()["aclEnable"] == "true"
    # embedded: the name server's own setting
    namesrv = NamesrvConfig.from_properties({
        "aclEnable": "true", "plainAclFile": path, "enableControllerInNamesrv": "true",
        "controllerType": "memory"})
    assert namesrv.controller is not None and namesrv.controller.acl_enable
    assert namesrv.controller.plain_acl_file == path
    missing = ControllerServerConfig(listen_port=0, bind_address="127.0.0.1",
                                     store_type=StoreType.MEMORY, acl_enable=True,
                                     plain_acl_file=str(tmp_path / "absent.yml"))
    refused: list[str] = []
    try:
        async with open_controller(missing):
            pytest.fail("served without its ACL file")
    except* AclConfigError as group:
        refused = [str(exc) for exc in group.exceptions]
    assert len(refused) == 1 and "absent.yml" in refused[0], refused


def start_acl_controller_and_namesrv(tmp_path: Path, logs: str, nodes: list[NodeProcess]
                                     ) -> tuple[NodeProcess, NodeProcess]:
    """An ACL controller (memory store) and a name server as processes, added to ``nodes``
    (which the caller stops)."""
    ctl = NodeProcess.start("ctl", {"kind": "controller", "log_level": "INFO", "properties": {
        "controllerType": "memory", "listenPort": str(free_broker_port()),
        "aclEnable": "true", "plainAclFile": acl_file(tmp_path)}}, log_dir=logs)
    nodes.append(ctl)
    namesrv = NodeProcess.start("ns", {"kind": "namesrv", "port": free_broker_port()},
                                log_dir=logs)
    nodes.append(namesrv)
    return ctl, namesrv


def test_our_brokers_sign_and_fail_over_under_an_acl_controller(tmp_path):
    """A controller process with aclEnable and two of our brokers signing with
    innerClientAuthenticationCredentials (an admin account): the first is master, the
    second joins its in-sync set; the master is SIGKILLed and the second is elected (its
    signed heartbeats made it alive). A third broker without credentials is refused: its set
    never lists it."""
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    ports = [free_broker_port() for _ in range(3)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    nodes: list[NodeProcess] = []
    try:
        ctl, namesrv = start_acl_controller_and_namesrv(tmp_path, logs, nodes)
        credentials = json.dumps({"accessKey": ADMIN.access_key,
                                  "secretKey": ADMIN.secret_key})

        def start(i: int, signed: bool = True) -> NodeProcess:
            spec = broker_spec(str(tmp_path / f"b{i}"), ports[i], namesrv.addr, ctl.addr)
            if signed:
                spec["properties"]["innerClientAuthenticationCredentials"] = credentials
            node = NodeProcess.start(f"b{i}", spec, log_dir=logs)
            nodes.append(node)
            return node

        master = start(0)
        assert trio.run(wait_master, ctl.addr, addrs[0], 1, 30.0) == 1
        start(2, signed=False)
        start(1)
        trio.run(send_some, namesrv.addr, 5, "acl")
        trio.run(wait_master, ctl.addr, addrs[0], 2, 30.0)
        master.kill()
        assert trio.run(wait_master, ctl.addr, addrs[1], 1, 30.0) == 2

        async def members() -> set[str]:
            async with open_remoting_client(ctl.addr) as client:
                reply = await call(client, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
                                   body=encode_broker_names([BROKER_NAME]))
            info = BrokerReplicasInfo.decode(reply.body).replicas_info_table[BROKER_NAME]
            return {r.broker_address for r in (*info.in_sync_replicas,
                                               *info.not_in_sync_replicas)}

        assert trio.run(members) == {addrs[0], addrs[1]}
    finally:
        for node in reversed(nodes):
            node.kill()


@pytest.mark.interop
def test_real_mqadmin_signs_with_tools_yml_against_an_acl_controller(rocketmq5, tmp_path):
    """mqadmin 5.3.3's electMaster: with conf/tools.yml naming the admin account it switches
    the master; without it (unsigned) the controller refuses and nothing changes.
    getSyncStateSet (a read) works either way."""
    home = tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "tools.yml").write_text(
        f"accessKey: {ADMIN.access_key}\nsecretKey: {ADMIN.secret_key}\n")

    async def main() -> None:
        async with open_controller(acl_config(tmp_path)) as ctl, \
                open_remoting_client(ctl.address, credentials=ADMIN) as admin, \
                open_remoting_client(ctl.address, credentials=ADMIN) as b1, \
                open_remoting_client(ctl.address, credentials=ADMIN) as b2:
            await admin_set(ctl, admin, b1, b2)

            def mqadmin(run: str, *args: object, **kwargs: object) -> str:
                return rocketmq5.mqadmin(tmp_path / run, *args, **kwargs)

            shown = await trio.to_thread.run_sync(
                lambda: mqadmin("read", "getSyncStateSet", "-a", ctl.address, "-b", NAME))
            assert A1 in shown, shown
            elect_args = ("electMaster", "-a", ctl.address, "-c", CLUSTER, "-bn", NAME,
                          "-b", 2)
            out = await trio.to_thread.run_sync(
                lambda: mqadmin("unsigned", *elect_args, check=False))
            assert await seen(admin) == IN_SYNC, out
            out = await trio.to_thread.run_sync(
                lambda: mqadmin("signed", *elect_args, home=home))
            assert (await seen(admin)).master == 2, out

    trio.run(main)


async def test_trio_ha_admin_controller_verbs_sign_with_the_global_account(tmp_path):
    """``trio-ha admin elect-master`` (mqadmin's electMaster) against an ACL controller:
    refused without ``--access-key``/``--secret-key`` (exit 1, the code named, nothing
    changed), served with them; ``sync-state-set`` (a read) needs no account."""
    async with open_controller(acl_config(tmp_path)) as ctl, \
            open_remoting_client(ctl.address, credentials=ADMIN) as admin, \
            open_remoting_client(ctl.address, credentials=ADMIN) as b1, \
            open_remoting_client(ctl.address, credentials=ADMIN) as b2:
        await admin_set(ctl, admin, b1, b2)

        async def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
            return await trio.run_process(
                [sys.executable, "-m", "trio_ha.cli", *args], capture_stdout=True,
                capture_stderr=True, check=False, env=child_env())

        elect = ("admin", "elect-master", "-a", ctl.address, "-c", CLUSTER, "-bn", NAME,
                 "-b", "2")
        refused = await cli(*elect)
        assert refused.returncode == 1, refused
        assert b"NO_PERMISSION" in refused.stderr, refused.stderr
        assert await seen(admin) == IN_SYNC
        shown = await cli("admin", "sync-state-set", "-a", ctl.address, "-b", NAME, "--json")
        assert shown.returncode == 0, shown
        rows = json.loads(shown.stdout)
        assert {(r["brokerId"], r["master"]) for r in rows} == {(1, True), (2, False)}
        signed = await cli("--access-key", ADMIN.access_key, "--secret-key", ADMIN.secret_key,
                           *elect)
        assert signed.returncode == 0, signed
        assert (await seen(admin)).master == 2
        config = await cli("--access-key", ADMIN.access_key, "--secret-key",
                           ADMIN.secret_key, "admin", "controller-config", "-a", ctl.address,
                           "--json")
        assert config.returncode == 0, config
        assert {"key": "aclEnable", "value": "true"} in json.loads(config.stdout)
        meta = await cli("admin", "controller-metadata", "-a", ctl.address, "--json")
        assert meta.returncode == 0, meta  # (a read: no account)
        assert {"key": "controllerLeaderAddress", "value": ctl.address} in json.loads(
            meta.stdout)


@pytest.mark.interop
def test_real_5_3_3_brokers_sign_their_requests_to_an_acl_controller(rocketmq5, tmp_path):
    """RocketMQ 5.3.3 brokers under our controller with aclEnable: one with
    innerClientAuthenticationCredentials (its BrokerOuterAPI signs every request, heartbeats
    included, without our seal) registers and is elected master; one without is refused at
    APPLY_BROKER_ID and never joins the set."""
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    ports = [free_broker_port() for _ in range(2)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    nodes: list[NodeProcess] = []
    java = []
    try:
        ctl, namesrv = start_acl_controller_and_namesrv(tmp_path, logs, nodes)

        def broker(i: int, signed: bool) -> None:
            properties: dict[str, object] = {
                "brokerClusterName": BROKERS_CLUSTER, "brokerName": BROKER_NAME,
                "listenPort": ports[i], "namesrvAddr": namesrv.addr,
                "enableControllerMode": True, "controllerAddr": ctl.addr,
                "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE, "maxHashSlotNum": 1000,
                "maxIndexNum": 4000}
            if signed:
                properties["innerClientAuthenticationCredentials"] = json.dumps(
                    {"accessKey": ADMIN.access_key, "secretKey": ADMIN.secret_key},
                    separators=(",", ":"))
                # 5.3.3 also makes the account a user of its own auth 2.0 store at start
                # (AuthenticationMetadataManagerImpl.initUser): it needs one; its own
                # authentication stays off
                properties["authenticationMetadataProvider"] = (
                    "org.apache.rocketmq.auth.authentication.provider."
                    "LocalAuthenticationMetadataProvider")
                properties["authorizationMetadataProvider"] = (
                    "org.apache.rocketmq.auth.authorization.provider."
                    "LocalAuthorizationMetadataProvider")
            java.append(rocketmq5.start_broker(tmp_path / f"b{i}", properties, name=f"b{i}"))

        broker(0, signed=True)
        assert trio.run(wait_master, ctl.addr, addrs[0], 1, 60.0) == 1

        async def members() -> set[str]:
            async with open_remoting_client(ctl.addr) as client:
                reply = await call(client, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
                                   body=encode_broker_names([BROKER_NAME]))
            info = BrokerReplicasInfo.decode(reply.body).replicas_info_table[BROKER_NAME]
            return {r.broker_address for r in (*info.in_sync_replicas,
                                               *info.not_in_sync_replicas)}

        broker(1, signed=False)

        def refused_apply() -> bool:
            with open(ctl.log_path, encoding="utf-8", errors="replace") as log:
                return "ACL refused request code 1013" in log.read()

        # its start-up (metadata, next id, then APPLY_BROKER_ID: refused)
        deadline = time.monotonic() + 60
        while not refused_apply() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert refused_apply(), "the unsigned broker's APPLY_BROKER_ID was not refused"
        assert trio.run(members) == {addrs[0]}
    finally:
        for process in java:
            process.kill()
        for node in reversed(nodes):
            node.kill()


def unsealed(code: int, fields: dict[str, str], credentials: Credentials,
             body: bytes = b"") -> RemotingCommand:
    """Signed as RocketMQ's AclClientRPCHook signs (mqadmin, a Java broker): no seal."""
    signed = {**fields, ACCESS_KEY: credentials.access_key}
    signed[SIGNATURE] = request_signature(signed, body, credentials.secret_key)
    return RemotingCommand.request(code, signed, body)


async def test_unsealed_admin_verbs_must_have_mqadmins_shape(tmp_path):
    """A signature covers the values, not the request code: a captured request of the same
    values could be sent again as CLEAN_BROKER_DATA or ELECT_MASTER. Unsealed (RocketMQ's
    signers), those verbs are taken only in the shape mqadmin and the brokers send."""
    async with open_controller(acl_config(tmp_path)) as ctl, \
            open_remoting_client(ctl.address, credentials=ADMIN) as admin, \
            open_remoting_client(ctl.address, credentials=ADMIN) as b1, \
            open_remoting_client(ctl.address, credentials=ADMIN) as b2, \
            open_remoting_client(ctl.address) as raw:
        await admin_set(ctl, admin, b1, b2)
        # a REGISTER_BROKER of broker 2, its values re-keyed as a CLEAN_BROKER_DATA: the
        # clean carries fields it never has, and is refused
        spliced = unsealed(RequestCode.CLEAN_BROKER_DATA, {
            "brokerName": NAME, "clusterName": CLUSTER, "brokerAddress": A2,
            "brokerId": "2", "isCleanLivingBroker": "true"}, ADMIN)
        refused = await raw.invoke(spliced, 5)
        assert refused.code == ResponseCode.NO_PERMISSION, refused
        assert "a replayed signature?" in (refused.remark or "")
        junk = unsealed(RequestCode.CONTROLLER_ELECT_MASTER, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerId": "2",
            "designateElect": "yes"}, ADMIN)
        assert (await raw.invoke(junk, 5)).code == ResponseCode.NO_PERMISSION
        with_body = unsealed(RequestCode.CONTROLLER_ELECT_MASTER, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerId": "2",
            "designateElect": "true"}, ADMIN, body=b"x")
        assert (await raw.invoke(with_body, 5)).code == ResponseCode.NO_PERMISSION
        assert await seen(raw) == IN_SYNC
        # mqadmin's own electMaster, unsealed, is served
        shaped = unsealed(RequestCode.CONTROLLER_ELECT_MASTER, {
            "clusterName": CLUSTER, "brokerName": NAME, "brokerId": "2",
            "designateElect": "true", "invokeTime": "1700000000000"}, ADMIN)
        served = await raw.invoke(shaped, 5)
        assert served.code == ResponseCode.SUCCESS, served
        assert (await seen(raw)).master == 2
