"""The step checks from Python: for notebook cells and nbgrader grade cells."""
from __future__ import annotations

import contextlib
import functools
import html
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Sequence

from autograde import settings
from autograde.engine import processes
from autograde.engine.verdicts import Result
from autograde.engine.workspace import RunKind, Unmade, Workspace
from autograde.grading import cache, judge, registry, turns

Step = str | int | float


class CheckFailed(AssertionError):
    """A step's verdict that fails the cell: the step, what was observed and the hint.

    In a notebook (and in nbgrader's feedback) it shows as those lines alone: the checker's own
    frames and paths say nothing to a learner. It is an AssertionError, so grading fails the cell.
    """

    def __init__(self, result: Result) -> None:
        self.result = result
        super().__init__(f"{registry.label(result.step)}: {result.observed}" + (f". Hint: {result.hint}" if result.hint else ""))

    def lines(self, width: int = 100) -> list[str]:
        """The verdict as short lines: the step and its status, what was seen, where to look."""
        r = self.result
        body = [f"{registry.label(r.step)} {r.status}"]
        body += textwrap.wrap(r.observed, width, initial_indent="  observed: ", subsequent_indent=" " * 12)
        if r.hint:
            body += textwrap.wrap(r.hint, width, initial_indent="  hint: ", subsequent_indent=" " * 8)
        return body

    def _render_traceback_(self) -> list[str]:  # IPython shows these lines instead of a traceback
        first, *rest = self.lines()
        return [f"\x1b[1;31m{first}\x1b[0m", *rest]


def normalise(step: Step) -> str:
    """'6.5', 6.5, 4, '4' and 'Optional' as the names the checks use."""
    text = str(step).strip().lower()
    if text.endswith(".0"):
        text = text[:-2]
    if text not in registry.IDS:
        raise ValueError(f"unknown step {step!r}: choose from {', '.join(registry.IDS)}")
    return text


def _in_notebook() -> bool:
    return "ipykernel" in sys.modules


def _say(text: str) -> None:
    """Progress while runs are made: in the cell's output in a notebook, on stderr elsewhere
    (so that `check --json` prints JSON alone on stdout)."""
    print(text, file=sys.stdout if _in_notebook() else sys.stderr, flush=True)


def _judge(path: Path, wanted: list[str], procs_per_node: int, nodes: int, gpus: int,
           say: Callable[[str], None] | None, record: Path | None = None) -> tuple[dict[str, Result], dict[str, str]]:
    """One set of runs: the verdicts on `wanted` and on every step those runs also answer, and
    the runs that ended for a reason outside the script (by name, with the reason). The runs are
    recorded in `record` when none ended for such a reason."""
    known: dict[str, Result] = {}
    kinds = registry.kinds_of(wanted)
    if kinds:
        processes.warm_environment()  # the warm-start server imports torch while the workspace is made
    with Workspace(path, procs_per_node, nodes, gpus=gpus, say=say) as ws:
        make_fixed_runs(ws, kinds)
        for step in wanted:
            known[step] = judge.check(ws, step)
        file = registry.item(wanted[0]).file
        for step in registry.answered_by(set(ws.made())):
            if step not in known and registry.item(step).file == file:
                with ws.only_made(), contextlib.suppress(Unmade):  # no run more for an item not asked
                    known[step] = judge.check(ws, step)
        outside = outside_causes(ws)
        if record is not None and not outside:
            try:
                ws.save(record)
            except OSError:
                pass  # only a notebook's picture would have to make the runs again
    return known, outside


def make_fixed_runs(ws: Workspace, kinds: set[RunKind]) -> None:
    """The fixed runs (`RunKind.make`) that checks reading `kinds` will read, made two at a time
    where they are independent: first those that need no other, then those that do (the lab's
    setup run beside its workers run, then its program run beside its two-node run). A check
    alone makes its runs one after another; `check --all`, or a grade, reads them all."""
    fixed = {k for k in kinds if k.make} | {need for k in kinds if k.make for need in k.needs}
    for wave in ([k for k in fixed if not k.needs], [k for k in fixed if k.needs]):
        ws.at_once(*(functools.partial(k.make, ws) for k in sorted(wave, key=lambda k: k.name) if k.make))


def outside_causes(ws: Workspace) -> dict[str, str]:
    """The workspace's runs that ended for a reason outside the script, by name, with the reason."""
    return {name: f"the {run.name}: {cause}" for name, run in ws.made().items()
            if (cause := run.outside_cause()) is not None}


