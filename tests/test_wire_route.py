"""Route JSON, name server bodies and the config JSON files, in both JSON dialects."""

import json
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_ha.wire import route
from trio_ha.wire.errors import MetadataDecodeError, RouteDecodeError
from trio_ha.wire.fastjson import read_json, write_json
from trio_ha.wire.heartbeat import (
    ConsumerData,
    ConsumerIdList,
    HeartbeatData,
    ProducerData,
    SubscriptionData,
)
from trio_ha.wire.metadata import (
    DEFAULT_DELAY_LEVELS,
    ConsumerOffsetTable,
    DataVersion,
    DelayOffsetTable,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicConfig,
    TopicConfigSerializeWrapper,
    decode_consumer_offsets,
    decode_delay_offsets,
    decode_subscription_groups,
    decode_topics_json,
    encode_consumer_offsets,
    encode_delay_offsets,
    encode_subscription_groups,
    encode_topics_json,
    offset_key,
    parse_delay_levels,
    split_offset_key,
)
from trio_ha.wire.permission import Permission, readable, writable
from trio_ha.wire.route import (
    BrokerData,
    ClusterInfo,
    KVTable,
    QueueData,
    RegisterBrokerBody,
    TopicRouteData,
    wants_standard_json,
)

# ---- the two JSON dialects -------------------------------------------------------------------


def test_reader_takes_fastjson_unquoted_numeric_keys_and_standard_json():
    assert read_json('{0:"a",1:"b"}') == {"0": "a", "1": "b"}
    assert read_json('{"0":"a"}') == {"0": "a"}
    assert read_json(b'{ 0 : {-1:2}, "x":[{7:8}]}') == {"0": {"-1": 2}, "x": [{"7": 8}]}
    # text inside strings is never rewritten
    assert read_json('{"s":"{0:1,2:3}",5:"\\"{6:7}"}') == {"s": "{0:1,2:3}", "5": '"{6:7}'}


@pytest.mark.parametrize(
    "text",
    [b"", b"{", b"{0:}", b"[1,]", b"{a:1}", b"NaN", b'{"x":Infinity}', b"\xff\xfe", b"{0:1} 2"],
)
def test_reader_rejects_what_is_neither_dialect(text):
    with pytest.raises(RouteDecodeError):
        read_json(text)


def test_reader_limits_size_and_nesting():
    with pytest.raises(RouteDecodeError, match="exceeds the limit"):
        read_json(b"[" + b"1," * 100 + b"1]", max_length=100)
    with pytest.raises(RouteDecodeError):
        read_json("[" * 200_000 + "]" * 200_000)


def test_writer_modes():
    value = {"b": {1: "é", 0: "x"}, "a": None, "c": [True, None, 3], "s": frozenset({"z", "y"})}
    assert write_json(value) == '{"b":{0:"x",1:"é"},"c":[true,null,3],"s":["y","z"]}'
    assert (
        write_json(value, standard_json=True)
        == '{"b":{"0":"x","1":"\\u00e9"},"c":[true,null,3],"s":["y","z"]}'
    )
    assert write_json({}) == "{}" and write_json({"e": {}}, pretty=True) == '{\n\t"e":{}\n}'
    with pytest.raises(TypeError):
        write_json({1.5: 1})


def test_which_callers_get_standard_json():
    assert not wants_standard_json(0)
    assert not wants_standard_json(400)
    assert wants_standard_json(401)
    assert wants_standard_json(409)
    assert wants_standard_json(0, accept_standard_json_only=True)


# ---- route data -------------------------------------------------------------------------------

