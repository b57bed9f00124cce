"""Part talk, how processes talk (notebooks 10-13): exercises/*.py, each launched as a learner would."""
from __future__ import annotations

from autograde.engine.workspace import RunKind
from autograde.grading.items import Check, Item, Part, exercise
from autograde.parts.talk import checks

PART_ID = "processes_talk"


def _item(id: str, title: str, points: int, notebook: str, name: str, reads: RunKind, check: Check) -> Item:
    return exercise(id, title, points, PART_ID, notebook, name, (reads,), check)


ITEMS = [
    _item("predict", "predict what collectives do", 1, "10_collectives", "predict_collectives.py",
          checks.COLLECTIVES_RUNS, checks.check_predict),
    _item("pi", "compute pi with all_reduce", 2, "11_compute_pi", "compute_pi.py", checks.PI_RUNS, checks.check_pi),
    _item("sampler", "a distributed sampler of your own", 2, "12_samplers", "shard_sampler.py", checks.SAMPLER_RUNS,
          checks.check_sampler),
    _item("ring", "ring all-reduce with send and recv", 3, "13_ring_allreduce", "ring_allreduce.py", checks.RING_RUNS,
          checks.check_ring),
]
PART = Part(PART_ID, "How processes talk: ranks, collectives, compute pi, samplers, ring all-reduce", "1[0-3]_*.ipynb",
            "1[0-3]_*", ("demos/hello_ranks.py",), tuple(ITEMS))
