"""What crosses the process boundary in part memory: its tasks (ZeRO-2 against DDP), the settings both
sides read, and what each rank reports."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from autograde.protocol import Task

# ZeRO-2 (inprocess.py `zero2`): the processes, the buckets tried (1 MB holds the whole model, one bucket; 4 KB
# cuts its 90 KB of gradients into several, 7 by the solution's rule: most of its tensors are 16 KB), the steps,
# and the optimizer. SGD with momentum: an update linear in the
# gradient, so a sum where the average belongs shows, as Adam's scale-free update would hide it.
ZERO2_WORLD_SIZES = (2, 3)
ZERO2_BUCKETS_MB = (1.0, 4 / 1024)
ZERO2_STEPS = 3
ZERO2_OPTIONS = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}

# ZeRO-3 (inprocess.py `zero3`): the processes and the steps (the optimizer is ZeRO-2's)
ZERO3_WORLD_SIZES = (2, 3)
ZERO3_STEPS = 3

# LAMB (inprocess.py `lamb`): two param groups of other options, the steps tried
LAMB_GROUPS = ({"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01},
               {"lr": 0.05, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.0})
LAMB_STEPS = 3

# Loss scaling (inprocess.py `loss_scaling`): each setting tried (GradScaler's arguments), and the steps: an input
# holding an inf at some steps (every gradient then overflows) and a nan at another, so that a scale backs off
# twice in a row, grows back, and is judged on a nan as on an inf
LOSS_SCALINGS = ({"init_scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3},
                 {"init_scale": 2.0**20, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 2})
OVERFLOW_STEPS = {3: "inf", 4: "inf", 8: "nan", 13: "inf"}  # counted from 1
LOSS_SCALING_STEPS = 16

# Activation checkpointing (inprocess.py `checkpointing`): the blocks, their width, the batch, and the numbers of
# runs tried (3 does not divide 8: runs of 3, 2 and 3 blocks)
CHECKPOINT_BLOCKS, CHECKPOINT_WIDTH, CHECKPOINT_BATCH = 8, 64, 32
CHECKPOINT_SEGMENTS = (1, 2, 3)
CHECKPOINT_FUNCTIONS = ("run_checkpointed", "run_by_hand")

# bf16 (inprocess_bf16.py `bf16`): master weights, a small rate and momentum (most of its updates are below bf16's
# resolution, so bf16 weights stepped in bf16 keep too little of them), the steps; the hook on 2 processes
BF16_OPTIONS = {"lr": 1e-3, "momentum": 0.9}
BF16_STEPS = 8

# The events this part's in-process code adds to a trace, with their fields (protocol.EVENTS has the core's)
EVENTS: dict[str, tuple[str, ...]] = {
    # zero2: each step is case_start, the forward and backward passes, backward_end, the learner's step(),
    # case_end (core events): what the learner's code sent before backward_end was sent during backward
    "backward_end": ("case",),
    # zero3: the harness's hooks, run after the learner's: a unit's forward about to run, and its backward (the
    # gradient of its output has arrived); each with the bytes of parameters every unit holds then
    "unit_forward": ("unit", "held"),
    "unit_backward": ("unit", "held"),
    # accumulation: the harness's hook, as each forward pass of a micro-batch begins
    "micro_forward": ("case",),
}


@dataclass
class Zero2Case:
    """One rank's training under the learner's Zero2 with one bucket size, against DDP."""

    case: int
    bucket_size_mb: float
    from_ddp: float = float("inf")    # largest |difference| of any weight from DDP's trained alike
    from_summed: float = float("inf")  # ... from DDP's trained on the sum of the gradients, not their average
    gradient_bytes: list[int] = field(default_factory=list)  # held when each optimizer step began (see inprocess)
    after_backward: list[int] = field(default_factory=list)  # the model's own .grad, when each backward() returned
    steps_seen: int = 0               # optimizer steps begun on this rank (not the reference's)
    error: str | None = None


@dataclass
class Zero2Report:
    """What one rank of a zero2 run found."""

    world_size: int
    rank: int
    whole_bytes: int = 0              # the model's trainable parameters: DDP holds this much gradient
    largest_bytes: int = 0            # the largest parameter's
    tensors: int = 0                  # the model's trainable tensors
    cases: list[Zero2Case] = field(default_factory=list)
    error: str | None = None


@dataclass
class Zero2Task(Task):
    """The learner's Zero2 against DistributedDataParallel, at each bucket size."""

    bucket_sizes: list[float] = field(default_factory=list)
    on_cpu: ClassVar[bool] = True
    runs_in: ClassVar[str] = "inprocess_zero"


