"""The checks of notebook 23 (debugging hangs): a training project that hangs, or goes wrong, on some
ranks, found and fixed by the learner (exercises/hang_training.py, its bugs unmarked).

The script is launched as a learner would (`python exercises/hang_training.py --world-size 2`: it
starts its own processes), with every optimizer step traced, and once more with `--world-size 1`:
one process, where no rank can wait for another, is the reference that 2 processes must match (the
same global batches, the same steps, the same numbers). The three items share these two runs.
- hang_finishes: the run on 2 processes ends, every rank with the same weights, and rank 0 saved each
  checkpoint with the state of every rank (as it says it did). A run that still
  hangs is stopped when nothing has moved for a while, and the verdict says where each rank waited
  (the torch.distributed call it was in, or a training step, where DDP all-reduces inside backward())
  and the last line each rank printed: which hang remains.
- hang_validation: the validation before any training, on 2 processes, equals one process's: the
  exact loss and accuracy over the whole validation set, its uneven shards each counted once. It
  needs only the start of the run.
- hang_same_steps: every rank made as many optimizer steps as one process does with the whole
  global batches (the corrupt batches skipped by every rank alike), and the validation after each
  epoch equals one process's: the training result unchanged.
Like the other checks, these read behaviour: any correct fix passes, whatever its calls.
"""
from __future__ import annotations

import re

from autograde.engine.run import Run
from autograde.engine.verdicts import Failed, require, run_ok
from autograde.engine.workspace import RunKind, Workspace
from autograde.protocol import ProcessTrace
from autograde.settings import TRACE_STEPS

# The kinds of run these checks read (an item's `runs`, items.py)
HANG_RUNS = RunKind("hang")

HANG_WORLD_SIZE = 2
EPOCHS, GLOBAL_BATCHES = 2, 2 * (192 // 16)  # the script's defaults: 2 epochs of 192 samples in batches of 16
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|nan|inf)(?:[eE][-+]?\d+)?"
VALIDATION = re.compile(rf"validation after (\d+) epochs?: loss ({NUMBER}), accuracy ({NUMBER})")  # rank 0's
SAVED = re.compile(r"saved .* with the state of (\d+) ranks?")  # rank 0's, after each checkpoint
WEIGHTS = re.compile(r"^rank (\d+): done after (\d+) epochs?, weights ([0-9a-f]+)")  # every rank's last line
LOSS_SLACK = 2e-5  # relative: 2 processes add the same numbers in another order than one (printed with 6 decimals)
KEEP_PRINTS = "leave the script's own prints as they are"


def _runs(ws: Workspace) -> tuple[Run, Run]:
    """The script on 2 processes and on 1, each optimizer step traced."""
    def run(world_size: int, which: str) -> Run:
        argv = ["--world-size", str(world_size)]
        return ws.launched(HANG_RUNS, which, f"run with {' '.join(argv)}", argv, env={TRACE_STEPS: "1"})
    return run(HANG_WORLD_SIZE, "two"), run(1, "one")


def _printed(trace: ProcessTrace) -> list[str]:
    return [str(e.get("text", "")) for e in trace.named("print")]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _where(rank: int, trace: ProcessTrace) -> str:
    """Where a rank of a stopped run waited, for one that was in no torch.distributed call."""
    steps = len(trace.named("step"))
    after = f"after its {_ordinal(steps)} optimizer step" if steps else "before its first optimizer step"
    return (f"rank {rank} in no torch.distributed call of the script, {after}: in a training step, whose "
            "backward() is where DDP all-reduces the gradients")


def _last_lines(run: Run) -> str:
    """The last line each rank printed, to tell which part of the script a rank had reached."""
    said = []
    for rank, trace in sorted(run.ranks().items()):
        lines = [line.strip() for line in _printed(trace) if line.strip()]
        said.append(f"rank {rank}: {lines[-1][:120]!r}" if lines else f"rank {rank}: nothing")
    return "; the last line each rank printed: " + ", ".join(said) if said else ""


def require_finished(run: Run, what: str) -> None:
    """Fail, naming where each rank waited and what it printed last, when the run hung; as run_ok
    does when it crashed."""
    if run.stalled or any(r.timed_out for r in run.results):
        problem = run.problem() or f"the {run.name} did not finish"
        silent = [_where(rank, t) for rank, t in sorted(run.ranks().items()) if t.waiting_in() is None]
        raise Failed(problem + (f"; {'; '.join(silent)}" if silent else "") + _last_lines(run), what)
    run_ok(run, what)


def _weights(run: Run) -> dict[int, str]:
    """Each rank's fingerprint of its final weights, from its last line, by rank."""
    found = {}
    for rank, trace in run.ranks().items():
        for line in _printed(trace):
            if m := WEIGHTS.match(line):
                found[rank] = m[3]
    return found


def _require_same_weights(run: Run, what: str) -> None:
    weights = _weights(run)
    require(len(weights) == HANG_WORLD_SIZE, f"the {run.name} finished, but only ranks {sorted(weights)} printed "
            "their final weights", KEEP_PRINTS)
    require(len(set(weights.values())) == 1, f"the {run.name} finished, but the ranks ended with different weights ("
            + ", ".join(f"rank {r}: {w}" for r, w in sorted(weights.items())) + ")", what)


def _validation(run: Run) -> dict[int, tuple[float, float]]:
    """Rank 0's validation (loss, accuracy) by the number of epochs trained before it."""
    trace = run.ranks().get(0)
    found = {}
    for line in _printed(trace) if trace else []:
        if m := VALIDATION.search(line):
            found[int(m[1])] = (float(m[2]), float(m[3]))
    return found


