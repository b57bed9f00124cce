"""The check of K-FAC for convolutions (exercises/kfac_conv.py, notebook 38).

It is tried by inprocess_kfac.py `kfac_conv` in one process: the learner's kfac_factors on three convolutions
(padding, a stride with a kernel that is not square, no bias, 1x1) and a linear layer, one batch of a small net,
against the Fisher's Kronecker approximation (only A kron G is judged: where the positions' count goes is the
learner's choice); then the learner's precondition, given the reference factors, against a dense damped solve.
"""
from __future__ import annotations

from autograde.engine.verdicts import rank_reports, require
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.memory.reports import KfacConvReport, KfacConvTask, KfacLayerCase

KFAC_CONV_RUNS = RunKind("kfac_conv")
TOLERANCE = 1e-4  # float32 factors and eigendecompositions, against float64, relative to the largest entry

# A product that is a multiple of the reference's: what the multiple says was done, and what to do instead
PRODUCT_MISTAKES = {
    "1/L": ("the output positions were averaged in both factors",
            "an example's gradient sums its positions' g a^T: the positions' count belongs once in A kron G (notebook 38)"),
    "L": ("the output positions were summed in both factors (no spatial average)",
          "take the means over examples and positions in A and G, and the positions' count once (notebook 38)"),
    "L^2": ("the output positions were summed in both factors, and counted once more",
            "take the means over examples and positions in A and G, and the positions' count once (notebook 38)"),
    "1/L^2": ("the output positions were averaged in both factors, and divided once more",
              "take the means over examples and positions in A and G, and the positions' count once (notebook 38)"),
    "1/B^2": ("G was made of the gradient of the batch's mean loss, not of each example's",
              "the loss is a mean over the batch: each example's own gradient is output_grad times the batch's size"),
}

PRECONDITION_MISTAKES = {
    "damped_factors": ("the damping was added to each factor ((A + sqrt(d) I) kron (G + sqrt(d) I)), not to their "
                       "product", "divide by (each eigenvalue of A times each of G) + damping"),
    "no_inverse": ("the gradient was multiplied by A kron G + damping I instead of its inverse",
                   "divide by the eigenvalues' products plus damping, in the eigenbases"),
}


def _multiple(case: KfacLayerCase, batch: int) -> str | None:
    if not case.ratio:
        return None
    positions = case.positions
    for name, value in (("1/L", 1 / positions), ("L", positions), ("L^2", positions**2), ("1/L^2", positions**-2),
                        ("1/B^2", batch**-2)):
        if positions == 1 and "L" in name:
            continue
        if abs(case.ratio / value - 1) < 1e-3:
            return name
    return None


def _judge_factors(case: KfacLayerCase, batch: int) -> None:
    where = f"kfac_factors on {case.name}"
    require(case.factors_error is None, f"{where}: {case.factors_error}", "return (A, G) as the TODO says, for "
            "nn.Linear and nn.Conv2d")
    require(case.a_shape == [case.columns] * 2, f"{where}: A is {'x'.join(map(str, case.a_shape))}, not "
            f"{case.columns}x{case.columns}", "A has a row and a column per input one output multiplies: for a "
            "convolution, in_channels x the kernel's height x its width (a patch), and a 1 for the bias where there is one")
    require(case.g_shape == [case.rows] * 2, f"{where}: G is {'x'.join(map(str, case.g_shape))}, not "
            f"{case.rows}x{case.rows}", "G has a row and a column per output channel (or feature)")
    if case.product <= TOLERANCE:
        return
    multiple = _multiple(case, batch)
    said = (f"{where}: A kron G is {case.ratio:.4g} times the Fisher's approximation" if case.ratio else
            f"{where}: A kron G is {case.product:.1e} from the Fisher's approximation (of its largest entry), "
            "not a multiple of it")
    if multiple in PRODUCT_MISTAKES:
        mistake, fix = PRODUCT_MISTAKES[multiple]
        require(False, f"{said} ({case.positions} output positions, a batch of {batch}): {mistake}", fix)
    require(False, said, "A is made of the patches each output position saw (stride, padding and kernel as the layer's), "
            "G of the output's gradient at each position, as notebook 38 says")


def _judge_precondition(case: KfacLayerCase) -> None:
    where = f"precondition on {case.name}"
    require(case.precondition_error is None, f"{where}: {case.precondition_error}", "precondition(layer, A, G, "
            "damping) replaces the layer's gradients in place")
    require(case.shapes_kept, f"{where}: weight.grad or bias.grad no longer has its parameter's shape",
            "write the preconditioned matrix back into each gradient in its own shape")
    if case.preconditioned <= TOLERANCE:
        return
    said = f"{where}: the gradient is {case.preconditioned:.1e} from (A kron G + damping I)^-1 applied to it"
    if case.matches in PRECONDITION_MISTAKES:
        mistake, fix = PRECONDITION_MISTAKES[case.matches]
        require(False, f"{said}: {mistake}", fix)
    require(not case.bias_untouched, f"{said}: the bias's gradient was left as it was",
            "precondition the weight and the bias as one matrix, the bias its last column")
    require(False, said, "take the weight's gradient as a matrix (a row per output, its bias's gradient a last column), "
            "precondition it as a whole, and write it back")


def check_kfac_conv(ws: Workspace) -> str:
    """kfac_factors on Conv2d(3, 4, 3, padding=1), Conv2d(4, 5, (3, 2), stride=2, bias=False), Conv2d(5, 6, 1) and
    Linear(54, 3), one batch of 6: A kron G equals the Fisher's Kronecker approximation to 1e-4 (only the product
    is judged); precondition, given those factors, leaves each gradient equal to (A kron G + damping I)^-1 applied
    to it (a dense solve in float64) to 1e-4. A product that is a multiple of the reference (the positions averaged
    or summed twice, the mean loss's gradient) and a preconditioning with the damping on each factor are named."""
    run = ws.called(KFAC_CONV_RUNS, "1", "factors and preconditioning of K-FAC", KfacConvTask(world_sizes=[1]))
    (report,) = rank_reports(run, KfacConvReport, "the file must import, and its two functions work as the TODOs' "
                             "contract says")
    for case in report.layers:
        _judge_factors(case, report.batch)
    for case in report.layers:
        _judge_precondition(case)
    convs = [c for c in report.layers if c.positions > 1 or "Conv" in c.name]
    shapes = ", ".join(f"{c.columns} numbers at {c.positions} positions" for c in convs)
    return (f"A kron G equals the Fisher's approximation on {len(convs)} convolutions (patches of {shapes}) and a "
            "linear layer; the preconditioned gradients equal a dense damped solve")
