"""The formats that cross a process boundary, defined once: the launched processes write them
(the tracer, the harness) and the checker reads them (runs, checks). A field here is written by
one side and read by the other; tests/test_formats.py fails on a field that nothing reads.

- A trace is one JSON object per line and event: `t`, `pid`, `rank`, `ev`, `line`, and the
  fields that EVENTS lists for its kind.
- A run report is a `Setup` (the setup run) or a `Workers` (the workers run), as JSON.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Every event's own fields, by kind. "enter"/"exit" are torch.distributed calls (collectives,
# init_process_group, destroy_process_group); the extra fields of init_process_group's are listed.
COMMON = ("t", "pid", "rank", "ev", "line")
EVENTS: dict[str, tuple[str, ...]] = {
    "enter": ("call", "backend", "world_size"),
    "exit": ("call", "rank_joined", "world_size", "backend"),
    "set_device": ("device",),
    "parameters": ("sha1", "when"),
    "spawn": ("call", "nprocs", "fn", "caller_module"),
    "child_signal": ("signal",),
    "dataset_enter": ("train", "download"),
    "dataset_error": ("error",),
    "dataset_exit": ("dataset", "train", "size"),
    "download_start": (),
    "download_end": (),
    "sampler": ("sampler", "dataset", "num_replicas", "sampler_rank", "drop_last", "size"),
    "sampler_iter": ("sampler", "epoch", "indices"),
    "set_epoch": (),
    "loader": ("loader", "dataset", "sampler", "sampler_type"),
    "loader_iter": ("loader", "validation"),
    "loader_end": ("loader", "samples", "per_image"),
    "first_optimizer_step": (),
    "ddp": ("device_ids", "parameter_device", "batchnorms", "sync_batchnorms"),
    "moved_after_wrap": (),
    "print": ("text",),
    # written by the harness (autograde/checker/harness.py) in the processes of the workers run
    "worker_start": ("fn",),
    "worker_done": ("optimizer_steps",),
    "crash": ("error",),
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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workers:
        return cls([Setup(**s) for s in data.get("setups", [])], [Child(**c) for c in data.get("children", [])],
                   data.get("error"))
