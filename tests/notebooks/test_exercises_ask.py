"""The exercises ask instead of tell: no exercise file gives its answer away in its comments or
docstrings, and every exercise's notebook holds its hints in tiers the learner opens on purpose.

The answer is what the course's solution has that the handed-out file does not: every line of
the solution's code that is not in the exercise. None of its expressions may stand in the
exercise's prose (a formula, an index, a call with its arguments). Nor may the prose point at
the API to use ("Look up: dist.all_reduce"): which API is part of the answer, and naming it is a
hint, which belongs in the notebook's tiers. A batch script (.sbatch) is read as bash: its prose
is its comment lines (not the shebang, not the #SBATCH lines, which are options), its code every
other line."""
from __future__ import annotations

import ast
import difflib
import io
import json
import re
import tokenize

import pytest
from conftest import ROOT

from autograde.grading import registry

EXERCISE_FILES = sorted(p.name for p in (ROOT / "exercises").iterdir() if p.suffix in (".py", ".sbatch"))
LOOK_UP = re.compile(r"\blook\s+up\b", re.I)  # "Look up: <API>", folded over a line break or not
EXERCISES = sorted({(i.file, str(i.checkpoint)) for i in registry.ITEMS if i.part != registry.FIRST and i.checkpoint})
SHORTEST = 14  # characters: shorter expressions (`rank`, `p.grad`) are words a contract needs


def _is_prose_line(line: str) -> bool:
    """A batch script's comment line: not the shebang, not an #SBATCH line (sbatch's options)."""
    text = line.strip()
    return text.startswith("#") and not text.startswith(("#!", "#SBATCH"))


def _bash_prose(source: str, fold: bool = True) -> str:
    text = " ".join(line.strip().lstrip("#") for line in source.splitlines() if _is_prose_line(line))
    return _fold(text) if fold else text


def _bash_answer(exercise: str, solution: str) -> set[str]:
    """As _answer, for batch scripts: each added code line, each value assigned in it and each
    command substitution ($(...), $((...)))."""
    lines = solution.splitlines()
    added = [lines[k] for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, exercise.splitlines(), lines).get_opcodes()
             if tag in ("replace", "insert") for k in range(j1, j2) if not _is_prose_line(lines[k])]
    found = set()
    for line in added:
        code = re.sub(r"\s+#\s.*$", "", line).strip()
        pieces = [code, *re.split(r"(?<![=!<>])=(?!=)", code)[1:], *re.findall(r"\$\(\(?[^()]*\)?\)", code)]
        found |= {_fold(p) for p in pieces if len(_fold(p)) >= SHORTEST}
    return found


def _prose(source: str, fold: bool = True) -> str:
    """The comments and docstrings of a file, white space folded (unless told not to)."""
    parts = [tok.string.lstrip("#") for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node) or "")
    return _fold(" ".join(parts)) if fold else " ".join(parts)


def _fold(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _answer(exercise: str, solution: str) -> set[str]:
    """The expressions of the solution's code lines that the exercise does not have (white space
    folded): each whole line, and each right-hand side and call in it."""
    lines = solution.splitlines()
    prose_lines = {k for node in ast.walk(ast.parse(solution)) if isinstance(node, ast.Expr)
                   and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                   for k in range(node.lineno - 1, node.end_lineno or node.lineno)}  # docstrings
    added = [lines[k] for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, exercise.splitlines(), lines).get_opcodes()
             if tag in ("replace", "insert") for k in range(j1, j2) if k not in prose_lines]
    found = set()
    for line in added:
        code = line.split("#")[0].strip()
        if not code:
            continue
        pieces = [code, *(side for side in re.split(r"(?<![=!<>])=(?!=)", code)[1:])]
        try:
            tree = ast.parse(code.rstrip(":") + (" pass" if code.endswith(":") else ""))
            pieces += [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Call, ast.BinOp, ast.Subscript))]
        except SyntaxError:
            pass
        found |= {_fold(p) for p in pieces if len(_fold(p)) >= SHORTEST}
    return found


@pytest.mark.parametrize("exercise,solution", EXERCISES, ids=[e for e, _ in EXERCISES])
def test_no_exercise_gives_its_answer_in_its_prose(exercise: str, solution: str) -> None:
    given = (ROOT / exercise).read_text()
    bash = exercise.endswith(".sbatch")
    prose = _bash_prose(given) if bash else _prose(given)
    told = sorted(a for a in (_bash_answer if bash else _answer)(given, (ROOT / solution).read_text()) if a in prose)
    assert not told, f"{exercise} gives the answer away in a comment or docstring: {told}"


