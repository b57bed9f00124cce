"""The checks of the part "inside DDP" (notebooks 20-), one function per graded item.

The three hand-made DDPs of exercises/ddp_by_hand.py are tried by autograde/inprocess/runner.py
(`ddp`): on 2 and then 3 processes, every rank wraps the course's awkward model (a tied weight,
a frozen layer, a layer the forward pass never uses, a buffer the forward pass adds; each rank
initialised differently), trains 3
SGD steps on its share of each batch, and compares its weights with one process trained on the
whole batches and with DistributedDataParallel trained alike. The trace says which collectives
each step made, how large, and whether they started during backward() or only in
finish_gradient_synchronization(); and, right after the wrapper was made, which parameters and
buffers still held the rank's own values rather than rank 0's ("wrapped" events), with the buckets
each correct rule makes, by parameter name.

The sharded optimizer (ZeRO stage 1) of exercises/sharded_optimizer.py is tried by autograde/parts/inside/inprocess.py
`zero` on 2 and 3 processes under DistributedDataParallel, against plain AdamW, and each rank's
optimizer state is weighed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autograde.engine.run import Run
from autograde.engine.verdicts import require, run_ok
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.inside.reports import ZERO_STEPS, DdpReport, DdpTask, ZeroReport, ZeroTask
from autograde.protocol import COLLECTIVES, Event, ProcessTrace, decode

# The kinds of run these checks read (an item's `runs`, items.py)
DDP_RUNS = RunKind("ddp")
ZERO_RUNS = RunKind("zero")


DDP_WORLD_SIZES = (2, 3)
TOLERANCE = 1e-6    # the same sums in another order differ by about 1e-7 here; a missing division by 0.1
# Buckets of the awkward model's 5 trainable tensors (2,624 floats): 1 MB holds all of them; 6 KB
# makes 2 buckets; 5 KB makes 3, whose sizes tell reverse order (1088, 1024, 512) from forward order.
BUCKET_SIZES = (1.0, 6 / 1024, 5 / 1024)
WITH_GRADIENT, TRAINABLE = 3, 5  # tensors that get a gradient each step (the tied one once); that train


def _require_no_hang(run: Run, collectives: str) -> None:
    """A run that hung is judged by where each rank waited (the deadlock report): what else it left,
    no report or requests half made, is only the symptom."""
    if run.stalled or any(r.timed_out for r in run.results):
        run_ok(run, f"every rank must make the same collectives in the same order, whatever its rank: {collectives}")


def _ddp_run(ws: Workspace, wrapper: str, buckets: tuple[float, ...] = ()) -> Run:
    """The wrapper's run, judged first for a hang: before its waits, its weights or its collectives."""
    sizes = [str(n) for n in DDP_WORLD_SIZES]
    run = ws.called(DDP_RUNS, wrapper, f"{wrapper} on {' and '.join(sizes)} processes",
                    DdpTask(world_sizes=list(DDP_WORLD_SIZES), wrapper=wrapper, bucket_sizes=list(buckets)))
    _require_no_hang(run, "one all_reduce for every gradient (or bucket)")
    return run


def _reports(run: Run) -> list[DdpReport]:
    ranks: list[dict[str, Any]] = (run.report or {}).get("ranks", [])
    return sorted((decode(DdpReport, r) for r in ranks), key=lambda r: (r.world_size, r.rank))


@dataclass
class _Step:
    case: int
    during: list[Event] = field(default_factory=list)  # collectives entered during backward()
    after: list[Event] = field(default_factory=list)   # ... in finish_gradient_synchronization()
    waits: int = 0                                     # requests the learner's code waited for


def _steps(trace: ProcessTrace) -> list[_Step]:
    """Each training step of the trace, in order."""
    found: list[_Step] = []
    inside, syncing = False, False
    for e in trace.events:
        if e["ev"] == "case_start":
            inside, syncing = True, False
            found.append(_Step(e["case"]))
        elif e["ev"] == "case_end":
            inside = False
        elif e["ev"] == "sync_start":
            syncing = True
        elif inside and e["ev"] == "enter" and e.get("call") in COLLECTIVES:
            (found[-1].after if syncing else found[-1].during).append(e)
        elif inside and e["ev"] == "enter" and e.get("call") == "wait":
            found[-1].waits += 1
    return found


