"""What every part's figures share: how a figure is handed back, one colour per rank, and the axes
of a plot against the number of processes. The figures themselves live in the module of the part
whose notebooks draw them (autograde/parts/<part>/notebook*.py).

Every figure function returns a matplotlib Figure and shows nothing itself: in a notebook, make the
call the last line of a cell and Jupyter draws it; elsewhere, `fig.savefig("name.png")`. `finish`
closes each figure in pyplot right away, so that Jupyter draws it once and many calls hold no memory.

    from autograde.parts.lab import notebook as lab
    lab.rank_layout(2, 2)
"""
from __future__ import annotations

from typing import Any, Sequence

import matplotlib.pyplot as plt  # without a display matplotlib picks Agg by itself
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def finish(fig: Figure) -> Figure:
    """Detach `fig` from pyplot: Jupyter then draws it once, as the cell's value, and nothing accumulates."""
    plt.close(fig)
    return fig


RANK_COLOURS = [plt.get_cmap("tab10")(k) for k in range(10)]  # one colour per rank


def scaling_axes(ax: Axes, processes: Sequence[int], ylabel: str) -> None:
    """Label `ax` as a plot against the number of processes, one tick per number measured."""
    ax.set_xlabel("processes N")
    ax.set_ylabel(ylabel)
    ax.set_xticks(list(processes))
    ax.grid(alpha=0.3)


def accuracy(logs: dict[str, list[dict[str, Any]]], by_time: bool = True) -> Figure:
    """Validation accuracy of each run by epoch, and (with `by_time`) by wall-clock seconds: each run its
    program's log (runtime.read_log), by name."""
    fig, axes = plt.subplots(1, 2 if by_time else 1, figsize=(11 if by_time else 6, 3.6), squeeze=False)
    for name, records in logs.items():
        axes[0][0].plot([r["epoch"] for r in records], [r["accuracy"] for r in records], "o-", label=name)
        if by_time:
            axes[0][1].plot([r["seconds"] for r in records], [r["accuracy"] for r in records], "o-", label=name)
    axes[0][0].set_xlabel("epoch")
    axes[0][0].xaxis.set_major_locator(MaxNLocator(integer=True))
    if by_time:
        axes[0][1].set_xlabel("seconds since the training began (this machine)")
    for ax in axes[0]:
        ax.set_ylabel("validation accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return finish(fig)