@dataclass
class LambParam:
    """One parameter moved by the learner's LAMB, against notebook 31's update in float64."""

    name: str                         # what it stands for: "a linear layer's weight", "a bias", ...
    shape: list[int]
    difference: float = float("inf")  # largest |difference| after the steps, relative to its largest entry
    matches: str | None = None        # a known wrong update it matches instead (inprocess.py, LAMB_VARIANTS)
    moved: bool = False


@dataclass
class LambReport:
    world_size: int
    rank: int
    params: list[LambParam] = field(default_factory=list)
    error: str | None = None


@dataclass
class LambTask(Task):
    """The learner's LAMB on parameters of every kind, against the update in float64."""

    on_cpu: ClassVar[bool] = True


@dataclass
class ScalingStep:
    """One step of the learner's LossScaler beside torch.amp.GradScaler's, from the same weights and batch."""

    step: int                         # from 1
    overflow: str | None              # what the step's input held: "inf", "nan", or None
    scale: float | None               # the learner's get_scale() before the step (None: not a number)
    expected_scale: float             # GradScaler's
    stepped: bool                     # whether the learner's step moved the weights
    expected_stepped: bool
    difference: float = float("inf")  # the weights' largest |difference| from GradScaler's after the step
    state_difference: float = float("inf")  # the optimizers' momentum buffers' (inf: one has none where the other has)


@dataclass
class ScalingCase:
    setting: int                      # which of LOSS_SCALINGS
    steps: list[ScalingStep] = field(default_factory=list)
    error: str | None = None


@dataclass
class ScalingReport:
    world_size: int
    rank: int
    cases: list[ScalingCase] = field(default_factory=list)
    error: str | None = None


@dataclass
class ScalingTask(Task):
    """The learner's LossScaler beside torch.amp.GradScaler, step by step, with overflows injected."""

    on_cpu: ClassVar[bool] = True


@dataclass
class CheckpointCase:
    """One call of a learner's checkpointed forward, against the plain forward pass."""

    function: str                     # one of CHECKPOINT_FUNCTIONS
    segments: int
    output: float = float("inf")      # largest |difference| of the output from the plain forward's
    input_grad: float = float("inf")  # ... of the input's gradient (inf: none)
    param_grad: float = float("inf")  # ... of the blocks' parameters' gradients (inf: a parameter got none)
    kept_bytes: int = 0               # what autograd kept for backward during the forward (each buffer once)
    recomputed: int = 0               # blocks run again during backward
    error: str | None = None


@dataclass
class CheckpointReport:
    world_size: int
    rank: int
    plain_bytes: int = 0              # what the plain forward kept for backward
    activation_bytes: int = 0         # one block's output: the input of a run
    cases: list[CheckpointCase] = field(default_factory=list)
    error: str | None = None


@dataclass
class CheckpointTask(Task):
    """The learner's checkpointed forwards against the plain one: gradients, bytes kept, blocks recomputed."""

    on_cpu: ClassVar[bool] = True


@dataclass
class Zero3Report:
    """What one rank of a zero3 run found: each step's outputs against DDP's, and the parameters each unit held."""

    world_size: int
    rank: int
    unit_bytes: list[int] = field(default_factory=list)   # each unit's whole parameters (units with parameters)
    outputs: list[float] = field(default_factory=list)    # each step: largest |difference| of the output from DDP's
    outputs_summed: list[float] = field(default_factory=list)  # ... from DDP's trained on the sum of the gradients
    probe: float = float("inf")       # after the steps: the output on a new batch, against DDP's
    at_rest: list[list[int]] = field(default_factory=list)  # after each step(): the bytes each unit's parameters held
    gradient_bytes: list[int] = field(default_factory=list)  # held when each optimizer step began (as zero2's)
    error: str | None = None


