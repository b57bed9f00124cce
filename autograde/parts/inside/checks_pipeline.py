"""The checks of the pipelines (notebook 22, part "inside DDP"), one function per graded item.

The learner's schedules run in real gloo process groups, called by
autograde/parts/inside/inprocess_model_parallel.py `stages`: gpipe and one_f_one_b on 2 and 3
stages with 1, 4 and 6 micro-batches, interleaved_1f1b on 2 and 3 ranks of 2 chunks each with 6
and 12. What a stage computed is in its report; in what order it ran its passes is read from the
trace, and judged by what must hold, never by one program's loops: every micro-batch's passes in
order, at most S - r micro-batches' activations held on stage r of S, and under 1F1B no backward
pass started that could only wait while a forward pass was free to run. An interleaved order's
bubble is counted from the traced orders (`idle_slots`: each pass of a chunk taking its share of a
stage's time, messages free) against plain 1F1B's. `bubble` calls the learner's bubble_fraction
and compares it with the same count made on the ideal orders.
"""
from __future__ import annotations

from typing import Any

from autograde.engine.run import Run
from autograde.engine.verdicts import function_calls, require, run_ok
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.inside.reports import StagesReport, StagesTask
from autograde.protocol import CallsTask, ProcessTrace, decode

STAGES_RUNS = RunKind("stages")
BUBBLE_RUNS = RunKind("bubble")

TOLERANCE = 1e-6
STAGE_COUNTS = (2, 3)
MICRO_BATCHES = (1, 4, 6)  # fewer than, more than and a multiple of the stages
INTERLEAVED_MICRO_BATCHES = (6, 12)  # multiples of every number of stages
CHUNKS = 2  # interleaved: chunks (virtual stages) per rank
SCHEDULE = {"gpipe": "gpipe", "1f1b": "one_f_one_b", "interleaved": "interleaved_1f1b"}
Pass = tuple[str, int, int]  # (kind "F" or "B", chunk, micro-batch)


def _micro(m: int) -> str:
    return f"{m} micro-batch{'' if m == 1 else 'es'}"


