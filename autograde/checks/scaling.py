"""The checks of the part "scaling" (notebooks 17-19), one function per graded item.

`scaling` and `warmup` call the learner's plain functions (autograde/learner_processes/tasks.py
`calls`, in a process of its own) with the checker's arguments and compare what they return
with what the definitions give. `lr_scaling` runs the learner's script under torchrun and reads
the learning rate of every optimizer step from the trace, never from the code. `speedup` times
the learner's script on 1 and 2 GPUs (autograde/checker/speed.py); it needs 2 GPUs.
`input_pipeline` times the learner's exercise against its handed-out pipeline (`--slow`), on
any machine, and compares the weights both end with.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from autograde import data
from autograde.checker import speed
from autograde.protocol import STOP_AT_STEP, TRACE_STEPS, Call, CallsReport, Task
from autograde.checker.runs import Family, Run, Workspace
from autograde.checker.verdicts import Failed, require, run_ok


def _calls(ws: Workspace, family: Family, label: str, calls: list[tuple[str, list[Any]]]) -> list[Call]:
    """What each call of the learner's functions gave (in order), from one launched process."""
    run = ws.called(family, "calls", label, Task.CALLS, ["--calls", json.dumps(calls)])
    ranks = (run.report or {}).get("ranks", [])
    problem = run.problem()
    require(ranks, problem or f"the {run.name} reported nothing", "the file must import without errors")
    report = CallsReport.from_json(ranks[0])
    require(report.error is None, f"importing the file failed: {report.error}", "the file must import without errors")
    return report.calls


def _number(value: Any) -> float | None:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _close(a: float, b: float, tolerance: float) -> bool:
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance * 1e-3)


# scaling: speedup, efficiency and T(N) -----------------------------------------------------

# Epoch times of three studies, in seconds, by number of processes: the exact model
# (64/N + 2 + 0.75(N-1)), a measured-looking one from a 2-core machine, and powers of two given
# out of order. And two logs: the first epoch (start-up) is left out of the mean.
STUDIES: list[dict[int, float]] = [
    {n: 64 / n + 2 + 0.75 * (n - 1) for n in range(1, 9)},
    {1: 41.2, 2: 24.9, 3: 21.7, 4: 20.8},
    {4: 3.4, 1: 10.0, 8: 2.9, 2: 5.6},
]
LOGS: list[list[float]] = [[9.7, 5.1, 4.9, 5.3], [7.25]]
PREDICT_AT = 16
TOLERANCE = 1e-6  # the same arithmetic in another order differs far less; a fitted parameter: 1e-4


def time_model(times: dict[int, float]) -> tuple[float, float, float]:
    """(t_par, t_seq, t_comm) of T(N) = t_par/N + t_seq + t_comm (N - 1), least squares."""
    ns = sorted(times)
    rows = np.array([[1 / n, 1.0, n - 1.0] for n in ns])
    fitted = np.linalg.lstsq(rows, np.array([times[n] for n in ns]), rcond=None)[0]
    return float(fitted[0]), float(fitted[1]), float(fitted[2])


def model_time(params: Sequence[float], n: int) -> float:
    return params[0] / n + params[1] + params[2] * (n - 1)


def _log_lines(times: list[float]) -> str:
    return "".join(json.dumps({"epoch": i + 1, "epoch_time": t, "images": 60000, "world_size": 2}) + "\n"
                   for i, t in enumerate(times))


def _by_n(value: Any, ns: list[int]) -> dict[int, float] | None:
    """A returned {N: x} (a dict, or a list in increasing N) as {N: float}, else None."""
    if isinstance(value, dict):
        try:
            found = {int(k): _number(v) for k, v in value.items()}
        except ValueError:
            return None
    elif isinstance(value, list) and len(value) == len(ns):
        found = {n: _number(v) for n, v in zip(sorted(ns), value)}
    else:
        return None
    return None if set(found) != set(ns) or any(v is None for v in found.values()) else found  # type: ignore[return-value]


