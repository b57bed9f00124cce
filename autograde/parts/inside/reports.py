"""What crosses the process boundary in part inside: its tasks (a hand-made DDP, a sharded
optimizer, tensor-parallel layers, 2-D parallelism, pipeline stages), their sizes, and what each
rank reports."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from autograde.protocol import Task

# all_reduce(buffer, op=...) on the same buffers
ZERO_STEPS = 3  # optimizer steps of the sharded optimizer's run
# optimizer steps of the sharded optimizer's run
# Model parallelism (inprocess_model_parallel.py): the cases of a tensor_parallel run, in
# the order they are tried and judged (Megatron's f and g first: the layers are made of them)
TENSOR_CASES = ("f", "g", "column", "row", "mlp")
TENSOR_IN, TENSOR_HIDDEN = 12, 16  # the unsplit layers: fc1 12 -> 16 (cut by columns), fc2 16 -> 12 (by rows)
# the unsplit layers: fc1 12 -> 16 (cut by columns), fc2 16 -> 12 (by rows)
TWO_D_WORLD, TWO_D_TENSOR = 4, 2  # two_d: 4 processes, tensor parallel in pairs


# The events this part's in-process code adds to a trace, with their fields (protocol.EVENTS has the core's)
EVENTS: dict[str, tuple[str, ...]] = {
    # around the call of a hand-made DDP's finish_gradient_synchronization() (inprocess.py `ddp`)
    "sync_start": (),
    "sync_end": (),
    # once a hand-made DDP is made (inprocess.py `ddp`): the parameters and buffers that still differ
    # from rank 0's, and for BucketedDDP each bucket plan it may follow, with parameter names
    "wrapped": ("case", "differs", "buckets"),
    # model parallelism (inprocess_model_parallel.py): a tensor-parallel case's phases
    # ("forward", "backward", "average", "end"), and a pipeline step's cases and passes: `kind` "F" or "B",
    # micro-batch `micro`, through this rank's chunk `chunk` (0 but in an interleaved schedule); a pass
    # starts when the stage is called (F) or its output's gradient arrives (B), and ends when it returns
    # (F) or its input's gradient is made (B)
    "phase": ("case", "phase"),
    "pipeline_case": ("case", "micro_batches"),
    "pass_start": ("case", "kind", "micro", "chunk"),
    "pass_end": ("case", "kind", "micro", "chunk"),
}


@dataclass
class DdpCase:
    """One rank's training of the course's model under a learner's hand-made DDP (inprocess.py `ddp`)."""

    case: int
    bucket_size_mb: float | None      # BucketedDDP's argument (None: the wrapper takes none)
    from_single: float                # largest |difference| from one process trained on the whole batch
    from_ddp: float                   # largest |difference| from DistributedDataParallel trained alike
    bucket_plans: list[list[int]]     # the numels of the buckets each correct rule makes (inprocess.py, bucket_plans)
    error: str | None = None          # what the learner's code raised


@dataclass
class DdpReport:
    """What one rank of a ddp run found (autograde/inprocess/runner.py writes it)."""

    world_size: int
    rank: int
    cases: list[DdpCase] = field(default_factory=list)
    error: str | None = None


@dataclass
class ZeroParam:
    """One parameter after a learner's sharded optimizer trained (inprocess.py `zero`)."""

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


@dataclass
class Shard:
    """One parameter of a learner's tensor-parallel module, found by its values among the unsplit
    layers' tensors (inprocess_model_parallel.py, `locate`)."""

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

STAGE_WIDTH, STAGE_BATCH = 32, 24  # the stages task's layers' width, and its whole batch: 24 micro-batches into 1, 2, 3, 4, 6, 8, 12 or 24


@dataclass
class DdpTask(Task):
    """A hand-made DDP (the class `wrapper`) against one process trained on the whole batch."""

    wrapper: str = "NaiveDDP"
    bucket_sizes: list[float] = field(default_factory=list)  # BucketedDDP's sizes (MB)
    on_cpu: ClassVar[bool] = True


@dataclass
class ZeroTask(Task):
    """A sharded optimizer against plain AdamW."""

    on_cpu: ClassVar[bool] = True


@dataclass
class TensorParallelTask(Task):
    """f, g and the tensor-parallel layers against unsplit ones."""

    on_cpu: ClassVar[bool] = True
    runs_in: ClassVar[str] = "inprocess_model_parallel"


@dataclass
class TwoDTask(Task):
    """Tensor parallel in groups, data parallel across them, against one process."""

    on_cpu: ClassVar[bool] = True
    runs_in: ClassVar[str] = "inprocess_model_parallel"


@dataclass
class StagesTask(Task):
    """A pipeline schedule (the learner's function `schedule`) against the unsplit model."""

    schedule: str = "gpipe"
    micro_batches: list[int] = field(default_factory=lambda: [4])
    chunks: int = 1  # > 1: an interleaved schedule, given each rank's list of chunks (virtual stages)
    width: int = STAGE_WIDTH
    batch_size: int = STAGE_BATCH  # the whole batch, cut into each number of micro-batches
    on_cpu: ClassVar[bool] = True
    runs_in: ClassVar[str] = "inprocess_model_parallel"


# What both sides build: the model every hand-made DDP is tried on, and DDP's bucket plan (the
# checks try it in the learner's processes; notebook 20 shows it)
def ddp_model(seed: int) -> Any:
    """The model every hand-made DDP is tried on: a weight used twice (tied), a frozen layer and a
    layer the forward pass never uses, so a wrapper must cope with gradients that are shared,
    absent by design and absent by accident; and a buffer (`shift`, no parameter: it has no
    gradient) that the forward pass adds, drawn from the seed like the weights, so a wrapper that
    broadcasts rank 0's parameters but not its buffers trains another model on every other rank."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Awkward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(16, 32, bias=False)
            self.hidden = nn.Linear(32, 32)
            self.frozen = nn.Linear(32, 32)
            self.frozen.requires_grad_(False)
            self.unused = nn.Linear(32, 32)
            # made last, so that the layers' weights are those the same seed gave before it existed
            self.register_buffer("shift", 0.5 * torch.randn(32))

        def forward(self, x: Any) -> Any:
            h = torch.relu(self.hidden(torch.relu(self.embed(x))) + self.shift)
            return F.linear(self.frozen(h), self.embed.weight.t())  # the embedding's weight, tied

    torch.manual_seed(seed)
    return Awkward()


MEGABYTES = (1024 * 1024, 1000 * 1000)  # a megabyte as DDP counts it (bucket_cap_mb), and as the SI does


def bucket_plan(model: Any, bucket_size_mb: float, megabyte: int = MEGABYTES[0],
                past_the_size: bool = False) -> list[list[tuple[str, int]]]:
    """Buckets of `model`, each a list of (parameter name, numel), as the exercise asks: the trainable
    parameters in reverse order, a new bucket whenever the next would make the current one larger
    than bucket_size_mb (a parameter larger than that alone in one). `past_the_size`: DDP's own
    reducer's rule instead, which closes a bucket once it reaches the size, so that its last
    parameter may take it past."""
    limit, size = bucket_size_mb * megabyte, 0.0
    buckets: list[list[tuple[str, int]]] = [[]]
    for name, p in reversed([(n, p) for n, p in model.named_parameters() if p.requires_grad]):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and (size >= limit if past_the_size else size + nbytes > limit):
            buckets.append([])
            size = 0.0
        buckets[-1].append((name, p.numel()))
        size += nbytes
    return buckets
