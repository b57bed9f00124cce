"""The checks of part memory (notebooks 30-) other than ZeRO's (checks_zero.py), one function per graded item.

LAMB (exercises/lamb.py) is tried by inprocess.py `lamb` on parameters of every kind, against notebook 31's
update in float64, and against the updates of known mistakes where it differs.

The loss scaler (exercises/loss_scaling.py) is tried by inprocess.py `loss_scaling` beside torch.amp.GradScaler,
step by step, with an inf or a nan put into some inputs: the scales, the steps taken and skipped, the weights
and the optimizer's state, for two settings.

Activation checkpointing (exercises/checkpointing.py) is tried by inprocess.py `checkpointing`: both of the
learner's forwards on 8 blocks, in 1, 2 and 3 runs, against the plain forward pass; the bytes autograd kept
for backward, and the blocks computed again in backward.

bf16 training (exercises/bf16_training.py) is tried by inprocess_bf16.py `bf16` on 2 processes: the learner's
master weights against fp32 masters stepped here, and DDP's gradients with the learner's hook against fp32's
and the sum's, the all-reduces the hook made traced with their dtype.
"""
from __future__ import annotations

from autograde.engine.verdicts import rank_reports, require
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.memory.checks_zero import steps_of
from autograde.parts.memory.reports import (
    BF16_STEPS,
    CHECKPOINT_BLOCKS,
    LAMB_STEPS,
    LOSS_SCALINGS,
    Bf16Report,
    Bf16Task,
    CheckpointReport,
    CheckpointTask,
    LambReport,
    LambTask,
    ScalingReport,
    ScalingStep,
    ScalingTask,
)

LAMB_RUNS = RunKind("lamb")
LOSS_SCALING_RUNS = RunKind("loss_scaling")
CHECKPOINT_RUNS = RunKind("checkpointing")
BF16_RUNS = RunKind("bf16")
TOLERANCE = 1e-6  # the same sums in another order differ by about 1e-7 here
FLOAT32_TOLERANCE = 1e-5  # float32 steps against a float64 definition (LAMB), or against GradScaler's


# What each known mistake is called in a verdict, and what to do about it
LAMB_MISTAKES = {
    "ratio_on_numerator": ("the trust ratio divided by the norm of Adam's averaged gradient (its numerator) alone",
                           "the ratio's denominator is the norm of the whole step: Adam's update plus weight_decay x w"),
    "ratio_without_decay": ("the trust ratio was taken on Adam's update alone, and the weight decay added after it",
                            "add weight_decay x w to Adam's update first, then scale the sum by ||w|| / ||sum||"),
    "no_bias_correction": ("Adam's running averages were used without bias correction",
                           "divide the averages by 1 - beta1^t and 1 - beta2^t, t the parameter's step count from 1"),
    "ratio_on_every_parameter": ("the trust ratio and weight decay were applied to a parameter with one dimension",
                                 "biases and norms' scales and shifts take Adam's update alone"),
    "no_zero_guard": ("the trust ratio was used where a norm is 0", "where ||w|| or the step's norm is 0, the ratio is 1"),
    "adamw": ("no trust ratio was applied at all: that is AdamW", "scale each weight's step (Adam's update plus "
              "weight decay) by ||w|| / ||step||"),
}


def check_lamb(ws: Workspace) -> str:
    """LAMB on seven parameters (a linear layer's weight and bias, a convolution's weight, a norm's scale, a weight
    whose gradient is zero, a weight of zeros, and one in a second param group with other options), 3 steps:
    each equals notebook 31's update computed in float64, to 1e-5 of its size. A parameter that differs is
    named, with the known mistake it matches, if it matches one."""
    run = ws.called(LAMB_RUNS, "1", "LAMB's steps", LambTask(world_sizes=[1]))
    (report,) = rank_reports(run, LambReport, "the file must import, and LAMB work as the TODO's contract says")
    require(any(p.moved for p in report.params), "LAMB.step() moved no parameter", "step() must move every "
            "parameter that has a gradient, in every param group")
    for p in report.params:
        if p.difference <= FLOAT32_TOLERANCE:
            continue
        said = f"after {LAMB_STEPS} steps, {p.name} (shape {tuple(p.shape)}) is {p.difference:.1e} from LAMB's update"
        if p.matches in LAMB_MISTAKES:
            mistake, fix = LAMB_MISTAKES[p.matches]
            require(False, f"{said}: {mistake}", fix)
        require(False, f"{said} (at most {FLOAT32_TOLERANCE:g} of its size)" if p.difference != float("inf") else
                f"after {LAMB_STEPS} steps, {p.name} (shape {tuple(p.shape)}) is not a finite number, or changed its "
                "shape", "each parameter moves as notebook 31's update says, with its own param group's lr, betas, "
                "eps and weight_decay")
    return ("LAMB moves weights, biases, norms' scales, a weight of zeros and one with a zero gradient as the update "
            "says, in two param groups")


