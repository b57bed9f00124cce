"""What the notebooks of the part "launching for real" (launching, notebooks 14-16) call: torchrun,
a node that never comes, two jobs on one port, the debugging variables, a group killed and
restarted (notebook 16's SLURM: launching_slurm.py). Every launch goes through runtime.run or
processes.run: a time limit, the output in the cell, and nothing left running afterwards. And the
part's figure: a fault-tolerant run's restarts as a timeline (15)."""
from __future__ import annotations

import difflib
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from autograde import data
from autograde.engine import processes
from autograde.engine.run import Run
from autograde.engine.workspace import Workspace
from autograde.grading import api
from autograde.jupyter import runtime
from autograde.jupyter.figures import finish
from autograde.parts.launching import checks

TORCHRUN, torchrun, course_file = runtime.TORCHRUN, runtime.torchrun, runtime.course_file  # what notebooks 14-16 call


# Quick mode's demos show how a launcher starts and connects the processes, not how well they train: a
# stand-in of 256 training and 64 validation images (8 steps an epoch for 1 process at a batch of 32)
QUICK_DEMO_DATA = (256, 64)


def quick_args(epochs: int = 2) -> list[str]:
    """The lab script's options for a small run on this machine (a tiny stand-in in quick mode)."""
    if not runtime.QUICK:
        return runtime.training_args()
    return runtime.training_args(epochs=epochs, target_accuracy=0,
                                 data_dir=data.temp_stand_in("ddp-lab-launch-quick-data", *QUICK_DEMO_DATA))


SHOW_ENV = ("import os; names = 'RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT "
            "TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS OMP_NUM_THREADS'.split(); "
            "print(' | '.join(f'{n}={os.environ.get(n)}' for n in names), flush=True)")


def environment(nproc: int = 2) -> list[dict[str, str]]:
    """What torchrun puts in each process's environment: runs a one-line program under it."""
    text = runtime.run([*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "--no-python",
                        processes.PYTHON, "-c", SHOW_ENV], timeout=120, echo=False)
    rows = [dict(item.split("=", 1) for item in line.strip().split(" | "))
            for line in text.splitlines() if line.startswith("RANK=")]
    rows.sort(key=lambda r: int(r["RANK"]))
    names = list(rows[0]) if rows else []
    print("  ".join(f"{n:>{max(len(n), 9)}}" for n in names))
    for row in rows:
        print("  ".join(f"{row[n]:>{max(len(n), 9)}}" for n in names))
    return rows


def side_by_side(before: str = "solutions/fashion_mnist_after_step_10.py",
                 after: str = "exercises/fashion_mnist_torchrun.py") -> object:
    """The lines that differ between two scripts, side by side (an HTML table in the notebook)."""
    old, new = (course_file(p).read_text().splitlines() for p in (before, after))
    table = difflib.HtmlDiff(wrapcolumn=72).make_table(old, new, Path(before).name, Path(after).name,
                                                       context=True, numlines=1)
    style = ("<style>table.diff{font-family:monospace;font-size:11px} .diff_add{background:#d4f7d4}"
             ".diff_chg{background:#fff3b0} .diff_sub{background:#f7d4d4}</style>")
    try:
        from IPython.display import HTML
        return HTML(style + table)
    except ImportError:  # outside IPython: a unified diff in text
        return "\n".join(difflib.unified_diff(old, new, before, after, lineterm="", n=0))