def _same(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return abs(a[0] - b[0]) <= LOSS_SLACK * max(1.0, abs(b[0])) and abs(a[1] - b[1]) <= 1e-4


def _shown(v: tuple[float, float]) -> str:
    return f"loss {v[0]:.6f}, accuracy {v[1]:.4f}"


def _reference(one: Run) -> dict[int, tuple[float, float]]:
    """One process's validations: the reference (a run that cannot wait for another rank)."""
    require_finished(one, "with --world-size 1 the script must run to its end: it is the reference")
    found = _validation(one)
    require(0 in found, f"the {one.name} printed no validation before training", KEEP_PRINTS)
    return found


def check_hang_finishes(ws: Workspace) -> str:
    """exercises/hang_training.py, launched with 2 processes, ends (a hang is stopped, and each rank's
    waiting call and last printed line named), every rank with the same weights, and rank 0 saved every
    checkpoint with the state of both ranks."""
    two, _ = _runs(ws)
    require_finished(two, "every rank must make the same collectives, in the same order, however its data, its "
                     "shard or its rank differ: find where each rank waits, and why the other is elsewhere")
    _require_same_weights(two, "every optimizer step must use gradients averaged over all ranks")
    saved = [int(m[1]) for line in _printed(two.ranks()[0]) if (m := SAVED.search(line))] if 0 in two.ranks() else []
    require(saved, f"the {two.name} finished, but rank 0 said it saved no checkpoint", KEEP_PRINTS)
    require(all(n == HANG_WORLD_SIZE for n in saved), f"the {two.name} finished, but rank 0 saved checkpoints with "
            f"the state of {', '.join(map(str, saved))} ranks, not of all {HANG_WORLD_SIZE}",
            "the checkpoint must hold every rank's state, so that a resume restarts every rank where it was")
    epochs = max(_validation(two), default=0)
    return f"with {HANG_WORLD_SIZE} processes the run ended after {epochs} epochs, every rank with the same weights"


def check_hang_validation(ws: Workspace) -> str:
    """The validation before training, printed by rank 0 of the run on 2 processes, equals the run on
    1 process's: the loss and accuracy over the whole validation set (37 samples, shards of 19 and 18).
    Only the start of the run is needed: it may still hang later."""
    two, one = _runs(ws)
    reference = _reference(one)
    mine = _validation(two)
    if 0 not in mine:
        require_finished(two, "every rank must make the same collectives during validation, however many "
                         "validation batches its shard holds")
        raise Failed(f"the {two.name} finished, but rank 0 printed no validation before training", KEEP_PRINTS)
    require(_same(mine[0], reference[0]), f"before any training, rank 0 of the {two.name} printed a validation "
            f"{_shown(mine[0])}, but one process gives {_shown(reference[0])} over the same validation set",
            "the validation must be over the whole set, every sample counted once, whatever the sizes of the "
            "ranks' shards and batches")
    return (f"the validation on {HANG_WORLD_SIZE} processes (uneven shards) equals one process's: "
            f"{_shown(reference[0])}")


def _steps(trace: ProcessTrace) -> int:
    """The optimizer steps a process made (each traced: DDP_LAB_TRACE_STEPS)."""
    return len(trace.named("step"))


def check_hang_same_steps(ws: Workspace) -> str:
    """The run on 2 processes ends; every rank made as many optimizer steps as one process makes on the
    same global batches, fewer than the 24 global batches of the script's 2 epochs (the data has
    corrupt samples, whose batches are skipped); the validation after each epoch equals one process's
    (the training result is unchanged: the same batches trained, the same skipped); and the ranks end
    with the same weights. (How many samples each forward pass was given is not compared: a rank may
    look at a batch it then skips, or not.)"""
    two, one = _runs(ws)
    require_finished(two, "every rank must make the same collectives in the same order, the all-reduces that DDP "
                     "makes inside backward() included")
    reference = _reference(one)
    counts = {rank: _steps(t) for rank, t in sorted(two.ranks().items())}
    require(len(set(counts.values())) == 1, "the ranks made different numbers of optimizer steps ("
            + ", ".join(f"rank {r}: {n}" for r, n in counts.items()) + ")", "every rank must step on the same "
            "global batches, and skip the same ones")
    alone = _steps(one.ranks()[0]) if 0 in one.ranks() else 0
    require(alone < GLOBAL_BATCHES, f"one process made {alone} optimizer steps, one for each of the "
            f"{GLOBAL_BATCHES} global batches of its {EPOCHS} epochs: no batch was skipped, but the training data has "
            "corrupt samples", "a batch whose loss is not finite must be skipped, not trained on")
    steps = next(iter(counts.values()), 0)
    require(steps == alone, f"the ranks made {steps} optimizer steps each, but one process makes {alone} "
            "on the same global batches", "skip exactly the global batches one process skips: those with a corrupt "
            "sample on any rank")
    mine = _validation(two)
    for epoch in sorted(reference):
        require(epoch in mine, f"rank 0 printed no validation after {epoch} epochs", KEEP_PRINTS)
        require(_same(mine[epoch], reference[epoch]), f"after {epoch} epochs, rank 0 printed a validation "
                f"{_shown(mine[epoch])}, but one process gives {_shown(reference[epoch])}", "the same global "
                "batches must give the same training: each step's gradient the average over the whole global batch"
                if epoch else "the validation itself must be right first (hang_validation)")
    _require_same_weights(two, "every optimizer step must use gradients averaged over all ranks")
    return (f"every rank made the same {steps} optimizer steps as one process, skipping the same "
            f"{GLOBAL_BATCHES - steps} corrupt global batches, and ended with its validation "
            f"({_shown(reference[max(reference)])})")
