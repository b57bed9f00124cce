"""What a check says: a verdict (`Result`), and the failure a check raises (`Failed`).

A check function (a part's checks*.py) returns what it observed when the item is right, and
raises `Failed` (through `require`) when it is wrong. It never names its own item: the judge
(autograde/grading/judge.py) knows which item it is checking and turns `what` into the hint
"see `# TODO Step N`: what".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, TypeVar

from autograde.engine.run import Run
from autograde.protocol import Call, CallsReport, decode


class RankReport(Protocol):
    """What every task's per-rank report holds (a part's reports.py)."""

    world_size: int
    rank: int
    error: str | None


R = TypeVar("R", bound=RankReport)


@dataclass
class Result:
    """The verdict on one item: passed (True, False, or None where it cannot be checked here)."""

    step: str
    passed: bool | None
    observed: str
    hint: str | None = None
    earlier: str | None = None  # an earlier item that fails too: fix that one first
    checker_error: bool = False  # the checker, not the script, is at fault: never kept, never blamed on the learner
    measured: dict[str, Any] | None = None  # a passing check's numbers, for a table (the capstone's leaderboard)

    @property
    def status(self) -> str:
        return "ERROR" if self.checker_error else {True: "pass", False: "FAIL", None: "n/a"}[self.passed]


@dataclass(frozen=True)
class Measured:
    """What a check observed, with the numbers behind it: a check that returns one instead of its text
    passes as well, and its verdict keeps `facts` (numbers and short texts, as JSON takes them)."""

    text: str
    facts: dict[str, Any]


class Failed(Exception):
    """A check's verdict that the item is wrong: what was seen, and what to do.

    `what` becomes a hint that points at the item's TODO (or at `step`'s, for a helper that
    several checks share but that is about one step); with `todo=False` it is the whole hint.
    """

    def __init__(self, observed: str, what: str, inconclusive: bool = False, step: str | None = None,
                 todo: bool = True) -> None:
        super().__init__(observed)
        self.observed, self.what, self.step, self.todo = observed, what, step, todo
        self.inconclusive = inconclusive  # the run stopped before it showed this item at work

    def hint(self, label: Callable[[str], str], item: str) -> str:
        """The hint, pointing at the TODO of `item` (or of this failure's own `step`), whose marker's
        words `label` gives: the judge, which knows the items, says where the learner should look."""
        return f"see `# TODO {label(self.step or item)}`: {self.what}" if self.todo else self.what


class NotHere(Exception):
    """The item cannot be judged on this machine (it needs what is not here, such as SLURM): its
    verdict is "n/a" with this reason, never a failure."""


def require(condition: object, observed: str, what: str, inconclusive: bool = False) -> None:
    """Fail with `observed` and the hint `what` unless `condition` holds."""
    if not condition:
        raise Failed(observed, what, inconclusive)


def evidence(condition: object, run: Run, missing: str) -> None:
    """Fail as inconclusive when a run stopped before it showed what the item needs."""
    require(condition, run.problem() or missing, "the earlier steps must work first", inconclusive=True)


def run_ok(run: Run, what: str) -> None:
    """Fail when a run that the item needs crashed or deadlocked."""
    problem = run.problem()
    require(problem is None, problem or "", what)


def rank_reports(run: Run, report_type: type[R], hint: str) -> list[R]:
    """Each rank's report of a task's run (as `report_type`), by world size and rank, judged
    first for a deadlock, then for a run that reported nothing, then for what the learner's file
    raised, named with its rank where there are several."""
    reports = sorted((decode(report_type, r) for r in (run.report or {}).get("ranks", [])),
                     key=lambda r: (r.world_size, r.rank))
    if run.stalled or any(r.timed_out for r in run.results):
        run_ok(run, "every rank must make the same collectives in the same order")
    require(reports, run.problem() or f"the {run.name} reported nothing", "the file must import without errors")
    for r in reports:
        require(r.error is None, f"{f'with {r.world_size} processes, rank {r.rank}: ' if r.world_size > 1 else ''}"
                f"{r.error}", hint)
    return reports


def function_calls(run: Run) -> list[Call]:
    """What each call of a CallsTask's run gave, in order (the learner's plain functions, called in a
    process of their own), judged first for a run that reported nothing, then for a file that does not
    import."""
    reports = (run.report or {}).get("ranks", [])
    require(reports, run.problem() or f"the {run.name} reported nothing", "the file must import without errors")
    report = decode(CallsReport, reports[0])
    require(report.error is None, f"importing the file failed: {report.error}", "the file must import without errors")
    return report.calls


def returned_number(value: Any) -> float | None:
    """A learner's function's JSON return value as a number (a tensor or array of one element comes
    as a one-element list), or None where it is not one (a bool is not)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
