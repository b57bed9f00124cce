"""What notebook 22 (part "inside DDP") reads from a pipeline's passes: a pipeline run traced by the
checker so that each forward and backward pass of each micro-batch has its times, and what is read
from those times: each stage's idle share of the step (the bubble) beside the learner's own
prediction (their bubble_fraction), and the micro-batches' activations a stage held at once; the
ideal schedules (passes of fixed length, free messages); and an interleaved schedule's bubble
counted from the order of the learner's passes against plain 1F1B's.

A traced run is the checker's own (`Workspace.called` with a StagesTask): the learner's schedule
function is called on 2 stages with the stage wrapped so that every pass emits "pass_start" and
"pass_end" events with wall-clock times (time.time(), one clock for all the processes of this
machine). When the learner's file does not run right yet, the solution's is measured instead, and
the notebook says so. notebook_model_parallel.py draws them.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from autograde.engine.run import Run
from autograde.engine.workspace import Workspace
from autograde.jupyter import runtime
from autograde.parts.inside.checks_pipeline import (
    CHUNKS,
    SCHEDULE,
    STAGES_RUNS,
    held_at_most,
    idle_slots,
    one_f_one_b_order,
    pass_order,
    passes,
)
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



# A pipeline step's passes, and what they say -------------------------------------------------

@dataclass(frozen=True)
class Span:
    """One pass of one micro-batch on one stage: kind "F" (forward) or "B" (backward), and its
    start and end in seconds from the step's start."""

    kind: str
    micro: int
    start: float
    end: float
    chunk: int = 0  # which of the rank's chunks (an interleaved schedule's)


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
    started: dict[tuple[str, int, int], float] = {}
    found = []
    for e in events:
        key = (e["kind"], e["micro"], e.get("chunk", 0))
        if e["ev"] == "pass_start":
            started[key] = e["t"]
        elif key in started:
            found.append(Span(e["kind"], e["micro"], started.pop(key) - zero, e["t"] - zero, key[2]))
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


def _steps(run: Run, schedule: str, keep_first: bool = False) -> list[Step]:
    """The steps of a traced stages run, the warm-up's (the first case) left out unless `keep_first`;
    PipelineError if the run failed."""
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
        if case == 0 and not keep_first:
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
            script: str = PIPELINE, repeats: int = REPEATS, show: bool = True,
            predict: Callable[..., float] | None = None) -> dict[str, list[Step]]:
    """Each schedule traced for every number of micro-batches (traced_steps); with `show`, the
    table of each stage's idle share beside `predict`'s (the learner's bubble_fraction) and the
    activations each stage held."""
    found = {schedule: traced_steps(schedule, micro_batches, script, repeats=repeats) for schedule in schedules}
    if show:
        print(table(found, predict))
    return found


def table(found: dict[str, list[Step]], predict: Callable[..., float] | None = None) -> str:
    """The measured steps as a table: schedule, M, each stage's idle share and their mean,
    `predict`(S, M) ("-" without one), and the most micro-batches' activations each stage held at once."""
    stages = max(s.stages for steps in found.values() for s in steps)
    head = (f"{'schedule':9} {'M':>3}  " + " ".join(f"{f'idle {r}':>7}" for r in range(stages))
            + f" {'mean':>6} {'predicted':>10}   held per stage")
    lines = [head]
    for schedule, steps in found.items():
        for s in steps:
            idle = s.idle
            lines.append(f"{schedule:9} {s.micro_batches:3d}  " + " ".join(f"{idle[r]:7.1%}" for r in sorted(idle))
                         + f" {s.mean_idle:6.1%} "
                         + (f"{predict(s.stages, s.micro_batches):10.1%}" if predict else f"{'-':>10}") + "   "
                         + " ".join(str(s.held[r]) for r in sorted(s.held)))
    return "\n".join(lines)



# The learner's prediction, and an interleaved order's bubble ---------------------------------

def prediction(script: str = PIPELINE) -> Callable[..., float] | None:
    """`script`'s bubble_fraction, once it gives a number between 0 and 1 for 2 stages and 4
    micro-batches; None before, with a line saying what it gave."""
    try:
        spec = importlib.util.spec_from_file_location("pipeline_prediction", runtime.course_file(script))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        function: Callable[..., float] = module.bubble_fraction
        value: Any = function(2, 4)
    except Exception as err:  # the learner's file: any error, said in a line
        print(f"{script}'s bubble_fraction cannot be called yet ({type(err).__name__}: {err}): no prediction")
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        print(f"{script}'s bubble_fraction(2, 4) gave {value!r}, not a share between 0 and 1: no prediction yet")
        return None
    return function


def interleaved_bubbles(stages: int = 2, micro_batches: tuple[int, ...] = (2, 4, 8), script: str = PIPELINE,
                        fallback: str | None = PIPELINE_SOLUTION,
                        predict: Callable[..., float] | None = None) -> dict[int, tuple[float, float]]:
    """`script`'s interleaved_1f1b run by the checker on `stages` ranks of 2 chunks, its passes'
    order traced; by number of micro-batches, (the idle share counted from that order, plain 1F1B's),
    every pass of a chunk taking 1/2 of a stage's, messages free (checks_pipeline.idle_slots), printed
    beside `predict`(S, M, 2) when given. The solution's when the script's does not run right."""
    if any(m % stages for m in micro_batches):
        raise ValueError(f"interleaved: every number of micro-batches must divide by the {stages} stages")
    task = StagesTask(world_sizes=[stages], schedule=SCHEDULE["interleaved"], chunks=CHUNKS,
                      micro_batches=list(micro_batches))
    ws = Workspace(Path(runtime.course_file(script)))
    try:
        run = ws.called(STAGES_RUNS, "interleaved-order", "interleaved_1f1b traced", task)
        _steps(run, "interleaved", keep_first=True)  # PipelineError unless every chunk's gradients are right
        traced = {rank: passes(t) for (_, rank), t in run.by_group().items()}
        found = {}
        for case, m in enumerate(micro_batches):
            mine = idle_slots({rank: pass_order(cases.get(case, [])) for rank, cases in traced.items()}, CHUNKS)
            plain = idle_slots({s: [(k, 0, i) for k, i in one_f_one_b_order(stages, s, m)] for s in range(stages)})
            found[m] = (mine, plain)
    except (PipelineError, ValueError) as err:
        if fallback is None or not runtime.handed_out(fallback):
            raise
        print(f"{script}'s interleaved_1f1b did not run right ({err}): counting {fallback}'s instead")
        return interleaved_bubbles(stages, micro_batches, fallback, None, predict)
    finally:
        ws.close()
    print(f"{'M':>3} {'interleaved':>12} {'plain 1F1B':>11} {'predicted':>10}")
    for m, (mine, plain) in found.items():
        guess = f"{predict(stages, m, CHUNKS):10.1%}" if predict else f"{'-':>10}"
        print(f"{m:3d} {mine:12.1%} {plain:11.1%} {guess}")
    return found
