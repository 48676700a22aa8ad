"""PNG plots of job results (matplotlib, headless)."""

from __future__ import annotations

__all__ = ["plot_rate"]


MAX_LINES = 10
MAX_LABEL = 32


def _label(topic: str) -> str:
    return topic if len(topic) <= MAX_LABEL else topic[: MAX_LABEL - 1] + "\u2026"


def plot_rate(rate: list[dict], bucket_seconds: int, path: str) -> str:
    """Messages per second over time, one line per topic (the ``MAX_LINES`` busiest; the
    rest summed as one line); written to ``path`` as PNG."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals: dict[str, int] = {}
    for r in rate:
        totals[r["topic"]] = totals.get(r["topic"], 0) + r["messages"]
    busiest = set(sorted(totals, key=lambda t: (-totals[t], t))[:MAX_LINES])
    other = f"({len(totals) - len(busiest)} other topics)"
    sums: dict[str, dict[int, float]] = {}
    for r in rate:
        name = _label(r["topic"]) if r["topic"] in busiest else other
        line = sums.setdefault(name, {})
        line[r["bucket_ms"]] = line.get(r["bucket_ms"], 0.0) + r["messages_per_s"]
    by_topic = {name: sorted(points.items()) for name, points in sums.items()}
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    try:
        for topic in sorted(by_topic):
            points = by_topic[topic]
            # datetime64 in UTC: matplotlib draws it as dates without a timezone conversion
            when = np.array([ms for ms, _ in points], dtype="datetime64[ms]")
            ax.plot(when, [v for _, v in points], marker=".", label=topic)
        ax.set_title(f"Message rate per topic ({bucket_seconds} s buckets, store time, UTC)")
        ax.set_xlabel("store time (UTC)")
        ax.set_ylabel("messages / s")
        ax.grid(True, alpha=0.3)
        if by_topic:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        fig.autofmt_xdate()
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
