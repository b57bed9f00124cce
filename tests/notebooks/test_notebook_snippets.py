"""Every "Your edit" section of a step notebook shows what the course's files really hold: the
TODO comment it quotes is in the starter, and every line of code it asks for is in that step's
checkpoint. (The notebooks and the checkpoints are written separately; this keeps them together.)"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, STARTER

from autograde.grading import registry

CODE = re.compile(r"```python\n(.*?)```", re.S)
STEP = re.compile(r"search for `TODO (Step (\d+(?:\.5)?)|Optional)`")


def _edits() -> list[tuple[str, str, str]]:
    """(notebook:cell, step, markdown) of every "Your edit" cell of the step notebooks."""
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            text = "".join(cell["source"])
            if cell["cell_type"] == "markdown" and text.startswith("### Your edit"):
                match = STEP.search(text)
                assert match, f"{path.name} cell {index}: a 'Your edit' section names no `TODO Step`"
                found.append((f"{path.name}:{index}", match.group(2) or "optional", text))
    return found


def checkpoint(step: str) -> Path:
    """The checkpoint that holds a step's edit, as the registry says (6.5 shares 6's, Optional 7's)."""
    return ROOT / str(registry.item(step).checkpoint)


def _lines(code: str) -> list[str]:
    """The lines of a snippet that must appear verbatim; `...` elides, `# the existing line` paraphrases."""
    return [line.strip() for line in code.splitlines()
            if line.strip() and "..." not in line and "existing line" not in line and "likewise" not in line]


EDITS = _edits()


def test_every_step_notebook_has_its_edits() -> None:
    steps = {step for _, step, _ in EDITS}
    assert steps == set(registry.FIRST_ITEMS), steps


@pytest.mark.parametrize("where,step,text", EDITS, ids=[f"{w}-step-{s}" for w, s, _ in EDITS])
def test_a_your_edit_snippet_is_in_its_checkpoint(where: str, step: str, text: str) -> None:
    quoted, *asked = CODE.findall(text)
    starter = {line.strip() for line in STARTER.read_text().splitlines()}
    missing = [line for line in _lines(quoted) if line not in starter]
    assert not missing, f"{where}: the quoted TODO lines are not in fashion_mnist.py: {missing}"
    held = {line.strip() for line in checkpoint(step).read_text().splitlines()}
    missing = [line for code in asked for line in _lines(code) if line not in held]
    assert not missing, f"{where}: these lines of the edit are not in {checkpoint(step).name}: {missing}"
