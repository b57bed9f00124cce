"""The check of where memory goes (exercises/memory_budget.py, notebook 36).

It is tried by inprocess_budget.py `memory_budget` on 2 and then 3 processes: every stage (0, DDP, to 3) runs a
step of Adam on two MLPs, each rank weighing the parameters, gradients, optimizer state and activations it held;
beside each, the learner's prediction.
"""
from __future__ import annotations

from autograde.engine.verdicts import rank_reports, require
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.memory.reports import (
    BUDGET_MODELS,
    BUDGET_QUANTITIES,
    BUDGET_TOLERANCE,
    BUDGET_WORLD_SIZES,
    BudgetCase,
    BudgetReport,
    BudgetTask,
)

BUDGET_RUNS = RunKind("memory_budget")
FIRST_SHARDED = {"optimizer_state": 1, "gradients": 2, "parameters": 3}  # the stage from which each is sharded
NAMES = {"parameters": "the parameters", "gradients": "the gradients", "optimizer_state": "Adam's state",
         "activations": "the activations", "peak_parameters": "the parameters held at the peak"}
ARE = {"optimizer_state": "is"}  # the verb after NAMES[q], where it is not "are"


def _close(ratio: float, value: float) -> bool:
    return abs(ratio / value - 1) <= BUDGET_TOLERANCE


def _diagnose(quantity: str, ratio: float, stage: int, world_size: int) -> tuple[str, str]:
    """What a prediction `ratio` times the measured bytes most likely got wrong (or "" where nothing known fits),
    and what to do."""
    names, are = NAMES[quantity], ARE.get(quantity, "are")
    if _close(ratio, 0.25):
        return "these look like numbers of float32 elements, not bytes", "return bytes: 4 for each float32 element"
    if quantity == "optimizer_state" and (_close(ratio, 0.5) or _close(ratio * world_size, 0.5)):
        return "one running average was counted", "Adam keeps two running averages per parameter (first and second moments)"
    sharded = quantity in FIRST_SHARDED and stage >= FIRST_SHARDED[quantity]
    if quantity in FIRST_SHARDED and _close(ratio, world_size) and sharded:
        return (f"the whole was counted, where {names} {are} sharded at stage {stage}",
                f"each rank holds 1/{world_size} of them: a flat vector split evenly")
    if quantity in FIRST_SHARDED and _close(ratio, 1 / world_size) and not sharded:
        return (f"a shard was counted, where stage {stage} does not shard {names}",
                f"below stage {FIRST_SHARDED[quantity]}, each rank holds the whole")
    if quantity == "peak_parameters" and stage >= 3:
        return "", ("at stage 3 the parameters a rank holds at once are its shards and the units gathered whole at that "
                    "moment: which units are whole together, and which is the largest?")
    if quantity == "activations":
        return "", ("count what autograd keeps for backward during the forward pass: what each layer saves (notebook 33's "
                    "saved_tensors_hooks shows it), each tensor once, for every example")
    return "", f"{names} of every parameter, in bytes, held as the TODO says at this stage"


def _judge(case: BudgetCase, world_size: int, rank: int) -> None:
    name, _, _, batch = BUDGET_MODELS[case.model]
    where = f"{name}, {batch} examples a rank, stage {case.stage} on {world_size} processes"
    require(case.error is None, f"{where}: bytes_per_rank: {case.error}", "bytes_per_rank(model, batch_size, stage, "
            "world_size) returns a dict with a number for each of " + ", ".join(BUDGET_QUANTITIES))
    for quantity in BUDGET_QUANTITIES:
        measured, predicted = case.measured[quantity], case.predicted[quantity]
        if abs(predicted - measured) <= BUDGET_TOLERANCE * measured:
            continue
        mistake, fix = _diagnose(quantity, predicted / measured if measured else float("inf"), case.stage, world_size)
        require(False, f"{where}: {NAMES[quantity]}, predicted {predicted:,.0f} bytes, measured {measured:,} on rank "
                f"{rank}" + (f": {mistake}" if mistake else ""), fix)


def check_memory_budget(ws: Workspace) -> str:
    """bytes_per_rank against what each rank held in real steps of Adam at every stage (0: DDP; 1-2: ZeRO on a flat
    vector; 3: ZeRO unit by unit), on two MLPs (one without biases), on 2 and 3 processes: the parameters between steps, the gradients
    when the optimizer steps, Adam's running averages, and what autograd kept for backward during the forward pass,
    and the most parameters held at once (stage 3 gathers each nn.Linear whole before its forward and its backward,
    and frees it after), each prediction within 1% of the bytes measured. A wrong one is named with what it most
    likely missed (bytes counted as elements, one of Adam's two averages, a quantity sharded at the wrong stage)."""
    sizes = ", ".join(map(str, BUDGET_WORLD_SIZES))
    run = ws.called(BUDGET_RUNS, sizes, f"steps of every ZeRO stage on {sizes} processes", BudgetTask(world_sizes=list(BUDGET_WORLD_SIZES)))
    reports = rank_reports(run, BudgetReport, "the file must import, and bytes_per_rank work as the TODO's contract says")
    for r in reports:
        require(r.cases, f"rank {r.rank} of {r.world_size}: no prediction was made", "define bytes_per_rank(model, "
                "batch_size, stage, world_size)")
        for case in r.cases:
            _judge(case, r.world_size, r.rank)
    last = max(reports, key=lambda r: r.world_size)
    first = {c.stage: c.measured for c in last.cases if c.model == 0}
    kb = {stage: sum(v for q, v in found.items() if q != "peak_parameters") / 1024 for stage, found in first.items()}
    return (f"every prediction is within 1% of the bytes measured, on 2 models, 4 stages and {sizes} processes (the "
            f"first model on {last.world_size}: " + ", ".join(f"stage {s} {v:,.0f} KB" for s, v in sorted(kb.items()))
            + f" per rank; parameters at the peak {first[3]['peak_parameters'] / 1024:,.0f} KB at stage 3, "
            f"{first[0]['peak_parameters'] / 1024:,.0f} KB under DDP)")
