"""What notebook 22 (model parallelism, part "inside DDP") calls: the exercises' own programs
(exercises/tensor_parallel.py, exercises/pipeline_parallel.py) and the notebook's figures: a layer
cut two ways, Megatron's f and g around the MLP block, a schedule drawn as a Gantt chart (measured,
or the ideal one with passes of fixed length), the bubble against M beside the learner's
prediction, and the activations held per stage. What a pipeline's passes say is
notebook_pipeline.py's, named here too, so that the notebook has one module to call.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

from autograde.jupyter import runtime
from autograde.jupyter.figures import RANK_COLOURS, finish
from autograde.parts.inside.notebook_pipeline import PIPELINE as PIPELINE
from autograde.parts.inside.notebook_pipeline import PIPELINE_SOLUTION as PIPELINE_SOLUTION
from autograde.parts.inside.notebook_pipeline import TENSOR_PARALLEL as TENSOR_PARALLEL
from autograde.parts.inside.notebook_pipeline import PipelineError as PipelineError
from autograde.parts.inside.notebook_pipeline import Span as Span
from autograde.parts.inside.notebook_pipeline import Step as Step
from autograde.parts.inside.notebook_pipeline import ideal_bubble as ideal_bubble
from autograde.parts.inside.notebook_pipeline import ideal_step as ideal_step
from autograde.parts.inside.notebook_pipeline import idle_fraction as idle_fraction
from autograde.parts.inside.notebook_pipeline import interleaved_bubbles as interleaved_bubbles
from autograde.parts.inside.notebook_pipeline import measure as measure
from autograde.parts.inside.notebook_pipeline import order as order
from autograde.parts.inside.notebook_pipeline import overlap as overlap
from autograde.parts.inside.notebook_pipeline import prediction as prediction
from autograde.parts.inside.notebook_pipeline import spans as spans
from autograde.parts.inside.notebook_pipeline import table as table
from autograde.parts.inside.notebook_pipeline import traced_steps as traced_steps

# The exercises' own programs -----------------------------------------------------------------

def tensor_parallel(world_size: int = 2, tensor_parallel: int = 0, script: str = TENSOR_PARALLEL) -> str:
    """Runs the tensor-parallel exercise's own program: each layer against the unsplit one on
    `world_size` processes, and with `tensor_parallel` > 0 the 2-D training too. Its output."""
    extra = ["--tensor-parallel", str(tensor_parallel)] if tensor_parallel else []
    return runtime.run([sys.executable, runtime.course_file(script), "--world-size", str(world_size), *extra],
                       timeout=300)


def pipeline(schedule: str = "gpipe", stages: int = 2, micro_batches: int = 4, script: str = PIPELINE) -> str:
    """Runs the pipeline exercise's own program: `schedule` ("gpipe" or "1f1b") on `stages`
    processes, each stage's gradients against the unsplit model's. Its output."""
    return runtime.run([sys.executable, runtime.course_file(script), "--stages", str(stages), "--micro-batches",
                        str(micro_batches), "--schedule", schedule], timeout=300)


# Figures ---------------------------------------------------------------------------------------

def tensor_split(world_size: int = 2) -> Figure:
    """A linear layer's weight (out x in) cut two ways among `world_size` ranks: by rows (output
    features) for the column split, each rank making its slice of the output from the whole input;
    by columns (input features) for the row split, each rank making a partial sum of the whole
    output from its slice of the input, which an all-reduce adds up."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax, (title, by_rows, after) in zip(axes, [
            ("column split: W cut by output features", True, "each rank: its slice of y, from all of x"),
            ("row split: W cut by input features", False, "each rank: a partial sum of all of y; all-reduce")]):
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
        ax.set_xlabel("input features (columns of W)")
        ax.set_ylabel("output features (rows of W)")
        ax.set_title(f"{title}\n{after}", fontsize=9)
    fig.tight_layout()
    return finish(fig)


