"""The checks of model parallelism (notebook 22, part "inside DDP"), one function per graded item.

The learner's pieces run in real gloo process groups, called by
autograde/parts/inside/inprocess_model_parallel.py: `tensor_parallel` (f, g, the column and row
layers and the MLP block, on 2 and 4 processes, against the unsplit layers), and `two_d` (4 processes:
tensor parallel in pairs, data parallel across them, against one process on the whole batch). What
a rank computed is in its report; how many collectives each pass made is read from the trace. The
pipelines' checks are checks_pipeline.py's.
"""
from __future__ import annotations

from typing import Any

from autograde.engine.run import Run
from autograde.engine.verdicts import rank_reports, require, run_ok
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.inside.reports import (
    TENSOR_CASES,
    TENSOR_HIDDEN,
    TWO_D_TENSOR,
    TWO_D_WORLD,
    ParallelCase,
    ParallelReport,
    TensorParallelTask,
    TwoDTask,
)
from autograde.protocol import COLLECTIVES, ProcessTrace

# The kinds of run these checks read (an item's `runs`, items.py)
TENSOR_PARALLEL_RUNS = RunKind("tensor_parallel")
TWO_D_RUNS = RunKind("two_d")


TOLERANCE = 1e-6
TENSOR_WORLD_SIZES = (2, 4)
# What each case is, and the collectives its forward and backward passes make (Megatron's f and g)
WHAT = {"f": "CopyToParallel (f)", "g": "ReduceFromParallel (g)", "column": "ColumnParallelLinear",
        "row": "RowParallelLinear", "mlp": "ParallelMLP", "two_d": "ParallelMLP"}
EXPECTED = {"f": (0, 1), "g": (1, 0), "column": (0, 1), "row": (1, 0), "mlp": (1, 1)}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _micro(m: int) -> str:
    return f"{m} micro-batch{'' if m == 1 else 'es'}"


def _collectives(trace: ProcessTrace, case: str) -> dict[str, list[dict[str, Any]]]:
    """The collectives the learner's code entered in each phase of `case` ("forward", "backward", ...)."""
    found: dict[str, list[dict[str, Any]]] = {}
    phase = None
    for e in trace.events:
        if e["ev"] == "phase":
            phase = e["phase"] if e["case"] == case and e["phase"] != "end" else None
            if phase is not None:
                found.setdefault(phase, [])
        elif phase is not None and e["ev"] == "enter" and e.get("call") in COLLECTIVES:
            found[phase].append(e)
    return found


def _parallel_reports(run: Run) -> list[ParallelReport]:
    reports: list[ParallelReport] = rank_reports(run, ParallelReport, "the file must import without errors")
    return reports


def _judge_counts(case: str, where: str, phases: dict[str, list[dict[str, Any]]]) -> None:
    """The collectives of each pass: f's and g's directions named when they are swapped or doubled."""
    made = (len(phases.get("forward", [])), len(phases.get("backward", [])))
    want = EXPECTED[case]
    if made == want:
        return
    what = WHAT[case]
    said = (f"{where}: {what} made {_plural(made[0], 'collective')} in the forward pass and "
            f"{_plural(made[1], 'collective')} in the backward pass; it needs {want[0]} and {want[1]}")
    if case in ("f", "g"):
        other = "g" if case == "f" else "f"
        if made == want[::-1]:
            require(False, f"{said}: f's and g's directions are swapped", f"{what}: its all-reduce belongs in "
                    f"{'backward' if case == 'f' else 'forward'}, and {WHAT[other]}'s in the other direction")
        if made == (1, 1):
            require(False, f"{said}: it all-reduces in both directions", f"{what} is the identity in its "
                    f"{'forward' if case == 'f' else 'backward'} pass: every rank already holds that whole tensor")
        require(False, said, f"{what}: one dist.all_reduce, in its {'backward' if case == 'f' else 'forward'} "
                "pass, and nothing in the other")
    require(False, said, "a tensor-parallel layer communicates only through CopyToParallel (the column layer's "
            "input) and ReduceFromParallel (the row layer's output); the MLP block needs nothing in between")


def _judge_shards(case: ParallelCase, where: str, n: int) -> None:
    """Each of the learner's parameters is a share of an unsplit tensor, the weights 1/N of each."""
    what = WHAT[case.case]
    strays = [s.name for s in case.shards if s.of is None]
    require(not strays, f"{where}: {what}'s parameter{'s' if len(strays) > 1 else ''} {', '.join(strays)} "
            "held values found in no row or column of the unsplit layers", "copy this rank's share from the "
            "layer you are given (its .weight and .bias), not new random values")
    for name, numel in case.whole_numel.items():
        if not name.endswith("weight"):
            continue
        held = sum(s.numel for s in case.shards if s.of == name)
        require(held == numel // n, f"{where}: {what} held {held} of {name}'s {numel} numbers; a share is "
                f"{numel // n} (1/{n})", "keep this rank's share of the weight only: 1/N of its output features "
                "(column) or input features (row)")


