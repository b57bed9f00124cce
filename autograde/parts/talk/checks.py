"""The checks of the part "how processes talk" (exercises/*.py), one function per exercise.

pi's launches the learner's file as a learner would (`python exercises/compute_pi.py
--world-size 3`: the script starts its own processes), several times, and judges what the
processes did and printed. The others have the learner's data, function or class used in real
process groups by autograde/inprocess/runner.py, and judge what each rank reported and the
messages traced. Like the lab's checks, they read behaviour, never names or wording.
"""
from __future__ import annotations

import functools
import math
import re
from collections import Counter
from typing import Any, TypeVar

from autograde.engine import output
from autograde.engine.run import PEER_LOST, Run
from autograde.engine.verdicts import RankReport, require, run_ok
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.talk.reports import (
    COLLECTIVES_WORLD_SIZE,
    RING_SIZES,
    SCENARIOS,
    CollectivesReport,
    CollectivesTask,
    RingReport,
    RingTask,
    SamplerCase,
    SamplerReport,
    SamplerTask,
)
from autograde.protocol import COLLECTIVES, Event, ProcessTrace, decode
from autograde.settings import COUNT_WORK

# The kinds of run these checks read (an item's `runs`, items.py)
COLLECTIVES_RUNS = RunKind("collectives")
PI_RUNS = RunKind("pi")
SAMPLER_RUNS = RunKind("sampler")
RING_RUNS = RunKind("ring")


Report = TypeVar("Report", bound=RankReport)  # any of the part's report types, with no list of them to keep


def _reports(run: Run, kind: type[Report]) -> list[Report]:
    """Each rank's report of a run of autograde/inprocess/runner.py, by world size and rank. Each
    check judges the ranks' errors itself, with a hint of its own."""
    ranks: list[dict[str, Any]] = (run.report or {}).get("ranks", [])
    return sorted((decode(kind, r) for r in ranks), key=lambda r: (r.world_size, r.rank))


# predict_collectives ---------------------------------------------------------------------

PREDICTED = ("broadcast", "all_reduce", "all_reduce_max", "all_gather", "scatter", "reduce_scatter")


def _collectives_run(ws: Workspace) -> Run:
    return ws.called(COLLECTIVES_RUNS, str(COLLECTIVES_WORLD_SIZE), f"collectives on {COLLECTIVES_WORLD_SIZE} processes",
                     CollectivesTask(world_sizes=[COLLECTIVES_WORLD_SIZE]))


