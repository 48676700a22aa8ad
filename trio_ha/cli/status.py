"""``trio-ha status``: the whole cluster at a glance, once or refreshing (``--watch``).

What an operator looks at first when something is wrong: which brokers are up and in which
role, how far each slave is behind its master (bytes, and the age of the oldest message it
does not have yet), whether a slave's replication is stuck or diverged and why, how much
each topic holds and how far behind each consumer group is. It is read from the name server
and each broker's runtime info, topic stats and consume stats; a broker that does not answer
is shown as such, not dropped.

**Controller mode** (RocketMQ 5): for each broker group whose brokers take their roles from a
controller, the controller's view too — the master, the master epoch and the in-sync set's
epoch, the in-sync set (ids and addresses, and whether the controller hears each member) —
and which controller leads. Where the controllers are: ``--controller host:port;...`` if
given (then every group the controller knows is shown); otherwise the ``controllerAddr`` of
the brokers whose config (GET_BROKER_CONFIG) says ``enableControllerMode=true``, which is
where those brokers themselves go (a name server with the embedded controller is only one of
the places a controller may run, so the name server's address is not assumed). The leader is
whoever GET_METADATA_INFO (1005) names, as mqadmin's ``getControllerMetaData`` learns it; the
sets come from the leader's GET_SYNC_STATE_DATA (1006), mqadmin's ``getSyncStateSet``. A
classic cluster looks as it always did: no broker names a controller, nothing is added.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import trio
import typer

from ._app import app, client_options
from .admin import (
    brokers_and_runtime,
    emit,
    format_ms,
    json_option,
    namesrv_option,
    run_client,
)

if TYPE_CHECKING:
    from ..client.admin import ByGroup

#: at most this many topics and groups are looked at (each costs a request per broker)
MAX_LISTED = 50


def _user_topic(topic: str, cluster_and_broker_names: set[str]) -> bool:
    from ..wire.metadata import (
        DLQ_GROUP_TOPIC_PREFIX,
        RETRY_GROUP_TOPIC_PREFIX,
        SYSTEM_TOPIC_PREFIX,
        SYSTEM_TOPICS,
    )

    return not (topic in SYSTEM_TOPICS or topic in cluster_and_broker_names
                or topic.lower().startswith(SYSTEM_TOPIC_PREFIX)
                or topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))
                or topic.endswith("_REPLY_TOPIC"))


def _user_group(group: str) -> bool:
    from ..broker.metadata.subscription_groups import (
        SYS_CONSUMER_GROUP_PREFIX,
        SYSTEM_CONSUMER_GROUPS,
    )

    return group not in SYSTEM_CONSUMER_GROUPS and not group.startswith(SYS_CONSUMER_GROUP_PREFIX)


def _int(table: dict[str, str], key: str) -> int | None:
    try:
        return int(table[key])
    except (KeyError, ValueError):
        return None


def split_addresses(text: str | None) -> list[str]:
    """``host:port;host:port`` (commas too) as a list."""
    return [a.strip() for a in (text or "").replace(",", ";").split(";") if a.strip()]


async def controller_status(admin: Any, members: list[tuple[str, str, int, str]],
                            controllers: list[str] | None) -> dict[str, Any] | None:
    """The controller's view of the controller-mode groups (see the module's docstring), or
    None when there are none and no controller was named."""
    from ..client import MQError

    if controllers:
        names = sorted({name for _, name, _, _ in members})
    else:
        configs: dict[str, dict[str, str]] = {}

        async def fetch(address: str) -> None:
            try:
                configs[address] = await admin.broker_config(address)
            except (MQError, OSError):
                pass  # its runtime info says it is down

        async with trio.open_nursery() as nursery:
            for *_, address in members:
                nursery.start_soon(fetch, address)
        found: set[str] = set()
        controller_groups: set[str] = set()
        for _, name, _, address in members:
            config = configs.get(address, {})
            if config.get("enableControllerMode", "").lower() == "true":
                controller_groups.add(name)
                found.update(split_addresses(config.get("controllerAddr")))
        if not found:
            return None
        controllers = sorted(found)
        names = sorted(controller_groups)
    view: dict[str, Any] = {"addresses": controllers, "leader": None, "leaderId": None,
                            "error": None, "groups": []}
    try:
        leader, meta = await admin.controller_leader(controllers)
        view.update(leader=leader, leaderId=meta.controller_leader_id)
        table = (await admin.sync_state_data(leader, names)).replicas_info_table
    except (MQError, OSError) as exc:
        view["error"] = str(exc)
        return view

    def replicas(found: Any) -> list[dict[str, Any]]:
        return [{"brokerId": r.broker_id, "address": r.broker_address, "alive": r.alive}
                for r in sorted(found, key=lambda r: r.broker_id)]

    for name in sorted(table):
        info = table[name]
        view["groups"].append({
            "brokerName": name, "masterBrokerId": info.master_broker_id,
            "masterAddress": info.master_address, "masterEpoch": info.master_epoch,
            "syncStateSetEpoch": info.sync_state_set_epoch,
            "inSync": replicas(info.in_sync_replicas),
            "notInSync": replicas(info.not_in_sync_replicas),
        })
    return view


async def cluster_status(namesrv: str, controllers: list[str] | None = None) -> dict[str, Any]:
    """Brokers, topics and groups, as ``status --json`` prints them; with controller-mode
    groups (or ``controllers`` named), ``controller`` too."""
    from ..client import MQError, open_admin
    from ..wire.record import encode_host, message_id, parse_host_port

    async with open_admin(namesrv, **client_options()) as admin:
        info, members, runtime = await brokers_and_runtime(admin)

        async def age_of_offset(master: str, offset: int) -> float | None:
            """Seconds since the message at ``offset`` of the master's log was stored: how
            old the oldest message a slave lacks is (None when the offset is not a record
            start, as a slave's may be mid-record)."""
            try:
                msg_id = message_id(encode_host(*parse_host_port(master)), offset)
                found = await admin.view_message(msg_id)
            except (MQError, OSError, ValueError):
                return None
            return max(0.0, time.time() - found.store_timestamp / 1000)

        masters = {name: address for _, name, broker_id, address in members if broker_id == 0}
        brokers = []
        for cluster, name, broker_id, address in members:
            table = runtime[address]
            row: dict[str, Any] = {
                "cluster": cluster, "brokerName": name, "brokerId": broker_id,
                "address": address, "role": table.get("brokerRole", "down"),
                "minOffset": _int(table, "commitLogMinOffset"),
                "maxOffset": _int(table, "commitLogMaxOffset"),
                "putTps": table.get("putTps"), "error": table.get("error"),
            }
            slaves = []
            i = 0
            while f"slave{i}Address" in table:
                slaves.append({"address": table[f"slave{i}Address"],
                               "ackedOffset": _int(table, f"slave{i}AckedOffset"),
                               "lagBytes": _int(table, f"slave{i}LagBytes")})
                i += 1
            if slaves:
                row["slaves"] = slaves
            if "haState" in table:
                master = masters.get(name)
                master_end = _int(runtime.get(master, {}), "commitLogMaxOffset") if master else None
                mine = row["maxOffset"]
                lag = (max(0, master_end - mine) if master_end is not None and mine is not None
                       else None)
                if table.get("haDivergence"):
                    # A diverged log is not "behind": how far it is from the master's end
                    # says nothing about what it lacks, and 0 would read as caught up.
                    lag = None
                row.update({
                    "haState": table["haState"], "haMaster": table.get("haMasterAddress") or None,
                    "divergence": table.get("haDivergence") or None, "lagBytes": lag,
                    "lagSeconds": (0.0 if lag == 0 else await age_of_offset(master, mine)
                                   if master and lag and mine is not None else None),
                })
            brokers.append(row)

        names = set(info.cluster_addr_table) | set(info.broker_addr_table)
        topics = [t for t in sorted(await admin.topic_list()) if _user_topic(t, names)]
        topic_rows = []
        for topic in topics[:MAX_LISTED]:
            try:
                found = await admin.topic_stats_by_group(topic)
            except (MQError, OSError) as exc:
                topic_rows.append({"topic": topic, "error": str(exc)})
                continue
            queues = found.figures.queues
            known = len(found.unknown) < len(found.answers)
            topic_rows.append({
                "topic": topic, "queues": len(queues) if known else None,
                "messages": sum(q.max_offset - q.min_offset for q in queues) if known else None,
                "lastUpdated": format_ms(max((q.last_update_ms for q in queues), default=0)),
                **source_fields(found),
            })

        # A group's name is known only to the brokers: with every broker of a group down,
        # its consumer groups are unknown, which the JSON says (``groupsUnknownFor``).
        try:
            listed = await admin.subscription_groups_by_group()
        except (MQError, OSError) as exc:
            listed = None
            groups_error: str | None = str(exc)
        else:
            groups_error = None
        groups = [g for g in listed.figures if _user_group(g)] if listed else []
        group_rows = []
        for group in groups[:MAX_LISTED]:
            try:
                progress = await admin.consume_stats_by_group(group)
            except (MQError, OSError) as exc:
                group_rows.append({"group": group, "error": str(exc)})
                continue
            known = len(progress.unknown) < len(progress.answers)
            if progress.figures.queues or not known:
                queues = progress.figures.queues
                group_rows.append({"group": group, "queues": len(queues) if known else None,
                                   "lag": progress.figures.lag if known else None,
                                   "topics": sorted({q.queue.topic for q in queues}),
                                   **source_fields(progress)})
        unknown = sorted({a.broker_name for a in listed.unknown}) if listed else []
        controller = await controller_status(admin, members, controllers)
    snapshot = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "brokers": brokers,
                "topics": topic_rows, "groups": group_rows, "groupsUnknownFor": unknown,
                "groupsError": groups_error,
                "truncated": len(topics) > MAX_LISTED or len(groups) > MAX_LISTED}
    if controller is not None:
        snapshot["controller"] = controller
    return snapshot