def _require_waited(step: _Step, where: str) -> None:
    """Every asynchronous all_reduce of the step waited for before finish_gradient_synchronization() returned."""
    launched = sum(bool(e.get("async_op")) for e in step.during + step.after)
    require(step.waits >= launched, f"{where} started {launched} asynchronous all-reduces in a step and waited for "
            f"{step.waits} of them before finish_gradient_synchronization() returned: optimizer.step() may read "
            "gradients still being summed", "call handle.wait() on every handle in finish_gradient_synchronization()")


def _broadcast_before_training(trace: ProcessTrace) -> bool:
    for e in trace.events:
        if e["ev"] == "case_start":
            return False
        if e["ev"] == "enter" and e.get("call") in COLLECTIVES:
            return True
    return False


def _wrapped(trace: ProcessTrace | None) -> dict[int, Event]:
    """The "wrapped" event of each case of the trace: what the wrapper's broadcast left as the rank's own."""
    return {e.get("case", 0): e for e in trace.named("wrapped")} if trace is not None else {}


def _require_synchronised(where: str, what: str, wrapped: Event | None) -> None:
    """Right after the wrapper was made, every parameter and buffer holds rank 0's values."""
    if wrapped is None:
        return
    differs = wrapped.get("differs") or {}
    parameters, buffers = differs.get("parameters") or [], differs.get("buffers") or []
    require(not parameters, f"{where}: after {what} was made, parameter{'s' if len(parameters) > 1 else ''} "
            f"{', '.join(parameters)} still held this rank's own initial values, not rank 0's",
            "broadcast every parameter from rank 0 in __init__ (the frozen and unused ones too), and the buffers")
    require(not buffers, f"{where}: after {what} was made, the model's buffer{'s' if len(buffers) > 1 else ''} "
            f"{', '.join(buffers)} still held this rank's own initial values, not rank 0's: the parameters were "
            "broadcast, the buffers were not, and the forward pass uses them, so each rank trained another model",
            "a buffer is not a parameter (module.parameters() misses it): broadcast rank 0's buffers too")


def _require_every_bucket_sent(run: Run) -> None:
    """A bucket that was never all-reduced in a step, while the others were (commonly the one holding
    the unused layer, which never fills up), named with the parameters it held. Judged before the
    weights, which that bucket leaves each rank's own. A wrapper that sent nothing at all is judged by
    its weights (it has not begun)."""
    for (world_size, rank), trace in sorted(run.by_group().items()):
        steps = _steps(trace)
        if not any(step.during or step.after for step in steps):
            continue
        buckets = {case: e.get("buckets") or [] for case, e in _wrapped(trace).items()}
        for step in steps:
            got = [e.get("numel") or 0 for e in step.during + step.after]
            missing: list[list[Any]] | None = None
            for plan in buckets.get(step.case, []):
                left, unsent = list(got), []
                for bucket in plan:
                    numel = sum(n for _, n in bucket)
                    if numel in left:
                        left.remove(numel)
                    else:
                        unsent.append(bucket)
                if not left and not unsent:  # a plan matched: every bucket sent
                    missing = None
                    break
                if not left and (missing is None or len(unsent) < len(missing)):
                    missing = unsent
            if missing:
                bucket = missing[0]
                names = [name for name, _ in bucket]
                require(False, f"with buckets of {BUCKET_SIZES[step.case] * 1024:g} KB, rank {rank} of {world_size}: "
                        f"the bucket of {sum(n for _, n in bucket)} elements holding {len(names)} "
                        f"parameter{'s' if len(names) > 1 else ''} ({', '.join(names)}) was never all-reduced: its "
                        "all-reduce never happened in a step, so the gradients in it stayed this rank's own, "
                        "not the average" + (f" ({len(missing) - 1} more bucket{'s' if len(missing) > 2 else ''} "
                                             "likewise)" if len(missing) > 1 else ""),
                        "a bucket holding a parameter that gets no gradient (the unused layer's) never fills up: "
                        "finish_gradient_synchronization() must send every bucket not sent yet, a missing "
                        "gradient counting as zeros")


def _require_all_waited(run: Run) -> None:
    """Judged before the weights: a request not waited for makes the weights a race, wrong in one run
    and right in the next, while the missing wait is there every time."""
    for (world_size, rank), trace in sorted(run.by_group().items()):
        for step in _steps(trace):
            _require_waited(step, f"rank {rank} of {world_size}")


def _what(wrapper: str, case: Any) -> str:
    return f"{wrapper}({'model' if case.bucket_size_mb is None else f'model, {case.bucket_size_mb * 1024:g} KB'})"


