"""The lab's checks, one function per step (`check_4` is Step 4's; autograde/grading/registry.py lists
them with their points and runs). Each reads the runs of autograde/engine/workspace.py (made once
per script, shared by every step that needs them) and says what it observed.

Checks look at behaviour, not at names: any correct script passes, whatever its
variables and helpers are called. Only Step 0 reads the source.
"""
from __future__ import annotations

import ast
from typing import Callable

from autograde.engine.run import Run
from autograde.engine.verdicts import Failed, require, run_ok
from autograde.engine.workspace import Workspace
from autograde.parts.lab import runs
from autograde.parts.lab.reports import Child, Setup, Workers
from autograde.protocol import ProcessTrace, decode

# Step 0 -------------------------------------------------------------------------------


def check_0(ws: Workspace) -> str:
    """The script imports torch.distributed (read from its source: nothing else can tell)."""
    try:
        tree = ast.parse(ws.script.read_text(), filename=str(ws.script))
    except SyntaxError as err:
        raise Failed(f"the script does not parse: {err.msg} (line {err.lineno})", "fix the syntax error first", todo=False)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "torch.distributed" for a in node.names):
            return "imports torch.distributed"
        if isinstance(node, ast.ImportFrom) and (node.module == "torch.distributed" or (
                node.module == "torch" and any(a.name == "distributed" for a in node.names))):
            return "imports torch.distributed"
    raise Failed("the script does not import torch.distributed", "import torch.distributed as dist")


# Steps 1-2: the setup run -------------------------------------------------------------


def _setup(ws: Workspace) -> Setup:
    report = runs.setup(ws).report
    if report is None:
        raise Failed(runs.setup(ws).problem() or "the setup run wrote no report", "run the script by hand to see why", todo=False)
    return Setup(**report)


def check_1(ws: Workspace) -> str:
    """The command line takes integer --num-nodes, --node-id and --num-gpus, defaults 1, 0 and 1."""
    report = _setup(ws)
    missing = [o for o in ("--num-nodes", "--node-id", "--num-gpus") if o not in report.options]
    require(not missing, f"the script has no {', '.join(missing)} option",
            "add the arguments with parser.add_argument(..., type=int)")
    require(report.stop, report.error or "", "the script must accept these options")
    expected = {"--num-nodes": (3, 1), "--node-id": (2, 0), "--num-gpus": (2, 1)}
    for option, (given, default) in expected.items():
        dest = report.dests[option]
        value = report.values.get(dest)
        require(report.types.get(dest) == "int" and value == given,
                f"{option} {given} gave args.{dest} = {value!r} ({report.types.get(dest)})",
                f"{option} needs type=int")
        got = (report.defaults or {}).get(dest)
        require(got == default, f"{option} defaults to {got!r}", f"{option} should default to {default}")
    return "--num-nodes, --node-id, --num-gpus are integers with defaults 1, 0, 1"


def check_2(ws: Workspace) -> str:
    """With --num-nodes 3 --num-gpus 2 the world size is 6, and MASTER_ADDR and MASTER_PORT
    are set before any process group starts."""
    report = _setup(ws)
    require(report.stop, report.error or "the set-up code did not get to the training",
            "the script should get as far as starting the training")
    env = report.env
    crashed = f" ({report.spawned_error})" if report.spawned_error else ""  # it may have set them later
    require(env.get("MASTER_ADDR"), f"MASTER_ADDR is not set when the first process group starts{crashed}",
            'set os.environ["MASTER_ADDR"] (node 0\'s address, e.g. "localhost")')
    require((env.get("MASTER_PORT") or "").isdigit(), f"MASTER_PORT is {env.get('MASTER_PORT')!r}",
            'set os.environ["MASTER_PORT"] to a free port, as a string')
    port_dest = report.dests.get("--master-port")
    if port_dest:
        require(str(report.values.get(port_dest)) == env["MASTER_PORT"],
                f"MASTER_PORT is {env['MASTER_PORT']} but --master-port was {report.values.get(port_dest)}", "set MASTER_PORT from --master-port")
    world = _world_size_six(report)
    require(world, "no world size of 6 found for --num-nodes 3 --num-gpus 2: not in args, not in a module-level "
            "variable, not in WORLD_SIZE, not among mp.spawn's arguments, nor given to init_process_group",
            "compute args.world_size = args.num_nodes * args.num_gpus")
    return (f"world size {world[0]} = 6 for 3 nodes x 2; MASTER_ADDR={env['MASTER_ADDR']} "
            f"MASTER_PORT={env['MASTER_PORT']}")