def source_fields(found: ByGroup) -> dict[str, Any]:
    """Where a topic's or group's figures come from: ``source`` is ``master`` (every
    broker group's master answered), ``slave`` (some only through a slave, whose copy may
    trail), ``partial`` (some groups unknown: the figures are a lower bound) or ``unknown``
    (no group answered: no figures at all); the groups concerned are named."""
    slaves = sorted(a.broker_name for a in found.from_slaves)
    unknown = sorted(a.broker_name for a in found.unknown)
    if not found.answers or len(unknown) == len(found.answers):
        word = "unknown"
    else:
        word = "partial" if unknown else "slave" if slaves else "master"
    fields: dict[str, Any] = {"source": word}
    if slaves:
        fields["fromSlaveOf"] = slaves
    if unknown:
        fields["unknownFor"] = unknown
    return fields


def source_text(row: dict[str, Any]) -> str | None:
    """A topic's or group's ``source`` for the table: nothing when every master answered."""
    word = row.get("source")
    if word in (None, "master"):
        return None
    parts = [f"slave of {', '.join(row['fromSlaveOf'])}"] if row.get("fromSlaveOf") else []
    if row.get("unknownFor"):
        parts.append(f"unknown for {', '.join(row['unknownFor'])}")
    return "; ".join(parts) or str(word)


