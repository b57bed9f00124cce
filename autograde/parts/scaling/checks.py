"""The checks of the part "scaling" (notebooks 17-19), one function per graded item.

`scaling` calls the learner's plain functions (autograde/inprocess/runner.py `calls`, in a
process of its own) with the checker's arguments and compares what they return with what the
definitions give. `large_batch` and `lr_scaling` (notebook 19) train the learner's plan for real
(autograde/parts/scaling/checks_batches.py). `speedup` times
the learner's script on 1 and 2 GPUs (autograde/parts/scaling/checks_speed.py); it needs 2 GPUs.
`input_pipeline` times the learner's exercise against its handed-out pipeline (`--slow`), on
any machine (checks_timed.py), and compares the batches and the weights both end with.
"""
from __future__ import annotations

import json
import math
from typing import Any, Sequence

import numpy as np

from autograde.engine.verdicts import function_calls, require, returned_number
from autograde.engine.workspace import RunKind, Workspace
from autograde.protocol import Call, CallsTask

# The kinds of run these checks read (an item's `runs`, items.py)
SCALING_RUNS = RunKind("scaling")



def _calls(ws: Workspace, kind: RunKind, label: str, calls: list[tuple[str, list[Any]]]) -> list[Call]:
    """What each call of the learner's functions gave (in order), from one launched process."""
    run = ws.called(kind, "calls", label, CallsTask(script=str(ws.script), calls=[list(c) for c in calls]))
    return function_calls(run)


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
            found = {int(k): returned_number(v) for k, v in value.items()}
        except ValueError:
            return None
    elif isinstance(value, list) and len(value) == len(ns):
        found = {n: returned_number(v) for n, v in zip(sorted(ns), value)}
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
    got = returned_number(returned)
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
        got, later = returned_number(value(next(found))), epochs[1:] or epochs
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
        got_fit = [returned_number(v) for v in fitted] if isinstance(fitted, list) and len(fitted) == 3 else None
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
        got, want = returned_number(returned), model_time(params, PREDICT_AT)
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
