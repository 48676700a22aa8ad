"""Issue 36, defect 2, against the real mqadmin (4.9.8): with the master SIGKILLed, mqadmin
``consumerProgress`` reads the group's lag from the slave (``selectBrokerAddr``); ours must
show the same lag, marked as the slave's."""

from __future__ import annotations

import re

import pytest

from test_tools_master_down import (
    CONSUMED,
    GROUP,
    SENT,
    TOPIC,
    ok,
    ok_json,
    slave_stats,
    wait_for,
)
from trio_ha.testing import ClusterConfig, ProcessCluster

pytestmark = pytest.mark.interop


def test_consumer_progress_with_the_master_down_agrees_with_mqadmin(rocketmq_clients, tmp_path):
    config = ClusterConfig(data_dir=tmp_path / "ours", properties=dict(
        mappedFileSizeCommitLog=1048576, slaveSyncInterval=500))
    with ProcessCluster.start(config) as cluster:
        namesrv, slave_addr = cluster.namesrv_addr, cluster.slave.addr
        ok("admin", "update-topic", "-n", namesrv, "-t", TOPIC, "-r", 4, "-w", 4)
        ok("produce", "-n", namesrv, "-t", TOPIC, "-c", SENT)
        ok("consume", "-n", namesrv, "-t", TOPIC, "-g", GROUP, "-c", CONSUMED, "-q")

        def slave_caught_up():
            stats = slave_stats(slave_addr)
            return stats is not None and stats.lag == SENT - CONSUMED and stats

        wait_for(slave_caught_up, "the slave to hold the group's offsets")
        cluster.master.kill()

        out = rocketmq_clients.mqadmin(tmp_path / "adm", "consumerProgress", "-n", namesrv,
                                       "-g", GROUP)
        assert "Exception" not in out, out
        total = re.search(r"Diff Total: (\d+)", out)
        assert total, out
        rows = ok_json("admin", "consumer-progress", "-n", namesrv, "-g", GROUP)
        assert sum(r["lag"] for r in rows) == int(total[1]) == SENT - CONSUMED
        assert {r["source"] for r in rows} == {"slave"}