def one_f_one_b_order(stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    """1F1B's passes on `stage` of `stages` with m micro-batches: the one order in which the stage
    holds at most S - r micro-batches' activations and starts a backward pass only when it holds
    that many or has no forward pass left."""
    warmup = min(stages - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def interleaved_order(stages: int, stage: int, m: int, chunks: int = CHUNKS) -> list[Pass]:
    """Megatron-LM's interleaved 1F1B on rank `stage`: S micro-batches through one chunk, then the
    next chunk; a warm-up long enough for the later ranks' first chunks and one round per further chunk."""
    def which(k: int, backward: bool) -> tuple[int, int]:
        group, j = divmod(k, stages * chunks)
        chunk = j // stages
        return (chunks - 1 - chunk if backward else chunk), group * stages + j % stages

    total = chunks * m
    warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
    order = [("F", *which(k, False)) for k in range(warmup)]
    for k in range(total - warmup):
        order += [("F", *which(warmup + k, False)), ("B", *which(k, True))]
    return order + [("B", *which(k, True)) for k in range(total - warmup, total)]


def idle_slots(orders: dict[int, list[Pass]], chunks: int = 1, forward: float = 1.0, backward: float = 2.0) -> float:
    """The mean idle share of a step in which each rank runs its passes in `orders`, each as soon
    as the rank is free and its input has come (a forward pass's from the virtual stage before, a
    backward pass's gradient from the one after), a pass of one of `chunks` chunks taking 1/chunks of
    `forward` or `backward`, messages free. ValueError if the orders wait on each other for ever."""
    stages = len(orders)
    last = stages * chunks - 1
    todo = {r: list(o) for r, o in orders.items()}
    ended: dict[tuple[str, int, int], float] = {}
    free = {r: 0.0 for r in orders}
    busy = {r: 0.0 for r in orders}
    while any(todo.values()):
        moved = False
        for r in orders:
            if not todo[r]:
                continue
            kind, chunk, i = todo[r][0]
            k = chunk * stages + r  # the virtual stage
            need = (("F", k - 1, i) if k else None) if kind == "F" else (("F", k, i) if k == last else ("B", k + 1, i))
            if need is not None and need not in ended:
                continue
            took = (forward if kind == "F" else backward) / chunks
            ended[(kind, k, i)] = free[r] = max(free[r], ended[need] if need else 0.0) + took
            busy[r] += took
            todo[r].pop(0)
            moved = True
        if not moved:
            raise ValueError("the ranks' orders wait on each other")
    length = max(free.values())
    return sum(1 - b / length for b in busy.values()) / stages


def passes(trace: ProcessTrace) -> dict[int, list[dict[str, Any]]]:
    """Each case's "pass_start"/"pass_end" events on this stage, in order."""
    found: dict[int, list[dict[str, Any]]] = {}
    for e in trace.named("pass_start", "pass_end"):
        found.setdefault(e["case"], []).append(e)
    return found


def held_at_most(events: list[dict[str, Any]]) -> int:
    """The most micro-batches (of one chunk each) whose activations the stage held at once: forward
    passes done whose backward pass had not ended."""
    held = most = 0
    for e in events:
        if e["kind"] == "F" and e["ev"] == "pass_end":
            held += 1
            most = max(most, held)
        elif e["kind"] == "B" and e["ev"] == "pass_end":
            held -= 1
    return most


def pass_order(events: list[dict[str, Any]]) -> list[Pass]:
    return [(e["kind"], e.get("chunk", 0), e["micro"]) for e in events if e["ev"] == "pass_start"]


def _said(order: list[Pass], chunks: int = 1) -> str:
    """The passes as F0 B0 ...; with chunks, F0c1: micro-batch 0's forward pass through chunk 1."""
    return " ".join(f"{k}{i}" if chunks == 1 else f"{k}{i}c{c}" for k, c, i in order)


def _in_backward(trace: ProcessTrace) -> bool:
    """Whether the stage was in its backward passes: one had started, or every forward pass of the case
    it was running had (a backward pass is traced from when its gradient arrives, so one that waits for
    it shows only as the forward passes all done)."""
    cases = trace.named("pipeline_case")
    started = trace.named("pass_start")
    if started and started[-1]["kind"] == "B":
        return True
    if not cases:
        return False
    case = cases[-1]
    return sum(1 for e in started if e["case"] == case["case"] and e["kind"] == "F") >= case["micro_batches"]


def _judge_interleaved_stall(run: Run) -> None:
    """An interleaved pipeline stuck with the last rank's loss computed and its backward pass never
    started: every micro-batch's backward pass begins at the last chunk of the last rank."""
    for (n, rank), trace in sorted(run.by_group().items()):
        cases = trace.named("pipeline_case")
        if rank != n - 1 or not cases or not (waiting := trace.waiting_in()) or waiting.get("call") != "recv":
            continue
        order = pass_order(passes(trace).get(cases[-1]["case"], []))
        if ("F", CHUNKS - 1, 0) in order and ("B", CHUNKS - 1, 0) not in order:
            require(False, f"with {n} ranks, rank {rank} waited in dist.recv with micro-batch 0's loss computed "
                    f"through its chunk {CHUNKS - 1}, whose backward pass it never started, in: "
                    f"{_said(order, CHUNKS)}: no gradient comes to a rank before that backward pass has run",
                    "a micro-batch's backward pass starts at the loss and comes back through the virtual stages "
                    "last to first: in which order does a rank run its chunks' backward passes?")


def _judge_stall(run: Run, reports: list[StagesReport], chunks: int = 1) -> None:
    """A deadlocked pipeline, named by the stage that waits where it should not: a backward pass that
    waits on the stage before it, two neighbours that both wait in a blocking send, (interleaved) a
    backward pass started elsewhere than at the loss, or a stage that raised an error while the
    others waited for it."""
    if not (run.stalled or any(r.timed_out for r in run.results)):
        return
    if chunks > 1:
        _judge_interleaved_stall(run)
    for (n, rank), trace in sorted(run.by_group().items()):
        if chunks > 1:
            break  # an interleaved stage receives from the rank before it in its backward passes too
        waiting = trace.waiting_in()
        messages = trace.named("message")
        if waiting is None or not messages:
            continue
        last = messages[-1]
        if waiting.get("call") == "recv" and last.get("peer") == rank - 1 and _in_backward(trace):
            before = f"stage {rank - 1}" if rank else "rank -1 (no stage comes before the first)"
            require(False, f"with {n} stages, stage {rank} waited in a backward pass to receive from {before}, "
                    "which never sends it anything then", "in the backward pass a stage receives its output's "
                    "gradient from the next stage (rank + 1) and sends its input's to the one before")
    blocked = [rank for (n, rank), t in run.by_group().items() if (w := t.waiting_in()) and w.get("call") == "send"]
    if len(blocked) >= 2:
        require(False, f"stages {' and '.join(map(str, sorted(blocked)))} each waited in dist.send at once: a "
                "blocking send returns only when the other side receives, and each waited for the other",
                "send with dist.isend (wait for the requests before returning), or pair each send with the recv "
                "the other side makes at the same time (dist.batch_isend_irecv)")
    _judge_errors(reports, "; the other stages waited for it", chunks)
    run_ok(run, "every send needs the matching recv on the other stage, in an order that lets both happen")


def _judge_errors(reports: list[StagesReport], after: str = "", chunks: int = 1) -> None:
    """A stage's error, with its likeliest cause where the error is a None sent back: the gradient of an
    input that was received without asking for one."""
    for r in reports:
        for c in r.cases:
            if c.error is None:
                continue
            none_sent = r.rank > 0 and "NoneType" in c.error
            cause = (": the gradient it sent back was None, its received input never having been made to "
                     "require grad" if none_sent else "")
            require(False, f"with {r.world_size} stages and {_micro(c.micro_batches)}, stage {r.rank}: "
                    f"{c.error}{cause}{after}", "every stage after the first receives its input, which must ask "
                    "for a gradient (requires_grad_()) so that its gradient can be sent back" if none_sent else
                    "make the schedule work as the TODO's contract says, on any number of stages and micro-batches"
                    + ("; a chunk's backward pass of a micro-batch needs its forward pass done on this rank first: "
                       "how many chunk passes does the first backward pass of rank r wait for?" if chunks > 1 else ""))


def _stages_run(ws: Workspace, schedule: str) -> tuple[Run, list[StagesReport]]:
    sizes = [str(n) for n in STAGE_COUNTS]
    function = SCHEDULE[schedule]
    chunks = CHUNKS if schedule == "interleaved" else 1
    task = StagesTask(world_sizes=list(STAGE_COUNTS), schedule=function, chunks=chunks,
                      micro_batches=list(INTERLEAVED_MICRO_BATCHES if chunks > 1 else MICRO_BATCHES))
    run = ws.called(STAGES_RUNS, schedule, f"{function} on {' and '.join(sizes)} stages", task)
    reports = sorted((decode(StagesReport, r) for r in (run.report or {}).get("ranks", [])),
                     key=lambda r: (r.world_size, r.rank))
    _judge_stall(run, reports, chunks)
    require(reports, run.problem() or f"the {run.name} reported nothing", "the file must import without errors")
    for r in reports:
        require(r.error is None, f"with {r.world_size} stages, stage {r.rank}: {r.error}",
                f"the file must define {function}({'chunks' if chunks > 1 else 'stage'}, micro_batches, targets, loss_fn)")
    _judge_errors(reports, chunks=chunks)
    require({r.world_size for r in reports} == set(STAGE_COUNTS), f"the {run.name} ran only with "
            f"{sorted({r.world_size for r in reports})} stages", f"make {function} work with any number of stages")
    return run, reports


def _stage_passes(run: Run, reports: list[StagesReport]) -> list[tuple[StagesReport, int, int, list[dict[str, Any]]]]:
    """(report, case, micro-batches, the passes traced) of every stage and case; a stage that never ran
    its layers is named."""
    traces = run.by_group()
    found = []
    for r in reports:
        trace = traces.get((r.world_size, r.rank))
        traced = passes(trace) if trace is not None else {}
        for case, c in enumerate(r.cases):
            events = traced.get(case, [])
            require(events, f"with {r.world_size} stages and {_micro(c.micro_batches)}, stage {r.rank} never "
                    "called its stage", "call stage(x) once per micro-batch: that is the forward pass through this "
                    "process's layers")
            found.append((r, case, c.micro_batches, events))
    return found


def _judge_gradients(reports: list[StagesReport], hint: str = "") -> None:
    for r in reports:
        for c in r.cases:
            where = f"with {r.world_size} stages and {_micro(c.micro_batches)}, stage {r.rank}"
            require(c.gradient <= TOLERANCE, f"{where}: the gradients are {c.gradient:.1e} from the unsplit model's "
                    f"on the whole batch (at most {TOLERANCE:g}){hint}", "each micro-batch's loss counts 1/M of the "
                    "whole batch's mean loss, and every micro-batch's gradient adds into .grad")


def _judge_each_once(where: str, order: list[Pass], m: int, chunks: int = 1) -> None:
    """Every chunk's forward passes, and its backward passes, take the micro-batches once each, in order."""
    for c in range(chunks):
        forwards = [i for k, j, i in order if k == "F" and j == c]
        backwards = [i for k, j, i in order if k == "B" and j == c]
        through = f" through chunk {c}" if chunks > 1 else ""
        require(forwards == list(range(m)), f"{where} ran the forward passes{through} of micro-batches "
                f"{forwards}, in: {_said(order, chunks)}", "call each stage (chunk) once per micro-batch, the "
                "micro-batches in order")
        require(backwards == list(range(m)), f"{where} ran the backward passes{through} of micro-batches "
                f"{backwards}, in: {_said(order, chunks)}", "run each micro-batch's backward pass once, the "
                "micro-batches in the order of their forward passes")


def check_gpipe(ws: Workspace) -> str:
    """gpipe on 2 and 3 stages with 1, 4 and 6 micro-batches: every stage's gradients equal the unsplit
    model's on the whole batch, to 1e-6; from the trace, every stage ran every micro-batch's forward
    pass, in order, before any backward pass, and each backward pass once. A deadlock is named by
    where the stages waited."""
    run, reports = _stages_run(ws, "gpipe")
    for r, case, m, events in _stage_passes(run, reports):
        order = pass_order(events)
        where = f"with {r.world_size} stages and {_micro(m)}, stage {r.rank}"
        forwards = [i for k, _, i in order if k == "F"]
        backwards = sorted(i for k, _, i in order if k == "B")
        require(forwards == list(range(m)) and backwards == list(range(m)), f"{where} ran {_said(order)}",
                "call the stage once per micro-batch, in order, and run each micro-batch's backward pass once")
        require(order[:m] == [("F", 0, i) for i in range(m)], f"{where} ran {_said(order)}: a backward pass "
                "before every forward pass was done", "GPipe: every micro-batch's forward pass, then the backward passes")
    _judge_gradients(reports)
    return "gpipe gives the unsplit model's gradients on 2 and 3 stages with 1, 4 and 6 micro-batches"


def _judge_1f1b_order(where: str, order: list[Pass], stages: int, stage: int, m: int) -> None:
    """1F1B's constraints, the first broken named: at most S - r micro-batches' activations held (a
    forward pass started while holding that many), and no backward pass started while the stage
    held fewer and a forward pass was left (it waits for a gradient that cannot have come yet)."""
    bound = min(stages - stage, m)
    require(m <= bound or any(k == "B" for k, _, _ in order[:m]), f"{where} ran all {m} forward passes before its "
            f"first backward pass, holding {m} micro-batches' activations: that is GPipe's order; stage {stage} of "
            f"{stages} may hold at most {stages - stage}", "start a backward pass as soon as the stage holds as many "
            "micro-batches as its bound allows")
    done_f = done_b = 0
    for kind, _, i in order:
        held = done_f - done_b
        if kind == "F":
            require(held < bound, f"{where} started F{i} while holding {held} micro-batches' activations, in: "
                    f"{_said(order)}; stage {stage} of {stages} may hold at most {stages - stage} at once",
                    "once a stage holds as many micro-batches as its bound, its next pass is a backward pass")
            done_f += 1
        else:
            require(held >= bound or done_f == m, f"{where} started B{i} while holding the activations of only "
                    f"{_micro(held)}, with F{done_f} still to run, in: {_said(order)}: its gradient can come back only "
                    "after the later stages' passes, so the stage waits, idle, where it could have run a forward pass",
                    f"stage {stage} of {stages} keeps running forward passes while it holds fewer than "
                    f"{stages - stage} micro-batches' activations")
            done_b += 1


def check_1f1b(ws: Workspace) -> str:
    """one_f_one_b on 2 and 3 stages with 1, 4 and 6 micro-batches: every stage's gradients equal
    the unsplit model's, to 1e-6; from the trace, judged by 1F1B's constraints, not by one program's
    loops: the forward passes and the backward passes each take every micro-batch once, in order;
    stage r of S never holds more than S - r micro-batches' activations (a forward pass started while
    holding that many); and no stage starts a backward pass while it holds fewer with a forward pass
    left (waiting, idle, for a gradient that cannot have come). All forward passes first is named as
    GPipe's order. Only 1F1B's order meets all three."""
    run, reports = _stages_run(ws, "1f1b")
    for r, case, m, events in _stage_passes(run, reports):
        order = pass_order(events)
        where = f"with {r.world_size} stages and {_micro(m)}, stage {r.rank}"
        _judge_each_once(where, order, m)
        _judge_1f1b_order(where, order, r.world_size, r.rank, m)
    _judge_gradients(reports)
    return ("one_f_one_b gives the unsplit model's gradients on 2 and 3 stages with 1, 4 and 6 micro-batches, stage "
            "r holding at most S - r micro-batches' activations and never idle while a forward pass was free to run")


def check_interleaved(ws: Workspace) -> str:
    """interleaved_1f1b on 2 and 3 ranks of 2 chunks each (virtual stages r and r + S of 2S), with 6
    and 12 micro-batches: every chunk's gradients equal the unsplit model's, to 1e-6; from the trace,
    each chunk's forward and backward passes take every micro-batch once, in order; no rank held the
    activations of every micro-batch through both its chunks at once (GPipe's memory); and the bubble
    of the traced orders (`idle_slots`, each pass of a chunk taking half a stage's, messages free)
    smaller than plain 1F1B's with the same S and M."""
    run, reports = _stages_run(ws, "interleaved")
    orders: dict[tuple[int, int], dict[int, list[Pass]]] = {}
    for r, case, m, events in _stage_passes(run, reports):
        order = pass_order(events)
        where = f"with {r.world_size} ranks and {_micro(m)}, rank {r.rank}"
        _judge_each_once(where, order, m, CHUNKS)
        held = held_at_most(events)
        require(held < CHUNKS * m, f"{where} held the activations of all {m} micro-batches through its {CHUNKS} "
                "chunks at once: that is GPipe's memory", "start the backward passes before every forward pass is "
                "done, as in 1F1B")
        orders.setdefault((r.world_size, m), {})[r.rank] = order
    hint = ("; messages between two ranks now carry several chunks' passes: does each recv get the message it "
            "expects?")
    _judge_gradients(reports, hint)
    found = []
    for (n, m), by_rank in sorted(orders.items()):
        try:
            mine = idle_slots(by_rank, CHUNKS)
        except ValueError:
            require(False, f"with {n} ranks and {_micro(m)}, the ranks' orders wait on each other", "a pass can "
                    "run only once its input has come from the virtual stage before it")
        plain = idle_slots({s: [(k, 0, i) for k, i in one_f_one_b_order(n, s, m)] for s in range(n)})
        require(mine < plain - 1e-9, f"with {n} ranks and {_micro(m)}, your order leaves each rank idle {mine:.1%} "
                f"of the step (every pass of a chunk taking half a stage's time, messages free), plain 1F1B's "
                f"{plain:.1%}: interleaving has not shrunk the bubble", "a micro-batch comes back to a rank after S "
                "chunk passes: run a rank's second chunk on the first micro-batches before the first chunk has taken "
                "them all")
        found.append(f"{mine:.0%} against {plain:.0%} with S = {n}, M = {m}")
    return f"interleaved_1f1b gives the unsplit model's gradients, its bubble {', '.join(found)} for plain 1F1B"


# bubble: the learner's prediction against the count on the ideal orders
BUBBLE_CASES = ((2, 1, 1), (2, 4, 1), (3, 6, 1), (4, 16, 1), (8, 32, 1), (2, 4, 2), (3, 6, 2), (4, 8, 2), (4, 8, 4))


def ideal_bubble(stages: int, m: int, chunks: int = 1) -> float:
    """The idle share of a step run in 1F1B's order (interleaved with `chunks` > 1), counted by idle_slots."""
    if chunks == 1:
        return idle_slots({s: [(k, 0, i) for k, i in one_f_one_b_order(stages, s, m)] for s in range(stages)})
    return idle_slots({s: interleaved_order(stages, s, m, chunks) for s in range(stages)}, chunks)


def check_bubble(ws: Workspace) -> str:
    """bubble_fraction(S, M) and bubble_fraction(S, M, v) for 9 shapes (2 to 8 stages, 1 to 32
    micro-batches, 1, 2 and 4 chunks), called in a process of its own, each within 1e-6 of the idle
    share counted on 1F1B's and interleaved 1F1B's orders (`ideal_bubble`: equal passes, free messages)."""
    calls = [["bubble_fraction", [s, m] if v == 1 else [s, m, v]] for s, m, v in BUBBLE_CASES]
    run = ws.called(BUBBLE_RUNS, "calls", "calls of bubble_fraction", CallsTask(script=str(ws.script), calls=calls))
    for (s, m, v), call in zip(BUBBLE_CASES, function_calls(run)):
        said = f"bubble_fraction({', '.join(map(str, call.args))})"
        require(call.error is None, f"{said} raised {call.error}", "return the idle share of a stage's step, a number")
        value = call.value[0] if isinstance(call.value, list) and len(call.value) == 1 else call.value
        require(isinstance(value, (int, float)) and not isinstance(value, bool), f"{said} returned {call.value!r}",
                "return a number: the idle share of the step, between 0 and 1")
        want = ideal_bubble(s, m, v)
        require(abs(value - want) <= 1e-6, f"{said} returned {value:.4g}; counted on {'1F1B' if v == 1 else 'interleaved 1F1B'}"
                f"'s passes (each chunk's pass of equal length, messages free), a stage is idle {want:.4g} of the step",
                "the share of the whole step, from the first pass's start to the last pass's end: how many pass-lengths "
                "does a stage wait while the pipeline fills and drains, and how does a chunk's pass length change that?")
    return f"bubble_fraction predicts the idle share of the step for all {len(BUBBLE_CASES)} shapes"
