"""Where the course's files are, written once: the repository, the solutions, and the lookup a
notebook or a command uses for a course file (the folder it runs in, then one folder up)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
SOLUTION = SOLUTIONS / "fashion_mnist_after_step_10.py"  # the finished lab
STARTER = REPO / "fashion_mnist.py"
NOTEBOOKS = REPO / "notebooks"


def course_file(relative: str | Path) -> Path:
    """A file of the course as a learner's folder holds it: here, else one folder up (a notebook
    runs in notebooks/, a terminal in the course folder). FileNotFoundError when in neither."""
    for folder in (Path.cwd(), Path.cwd().parent):
        if (folder / relative).exists():
            return folder / relative
    raise FileNotFoundError(f"{relative} is neither here ({Path.cwd()}) nor one folder up")


def learner_script(path: str | Path | None = None, default: str = "fashion_mnist.py") -> Path:
    """The learner's script: `path`, else `default` (a path in the course folder, such as
    exercises/compute_pi.py) found by `course_file` (else that path here)."""
    if path is not None:
        return Path(path)
    try:
        return course_file(default)
    except FileNotFoundError:
        return Path(default)