def blame_outside(verdicts: dict[str, Result], outside: dict[str, str]) -> dict[str, Result]:
    """The verdicts as a learner gets them once a run spoilt from outside (`outside_causes`) has been
    made again and spoilt again: a failure that rests on such a run blames the checker, not the script."""
    blamed = dict(verdicts)
    for step, result in verdicts.items():
        affected = {name: cause for name, cause in outside.items() if registry.reads_run(step, name)}
        if result.checker_error and outside:  # its runs were not made: an earlier one was spoilt
            affected = affected or outside
        if affected and result.passed is False:
            blamed[step] = _checker_error(result, affected)
    return blamed


def _checker_error(result: Result, spoilt: dict[str, str]) -> Result:
    """A failing verdict that a run outside the script's control produced twice: the checker's problem."""
    causes = "; ".join(spoilt.values())
    return Result(result.step, False, f"the checker could not judge this step: {causes}, twice. This is "
                         "the checker's problem, not your script's",
                         "run the check again with fresh=True (or --fresh); if it happens again, please report "
                         "it to the course's maintainers with this message", checker_error=True)


def check_steps(steps: Sequence[Step] | None = None, script: str | Path | None = None,
                procs_per_node: int = 2, nodes: int = 2, fresh: bool = False,
                quiet: bool = False) -> list[Result]:
    """Check the given items (the lab's steps if None) of `script` (by default, the course's file
    the items read: fashion_mnist.py, exercises/compute_pi.py, ...); one verdict per item, in
    the registry's order.

    Verdicts already known for this exact file and layout are reused (see autograde/grading/cache.py),
    unless `fresh` (or $DDP_LAB_FRESH=1); the runs made for the steps asked also answer, and keep,
    every other step that reads only those runs. A run that ends for a reason outside the script
    (a signal nobody in it sent, the time limit, a port taken by another program) is made again
    once; a step it fails twice gets an ERROR verdict that blames the checker, and is not kept.
    """
    asked = {normalise(s) for s in steps} if steps else set(registry.FIRST_ITEMS)
    wanted = [s for s in registry.IDS if s in asked]
    files = sorted({registry.item(s).file for s in wanted})
    if len(files) > 1:  # items of different files: each file's own runs
        if script is not None:
            raise ValueError(f"{', '.join(wanted)} read different files ({', '.join(files)}): check one file at a time")
        found = {r.step: r for file in files for r in check_steps([s for s in wanted if registry.item(s).file == file],
                                                                  None, procs_per_node, nodes, fresh, quiet)}
        return [found[s] for s in wanted]
    path = settings.learner_script(script, default=files[0])
    if not path.is_file():
        raise FileNotFoundError(f"no script at {path}: pass script='path/to/fashion_mnist.py'")
    mark, cut = cache.begin(path, wanted)
    try:
        if cut and not quiet:
            _say(cut_short(cut))
        return _check_file(path, wanted, procs_per_node, nodes, fresh, quiet)
    finally:
        cache.end(mark)


def cut_short(marks: list[dict[str, object]]) -> str:
    """What a learner is told of their earlier checks of this file that never gave a verdict."""
    said = []
    for mark in marks:
        asked = mark.get("steps")
        steps = ", ".join(registry.label(str(s)) for s in (asked if isinstance(asked, list) else [])
                          if str(s) in registry.BY_ID)
        at = time.strftime("%H:%M:%S", time.localtime(float(str(mark.get("at", 0)))))
        said.append(f"your check of {steps or 'this file'} started at {at}")
    return (f"({'; '.join(said)} was cut short before its verdict: its kernel or server stopped (killed, or "
            "the server or its node was lost). Nothing of it was kept; checking again now.)")


def _check_file(path: Path, wanted: list[str], procs_per_node: int, nodes: int, fresh: bool,
                quiet: bool) -> list[Result]:
    fresh = fresh or os.environ.get(settings.FRESH, "") not in ("", "0")
    gpus = processes.gpu_count()
    layout = devices_key(gpus)
    known = {} if fresh else cache.load(path, procs_per_node, nodes, layout)
    if all(step in known for step in wanted):
        return [known[step] for step in wanted]
    say = None if quiet else _say
    record = cache.runs_file(path, procs_per_node, nodes, layout)
    # on a class's node, a check that makes runs waits for its turn (turns.py; at once elsewhere), and
    # says so even when quiet: a silent wait would look like a hang
    with turns.turn(say or _say) if registry.kinds_of(wanted) else contextlib.nullcontext():
        verdicts, outside = _judge(path, wanted, procs_per_node, nodes, gpus, say, record)
        if outside:
            if say:
                say(f"  ({'; '.join(outside.values())}: not your script's doing; running it again)")
            verdicts, outside = _judge(path, wanted, procs_per_node, nodes, gpus, say, record)
    verdicts = blame_outside(verdicts, outside)
    kept = {step: r for step, r in verdicts.items()
            if not any(registry.reads_run(step, name) for name in outside) and not r.checker_error}
    cache.save(path, procs_per_node, nodes, layout, {**known, **kept})
    return [verdicts[step] for step in wanted]


