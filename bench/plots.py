"""PNG charts for the benchmark scripts (matplotlib: `pip install -e '.[bench]'`)."""

from __future__ import annotations

from pathlib import Path


def line_chart(path: str | Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list[float], list[float]]]) -> None:
    """One line per series name: (x values, y values)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=110)
    for name, (xs, ys) in series.items():
        axes.plot(xs, ys, label=name, linewidth=1.8)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
