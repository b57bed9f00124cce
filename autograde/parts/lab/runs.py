"""The lab's four runs of a learner's fashion_mnist.py, each a `RunKind` the lab's items read:

- setup run (Steps 1-2): the script's own start-up code, stopped where real work begins;
- workers run (Steps 3-9): the workspace's layout of simulated nodes (2 x 2 by default), each
  process calling `worker`;
- program run (Step 10): `python script.py --num-gpus 2`, as a learner types it;
- two-node run (Step 10): two node commands started together.

The program and two-node runs pass only the options the script's parser knows, as the setup run
found them: they need it first. On GPUs, each run's processes get devices of their own (below).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from autograde.engine import processes
from autograde.engine.run import Run
from autograde.engine.workspace import RunKind, Workspace, task_command
from autograde.parts.lab.reports import Argv, SetupTask, WorkersTask

EPOCHS = 3  # with --target-accuracy 0 and --patience 2, a right script stops after epoch 2
REPORT = "report.json"  # what the setup and workers runs' driver writes in the run's folder (inprocess.py)


# --- Which devices each run uses ------------------------------------------------------------
# Which devices each run of the checker uses: no two ranks of one process group on one GPU.
#
# NCCL refuses two ranks of a group on the same device, and a learner's script puts local rank r
# on `cuda:r`. So each simulated node gets GPUs of its own through CUDA_VISIBLE_DEVICES (set in
# its processes before CUDA starts): node k of a p-process layout sees GPUs k*p .. k*p+p-1, and
# its `cuda:local_rank` lands on them. A run that needs more GPUs than the machine has runs on
# the CPU with gloo (CUDA_VISIBLE_DEVICES=""), as on a machine without GPUs.

# What each run starts: (commands or nodes, processes each). The workers run's layout is the check's.
FIXED = {"program": (1, 2), "two_nodes": (2, 1)}


def devices_plan(gpus: int, procs_per_node: int, nodes: int) -> dict[str, list[str] | None]:
    """For each run, the CUDA_VISIBLE_DEVICES of each node (or command) in it; None: on the CPU."""
    layouts = {"workers": (nodes, procs_per_node), **FIXED}
    result: dict[str, list[str] | None] = {}
    for run, (count, each) in layouts.items():
        if count * each > gpus or gpus < 2:  # one GPU cannot hold a group of 2: the CPU checks it
            result[run] = None
        else:
            result[run] = [",".join(str(k * each + r) for r in range(each)) for k in range(count)]
    return result


def describe(assigned: list[str] | None) -> str:
    """The devices of a run, for a verdict: 'the CPU' or 'GPUs 0,1 | 2,3' (a | between nodes)."""
    return "the CPU" if assigned is None else f"GPUs {' | '.join(assigned)}"


def plan(ws: Workspace) -> dict[str, list[str] | None]:
    """Each run's GPUs: for each node (or command) its CUDA_VISIBLE_DEVICES; None: on the CPU."""
    return devices_plan(ws.gpus, ws.procs_per_node, ws.nodes)


def on_gpu(ws: Workspace, run: str) -> bool:
    """Whether the run (workers, program, two_nodes) uses GPUs (else the CPU, with gloo)."""
    return plan(ws).get(run) is not None


def uses(ws: Workspace, run: str) -> str:
    """The devices of a run, for a verdict."""
    return describe(plan(ws).get(run))


def _read(folder: Path) -> dict[str, Any] | None:
    report = folder / REPORT
    return json.loads(report.read_text()) if report.exists() else None


def _plain(pairs: Argv) -> Argv:
    """A command line's pairs as JSON holds them (paths as strings), for a task's options."""
    return [[option, value if value is None or isinstance(value, int) else str(value)] for option, value in pairs]


def _common(data_dir: Path, epochs: int = EPOCHS, port: int | None = None) -> Argv:
    return [["--widen-factor", 1], ["--batch-size", 16], ["--epochs", epochs], ["--target-accuracy", 0],
            ["--patience", 2], ["--data-dir", data_dir], ["--master-port", port or processes.free_port()]]