def f_and_g(world_size: int = 2) -> Figure:
    """The tensor-parallel MLP block on `world_size` ranks: the whole x enters through f, each rank
    runs its column share of fc1, GeLU and its row share of fc2, and g adds the partial results
    into the whole y; under f and g, what each does forward and backward."""
    fig, ax = plt.subplots(figsize=(9, 1.3 + 0.9 * world_size))
    middle = (world_size - 1) / 2

    def box(x: float, y: float, text: str, colour: Any, width: float = 1.3) -> None:
        ax.add_patch(FancyBboxPatch((x - width / 2, y - 0.3), width, 0.6, boxstyle="round,pad=0.05",
                                    facecolor=colour, edgecolor="black", alpha=0.6))
        ax.text(x, y, text, ha="center", va="center", fontsize=8)

    def arrow(x0: float, y0: float, x1: float, y1: float) -> None:
        ax.annotate("", (x1, y1), (x0, y0), arrowprops={"arrowstyle": "->", "lw": 0.8})

    box(0, middle, "x (whole,\nevery rank)", "white", 1.1)
    box(1.6, middle, "f", "gold", 0.6)
    box(8.4, middle, "g", "gold", 0.6)
    box(10, middle, "y (whole,\nevery rank)", "white", 1.1)
    arrow(0.55, middle, 1.3, middle)
    arrow(8.7, middle, 9.45, middle)
    for r in range(world_size):
        colour = RANK_COLOURS[r % 10]
        box(3.3, r, f"x A{r}\n(fc1, column)", colour)
        box(5.0, r, "GeLU", colour, 0.9)
        box(6.7, r, f"h{r} B{r}\n(fc2, row)", colour)
        arrow(1.9, middle, 2.65, r)
        arrow(3.95, r, 4.55, r)
        arrow(5.45, r, 6.05, r)
        arrow(7.35, r, 8.1, middle)
    low = world_size - 0.55  # just under the last rank's row
    ax.text(1.6, low, "f\nforward: identity\nbackward: all-reduce", ha="center", va="top", fontsize=8)
    ax.text(8.4, low, "g\nforward: all-reduce\nbackward: identity", ha="center", va="top", fontsize=8)
    ax.text(5.0, -0.75, "no communication between fc1 and fc2: rank r's hidden slice h_r is what its share of fc2 needs",
            ha="center", fontsize=8)
    ax.set_xlim(-0.8, 10.8)
    ax.set_ylim(world_size + 0.3, -1.0)
    ax.axis("off")
    ax.set_title(f"the MLP block on {world_size} ranks: one all-reduce forward (g), one backward (f)", fontsize=9)
    fig.tight_layout()
    return finish(fig)


def gantt(steps: list[Step], unit: str = "ms") -> Figure:
    """One Gantt chart per step, stacked: a row per stage, a box per pass (forward light, backward
    dark, coloured by micro-batch and labelled F3, B3); the white gaps are the stage's idle time,
    given on the right. `unit`: "ms" for measured steps (seconds scaled), "" for ideal ones."""
    scale = 1000.0 if unit == "ms" else 1.0
    height = sum(0.55 * s.stages + 0.9 for s in steps)
    fig, axes = plt.subplots(len(steps), 1, figsize=(9, height), squeeze=False)
    for ax, step in zip(axes[:, 0], steps):
        idle = step.idle
        for stage, found in step.timeline.items():
            for s in found:
                ax.barh(stage, (s.end - s.start) * scale, left=s.start * scale, color=RANK_COLOURS[s.micro % 10],
                        alpha=0.4 if s.kind == "F" else 0.9, edgecolor="black", linewidth=0.5)
                if step.micro_batches <= 16:
                    ax.text((s.start + s.end) / 2 * scale, stage, f"{s.kind}{s.micro}", ha="center", va="center",
                            fontsize=6 if step.micro_batches > 8 else 7)
        ax.set_yticks(range(step.stages), [f"stage {r}\n{idle[r]:.0%} idle" for r in range(step.stages)], fontsize=8)
        ax.set_ylim(step.stages - 0.5, -0.5)
        ax.set_xlabel("milliseconds into the step" if unit == "ms" else "time (a forward pass = 1)", fontsize=8)
        ax.set_title(f"{step.schedule}, S = {step.stages}, M = {step.micro_batches}: {step.mean_idle:.0%} idle",
                     fontsize=9)
    fig.tight_layout()
    return finish(fig)


def bubbles(found: dict[str, list[Step]], predict: Callable[..., float] | None = None) -> Figure:
    """The idle share of a step (the stages' mean) against the number of micro-batches, measured
    for each schedule, beside `predict`(S, M) (the learner's bubble_fraction) when it is given."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ms: list[int] = []
    for k, (schedule, steps) in enumerate(found.items()):
        ms = [s.micro_batches for s in steps]
        ax.plot(ms, [s.mean_idle * 100 for s in steps], marker="o", color=RANK_COLOURS[k], label=f"{schedule}, measured")
    stages = max(s.stages for steps in found.values() for s in steps)
    if predict is not None:
        ax.plot(ms, [predict(stages, m) * 100 for m in ms], linestyle="--", color="grey", label="your bubble_fraction")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlabel("micro-batches (M)")
    ax.set_ylabel("% of the step idle")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"the bubble on {stages} stages, measured", fontsize=9)
    fig.tight_layout()
    return finish(fig)


def activations(found: dict[str, list[Step]]) -> Figure:
    """The most micro-batches' activations each stage held at once (forward passes done whose
    backward pass had not ended), by number of micro-batches, one panel per schedule."""
    fig, axes = plt.subplots(1, len(found), figsize=(4 * len(found), 3), sharey=True, squeeze=False)
    for ax, (schedule, steps) in zip(axes[0], found.items()):
        stages = max(s.stages for s in steps)
        width = 0.8 / stages
        for r in range(stages):
            xs = [k + (r - (stages - 1) / 2) * width for k in range(len(steps))]
            held = [s.held.get(r, 0) for s in steps]
            ax.bar(xs, held, width, color=RANK_COLOURS[r % 10], label=f"stage {r}")
            for x, h in zip(xs, held):
                ax.text(x, h, str(h), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(steps)), [str(s.micro_batches) for s in steps])
        ax.set_xlabel("micro-batches (M)")
        ax.set_title(f"{schedule}: activations held at once", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("micro-batches")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return finish(fig)
