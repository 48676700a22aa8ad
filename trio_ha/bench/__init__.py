"""Benchmarks behind ``trio-ha bench <what>``.

Each benchmark is a plain function that yields one dict per result; the CLI prints each as one
JSON object per line. Every result carries the physical limit it should be read against,
measured in the same run on the same machine (``trio_ha.bench.limits``), so the figures are
ratios that survive a noisy or different machine. Benchmarks report; they never assert.
"""

from __future__ import annotations

__all__ = ["percentile"]


def percentile(sorted_values, fraction: float):
    """The value at ``fraction`` (0..1) of an already sorted sequence (nearest rank), or None
    for an empty one."""
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, int(round(fraction * len(sorted_values) + 0.5)) - 1))
    return sorted_values[index]
