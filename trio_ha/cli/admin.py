"""The operator's admin commands: ``trio-ha admin ...`` (mqadmin's verbs) and ``trio-ha
message get``.

Every command talks to a running cluster through its name server (``-n``, else
``$NAMESRV_ADDR``, else 127.0.0.1:9876) with the project's own client library, and prints a
table, or the same rows as JSON with ``--json`` (for scripts: one document on stdout, nothing
else there). The admin verbs keep mqadmin's names in kebab case, and answer to mqadmin's
camelCase too (``trio-ha admin clusterList``), so an operator's habits carry over.

A failure an operator can act on (no name server there, an unknown topic, a broker's refusal)
is one line on stderr and exit code 1, as for the node commands.

Why one module at about 700 lines: one command per mqadmin verb, each a few lines around one
client call and a table, sharing the table and source-marking helpers at its top.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import trio
import typer

from ._app import app, client_options
from ._failures import run_cancellable

if TYPE_CHECKING:
    from ..client.admin import Answered, ByGroup
    from ..wire.route import ClusterInfo
    from ..wire.stats import ConsumeStats

admin_app = typer.Typer(
    no_args_is_help=True,
    help="Cluster administration over the name server (mqadmin's verbs; --json for scripts).",
)
app.add_typer(admin_app, name="admin")
message_app = typer.Typer(no_args_is_help=True, help="Look up messages.")
app.add_typer(message_app, name="message")

NAMESRV_DEFAULT = "127.0.0.1:9876"

_T = TypeVar("_T")

#: rows of a table: each a dict, columns named by their keys
Rows = list[dict[str, Any]]


def namesrv_option() -> Any:
    return typer.Option(NAMESRV_DEFAULT, "-n", "--namesrv", envvar="NAMESRV_ADDR",
                        help="name server(s), 'host:port;host:port'")


def json_option() -> Any:
    return typer.Option(False, "--json", help="print JSON instead of a table")


def run_client(work: Callable[[], Awaitable[_T]],
               interrupted: Callable[[], str] | None = None, *,
               stop: trio.CancelScope | None = None) -> _T:
    """Run ``work`` under trio. A Ctrl-C (or SIGTERM) cancels it (or only ``stop``, a scope
    inside it: see ``run_cancellable``), prints ``interrupted()``, if given, as one line on
    stderr (what got done) and exits 128 + the signal. Failures are the app's to report (one
    line and exit 1 for an error of ours)."""
    result, signum = run_cancellable(work, forgive_after_signal=True, stop=stop)
    if signum is not None:
        if interrupted is not None:
            print(f"trio-ha: interrupted: {interrupted()}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)
    return cast("_T", result)


def _fail(message: str) -> typer.Exit:
    print(f"trio-ha: {message}", file=sys.stderr)
    return typer.Exit(1)


def emit(rows: Rows, *, as_json: bool, title: str | None = None,
         columns: Sequence[str] | None = None) -> None:
    """Print ``rows`` as a table (rich) or as a JSON array."""
    if as_json:
        print(json.dumps(rows, indent=1, default=str))
        return
    if not rows:
        print(f"{title}: none" if title else "none")
        return
    from rich.console import Console
    from rich.table import Table

    names = list(columns) if columns is not None else list(rows[0]) if rows else []
    # Columns nobody filled in (no broker reported an error, say) are left out.
    names = [n for n in names if any(row.get(n) is not None for row in rows)] or names
    table = Table(title=title, show_lines=False, header_style="bold")
    for name in names:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*("" if row.get(n) is None else str(row.get(n)) for n in names))
    # A pipe or a file gets the whole table, not one folded to 80 columns.
    Console(width=None if sys.stdout.isatty() else 240).print(table)


def emit_fields(fields: Mapping[str, Any], *, as_json: bool, title: str | None = None) -> None:
    """Print a mapping as key/value rows, sorted by key (``emit``)."""
    emit([{"key": k, "value": v} for k, v in sorted(fields.items())], as_json=as_json,
         title=title)


def tps_text(put_tps: object) -> str | None:
    """Runtime info's putTps ("10s 60s 600s" windows, each a float with 15 digits) with one
    decimal each, as a person reads it."""
    if put_tps is None:
        return None
    try:
        return " ".join(f"{float(part):.1f}" for part in str(put_tps).split())
    except ValueError:
        return str(put_tps)


def _alias(command: Callable, *names: str) -> None:
    """Register ``command`` under mqadmin's camelCase names too (hidden from the help)."""
    for name in names:
        admin_app.command(name, hidden=True)(command)


