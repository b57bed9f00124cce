"""Every graded item of the course, in one place: the single source of its facts.

An item is one thing a learner does and a check judges: a step of the lab today, an exercise of
a later part tomorrow. Its entry says what it is called, what it is worth, which file of the
learner's it reads, which checkpoint shows it done, which runs its check needs and which
function is its check. Everything else is derived from here or tested against it: `make check`
and `autograde.assert_step`, the progress table, the order in which earlier failures are
named, the nbgrader grade cells' points (tests/test_registry.py), the checkpoints' tests and the
kept-verdict cache.

To add a graded exercise: write its check in autograde/checks/<part>.py, then add one `Item` here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autograde.checker.runs import Family, Workspace, family
from autograde.checks import (inside, inside_hangs, inside_model_parallel, lab, launching, launching_slurm,
                             optimizers, scaling, talk)

@dataclass(frozen=True)
class Layout:
    """A simulated layout a grader checks an item with, besides the default 2 nodes x 2: a hidden test."""

    procs_per_node: int
    nodes: int
    why: str


ONE_NODE_OF_3 = Layout(procs_per_node=3, nodes=1, why="3 processes on one node")
THREE_NODES_OF_1 = Layout(procs_per_node=1, nodes=3, why="3 nodes of one process: each is local rank 0")


@dataclass(frozen=True)
class Item:
    """One graded item and everything that is known about it."""

    id: str                 # what learners type: assert_step("6.5"), make check STEP=6.5
    title: str
    points: int             # 0: checked, but not graded
    part: str               # the nbgrader assignment it belongs to
    notebook: str           # the notebook whose check cell (and grade cell) runs it
    file: str               # the learner's file the check reads, relative to the course folder
    checkpoint: str | None  # the course's file with this item done (6.5 shares 6's; Optional, 7's)
    runs: tuple[Family, ...]  # the kinds of run its check reads (none: it reads the source)
    check: Callable[[Workspace], str | None]  # what it observed, or None: cannot apply on this machine
    needs_gpu: bool = False  # it can only be judged where there are GPUs
    todo: str = ""           # the words after "# TODO" that mark it in the learner's file (default: Step <id>)
    # The graders' hidden tests: more layouts its grade cell checks when grading (learners never see
    # them; `make release` writes them into the source assignment's grade cells, autograde/course/)
    hidden: tuple[Layout, ...] = ()

    @property
    def graded(self) -> bool:
        return self.points > 0

    @property
    def label(self) -> str:
        """What the learner's file calls it: `# TODO Step 4`, `# TODO Optional`, `# TODO pi`."""
        if self.todo:
            return self.todo
        return "Optional" if self.id == "optional" else f"Step {self.id}"

    @property
    def grade_id(self) -> str:
        """The nbgrader grade cell's id: step_6_5."""
        return f"step_{self.id.replace('.', '_')}"


LAB = "ddp_lab"  # the core lab's part (nbgrader assignment): the steps of fashion_mnist.py


def _step(id: str, title: str, points: int, notebook: str, checkpoint: int, runs: tuple[Family, ...],
          check: Callable[[Workspace], str | None], needs_gpu: bool = False, hidden: tuple[Layout, ...] = ()) -> Item:
    return Item(id, title, points, LAB, notebook, "fashion_mnist.py",
                f"solutions/fashion_mnist_after_step_{checkpoint}.py", runs, check, needs_gpu, hidden=hidden)


