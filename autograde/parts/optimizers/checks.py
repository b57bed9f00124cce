"""The checks of the part "optimizers for large batches" (notebooks 24-26), one function per graded item.

The learner's LARS and KFAC run in launched processes, called by
autograde/parts/optimizers/inprocess.py: `lars` moves parameters of every kind for 3 steps
against notebook 24's update; `kfac` preconditions a 3-layer model's gradients on 1 process, or on
2, 3 and 4 under DistributedDataParallel, against the dense computation on the whole batch. Where
a result is wrong, the report says which known mistake it matches, if one; the trace says which rank
decomposed which factor, and what each step() communicated.
"""
from __future__ import annotations

from typing import Any

from autograde.engine.run import Run
from autograde.engine.verdicts import rank_reports, require
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.optimizers.reports import KFAC_LAYERS, KfacReport, KfacTask, LarsReport, LarsTask
from autograde.protocol import COLLECTIVES, ProcessTrace

# The kinds of run these checks read (an item's `runs`, items.py)
LARS_RUNS = RunKind("lars")
KFAC_RUNS = RunKind("kfac")


TOLERANCE = 1e-5  # relative to the largest entry: float32 against the float64 definition
KFAC_WORLD_SIZES = (2, 3, 4)

# What each known mistake is called in a verdict, and what to do about it
LARS_MISTAKES = {
    "ratio_on_every_parameter": ("the trust ratio and weight decay were applied to a parameter with one dimension",
                                 "biases and norms' scales and shifts keep the global rate, without weight decay"),
    "no_weight_decay_in_ratio": ("the trust ratio's denominator left out weight decay",
                                 "the denominator is ||grad|| + weight_decay x ||w||"),
    "no_zero_guard": ("the trust ratio was used where a norm is 0",
                      "where ||w|| or ||grad|| is 0, the trust ratio is 1"),
    "no_momentum": ("no momentum was kept", "keep a momentum buffer per parameter in self.state[p]"),
    "plain_sgd": ("no trust ratio was applied at all: that is SGD with momentum",
                  "scale each weight's step by eta x ||w|| / (||grad|| + weight_decay x ||w||)"),
}
KFAC_MISTAKES = {
    "unpreconditioned": ("step() left the gradients as they were", "precondition every nn.Linear's gradient in "
                         "place: its weight's and bias's .grad hold the result"),
    "summed": ("the factors were summed over the ranks, not averaged",
               "each rank's factors cover 1/N of the batch: all-reduce them, then divide by the world size"),
    "damping_on_a": ("the damping was added to A only: (A + damping I) kron G",
                     "the damping goes on the Kronecker product: divide by (eigenvalue of G x eigenvalue of A + damping)"),
    "damping_on_g": ("the damping was added to G only: A kron (G + damping I)",
                     "the damping goes on the Kronecker product: divide by (eigenvalue of G x eigenvalue of A + damping)"),
    "factored_damping": ("the damping was split between the factors: (A + sqrt(damping) I) kron (G + sqrt(damping) I), "
                         "a known approximation, not the one asked for",
                         "divide by (eigenvalue of G x eigenvalue of A + damping)"),
    "no_running_average": ("each refresh used that batch's factors alone, without the running average",
                           "A <- factor_decay x A + (1 - factor_decay) x A of the batch, from the second refresh on"),
    "every_step": ("the factors were refreshed at every step, not every update_freq steps",
                   "refresh at steps 0, update_freq, 2 x update_freq, ...; reuse the last decompositions in between"),
    "bias_apart": ("the bias was left out: the weight's gradient was preconditioned with an A of the inputs alone, "
                   "and the bias's gradient left as it was",
                   "append a 1 to each input of a layer with a bias, and precondition [grad_W | grad_b] as one matrix"),
    "local_factors": ("each rank's factors came from its own share of the batch, not averaged over the ranks",
                      "all-reduce each layer's A and G of the batch and divide them by the world size, before the "
                      "running average"),
}
# Seen, not computed: the ranks that broadcast a tensor that is not contiguous (inprocess.py)
NONCONTIGUOUS = ("{ranks} broadcast a tensor that is not contiguous (eigh's eigenvectors are laid out column by "
                 "column, and .to() or .float() keeps that layout): broadcast sends the memory as it lies, so the "
                 "ranks that received it into a contiguous tensor got it transposed",
                 "call .contiguous() on the eigenvectors before broadcasting them")
# Words of a RuntimeError that multiplied or divided matrices of the wrong shapes
SHAPE_ERRORS = ("cannot be multiplied", "must match the size of tensor", "size mismatch", "shape mismatch")
# Each factor's size names its layer: A's is the layer's inputs (+1 with a bias), G's its outputs
FACTOR_SIZES = {(i + 1, "A"): inputs + bias for i, (inputs, _, bias) in enumerate(KFAC_LAYERS)}
FACTOR_SIZES.update({(i + 1, "G"): outputs for i, (_, outputs, _) in enumerate(KFAC_LAYERS)})


