"""What notebook 22 (model parallelism, part "inside DDP") calls: the exercises' own programs
(exercises/tensor_parallel.py, exercises/pipeline_parallel.py), a pipeline run traced by the
checker so that each forward and backward pass of each micro-batch has its times, and what is read
from those times: each stage's idle share of the step (the bubble) beside (S-1)/(M+S-1), and the
micro-batches' activations a stage held at once. And the notebook's figures: a layer cut two ways,
Megatron's f and g around the MLP block, a schedule drawn as a Gantt chart (measured, or the ideal
one with passes of fixed length), the bubble against M, and the activations held per stage.

A traced run is the checker's own (`Workspace.called` with a StagesTask): the learner's schedule
function is called on 2 stages with the stage wrapped so that every pass emits "pass_start" and
"pass_end" events with wall-clock times (time.time(), one clock for all the processes of this
machine). When the learner's file does not run right yet, the solution's is measured instead, and
the notebook says so.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

from autograde.engine.run import Run
from autograde.engine.workspace import Workspace
from autograde.jupyter import runtime
from autograde.jupyter.figures import RANK_COLOURS, finish
from autograde.parts.inside.checks_pipeline import SCHEDULE, STAGES_RUNS, held_at_most, one_f_one_b_order, passes
from autograde.parts.inside.reports import StagesReport, StagesTask
from autograde.protocol import ProcessTrace, decode

TENSOR_PARALLEL = "exercises/tensor_parallel.py"
PIPELINE = "exercises/pipeline_parallel.py"
PIPELINE_SOLUTION = "solutions/pipeline_parallel.py"
# The measured pipeline: 2 stages of 2 linear layers 512 wide, a batch of 4096 rows. A micro-batch of
# 256 rows (M = 16) still computes for several milliseconds a pass on one core: with smaller ones
# (1024 rows), the gaps while gloo hands a message over and the processes are woken took most of
# the step, and the measured bubble grew with M instead of shrinking.
BUBBLE_STAGES, BUBBLE_WIDTH, BUBBLE_BATCH = 2, 1024, 2048
BUBBLE_MICRO_BATCHES = (1, 2, 4, 8, 16)
REPEATS = 3  # each M measured this many times, the least idle kept: other programs take the cores at times
WARM_UP = 8  # the run's first step, with this many micro-batches, is not measured: it warms up allocations
TOLERANCE = 1e-6  # the checks' tolerance on a stage's gradients


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


# A pipeline step's passes, and what they say -------------------------------------------------

@dataclass(frozen=True)
class Span:
    """One pass of one micro-batch on one stage: kind "F" (forward) or "B" (backward), and its
    start and end in seconds from the step's start."""

    kind: str
    micro: int
    start: float
    end: float


Timeline = dict[int, list[Span]]  # each stage's passes, in the order they started


@dataclass
class Step:
    """One traced pipeline step: its schedule, its shape and each stage's passes."""

    schedule: str
    stages: int
    micro_batches: int
    timeline: Timeline
    held: dict[int, int] = field(default_factory=dict)  # each stage's most activations held at once

    @property
    def idle(self) -> dict[int, float]:
        """Each stage's idle share of the step."""
        return idle_fraction(self.timeline)

    @property
    def mean_idle(self) -> float:
        return sum(self.idle.values()) / len(self.idle)


def spans(events: list[dict[str, Any]], origin: float | None = None) -> list[Span]:
    """The passes in one case's "pass_start"/"pass_end" events (their `t`: seconds since the
    epoch), with times from `origin` (by default the first event's). A pass that never ended is left out."""
    if not events:
        return []
    zero = events[0]["t"] if origin is None else origin
    started: dict[tuple[str, int], float] = {}
    found = []
    for e in events:
        key = (e["kind"], e["micro"])
        if e["ev"] == "pass_start":
            started[key] = e["t"]
        elif key in started:
            found.append(Span(e["kind"], e["micro"], started.pop(key) - zero, e["t"] - zero))
    return sorted(found, key=lambda s: s.start)


def idle_fraction(timeline: Timeline) -> dict[int, float]:
    """Each stage's idle share of the step: 1 - (its passes' time) / (the step's length), the step
    running from the first pass's start on any stage to the last pass's end on any stage."""
    every = [s for stage in timeline.values() for s in stage]
    if not every:
        raise ValueError("no passes: the pipeline ran no micro-batch")
    length = max(s.end for s in every) - min(s.start for s in every)
    if length <= 0:
        raise ValueError("the step has no length")
    return {stage: 1 - sum(s.end - s.start for s in found) / length for stage, found in sorted(timeline.items())}


