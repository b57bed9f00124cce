"""Every notebook from 14 on asks for graded work, and no prompt to predict or to think is left
unanswered: each is followed, before the next heading, by a check cell (a prediction a check
compares with a measurement) or an answer cell (free text the instructor grades by hand;
autograde/course/assignment.py says what one is)."""
from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT

from autograde.course import assignment
from autograde.grading import registry

NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
FROM_14 = [n for n in NOTEBOOKS if int(n[:2]) >= 14]
# How the notebooks ask for a prediction or a thought: a bold lead-in ("**Predict first:**",
# "**Predict:**", "**Think about it.**", "**Before you run**...", "**What does the trace show?**")
# or a heading that says predict.
PROMPT = re.compile(r"\*\*\s*(predict|think about it|before you run|what does the trace show)\b[^*]*\*\*"
                    r"|^#+ .*\bpredict\b", re.I | re.M)
HEADING = re.compile(r"^#+ ", re.M)
FENCED = re.compile(r"^```.*?^```", re.M | re.S)  # a code block's "# comment" is no heading
CHECK = re.compile(r"\bautograde\.assert_step\(")


def _cells(notebook: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _prose(cell: dict) -> str:
    """A markdown cell's text without its code blocks, where a line may start with '#'."""
    return FENCED.sub("", _source(cell))


def _is_answer(cell: dict) -> bool:
    meta = cell["metadata"].get("nbgrader", {})
    return bool(meta.get("grade")) and assignment.is_answer(str(meta.get("grade_id", "")))


def unanswered(cells: list[dict]) -> list[str]:
    """The prompts (their first words) that no check cell or answer cell follows before the next heading."""
    left = []
    for at, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        text = _prose(cell)
        for prompt in PROMPT.finditer(text):
            if HEADING.search(text, prompt.end()):  # a heading later in the prompt's own cell ends its section
                left.append(" ".join(text[prompt.start():prompt.start() + 60].split()))
                continue
            section = []
            for later in cells[at + 1:]:
                if later["cell_type"] == "markdown" and HEADING.search(_prose(later)) and not _is_answer(later):
                    break
                section.append(later)
            if not any(_is_answer(c) or (c["cell_type"] == "code" and CHECK.search(_source(c))) for c in section):
                left.append(" ".join(text[prompt.start():prompt.start() + 60].split()))
    return left


@pytest.mark.parametrize("notebook", FROM_14)
def test_every_notebook_from_14_on_has_graded_work(notebook: str) -> None:
    items = [i.id for i in registry.ITEMS if i.notebook == notebook and i.graded]
    answers = [c for c in _cells(notebook) if _is_answer(c)]
    assert items or answers, f"{notebook} has no graded item and no answer cell"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_prompt_is_checked_or_answered_before_the_next_heading(notebook: str) -> None:
    left = unanswered(_cells(notebook))
    assert not left, f"{notebook}: no check cell or answer cell after {left}"


def test_the_prompt_rule_sees_an_unanswered_prompt_and_an_answered_one() -> None:
    def md(text: str) -> dict:
        return {"cell_type": "markdown", "metadata": {}, "source": [text]}

    def code(text: str) -> dict:
        return {"cell_type": "code", "metadata": {}, "source": [text]}

    answer = assignment.answer_cell("15_fault_tolerance", "lives")
    prompt = md("Kill node B. **Predict first:** how many lives will the group have?")
    assert unanswered([prompt, code("run()"), answer]) == []
    assert unanswered([prompt, code("autograde.assert_step(\"elastic\")")]) == []
    assert unanswered([prompt, code("run()"), md("## Next\n"), answer]) == [
        "**Predict first:** how many lives will the group have?"]
    assert unanswered([md("**Think about it.** Why?\n\n## Next"), answer]) == ["**Think about it.** Why? ## Next"]
    assert unanswered([md("## Your turn: predict, then run"), code("x = 1")]) == ["## Your turn: predict, then run"]
    assert unanswered([md("**What does the trace show?** Name the widest gap."), code("x = 1")]) == [
        "**What does the trace show?** Name the widest gap."]
    assert unanswered([md("Nothing is asked here."), code("x = 1")]) == []
    hint = md("<details><summary>Hint 3</summary>\n\n```python\n# the owners, from the sizes\n```\n</details>")
    assert unanswered([prompt, hint, code("autograde.assert_step(\"elastic\")")]) == []  # a comment is no heading