ROUTE_FASTJSON = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},'
    b'"brokerName":"broker-a","cluster":"DefaultCluster"}],"filterServerTable":{},'
    b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
    b'"writeQueueNums":4}]}'
)
ROUTE = TopicRouteData(
    queue_datas=[QueueData("broker-a", 4, 4, 6, 0)],
    broker_datas=[
        BrokerData("DefaultCluster", "broker-a", {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"})
    ],
)


def test_route_data_in_fastjson_form_is_what_java_writes():
    assert TopicRouteData.decode(ROUTE_FASTJSON) == ROUTE
    assert ROUTE.encode(standard_json=False) == ROUTE_FASTJSON
    standard = ROUTE.encode(standard_json=True)
    assert json.loads(standard)["brokerDatas"][0]["brokerAddrs"] == {
        "0": "10.0.0.1:10911",
        "1": "10.0.0.2:10911",
    }
    assert TopicRouteData.decode(standard) == ROUTE


def test_route_data_from_a_5x_name_server_and_an_old_4x_one():
    body = (
        '{"brokerDatas":[{"brokerAddrs":{"0":"h:1"},"brokerName":"b","cluster":"c",'
        '"enableActingMaster":false,"zoneName":"z1"}],"filterServerTable":{"h:1":["f:1"]},'
        '"orderTopicConf":"b:4","queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":8,'
        '"topicSynFlag":2,"writeQueueNums":8}],"topicQueueMappingByBroker":{}}'
    )
    route = TopicRouteData.decode(body)
    assert route.broker_datas[0].zone_name == "z1"
    assert route.queue_datas[0].topic_sys_flag == 2
    assert route.filter_server_table == {"h:1": ("f:1",)}
    assert route.order_topic_conf == "b:4"
    assert TopicRouteData.decode(route.encode(standard_json=False)) == route


names = st.text(min_size=1, max_size=12)
int32 = st.integers(-(2**31), 2**31 - 1)
broker_datas = st.builds(
    BrokerData,
    cluster=names,
    broker_name=names,
    broker_addrs=st.dictionaries(st.integers(-5, 2**40), names, max_size=3),
    enable_acting_master=st.booleans(),
    zone_name=st.none() | names,
)
queue_datas = st.builds(QueueData, names, int32, int32, st.integers(0, 15), int32)
routes = st.builds(
    TopicRouteData,
    queue_datas=st.lists(queue_datas, max_size=3),
    broker_datas=st.lists(broker_datas, max_size=3),
    filter_server_table=st.dictionaries(
        names, st.lists(names, max_size=2).map(tuple), max_size=2
    ),
    order_topic_conf=st.none() | names,
)


@given(route=routes, standard=st.booleans())
def test_route_data_round_trips_in_both_modes(route, standard):
    assert TopicRouteData.decode(route.encode(standard_json=standard)) == route


@given(
    info=st.builds(
        ClusterInfo,
        broker_addr_table=st.dictionaries(names, broker_datas, max_size=3),
        cluster_addr_table=st.dictionaries(names, st.frozensets(names, max_size=3), max_size=2),
    )
)
def test_cluster_info_round_trips(info):
    assert ClusterInfo.decode(info.encode()) == info
    assert ClusterInfo.decode(info.encode(standard_json=True)) == info


def test_cluster_info_as_java_writes_it():
    body = (
        b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"h:10911"},"brokerName":"broker-a",'
        b'"cluster":"DefaultCluster"}},"clusterAddrTable":{"DefaultCluster":["broker-a"]}}'
    )
    info = ClusterInfo.decode(body)
    assert info.cluster_addr_table == {"DefaultCluster": frozenset({"broker-a"})}
    assert info.broker_addr_table["broker-a"].broker_addrs == {0: "h:10911"}
    assert info.encode() == body


@pytest.mark.parametrize(
    ('body', 'match'),
    [
        (b"[]", "must be an object"),
        (b'{"brokerDatas":{}}', "brokerDatas must be an array"),
        (b'{"brokerDatas":[{"brokerAddrs":{"x":"h"},"brokerName":"b"}]}', "must be an integer"),
        (b'{"brokerDatas":[{"brokerAddrs":{0:5},"brokerName":"b"}]}', "must be a string"),
        (b'{"brokerDatas":[{"brokerAddrs":{}}]}', "brokerName is missing"),
        (b'{"queueDatas":[{"brokerName":"b","perm":"rw"}]}', "perm must be an integer"),
        (b'{"queueDatas":[{"brokerName":"b","perm":99999999999}]}', "perm must be an integer"),
        (b'{"filterServerTable":{"a":[1]}}', "must be a string"),
    ],
)
def test_malformed_route_data(body, match):
    with pytest.raises(RouteDecodeError, match=match):
        TopicRouteData.decode(body)


@given(data=st.binary(max_size=200))
def test_route_decoders_raise_only_route_decode_errors(data):
    for decode in (
        TopicRouteData.decode,
        ClusterInfo.decode,
        HeartbeatData.decode,
        ConsumerIdList.decode,
        KVTable.decode,
        RegisterBrokerBody.decode,
        lambda d: RegisterBrokerBody.decode(d, compressed=True),
        lambda d: RegisterBrokerBody.decode(zlib.compress(d), compressed=True),
    ):
        try:
            decode(data)
        except RouteDecodeError:
            pass


# ---- broker registration ---------------------------------------------------------------------

TOPICS = TopicConfigSerializeWrapper(
    {
        "TopicTest": TopicConfig("TopicTest", 4, 4),
        "%RETRY%cg": TopicConfig(
            "%RETRY%cg", 1, 1, Permission.READ | Permission.WRITE, "SINGLE_TAG", 0, False
        ),
        "ordered": TopicConfig("ordered", 8, 8, 6, "MULTI_TAG", 1, True),
    },
    DataVersion(7, 1636355958169),
)


def java_compressed(
    version_json: bytes, topics: list[bytes], filters: bytes, tail: bytes = b""
) -> bytes:
    """The compressed register body built by hand from the layout in docs/remoting.md, 'Name
    server'."""
    parts = [struct.pack(">i", len(version_json)), version_json, struct.pack(">i", len(topics))]
    for text in topics:
        parts += [struct.pack(">i", len(text)), text]
    parts += [struct.pack(">i", len(filters)), filters, tail]
    return zlib.compress(b"".join(parts), 9)


def test_register_body_json_form():
    body = RegisterBrokerBody(TOPICS, ["10.0.0.9:3000"])
    raw = body.encode()
    assert json.loads(raw)["topicConfigSerializeWrapper"]["dataVersion"] == {
        "counter": 7,
        "timestamp": 1636355958169,
    }
    assert RegisterBrokerBody.decode(raw) == body
    assert RegisterBrokerBody.decode(b"{}") == RegisterBrokerBody()


def test_register_body_compressed_form_round_trips_and_reads_the_java_layout():
    body = RegisterBrokerBody(TOPICS, ["10.0.0.9:3000"])
    decoded = RegisterBrokerBody.decode(body.encode(compressed=True), compressed=True)
    # the compact topic form has five fields: topicSysFlag and order do not travel (as in Java)
    assert decoded.topic_config_table["ordered"] == TopicConfig("ordered", 8, 8, 6, "MULTI_TAG")
    plain = {name: TopicConfig(name, 3, 5, 2) for name in ("a", "b%")}
    body = RegisterBrokerBody(TopicConfigSerializeWrapper(plain, DataVersion(1, 2)), ["f:1"])
    assert RegisterBrokerBody.decode(body.encode(compressed=True), compressed=True) == body
    java = java_compressed(
        b'{"counter":7,"timestamp":1636355958169}',
        [b"TopicTest 4 4 6 SINGLE_TAG", b"%RETRY%cg 1 1 6 SINGLE_TAG", b"ordered 8 8 6 MULTI_TAG"],
        b'["10.0.0.9:3000"]',
    )
    decoded = RegisterBrokerBody.decode(java, compressed=True)
    assert decoded.data_version == TOPICS.data_version
    assert decoded.topic_config_table["ordered"] == TopicConfig("ordered", 8, 8, 6, "MULTI_TAG")
    assert decoded.filter_server_list == ("10.0.0.9:3000",)
    # 5.x appends a topic-queue-mapping section; we write an empty one and skip theirs
    ours = zlib.decompress(body.encode(compressed=True))
    assert ours.endswith(b'["f:1"]' + b"\x00\x00\x00\x00")
    version = b'{"counter":1,"stateVersion":0,"timestamp":2}'
    five = java_compressed(version, [], b"[]", b"\x00\x00\x00\x00")
    assert RegisterBrokerBody.decode(five, compressed=True).data_version == DataVersion(1, 2)


def test_compressed_register_body_bomb_is_rejected():
    bomb = zlib.compress(b"\x00" * (8 * 1024 * 1024), 9)
    assert len(bomb) < 20_000
    with pytest.raises(RouteDecodeError, match="inflates beyond"):
        RegisterBrokerBody.decode(bomb, compressed=True, max_inflated_length=1024 * 1024)


@pytest.mark.parametrize(
    ('raw', 'match'),
    [
        (b"not zlib", "does not inflate"),
        (zlib.compress(b"\x00\x00"), "truncated"),
        (zlib.compress(b"\x7f\xff\xff\xff{}"), "DataVersion length"),
        (java_compressed(b"{}", [], b"[]")[:-6], "truncated|does not fit|inflate"),
        (
            zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 10**9)),
            "topic count",
        ),
        (java_compressed(b"{}", [b"only three parts"], b"[]"), "parts"),
        (java_compressed(b"{}", [b"t x 1 6 SINGLE_TAG"], b"[]"), "readQueueNums"),
        (java_compressed(b"{}", [b"t 1 1 6 NO_TAG"], b"[]"), "malformed"),
        (java_compressed(b"{}", [], b"[1]"), "must be a string"),
        (java_compressed(b"[]", [], b"[]"), "must be an object"),
    ],
)
def test_malformed_compressed_register_bodies(raw, match):
    with pytest.raises(RouteDecodeError, match=match):
        RegisterBrokerBody.decode(raw, compressed=True)


