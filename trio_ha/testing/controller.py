"""Our controller for tests, in this process: ``async with open_controller() as ctl``.

It yields the controller's address and its live parts (the service, whose ``statistics()``
and heartbeat table a test reads, and the StateStore), on loopback at a free port with the
memory store unless told otherwise. Pass the same ``store`` to a second ``open_controller`` to
restart a controller on the state the first one committed. As a child process, the node kind
``controller`` of ``trio_ha.testing.node`` runs it (``NodeProcess.start(name, {"kind":
"controller", "properties": {...}})``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator

import attrs
import trio

from ..controller.config import ControllerServerConfig, StoreType
from ..controller.leadership import Leadership
from ..controller.memory import MemoryStateStore
from ..controller.server import ControllerServer, open_controller_service
from ..controller.service import ControllerService
from ..controller.state_store import StateStore

__all__ = ["RunningController", "open_controller"]


@attrs.frozen
class RunningController:
    address: str
    service: ControllerService
    store: StateStore


@contextlib.asynccontextmanager
async def open_controller(
    config: ControllerServerConfig | None = None, *, store: StateStore | None = None,
    leadership: Leadership | None = None,
) -> AsyncIterator[RunningController]:
    """A controller serving until the block ends (then shut down gracefully). Without a
    ``store``, the memory store, but for ``controllerType=etcd``: the etcd election and
    store of ``config``, as ``serve_controller`` opens them."""
    if config is None:
        config = ControllerServerConfig(listen_port=0, bind_address="127.0.0.1",
                                        store_type=StoreType.MEMORY)
    if store is None and config.store_type is not StoreType.ETCD:
        store = MemoryStateStore()
    async with open_controller_service(config, store=store, leadership=leadership) as (
            service, listeners), trio.open_nursery() as nursery:
        host, port = await nursery.start(functools.partial(
            ControllerServer(service).serve, listeners=listeners))
        yield RunningController(f"{host}:{port}", service, service.store)
        nursery.cancel_scope.cancel()
