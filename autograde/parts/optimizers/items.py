"""Part optimizers, optimizers for large batches (notebooks 24-26): LARS, K-FAC, K-FAC distributed."""
from __future__ import annotations

from autograde.grading.items import Part, exercise
from autograde.parts.optimizers import checks, checks_traffic

PART_ID = "optimizers"
ITEMS = [
    exercise("lars", "LARS: a trust ratio per layer", 2, PART_ID, "24_lars", "lars.py", (checks.LARS_RUNS,),
             checks.check_lars),
    exercise("kfac", "K-FAC on one process", 3, PART_ID, "25_kfac", "kfac.py", (checks.KFAC_RUNS,), checks.check_kfac),
    exercise("kfac_distributed", "K-FAC distributed layer by layer", 3, PART_ID, "26_kfac_distributed", "kfac.py",
             (checks.KFAC_RUNS,), checks.check_kfac_distributed),
    exercise("kfac_traffic", "predict what distributed K-FAC communicates", 1, PART_ID, "26_kfac_distributed",
             "kfac_traffic.py", (checks_traffic.TRAFFIC_RUNS,), checks_traffic.check_kfac_traffic),
]
PART = Part(PART_ID, "Optimizers for large batches: LARS, K-FAC, K-FAC distributed layer by layer", "2[4-6]_*.ipynb",
            "2[4-6]_*", (), tuple(ITEMS))