def test_topic_config_compact_form():
    config = TopicConfig("T", 8, 4, 6, "SINGLE_TAG")
    assert config.encode_compact() == "T 8 4 6 SINGLE_TAG"
    assert TopicConfig.decode_compact("T 8 4 6 SINGLE_TAG") == config
    assert TopicConfig.decode_compact('T 8 4 6 SINGLE_TAG {"+k":"v"}') == config


@pytest.mark.parametrize("perm", [*range(16), -1, -3, 2**31 - 1, -(2**31)])
def test_readable_and_writable_read_the_bits_of_any_java_int(perm):
    assert readable(perm) is bool(perm & Permission.READ)
    assert writable(perm) is bool(perm & Permission.WRITE)
    assert (readable(6), writable(6), readable(2), writable(4)) == (True, True, False, False)


def test_permission_members_are_written_as_the_plain_ints_java_expects():
    rw = Permission.READ | Permission.WRITE
    assert (Permission.INHERIT, Permission.WRITE, Permission.READ, Permission.PRIORITY) == (
        1, 2, 4, 8
    )
    config = TopicConfig("T", 8, 4, rw)
    assert config == TopicConfig("T", 8, 4, 6) and config.perm == 6
    assert '"perm":6' in write_json(config.to_json_obj())
    assert '"perm":6' in write_json(config.to_json_obj(), standard_json=True)
    assert json.loads(json.dumps({"perm": Permission.INHERIT | rw})) == {"perm": 7}
    assert config.encode_compact() == "T 8 4 6 SINGLE_TAG"
    wrapper = TopicConfigSerializeWrapper({"T": config})
    assert b'"perm":6' in encode_topics_json(wrapper, pretty=False)
    route = TopicRouteData(queue_datas=[QueueData("b", 4, 4, rw, 0)])
    assert TopicRouteData.decode(route.encode(standard_json=False)).queue_datas[0].perm == 6
    # defaults are read|write, and bits we do not know survive a round trip as plain ints
    assert TopicConfig("T").perm == rw and QueueData("b", 1, 1).perm == rw
    odd = TopicConfig("T", perm=-1)
    assert TopicConfigSerializeWrapper.from_json_obj(
        json.loads(write_json(TopicConfigSerializeWrapper({"T": odd}).to_json_obj())), "t"
    ).topic_config_table["T"].perm == -1


