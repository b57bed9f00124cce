"""The check of kfac_traffic (notebook 26): the learner's prediction of what distributed K-FAC
communicates, a plain function of exercises/kfac_traffic.py called (autograde/inprocess/calls.py,
in a process of its own) on the checker's layers, world sizes, update frequencies and run lengths,
and compared with what the design of `# TODO kfac_distributed` hands to collectives: at a refresh,
every layer's A and G all-reduced whole, each factor's eigenvalues and eigenvectors broadcast from
its owner; nothing between refreshes. Notebook 26 shows the prediction beside rank 0's traced count.
"""
from __future__ import annotations

import json
import math
from typing import Any

from autograde.engine.verdicts import function_calls, require, returned_number
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.optimizers.reports import KFAC_LAYERS
from autograde.protocol import Call, CallsTask

TRAFFIC_RUNS = RunKind("kfac_traffic")

Layers = list[tuple[int, int, bool]]
MLP: Layers = [(784, 128, True), (128, 64, True), (64, 10, True)]  # exercises/kfac.py's make_model
CHECKER: Layers = [tuple(layer) for layer in KFAC_LAYERS]  # type: ignore[misc]  # the first one without a bias
# (layers, world size, update_freq, steps): notebook 26's two runs, a refresh count that is not a
# whole division, a model with a layer without a bias on 4 processes, one process, and fewer steps
# than update_freq
CASES: list[tuple[Layers, int, int, int]] = [(MLP, 2, 1, 48), (MLP, 2, 10, 48), (CHECKER, 4, 3, 10),
                                             (MLP, 1, 10, 48), (CHECKER, 3, 10, 5)]
TOLERANCE = 1e-9


def floats_per_step(layers: Layers, world_size: int, update_freq: int, steps: int, *, bias: bool = True,
                    ceiling: bool = True, values: bool = True, broadcasts: bool = True, alone: bool = False,
                    every_step: bool = False, mean: bool = True) -> float:
    """The design's floats a step on one rank; the keywords make the known mistakes' numbers."""
    if world_size == 1 and not alone:
        return 0.0
    refreshes = steps if every_step else (-(-steps // update_freq) if ceiling else steps // update_freq)
    per_refresh = 0
    for inputs, outputs, has_bias in layers:
        for n in (inputs + (has_bias and bias), outputs):
            per_refresh += n * n + broadcasts * (n * n + values * n)
    return refreshes * per_refresh / (steps if mean else 1)


# What a wrong number matches, said in the learner's terms, and what to do about it
MISTAKES: dict[str, tuple[dict[str, bool], str, str]] = {
    "bias": ({"bias": False}, "it matches A sized by the inputs alone, the bias left out",
             "a layer with a bias has A over its inputs and a 1 appended to each: one more row and column"),
    "floor": ({"ceiling": False}, "it matches counting steps // update_freq refreshes",
              "the refreshes are the steps 0, update_freq, 2 x update_freq, ... below `steps`: step 0 refreshes "
              "too, so a run shorter than update_freq still has one"),
    "values": ({"values": False}, "it matches the eigenvectors broadcast without their eigenvalues",
               "a decomposition is its eigenvalues and its eigenvectors: both go from the owner"),
    "broadcasts": ({"broadcasts": False}, "it matches the factors' all-reduces alone, no decomposition sent",
                   "each factor's decomposition goes from its owner to every other rank: those floats count too"),
    "alone": ({"alone": True}, "one process has no process group: K-FAC calls no collective there",
              "on one process, K-FAC communicates nothing"),
    "every_step": ({"every_step": True}, "it matches a refresh at every step",
                   "only the steps 0, update_freq, 2 x update_freq, ... refresh; the others send nothing"),
    "total": ({"mean": False}, "it matches the whole run's floats, not a mean per step",
              "divide the run's floats by its number of steps"),
}


def _calls(ws: Workspace, label: str, calls: list[tuple[str, list[Any]]]) -> list[Call]:
    run = ws.called(TRAFFIC_RUNS, "calls", label, CallsTask(script=str(ws.script), calls=[list(c) for c in calls]))
    return function_calls(run)


def _show(x: float) -> str:
    return f"{x:,.0f}" if x == round(x) else f"{x:,.2f}"


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def check_kfac_traffic(ws: Workspace) -> str:
    """kfac_floats_per_step(layers, world_size, update_freq, steps) gives the mean floats one rank
    hands to K-FAC's collectives a step (to 1e-9): notebook 26's MLP on 2 processes with update_freq
    1 and 10 over 48 steps (5 refreshes: a ceiling), the checker's model (a layer without a bias) on
    4 processes, one process (nothing), and a run shorter than update_freq. A number that matches a
    known mistake (the bias's row, the refresh count, the eigenvalues, the broadcasts, one process,
    a refresh every step, a total instead of a mean) is named."""
    calls = [("kfac_floats_per_step", [[list(layer) for layer in layers], n, k, steps]) for layers, n, k, steps in CASES]
    for call, (layers, n, k, steps) in zip(_calls(ws, "calls of kfac_floats_per_step", calls), CASES):
        shown = f"kfac_floats_per_step({json.dumps(call.args[0])}, {n}, {k}, {steps})"
        require(call.error is None, f"{shown} raised {call.error}", "make kfac_floats_per_step work on any "
                "layers, world size, update_freq and number of steps")
        got, want = returned_number(call.value), floats_per_step(layers, n, k, steps)
        require(got is not None, f"{shown} gave {json.dumps(call.value)[:80]}, not a number", "return the mean "
                "floats a step, a number")
        assert got is not None
        if _same(got, want):
            continue
        said = f"{shown} gave {_show(got)}; the design's collectives carry {_show(want)} floats a step on each rank"
        for options, mistake, fix in MISTAKES.values():
            if _same(got, floats_per_step(layers, n, k, steps, **options)):
                require(False, f"{said}: {mistake}", fix)
        require(False, said, "count, at each refresh, every factor all-reduced and every decomposition broadcast "
                "(a layer's A is over its inputs, with a 1 for the bias; its G over its outputs), then the refreshes "
                "in the run, then the mean over its steps")
    mlp = {k: floats_per_step(MLP, 2, k, 48) for k in (1, 10)}
    return (f"kfac_floats_per_step predicts K-FAC's traffic: on notebook 26's MLP, {mlp[1]:,.0f} floats a step with "
            f"update_freq 1 and {mlp[10]:,.0f} with 10, over 48 steps; one process sends none")