def _show(times: dict[int, float]) -> str:
    return "{" + ", ".join(f"{n}: {t:g}" for n, t in times.items()) + "}"


def check_scaling(ws: Workspace) -> str:
    """epoch_time averages a JSON-lines log's epoch times without the first epoch; speedup gives
    T(1)/T(N) and efficiency T(1)/(N T(N)) for every N (to 1e-6); fit_time_model gives the
    least-squares parameters of T(N) = t_par/N + t_seq + t_comm (N - 1) (to 1e-4 of the
    measurements' scale, so any solver passes); predict_time gives the model's T(16). Three
    studies: the exact model, measured-looking times, and N = 1, 2, 4, 8 given out of order.
    Dicts or lists in increasing N, tuples, arrays and tensors are all accepted."""
    paths = []
    for i, times in enumerate(LOGS):
        path = ws.root / f"epochs-{i}.jsonl"
        if not ws.replaying:
            path.write_text(_log_lines(times))
        paths.append(str(path))
    calls: list[tuple[str, list[Any]]] = [("epoch_time", [p]) for p in paths]
    for study in STUDIES:
        as_json = {str(n): t for n, t in study.items()}
        calls += [("speedup", [as_json]), ("efficiency", [as_json]), ("fit_time_model", [as_json])]
    calls += [("predict_time", [list(time_model(s)), PREDICT_AT]) for s in STUDIES]
    found = iter(_calls(ws, Family.SCALING, "calls of the scaling functions", calls))

    def value(call: Call) -> Any:
        shown = json.dumps(call.args)[1:-1]
        require(call.error is None, f"{call.function}({shown[:120]}) raised {call.error}",
                f"make {call.function} work on the arguments its docstring describes")
        return call.value

    for epochs in LOGS:
        got, later = _number(value(next(found))), epochs[1:] or epochs
        want = sum(later) / len(later)
        require(got is not None and _close(got, want, TOLERANCE),
                f"epoch_time of a log with epoch times {', '.join(map(str, epochs))} s gave {got}; the mean without "
                f"the first epoch is {want:g}", "average the epoch_time field over the epochs after the first "
                "(all of them if there is only one)")
    for study in STUDIES:
        ns, show = sorted(study), _show(study)
        for name, expected in (("speedup", {n: study[1] / study[n] for n in ns}),
                               ("efficiency", {n: study[1] / study[n] / n for n in ns})):
            returned = _by_n(value(next(found)), ns)
            require(returned is not None, f"{name}({show}) gave no number for each N",
                    f"{name} returns {{N: value}} for every N of its argument")
            assert returned is not None
            formula = "T(1) / T(N)" + (" / N" if name == "efficiency" else "")
            for n in ns:
                require(_close(returned[n], expected[n], TOLERANCE), f"{name}({show}) gave {returned[n]:.4g} for "
                        f"N = {n}; {formula} is {expected[n]:.4g}", f"{name}(N) = {formula}")
        fitted = value(next(found))
        want_fit = time_model(study)
        got_fit = [_number(v) for v in fitted] if isinstance(fitted, list) and len(fitted) == 3 else None
        scale = max(study.values())
        require(got_fit is not None and all(g is not None and abs(g - w) <= 1e-4 * scale
                                             for g, w in zip(got_fit, want_fit)),
                f"fit_time_model({show}) gave "
                f"{'(' + ', '.join(f'{g:.4g}' for g in got_fit if g is not None) + ')' if got_fit else fitted}; "
                "the least-squares fit is "
                f"(t_par, t_seq, t_comm) = ({', '.join(f'{x:.4g}' for x in want_fit)})",
                "T(N) is linear in the three parameters, so each measurement is one equation: solve them "
                "all in the least-squares sense (np.linalg.lstsq), returning (t_par, t_seq, t_comm) in that order")
    for study in STUDIES:
        params = time_model(study)
        returned = value(next(found))
        got, want = _number(returned), model_time(params, PREDICT_AT)
        require(got is not None and _close(got, want, TOLERANCE),
                f"predict_time(({', '.join(f'{x:.4g}' for x in params)}), {PREDICT_AT}) gave "
                f"{f'{got:.4g}' if got is not None else returned!r}; "
                f"the model gives {want:.4g}", "T(n) = t_par / n + t_seq + t_comm * (n - 1)")
    measured = time_model(STUDIES[1])
    return (f"speedup, efficiency, the fit and T({PREDICT_AT}) right on 3 studies; for "
            f"{_show(STUDIES[1])} s: T(N) = {measured[0]:.1f}/N + {measured[1]:.1f} + {measured[2]:.2f}(N-1), "
            f"T({PREDICT_AT}) = {model_time(measured, PREDICT_AT):.1f} s")


