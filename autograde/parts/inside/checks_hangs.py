"""The checks of notebook 23 (debugging hangs): three scripts that hang, each fixed by the learner.

Each check launches the learner's script as a learner would (`python exercises/hang_uneven.py
--world-size 2 ...`: the script starts its own processes), once, with the checker's time limit,
and judges what the processes did and printed. A run that still hangs is stopped when nothing
has moved for a while, and the verdict says where each rank waited: the torch.distributed call
it was in, or, for a rank in none, that it was in a training step (DDP all-reduces the gradients
inside backward(), where the trace cannot see). A run that finishes must also give the right
result: rank 0's mean loss over all ranks, every rank trained on its batches with the same
weights at the end, every rank stopped after the epoch that rank 0's validation loss asked for.
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
EPOCHS = 3
UNEVEN_BATCHES = 11  # dealt to 2 ranks: 6 and 5
EARLY_STOP_EPOCHS, TARGET_LOSS = 6, 0.2  # rank 0's validation loss falls below 0.2 after epoch 3 of 6
LOSS_SLACK = 2e-6  # losses are printed with 6 decimals: a mean of rounded numbers is off by 1e-6 at most
NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
OWN_LOSS = re.compile(rf"^rank (\d+): epoch (\d+), loss ({NUMBER})")   # every rank's line, each epoch
WEIGHTS = re.compile(r"^rank (\d+): done after (\d+) epochs?, weights ([0-9a-f]+)")  # every rank's last line


def _run(ws: Workspace, name: str, argv: list[str]) -> Run:
    """The script with `argv`, on 2 processes, each optimizer step traced."""
    argv = ["--world-size", str(HANG_WORLD_SIZE), *argv]
    return ws.launched(HANG_RUNS, name, f"run with {' '.join(argv)}", argv, env={TRACE_STEPS: "1"})


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


def require_finished(run: Run, what: str) -> None:
    """Fail, naming where each rank waited, when the run hung; as run_ok does when it crashed."""
    if run.stalled or any(r.timed_out for r in run.results):
        problem = run.problem() or f"the {run.name} did not finish"
        silent = [_where(rank, t) for rank, t in sorted(run.ranks().items()) if t.waiting_in() is None]
        raise Failed(problem + (f"; {'; '.join(silent)}" if silent else ""), what)
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
            "their final weights", "leave the script's own prints as they are")
    require(len(set(weights.values())) == 1, f"the {run.name} finished, but the ranks ended with different weights ("
            + ", ".join(f"rank {r}: {w}" for r, w in sorted(weights.items())) + ")", what)


def _own_losses(run: Run) -> dict[int, dict[int, float]]:
    """Each rank's own training loss of each epoch, as it printed it: {rank: {epoch: loss}}."""
    found: dict[int, dict[int, float]] = {}
    for rank, trace in run.ranks().items():
        for line in _printed(trace):
            if (m := OWN_LOSS.match(line)) and int(m[1]) == rank:
                found.setdefault(rank, {})[int(m[2])] = float(m[3])
    return found


def _after(word: str, trace: ProcessTrace) -> dict[int, float]:
    """What a rank printed after `word`, by epoch: in any line with `word` and "epoch N", the first
    number with decimals that follows the word ("epoch 2: mean loss over 2 ranks 0.415789": 0.415789)."""
    found = {}
    for line in _printed(trace):
        epoch = re.search(r"epoch (\d+)", line)
        at = line.lower().find(word)
        value = re.search(r"[-+]?\d+\.\d+(?:[eE][-+]?\d+)?", line[at:]) if at >= 0 else None
        if epoch and value:
            found[int(epoch[1])] = float(value[0])
    return found


def check_hang_collective(ws: Workspace) -> str:
    """exercises/hang_collective.py, launched with 2 processes for 3 epochs, finishes (a hang is
    stopped and each rank's waiting call named); after each epoch rank 0 printed the mean of the
    losses that the ranks printed for that epoch (to printing precision), and the ranks end with
    the same weights."""
    run = _run(ws, "collective", ["--epochs", str(EPOCHS)])
    require_finished(run, "every rank must make the same collectives in the same order, whatever its rank: "
                     "rank 0 alone may print, but not make a collective alone")
    own = _own_losses(run)
    means = _after("mean", run.ranks()[0]) if 0 in run.ranks() else {}
    for epoch in range(EPOCHS):
        losses = [own.get(rank, {}).get(epoch) for rank in range(HANG_WORLD_SIZE)]
        require(all(loss is not None for loss in losses), f"the {run.name} finished, but not every rank printed its "
                f"loss for epoch {epoch}", "leave the script's own prints as they are")
        require(epoch in means, f"the {run.name} finished, but rank 0 printed no mean loss for epoch {epoch}",
                "rank 0 must still print the mean loss over all ranks, every epoch")
        average = sum(float(loss or 0.0) for loss in losses) / len(losses)
        shown = ", ".join(f"{loss:.6f}" for loss in losses if loss is not None)
        require(abs(means[epoch] - average) <= LOSS_SLACK + 1e-6 * abs(average),
                f"for epoch {epoch}, rank 0 printed a mean loss of {means[epoch]:.6f}, but the ranks' own losses "
                f"({shown}) average {average:.6f}", "the mean must be over every rank's loss of the epoch, each "
                "counted once")
    _require_same_weights(run, "keep the training as it is: DDP keeps the ranks' weights equal")
    return (f"with {HANG_WORLD_SIZE} processes the run finished, and rank 0 printed the mean loss over all ranks for "
            f"each of {EPOCHS} epochs (epoch {EPOCHS - 1}: {means[EPOCHS - 1]:.6f})")