def two_nodes(script: str, *args: str | int, timeout: float = 180) -> list[str]:
    """The same torchrun command on two "nodes" (here: two commands on this machine, started
    together), each with its own --node-rank; the output of each."""
    port = processes.free_port()
    results: list[processes.Result | None] = [None, None]

    def node(k: int) -> None:
        command = [*TORCHRUN, "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1",
                   "--rdzv-endpoint", f"localhost:{port}", course_file(script), *map(str, args)]
        results[k] = processes.run(command, timeout=timeout)

    for k in (0, 1):
        print(f"node {k}$ torchrun --nnodes 2 --node-rank {k} --nproc-per-node 1 --rdzv-endpoint localhost:{port} "
              f"{script} ...")
    threads = [threading.Thread(target=node, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    texts = []
    for k, result in enumerate(results):
        assert result is not None
        shown = [line for line in result.stdout.splitlines() if not line.startswith(("W", "I", "["))]
        print(f"--- node {k}: exit status {result.returncode}, {result.seconds:.0f} s")
        print("\n".join(shown[-6:]))
        if result.returncode != 0 or result.timed_out:
            raise runtime.LaunchError(f"node {k} failed (exit status {result.returncode}): {result.last_line}")
        texts.append(result.stdout)
    return texts


JOIN = """\
import datetime, os, sys
import torch.distributed as dist

timeout = datetime.timedelta(seconds=float(sys.argv[1]))
try:  # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment, as under torchrun
    dist.init_process_group("gloo", timeout=timeout)
except dist.DistError as err:  # one line, not a traceback
    sys.exit(f"error: rank {os.environ['RANK']} could not join the group ({str(err).strip().splitlines()[0]})")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} joined", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def join_program() -> Path:
    """A program that only joins a process group, with a time limit (JOIN), written to a temporary file."""
    path = Path(tempfile.mkdtemp(prefix="ddp-lab-join-")) / "join.py"
    path.write_text(JOIN)
    return path


def as_rank(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment torchrun would give one process, for starting it by hand."""
    return {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "localhost", "MASTER_PORT": str(port)}


def lonely_node(timeout: float = 10) -> str:
    """Rank 0 of a group of 2, started alone (its partner's node never comes), giving up after
    `timeout` seconds: what it says, and after how long."""
    result = processes.run([processes.PYTHON, join_program(), str(timeout)], timeout=timeout + 60,
                        env=as_rank(0, 2, processes.free_port()))
    line = result.last_line
    print(f"rank 0 alone, timeout {timeout:g} s: exit status {result.returncode} after {result.seconds:.0f} s\n{line}")
    return line


def same_port() -> str:
    """Two jobs given one MASTER_PORT: the second's rank 0 cannot listen there. What it says."""
    port, program = processes.free_port(), join_program()
    first = processes.start([processes.PYTHON, program, "60"], env=as_rank(0, 2, port))
    try:
        deadline = time.monotonic() + 60
        while not listening(port) and time.monotonic() < deadline:  # the first job's rank 0 holds the port
            time.sleep(0.2)
        second = processes.run([processes.PYTHON, program, "20"], timeout=80, env=as_rank(0, 2, port))
    finally:
        processes.finish(first, 0.1)
    line = second.last_line
    print(f"a second job on port {port}: exit status {second.returncode} after {second.seconds:.0f} s\n{line}")
    return line


def listening(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("localhost", port)) == 0


MISMATCH = """\
import datetime, os, torch, torch.distributed as dist
gpu = torch.cuda.device_count() >= 2
if gpu:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=10))
# a bug: rank 0 sends 3 numbers, rank 1 sends 4
t = torch.ones(3 if dist.get_rank() == 0 else 4, device="cuda" if gpu else "cpu")
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: {t}")
dist.destroy_process_group()
"""


def debug_variables() -> dict[str, str]:
    """The same mistake (ranks that disagree on a tensor's size) run as is, with
    TORCH_DISTRIBUTED_DEBUG=DETAIL and, on a machine with 2 GPUs, with NCCL_DEBUG=INFO (NCCL
    says nothing where gloo does the talking). What each run's last error line says."""
    cases = [("no variable", {}), ("TORCH_DISTRIBUTED_DEBUG=DETAIL", {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})]
    if processes.gpu_count() >= 2:
        cases.append(("NCCL_DEBUG=INFO", {"NCCL_DEBUG": "INFO"}))
    else:
        print("--- NCCL_DEBUG=INFO: n/a here, no GPUs: without NCCL it prints nothing")
    said = {}
    with tempfile.TemporaryDirectory() as folder:
        program = Path(folder, "mismatch.py")
        program.write_text(MISMATCH)
        for name, env in cases:
            result = processes.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", program], timeout=90, env=env)
            errors = [line for line in result.output.splitlines() if "Error" in line and "rank" in line.lower()]
            nccl = [line for line in result.output.splitlines() if "NCCL INFO" in line]
            said[name] = _tidy(errors[-1] if errors else result.last_line)
            print(f"--- {name}: exit status {result.returncode} after {result.seconds:.0f} s\n{said[name][:600]}")
            if nccl:
                print(f"({len(nccl)} lines of NCCL INFO, the first ones:)\n" + "\n".join(nccl[:8]))
    return said


def _tidy(line: str) -> str:
    return re.sub(r"^\[rank\d\]:\s*", "", line.strip())


def fault_runs(script: str = "exercises/resume_training.py") -> tuple[Run, Run, Run]:
    """The check's three runs of a fault-tolerant script: undisturbed, a worker killed in epoch 2,
    rank 0 killed during its second save. Those of the last check of this exact file when they
    were recorded (autograde/grading/cache.py), else made now as the check makes them (a minute)."""
    path = course_file(script)
    keys = ("checkpoint/whole", "restart/killed", "restart/torn")
    recorded = api.recorded_runs(path)
    if recorded is not None and set(keys) <= set(recorded.made()):
        runs = recorded.made()
        recorded.close()
        print("(the runs of the last check of this file)")
        return runs[keys[0]], runs[keys[1]], runs[keys[2]]
    with Workspace(path, say=print) as ws:
        whole, _, _, per_epoch = checks.undisturbed(ws)
        killed, torn = checks.killed_run(ws, per_epoch), checks.torn_run(ws)
    return whole, killed, torn


def timeline(run: Run) -> list[dict[str, object]]:
    """A run's processes for restart_timeline: each life's training, its checkpoints and loads."""
    events = [e for t in run.traces.values() for e in t.events]
    if not events:
        return []
    zero = min(e["t"] for e in events)
    checkpoint = checks.checkpoint_path(run)
    done = {w.done for w in checks.writes(run, checkpoint)}
    processes = []
    for trace in run.traces.values():
        if trace.rank is None or not trace.events:
            continue
        times = [e["t"] - zero for e in trace.events]
        killed = [e["t"] - zero for e in trace.named("killed")]
        processes.append({"life": checks.life_of(trace) or 0, "rank": trace.rank, "start": times[0], "end": times[-1],
                          "saves": [e["t"] - zero for e in trace.events if e["t"] in done],
                          "loads": [e["t"] - zero for e in trace.named("load_exit") if e.get("path") == checkpoint],
                          "killed": killed[0] if killed else None})
    return processes


# Figures -------------------------------------------------------------------------------------

def restart_timeline(runs: dict[str, list[dict[str, Any]]]) -> Figure:
    """Each run of a fault-tolerant script as a timeline, one row per process and life: when it
    trained, when rank 0's checkpoints were complete, where a process was killed and where the
    restarted processes loaded the checkpoint.

    `runs`: title -> processes, each {"life", "rank", "start", "end", "saves", "loads", "killed"}
    (seconds since the run began; "killed" is None or a time)."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.2 + 1.05 * sum(len(p) for p in runs.values()) / 2),
                             squeeze=False, sharex=True)
    colours = plt.get_cmap("tab10")
    for ax, (title, started) in zip(axes[:, 0], runs.items()):
        rows = sorted(started, key=lambda p: (p["life"], p["rank"]))
        for y, p in enumerate(rows):
            ax.barh(y, p["end"] - p["start"], left=p["start"], height=0.5, color=colours(p["life"]), alpha=0.6)
            for t in p["saves"]:
                ax.plot([t, t], [y - 0.35, y + 0.35], color="black", linewidth=2)
            for t in p["loads"]:
                ax.plot(t, y, marker="o", color="tab:blue", markersize=7)
            if p["killed"] is not None:
                ax.plot(p["killed"], y, marker="X", color="red", markersize=12)
        ax.set_yticks(range(len(rows)), [f"life {p['life']}, rank {p['rank']}" for p in rows])
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("seconds since the start")
    handles = [Patch(color=colours(0), alpha=0.6, label="training (first life)"),
               Patch(color=colours(1), alpha=0.6, label="after a restart"),
               plt.Line2D([], [], color="black", linewidth=2, label="checkpoint complete"),
               plt.Line2D([], [], color="tab:blue", marker="o", linestyle="", label="checkpoint loaded"),
               plt.Line2D([], [], color="red", marker="X", linestyle="", markersize=10, label="killed (SIGKILL)")]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return finish(fig)