def test_bodies_that_moved_out_of_route_stay_importable_from_it():
    from trio_ha.wire import fastjson, heartbeat, metadata, permission

    for module in (fastjson, heartbeat, metadata, permission):
        for name in set(module.__all__) & set(route.__all__):
            assert getattr(route, name) is getattr(module, name), name
    assert route.HeartbeatData is HeartbeatData and route.TopicConfig is TopicConfig
    assert route.read_json is read_json and route.Permission is Permission


# ---- heartbeats and small bodies ---------------------------------------------------------

HEARTBEAT_JAVA = (
    '{"clientID":"10.0.0.5@12345","consumerDataSet":[{'
    '"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
    '"consumeType":"CONSUME_PASSIVELY","groupName":"cg","messageModel":"CLUSTERING",'
    '"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[2598919,2598920],'
    '"expressionType":"TAG","subString":"TagA || TagB","subVersion":1700000000000,'
    '"tagsSet":["TagA","TagB"],"topic":"TopicTest"},{"classFilterMode":false,"codeSet":[],'
    '"expressionType":"TAG","subString":"*","subVersion":1700000000001,"tagsSet":[],'
    '"topic":"%RETRY%cg"}],"unitMode":false}],"producerDataSet":[{"groupName":"pg"},'
    '{"groupName":"CLIENT_INNER_PRODUCER"}]}'
)


