"""The notebooks' pictures (each part's figures, in autograde/notebook/<part>.py) show what they claim:
the right ranks, the sampler's real split, the measured scaling."""
from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ROOT  # noqa: F401  (puts the repository on sys.path)
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from torch.utils.data import DistributedSampler

from autograde.engine.output import Epoch
from autograde.parts.lab import notebook as lab
from autograde.parts.talk import notebook as talk


def texts(fig: Figure) -> list[str]:
    return [text.get_text() for ax in fig.axes for text in ax.texts]


def line(ax: Axes, label_start: str) -> Line2D:
    found = [line for line in ax.get_lines() if str(line.get_label()).startswith(label_start)]
    assert len(found) == 1, [line.get_label() for line in ax.get_lines()]
    return found[0]


def xs(line: Line2D) -> list[float]:
    return [float(x) for x in np.asarray(line.get_xdata())]


def ys(line: Line2D) -> list[float]:
    return [float(y) for y in np.asarray(line.get_ydata())]


def cells(fig: Figure) -> list[tuple[int, bool]]:
    """The sampler figure's cells in drawing order: (sample index, whether it is a padded repeat)."""
    found = []
    for patch in fig.axes[0].patches:
        match = re.fullmatch(r"sample (\d+)( padded)?", patch.get_gid() or "")
        if isinstance(patch, Rectangle) and match:
            found.append((int(match[1]), bool(match[2])))
    return found


def test_rank_layout_labels_every_process_with_its_global_and_local_rank() -> None:
    fig = lab.rank_layout(2, 2)
    labels = {(int(m[1]), int(m[2])) for t in texts(fig) for m in [re.search(r"rank (\d+), local rank (\d+)", t)] if m}
    assert labels == {(0, 0), (1, 1), (2, 0), (3, 1)}
    assert "node_id 0" in texts(fig) and "node_id 1" in texts(fig)
    assert any("node_id * gpus_per_node + local_rank" in t for t in texts(fig))
    assert "world size 4" in fig.axes[0].get_title()


def test_rank_layout_of_three_single_gpu_nodes() -> None:
    fig = lab.rank_layout(3, 1)
    labels = {(int(m[1]), int(m[2])) for t in texts(fig) for m in [re.search(r"rank (\d+), local rank (\d+)", t)] if m}
    assert labels == {(0, 0), (1, 0), (2, 0)}
    assert "world size 3" in fig.axes[0].get_title()


def test_sampler_indices_are_the_real_samplers() -> None:
    for rank in range(3):
        sampler: DistributedSampler[int] = DistributedSampler(list(range(10)), num_replicas=3, rank=rank,  # type: ignore[arg-type]
                                                              shuffle=True, seed=0)
        sampler.set_epoch(1)
        assert lab.sampler_indices(10, 3, epoch=1)[rank] == list(sampler)


def test_sampler_partition_covers_every_sample_and_marks_the_padding() -> None:
    fig = lab.sampler_partition(dataset_size=10, world_size=3, epochs=2)
    drawn = cells(fig)
    assert len(drawn) == 2 * 12  # two epochs of 3 ranks x 4 places
    for epoch in range(2):
        shown = drawn[12 * epoch:12 * (epoch + 1)]
        assert {index for index, _ in shown} == set(range(10))
        assert sum(padded for _, padded in shown) == 2  # 12 places for 10 samples
        assert {index for index, padded in shown if not padded} == set(range(10))  # the rest: each sample once
    numbers = [int(t) for t in texts(fig) if t.isdigit()]
    assert numbers == [index for index, _ in drawn]
    assert any(patch.get_hatch() == lab.PADDED_HATCH for patch in fig.axes[0].patches)
    assert "set_epoch(epoch) called" in fig.axes[0].get_title()


def test_sampler_partition_without_padding_or_set_epoch() -> None:
    fig = lab.sampler_partition(dataset_size=10, world_size=2, epochs=2, set_epoch=False)
    drawn = cells(fig)
    assert not any(padded for _, padded in drawn)
    assert drawn[:10] == drawn[10:]  # without set_epoch the second epoch repeats the first
    assert "NOT called" in fig.axes[0].get_title()
    reshuffled = cells(lab.sampler_partition(dataset_size=10, world_size=2, epochs=2, set_epoch=True))
    assert reshuffled[:10] == drawn[:10] and reshuffled[10:] != drawn[10:]


def test_speedup_panels() -> None:
    fig = lab.speedup({1: 100.0, 4: 300.0, 2: 180.0})
    rate_ax, speedup_ax, efficiency_ax = fig.axes
    assert ys(line(rate_ax, "measured")) == [100.0, 180.0, 300.0]
    ideal = line(speedup_ax, "ideal")
    assert xs(ideal) == ys(ideal) == [1, 2, 4]
    assert ys(line(speedup_ax, "measured")) == pytest.approx([1.0, 1.8, 3.0])
    assert ys(line(efficiency_ax, "ideal")) == [1.0, 1.0, 1.0]
    assert ys(line(efficiency_ax, "measured")) == pytest.approx([1.0, 0.9, 0.75])
    with pytest.raises(ValueError, match="N = 1"):
        lab.speedup({2: 180.0, 4: 300.0})