def _reports(run: Run, report_type: Any) -> list[Any]:
    return rank_reports(run, report_type, "the file must import, and its class work as the TODO's contract says")


def check_lars(ws: Workspace) -> str:
    """LARS on seven parameters (a linear layer's weight and bias, a convolution's weight, a norm's
    scale, a weight whose gradient is zero, a weight of zeros, and one in a second param group with
    other options), 3 steps: each equals notebook 24's update computed in float64, to 1e-5 of its
    size. A parameter that differs is named, with the known mistake it matches, if it matches one."""
    run = ws.called(LARS_RUNS, "1", "LARS's steps", LarsTask(world_sizes=[1]))
    (report,) = _reports(run, LarsReport)
    require(any(p.moved for p in report.params), "LARS.step() moved no parameter", "step() must move every "
            "parameter that has a gradient, in every param group")
    for p in report.params:
        if p.difference <= TOLERANCE:
            continue
        said = f"after 3 steps, {p.name} (shape {tuple(p.shape)}) is {p.difference:.1e} from LARS's update"
        if p.matches in LARS_MISTAKES:
            mistake, fix = LARS_MISTAKES[p.matches]
            require(False, f"{said}: {mistake}", fix)
        require(False, f"{said} (at most {TOLERANCE:g} of its size)" if p.difference != float("inf") else
                f"after 3 steps, {p.name} (shape {tuple(p.shape)}) is not a finite number, or changed its shape",
                "each parameter moves as notebook 24's update says, with its own param group's lr, momentum, "
                "weight_decay and eta")
    return ("LARS moves weights, biases, norms' scales, a weight of zeros and one with a zero gradient as the "
            "update says, in two param groups")


def _shapes() -> str:
    """Each layer's gradient, G and A, by their shapes: what a RuntimeError of mismatched shapes is measured against."""
    said = "; ".join(f"layer {i + 1}'s gradient {outputs} x {inputs + bias}, G {outputs} x {outputs}, A "
                     f"{inputs + bias} x {inputs + bias}" for i, (inputs, outputs, bias) in enumerate(KFAC_LAYERS))
    return (". A layer's gradient [grad_W | grad_b] is outputs x (inputs + 1 with a bias), its G outputs x outputs, "
            f"its A (inputs + 1) x (inputs + 1): G multiplies it on the left, A on the right (here {said})")


def _judge_kfac(reports: list[KfacReport]) -> None:
    sent: dict[tuple[int, int], list[int]] = {}  # (world size, case) -> the ranks that broadcast a non-contiguous tensor
    for r in reports:
        for i, c in enumerate(r.cases):
            if c.matches == "noncontiguous_broadcast":
                sent.setdefault((r.world_size, i), []).append(r.rank)
    for r in reports:
        where = f"with {r.world_size} processes, rank {r.rank}: " if r.world_size > 1 else ""
        for i, c in enumerate(r.cases):
            what = f"damping {c.damping:g}, factor_decay {c.factor_decay:g}, update_freq {c.update_freq}"
            shapes = _shapes() if c.error and any(words in c.error for words in SHAPE_ERRORS) else ""
            require(c.error is None, f"{where}with {what}: {c.error}{shapes}", "KFAC(model, damping=..., "
                    "factor_decay=..., update_freq=...) must work on a model with layers with and without a bias")
            for step, layers in enumerate(c.differences):
                for layer, d in enumerate(layers):
                    if d <= TOLERANCE:
                        continue
                    said = (f"{where}with {what}, after step() number {step}, layer {layer + 1}'s preconditioned "
                            f"gradient is {d:.1e} from (A kron G + damping I)^-1 grad" if d != float("inf") else
                            f"{where}with {what}, after step() number {step}, layer {layer + 1}'s gradient is not a "
                            "finite number, or changed its shape")
                    if (r.world_size, i) in sent:
                        ranks = sent[r.world_size, i]
                        mistake, fix = NONCONTIGUOUS
                        require(False, f"{said}: " + mistake.format(ranks=f"rank{'s' * (len(ranks) > 1)} "
                                                                         f"{', '.join(map(str, ranks))}"), fix)
                    if c.matches in KFAC_MISTAKES:
                        mistake, fix = KFAC_MISTAKES[c.matches]
                        require(False, f"{said}: {mistake}", fix)
                    require(False, f"{said} (at most {TOLERANCE:g} of its largest entry)",
                            "A: the mean of a a^T over the batch (a the layer's input, with a 1 appended when it has "
                            "a bias); G: the mean of g g^T (g = batch size x the gradient of the layer's output); "
                            "the weight's and bias's gradients preconditioned together")


