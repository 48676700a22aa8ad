"""The Prometheus endpoint of the broker and the name server (issue 13, "Operations").

A SYNC_MASTER (SYNC_FLUSH) with a slave and a name server, all with metrics on port 0, take
sends and a group's consumption over the client library; then a real HTTP scrape of each node
is parsed with prometheus_client's text parser and the series are checked against what the
cluster says through its own admin requests. The endpoint's HTTP handling is checked against
bad clients (wrong path or method, garbage, an oversized head, silence, a flood of
connections): each costs only its own connection, and the node keeps serving. The store's
wait histogram, which the flush and replication wait series come from, is checked alone.
"""

import contextlib
import math

import pytest
import trio
import trio.testing
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from conftest import wait_until
from trio_ha.broker import BrokerAddresses, BrokerConfig
from trio_ha.chaos import hostile
from trio_ha.client import Message, SendStatus, open_admin, open_producer, open_pull_consumer
from trio_ha.client.consumer import PullStatus
from trio_ha.config import ConfigError, StoreConfig
from trio_ha.namesrv import NameServer, NamesrvConfig
from trio_ha.remoting.metrics import MetricsHttpLimits, serve_metrics
from trio_ha.store import open_store
from trio_ha.store.results import PutMessageStatus
from trio_ha.store.sync_requests import SyncRequestService
from trio_ha.store.wait_histogram import WaitHistogram
from trio_ha.testing import ClusterConfig, open_cluster
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.watermark import Watermark

TOPIC = "Metered"
SENT = 12
GROUP = "metered-readers"
#: the most bytes a test reads from one HTTP reply
MAX_REPLY = 4 * 1024 * 1024


# ---- a tiny HTTP client ----------------------------------------------------------------------


