"""Pictures for the notebooks: how ranks are laid out, how the sampler splits data, how runs scale.

Every function returns a matplotlib Figure and shows nothing itself: in a notebook, make the call the
last line of a cell and Jupyter draws it; elsewhere, `fig.savefig("name.png")`. The figures are closed
in pyplot right away, so that Jupyter draws each one once and many calls hold no memory.

    from autograde.notebook import plots
    plots.rank_layout(2, 2)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import matplotlib.pyplot as plt  # without a display matplotlib picks Agg by itself
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from autograde.checker.output import Epoch

PADDED_HATCH = "///"  # how sampler_partition marks a sample the sampler repeated to even out the shards


def _finish(fig: Figure) -> Figure:
    """Detach `fig` from pyplot: Jupyter then draws it once, as the cell's value, and nothing accumulates."""
    plt.close(fig)
    return fig


def rank_layout(nodes: int = 2, gpus_per_node: int = 2) -> Figure:
    """Nodes as boxes, one process per GPU inside each, labelled with its global and local rank."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("need at least one node and one GPU per node")
    world_size = nodes * gpus_per_node
    fig, ax = plt.subplots(figsize=(max(4.0, 2.6 * nodes + 0.6), 1.4 + 0.95 * gpus_per_node))
    colours = plt.get_cmap("tab10")
    node_width, pad = 2.2, 0.4
    for node_id in range(nodes):
        x = node_id * (node_width + pad)
        ax.add_patch(FancyBboxPatch((x, 0), node_width, gpus_per_node + 0.7, boxstyle="round,pad=0.05",
                                    facecolor="#f2f2f2", edgecolor="#555555", linewidth=1.5))
        ax.text(x + node_width / 2, gpus_per_node + 0.4, f"node_id {node_id}", ha="center", va="center",
                fontsize=11, fontweight="bold")
        for local_rank in range(gpus_per_node):
            rank = node_id * gpus_per_node + local_rank
            y = gpus_per_node - 1 - local_rank + 0.1  # local rank 0 at the top
            ax.add_patch(Rectangle((x + 0.15, y), node_width - 0.3, 0.8, facecolor=colours(rank % 10),
                                   alpha=0.35, edgecolor="#333333", gid=f"rank {rank}"))
            ax.text(x + node_width / 2, y + 0.4, f"GPU {local_rank}\nrank {rank}, local rank {local_rank}",
                    ha="center", va="center", fontsize=9)
    width = nodes * node_width + (nodes - 1) * pad
    ax.text(width / 2, -0.35, "rank = node_id * gpus_per_node + local_rank", ha="center", va="center",
            fontsize=10, family="monospace")
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(-0.7, gpus_per_node + 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"{nodes} node{'s' if nodes != 1 else ''} x {gpus_per_node} GPU{'s' if gpus_per_node != 1 else ''}"
                 f" (one process each): world size {world_size}")
    fig.tight_layout()
    return _finish(fig)


def sampler_indices(dataset_size: int, world_size: int, epoch: int, set_epoch: bool = True) -> list[list[int]]:
    """What torch's DistributedSampler (shuffle=True, seed 0) gives each rank in one epoch.

    Without `set_epoch` the sampler stays at its epoch 0, whatever epoch the training loop is in.
    """
    from torch.utils.data import Dataset, DistributedSampler  # slow import: only when asked

    class _Samples(Dataset[int]):
        def __len__(self) -> int:
            return dataset_size

        def __getitem__(self, index: int) -> int:
            return index

    shards = []
    for rank in range(world_size):
        sampler: DistributedSampler[int] = DistributedSampler(_Samples(), num_replicas=world_size, rank=rank, shuffle=True, seed=0)
        if set_epoch:
            sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def sampler_partition(dataset_size: int = 10, world_size: int = 2, epochs: int = 2, set_epoch: bool = True) -> Figure:
    """Which samples each rank gets in each epoch, from the real DistributedSampler.

    One row of cells per rank and epoch; a cell shows a sample's index, coloured by sample. When the data
    set does not split evenly, the sampler repeats a few samples so that every rank gets as many; those
    repeats are hatched.
    """
    if dataset_size < 1 or world_size < 1 or epochs < 1:
        raise ValueError("dataset_size, world_size and epochs must be at least 1")
    per_rank = math.ceil(dataset_size / world_size)
    rows = epochs * world_size + (epochs - 1)  # an empty row between epochs
    fig, ax = plt.subplots(figsize=(max(6.5, 0.5 * per_rank + 2.5), 0.5 * rows + 2.0))
    colours = plt.get_cmap("tab20" if dataset_size > 10 else "tab10")
    labels: list[str] = []
    ticks: list[float] = []
    padded = False
    for epoch in range(epochs):
        for rank, shard in enumerate(sampler_indices(dataset_size, world_size, epoch, set_epoch)):
            row = epoch * (world_size + 1) + rank
            y = rows - 1 - row
            ticks.append(y + 0.5)
            labels.append(f"epoch {epoch}, rank {rank}")
            for position, index in enumerate(shard):
                # The sampler lays out rank 0, 1, ..., rank 0, 1, ... over the shuffled order and fills
                # the last places with repeats of the first samples.
                repeat = position * world_size + rank >= dataset_size
                padded = padded or repeat
                ax.add_patch(Rectangle((position, y + 0.05), 0.92, 0.9, facecolor=colours(index % colours.N),
                                       alpha=0.55 if not repeat else 0.3, edgecolor="black",
                                       linewidth=1.5 if repeat else 0.8, hatch=PADDED_HATCH if repeat else None,
                                       gid=f"sample {index}{' padded' if repeat else ''}"))
                ax.text(position + 0.46, y + 0.5, str(index), ha="center", va="center", fontsize=10,
                        fontweight="bold" if repeat else "normal")
    ax.set_xlim(-0.1, per_rank + 0.1)
    ax.set_ylim(0, rows)
    ax.set_aspect("equal")
    ax.set_yticks(ticks, labels)
    ax.set_xticks([p + 0.46 for p in range(per_rank)], [str(p) for p in range(per_rank)])
    ax.set_xlabel("position in the rank's epoch")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    if padded:
        ax.legend(handles=[Patch(facecolor="white", edgecolor="black", hatch=PADDED_HATCH,
                                 label="repeated to even out the shards")],
                  loc="upper center", bbox_to_anchor=(0.5, -1.3 / rows), frameon=False)
    how = ("set_epoch(epoch) called: a new order every epoch" if set_epoch
           else "set_epoch NOT called: every epoch repeats the same order")
    ax.set_title(f"DistributedSampler, {dataset_size} samples over {world_size} ranks\n{how}")
    fig.tight_layout()
    return _finish(fig)


def _scaling_axes(ax: Axes, processes: Sequence[int], ylabel: str) -> None:
    ax.set_xlabel("processes N")
    ax.set_ylabel(ylabel)
    ax.set_xticks(list(processes))
    ax.grid(alpha=0.3)


def speedup(images_per_sec: dict[int, float]) -> Figure:
    """Throughput, speedup S(N) = R(N) / R(1) and efficiency S(N) / N against the number of processes N.

    `images_per_sec` maps N to the images per second measured with N processes; it must include N = 1.
    """
    if 1 not in images_per_sec:
        raise ValueError("speedup is measured against one process: images_per_sec needs an entry for N = 1")
    processes = sorted(images_per_sec)
    rates = [images_per_sec[n] for n in processes]
    speedups = [rate / images_per_sec[1] for rate in rates]
    efficiencies = [s / n for s, n in zip(speedups, processes)]
    fig, (ax_rate, ax_speedup, ax_efficiency) = plt.subplots(1, 3, figsize=(12, 3.6))
    ax_rate.plot(processes, rates, "o-", label="measured")
    ax_rate.set_title("throughput R(N)")
    _scaling_axes(ax_rate, processes, "images / second")
    ax_rate.set_ylim(bottom=0)
    ax_speedup.plot(processes, processes, "--", color="grey", label="ideal: S = N")
    ax_speedup.plot(processes, speedups, "o-", label="measured")
    ax_speedup.set_title("speedup S(N) = R(N) / R(1)")
    _scaling_axes(ax_speedup, processes, "speedup")
    ax_speedup.set_ylim(bottom=0)
    ax_efficiency.plot(processes, [1.0] * len(processes), "--", color="grey", label="ideal: 1")
    ax_efficiency.plot(processes, efficiencies, "o-", label="measured")
    ax_efficiency.set_title("efficiency S(N) / N")
    _scaling_axes(ax_efficiency, processes, "efficiency")
    ax_efficiency.set_ylim(0, max(1.1, max(efficiencies) * 1.1))
    for ax in (ax_rate, ax_speedup, ax_efficiency):
        ax.legend(loc="best")
    fig.tight_layout()
    return _finish(fig)


def time_to_accuracy(runs: dict[int, list[Epoch]], target: float) -> Figure:
    """Validation accuracy against wall time (the epochs' times added up), one line per number of processes."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for processes in sorted(runs):
        epochs = runs[processes]
        times, total = [], 0.0
        for epoch in epochs:
            total += epoch.epoch_time
            times.append(total)
        accuracies = [epoch.val_accuracy for epoch in epochs]
        reached = next((t for t, a in zip(times, accuracies) if a >= target), None)
        name = f"N = {processes}"
        label = (f"{name}: reached {target:g} after {reached:.1f} s" if reached is not None
                 else f"{name}: never reached {target:g}")
        ax.plot(times, accuracies, "o-", label=label)
    ax.axhline(target, color="black", linestyle=":", label=f"target accuracy {target:g}")
    ax.set_xlabel("wall time (s, epoch times added up)")
    ax.set_ylabel("validation accuracy")
    ax.set_xlim(left=0)
    ax.set_title("time to accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return _finish(fig)


def amdahl(t_parallel: float, t_sequential: float, t_comm_per_process: float, max_n: int = 8) -> Figure:
    """A model of an epoch's time: T(N) = T_parallel / N + T_sequential + T_communication(N).

    T_communication(N) = t_comm_per_process * (N - 1): nothing to exchange with one process, more the more
    processes take part. Left: T(N) against the ideal T(1) / N; right: the speedup T(1) / T(N) against N.
    """
    if max_n < 1:
        raise ValueError("max_n must be at least 1")
    processes = list(range(1, max_n + 1))

    def epoch_time(n: int) -> float:
        return t_parallel / n + t_sequential + t_comm_per_process * (n - 1)

    times = [epoch_time(n) for n in processes]
    fig, (ax_time, ax_speedup) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax_time.plot(processes, [times[0] / n for n in processes], "--", color="grey", label="ideal: T(1) / N")
    ax_time.plot(processes, times, "o-", label="T(N) (model)")
    ax_time.plot(processes, [t_parallel / n for n in processes], ":", label="T_parallel / N")
    ax_time.plot(processes, [t_sequential + t_comm_per_process * (n - 1) for n in processes], ":",
                 label="T_sequential + T_communication(N)")
    ax_time.set_title("time per epoch")
    _scaling_axes(ax_time, processes, "seconds")
    ax_time.set_ylim(bottom=0)
    ax_speedup.plot(processes, processes, "--", color="grey", label="ideal: S = N")
    ax_speedup.plot(processes, [times[0] / t for t in times], "o-", label="S(N) = T(1) / T(N) (model)")
    ax_speedup.set_title("speedup")
    _scaling_axes(ax_speedup, processes, "speedup")
    ax_speedup.set_ylim(bottom=0)
    for ax in (ax_time, ax_speedup):
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"T(N) = {t_parallel:g} / N + {t_sequential:g} + {t_comm_per_process:g} (N - 1)")
    fig.tight_layout()
    return _finish(fig)


RANK_COLOURS = [plt.get_cmap("tab10")(k) for k in range(10)]  # one colour per rank


def pi_shares(world_size: int = 4, intervals: int = 16) -> Figure:
    """The midpoint rule for pi = integral of 4 / (1 + x^2) over [0, 1]: `intervals` rectangles,
    coloured by the rank that adds them up when rank r takes [r * n // N, (r + 1) * n // N)."""
    if world_size < 1 or intervals < 1:
        raise ValueError("world_size and intervals must be at least 1")
    fig, ax = plt.subplots(figsize=(8, 3.4))
    width = 1 / intervals
    for rank in range(world_size):
        for i in range(rank * intervals // world_size, (rank + 1) * intervals // world_size):
            middle = (i + 0.5) * width
            ax.add_patch(Rectangle((i * width, 0), width, 4 / (1 + middle * middle), alpha=0.6,
                                   facecolor=RANK_COLOURS[rank % 10], edgecolor="white"))
    xs = [k / 200 for k in range(201)]
    ax.plot(xs, [4 / (1 + x * x) for x in xs], color="black", label="f(x) = 4 / (1 + x²)")
    ax.legend(handles=[*ax.get_legend_handles_labels()[0],
                       *[Patch(facecolor=RANK_COLOURS[r % 10], alpha=0.6, label=f"rank {r}") for r in range(world_size)]],
              loc="upper right", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 4.2)
    ax.set_xlabel("x")
    ax.set_title(f"{intervals} rectangles over {world_size} ranks: their areas add up to about pi")
    fig.tight_layout()
    return _finish(fig)


def _by_backend(numbers: list[int], backends: dict[int, str] | None) -> dict[str, list[int]]:
    """The numbers of processes grouped by the backend their runs used (one group, "", when not
    said): a fit across NCCL and gloo runs would model two different machines as one."""
    groups: dict[str, list[int]] = {}
    for n in sorted(numbers):
        groups.setdefault((backends or {}).get(n, ""), []).append(n)
    return groups


def fitted_scaling(seconds: dict[int, float], what: str = "wall time", backends: dict[int, str] | None = None) -> Figure:
    """Measured times against N, with the fit T(N) = T_sequential + T_parallel / N (least squares)
    and the ideal T(1) / N: the fitted sequential part is what no number of processes removes.
    With `backends` ({N: "nccl" or "gloo"}), each backend's runs are fitted apart (a backend with
    a single N is only drawn)."""
    processes = sorted(seconds)
    if len(processes) < 2:
        raise ValueError("need times for at least two numbers of processes")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    groups = _by_backend(processes, backends)
    for backend, ns in groups.items():
        on = f" ({backend})" if backend else ""
        ax.plot(ns, [seconds[n] for n in ns], "o", label=f"measured {what}{on}")
        if len(ns) < 2:
            continue
        xs, ys = [1 / n for n in ns], [seconds[n] for n in ns]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
        t_parallel, t_sequential = max(slope, 0.0), mean_y - max(slope, 0.0) * mean_x
        line, = ax.plot(ns, [t_sequential + t_parallel / n for n in ns], "-",
                        label=f"fit{on}: {t_sequential:.2f} + {t_parallel:.2f} / N")
        ax.axhline(t_sequential, linestyle=":", color=line.get_color(),
                   label=f"sequential part{on}: {t_sequential:.2f} s")
    ax.plot(processes, [seconds[processes[0]] * processes[0] / n for n in processes], "--", color="grey",
            label="ideal: T(1) / N")
    _scaling_axes(ax, processes, "seconds")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(f"{what} against the number of processes")
    fig.tight_layout()
    return _finish(fig)


def ring_states(world_size: int = 4) -> list[list[list[int]]]:
    """How many ranks' values each chunk holds, on each rank, after each round of a ring
    all-reduce (states[round][rank][chunk]; round 0 is the start, rounds 1..N-1 the
    reduce-scatter, then N-1 rounds of all-gather), following the exercise's chunk numbering."""
    n = world_size
    held = [[{r} for _ in range(n)] for r in range(n)]  # held[rank][chunk]: whose values are in it
    states = [[[len(c) for c in rank] for rank in held]]
    for s in range(n - 1):
        sent = [set(held[r][(r - s) % n]) for r in range(n)]
        for r in range(n):
            held[r][(r - s - 1) % n] |= sent[(r - 1) % n]
        states.append([[len(c) for c in rank] for rank in held])
    for s in range(n - 1):
        sent = [set(held[r][(r + 1 - s) % n]) for r in range(n)]
        for r in range(n):
            held[r][(r - s) % n] = sent[(r - 1) % n]
        states.append([[len(c) for c in rank] for rank in held])
    return states


def ring_rounds(world_size: int = 4) -> Figure:
    """Each rank's chunks after each round of the ring: the shade is how many ranks' values a
    chunk holds (1: only its own; N: the full result)."""
    states = ring_states(world_size)
    n = world_size
    fig, axes = plt.subplots(1, len(states), figsize=(1.35 * len(states), 2.4), sharey=True)
    for k, (ax, state) in enumerate(zip(axes, states)):
        ax.imshow(state, cmap="Blues", vmin=0, vmax=n, aspect="equal")
        for r in range(n):
            for c in range(n):
                ax.text(c, r, str(state[r][c]), ha="center", va="center", fontsize=8,
                        color="white" if state[r][c] > n / 2 else "black")
        ax.set_xticks(range(n), [str(c) for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)], fontsize=7)
        ax.set_xlabel("chunk", fontsize=7)
        stage = "start" if k == 0 else (f"scatter {k}" if k < n else f"gather {k - n + 1}")
        ax.set_title(stage, fontsize=8)
    fig.suptitle("ranks' values summed into each chunk: reduce-scatter, then all-gather", fontsize=9)
    fig.tight_layout()
    return _finish(fig)


def ring_times(seconds: dict[int, dict[int, tuple[float, float]]], backends: dict[int, str] | None = None) -> Figure:
    """Ring all-reduce and dist.all_reduce against the tensor's size, one panel per world size
    (seconds[N][floats] = (ring, all_reduce)), with the ring's model fitted to the ring's
    measurements of all world sizes at once: T = 2(N-1) * alpha + 2(N-1)/N * bytes / bandwidth
    (alpha: one message's fixed cost, the latency). With `backends` ({N: "nccl" or "gloo"}), the
    world sizes of each backend are fitted apart: NCCL's links and gloo's are different machines."""
    fits: dict[int, tuple[float, float]] = {}  # N -> (alpha, 1 / bandwidth) of its backend's fit
    said = []
    for backend, ns in _by_backend(list(seconds), backends).items():
        rows = [(n, size, ring) for n in ns for size, (ring, _) in seconds[n].items()]
        # least squares for (alpha, 1/bandwidth) in T = a * alpha + b * inverse_bandwidth
        a = [2 * (n - 1) for n, _, _ in rows]
        b = [2 * (n - 1) / n * 4 * size for n, size, _ in rows]
        t = [ring for _, _, ring in rows]
        saa, sab, sbb = sum(x * x for x in a), sum(x * y for x, y in zip(a, b)), sum(y * y for y in b)
        sat, sbt = sum(x * z for x, z in zip(a, t)), sum(y * z for y, z in zip(b, t))
        det = saa * sbb - sab * sab
        alpha = max((sat * sbb - sbt * sab) / det, 0.0) if det else 0.0
        inverse = max((saa * sbt - sab * sat) / det, 1e-15) if det else 1e-15
        fits.update({n: (alpha, inverse) for n in ns})
        said.append(f"{backend + ': ' if backend else ''}latency α = {alpha * 1e6:.0f} µs per message, "
                    f"bandwidth B = {1 / inverse / 1e9:.2f} GB/s")
    fig, axes = plt.subplots(1, len(seconds), figsize=(4 * len(seconds), 3.4), sharey=True, squeeze=False)
    for ax, n in zip(axes[0], sorted(seconds)):
        sizes = sorted(seconds[n])
        alpha, inverse = fits[n]
        ax.loglog(sizes, [seconds[n][s][0] for s in sizes], "o-", label="your ring")
        ax.loglog(sizes, [seconds[n][s][1] for s in sizes], "s-", label="dist.all_reduce")
        ax.loglog(sizes, [2 * (n - 1) * alpha + 2 * (n - 1) / n * 4 * s * inverse for s in sizes], "--",
                  color="black", label="model 2(N-1)(α + S/(N·B))")
        ax.set_title(f"{n} processes" + (f" ({backends[n]})" if backends and n in backends else ""), fontsize=9)
        ax.set_xlabel("tensor size (floats)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("seconds")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("fitted: " + "; ".join(said), fontsize=9)
    fig.tight_layout()
    return _finish(fig)


def padding_effect(dataset_size: int = 10, world_size: int = 4) -> Figure:
    """What padding and drop_last do to a validation accuracy, with the real DistributedSampler
    (no shuffle) over a data set whose size does not divide by the world size. The "model" is
    right on every image whose index is not a multiple of 3. Averaging what the ranks saw counts
    the padded repeats twice (padding) or never sees the tail (drop_last); only counting each
    image once gives the true accuracy."""
    from torch.utils.data import DistributedSampler  # slow import: only when asked

    correct = [i % 3 != 0 for i in range(dataset_size)]
    seen: dict[bool, list[int]] = {}
    items: Any = range(dataset_size)  # any sized collection does as a data set here
    for drop_last in (False, True):
        samplers: list[Any] = [DistributedSampler(items, num_replicas=world_size, rank=rank, shuffle=False,
                                                  drop_last=drop_last) for rank in range(world_size)]
        seen[drop_last] = [int(i) for sampler in samplers for i in sampler]
    accuracy = {"every image once (true)": sum(correct) / dataset_size,
                f"padded: {len(seen[False])} seen": sum(correct[i] for i in seen[False]) / len(seen[False]),
                f"drop_last: {len(seen[True])} seen": sum(correct[i] for i in seen[True]) / len(seen[True])}
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    bars = ax.barh(list(accuracy)[::-1], [100 * a for a in list(accuracy.values())[::-1]],
                   color=["tab:orange", "tab:red", "tab:green"])
    for bar, value in zip(bars, list(accuracy.values())[::-1]):
        ax.text(bar.get_width() + 0.5, bar.get_y() + bar.get_height() / 2, f"{100 * value:.1f}%", va="center")
    ax.set_xlim(0, 100)
    ax.set_xlabel("validation accuracy (%)")
    ax.set_title(f"{dataset_size} validation images over {world_size} ranks: the same model, three answers", fontsize=10)
    fig.tight_layout()
    return _finish(fig)


def arrival_orders(orders: list[list[int]]) -> Figure:
    """The order in which the ranks' first lines arrived, one row per run of the same program."""
    world_size = max(max(o) for o in orders) + 1
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(1.1 * world_size + 2, 0.55 * len(orders) + 1.2))
    for row, order in enumerate(orders):
        for position, rank in enumerate(order):
            ax.add_patch(Rectangle((position, len(orders) - 1 - row + 0.1), 0.9, 0.8, facecolor=colours(rank), alpha=0.6))
            ax.text(position + 0.45, len(orders) - 1 - row + 0.5, f"rank {rank}", ha="center", va="center", fontsize=9)
    ax.set_xlim(0, world_size)
    ax.set_ylim(0, len(orders))
    ax.set_yticks([len(orders) - 1 - r + 0.5 for r in range(len(orders))], [f"run {r + 1}" for r in range(len(orders))])
    ax.set_xticks([p + 0.45 for p in range(world_size)], [f"{p + 1}{'st' if p == 0 else 'nd' if p == 1 else 'rd' if p == 2 else 'th'}"
                                                         for p in range(world_size)])
    ax.set_xlabel("order in which the 'hello' lines arrived")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title("the same program, started the same way: the order differs", fontsize=10)
    fig.tight_layout()
    return _finish(fig)


def _buffer_cells(ax: Axes, buffers: list[list[float]], title: str, highlight: list[bool] | None = None) -> None:
    """Each rank's buffer as a row of numbered cells."""
    width = max(len(b) for b in buffers)
    for rank, values in enumerate(buffers):
        y = len(buffers) - 1 - rank
        for k, value in enumerate(values):
            lit = highlight[rank] if highlight else False
            ax.add_patch(Rectangle((k, y + 0.1), 0.95, 0.8, facecolor="tab:orange" if lit else "tab:blue",
                                   alpha=0.45 if lit else 0.25, edgecolor="black", linewidth=0.5))
            ax.text(k + 0.47, y + 0.5, f"{value:g}", ha="center", va="center", fontsize=8)
    ax.set_xlim(0, max(width, 2))
    ax.set_ylim(0, len(buffers))
    ax.set_yticks([len(buffers) - 1 - r + 0.5 for r in range(len(buffers))], [f"rank {r}" for r in range(len(buffers))],
                  fontsize=8)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=8)


