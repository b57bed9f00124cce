"""Record the runs that the check tests replay (tests/recorded/): the finished solution, the
starter and every checkpoint, every exercise's TODO file and solution, every catalogued
mistake (tests/mistakes.py; the lab's in both of its styles), every correct lab script in
another style (tests/styles/, in the default layout and in the graders' hidden layouts) and
every exercise written in another style (tests/exercise_styles.py), each checked for the items
its test asks about. A recording holds the script it was made from, so a test can say
when a file changed since and the recording must be made again.

Run it as a script, from the repository's root (it finds its files from its own place):

    .venv/bin/python tests/record_runs.py            # everything (about 25 minutes on 2 cores)
    .venv/bin/python tests/record_runs.py solution no_set_epoch

It is the tests' tool, not the package's: it imports tests/mistakes.py and tests/exercise_styles.py
as its neighbours (run as a script, its folder comes first on sys.path; under pytest, conftest's).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(1, str(HERE.parent))  # the package, where .venv does not name it (a fresh clone)

import exercise_styles
import mistakes as catalogue

from autograde import settings
from autograde.course import assignment
from autograde.engine.verdicts import Result
from autograde.engine.workspace import Workspace
from autograde.grading import api, judge, registry

OUT = HERE / "recorded"
COMMAND = ".venv/bin/python tests/record_runs.py"  # from the repository's root, as the tests' messages say
LAB_STEPS = registry.FIRST_ITEMS
GRADED = [i.id for i in registry.ITEMS if i.graded and i.part == registry.FIRST]
EXERCISES = [i for i in registry.ITEMS if i.part != registry.FIRST and not i.needs_gpu]  # GPU-only: n/a here


STYLES = HERE / "styles"
ORIGINAL_LAB = STYLES / "original_lab.py"


def mistakes() -> dict[str, tuple[catalogue.Mistake, Path]]:
    """Every catalogued mistake by recording name, with the correct file it is made in: the
    lab's in the course's solution (its own name) and in the original lab's style ("original_" +
    name), an exercise's in the exercise's solution."""
    return {**{m.name: (m, settings.SOLUTION) for m in catalogue.MISTAKES},
            **{f"original_{m.name}": (m, ORIGINAL_LAB) for m in catalogue.ORIGINAL_LAB_MISTAKES},
            **{m.name: (m, settings.REPO / str(registry.item(m.step).checkpoint)) for m in catalogue.EXERCISE_MISTAKES}}


def exercise_files() -> dict[str, tuple[Path, str]]:
    """Each exercise's TODO file ("<item>_exercise": it fails) and solution ("<item>_solution":
    it passes), with the item."""
    return {**{f"{i.id}_exercise": (settings.REPO / i.file, i.id) for i in EXERCISES},
            **{f"{i.id}_solution": (settings.REPO / str(i.checkpoint), i.id) for i in EXERCISES}}


def styles() -> dict[str, tuple[str, str]]:
    """Each exercise style ("style_<file>": it passes) as the whole learner file, with its item."""
    return {f"style_{s.stem}": (exercise_styles.learner_file(s), exercise_styles.item_of(s))
            for s in exercise_styles.STYLES}


def lab_styles() -> dict[str, tuple[Path, list[str], int, int]]:
    """Each correct lab script in another style (tests/styles/*.py), with the items its recording
    checks and the layout (processes per node, nodes): "lab_style_<name>", every step in the
    default layout; "lab_style_<name>_<nodes>x<procs>", the steps the graders' hidden tests check
    in that layout (each item's `hidden` layouts in autograde/grading/registry.py)."""
    found: dict[str, tuple[Path, list[str], int, int]] = {}
    for path in sorted(STYLES.glob("*.py")):
        found[f"lab_style_{path.stem}"] = (path, LAB_STEPS, 2, 2)
        for name, (steps, layout) in assignment.hidden_layouts().items():
            found[f"lab_style_{path.stem}_{name}"] = (path, steps, layout.procs_per_node, layout.nodes)
    return found


def replay(name: str, source: str, steps: list[str]) -> dict[str, Result]:
    """The verdicts on `steps` of the recording `name`, whose script must still be `source` (the tests'
    replay, in milliseconds: tests/core/test_checks_recorded.py and each part's tests of recorded runs)."""
    path = OUT / f"{name}.json.gz"
    assert path.is_file(), f"no recording of {name}: {COMMAND} {name}"
    ws = Workspace.replay(path)
    try:
        assert ws.script.read_text() == source, f"{name} changed since it was recorded: {COMMAND} {name}"
        # as a learner's check would end: a run spoilt from outside is made again, and blamed on the checker
        verdicts = api.blame_outside({step: judge.check(ws, step) for step in steps}, api.outside_causes(ws))
    finally:
        ws.close()
    errors = [f"{r.step}: {r.observed}" for r in verdicts.values() if r.checker_error]
    assert not errors, f"the checker failed on the recording of {name}: {errors}"
    return verdicts


def lab_files() -> dict[str, Path]:
    """The starter and the checkpoints by name: each passes its steps and fails the next."""
    return {"starter": settings.STARTER, **{f"after_step_{n}": settings.SOLUTIONS / f"fashion_mnist_after_step_{n}.py"
                                         for n in range(10)}, "solution": settings.SOLUTION}


def names() -> list[str]:
    """Every recording this recorder makes, by name (tests/recorded/<name>.json.gz), in its order."""
    return [*lab_files(), *exercise_files(), *mistakes(), *styles(), *lab_styles()]


def steps_after(name: str) -> list[str]:
    """The items a file's test asks about: those it has done and the first it has not."""
    if name == "solution":
        return LAB_STEPS
    done = -1 if name == "starter" else GRADED.index(name.removeprefix("after_step_"))
    if done >= 0 and GRADED[done] == "6":
        done += 1  # 6.5 is done with 6
    return GRADED[:done + 2]


def same_file(item: str) -> list[str]:
    """The items that read the same learner file as `item` (checkpoint and resume: resume_training.py),
    in the registry's order: an exercise file is recorded, and replayed, for all of them."""
    return [i.id for i in registry.ITEMS if i.file == registry.item(item).file]


FAILED: list[str] = []  # the recordings whose checker failed, or whose runs were spoilt, twice: main() names them


def record(name: str, script: Path, steps: list[str], procs_per_node: int = 2, nodes: int = 2) -> Path:
    """Records `script`'s runs for `steps` under `name`; once more where the checker failed or a run was spoilt from
    outside (on a loaded machine gloo can lose a connection: the replay would blame the checker)."""
    for attempt in (1, 2):
        with Workspace(script, procs_per_node, nodes) as ws:
            verdicts = [judge.check(ws, step) for step in steps]
            spoilt = api.outside_causes(ws)
            out = OUT / f"{name}.json.gz"
            ws.save(out)
        print(f"{name}: " + ", ".join(f"{v.step} {v.status}" for v in verdicts) + f" -> {out.relative_to(settings.REPO)}"
              + (f" (spoilt from outside: {'; '.join(spoilt.values())})" if spoilt else ""))
        if not spoilt and not any(v.checker_error for v in verdicts):
            return out
    FAILED.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/record_runs.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("names", nargs="*", help="what to record (default: everything)")
    args = parser.parse_args(argv)
    os.environ[settings.CAPSTONE_RULES] = "reduced"  # as the tests replay them (tests/conftest.py)
    OUT.mkdir(parents=True, exist_ok=True)
    files, exercises, made_in, written = lab_files(), exercise_files(), mistakes(), styles()
    lab_written = lab_styles()
    everything = names()
    chosen = args.names or everything
    unknown = [n for n in chosen if n not in everything]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)} (choose from {', '.join(everything)})")
    made: dict[tuple[Path, tuple[str, ...]], Path] = {}  # each exercise file's recording, by the items it checks
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            if name in files:
                record(name, files[name], steps_after(name))
            elif name in exercises:
                path, item = exercises[name]
                steps = same_file(item)
                twin = made.get((path, tuple(steps)))
                if twin is not None:  # the items of one file share its runs: recorded once, under each name
                    shutil.copyfile(twin, OUT / f"{name}.json.gz")
                    print(f"{name}: the runs of {twin.name}, the same file and items")
                else:
                    made[path, tuple(steps)] = record(name, path, steps)
            elif name in lab_written:
                path, steps, procs, nodes = lab_written[name]
                record(name, path, steps, procs, nodes)
            elif name in written:
                text, item = written[name]
                script = Path(tmp) / f"{name}{Path(registry.item(item).file).suffix}"  # .py, .sbatch
                script.write_text(text)
                record(name, script, same_file(item))
            else:
                mistake, correct = made_in[name]
                script = Path(tmp) / f"fashion_mnist{Path(registry.item(mistake.step).file).suffix}"
                script.write_text(mistake.apply(correct.read_text()))
                record(name, script, sorted({mistake.step, *(s for s, _ in mistake.also_fails)}, key=registry.IDS.index))
    if FAILED:
        print(f"the checker failed, or a run was spoilt from outside, twice on {len(FAILED)} recording(s); make them "
              f"again: {COMMAND} {' '.join(FAILED)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
