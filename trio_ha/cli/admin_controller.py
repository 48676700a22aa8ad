"""``trio-ha admin``'s controller verbs: mqadmin's ``getControllerMetaData``,
``getSyncStateSet``, ``electMaster``, ``cleanBrokerMetadata`` and ``getControllerConfig``,
against a controller (``-a``, mqadmin's flag: one address or several separated by ``;``).

Why a module of its own: these talk to a controller, not through the name server as the rest
of ``admin`` does, and share one helper, ``_leader_call``: ask the given controllers who leads
(GET_METADATA_INFO, which any controller answers) and send the request there, signed with the
global ``--access-key`` / ``--secret-key`` when given, which an ACL-enabled controller needs
for every verb here but the two reads. A refusal is one line on stderr and exit 1, naming the
controller's code.
"""

from __future__ import annotations

from typing import Any

import typer

from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ._app import client_options
from .admin import _alias, _fail, admin_app, emit, emit_fields, json_option, run_client

#: each request to a controller is bounded by this (s)
TIMEOUT = 10.0


def controller_option() -> Any:
    return typer.Option(..., "-a", "--controller", envvar="CONTROLLER_ADDR",
                        help="controller(s), 'host:port;host:port'")


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


async def _leader(addresses: str) -> str:
    """The leader's address, as the first controller of ``addresses`` that answers says."""
    from ..remoting import RemotingError, open_remoting_client

    tried: list[str] = []
    for address in (a.strip() for a in addresses.split(";") if a.strip()):
        try:
            async with open_remoting_client(address, **client_options()) as client:
                reply = await client.invoke(RemotingCommand.request(
                    RequestCode.CONTROLLER_GET_METADATA_INFO), TIMEOUT)
        except (OSError, RemotingError) as exc:
            tried.append(f"{address}: {exc}")
            continue
        leader = reply.ext_fields.get("controllerLeaderAddress")
        if reply.code == ResponseCode.SUCCESS and leader:
            return leader
        tried.append(f"{address}: names no leader")
    raise _fail("no controller named a leader (" + "; ".join(tried) + ")")


async def _call(address: str, code: int, fields: dict[str, Any] | None = None,
                body: bytes = b"", *, ok: tuple[int, ...] = (ResponseCode.SUCCESS,)
                ) -> RemotingCommand:
    """One request to the controller at ``address``; a code outside ``ok`` is an error."""
    from ..remoting import open_remoting_client

    async with open_remoting_client(address, **client_options()) as client:
        reply = await client.invoke(RemotingCommand.request(code, fields, body), TIMEOUT)
    if reply.code not in ok:
        raise _fail(f"controller {address} answered {_code_name(reply.code)}: "
                    f"{reply.remark or ''}")
    return reply


async def _leader_call(addresses: str, code: int, fields: dict[str, Any] | None = None,
                       body: bytes = b"", *, ok: tuple[int, ...] = (ResponseCode.SUCCESS,)
                       ) -> RemotingCommand:
    return await _call(await _leader(addresses), code, fields, body, ok=ok)


@admin_app.command("controller-metadata")
def controller_metadata(controller: str = controller_option(),
                        as_json: bool = json_option()) -> None:
    """Who leads the controllers (mqadmin getControllerMetaData)."""
    address = controller.split(";")[0].strip()

    async def work() -> dict[str, str]:
        reply = await _call(address, RequestCode.CONTROLLER_GET_METADATA_INFO)
        return dict(reply.ext_fields)

    fields = run_client(work)
    emit_fields(fields, as_json=as_json, title=f"controller {address}")


_alias(controller_metadata, "getControllerMetaData")