async def http(address: str, request: bytes) -> tuple[int, dict[str, str], bytes] | None:
    """Send ``request`` to ``host:port`` and read the reply to its end: (status, headers,
    body), or None when the server closes without a reply."""
    host, port = address.rsplit(":", 1)
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, int(port))
        data = bytearray()
        async with stream:
            try:
                await stream.send_all(request)
                while len(data) < MAX_REPLY:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    data += chunk
            except trio.BrokenResourceError:
                pass  # reset by the server: what came before counts
    if not data:
        return None
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("ascii").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    assert int(headers["content-length"]) == len(body) or request.startswith(b"HEAD")
    return int(status_line.split(" ")[1]), headers, body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: test\r\nAccept: */*\r\n\r\n".encode()


async def scrape(address: str) -> dict[str, list]:
    """GET /metrics, parsed with the Prometheus text parser: sample name -> samples."""
    reply = await http(address, get("/metrics"))
    assert reply is not None
    status, headers, body = reply
    assert status == 200, body
    assert headers["content-type"] == CONTENT_TYPE_LATEST
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    """The value of the one sample ``name`` with (at least) ``labels``."""
    found = [s.value for s in samples.get(name, [])
             if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found} among {samples.get(name)}"
    return found[0]


# ---- the cluster's series --------------------------------------------------------------------


async def test_a_cluster_serves_its_series_and_a_scrape_parses(tmp_path, nursery):
    namesrv = NameServer(NamesrvConfig(listen_port=0, bind_address="127.0.0.1", metrics_port=0,
                                      kv_config_path=None))
    host, port = await nursery.start(namesrv.serve)
    namesrv_addr = f"{host}:{port}"
    assert namesrv.metrics_address is not None
    namesrv_metrics = "{}:{}".format(*namesrv.metrics_address)
    config = ClusterConfig(
        data_dir=tmp_path, slaves=1, master_role="SYNC_MASTER", flush_disk_type="SYNC_FLUSH",
        # The brokers register with this test's name server (its metrics are checked too).
        properties={"metricsPort": 0, "namesrvAddr": namesrv_addr, "haReconnectInterval": 100},
    )
    with trio.fail_after(60):
        async with open_cluster(config) as cluster:
            master, slave = cluster.master.started_addresses, cluster.slave.started_addresses
            assert isinstance(master, BrokerAddresses)
            assert isinstance(slave, BrokerAddresses)
            master_metrics, slave_metrics = master.metrics_addr, slave.metrics_addr
            assert master_metrics is not None and slave_metrics is not None
            node = {"cluster": "DefaultCluster", "brokerName": "broker-a"}

            async def slave_transferring():
                samples = await scrape(master_metrics)
                states = samples.get("trio_ha_ha_slave_state", [])
                return any(s.labels["state"] == "transfer" and s.value == 1 for s in states)

            # A SYNC_MASTER put waits for the slave only once it is connected.
            await wait_until(slave_transferring, "the slave to connect to the master")
            async with open_producer(namesrv_addr, "metered-writers") as producer:
                for number in range(SENT):
                    result = await producer.send(Message(TOPIC, b"m%d" % number))
                    assert result.send_status is SendStatus.SEND_OK
                consumed = await consume_one_per_queue(namesrv_addr)
                # Nothing is written now: the master's log end stays where the sends left it.
                end = value(await scrape(master_metrics), "trio_ha_commitlog_max_offset")
                assert end > 0

                async def caught_up():
                    slave_end = value(await scrape(slave_metrics), "trio_ha_commitlog_max_offset")
                    acked = value(await scrape(master_metrics), "trio_ha_ha_slave_acked_offset")
                    return slave_end == acked == end

                await wait_until(caught_up, "the slave to copy the log and ack it")
                m = await scrape(master_metrics)
                s = await scrape(slave_metrics)
                n = await scrape(namesrv_metrics)
    # The series said what the store holds (read from its files, once the brokers stopped).
    async with open_store(StoreConfig(store_path_root_dir=config.store_dir(0),
                                      mapped_file_size_commit_log=DEFAULT_SEGMENT_SIZE)) as store:
        assert store.max_commitlog_offset == end

    # The master: puts, the log, replication per slave, waits, lag, connections.
    assert value(m, "trio_ha_broker_info", **node, brokerId="0") == 1
    assert value(m, "trio_ha_broker_info", role="SYNC_MASTER") == 1
    assert value(m, "trio_ha_messages_put_total", **node, brokerId="0") == SENT
    assert value(m, "trio_ha_message_put_failures_total") == 0
    assert value(m, "trio_ha_commitlog_max_offset") == end
    assert value(m, "trio_ha_commitlog_min_offset") == 0
    assert value(m, "trio_ha_commitlog_flushed_offset") == end  # SYNC_FLUSH
    assert value(m, "trio_ha_ha_slave_connections") == 1
    assert value(m, "trio_ha_ha_slave_acked_offset") == end
    assert value(m, "trio_ha_ha_slave_lag_bytes") == 0
    assert value(m, "trio_ha_ha_slave_state", state="transfer") == 1
    assert value(m, "trio_ha_ha_slave_state", state="diverged") == 0
    # One send at a time finds the slave's link idle: the read round that stored a send
    # hands its frame to the slave itself, not the HA writer a scheduling round later.
    assert value(m, "trio_ha_ha_slave_frames_total", sent_by="round") >= SENT // 2
    assert value(m, "trio_ha_ha_replicated_offset") == end
    for wait in ("trio_ha_flush_wait", "trio_ha_replication_wait"):
        # Every send waited, for the disk and for the slave, and none timed out.
        assert value(m, f"{wait}_seconds_count") == SENT
        assert value(m, f"{wait}_seconds_bucket", le="+Inf") == SENT
        assert value(m, f"{wait}_seconds_sum") > 0
        buckets = [x.value for x in m[f"{wait}_seconds_bucket"]]
        assert buckets == sorted(buckets)
        assert value(m, f"{wait}_timeouts_total") == 0
        assert value(m, f"{wait}_pending") == 0
    assert value(m, "trio_ha_consumer_group_lag_messages", group=GROUP, topic=TOPIC) == (
        SENT - consumed)
    assert value(m, "trio_ha_remoting_connections", listener="main") > 0
    assert value(m, "trio_ha_remoting_connections_accepted_total", listener="main") > 0
    assert value(m, "trio_ha_remoting_connections", listener="vip") >= 0
    assert value(m, "trio_ha_store_healthy") == 1
    assert "trio_ha_ha_client_state" not in m
    assert value(m, "trio_ha_pull_requests_total") > 0  # the group's pulls

    # The slave: its replication state, its log, no sends.
    assert value(s, "trio_ha_broker_info", **node, brokerId="1", role="SLAVE") == 1
    assert value(s, "trio_ha_ha_client_state", state="transfer") == 1
    assert value(s, "trio_ha_ha_client_state", state="diverged") == 0
    assert value(s, "trio_ha_ha_client_diverged") == 0
    assert value(s, "trio_ha_commitlog_max_offset") == end
    assert value(s, "trio_ha_ha_client_received_bytes_total") >= end
    assert 0 <= value(s, "trio_ha_ha_client_spliced_bytes_total") <= value(
        s, "trio_ha_ha_client_received_bytes_total")
    assert value(s, "trio_ha_messages_put_total") == 0
    assert "trio_ha_ha_slave_acked_offset" not in s
    assert "trio_ha_replication_wait_seconds_count" not in s

    # The name server: both brokers, the topic, their connections.
    assert value(n, "trio_ha_namesrv_brokers", cluster="DefaultCluster") == 2
    ages = n["trio_ha_namesrv_broker_registration_age_seconds"]
    assert sorted(a.labels["brokerId"] for a in ages) == ["0", "1"]
    assert all(0 <= a.value < 120 for a in ages)
    assert value(n, "trio_ha_namesrv_topics") >= 1
    assert value(n, "trio_ha_remoting_connections", listener="main") > 0


async def consume_one_per_queue(namesrv_addr: str) -> int:
    """Pull each queue of TOPIC and commit past its first message only, so the group lags by
    the rest; returns how many messages it consumed."""
    consumed = 0
    async with open_pull_consumer(namesrv_addr, GROUP) as consumer:
        for queue in await consumer.queues(TOPIC):
            result = await consumer.pull(queue, 0, 32, suspend_timeout=0)
            if result.status is PullStatus.FOUND and result.messages:
                await consumer.commit(queue, result.messages[0].queue_offset + 1)
                consumed += 1
    assert consumed > 0
    return consumed


# ---- the endpoint against bad clients --------------------------------------------------------


def one_counter_registry() -> CollectorRegistry:
    class One:
        def collect(self):
            family = CounterMetricFamily("trio_ha_test_things", "Things.", labels=["x"])
            family.add_metric(["y"], 7)
            yield family

    registry = CollectorRegistry()
    registry.register(One())
    return registry


async def test_only_get_of_metrics_answers_and_bad_requests_cost_their_connection(nursery):
    namesrv = NameServer(NamesrvConfig(listen_port=0, bind_address="127.0.0.1", metrics_port=0,
                                      kv_config_path=None))
    await nursery.start(namesrv.serve)
    assert namesrv.metrics_address is not None
    address = "{}:{}".format(*namesrv.metrics_address)
    head_limit = MetricsHttpLimits().max_request_head

    async def status_of(request: bytes) -> int | None:
        reply = await http(address, request)
        return reply[0] if reply is not None else None

    assert await status_of(get("/other")) == 404
    assert await status_of(get("/")) == 404
    assert await status_of(get("/metrics?name[]=x")) == 200
    assert await status_of(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n") == 405
    assert await status_of(b"\x00\x01\x02 garbage\r\n\r\n") == 400
    assert await status_of(b"GET /metrics SPDY/3\r\n\r\n") == 400
    assert await status_of(b"\xff" * 100 + b"\n\n") == 400
    # A head that never ends: read to the limit, refused, the connection closed.
    assert await status_of(b"A" * (head_limit + 4)) == 431
    # A client that closes halfway, and one that resets.
    host, port = namesrv.metrics_address
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"GET /metr")
        await stream.aclose()
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"GET /metrics HTTP/1.1\r\n")
        await trio.aclose_forcefully(stream)
    # HEAD: the headers only.
    reply = await http(address, b"HEAD /metrics HTTP/1.0\r\n\r\n")
    assert reply is not None and reply[0] == 200 and reply[2] == b""
    # The node still serves its series, and its routes.
    samples = await scrape(address)
    assert value(samples, "trio_ha_namesrv_topics") == 0
    assert namesrv.address is not None
    async with open_admin("{}:{}".format(*namesrv.address)) as admin:
        assert await admin.topic_list() == []


async def test_a_silent_client_is_closed_at_the_timeout_and_does_not_hold_others(nursery):
    limits = MetricsHttpLimits(timeout=0.5, max_connections=2)
    host, port = await nursery.start(
        lambda task_status: serve_metrics(one_counter_registry(), host="127.0.0.1", port=0,
                                          limits=limits, task_status=task_status))
    address = f"{host}:{port}"
    with trio.fail_after(10):
        silent = await trio.open_tcp_stream(host, port)
        # Another client is served meanwhile.
        samples = await scrape(address)
        assert value(samples, "trio_ha_test_things_total", x="y") == 7
        # The silent one is closed by the server (its timeout), with no reply.
        assert await silent.receive_some(1024) == b""
        await silent.aclose()


async def test_a_connection_over_the_budget_takes_the_place_of_the_oldest_waiting_one(nursery):
    limits = MetricsHttpLimits(max_connections=2)
    host, port = await nursery.start(
        lambda task_status: serve_metrics(one_counter_registry(), host="127.0.0.1", port=0,
                                          limits=limits, task_status=task_status))
    address = f"{host}:{port}"
    with trio.fail_after(20):
        oldest = await trio.open_tcp_stream(host, port)
        # (accepted first: the order is the endpoint's, not ours)
        await trio.testing.wait_all_tasks_blocked()
        newer = await trio.open_tcp_stream(host, port)
        # The budget is full of connections waiting for their heads: a scrape is answered,
        # the oldest waiting one closed for it, the newer one kept.
        samples = await scrape(address)
        assert value(samples, "trio_ha_test_things_total", x="y") == 7
        assert await oldest.receive_some(1024) == b""
        assert await hostile.scrape_status(address) == 200  # now the newer one makes way
        assert await newer.receive_some(1024) == b""
        await oldest.aclose()
        await newer.aclose()


@pytest.mark.parametrize("node", ["namesrv", "broker"])
async def test_a_scrape_gets_through_hundreds_of_idle_and_slowloris_connections(
        node, tmp_path):
    """Issue 35, defect 5: 300 slowloris or 3,000 idle connections made every scrape fail (the
    first 16 held the endpoint's places, every later connection was closed at once). The
    endpoint's budget now makes room for a newcomer by closing the connection that has waited
    longest for its request, so every scrape is answered while the crowd is held, for the
    name server's endpoint and the broker's alike."""
    async with contextlib.AsyncExitStack() as stack:
        if node == "namesrv":
            nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(nursery.cancel_scope.cancel)
            namesrv = NameServer(NamesrvConfig(listen_port=0, bind_address="127.0.0.1",
                                               metrics_port=0, kv_config_path=None))
            await nursery.start(namesrv.serve)
            assert namesrv.metrics_address is not None
            address = "{}:{}".format(*namesrv.metrics_address)
        else:
            cluster = await stack.enter_async_context(open_cluster(ClusterConfig(
                data_dir=tmp_path, slaves=0, properties={"metricsPort": 0})))
            address = cluster.master.started_addresses.metrics_addr
            assert address is not None
        with trio.fail_after(60):
            crowd = await hostile.crowd_the_metrics(address, idle=600, slowloris=300,
                                                    scrapes=3, seconds=40)
            assert crowd.connections == 900 and crowd.refused == 0, crowd
            assert crowd.answers == {"200": 3}, crowd
            assert crowd.closed_by_node >= 900 - MetricsHttpLimits().max_connections, crowd
            assert await hostile.scrape_status(address) == 200


async def test_a_failing_collector_answers_500_and_the_endpoint_goes_on(nursery, caplog):
    class Broken:
        def collect(self):
            raise RuntimeError("a bug in a series")
            yield  # a generator, as collectors are

    registry = CollectorRegistry()
    registry.register(Broken())
    host, port = await nursery.start(
        lambda task_status: serve_metrics(registry, host="127.0.0.1", port=0,
                                          task_status=task_status))
    for _ in range(2):
        reply = await http(f"{host}:{port}", get("/metrics"))
        assert reply is not None and reply[0] == 500
    assert "collecting the series failed" in caplog.text


# ---- the store's wait histogram --------------------------------------------------------------


def test_the_histogram_counts_each_wait_in_its_le_bucket():
    histogram = WaitHistogram((0.001, 0.01, 0.1))
    for seconds in (0.0, 0.001, 0.002, 0.01, 0.05, 5.0):
        histogram.observe(seconds)
    snapshot = histogram.snapshot()
    assert snapshot.counts == (2, 2, 1, 1)  # a wait equal to a bound is in that bucket
    assert snapshot.count == 6
    assert snapshot.total_seconds == pytest.approx(5.063)
    assert snapshot.cumulative() == [(0.001, 2), (0.01, 4), (0.1, 5), (math.inf, 6)]
    with pytest.raises(ValueError, match="ascend strictly"):
        WaitHistogram((0.1, 0.01))


async def test_a_sync_service_counts_every_answer_it_gives(autojump_clock):
    service = SyncRequestService(Watermark(), 5.0, PutMessageStatus.FLUSH_DISK_TIMEOUT, 8)
    statuses = []

    async def put(end: int) -> None:
        request = service.request(end, trio.current_time())
        statuses.append(await service.wait(request))

    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        nursery.start_soon(put, 10)
        await trio.testing.wait_all_tasks_blocked()  # in append order, as a store's puts
        nursery.start_soon(put, 20)
        await trio.sleep(0.003)
        service.watermark.raise_to(10)  # the first, after 3 ms; the second times out at 5 s
        await trio.sleep(6)
        nursery.cancel_scope.cancel()
    stats = service.statistics()
    assert sorted(statuses, key=str) == sorted(
        [PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT], key=str)
    assert (stats.completed, stats.timed_out, stats.waits.count) == (1, 1, 2)
    assert stats.waits.total_seconds == pytest.approx(5.003)
    by_bound = dict(stats.waits.cumulative())
    assert by_bound[0.0025] == 0 and by_bound[0.005] == 1  # 3 ms
    assert by_bound[2.5] == 1 and by_bound[5.0] == 2  # 5 s, the timeout


def test_metrics_port_is_a_broker_conf_key_unset_by_default():
    assert BrokerConfig().metrics_port is None
    assert BrokerConfig.from_properties("metricsPort=9100\n").metrics_port == 9100
    assert BrokerConfig.from_properties("metricsPort=0\n").to_properties()["metricsPort"] == "0"
    assert "metricsPort" not in BrokerConfig().to_properties()
    with pytest.raises(ConfigError, match="metricsPort"):
        BrokerConfig.from_properties("metricsPort=70000\n")