def _judge_weights(run: Run, wrapper: str) -> list[tuple[DdpReport, ProcessTrace]]:
    """The weights of every rank and case equal both references; returns each report with its trace.
    First, on every rank, what went wrong before training: an error, no broadcast at all, a
    parameter or buffer left the rank's own (rank 0's weights then differ too, but the cause is
    another rank's, and is named)."""
    reports = _reports(run)
    require(reports, run.problem() or f"the {run.name} reported nothing", "the file must import without errors")
    traces = run.by_group()
    for report in reports:
        where = f"with {report.world_size} processes, rank {report.rank}"
        require(report.error is None, f"{where}: {report.error}", f"make {wrapper} work")
        trace = traces.get((report.world_size, report.rank))
        for case in report.cases:
            what = _what(wrapper, case)
            require(case.error is None, f"{where}, {what}: {case.error}", f"make {wrapper} work on any model: a "
                    "frozen or unused parameter has no gradient (its grad is None), and takes no hook if frozen")
            if case.from_single > TOLERANCE and trace is not None and not _broadcast_before_training(trace):
                require(False, f"{where}: {what} trained other weights than one process on the whole batch "
                        f"(by {case.from_single:.1e}); no collective ran before the first step, so each rank "
                        "kept its own initial weights", "broadcast rank 0's parameters and buffers in __init__")
    for report in reports:
        for case in report.cases:
            _require_synchronised(f"with {report.world_size} processes, rank {report.rank}", _what(wrapper, case),
                                  _wrapped(traces.get((report.world_size, report.rank))).get(case.case))
    paired = []
    for report in reports:
        where = f"with {report.world_size} processes, rank {report.rank}"
        trace = traces.get((report.world_size, report.rank))
        for case in report.cases:
            require(case.from_single <= TOLERANCE and case.from_ddp <= TOLERANCE,
                    f"{where}: after 3 steps, {_what(wrapper, case)} left weights {case.from_single:.1e} from one "
                    f"process trained on the whole batch, and {case.from_ddp:.1e} from DistributedDataParallel (at "
                    f"most {TOLERANCE:g})", "every gradient must be the average over the processes: all-reduce (a "
                    "sum), then divide by the world size, all before optimizer.step()")
        if report.world_size == DDP_WORLD_SIZES[-1] and trace is not None:
            paired.append((report, trace))
    require(len({r.world_size for r in reports}) == len(DDP_WORLD_SIZES), f"the {run.name} ran only with "
            f"{sorted({r.world_size for r in reports})} processes", f"make {wrapper} work")
    return paired


def check_naive_ddp(ws: Workspace) -> str:
    """NaiveDDP on 2 and 3 processes: the same weights as one process on the whole batches and as
    DistributedDataParallel, to 1e-6, after 3 steps on a model with a tied weight, a frozen layer, an
    unused one and a buffer (each rank initialised differently: the wrapper broadcasts rank 0's
    parameters and buffers, and a rank left with its own is named before the weights); each step
    makes one collective per parameter that has a gradient (3 here; 5 when the unused layer's are
    sent as zeros is accepted too)."""
    run = _ddp_run(ws, "NaiveDDP")
    for report, trace in _judge_weights(run, "NaiveDDP"):
        for step in _steps(trace):
            made = len(step.during) + len(step.after)
            require(WITH_GRADIENT <= made <= TRAINABLE, f"rank {report.rank} of {report.world_size} made {made} "
                    f"collectives in a step; the model has {WITH_GRADIENT} tensors with a gradient",
                    "one all_reduce per parameter's gradient")
    return (f"NaiveDDP trains the same weights as one process and as DDP on 2 and 3 processes, with one "
            f"all_reduce per gradient ({WITH_GRADIENT} a step)")