@admin_app.command("sync-state-set")
def sync_state_set(controller: str = controller_option(),
                   broker_names: list[str] = typer.Option(..., "-b", "--broker-name",
                                                          help="broker name(s) of the sets"),
                   as_json: bool = json_option()) -> None:
    """Each set's master, epochs and members, in sync or not (mqadmin getSyncStateSet)."""
    from ..wire.controller import BrokerReplicasInfo, encode_broker_names

    async def work() -> BrokerReplicasInfo:
        reply = await _leader_call(controller, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
                                   body=encode_broker_names(broker_names))
        return BrokerReplicasInfo.decode(reply.body)

    table = run_client(work)
    rows: list[dict[str, Any]] = []
    for name, info in sorted(table.replicas_info_table.items()):
        for in_sync, replicas in ((True, info.in_sync_replicas),
                                  (False, info.not_in_sync_replicas)):
            for replica in replicas:
                rows.append({
                    "brokerName": name, "brokerId": replica.broker_id,
                    "address": replica.broker_address, "alive": replica.alive,
                    "inSync": in_sync, "master": replica.broker_id == info.master_broker_id,
                    "masterEpoch": info.master_epoch,
                    "syncStateSetEpoch": info.sync_state_set_epoch})
    emit(rows, as_json=as_json, title="sync state sets")


_alias(sync_state_set, "getSyncStateSet")


@admin_app.command("elect-master")
def elect_master(controller: str = controller_option(),
                 cluster: str = typer.Option(..., "-c", "--cluster", help="the cluster"),
                 broker_name: str = typer.Option(..., "-bn", "--broker-name",
                                                 help="the set's broker name"),
                 broker_id: int = typer.Option(..., "-b", "--broker-id",
                                               help="the controller id to make master"),
                 as_json: bool = json_option()) -> None:
    """Make one member of a set master, if it is alive and in sync (mqadmin electMaster)."""
    async def work() -> dict[str, str]:
        reply = await _leader_call(controller, RequestCode.CONTROLLER_ELECT_MASTER, {
            "clusterName": cluster, "brokerName": broker_name, "brokerId": broker_id,
            "designateElect": True})
        return dict(reply.ext_fields)

    fields = run_client(work)
    emit_fields(fields, as_json=as_json, title=f"{broker_name}: elected")


_alias(elect_master, "electMaster")


@admin_app.command("clean-broker-metadata")
def clean_broker_metadata(
    controller: str = controller_option(),
    cluster: str = typer.Option(..., "-c", "--cluster", help="the cluster"),
    broker_name: str = typer.Option(..., "-bn", "--broker-name", help="the set's broker name"),
    broker_ids: str | None = typer.Option(None, "-b", "--broker-ids",
                                          help="controller ids to forget, '1;2' (default: "
                                               "the whole set)"),
    clean_living: bool = typer.Option(False, "-l", "--clean-living",
                                      help="forget living brokers too"),
) -> None:
    """Forget members of a set, or the whole set (mqadmin cleanBrokerMetadata)."""
    fields: dict[str, Any] = {"clusterName": cluster, "brokerName": broker_name,
                              "isCleanLivingBroker": clean_living}
    if broker_ids:
        fields["brokerControllerIdsToClean"] = broker_ids

    async def work() -> None:
        await _leader_call(controller, RequestCode.CLEAN_BROKER_DATA, fields)

    run_client(work)
    print(f"cleaned {broker_ids or 'every member'} of {broker_name}")


_alias(clean_broker_metadata, "cleanBrokerMetadata")


@admin_app.command("controller-config")
def controller_config(controller: str = controller_option(),
                      as_json: bool = json_option()) -> None:
    """The controller's settings (mqadmin getControllerConfig)."""
    from ..config import parse_properties_text

    address = controller.split(";")[0].strip()

    async def work() -> dict[str, str]:
        reply = await _call(address, RequestCode.GET_CONTROLLER_CONFIG)
        return dict(parse_properties_text(reply.body.decode("utf-8", "replace")))

    table = run_client(work)
    emit_fields(table, as_json=as_json, title=f"controller {address}")


_alias(controller_config, "getControllerConfig")
