"""What a part declares in its items.py: the part itself (`Part`), its graded items (`Item`), and the
graders' hidden layouts (`Layout`). autograde/grading/registry.py gathers every part's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autograde.engine.verdicts import Measured
from autograde.engine.workspace import RunKind, Workspace


@dataclass(frozen=True)
class Layout:
    """A simulated layout a grader checks an item with, besides the default 2 nodes x 2: a hidden test."""

    procs_per_node: int
    nodes: int
    why: str


@dataclass(frozen=True)
class Item:
    """One graded item and everything that is known about it."""

    id: str                 # what learners type: assert_step("6.5"), make check STEP=6.5
    title: str
    points: int             # 0: checked, but not graded
    part: str               # the nbgrader assignment it belongs to
    notebook: str           # the notebook whose check cell (and grade cell) runs it
    file: str               # the learner's file the check reads, relative to the course folder
    checkpoint: str | None  # the course's file with this item done (6.5 shares 6's; Optional, 7's)
    reads: tuple[RunKind, ...]  # the kinds of run its check reads (none: it reads the source)
    check: Callable[[Workspace], str | Measured | None]  # what it observed, or None: cannot apply on this machine
    needs_gpu: bool = False  # it can only be judged where there are GPUs
    todo: str = ""           # the words after "# TODO" that mark it in the learner's file (default: its id)
    # The graders' hidden tests: more layouts its grade cell checks when grading (learners never see
    # them; `make release` writes them into the source assignment's grade cells, autograde/course/)
    hidden: tuple[Layout, ...] = ()

    @property
    def graded(self) -> bool:
        return self.points > 0

    @property
    def label(self) -> str:
        """What the learner's file calls it: `# TODO Step 4`, `# TODO Optional`, `# TODO pi`."""
        return self.todo or self.id

    @property
    def grade_id(self) -> str:
        """The nbgrader grade cell's id: step_6_5."""
        return f"step_{self.id.replace('.', '_')}"


@dataclass(frozen=True)
class Part:
    """A part of the course: one nbgrader assignment, its notebooks and the files handed out with it."""

    id: str
    title: str
    notebooks: str             # a glob of its notebooks in notebooks/
    graded: str                # a glob of those with grade cells (grading runs only these)
    extra_files: tuple[str, ...] = ()  # handed out besides the files its items read

    items: tuple[Item, ...] = ()      # its graded items, in the order a learner does them

    @property
    def files(self) -> list[str]:
        """The learner's files of the part: those its items read, then the extras."""
        return list(dict.fromkeys([*(i.file for i in self.items), *self.extra_files]))

    @property
    def graded_notebooks(self) -> list[str]:
        return list(dict.fromkeys(i.notebook for i in self.items if i.graded))


Check = Callable[[Workspace], "str | Measured | None"]


def exercise(id: str, title: str, points: int, part: str, notebook: str, name: str, reads: tuple[RunKind, ...],
             check: Check, needs_gpu: bool = False) -> Item:
    """An item of a later part: the exercise file exercises/<name>, its finished version solutions/<name>,
    marked `# TODO <id>`."""
    return Item(id, title, points, part, notebook, f"exercises/{name}", f"solutions/{name}", reads, check, needs_gpu)
