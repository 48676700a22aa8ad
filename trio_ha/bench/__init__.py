"""Benchmarks behind ``trio-ha bench <what>``.

Each benchmark is a plain function that yields one dict per result; the CLI prints each as one
JSON object per line. Every result carries the physical limit it should be read against,
measured in the same run on the same machine (``limits``: memory, disk; ``loopback``: between
two processes), so the figures are ratios that survive a noisy or different machine.
Benchmarks report; they never assert.

``harness`` holds what they all run on (plans, scratch directories, result lines, run budgets,
the store load, CPU per process); ``store``, ``replication`` (with ``replication_runs``),
``produce`` and ``consume`` (with ``clients``, their cluster of child processes) and ``spark``
are the benchmarks. Only ``percentile`` and ``tidy`` live here: ``spark``'s replay source runs
inside Spark's Python workers, which must not import trio.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["percentile", "percentile_us", "tidy"]


def percentile(sorted_values: Sequence[T], fraction: float) -> T | None:
    """The value at ``fraction`` (0..1) of an already sorted sequence (nearest rank), or None
    for an empty one."""
    if not sorted_values:
        return None
    rank = math.ceil(fraction * len(sorted_values))  # nearest rank, 1-based
    return sorted_values[min(len(sorted_values), max(1, rank)) - 1]


def percentile_us(sorted_ns: Sequence[int], fraction: float) -> float:
    """:func:`percentile` of nanosecond figures (a non-empty, sorted sequence), in
    microseconds."""
    value = percentile(sorted_ns, fraction)
    if value is None:
        raise ValueError("no figures")
    return value / 1000


def tidy(value: Any, digits: int = 5) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits (recursively through
    dicts, lists and tuples), so printed results stay readable."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {key: tidy(item, digits) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [tidy(item, digits) for item in value]
    return value
