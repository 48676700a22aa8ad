"""Issue 15, part 1: RocketMQ 4.9's plain ACL — the signature, plain_acl.yml, the check of
every request in RocketMQ's order, and a broker with ``aclEnable=true`` serving our client.
The real Java client with its AclClientRPCHook is in test_interop_java_client.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import textwrap

import attrs
import pytest

from conftest import wait_until
from trio_ha.acl import AclConfigError, AclFile, AddressPattern, PlainAcl
from trio_ha.client import (
    Credentials,
    Message,
    MQBrokerError,
    open_admin,
    open_client_instance,
    open_producer,
    open_pull_consumer,
)
from trio_ha.testing import ClusterConfig, open_cluster
from trio_ha.wire.acl import request_content, sign, signature
from trio_ha.wire.heartbeat import ConsumerData, HeartbeatData, SubscriptionData
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

ADMIN = Credentials("rocketmq2", "12345678")
APP = Credentials("RocketMQ", "12345678")

ACL_YAML = textwrap.dedent("""\
    globalWhiteRemoteAddresses:
      - 10.10.103.*
      - 192.168.0.*
    accounts:
      - accessKey: RocketMQ
        secretKey: 12345678
        whiteRemoteAddress:
        admin: false
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms:
          - topicA=DENY
          - topicB=PUB|SUB
          - topicC=SUB
          - Orders=PUB|SUB
        groupPerms:
          - groupA=DENY
          - groupB=PUB|SUB
      - accessKey: rocketmq2
        secretKey: 12345678
        whiteRemoteAddress: 192.168.1.*
        admin: true
    """)


# ---- the signature --------------------------------------------------------------------------------


def test_signature_is_hmac_sha1_over_the_values_in_key_order_then_the_body():
    fields = {"b": "2", "a": "1", "AccessKey": "RocketMQ", "c": "é"}
    content = request_content(fields, b"BODY")
    # Keys in Java's order (upper case before lower), values only, UTF-8, then the body.
    assert content == "RocketMQ12é".encode() + b"BODY"
    expected = base64.b64encode(hmac.new(b"12345678", content, hashlib.sha1).digest()).decode()
    assert signature(content, "12345678") == expected


def test_signature_orders_keys_as_java_strings_do_not_as_python_strings():
    # Java compares UTF-16 code units: a surrogate pair (U+1F600) sorts before U+FFFF;
    # Python compares code points and puts it after.
    fields = {"\uffff": "B", "\U0001F600": "A"}
    assert request_content(fields, None) == b"AB"


def test_signing_covers_every_field_but_signature_where_rocketmq_4_9_drops_the_query_flag():
    request = RemotingCommand.request(RequestCode.QUERY_MESSAGE, {"topic": "T", "key": "k"},
                                      body=b"x")
    signed = sign(request, Credentials("RocketMQ", "12345678", security_token="tok"))
    fields = signed.ext_fields
    assert fields["AccessKey"] == "RocketMQ" and fields["SecurityToken"] == "tok"
    assert fields["Signature"] == signature(request_content(fields, b"x"), "12345678")
    # A query by unique key carries _UNIQUE_KEY_QUERY, which the Java client signs and
    # RocketMQ 4.9's broker leaves out of its content, so those queries never verify there.
    # Here it stays in: the signed query verifies, and changing the flag breaks it.
    # (as GET_BROKER_CONFIG, which touches no resource: the permissions are not the point)
    query = sign(attrs.evolve(request, code=RequestCode.GET_BROKER_CONFIG, ext_fields={
        **request.ext_fields, "_UNIQUE_KEY_QUERY": "true"}), APP)
    acl = PlainAcl.parse(ACL_YAML)
    assert acl.check(query, "h") is None
    flipped = attrs.evolve(query, ext_fields={**query.ext_fields, "_UNIQUE_KEY_QUERY": "false"})
    assert "signature" in (acl.check(flipped, "h") or "")
    assert "hunter22" not in repr(Credentials("a" * 7, "hunter22"))


# ---- plain_acl.yml -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "address", "matches"), [
    ("", "127.0.0.1", False),
    ("*", "10.1.2.3", True),
    ("*.*.*.*", "::1", True),
    ("192.168.1.*", "192.168.1.77", True),
    ("192.168.1.*", "192.168.2.77", False),
    ("192.168.*.*", "192.168.200.1", True),
    ("192.168.1.10-20", "192.168.1.15", True),
    ("192.168.1.10-20", "192.168.1.21", False),
    ("10.1.2.{1,2,3}", "10.1.2.2", True),
    ("10.1.2.{1,2,3}", "10.1.2.4", False),
    ("10.0.0.1,10.0.0.9", "10.0.0.9", True),
    ("127.0.0.1", "127.0.0.1", True),
    ("::1", "0:0:0:0:0:0:0:1", True),
    ("2001:db8::1,2001:db8::2", "2001:db8:0::2", True),
])
def test_address_patterns_match_as_rocketmq_reads_them(pattern, address, matches):
    assert AddressPattern.parse(pattern).match(address) is matches


@pytest.mark.parametrize(("text", "names"), [
    ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", "accessKey"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 123\n", "secretKey"),
    ("accounts:\n  - {accessKey: RocketMQ, secretKey: 12345678, topicPerms: [topicA]}\n",
     "name=PERM"),
    ("accounts: [1, 2]\n", "mapping"),
    ("- a\n- b\n", "mapping"),
    ("accounts: [\n", "not YAML"),
    ("globalWhiteRemoteAddresses: ['2001:db8::*']\n", "IPv6"),
    ("globalWhiteRemoteAddresses: ['10.0.0.300']\n", "not an IP"),
])
def test_a_bad_acl_file_is_refused_with_what_is_wrong(text, names):
    with pytest.raises(AclConfigError, match=names):
        PlainAcl.parse(text)


def test_a_key_defined_twice_keeps_its_first_entry_as_rocketmq_does():
    acl = PlainAcl.parse("accounts:\n  - {accessKey: RocketMQ, secretKey: 12345678}\n"
                         "  - {accessKey: RocketMQ, secretKey: 87654321}\n")
    assert acl.accounts["RocketMQ"].secret_key == "12345678"


def test_a_broken_acl_file_says_where_but_never_quotes_a_secret():
    with pytest.raises(AclConfigError) as bad_yaml:
        PlainAcl.parse("accounts:\n  - accessKey: RocketMQ\n    secretKey: [MySecret99\n")
    assert "MySecret99" not in str(bad_yaml.value) and "line" in str(bad_yaml.value)
    with pytest.raises(AclConfigError) as bad_type:
        PlainAcl.parse("accounts:\n  - {accessKey: RocketMQ, secretKey: 12345678.5}\n")
    assert "12345678" not in str(bad_type.value) and "float" in str(bad_type.value)


def test_an_empty_acl_file_has_no_accounts_and_refuses_everyone():
    acl = PlainAcl.parse("")
    request = sign(RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), APP)
    assert "no ACL account" in (acl.check(request, "127.0.0.1") or "")


# ---- the check, in RocketMQ's order ------------------------------------------------------------------


def send_v2(topic: str, group: str = "producerGroup") -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2,
                                   {"a": group, "b": topic, "c": "TBW102"}, body=b"hello")


@pytest.fixture
def acl() -> PlainAcl:
    return PlainAcl.parse(ACL_YAML)


@pytest.mark.parametrize(("topic", "allowed"), [
    ("topicA", False), ("topicB", True), ("topicC", False), ("other", False),
])
def test_sends_need_pub_on_their_topic_explicit_or_default(acl, topic, allowed):
    refusal = acl.check(sign(send_v2(topic), APP), "127.0.0.1")
    if allowed:
        assert refusal is None
    else:
        assert refusal == f"AccessKey 'RocketMQ' has no PUB permission on topic {topic}"


@pytest.mark.parametrize("code", [RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE])
def test_pulls_need_sub_on_the_topic_and_on_the_groups_retry_topic(acl, code):
    def pull(topic, group):
        return sign(RemotingCommand.request(
            code, {"topic": topic, "consumerGroup": group}), APP)

    assert acl.check(pull("topicC", "groupB"), "127.0.0.1") is None
    assert acl.check(pull("topicC", "anyGroup"), "127.0.0.1") is None  # defaultGroupPerm SUB
    assert "SUB permission on group groupA" in (acl.check(pull("topicC", "groupA"), "h") or "")
    assert "SUB permission on topic topicA" in (acl.check(pull("topicA", "groupB"), "h") or "")


def test_batches_need_pub_like_sends_where_rocketmq_4_9_checks_nothing(acl):
    def batch(topic):
        return sign(RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE,
                                            {"a": "producerGroup", "b": topic}), APP)

    assert acl.check(batch("topicB"), "127.0.0.1") is None
    assert "no PUB permission on topic topicA" in (acl.check(batch("topicA"), "h") or "")
    assert "no PUB permission on topic other" in (acl.check(batch("other"), "h") or "")


def test_a_consumers_heartbeat_needs_sub_on_each_subscription(acl):
    def heartbeat(topic):
        body = HeartbeatData("c1", consumer_data_set=[ConsumerData(
            "groupB", subscription_data_set=[SubscriptionData(topic)])]).encode()
        return sign(RemotingCommand.request(RequestCode.HEART_BEAT, body=body), APP)

    assert acl.check(heartbeat("topicB"), "127.0.0.1") is None
    assert "topic topicA" in (acl.check(heartbeat("topicA"), "127.0.0.1") or "")
    broken = sign(RemotingCommand.request(RequestCode.HEART_BEAT, body=b"{not json"), APP)
    assert "cannot work out" in (acl.check(broken, "127.0.0.1") or "")


def test_refusals_name_the_missing_key_the_unknown_key_and_the_bad_signature(acl):
    unsigned = send_v2("topicB")
    assert "no AccessKey" in (acl.check(unsigned, "127.0.0.1") or "")
    stranger = sign(send_v2("topicB"), Credentials("Stranger", "12345678"))
    assert acl.check(stranger, "127.0.0.1") == "no ACL account has AccessKey 'Stranger'"
    forged = sign(send_v2("topicB"), Credentials("RocketMQ", "wrong-secret"))
    assert "signature does not match" in (acl.check(forged, "127.0.0.1") or "")
    # a field changed after signing breaks the signature too
    tampered = sign(send_v2("topicB"), APP)
    tampered = attrs.evolve(tampered, ext_fields={**tampered.ext_fields, "b": "topicA"})
    assert "signature does not match" in (acl.check(tampered, "127.0.0.1") or "")
    huge = sign(send_v2("topicB"), Credentials("K" * 200_000, "12345678"))
    remark = acl.check(huge, "127.0.0.1") or ""
    assert "no ACL account" in remark and len(remark) < 200


def test_whitelisted_addresses_pass_as_in_rocketmq(acl):
    # the global whitelist passes anything, signed or not
    assert acl.check(send_v2("topicA"), "10.10.103.7") is None
    # an account's own whitelist passes its requests without the signature or permissions
    # being checked (RocketMQ's trusted-address bypass)
    forged = sign(send_v2("topicA"), Credentials("rocketmq2", "wrong-secret"))
    assert acl.check(forged, "192.168.1.5") is None
    assert "signature" in (acl.check(forged, "192.168.2.5") or "")


def test_admin_codes_need_an_admin_account(acl):
    create = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "topicB"})
    assert "needs an admin account" in (acl.check(sign(create, APP), "127.0.0.1") or "")
    assert acl.check(sign(create, ADMIN), "127.0.0.1") is None


def test_sends_to_the_trace_topic_pass_whatever_the_topic_permissions(acl):
    assert acl.check(sign(send_v2("RMQ_SYS_TRACE_TOPIC"), APP), "127.0.0.1") is None


# ---- reloads --------------------------------------------------------------------------------------------


def test_the_acl_file_reloads_on_change_and_keeps_the_last_good_accounts(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    live = AclFile.open(str(path))
    request = sign(send_v2("other"), APP)
    assert live.check(request, "127.0.0.1") is not None
    path.write_text(ACL_YAML.replace("defaultTopicPerm: DENY", "defaultTopicPerm: PUB"))
    os.utime(path, ns=(1, 1))  # a new mtime even on a coarse clock
    assert live.reload_if_changed() is True
    assert live.check(request, "127.0.0.1") is None
    path.write_text("accounts: [\n")  # a half-saved edit
    os.utime(path, ns=(2, 2))
    assert live.reload_if_changed() is False and live.failed_reloads == 1
    assert live.check(request, "127.0.0.1") is None  # the last good accounts stay
    with pytest.raises(AclConfigError, match="cannot be read"):
        AclFile.open(str(tmp_path / "missing.yml"))


# ---- a broker with aclEnable=true ----------------------------------------------------------------------


async def test_a_broker_with_acl_serves_signed_clients_and_answers_no_permission_to_others(
        tmp_path):
    """Where RocketMQ 4.9 answers an ACL refusal SYSTEM_ERROR, this broker answers
    NO_PERMISSION, with a remark naming what was refused; the refused connection and the
    broker keep serving."""
    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(ACL_YAML)
    config = ClusterConfig(data_dir=str(tmp_path / "data"), slaves=0,
                           master_role="ASYNC_MASTER",
                           properties={"aclEnable": "true", "plainAclFile": str(acl_path)})
    async with open_cluster(config) as cluster:
        namesrv = cluster.namesrv_addr
        async with open_client_instance(namesrv, credentials=ADMIN) as admin_client, \
                open_admin(admin_client) as admin:
            await admin.create_topic("Orders", 4, cluster="DefaultCluster")
            await admin.create_topic("topicA", 4, cluster="DefaultCluster")
        async with open_client_instance(namesrv, credentials=APP) as client, \
                open_producer(client, "producerGroup") as producer:
            sent = await producer.send(Message("Orders", b"paid", tags="t"))
            assert sent.send_status.name == "SEND_OK"
            with pytest.raises(MQBrokerError) as refused:
                await producer.send(Message("topicA", b"no"))
            assert refused.value.code == ResponseCode.NO_PERMISSION
            assert "no PUB permission on topic topicA" in str(refused.value)
            # the same connection still serves
            assert (await producer.send(Message("Orders", b"again"))).send_status.name \
                == "SEND_OK"
            async with open_pull_consumer(client, "groupB") as consumer:
                queue = [q for q in await consumer.queues("Orders")
                         if q.queue_id == sent.message_queue.queue_id][0]
                pulled = await consumer.pull(queue, sent.queue_offset, 1, timeout=5)
                assert [m.body for m in pulled.messages] == [b"paid"]
        async with open_client_instance(namesrv) as anonymous, \
                open_producer(anonymous, "producerGroup") as producer:
            with pytest.raises(MQBrokerError) as unsigned:
                await producer.send(Message("Orders", b"who"))
            assert unsigned.value.code == ResponseCode.NO_PERMISSION
            assert "no AccessKey" in str(unsigned.value)
        wrong = Credentials("RocketMQ", "not-the-secret")
        async with open_client_instance(namesrv, credentials=wrong) as forger, \
                open_producer(forger, "producerGroup") as producer:
            with pytest.raises(MQBrokerError, match="signature does not match"):
                await producer.send(Message("Orders", b"forged"))

        # The operator grants topicA: the broker picks the file up without a restart.
        acl_path.write_text(ACL_YAML.replace("topicA=DENY", "topicA=PUB"))
        async with open_client_instance(namesrv, credentials=APP) as client, \
                open_producer(client, "producerGroup") as producer:
            async def granted() -> bool:
                try:
                    await producer.send(Message("topicA", b"now"))
                except MQBrokerError as exc:
                    refusal = exc
                else:
                    return True
                assert refusal.code == ResponseCode.NO_PERMISSION
                return False

            # the broker polls the file every 0.5 s: no event to wait on from here
            await wait_until(granted, "the broker to pick up the edited plain_acl.yml",
                             interval=0.1)


def test_acl_enable_without_a_file_is_a_start_error(monkeypatch):
    from trio_ha.acl import acl_file_path
    from trio_ha.broker.config import BrokerConfig
    from trio_ha.config import ConfigError

    monkeypatch.delenv("ROCKETMQ_HOME", raising=False)
    config = BrokerConfig.from_properties("aclEnable=true\n")
    assert config.acl_enable
    with pytest.raises(ConfigError, match="plainAclFile"):
        acl_file_path(config.plain_acl_file)
    monkeypatch.setenv("ROCKETMQ_HOME", "/opt/rocketmq")
    assert acl_file_path(None) == "/opt/rocketmq/conf/plain_acl.yml"
    assert acl_file_path("/etc/acl.yml") == "/etc/acl.yml"


# ---- the name server's admin verbs ----------------------------------------------------------------------


async def test_a_name_server_with_acl_wants_an_admin_account_for_its_admin_verbs(
        nursery, tmp_path):
    """Our extension (RocketMQ 4.9's name server checks nothing): with aclEnable, deleting a
    topic, changing a broker's write permission, the KV config and config updates need an
    admin account's signed request (so do broker registrations: test_takeover.py); route
    lookups stay unsigned."""
    from trio_ha.namesrv import NamesrvConfig, serve_namesrv
    from trio_ha.remoting import open_remoting_client

    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(ACL_YAML)
    config = NamesrvConfig.from_properties({
        "listenPort": "0", "bindAddress": "127.0.0.1", "aclEnable": "true",
        "plainAclFile": str(acl_path), "kvConfigPath": str(tmp_path / "kv.json")})
    _, port = await nursery.start(serve_namesrv, config)
    put = RemotingCommand.request(RequestCode.PUT_KV_CONFIG,
                                  {"namespace": "ORDER_TOPIC_CONFIG", "key": "T", "value": "a:4"})

    async def call(request, credentials=None):
        async with open_remoting_client(f"127.0.0.1:{port}", credentials=credentials) as c:
            return await c.invoke(request, 5)

    unsigned = await call(put)
    assert unsigned.code == ResponseCode.NO_PERMISSION and "no AccessKey" in (unsigned.remark or "")
    by_app = await call(put, APP)
    assert by_app.code == ResponseCode.NO_PERMISSION
    assert "needs an admin account" in (by_app.remark or "")
    assert (await call(put, ADMIN)).code == ResponseCode.SUCCESS
    lookup = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert (await call(lookup)).code == ResponseCode.TOPIC_NOT_EXIST  # unchecked
    read = RemotingCommand.request(RequestCode.GET_KV_CONFIG,
                                   {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"})
    assert (await call(read)).ext_fields.get("value") == "a:4"


def test_the_cli_signs_with_the_account_it_is_given(tmp_path):
    """``trio-ha --access-key/--secret-key`` (or $TRIO_HA_ACCESS_KEY/$TRIO_HA_SECRET_KEY)
    signs every request of a client command; without them an ACL broker refuses, and the
    refusal is the command's one line on stderr."""
    import subprocess
    import sys

    from trio_ha.testing import ProcessCluster

    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(ACL_YAML)
    config = ClusterConfig(data_dir=str(tmp_path / "data"), slaves=0,
                           master_role="ASYNC_MASTER",
                           properties={"aclEnable": "true", "plainAclFile": str(acl_path)})

    def cli(*args, env=None):
        return subprocess.run([sys.executable, "-m", "trio_ha.cli", *args], capture_output=True,
                              text=True, timeout=120, env={**os.environ, **(env or {})})

    with ProcessCluster.start(config) as running:
        create = ("admin", "update-topic", "-n", running.namesrv_addr, "-t", "CliAcl",
                  "-r", "2", "-w", "2", "--json")
        refused = cli(*create)
        assert refused.returncode == 1 and "no AccessKey" in refused.stderr, refused.stderr
        as_app = cli("--access-key", APP.access_key, "--secret-key", APP.secret_key, *create)
        assert as_app.returncode == 1 and "needs an admin account" in as_app.stderr
        as_admin = cli(*create, env={"TRIO_HA_ACCESS_KEY": ADMIN.access_key,
                                     "TRIO_HA_SECRET_KEY": ADMIN.secret_key})
        assert as_admin.returncode == 0, as_admin.stderr
        half = cli("--access-key", "only-the-key", *create)
        assert half.returncode == 2 and "go together" in half.stderr


async def test_hostile_acl_input_costs_only_the_requests_not_the_broker(tmp_path):
    """Malformed signatures, huge and odd AccessKeys, fields missing or out of place: each
    is refused NO_PERMISSION on a connection that keeps serving, and a signed client is
    served throughout."""
    import random

    from trio_ha.remoting import open_remoting_client

    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(ACL_YAML)
    config = ClusterConfig(data_dir=str(tmp_path / "data"), slaves=0,
                           master_role="ASYNC_MASTER",
                           properties={"aclEnable": "true", "plainAclFile": str(acl_path)})
    rng = random.Random(15)
    async with open_cluster(config) as cluster:
        async with open_client_instance(cluster.namesrv_addr, credentials=ADMIN) as admin_client, \
                open_admin(admin_client) as admin:
            await admin.create_topic("topicB", 2, cluster="DefaultCluster")
        broker = cluster.master.addr
        async with open_remoting_client(broker) as hostile:
            for i in range(300):
                fields = {"a": "producerGroup", "b": "topicB", "c": "TBW102", "d": "4",
                          "e": "0", "f": "0", "g": "0", "h": "0"}
                kind = i % 6
                if kind == 0:
                    fields["AccessKey"] = "K" * rng.randrange(1, 250_000)
                elif kind == 1:
                    fields.update(AccessKey="RocketMQ", Signature=rng.randbytes(
                        rng.randrange(0, 64)).decode("latin-1"))
                elif kind == 2:
                    fields.update(AccessKey="RocketMQ", Signature="=" * 1000)
                elif kind == 3:
                    fields.update(AccessKey="\ud800broken", Signature="x")
                elif kind == 4:
                    fields = {"AccessKey": "RocketMQ"}  # no topic at all
                request = RemotingCommand.request(310, fields, body=rng.randbytes(64))
                response = await hostile.invoke(request, 5)
                assert response.code == ResponseCode.NO_PERMISSION, (kind, response.remark)
                assert len(response.remark or "") < 400
        async with open_client_instance(cluster.namesrv_addr, credentials=APP) as client, \
                open_producer(client, "producerGroup") as producer:
            assert (await producer.send(Message("topicB", b"still up"))).send_status.name \
                == "SEND_OK"