# warmup and lr_scaling: the large-batch learning rate --------------------------------------

WARMUP_CASES = [(0.1, n, w) for n in (1, 2, 4, 8) for w in (0, 1, 10)] + [(0.05, 3, 6)]
AFTER = 4  # steps judged after the warm-up


def schedule_problem(rates: list[float], base: float, n: int, warmup: int) -> str | None:
    """What is wrong with the rates of steps 0, 1, ... (at least warmup + 1 of them) for base rate
    `base`, n processes and a warm-up of `warmup` steps, or None. Accepted: from step `warmup` on,
    exactly n x base; before it, a straight line that starts at no more than base (or than
    n x base / warmup, where that is more: PyTorch's LinearLR starts there) and would reach n x base
    at step warmup or warmup - 1. The ramps from base, from 0 and from n x base / warmup all pass."""
    target = base * n
    for step, rate in enumerate(rates):
        if step >= warmup and not _close(rate, target, 1e-9):
            return f"step {step} had {rate:.6g}; after the warm-up the rate is {n} x {base:g} = {target:.6g}"
    ramp = rates[:warmup]
    if not ramp:
        return None
    start_limit = max(base, target / warmup) * (1 + 1e-9)
    if not 0 <= ramp[0] <= start_limit:
        return (f"step 0 had {ramp[0]:.6g}; a warm-up starts low, at {base:g} (or at most "
                f"{max(base, target / warmup):.6g}), and rises to {target:.6g}")
    rise = (ramp[-1] - ramp[0]) / (len(ramp) - 1) if len(ramp) > 1 else None
    if rise is not None:
        bent = [s for s in range(1, len(ramp)) if not _close(ramp[s] - ramp[s - 1], rise, 1e-6)
                and abs(ramp[s] - ramp[s - 1] - rise) > 1e-9 * target]
        if bent:
            s = bent[0]
            return (f"the warm-up is not a straight line: steps {s - 1} and {s} had {ramp[s - 1]:.6g} and "
                    f"{ramp[s]:.6g}, while it rises by {rise:.6g} a step on average")
        reaches = [ramp[0] + rise * k for k in (warmup, warmup - 1)]
        if not any(_close(r, target, 1e-6) for r in reaches):
            return (f"the warm-up goes from {ramp[0]:.6g} (step 0) to {ramp[-1]:.6g} (step {warmup - 1}): "
                    f"a straight line that does not reach {target:.6g} at step {warmup}")
    return None


def check_warmup(ws: Workspace) -> str:
    """warmup_lr(step, base_lr, world_size, warmup_steps) at world sizes 1, 2, 3, 4 and 8 with
    warm-ups of 0, 1, 6 and 10 steps, for every step of the warm-up and 4 after it: from step
    warmup_steps on, exactly world_size x base_lr (linear scaling); before it, a straight line
    from at most base_lr up to that rate (see schedule_problem for the ramps accepted)."""
    calls: list[tuple[str, list[Any]]] = [("warmup_lr", [s, base, n, w]) for base, n, w in WARMUP_CASES
                                          for s in range(w + AFTER)]
    found = iter(_calls(ws, Family.WARMUP, "calls of warmup_lr", calls))
    for base, n, w in WARMUP_CASES:
        rates = []
        for s in range(w + AFTER):
            call = next(found)
            require(call.error is None, f"warmup_lr({s}, {base}, {n}, {w}) raised {call.error}",
                    "return the rate of the step")
            rate = _number(call.value)
            require(rate is not None, f"warmup_lr({s}, {base}, {n}, {w}) returned {call.value!r}, not a number",
                    "return the rate as a number")
            assert rate is not None
            rates.append(rate)
        problem = schedule_problem(rates, base, n, w)
        require(problem is None, f"warmup_lr with base_lr={base}, world_size={n}, warmup_steps={w}: {problem}",
                "the rate rises in a straight line from base_lr to world_size x base_lr over warmup_steps "
                "steps, then stays there")
    return ("warmup_lr scales with the world size (1-8 processes) and warms up in a straight line "
            f"({len(WARMUP_CASES)} settings, {len(calls)} steps)")