def collective(buffers: dict[str, list[list[list[float]]]], name: str, call: str, note: str = "") -> Figure:
    """One collective, run for real: every rank's buffer before and after (`buffers[name][rank]`
    is [before, after]); the ranks whose buffer changed are shaded orange."""
    per_rank = buffers[name]
    before, after = [b for b, _ in per_rank], [a for _, a in per_rank]
    wide = max(len(x) for x in before + after)
    title = call + (f"\n{note}" if note else "")
    width = max(min(2.2 + 0.55 * wide, 7.5) * 2 / 1.6, 0.075 * max(len(line) for line in title.splitlines()))
    fig, (left, right) = plt.subplots(1, 2, figsize=(width, 0.45 * len(per_rank) + 1.2),
                                      gridspec_kw={"width_ratios": [max(len(x) for x in before), max(len(x) for x in after)]})
    _buffer_cells(left, before, "before")
    _buffer_cells(right, after, "after", [b != a for b, a in zip(before, after)])
    fig.suptitle(title, fontsize=9, family="monospace")
    fig.tight_layout()
    return _finish(fig)


def reduction_ops(buffers: dict[str, list[list[list[float]]]]) -> Figure:
    """all_reduce of the same buffers with each reduction: what every rank holds afterwards."""
    ops = [name for name in buffers if name.startswith("op_")]
    starts = [b for b, _ in buffers[ops[0]]]
    fig, ax = plt.subplots(figsize=(7, 0.5 * (len(ops) + len(starts)) + 1.4))
    rows = [(f"rank {r} before", values) for r, values in enumerate(starts)] + \
           [(f"op={name.removeprefix('op_')}", buffers[name][0][1]) for name in ops]
    for row, (label, values) in enumerate(rows):
        y = len(rows) - 1 - row
        for k, value in enumerate(values):
            after = row >= len(starts)
            ax.add_patch(Rectangle((k * 1.6, y + 0.1), 1.5, 0.8, facecolor="tab:orange" if after else "tab:blue",
                                   alpha=0.4 if after else 0.2, edgecolor="black", linewidth=0.5))
            ax.text(k * 1.6 + 0.75, y + 0.5, f"{value:g}", ha="center", va="center", fontsize=9)
    ax.set_xlim(0, 1.6 * len(starts[0]))
    ax.set_ylim(0, len(rows))
    ax.set_yticks([len(rows) - 1 - r + 0.5 for r in range(len(rows))], [label for label, _ in rows], fontsize=9)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title("dist.all_reduce(buffer, op=dist.ReduceOp.<op>): every rank ends with the same", fontsize=9)
    fig.tight_layout()
    return _finish(fig)