@dataclass
class Zero3Task(Task):
    """The learner's Zero3 against DistributedDataParallel (made with prefetch=True where `prefetch`)."""

    prefetch: bool = False
    on_cpu: ClassVar[bool] = True
    runs_in: ClassVar[str] = "inprocess_zero"


@dataclass
class Bf16Report:
    """What one rank of a bf16 run found: the learner's master weights against the reference's, and DDP's
    gradients with the learner's hook against fp32's and the sum's."""

    world_size: int
    rank: int
    master_error: str | None = None   # what MasterWeights raised
    optimizer_dtypes: list[str] = field(default_factory=list)  # the dtypes of what the learner's optimizer stepped
    masters: float = float("inf")     # largest |difference| of those tensors from the reference's fp32 masters
    weights: float = float("inf")     # ... of the model's bf16 weights from the reference's
    moved: float = 0.0                # how far the learner's bf16 weights moved in all (sum of |change|)
    moved_pure: float = 0.0           # ... bf16 weights stepped in bf16, without masters
    hook_error: str | None = None     # what the hook raised
    from_fp32: float = float("inf")   # the hooked gradients' largest |difference| from fp32's, over the largest gradient
    from_sum: float = float("inf")    # ... from the sum over the processes (fp32)
    error: str | None = None


@dataclass
class Bf16Task(Task):
    """The learner's MasterWeights and bf16 all-reduce hook."""

    on_cpu: ClassVar[bool] = True
    runs_in: ClassVar[str] = "inprocess_bf16"


# K-FAC for convolutions (inprocess_kfac.py `kfac_conv`): the layers of the small net tried, each as (what it is
# called in a verdict, its kind and arguments); its input's batch and side; the damping, as a share of the mean
# eigenvalue of each layer's A kron G (a preconditioner well conditioned enough for float32 to be judged to 1e-4)
KFAC_CONV_LAYERS: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("Conv2d(3, 4, 3, padding=1)", "conv", {"in_channels": 3, "out_channels": 4, "kernel_size": 3, "padding": 1}),
    ("Conv2d(4, 5, (3, 2), stride=2, bias=False)", "conv",
     {"in_channels": 4, "out_channels": 5, "kernel_size": (3, 2), "stride": 2, "bias": False}),
    ("Conv2d(5, 6, 1)", "conv", {"in_channels": 5, "out_channels": 6, "kernel_size": 1}),
    ("Linear(54, 3)", "linear", {"in_features": 54, "out_features": 3}),
)
KFAC_CONV_BATCH, KFAC_CONV_CHANNELS, KFAC_CONV_SIDE, KFAC_CONV_CLASSES = 6, 3, 7, 3  # the input's, the last layer's
KFAC_CONV_DAMPING = 0.1


@dataclass
class KfacLayerCase:
    """One layer of the small net: the learner's factors against the Fisher's Kronecker approximation, and the
    learner's preconditioning against a dense damped inverse."""

    name: str                          # the layer, as KFAC_CONV_LAYERS calls it
    positions: int                     # the output positions its kernel visited (1 for a linear layer)
    columns: int                       # A's side: the inputs one output multiplies, the bias's 1 included
    rows: int                          # G's side: the output channels or features
    a_shape: list[int] = field(default_factory=list)   # the learner's A
    g_shape: list[int] = field(default_factory=list)   # ... and G
    factors_error: str | None = None   # what kfac_factors raised, or what it returned instead of two tensors
    product: float = float("inf")      # |A kron G - the reference's|, largest, over the reference's largest
    ratio: float = 0.0                 # the learner's product over the reference's, where it is a multiple of it
    precondition_error: str | None = None
    preconditioned: float = float("inf")  # the preconditioned gradient against the dense solve, as `product`
    matches: str | None = None         # the known mistake the preconditioned gradient matches, if it differs
    bias_untouched: bool = False       # the bias's gradient left as it was (a layer with a bias)
    shapes_kept: bool = True           # weight.grad and bias.grad kept their shapes


