"""Part launching, launching for real (notebooks 14-16): scripts started by torchrun, killed,
restarted, and submitted to SLURM."""
from __future__ import annotations

from autograde.grading.items import Part, exercise
from autograde.parts.launching import checks, checks_elastic, checks_slurm

PART_ID = "launching"
ITEMS = [
    exercise("torchrun", "the finished lab, launched by torchrun", 2, PART_ID, "14_torchrun",
             "fashion_mnist_torchrun.py", (checks.TORCHRUN_RUNS,), checks.check_torchrun),
    exercise("checkpoint", "a checkpoint every epoch, written safely", 2, PART_ID, "15_fault_tolerance",
             "resume_training.py", (checks.CHECKPOINT_RUNS,), checks.check_checkpoint),
    exercise("resume", "resume after a worker is killed", 2, PART_ID, "15_fault_tolerance", "resume_training.py",
             (checks.CHECKPOINT_RUNS, checks.RESTART_RUNS), checks.check_resume),
    exercise("elastic", "what elastic torchrun does, predicted", 2, PART_ID, "15_fault_tolerance",
             "elastic_predictions.py", (checks_elastic.ELASTIC_RUNS,), checks_elastic.check_elastic),
    exercise("slurm_env", "SLURM's variables mapped to PyTorch's", 2, PART_ID, "16_slurm", "slurm_env.py",
             (checks_slurm.SLURM_ENV_RUNS,), checks_slurm.check_slurm_env),
    exercise("slurm_job", "a batch script that starts the job's tasks", 2, PART_ID, "16_slurm", "slurm_job.sbatch",
             (checks_slurm.SLURM_JOB_RUNS,), checks_slurm.check_slurm_job),
]
PART = Part(PART_ID, "Launching for real: torchrun, checkpoints and restarts, SLURM, nodes that never arrive",
            "1[4-6]_*.ipynb", "1[4-6]_*", ("solutions/fashion_mnist_after_step_10.py",  # where notebook 14 starts
                                           "demos/slurm/srun_one_task_per_gpu.sbatch",
                                           "demos/slurm/srun_torchrun_per_node.sbatch",
                                           "demos/slurm/save_on_usr1.sbatch", "demos/slurm/save_on_usr1.py",
                                           "demos/mpi/mpirun_fashion_mnist.sh"), tuple(ITEMS))
