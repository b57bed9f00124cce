"""Part scaling's timed checks: the finished script's speedup on 2 GPUs, and an input pipeline that
keeps up with training on the CPU, found in its own trace. Each times runs against each other, in pairs made in
alternating order (checks_speed.py), so that a machine that slows down favours neither."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from autograde import data
from autograde.engine.run import Run
from autograde.engine.verdicts import Failed, require, run_ok
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.scaling import checks_speed as speed
from autograde.settings import STOP_AT_STEP, TRACE_STEPS

# The kinds of run these checks read (an item's `runs`, items.py)
SPEED_RUNS = RunKind("speed")
PIPELINE_RUNS = RunKind("pipeline")


# speedup: the finished script on 1 and 2 GPUs -----------------------------------------------

STUDY_SOLUTION = "solutions/large_batch_training.py"  # the part's finished script
SPEEDUP_TARGET = 1.6   # on 2 GPUs: to be set from measurements on GPU nodes
SPEED_PAIRS, SPEED_WARMUP, SPEED_STEPS = 3, 5, 20
SPEED_BATCH = 128


def speed_argv(batch: int, widen: int) -> list[str]:
    return ["--widen-factor", str(widen), "--batch-size", str(batch), "--epochs", "1", "--target-accuracy", "0"]


def _speed_data(ws: Workspace, processes: int, batch: int, steps: int) -> Path:
    """The timed runs' data set, written once per workspace, enough for `processes` processes to
    take `steps` steps within one epoch (the first caller sizes it: measure_speedup, for the most)."""
    folder = ws.root / "speed-data"
    if not ws.replaying and not folder.exists():
        data.write_synthetic(folder, processes * batch * (steps + 2), 64, seed=7)
    return folder


def timed_run(ws: Workspace, processes: int, index: int, batch: int, widen: int, warmup: int, steps: int) -> Run:
    """One run of `processes` processes under torchrun that stops after warmup + steps steps,
    every step traced, with data enough for them; its work verified (speed.verify)."""
    folder = _speed_data(ws, processes, batch, warmup + steps)
    run = ws.torchrun(SPEED_RUNS, f"{processes}-{index}", f"timed run of {processes} process(es), pair {index + 1}", [
        (["--standalone", "--nproc-per-node", str(processes)], [*speed_argv(batch, widen), "--data-dir", str(folder)])],
        env={TRACE_STEPS: "1", STOP_AT_STEP: str(warmup + steps)})
    run_ok(run, "the script must run under torchrun")
    problem = speed.verify(run, processes, warmup + steps, batch)
    require(problem is None, f"the {run.name}: {problem}", "every process must train on its full batch in every step")
    return run


def measure_speedup(ws: Workspace, n: int, pairs: int, batch: int, widen: int, warmup: int,
                    steps: int) -> list[speed.Pair]:
    """The pairs of timed runs (1 and n processes, alternating), each verified."""
    _speed_data(ws, n, batch, warmup + steps)  # sized for the larger runs, which come second
    try:
        return speed.paired(lambda k, i: timed_run(ws, k, i, batch, widen, warmup, steps), n, pairs, warmup)
    except ValueError as err:
        raise Failed(str(err), "the script must train for at least an epoch's steps") from None


def check_speedup(ws: Workspace) -> str | None:
    """With 2 GPUs or more: the learner's script under torchrun on 1 and on 2 GPUs, 3 pairs of
    runs in alternating order, each timed over 20 steps after 5 untimed ones (the slowest rank's
    time; every rank's work and final parameters verified): the median ratio of the throughputs
    is at least 1.6. Without 2 GPUs: not applicable (None)."""
    if ws.gpus < 2:
        return None
    found = measure_speedup(ws, 2, SPEED_PAIRS, SPEED_BATCH, 4, SPEED_WARMUP, SPEED_STEPS)
    ratio = speed.median_ratio(found)
    shown = ", ".join(f"{p.ratio:.2f}" for p in found)
    require(ratio >= SPEEDUP_TARGET, f"2 GPUs trained {ratio:.2f} x as fast as 1 (pairs: {shown}); the target is "
            f"{SPEEDUP_TARGET}", "look for work every step repeats on one process: loading on the CPU, "
            "synchronising (.item(), printing) inside the loop, a batch too small to keep a GPU busy")
    return f"2 GPUs trained {ratio:.2f} x as fast as 1 (median of {len(found)} pairs: {shown})"


# input_pipeline: a data pipeline that keeps up, on the CPU ---------------------------------

PIPELINE_ARGV = ["--world-size", "2", "--images", "512", "--batch-size", "20", "--epochs", "2", "--seed", "5"]
PIPELINE_EPOCH = [20] * 12 + [16]  # a rank's batches an epoch: its 256 images, 20 a batch, the last one short
PIPELINE_BATCHES = PIPELINE_EPOCH * 2  # the images of each optimizer step of a rank, 2 epochs
PIPELINE_PAIRS = 3
# The handed-out pipeline's time over yours. Its time is nearly all waiting for the share, which a
# loaded machine does not lengthen; fixing one of its two causes gives less than 2, both about 7 here.
PIPELINE_TARGET = 2.5
PIPELINE_NO_FASTER = 1.25  # below this, "no faster": the change did not touch what the time goes into
PIPELINE_TOLERANCE = 1e-4  # relative, on each parameter's norm: the same batches in another float order pass


@dataclass(frozen=True)
class PipelineRun:
    """What one run of the pipeline exercise did: its time (the slowest rank's, from making its
    sampler to its last optimizer step) and the part of it before the first step, each rank's
    sampler orders, and the final parameters (rank 0's fingerprint and norms)."""

    seconds: float
    before_first_step: float
    orders: dict[int, list[list[int]]]
    sha1: str
    norms: list[float]


def _batches_problem(run: Run, rank: int, images: list[int]) -> str | None:
    """How a rank's batches (the images of each optimizer step) differ from the handed-out
    pipeline's, in words; None when they do not."""
    if images == PIPELINE_BATCHES:
        return None
    steps, expected = len(images), len(PIPELINE_BATCHES)
    if steps == expected - 2 and images == [b for b in PIPELINE_BATCHES if b == PIPELINE_EPOCH[0]]:
        return (f"the {run.name}: rank {rank} took {steps} optimizer steps in 2 epochs, not {expected}: the last batch "
                f"of each epoch ({PIPELINE_EPOCH[-1]} images, the rest of the rank's 256) never reached the model")
    if images == PIPELINE_EPOCH:
        return (f"the {run.name}: rank {rank} took the {len(PIPELINE_EPOCH)} batches of the first epoch and none in "
                "the second: what fast_loader returned could be gone through once only (an iterator or a generator), "
                "and the training loop goes through it once an epoch")
    if steps != expected:
        return (f"the {run.name}: rank {rank} took {steps} optimizer steps in 2 epochs, not {expected} (256 images "
                f"an epoch, {PIPELINE_EPOCH[0]} a batch, the last one {PIPELINE_EPOCH[-1]})")
    k = next(k for k, (a, b) in enumerate(zip(images, PIPELINE_BATCHES)) if a != b)
    return (f"the {run.name}: rank {rank} gave the model {images[k]} images in its step {k + 1}, not the "
            f"{PIPELINE_BATCHES[k]} the handed-out pipeline gives")


def _pipeline_run(ws: Workspace, slow: bool, index: int) -> PipelineRun:
    """One traced run, the handed-out pipeline (`--slow`) or the learner's, verified: 2 ranks,
    each the handed-out pipeline's batches (26 steps, the last of each epoch short), the same
    parameters at the end on both."""
    which = "the handed-out pipeline (--slow)" if slow else "your pipeline"
    run = ws.launched(PIPELINE_RUNS, f"{'slow' if slow else 'yours'}-{index}", f"run with {which}, pair {index + 1}",
                      [*PIPELINE_ARGV, *(["--slow"] if slow else [])], env={TRACE_STEPS: "1"})
    hint = ("keep --slow as handed out (SlowDisk, decode, Images, slow_loader and the training loop): it is what "
            "yours is timed against" if slow else "fast_loader must give the training loop the batches slow_loader gives")
    run_ok(run, hint)
    ranks = run.ranks()
    require(len(ranks) == 2, f"the {run.name}: {len(ranks)} of 2 processes joined the process group", hint)
    seconds, before, orders, ends = 0.0, 0.0, {}, []
    for rank, trace in sorted(ranks.items()):
        steps, samplers = trace.named("step"), trace.named("sampler")
        require(samplers, f"the {run.name}: rank {rank} made no DistributedSampler", hint)
        problem = _batches_problem(run, rank, [int(e["images"]) for e in steps])
        require(problem is None, str(problem), "every image of the rank's share must reach the model once an epoch, "
                "in the batches slow_loader makes, the last short one included")
        start = samplers[0]["t"]
        seconds = max(seconds, steps[-1]["t"] - start)
        before = max(before, steps[0]["t"] - start)
        orders[rank] = [list(e["indices"]) for e in trace.named("sampler_iter")]
        ends += [e for e in trace.named("parameters") if e.get("when") == "end"]
    require(len(ends) == 2, f"the {run.name}: {len(ends)} of 2 ranks reached destroy_process_group", hint)
    require(len({e["sha1"] for e in ends}) == 1, f"the {run.name}: the ranks ended with different weights",
            "every rank must train the DDP model on its own batches")
    return PipelineRun(seconds, before, orders, ends[0]["sha1"], [float(n) for n in ends[0]["norms"]])


def _same_training(slow: PipelineRun, yours: PipelineRun) -> None:
    """Fail unless the learner's run ended with the handed-out pipeline's weights."""
    if yours.sha1 == slow.sha1:
        return
    far = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(yours.norms, slow.norms)), default=0.0)
    if len(yours.norms) == len(slow.norms) and far <= PIPELINE_TOLERANCE:
        return
    if yours.orders != slow.orders:
        ranks = [r for r in sorted(slow.orders) if yours.orders.get(r) != slow.orders[r]]
        rank = ranks[0] if ranks else 0
        raise Failed(f"your pipeline went through the images in another order than the handed-out one: rank {rank}'s "
                     "sampler gave other indices (or another sampler was used), and the weights after 2 epochs differ "
                     f"(a parameter's norm by {far:.1%})",
                     "go through the images in the order of the sampler the training loop is given (it calls "
                     "set_epoch on that one), as slow_loader does")
    raise Failed(f"your pipeline went through the same images in the same order, but the model ended with other weights "
                 f"than with the handed-out pipeline (a parameter's norm differs by {far:.1%}): the images or labels "
                 "it gave the model were not the ones decode makes of the share's records",
                 "give the model each image and label exactly as decode returns them: no other scaling, no other "
                 "type, no augmentation, each label with its own image")