def _setting(k: int) -> str:
    a = LOSS_SCALINGS[k]
    return (f"LossScaler(init_scale={a['init_scale']:g}, growth_factor={a['growth_factor']:g}, backoff_factor="
            f"{a['backoff_factor']:g}, growth_interval={a['growth_interval']})")


def _judge_scaling_step(setting: int, s: ScalingStep, previous: ScalingStep | None) -> None:
    held = {"inf": "an inf", "nan": "a nan"}.get(s.overflow or "", s.overflow)
    at = f"{_setting(setting)}, step {s.step}" + (f" (its input held {held})" if s.overflow else "")
    require(s.scale is not None, f"{at}: get_scale() gave no finite number", "get_scale() returns the current scale")
    scale = s.scale or 0.0
    before = previous.scale if previous is not None and previous.scale is not None else None
    if scale != s.expected_scale and previous is not None and before is not None:
        interval = LOSS_SCALINGS[setting]["growth_interval"]
        require(not (previous.overflow and scale == before), f"{at}: the scale was still {scale:g} after the step "
                f"before overflowed; it should have become {s.expected_scale:g}", "after a skipped step, multiply "
                "the scale by backoff_factor")
        require(not (not previous.overflow and s.expected_scale > before and scale == before), f"{at}: the scale "
                f"stayed {scale:g} after {interval} steps in a row without overflow; it should have grown to "
                f"{s.expected_scale:g}", "count the steps taken in a row since the last overflow (or growth); at "
                "growth_interval, multiply the scale by growth_factor and count again from 0")
        require(not (not previous.overflow and scale > s.expected_scale and scale > before), f"{at}: the scale grew "
                f"to {scale:g}, where GradScaler's stayed {s.expected_scale:g}: fewer than {interval} steps had been "
                "taken in a row since the last one skipped", "after a skipped step, count the steps taken in a row "
                "again from 0")
    if scale != s.expected_scale:
        require(False, f"{at}: the scale was {scale:g} where torch.amp.GradScaler's was {s.expected_scale:g}",
                "start at init_scale; after a skipped step multiply by backoff_factor; after growth_interval steps "
                "taken in a row, by growth_factor; count again from 0 after either")
    if s.expected_stepped != s.stepped:
        require(not s.stepped, f"{at}: your step moved the weights, where its gradients were not all finite and "
                "GradScaler skipped the step", "look for an inf or a nan in every gradient, after unscaling; when "
                "there is one, do not call optimizer.step() at all")
        require(False, f"{at}: your step left the weights as they were, where GradScaler took the step",
                "call optimizer.step() once, when every gradient is finite")
    if not s.expected_stepped:
        require(s.state_difference <= FLOAT32_TOLERANCE, f"{at}: the optimizer's momentum buffers are "
                f"{s.state_difference:.1e} from those beside GradScaler, though the weights did not move: a skipped "
                "step still changed the optimizer's state", "a skipped step leaves the optimizer untouched: no "
                "optimizer.step() at all, whatever its rate or gradients")
    require(s.difference <= FLOAT32_TOLERANCE and s.state_difference <= FLOAT32_TOLERANCE, f"{at}: the weights are "
            f"{s.difference:.1e} and the momentum buffers {s.state_difference:.1e} from those beside GradScaler",
            "divide every gradient by the scale the loss was multiplied by, before the optimizer steps")


