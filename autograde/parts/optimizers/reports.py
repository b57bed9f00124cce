"""What crosses the process boundary in part optimizers: its tasks (LARS's steps, K-FAC on one
or several ranks), the K-FAC model's layers, and what each rank reports."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from autograde.protocol import Task

# two_d: 4 processes, tensor parallel in pairs
# K-FAC (inprocess.py): the model's layers as (inputs, outputs, bias), chosen so that
# every factor has a size of its own (A: inputs + 1 with a bias; G: outputs), which names the layer
# and factor of a traced decomposition
KFAC_LAYERS = ((6, 9, False), (9, 13, True), (13, 4, True))


# The events this part's in-process code adds to a trace, with their fields (protocol.EVENTS has the core's)
EVENTS: dict[str, tuple[str, ...]] = {
    # K-FAC (inprocess.py): around each call of the learner's step(); and each
    # decomposition or inverse the learner's code made (torch.linalg's function, the matrix's size)
    "kfac_step": ("case", "step"),
    "kfac_step_end": ("case", "step"),
    "decomposition": ("fn", "size"),
}


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


@dataclass
class LarsTask(Task):
    """A LARS optimizer's steps against the formula."""

    on_cpu: ClassVar[bool] = True


@dataclass
class KfacTask(Task):
    """A K-FAC preconditioner against the dense computation, on 1 or N ranks."""

    on_cpu: ClassVar[bool] = True