def test_the_check_finds_an_answer_written_in_a_todo() -> None:
    """The rule above catches an answer told in prose: a TODO that spells out the share's formula."""
    solution = "def share(rank, n, world_size):\n    start = rank * n // world_size\n    return start\n"
    exercise = ("def share(rank, n, world_size):\n    # TODO pi: start at rank * n // world_size\n"
                "    start = 0\n    return start\n")
    assert any(answer in _prose(exercise) for answer in _answer(exercise, solution))
    assert not any(answer in _prose(solution) for answer in _answer(solution, solution))


def test_the_check_finds_an_answer_written_in_a_batch_scripts_todo() -> None:
    """The same for a batch script: a TODO that spells out the address's command is caught, and
    the #SBATCH lines and the code are not prose."""
    solution = "#!/bin/bash\n#SBATCH --nodes=2\nMASTER_ADDR=$(scontrol show hostnames | head -n 1)\nsrun true\n"
    exercise = ("#!/bin/bash\n# TODO slurm_job: MASTER_ADDR=$(scontrol show hostnames | head -n 1)\n"
                "srun true\n")
    assert _bash_answer(exercise, solution) >= {"#SBATCH--nodes=2", "$(scontrolshowhostnames|head-n1)"}
    assert any(answer in _bash_prose(exercise) for answer in _bash_answer(exercise, solution))
    assert not any(answer in _bash_prose(solution) for answer in _bash_answer(solution, solution))
    assert "nodes=2" not in _bash_prose(solution)


def _pointers(name: str, source: str) -> list[str]:
    """Where the prose of an exercise file tells the learner which API to look up."""
    prose = _bash_prose(source, fold=False) if name.endswith(".sbatch") else _prose(source, fold=False)
    return [prose[m.start():m.end() + 40] for m in LOOK_UP.finditer(prose)]


@pytest.mark.parametrize("name", EXERCISE_FILES)
def test_no_exercise_names_the_api_to_look_up(name: str) -> None:
    told = _pointers(name, (ROOT / "exercises" / name).read_text())
    assert not told, f"exercises/{name} tells the learner which API to use (a hint for the notebook): {told}"


def test_the_check_finds_an_api_to_look_up_in_a_todo() -> None:
    """The rule above catches "Look up" in a comment, a docstring and a batch script's comment, in
    any case and across a line break, and not in code or an #SBATCH line."""
    told = ("def total(part):\n    \"\"\"Sums the parts. LOOK\n    UP: dist.all_reduce\"\"\"\n"
            "    # TODO pi: pi on every rank. Look up: dist.all_reduce\n    return part\n")
    assert len(_pointers("compute_pi.py", told)) == 2
    assert _pointers("slurm_job.sbatch", "#!/bin/bash\n#SBATCH --nodes=2\n# look up: man srun\nsrun true\n")
    assert not _pointers("compute_pi.py", "LOOKUP = {}  # a table of the ranks\nlook_up = 'look up'\n")
    assert not _pointers("slurm_job.sbatch", "#!/bin/bash\n#SBATCH --comment='look up'\necho look up\n")


HINTS = ("Hint 1", "Hint 2", "Hint 3")
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
TIERS = re.compile(r"<details><summary>Hint (\d)[^<]*</summary>(.*?)</details>", re.S)
DETAILS = re.compile(r"<details.*?</details>", re.S | re.I)
INLINE_CODE = re.compile(r"`[^`]+`")
CALL_WITH_ARGUMENTS = re.compile(r"[\w\])]\(\s*[^)\s]")  # `f(x)`, `t.chunk(N, dim)`; not `f()`, not `(a, b)`


def _markdown(notebook: str) -> str:
    cells = json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


@pytest.mark.parametrize("notebook", sorted({i.notebook for i in registry.ITEMS if i.part != registry.FIRST and i.graded
                                             and i.id != "predict"}))
def test_every_exercise_notebook_has_hints_in_tiers_opened_on_purpose(notebook: str) -> None:
    """Each graded exercise's notebook has collapsed hints, in three tiers: a question, the idea,
    near-code (predict's notebook asks for predictions: its hint is running the calls)."""
    text = _markdown(notebook)
    blocks = re.findall(r"<details><summary>(Hint \d)[^<]*</summary>", text)
    assert blocks, f"{notebook} has no hints in <details> blocks"
    assert all(tier in blocks for tier in HINTS), f"{notebook}'s hints are not in three tiers: {blocks}"
    assert text.count("<details>") == text.count("</details>"), f"{notebook} has an unclosed <details>"