def test_heartbeat_as_java_writes_it():
    heartbeat = HeartbeatData.decode(HEARTBEAT_JAVA)
    assert heartbeat.client_id == "10.0.0.5@12345"
    assert heartbeat.producer_groups == ("pg", "CLIENT_INNER_PRODUCER")
    (consumer,) = heartbeat.consumer_data_set
    assert (consumer.group_name, consumer.consume_type, consumer.message_model) == (
        "cg",
        "CONSUME_PASSIVELY",
        "CLUSTERING",
    )
    sub = consumer.subscription_data_set[0]
    assert sub.tags_set == {"TagA", "TagB"} and sub.code_set == {2598919, 2598920}
    assert sub.sub_version == 1700000000000 and sub.expression_type == "TAG"
    assert heartbeat.encode().decode() == HEARTBEAT_JAVA


def test_heartbeat_from_a_lax_client():
    # other clients send numbers as strings, leave fields out, send nulls; a producer-only
    # heartbeat has no consumer data at all
    body = (
        '{"clientID":"py@1","producerDataSet":[{"groupName":"pg"}],"consumerDataSet":[{'
        '"groupName":"cg","consumeType":null,"subscriptionDataSet":[{"topic":"T",'
        '"subVersion":"17","expressionType":null,"tagsSet":null}],"unitMode":"false"}]}'
    )
    heartbeat = HeartbeatData.decode(body)
    sub = heartbeat.consumer_data_set[0].subscription_data_set[0]
    assert sub == SubscriptionData("T", "*", (), (), 17, "TAG", False)
    assert heartbeat.consumer_data_set[0].consume_type is None
    assert HeartbeatData.decode('{"clientID":"x"}') == HeartbeatData("x")
    with pytest.raises(RouteDecodeError, match="clientID is missing"):
        HeartbeatData.decode("{}")
    with pytest.raises(RouteDecodeError, match="codeSet"):
        HeartbeatData.decode('{"clientID":"x","consumerDataSet":[{"groupName":"g",'
                             '"subscriptionDataSet":[{"topic":"T","codeSet":{}}]}]}')


