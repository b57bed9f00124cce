"""Every check, on recorded runs, in milliseconds: the starter and each checkpoint pass their
steps and fail the next, the finished solution passes everything, and each catalogued mistake,
in the course's style and in the original lab's, fails its own step with its words; each exercise
fails untouched and passes solved, and passes in other learners' styles (tests/styles/exercises/). The recordings (tests/recorded/, made by
`.venv/bin/python tests/record_runs.py`) are real runs of the current files; a file changed since
its recording fails here with the command that records it again. The same scripts are also checked
launched for real in tests/core/test_autograde.py (the solution, and the mistakes in the course's style)
and tests/core/test_styles.py (nine correct styles, the original lab's among them).

    pytest tests/core/test_checks_recorded.py      # after changing a check: seconds
"""
from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from record_runs import (
    COMMAND,
    OUT,
    exercise_files,
    lab_files,
    lab_styles,
    mistakes,
    names,
    replay,
    same_file,
    steps_after,
    styles,
)

from autograde.engine import code
from autograde.engine.workspace import Workspace
from autograde.grading import judge, registry

FILES = lab_files()


@pytest.mark.parametrize("name", list(FILES))
def test_each_lab_file_passes_its_steps_and_fails_the_next(name: str) -> None:
    steps = steps_after(name)
    verdicts = replay(name, FILES[name].read_text(), steps)
    if name == "solution":
        assert {s: r.status for s, r in verdicts.items()} == {s: "n/a" if s == "optional" else "pass" for s in steps}
        return
    *done, following = steps
    for step in done:
        assert verdicts[step].passed is True, f"Step {step}: {verdicts[step].observed}"
    failing = verdicts[following]
    assert failing.passed is False and failing.hint and f"Step {following}" in failing.hint, failing


EXERCISES = exercise_files()


@pytest.mark.parametrize("name", list(EXERCISES))
def test_each_exercise_fails_untouched_and_passes_solved(name: str) -> None:
    path, item = EXERCISES[name]
    verdict = replay(name, path.read_text(), same_file(item))[item]
    if name.endswith("_solution"):
        assert verdict.passed is True, verdict.observed
    else:  # the hint points at this item's TODO, or at an earlier one of the same file that fails too
        labels = [f"# TODO {registry.item(i).label}" for i in same_file(item)[:same_file(item).index(item) + 1]]
        assert verdict.passed is False and verdict.hint and any(label in verdict.hint for label in labels), verdict


LAB_STYLES = lab_styles()


@pytest.mark.parametrize("name", list(LAB_STYLES))
def test_a_correct_lab_script_in_another_style_passes_every_step(name: str) -> None:
    """tests/styles/: module-level arguments, a Trainer class, the world size only in the process
    group or the environment, averaged metrics, drop_last, any epoch line; in the default layout
    and in each layout of the graders' hidden tests. (tests/core/test_styles.py trains each for real,
    and launches the checker on one.)"""
    path, steps, _, _ = LAB_STYLES[name]
    verdicts = replay(name, path.read_text(), steps)
    wrong = [f"{s} {v.status}: {v.observed}" for s, v in verdicts.items() if v.status != ("n/a" if s == "optional" else "pass")]
    assert not wrong, wrong


STYLES = styles()


def test_every_exercise_has_correct_files_in_other_styles() -> None:
    exercises = {i.id for i in registry.ITEMS if i.part != registry.FIRST and i.graded}
    assert exercises <= {judged for _, item in STYLES.values() for judged in same_file(item)}  # all of the file's


@pytest.mark.parametrize("name", list(STYLES))
def test_a_correct_exercise_in_another_style_passes(name: str) -> None:
    """Loops or tensors, strided or blocked shares, reduce, all_gather, numpy, blocking calls in a
    safe order, batch_isend_irecv, a returned tensor, a ring turning the other way, helpers."""
    text, item = STYLES[name]
    verdicts = replay(name, text, same_file(item))  # every item of the file: resume_training.py has two
    wrong = [f"{step}: {v.observed}" for step, v in verdicts.items()
             if v.passed is not True and not (registry.item(step).needs_gpu and v.passed is None)]
    assert not wrong, f"{name}: {wrong}"


