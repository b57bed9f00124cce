"""What crosses the process boundary in part launching: the variables a SLURM task reports,
and the tasks its checker's SLURM job runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autograde.protocol import Task

# set: the last task of the checker's SLURM job fails at its start
# What a process needs to join a group with init_process_group's env:// (a SLURM task's report lists them)
TORCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")




# The events this part's in-process code adds to a trace, with their fields (protocol.EVENTS has the core's)
EVENTS: dict[str, tuple[str, ...]] = {
    # checkpoints (inprocess.py): files written, read and renamed, absolute paths
    "save_enter": ("path",),
    "save_exit": ("path",),
    "load_enter": ("path", "map_location"),
    "load_exit": ("path", "error"),  # error: what the load raised (a missing file, say), else absent
    "moved": ("src", "dst"),
    # a fault the checker injected: the process kills itself (after `steps` steps, or halfway through writing `path`)
    "killed": ("steps", "path"),
}


@dataclass
class SlurmTask(Task):
    """One task of the checker's job: run the learner's file as __main__; when it joins its group,
    write its SLURM and PyTorch variables to `<run folder>/slurm-<task>.json`."""

    in_a_group: ClassVar[bool] = False


@dataclass
class SlurmProbeTask(Task):
    """The checker's program for the learner's batch script: write the task's variables to the
    trace folder, then join a gloo group with env:// and make one all_reduce."""

    in_a_group: ClassVar[bool] = False
