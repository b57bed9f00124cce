"""Everything that crosses the process boundary, defined once: the checker's side (autograde/checker/,
autograde/checks/) starts the learner's processes and reads what they leave; the code that runs in
those processes (autograde/learner_processes/) writes it. Both sides import these names, and
nothing else of each other.

- The environment the checker gives every process it launches (TRACE_DIR, SCRIPT, ...), and the
  faults and measurements it can ask for through it.
- The tasks a run can ask `python -m autograde.learner_processes.tasks` to do (`Task`), with the
  sizes and scenarios they use.
- A trace is one JSON object per line and event, in `<trace dir>/trace-<pid>.jsonl`: `t`, `pid`,
  `rank`, `ev`, `line`, and the fields that EVENTS lists for its kind. `read` gives each
  process's as a `ProcessTrace`. tests/test_formats.py checks the recordings against EVENTS.
- A run report is a `Setup` (the setup run), a `Workers` (the workers run) or, from the runs that
  call a learner's functions, one report per rank (`RingReport`, ...), as JSON: `read_reports`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

# --- The environment of a launched process ------------------------------------------------------
# The folder the checker puts first on PYTHONPATH: its sitecustomize.py starts the tracing
STARTUP = Path(__file__).resolve().parent / "learner_processes" / "_startup"
TRACE_DIR = "DDP_LAB_TRACE_DIR"  # set: trace this process (and its children) into this folder
SCRIPT = "DDP_LAB_SCRIPT"  # the learner's file: lines are reported in it, errors at its last line
STAGING = "DDP_LAB_STAGING"  # set: a Fashion-MNIST "download" copies the stand-in from this folder
COUNT_WORK = "DDP_LAB_COUNT_WORK"  # set to 1: count the elements every PyTorch operation computes
# "0": the learner's mp.spawn starts each process cold (a new interpreter that imports torch), as
# untraced; otherwise each is forked from a server that has imported it (tracer.py, _warm_start)
WARM_SPAWN = "DDP_LAB_WARM_SPAWN"
# The folder of a warm-start server (learner_processes/warm_start.py): a traced Python process whose
# environment names one is forked from it, torch imported, instead of importing torch itself. Each
# process it forks leads a process group of its own, registered in <folder>/groups/<group>, the file
# holding the launch's mark (LAUNCH_MARK), while a process of the group is left.
WARM_SERVER = "DDP_LAB_WARM_SERVER"
# In a server's folder: its socket, the groups it registered, and a JSON line per request it answered
# ({"cold": why or null, "command": the first arguments})
WARM_SOCKET, WARM_GROUPS, WARM_LOG = "socket", "groups", "log"
# In the environment of every process a launch starts, and of their children: the launch's mark
# (marks of launches inside launches, joined with ":")
LAUNCH_MARK = "DDP_LAB_LAUNCH"
# Faults the checker injects into the first life of a torchrun group (autograde/checks/launching.py):
KILL_AT_STEP = "DDP_LAB_KILL_AT_STEP"  # "<rank>:<n>": SIGKILL that rank right after its n-th optimizer step
# "<rank>:<n>:<checkpoint>": that rank's first torch.save once n - 1 checkpoints are complete (written
# straight into the file <checkpoint>, or renamed onto it) writes half its file, then SIGKILL: a kill during
# the n-th checkpoint, however many files a checkpoint takes
TEAR_SAVE = "DDP_LAB_TEAR_SAVE"
SLOW_SAVE = "DDP_LAB_SLOW_SAVE"  # seconds every torch.save waits before writing: a window in which to be caught
# Step by step (autograde/checks/scaling.py): a "step" event per optimizer step (its time, learning
# rates and the images the model was given for it), and a run that ends itself after a number of steps.
TRACE_STEPS = "DDP_LAB_TRACE_STEPS"  # set to 1
STOP_AT_STEP = "DDP_LAB_STOP_AT_STEP"  # "<n>": after its n-th optimizer step, record the parameters and exit 0
SLURM_FAIL = "DDP_LAB_SLURM_FAIL"  # set: the last task of the checker's SLURM job fails at its start
# What a process needs to join a group with init_process_group's env:// (a SLURM task's report lists them)
TORCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# The torch.distributed calls traced as "enter"/"exit" events (send and recv too, and "wait")
COLLECTIVES = ("barrier", "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter", "gather", "scatter", "all_gather_object", "broadcast_object_list",
               "gather_object", "monitored_barrier")


# --- Tasks: the learner's functions, called in real process groups -------------------------------
class Task(StrEnum):
    """What `python -m autograde.learner_processes.tasks TASK` does (a run of `Workspace.called`)."""

    RING = "ring"                # ring_all_reduce against dist.all_reduce (part talk)
    SAMPLER = "sampler"          # ShardSampler's shards (part talk)
    COLLECTIVES = "collectives"  # every scenario for real, and the file's PREDICTIONS (part talk)
    CALLS = "calls"              # plain functions called with JSON arguments, no group (parts scaling, launching)
    DDP = "ddp"                  # a hand-made DDP against one process on the whole batch (part inside)
    ZERO = "zero"                # a sharded optimizer against plain AdamW (part inside)
    TENSOR_PARALLEL = "tensor_parallel"  # f, g and the tensor-parallel layers against unsplit ones (part inside)
    TWO_D = "two_d"              # tensor parallel in groups, data parallel across them, against one process
    STAGES = "stages"            # a pipeline schedule against the unsplit model (part inside)
    LARS = "lars"                # a LARS optimizer's steps against the formula (part optimizers)
    KFAC = "kfac"                # a K-FAC preconditioner against the dense computation, on 1 or N ranks


RING_SIZES = (12, 1001, 65537)  # 12 divides by 2, 3 and 4; 1001 and 65537 by none of them
COLLECTIVES_WORLD_SIZE = 4
# The collectives of notebook 10 and exercises/predict_collectives.py, on 4 ranks: each the call
# as the exercise shows it. Rank r's buffer starts as [r + 1, 10 * (r + 1)].
SCENARIOS: dict[str, str] = {
    "send_recv": "rank 0: dist.send(buffer, dst=1); rank 1: dist.recv(buffer, src=0)",
    "broadcast": "dist.broadcast(buffer, src=2)",
    "reduce": "dist.reduce(buffer, dst=0)",
    "all_reduce": "dist.all_reduce(buffer)",
    "all_reduce_max": "dist.all_reduce(buffer, op=dist.ReduceOp.MAX)",
    "all_gather": "dist.all_gather(out, buffer)",
    "gather": "dist.gather(buffer, out if rank == 0 else None, dst=0)",
    "scatter": "dist.scatter(buffer, pieces if rank == 0 else None, src=0)",
    "reduce_scatter": "dist.reduce_scatter(buffer, list(big.chunk(4)))",
    "split_sum": "part = torch.arange(1.0, 101.0)[25 * rank:25 * (rank + 1)].sum(); dist.all_reduce(part)",
}
OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG")  # all_reduce(buffer, op=...) on the same buffers
ZERO_STEPS = 3  # optimizer steps of the sharded optimizer's run
# Model parallelism (learner_processes/inside_model_parallel.py): the cases of a tensor_parallel run, in
# the order they are tried and judged (Megatron's f and g first: the layers are made of them)
TENSOR_CASES = ("f", "g", "column", "row", "mlp")
TENSOR_IN, TENSOR_HIDDEN = 12, 16  # the unsplit layers: fc1 12 -> 16 (cut by columns), fc2 16 -> 12 (by rows)
TWO_D_WORLD, TWO_D_TENSOR = 4, 2  # two_d: 4 processes, tensor parallel in pairs
# K-FAC (learner_processes/optimizers.py): the model's layers as (inputs, outputs, bias), chosen so that
# every factor has a size of its own (A: inputs + 1 with a bias; G: outputs), which names the layer
# and factor of a traced decomposition
KFAC_LAYERS = ((6, 9, False), (9, 13, True), (13, 4, True))


def read_reports(folder: Path) -> list[dict[str, Any]]:
    """What every rank of a task's run wrote in `folder` (`<world size>-<rank>.json`), as JSON."""
    return [json.loads(path.read_text()) for path in sorted(Path(folder).glob("*-*.json"))]


