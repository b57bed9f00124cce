"""Digests of the course's own code, by what it can change: a verdict, or a run itself."""
from __future__ import annotations

import hashlib
from functools import lru_cache

from autograde.settings import PACKAGE

# The code that can change a verdict: every file of the package but the course's tooling, the
# notebooks' helpers and figures (editing a figure keeps the verdicts).
VERDICT_CODE = ("**/*.py",)
NOT_VERDICT_CODE = ("course/**/*.py", "tools/**/*.py", "jupyter/**/*.py", "parts/*/notebook*.py")
# The code that runs inside the learner's processes and makes what their traces hold: the core's
# and each part's. A recorded run was made by it; a replay cannot show what a change to it does,
# only a new run can.
LEARNER_SIDE_CODE = ("inprocess/**/*.py", "parts/*/inprocess*.py")
# ... of it, what a part's tasks run: the core's, and the part's own in-process files and settings (its reports.py
# holds the tasks and the constants its in-process files read). A part's runs depend on no other part's.
CORE_LEARNER_SIDE = ("inprocess/**/*.py",)
PART_LEARNER_SIDE = ("parts/{part}/inprocess*.py", "parts/{part}/reports.py")
# ... less how a process starts: cold, or forked warm from a server that has imported torch. Both
# trace the same events (tests/core/test_warm_start.py compares them, event by event), so that a
# recording made cold stands for a run made warm, and the other way round.
STARTING_CODE = ("inprocess/_startup/*.py", "inprocess/warm_*.py")


def digest(patterns: tuple[str, ...], leave_out: tuple[str, ...] = ()) -> str:
    """One digest of every file of the package that the glob patterns name (less those that
    `leave_out` names), with their paths."""
    found = hashlib.sha256()
    left_out = {p for pattern in leave_out for p in PACKAGE.glob(pattern)}
    for path in sorted({p for pattern in patterns for p in PACKAGE.glob(pattern)} - left_out):
        found.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return found.hexdigest()


@lru_cache(maxsize=1)
def learner_side_version() -> str:
    """A digest of the code inside the learner's processes, kept with every recording of runs."""
    return digest(LEARNER_SIDE_CODE, STARTING_CODE)


@lru_cache(maxsize=None)
def part_learner_side_version(part: str) -> str:
    """A digest of the code inside the learner's processes when they run `part`'s tasks (the core's and the part's
    own), kept with every recording by part: a change to one part's in-process code leaves the other parts'
    recordings standing."""
    return digest(CORE_LEARNER_SIDE + tuple(p.format(part=part) for p in PART_LEARNER_SIDE), STARTING_CODE)


def parts_learner_side() -> dict[str, str]:
    """`part_learner_side_version` of every part of the package (each folder of parts/)."""
    return {folder.name: part_learner_side_version(folder.name) for folder in sorted((PACKAGE / "parts").iterdir())
            if (folder / "__init__.py").is_file()}