S, W, P = (Family.SETUP,), (Family.WORKERS,), (Family.PROGRAM,)
ITEMS: list[Item] = [
    _step("0", "import torch.distributed", 1, "03_steps_0_to_2", 0, (), lab.check_0),
    _step("1", "the layout's arguments", 1, "03_steps_0_to_2", 1, S, lab.check_1),
    _step("2", "world size and rendezvous address", 1, "03_steps_0_to_2", 2, S, lab.check_2),
    _step("3", "a function per process", 1, "04_steps_3_to_5", 3, W, lab.check_3),
    _step("4", "join the process group", 2, "04_steps_3_to_5", 4, W, lab.check_4,
          hidden=(ONE_NODE_OF_3,)),
    _step("5", "one download per node", 2, "04_steps_3_to_5", 5, W, lab.check_5,
          hidden=(THREE_NODES_OF_1,)),
    _step("6", "DistributedSampler", 2, "05_step_6_sampler", 6, W, lab.check_6,
          hidden=(ONE_NODE_OF_3,)),
    _step("6.5", "set_epoch", 1, "05_step_6_sampler", 6, W, lab.check_6_5),
    _step("optional", "SyncBatchNorm", 0, "06_step_7_ddp", 7, P, lab.check_optional, needs_gpu=True),
    _step("7", "DistributedDataParallel", 2, "06_step_7_ddp", 7, W, lab.check_7),
    _step("8", "throughput over all processes", 2, "07_steps_8_and_9", 8, W, lab.check_8,
          hidden=(ONE_NODE_OF_3,)),
    _step("9", "global validation metrics", 2, "07_steps_8_and_9", 9, W, lab.check_9,
          hidden=(ONE_NODE_OF_3,)),
    _step("10", "mp.spawn and several nodes", 3, "08_step_10_launch", 10, (Family.PROGRAM, Family.TWO_NODES), lab.check_10),
]
TALK = "processes_talk"  # the part "how processes talk": exercises/*.py, each launched as a learner would
ITEMS += [
    Item("predict", "predict what collectives do", 1, TALK, "10_collectives", "exercises/predict_collectives.py",
         "solutions/predict_collectives.py", (Family.COLLECTIVES,), talk.check_predict, todo="predict"),
    Item("pi", "compute pi with all_reduce", 2, TALK, "11_compute_pi", "exercises/compute_pi.py",
         "solutions/compute_pi.py", (Family.PI,), talk.check_pi, todo="pi"),
    Item("sampler", "a distributed sampler of your own", 2, TALK, "12_samplers", "exercises/shard_sampler.py",
         "solutions/shard_sampler.py", (Family.SAMPLER,), talk.check_sampler, todo="sampler"),
    Item("ring", "ring all-reduce with send and recv", 3, TALK, "13_ring_allreduce", "exercises/ring_allreduce.py",
         "solutions/ring_allreduce.py", (Family.RING,), talk.check_ring, todo="ring"),
]
LAUNCH = "launching"  # the part "launching for real": scripts started by torchrun, killed, restarted
ITEMS += [
    Item("torchrun", "the finished lab, launched by torchrun", 2, LAUNCH, "14_torchrun",
         "exercises/fashion_mnist_torchrun.py", "solutions/fashion_mnist_torchrun.py", (Family.TORCHRUN,),
         launching.check_torchrun, todo="torchrun"),
    Item("checkpoint", "a checkpoint every epoch, written safely", 2, LAUNCH, "15_fault_tolerance",
         "exercises/resume_training.py", "solutions/resume_training.py", (Family.CHECKPOINT,), launching.check_checkpoint,
         todo="checkpoint"),
    Item("resume", "resume after a worker is killed", 2, LAUNCH, "15_fault_tolerance", "exercises/resume_training.py",
         "solutions/resume_training.py", (Family.CHECKPOINT, Family.RESTART), launching.check_resume, todo="resume"),
    Item("slurm_env", "SLURM's variables mapped to PyTorch's", 2, LAUNCH, "16_slurm", "exercises/slurm_env.py",
         "solutions/slurm_env.py", (Family.SLURM_ENV,), launching_slurm.check_slurm_env, todo="slurm_env"),
    Item("slurm_job", "a batch script that starts the job's tasks", 2, LAUNCH, "16_slurm", "exercises/slurm_job.sbatch",
         "solutions/slurm_job.sbatch", (Family.SLURM_JOB,), launching_slurm.check_slurm_job, todo="slurm_job"),
]
SCALE = "scaling"  # the part "scaling": measure it, model it, find where the time goes, large batches
ITEMS += [
    Item("scaling", "speedup, efficiency and a fitted T(N)", 2, SCALE, "17_scaling_study", "exercises/scaling_model.py",
         "solutions/scaling_model.py", (Family.SCALING,), scaling.check_scaling, todo="scaling"),
    Item("input_pipeline", "an input pipeline that keeps up with training", 2, SCALE, "18_where_time_goes",
         "exercises/input_pipeline.py", "solutions/input_pipeline.py", (Family.PIPELINE,), scaling.check_input_pipeline,
         todo="input_pipeline"),
    # nbgrader has no "not applicable": a GPU-only item graded on a CPU would give a free point or a
    # zero. It is judged (n/a without 2 GPUs) and reported, but worth no points, like the Optional step.
    Item("speedup", "a speedup of 1.6 or more on 2 GPUs", 0, SCALE, "18_where_time_goes",
         "exercises/large_batch_training.py", "solutions/large_batch_training.py", (Family.SPEED,), scaling.check_speedup,
         needs_gpu=True, todo="speedup"),
    Item("warmup", "a warm-up to the linearly scaled learning rate", 2, SCALE, "19_large_batches",
         "exercises/large_batch_training.py", "solutions/large_batch_training.py", (Family.WARMUP,), scaling.check_warmup,
         todo="warmup"),
    Item("lr_scaling", "the scaled rate in every optimizer step", 2, SCALE, "19_large_batches",
         "exercises/large_batch_training.py", "solutions/large_batch_training.py", (Family.LR,), scaling.check_lr_scaling,
         todo="lr_scaling"),
]
INSIDE = "inside_ddp"  # the part "inside DDP": data parallelism by hand, sharding, model parallelism, hangs
ITEMS += [
    Item("naive_ddp", "DDP by hand: all-reduce every gradient", 2, INSIDE, "20_ddp_by_hand", "exercises/ddp_by_hand.py",
         "solutions/ddp_by_hand.py", (Family.DDP,), inside.check_naive_ddp, todo="naive_ddp"),
    Item("overlap_ddp", "DDP by hand: all-reduce during backward", 2, INSIDE, "20_ddp_by_hand",
         "exercises/ddp_by_hand.py", "solutions/ddp_by_hand.py", (Family.DDP,), inside.check_overlap_ddp, todo="overlap_ddp"),
    Item("bucketed_ddp", "DDP by hand: buckets", 3, INSIDE, "20_ddp_by_hand", "exercises/ddp_by_hand.py",
         "solutions/ddp_by_hand.py", (Family.DDP,), inside.check_bucketed_ddp, todo="bucketed_ddp"),
    Item("zero", "ZeRO stage 1: a sharded optimizer", 3, INSIDE, "21_sharding", "exercises/sharded_optimizer.py",
         "solutions/sharded_optimizer.py", (Family.ZERO,), inside.check_zero, todo="zero"),
    Item("tensor_parallel", "tensor-parallel layers: f, g, column, row", 3, INSIDE, "22_model_parallel",
         "exercises/tensor_parallel.py", "solutions/tensor_parallel.py", (Family.TENSOR_PARALLEL,),
         inside_model_parallel.check_tensor_parallel, todo="tensor_parallel"),
    Item("two_d", "2-D parallelism: tensor parallel in pairs, data parallel across", 2, INSIDE, "22_model_parallel",
         "exercises/tensor_parallel.py", "solutions/tensor_parallel.py", (Family.TWO_D,), inside_model_parallel.check_two_d,
         todo="two_d"),
    Item("gpipe", "a pipeline with GPipe's schedule", 2, INSIDE, "22_model_parallel", "exercises/pipeline_parallel.py",
         "solutions/pipeline_parallel.py", (Family.STAGES,), inside_model_parallel.check_gpipe, todo="gpipe"),
    Item("1f1b", "a pipeline with 1F1B's schedule", 2, INSIDE, "22_model_parallel", "exercises/pipeline_parallel.py",
         "solutions/pipeline_parallel.py", (Family.STAGES,), inside_model_parallel.check_1f1b, todo="1f1b"),
    Item("hang_collective", "fix a hang: a collective on one rank", 1, INSIDE, "23_debugging_hangs",
         "exercises/hang_collective.py", "solutions/hang_collective.py", (Family.HANG,), inside_hangs.check_hang_collective,
         todo="hang_collective"),
    Item("hang_uneven", "fix a hang: uneven batches", 1, INSIDE, "23_debugging_hangs", "exercises/hang_uneven.py",
         "solutions/hang_uneven.py", (Family.HANG,), inside_hangs.check_hang_uneven, todo="hang_uneven"),
    Item("hang_early_stop", "fix a hang: early stopping decided on rank 0", 1, INSIDE, "23_debugging_hangs",
         "exercises/hang_early_stop.py", "solutions/hang_early_stop.py", (Family.HANG,), inside_hangs.check_hang_early_stop,
         todo="hang_early_stop"),
]
OPTIMIZERS = "optimizers"  # the part "optimizers for large batches": LARS, K-FAC, K-FAC distributed
ITEMS += [
    Item("lars", "LARS: a trust ratio per layer", 2, OPTIMIZERS, "24_lars", "exercises/lars.py", "solutions/lars.py",
         (Family.LARS,), optimizers.check_lars, todo="lars"),
    Item("kfac", "K-FAC on one process", 3, OPTIMIZERS, "25_kfac", "exercises/kfac.py", "solutions/kfac.py",
         (Family.KFAC,), optimizers.check_kfac, todo="kfac"),
    Item("kfac_distributed", "K-FAC distributed layer by layer", 3, OPTIMIZERS, "26_kfac_distributed",
         "exercises/kfac.py", "solutions/kfac.py", (Family.KFAC,), optimizers.check_kfac_distributed,
         todo="kfac_distributed"),
]
STEPS = [item.id for item in ITEMS]  # in the order a learner does them
LAB_STEPS = [item.id for item in ITEMS if item.part == LAB]  # the lab's, what `check --all` and progress() check
BY_ID = {item.id: item for item in ITEMS}