def overlap(step: Step) -> dict[str, tuple[float, float]]:
    """Mean seconds of a pass by kind ("F", "B"): (those that ran while no other stage computed,
    those that ran beside another stage's pass for most of their length). Every pass of a step
    has the same micro-batch size, so on cores of its own each would take the same time either
    way; a kind with no pass of one sort is left out."""
    found: dict[str, tuple[float, float]] = {}
    for kind in ("F", "B"):
        alone, beside = [], []
        for stage, mine in step.timeline.items():
            others = [s for r, found_ in step.timeline.items() if r != stage for s in found_]
            for s in mine:
                if s.kind != kind or s.end <= s.start:
                    continue
                shared = sum(max(0.0, min(s.end, o.end) - max(s.start, o.start)) for o in others)
                if shared == 0:
                    alone.append(s.end - s.start)
                elif shared > (s.end - s.start) / 2:
                    beside.append(s.end - s.start)
        if alone and beside:
            found[kind] = (sum(alone) / len(alone), sum(beside) / len(beside))
    return found


def ideal_bubble(stages: int, micro_batches: int) -> float:
    """A stage's idle share with S equal stages and free communication, GPipe's and 1F1B's alike:
    (S - 1) / (M + S - 1)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError("stages and micro-batches must be at least 1")
    return (stages - 1) / (micro_batches + stages - 1)


def order(schedule: str, stages: int, stage: int, micro_batches: int) -> list[tuple[str, int]]:
    """The passes `stage` runs, in order: GPipe's (every forward, then every backward) or 1F1B's."""
    if schedule == "gpipe":
        return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
    if schedule == "1f1b":
        return one_f_one_b_order(stages, stage, micro_batches)
    raise ValueError(f"unknown schedule {schedule!r}: gpipe or 1f1b")


def ideal_step(schedule: str, stages: int, micro_batches: int, forward: float = 1.0,
               backward: float = 2.0) -> Step:
    """The step as it would run with every forward pass taking `forward` and every backward pass
    `backward` (units of time), and messages free: each stage runs its passes in the schedule's
    order, a pass as soon as its stage is free and its input has arrived (a forward pass's from
    the stage before, a backward pass's gradient from the stage after)."""
    todo = {r: order(schedule, stages, r, micro_batches) for r in range(stages)}
    ended: dict[tuple[int, str, int], float] = {}
    free = {r: 0.0 for r in range(stages)}
    timeline: Timeline = {r: [] for r in range(stages)}
    while any(todo.values()):
        moved = False
        for r in range(stages):
            if not todo[r]:
                continue
            kind, i = todo[r][0]
            needs = (r - 1, "F", i) if kind == "F" else (r + 1, "B", i)
            if (kind == "F" and r == 0) or (kind == "B" and r == stages - 1):
                ready = ended.get((r, "F", i), 0.0) if kind == "B" else 0.0
            elif needs in ended:
                ready = ended[needs]
            else:
                continue
            start = max(free[r], ready)
            end = start + (forward if kind == "F" else backward)
            timeline[r].append(Span(kind, i, start, end))
            ended[(r, kind, i)] = free[r] = end
            todo[r].pop(0)
            moved = True
        if not moved:
            raise RuntimeError(f"the {schedule} order deadlocks")  # not for GPipe's nor 1F1B's orders
    step = Step(schedule, stages, micro_batches, timeline)
    step.held = {r: _held(found) for r, found in timeline.items()}
    return step


def _held(found: list[Span]) -> int:
    """The most micro-batches whose forward pass had ended and backward pass had not, from spans."""
    events = sorted([(s.end, 0 if s.kind == "B" else 1, s.kind) for s in found])  # a backward's end frees first
    held = most = 0
    for _, _, kind in events:
        held += 1 if kind == "F" else -1
        most = max(most, held)
    return most


# A traced run ---------------------------------------------------------------------------------

class PipelineError(Exception):
    """A traced pipeline run that did not give the unsplit gradients, or no passes to read."""


def _steps(run: Run, schedule: str) -> list[Step]:
    """The steps of a traced stages run, the warm-up's left out; PipelineError if the run failed."""
    problem = run.problem()
    if problem:
        raise PipelineError(problem)
    reports = [decode(StagesReport, r) for r in (run.report or {}).get("ranks", [])]
    if not reports:
        raise PipelineError("the run reported nothing")
    for r in reports:
        if r.error:
            raise PipelineError(f"stage {r.rank}: {r.error}")
        for c in r.cases:
            if c.error or c.gradient > TOLERANCE:
                raise PipelineError(f"stage {r.rank} with {c.micro_batches} micro-batches: "
                                    f"{c.error or f'gradients {c.gradient:.1e} from the unsplit ones'}")
    traces: dict[int, ProcessTrace] = {rank: t for (_, rank), t in run.by_group().items()}
    stages = len(traces)
    sizes = {e["case"]: e["micro_batches"] for t in traces.values() for e in t.named("pipeline_case")}
    traced = {rank: passes(t) for rank, t in traces.items()}
    found: dict[int, Step] = {}
    for case, m in sorted(sizes.items()):
        if case == 0:
            continue  # the warm-up
        events = {rank: traced[rank].get(case, []) for rank in traces}
        if not all(events.values()):
            raise PipelineError(f"with {m} micro-batches, a stage ran no pass")
        origin = min(es[0]["t"] for es in events.values())
        step = Step(schedule, stages, m, {rank: spans(es, origin) for rank, es in sorted(events.items())})
        step.held = {rank: held_at_most(es) for rank, es in sorted(events.items())}
        if m not in found or step.mean_idle < found[m].mean_idle:
            found[m] = step  # of the repeats, the one the other programs on this machine disturbed least
    return list(found.values())


def traced_steps(schedule: str, micro_batches: tuple[int, ...] = BUBBLE_MICRO_BATCHES, script: str = PIPELINE,
                 fallback: str | None = PIPELINE_SOLUTION, width: int = BUBBLE_WIDTH,
                 batch_size: int = BUBBLE_BATCH, repeats: int = REPEATS) -> list[Step]:
    """`schedule` ("gpipe" or "1f1b") of `script` run by the checker on BUBBLE_STAGES processes,
    one step per number of micro-batches (after a warm-up step), each pass traced; each number is
    tried `repeats` times and the least idle step kept. When the script's schedule fails (an error,
    a deadlock, wrong gradients), `fallback`'s is run instead, and the cell says so."""
    if any(batch_size % m for m in micro_batches):
        raise ValueError(f"the batch of {batch_size} must divide by every number of micro-batches")
    task = StagesTask(world_sizes=[BUBBLE_STAGES], schedule=SCHEDULE[schedule],
                      micro_batches=[WARM_UP, *micro_batches * repeats], width=width, batch_size=batch_size)
    ws = Workspace(Path(runtime.course_file(script)))
    try:
        run = ws.called(STAGES_RUNS, f"{schedule}-bubble", f"{SCHEDULE[schedule]} traced", task)
        return _steps(run, schedule)
    except PipelineError as err:
        if fallback is None or not runtime.handed_out(fallback):  # an assignment has no solutions/
            raise
        print(f"{script}'s {SCHEDULE[schedule]} did not run right ({err}): measuring {fallback}'s instead")
        return traced_steps(schedule, micro_batches, fallback, None, width, batch_size, repeats)
    finally:
        ws.close()


def measure(micro_batches: tuple[int, ...] = BUBBLE_MICRO_BATCHES, schedules: tuple[str, ...] = ("gpipe", "1f1b"),
            script: str = PIPELINE, repeats: int = REPEATS, show: bool = True) -> dict[str, list[Step]]:
    """Each schedule traced for every number of micro-batches (traced_steps); with `show`, the
    table of each stage's idle share beside (S-1)/(M+S-1) and the activations each stage held."""
    found = {schedule: traced_steps(schedule, micro_batches, script, repeats=repeats) for schedule in schedules}
    if show:
        print(table(found))
    return found


def table(found: dict[str, list[Step]]) -> str:
    """The measured steps as a table: schedule, M, each stage's idle share and their mean, the
    formula, and the most micro-batches' activations each stage held at once."""
    stages = max(s.stages for steps in found.values() for s in steps)
    head = (f"{'schedule':9} {'M':>3}  " + " ".join(f"{f'idle {r}':>7}" for r in range(stages))
            + f" {'mean':>6} {'(S-1)/(M+S-1)':>14}   held per stage")
    lines = [head]
    for schedule, steps in found.items():
        for s in steps:
            idle = s.idle
            lines.append(f"{schedule:9} {s.micro_batches:3d}  " + " ".join(f"{idle[r]:7.1%}" for r in sorted(idle))
                         + f" {s.mean_idle:6.1%} {ideal_bubble(s.stages, s.micro_batches):14.1%}   "
                         + " ".join(str(s.held[r]) for r in sorted(s.held)))
    return "\n".join(lines)


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
        ax.set_title(f"{step.schedule}, S = {step.stages}, M = {step.micro_batches}: {step.mean_idle:.0%} idle "
                     f"(formula {ideal_bubble(step.stages, step.micro_batches):.0%})", fontsize=9)
    fig.tight_layout()
    return finish(fig)


def bubbles(found: dict[str, list[Step]]) -> Figure:
    """The idle share of a step (the stages' mean) against the number of micro-batches, measured
    for each schedule, beside (S-1)/(M+S-1)."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ms: list[int] = []
    for k, (schedule, steps) in enumerate(found.items()):
        ms = [s.micro_batches for s in steps]
        ax.plot(ms, [s.mean_idle * 100 for s in steps], marker="o", color=RANK_COLOURS[k], label=f"{schedule}, measured")
    stages = max(s.stages for steps in found.values() for s in steps)
    ax.plot(ms, [ideal_bubble(stages, m) * 100 for m in ms], linestyle="--", color="grey", label="(S-1)/(M+S-1)")
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