def _numbers(value: object) -> list[float] | None:
    """A rank's predicted buffer as numbers (any nesting of lists, tuples, tensors), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, list):
        parts = [_numbers(v) for v in value]
        return None if any(p is None for p in parts) else [x for p in parts for x in p or []]
    return None


def check_predict(ws: Workspace) -> str:
    """The file's PREDICTIONS of each rank's buffer after six collectives (broadcast, all_reduce
    with sum and max, all_gather, scatter, reduce_scatter) match what the calls give, made for
    real on 4 processes (to 1e-6; lists, tuples, tensors, ints or floats alike)."""
    run = _collectives_run(ws)
    reports = _reports(run, CollectivesReport)
    for report in reports:
        require(report.error is None, f"PREDICTIONS could not be read: {report.error}",
                "PREDICTIONS must be a dict of lists of numbers, one list per rank")
    run_ok(run, "the checker's own collectives failed: run the check again")
    require(len(reports) == COLLECTIVES_WORLD_SIZE and reports[0].predictions is not None,
            f"the {run.name}: {len(reports)} of {COLLECTIVES_WORLD_SIZE} processes reported", "run the check again")
    predictions = reports[0].predictions or {}
    missing = [name for name in PREDICTED if predictions.get(name) is None]
    require(not missing, f"no prediction yet for {', '.join(missing)}",
            "replace each None with a list of four lists: what ranks 0, 1, 2 and 3 hold afterwards")
    wrong = []
    for name in PREDICTED:
        guess = predictions[name]
        ranks = guess if isinstance(guess, list) and len(guess) == COLLECTIVES_WORLD_SIZE else None
        require(ranks is not None, f"the prediction for {name} is {guess!r}, not one list per rank (4 of them)",
                "write four lists: [rank 0's, rank 1's, rank 2's, rank 3's]")
        assert ranks is not None
        for report in reports:
            actual = report.buffers[name][1]
            predicted = _numbers(ranks[report.rank])
            if predicted is None or len(predicted) != len(actual) or any(abs(a - b) > 1e-6 for a, b in zip(actual, predicted)):
                wrong.append(f"{name}: after {SCENARIOS[name]}, rank {report.rank} holds {_short(actual)}, "
                             f"you predicted {ranks[report.rank]!r}")
                break
    require(not wrong, f"{len(PREDICTED) - len(wrong)} of {len(PREDICTED)} predictions right; " + "; ".join(wrong),
            "compare with the pictures in notebook 10 (they are drawn from the same calls), then correct them")
    return f"all {len(PREDICTED)} predictions match the collectives made on {COLLECTIVES_WORLD_SIZE} processes"


def _short(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


# compute_pi -----------------------------------------------------------------------------

PI_INTERVALS = 300_001  # does not divide by 2, 3 or 4: a share rule that drops the remainder shows
PI_WORLD_SIZES = (1, 2, 3, 4)
PI_ERROR = 1e-9  # the midpoint rule's own error at this many intervals is about 1e-12
WORK_SLACK = 1.5  # a rank may do this much more than its 1/N of one process's work (uneven shares, set-up)


def _pi_run(ws: Workspace, world_size: int) -> Run:
    return ws.launched(PI_RUNS, str(world_size), f"run with --world-size {world_size}",
                       ["--world-size", str(world_size), "--intervals", str(PI_INTERVALS)],
                       env={COUNT_WORK: "1"})


def _printed_pi(run: Run) -> output.Number | None:
    """The number closest to pi among what the run printed (any wording), if one is within 0.1."""
    near = [n for n in output.numbers(run.output) if abs(n.value - math.pi) < 0.1 and not n.percent]
    return min(near, key=lambda n: abs(n.value - math.pi)) if near else None


def check_pi(ws: Workspace) -> str:
    """Launched with 1, 2, 3 and 4 processes over a number of rectangles that none of them
    divides: each run prints pi to within 1e-9 (the midpoint rule's own error is far smaller),
    the value does not depend on the number of processes beyond rounding, and each process
    computes only its share: with N processes, every rank does at most 1.5/N of the work the
    single process does (work: elements that PyTorch operations produce, plus lines of the
    file that run). Work the tracer cannot see (numpy, say) leaves the share unjudged, and the
    verdict says so."""
    found: dict[int, float] = {}
    work: dict[int, dict[int, int]] = {}
    ws.at_once(*(functools.partial(_pi_run, ws, n) for n in PI_WORLD_SIZES))
    for n in PI_WORLD_SIZES:
        run = _pi_run(ws, n)
        run_ok(run, "the script must run to the end with any --world-size")
        number = _printed_pi(run)
        require(number is not None, f"the {run.name} printed no number near pi: {output_tail(run)}",
                "every rank must hold the sum of all the ranks' parts before printing (a collective does "
                "that): one rank's part is only a piece of pi")
        assert number is not None
        require(number.decimals >= 10, f"the {run.name} printed pi as {number.value} ({number.decimals} decimals)",
                "print pi with at least 10 decimals (f\"{pi:.12f}\"), so that its accuracy shows")
        require(abs(number.value - math.pi) <= PI_ERROR,
                f"the {run.name} printed {number.value:.12f}, {abs(number.value - math.pi):.1e} away from pi",
                "every rank must add its part into the total (an all_reduce), and the shares must cover "
                "every rectangle exactly once")
        found[n] = number.value
        work[n] = {rank: e["amount"] for rank, t in run.ranks().items() for e in t.named("work")}
        require(len(work[n]) == n, f"the {run.name}: {len(work[n])} of {n} processes reached destroy_process_group",
                "end every process with dist.destroy_process_group()")
    spread = max(found.values()) - min(found.values())
    require(spread <= 1e-11, f"pi depends on the number of processes: {found}",
            "the shares must add up to the same sum whatever their number")
    result = f"pi = {found[4]:.12f} with 1-4 processes (error {abs(found[4] - math.pi):.0e})"
    whole = work[1][0]
    if whole < PI_INTERVALS:  # less than one unit per rectangle: the sum was not done where the tracer looks
        return (f"{result}; the shares were not judged: the sum was computed outside PyTorch and Python "
                "code (numpy?), where the checker cannot count work")
    for n in PI_WORLD_SIZES[1:]:
        for rank, amount in sorted(work[n].items()):
            require(amount <= WORK_SLACK * whole / n,
                    f"with {n} processes, rank {rank} did {amount / whole:.0%} of the work one process does alone "
                    f"(its share is {1 / n:.0%})", "each rank must evaluate only its own share of the rectangles")
    return f"{result}; with 4, each rank did {max(work[4].values()) / whole:.0%} or less of one process's work"


# ring_allreduce -------------------------------------------------------------------------

RING_WORLD_SIZES = (2, 3, 4)
RING_TOLERANCE = 1e-5  # a sum in another order differs by rounding (about 1e-7 here); a max not at all


def _ring_run(ws: Workspace) -> Run:
    sizes = [str(n) for n in RING_WORLD_SIZES]
    return ws.called(RING_RUNS, "-".join(sizes), f"ring with {', '.join(sizes)} processes",
                     RingTask(world_sizes=list(RING_WORLD_SIZES), sizes=list(RING_SIZES)))


def _case_events(trace: ProcessTrace, case: int) -> list[Event]:
    """What one rank did during one call of ring_all_reduce."""
    inside, events = False, []
    for e in trace.events:
        if e["ev"] in ("case_start", "case_end") and e["case"] == case:
            inside = e["ev"] == "case_start"
        elif inside:
            events.append(e)
    return events


def _require_returned(report: RingReport) -> None:
    require(report.error is None, f"with {report.world_size} processes, ring_all_reduce raised on rank "
            f"{report.rank}: {report.error}", "the error names the line of your ring where it happened")


def check_ring(ws: Workspace) -> str:
    """ring_all_reduce(tensor, op), called on every rank of 2, 3 and 4 processes for tensors of 12,
    1001 and 65,537 floats (some sizes do not divide by the number of processes) and for sum and
    max, gives every rank what dist.all_reduce gives (to rounding), with point-to-point messages
    only: no collective inside it, and on every rank 2(N-1) sends to one neighbour and 2(N-1)
    receives from one neighbour, each message at most 1/N of the tensor (plus N elements, for
    uneven chunks). A ring that deadlocks is stopped, and each rank's waiting call is named."""
    run = _ring_run(ws)
    reports = _reports(run, RingReport)
    # A rank whose neighbour died raises a lost connection: a consequence, said after the causes, of
    # which a message of the wrong size (gloo aborts the rank that receives it) is one
    lost = [r for r in reports if r.error is not None and PEER_LOST.search(r.error)]
    for report in [r for r in reports if r not in lost]:
        _require_returned(report)
    mismatch = SIZE_MISMATCH.search(run.output)
    require(mismatch is None, "a rank received a message of another size than the buffer it posted "
            f"({mismatch['sizes'] if mismatch else ''} bytes), and gloo aborted the process",
            "in each round, the buffer a rank receives into must be the size of the chunk its neighbour "
            "sends it in that round: sender and receiver must agree on which chunk travels")
    for report in lost:
        _require_returned(report)
    run_ok(run, "every rank must post its receive while its neighbour sends: send with dist.isend (or "
           "receive first on every other rank), then recv, then wait for the send")
    traces = run.by_group()
    for n in RING_WORLD_SIZES:
        group = [r for r in reports if r.world_size == n]  # by rank
        require(len(group) == n, f"with {n} processes, {len(group)} returned from ring_all_reduce",
                "every rank must return from ring_all_reduce")
        for case in group[0].cases:
            what = f"ring_all_reduce of {case.numel:,} floats with {case.op!r} on {n} processes"
            during = {rank: _case_events(traces[n, rank], case.case) for rank in range(n)}
            for rank, events in during.items():
                used = sorted({e["call"] for e in events if e["ev"] == "enter" and e["call"] in COLLECTIVES})
                require(not used, f"{what}: rank {rank} called dist.{used[0] if used else ''}()",
                        "build the ring from dist.send/recv (or isend/irecv) alone: a collective does the "
                        "work the exercise asks you to do")
            for report in group:
                error = report.cases[case.case].error
                require(error <= RING_TOLERANCE,
                        f"{what}: rank {report.rank}'s result differs from dist.all_reduce's by up to {error:.3g}",
                        _ring_hint(case.op))
            for rank, events in during.items():
                _require_ring_messages(what, rank, events, n, case.numel)
    largest = max(r.cases[-1].seconds for r in reports if r.world_size == RING_WORLD_SIZES[-1])
    return (f"ring_all_reduce agrees with dist.all_reduce on 2-4 processes for {', '.join(f'{s:,}' for s in RING_SIZES)} "
            f"floats (sum and max), with 2(N-1) messages of about 1/N per rank ({RING_SIZES[-1]:,} floats on 4 "
            f"processes: {largest * 1e3:.1f} ms)")


# gloo's abort when a message is longer than the buffer posted for it: "... op.nbytes. 2004 vs 2000.
# Received data size doesn't match expected size."
SIZE_MISMATCH = re.compile(r"(?P<sizes>\d+ vs \d+)\. Received data size doesn't match expected size")


def _ring_hint(op: str) -> str:
    if op == "max":
        return "combine the incoming chunk with the op you were given: torch.maximum for 'max', addition for 'sum'"
    return ("reduce-scatter first (N-1 rounds, adding the chunk that arrives), then all-gather (N-1 rounds, "
            "copying it), and cover every element: chunks of a size that does not divide still cover the tensor")


def _require_ring_messages(what: str, rank: int, events: list[Event], n: int, numel: int) -> None:
    messages = [e for e in events if e["ev"] == "message"]
    sends = [e for e in messages if e["op"] in ("send", "isend")]
    receives = [e for e in messages if e["op"] in ("recv", "irecv")]
    rounds = 2 * (n - 1)
    require(len(sends) == rounds and len(receives) == rounds,
            f"{what}: rank {rank} sent {len(sends)} and received {len(receives)} messages (a ring: {rounds} each)",
            "each of the 2(N-1) rounds sends one chunk to one neighbour and receives one from the other")
    peers = {e["peer"] for e in sends}, {e["peer"] for e in receives}
    require(len(peers[0]) == 1 and len(peers[1]) == 1,
            f"{what}: rank {rank} sent to ranks {sorted(peers[0], key=str)} and received from ranks "
            f"{sorted(peers[1], key=str)}", "in a ring every rank talks only to its two neighbours: it always sends "
            "to the same one and always receives from the other")
    biggest = max((e["numel"] or 0) for e in messages)
    require(biggest <= numel / n + n,
            f"{what}: rank {rank} sent or received {biggest:,} floats in one message ({biggest / numel:.0%} of "
            f"the tensor; a chunk is 1/{n})", "send one chunk (1/N of the tensor) per round, not the whole tensor")


# shard_sampler --------------------------------------------------------------------------

SAMPLER_WORLD_SIZES = (1, 2, 3, 4)
SAMPLER_SIZES = (12, 10, 13)  # 12 divides by 1-4; 10 by 1 and 2; 13 by 1 only
SAMPLER_SEEDS = (0, 5)
SAMPLER_EPOCHS = 3


def _sampler_run(ws: Workspace) -> Run:
    sizes = [str(n) for n in SAMPLER_WORLD_SIZES]
    return ws.called(SAMPLER_RUNS, "-".join(sizes), f"sampler on {', '.join(sizes)} processes",
                     SamplerTask(world_sizes=list(SAMPLER_WORLD_SIZES), sizes=list(SAMPLER_SIZES),
                                 seeds=list(SAMPLER_SEEDS), epochs=SAMPLER_EPOCHS))


def _options(case: SamplerCase) -> str:
    flags = [f"shuffle={case.shuffle}", f"drop_last={case.drop_last}"] + ([f"seed={case.seed}"] if case.shuffle else [])
    return f"{case.size} items, {', '.join(flags)}"


def check_sampler(ws: Workspace) -> str:
    """ShardSampler(range(size), num_replicas=N, rank=r, shuffle, seed, drop_last), built on
    every rank of 1, 2, 3 and 4 processes, for data sets of 12, 10 and 13 items, with and
    without shuffle and drop_last, for two seeds and three epochs: every rank gets len(sampler)
    indices, the same number on every rank; together they are every index exactly once, plus at
    most N-1 repeated ones when padding (or minus the tail with drop_last: N * (size // N)
    distinct indices); iterating again gives the same indices; the order is new each epoch
    and each seed when shuffling, and the same each epoch when not. Odd ranks build their
    samplers in the reverse order: shards drawn from a global random state, not from the seed
    and epoch, disagree between ranks and fail."""
    run = _sampler_run(ws)
    reports = _reports(run, SamplerReport)
    for report in reports:
        require(report.error is None, f"with {report.world_size} processes, the sampler raised on rank "
                f"{report.rank}: {report.error}", "the error names the line of your sampler where it happened")
    run_ok(run, "build and iterate the sampler without any collective: each rank computes its shard alone")
    orders: dict[tuple[int, int, bool, bool, int, int], tuple[tuple[int, ...], ...]] = {}
    for n in SAMPLER_WORLD_SIZES:
        group = [r for r in reports if r.world_size == n]  # by rank
        require(len(group) == n, f"with {n} processes, {len(group)} built their samplers", "every rank must finish")
        by_case: dict[tuple[int, bool, bool, int, int], list[SamplerCase]] = {}
        for report in group:
            for case in report.cases:
                by_case.setdefault((case.size, case.shuffle, case.drop_last, case.seed, case.epoch), []).append(case)
        for key, shards in sorted(by_case.items()):
            _require_partition(n, shards)
            orders[(n, *key)] = tuple(tuple(c.indices) for c in shards)
    for (n, size, shuffle, drop_last, seed, epoch), order in sorted(orders.items()):
        what = f"with {_processes(n)} and {_options_text(size, shuffle, drop_last, seed)}"
        if epoch + 1 < SAMPLER_EPOCHS:
            following = orders[(n, size, shuffle, drop_last, seed, epoch + 1)]
            if shuffle:
                require(following != order, f"{what}, epochs {epoch} and {epoch + 1} had the same order: {list(order)}",
                        "the shuffle must depend on the seed and the epoch (the same on every rank): set_epoch must "
                        "change the order")
            else:
                require(following == order, f"{what}, without shuffle the order changed from epoch {epoch} "
                        f"({list(order)}) to {epoch + 1} ({list(following)})", "without shuffle, keep 0, 1, 2, ...")
        if shuffle and seed != SAMPLER_SEEDS[0]:
            other = orders[(n, size, shuffle, drop_last, SAMPLER_SEEDS[0], epoch)]
            require(other != order or n * len(order[0]) < 3, f"{what}, seeds {SAMPLER_SEEDS[0]} and {seed} gave "
                    f"the same order in epoch {epoch}", "the shuffle's generator must be seeded with the seed (plus the epoch)")
    return (f"on 1-4 processes and {', '.join(map(str, SAMPLER_SIZES))} items, with and without shuffle and drop_last, "
            "the shards are equal, disjoint and cover the data set (padded or dropped as documented), and the "
            "order changes with the epoch and the seed")


def _processes(n: int) -> str:
    return f"{n} process{'es' if n > 1 else ''}"


def _options_text(size: int, shuffle: bool, drop_last: bool, seed: int) -> str:
    return _options(SamplerCase(size, shuffle, drop_last, seed, 0, [], 0, True))


def _require_partition(n: int, shards: list[SamplerCase]) -> None:
    """The N ranks' shards of one case split the data set as documented."""
    first = shards[0]
    what = f"with {_processes(n)}, {_options(first)}, epoch {first.epoch}"
    hint_len = ("len() and the indices must agree, on every rank the same number: with drop_last the tail "
                "that does not divide by N is left out, without it the order is padded up to a multiple of N")
    for rank, case in enumerate(shards):
        require(case.again, f"{what}: rank {rank}'s sampler gave other indices when iterated again",
                "build the order there and then from a generator seeded from the seed and the epoch, not "
                "from a shared random state")
        require(case.length == len(case.indices), f"{what}: rank {rank}'s sampler gave {len(case.indices)} "
                f"indices, but its len() is {case.length}", hint_len)
        require(all(0 <= i < case.size for i in case.indices),
                f"{what}: rank {rank} got indices outside 0..{case.size - 1}: {case.indices}",
                "the indices are the data set's positions, 0 to size - 1")
    lengths = [len(c.indices) for c in shards]
    expected = first.size // n if first.drop_last else -(-first.size // n)
    require(set(lengths) == {expected}, f"{what}: the ranks got {lengths} indices (each should get {expected})",
            "every rank must get the same number: " + ("drop the tail" if first.drop_last else
                                                       "pad by repeating indices from the start"))
    counts = Counter(i for c in shards for i in c.indices)
    shown = {f"rank {r}": c.indices for r, c in enumerate(shards)}
    if first.drop_last:
        repeated = sorted(i for i, k in counts.items() if k > 1)
        require(not repeated, f"{what}: index {repeated[0] if repeated else ''} went to more than one rank: {shown}",
                "the shards must be disjoint: every rank takes its own positions of the same order")
    else:
        missing = sorted(set(range(first.size)) - set(counts))
        require(not missing, f"{what}: no rank got index {missing[0] if missing else ''}: {shown}",
                "together the shards must cover every index; every rank must shuffle the same way (same seed and epoch)")
        twice = [i for i, k in counts.items() if k > 1]
        require(max(counts.values()) <= 2 and sum(counts.values()) - len(counts) < n,
                f"{what}: indices {sorted(twice)} went to more than one rank: {shown}",
                "the shards must be disjoint, apart from at most N-1 repeated for padding")


def output_tail(run: Run, limit: int = 200) -> str:
    text = " ".join(run.output.split())
    return repr(text[-limit:]) if text else "(nothing)"