def check_hang_uneven(ws: Workspace) -> str:
    """exercises/hang_uneven.py, launched with 2 processes and 11 batches dealt out (6 and 5) for 3
    epochs, finishes (a hang is stopped and each rank's waiting call named); the ranks end with the
    same weights; and every rank made, in all, at least as many optimizer steps as the smaller share
    has batches and at most as many as the larger has (Join: each rank steps through its own;
    evened-out batches, a shared stop, or padding: the same number on every rank)."""
    run = _run(ws, "uneven", ["--epochs", str(EPOCHS), "--batches", str(UNEVEN_BATCHES)])
    require_finished(run, "every rank must make the same collectives in the same order, the all-reduces that DDP "
                     "makes inside backward() included, whatever the number of batches each rank holds")
    _require_same_weights(run, "every optimizer step must use gradients averaged over all ranks: no rank may "
                          "step alone on a batch the others do not match")
    fewest, most = UNEVEN_BATCHES // HANG_WORLD_SIZE, -(-UNEVEN_BATCHES // HANG_WORLD_SIZE)
    steps = {rank: len(t.named("step")) for rank, t in sorted(run.ranks().items())}
    for rank, made in steps.items():
        require(made >= EPOCHS * fewest, f"rank {rank} made {made} optimizer steps in {EPOCHS} epochs, fewer than "
                f"the {fewest} batches an epoch that every rank holds ({EPOCHS * fewest} steps)",
                "leave out no batch that every rank has: at most the batches that other ranks lack")
        require(made <= EPOCHS * most, f"rank {rank} made {made} optimizer steps in {EPOCHS} epochs, more than the "
                f"largest share of batches allows ({most} an epoch: {EPOCHS * most} steps)",
                "one optimizer step per batch")
    shown = ", ".join(f"rank {rank}: {made}" for rank, made in steps.items())
    return (f"with {UNEVEN_BATCHES} batches dealt to {HANG_WORLD_SIZE} processes ({most} and {fewest}), the run "
            f"finished with the same weights on every rank; optimizer steps in {EPOCHS} epochs: {shown}")


def check_hang_early_stop(ws: Workspace) -> str:
    """exercises/hang_early_stop.py, launched with 2 processes for at most 6 epochs and a target
    validation loss of 0.2, finishes (a hang is stopped and each rank's waiting call named); every
    rank trained exactly up to the first epoch after which rank 0's printed validation loss was below
    the target (every epoch, if none was), and the ranks end with the same weights."""
    run = _run(ws, "early_stop", ["--epochs", str(EARLY_STOP_EPOCHS), "--target-loss", str(TARGET_LOSS)])
    require_finished(run, "every rank must stop after the same epoch: rank 0's decision must reach the others "
                     "through a collective that every rank makes")
    validation = _after("validation", run.ranks()[0]) if 0 in run.ranks() else {}
    require(validation, f"the {run.name} finished, but rank 0 printed no validation loss",
            "rank 0 must still measure and print the validation loss after each epoch")
    below = [epoch for epoch, loss in sorted(validation.items()) if loss < TARGET_LOSS]
    expected = below[0] + 1 if below else EARLY_STOP_EPOCHS  # epochs to train
    trained = {rank: len(losses) for rank, losses in sorted(_own_losses(run).items())}
    asked = (f"rank 0's validation loss was {validation[below[0]]:.6f} after epoch {below[0]}, below the target "
             f"{TARGET_LOSS}" if below else f"rank 0's validation loss never fell below {TARGET_LOSS}")
    wrong = {rank: n for rank, n in trained.items() if n != expected}
    require(len(trained) == HANG_WORLD_SIZE and not wrong,
            f"the ranks trained {', '.join(f'rank {r}: {n} epochs' for r, n in trained.items())}, but {asked}: "
            f"every rank should have trained {expected} epochs", "every rank must get rank 0's decision, and "
            "stop exactly when rank 0's validation loss is below the target")
    _require_same_weights(run, "keep the training as it is: DDP keeps the ranks' weights equal")
    return (f"with {HANG_WORLD_SIZE} processes the run finished, and every rank stopped after epoch {expected - 1}, "
            f"where {asked}")