subscriptions = st.builds(
    SubscriptionData,
    topic=names,
    sub_string=names,
    tags_set=st.frozensets(names, max_size=3),
    code_set=st.frozensets(int32, max_size=3),
    sub_version=st.integers(0, 2**62),
    expression_type=st.sampled_from(["TAG", "SQL92"]),
    class_filter_mode=st.booleans(),
)


@given(
    heartbeat=st.builds(
        HeartbeatData,
        client_id=names,
        producer_data_set=st.lists(st.builds(ProducerData, names), max_size=2),
        consumer_data_set=st.lists(
            st.builds(
                ConsumerData,
                group_name=names,
                consume_type=st.sampled_from(["CONSUME_ACTIVELY", "CONSUME_PASSIVELY"]),
                message_model=st.sampled_from(["CLUSTERING", "BROADCASTING"]),
                consume_from_where=st.sampled_from(
                    ["CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET"]
                ),
                subscription_data_set=st.lists(subscriptions, max_size=2),
                unit_mode=st.booleans(),
            ),
            max_size=2,
        ),
    )
)
def test_heartbeat_round_trips(heartbeat):
    assert HeartbeatData.decode(heartbeat.encode()) == heartbeat


def test_consumer_id_list_and_kv_table():
    ids = ConsumerIdList(["10.0.0.5@1", "10.0.0.6@2"])
    assert ids.encode() == b'{"consumerIdList":["10.0.0.5@1","10.0.0.6@2"]}'
    assert ConsumerIdList.decode(ids.encode()) == ids
    table = KVTable({"brokerVersion": "409", "commitLogMaxOffset": "1024"})
    assert KVTable.decode(table.encode()) == table
    assert json.loads(table.encode()) == {"table": table.table}
    with pytest.raises(RouteDecodeError):
        ConsumerIdList.decode(b'{"consumerIdList":[1]}')


def test_data_version():
    version = DataVersion(3, 100)
    assert version.encode() == b'{"counter":3,"timestamp":100}'
    assert version.next_version(200) == DataVersion(4, 200)
    five = b'{"counter":1,"stateVersion":2,"timestamp":3}'
    assert DataVersion.decode(five) == DataVersion(1, 3, 2)


# ---- config files (metadata) ------------------------------------------------------------------

# As RocketMQ 4.9 writes them: fastjson pretty format (tabs), alphabetical fields,
# unquoted integer keys with the closing brace on its own line.
TOPICS_JSON_SAMPLE = """{
\t"dataVersion":{
\t\t"counter":3,
\t\t"timestamp":1622907213314
\t},
\t"topicConfigTable":{
\t\t"SCHEDULE_TOPIC_XXXX":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":18,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"SCHEDULE_TOPIC_XXXX",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":18
\t\t},
\t\t"TopicTest":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":4,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"TopicTest",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":4
\t\t}
\t}
}"""

CONSUMER_OFFSET_SAMPLE = """{
\t"offsetTable":{
\t\t"%RETRY%cg@cg":{0:0
\t\t},
\t\t"TopicTest@cg":{0:250,1:250,2:249,3:251
\t\t}
\t}
}"""

DELAY_OFFSET_SAMPLE = """{
\t"offsetTable":{1:0,2:17,3:4
\t}
}"""

SUBSCRIPTION_SAMPLE = """{
\t"dataVersion":{
\t\t"counter":1,
\t\t"timestamp":1622907213999
\t},
\t"subscriptionGroupTable":{
\t\t"cg":{
\t\t\t"brokerId":0,
\t\t\t"consumeBroadcastEnable":true,
\t\t\t"consumeEnable":true,
\t\t\t"consumeFromMinEnable":true,
\t\t\t"groupName":"cg",
\t\t\t"notifyConsumerIdsChangedEnable":true,
\t\t\t"retryMaxTimes":16,
\t\t\t"retryQueueNums":1,
\t\t\t"whichBrokerWhenConsumeSlowly":1
\t\t}
\t}
}"""


