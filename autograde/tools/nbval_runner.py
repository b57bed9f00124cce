"""Running the course's notebooks the way CI does: top to bottom under nbval, in quick mode,
in a copy of the course where the finished solution stands in for the learner's file.

Used by tests/notebooks/test_notebooks.py and by `make bench`.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from autograde import settings
from autograde.engine import processes
from autograde.grading import registry

REPO, NOTEBOOKS = settings.REPO, settings.NOTEBOOKS


def learner_copy(folder: Path, script: Path = settings.SOLUTION) -> Path:
    """The course in `folder` as a learner has it, with `script` as their fashion_mnist.py and
    each exercise done (its solution in place of the TODO file)."""
    for name in ("notebooks", "exercises", "solutions", "demos"):
        shutil.copytree(REPO / name, folder / name)
    shutil.copy(script, folder / "fashion_mnist.py")
    for item in registry.ITEMS:
        if item.part != registry.FIRST and item.checkpoint:
            shutil.copy(REPO / item.checkpoint, folder / item.file)
    return folder


def nbval(folder: Path, *paths: Path | str, timeout: float, env: dict[str, str] | None = None) -> processes.Result:
    """`pytest --nbval-lax` on `paths` in `folder`, in quick mode; the kernels use this interpreter."""
    return processes.run([processes.PYTHON, "-m", "pytest", "--nbval-lax", "--nbval-cell-timeout=900", "-p",
                       "no:cacheprovider", "-q", "-o", "addopts=", *paths], cwd=folder, timeout=timeout,
                      env={settings.QUICK: "1", **(env or {})})
