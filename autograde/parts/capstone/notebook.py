"""What notebook 40 (the capstone) calls: the data set and the rules shown, the baseline and the
learner's tries run with the rules' options, each try's log kept, and the chart of quality against time.

    from autograde.parts.capstone import notebook as capstone
    base = capstone.baseline()
    mine = capstone.try_run("exercises/capstone_lm.py", "ddp, batch 64")
    capstone.curves([base, mine])
    capstone.speedup(base, mine)
"""
from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from autograde.jupyter import figures, runtime
from autograde.parts.capstone import checks
from autograde.parts.capstone.reports import CONTEXT, samples, split_bytes

RUNS = Path("runs") / "capstone"  # each try's log, kept beside the notebook


@dataclass
class Try:
    """One run of a script under the rules: its label, its log's events, where the log is, and the
    machine it ran on."""

    label: str
    log: list[dict[str, Any]]
    path: Path
    machine: str

    @property
    def seconds(self) -> float | None:
        """The time to the target the log says (run_start to run_stop), None where the run gave up."""
        if not self.log or self.log[-1].get("status") != "success":
            return None
        return float(self.log[-1]["time"]) - float(self.log[0]["time"])


def data_summary() -> None:
    """The two splits' sizes under the rules in force, and one sample, as bytes and as text."""
    r = checks.rules()
    for split, limit in (("train", r.train_bytes), ("val", r.val_bytes)):
        print(f"{split:>5}: {len(split_bytes(split, limit)):>9,} bytes used, {len(samples(split, limit)):>7,} "
              f"samples of {CONTEXT} + 1 bytes")
    print("a training sample:", repr(samples("train", r.train_bytes)[1000 if not runtime.QUICK else 10].decode(
        errors="replace")))


def rules_table() -> None:
    """The rules in force (quick mode: the reduced ones `make test` uses)."""
    r = checks.rules()
    rows = [("target", f"validation loss per byte <= {r.target}"),
            ("evaluation", f"after every {r.eval_every:,} training samples (all processes), the whole validation split"),
            ("budget", f"{r.max_samples:,} training samples"),
            ("data", f"the first {r.train_bytes:,} bytes of the training split, {r.val_bytes:,} of the validation split"),
            ("seeds", ", ".join(map(str, r.seeds)) + " (the median time counts)")]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:>{width}}  {value}")


def _events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def _label_file(label: str, seed: int) -> Path:
    RUNS.mkdir(parents=True, exist_ok=True)
    return RUNS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', label).strip('-') or 'run'}-seed{seed}.jsonl"


def try_run(script: str, label: str, processes: int = 2, seed: int = 0, *options: str) -> Try:
    """Run `script` under the rules with torchrun and `processes` processes (1: plain python, as the
    baseline runs), with the rules' options and `options` of your own, and keep its log as `label`."""
    log = _label_file(label, seed)
    log.unlink(missing_ok=True)
    argv = [*checks.rules().argv(seed, str(log)), *options]
    if processes == 1:
        runtime.run([runtime.processes.PYTHON, runtime.course_file(script).resolve(), *argv],
                    timeout=600 if runtime.QUICK else None, env={"OMP_NUM_THREADS": "1"})
    else:
        runtime.torchrun(script, *argv, nproc=processes, env={"OMP_NUM_THREADS": "1"})
    machine = this_machine()
    log.with_suffix(".machine").write_text(machine)
    found = Try(label, _events(log), log, machine)
    print(f"{label}: " + (f"the target in {found.seconds:.1f} s" if found.seconds is not None else "no target reached"))
    return found


def this_machine() -> str:
    """What a time depends on: the host, its processor and the cores this notebook may use, its GPUs."""
    cpu = "an unknown processor"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    found = runtime.machine()
    gpus = f", {len(found.gpus)} GPU(s): {', '.join(sorted(set(found.gpus)))}" if found.gpus else ", no GPU"
    return f"{socket.gethostname()} ({cpu}, {found.cpu_cores} core(s){gpus})"


def kept(label: str, seed: int = 0) -> Try:
    """A try run before (in this notebook or another, on this machine or another), from runs/capstone/."""
    log = _label_file(label, seed)
    if not log.exists():
        raise FileNotFoundError(f"no try labelled {label!r} in {RUNS}/: run it with capstone.try_run(...)")
    machine = log.with_suffix(".machine")
    return Try(label, _events(log), log, machine.read_text() if machine.exists() else "a machine not recorded")


def speedup(base: Try, mine: Try) -> float:
    """The baseline's time to the target over yours, both timed on the same machine; printed and returned."""
    if base.machine != mine.machine:
        raise ValueError(f"the baseline {base.label!r} ran on {base.machine}, {mine.label!r} on {mine.machine}: a "
                         "speedup compares two runs on one machine; time the baseline here (capstone.baseline())")
    if base.seconds is None or mine.seconds is None:
        raise ValueError(f"{base.label if base.seconds is None else mine.label!r} did not reach the target: "
                         "no time to compare")
    ratio = base.seconds / mine.seconds
    print(f"{mine.label}: {mine.seconds:.1f} s against the baseline's {base.seconds:.1f} s: a speedup of {ratio:.2f}")
    return ratio


def baseline(seed: int = 0) -> Try:
    """The handed-out baseline (the course's copy, one process), timed here."""
    return try_run(str(checks.BASELINE), "baseline", 1, seed)


def curves(tries: list[Try]) -> Figure:
    """Each try's validation loss against the seconds since its run_start, the target across."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for t in tries:
        start = float(t.log[0]["time"]) if t.log else 0.0
        evals = [e for e in t.log if e.get("key") == "eval"]
        ax.plot([float(e["time"]) - start for e in evals], [e["loss"] for e in evals], marker="o", label=t.label)
    ax.axhline(checks.rules().target, color="grey", linestyle="--", label="target")
    ax.set_xlabel("seconds since run_start")
    ax.set_ylabel("validation loss per byte")
    ax.grid(alpha=0.3)
    ax.legend()
    return figures.finish(fig)