# ---- cluster and topics ------------------------------------------------------------------------


async def brokers_and_runtime(admin) -> tuple[ClusterInfo, list[tuple[str, str, int, str]],
                                              dict[str, dict[str, str]]]:
    """The name server's cluster info; every broker it knows, as (cluster, brokerName,
    brokerId, address); and each one's runtime info, asked all at once (a broker that does
    not answer has ``{"error": why}``, so one broker down hides none of the others)."""
    from ..client import MQError

    info = await admin.cluster_info()
    brokers = [(cluster, name, broker_id, address)
               for cluster, names in sorted(info.cluster_addr_table.items())
               for name in sorted(names)
               if (data := info.broker_addr_table.get(name)) is not None
               for broker_id, address in sorted(data.broker_addrs.items())]
    runtime: dict[str, dict[str, str]] = {}

    async def fetch(address: str) -> None:
        try:
            runtime[address] = await admin.runtime_info(address)
        except (MQError, OSError) as exc:
            runtime[address] = {"error": str(exc)}

    async with trio.open_nursery() as nursery:
        for *_, address in brokers:
            nursery.start_soon(fetch, address)
    return info, brokers, runtime


async def cluster_rows(namesrv: str) -> Rows:
    """A row per broker of every cluster, with what its runtime info says."""
    from ..client import open_admin

    async with open_admin(namesrv, **client_options()) as admin:
        _, brokers, runtime = await brokers_and_runtime(admin)
    rows = []
    for cluster, name, broker_id, address in brokers:
        table = runtime.get(address, {})
        rows.append({
            "cluster": cluster, "brokerName": name, "brokerId": broker_id, "address": address,
            "role": table.get("brokerRole", "?"), "version": table.get("brokerVersionDesc"),
            "putTps": tps_text(table.get("putTps")),
            "commitLogMinOffset": _int(table, "commitLogMinOffset"),
            "commitLogMaxOffset": _int(table, "commitLogMaxOffset"),
            "error": table.get("error"),
        })
    return rows


def _int(table: dict[str, str], key: str) -> int | None:
    try:
        return int(table[key])
    except (KeyError, ValueError):
        return None


