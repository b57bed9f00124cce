"""The registry of graded items is the one source of their facts: every other place that states
one (the notebooks' check and grade cells, the checkpoints, the checks) agrees with it. The only
other grade cells are answer cells, graded by hand (autograde/course/assignment.py says what one is)."""
from __future__ import annotations

import fnmatch
import inspect
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT

from autograde import parts
from autograde.course import assignment
from autograde.engine.workspace import RunKind
from autograde.grading import api, registry

ITEMS = registry.ITEMS


def _cells(notebook: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]


def _argument(item: registry.Item) -> str:
    return item.id if item.id.isdigit() else f'"{item.id}"'


@pytest.mark.parametrize("item", ITEMS, ids=[i.id for i in ITEMS])
def test_an_item_is_checked_in_its_notebook_and_graded_for_its_points(item: registry.Item) -> None:
    cells = [c for c in _cells(item.notebook) if c["cell_type"] == "code"
             and re.search(rf"assert_step\({re.escape(_argument(item))}[,)]", "".join(c["source"]))]
    assert cells, f"{item.notebook} has no cell that checks {item.label}"
    grading = [c["metadata"]["nbgrader"] for c in cells if c["metadata"].get("nbgrader", {}).get("grade")]
    if item.graded:
        assert [(g["grade_id"], g["points"]) for g in grading] == [(item.grade_id, item.points)]
    else:
        assert not grading, f"{item.label} is not graded, but {item.notebook} has a grade cell for it"


@pytest.mark.parametrize("item", ITEMS, ids=[i.id for i in ITEMS])
def test_an_item_names_real_files_and_its_check_lives_in_its_parts_module(item: registry.Item) -> None:
    assert (ROOT / item.file).is_file() or item.file == "fashion_mnist.py"
    assert item.checkpoint is None or (ROOT / item.checkpoint).is_file(), item.checkpoint
    assert all(isinstance(kind, RunKind) for kind in item.reads), item.reads
    source = Path(inspect.getsourcefile(item.check) or "")
    folder = next(Path(inspect.getsourcefile(m) or "").parent for m in parts.of_role("items") if m.PART.id == item.part)
    assert source.parent == folder and source.stem.startswith("checks"), f"{source} is not a checks file of {folder}"
    assert item.check.__doc__, f"{item.check.__name__} must say what it proves"


def test_ids_are_unique_and_every_part_is_an_nbgrader_assignment() -> None:
    assert len({i.id for i in ITEMS}) == len(ITEMS)
    assert {i.part for i in ITEMS} == set(registry.PART)


NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def _grade_cells(notebook: str) -> list[dict]:
    return [c for c in _cells(notebook) if c["metadata"].get("nbgrader", {}).get("grade")]


def _answered(notebook: str) -> bool:
    return any(assignment.is_answer(c["metadata"]["nbgrader"]["grade_id"]) for c in _grade_cells(notebook))


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_a_notebooks_autograded_cells_are_exactly_its_items_and_the_others_are_answer_cells(notebook: str) -> None:
    """Two kinds of grade cell: an item's check (autograded), and an answer cell the instructor
    grades by hand (autograde/course/assignment.py says what one is)."""
    ids = [c["metadata"]["nbgrader"]["grade_id"] for c in _grade_cells(notebook)]
    autograded = [i for i in ids if not assignment.is_answer(i)]
    assert sorted(autograded) == sorted(i.grade_id for i in ITEMS if i.notebook == notebook and i.graded)
    for cell in _grade_cells(notebook):
        if assignment.is_answer(cell["metadata"]["nbgrader"]["grade_id"]):
            assert not assignment.answer_faults(cell, notebook)


def test_grade_ids_are_unique_across_the_course() -> None:
    """nbgrader keys grades by grade id within a notebook; the course's tools (the log filter, the
    gradebook's outcomes) by grade id alone."""
    ids = [c["metadata"]["nbgrader"]["grade_id"] for n in NOTEBOOKS for c in _grade_cells(n)]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


def test_what_an_answer_cell_is_is_checked() -> None:
    """Each fact of an answer cell, broken in turn, is named (the metadata the helper writes is the convention's)."""
    good = assignment.answer_cell("23_debugging_hangs", "where_ranks_wait")
    assert good["metadata"] == {"nbgrader": {"grade": True, "grade_id": "answer_23_where_ranks_wait", "locked": False,
                                             "points": 1, "schema_version": 3, "solution": True, "task": False}}
    assert assignment.answer_faults(good, "23_debugging_hangs") == []
    assert assignment.step_of("answer_23_where_ranks_wait") is None
    broken = {"markdown cell": {"cell_type": "code"}, "unlocked": {"locked": True}, "solution: true": {"solution": False},
              "points > 0": {"points": 0}, "id answer_23_": {"grade_id": "answer_22_where_ranks_wait"},
              "(snake_case)": {"grade_id": "answer_23_Where ranks"}, "text 'YOUR ANSWER HERE'": {"source": ["my answer"]}}
    for words, change in broken.items():
        cell = json.loads(json.dumps(good))
        for key, value in change.items():
            (cell if key in ("cell_type", "source") else cell["metadata"]["nbgrader"])[key] = value
        (fault,) = assignment.answer_faults(cell, "23_debugging_hangs")
        assert words in fault, (words, fault)


@pytest.mark.parametrize("part", registry.PARTS, ids=[p.id for p in registry.PARTS])
def test_a_part_hands_out_its_notebooks_and_files_and_grades_exactly_its_graded_notebooks(part: registry.Part) -> None:
    notebooks = {p.stem for p in (ROOT / "notebooks").glob(part.notebooks)}
    assert set(part.graded_notebooks) <= notebooks, part.graded_notebooks
    graded = {n for n in notebooks if fnmatch.fnmatch(n, part.graded)}
    # grading runs these only: the notebooks with an item's grade cell, and those with answer cells
    assert graded == set(part.graded_notebooks) | {n for n in notebooks if _answered(n)}, (part.graded, graded)
    assert all((ROOT / f).is_file() for f in part.files), part.files
    others = [p for p in registry.PARTS if p is not part]
    assert not any(notebooks & {n.stem for n in (ROOT / "notebooks").glob(o.notebooks)} for o in others)


def test_the_command_line_and_the_notebooks_know_the_same_ids() -> None:
    for item in ITEMS:
        assert api.normalise(item.id) == item.id
    with pytest.raises(ValueError, match="unknown step"):
        api.normalise("11")


def test_a_grade_cell_id_names_its_item_both_ways() -> None:
    """Ids with dots (6.5) and underscores (lr_scaling) alike: grading reads the item back from the cell."""
    assert all(assignment.step_of(assignment.grade_id(i.id)) == i.id for i in ITEMS)