@dataclass(frozen=True)
class Part:
    """A part of the course: one nbgrader assignment, its notebooks and the files handed out with it."""

    id: str
    short: str                 # its files' name: autograde/checks/<short>.py, learner_processes/<short>.py, notebook/<short>.py
    title: str
    notebooks: str             # a glob of its notebooks in notebooks/
    graded: str                # a glob of those with grade cells (grading runs only these)
    extra_files: tuple[str, ...] = ()  # handed out besides the files its items read

    @property
    def files(self) -> list[str]:
        """The learner's files of the part: those its items read, then the extras."""
        read = [i.file for i in ITEMS if i.part == self.id]
        return list(dict.fromkeys([*read, *self.extra_files]))

    @property
    def graded_notebooks(self) -> list[str]:
        return list(dict.fromkeys(i.notebook for i in ITEMS if i.part == self.id and i.graded))


PARTS = [
    Part(LAB, "lab", "The DDP Lab: fashion_mnist.py, Steps 0-10", "0*.ipynb", "*step*",
         ("demos/big_batch_equivalence.py",)),
    Part(TALK, "talk", "How processes talk: ranks, collectives, compute pi, samplers, ring all-reduce", "1[0-3]_*.ipynb",
         "1[0-3]_*", ("demos/hello_ranks.py",)),
    Part(LAUNCH, "launching", "Launching for real: torchrun, checkpoints and restarts, SLURM, nodes that never arrive",
         "1[4-6]_*.ipynb", "1[4-6]_*", ("solutions/fashion_mnist_after_step_10.py",  # where notebook 14 starts
                                         "demos/slurm/srun_one_task_per_gpu.sbatch",
                                         "demos/slurm/srun_torchrun_per_node.sbatch",
                                         "demos/mpi/mpirun_fashion_mnist.sh")),
    Part(SCALE, "scaling", "Scaling: measure it, model it, find where the time goes, train with large batches",
         "1[7-9]_*.ipynb", "1[7-9]_*", ("demos/speed_fixes.py",)),
    Part(INSIDE, "inside", "Inside DDP: data parallelism by hand, sharding, model parallelism, hangs", "2[0-3]_*.ipynb",
         "2[0-3]_*", ("demos/no_sync_accumulation.py", "demos/fsdp_memory.py", "demos/hangs.py",
                     "solutions/fashion_mnist_after_step_10.py")),  # 10: notebook 21 weighs its model
    Part(OPTIMIZERS, "optimizers", "Optimizers for large batches: LARS, K-FAC, K-FAC distributed layer by layer",
         "2[4-6]_*.ipynb", "2[4-6]_*"),
]
PART = {part.id: part for part in PARTS}


def item(id: str) -> Item:
    return BY_ID[id]


def answered_by(made: set[str]) -> list[str]:
    """The items whose checks read only runs of the kinds in `made` (an item that reads no run is
    always answered): those that may be judged from these runs alone. One may still need a run of
    those kinds that was not made (each ddp_by_hand item its own wrapper's): the checker then
    leaves it to be judged when asked (autograde/checker/api.py)."""
    kinds = {family(key) for key in made}
    return [i.id for i in ITEMS if set(i.runs) <= kinds]
