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

from typing import Sequence

import matplotlib.pyplot as plt  # without a display matplotlib picks Agg by itself
from matplotlib.axes import Axes
from matplotlib.figure import Figure


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

