"""What the notebooks of the part "inside DDP" (inside_ddp, notebooks 20-23) call: the hand-made
DDPs timed against DistributedDataParallel, the bucket plan of a model, gradient accumulation with
no_sync (20); the memory each ZeRO stage leaves on a process, and the sharded optimizer and FSDP
measured (21); demos/hangs.py made to hang and looked at from outside, and the stacks of the
learner's project where it hangs (23). Every launch has a
time limit and leaves nothing running (runtime.run, or a process group killed after). And the
part's figures: the hand-made DDPs against DDP (20), memory by ZeRO stage and the optimizer state's
shares (21). Model parallelism (22) has its own module, inside_model_parallel.py."""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from autograde.engine import processes
from autograde.engine.workspace import Workspace
from autograde.jupyter import runtime
from autograde.jupyter.figures import RANK_COLOURS, finish
from autograde.parts.inside import (
    checks_hangs,
    reports,  # the model the checks try, and DDP's bucket plan
)

BY_HAND = "exercises/ddp_by_hand.py"
SHARDED = "exercises/sharded_optimizer.py"
NO_SYNC = "demos/no_sync_accumulation.py"
FSDP = "demos/fsdp_memory.py"
LAB_MODEL = "solutions/fashion_mnist_after_step_10.py"  # the finished lab's WideResNet
HANGS = "demos/hangs.py"

# Bytes per parameter that training with Adam keeps: the parameter, its gradient, the optimizer's state.
# fp32: Adam's two moving averages. Mixed precision (the ZeRO paper's accounting): bf16/fp16 weights and
# gradients, and an fp32 master copy of the weights beside the two averages.
PER_PARAMETER = {"fp32": {"parameters": 4, "gradients": 4, "optimizer": 8},
                 "mixed": {"parameters": 2, "gradients": 2, "optimizer": 12}}
# What each stage divides among N processes.
SHARDED_BY_STAGE = {"DDP": (), "ZeRO-1": ("optimizer",), "ZeRO-2": ("optimizer", "gradients"),
                    "ZeRO-3 (FSDP)": ("optimizer", "gradients", "parameters")}

ddp_model = reports.ddp_model  # notebook 20's small model, the one the checks train


