"""``trio-ha store verify|inspect|truncate DIR``: a store directory seen and repaired offline.

An operator runs these on a store no broker has open: to find damage and learn what the next
start would do with it (``verify``, exit 2 when there is damage), to see what the directory
holds (``inspect``), and to cut a diverged slave back to what it shares with its master
(``truncate``). The work is ``trio_ha.store.offline``'s; this module parses options, prints
tables, lines or JSON and draws progress on a terminal; the failures an operator causes (no
such directory, not a store, a store in use, a refused offset) are errors of ours, which the
app's command group prints as one line with exit 1.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs
import typer

from ._app import app

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress

    from ..config import StoreConfig
    from ..store.offline import (
        Damage,
        Progress,
        StoreInventory,
        TruncatePlan,
        VerifyReport,
    )

store_app = typer.Typer(
    no_args_is_help=True,
    help="Check, describe or repair a store directory that no broker has open.",
)
app.add_typer(store_app, name="store")

#: exit status of ``verify`` when it found damage (1 is an operator's mistake, as elsewhere)
EXIT_DAMAGE = 2
#: progress bars only for stores whose commitlog files take at least this much
_LARGE_STORE_BYTES = 256 * 1024 * 1024
_CONFIG_HELP = ("a broker.conf whose store settings apply (segment sizes, maxMessageSize, "
                "the recovery switches); without it sizes are read from the files")


def _fail(line: str) -> typer.Exit:
    print(f"trio-ha: {line}", file=sys.stderr)
    return typer.Exit(1)


def _store_config(config_file: str | None, store_dir: str) -> StoreConfig | None:
    if config_file is None:
        return None
    from ..config import StoreConfig

    with open(config_file) as f:
        text = f.read()
    return StoreConfig.from_properties(text, store_path_root_dir=store_dir)


def _commitlog_bytes(store_dir: str, config: StoreConfig | None) -> int:
    directory = config.commitlog_dir if config is not None else os.path.join(store_dir,
                                                                              "commitlog")
    total = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if entry.is_file():
                total += entry.stat().st_size
    return total


class _Bar:
    """The library's Progress drawn by rich, one task per phase."""

    def __init__(self, bar: RichProgress) -> None:
        self._bar = bar
        self._task: Any = None
        self._total = 0

    def begin(self, what: str, total: int) -> None:
        if self._task is not None:  # the phase before ended early (damage stops a walk)
            self._bar.update(self._task, completed=self._total)
        self._task = self._bar.add_task(what, total=total)
        self._total = total

    def advance(self, amount: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, amount)


@contextlib.contextmanager
def _progress(large: bool) -> Iterator[Progress | None]:
    """Bars on stderr for a large store, when stderr is a terminal (never in a pipe or a
    log file, where they would be noise)."""
    if not (large and sys.stderr.isatty()):
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        yield _Bar(bar)