@admin_app.command("cluster-list")
def cluster_list(namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """Every broker of every cluster: name, id, address, role, version, put rate, log span."""
    rows = run_client(lambda: cluster_rows(namesrv))
    emit(rows, as_json=as_json, title="clusters",
         columns=["cluster", "brokerName", "brokerId", "address", "role", "version", "putTps",
                  "commitLogMinOffset", "commitLogMaxOffset", "error"])


_alias(cluster_list, "clusterList")


@admin_app.command("topic-list")
def topic_list(cluster: str = typer.Option(None, "-c", "--cluster",
                                           help="only the topics on this cluster's brokers"),
               namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """Every topic the name server knows (of one cluster with -c)."""
    from ..client import open_admin

    async def work() -> list[str]:
        async with open_admin(namesrv, **client_options()) as admin:
            if cluster is not None:
                return await admin.topics_by_cluster(cluster)
            return sorted(await admin.topic_list())

    topics = run_client(work)
    emit([{"topic": t} for t in topics], as_json=as_json, columns=["topic"])


_alias(topic_list, "topicList")


@admin_app.command("topic-route")
def topic_route(topic: str = typer.Option(..., "-t", "--topic", help="the topic"),
                namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """The name server's route of a topic: its broker groups and queue numbers."""
    from ..client import open_admin

    async def work():
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.topic_route(topic)

    route = run_client(work)
    if route is None:
        raise _fail(f"the name server knows no topic {topic!r}")
    if as_json:
        print(json.dumps(route.to_json_obj(), indent=1))
        return
    queues = {q.broker_name: q for q in route.queue_datas}
    rows = []
    for data in route.broker_datas:
        q = queues.get(data.broker_name)
        for broker_id, address in sorted(data.broker_addrs.items()):
            rows.append({"brokerName": data.broker_name, "brokerId": broker_id,
                         "address": address,
                         "readQueueNums": q.read_queue_nums if q else None,
                         "writeQueueNums": q.write_queue_nums if q else None,
                         "perm": q.perm if q else None})
    emit(rows, as_json=False, title=f"route of {topic}")


_alias(topic_route, "topicRoute")


@admin_app.command("update-topic")
def update_topic(
    topic: str = typer.Option(..., "-t", "--topic", help="the topic"),
    cluster: str = typer.Option(None, "-c", "--cluster",
                                help="every master of this cluster (default: the only one)"),
    read_queues: int = typer.Option(8, "-r", "--read-queues", min=1, max=1024,
                                   help="queues consumers read, on each master"),
    write_queues: int = typer.Option(8, "-w", "--write-queues", min=1, max=1024,
                                    help="queues producers write, on each master"),
    perm: int = typer.Option(6, "-p", "--perm", help="2 read, 4 write, 6 both"),
    order: bool = typer.Option(False, "-o", "--order", help="an ordered topic"),
    namesrv: str = namesrv_option(), as_json: bool = json_option(),
) -> None:
    """Create a topic, or change its queue numbers and permission, on every master."""
    from ..client import open_admin

    async def work() -> dict[str, str]:
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.create_topic(topic, cluster=cluster, read_queue_nums=read_queues,
                                            write_queue_nums=write_queues, perm=perm,
                                            order=order)

    done = run_client(work)
    emit([{"topic": topic, "brokerName": n, "master": a} for n, a in sorted(done.items())],
         as_json=as_json, title="topic created or updated")


_alias(update_topic, "updateTopic")


@admin_app.command("topic-status")
def topic_status(topic: str = typer.Option(..., "-t", "--topic", help="the topic"),
                 namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """Each queue of a topic: min and max offset, the time of its last message. A broker
    group whose master is down answers from a slave (source: slave); one none of whose
    brokers answers is a row with source unknown. Exit 1 only when no group answered."""
    from ..client import open_admin

    async def work():
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.topic_stats_by_group(topic)

    found = run_client(work)
    rows: Rows = []
    for q in found.figures.queues:
        answer = found.answer_of(q.queue.broker_name)
        rows.append({"brokerName": q.queue.broker_name, "queueId": q.queue.queue_id,
                     "minOffset": q.min_offset, "maxOffset": q.max_offset,
                     "lastUpdated": format_ms(q.last_update_ms), **source_fields(answer)})
    rows += unknown_rows(found.unknown)
    if found.answers and len(found.unknown) == len(found.answers):
        raise _fail(f"status of {topic} unknown: {unknown_text(found.unknown)}")
    emit(rows, as_json=as_json, title=f"status of {topic}{from_slaves_note(found)}",
         columns=["brokerName", "queueId", "minOffset", "maxOffset", "lastUpdated", "source",
                  "sourceAddress", "error"])


_alias(topic_status, "topicStatus")


def source_fields(answer: Answered | None) -> dict[str, Any]:
    """The columns that say which broker of a row's group gave its figures."""
    if answer is None:
        return {"source": "unknown", "sourceAddress": None}
    return {"source": answer.source, "sourceAddress": answer.address}


def unknown_rows(unknown: Iterable[Answered]) -> Rows:
    """A row for each broker group none of whose brokers answered: its figures are unknown
    (None, an empty cell), never zero."""
    return [{"brokerName": a.broker_name, "source": "unknown", "sourceAddress": None,
             "error": a.error} for a in unknown]


def unknown_text(unknown: Iterable[Answered]) -> str:
    return "no broker answered for " + "; ".join(f"{a.broker_name} ({a.error})"
                                                 for a in unknown)


def from_slaves_note(found: ByGroup) -> str:
    """What a title adds when some figures come from slaves, or are unknown."""
    notes = []
    slaves = sorted(a.broker_name for a in found.from_slaves)
    if slaves:
        notes.append(f"from a slave for {', '.join(slaves)}: the master is down or not "
                     "registered")
    unknown = sorted(a.broker_name for a in found.unknown)
    if unknown:
        notes.append(f"unknown for {', '.join(unknown)}: no broker answered")
    return f" ({'; '.join(notes)})" if notes else ""


def format_ms(ms: int) -> str | None:
    if ms <= 0:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


# ---- brokers -----------------------------------------------------------------------------------


@admin_app.command("broker-status")
def broker_status(broker: str = typer.Option(..., "-b", "--broker", help="broker host:port"),
                  namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """The broker's runtime statistics (GET_BROKER_RUNTIME_INFO), key by key."""
    from ..client import open_admin

    async def work() -> dict[str, str]:
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.runtime_info(broker)

    table = run_client(work)
    emit_fields(table, as_json=as_json, title=f"broker {broker}")


_alias(broker_status, "brokerStatus")


@admin_app.command("broker-config")
def broker_config(broker: str = typer.Option(..., "-b", "--broker", help="broker host:port"),
                  namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """Every setting of a broker, by RocketMQ's key names."""
    from ..client import open_admin

    async def work() -> dict[str, str]:
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.broker_config(broker)

    table = run_client(work)
    emit_fields(table, as_json=as_json, title=f"config of {broker}")


_alias(broker_config, "getBrokerConfig")


# ---- consumers ---------------------------------------------------------------------------------


def progress_rows(found: ByGroup[ConsumeStats]) -> Rows:
    rows: Rows = [{"topic": q.queue.topic, "brokerName": q.queue.broker_name,
                   "queueId": q.queue.queue_id, "brokerOffset": q.broker_offset,
                   "consumerOffset": q.consumer_offset, "lag": q.lag,
                   "lastConsumed": format_ms(q.last_timestamp),
                   **source_fields(found.answer_of(q.queue.broker_name))}
                  for q in found.figures.queues]
    return rows + [{"topic": None, **row} for row in unknown_rows(found.unknown)]


def lag_title(group: str, found: ByGroup[ConsumeStats]) -> str:
    """``billing: lag 600 messages``, with what part of it is a slave's or unknown."""
    lag = found.figures.lag
    known = f"lag {lag} messages" if not found.unknown else f"lag at least {lag} messages"
    return f"{group}: {known}{from_slaves_note(found)}"


@admin_app.command("consumer-progress")
def consumer_progress(group: str = typer.Option(..., "-g", "--group", help="the consumer group"),
                      topic: str = typer.Option(
                          None, "-t", "--topic",
                          help="only this topic (default: all of the group's)"),
                      namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """A consumer group's progress per queue: broker offset, committed offset and lag. A
    broker group whose master is down answers from a slave (source: slave; the slave's copy
    of the offsets trails the master's by up to its slaveSyncInterval); one none of whose
    brokers answers is a row with source unknown and no lag. Exit 1 only when no group
    answered (the lag is unknown)."""
    from ..client import open_admin

    async def work():
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.consume_stats_by_group(group, topic)

    found = run_client(work)
    if not found.answers:
        raise _fail(f"lag of {group} unknown: the name server lists no broker")
    if len(found.unknown) == len(found.answers):
        raise _fail(f"lag of {group} unknown: {unknown_text(found.unknown)}")
    rows = progress_rows(found)
    if not rows and not as_json:
        # not "lag 0": a group that committed nothing has no lag to speak of
        print(f"{group}: no broker holds an offset of this group (it has committed none)")
        return
    emit(rows, as_json=as_json, title=lag_title(group, found),
         columns=["topic", "brokerName", "queueId", "brokerOffset", "consumerOffset", "lag",
                  "lastConsumed", "source", "sourceAddress", "error"])


_alias(consumer_progress, "consumerProgress")


@admin_app.command("consumer-connection")
def consumer_connection(group: str = typer.Option(..., "-g", "--group", help="the consumer group"),
                        namesrv: str = namesrv_option(),
                        as_json: bool = json_option()) -> None:
    """A consumer group's live clients (from its brokers' masters, or a slave of a group
    whose master is down: consumers heartbeat slaves too)."""
    from ..client import open_admin

    async def work():
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.consumer_connections_answered(group)

    answer, body = run_client(work)
    if as_json:
        print(json.dumps({**body, **source_fields(answer)}, indent=1))
        return
    note = (f" (from the slave {answer.address} of {answer.broker_name}: its master is down)"
            if answer.source == "slave" else "")
    emit([{k: c.get(k) for k in ("clientId", "clientAddr", "language", "version")}
          for c in body.get("connectionSet", [])], as_json=False,
         title=f"{group}: {body.get('consumeType')} {body.get('messageModel')}{note}")


_alias(consumer_connection, "consumerConnection")


# ---- messages ----------------------------------------------------------------------------------


def message_row(m) -> dict[str, Any]:
    body = m.body.decode("utf-8", "replace")
    return {"offsetMsgId": m.msg_id, "msgId": m.properties.get("UNIQ_KEY"), "topic": m.topic,
            "queueId": m.queue_id, "queueOffset": m.queue_offset,
            "commitLogOffset": m.commitlog_offset, "tags": m.tags, "keys": " ".join(m.keys),
            "storeTime": format_ms(m.store_timestamp), "bornHost": m.born_host,
            "storeHost": m.store_host, "reconsumeTimes": m.reconsume_times,
            "bodySize": len(m.body), "body": body if len(body) <= 4096 else body[:4096] + "...",
            "properties": dict(m.properties)}


def _print_messages(messages: Iterable, *, as_json: bool) -> None:
    rows = [message_row(m) for m in messages]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        emit([{"field": k, "value": v} for k, v in row.items() if k != "properties"]
             + [{"field": f"property {k}", "value": v}
                for k, v in sorted(row["properties"].items())],
             as_json=False, title=row["offsetMsgId"])


@message_app.command("get")
def message_get(
    message_id: str = typer.Argument(..., help="offsetMsgId, or the client's msgId (UNIQ_KEY) "
                                               "with --topic"),
    topic: str | None = typer.Option(None, "-t", "--topic",
                                     help="the topic, to look up a client msgId (UNIQ_KEY)"),
    namesrv: str = namesrv_option(), as_json: bool = json_option(),
) -> None:
    """A message by id: the broker's offsetMsgId (store address and commitlog offset), or,
    with --topic, the msgId the client gave it (UNIQ_KEY, through the index)."""
    from ..client import MQError, open_admin

    async def work() -> tuple[list, str | None]:
        async with open_admin(namesrv, **client_options()) as admin:
            # Both ids are 32 hex digits: with a topic, the client's id is tried first.
            if topic is not None:
                found = await admin.query_by_key(topic, message_id, unique_key=True)
                if found:
                    return found, None
            try:
                answer, message = await admin.view_message_answered(message_id)
            except MQError as exc:
                hint = "" if topic else " (a client msgId needs --topic)"
                return [], f"no message {message_id}: {exc}{hint}"
            if answer.source == "slave":
                print(f"trio-ha: read from the slave {answer.address} of {answer.broker_name}: "
                      "the broker that stored it does not answer", file=sys.stderr)
            return [message], None

    messages, problem = run_client(work)
    if problem is not None:
        raise _fail(problem)
    _print_messages(messages, as_json=as_json)


@admin_app.command("query-msg-by-key")
def query_msg_by_key(topic: str = typer.Option(..., "-t", "--topic", help="the topic"),
                     key: str = typer.Option(..., "-k", "--key", help="the key"),
                     max_num: int = typer.Option(32, "--max", min=1, max=64,
                                                   help="at most this many messages"),
                     namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """The messages of a topic with a key among their KEYS (from the index files)."""
    from ..client import open_admin

    async def work() -> list:
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.query_by_key(topic, key, max_num=max_num)

    messages = run_client(work)
    rows = [{k: r[k] for k in ("offsetMsgId", "msgId", "queueId", "queueOffset", "keys",
                               "tags", "storeTime", "bodySize")}
            for r in map(message_row, messages)]
    emit(rows, as_json=as_json, title=f"{topic} with key {key}: {len(rows)}")


_alias(query_msg_by_key, "queryMsgByKey")


@admin_app.command("query-msg-by-id")
def query_msg_by_id(message_id: str = typer.Option(..., "-i", "--id", help="offsetMsgId"),
                    namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """A message by its offsetMsgId (``trio-ha message get`` also takes the client's id)."""
    message_get(message_id, None, namesrv, as_json)


_alias(query_msg_by_id, "queryMsgById")


# ---- changes to a running cluster --------------------------------------------------------------


@admin_app.command("delete-topic")
def delete_topic(topic: str = typer.Option(..., "-t", "--topic", help="the topic"),
                 cluster: str = typer.Option(None, "-c", "--cluster",
                                             help="only on this cluster (default: every one)"),
                 namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """Delete a topic: its config, consume queues and offsets on every master, then its
    routes on every name server (its messages stay in the commitlog until retention)."""
    from ..client import open_admin

    async def work() -> dict[str, str]:
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.delete_topic(topic, cluster)

    done = run_client(work)
    emit([{"topic": topic, "brokerName": n, "master": a} for n, a in sorted(done.items())],
         as_json=as_json, title="topic deleted")


_alias(delete_topic, "deleteTopic")


def _write_perm(broker_name: str, namesrv: str, as_json: bool, *, wipe: bool) -> None:
    from ..client import open_admin

    async def work() -> int:
        async with open_admin(namesrv, **client_options()) as admin:
            if wipe:
                return await admin.wipe_write_perm(broker_name)
            return await admin.add_write_perm(broker_name)

    count = run_client(work)
    emit([{"brokerName": broker_name, "topics": count, "write": not wipe}], as_json=as_json,
         title="write permission " + ("wiped" if wipe else "restored"))


@admin_app.command("wipe-write-perm")
def wipe_write_perm(broker_name: str = typer.Option(..., "-b", "--broker-name",
                                                              help="the broker group (brokerName)"),
                    namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """Stop producers choosing a broker group's queues (before maintenance), on every name
    server; consumers go on reading."""
    _write_perm(broker_name, namesrv, as_json, wipe=True)


_alias(wipe_write_perm, "wipeWritePerm")


@admin_app.command("add-write-perm")
def add_write_perm(broker_name: str = typer.Option(..., "-b", "--broker-name",
                                                              help="the broker group (brokerName)"),
                   namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """Give a broker group's queues back to producers (after wipe-write-perm)."""
    _write_perm(broker_name, namesrv, as_json, wipe=False)


_alias(add_write_perm, "addWritePerm")


@admin_app.command("update-broker-config")
def update_broker_config(broker: str = typer.Option(..., "-b", "--broker",
                                                    help="broker host:port"),
                         key: str = typer.Option(..., "-k", "--key", help="the key"),
                         value: str = typer.Option(..., "-v", "--value", help="the new value"),
                         namesrv: str = namesrv_option()) -> None:
    """Change a setting of a running broker (the keys it can change at runtime, such as
    brokerPermission or autoCreateTopicEnable); until it restarts."""
    from ..client import open_admin

    async def work() -> dict[str, str]:
        async with open_admin(namesrv, **client_options()) as admin:
            await admin.update_broker_config(broker, {key: value})
            return await admin.broker_config(broker)

    now = run_client(work)
    print(f"{broker}: {key}={now.get(key)}")


_alias(update_broker_config, "updateBrokerConfig")


@admin_app.command("update-kv-config")
def update_kv_config(namespace: str = typer.Option(..., "-s", "--namespace",
                                                  help="the KV config namespace"),
                     key: str = typer.Option(..., "-k", "--key", help="the key"),
                     value: str = typer.Option(..., "-v", "--value", help="the new value"),
                     namesrv: str = namesrv_option()) -> None:
    """Set a name-server KV config entry on every name server (ORDER_TOPIC_CONFIG holds the
    ordered topics' queue layout)."""
    from ..client import open_admin

    async def work() -> None:
        async with open_admin(namesrv, **client_options()) as admin:
            await admin.put_kv_config(namespace, key, value)

    run_client(work)
    print(f"{namespace}: {key}={value}")


_alias(update_kv_config, "updateKvConfig")


@admin_app.command("delete-kv-config")
def delete_kv_config(namespace: str = typer.Option(..., "-s", "--namespace",
                                                  help="the KV config namespace"),
                     key: str = typer.Option(..., "-k", "--key", help="the key"),
                     namesrv: str = namesrv_option()) -> None:
    """Remove a name-server KV config entry from every name server."""
    from ..client import open_admin

    async def work() -> None:
        async with open_admin(namesrv, **client_options()) as admin:
            await admin.delete_kv_config(namespace, key)

    run_client(work)
    print(f"{namespace}: {key} deleted")


_alias(delete_kv_config, "deleteKvConfig")


@admin_app.command("kv-config")
def kv_config(namespace: str = typer.Option(..., "-s", "--namespace",
                                                  help="the KV config namespace"),
              namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """A name-server KV config namespace's entries."""
    from ..client import open_admin

    async def work() -> dict[str, str]:
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.kv_config(namespace)

    entries = run_client(work)
    emit_fields(entries, as_json=as_json, title=namespace)


@admin_app.command("namesrv-config")
def namesrv_config(namesrv: str = namesrv_option(), as_json: bool = json_option()) -> None:
    """Every setting of each name server."""
    from ..client import open_admin

    async def work() -> dict[str, dict[str, str]]:
        async with open_admin(namesrv, **client_options()) as admin:
            return await admin.namesrv_config()

    configs = run_client(work)
    emit([{"namesrv": address, "key": k, "value": v}
          for address, table in configs.items() for k, v in sorted(table.items())],
         as_json=as_json, title="name servers")


_alias(namesrv_config, "getNamesrvConfig")
