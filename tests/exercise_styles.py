"""Correct exercise files written the ways learners write them (tests/styles/exercises/): each
must pass its exercise's check (tests/core/test_checks_recorded.py replays their recorded runs;
.venv/bin/python tests/record_runs.py records them).

A style file either is a whole program (it has its own `__main__` block), or holds the
definitions that replace functions, classes or assignments of the exercise's solution (its first line says which:
`# replaces: compute_pi`, or several: `# replaces: CopyToParallel, ReduceFromParallel`), as a learner fills the TODOs in their own way. The styles differ
where learners differ: loops or tensors, strided or blocked shares, reduce or all_reduce or
all_gather, numpy, blocking calls in a safe order, batch_isend_irecv, a returned tensor instead
of an in-place one, a ring that turns the other way, helpers of their own.
"""
from __future__ import annotations

import ast
from pathlib import Path

from autograde import settings
from autograde.grading import registry

STYLES = sorted(path for suffix in ("*.py", "*.sbatch")  # .sbatch: a whole batch script (slurm_job)
                for path in (Path(__file__).resolve().parent / "styles" / "exercises").glob(suffix))


def item_of(style: Path) -> str:
    """The exercise a style is written for: the item whose id begins its name (ring_batched.py:
    ring; naive_ddp_params.py: naive_ddp)."""
    return max((i.id for i in registry.ITEMS if style.stem.startswith(f"{i.id}_")), key=len)


def learner_file(style: Path) -> str:
    """The style as a whole exercise file: its text in place of the first definition its header
    names (`# replaces: A, B`), the others it names removed from the solution (the style defines
    them too)."""
    text = style.read_text()
    first = text.splitlines()[0]
    if not first.startswith("# replaces: "):
        return text
    names = [name.strip() for name in first.removeprefix("# replaces: ").split(",")]
    item = registry.item(item_of(style))
    solution = (settings.REPO / str(item.checkpoint)).read_text()
    nodes = sorted((n for n in ast.parse(solution).body
                    if (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names)
                    or (isinstance(n, ast.Assign) and len(n.targets) == 1
                        and getattr(n.targets[0], "id", None) in names)), key=lambda n: n.lineno)
    assert len(nodes) == len(names), f"{style.name}: the solution does not define each of {names} once"
    lines = solution.splitlines(keepends=True)
    found, start = [], 0
    for k, node in enumerate(nodes):
        found += lines[start:node.lineno - 1] + ([text] if k == 0 else [])
        start = node.end_lineno or node.lineno
    return "".join(found + lines[start:])