def _world_size_six(report: Setup) -> list[str]:
    """Every place the set-up run kept a world size of 6: wherever a script keeps it is fine."""
    found = [f"args.{k}" for k, v in report.values.items() if v == 6 and report.types.get(k) == "int"]
    found += [name for name, v in report.module_ints.items() if v == 6]
    if (report.env.get("WORLD_SIZE") or "") == "6":
        found.append("WORLD_SIZE")
    if (report.init or {}).get("world_size") == 6:
        found.append("init_process_group's world_size")
    if 6 in (report.spawn or {}).get("ints", []):
        found.append("an argument of mp.spawn")
    return found


# Steps 3-9: the workers run -------------------------------------------------------------


def _children(ws: Workspace) -> list[Child]:
    if runs.workers(ws).report is None:
        raise Failed(runs.workers(ws).problem() or "the workers run wrote no report", "see the error above", step="3")
    report = decode(Workers, runs.workers(ws).report or {})
    if report.error:
        raise Failed(report.error, "define worker(local_rank, args) and call it from main()", step="3")
    return report.children


def _by_child(ws: Workspace) -> list[tuple[Child, ProcessTrace]]:
    """(node, local rank, pid) of every worker process, with its trace."""
    return [(c, runs.workers(ws).traces.get(c.pid, ProcessTrace(c.pid))) for c in _children(ws)]


def check_3(ws: Workspace) -> str:
    """The training runs inside the function each process is given (worker(local_rank, args),
    or whatever the script's own mp.spawn names): called in each process, it trains. A pass rests
    on what each process did: one whose function crashed before any work (a data set, a loader, a
    torch.distributed call) fails here, one that returned without an optimizer step too."""
    children = _by_child(ws)
    names = set()
    for child, trace in children:
        started = trace.named("worker_start")
        require(started, runs.workers(ws).problem() or "worker did not start",
                "define worker(local_rank, args)")
        name = f"{started[0].get('fn', 'worker')}(local_rank, ...)"
        names.add(name)
        crash = trace.named("crash")
        work = [e for e in trace.events if e["ev"] not in ("worker_start", "print", "crash")]
        require(not (crash and not work), f"{name} crashed before it did anything, in the process of node "
                f"{child.node}, local rank {child.local_rank}: {crash[0]['error'] if crash else ''}",
                f"{name} must run the training in each process: the error names the line where it stopped")
        finished = trace.named("worker_done")
        require(not finished or finished[0]["optimizer_steps"] > 0,
                f"{name} returned without training", f"move the training into {name}")
    return f"{' / '.join(sorted(names)) or 'worker'} runs the training in each of {len(children)} processes"


def check_4(ws: Workspace) -> str:
    """Every process calls init_process_group once, with rank node_id * num_gpus + local_rank,
    the world size, and the backend for its device (gloo on the CPU, nccl on GPUs)."""
    backend = "nccl" if runs.on_gpu(ws, "workers") else "gloo"
    for child, trace in _by_child(ws):
        inits = trace.calls("init_process_group")
        who = f"the process of node {child.node}, local rank {child.local_rank}"
        require(len(inits) == 1, f"{who} called init_process_group {len(inits)} times",
                "call dist.init_process_group once, at the start of worker")
        expected = child.node * ws.procs_per_node + child.local_rank
        joined = trace.joined()
        rank = joined["rank_joined"] if joined else inits[0].get("rank")
        require(rank == expected, f"{who} joined as rank {rank}; expected {expected}",
                "global rank = args.node_id * args.num_gpus + local_rank")
        world = joined["world_size"] if joined else inits[0].get("world_size")
        require(world == ws.world_size, f"{who} joined a world of {world}; expected {ws.world_size}",
                "pass world_size=args.world_size")
        used = (joined["backend"] if joined else inits[0].get("backend") or "").lower()
        require(backend in used, f"{who} used backend {used!r} on {runs.uses(ws, 'workers')}",
                'backend "nccl" on GPUs, "gloo" on the CPU')
    _run_ok_until(runs.workers(ws), "init_process_group")
    gpu = _gpu_note(ws, _pinned_before_group)
    return (f"{ws.world_size} processes joined as ranks 0-{ws.world_size - 1} of {ws.world_size} with {backend}, "
            f"on {runs.uses(ws, 'workers')}{gpu}")


def _gpu_run(ws: Workspace) -> str | None:
    """The run that shows the GPU-only parts of Steps 4 and 7 (nccl, set_device before the group,
    the model on cuda:local_rank): the workers run when it has GPUs enough, else the program run
    (2 processes), else none: on the CPU they cannot show."""
    return next((run for run in ("workers", "program") if runs.on_gpu(ws, run)), None)


def _gpu_processes(ws: Workspace, run_name: str) -> list[tuple[int, int, ProcessTrace]] | None:
    """(global rank, local rank, trace) of every process of a GPU run; None when the program run
    cannot show it yet (the script does not start its processes before Step 10)."""
    if run_name == "workers":
        return [(r, r % ws.procs_per_node, t) for r, t in sorted(runs.workers(ws).ranks().items())]
    run = runs.program(ws)
    if not any(t.named("spawn") for t in run.traces.values()) or len(run.ranks()) != 2:
        return None
    return [(r, r, t) for r, t in sorted(run.ranks().items())]  # one node: local rank = global rank


