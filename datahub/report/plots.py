"""Matplotlib plots (Agg backend, PNG files) for the report; one function per figure."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from datahub.report.data import SignalHistogram


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def signal_histograms(signals: dict[str, SignalHistogram], path: Path) -> Path | None:
    """One panel per signal, drawn from its streamed histogram (the bars ``hist`` draws for the values themselves:
    each bin's left edge weighted by its count)."""
    names = sorted(n for n, h in signals.items() if h.values)
    if not names:
        return None
    plt = _pyplot()
    cols = 3
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        histogram = signals[name]
        ax.hist(histogram.edges[:-1], bins=histogram.edges, weights=histogram.counts, color="#4878a8")
        ax.set_title(f"{name}  (mean {histogram.mean:.3g})", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    return _save(fig, path)


def bar_chart(counts: Counter[Any], path: Path, *, title: str, xlabel: str = "samples", top: int = 30) -> Path | None:
    if not counts:
        return None
    plt = _pyplot()
    items = counts.most_common(top)[::-1]
    labels = [" / ".join(k) if isinstance(k, tuple) else str(k) for k, _ in items]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(items) + 1.2))
    ax.barh(labels, [v for _, v in items], color="#d0743c")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.tick_params(labelsize=8)
    fig.tight_layout()
    return _save(fig, path)


def cluster_size_histogram(counts: Counter[int], path: Path) -> Path | None:
    """Bars of clusters per cluster size (``counts``: size -> clusters)."""
    if not counts:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar([str(k) for k in sorted(counts)], [counts[k] for k in sorted(counts)], color="#6a9f58")
    ax.set_xlabel("cluster size (kept + dropped duplicates)")
    ax.set_ylabel("clusters")
    ax.set_title("duplicate clusters by size")
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=80)
    _pyplot().close(fig)
    return path
