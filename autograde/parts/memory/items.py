"""Part memory, memory and precision (notebooks 27-): ZeRO-2 by hand."""
from __future__ import annotations

from autograde.grading.items import Part, exercise
from autograde.parts.memory import checks

PART_ID = "memory"
ITEMS = [
    exercise("zero2", "ZeRO-2: gradients reduce-scattered during backward, a shard kept", 3, PART_ID, "27_zero_2",
             "zero2.py", (checks.ZERO2_RUNS,), checks.check_zero2),
]
PART = Part(PART_ID, "Memory and precision: ZeRO-2 by hand", "2[7-9]_*.ipynb", "2[7-9]_*", (), tuple(ITEMS))
