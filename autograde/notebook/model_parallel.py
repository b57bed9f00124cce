"""What notebook 22 (model parallelism) calls: demos/model_parallel.py launched through lab.run
(a time limit, nothing left running), and the pipeline's bubble read from its timeline."""
from __future__ import annotations

from typing import Any

from autograde.notebook import inside

SCRIPT = "demos/model_parallel.py"


def run(demo: str = "all", world_size: int = 2, micro_batches: int = 4) -> dict[str, Any]:
    """The demonstration(s) on `world_size` processes: {"differences": {demo: largest difference
    from the unsplit computation}, "stages": {rank: [(kind, micro-batch, start, end), ...]}}."""
    return inside.json_run(SCRIPT, "--world-size", str(world_size), "--demo", demo,
                           "--micro-batches", str(micro_batches))


def bubble(stages: dict[str, list[Any]]) -> float:
    """The share of the step the stages spent idle: 1 - (time busy, summed over the stages) /
    (stages x the step's length, from the first start to the last end)."""
    spans = [e for events in stages.values() for e in events]
    if not spans:
        raise ValueError("no pipeline events: run the pipeline demonstration")
    length = max(e[3] for e in spans) - min(e[2] for e in spans)
    busy = sum(e[3] - e[2] for e in spans)
    return 1 - busy / (len(stages) * length)


def ideal_bubble(stages: int, micro_batches: int) -> float:
    """GPipe's idle share with equal stages and free communication: (S - 1) / (M + S - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)