def test_topics_json_sample_is_read_and_written_byte_for_byte():
    wrapper = decode_topics_json(TOPICS_JSON_SAMPLE.encode())
    assert wrapper.data_version == DataVersion(3, 1622907213314)
    assert wrapper.topic_config_table["SCHEDULE_TOPIC_XXXX"].read_queue_nums == 18
    assert wrapper.topic_config_table["TopicTest"] == TopicConfig("TopicTest", 4, 4)
    assert encode_topics_json(wrapper).decode() == TOPICS_JSON_SAMPLE
    compact = encode_topics_json(wrapper, pretty=False)
    assert b"\n" not in compact and decode_topics_json(compact) == wrapper


def test_consumer_offsets_sample_both_key_styles():
    table = decode_consumer_offsets(CONSUMER_OFFSET_SAMPLE)
    assert table.offsets("TopicTest", "cg") == {0: 250, 1: 250, 2: 249, 3: 251}
    assert table.offset_table["%RETRY%cg@cg"] == {0: 0}
    assert table.data_version is None
    assert encode_consumer_offsets(table).decode() == CONSUMER_OFFSET_SAMPLE
    standard = encode_consumer_offsets(table, standard_json=True, pretty=False)
    assert json.loads(standard)["offsetTable"]["TopicTest@cg"]["3"] == 251
    assert decode_consumer_offsets(standard) == table
    assert encode_consumer_offsets(table, pretty=False) == (
        b'{"offsetTable":{"%RETRY%cg@cg":{0:0},"TopicTest@cg":{0:250,1:250,2:249,3:251}}}'
    )
    five = decode_consumer_offsets('{"dataVersion":{"counter":2,"timestamp":5},"offsetTable":{}}')
    assert five.data_version == DataVersion(2, 5)
    assert decode_consumer_offsets(encode_consumer_offsets(five)) == five
    assert offset_key("T", "g") == "T@g" and split_offset_key("T@g") == ("T", "g")
    with pytest.raises(ValueError, match="is not <topic>@<group>"):
        split_offset_key("T@g@x")


def test_delay_offsets_sample():
    table = decode_delay_offsets(DELAY_OFFSET_SAMPLE)
    assert table == DelayOffsetTable({1: 0, 2: 17, 3: 4})
    assert encode_delay_offsets(table).decode() == DELAY_OFFSET_SAMPLE
    assert decode_delay_offsets('{"offsetTable":{"1":5}}').offset_table == {1: 5}
    assert parse_delay_levels(DEFAULT_DELAY_LEVELS)[18] == 2 * 3600 * 1000
    assert len(parse_delay_levels()) == 18
    assert parse_delay_levels("1s 2d") == {1: 1000, 2: 172800000}


def test_subscription_groups_sample_and_defaults():
    wrapper = decode_subscription_groups(SUBSCRIPTION_SAMPLE)
    assert wrapper.subscription_group_table["cg"] == SubscriptionGroupConfig("cg")
    assert encode_subscription_groups(wrapper).decode() == SUBSCRIPTION_SAMPLE
    # missing fields take Java's defaults; a missing groupName is the table key
    sparse = decode_subscription_groups(
        '{"subscriptionGroupTable":{"g2":{"retryMaxTimes":3,"consumeEnable":false}}}'
    )
    config = sparse.subscription_group_table["g2"]
    assert config.group_name == "g2" and config.retry_max_times == 3 and not config.consume_enable
    assert config.retry_queue_nums == 1 and config.which_broker_when_consume_slowly == 1
    assert sparse.data_version == DataVersion()
    # 5.x fields are ignored
    five = decode_subscription_groups(
        '{"dataVersion":{"counter":1,"stateVersion":0,"timestamp":1},"forbiddenTable":{},'
        '"subscriptionGroupTable":{"g":{"groupName":"g","attributes":{},"groupSysFlag":0,'
        '"consumeTimeoutMinute":15,"groupRetryPolicy":{"type":"CUSTOMIZED"}}}}'
    )
    assert five.subscription_group_table["g"] == SubscriptionGroupConfig("g")


