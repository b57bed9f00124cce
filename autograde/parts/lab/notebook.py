"""The core lab's figures (part ddp_lab, notebooks 00-09): how ranks are laid out (01, 04), how
DistributedSampler splits the data (01, 05; notebook 12 draws it again), and how runs scale: speedup,
time to accuracy and Amdahl's model (09). What the lab's notebooks run is in autograde/jupyter/runtime.py;
how every figure is handed back is in figure_style.py.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from autograde.engine import output, processes
from autograde.engine.output import Epoch
from autograde.grading import api
from autograde.jupyter import runtime
from autograde.jupyter.figures import finish, scaling_axes
from autograde.parts.lab import runs

PADDED_HATCH = "///"  # how sampler_partition marks a sample the sampler repeated to even out the shards


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
    return finish(fig)


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
    return finish(fig)


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
    scaling_axes(ax_rate, processes, "images / second")
    ax_rate.set_ylim(bottom=0)
    ax_speedup.plot(processes, processes, "--", color="grey", label="ideal: S = N")
    ax_speedup.plot(processes, speedups, "o-", label="measured")
    ax_speedup.set_title("speedup S(N) = R(N) / R(1)")
    scaling_axes(ax_speedup, processes, "speedup")
    ax_speedup.set_ylim(bottom=0)
    ax_efficiency.plot(processes, [1.0] * len(processes), "--", color="grey", label="ideal: 1")
    ax_efficiency.plot(processes, efficiencies, "o-", label="measured")
    ax_efficiency.set_title("efficiency S(N) / N")
    scaling_axes(ax_efficiency, processes, "efficiency")
    ax_efficiency.set_ylim(0, max(1.1, max(efficiencies) * 1.1))
    for ax in (ax_rate, ax_speedup, ax_efficiency):
        ax.legend(loc="best")
    fig.tight_layout()
    return finish(fig)


def time_to_accuracy(runs: dict[int, list[Epoch]], target: float) -> Figure:
    """Validation accuracy against wall time (the epochs' times added up), one line per number of processes."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for count in sorted(runs):
        epochs = runs[count]
        times, total = [], 0.0
        for epoch in epochs:
            total += epoch.epoch_time
            times.append(total)
        accuracies = [epoch.val_accuracy for epoch in epochs]
        reached = next((t for t, a in zip(times, accuracies) if a >= target), None)
        name = f"N = {count}"
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
    return finish(fig)


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
    scaling_axes(ax_time, processes, "seconds")
    ax_time.set_ylim(bottom=0)
    ax_speedup.plot(processes, processes, "--", color="grey", label="ideal: S = N")
    ax_speedup.plot(processes, [times[0] / t for t in times], "o-", label="S(N) = T(1) / T(N) (model)")
    ax_speedup.set_title("speedup")
    scaling_axes(ax_speedup, processes, "speedup")
    ax_speedup.set_ylim(bottom=0)
    for ax in (ax_time, ax_speedup):
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"T(N) = {t_parallel:g} / N + {t_sequential:g} + {t_comm_per_process:g} (N - 1)")
    fig.tight_layout()
    return finish(fig)


def train(*args: str | Path, num_gpus: int | None = None, script_path: str | Path | None = None,
          timeout: float | None = None) -> list[Epoch]:
    """Train with the learner's script (`--num-gpus N` when given) and return its epoch lines.

    Several processes need Step 10 (the script starting them): before it is done, a run with
    --num-gpus 2 would wait forever for a second process, so this asks Step 10's check first
    (its verdict is usually known already) and says what is missing instead.
    """
    path = Path(script_path) if script_path else runtime.script()
    if num_gpus is not None and num_gpus > 1:
        (step_10,) = api.check_steps(["10"], path)
        if step_10.passed is False:
            raise runtime.LaunchError(f"--num-gpus {num_gpus} needs Step 10 done; its check says: {step_10.observed}")
    extra = [] if num_gpus is None else ["--num-gpus", str(num_gpus)]
    if "--master-port" in runs.script_options(path):  # from Step 2 on: a port nothing else holds
        extra += ["--master-port", str(processes.free_port())]
    text = runtime.run([processes.PYTHON, path, *runtime.training_args(), *extra, *map(str, args)], timeout)
    epochs = output.epochs(text)
    if not epochs:
        raise runtime.LaunchError("the script printed no epoch line (epoch N | time ... | val accuracy ...)")
    return epochs
