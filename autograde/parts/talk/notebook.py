"""What the notebooks of the part "how processes talk" (processes_talk, notebooks 10-13) call:
launching an exercise with N processes and timing it, and the checker's runner of collectives and
rings (all through runtime.run: output in the cell, a time limit, nothing left running); and the
part's figures: the ranks' arrival order, the collectives' buffers before and after (10), pi's
shares and the scaling fit (11), what padding does to an accuracy (12), the ring's rounds and its
times against its model (13)."""
from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from autograde import settings
from autograde.engine import processes
from autograde.engine.workspace import task_command
from autograde.jupyter import runtime
from autograde.jupyter.figures import RANK_COLOURS, finish, scaling_axes
from autograde.parts.talk import reports
from autograde.parts.talk.reports import (
    COLLECTIVES_WORLD_SIZE,
    CollectivesReport,
    CollectivesTask,
    RingReport,
    RingTask,
)
from autograde.protocol import Task, decode, read_reports

SCENARIOS = reports.SCENARIOS  # each collective of notebook 10 as the call that makes it


def exercise(name: str) -> Path:
    """The learner's exercise file, exercises/<name>, found from the notebook's folder."""
    return runtime.course_file(f"exercises/{name}").resolve()


def launch_exercise(name: str, *args: str | int, echo: bool = True) -> tuple[str, float]:
    """`python exercises/<name> ARGS`, as in a terminal: its output, and its wall time in seconds."""
    return _launch(exercise(name), *args, echo=echo)


def _launch(script: Path, *args: str | int, echo: bool) -> tuple[str, float]:
    started = time.perf_counter()
    text = runtime.run([processes.PYTHON, script, *map(str, args)], timeout=300 if runtime.QUICK else 1800, echo=echo)
    return text, time.perf_counter() - started


def wall_times(name: str, world_sizes: list[int], *args: str | int) -> dict[int, float]:
    """The wall time of `python exercises/<name> --world-size N ARGS` for each N (one run each)."""
    seconds = {}
    for n in world_sizes:
        _, seconds[n] = launch_exercise(name, "--world-size", n, *args, echo=False)
        print(f"--world-size {n}: {seconds[n]:.1f} s")
    return seconds


def backends(world_sizes: list[int]) -> dict[int, str]:
    """The backend the exercises' runs use with each number of processes: NCCL where this machine
    has a GPU for every process, gloo otherwise (the exercises' own rule). On a GPU node, small
    runs are NCCL's and larger ones gloo's: their times are fitted apart."""
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {n: "nccl" if gpus >= n else "gloo" for n in world_sizes}


def _call(task: Task, timeout: float) -> list[dict[str, Any]]:
    """The checker's runner (autograde/inprocess/runner.py) made to do `task` in processes of
    its own, through runtime.run (a time limit, nothing left running): what each rank reported."""
    with tempfile.TemporaryDirectory() as out:
        runtime.run(task_command(task, Path(out)), timeout=timeout, echo=False,
                    env={"PYTHONPATH": str(settings.REPO), "OMP_NUM_THREADS": "1"})
        return read_reports(Path(out))


def ring_times(world_sizes: list[int], sizes: list[int], repeats: int = 5) -> dict[int, dict[int, tuple[float, float]]]:
    """Time the learner's ring_all_reduce (exercises/ring_allreduce.py) beside dist.all_reduce:
    seconds[N][floats] = (ring, all_reduce), each the median of `repeats` calls, slowest rank's.
    The calls are made by the checker's runner (autograde/inprocess/runner.py), in processes of
    their own; a ring that gives wrong results is said so (its times mean little)."""
    task = RingTask(script=str(Path(exercise("ring_allreduce.py")).resolve()), world_sizes=world_sizes, sizes=sizes,
                    repeats=repeats, ops=["sum"])
    reports = [decode(RingReport, r) for r in _call(task, timeout=600)]
    seconds: dict[int, dict[int, tuple[float, float]]] = {}
    for report in reports:
        for case in report.cases:
            ring, reference = seconds.setdefault(report.world_size, {}).get(case.numel, (0.0, 0.0))
            seconds[report.world_size][case.numel] = (max(ring, case.seconds), max(reference, case.reference_seconds))
    wrong = sorted({r.world_size for r in reports for c in r.cases if c.error > 1e-5})
    if wrong:
        print(f"careful: your ring's results differ from dist.all_reduce's with {wrong} processes; its times mean little")
    return seconds


HELLO = "demos/hello_ranks.py"  # a demo, not an exercise: no learner's copy of it


def arrival_orders(runs: int | None = None, world_size: int = 4) -> list[list[int]]:
    """Run demos/hello_ranks.py `runs` times (3; 2 in quick mode) and note the order of the
    ranks' hello lines."""
    orders = []
    for k in range(runs or (2 if runtime.QUICK else 3)):
        text, _ = _launch(runtime.course_file(HELLO).resolve(), "--world-size", world_size, echo=k == 0)
        orders.append([int(m.group(1)) for m in re.finditer(r"hello from rank (\d+)", text)])
        print(f"run {k + 1}: ranks in the order {orders[-1]}")
    return orders


def collectives() -> dict[str, list[list[list[float]]]]:
    """Every collective of the course's scenarios (autograde/parts/talk/reports.py, SCENARIOS),
    made for real on 4 processes: buffers[name][rank] = [before, after]."""
    reports = sorted((decode(CollectivesReport, r) for r in _call(CollectivesTask(world_sizes=[COLLECTIVES_WORLD_SIZE]), timeout=300)),
                     key=lambda r: r.rank)
    return {name: [r.buffers[name] for r in reports] for name in reports[0].buffers}


# Figures -------------------------------------------------------------------------------------

def plot_arrival_orders(orders: list[list[int]]) -> Figure:
    """The order in which the ranks' first lines arrived, one row per run of the same program
    (`orders` as arrival_orders returns them)."""
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
    return finish(fig)


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
    return finish(fig)


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
    return finish(fig)


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
    return finish(fig)


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
    scaling_axes(ax, processes, "seconds")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(f"{what} against the number of processes")
    fig.tight_layout()
    return finish(fig)


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
    return finish(fig)


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
    return finish(fig)


def plot_ring_times(seconds: dict[int, dict[int, tuple[float, float]]], backends: dict[int, str] | None = None) -> Figure:
    """Ring all-reduce and dist.all_reduce against the tensor's size, one panel per world size
    (seconds[N][floats] = (ring, all_reduce), as ring_times measures them), with the ring's model
    fitted to the ring's measurements of all world sizes at once: T = 2(N-1) * alpha + 2(N-1)/N *
    bytes / bandwidth (alpha: one message's fixed cost, the latency). With `backends` ({N: "nccl"
    or "gloo"}), the world sizes of each backend are fitted apart: NCCL's links and gloo's are
    different machines."""
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
    return finish(fig)
