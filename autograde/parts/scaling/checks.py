"""The checks of the part "scaling" (notebooks 17-19), one function per graded item.

`scaling` and `warmup` call the learner's plain functions (autograde/inprocess/runner.py
`calls`, in a process of its own) with the checker's arguments and compare what they return
with what the definitions give. `lr_scaling` runs the learner's script under torchrun and reads
the learning rate of every optimizer step from the trace, never from the code. `speedup` times
the learner's script on 1 and 2 GPUs (autograde/parts/scaling/checks_speed.py); it needs 2 GPUs.
`input_pipeline` times the learner's exercise against its handed-out pipeline (`--slow`), on
any machine (checks_timed.py), and compares the batches and the weights both end with.
"""
from __future__ import annotations

import json
import math
from typing import Any, Sequence

import numpy as np

from autograde.engine.run import Run
from autograde.engine.verdicts import require, run_ok
from autograde.engine.workspace import RunKind, Workspace
from autograde.protocol import Call, CallsReport, CallsTask, decode
from autograde.settings import TRACE_STEPS

# The kinds of run these checks read (an item's `runs`, items.py)
SCALING_RUNS = RunKind("scaling")
WARMUP_RUNS = RunKind("warmup")
LR_RUNS = RunKind("lr")



def _calls(ws: Workspace, kind: RunKind, label: str, calls: list[tuple[str, list[Any]]]) -> list[Call]:
    """What each call of the learner's functions gave (in order), from one launched process."""
    run = ws.called(kind, "calls", label, CallsTask(script=str(ws.script), calls=[list(c) for c in calls]))
    ranks = (run.report or {}).get("ranks", [])
    problem = run.problem()
    require(ranks, problem or f"the {run.name} reported nothing", "the file must import without errors")
    report = decode(CallsReport, ranks[0])
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
# half_efficiency, beyond the studies' fits: (params, max_n or None for the default of 1024). No
# communication and nothing sequential never drops; a sequential part alone does, at 12 (0.505 at
# 11); a small one only at 669, so not within a max_n of 500. No case is within 1e-4 of one half.
HALF_CASES: list[tuple[tuple[float, float, float], int | None]] = [
    ((100.0, 0.0, 0.0), None), ((92.0, 10.0, 0.0), None), ((1000.0, 1.5, 0.0), None), ((1000.0, 1.5, 0.0), 500)]
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


def model_efficiency(params: Sequence[float], n: int) -> float:
    return model_time(params, 1) / (n * model_time(params, n))


def half_point(params: Sequence[float], max_n: int = 1024) -> int | None:
    """The fewest processes, 1 to max_n, at which the model's efficiency is below one half, or None."""
    return next((n for n in range(1, max_n + 1) if model_efficiency(params, n) < 0.5), None)


def _half_problem(params: Sequence[float], max_n: int | None, returned: Any) -> str | None:
    """What is wrong with half_efficiency's answer for these parameters, or None."""
    want = half_point(params, max_n or 1024)
    shown = f"half_efficiency(({', '.join(f'{x:.4g}' for x in params)}){f', {max_n}' if max_n else ''})"
    got = _number(returned)
    if returned is None and want is None:
        return None
    if got is not None and want is not None and got == want:
        return None
    if want is None:
        return (f"{shown} gave {returned!r}; the model's efficiency stays at one half or more for every N "
                f"up to {max_n or 1024} (at N = {max_n or 1024}: {model_efficiency(params, max_n or 1024):.4f}): None")
    said = ""
    if got is not None and got == int(got) and got >= 1:
        said = f" (the model's efficiency at N = {int(got)} is {model_efficiency(params, int(got)):.4f})"
    return (f"{shown} gave {returned!r}{said}; the model's efficiency first drops below one half at N = {want} "
            f"({model_efficiency(params, want):.4f}"
            + (f", and {model_efficiency(params, want - 1):.4f} at N = {want - 1})" if want > 1 else ")"))


def check_scaling(ws: Workspace) -> str:
    """epoch_time averages a JSON-lines log's epoch times without the first epoch; speedup gives
    T(1)/T(N) and efficiency T(1)/(N T(N)) for every N (to 1e-6); fit_time_model gives the
    least-squares parameters of T(N) = t_par/N + t_seq + t_comm (N - 1) (to 1e-4 of the
    measurements' scale, so any solver passes); predict_time gives the model's T(16);
    half_efficiency gives the fewest N at which the model's efficiency T(1)/(N T(N)) is below 0.5,
    or None when no N up to max_n (default 1024) is. Three studies: the exact model,
    measured-looking times, and N = 1, 2, 4, 8 given out of order; and four more models for
    half_efficiency (one that never drops, one that drops only past max_n).
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
    halves = [(time_model(s), None) for s in STUDIES] + HALF_CASES
    calls += [("half_efficiency", [list(p)] + ([m] if m else [])) for p, m in halves]
    found = iter(_calls(ws, SCALING_RUNS, "calls of the scaling functions", calls))

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
                f"the model gives {want:.4g}", "predict with notebook 17's model of T(N), the parameters in the "
                "order fit_time_model returns them")
    for params, max_n in halves:
        problem = _half_problem(params, max_n, value(next(found)))
        require(problem is None, problem or "", "return the first N whose predicted efficiency, the model's T(1) "
                "over N times its T(N), is below 0.5, and None when no N up to max_n is")
    measured = time_model(STUDIES[1])
    return (f"speedup, efficiency, the fit, T({PREDICT_AT}) and the half-efficiency point right on 3 studies and "
            f"{len(HALF_CASES)} models; for {_show(STUDIES[1])} s: T(N) = {measured[0]:.1f}/N + {measured[1]:.1f} + "
            f"{measured[2]:.2f}(N-1), T({PREDICT_AT}) = {model_time(measured, PREDICT_AT):.1f} s, efficiency below "
            f"one half from N = {half_point(measured)}")


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
    found = iter(_calls(ws, WARMUP_RUNS, "calls of warmup_lr", calls))
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
    return ws.torchrun(LR_RUNS, "2", "torchrun run with --scale-lr --warmup-epochs 1", [
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
