"""PNG charts for the bench reports (matplotlib, drawn off-screen): the few chart shapes the
benches need, each written to a file and returned as its path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#7f7f7f")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    _pyplot().close(figure)
    return out


def distributions(series: Mapping[str, Sequence[float]], *, title: str, ylabel: str,
                  out: Path, log: bool = True) -> Path:
    """One box per series (whiskers at the 1st and 99th percentiles, outliers as dots)."""
    plt = _pyplot()
    names = [name for name, values in series.items() if len(values)]
    figure, axes = plt.subplots(figsize=(1.6 * max(3, len(names)) + 1, 4))
    boxes = axes.boxplot([list(series[name]) for name in names], whis=(1, 99),
                         flierprops={"markersize": 2, "alpha": 0.3}, patch_artist=True)
    axes.set_xticks(range(1, len(names) + 1), names)
    for patch, color in zip(boxes["boxes"], COLORS, strict=False):
        patch.set_facecolor(color)
        patch.set_alpha(0.5)
    if log:
        axes.set_yscale("log")
    axes.set_title(title)
    axes.set_ylabel(ylabel)
    axes.grid(axis="y", alpha=0.3)
    return _save(figure, out)


def against_peers(points: Mapping[str, Sequence[tuple[float, float]]], *, title: str,
                  xlabel: str, ylabel: str, out: Path) -> Path:
    """A log-log scatter per peer of (peer's value, ours) with the diagonal: points below it
    are where ours is lower."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(5.5, 5))
    values = [v for pairs in points.values() for pair in pairs for v in pair if v > 0]
    for (peer, pairs), color in zip(points.items(), COLORS[1:], strict=False):
        shown = [(x, y) for x, y in pairs if x > 0 and y > 0]
        if shown:
            axes.scatter(*zip(*shown, strict=True), s=14, alpha=0.7, color=color,
                         label=f"{peer} ({len(shown)})")
    if values:
        low, high = min(values) / 1.5, max(values) * 1.5
        axes.plot([low, high], [low, high], color="black", linewidth=0.8, label="equal")
        axes.set_xlim(low, high)
        axes.set_ylim(low, high)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return _save(figure, out)


def bars(groups: Sequence[str], series: Mapping[str, Sequence[float]], *, title: str,
         ylabel: str, out: Path, stacked: bool = False, ylim: tuple[float, float] | None = None,
         ) -> Path:
    """Bars per group, one per series side by side (or stacked), labelled with their values
    when side by side."""
    plt = _pyplot()
    count = max(1, len(series))
    figure, axes = plt.subplots(figsize=(max(5.0, 0.9 * len(groups) * (1 if stacked else count)
                                             + 2), 4.2))
    width = 0.8 if stacked else 0.8 / count
    bottom = [0.0] * len(groups)
    for i, ((name, values), color) in enumerate(zip(series.items(), COLORS, strict=False)):
        if stacked:
            axes.bar(range(len(groups)), values, 0.8, bottom=bottom, label=name, color=color)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        else:
            offsets = [g + (i - (count - 1) / 2) * width for g in range(len(groups))]
            drawn = axes.bar(offsets, values, width, label=name, color=color)
            axes.bar_label(drawn, fmt="%.2g", fontsize=7)
    axes.set_xticks(range(len(groups)), groups, rotation=20 if len(groups) > 4 else 0,
                    ha="right" if len(groups) > 4 else "center")
    if ylim:
        axes.set_ylim(*ylim)
    axes.set_title(title)
    axes.set_ylabel(ylabel)
    axes.grid(axis="y", alpha=0.3)
    if stacked:  # beside the bars, which fill the height
        axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    else:
        axes.legend(fontsize=8)
    return _save(figure, out)


def scaling(panels: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]], *, title: str,
            ylabel: str, out: Path) -> Path:
    """Side by side, one log-log panel per group (titled by its key, sizes on x): a line per
    series of (size, value) points."""
    plt = _pyplot()
    figure, axes_row = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2),
                                    squeeze=False)
    for axes, (label, series) in zip(axes_row[0], panels.items(), strict=True):
        for (name, points), color in zip(series.items(), COLORS, strict=False):
            if points:
                axes.plot(*zip(*sorted(points), strict=True), marker="o", color=color,
                          label=name)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel(label)
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3, which="both")
        axes.legend(fontsize=8)
    figure.suptitle(title)
    return _save(figure, out)