def log_span(broker: dict[str, Any]) -> str:
    """``[min, max)`` of a broker's commitlog, or ``unknown`` when it did not answer."""
    low, high = broker.get("minOffset"), broker.get("maxOffset")
    return "unknown" if low is None or high is None else f"[{low}, {high})"


def unknown_cells(row: dict[str, Any], *names: str) -> dict[str, Any]:
    """``row`` for the table: the figures nobody could give read ``unknown``, not blank."""
    if row.get("source") != "unknown" or row.get("error"):
        return row
    return {**row, **{name: "unknown" for name in names if row.get(name) is None}}


def lag_text(lag_bytes: int | None) -> str:
    """``lag 120 B``, or ``lag unknown`` when nobody could say: never ``lag None B``."""
    return "lag unknown" if lag_bytes is None else f"lag {lag_bytes} B"


def puts_per_second(broker: dict) -> str:
    """The 10 s window of runtime info's putTps ("10s 60s 600s", as RocketMQ reports it)."""
    try:
        return f"{float(str(broker.get('putTps')).split()[0]):.1f}"
    except (ValueError, IndexError):
        return "?"


def not_ready(status: dict[str, Any]) -> str | None:
    """Why the cluster is not ready to take SYNC_MASTER sends, or None: every broker group
    needs its master up, a SYNC_MASTER a slave attached, and every slave copying (HA
    transfer) with nothing left to copy."""
    if not status["brokers"]:
        return "no broker has registered"
    groups: dict[str, list[dict[str, Any]]] = {}
    for broker in status["brokers"]:
        groups.setdefault(broker["brokerName"], []).append(broker)
    for name, members in sorted(groups.items()):
        if not any(b["brokerId"] == 0 for b in members):
            return f"{name} has no master"
        for b in members:
            if b.get("error"):
                return f"{name}/{b['brokerId']} does not answer: {b['error']}"
            if b.get("role") == "SYNC_MASTER" and not b.get("slaves"):
                # (a slave that has not registered yet is not listed at all: the master's
                # own word is what counts)
                return (f"{name}/{b['brokerId']} is a SYNC_MASTER without an attached slave "
                        f"(its sends would answer SLAVE_NOT_AVAILABLE)")
            if b.get("divergence"):
                return f"{name}/{b['brokerId']} has DIVERGED: {b['divergence']}"
            if "haState" in b and (b["haState"] != "transfer" or b.get("lagBytes") != 0):
                return (f"{name}/{b['brokerId']} is not caught up (HA {b['haState']}, "
                        f"{lag_text(b.get('lagBytes'))})")
    return None


