"""The checks of the part "how processes talk" (exercises/*.py), one function per exercise.

Each launches the learner's file as a learner would (`python exercises/compute_pi.py
--world-size 3`: the script starts its own processes), several times, and judges what the
processes did and printed. Like the lab's checks, they read behaviour, never names or wording.
"""
from __future__ import annotations

import math

from autograde.checker import output
from autograde.checker.runs import Run, Workspace
from autograde.checker.verdicts import require, run_ok

# compute_pi -----------------------------------------------------------------------------

PI_INTERVALS = 300_001  # does not divide by 2, 3 or 4: a share rule that drops the remainder shows
PI_WORLD_SIZES = (1, 2, 3, 4)
PI_ERROR = 1e-9  # the midpoint rule's own error at this many intervals is about 1e-12
WORK_SLACK = 1.5  # a rank may do this much more than its 1/N of one process's work (uneven shares, set-up)


def _pi_run(ws: Workspace, world_size: int) -> Run:
    return ws.launched(f"pi/{world_size}", f"run with --world-size {world_size}",
                       ["--world-size", str(world_size), "--intervals", str(PI_INTERVALS)],
                       env={"DDP_LAB_COUNT_WORK": "1"})


def _printed_pi(run: Run) -> output.Number | None:
    """The number closest to pi among what the run printed (any wording), if one is within 0.1."""
    near = [n for n in output.numbers(run.output) if abs(n.value - math.pi) < 0.1 and not n.percent]
    return min(near, key=lambda n: abs(n.value - math.pi)) if near else None


def check_pi(ws: Workspace) -> str:
    """Launched with 1, 2, 3 and 4 processes over a number of rectangles that none of them
    divides: each run prints pi to within 1e-9 (the midpoint rule's own error is far smaller),
    the value does not depend on the number of processes beyond rounding, and each process
    computes only its share: with N processes, every rank's PyTorch operations produce at most
    1.5/N of the elements that the single process's produce."""
    found: dict[int, float] = {}
    work: dict[int, dict[int, int]] = {}
    for n in PI_WORLD_SIZES:
        run = _pi_run(ws, n)
        run_ok(run, "the script must run to the end with any --world-size")
        number = _printed_pi(run)
        require(number is not None, f"the {run.name} printed no number near pi: {output_tail(run)}",
                "add up every rank's part with dist.all_reduce(part) (its default is a sum) before "
                "printing: one rank's part is only a piece of pi")
        assert number is not None
        require(number.decimals >= 10, f"the {run.name} printed pi as {number.value} ({number.decimals} decimals)",
                "print pi with at least 10 decimals (f\"{pi:.12f}\"), so that its accuracy shows")
        require(abs(number.value - math.pi) <= PI_ERROR,
                f"the {run.name} printed {number.value:.12f}, {abs(number.value - math.pi):.1e} away from pi",
                "every rank must add its part into the total (an all_reduce), and the shares must cover "
                "every rectangle exactly once")
        found[n] = number.value
        work[n] = {rank: e["elements"] for rank, t in run.ranks().items() for e in t.named("work")}
        require(len(work[n]) == n, f"the {run.name}: {len(work[n])} of {n} processes reached destroy_process_group",
                "end every process with dist.destroy_process_group()")
    spread = max(found.values()) - min(found.values())
    require(spread <= 1e-11, f"pi depends on the number of processes: {found}",
            "the shares must add up to the same sum whatever their number")
    whole = work[1][0]
    for n in PI_WORLD_SIZES[1:]:
        for rank, elements in sorted(work[n].items()):
            require(elements <= WORK_SLACK * whole / n,
                    f"with {n} processes, rank {rank} computed {elements:,} elements, "
                    f"{elements / whole:.0%} of what one process computes alone (its share is {1 / n:.0%})",
                    "each rank must evaluate only its own share of the rectangles")
    return (f"pi = {found[4]:.12f} with 1-4 processes (error {abs(found[4] - math.pi):.0e}); with 4, each rank "
            f"computed {max(work[4].values()) / whole:.0%} or less of the work one process does")


def output_tail(run: Run, limit: int = 200) -> str:
    text = " ".join(run.output.split())
    return repr(text[-limit:]) if text else "(nothing)"
