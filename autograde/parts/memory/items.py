"""Part memory, memory and precision (notebooks 30-): ZeRO-2 and ZeRO-3 by hand; LAMB beside part 6's LARS; fp16 loss
scaling; activation checkpointing; bf16 master weights and a bf16 hook; the bytes per rank predicted; gradient
accumulation in part 5's bucketed DDP; K-FAC for convolutions."""
from __future__ import annotations

from autograde.grading.items import Part, exercise
from autograde.parts.memory import checks, checks_accumulation, checks_budget, checks_kfac, checks_zero

PART_ID = "memory"
ITEMS = [
    exercise("memory_budget", "where memory goes: bytes per rank predicted for DDP and ZeRO 1-3, then measured", 2,
             PART_ID, "36_memory_budget", "memory_budget.py", (checks_budget.BUDGET_RUNS,), checks_budget.check_memory_budget),
    exercise("zero2", "ZeRO-2: gradients reduce-scattered during backward, a shard kept", 3, PART_ID, "30_zero_2",
             "zero2.py", (checks_zero.ZERO2_RUNS,), checks_zero.check_zero2),
    exercise("zero3", "ZeRO-3 (FSDP) by hand: each unit gathered just before it runs, freed after", 3, PART_ID,
             "34_zero_3", "zero3.py", (checks_zero.ZERO3_RUNS,), checks_zero.check_zero3),
    exercise("zero3_prefetch", "ZeRO-3: the next unit's gather under way while a unit runs", 1, PART_ID, "34_zero_3",
             "zero3.py", (checks_zero.ZERO3_RUNS,), checks_zero.check_zero3_prefetch),
    exercise("lamb", "LAMB: a trust ratio on Adam's update", 2, PART_ID, "31_lamb", "lamb.py", (checks.LAMB_RUNS,),
             checks.check_lamb),
    exercise("loss_scaling", "fp16 dynamic loss scaling: GradScaler's decisions by hand", 2, PART_ID,
             "32_loss_scaling", "loss_scaling.py", (checks.LOSS_SCALING_RUNS,), checks.check_loss_scaling),
    exercise("checkpointing", "activation checkpointing: with torch.utils.checkpoint, and by hand", 3, PART_ID,
             "33_checkpointing", "checkpointing.py", (checks.CHECKPOINT_RUNS,), checks.check_checkpointing),
    exercise("bf16", "bf16: fp32 master weights, and gradients all-reduced in bf16", 2, PART_ID, "35_bf16",
             "bf16_training.py", (checks.BF16_RUNS,), checks.check_bf16),
    exercise("kfac_conv", "K-FAC for convolutions: factors from patches, a damped inverse", 2, PART_ID, "38_kfac_conv",
             "kfac_conv.py", (checks_kfac.KFAC_CONV_RUNS,), checks_kfac.check_kfac_conv),
    exercise("accumulation", "gradient accumulation in your own bucketed DDP: no_sync, one all-reduce per bucket",
             2, PART_ID, "37_accumulation", "accumulation.py", (checks_accumulation.ACCUMULATION_RUNS,),
             checks_accumulation.check_accumulation),
]
PART = Part(PART_ID, "Memory and precision: ZeRO-2 and ZeRO-3 by hand, LAMB, loss scaling, checkpointing, bf16", "3[0-9]_*.ipynb",
            "3[0-9]_*", (), tuple(ITEMS))