def _gpu_note(ws: Workspace, check: Callable[[int, int, ProcessTrace], None]) -> str:
    """Check the GPU-only part of a step in the run that can show it; say which run and devices."""
    run_name = _gpu_run(ws)
    if run_name is None:
        return ""
    processes = _gpu_processes(ws, run_name)
    if processes is None:
        return f"; its GPU part is checked once Step 10 is done (the program run, on {runs.uses(ws, run_name)})"
    for rank, local_rank, trace in processes:
        check(rank, local_rank, trace)
    return f"; on GPUs: checked in the {run_name} run, on {runs.uses(ws, run_name)}"


def _pinned_before_group(rank: int, local_rank: int, trace: ProcessTrace) -> None:
    """Step 4 on GPUs: nccl, and torch.cuda.set_device(local_rank) before init_process_group."""
    init = next((i for i, e in enumerate(trace.events) if e["ev"] == "enter" and e.get("call") == "init_process_group"), None)
    pinned = [e for e in trace.events[:init] if e["ev"] == "set_device"] if init is not None else []
    require(pinned and pinned[-1]["device"] in (str(local_rank), f"cuda:{local_rank}"),
            f"rank {rank} did not call torch.cuda.set_device({local_rank}) before init_process_group"
            + (f" (it set {pinned[-1]['device']})" if pinned else ""),
            "on a GPU, torch.cuda.set_device(local_rank) before dist.init_process_group")
    joined = trace.joined() or {}
    require("nccl" in str(joined.get("backend", "")).lower(), f"rank {rank} used backend {joined.get('backend')!r} "
            "on GPUs", 'backend "nccl" on GPUs')


def _model_on_own_gpu(rank: int, local_rank: int, trace: ProcessTrace) -> None:
    """Step 7 on GPUs: the model on cuda:local_rank when wrapped, with device_ids=[local_rank]."""
    wraps = trace.named("ddp")
    require(wraps and wraps[0]["parameter_device"] == f"cuda:{local_rank}",
            f"rank {rank}'s model was on {wraps[0]['parameter_device'] if wraps else 'no device'} when wrapped; "
            f"expected cuda:{local_rank}", "model.to(torch.device('cuda', local_rank)) before wrapping it")
    require(wraps[0]["device_ids"] == [local_rank], f"rank {rank} gave device_ids={wraps[0]['device_ids']}",
            "device_ids=[local_rank]")


def _run_ok_until(run: Run, call: str) -> None:
    """Fail if some process deadlocked or crashed inside `call`."""
    for trace in run.traces.values():
        waiting = trace.waiting_in()
        if waiting and waiting.get("call") == call and not run.ok:
            raise Failed(run.problem() or "", f"every process must get through {call}")


# Step 10: the program runs ----------------------------------------------------------------


def check_10(ws: Workspace) -> str:
    """`python script.py --num-gpus 2` starts 2 processes with mp.spawn under
    `if __name__ == "__main__"` and exits 0; two node commands started together train one model."""
    run = runs.program(ws)
    spawns = [e for t in run.traces.values() for e in t.named("spawn")]
    require(spawns, run.problem() or "the script started no processes with mp.spawn",
            "mp.spawn(worker, args=(args,), nprocs=args.num_gpus)")
    require(all(e["caller_module"] == "__main__" for e in spawns),
            "mp.spawn ran again inside the started processes (they re-import the script)",
            'launch only under if __name__ == "__main__":')
    require(len(spawns) == 1 and spawns[0]["nprocs"] == 2, f"mp.spawn was called with nprocs={spawns[0]['nprocs']} "
            f"for --num-gpus 2" if len(spawns) == 1 else f"mp.spawn was called {len(spawns)} times",
            "nprocs=args.num_gpus, once, from the main process")
    run_ok(run, "the script must finish with exit status 0")
    require(len(run.ranks()) == 2, f"{len(run.ranks())} processes joined the group", "nprocs=args.num_gpus")
    nodes = runs.two_nodes(ws)
    run_ok(nodes, "both node commands must finish with exit status 0")
    fingerprints = {e["sha1"] for t in nodes.traces.values() for e in t.named("parameters")}
    require(sorted(nodes.ranks()) == [0, 1] and len(fingerprints) == 1,
            f"the two nodes ran ranks {sorted(nodes.ranks())} with {len(fingerprints)} different models",
            "both nodes must join one group of 2")
    return "mp.spawn starts 2 processes and the script exits 0; 2 node commands trained one model"