def check_loss_scaling(ws: Workspace) -> str:
    """The learner's LossScaler beside torch.amp.GradScaler, each driving SGD with momentum and weight decay from the
    same weights on the same batches, 16 steps, the gradients overflowing (an inf in the input) at steps 3, 4 and 13
    and holding a nan at step 8, for two settings (init_scale, growth_factor, backoff_factor, growth_interval): at
    every step the same scale, the same steps taken and skipped, the same weights and momentum buffers to 1e-5. The
    first step that differs is named, with what the scale should have done there."""
    run = ws.called(LOSS_SCALING_RUNS, "1", "LossScaler beside GradScaler", ScalingTask(world_sizes=[1]))
    (report,) = rank_reports(run, ScalingReport, "the file must import, and LossScaler work as the TODOs' contract says")
    for case in report.cases:
        require(case.error is None, f"{_setting(case.setting)}: {case.error}", "scale(loss) returns the loss times "
                "the scale; step(optimizer) and update() follow it, as with torch.amp.GradScaler")
        for k, s in enumerate(case.steps):
            _judge_scaling_step(case.setting, s, case.steps[k - 1] if k else None)
    skipped = sum(not s.expected_stepped for s in report.cases[0].steps)
    return (f"LossScaler makes GradScaler's decisions at every step, in two settings: the scale backs off at each of "
            f"the {skipped} overflows (an inf or a nan), grows back after its interval, and a skipped step leaves the "
            "weights and the optimizer's state untouched")


CHECKPOINT_SLACK = 4096  # bytes a correct forward may keep beyond one input per run (none here; a margin)
WHAT = {"run_checkpointed": "run_checkpointed (torch.utils.checkpoint)", "run_by_hand": "run_by_hand (Recompute)"}


def _judge_checkpointing(report: CheckpointReport, function: str) -> str:
    cases = [c for c in report.cases if c.function == function]
    require(cases, f"{WHAT[function]} was not tried", f"define {function}(blocks, x, segments)")
    act = report.activation_bytes
    for c in cases:
        at = f"{WHAT[function]} with {c.segments} run{'s' if c.segments > 1 else ''} of {CHECKPOINT_BLOCKS} blocks"
        require(c.error is None, f"{at}: {c.error}", f"{function}(blocks, x, segments) returns blocks(x), "
                "and backward() goes through it")
        require(c.output <= TOLERANCE, f"{at}: the output is {c.output:.1e} from blocks(x)", "apply every block, "
                "in order, each exactly once in the forward pass")
        require(c.input_grad != float("inf"), f"{at}: the input got no gradient", "backward must return the "
                "gradient with respect to the run's input")
        require(c.param_grad != float("inf"), f"{at}: a block's parameters got no gradient: backward computed the "
                "input's gradient alone", "go back through the recomputed run so that its parameters' .grad "
                "receive their gradients too (torch.autograd.backward, not torch.autograd.grad of the input alone)")
        require(c.input_grad <= TOLERANCE and c.param_grad <= TOLERANCE, f"{at}: the gradients are "
                f"{max(c.input_grad, c.param_grad):.1e} from the plain forward's (input {c.input_grad:.1e}, "
                f"parameters {c.param_grad:.1e})", "compute the run again from the very input it had in the forward "
                "pass, and go back through it once")
        limit = c.segments * act + CHECKPOINT_SLACK
        require(c.kept_bytes <= limit, f"{at}: autograd kept {c.kept_bytes / 1024:.0f} KB for backward during the "
                f"forward, where one input per run is {c.segments * act / 1024:.0f} KB (the plain forward keeps "
                f"{report.plain_bytes / 1024:.0f} KB)", "checkpoint every run, the last too, and compute inside a run "
                "without keeping anything for backward (in Recompute.forward, under torch.no_grad)")
        least = CHECKPOINT_BLOCKS - c.segments  # torch's non-reentrant checkpoint skips each run's last block
        require(c.recomputed >= least, f"{at}: {c.recomputed} blocks ran again in backward, where every run is "
                f"computed again ({least} at least)", "compute each run again in backward, from its input")
    return f"{min(c.kept_bytes for c in cases) / 1024:.0f}-{max(c.kept_bytes for c in cases) / 1024:.0f} KB"


def check_checkpointing(ws: Workspace) -> str:
    """run_checkpointed (torch.utils.checkpoint) and run_by_hand (the learner's Recompute) on 8 blocks of 64 wide, in
    1, 2 and 3 runs (3, 2 and 3 blocks): the output and every gradient (input and parameters) equal the plain
    forward's to 1e-6; during the forward, autograd keeps at most one input per run for backward
    (torch.autograd.graph.saved_tensors_hooks weighs it, each buffer once); and in backward the blocks run again (at
    least all but each run's last). The torch.utils.checkpoint form is judged first."""
    run = ws.called(CHECKPOINT_RUNS, "1", "the checkpointed forwards", CheckpointTask(world_sizes=[1]))
    (report,) = rank_reports(run, CheckpointReport, "the file must import, and its functions work as the TODOs' "
                             "contract says")
    kept = {function: _judge_checkpointing(report, function) for function in WHAT}
    return (f"both forwards give the plain forward's output and gradients in 1 to 3 runs, keeping one input per run "
            f"for backward (torch.utils.checkpoint {kept['run_checkpointed']}, by hand {kept['run_by_hand']}, the "
            f"plain forward {report.plain_bytes / 1024:.0f} KB) and computing each run again in backward")