def check_kfac(ws: Workspace) -> str:
    """KFAC on one process: a 3-layer model (the first layer without a bias), each step() on a new
    batch; after every step() each layer's gradient equals the dense (A kron G + damping I)^-1
    vec(grad) of the running averages, in float64, to 1e-5 of its largest entry, with damping 1e-3
    and update_freq 1, and with damping 0.1, factor_decay 0.8 and update_freq 3 (the decompositions
    reused between refreshes), 16 samples a batch (every factor of full rank). A result that matches a
    known mistake is named, and a RuntimeError of mismatched shapes is told each layer's shapes."""
    run = ws.called(KFAC_RUNS, "1", "KFAC on one process", KfacTask(world_sizes=[1]))
    _judge_kfac(_reports(run, KfacReport))
    return ("KFAC preconditions every layer (with and without a bias) as the dense computation does, at dampings "
            "1e-3 and 0.1, refreshed every step and every 3 steps")


def _steps(trace: ProcessTrace) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """(case, step, the events inside that step() call) of every step() call of the trace."""
    found: list[tuple[int, int, list[dict[str, Any]]]] = []
    inside = False
    for e in trace.events:
        if e["ev"] == "kfac_step":
            found.append((e["case"], e["step"], []))
            inside = True
        elif e["ev"] == "kfac_step_end":
            inside = False
        elif inside:
            found[-1][2].append(e)
    return found


def check_kfac_distributed(ws: Workspace) -> str:
    """KFAC on 2, 3 and 4 processes under DistributedDataParallel, each on its share of every batch:
    every rank's preconditioned gradients equal one process's dense computation on the whole batch, to
    1e-5 (with update_freq 1 and 10); from the trace, at every refresh each factor of each layer was
    decomposed by exactly one rank (a factor's size names its layer), and between refreshes step()
    made no collective and no decomposition. Factors summed, or not averaged at all, are named, and so is
    a broadcast of a tensor that is not contiguous (it arrives transposed)."""
    sizes = [str(n) for n in KFAC_WORLD_SIZES]
    run = ws.called(KFAC_RUNS, "-".join(sizes), f"KFAC on {', '.join(sizes)} processes",
                    KfacTask(world_sizes=list(KFAC_WORLD_SIZES)))
    reports = _reports(run, KfacReport)
    _judge_kfac(reports)
    traces = run.by_group()
    counts: dict[int, dict[int, list[int]]] = {}  # update_freq -> step -> collectives per rank
    for n in KFAC_WORLD_SIZES:
        group = [r for r in reports if r.world_size == n]
        require(group, f"the {run.name} ran only with {sorted({r.world_size for r in reports})} processes",
                "make KFAC work with any number of processes")
        decomposed: dict[tuple[int, int, int], set[int]] = {}  # (case, step, size) -> ranks
        for r in group:
            trace = traces.get((n, r.rank))
            for case, step, events in (_steps(trace) if trace is not None else []):
                freq = group[0].cases[case].update_freq
                made = [e for e in events if e["ev"] == "enter" and e.get("call") in COLLECTIVES]
                work = [e for e in events if e["ev"] == "decomposition"]
                if step % freq:
                    require(not made and not work, f"with {n} processes, rank {r.rank}'s step() number {step} "
                            f"(update_freq {freq}: no refresh) made {len(made)} collectives and {len(work)} "
                            "decompositions", "between refreshes, reuse the last decompositions: nothing to send")
                for e in work:
                    decomposed.setdefault((case, step, e["size"]), set()).add(r.rank)
                if n == KFAC_WORLD_SIZES[-1]:
                    counts.setdefault(freq, {}).setdefault(step, []).append(len(made))
        refreshes = {(case, step) for case, step, _ in decomposed} | {
            (c, s) for r in group for c, case in enumerate(r.cases) for s in range(len(case.differences))
            if s % case.update_freq == 0}
        for case, step in sorted(refreshes):
            for (layer, factor), size in sorted(FACTOR_SIZES.items()):
                ranks = sorted(decomposed.get((case, step, size), set()))
                require(ranks, f"with {n} processes, at step() number {step} no rank decomposed layer {layer}'s "
                        f"{factor} ({size} x {size})", "each layer's factors are decomposed by one rank (torch.linalg"
                        ".eigh) and sent from it to the others")
                require(len(ranks) == 1, f"with {n} processes, at step() number {step}, layer {layer}'s {factor} "
                        f"({size} x {size}) was decomposed by ranks {', '.join(map(str, ranks))}: each rank did "
                        "every layer's work", "give each layer one rank (round robin, or by cost), which decomposes "
                        "it and broadcasts the result")
    said = "; ".join(f"update_freq {freq}: {sum(max(v) for v in steps.values()) / len(steps):.1f} collectives a step "
                     f"on {KFAC_WORLD_SIZES[-1]} processes" for freq, steps in sorted(counts.items()))
    return (f"KFAC on 2, 3 and 4 processes preconditions as one process on the whole batch, each factor "
            f"decomposed by one rank ({said})")