topic_configs = st.builds(
    TopicConfig,
    topic_name=names,
    read_queue_nums=st.integers(0, 1024),
    write_queue_nums=st.integers(0, 1024),
    perm=st.integers(0, 15),
    topic_filter_type=st.sampled_from(["SINGLE_TAG", "MULTI_TAG"]),
    topic_sys_flag=int32,
    order=st.booleans(),
)
tables = st.lists(topic_configs, max_size=4).map(lambda cs: {c.topic_name: c for c in cs})


@given(
    topics=tables,
    version=st.builds(DataVersion, st.integers(0, 2**62), st.integers(0, 2**62)),
    offsets=st.dictionaries(
        names, st.dictionaries(st.integers(0, 1023), st.integers(-1, 2**62), max_size=4), max_size=3
    ),
    delay=st.dictionaries(st.integers(1, 18), st.integers(0, 2**62), max_size=18),
    groups=st.lists(
        st.builds(
            SubscriptionGroupConfig,
            group_name=names,
            consume_enable=st.booleans(),
            retry_queue_nums=st.integers(0, 16),
            retry_max_times=st.integers(-1, 32),
            broker_id=st.integers(0, 3),
            which_broker_when_consume_slowly=st.integers(0, 3),
        ),
        max_size=3,
    ),
    pretty=st.booleans(),
    standard=st.booleans(),
)
def test_config_files_round_trip(topics, version, offsets, delay, groups, pretty, standard):
    options = dict(pretty=pretty, standard_json=standard)
    wrapper = TopicConfigSerializeWrapper(topics, version)
    assert decode_topics_json(encode_topics_json(wrapper, **options)) == wrapper
    consumer = ConsumerOffsetTable(offsets)
    assert decode_consumer_offsets(encode_consumer_offsets(consumer, **options)) == consumer
    delays = DelayOffsetTable(delay, version)
    assert decode_delay_offsets(encode_delay_offsets(delays, **options)) == delays
    subs = SubscriptionGroupWrapper({g.group_name: g for g in groups}, version)
    assert decode_subscription_groups(encode_subscription_groups(subs, **options)) == subs


@pytest.mark.parametrize(
    ('decode', 'text', 'match'),
    [
        (decode_topics_json, "", "not valid JSON"),
        (decode_topics_json, "[]", "must be an object"),
        (decode_topics_json, '{"topicConfigTable":{"t":{"perm":"x"}}}', "perm"),
        (decode_topics_json, '{"topicConfigTable":{"t":{"topicFilterType":"X"}}}', "FilterType"),
        (decode_topics_json, '{"dataVersion":7}', "dataVersion must be an object"),
        (decode_consumer_offsets, '{"offsetTable":{"t@g":{a:1}}}', "not valid JSON"),
        (decode_consumer_offsets, '{"offsetTable":{"t@g":{"a":1}}}', "must be an integer"),
        (decode_consumer_offsets, '{"offsetTable":{"t@g":{0:"x"}}}', "must be an integer"),
        (decode_consumer_offsets, '{"offsetTable":{"t@g":[]}}', "must be an object"),
        (decode_delay_offsets, '{"offsetTable":[]}', "must be an object"),
        (decode_subscription_groups, '{"subscriptionGroupTable":{"g":{"consumeEnable":3}}}', "bo"),
    ],
)
def test_malformed_config_files(decode, text, match):
    with pytest.raises(MetadataDecodeError, match=match):
        decode(text)


@given(data=st.binary(max_size=200))
def test_config_decoders_raise_only_metadata_errors(data):
    for decode in (
        decode_topics_json,
        decode_consumer_offsets,
        decode_delay_offsets,
        decode_subscription_groups,
    ):
        try:
            decode(data)
        except MetadataDecodeError:
            pass
