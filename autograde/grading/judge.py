"""Turns a check's outcome into a verdict: runs the item's check function (autograde/grading/registry.py
says which), names an earlier item that fails too, adds what went wrong in the runs it read,
and tells the checker's own failures apart from the learner's."""
from __future__ import annotations

from autograde.engine.run import Run
from autograde.engine.verdicts import Failed, Measured, NotHere, Result
from autograde.engine.workspace import Abandoned, Unmade, Workspace
from autograde.grading import registry
from autograde.grading.registry import label as _label


def _with_problems(ws: Workspace, step: str, observed: str) -> str:
    """`observed`, plus what went wrong in the runs the item read (a deadlock, a crash)."""
    for run in _runs_read(ws, step):
        problem = run.problem()
        if problem and problem not in observed:
            observed += f"; {problem}"
    return observed


def _runs_read(ws: Workspace, step: str) -> list[Run]:
    """The runs made so far of the kinds the item reads."""
    return [run for key, run in ws.made().items() if registry.reads_run(step, key)]


def check(ws: Workspace, step: str) -> Result:
    """Run one item's check; an item before it that fails is named in the verdict."""
    item = registry.item(step)
    try:
        observed = item.check(ws)
    except Failed as failure:
        earlier = _first_failing_before(ws, step)
        observed = _with_problems(ws, step, failure.observed)
        if earlier is None:
            return Result(step, False, observed, failure.hint(_label, step))
        # The item is judged on its own: its own words and hint, with the earlier item named as a
        # possible cause. Only a run cut short before it showed this item has the earlier one's hint.
        label = registry.item(earlier.step).label
        hint = earlier.hint if failure.inconclusive else f"{failure.hint(_label, step)} (or {label}, which fails too, may be the cause)"
        return Result(step, False, f"{observed} ({label} is not right yet either: {earlier.observed})", hint,
                      earlier=earlier.step)
    except NotHere as err:
        return Result(step, None, f"not applicable here: {err}")
    except Unmade:
        raise  # judged only where its runs may be made (api.py)
    except Abandoned as err:  # an earlier run was spoilt from outside: the set is made again
        return Result(step, False, f"the checker could not judge this step: {err}. This is the checker's "
                      "problem, not your script's", "run the check again with fresh=True (or --fresh)",
                      checker_error=True)
    except Exception as err:  # a bug in the check itself, unless a run it reads went wrong first
        problems = [p for run in _runs_read(ws, step) if (p := run.problem())]
        if problems:
            return Result(step, False, f"{problems[0]} (so there was too little to check this step)",
                          Failed("", "run the script by hand to see what happens").hint(_label, step))
        return Result(step, False, f"the checker failed while checking this step ({type(err).__name__}: {err}). "
                      "This is the checker's fault, not your script's", "please report it to the course's maintainers, "
                      "with this message and your script", checker_error=True)
    if observed is None:
        shown_by = " and the ".join(f"{kind.name.replace('_', '-')} run" for kind in item.reads)
        return Result(step, None, f"not applicable here: {item.title} needs GPUs, and the {shown_by} had "
                      "fewer than 2 GPUs on this machine")
    if isinstance(observed, Measured):
        return Result(step, True, observed.text, measured=observed.facts)
    return Result(step, True, observed)


def _first_failing_before(ws: Workspace, step: str) -> Result | None:
    """The first graded item of the same file, before `step`, whose check fails for sure."""
    item = registry.item(step)
    for earlier in registry.ITEMS[:registry.IDS.index(step)]:
        if earlier.needs_gpu or earlier.file != item.file:
            continue
        try:
            earlier.check(ws)
        except Failed as failure:
            if not failure.inconclusive:  # a run cut short by a later step's bug says nothing about this one
                return Result(earlier.id, False, failure.observed, failure.hint(_label, earlier.id))
        except Unmade:
            raise  # the verdict would lack the earlier item: judged only where its runs may be made
        except Exception:  # check() reports a check's own failure; here it only hides an earlier step
            continue
    return None