def check_overlap_ddp(ws: Workspace) -> str:
    """OverlapDDP: NaiveDDP's weights and count, and every gradient's all_reduce started during
    backward() (from a hook, as soon as that gradient was ready), none left for
    finish_gradient_synchronization() to start."""
    run = _ddp_run(ws, "OverlapDDP")
    _require_all_waited(run)
    for report, trace in _judge_weights(run, "OverlapDDP"):
        for step in _steps(trace):
            where = f"rank {report.rank} of {report.world_size}"
            made = len(step.during) + len(step.after)
            require(WITH_GRADIENT <= made <= TRAINABLE, f"{where} made {made} collectives in a step; the model has "
                    f"{WITH_GRADIENT} tensors with a gradient", "one asynchronous all_reduce per parameter's gradient")
            overlapped = [e for e in step.during if e.get("async_op")]
            require(len(overlapped) >= WITH_GRADIENT, f"{where} started {len(overlapped)} of its {made} all-reduces "
                    "asynchronously during backward(): "
                    + ("they waited there, one by one" if len(step.during) >= WITH_GRADIENT else
                       "the rest only in finish_gradient_synchronization()") + ": no overlap",
                    "launch each all_reduce(..., async_op=True) from a register_post_accumulate_grad_hook, "
                    "and only wait for them in finish_gradient_synchronization()")
    return (f"OverlapDDP trains the same weights as DDP on 2 and 3 processes; its {WITH_GRADIENT} all-reduces "
            "a step all start during backward()")


def check_bucketed_ddp(ws: Workspace) -> str:
    """BucketedDDP with buckets of 1 MB, 6 KB and 5 KB (1, 2 and 3 buckets for the course's model):
    the same weights as one process and as DDP, to 1e-6, on 2 and 3 processes; each step makes one
    all_reduce per bucket, of the sizes the exercise's rule gives (parameters in reverse order, a new
    bucket when the next would overflow it; DDP's own reducer's rule, a bucket closed once it reaches
    the size, and a megabyte of 10**6 bytes pass too: autograde/parts/inside/inprocess.py, bucket_plans), and every bucket whose
    gradients all arrive starts its all_reduce during backward(). A bucket never all-reduced while
    the others were (the unused layer's, never filled) is named, with its parameters, before the
    weights it leaves wrong."""
    run = _ddp_run(ws, "BucketedDDP", BUCKET_SIZES)
    _require_all_waited(run)
    _require_every_bucket_sent(run)
    for report, trace in _judge_weights(run, "BucketedDDP"):
        plans = {c.case: c.bucket_plans for c in report.cases}
        for step in _steps(trace):
            got = [e.get("numel") or 0 for e in step.during + step.after]
            want = next((plan for plan in plans[step.case] if sorted(plan) == sorted(got)), plans[step.case][0])
            where = f"with buckets of {BUCKET_SIZES[step.case] * 1024:g} KB, rank {report.rank} of {report.world_size}"
            require(sorted(got) == sorted(want),
                    f"{where} all-reduced tensors of {got} elements in a step; buckets of at most that size hold "
                    f"{want} for this model (parameters in reverse order: the unused layer's, then hidden's, then "
                    "the embedding's)", "fill buckets in reversed(parameters()) order, start a new one when the "
                    "next parameter would overflow it, and all-reduce each bucket as one flat tensor")
            overlapped = [e for e in step.during if e.get("async_op")]
            require(len(overlapped) >= len(want) - 1, f"{where} started {len(overlapped)} of its {len(want)} "
                    "bucket all-reduces asynchronously during backward(); only the bucket with the unused layer "
                    "may wait for finish_gradient_synchronization()", "start a bucket's all_reduce "
                    "(async_op=True) from the hook of the last of its gradients to arrive")
    return ("BucketedDDP trains the same weights as DDP on 2 and 3 processes with 1, 2 and 3 buckets, one "
            "all_reduce per bucket, started during backward()")


# zero: ZeRO stage 1, a sharded optimizer ---------------------------------------------------------

ZERO_WORLD_SIZES = (2, 3)
STATE_SLACK = 1.02  # Adam's step counts, a few bytes per parameter, sit where their parameter does


def _zero_reports(ws: Workspace) -> list[ZeroReport]:
    sizes = [str(n) for n in ZERO_WORLD_SIZES]
    run = ws.called(ZERO_RUNS, "-".join(sizes), f"ShardedOptimizer on {' and '.join(sizes)} processes",
                    ZeroTask(world_sizes=list(ZERO_WORLD_SIZES)))
    reports = sorted((decode(ZeroReport, r) for r in (run.report or {}).get("ranks", [])),
                     key=lambda r: (r.world_size, r.rank))
    _require_no_hang(run, "after the step, a broadcast of every parameter from its owner")
    require(reports, run.problem() or f"the {run.name} reported nothing", "the file must import without errors")
    for r in reports:
        require(r.error is None, f"with {r.world_size} processes, rank {r.rank}: {r.error}",
                "ShardedOptimizer(params, optimizer_cls, **kwargs) must work with model.parameters() (a "
                "generator), torch.optim.AdamW and its options; step() must update the model")
    require({r.world_size for r in reports} == set(ZERO_WORLD_SIZES), f"the {run.name} ran only with "
            f"{sorted({r.world_size for r in reports})} processes", "make ShardedOptimizer work with any world size")
    return reports