def setup(ws: Workspace) -> Run:
    """The script's start-up code for node 2 of 3 with 2 processes each (world size 6)."""
    argv = [["--num-nodes", 3], ["--node-id", 2], ["--num-gpus", 2]] + _common(ws.root / "unused")
    task = SetupTask(script=str(ws.script), argv=_plain(argv))
    return ws.once(SETUP, "", "setup run", lambda folder: [task_command(task, folder)], [], gpus=[""], read=_read,
                   about="the start-up code, as node 2 of 3")


def workers(ws: Workspace) -> Run:
    """worker(local_rank, args) in every process of the workspace's simulated nodes, each with its own disk."""
    port = processes.free_port()
    nodes = [[["--num-nodes", ws.nodes], ["--node-id", k], ["--num-gpus", ws.procs_per_node]]
             + _common(ws.root / f"node{k}-disk", port=port) for k in range(ws.nodes)]
    # the driver itself never starts CUDA; each node's processes see only the node's GPUs
    task = WorkersTask(script=str(ws.script), nodes=[_plain(node) for node in nodes],
                       procs_per_node=ws.procs_per_node, node_gpus=plan(ws)["workers"] or [""] * ws.nodes)
    return ws.once(WORKERS, "", "workers run", lambda folder: [task_command(task, folder)], [], gpus=[""], read=_read,
                   about=f"worker() in {ws.world_size} processes ({ws.nodes} simulated nodes x {ws.procs_per_node})")


def options(ws: Workspace) -> frozenset[str]:
    """The command-line options the script's parser knows, as the setup run saw them."""
    return frozenset((setup(ws).report or {}).get("options", []))


_OPTIONS: dict[str, frozenset[str]] = {}


def script_options(script: Path) -> frozenset[str]:
    """The command-line options the script's parser accepts ("--master-port", ...), as its own
    parser reports them in a setup run (one short launch per version of the file, then kept in
    this process): what to pass is decided by what the script does, never by reading its text."""
    path = Path(script).resolve()
    key = f"{path}:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    if key not in _OPTIONS:
        with Workspace(path) as ws:
            _OPTIONS[key] = options(ws)
    return _OPTIONS[key]


def _argv(ws: Workspace, pairs: Argv) -> list[str]:
    """`pairs` as a command line, without the options the script does not know (from the setup run)."""
    known = options(ws)
    argv: list[str] = []
    for option, value in pairs:
        if option in known:
            argv += [option] if value is None else [option, str(value)]
    return argv


def program(ws: Workspace) -> Run:
    """`python script.py --num-gpus 2 ...`: the script launching its own processes."""
    sync_bn: Argv = [["--sync-bn", None]] if on_gpu(ws, "program") else []  # the Optional step's check reads this run
    argv = _argv(ws, [["--num-gpus", 2]] + sync_bn + _common(ws.root / "program" / "data", epochs=1))
    return ws.once(PROGRAM, "", "program run", lambda folder: [[processes.PYTHON, str(ws.script), *argv]], argv,
                   gpus=plan(ws)["program"] or [""])


def two_nodes(ws: Workspace) -> Run:
    """Two node commands (--num-nodes 2 --node-id 0|1 --num-gpus 1) started together on this machine."""
    port = processes.free_port()
    commands = []
    for k in (0, 1):  # each node with a disk of its own
        layout: Argv = [["--num-nodes", 2], ["--node-id", k], ["--num-gpus", 1]]
        argv = _argv(ws, layout + _common(ws.root / "two_nodes" / f"node{k}-disk", epochs=1, port=port))
        commands.append([processes.PYTHON, str(ws.script), *argv])
    # on GPUs each "node" gets a GPU of its own: NCCL refuses two ranks on one device
    return ws.once(TWO_NODES, "", "two-node run", lambda folder: commands, commands[0][2:],
                   gpus=plan(ws)["two_nodes"] or ["", ""])


SETUP = RunKind("setup", make=setup)
WORKERS = RunKind("workers", make=workers)
PROGRAM = RunKind("program", make=program, needs=(SETUP,))
TWO_NODES = RunKind("two_nodes", make=two_nodes, needs=(SETUP,))

