"""What the notebooks of the part "inside DDP" call: the hand-made DDPs timed against
DistributedDataParallel, and the bucket plan of a model. Every launch goes through lab.run."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from autograde.checker import functions
from autograde.notebook import lab

BY_HAND = "exercises/ddp_by_hand.py"


def compare(world_size: int = 2, steps: int | None = None, script: str = BY_HAND) -> dict[str, Any]:
    """Runs the exercise's own program: each wrapper trains beside DistributedDataParallel on
    `world_size` processes; returns rank 0's {wrapper: {"seconds": per step, "difference": from DDP}}."""
    with tempfile.TemporaryDirectory(prefix="ddp-lab-by-hand-") as folder:
        out = Path(folder) / "times.json"
        lab.run([sys.executable, lab.course_file(script), "--world-size", str(world_size),
                 "--steps", str(steps or (10 if lab.QUICK else 50)), "--json-file", str(out)], timeout=300)
        found: dict[str, Any] = json.loads(out.read_text())
    return found


def bucket_plan(model: Any, bucket_size_mb: float) -> list[list[str]]:
    """The names of the parameters in each of DDP's buckets for `model` (the checker's own plan)."""
    return [[name for name, _ in bucket] for bucket in functions.bucket_plan(model, bucket_size_mb)]
