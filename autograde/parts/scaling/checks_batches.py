"""The checks of notebook 19 (large batches): the learner's plan trained for real.

One torchrun run of the learner's script with 2 processes and `--large-batch --seed 0` on a
stand-in of 1,024 training and 256 validation images, for a budget of 4 epochs, traced: every
optimizer step's rate (the optimizer's own, as it stepped) and images, and every validation image
the model got right or wrong. `large_batch` judges the outcome: a batch of at least 32 per process,
no more training than the budget, and a validation accuracy of 0.8 after one of the epochs.
`lr_scaling` judges that every step of every rank used the rate the learner's own
`large_batch_lr(step, steps_per_epoch, world_size)` gives (called in a process of its own).

Measured (seed 0, validation accuracy after epochs 1-4, global batch 64): the solution (0.02 rising
to 0.08 over one epoch) 0.20, 0.28, 0.68, 0.88; the reference's rate unscaled 0.13, 0.20, 0.37,
0.68; a warm-up that never ends (still rising at the last step) 0.14, 0.21, 0.43, 0.72. With other
seeds the solution's plan ended at 0.87 and 0.84, the unscaled rate at 0.47 and 0.79. On this
stand-in a batch 4 times the reference's also trains at the scaled rate with no warm-up (0.91):
the target separates a scaled rate from an unscaled one, not a warm-up from none. About 13 s on an
idle 2-core machine (one torchrun of 2 processes, one process for the calls).
"""
from __future__ import annotations

import math
from typing import Any

from autograde import data
from autograde.engine.run import Run
from autograde.engine.verdicts import function_calls, require, returned_number, run_ok
from autograde.engine.workspace import RunKind, Workspace
from autograde.protocol import CallsTask, ProcessTrace
from autograde.settings import TRACE_STEPS

# The kinds of run these checks read (an item's `runs`, items.py)
LARGE_BATCH_RUNS = RunKind("large_batch")
SCHEDULE_CALLS = RunKind("large_batch_lr")

PROCESSES, BUDGET, TARGET, MIN_BATCH = 2, 4, 0.8, 32
TRAIN_IMAGES, VAL_IMAGES, DATA_SEED = 1024, 256, 7
ARGV = ["--large-batch", "--widen-factor", "1", "--epochs", str(BUDGET), "--target-accuracy", "0",
        "--patience", "1000", "--seed", "0"]
TOLERANCE = 1e-6  # a scheduler's rate differs from the same rate written out by rounding alone


def _run(ws: Workspace) -> Run:
    folder = ws.root / "large-batch-data"
    if not ws.replaying and not data.has_data(folder):
        data.write_synthetic(folder, TRAIN_IMAGES, VAL_IMAGES, seed=DATA_SEED)
    return ws.torchrun(LARGE_BATCH_RUNS, str(PROCESSES), f"torchrun run with {' '.join(ARGV[:1])}", [
        (["--standalone", "--nproc-per-node", str(PROCESSES)], [*ARGV, "--data-dir", str(folder)])],
        env={TRACE_STEPS: "1"})


def _traces(ws: Workspace) -> dict[int, ProcessTrace]:
    run = _run(ws)
    run_ok(run, f"the script must run to the end under torchrun with {' '.join(ARGV)}")
    ranks = run.ranks()
    require(len(ranks) == PROCESSES, f"{len(ranks)} of {PROCESSES} processes joined the process group",
            f"the script must run under torchrun with {PROCESSES} processes")
    for rank, trace in ranks.items():
        require(trace.named("step"), f"rank {rank} took no optimizer step", "train with the optimizer")
    return ranks


def _rates(trace: ProcessTrace) -> list[list[float]]:
    """Each optimizer step's rates, one per parameter group."""
    return [[float(r) for r in e["lrs"]] for e in trace.named("step")]


def _accuracies(ranks: dict[int, ProcessTrace]) -> list[float]:
    """The validation accuracy after each epoch: every rank's evaluated images, counted together."""
    passes: list[list[list[float]]] = []
    for trace in ranks.values():
        validating = {e["loader"] for e in trace.named("loader_iter") if e["validation"]}
        ends = [e for e in trace.named("loader_end") if e["loader"] in validating]
        for i, end in enumerate(ends):
            if i == len(passes):
                passes.append([])
            passes[i] += end.get("per_image") or []
    return [sum(v[1] for v in images) / len(images) for images in passes if images]


def _schedule(ws: Workspace, steps: int, per_epoch: int) -> list[Any]:
    """What large_batch_lr(step, per_epoch, PROCESSES) returns for every step (an error: a str)."""
    task = CallsTask(script=str(ws.script), calls=[["large_batch_lr", [s, per_epoch, PROCESSES]] for s in range(steps)])
    run = ws.called(SCHEDULE_CALLS, str(steps), "calls of large_batch_lr", task)
    return [c.value if c.error is None else f"raised {c.error}" for c in function_calls(run)]