def _tier_faults(text: str) -> list[str]:
    """What breaks the course's hint tiers in a notebook's markdown. Every set of hints is Hint 1,
    2, 3 in that order, each collapsed (no `<details open`). Tier 1 asks a question (a "?") and
    shows no code block. Tier 2 names the idea: no code block, no call with its arguments, no "="
    (an assignment, a keyword argument): the code is for tier 3. An API may be named in tier 2."""
    faults = ["a <details> open by default"] if re.search(r"<details\s+open", text, re.I) else []
    tiers = TIERS.findall(text)
    numbers = [number for number, _ in tiers]
    if numbers != ["1", "2", "3"] * (len(numbers) // 3):
        faults.append(f"hint sets not in tiers 1, 2, 3: {numbers}")
    for number, body in tiers:
        words = " ".join(body.split())[:90]
        if number == "1" and ("?" not in body or "```" in body):
            faults.append(f"tier 1 does not ask, or shows code: {words}")
        calls = [c for c in INLINE_CODE.findall(body.replace("```", "")) if CALL_WITH_ARGUMENTS.search(c)]
        if number == "2" and ("```" in body or "=" in body or calls):
            faults.append(f"tier 2 shows code {calls}: {words}")
    return faults


def _visible_pointers(text: str) -> list[str]:
    """Where a notebook's markdown, outside the collapsed <details> blocks, says "look up"."""
    visible = DETAILS.sub("", text)
    return [visible[m.start():m.end() + 40] for m in LOOK_UP.finditer(visible)]


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_notebooks_hints_ask_first_and_keep_the_code_for_the_last_tier(notebook: str) -> None:
    faults = _tier_faults(_markdown(notebook))
    assert not faults, f"{notebook}: {faults}"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_no_notebook_names_the_api_to_look_up_where_it_shows(notebook: str) -> None:
    told = _visible_pointers(_markdown(notebook))
    assert not told, f"{notebook} tells the learner which API to use outside its hints: {told}"


GOOD_TIERS = ("<details><summary>Hint 1: a question</summary>\n\nWhich rank holds the sum?\n</details>\n"
              "<details><summary>Hint 2: the idea</summary>\n\nAn all-reduce (`dist.all_reduce`) sums in place.\n"
              "</details>\n<details><summary>Hint 3: the shape of the code</summary>\n\n"
              "```python\ndist.all_reduce(part)\n```\n</details>\n")


def test_the_tier_check_finds_hints_that_tell_first_or_show_code_early() -> None:
    """The rules above, on made-up hints: the good set passes; an idea in tier 1, code in tier 1
    or 2 (a block, a call with its arguments, a keyword argument), tiers out of order or missing,
    an open tier, and "look up" outside the tiers each fail."""
    assert _tier_faults(GOOD_TIERS * 2) == []
    tells = GOOD_TIERS.replace("Which rank holds the sum?", "An all-reduce gives every rank the sum.")
    assert any("tier 1" in f for f in _tier_faults(tells))
    assert any("tier 1" in f for f in _tier_faults(GOOD_TIERS.replace("holds the sum?", "holds it?\n```\nx\n```")))
    for code in ("`dist.all_reduce(part)`", "`dist.all_reduce(\npart)`", "`async_op=True`", "```\nx\n```"):
        assert any("tier 2" in f for f in _tier_faults(GOOD_TIERS.replace("`dist.all_reduce`", code))), code
    assert _tier_faults(GOOD_TIERS.replace("`dist.all_reduce`", "`dist.get_world_size()`, `(a, b)`")) == []
    assert _tier_faults(GOOD_TIERS.replace("Hint 1", "Hint 0"))
    assert _tier_faults(GOOD_TIERS + GOOD_TIERS.split("<details><summary>Hint 3")[0])
    assert _tier_faults(GOOD_TIERS.replace("<details>", "<details open>", 1))
    assert _visible_pointers("Sum it. The API to LOOK\nup: `dist.all_reduce`.\n" + GOOD_TIERS)
    assert not _visible_pointers("Sum it.\n" + GOOD_TIERS.replace("An all-reduce", "Look up: an all-reduce"))
