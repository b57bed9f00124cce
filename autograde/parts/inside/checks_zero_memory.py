"""The check of zero_memory (notebook 21): the learner's prediction of the bytes each rank holds
under their own ZeRO-1, a plain function of exercises/sharded_optimizer.py called
(autograde/inprocess/calls.py, in a process of its own) on the sizes of the model that `zero`'s
run trains, and compared with that run's measurements: each rank's optimizer state weighed in its
process after AdamW's steps (autograde/parts/inside/inprocess.py `zero`), plain AdamW's for one
process, and the model's parameters and gradients, whole on every rank under ZeRO-1.
"""
from __future__ import annotations

import json
from typing import Any

from autograde.engine.verdicts import function_calls, require
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.inside.checks import ZERO_WORLD_SIZES, _zero_reports
from autograde.parts.inside.reports import ZeroReport
from autograde.protocol import Call, CallsTask

ZERO_MEMORY_RUNS = RunKind("zero_memory")

KINDS = ("parameters", "gradients", "optimizer_state")
FLOAT32 = 4  # bytes: the zero run's model and its optimizer state are fp32


def _calls(ws: Workspace, calls: list[tuple[str, list[Any]]]) -> list[Call]:
    run = ws.called(ZERO_MEMORY_RUNS, "calls", "calls of zero1_bytes",
                    CallsTask(script=str(ws.script), calls=[list(c) for c in calls]))
    return function_calls(run)


def _whole(value: Any) -> int | None:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != round(value):
        return None
    return int(round(value))


def _per_rank(value: Any, n: int) -> list[dict[str, int]] | None:
    """A returned prediction as one {kind: bytes} per rank: a list in rank order (or a dict by rank),
    each a dict with the three kinds or a sequence of three numbers in their order."""
    if isinstance(value, dict) and {str(k) for k in value} == {str(r) for r in range(n)}:
        value = [value[k] for k in sorted(value, key=int)]
    if not isinstance(value, list) or len(value) != n:
        return None
    found = []
    for entry in value:
        if isinstance(entry, dict) and set(entry) == set(KINDS):
            numbers = [_whole(entry[k]) for k in KINDS]
        elif isinstance(entry, list) and len(entry) == len(KINDS):
            numbers = [_whole(v) for v in entry]
        else:
            return None
        whole = [v for v in numbers if v is not None]
        if len(whole) != len(KINDS):
            return None
        found.append(dict(zip(KINDS, whole)))
    return found


def _judge_state(n: int, got: list[int], measured: list[int], numels: list[int]) -> None:
    """The predicted optimizer state of each rank against the weighed one; a known slip is named."""
    full = sum(measured)
    said = (f"with {n} process{'es' if n > 1 else ''}, zero1_bytes predicted {got} bytes of optimizer state by rank; "
            f"measured: {measured}")
    require(not (n > 1 and all(g == full for g in got)), f"{said}: every rank whole, as in DDP",
            "under ZeRO-1 a rank keeps the optimizer state of its own shard only")
    short = full - sum(got)
    require(not (short and short == FLOAT32 * len(numels)), f"{said}: {short} bytes short in all, {FLOAT32} for each "
            f"of the {len(numels)} parameters: AdamW keeps more per parameter than its two running averages",
            "weigh what torch.optim.AdamW's state holds for one parameter after a step (optimizer.state[p])")
    require(not (n > 1 and len(set(got)) == 1 and len(set(measured)) > 1), f"{said}: the same for every rank, but "
            "your ShardedOptimizer's shards are not even (a shard is made of whole parameters)",
            "predict each rank's own shard, as your ShardedOptimizer cuts them")
    require(got == measured, said, "each rank's optimizer state is AdamW's for the parameters of its own shard, as "
            "your ShardedOptimizer cuts the shards")


def check_zero_memory(ws: Workspace) -> str:
    """zero1_bytes(numels, world_size) predicts, for each rank, the bytes of parameters, gradients and
    optimizer state it holds once the learner's ShardedOptimizer (AdamW, fp32) has stepped under DDP,
    for the 13 tensors of `zero`'s model: on 1 process the optimizer state equals plain AdamW's weighed
    state; on 2 and 3 it equals, rank by rank, what `zero`'s run weighed in each rank's process, to the
    byte (the learner's own shards, uneven as they are); parameters and gradients are the whole model's
    on every rank. The learner's ShardedOptimizer must shard the state (its ranks' states add up to
    plain AdamW's): the prediction is measured against it. Gradients or parameters divided among the
    ranks, every rank's state whole, AdamW's step counts left out, and even shares are named."""
    reports: list[ZeroReport] = _zero_reports(ws)
    numels = [p.numel for p in reports[0].params]
    sizes = (1, *ZERO_WORLD_SIZES)
    found = _calls(ws, [("zero1_bytes", [numels, n]) for n in sizes])
    whole = FLOAT32 * sum(numels)
    full_state = reports[0].full_state_bytes
    predicted: dict[int, list[dict[str, int]]] = {}
    for call, n in zip(found, sizes):
        shown = f"zero1_bytes({json.dumps(numels)}, {n})"
        require(call.error is None, f"{shown} raised {call.error}", "make zero1_bytes work for any parameter sizes "
                "and world size")
        per_rank = _per_rank(call.value, n)
        require(per_rank is not None, f"{shown} gave {json.dumps(call.value)[:120]}: not one entry per rank, each "
                f"with whole numbers of bytes for {', '.join(KINDS)}", "return one entry per rank, in rank order, as "
                "the docstring says")
        assert per_rank is not None
        predicted[n] = per_rank
        for kind, stage in (("parameters", "ZeRO-3"), ("gradients", "ZeRO-2")):
            got = [r[kind] for r in per_rank]
            require(not (n > 1 and sum(got) == whole), f"with {n} processes, zero1_bytes predicted {got} bytes of "
                    f"{kind} by rank, {whole} in all: divided among the ranks, as {stage} does",
                    f"under ZeRO-1 every rank holds the whole model's {kind}: only the optimizer state is sharded")
            require(all(g == whole for g in got), f"with {n} process{'es' if n > 1 else ''}, zero1_bytes predicted "
                    f"{got} bytes of {kind} by rank; the model's {len(numels)} fp32 tensors hold {whole}",
                    f"every rank holds all of the model's {kind}, {FLOAT32} bytes an element")
    _judge_state(1, [r["optimizer_state"] for r in predicted[1]], [full_state], numels)
    for n in ZERO_WORLD_SIZES:
        group = [r for r in reports if r.world_size == n]
        held = [r.state_bytes for r in group]
        require(sum(held) == full_state, f"with {n} processes, your ShardedOptimizer's ranks held {held} bytes of "
                f"optimizer state, {sum(held)} in all where plain AdamW holds {full_state}: the prediction is "
                "measured against your ShardedOptimizer", "finish ShardedOptimizer first (`# TODO zero`, its "
                "check must pass): every parameter's state on exactly one rank")
        _judge_state(n, [r["optimizer_state"] for r in predicted[n]], held, numels)
    shown = "; ".join(f"on {n}, {[r.state_bytes for r in reports if r.world_size == n]}" for n in ZERO_WORLD_SIZES)
    return (f"zero1_bytes predicts every rank's bytes: the whole model's parameters and gradients ({whole} bytes "
            f"each), and its own shard's optimizer state to the byte ({shown})")
