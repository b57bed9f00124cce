"""What crosses the process boundary in the lab: the tasks that run the learner's start-up code
and its worker function (inprocess.py does them), and what they report."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from autograde.protocol import Task

# The events this part's in-process code adds to a trace, with their fields (protocol.EVENTS has the core's)
EVENTS: dict[str, tuple[str, ...]] = {
    # written by the lab's driver (inprocess.py) in the processes of the workers run
    "worker_start": ("fn", "visible_devices"),
    "worker_done": ("optimizer_steps",),
}


@dataclass
class Setup:
    """What the script's set-up code did with one command line (the setup run's report)."""

    stop: str | None = None          # the call that ended the set-up run
    error: str | None = None         # why it ended otherwise
    options: list[str] = field(default_factory=list)    # the options the parser knows
    dests: dict[str, str] = field(default_factory=dict)  # option -> attribute of args
    argv: list[str] = field(default_factory=list)        # the command line actually given
    values: dict[str, Any] = field(default_factory=dict)   # the parsed args, after main's changes
    types: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Any] | None = None
    env: dict[str, str | None] = field(default_factory=dict)  # MASTER_ADDR/PORT when the first group starts
    # where a world size may be kept: module-level integers, WORLD_SIZE in the environment,
    # what init_process_group was given, and integers among mp.spawn's arguments
    module_ints: dict[str, int] = field(default_factory=dict)
    init: dict[str, Any] | None = None       # init_process_group's arguments, if the run got there
    spawn: dict[str, Any] | None = None      # mp.spawn's function name, nprocs and integer arguments
    spawned_error: str | None = None          # how the first spawned process failed before its process group
    pid: int | None = None  # the process that ran the main code: its trace shows what it did first (a download, say)


@dataclass
class Child:
    """One process of the workers run: which node and local rank it plays (its trace tells the rest)."""

    node: int
    local_rank: int
    pid: int


@dataclass
class Workers:
    """The workers run's report: each node's set-up, then the processes started."""

    setups: list[Setup] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)
    error: str | None = None     # why no process was started


Argv = list[list[Any]]  # a command line as (option, value) pairs; value None: a flag


@dataclass
class SetupTask(Task):
    """Run the script's own start-up code with `argv` until real work begins: a Setup, in the run's folder."""

    argv: Argv = field(default_factory=list)
    in_a_group: ClassVar[bool] = False


@dataclass
class WorkersTask(Task):
    """Call the script's worker in every process of the simulated nodes (one argv each): a Workers, in the run's folder."""

    nodes: list[Argv] = field(default_factory=list)
    procs_per_node: int = 2
    node_gpus: list[str] = field(default_factory=list)  # each node's CUDA_VISIBLE_DEVICES ("": the CPU)
    in_a_group: ClassVar[bool] = False
