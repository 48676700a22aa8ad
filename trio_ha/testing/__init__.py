"""Testing helpers, public as ``trio.testing`` is: for this package's tests and for
applications that embed it.

* a cluster on loopback — a name server, a master and N slaves — in this process
  (:func:`serve_cluster` in your nursery, or ``async with`` :func:`open_cluster` to stop and
  restart brokers) or as child processes (:class:`ProcessCluster`), both described by one
  :class:`ClusterConfig`;
* our controller (RocketMQ 5's controller mode) in this process (:func:`open_controller`),
  or as a child process (:class:`NodeProcess`, kind ``controller``);
* :class:`FaultProxy` (:func:`open_fault_proxy`): a TCP proxy between a slave and its master
  that stalls, delays or cuts the replication stream at an exact byte of a frame;
* :class:`EtcdCluster`: a real etcd cluster (1 or 3 members) as child processes, for the
  replicated controller, with members to kill, pause and restart.

Nothing here is used by the store or the broker.
"""

from .cluster import (
    Cluster,
    ClusterAddresses,
    ClusterBroker,
    ClusterConfig,
    open_cluster,
    serve_cluster,
)
from .controller import RunningController, open_controller
from .etcd import EtcdCluster
from .fault_proxy import Cut, FaultProxy, ProxyConnection, open_fault_proxy
from .ports import free_broker_port
from .processes import NodeProcess, ProcessCluster

__all__ = [
    "Cluster",
    "ClusterAddresses",
    "ClusterBroker",
    "ClusterConfig",
    "Cut",
    "EtcdCluster",
    "FaultProxy",
    "NodeProcess",
    "ProcessCluster",
    "ProxyConnection",
    "RunningController",
    "free_broker_port",
    "open_cluster",
    "open_controller",
    "open_fault_proxy",
    "serve_cluster",
]