@dataclass
class KfacConvReport:
    world_size: int
    rank: int
    batch: int = 0
    layers: list[KfacLayerCase] = field(default_factory=list)
    error: str | None = None


@dataclass
class KfacConvTask(Task):
    """The learner's kfac_factors and precondition on the layers of a small convolutional net."""

    on_cpu: ClassVar[bool] = True
    runs_in: ClassVar[str] = "inprocess_kfac"


# Gradient accumulation (inprocess_accumulation.py `accumulation`): the processes, the micro-steps tried (1: the
# learner's class without no_sync, for its own count of buckets), the steps, each rank's share of a batch, the
# model's width, the buckets (20 KB: the model's 102 KB of gradients in 4 buckets by part 5's rule), the optimizer
ACCUMULATION_WORLD_SIZE = 2
ACCUMULATION_MICRO_STEPS = (1, 4)
ACCUMULATION_STEPS = 3
ACCUMULATION_SHARE, ACCUMULATION_HIDDEN = 32, 128
ACCUMULATION_BUCKET_MB = 20 / 1024
ACCUMULATION_OPTIONS = {"lr": 0.1, "momentum": 0.9}
# The weights of known mistakes, each trained alike by DDP: what each one's gradient was, by name
ACCUMULATION_VARIANTS = ("summed", "processes_summed", "last_divided", "last")


@dataclass
class AccumulationCase:
    """One step of the learner's train_step with k micro-batches, against DDP's one step on the whole batch."""

    micro_steps: int
    step: int                          # counted from 1
    case: int                          # its case_start in the trace
    moved: bool = False                # the step changed a weight
    from_whole: float = float("inf")   # largest |difference| of a weight from DDP's after as many steps
    matches: str | None = None         # the variant of ACCUMULATION_VARIANTS the weights equal, where they differ
    error: str | None = None


@dataclass
class AccumulationReport:
    world_size: int
    rank: int
    elements: int = 0                  # the model's trainable elements: each is sent once a step
    tensors: int = 0
    cases: list[AccumulationCase] = field(default_factory=list)
    error: str | None = None


@dataclass
class AccumulationTask(Task):
    """The learner's BucketedDDP and train_step with 1 and with k micro-batches, against DDP on the whole batch."""

    on_cpu: ClassVar[bool] = True
    runs_in: ClassVar[str] = "inprocess_accumulation"



# Where memory goes (inprocess_budget.py `memory_budget`): the models measured, each as (what a verdict calls it,
# the widths of its nn.Linear layers, whether they have biases, the examples per rank); the processes; the
# stages; how close a prediction must come to the measured bytes
BUDGET_MODELS: tuple[tuple[str, tuple[int, ...], bool, int], ...] = (
    ("Linear(784, 256), ReLU, Linear(256, 256), ReLU, Linear(256, 10)", (784, 256, 256, 10), True, 64),
    ("Linear(32, 512, bias=False), ReLU, Linear(512, 8, bias=False)", (32, 512, 8), False, 16),
)
BUDGET_WORLD_SIZES = (2, 3)
BUDGET_STAGES = (0, 1, 2, 3)
BUDGET_QUANTITIES = ("parameters", "gradients", "optimizer_state", "activations", "peak_parameters")
BUDGET_TOLERANCE = 0.01


@dataclass
class BudgetCase:
    """One model at one stage on one rank: the bytes measured, and the learner's prediction."""

    model: int                         # its index in BUDGET_MODELS
    stage: int
    measured: dict[str, int] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    error: str | None = None           # what bytes_per_rank raised, or what it returned instead of a dict of numbers


@dataclass
class BudgetReport:
    world_size: int
    rank: int
    elements: list[int] = field(default_factory=list)  # each model's parameters
    cases: list[BudgetCase] = field(default_factory=list)
    error: str | None = None


@dataclass
class BudgetTask(Task):
    """Each stage run on each model, its bytes per rank weighed, beside the learner's bytes_per_rank."""

    on_cpu: ClassVar[bool] = True
    runs_in: ClassVar[str] = "inprocess_budget"