def check_input_pipeline(ws: Workspace) -> str:
    """The learner's script launched with 2 processes, 2 epochs of 512 images on a slow share (a
    stand-in: every request waits 1.5 ms, one request at a time): 3 pairs of runs, the handed-out
    pipeline (--slow) and the learner's in alternating order, every step traced. Each run did all
    the work (2 ranks, each the handed-out pipeline's 26 batches: 12 of 20 images and one of 16 an
    epoch), and the learner's ended with the same weights as the handed-out one's (each
    parameter's norm within 1e-4, relative: the same images in the same order; skipping data,
    reordering it or changing it fails). Its time, the slowest rank's from making its sampler to
    its last optimizer step: the median of the pairs' ratios (slow over yours) is at least 2.5."""
    pairs: list[tuple[PipelineRun, PipelineRun]] = []
    for i in range(PIPELINE_PAIRS):  # judged pair by pair: a pipeline that trains differently fails at once
        if i % 2 == 0:  # alternating order: a machine that slows down meanwhile favours neither
            slow = _pipeline_run(ws, True, i)
            yours = _pipeline_run(ws, False, i)
        else:
            yours = _pipeline_run(ws, False, i)
            slow = _pipeline_run(ws, True, i)
        _same_training(slow, yours)
        pairs.append((slow, yours))
    ratios = [slow.seconds / yours.seconds if yours.seconds > 0 else float("inf") for slow, yours in pairs]
    ratio = statistics.median(ratios)
    middle = sorted(range(len(pairs)), key=lambda k: ratios[k])[len(pairs) // 2]
    slow, yours = pairs[middle]
    shown = ", ".join(f"{r:.2f}" for r in ratios)
    measured = (f"{yours.seconds:.2f} s with your pipeline, {slow.seconds:.2f} s with the handed-out one (the "
                f"slowest rank, from making its sampler to its last step; median of {len(pairs)} pairs run in "
                f"alternating order, ratios {shown})")
    if ratio < PIPELINE_TARGET:
        where = (f"most of your time ({yours.before_first_step:.2f} s) went before the first optimizer step"
                 if yours.before_first_step > yours.seconds / 2 else
                 f"most of your time went between optimizer steps, waiting for the next batch "
                 f"({yours.before_first_step:.2f} s before the first)")
        how = ("no faster than the handed-out one: what its time goes into is all still there"
               if ratio < PIPELINE_NO_FASTER else
               "faster than the handed-out one, but not enough: a batch still waits for something your change "
               "left as it was")
        raise Failed(f"your pipeline trained the 2 epochs {ratio:.2f}x as fast as the handed-out one, {how}; "
                     f"{measured}; {where}; the target is {PIPELINE_TARGET}x",
                     "profile a run of yours (--profile) as you did the handed-out one, and count what each batch "
                     "still waits for: the requests to the share, and what each one waits behind")
    return (f"your pipeline trained the 2 epochs {ratio:.2f}x as fast as the handed-out one (the target is "
            f"{PIPELINE_TARGET}x), with the same {len(PIPELINE_BATCHES)} batches a rank and the same weights: "
            f"{measured}")