def replicas_text(replicas: list[dict[str, Any]]) -> str:
    """``1 127.0.0.1:10911, 3 127.0.0.1:10931 (not heard)``."""
    return ", ".join(f"{r['brokerId']} {r['address']}" + ("" if r["alive"] else " (not heard)")
                     for r in replicas) or "none"


def controller_lines(view: dict[str, Any]) -> list[str]:
    """The controller's view as lines: the leader, then one line per group."""
    where = ", ".join(view["addresses"])
    if view.get("error"):
        return [f"controller ({where}): {view['error']}"]
    lines = [f"controller leader {view['leader']} (id {view.get('leaderId') or '?'}; asked "
             f"{where})"]
    for g in view["groups"]:
        master = (f"master {g['masterBrokerId']} at {g['masterAddress']}"
                  if g.get("masterAddress") else "NO MASTER")
        line = (f"{g['brokerName']}: {master}, epoch {g['masterEpoch']} (in-sync set epoch "
                f"{g['syncStateSetEpoch']}), in sync: {replicas_text(g['inSync'])}")
        if g["notInSync"]:
            line += f"; not in sync: {replicas_text(g['notInSync'])}"
        lines.append(line)
    return lines


def _print_controller(view: dict[str, Any]) -> None:
    where = ", ".join(view["addresses"])
    if view.get("error"):
        print(f"controller ({where}): unknown: {view['error']}")
        return
    rows = [{"group": g["brokerName"],
             "master": (f"{g['masterBrokerId']} {g['masterAddress']}"
                        if g.get("masterAddress") else "none"),
             "epoch": f"{g['masterEpoch']} / {g['syncStateSetEpoch']}",
             "in sync": replicas_text(g["inSync"]),
             "not in sync": replicas_text(g["notInSync"]) if g["notInSync"] else None}
            for g in view["groups"]]
    emit(rows, as_json=False,
         title=(f"controller mode: leader {view['leader']} (id {view.get('leaderId') or '?'}); "
                "epoch = master / in-sync set"),
         columns=["group", "master", "epoch", "in sync", "not in sync"])