def json_run(script: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    """Runs a course script with `args` and `--json-file`; returns what it wrote there."""
    with tempfile.TemporaryDirectory(prefix="ddp-lab-inside-") as folder:
        out = Path(folder) / "found.json"
        runtime.run([sys.executable, runtime.course_file(script), *args, "--json-file", str(out)], timeout=timeout)
        found: dict[str, Any] = json.loads(out.read_text())
    return found


GPU_HIDDEN = 4096  # on GPUs, hidden layers this wide: 2 x 4096^2 weights, 134 MB of gradients a step to all-reduce


def compare(world_size: int = 2, steps: int | None = None, script: str = BY_HAND) -> dict[str, Any]:
    """Runs the exercise's own program: each wrapper trains beside DistributedDataParallel on
    `world_size` processes; returns rank 0's {wrapper: {"seconds": per step, "difference": from DDP}}.
    With a GPU for each process it runs on NCCL, with a model wide enough for the all-reduces to
    take time (GPU_HIDDEN), and says so; elsewhere on gloo with the small model."""
    on_gpus = processes.gpu_count() >= world_size
    hidden = GPU_HIDDEN if on_gpus else 256
    print(f"{world_size} processes on {'GPUs, NCCL' if on_gpus else 'the CPU, gloo'}, hidden layers of {hidden}")
    return json_run(script, "--world-size", str(world_size), "--steps", str(steps or (10 if runtime.QUICK else 50)),
                    "--hidden", str(hidden))


def bucket_plan(model: Any, bucket_size_mb: float) -> list[list[str]]:
    """The names of the parameters in each of DDP's buckets for `model` (the checker's own plan)."""
    return [[name for name, _ in bucket] for bucket in reports.bucket_plan(model, bucket_size_mb)]


def no_sync(world_size: int = 2, accumulate: int = 4) -> dict[str, Any]:
    """Accumulation over `accumulate` micro-batches, with and without no_sync(): all-reduces per step and
    the weights' largest difference from one process on the big batch (demos/no_sync_accumulation.py)."""
    return json_run(NO_SYNC, "--world-size", str(world_size), "--accumulate", str(accumulate))


def sharded(world_size: int = 2, script: str = SHARDED) -> dict[str, Any]:
    """Runs the sharded optimizer's program: each rank's optimizer state (bytes) and its weights'
    difference from plain AdamW, with `world_size` processes."""
    return json_run(script, "--world-size", str(world_size))


def predicted_beside_measured(runs: dict[int, dict[str, Any]], predict: Callable[[list[int], int], Any],
                              numels: list[int]) -> list[tuple[int, int, Any, int]]:
    """The learner's zero1_bytes beside what the sharded optimizer's program weighed (`sharded`'s runs,
    by number of processes): each rank's optimizer state, predicted and measured, and the model's
    parameters. Returns (processes, rank, predicted entry, measured state bytes) for each rank."""
    found = []
    print(f"{'N':>3}{'rank':>6}{'optimizer state: predicted':>28}{'measured':>10}{'parameters: predicted':>24}"
          f"{'measured':>10}")
    for n, run in sorted(runs.items()):
        try:
            predicted = list(predict(numels, n))
        except Exception as err:  # the learner's function, not written yet or wrong: said, and the table goes on
            print(f"{n:>3}   zero1_bytes({n}): {type(err).__name__}: {err}")
            continue
        for rank in run["ranks"]:
            entry = predicted[rank["rank"]] if rank["rank"] < len(predicted) else None
            state = params = None
            if isinstance(entry, dict):
                state, params = entry.get("optimizer_state"), entry.get("parameters")
            elif isinstance(entry, (list, tuple)) and len(entry) == 3:
                params, _, state = entry
            print(f"{n:>3}{rank['rank']:>6}{state!s:>28}{rank['state_bytes']:>10}{params!s:>24}{run['param_bytes']:>10}")
            found.append((n, rank["rank"], entry, rank["state_bytes"]))
    return found


def fsdp(world_size: int = 2) -> dict[str, Any]:
    """What each rank holds under DDP and under FSDP (fully_shard), and their weights' difference."""
    return json_run(FSDP, "--world-size", str(world_size))


def parameter_count(model: Any) -> int:
    """The number of numbers in `model`'s parameters."""
    return sum(p.numel() for p in model.parameters())


def lab_parameters(widen_factor: int = 10) -> int:
    """The lab's WideResNet's parameter count, counted in a process of its own (the course's
    notebooks never import a training script)."""
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('lab', sys.argv[1]); "
            "lab = importlib.util.module_from_spec(spec); spec.loader.exec_module(lab); "
            "print(sum(p.numel() for p in lab.WideResNet(int(sys.argv[2])).parameters()))")
    text = runtime.run([sys.executable, "-c", code, runtime.course_file(LAB_MODEL), str(widen_factor)], timeout=120,
                       echo=False)
    return int(text.split()[-1])


def zero_memory(parameters: int, world_size: int, precision: str = "fp32") -> dict[str, dict[str, float]]:
    """Bytes each process holds, by stage (DDP, ZeRO-1, ZeRO-2, ZeRO-3) and kind (parameters,
    gradients, optimizer state), for a model of `parameters` numbers trained with Adam on
    `world_size` processes. Activations and temporary buffers are left out: they depend on the batch."""
    if world_size < 1 or parameters < 0:
        raise ValueError("world_size must be at least 1 and parameters not negative")
    per = PER_PARAMETER[precision]
    return {stage: {kind: parameters * size / (world_size if kind in divided else 1) for kind, size in per.items()}
            for stage, divided in SHARDED_BY_STAGE.items()}


# Debugging hangs (notebook 23) ---------------------------------------------------------------
# demos/hangs.py made to hang, then looked at from outside three ways: where each rank's Python
# stack waits (`py-spy dump`, or Python's faulthandler where py-spy is missing), what
# TORCH_DISTRIBUTED_DEBUG=DETAIL says, and the course checker's deadlock report. Every launch has
# a time limit, and its whole process group is killed after.

BUGS = ("one_rank_collective", "uneven_batches", "early_stop_rank0")
RANK_LINE = re.compile(r"rank (\d+) \(pid (\d+)\)")
PY_SPY_FRAME = re.compile(r"^\s+(\S+) \((.+):(\d+)\)")            # "    all_reduce (torch/.../c10d.py:2950)"
FAULTHANDLER_FRAME = re.compile(r'File "(.+)", line (\d+) in (\S+)')  # faulthandler's "File "x.py", line 3 in f"


class HangError(Exception):
    """The script did not behave as the demonstration needs (it finished, or never started)."""


def _py_spy() -> str | None:
    found = Path(sys.executable).parent / "py-spy"
    return str(found) if found.exists() else shutil.which("py-spy")