def devices_key(gpus: int) -> str:
    """Where the runs could run, part of the key of kept verdicts: the same file and layout may pass
    on the CPU and fail on GPUs."""
    return f"{gpus}-gpus"


def recorded_runs(script: str | Path, procs_per_node: int = 2, nodes: int = 2) -> Workspace | None:
    """The runs the last check of this exact script made (replayed; see Workspace.replay), if
    they were recorded and the checker has not changed since; else None."""
    path = Path(script).resolve()
    layout = devices_key(processes.gpu_count())
    record = cache.runs_file(path, procs_per_node, nodes, layout)
    try:
        return Workspace.replay(record) if record.is_file() else None
    except (OSError, ValueError, KeyError):
        return None


def assert_step(step: Step, script: str | Path | None = None, procs_per_node: int = 2,
                nodes: int = 2, fresh: bool = False) -> None:
    """Print the verdict on `step`; raise CheckFailed (an AssertionError) with what is wrong unless
    it passes (or cannot apply here). For check cells and grade cells, which must show no return value.

    `procs_per_node` and `nodes` choose the simulated layout of Steps 3-9 (default 2 x 2);
    `fresh=True` runs the script again even if its verdict is known.
    """
    (result,) = check_steps([step], script, procs_per_node, nodes, fresh=fresh)
    if result.passed is False:
        raise CheckFailed(result)
    if result.passed is None and os.environ.get(settings.GRADING) and registry.item(result.step).points:
        raise CheckFailed(Result(result.step, False, f"cannot be checked where grading runs ({result.observed})",
                                 "your instructor grades this step by hand, from your own check cell's verdict"))
    print(f"{registry.label(result.step)}: {result.status}: {result.observed}")


def report(results: Sequence[Result]) -> str:
    """The verdicts as the command line prints them: a line per step, a hint under a failure."""
    return "\n".join(f"{registry.label(r.step):<13} {r.status:<5} {r.observed}" + (f"\n{'':15}hint: {r.hint}" if r.hint else "")
                     for r in results)


def summary(results: Sequence[Result]) -> str:
    """How many graded steps pass, and which to do next."""
    graded = [r for r in results if r.step != "optional"]
    first = next((r for r in graded if not r.passed), None)
    return (f"{sum(r.passed is True for r in graded)} of {len(graded)} steps pass"
            + ("" if first is None else f"; next: {registry.label(first.step)}"))


def progress_table(results: Sequence[Result]) -> str:
    """The verdicts as a compact HTML table: a row per step; a step that waits on an earlier one
    says so instead of repeating its hint; the next step's hint once, under the table."""
    colours = {"pass": "#1a7f37", "FAIL": "#cf222e", "ERROR": "#9a6700", "n/a": "#6e7781"}
    rows = []
    for r in results:
        seen = f"needs {registry.label(r.earlier)} first" if r.earlier else r.observed
        name = registry.label(r.step)
        rows.append(f"<tr><td style='text-align:left;white-space:nowrap'>{html.escape(name)}</td>"
                    f"<td style='text-align:left;color:{colours[r.status]};font-weight:bold'>{r.status}</td>"
                    f"<td style='text-align:left'>{html.escape(seen)}</td></tr>")
    first = next((r for r in results if r.step != "optional" and not r.passed), None)
    hint = f"<p><b>Hint for {html.escape(registry.label(first.step))}:</b> {html.escape(first.hint)}</p>" if first and first.hint else ""
    head = "".join(f"<th style='text-align:left'>{h}</th>" for h in ("step", "verdict", "what the checker saw"))
    return (f"<table class='ddp-lab-progress'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table><p><b>{html.escape(summary(results))}</b></p>{hint}")


def progress(script: str | Path | None = None, fresh: bool = False) -> list[Result]:
    """Show every step's verdict at once, and how many of the graded steps pass: a table in a
    notebook, plain lines elsewhere."""
    results = check_steps(None, script, fresh=fresh)
    if _in_notebook():
        from IPython.display import HTML, display

        display(HTML(progress_table(results)))
    else:
        print(report(results))
        print("\n" + summary(results))
    return results