def _judge_zero_weights(group: list[ZeroReport]) -> None:
    """Every rank's every parameter equals plain AdamW's. The first fault named is the root one: a
    parameter that moved on no rank (dropped from every shard, or its update overwritten) makes
    every other one drift too; then one that moved on some ranks only (not sent to the others);
    then one updated wrongly."""
    n = group[0].world_size

    def what(k: int) -> str:
        return f"with {n} processes, parameter {group[0].params[k].name} ({group[0].params[k].numel} elements)"

    indices = range(len(group[0].params))
    require(any(p.changed for r in group for p in r.params), f"with {n} processes, step() changed no parameter on "
            "any rank", "each rank's optimizer_cls(...) must update its own shard, and every parameter then go "
            "from its owner to the others")
    for k in indices:
        moved = [r.rank for r in group if r.params[k].changed]
        require(bool(moved), f"{what(k)} never changed on any rank: no shard held it, or its owner's update was "
                "overwritten", "every parameter must belong to exactly one rank's shard (the last ones too), and "
                "go from that owner to the others: dist.broadcast(p.data, src=owner)")
        stale = [r.rank for r in group if not r.params[k].changed]
        require(not stale, f"{what(k)} changed on rank{'s' if len(moved) > 1 else ''} {', '.join(map(str, moved))} "
                f"only; rank{'s' if len(stale) > 1 else ''} {', '.join(map(str, stale))} kept the initial value",
                "after its owner's optimizer step, send each parameter to every rank: "
                "dist.broadcast(p.data, src=owner)")
    for k in indices:
        worst = max(group, key=lambda r: r.params[k].from_reference)
        require(worst.params[k].from_reference <= TOLERANCE, f"{what(k)} is {worst.params[k].from_reference:.1e} "
                f"from plain AdamW's after {ZERO_STEPS} steps on rank {worst.rank} (at most {TOLERANCE:g})",
                "its owner must update it with optimizer_cls(..., **kwargs), all the options passed on, and "
                "send it from the owner (src=owner, not 0)")


def check_zero(ws: Workspace) -> str:
    """ShardedOptimizer on 2 and 3 processes, under DistributedDataParallel: after 3 AdamW steps
    (lr, weight decay and betas passed as options), every rank's every parameter equals plain
    AdamW's to 1e-6; and each rank holds at most 1/N of plain AdamW's optimizer state plus the
    state of the largest parameter (a shard of whole parameters cannot always be split evenly),
    counted in every torch.optim.Optimizer alive in the rank's process, wherever the learner keeps it."""
    reports = _zero_reports(ws)
    shares: dict[int, list[float]] = {}
    for n in ZERO_WORLD_SIZES:
        group = [r for r in reports if r.world_size == n]
        _judge_zero_weights(group)
        for r in group:
            require(r.state_bytes > 0, f"with {n} processes, rank {r.rank} kept no optimizer state the checker "
                    "could find", "keep each shard's state in the optimizer that optimizer_cls(...) makes "
                    "(self.optimizer = optimizer_cls(my_params, **kwargs))")
            share = r.state_bytes / r.full_state_bytes
            limit = (r.full_state_bytes / n + r.largest_state_bytes) * STATE_SLACK
            require(r.state_bytes <= limit, f"with {n} processes, rank {r.rank} held {share:.0%} of plain AdamW's "
                    f"optimizer state ({r.state_bytes / 1024:.1f} of {r.full_state_bytes / 1024:.1f} KB); a shard "
                    f"is about {1 / n:.0%} (at most {limit / r.full_state_bytes:.0%} here, whole parameters)",
                    "make optimizer_cls over this rank's own parameters only, and balance the shards by "
                    "number of elements, not by number of parameters")
        shares[n] = [r.state_bytes / r.full_state_bytes for r in group]
    held = "; ".join(f"on {n}, each rank held {min(s):.0%}-{max(s):.0%}" for n, s in shares.items())
    return (f"ShardedOptimizer trains the same weights as plain AdamW on 2 and 3 processes; optimizer state: {held}")
