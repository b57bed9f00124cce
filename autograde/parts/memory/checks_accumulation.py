"""The check of gradient accumulation (exercises/accumulation.py, notebook 37).

It is tried by inprocess_accumulation.py `accumulation` on 2 processes: the learner's BucketedDDP and train_step,
3 steps with 1 micro-batch a step, then 3 with 4, against DistributedDataParallel's steps on the whole batch. The
trace says which reducing calls each step made, how much each reduced, and after which micro-batch's forward
pass each began.
"""
from __future__ import annotations

from dataclasses import dataclass

from autograde.engine.verdicts import rank_reports, require
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.memory.checks_zero import steps_of
from autograde.parts.memory.reports import (
    ACCUMULATION_BUCKET_MB,
    ACCUMULATION_MICRO_STEPS,
    ACCUMULATION_WORLD_SIZE,
    AccumulationCase,
    AccumulationReport,
    AccumulationTask,
)
from autograde.protocol import REDUCING, ProcessTrace

ACCUMULATION_RUNS = RunKind("accumulation")
TOLERANCE = 1e-6  # the same sums in another order differ by about 1e-8 here

VARIANT_MISTAKES = {
    "summed": ("the micro-batches' gradients were summed: the step was k times too large",
               "divide each micro-batch's loss by k (the micro-batches' means then add up to the whole batch's mean)"),
    "processes_summed": ("the gradients were summed over the processes, not averaged",
                         "after the all-reduce, divide by the number of processes (finish_gradient_synchronization)"),
    "last_divided": ("only the last micro-batch's gradient was left when the optimizer stepped (divided by k)",
                     "zero the gradients once per step, before the first micro-batch, not before each one"),
    "last": ("only the last micro-batch's gradient was left when the optimizer stepped",
             "zero the gradients once per step, before the first micro-batch, not before each one"),
}


@dataclass
class Sent:
    """What one step's reducing calls were: how many, how much they reduced, and after which forward each began."""

    calls: int
    elements: int
    micro: list[int]  # for each call, the micro-batches whose forward had begun (1: during the first's backward ...)


def sent(trace: ProcessTrace) -> dict[int, Sent]:
    """Each case's reducing calls, by case (the steps as checks_zero.steps_of reads them: no backward_end here)."""
    found: dict[int, Sent] = {}
    for step in steps_of(trace):
        forwards, s = 0, Sent(0, 0, [])
        for e in step.during:
            if e["ev"] == "micro_forward":
                forwards += 1
            elif e["ev"] == "enter" and e.get("call") in REDUCING:
                s.calls += 1
                s.elements += int(e.get("numel") or 0)
                s.micro.append(forwards)
        found[step.case] = s
    return found


def _weights(case: AccumulationCase, rank: int) -> None:
    where = f"rank {rank}, step {case.step} with {case.micro_steps} micro-batch{'es' if case.micro_steps > 1 else ''}"
    require(case.error is None, f"{where}: {case.error}", "train_step(model, optimizer, micro_batches) steps once on "
            "the micro-batches, with your BucketedDDP as model")
    require(case.moved, f"{where}: train_step moved no weight", "train_step steps the optimizer once, after the "
            "micro-batches' backward passes")
    if case.from_whole <= TOLERANCE:
        return
    said = f"{where}: the weights are {case.from_whole:.1e} from one step of DDP on the whole batch"
    if case.matches in VARIANT_MISTAKES:
        mistake, fix = VARIANT_MISTAKES[case.matches]
        require(False, f"{said}: {mistake}", fix)
    if case.micro_steps == 1:
        require(False, f"{said}, without any accumulation", "with one micro-batch, train_step is one step of SGD on "
                "it with your part-5 BucketedDDP: copy the class as it passed its check (its contract is in the TODO)")
    require(False, said, "the gradients when the optimizer steps must be the whole batch's: every micro-batch's, "
            "averaged over the micro-batches and the processes")


def check_accumulation(ws: Workspace) -> str:
    """Your BucketedDDP and train_step on 2 processes, an MLP whose 102 KB of gradients go in buckets of 20 KB: 3
    steps with 1 micro-batch a step, then 3 with 4. After each step the weights equal DDP's after as many steps on
    the whole batch (to 1e-6); with 4 micro-batches each step makes as many all-reduces as with 1 (each bucket
    once: more than one a step), reducing each gradient element once, all of them begun after the last
    micro-batch's forward pass. Gradients summed over the micro-batches, or only the last one's kept, are named."""
    run = ws.called(ACCUMULATION_RUNS, str(ACCUMULATION_WORLD_SIZE), "accumulation on 2 processes",
                    AccumulationTask(world_sizes=[ACCUMULATION_WORLD_SIZE]))
    reports = rank_reports(run, AccumulationReport, "the file must import, and BucketedDDP, no_sync and train_step "
                           "work as the TODOs' contract says")
    traces = run.ranks()
    one, k = ACCUMULATION_MICRO_STEPS
    kb = f"{ACCUMULATION_BUCKET_MB * 1024:g} KB"
    for r in reports:
        require(r.cases, f"rank {r.rank}: BucketedDDP(model, bucket_size_mb) did not make a model", "BucketedDDP's "
                "constructor takes the module and the bucket size in MB")
        steps = sent(traces[r.rank])
        single = [c for c in r.cases if c.micro_steps == one]
        for case in single:
            _weights(case, r.rank)
        base = steps[single[0].case]
        require(base.calls > 1, f"rank {r.rank}: with 1 micro-batch a step, your BucketedDDP made {base.calls} "
                f"all-reduce{'s' if base.calls != 1 else ''} a step; buckets of {kb} cut this model's {r.tensors} "
                "gradients into several", "part 5's BucketedDDP sends a bucket as soon as its gradients are in")
        for case in r.cases:
            if case.micro_steps != k:
                continue
            require(case.error is None, f"rank {r.rank}, step {case.step} with {k} micro-batches: {case.error}",
                    "train_step(model, optimizer, micro_batches) steps once on the micro-batches")
            s = steps[case.case]
            where = f"rank {r.rank}, step {case.step} with {k} micro-batches"
            early = [m for m in s.micro if m < k]
            listed = ", ".join(map(str, sorted(set(early))))
            require(not early, f"{where}: {len(early)} of its {s.calls} all-reduces began before the last micro-batch's "
                    f"forward pass (during micro-batch {listed} of {k})", "run every micro-batch's backward but the last "
                    "inside model.no_sync(), and let no_sync() stop your hooks from sending")
            require(s.calls == base.calls, f"{where}: {s.calls} all-reduces, against {base.calls} with 1 micro-batch "
                    "a step", "each bucket is all-reduced once a step, whatever k")
            require(s.elements == r.elements, f"{where}: the all-reduces reduced {s.elements} elements; the model's "
                    f"gradients have {r.elements}", "each gradient element is sent once a step")
            _weights(case, r.rank)
    return (f"{k} micro-batches a step give the weights of one step on the whole batch, with {base.calls} all-reduces "
            f"a step as with 1 (buckets of {kb}), all begun in the last micro-batch's backward pass")
