"""Part scaling (notebooks 17-19): measure it, model it, find where the time goes, large batches."""
from __future__ import annotations

from autograde.grading.items import Part, exercise
from autograde.parts.scaling import checks, checks_batches, checks_timed

PART_ID = "scaling"
LARGE_BATCH = "large_batch_training.py"
ITEMS = [
    exercise("scaling", "speedup, efficiency and a fitted T(N)", 2, PART_ID, "17_scaling_study", "scaling_model.py",
             (checks.SCALING_RUNS,), checks.check_scaling),
    exercise("input_pipeline", "the bottleneck of an input pipeline, found and removed", 2, PART_ID, "18_where_time_goes",
             "input_pipeline.py", (checks_timed.PIPELINE_RUNS,), checks_timed.check_input_pipeline),
    # nbgrader has no "not applicable": a GPU-only item graded on a CPU would give a free point or a
    # zero. It is judged (n/a without 2 GPUs) and reported, but worth no points, like the Optional step.
    exercise("speedup", "a speedup of 1.6 or more on 2 GPUs", 0, PART_ID, "18_where_time_goes", LARGE_BATCH,
             (checks_timed.SPEED_RUNS,), checks_timed.check_speedup, needs_gpu=True),
    exercise("large_batch", "a large-batch plan that reaches the target accuracy in the budget", 2, PART_ID,
             "19_large_batches", LARGE_BATCH, (checks_batches.LARGE_BATCH_RUNS, checks_batches.SCHEDULE_CALLS),
             checks_batches.check_large_batch),
    exercise("lr_scaling", "your schedule's rate in every optimizer step", 2, PART_ID, "19_large_batches", LARGE_BATCH,
             (checks_batches.LARGE_BATCH_RUNS, checks_batches.SCHEDULE_CALLS), checks_batches.check_lr_scaling),
]
PART = Part(PART_ID, "Scaling: measure it, model it, find where the time goes, train with large batches",
            "1[7-9]_*.ipynb", "1[7-9]_*", ("demos/speed_fixes.py",), tuple(ITEMS))