def restart_timeline(runs: dict[str, list[dict[str, Any]]]) -> Figure:
    """Each run of a fault-tolerant script as a timeline, one row per process and life: when it
    trained, when rank 0's checkpoints were complete, where a process was killed and where the
    restarted processes loaded the checkpoint.

    `runs`: title -> processes, each {"life", "rank", "start", "end", "saves", "loads", "killed"}
    (seconds since the run began; "killed" is None or a time)."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.2 + 1.05 * sum(len(p) for p in runs.values()) / 2),
                             squeeze=False, sharex=True)
    colours = plt.get_cmap("tab10")
    for ax, (title, processes) in zip(axes[:, 0], runs.items()):
        rows = sorted(processes, key=lambda p: (p["life"], p["rank"]))
        for y, p in enumerate(rows):
            ax.barh(y, p["end"] - p["start"], left=p["start"], height=0.5, color=colours(p["life"]), alpha=0.6)
            for t in p["saves"]:
                ax.plot([t, t], [y - 0.35, y + 0.35], color="black", linewidth=2)
            for t in p["loads"]:
                ax.plot(t, y, marker="o", color="tab:blue", markersize=7)
            if p["killed"] is not None:
                ax.plot(p["killed"], y, marker="X", color="red", markersize=12)
        ax.set_yticks(range(len(rows)), [f"life {p['life']}, rank {p['rank']}" for p in rows])
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("seconds since the start")
    handles = [Patch(color=colours(0), alpha=0.6, label="training (first life)"),
               Patch(color=colours(1), alpha=0.6, label="after a restart"),
               plt.Line2D([], [], color="black", linewidth=2, label="checkpoint complete"),
               plt.Line2D([], [], color="tab:blue", marker="o", linestyle="", label="checkpoint loaded"),
               plt.Line2D([], [], color="red", marker="X", linestyle="", markersize=10, label="killed (SIGKILL)")]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return _finish(fig)


def time_model(seconds: dict[int, float], params: Sequence[float], predict_at: int = 16,
               what: str = "epoch time") -> Figure:
    """Left: measured times against N with the fitted T(N) = t_par/N + t_seq + t_comm (N - 1),
    drawn on to N = predict_at, and the ideal T(1)/N. Right: speedup and efficiency, measured
    and as the model predicts them, against the ideal."""
    processes = sorted(seconds)
    t_par, t_seq, t_comm = params
    model = lambda n: t_par / n + t_seq + t_comm * (n - 1)  # noqa: E731
    ns = list(range(1, predict_at + 1))
    fig, (ax_time, ax_speedup) = plt.subplots(1, 2, figsize=(12, 3.8))
    ax_time.plot(processes, [seconds[n] for n in processes], "o", label=f"measured {what}")
    ax_time.plot(ns, [model(n) for n in ns], "-",
                 label=f"fit: {t_par:.2f}/N + {t_seq:.2f} + {t_comm:.3f}(N-1)")
    ax_time.plot(ns, [seconds[1] / n for n in ns], "--", color="grey", label="ideal: T(1) / N")
    ax_time.plot([predict_at], [model(predict_at)], "s", color="C3", label=f"predicted T({predict_at}) = "
                 f"{model(predict_at):.2f} s")
    _scaling_axes(ax_time, ns[:: max(1, predict_at // 8)], "seconds")
    ax_time.set_ylim(bottom=0)
    ax_time.set_title(f"{what} against the number of processes")
    ax_time.legend(loc="best", fontsize=8)
    ax_speedup.plot(ns, ns, "--", color="grey", label="ideal speedup: N")
    ax_speedup.plot(processes, [seconds[1] / seconds[n] for n in processes], "o", color="C0",
                    label="measured speedup")
    ax_speedup.plot(ns, [model(1) / model(n) for n in ns], "-", color="C0", alpha=0.6, label="model's speedup")
    ax_efficiency = ax_speedup.twinx()
    ax_efficiency.plot(processes, [seconds[1] / seconds[n] / n for n in processes], "o", color="C1",
                       label="measured efficiency")
    ax_efficiency.plot(ns, [model(1) / model(n) / n for n in ns], "-", color="C1", alpha=0.6,
                       label="model's efficiency")
    ax_efficiency.set_ylim(0, 1.1)
    ax_efficiency.set_ylabel("efficiency S(N) / N", color="C1")
    _scaling_axes(ax_speedup, ns[:: max(1, predict_at // 8)], "speedup S(N)")
    ax_speedup.set_ylim(bottom=0)
    ax_speedup.set_title("speedup and efficiency")
    lines = ax_speedup.get_legend_handles_labels()
    more = ax_efficiency.get_legend_handles_labels()
    ax_speedup.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    fig.tight_layout()
    return _finish(fig)


def time_split(phases: dict[str, float], title: str = "one training step") -> Figure:
    """Where a step's time goes: one bar cut into the phases (seconds per step), and below it the
    all-reduce's own time, which runs inside (and, with DDP's buckets, under) the backward pass."""
    order = [p for p in phases if p != "all-reduce"]
    fig, ax = plt.subplots(figsize=(10, 2.8))
    left = 0.0
    for k, name in enumerate(order):
        width = phases[name] * 1000
        ax.barh(1, width, left=left, color=RANK_COLOURS[k], edgecolor="black", label=name)
        if width > 0.06 * sum(phases[p] * 1000 for p in order):
            ax.text(left + width / 2, 1, f"{width:.0f} ms", ha="center", va="center", fontsize=8)
        left += width
    if "all-reduce" in phases:
        backward = [k for k, p in enumerate(order) if p.startswith("backward")]
        end = sum(phases[p] for p in order[:backward[0] + 1]) * 1000 if backward else left
        ax.barh(0, phases["all-reduce"] * 1000, left=end - phases["all-reduce"] * 1000, color="white",
                edgecolor="black", hatch="///", label=f"all-reduce ({phases['all-reduce'] * 1000:.0f} ms, inside backward)")
    ax.set_yticks([0, 1], ["communication", "step"])
    ax.set_xlabel("milliseconds per step")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=5, fontsize=8)
    fig.tight_layout()
    return _finish(fig)


def fix_speedups(names: list[str], rates: list[float | None], notes: list[str] | None = None) -> Figure:
    """Images per second of each setting against the first (the baseline); a setting not run
    (rate None) shows its note instead of a bar."""
    base = rates[0] or 1.0
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1))
    for k, (name, rate) in enumerate(zip(names, rates)):
        if rate is None:
            ax.text(0.02, k, notes[k] if notes else "not run", va="center", fontsize=8, color="grey")
            continue
        ax.barh(k, rate / base, color="C2" if rate >= base else "C3")
        ax.text(rate / base, k, f" {rate / base:.2f}x", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("images / second, relative to the baseline")
    fig.tight_layout()
    return _finish(fig)


def large_batch(logs: dict[str, list[dict[str, Any]]]) -> Figure:
    """Validation accuracy of each run by epoch (left) and by optimizer step (right): a larger
    global batch takes fewer steps per epoch, so at the same epoch it has taken fewer steps."""
    fig, (ax_epoch, ax_step) = plt.subplots(1, 2, figsize=(12, 3.8))
    for name, records in logs.items():
        epochs = [r["epoch"] for r in records]
        ax_epoch.plot(epochs, [r["val_accuracy"] for r in records], "o-", label=name)
        ax_step.plot([r["steps"] for r in records], [r["val_accuracy"] for r in records], "o-", label=name)
    ax_epoch.set_xlabel("epoch")
    ax_step.set_xlabel("optimizer steps")
    for ax in (ax_epoch, ax_step):
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
    ax_epoch.set_title("by epoch")
    ax_step.set_title("by step")
    ax_epoch.legend(loc="best", fontsize=7)
    fig.tight_layout()
    return _finish(fig)


def lr_schedules(rates: dict[str, list[float]], warmup_steps: int) -> Figure:
    """Learning rate against optimizer step, one line per setting; the warm-up's end dotted."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for name, values in rates.items():
        ax.plot(range(len(values)), values, ".-", label=name)
    ax.axvline(warmup_steps, linestyle=":", color="black", label=f"end of the warm-up (step {warmup_steps})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return _finish(fig)


def against_ddp(times: dict[str, float], reference: str = "DDP") -> Figure:
    """Seconds per step of each hand-made DDP beside DistributedDataParallel's, labelled with the ratio."""
    names = list(times)
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.2))
    for k, name in enumerate(names):
        ax.barh(k, times[name] * 1000, color="grey" if name == reference else RANK_COLOURS[k % 10])
        ax.text(times[name] * 1000, k, f" {times[name] / times[reference]:.2f} x", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per step (rank 0)")
    ax.set_title(f"each against {reference}, measured in one run")
    fig.tight_layout()
    return _finish(fig)


def zero_stages(memory: dict[str, dict[str, float]], title: str) -> Figure:
    """Per-process memory by ZeRO stage (notebook.inside.zero_memory): a stacked bar of parameters,
    gradients and optimizer state for each stage, in MB or GB."""
    stages = list(memory)
    kinds = list(next(iter(memory.values())))
    largest = max(sum(m.values()) for m in memory.values())
    unit, scale = ("GB", 1024 ** 3) if largest >= 1024 ** 3 else ("MB", 1024 ** 2)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottom = [0.0] * len(stages)
    for k, kind in enumerate(kinds):
        values = [memory[s][kind] / scale for s in stages]
        ax.bar(range(len(stages)), values, bottom=bottom, color=RANK_COLOURS[k], label=kind)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, total in enumerate(bottom):
        ax.text(x, total, f"{total:.3g} {unit}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(stages)), stages)
    ax.set_ylabel(f"{unit} per process")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return _finish(fig)


def state_shares(runs: dict[int, list[float]]) -> Figure:
    """Each rank's share of the unsharded optimizer state, measured, for each number of processes,
    beside the even share 1/N."""
    sizes = sorted(runs)
    fig, ax = plt.subplots(figsize=(6, 3))
    for n in sizes:
        for rank, share in enumerate(runs[n]):
            ax.scatter(n, share * 100, color=RANK_COLOURS[rank % 10], zorder=3, label=f"rank {rank}" if n == max(
                sizes, key=lambda m: len(runs[m])) else None)
    ax.plot(sizes, [100 / n for n in sizes], color="grey", linestyle="--", label="1/N")
    ax.set_xticks(sizes)
    ax.set_xlabel("processes (N)")
    ax.set_ylabel("% of the unsharded state")
    ax.set_ylim(bottom=0)
    ax.set_title("optimizer state per rank, measured")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return _finish(fig)


def tensor_split(world_size: int = 2) -> Figure:
    """A linear layer's weight (out x in) cut two ways among `world_size` ranks: by rows for the
    column split (each rank makes some outputs: all-gather them), by columns for the row split
    (each rank makes a partial sum of every output: all-reduce them)."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax, (title, by_rows, after) in zip(axes, [("column split: W cut by output features", True, "all-gather"),
                                                  ("row split: W cut by input features", False, "all-reduce")]):
        for r in range(world_size):
            box = (Rectangle((0, r / world_size), 1, 1 / world_size) if by_rows
                   else Rectangle((r / world_size, 0), 1 / world_size, 1))
            box.set_facecolor(RANK_COLOURS[r % 10])
            box.set_alpha(0.55)
            box.set_edgecolor("black")
            ax.add_patch(box)
            x, y = ((0.5, (r + 0.5) / world_size) if by_rows else ((r + 0.5) / world_size, 0.5))
            ax.text(x, y, f"rank {r}", ha="center", va="center", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(1, 0)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("input features")
        ax.set_ylabel("output features")
        ax.set_title(f"{title}\nthen {after}", fontsize=9)
    fig.tight_layout()
    return _finish(fig)


def pipeline_timeline(stages: dict[str, list[Any]], title: str = "") -> Figure:
    """A Gantt chart of a pipeline step: one row per stage, a box per micro-batch's forward (light)
    and backward (dark), labelled with the micro-batch; the white gaps are the bubble."""
    fig, ax = plt.subplots(figsize=(8, 0.8 * len(stages) + 1.2))
    for row, (rank, events) in enumerate(sorted(stages.items(), key=lambda kv: int(kv[0]))):
        for kind, m, start, end in events:
            colour = RANK_COLOURS[m % 10]
            ax.barh(row, (end - start) * 1000, left=start * 1000, color=colour, alpha=0.45 if kind == "forward" else 0.95,
                    edgecolor="black", linewidth=0.5)
            ax.text((start + end) / 2 * 1000, row, f"{'F' if kind == 'forward' else 'B'}{m}", ha="center",
                    va="center", fontsize=7)
    ax.set_yticks(range(len(stages)), [f"stage {r}" for r in sorted(stages, key=int)])
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds into the step")
    ax.set_title(title or "one pipeline step: F = forward, B = backward of micro-batch k")
    fig.tight_layout()
    return _finish(fig)


def bubbles(measured: dict[int, float], ideal: dict[int, float]) -> Figure:
    """The idle share of a pipeline step by number of micro-batches, measured and GPipe's (S-1)/(M+S-1)."""
    ms = sorted(measured)
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(ms, [measured[m] * 100 for m in ms], marker="o", label="measured")
    ax.plot(ms, [ideal[m] * 100 for m in ms], linestyle="--", color="grey", label="(S-1)/(M+S-1)")
    ax.set_xticks(ms)
    ax.set_xlabel("micro-batches (M)")
    ax.set_ylabel("% of the step idle")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("the bubble shrinks as the micro-batches grow")
    fig.tight_layout()
    return _finish(fig)