def _json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def _time(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


# ---- verify ----------------------------------------------------------------------------------


def _damage_line(damage: Damage) -> str:
    where = f"{damage.file}, position {damage.file_offset} in the file"
    if damage.area == "commitlog":
        head = f"commitlog offset {damage.commitlog_offset} ({where})"
    elif damage.area == "consume queue":
        head = f"consume queue {damage.queue} queue offset {damage.queue_offset} ({where})"
    else:
        head = f"index file {damage.file}, position {damage.file_offset}"
    return f"DAMAGE at {head}: {damage.problem}\n  {damage.recovery}"


def _print_verify(report: VerifyReport) -> None:
    print(f"store {report.root}")
    print(f"  commitlog: {report.segments} segments, {report.records} records "
          f"({report.record_bytes} bytes) verified in [{report.log_start}, {report.log_end})")
    unchecked = (f"; {report.queue_entries_unchecked} past the commitlog damage not checked"
                 if report.queue_entries_unchecked else "")
    print(f"  consume queues: {report.queues} queues, {report.queue_entries} entries "
          f"checked{unchecked}")
    print(f"  index files: {report.index_files}")
    for warning in report.warnings:
        print(f"warning: {warning}")
    for damage in report.damage:
        print(_damage_line(damage))
    if report.clean:
        print("clean")
    else:
        first = report.damage[0]
        at = (f"commitlog offset {first.commitlog_offset}" if first.area == "commitlog"
              else f"{first.file} position {first.file_offset}")
        print(f"damaged: {len(report.damage)} problem(s), the first at {at}")


@store_app.command(
    "verify", short_help="Check every record, queue entry and index header; name the damage.")
def store_verify(
    dir: str = typer.Argument(..., help="the store directory (storePathRootDir)"),
    json_output: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
    config_file: str | None = typer.Option(None, "-c", "--config", help=_CONFIG_HELP),
) -> None:
    """Check every record (magic, sizes, BODYCRC, PHYSICALOFFSET), segment file names and
    sizes, every consume-queue entry against its record, index file headers and the
    checkpoint. Damage is named by offset, with what crash recovery would do about it; exit
    status 2 when there is any, 0 when the store is clean."""
    from ..store.offline import verify_store

    config = _store_config(config_file, dir)
    with _progress(_commitlog_bytes(dir, config) >= _LARGE_STORE_BYTES) as progress:
        report = verify_store(dir, config=config, progress=progress)
    if json_output:
        _json({"clean": report.clean, **attrs.asdict(report)})
    else:
        _print_verify(report)
    if not report.clean:
        raise typer.Exit(EXIT_DAMAGE)


# ---- inspect ---------------------------------------------------------------------------------


def _inventory_json(inventory: StoreInventory) -> dict[str, Any]:
    out = attrs.asdict(inventory)
    out["queues"] = [{**attrs.asdict(q), "entries": q.entries} for q in inventory.queues]
    topics: dict[str, dict[str, int]] = {}
    for q in inventory.queues:
        topic = topics.setdefault(q.topic, {"queues": 0, "entries": 0})
        topic["queues"] += 1
        topic["entries"] += q.entries
    out["topics"] = topics
    return out


def _print_inventory(inventory: StoreInventory) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"store [bold]{inventory.root}[/bold]", highlight=False)
    console.print(f"  commitlog {inventory.commitlog_dir}: [{inventory.min_offset}, "
                  f"{inventory.max_offset}), segment size {inventory.segment_size or '-'}",
                  highlight=False)
    last_stop = ("NOT clean (abort file present: the next open runs crash recovery)"
                 if inventory.abort_present else "clean")
    lock = {"held": "held (a broker has it open)", "free": "free",
            "unknown": "unknown (the lock file cannot be tried)"}[inventory.lock]
    console.print(f"  last stop: {last_stop}; lock: {lock}", highlight=False)
    console.print("  config files: " + (", ".join(inventory.config_files) or "none"),
                  highlight=False)

    segments = Table(title="commitlog segments", title_justify="left")
    for column in ("file", "start offset", "size", "written end", "state"):
        segments.add_column(column, justify="left" if column in ("file", "state") else "right")
    for s in inventory.segments:
        segments.add_row(s.name, str(s.base_offset), str(s.size), str(s.written_end), s.state)
    console.print(segments)

    queues = Table(title="consume queues", title_justify="left")
    for column in ("topic", "queue", "files", "min offset", "max offset", "entries"):
        queues.add_column(column, justify="left" if column == "topic" else "right")
    previous = None
    for q in inventory.queues:
        queues.add_row(q.topic if q.topic != previous else "", str(q.queue_id), str(q.files),
                       str(q.min_offset), str(q.max_offset), str(q.entries))
        previous = q.topic
    console.print(queues)

    checkpoint = inventory.checkpoint
    table = Table(title="checkpoint" + ("" if checkpoint.present else " (no file)"),
                  title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    table.add_column("time")
    for name, field in _CHECKPOINT_FIELDS:
        value = getattr(checkpoint, field)
        table.add_row(name, str(value), _time(value) if field.endswith("timestamp") else "")
    console.print(table)

    if inventory.index_files:
        index = Table(title="index files", title_justify="left")
        for column in ("file", "entries", "commitlog offsets", "stored"):
            index.add_column(column)
        for i in inventory.index_files:
            index.add_row(i.name, str(i.entries), f"{i.begin_phy_offset}..{i.end_phy_offset}",
                          f"{_time(i.begin_timestamp)} .. {_time(i.end_timestamp)}")
        console.print(index)


@store_app.command(
    "inspect", short_help="Segments, offsets, topics and queues, checkpoint, abort and lock.")
def store_inspect(
    dir: str = typer.Argument(..., help="the store directory (storePathRootDir)"),
    json_output: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
    config_file: str | None = typer.Option(None, "-c", "--config", help=_CONFIG_HELP),
) -> None:
    """Segments (start, size, written end), the commitlog's offsets, checkpoint times, topics
    and their queues (files, min/max offsets, entries), index files, config files, whether
    the last stop was clean and whether a broker holds the lock. Changes nothing."""
    from ..store.offline import inspect_store

    inventory = inspect_store(dir, config=_store_config(config_file, dir))
    if json_output:
        _json(_inventory_json(inventory))
    else:
        _print_inventory(inventory)


# ---- truncate --------------------------------------------------------------------------------


#: the checkpoint's fields under RocketMQ's names
_CHECKPOINT_FIELDS = (
    ("physicMsgTimestamp", "physic_msg_timestamp"), ("logicsMsgTimestamp", "logics_msg_timestamp"),
    ("indexMsgTimestamp", "index_msg_timestamp"), ("masterFlushedOffset", "master_flushed_offset"),
    ("confirmPhyOffset", "confirm_phy_offset"),
)


def _plan_lines(plan: TruncatePlan) -> list[str]:
    lines = [f"store {plan.root}: cut the commitlog back to {plan.offset} (its records end at "
             f"{plan.log_end}): {plan.bytes_cut} bytes, {plan.records_cut} records"]
    if plan.segments_deleted:
        lines.append("  segment files deleted: " + ", ".join(plan.segments_deleted))
    if plan.segment_cut is not None:
        lines.append(f"  segment file cut: {plan.segment_cut} (the rest of it zeroed)")
    for cut in plan.queue_cuts:
        after = "removed (all its entries were past the cut)" if cut.removed else (
            f"max offset {cut.max_offset_before} -> {cut.max_offset_after}")
        lines.append(f"  consume queue {cut.topic}/{cut.queue_id}: {after}")
    for cut in plan.index_cuts:
        after = "deleted" if cut.entries_after is None else (
            f"{cut.entries_before} -> {cut.entries_after} entries")
        lines.append(f"  index file {cut.name}: {after}")
    before, after = plan.checkpoint_before, plan.checkpoint_after
    for name, field in _CHECKPOINT_FIELDS:
        if getattr(after, field) != getattr(before, field):
            lines.append(f"  checkpoint {name}: {getattr(before, field)} -> "
                         f"{getattr(after, field)}")
    if plan.abort_present:
        lines.append("  note: the abort file is present; the next open still runs crash "
                     "recovery")
    return lines


@store_app.command(
    "truncate", short_help="Cut a (diverged slave's) store back to a record boundary.")
def store_truncate(
    dir: str = typer.Argument(..., help="the store directory (storePathRootDir)"),
    to: int = typer.Option(..., "--to", help="the commitlog offset to cut back to (a record "
                                             "boundary)"),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    dry_run: bool = typer.Option(False, "--dry-run", help="say what would be cut, cut nothing"),
    json_output: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
    config_file: str | None = typer.Option(None, "-c", "--config", help=_CONFIG_HELP),
) -> None:
    """Cut the store back to commitlog offset --to: the explicit repair of a slave that holds
    bytes its master does not. The log is cut at a record boundary (refused elsewhere, naming
    the nearest ones), consume-queue and index entries past it are dropped and the
    checkpoint lowered, so the next start (a slave's: replication) resumes there. Refused
    while a broker has the store open."""
    from ..store.offline import truncate_store

    def confirm(plan: TruncatePlan) -> bool:
        if not json_output:
            print("\n".join(_plan_lines(plan)), flush=True)
        return yes or typer.confirm("Cut the store?", default=False, err=True)

    outcome = truncate_store(dir, to, config=_store_config(config_file, dir),
                             dry_run=dry_run, confirm=confirm)
    plan = outcome.plan
    if json_output:
        _json({"applied": outcome.applied, "dry_run": dry_run, **attrs.asdict(plan)})
    elif not plan.changes_anything:
        print(f"nothing to cut: the store {plan.root} ends at {plan.offset}")
    elif dry_run:
        print("\n".join(_plan_lines(plan)))
        print("dry run: nothing was changed")
    elif outcome.applied:
        print(f"truncated: the commitlog ends at {plan.offset}; the next start resumes there "
              "(a slave replicates from its master from there)")
    if plan.changes_anything and not dry_run and not outcome.applied:
        raise _fail("not confirmed: nothing was changed")