def _judge_values(case: ParallelCase, where: str, n: int) -> None:
    what = WHAT[case.case]
    if case.case in ("row", "mlp") and case.output > TOLERANCE and case.bias_every_rank <= TOLERANCE:
        require(False, f"{where}: {what}'s output is the unsplit one plus {n - 1} more times the bias: every rank "
                "added the bias to its partial sum before the all-reduce", "add the row layer's bias once, to "
                "the sum (after ReduceFromParallel), or on one rank only")
    require(case.output <= TOLERANCE, f"{where}: {what}'s output is {case.output:.1e} from the unsplit "
            f"computation's (at most {TOLERANCE:g})", "the forward pass must give the unsplit result (its share, "
            "for the column layer), on every rank")
    require(case.input_grad <= TOLERANCE, f"{where}: the gradient of {what}'s input is {case.input_grad:.1e} from "
            f"the unsplit one's (at most {TOLERANCE:g})", "backward must give each rank its input's whole gradient")
    for shard in case.shards:
        if not shard.used:
            continue  # a copy the forward pass never uses (a bias kept everywhere, added on rank 0 only): idle
        require(shard.difference <= TOLERANCE, f"{where}: the gradient of {what}'s {shard.name} (a share of "
                f"{shard.of}) is {shard.difference:.1e} from the unsplit gradient's share (at most {TOLERANCE:g})",
                "each shard's gradient is the unsplit weight's gradient, cut as the weight is")


def _judge_coverage(group: list[ParallelReport], case: str) -> None:
    """Over the ranks, every output (column) or input (row) feature held by exactly one rank."""
    n = group[0].world_size
    cases = [next(c for c in r.cases if c.case == case) for r in group]
    for name in cases[0].whole_numel:
        if not name.endswith("weight"):
            continue
        held = sorted(i for c in cases for s in c.shards if s.of == name for i in s.indices)
        size = TENSOR_HIDDEN  # fc1's outputs, fc2's inputs: the features a rank's share is cut from
        require(held == list(range(size)), f"with {n} processes, the ranks' shares of {name} in {WHAT[case]} "
                f"hold features {held}; each of its {size} must be held by exactly one rank",
                "rank r of N keeps its own share: cut by the rank within the group (dist.get_rank(group))")


def check_tensor_parallel(ws: Workspace) -> str:
    """f, g, ColumnParallelLinear, RowParallelLinear and ParallelMLP on 2 and 4 processes, each against
    the unsplit computation: outputs, the input's gradient and every parameter's gradient (each
    parameter found by its values among the unsplit tensors, however it was cut or named) to 1e-6;
    the collectives of each forward and backward pass counted from the trace (f: 0 and 1, g: 1 and 0,
    the MLP block: 1 and 1), swapped or doubled directions named; each rank's weights 1/N of each
    unsplit weight, every feature on exactly one rank. The first failing piece is named, f and g
    before the layers made of them."""
    sizes = [str(n) for n in TENSOR_WORLD_SIZES]
    run = ws.called(TENSOR_PARALLEL_RUNS, "-".join(sizes), f"tensor-parallel layers on {' and '.join(sizes)} "
                    "processes", TensorParallelTask(world_sizes=list(TENSOR_WORLD_SIZES)))
    reports = _parallel_reports(run)
    traces = run.by_group()
    require({r.world_size for r in reports} == set(TENSOR_WORLD_SIZES), f"the {run.name} ran only with "
            f"{sorted({r.world_size for r in reports})} processes", "make the layers work with any world size")
    for case in TENSOR_CASES:
        for n in TENSOR_WORLD_SIZES:
            group = [r for r in reports if r.world_size == n]
            for r in group:
                where = f"with {n} processes, rank {r.rank}"
                found = next((c for c in r.cases if c.case == case), None)
                require(found is not None, f"{where}: {WHAT[case]} was not tried", f"make {WHAT[case]} work")
                assert found is not None
                require(found.error is None, f"{where}: {WHAT[case]}: {found.error}", f"make {WHAT[case]} work "
                        "as the TODO's contract says")
                trace = traces.get((n, r.rank))
                if trace is not None:
                    _judge_counts(case, where, _collectives(trace, case))
                _judge_shards(found, where, n)
                _judge_values(found, where, n)
            if case in ("column", "row", "mlp"):
                _judge_coverage(group, case)
    return ("f, g, the column and row layers and the MLP block give the unsplit outputs and gradients on 2 and "
            "4 processes, each rank holding 1/N of the weights, with one all-reduce forward and one backward")


