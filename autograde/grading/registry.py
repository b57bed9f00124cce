"""Every graded item of the course, gathered from its parts: the single source of an item's facts.

An item is one thing a learner does and a check judges: a step of the lab, an exercise of a
later part. Each part declares its own in autograde/parts/<part>/items.py (`PART` and `ITEMS`);
this module reads every part's, in the order of autograde/parts/__init__.py, and knows no part by
name. An item's entry says what it is called, what it is worth, which file of the learner's it
reads, which checkpoint shows it done, which kinds of run its check reads and which function is
its check. Everything else is derived from here or tested against it: `make check` and
`autograde.assert_step`, the progress table, the order in which earlier failures are named, the
nbgrader grade cells' points (tests/grading/test_registry.py), the checkpoints' tests and the
kept-verdict cache.
"""
from __future__ import annotations

from autograde import parts
from autograde.engine.workspace import RunKind, kind_name
from autograde.grading.items import Item, Layout, Part

__all__ = ["Item", "Layout", "Part", "PARTS", "ITEMS", "PART", "IDS", "FIRST", "FIRST_ITEMS", "item", "label"]


class RegistryError(Exception):
    """Two parts declare one item id, or one kind of run."""


def _gather() -> tuple[list[Part], list[Item]]:
    found_parts: list[Part] = []
    found_items: list[Item] = []
    for module in parts.of_role("items"):
        found_parts.append(module.PART)
        found_items += module.PART.items
    ids = [i.id for i in found_items]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise RegistryError(f"items declared twice: {', '.join(twice)}")
    kinds: dict[str, RunKind] = {}
    for item in found_items:
        for kind in item.reads:
            if kinds.setdefault(kind.name, kind) is not kind:
                raise RegistryError(f"two kinds of run are named {kind.name!r}: name each part's kinds apart")
    return found_parts, found_items


PARTS, ITEMS = _gather()
PART = {part.id: part for part in PARTS}
BY_ID = {item.id: item for item in ITEMS}
IDS = [item.id for item in ITEMS]  # in the order a learner does them
FIRST = PARTS[0].id  # the course's first part (the lab): what a command that names no part is about
FIRST_ITEMS = [i.id for i in ITEMS if i.part == FIRST]  # what `check --all` and progress() check


def item(id: str) -> Item:
    return BY_ID[id]


def label(id: str) -> str:
    """How verdicts, and the learner's file, name an item: Step 4, Optional, pi."""
    return BY_ID[id].label


def kinds_of(ids: list[str]) -> set[RunKind]:
    """The kinds of run the items' checks read."""
    return {kind for i in ids for kind in BY_ID[i].reads}


def reads_run(id: str, key: str) -> bool:
    """Whether the item's check reads the run kept under `key`."""
    return kind_name(key) in {kind.name for kind in BY_ID[id].reads}


def answered_by(made: set[str]) -> list[str]:
    """The items whose checks read only runs of the kinds in `made` (an item that reads no run is
    always answered): those that may be judged from these runs alone. One may still need a run of
    those kinds that was not made (each ddp_by_hand item its own wrapper's): the checker then
    leaves it to be judged when asked (autograde/grading/api.py)."""
    names = {kind_name(key) for key in made}
    return [i.id for i in ITEMS if {kind.name for kind in i.reads} <= names]
