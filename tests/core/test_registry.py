"""The registry of graded items is the one source of their facts: every other place that states
one (the notebooks' check and grade cells, the checkpoints, the checks) agrees with it."""
from __future__ import annotations

import fnmatch
import inspect
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT

from autograde import parts
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


@pytest.mark.parametrize("part", registry.PARTS, ids=[p.id for p in registry.PARTS])
def test_a_part_hands_out_its_notebooks_and_files_and_grades_exactly_its_graded_notebooks(part: registry.Part) -> None:
    notebooks = {p.stem for p in (ROOT / "notebooks").glob(part.notebooks)}
    assert set(part.graded_notebooks) <= notebooks, part.graded_notebooks
    graded = {n for n in notebooks if fnmatch.fnmatch(n, part.graded)}
    assert graded == set(part.graded_notebooks), (part.graded, graded)
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
    from autograde.course import assignment

    assert all(assignment.step_of(assignment.grade_id(i.id)) == i.id for i in ITEMS)
