"""Part inside, inside DDP (notebooks 20-23): data parallelism by hand, sharding, model parallelism, hangs."""
from __future__ import annotations

from autograde.grading.items import Part, exercise
from autograde.parts.inside import checks, checks_hangs, checks_pipeline, checks_zero_memory
from autograde.parts.inside import checks_model_parallel as model_parallel

PART_ID = "inside_ddp"
BY_HAND, TENSOR, PIPELINE = "ddp_by_hand.py", "tensor_parallel.py", "pipeline_parallel.py"
HANGS, HANG_FILE = "23_debugging_hangs", "hang_training.py"
ITEMS = [
    exercise("naive_ddp", "DDP by hand: all-reduce every gradient", 2, PART_ID, "20_ddp_by_hand", BY_HAND,
             (checks.DDP_RUNS,), checks.check_naive_ddp),
    exercise("overlap_ddp", "DDP by hand: all-reduce during backward", 2, PART_ID, "20_ddp_by_hand", BY_HAND,
             (checks.DDP_RUNS,), checks.check_overlap_ddp),
    exercise("bucketed_ddp", "DDP by hand: buckets", 3, PART_ID, "20_ddp_by_hand", BY_HAND, (checks.DDP_RUNS,),
             checks.check_bucketed_ddp),
    exercise("zero", "ZeRO stage 1: a sharded optimizer", 3, PART_ID, "21_sharding", "sharded_optimizer.py",
             (checks.ZERO_RUNS,), checks.check_zero),
    exercise("zero_memory", "ZeRO-1: predict the bytes each rank holds", 1, PART_ID, "21_sharding",
             "sharded_optimizer.py", (checks.ZERO_RUNS, checks_zero_memory.ZERO_MEMORY_RUNS),
             checks_zero_memory.check_zero_memory),
    exercise("tensor_parallel", "tensor-parallel layers: f, g, column, row", 3, PART_ID, "22_model_parallel", TENSOR,
             (model_parallel.TENSOR_PARALLEL_RUNS,), model_parallel.check_tensor_parallel),
    exercise("two_d", "2-D parallelism: tensor parallel in pairs, data parallel across", 2, PART_ID,
             "22_model_parallel", TENSOR, (model_parallel.TWO_D_RUNS,), model_parallel.check_two_d),
    exercise("gpipe", "a pipeline with GPipe's schedule", 2, PART_ID, "22_model_parallel", PIPELINE,
             (checks_pipeline.STAGES_RUNS,), checks_pipeline.check_gpipe),
    exercise("1f1b", "a pipeline with 1F1B's schedule", 2, PART_ID, "22_model_parallel", PIPELINE,
             (checks_pipeline.STAGES_RUNS,), checks_pipeline.check_1f1b),
    exercise("interleaved", "interleaved 1F1B: two chunks per process, a smaller bubble", 2, PART_ID,
             "22_model_parallel", PIPELINE, (checks_pipeline.STAGES_RUNS,), checks_pipeline.check_interleaved),
    exercise("bubble", "predict the bubble of S stages and M micro-batches", 1, PART_ID, "22_model_parallel",
             PIPELINE, (checks_pipeline.BUBBLE_RUNS,), checks_pipeline.check_bubble),
    exercise("hang_finishes", "a training project that hangs: every rank reaches the end", 1, PART_ID, HANGS,
             HANG_FILE, (checks_hangs.HANG_RUNS,), checks_hangs.check_hang_finishes),
    exercise("hang_validation", "a training project that hangs: validation over uneven shards", 1, PART_ID, HANGS,
             HANG_FILE, (checks_hangs.HANG_RUNS,), checks_hangs.check_hang_validation),
    exercise("hang_same_steps", "a training project that hangs: the same steps on every rank", 1, PART_ID, HANGS,
             HANG_FILE, (checks_hangs.HANG_RUNS,), checks_hangs.check_hang_same_steps),
]
PART = Part(PART_ID, "Inside DDP: data parallelism by hand, sharding, model parallelism, hangs", "2[0-3]_*.ipynb",
            "2[0-3]_*", ("demos/no_sync_accumulation.py", "demos/fsdp_memory.py", "demos/hangs.py",
                         "solutions/fashion_mnist_after_step_10.py"), tuple(ITEMS))  # 10: notebook 21 weighs its model