def test_time_to_accuracy_adds_up_epoch_times_and_says_who_never_got_there() -> None:
    def run(*points: tuple[float, float]) -> list[Epoch]:
        return [Epoch(i + 1, time, 100.0, 0.5, accuracy) for i, (time, accuracy) in enumerate(points)]

    fig = lab.time_to_accuracy({1: run((10, 0.6), (10, 0.86)), 2: run((6, 0.5), (6, 0.7))}, target=0.85)
    ax = fig.axes[0]
    one = line(ax, "N = 1")
    assert xs(one) == [10.0, 20.0] and ys(one) == [0.6, 0.86]
    assert "reached 0.85 after 20.0 s" in str(one.get_label())
    assert "never reached 0.85" in str(line(ax, "N = 2").get_label())
    assert ys(line(ax, "target")) == [0.85, 0.85]
    legend = ax.get_legend()
    assert legend is not None and any("never reached" in t.get_text() for t in legend.get_texts())


def test_amdahl_model() -> None:
    fig = lab.amdahl(t_parallel=100.0, t_sequential=5.0, t_comm_per_process=3.0, max_n=4)
    time_ax, speedup_ax = fig.axes[:2]
    assert ys(line(time_ax, "T(N)")) == pytest.approx([105.0, 58.0, 100 / 3 + 11, 39.0])
    assert ys(line(time_ax, "ideal")) == pytest.approx([105.0, 52.5, 35.0, 26.25])
    assert ys(line(speedup_ax, "ideal")) == [1, 2, 3, 4]


@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_ring_states_follow_the_exercise_rounds(world_size: int) -> None:
    """After the reduce-scatter rank r holds chunk (r + 1) % N complete; after the all-gather, all."""
    states = talk.ring_states(world_size)
    assert len(states) == 2 * world_size - 1
    assert all(count == 1 for rank in states[0] for count in rank)
    scattered = states[world_size - 1]
    for rank in range(world_size):
        assert scattered[rank][(rank + 1) % world_size] == world_size
        assert sorted(scattered[rank]).count(world_size) == 1
    assert all(count == world_size for rank in states[-1] for count in rank)
    assert len(talk.ring_rounds(world_size).axes) == 2 * world_size - 1


def test_padding_effect_shows_the_true_padded_and_dropped_accuracies() -> None:
    """10 images over 4 ranks, right on those whose index is not a multiple of 3 (6 of 10)."""
    fig = talk.padding_effect(10, 4)
    widths = sorted(round(float(bar.get_width()), 1) for bar in fig.axes[0].patches if isinstance(bar, Rectangle))
    assert widths == [58.3, 60.0, 62.5]  # padded 7/12, true 6/10, drop_last 5/8


def test_ring_times_fits_latency_and_bandwidth() -> None:
    """Times made from the model itself give back its latency and bandwidth."""
    alpha, bandwidth = 50e-6, 2e9
    seconds = {n: {s: (2 * (n - 1) * alpha + 2 * (n - 1) / n * 4 * s / bandwidth, 0.001) for s in (1_000, 100_000, 1_000_000)}
               for n in (2, 3, 4)}
    title = talk.plot_ring_times(seconds)._suptitle
    assert title is not None and "α = 50 µs" in title.get_text() and "B = 2.00 GB/s" in title.get_text(), title


def test_restart_timeline_shows_each_life_its_checkpoints_and_the_kill() -> None:
    """From the recorded runs of the checkpoint exercise's solution: the killed run has two lives
    of 2 ranks, one red cross (rank 1, first life), and the restarted life loaded the checkpoint."""
    from record_runs import OUT

    from autograde.engine.workspace import Workspace
    from autograde.parts.launching import notebook as launching

    ws = Workspace.replay(OUT / "checkpoint_solution.json.gz")
    try:
        runs = ws.made()
        killed = launching.timeline(runs["restart/killed"])
        fig = launching.restart_timeline({"undisturbed": launching.timeline(runs["checkpoint/whole"]),
                                          "rank 1 killed": killed})
    finally:
        ws.close()
    assert sorted((p["life"], p["rank"]) for p in killed) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [(p["life"], p["rank"]) for p in killed if p["killed"] is not None] == [(0, 1)]
    assert all(p["loads"] for p in killed if p["life"] == 1)
    assert [p for p in killed if p["life"] == 0 and p["rank"] == 0][0]["saves"], "epoch 1's checkpoint is not drawn"
    crosses = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_marker() == "X"]
    assert len(crosses) == 1
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["undisturbed", "rank 1 killed"]


def test_ring_times_and_the_scaling_fit_fit_each_backend_apart() -> None:
    """On a GPU node 2 processes run on NCCL and 3-4 on gloo: one fit across both would model two
    machines as one. Times made from two models give back each backend's own numbers."""
    models = {"nccl": (10e-6, 20e9), "gloo": (80e-6, 1e9)}
    backends = {2: "nccl", 3: "gloo", 4: "gloo"}
    seconds = {n: {s: (2 * (n - 1) * models[backends[n]][0] + 2 * (n - 1) / n * 4 * s / models[backends[n]][1], 0.001)
                   for s in (1_000, 100_000, 1_000_000)} for n in backends}
    title = talk.plot_ring_times(seconds, {2: "nccl", 3: "gloo", 4: "gloo"})._suptitle
    assert title is not None
    assert "nccl: latency α = 10 µs per message, bandwidth B = 20.00 GB/s" in title.get_text(), title
    assert "gloo: latency α = 80 µs per message, bandwidth B = 1.00 GB/s" in title.get_text(), title
    walls = {1: 9.0, 2: 6.0, 3: 7.0, 4: 6.25}  # NCCL for 1-2 (3 + 6/N), gloo for 3-4 (4 + 9/N)
    labels = [line.get_label() for line in talk.fitted_scaling(walls, backends={1: "nccl", 2: "nccl", 3: "gloo",
                                                                                 4: "gloo"}).axes[0].get_lines()]
    assert "fit (nccl): 3.00 + 6.00 / N" in labels and "fit (gloo): 4.00 + 9.00 / N" in labels, labels