def check_two_d(ws: Workspace) -> str:
    """2-D parallelism on 4 processes: the learner's make_groups(2) cuts the world into tensor groups
    of 2 and data groups of the ranks that hold the same shards (read from each rank's groups);
    ParallelMLP over the tensor group, trained 3 SGD steps on the data group's share of each batch
    with the learner's average_gradients over the data group (its all-reduces' group sizes read from
    the trace), ends with every shard equal to one process trained on the whole batches, to 1e-6."""
    run = ws.called(TWO_D_RUNS, str(TWO_D_WORLD), f"2-D parallelism on {TWO_D_WORLD} processes",
                    TwoDTask(world_sizes=[TWO_D_WORLD]))
    if run.stalled or any(r.timed_out for r in run.results):
        hint = "every rank must call dist.new_group for every group, in the same order, even the groups it is not in"
        stuck = sorted(rank for (_, rank), t in run.by_group().items()
                       if (w := t.waiting_in()) and w.get("call") == "new_group")
        # ranks that made other groups than their neighbours pair up wrongly: some never leave new_group
        require(not stuck, f"{run.problem()}; rank{'s' if len(stuck) > 1 else ''} "
                f"{' and '.join(map(str, stuck))} never got out of dist.new_group(): the ranks did not all make "
                "the same groups in the same order", hint)
        run_ok(run, hint)
    # gloo may let ranks out of new_groups that the others called for other groups (no deadlock, wrong
    # groups): a rank that makes its groups with dist.new_group must call it once per group of the world
    # (new_subgroups and the like make theirs without the traced call, and are judged by their groups)
    groups = TWO_D_WORLD // TWO_D_TENSOR + TWO_D_TENSOR
    made = {rank: len(t.calls("new_group")) for (_, rank), t in run.by_group().items()}
    short = sorted(rank for rank, n in made.items() if 0 < n != groups)
    require(not short, f"rank {short[0] if short else ''} called dist.new_group {made.get(short[0] if short else 0)} "
            f"times, but the world of {TWO_D_WORLD} is cut into {groups} groups ({TWO_D_WORLD // TWO_D_TENSOR} "
            f"tensor groups and {TWO_D_TENSOR} data groups): the ranks did not all make the same groups in the same "
            "order", "every rank must call dist.new_group for every group, in the same order, even the groups it "
            "is not in")
    reports = _parallel_reports(run)
    found = {r.rank: r.cases[0] for r in reports if r.cases}
    for r in reports:
        case = found[r.rank]
        require(case.error is None, f"rank {r.rank}: {case.error}", "make_groups(tensor_parallel) returns "
                "(tensor_group, data_group); average_gradients(model, group) averages over that group")
    tensor = {r.rank: r.tensor_ranks for r in reports}
    data = {r.rank: r.data_ranks for r in reports}
    for r in reports:
        mine_t, mine_d = tensor[r.rank], data[r.rank]
        require(len(mine_t) == TWO_D_TENSOR and r.rank in mine_t, f"rank {r.rank}'s tensor group is ranks {mine_t}; "
                f"it must hold {TWO_D_TENSOR} ranks, this one among them", "cut the world into groups of "
                "`tensor_parallel` ranks, and return the one this rank is in")
        require(all(tensor[o] == mine_t for o in mine_t), f"rank {r.rank}'s tensor group is {mine_t}, but those "
                f"ranks' own tensor groups are {[tensor[o] for o in mine_t]}", "every rank of a group must "
                "agree on who is in it")
        require(len(mine_d) == TWO_D_WORLD // TWO_D_TENSOR and set(mine_t) & set(mine_d) == {r.rank},
                f"rank {r.rank}'s data group is {mine_d} and its tensor group {mine_t}; a data group holds one rank "
                "of each tensor group, the ranks that hold the same shards", "the data group of a rank: the ranks "
                "at the same position in every tensor group")
        require(all(data[o] == mine_d for o in mine_d), f"rank {r.rank}'s data group is {mine_d}, but those ranks' "
                f"own data groups are {[data[o] for o in mine_d]}", "every rank of a group must agree on who is in it")
    traces = run.by_group()
    for r in reports:
        trace = traces.get((TWO_D_WORLD, r.rank))
        if trace is None:
            continue
        sizes = [e.get("group_size") or TWO_D_WORLD for e in _collectives(trace, "two_d").get("average", [])]
        require(sizes, f"rank {r.rank}: average_gradients made no collective", "all-reduce every gradient over the "
                "data group, then divide by its size")
        wrong = [s for s in sizes if s != TWO_D_WORLD // TWO_D_TENSOR]
        require(not wrong, f"rank {r.rank}: average_gradients all-reduced over {wrong[0] if wrong else 0} processes; "
                f"the ranks that hold the same shards are {TWO_D_WORLD // TWO_D_TENSOR}", "pass the data group: "
                "dist.all_reduce(grad, group=group); over the world it adds up different shards")
    for r in reports:
        case = found[r.rank]
        _judge_shards(case, f"rank {r.rank}", TWO_D_TENSOR)
        for shard in (s for s in case.shards if s.used):
            require(shard.difference <= TOLERANCE, f"rank {r.rank}: after 3 steps, {shard.name} (a share of "
                    f"{shard.of}) is {shard.difference:.1e} from one process trained on the whole batches (at most "
                    f"{TOLERANCE:g})", "average every gradient over the data group (sum, then divide by its size) "
                    "before the step")
        require(case.output <= TOLERANCE, f"rank {r.rank}: after 3 steps, the output is {case.output:.1e} from one "
                "process's", "average every gradient over the data group before the step")
    return (f"2-D parallelism on {TWO_D_WORLD} processes (tensor parallel in pairs, data parallel across them) "
            "trains the same weights as one process on the whole batch")
