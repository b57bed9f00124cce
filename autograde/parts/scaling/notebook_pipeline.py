"""What notebook 18's pipeline task calls: the learner's exercise run under the profiler (its own
`--profile` option: rank 0's steps 3-5 under torch.profiler with Python's calls), the trace read
back function by function, and the learner's reading of it compared with what it holds."""
from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from autograde.engine import processes
from autograde.jupyter import runtime

EXERCISE = "exercises/input_pipeline.py"
WAIT = "wait for the batch"  # the training loop's record_function labels
SHARE_TOLERANCE = 0.1        # a share of the step read off the table: within 10 points


@dataclass(frozen=True)
class Row:
    """One Python function (or record_function label) of a trace: its calls and its time, both
    summed over the profiled steps; the time includes what it called."""

    name: str
    calls: int
    seconds: float


@dataclass(frozen=True)
class Trace:
    """Rank 0's profiled steps: how many, their time, and each function called in every one of
    them at least once, the slowest first."""

    path: Path
    steps: int
    seconds: float
    rows: list[Row]

    def row(self, part: str) -> Row | None:
        """The slowest row whose name holds `part` ("): read", "wait for the batch")."""
        return next((r for r in self.rows if part in r.name), None)


def read_trace(path: str | Path) -> Trace:
    """A Chrome trace written by torch.profiler with with_stack=True, summed by function. Frames
    called fewer times than there are steps (the start of the program, the profiler's own) are left out."""
    try:
        events = json.loads(Path(path).read_text())["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a trace torch.profiler wrote: {err}") from None
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    steps = [e for e in spans if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError(f"{path} holds no profiled step (no ProfilerStep#): was the profiler's step() called?")
    calls: dict[str, int] = defaultdict(int)
    micros: dict[str, float] = defaultdict(float)
    for e in spans:
        if e.get("cat") in ("python_function", "user_annotation") and not str(e["name"]).startswith("ProfilerStep#"):
            calls[e["name"]] += 1
            micros[e["name"]] += float(e["dur"])
    rows = [Row(name, calls[name], micros[name] / 1e6) for name in calls if calls[name] >= len(steps)]
    rows.sort(key=lambda r: -r.seconds)
    return Trace(Path(path), len(steps), sum(float(e["dur"]) for e in steps) / 1e6, rows)


def profile_pipeline(slow: bool, script: str = EXERCISE, folder: str | Path | None = None) -> Trace:
    """`python exercises/input_pipeline.py [--slow] --profile DIR`, as in a terminal: rank 0's
    steps 3-5 of the handed-out pipeline (slow) or of yours, read back."""
    out = Path(folder or tempfile.mkdtemp(prefix="ddp-lab-pipeline-"))
    which = ["--slow"] if slow else []
    print(f"$ python {script} {' '.join(which + ['--profile', str(out)])}")
    runtime.run([processes.PYTHON, runtime.course_file(script), *which, "--profile", str(out)],
                timeout=300, echo=False, env={"KINETO_LOG_LEVEL": "5"})
    path = out / f"{'slow' if slow else 'yours'}-rank0.json"
    if not path.exists():
        raise runtime.LaunchError(f"{script} --profile wrote no {path.name} in {out}: keep its --profile "
                                  "option and training loop as handed out")
    return read_trace(path)


def show(trace: Trace, top: int = 14) -> None:
    """The trace as a table: for each function, its time and calls per step and its time per
    call, the slowest first (a function's time includes the functions it calls)."""
    n = trace.steps
    print(f"rank 0, {n} profiled steps: {trace.seconds / n * 1000:.1f} ms a step  ({trace.path})")
    print(f"{'ms/step':>8} {'calls/step':>10} {'ms/call':>8}  function (file(line): name) or label")
    for r in trace.rows[:top]:
        print(f"{r.seconds / n * 1000:8.2f} {r.calls / n:10.1f} {r.seconds / r.calls * 1000:8.3f}  {r.name}")


def check_reading(trace: Trace, requests_per_batch: float | None, waiting_share: float | None) -> bool:
    """Your reading of the handed-out pipeline's trace against the trace: the requests to the
    share (calls of SlowDisk.read) one batch makes, and the share of a step spent waiting for its
    batch (0 to 1, within 0.1). Says which is off, not the value."""
    if requests_per_batch is None or waiting_share is None:
        print("fill in requests_per_batch and waiting_share from the table above first")
        return False
    reads, waits = trace.row("): read"), trace.row(WAIT)
    if reads is None or waits is None:
        print("this trace has no SlowDisk.read or no 'wait for the batch': profile the handed-out pipeline (slow=True)")
        return False
    right = True
    if abs(requests_per_batch - reads.calls / trace.steps) > 0.5:
        print(f"requests_per_batch = {requests_per_batch}: not what the trace says. A step takes one batch: "
              "how many times a step is SlowDisk's read called?")
        right = False
    if abs(waiting_share - waits.seconds / trace.seconds) > SHARE_TOLERANCE:
        print(f"waiting_share = {waiting_share}: not what the trace says. Compare the row '{WAIT}' with "
              "the time of a whole step")
        right = False
    if right:
        print(f"right: {reads.calls / trace.steps:.0f} requests a batch of {reads.seconds / reads.calls * 1000:.1f} ms "
              f"each, and {waits.seconds / trace.seconds:.0%} of a step waiting for the batch")
    return right