def _frames_py_spy(pid: int) -> list[str]:
    """The main thread's stack of `pid`, innermost first, as "function (file:line)"."""
    spy = _py_spy()
    assert spy is not None
    result = processes.run([spy, "dump", "--pid", str(pid)], timeout=30)
    if result.returncode != 0:
        raise HangError(f"py-spy could not read process {pid}: {result.last_line}")
    frames, in_main = [], False
    for line in result.stdout.splitlines():
        if line.startswith("Thread "):
            in_main = "MainThread" in line
        elif in_main and (m := PY_SPY_FRAME.match(line)):
            frames.append(f"{m[1]} ({Path(m[2]).name}:{m[3]})")
    return frames


def _frames_faulthandler(pid: int, output: list[str], collect: Callable[[], None]) -> list[str]:
    """The stack the script's faulthandler prints on SIGUSR1 (into the run's output, which
    `collect` brings in), innermost first."""
    collect()
    seen = len(output)
    os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    collect()
    frames: list[str] = []
    for line in output[seen:]:
        if "hread 0x" in line and frames:
            break  # the next thread's stack
        if m := FAULTHANDLER_FRAME.search(line):
            frames.append(f"{m[3]} ({Path(m[1]).name}:{m[2]})")
    return frames


def where_they_wait(bug: str, world_size: int = 2, settle: float = 4.0, limit: float = 90.0) -> dict[int, list[str]]:
    """Starts the demo with `bug`, waits until every rank has said its pid and nothing has been
    printed for `settle` seconds (stuck), reads each rank's stack, kills everything, and returns
    {rank: frames, innermost first}. With py-spy where it is installed, else with faulthandler."""
    command: list[str | Path] = [sys.executable, runtime.course_file(HANGS), "--world-size", str(world_size), "--bug", bug,
                                 "--timeout", "300"]
    return _stuck_stacks(command, f"hangs.py --bug {bug}", world_size, settle, limit)


def stacks_of(script: str = "exercises/hang_training.py", *args: str, world_size: int = 2, settle: float = 5.0,
              limit: float = 120.0) -> dict[int, list[str]]:
    """`python SCRIPT --world-size N --timeout 300 ARGS` (a script that prints "rank R (pid P)" on each
    rank), read as where_they_wait reads the demo: {rank: frames, innermost first} once it is stuck;
    {} (and a line that says so) when it ends by itself, as a fixed script does."""
    command: list[str | Path] = [sys.executable, runtime.course_file(script), "--world-size", str(world_size),
                                 "--timeout", "300", *args]
    try:
        return _stuck_stacks(command, Path(script).name, world_size, settle, limit)
    except HangError as error:
        print(error)
        return {}


def _stuck_stacks(command: list[str | Path], name: str, world_size: int, settle: float,
                  limit: float) -> dict[int, list[str]]:
    proc = processes.start(command, merge_stderr=True)
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline, quiet_since, ended = time.monotonic() + limit, time.monotonic(), False
    pids: dict[int, int] = {}

    def drain(wait: float) -> None:
        nonlocal quiet_since, ended
        try:
            line = lines.get(timeout=wait)
        except queue.Empty:
            return
        if line is None:
            ended = True
            return
        output.append(line)
        quiet_since = time.monotonic()
        for m in RANK_LINE.finditer(line):  # two ranks' lines can arrive as one
            pids[int(m[1])] = int(m[2])

    def collect() -> None:
        for _ in range(lines.qsize()):
            drain(0)

    try:
        while not ended and time.monotonic() < deadline:
            drain(0.2)
            if len(pids) == world_size and time.monotonic() - quiet_since >= settle:
                break
        if ended:
            raise HangError(f"{name} ended by itself: {''.join(output[-3:]).strip()}")
        if len(pids) < world_size:
            raise HangError(f"{name}: only {len(pids)} of {world_size} ranks started in {limit:.0f} s")
        how = "py-spy dump" if _py_spy() else "faulthandler (py-spy is not installed)"
        print(f"{name}: stuck for {settle:g} s; each rank's stack by {how}:")
        stacks = {}
        for rank, pid in sorted(pids.items()):
            if _py_spy():
                stacks[rank] = _frames_py_spy(pid)
            else:
                stacks[rank] = _frames_faulthandler(pid, output, collect)
        return stacks
    finally:
        processes.kill_group(proc.pid)
        proc.wait()


def waiting_line(frames: list[str], script: str = "hangs.py") -> str:
    """Where a stack waits, in a line: the innermost call (the collective), and the line of the
    script that made it."""
    mine = [f for f in frames if f"({script}:" in f]
    return f"in {frames[0]}, called from {mine[0]}" if frames and mine else (frames[0] if frames else "(no stack)")