LR_BASE, LR_EPOCHS = 0.05, 2
LR_ARGV = ["--widen-factor", "1", "--batch-size", "16", "--epochs", str(LR_EPOCHS), "--target-accuracy", "0",
           "--patience", "2", "--base-lr", str(LR_BASE), "--scale-lr", "--warmup-epochs", "1"]


def _lr_run(ws: Workspace) -> Run:
    return ws.torchrun(Family.LR, "2", "torchrun run with --scale-lr --warmup-epochs 1", [
        (["--standalone", "--nproc-per-node", "2"], [*LR_ARGV, "--data-dir", str(ws.root / "disk")])],
        env={TRACE_STEPS: "1"})


def check_lr_scaling(ws: Workspace) -> str:
    """Run under torchrun with 2 processes, `--scale-lr --warmup-epochs 1 --base-lr 0.05` for 2
    epochs: the learning rate that every optimizer step of every rank used (read from the
    optimizer when it steps) follows the warm-up to 2 x 0.05 over the first epoch's steps, then
    stays there (the same rule as `warmup`), and both ranks used the same rates."""
    run = _lr_run(ws)
    run_ok(run, "the script must run to the end under torchrun with --scale-lr --warmup-epochs 1")
    ranks = run.ranks()
    require(len(ranks) == 2, f"{len(ranks)} of 2 processes joined the process group",
            "the script must run under torchrun with 2 processes")
    rates: dict[int, list[float]] = {}
    for rank, trace in sorted(ranks.items()):
        steps = trace.named("step")
        require(steps, f"rank {rank} took no optimizer step", "train with the optimizer")
        groups = [e["lrs"] for e in steps]
        require(all(len(set(g)) == 1 for g in groups), f"rank {rank}'s parameter groups had different rates",
                "set the rate of every parameter group")
        rates[rank] = [g[0] for g in groups]
    require(len({tuple(r) for r in rates.values()}) == 1, f"the ranks used different rates: rank 0 "
            f"{rates[0][:4]}..., rank 1 {rates[1][:4]}...", "every rank must use the same schedule")
    used = rates[0]
    require(len(used) % LR_EPOCHS == 0, f"{len(used)} optimizer steps in {LR_EPOCHS} epochs",
            "take one optimizer step per batch")
    warmup = len(used) // LR_EPOCHS
    problem = schedule_problem(used, LR_BASE, 2, warmup)
    require(problem is None, f"with 2 processes, --base-lr {LR_BASE} and a warm-up of 1 epoch ({warmup} steps), "
            f"the rates the optimizer used were wrong: {problem} (all: {', '.join(f'{r:.4g}' for r in used)})",
            "with --scale-lr, set each step's rate from warmup_lr(step, args.base_lr, world size, "
            "warm-up steps) before optimizer.step()")
    return (f"the optimizer's rate rose from {used[0]:.4g} to {used[warmup]:.4g} = 2 x {LR_BASE} over the "
            f"{warmup} steps of epoch 1, then stayed there (both ranks, {len(used)} steps)")


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
    run = ws.torchrun(Family.SPEED, f"{processes}-{index}", f"timed run of {processes} process(es), pair {index + 1}", [
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

PIPELINE_ARGV = ["--world-size", "2", "--images", "512", "--batch-size", "16", "--epochs", "2", "--seed", "5"]
PIPELINE_STEPS = 2 * 512 // (2 * 16)  # optimizer steps per rank: 2 epochs of 256 images, 16 a batch
PIPELINE_BATCH = 16
PIPELINE_PAIRS = 3
PIPELINE_TARGET = 1.5  # the handed-out pipeline's time over yours; 4 loader workers give about 3 here
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


def _pipeline_run(ws: Workspace, slow: bool, index: int) -> PipelineRun:
    """One traced run, the handed-out pipeline (`--slow`) or the learner's, verified: 2 ranks,
    each PIPELINE_STEPS steps of a full batch, the same parameters at the end on both."""
    which = "the handed-out pipeline (--slow)" if slow else "your pipeline"
    run = ws.launched(Family.PIPELINE, f"{'slow' if slow else 'yours'}-{index}", f"run with {which}, pair {index + 1}",
                      [*PIPELINE_ARGV, *(["--slow"] if slow else [])], env={TRACE_STEPS: "1"})
    hint = ("keep --slow as handed out (slow_loader, SlowDisk and the training loop): it is what yours is timed "
            "against" if slow else "fast_loader must give the training loop the batches slow_loader gives")
    run_ok(run, hint)
    ranks = run.ranks()
    require(len(ranks) == 2, f"the {run.name}: {len(ranks)} of 2 processes joined the process group", hint)
    seconds, before, orders, ends = 0.0, 0.0, {}, []
    for rank, trace in sorted(ranks.items()):
        steps, samplers = trace.named("step"), trace.named("sampler")
        require(samplers, f"the {run.name}: rank {rank} made no DistributedSampler", hint)
        require(len(steps) == PIPELINE_STEPS, f"the {run.name}: rank {rank} took {len(steps)} optimizer steps in "
                f"2 epochs, not {PIPELINE_STEPS} (256 images an epoch, 16 a batch)",
                "every image of the rank's share must reach the model once an epoch, in batches of 16")
        short = [e for e in steps if e["images"] != PIPELINE_BATCH]
        require(not short, f"the {run.name}: rank {rank} gave the model {short[0]['images'] if short else 0} images "
                f"in its step {short[0]['n'] if short else 0}, not the batch of {PIPELINE_BATCH}",
                "give the model the batches slow_loader gives: 16 images each")
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
                 "it gave the model were not the ones the disk holds",
                 "give the model the images and labels exactly as dataset[i] returns them: no other scaling, no "
                 "other type, no augmentation")


def check_input_pipeline(ws: Workspace) -> str:
    """The learner's script launched with 2 processes, 2 epochs of 512 images read from a slow
    disk (a stand-in: every read of an image waits 4 ms): 3 pairs of runs, the handed-out pipeline
    (--slow) and the learner's in alternating order, every step traced. Each run did all the work
    (2 ranks, 32 optimizer steps each of a full batch of 16), and the learner's ended with the
    same weights as the handed-out one's (each parameter's norm within 1e-4, relative: the same
    images in the same order; skipping data or changing it fails). Its time, the slowest rank's
    from making its sampler to its last optimizer step: the median of the pairs' ratios (slow
    over yours) is at least 1.5."""
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
        where = (f"most of it ({yours.before_first_step:.2f} s) before the first optimizer step: reading the data set "
                 "up front costs what the epochs' reads cost, unless the reads overlap"
                 if yours.before_first_step > yours.seconds / 2 else
                 f"most of it between optimizer steps, waiting for the next batch ({yours.before_first_step:.2f} s "
                 "before the first)")
        raise Failed(f"your pipeline trained the 2 epochs only {ratio:.2f}x as fast as the handed-out one, "
                     f"{measured}; {where}; the target is {PIPELINE_TARGET}x",
                     "the time goes into waiting for the disk, one image after the other: have several reads "
                     "waiting at once, while the model trains")
    return (f"your pipeline trained the 2 epochs {ratio:.2f}x as fast as the handed-out one, with the same "
            f"{PIPELINE_STEPS} steps a rank and the same weights: {measured}")