# --- Traces --------------------------------------------------------------------------------------
# Every event's own fields, by kind. "enter"/"exit" are torch.distributed calls (collectives,
# send and recv, init_process_group, destroy_process_group, and "wait": a request's wait() in the
# learner's code); the extra fields of init_process_group's are listed.
COMMON = ("t", "pid", "rank", "ev", "line")
EVENTS: dict[str, tuple[str, ...]] = {
    # all_reduce's: its tensor's size, async or not; any collective given a group: the group's size;
    # init_process_group's: the rank it was given (`rank`, else None) and RANK in the environment
    "enter": ("call", "backend", "world_size", "numel", "async_op", "group_size", "env_rank"),
    # init_process_group's exit: env_rank is RANK in the environment, life how often torchrun restarted
    "exit": ("call", "rank_joined", "world_size", "backend", "env_rank", "life"),
    "set_device": ("device",),
    "parameters": ("sha1", "when", "norms", "steps"),
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
    # train: the loader's data set is Fashion-MNIST's training set (True), its validation set (False), or
    # neither (None; absent from older recordings)
    "loader": ("loader", "dataset", "sampler", "sampler_type", "train"),
    "loader_iter": ("loader", "validation"),
    # a validation loader's: per_image, [loss, correct] of each image the model evaluated, and evaluated,
    # each one's place in the loader's order (absent from older recordings: the first len(per_image))
    "loader_end": ("loader", "samples", "per_image", "evaluated"),
    "first_optimizer_step": (),
    "ddp": ("device_ids", "parameter_device", "batchnorms", "sync_batchnorms"),
    "moved_after_wrap": (),
    "print": ("text",),
    # a point-to-point message: op is send, recv, isend or irecv; peer the other rank
    "message": ("op", "peer", "numel"),
    # written by the lab's driver (autograde/learner_processes/lab.py) in the processes of the workers run
    "worker_start": ("fn", "visible_devices"),
    "worker_done": ("optimizer_steps",),
    "crash": ("error",),
    # written by autograde/learner_processes/tasks.py around each call of a learner's function
    "case_start": ("case", "world_size"),
    "case_end": ("case",),
    # around the call of a hand-made DDP's finish_gradient_synchronization() (learner_processes/inside.py `ddp`)
    "sync_start": (),
    "sync_end": (),
    # once a hand-made DDP is made (learner_processes/inside.py `ddp`): the parameters and buffers that still differ
    # from rank 0's, and for BucketedDDP each bucket plan it may follow, with parameter names
    "wrapped": ("case", "differs", "buckets"),
    # model parallelism (learner_processes/inside_model_parallel.py): a tensor-parallel case's phases
    # ("forward", "backward", "average", "end"), and a pipeline step's cases and passes: `kind` "F" or "B",
    # micro-batch `micro`; a pass starts when the stage is called (F) or its output's gradient arrives (B),
    # and ends when it returns (F) or its input's gradient is made (B)
    "phase": ("case", "phase"),
    # K-FAC (learner_processes/optimizers.py): around each call of the learner's step(); and each
    # decomposition or inverse the learner's code made (torch.linalg's function, the matrix's size)
    "kfac_step": ("case", "step"),
    "kfac_step_end": ("case", "step"),
    "decomposition": ("fn", "size"),
    "pipeline_case": ("case", "micro_batches"),
    "pass_start": ("case", "kind", "micro"),
    "pass_end": ("case", "kind", "micro"),
    # with DDP_LAB_COUNT_WORK=1, at destroy_process_group: the elements the process's PyTorch
    # operations produced plus the lines of the learner's file it ran (learner_processes/talk.py)
    "work": ("amount",),
    # checkpoints (learner_processes/launching.py): files written, read and renamed, absolute paths
    "save_enter": ("path",),
    "save_exit": ("path",),
    "load_enter": ("path", "map_location"),
    "load_exit": ("path", "error"),  # error: what the load raised (a missing file, say), else absent
    "moved": ("src", "dst"),
    # with DDP_LAB_TRACE_STEPS=1, after each optimizer step: its number (1, 2, ...), each parameter
    # group's learning rate, and the images the DDP model was given in training mode since the last
    "step": ("n", "lrs", "images"),
    # a fault the checker injected: the process kills itself (after `steps` steps, or halfway through writing `path`)
    "killed": ("steps", "path"),
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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workers:
        return cls([Setup(**s) for s in data.get("setups", [])], [Child(**c) for c in data.get("children", [])],
                   data.get("error"))


@dataclass
class RingCase:
    """One call of the learner's ring_all_reduce on every rank: a size and a reduction."""

    case: int
    numel: int
    op: str                      # "sum" or "max"
    error: float                 # the largest difference from dist.all_reduce's result (inf: wrong shape)
    seconds: float               # the call's time on this rank (the median of the repeats)
    reference_seconds: float     # dist.all_reduce's, measured beside it


@dataclass
class RingReport:
    """What one rank of a ring run found (autograde/learner_processes/tasks.py writes it)."""

    world_size: int
    rank: int
    cases: list[RingCase] = field(default_factory=list)
    error: str | None = None     # the error the learner's code raised, if it did

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RingReport:
        return cls(data["world_size"], data["rank"], [RingCase(**c) for c in data.get("cases", [])], data.get("error"))


@dataclass
class SamplerCase:
    """One rank's shard from the learner's sampler, for one data set size and set of options."""

    size: int
    shuffle: bool
    drop_last: bool
    seed: int
    epoch: int
    indices: list[int]           # what iterating the sampler gave
    length: int                  # what len(sampler) said
    again: bool                  # iterating it a second time gave the same indices


@dataclass
class SamplerReport:
    """What one rank of a sampler run found (autograde/learner_processes/tasks.py writes it)."""

    world_size: int
    rank: int
    cases: list[SamplerCase] = field(default_factory=list)
    error: str | None = None     # the error the learner's code raised, if it did

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SamplerReport:
        return cls(data["world_size"], data["rank"], [SamplerCase(**c) for c in data.get("cases", [])],
                   data.get("error"))


@dataclass
class CollectivesReport:
    """One rank's buffers before and after each collective of the course's scenarios, and the
    learner's predictions of them (autograde/learner_processes/tasks.py writes it)."""

    world_size: int
    rank: int
    buffers: dict[str, list[list[float]]] = field(default_factory=dict)  # scenario -> [before, after]
    predictions: dict[str, Any] | None = None   # the file's PREDICTIONS, as JSON
    error: str | None = None     # why they could not be read

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CollectivesReport:
        return cls(data["world_size"], data["rank"], data.get("buffers", {}), data.get("predictions"), data.get("error"))


@dataclass
class Call:
    """One call of a learner's plain function: what it returned (as JSON), or the error it raised."""

    function: str
    args: list[Any]
    value: Any = None
    error: str | None = None


@dataclass
class CallsReport:
    """What the learner's plain functions gave for the checker's arguments (learner_processes/scaling.py `calls`)."""

    world_size: int
    rank: int
    calls: list[Call] = field(default_factory=list)
    error: str | None = None     # the error importing the file raised, if it did

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CallsReport:
        return cls(data["world_size"], data["rank"], [Call(**c) for c in data.get("calls", [])], data.get("error"))


@dataclass
class DdpCase:
    """One rank's training of the course's model under a learner's hand-made DDP (learner_processes/inside.py `ddp`)."""

    case: int
    bucket_size_mb: float | None      # BucketedDDP's argument (None: the wrapper takes none)
    from_single: float                # largest |difference| from one process trained on the whole batch
    from_ddp: float                   # largest |difference| from DistributedDataParallel trained alike
    bucket_plans: list[list[int]]     # the numels of the buckets each correct rule makes (learner_processes/inside.py, bucket_plans)
    error: str | None = None          # what the learner's code raised


@dataclass
class DdpReport:
    """What one rank of a ddp run found (autograde/learner_processes/tasks.py writes it)."""

    world_size: int
    rank: int
    cases: list[DdpCase] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DdpReport:
        return cls(data["world_size"], data["rank"], [DdpCase(**c) for c in data.get("cases", [])], data.get("error"))


@dataclass
class Shard:
    """One parameter of a learner's tensor-parallel module, found by its values among the unsplit
    layers' tensors (learner_processes/inside_model_parallel.py, `locate`)."""

    name: str                         # the learner's name for it
    numel: int
    of: str | None = None             # the unsplit tensor it is a share of ("fc1.weight"); None: of none
    dim: int = 0                      # which of that tensor's dimensions it holds a share of
    indices: list[int] = field(default_factory=list)  # which rows (dim 0) or columns (dim 1) or entries
    difference: float = float("inf")  # its gradient's (two_d: its value's) largest difference from the unsplit one's share
    used: bool = False                # it got a gradient: the learner's forward pass used it (a copy it never uses is idle)


@dataclass
class ParallelCase:
    """One rank's try of one of the learner's tensor-parallel pieces against the unsplit computation."""

    case: str                         # one of TENSOR_CASES, or "two_d"
    output: float = float("inf")      # largest difference of the output from the unsplit one's (its share)
    input_grad: float = float("inf")  # ... of the input's gradient
    bias_every_rank: float = float("inf")  # row, mlp: ... from the unsplit output plus (N - 1) x the last bias
    shards: list[Shard] = field(default_factory=list)
    whole_numel: dict[str, int] = field(default_factory=dict)  # the unsplit tensors' sizes, by name
    error: str | None = None


@dataclass
class ParallelReport:
    """What one rank of a tensor_parallel or two_d run found."""

    world_size: int
    rank: int
    cases: list[ParallelCase] = field(default_factory=list)
    tensor_ranks: list[int] = field(default_factory=list)  # two_d: the global ranks of this rank's groups
    data_ranks: list[int] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ParallelReport:
        cases = [ParallelCase(**{**c, "shards": [Shard(**s) for s in c.get("shards", [])]}) for c in data.get("cases", [])]
        return cls(**{**data, "cases": cases})


@dataclass
class StagesCase:
    """One step of a learner's pipeline schedule on one stage, against the unsplit model."""

    micro_batches: int
    gradient: float = float("inf")    # the stage's parameters' gradients: largest difference from the unsplit model's
    error: str | None = None


@dataclass
class StagesReport:
    """What one stage (rank) of a stages run found."""

    world_size: int
    rank: int
    cases: list[StagesCase] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StagesReport:
        return cls(data["world_size"], data["rank"], [StagesCase(**c) for c in data.get("cases", [])], data.get("error"))


@dataclass
class LarsParam:
    """One parameter moved by the learner's LARS, against the update of notebook 24."""

    name: str                         # what it stands for: "linear weight", "bias", "weight of zeros", ...
    shape: list[int]
    difference: float = float("inf")  # largest |difference| over the steps, relative to the parameter's size
    matches: str | None = None        # a known wrong update it matches instead (optimizers.py, LARS_VARIANTS)
    moved: bool = False               # whether the steps changed it at all


@dataclass
class LarsReport:
    world_size: int
    rank: int
    params: list[LarsParam] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LarsReport:
        return cls(data["world_size"], data["rank"], [LarsParam(**p) for p in data.get("params", [])],
                   data.get("error"))


@dataclass
class KfacCase:
    """One run of the learner's K-FAC on this rank: a damping, a factor decay and an update frequency."""

    damping: float
    factor_decay: float
    update_freq: int
    # per step, per layer: the largest |difference| from the dense computation on the whole batch,
    # relative to the largest preconditioned gradient
    differences: list[list[float]] = field(default_factory=list)
    matches: str | None = None        # a known wrong preconditioner it matches instead (KFAC_VARIANTS)
    error: str | None = None


@dataclass
class KfacReport:
    world_size: int
    rank: int
    cases: list[KfacCase] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KfacReport:
        return cls(data["world_size"], data["rank"], [KfacCase(**c) for c in data.get("cases", [])],
                   data.get("error"))


@dataclass
class ZeroParam:
    """One parameter after a learner's sharded optimizer trained (learner_processes/inside.py `zero`)."""

    name: str
    numel: int
    from_reference: float             # largest |difference| from the unsharded optimizer trained alike
    changed: bool                     # whether it moved from its initial value on this rank


@dataclass
class ZeroReport:
    """What one rank of a zero run found: each parameter, and the optimizer state this rank held."""

    world_size: int
    rank: int
    params: list[ZeroParam] = field(default_factory=list)
    state_bytes: int = 0              # this rank's optimizer state (every torch.optim.Optimizer it kept)
    full_state_bytes: int = 0         # the unsharded optimizer's state, trained alike
    largest_state_bytes: int = 0      # the state of the largest parameter alone (a shard may hold it whole)
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ZeroReport:
        fields = {k: v for k, v in data.items() if k != "params"}
        return cls(**fields, params=[ZeroParam(**p) for p in data.get("params", [])])


Event = dict[str, Any]


@dataclass
class ProcessTrace:
    """Everything one process did, in order."""

    pid: int
    events: list[Event] = field(default_factory=list)

    @property
    def rank(self) -> int | None:
        """The global rank the process joined the group with (None if it never joined)."""
        for e in self.events:
            if e["ev"] == "exit" and e.get("call") == "init_process_group":
                return e.get("rank_joined", e.get("rank"))
        return None

    def named(self, *names: str) -> list[Event]:
        return [e for e in self.events if e["ev"] in names]

    def calls(self, call: str) -> list[Event]:
        """The times the process entered a torch.distributed call."""
        return [e for e in self.events if e["ev"] == "enter" and e.get("call") == call]

    def waiting_in(self) -> Event | None:
        """The call the process entered and never left (where it hung or died), if any."""
        open_calls: list[Event] = []
        for e in self.events:
            if e["ev"] == "enter":
                open_calls.append(e)
            elif e["ev"] == "exit" and open_calls and open_calls[-1].get("call") == e.get("call"):
                open_calls.pop()
        return open_calls[-1] if open_calls else None

    def last_seen(self) -> str:
        """What the process did last, for a stall outside any collective: `dist.barrier() returned`."""
        if not self.events:
            return "nothing traced"
        e = self.events[-1]
        if e["ev"] in ("enter", "exit"):
            return f"{where(e)} {'entered' if e['ev'] == 'enter' else 'returned'}"
        return e["ev"].replace("_", " ")

    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"process {self.pid}"


def read(trace_dir: Path) -> dict[int, ProcessTrace]:
    """Every process's trace in `trace_dir`, by pid. A line cut short by a kill is skipped."""
    traces: dict[int, ProcessTrace] = {}
    for path in sorted(Path(trace_dir).glob("trace-*.jsonl")):
        pid = int(path.stem.split("-")[1])
        trace = ProcessTrace(pid)
        for line in path.read_text().splitlines():
            try:
                trace.events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        traces[pid] = trace
    return traces


def where(event: Event) -> str:
    """`dist.barrier()` at line 170, or without the line where it is not known."""
    line = event.get("line")
    call = "the wait() of a request (async_op=True, isend or irecv)" if event.get("call") == "wait" else f"dist.{event.get('call')}()"
    return call + (f" (line {line})" if line else "")