def detail(bug: str, world_size: int = 2) -> str:
    """The same bug with TORCH_DISTRIBUTED_DEBUG=DETAIL, the gradients averaged by hand (--by-hand:
    with gloo, DETAIL crashes DistributedDataParallel's constructor in this PyTorch): the line
    that names the collectives the ranks disagree on."""
    result = processes.run([sys.executable, runtime.course_file(HANGS), "--world-size", str(world_size), "--bug", bug,
                            "--by-hand", "--timeout", "20"], timeout=90, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    found = [line for line in result.output.splitlines() if "Detected mismatch" in line]
    if not found:
        return f"(no mismatch reported; exit status {result.returncode}: {result.last_line})"
    line = found[0][found[0].index("Detected mismatch"):]
    return re.sub(r"TensorDeviceTypes=TensorOptions\(.*?\)\)", "...)", line.split(".Collectives differ")[0])


def checker_report(bug: str, world_size: int = 2) -> str:
    """The course checker's verdict on a run of the script with `bug`: it traces every
    torch.distributed call, notices that nothing moves, stops the run and names the call each
    rank waits in."""
    ws = Workspace(Path(runtime.course_file(HANGS)).resolve())
    try:
        run = ws.launched(checks_hangs.HANG_RUNS, bug, f"run with --bug {bug}", ["--world-size", str(world_size), "--bug", bug,
                                                                      "--timeout", "300"])
        return run.problem() or f"the run with --bug {bug} finished"
    finally:
        ws.close()


def timeout_message(bug: str, seconds: int = 5, world_size: int = 2) -> str:
    """The demo with `bug` and init_process_group(timeout=`seconds`): the line it ends with once a
    rank's collective gives up waiting."""
    result = processes.run([sys.executable, runtime.course_file(HANGS), "--world-size", str(world_size), "--bug", bug,
                            "--timeout", str(seconds)], timeout=seconds + 90)
    found = [line for line in result.stderr.splitlines() if line.startswith("hangs.py:")]
    return found[0] if found else f"(exit status {result.returncode}: {result.last_line})"


# Figures -------------------------------------------------------------------------------------

def against_ddp(times: dict[str, float], reference: str = "DDP") -> Figure:
    """Seconds per step of each hand-made DDP beside DistributedDataParallel's, labelled with the ratio."""
    names = list(times)
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.2))
    for k, name in enumerate(names):
        ax.barh(k, times[name] * 1000, color="grey" if name == reference else RANK_COLOURS[k % 10])
        ax.text(times[name] * 1000, k, f" {times[name] / times[reference]:.2f} x", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per step (rank 0)")
    ax.set_title(f"each against {reference}, measured in one run")
    fig.tight_layout()
    return finish(fig)


def zero_stages(memory: dict[str, dict[str, float]], title: str) -> Figure:
    """Per-process memory by ZeRO stage (zero_memory): a stacked bar of parameters,
    gradients and optimizer state for each stage, in MB or GB."""
    stages = list(memory)
    kinds = list(next(iter(memory.values())))
    largest = max(sum(m.values()) for m in memory.values())
    unit, scale = ("GB", 1024 ** 3) if largest >= 1024 ** 3 else ("MB", 1024 ** 2)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottom = [0.0] * len(stages)
    for k, kind in enumerate(kinds):
        values = [memory[s][kind] / scale for s in stages]
        ax.bar(range(len(stages)), values, bottom=bottom, color=RANK_COLOURS[k], label=kind)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, total in enumerate(bottom):
        ax.text(x, total, f"{total:.3g} {unit}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(stages)), stages)
    ax.set_ylabel(f"{unit} per process")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return finish(fig)


def state_shares(runs: dict[int, list[float]]) -> Figure:
    """Each rank's share of the unsharded optimizer state, measured, for each number of processes,
    beside the even share 1/N."""
    sizes = sorted(runs)
    fig, ax = plt.subplots(figsize=(6, 3))
    for n in sizes:
        for rank, share in enumerate(runs[n]):
            ax.scatter(n, share * 100, color=RANK_COLOURS[rank % 10], zorder=3, label=f"rank {rank}" if n == max(
                sizes, key=lambda m: len(runs[m])) else None)
    ax.plot(sizes, [100 / n for n in sizes], color="grey", linestyle="--", label="1/N")
    ax.set_xticks(sizes)
    ax.set_xlabel("processes (N)")
    ax.set_ylabel("% of the unsharded state")
    ax.set_ylim(bottom=0)
    ax.set_title("optimizer state per rank, measured")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return finish(fig)