CATALOGUE = mistakes()


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_a_typical_mistake_fails_its_step_with_the_right_message(name: str) -> None:
    """In the course's solution, and in the original lab's style ("original_..."): the same
    step fails with the same words, and no earlier one unless the mistake really breaks it."""
    mistake, correct = CATALOGUE[name]
    steps = sorted({mistake.step, *(s for s, _ in mistake.also_fails)}, key=registry.IDS.index)
    verdicts = replay(name, mistake.apply(correct.read_text()), steps)
    verdict = verdicts[mistake.step]
    assert verdict.passed is False and mistake.expect in verdict.observed, verdict.observed
    if verdict.earlier:  # an earlier item fails too: it is named as a possible cause, the hint stays this item's
        own = f"# TODO {registry.item(mistake.step).label}`"
        assert verdict.hint and own in verdict.hint, f"the hint is not {own}'s own: {verdict.hint}"
    for step, words in mistake.also_fails:
        assert verdicts[step].passed is False and words in verdicts[step].observed, verdicts[step].observed
    if not mistake.also_fails:
        assert "is not right yet" not in verdict.observed, f"an earlier step failed instead: {verdict.observed}"


def test_a_replayed_workspace_makes_no_run_it_did_not_record() -> None:
    ws = Workspace.replay(OUT / "starter.json.gz")  # Step 0 reads the source alone: no run recorded
    try:
        verdict = judge.check(ws, "1")
    finally:
        ws.close()
    assert verdict.checker_error and "was not recorded" in verdict.observed, verdict


def test_the_recordings_on_disk_are_exactly_those_the_recorder_makes() -> None:
    """No recording missing (its test would fail with less to say), none stale (a lab file, exercise,
    style or mistake that is gone, or renamed, leaves its recording behind)."""
    known = names()
    assert len(known) == len(set(known)), "two recordings share a name"
    assert set(known) == {*FILES, *EXERCISES, *CATALOGUE, *STYLES, *LAB_STYLES}
    on_disk = {p.name.removesuffix(".json.gz") for p in OUT.glob("*.json.gz")}
    missing = [n for n in known if n not in on_disk]
    assert not missing, f"not recorded: {COMMAND} {' '.join(missing)}"
    stale = sorted(on_disk - set(known))
    assert not stale, f"recordings of nothing the recorder makes (delete them): {stale}"


def _parts_run(record: dict[str, Any]) -> set[str]:
    """The parts (their folders in autograde/parts/) whose tasks made a recording's runs (a run is kept under its
    kind's name, `pi/3`): those of the items that read such runs, found by where their checks live."""
    kinds = {key.split("/")[0] for key in record["runs"]}
    return {i.check.__module__.split(".")[2] for i in registry.ITEMS for kind in i.reads if kind.name in kinds}


def test_every_recording_was_made_by_todays_code_inside_the_learners_processes() -> None:
    """A replay reads runs as they were made: after a change to how the learner's processes start or
    what they trace (autograde/inprocess/, a part's inprocess*.py and reports.py), only new runs show what the
    change does to a correct file or a mistake (see docs/testing.md). A recording made part by part is stale when
    the core's or its own part's in-process code changed; an older one, when any in-process code did."""
    today, by_part = code.learner_side_version(), code.parts_learner_side()
    stale = []
    for path in sorted(OUT.glob("*.json.gz")):
        record = json.loads(gzip.decompress(path.read_bytes()))
        made = record.get("learner_side_parts")
        if (made is None and record.get("learner_side") != today) or (
                made is not None and any(made.get(part) != by_part[part] for part in _parts_run(record))):
            stale.append(path.name.removesuffix(".json.gz"))
    assert not stale, (f"{len(stale)} of the recordings were made before the code inside the learner's processes last changed "
                       f"(the first: {', '.join(stale[:5])}): record them again, for real: {COMMAND}"
                       + (f" {' '.join(stale)}" if len(stale) <= 30 else ""))