def _print_status(status: dict[str, Any]) -> None:
    brokers = []
    for b in status["brokers"]:
        ha = ""
        if "slaves" in b:
            ha = ", ".join(f"{s['address']} acked {s['ackedOffset']} {lag_text(s['lagBytes'])}"
                           for s in b["slaves"])
        elif "haState" in b:
            age = b.get("lagSeconds")
            ha = f"{b['haState']} from {b.get('haMaster') or '?'}, "
            if b.get("divergence"):  # no lag beside it: a diverged slave is not caught up
                ha += f"DIVERGED: {b['divergence']}"
            else:
                ha += (lag_text(b.get("lagBytes"))
                       + (f" / {age:.1f} s" if age is not None else ""))
        brokers.append({"broker": f"{b['brokerName']}/{b['brokerId']}", "address": b["address"],
                        "role": b["role"], "log": log_span(b),
                        "puts/s": puts_per_second(b), "replication": ha,
                        "error": b.get("error")})
    emit(brokers, as_json=False, title=f"brokers at {status['time']}")
    if status.get("controller") is not None:
        _print_controller(status["controller"])
    if not status["brokers"]:
        print("topics and consumer groups: unknown (the name server lists no broker)")
        return
    columns = ["topic", "queues", "messages", "lastUpdated", "source", "error"]
    emit([{**unknown_cells(t, "queues", "messages"), "source": source_text(t)}
          for t in status["topics"]], as_json=False, title="topics", columns=columns)
    groups_title = "consumer groups"
    if status.get("groupsError"):
        groups_title += f" (unknown: {status['groupsError']})"
    elif status.get("groupsUnknownFor"):
        groups_title += (f" (those of {', '.join(status['groupsUnknownFor'])} unknown: "
                         "no broker answered)")
    if not status["groups"] and groups_title != "consumer groups":
        print(groups_title)  # not "none": there may be groups nobody could name
    else:
        emit([{**unknown_cells(g, "queues", "lag"), "topics": " ".join(g.get("topics", [])),
               "source": source_text(g)} for g in status["groups"]], as_json=False,
             title=groups_title, columns=["group", "queues", "lag", "topics", "source",
                                          "error"])
    if status["truncated"]:
        print(f"(only the first {MAX_LISTED} topics and groups are shown)")


@app.command()
def status(
    namesrv: str = namesrv_option(),
    as_json: bool = json_option(),
    watch: float = typer.Option(0, "--watch", min=0,
                                help="refresh every this many seconds (0: once)"),
    count: int = typer.Option(0, "--count", min=0,
                              help="with --watch: stop after this many (0: until Ctrl-C)"),
    wait_ready: float = typer.Option(
        0, "--wait-ready", min=0,
        help="first wait up to this many seconds for every group's master and caught-up "
             "slaves (exit 1 if they are not)"),
    controller: str | None = typer.Option(
        None, "--controller",
        help="controllers (host:port;...) to ask for the controller-mode view (default: the "
             "controllerAddr of brokers in controller mode)"),
) -> None:
    """The cluster at a glance: brokers and roles, log spans, slave lag and HA state,
    topics, consumer-group lag; in controller mode, each group's master, epochs, in-sync
    set and the controller leader."""
    controllers = split_addresses(controller) or None
    if wait_ready:
        _wait_until_ready(namesrv, wait_ready)

    async def show() -> None:
        # The whole watch is one trio run (one signal receiver), its pauses trio sleeps: a
        # Ctrl-C at any moment cancels it and exits 130, as for every command. (A trio run
        # per refresh with time.sleep between them once left a SIGINT unanswered: the
        # process slept on in time.sleep, the signal gone.)
        shown = 0
        while True:
            snapshot = await cluster_status(namesrv, controllers)
            if as_json:
                print(json.dumps(snapshot), flush=True)
            else:
                if watch and sys.stdout.isatty():
                    print("\x1b[2J\x1b[H", end="")  # clear the screen between refreshes
                _print_status(snapshot)
                sys.stdout.flush()
            shown += 1
            if not watch or (count and shown >= count):
                return
            await trio.sleep(watch)

    run_client(show)


def _wait_until_ready(namesrv: str, timeout: float) -> None:
    """Poll the cluster (every 0.2 s) until ``not_ready`` finds nothing, for at most
    ``timeout`` seconds; exit 1 naming what was still missing."""
    from ..client import MQError

    async def wait() -> str | None:
        problem: str | None = "not asked yet"
        with trio.move_on_after(timeout):
            while True:
                try:
                    problem = not_ready(await cluster_status(namesrv))
                except (MQError, OSError) as exc:
                    problem = str(exc)
                if problem is None:
                    return None
                await trio.sleep(0.2)
        return problem

    problem = trio.run(wait)
    if problem is not None:
        print(f"trio-ha: not ready after {timeout:g} s: {problem}", file=sys.stderr)
        raise typer.Exit(1)
