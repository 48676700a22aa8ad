"""``trio-ha bench replication``: slave catch-up and SYNC_MASTER latency against loopback limits.

What runs (one JSON object per result, in this order):

1. limits, measured in the same run, between this process and a child process (two
   processes, so both vCPUs can work); the round trips just before the SYNC_MASTER runs they
   are read against, the rest first:

   * ``limit.loopback_transfer``: a file of the catch-up's size, written and mapped, sent over a
     loopback TCP socket to a child that ``recv_into``'s a preallocated buffer: ``send`` of
     memoryview slices of the mapping, and ``os.sendfile``, each in 1 MiB and 32 KiB pieces
     (the two frame sizes the catch-up uses); blocking sockets; best of several passes; the
     clock runs from the first send to the receiver's one-byte "all received";
   * ``limit.loopback_transfer_into_file``: the same in 1 MiB pieces, the child receiving into
     a new file per pass (sized, blocks reserved, as a slave's unwarmed segment), both ways a
     slave can: ``recv_into`` the file's shared mapping, and ``splice`` from the socket into
     the file: what putting received bytes into new file pages costs any slave. The catch-up
     is read against the plain transfer (the target) and against the faster of these
     (``into_file_limit``);
   * ``limit.loopback_rtt``: 8-byte ping-pong with TCP_NODELAY between two processes, blocking
     sockets (the raw round trip), and the same between two Trio processes (what an event
     loop adds on each side);
   * ``limit.memcpy_into_mapping`` (``trio_ha.bench.limits``): its first-touch figure is what a
     fresh slave pays on every page of the segments it creates, a secondary limit;

2. catch-up: a master store (ASYNC_MASTER) is filled with 1 KiB records in batches of 64
   (``put`` of a ``PutRequest.batch``) up to at least 1 GiB (quick: 100 MiB) and flushed; then,
   for each transfer method (``send``, ``sendfile``) and frame size
   (``ha_transfer_batch_size`` 32 KiB and 1 MiB) the master is reopened with that
   configuration and a fresh, empty slave copies everything
   (``ha_start_from_min_offset``): in a separate process (the real deployment: its own
   interpreter, its own core) and in the master's process (the embedded case: one event loop
   and one GIL for both sides), alternately, for a few passes (3; quick: 1); the median pass is
   the figure, with the spread of all (the limits stay the best of theirs). The clock runs
   from the slave's ``open_store`` call until its ``written`` watermark reaches the master's
   end. After every pass the slave's commitlog is compared byte
   for byte with the master's. One catch-up runs before all of them and is reported apart
   (``replication.catchup_warmup``): on a VM the first use of fresh memory is slow, and that
   cost would otherwise fall on whichever configuration runs first;

3. SYNC_MASTER (after the round trips above): a fresh SYNC_MASTER (ASYNC_FLUSH) master with
   one slave (separate process, and in-process), 1 and then 16 concurrent producer tasks doing
   ``put_message`` of 1 KiB bodies for a fixed time; every put is timed; p50/p99 latency and
   puts/s, next to the round trips;

4. a summary of the issue's targets (evaluated on the separate-process runs, the real
   deployment; the in-process figures are reported beside them as ``embedded_targets``).

Bandwidths are decimal MB/s (10**6 bytes); latencies in microseconds. A benchmark reports
figures; it never asserts. The measured parts live in :mod:`trio_ha.bench.replication_runs`,
the loopback limits in :mod:`trio_ha.bench.loopback`; their child processes are those modules
run with ``python -m`` and a role.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator

import attrs

from ..config import BrokerRole
from . import limits
from .harness import (
    MB,
    KiB,
    MiB,
    common_fields,
    config_fields,
    fit_plan,
    limit,
    scratch_directory,
    tidied,
    trio_run,
)
from .loopback import (
    Children,
    make_raw_file,
    raw_rtt,
    raw_transfer,
    round_trip_limit,
    trio_rtt,
)
from .replication_runs import (
    BODY_SIZE,
    ReplicationPlan,
    fill_master,
    master_config,
    median_catchup_pass,
    run_catchups,
    sync_master_run,
    with_rate,
)

TRANSFER_METHODS = ("send", "sendfile")
FRAME_SIZES = (32 * KiB, MiB)
PLACEMENTS = ("separate_process", "in_process")
#: how the into-a-new-file limit's receiver puts the bytes into the file
INTO_FILE_RECEIVES = ("recv_into", "splice")

TARGET_CATCHUP_RATIO = 0.6
TARGET_SYNC_P50_RTT_RATIO = 3.0
TARGET_PRODUCER_SCALING = 8.0


# ---- the whole benchmark ---------------------------------------------------------------------


def run_replication_benchmarks(directory: str | None = None, *, quick: bool = False
                               ) -> Iterator[dict]:
    """Run the replication benchmarks in a scratch directory (inside ``directory`` if given)
    and yield one dict per result (floats to 5 significant digits). The scratch directory and
    every child process are gone at the end, also on error."""
    yield from tidied(_run(directory, quick))


def _run(directory: str | None, quick: bool) -> Iterator[dict]:
    plan = ReplicationPlan.make(quick)
    begun = time.perf_counter()
    common = common_fields(quick)
    backend = common["backend"]
    with scratch_directory(directory, "replication") as scratch, \
            Children(scratch.logs) as children:
        base = scratch.base
        fit_plan(plan, scratch)
        yield {
            "bench": "replication.config", **config_fields(plan, scratch),
            "segment_size": plan.segment_size, "catchup_bytes": plan.catchup_bytes,
            "raw_bytes": plan.raw_bytes, "sync_seconds": plan.sync_seconds,
            "note": "master in this process; 'separate_process' slaves and the limits' peers "
                    "are child processes (python -m trio_ha.bench.replication_runs <role>, "
                    "python -m trio_ha.bench.loopback <role>); other processes on this "
                    "machine compete for its cores, loadavg says how busy",
        }

        # -- limits ---------------------------------------------------------------------------
        raw_path = make_raw_file(base, plan.raw_bytes)
        raw: dict[tuple[str, int], dict] = {}
        try:
            for chunk in FRAME_SIZES[::-1]:
                for method in TRANSFER_METHODS:
                    figures = raw_transfer(children, raw_path, plan.raw_bytes, method=method,
                                           chunk=chunk, passes=plan.raw_passes, timeout=60)
                    raw[method, chunk] = figures
                    yield {
                        "bench": "limit.loopback_transfer", **common, **figures,
                        "note": ("send of memoryview slices of a MAP_SHARED mapping"
                                 if method == "send" else "os.sendfile from the file")
                        + " to a child process recv_into'ing a preallocated 1 MiB buffer; "
                          "blocking sockets; file in the page cache; best pass",
                    }
            # The same into a new file per pass, through its mapping and by splice: the page
            # allocation and first touch every slave pays for the bytes it receives, whatever
            # else it does.
            into_file = {}
            for receive in INTO_FILE_RECEIVES:
                for method in TRANSFER_METHODS:
                    figures = raw_transfer(children, raw_path, plan.raw_bytes, method=method,
                                           chunk=MiB, passes=plan.raw_passes, timeout=60,
                                           into_file=os.path.join(base, "sink-file"),
                                           receive=receive)
                    into_file[method, receive] = figures
                    yield {
                        "bench": "limit.loopback_transfer_into_file", **common, **figures,
                        "receive": receive,
                        "note": ("send of memoryview slices" if method == "send"
                                 else "os.sendfile")
                        + " to a child process putting the bytes into a new file of the "
                          "transfer's size (sized, blocks reserved: a slave's new segment, "
                          "unwarmed as a slave's are), one per pass, "
                        + ("by recv_into its shared mapping" if receive == "recv_into"
                           else "by splice from the socket through a pipe")
                        + "; blocking sockets; best pass",
                    }
        finally:
            os.unlink(raw_path)
        file_limit = limit(
            "loopback_into_new_file_1MiB",
            max(f["mb_per_s"] for f in into_file.values()), "MB/s",
            **{f"{method}_{receive}": figures["mb_per_s"]
               for (method, receive), figures in into_file.items()},
        )
        memcpy = limits.memcpy_into_mapping(
            base, map_size=plan.memcpy_map, total_bytes=plan.memcpy_bytes, passes=2,
            record_seconds=0.05,
        )
        yield {"bench": "limit.memcpy_into_mapping", **common, **memcpy,
               "note": "trio_ha.bench.limits: slice assignment into a warm MAP_SHARED file "
                       "mapping (best pass); first_touch is the same mapping's first write "
                       "pass, what a fresh slave pays on every page of its new segments"}
        first_touch_limit = limit("first_touch_of_new_mapping",
                                   memcpy["first_touch_gb_per_s"] * 1000, "MB/s",
                                   warm_memcpy_mb_per_s=memcpy["mb_per_s"])

        def transfer_limit(chunk: int) -> dict:
            send, sendfile = raw["send", chunk]["mb_per_s"], raw["sendfile", chunk]["mb_per_s"]
            return limit(
                f"loopback_faster_raw_{'1MiB' if chunk == MiB else '32KiB'}",
                max(send, sendfile), "MB/s", send_mmap_slices=send, sendfile=sendfile,
                faster="send" if send >= sendfile else "sendfile",
            )

        targets: list[dict] = []
        embedded_targets: list[dict] = []

        # -- catch-up -------------------------------------------------------------------------
        master_root = os.path.join(base, "master")
        fill_config = master_config(master_root, plan, BrokerRole.ASYNC_MASTER)
        try:
            fill = trio_run(fill_master, fill_config, plan.catchup_bytes,
                           max(60.0, plan.catchup_bytes / (10 * MB)))
            yield {"bench": "replication.fill", **common, **fill,
                   "note": "64 x 1 KiB put_batch into the master (ASYNC_MASTER, ASYNC_FLUSH), "
                           "then dispatched and flushed; the store every catch-up copies"}
            # One catch-up first, reported apart: the first run after the fill pays for
            # memory this machine has not touched yet (slow first touch on a VM), which would
            # otherwise land on whichever configuration happens to run first.
            warm_config = attrs.evolve(fill_config, ha_transfer_method="send",
                                       ha_transfer_batch_size=MiB)
            warm = trio_run(run_catchups, warm_config, plan, base, fill["max_offset"],
                           ("separate_process",), 1)
            yield {
                "bench": "replication.catchup_warmup", "transfer_method": "send",
                "frame_bytes": MiB, **with_rate(warm[0]), "backend": backend,
                "note": "a first catch-up, not used for targets: it absorbs first-touch costs "
                        "of memory the machine has not used yet",
            }
            catchup_1mib: dict[tuple[str, str], float] = {}
            for method in TRANSFER_METHODS:
                for frame in FRAME_SIZES:
                    config = attrs.evolve(fill_config, ha_transfer_method=method,
                                          ha_transfer_batch_size=frame)
                    runs = trio_run(run_catchups, config, plan, base, fill["max_offset"],
                                   PLACEMENTS, plan.catchup_passes)
                    frame_limit = transfer_limit(frame)
                    for placement in PLACEMENTS:
                        run = median_catchup_pass([r for r in runs if r["placement"] == placement])
                        rate = run["mb_per_s"]
                        ratio = rate / frame_limit["value"]
                        target = meets = None
                        if frame == MiB:
                            target = f"ratio_to_limit >= {TARGET_CATCHUP_RATIO}"
                            meets = ratio >= TARGET_CATCHUP_RATIO and run["failures"] == 0
                            catchup_1mib[placement, method] = rate
                            entry = {"result": f"catch-up 1 MiB frames, {method}, {placement}",
                                     "target": target, "meets": meets,
                                     "mb_per_s": rate, "limit_mb_per_s": frame_limit["value"],
                                     "ratio": ratio,
                                     "into_file_limit_mb_per_s": file_limit["value"],
                                     "ratio_to_into_file_limit": rate / file_limit["value"]}
                            (targets if placement == "separate_process"
                             else embedded_targets).append(entry)
                        yield {
                            "bench": "replication.catchup",
                            "transfer_method": method, "frame_bytes": frame,
                            **run,
                            "limit": frame_limit, "ratio_to_limit": ratio,
                            "ratio_to_raw_send": rate / raw["send", frame]["mb_per_s"],
                            "ratio_to_raw_sendfile": rate / raw["sendfile", frame]["mb_per_s"],
                            "secondary_limit": first_touch_limit,
                            "into_file_limit": file_limit,
                            "ratio_to_into_file_limit": rate / file_limit["value"],
                            "target": target, "meets_target": meets, "backend": backend,
                            "note": ("slave in a child process (the real deployment)"
                                     if placement == "separate_process" else
                                     "slave in the master's process: one event loop and one "
                                     "GIL for both sides (the embedded case)")
                            + "; clock from the slave's open_store to its written watermark "
                              "reaching the master's end; mb_per_s = bytes_copied / seconds; "
                              "the median pass, with the spread of all; the limits are the "
                              "best of theirs; failures summed over all passes; "
                              "slave_cpu_seconds counts its threads too (segment warming, "
                              "flushes); secondary_limit: a fresh slave writes every page of "
                              "its new segments for the first time",
                        }
        finally:
            shutil.rmtree(master_root, ignore_errors=True)

        # -- SYNC_MASTER latency ----------------------------------------------------------------
        # The round trips are measured right before the puts they are compared with: on a VM
        # the wake-up latency of an idle vCPU changes with how busy the machine is.
        rtt = raw_rtt(children, count=plan.rtt_count, seconds=plan.rtt_seconds, timeout=60)
        yield {"bench": "limit.loopback_rtt", **common, **rtt,
               "note": "8-byte ping-pong, TCP_NODELAY, this process and a child"}
        rtt_trio = trio_rtt(children, count=plan.rtt_count, seconds=plan.rtt_seconds,
                            timeout=60)
        yield {"bench": "limit.loopback_rtt_trio", **common, **rtt_trio,
               "note": "the same ping-pong, trio sockets in both processes"}

        rtt_limit = round_trip_limit(rtt, rtt_trio)
        for placement in PLACEMENTS:
            runs, info = trio_run(sync_master_run, base, plan, placement)
            one = runs[0]["puts_per_s"] if runs and runs[0]["producers"] == 1 else None
            for run in runs:
                p50 = run["latency_us"]["p50"]
                result = {
                    "bench": "replication.sync_master", "placement": placement,
                    "flush": "ASYNC_FLUSH", "body_size": BODY_SIZE, **run,
                    "slave": info, "limit": rtt_limit,
                    "ratio_to_limit": (p50 / rtt["p50_us"]) if p50 else None,
                    "ratio_basis": "latency p50 / raw loopback RTT p50",
                    "ratio_to_trio_rtt": (p50 / rtt_trio["p50_us"]) if p50 else None,
                }
                checks = []
                if run["producers"] == 1:
                    target = f"ratio_to_limit <= {TARGET_SYNC_P50_RTT_RATIO}"
                    meets = (result["ratio_to_limit"] is not None
                             and result["ratio_to_limit"] <= TARGET_SYNC_P50_RTT_RATIO
                             and run["failures"] == 0)
                    checks.append(("SYNC_MASTER p50 latency, 1 producer", target, meets,
                                   {"p50_us": p50, "rtt_p50_us": rtt["p50_us"],
                                    "ratio": result["ratio_to_limit"]}))
                else:
                    scaling = run["puts_per_s"] / one if one else None
                    result["scaling_vs_1_producer"] = scaling
                    target = f"scaling_vs_1_producer >= {TARGET_PRODUCER_SCALING}"
                    meets = (scaling is not None and scaling >= TARGET_PRODUCER_SCALING
                             and run["failures"] == 0)
                    checks.append((f"SYNC_MASTER {run['producers']} producers vs 1", target,
                                   meets, {"puts_per_s": run["puts_per_s"],
                                           "one_producer_puts_per_s": one,
                                           "ratio": scaling}))
                result["target"] = target
                result["meets_target"] = meets
                result["backend"] = backend
                result["note"] = (
                    ("slave in a child process (the real deployment)"
                     if placement == "separate_process" else
                     "slave in the master's process (embedded)")
                    + "; SYNC_MASTER + ASYNC_FLUSH; each put_message timed from call to "
                      "return (slave ack); producers are tasks on the master's event loop"
                )
                for name, tgt, ok, figures in checks:
                    entry = {"result": f"{name}, {placement}", "target": tgt, "meets": ok,
                             **figures}
                    (targets if placement == "separate_process" else embedded_targets).append(
                        entry)
                yield result

        faster = {}
        for placement in PLACEMENTS:
            send = catchup_1mib.get((placement, "send"))
            sendfile = catchup_1mib.get((placement, "sendfile"))
            if send is not None and sendfile is not None:
                faster[placement] = "send" if send >= sendfile else "sendfile"
        yield {
            "bench": "replication.summary", **common, "targets": targets,
            "all_met": all(t["meets"] for t in targets),
            "embedded_targets": embedded_targets,
            "embedded_all_met": all(t["meets"] for t in embedded_targets),
            "faster_transfer_method_1MiB": faster,
            "raw_faster_1MiB": transfer_limit(MiB)["faster"],
            "rtt_p50_us": rtt["p50_us"], "trio_rtt_p50_us": rtt_trio["p50_us"],
            "total_seconds": time.perf_counter() - begun, "loadavg": os.getloadavg(),
        }
