"""The capstone (notebook 40): a byte-level GPT on Python's own sources, trained to a target loss as fast
as the learner can under the rules, against the handed-out baseline timed in the same grading."""
from __future__ import annotations

from autograde.grading.items import Part, exercise
from autograde.parts.capstone import checks

PART_ID = "capstone"
RUNS = (checks.BASELINE_RUNS, checks.LEARNER_RUNS)
ITEMS = [
    exercise("time_to_target", "data-parallel training to the target, under the rules", 4, PART_ID, "40_capstone",
             "capstone_lm.py", RUNS, checks.check_time_to_target),
    exercise("speedup_1", "the class's first speedup over the baseline", 1, PART_ID, "40_capstone",
             "capstone_lm.py", RUNS, checks.check_speedup_1),
    exercise("speedup_2", "the class's second speedup over the baseline", 1, PART_ID, "40_capstone",
             "capstone_lm.py", RUNS, checks.check_speedup_2),
]
PART = Part(PART_ID, "Capstone: time to a target quality on a new model and data set", "4[0-9]_*.ipynb", "4[0-9]_*",
            (), tuple(ITEMS))