BF16_GAP = 2.0 ** -7  # bf16's relative spacing near 1: a bf16 average is this far from fp32's, at most about


def check_bf16(ws: Workspace) -> str:
    """MasterWeights on a bf16 model, 8 steps of SGD with momentum at a rate whose updates are mostly below bf16's
    resolution: what the learner's optimizer steps is fp32, equals fp32 masters stepped alike to 1e-6, and the
    model's bf16 weights are those masters rounded (to 1e-6). The hook, on 2 processes under DDP: the gradients
    are the average over the processes, within bf16's rounding of fp32's (2^-7 of the largest), not fp32's
    exactly; what its all-reduces sent was bf16 (traced). The verdict gives the error against fp32 and how far
    the weights moved with masters and without."""
    run = ws.called(BF16_RUNS, "2", "bf16 training on 2 processes", Bf16Task(world_sizes=[2]))
    reports = rank_reports(run, Bf16Report, "the file must import, and its class and hook work as the TODOs' "
                           "contract says")
    for r in reports:
        where = f"rank {r.rank}"
        require(r.master_error is None, f"{where}, MasterWeights: {r.master_error}", "MasterWeights(model, "
                "optimizer_cls, **kwargs) keeps fp32 copies and an optimizer over them; step() follows loss.backward()")
        require(r.optimizer_dtypes, f"{where}: no optimizer of MasterWeights began a step", "step the fp32 copies with "
                "optimizer_cls(...) in step()")
        require(r.optimizer_dtypes == ["float32"], f"{where}: the optimizer stepped {', '.join(r.optimizer_dtypes)} "
                "tensors: master weights kept in bf16 lose the small updates they are there to keep", "make the "
                "copies float32 (p.detach().float().clone()), and step those")
        require(r.masters <= TOLERANCE, f"{where}: after {BF16_STEPS} steps, the fp32 copies your optimizer stepped are "
                f"{r.masters:.1e} from fp32 masters stepped with the same bf16 gradients", "give each copy the model's "
                "gradient as fp32, step, and start the next step from the copies (never from the bf16 weights)")
        require(r.weights <= TOLERANCE, f"{where}: after {BF16_STEPS} steps, the model's bf16 weights are {r.weights:.1e} "
                "from the fp32 masters rounded to bf16", "after each step, copy every master into its bf16 parameter")
        require(r.hook_error is None, f"{where}, the hook: {r.hook_error}", "bf16_allreduce_hook(process_group, bucket) "
                "returns a torch.futures.Future whose value is the averaged bucket, in its own dtype")
        require(not (r.from_sum <= BF16_GAP < r.from_fp32), f"{where}: the hooked gradients are the sum over the "
                "processes, not their average", "divide by the process group's size")
        require(r.from_fp32 > 0, f"{where}: the hooked gradients equal fp32's exactly: nothing was rounded to bf16 on "
                "the way", "cast the bucket to torch.bfloat16 before the all-reduce")
        require(r.from_fp32 <= BF16_GAP, f"{where}: the hooked gradients are {r.from_fp32:.1e} (of the largest) from "
                f"DDP's in fp32, more than bf16's rounding ({BF16_GAP:.1e})", "average the bucket: cast it to bf16, "
                "all-reduce, divide by the group's size, cast back to the bucket's dtype")
    sent = [e for trace in run.by_group().values() for step in steps_of(trace) for e in step.calls(("all_reduce",))]
    require(sent, "the hook made no all_reduce that the trace saw", "all-reduce the compressed bucket with "
            "torch.distributed.all_reduce")
    wide = sorted({str(e.get("dtype")) for e in sent} - {"bfloat16"})
    require(not wide, f"the hook's all-reduces sent {', '.join(wide)}, not bfloat16", "cast the bucket to "
            "torch.bfloat16 before the all-reduce: that halves the bytes sent")
    r = reports[0]
    return (f"MasterWeights steps fp32 copies and rounds them into the bf16 model (the weights moved {r.moved:.3f} in "
            f"all, {r.moved_pure:.3f} stepped in bf16 alone); the hook all-reduces in bf16, {r.from_fp32:.1e} of the "
            "largest gradient from fp32's average")
