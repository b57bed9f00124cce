"""The parts of the course, each a folder of its own (autograde/parts/<part>/), in the order a
learner meets them. Adding a part is a new folder and one line here.

Every part's folder holds the same files, by role (a part leaves out those it does not need):

- items.py: the part (`PART`: its nbgrader assignment, notebooks and handed-out files) and its
  graded items, each naming its check and the kinds of run the check reads;
- checks.py (checks_<topic>.py where a part has several topics): the checks, on the checker's side;
- reports.py: what crosses the process boundary: the tasks its checks ask for and what each rank
  reports (both sides import it);
- inprocess.py (inprocess_<topic>.py): what runs inside the learner's processes: an `install()`
  that the start-up code calls in every traced process, and the functions that perform its tasks;
- notebook.py (notebook_<topic>.py): what its notebooks call: demonstrations and figures.
- leaderboard.py (the capstone's): the class's table of graded runs, which grading records
  (`record`, for every learner it grades) and a service on the hub shows (leaderboard_service.py).

Both sides of the process boundary read this list: the checker to find every part's items
(autograde/grading/registry.py), the learner's processes to install every part's tracing
(autograde/inprocess/_startup/sitecustomize.py). So this module imports nothing.
"""
from __future__ import annotations

import importlib
from types import ModuleType

NAMES = (
    "lab",
    "talk",
    "launching",
    "scaling",
    "inside",
    "optimizers",
    "memory",
    "capstone",
)


def module(part: str, role: str) -> ModuleType | None:
    """The part's file for `role` ("items", "inprocess", ...), imported; None where it has none."""
    name = f"{__name__}.{part}.{role}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise
        return None


def of_role(role: str) -> list[ModuleType]:
    """Every part's file for `role`, in the parts' order."""
    return [found for part in NAMES if (found := module(part, role)) is not None]