def _mismatch(ws: Workspace, used: list[float]) -> str | None:
    """The first step whose rate is not the one large_batch_lr gives, said in a sentence, or None."""
    per_epoch = len(used) // BUDGET
    if len(used) % BUDGET:
        return f"{len(used)} optimizer steps in {BUDGET} epochs: not the same number in each epoch"
    said = _schedule(ws, len(used), per_epoch)
    for step, (rate, value) in enumerate(zip(used, said)):
        number = returned_number(value)
        if number is None:
            return f"large_batch_lr({step}, {per_epoch}, {PROCESSES}) {value if isinstance(value, str) else f'returned {value!r}'}"
        if not math.isclose(rate, number, rel_tol=TOLERANCE, abs_tol=1e-12):
            wrong = sum(not math.isclose(r, n, rel_tol=TOLERANCE, abs_tol=1e-12)
                        for r, n in zip(used, (returned_number(v) for v in said)) if n is not None)
            return (f"optimizer step {step} used the rate {rate:.6g}, while large_batch_lr({step}, {per_epoch}, "
                    f"{PROCESSES}) says {number:.6g} ({wrong} of the {len(used)} steps differ)")
    return None


def _shape(used: list[float]) -> str:
    top = max(used)
    first_top = next(s for s, r in enumerate(used) if math.isclose(r, top, rel_tol=TOLERANCE))
    return (f"rates from {used[0]:.4g} (step 0) up to {top:.4g} (first at step {first_top} of {len(used)}"
            + (", still rising at the last step)" if first_top == len(used) - 1 and len(used) > 1 else ")"))


def check_large_batch(ws: Workspace) -> str:
    """Under torchrun with 2 processes, `--large-batch --seed 0`, 4 epochs on the stand-in: a
    batch of at least 32 images per process and step, every rate above 0, no more than the
    budget's images trained, and a validation accuracy (every rank's images, read from what the
    model answered) of at least 0.8 after one of the epochs. Which rates reach it is the
    learner's choice; a verdict names theirs."""
    ranks = _traces(ws)
    steps = ranks[0].named("step")
    batch = max(e["images"] for e in steps)
    require(batch >= MIN_BATCH, f"your run trained with {batch} images per process and step (a global batch of "
            f"{batch * PROCESSES}); the task is a batch of at least {MIN_BATCH} per process",
            "choose LARGE_BATCH (and train with it under --large-batch)")
    used = [g[0] for g in _rates(ranks[0])]
    require(all(r > 0 for g in _rates(ranks[0]) for r in g), f"a step used the rate {min(used):.4g}",
            "every step's rate must be above 0")
    trained = sum(e["images"] for t in ranks.values() for e in t.named("step"))
    require(trained <= BUDGET * TRAIN_IMAGES, f"your run trained on {trained} images: more than {BUDGET} epochs of "
            f"{TRAIN_IMAGES}", f"train for the --epochs {BUDGET} the check asks for")
    accuracies = _accuracies(ranks)
    require(accuracies, "no validation image was evaluated (or the check could not see the model's answers)",
            "evaluate the model on the validation set after each epoch")
    shown = ", ".join(f"{a:.3f}" for a in accuracies)
    mismatch = _mismatch(ws, used)
    require(max(accuracies) >= TARGET,
            f"with a global batch of {batch * PROCESSES} and {_shape(used)}, the validation accuracy after each "
            f"epoch was {shown}: below {TARGET} within {BUDGET} epochs"
            + (f". Note: {mismatch}" if mismatch else ""),
            "choose the rate, and how it starts, for a batch this size: notebook 19's experiment shows "
            "what a rate too small, or too large from the first step, does")
    return (f"a global batch of {batch * PROCESSES}, {_shape(used)}: validation accuracy {shown} "
            f"(the target {TARGET} within {BUDGET} epochs)")


def check_lr_scaling(ws: Workspace) -> str:
    """The same run: every optimizer step of both ranks, in every parameter group, used the rate
    that large_batch_lr(step, steps_per_epoch, 2) returns for it (to 1e-6), steps_per_epoch being
    the steps of one of the run's epochs; both ranks used the same rates."""
    ranks = _traces(ws)
    rates = {rank: _rates(trace) for rank, trace in sorted(ranks.items())}
    for rank, groups in rates.items():
        require(all(len(set(g)) == 1 for g in groups), f"rank {rank}'s parameter groups had different rates",
                "set the rate of every parameter group")
    used = {rank: [g[0] for g in groups] for rank, groups in rates.items()}
    require(len({tuple(u) for u in used.values()}) == 1, f"the ranks used different rates: rank 0 "
            f"{used[0][:4]}..., rank 1 {used[1][:4]}...", "every rank must use the same schedule")
    mismatch = _mismatch(ws, used[0])
    require(mismatch is None, f"with --large-batch and {PROCESSES} processes, {mismatch}",
            "with --large-batch, set each optimizer step's rate from large_batch_lr before the step, with the "
            "length of this run's epochs and its world size")
    return (f"every one of the {len(used[0])} optimizer steps of both ranks used the rate large_batch_lr gives "
            f"({_shape(used[0])})")
