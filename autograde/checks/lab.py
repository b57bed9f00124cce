"""The lab's checks, one function per step (`check_4` is Step 4's; autograde/registry.py lists
them with their points and runs). Each reads the runs of autograde/checker/runs.py (made once
per script, shared by every step that needs them) and says what it observed.

Checks look at behaviour, not at names: any correct script passes, whatever its
variables and helpers are called. Only Step 0 reads the source.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable

from autograde.checker import output
from autograde.protocol import Child, Event, ProcessTrace, Setup, Workers, where
from autograde.checker.runs import Run, Workspace
from autograde.checker.verdicts import Failed, evidence, require, run_ok


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
    report = ws.setup.report
    if report is None:
        raise Failed(ws.setup.problem() or "the setup run wrote no report", "run the script by hand to see why", todo=False)
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
    if ws.workers.report is None:
        raise Failed(ws.workers.problem() or "the workers run wrote no report", "see the error above", step="3")
    report = Workers.from_json(ws.workers.report)
    if report.error:
        raise Failed(report.error, "define worker(local_rank, args) and call it from main()", step="3")
    return report.children


def _by_child(ws: Workspace) -> list[tuple[Child, ProcessTrace]]:
    """(node, local rank, pid) of every worker process, with its trace."""
    return [(c, ws.workers.traces.get(c.pid, ProcessTrace(c.pid))) for c in _children(ws)]


def check_3(ws: Workspace) -> str:
    """The training runs inside the function each process is given (worker(local_rank, args),
    or whatever the script's own mp.spawn names): called in each process, it trains. A pass rests
    on what each process did: one whose function crashed before any work (a data set, a loader, a
    torch.distributed call) fails here, one that returned without an optimizer step too."""
    children = _by_child(ws)
    names = set()
    for child, trace in children:
        started = trace.named("worker_start")
        require(started, ws.workers.problem() or "worker did not start",
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
    backend = "nccl" if ws.on_gpu("workers") else "gloo"
    for child, trace in _by_child(ws):
        inits = trace.calls("init_process_group")
        who = f"the process of node {child.node}, local rank {child.local_rank}"
        require(len(inits) == 1, f"{who} called init_process_group {len(inits)} times",
                "call dist.init_process_group once, at the start of worker")
        expected = child.node * ws.procs_per_node + child.local_rank
        joined = [e for e in trace.events if e["ev"] == "exit" and e.get("call") == "init_process_group"]
        rank = joined[0]["rank_joined"] if joined else inits[0].get("rank")
        require(rank == expected, f"{who} joined as rank {rank}; expected {expected}",
                "global rank = args.node_id * args.num_gpus + local_rank")
        world = joined[0]["world_size"] if joined else inits[0].get("world_size")
        require(world == ws.world_size, f"{who} joined a world of {world}; expected {ws.world_size}",
                "pass world_size=args.world_size")
        used = (joined[0]["backend"] if joined else inits[0].get("backend") or "").lower()
        require(backend in used, f"{who} used backend {used!r} on {ws.uses('workers')}",
                'backend "nccl" on GPUs, "gloo" on the CPU')
    _run_ok_until(ws.workers, "init_process_group")
    gpu = _gpu_note(ws, _pinned_before_group)
    return (f"{ws.world_size} processes joined as ranks 0-{ws.world_size - 1} of {ws.world_size} with {backend}, "
            f"on {ws.uses('workers')}{gpu}")


def _gpu_run(ws: Workspace) -> str | None:
    """The run that shows the GPU-only parts of Steps 4 and 7 (nccl, set_device before the group,
    the model on cuda:local_rank): the workers run when it has GPUs enough, else the program run
    (2 processes), else none: on the CPU they cannot show."""
    return next((run for run in ("workers", "program") if ws.on_gpu(run)), None)


def _gpu_processes(ws: Workspace, run_name: str) -> list[tuple[int, int, ProcessTrace]] | None:
    """(global rank, local rank, trace) of every process of a GPU run; None when the program run
    cannot show it yet (the script does not start its processes before Step 10)."""
    if run_name == "workers":
        return [(r, r % ws.procs_per_node, t) for r, t in sorted(ws.workers.ranks().items())]
    run = ws.program
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
        return f"; its GPU part is checked once Step 10 is done (the program run, on {ws.uses(run_name)})"
    for rank, local_rank, trace in processes:
        check(rank, local_rank, trace)
    return f"; on GPUs: checked in the {run_name} run, on {ws.uses(run_name)}"


def _pinned_before_group(rank: int, local_rank: int, trace: ProcessTrace) -> None:
    """Step 4 on GPUs: nccl, and torch.cuda.set_device(local_rank) before init_process_group."""
    init = next((i for i, e in enumerate(trace.events) if e["ev"] == "enter" and e.get("call") == "init_process_group"), None)
    pinned = [e for e in trace.events[:init] if e["ev"] == "set_device"] if init is not None else []
    require(pinned and pinned[-1]["device"] in (str(local_rank), f"cuda:{local_rank}"),
            f"rank {rank} did not call torch.cuda.set_device({local_rank}) before init_process_group"
            + (f" (it set {pinned[-1]['device']})" if pinned else ""),
            "on a GPU, torch.cuda.set_device(local_rank) before dist.init_process_group")
    joined = next((e for e in trace.events if e["ev"] == "exit" and e.get("call") == "init_process_group"), {})
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


def check_5(ws: Workspace) -> str:
    """On each node one process downloads; the others build their data sets only after a
    barrier that the downloader reaches once its download is done. What anyone builds after
    that (the downloader may build its sets again, without download) reads complete files."""
    by_node: dict[int, list[tuple[Child, ProcessTrace]]] = {}
    for child, trace in _by_child(ws):
        by_node.setdefault(child.node, []).append((child, trace))
    setups = Workers.from_json(ws.workers.report or {}).setups
    before = 0
    for node, members in sorted(by_node.items()):
        for child, trace in members:
            errors = trace.named("dataset_error")
            require(not errors, f"node {node}, local rank {child.local_rank} read the data set before it was "
                    f"there ({errors[0]['error'] if errors else ''})",
                    "after the download, dist.barrier() on every process; read the files only after it")
        main = ws.workers.traces.get(setups[node].pid or -1) if node < len(setups) else None
        if main is not None and any(end is not None for _, end in _downloads(main)):
            before += 1  # the node's main code downloaded before it started the processes: they all read after
            continue
        downloaders = [(c, t) for c, t in members if _downloads(t)]
        require(len(downloaders) == 1, f"{len(downloaders)} processes of node {node} asked to download",
                "only local rank 0 downloads (download=True); the others read with download=False")
        _, loader_trace = downloaders[0]
        done = [end for _, end in _downloads(loader_trace)]
        require(all(t is not None for t in done), ws.workers.problem() or f"node {node}'s download never finished",
                "see the error")
        downloaded = max(t for t in done if t is not None)
        barriers = [e for e in loader_trace.calls("barrier") if e["t"] >= downloaded]
        require(barriers, f"node {node}'s downloader reaches no barrier after its download",
                "call dist.barrier() after the download, on every process")
        for child, trace in members:
            if trace is loader_trace:
                continue
            starts = [e["t"] for e in trace.named("dataset_enter")]
            require(starts and min(starts) >= barriers[0]["t"],
                    f"node {node}, local rank {child.local_rank} built its data set before the barrier",
                    "the other processes read the files only after dist.barrier()")
    if before == len(by_node):
        return f"one download per node ({len(by_node)} nodes), before the node's processes started"
    return f"one download per node ({len(by_node)} nodes); the others waited at a barrier"


def _downloads(trace: ProcessTrace) -> list[tuple[float, float | None]]:
    """When each data set that this process built with download=True began, and when it was built
    (None: never)."""
    found: list[tuple[float, float | None]] = []
    building = None
    for e in trace.events:
        if e["ev"] == "dataset_enter":
            building = e if e.get("download") else None
            if building is not None:
                found.append((e["t"], None))
        elif e["ev"] == "dataset_exit" and building is not None:
            found[-1] = (building["t"], e["t"])
            building = None
    return found


def _training_set(trace: ProcessTrace, loader: Event) -> bool | None:
    """Whether a loader reads the training set (True), the validation set (False) or neither (None):
    as its event says, or in older recordings, from the last data set of that id made before it."""
    if "train" in loader:
        return None if loader["train"] is None else bool(loader["train"])
    kind = None
    for e in trace.named("dataset_exit"):
        if e["t"] <= loader["t"] and e["dataset"] == loader["dataset"]:
            kind = bool(e["train"])
    return kind


def _iterated_loaders(trace: ProcessTrace) -> dict[bool, dict]:
    """The loader events of the training (True) and validation (False) loaders: the ones
    iterated, else the last ones made."""
    loaders: dict[int, Event] = {}
    found: dict[bool, dict] = {}
    for e in trace.events:
        if e["ev"] == "loader":
            loaders[e["loader"]] = e
        loader = loaders.get(e["loader"]) if e["ev"] in ("loader", "loader_iter") else None
        kind = None if loader is None else _training_set(trace, loader)
        if loader is not None and kind is not None:
            found[kind] = loader
    return found


def _loader(ws: Workspace, rank: int, trace: ProcessTrace, train: bool) -> dict:
    """Rank `rank`'s training (or validation) loader; inconclusive if it made none."""
    loader = _iterated_loaders(trace).get(train)
    if loader is None:
        kind = "training" if train else "validation"
        raise Failed(ws.workers.problem() or f"rank {rank} made no {kind} loader",
                     "the earlier steps must work first", inconclusive=True)
    return loader


def _shards(trace: ProcessTrace, sampler: int) -> list[list[int]]:
    return [e["indices"] for e in trace.named("sampler_iter") if e["sampler"] == sampler]


def check_6(ws: Workspace) -> str:
    """Both loaders draw from a DistributedSampler over the world: in every epoch the ranks'
    training indices are disjoint and cover the data set (up to the sampler's padding, or
    less the remainder a drop_last sampler leaves out), and validation is split the same way."""
    ranks = ws.workers.ranks()
    evidence(len(ranks) == ws.world_size, ws.workers, "not every process joined")
    sizes: dict[bool, int] = {}
    dropping: dict[bool, bool] = {}
    for rank, trace in sorted(ranks.items()):
        for train, name in ((True, "training"), (False, "validation")):
            loader = _loader(ws, rank, trace, train)
            require(loader["sampler_type"] == "DistributedSampler",
                    f"rank {rank}'s {name} loader draws from a {loader['sampler_type']}, not a DistributedSampler", f"pass sampler=... to the {name} DataLoader")
            sampler = next(e for e in trace.named("sampler") if e["sampler"] == loader["sampler"])
            require(sampler["num_replicas"] == ws.world_size and sampler["sampler_rank"] == rank,
                    f"rank {rank}'s {name} sampler has num_replicas={sampler['num_replicas']}, "
                    f"rank={sampler['sampler_rank']}", "num_replicas=world size, rank=global rank")
            sizes[train] = sampler["size"]
            dropping[train] = bool(sampler["drop_last"])
    for train, name in ((True, "training"), (False, "validation")):
        samplers = [(t, _iterated_loaders(t)[train]["sampler"]) for _, t in sorted(ranks.items())]
        per_rank = [_shards(t, sampler) for t, sampler in samplers]
        sampler_epochs = [[e["epoch"] for e in t.named("sampler_iter") if e["sampler"] == sampler]
                          for t, sampler in samplers]
        epochs = min(len(s) for s in per_rank)
        for epoch in range(epochs):
            if len({e[epoch] for e in sampler_epochs}) > 1:
                continue  # the ranks shuffled for different epochs: Step 6.5's check says so
            shards = [s[epoch] for s in per_rank]
            total = sum(len(s) for s in shards)
            covered = set().union(*map(set, shards))
            # drop_last=True leaves out the data set's remainder after dividing by the world
            # size (never more than world size - 1 images); without it the sampler pads.
            size = sizes[train]
            whole = covered <= set(range(size)) and (
                len(covered) == total == size - size % ws.world_size if dropping[train]
                else len(covered) == size and total - len(covered) < ws.world_size)
            require(whole,
                    f"in epoch {epoch + 1} the ranks' {name} shards overlap or miss images "
                    f"({len(covered)} of {sizes[train]} covered by {total} draws)",
                    "every rank's sampler must use the same world size and its own rank")
    return f"both loaders use DistributedSampler; {ws.world_size} disjoint shards cover the data each epoch"


def check_6_5(ws: Workspace) -> str:
    """set_epoch(epoch) is called before each epoch's iteration, so the order changes from
    epoch to epoch and the ranks stay consistent."""
    seen: list[list[int]] = []
    ranks = ws.workers.ranks()
    evidence(len(ranks) == ws.world_size, ws.workers, "not every process joined")
    for rank, trace in sorted(ranks.items()):
        sampler = _loader(ws, rank, trace, True)["sampler"]
        orders = _shards(trace, sampler)
        evidence(len(orders) >= 2, ws.workers, f"rank {rank} trained fewer than 2 epochs")
        epochs = [e["epoch"] for e in trace.named("sampler_iter") if e["sampler"] == sampler]
        require(len(set(epochs)) == len(epochs),
                f"rank {rank}'s training sampler had epoch {epochs[0]} in every epoch: the same order each time", "call train_sampler.set_epoch(epoch) at the start of each epoch")
        require(orders[0] != orders[1], f"rank {rank} saw the same order in epochs 1 and 2",
                "call train_sampler.set_epoch(epoch) with the epoch number")
        seen.append(epochs)
    common = min((len(e) for e in seen), default=0)  # a rank that stopped early (Step 9's concern) has fewer
    require(all(e[:common] == seen[0][:common] for e in seen),
            f"the ranks set different epochs on their samplers: {seen}",
            "call set_epoch(epoch) with the same epoch number on every rank")
    return "set_epoch before every epoch: a new order each epoch, the same on every rank"


def check_optional(ws: Workspace) -> str | None:
    """With --sync-bn on GPUs every BatchNorm is a SyncBatchNorm (not applicable on a CPU-only machine)."""
    if not ws.on_gpu("program"):
        return None
    run = ws.program
    ddp = [e for t in run.traces.values() for e in t.named("ddp")]
    require("--sync-bn" in _setup(ws).options, "the script has no --sync-bn flag", 'parser.add_argument("--sync-bn", action="store_true")')
    require(ddp and all(e["sync_batchnorms"] == e["batchnorms"] > 0 for e in ddp),
            "with --sync-bn, some BatchNorm layers are not SyncBatchNorm",
            "model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP")
    return "every BatchNorm is a SyncBatchNorm"


def check_7(ws: Workspace) -> str:
    """The model sits on the process's own device and is wrapped in DDP; after training
    the parameters are identical on every rank."""
    ranks = ws.workers.ranks()
    evidence(len(ranks) == ws.world_size, ws.workers, "not every process joined")
    for rank, trace in sorted(ranks.items()):
        wraps = trace.named("ddp")
        require(len(wraps) == 1, f"rank {rank} wrapped {len(wraps)} models in DistributedDataParallel",
                "model = nn.parallel.DistributedDataParallel(model, ...)")
        if not ws.on_gpu("workers"):  # on GPUs, _model_on_own_gpu below
            require(wraps[0]["parameter_device"] == "cpu",
                    f"rank {rank}'s model was on {wraps[0]['parameter_device']} when wrapped; expected cpu",
                    "move the model to its device before wrapping it")
        require(not trace.named("moved_after_wrap"), f"rank {rank} moved the model after wrapping it in DDP", "call .to(device) before DistributedDataParallel(...)")
    per_epoch = {r: [e["sha1"] for e in t.named("parameters") if e["when"] == "validation"]
                 for r, t in ranks.items()}
    epochs = min(len(v) for v in per_epoch.values())
    evidence(epochs, ws.workers, "no rank finished an epoch of training")
    for epoch in range(epochs):
        models = {v[epoch] for v in per_epoch.values()}
        require(len(models) == 1, f"after epoch {epoch + 1}'s training the ranks hold {len(models)} different "
                "models", "wrap the model in DDP so that gradients are averaged")
    gpu = _gpu_note(ws, _model_on_own_gpu)
    return f"DDP on {ws.uses('workers')}; identical parameters on all {len(ranks)} ranks after every epoch{gpu}"


@dataclass
class _Epoch:
    """What one rank printed around one epoch, and when its parts ended."""

    number: int
    train_end: float               # the training loader's end
    prints_after_training: str     # printed from the end of training to the next epoch
    prints_after_validation: str   # printed from the end of validation to the next epoch


def _epochs(trace: ProcessTrace) -> list[_Epoch]:
    """Each epoch of a rank, with what it printed after its training and after its validation:
    the epoch's report may say anything in any words, as long as its numbers are right."""
    starts = [e["t"] for e in trace.named("loader_iter") if not e["validation"]]
    val_loaders = {e["loader"] for e in trace.named("loader_iter") if e["validation"]}
    train_ends = [e["t"] for e in trace.named("loader_end") if e["loader"] not in val_loaders]
    val_ends = [e["t"] for e in trace.named("loader_end") if e["loader"] in val_loaders]
    prints = trace.named("print")
    epochs = []
    for k, start in enumerate(starts):
        following = starts[k + 1] if k + 1 < len(starts) else float("inf")
        trained = next((t for t in train_ends if start <= t < following), None)
        validated = next((t for t in val_ends if start <= t < following), None)
        if trained is None:
            break

        def printed(since: float | None) -> str:
            return "\n".join(e["text"] for e in prints if since is not None and since <= e["t"] < following)
        epochs.append(_Epoch(k + 1, trained, printed(trained), printed(validated)))
    return epochs


def _quote(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return f"'{lines[-1][:160]}'" if lines else "nothing"


def _epoch_seconds(trace: ProcessTrace, epoch: _Epoch) -> float | None:
    """How long the rank's epoch of training took, to the end of the barrier after it."""
    starts = [e["t"] for e in trace.named("loader_iter") if not e["validation"]]
    barrier = next((e for e in trace.events if e["ev"] == "exit" and e.get("call") == "barrier"
                    and e["t"] >= epoch.train_end), None)
    if barrier is None or epoch.number > len(starts):
        return None
    return float(barrier["t"] - starts[epoch.number - 1])


def check_8(ws: Workspace) -> str:
    """A barrier closes each training epoch before its time is taken, and rank 0 prints the sum
    of all ranks' images/sec (read as a number, in any wording)."""
    ranks = ws.workers.ranks()
    evidence(len(ranks) == ws.world_size and all(_iterated_loaders(t).get(True) for t in ranks.values()),
             ws.workers, "not every rank trained")
    samples: dict[int, list[int]] = {}
    for rank, trace in sorted(ranks.items()):
        loader = _iterated_loaders(trace)[True]["loader"]
        ends = [e for e in trace.named("loader_end") if e["loader"] == loader]
        samples[rank] = [e["samples"] for e in ends]
        for epoch, end in enumerate(ends, 1):
            after = [e for e in trace.events if e["t"] >= end["t"] and e["ev"] in ("enter", "loader_iter")]
            first = after[0] if after else None
            require(first is not None and first.get("call") == "barrier",
                    f"rank {rank}: after the training of epoch {epoch} the first step is "
                    f"{where(first) if first and first['ev'] == 'enter' else 'validation'}, not a barrier", "dist.barrier() right after the training loop, before taking the time")
    epochs = _epochs(ranks[0])
    evidence(epochs, ws.workers, "rank 0 finished no epoch")
    for ep in epochs:
        seconds = _epoch_seconds(ranks[0], ep)
        if not seconds or ep.number > min(len(v) for v in samples.values()):
            continue
        total = sum(samples[r][ep.number - 1] for r in ranks)
        expected, own = total / seconds, samples[0][ep.number - 1] / seconds
        printed = [n.value for n in output.numbers(ep.prints_after_training) if not n.percent]
        require(any(abs(v - expected) <= 0.25 * expected and abs(v - expected) < abs(v - own) for v in printed),
                f"epoch {ep.number}: all ranks together trained about {expected:.0f} images/sec ({total} images "
                f"in {seconds:.2f} s), and no such number is in what rank 0 printed: {_quote(ep.prints_after_training)}", "sum the images/sec of all ranks with dist.reduce (op SUM) onto rank 0, and print it")
    return "a barrier ends every epoch; the printed images/sec is the sum over ranks"


def _validation_truth(ranks: dict[int, ProcessTrace]) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Per epoch: (loss, accuracy) over the whole validation set, and the average of the ranks' own.
    Raises Failed when some validation images were never evaluated (drop_last=True, say)."""
    per_rank = {}
    for rank, trace in ranks.items():
        loader = _iterated_loaders(trace)[False]
        ends = [e for e in trace.named("loader_end") if e["loader"] == loader["loader"]]
        shards = _shards(trace, loader["sampler"])
        per_rank[rank] = list(zip(shards, [_evaluated(e) for e in ends]))
    truth: list[tuple[tuple[float, float], tuple[float, float]]] = []
    for epoch in range(min(len(v) for v in per_rank.values())):
        seen: dict[int, list[float]] = {}
        everything: set[int] = set()
        means = []
        for rank in sorted(per_rank):
            indices, evaluated = per_rank[rank][epoch]
            if evaluated is None or any(place >= len(indices) for place, _ in evaluated):
                return truth
            everything.update(indices)
            for place, values in evaluated:  # a loader takes its sampler's indices in order
                seen.setdefault(indices[place], values)
            per_image = [values for _, values in evaluated]
            if per_image:
                means.append([sum(v[i] for v in per_image) / len(per_image) for i in (0, 1)])
        require(len(seen) == len(everything),
                f"epoch {epoch + 1}: {len(everything) - len(seen)} of {len(everything)} validation images were never "
                "evaluated (a validation loader with drop_last=True, or a loop cut short)",
                "evaluate every validation image: no drop_last on the validation loader")
        exact = (sum(v[0] for v in seen.values()) / len(seen), sum(v[1] for v in seen.values()) / len(seen))
        average = (sum(m[0] for m in means) / len(means), sum(m[1] for m in means) / len(means))
        truth.append((exact, average))
    return truth


def _evaluated(end: Event) -> list[tuple[int, list[float]]] | None:
    """(place in the loader's order, [loss, correct]) of each image a validation loop evaluated
    (older recordings: the loader's first len(per_image) images); None if it could not be seen."""
    per_image = end.get("per_image")
    if per_image is None:
        return None
    places = end.get("evaluated")
    return list(zip(range(len(per_image)) if places is None else places, per_image))


def _shows_metrics(text: str, loss: float, accuracy: float) -> bool:
    """Whether `text` holds the loss and the accuracy, to printing precision, in any wording."""
    found = output.numbers(text)
    return (any(n.matches(loss, slack=5e-4) for n in found)
            and any(n.matches(accuracy, slack=2e-4, fraction=True) for n in found))


def check_9(ws: Workspace) -> str:
    """Rank 0 prints the validation loss and accuracy over the whole validation set (or the ranks'
    average over equal shards), in any wording; no other rank prints them; every rank stops
    after the same epoch."""
    ranks = ws.workers.ranks()
    evidence(len(ranks) == ws.world_size, ws.workers, "not every process joined")
    epochs = {r: len([e for e in t.named("loader_iter") if not e["validation"]]) for r, t in ranks.items()}
    require(len(set(epochs.values())) == 1, f"the ranks trained different numbers of epochs: {epochs}",
            "decide early stopping from the all-reduced accuracy, the same on every rank")
    truth = _validation_truth(ranks)
    reports = {r: _epochs(t) for r, t in ranks.items()}
    require(truth and len(truth) == len(reports[0]), "could not see the model's validation outputs",
            "evaluate the DDP model on the validation loader")
    for k, (exact, average) in enumerate(truth):
        printers = sorted(r for r, epochs_of_r in reports.items() if k < len(epochs_of_r) and any(
            _shows_metrics(epochs_of_r[k].prints_after_validation, *pair) for pair in (exact, average)))
        require(printers == [0], f"epoch {k + 1}: the validation metrics were printed by ranks {printers}" if printers
                else f"epoch {k + 1}: over all ranks the validation loss is {exact[0]:.4f} and the accuracy "
                f"{exact[1]:.4f}, and rank 0 printed {_quote(reports[0][k].prints_after_validation)}",
                "add up loss sums, correct answers and counts with dist.all_reduce, then divide; print on rank 0 only"
                if not printers or 0 in printers else "print only on global rank 0 (if rank == 0: ...)")
    return f"rank 0 alone prints the global validation metrics; all ranks stopped after epoch {epochs[0]}"


# Step 10: the program runs ----------------------------------------------------------------


def check_10(ws: Workspace) -> str:
    """`python script.py --num-gpus 2` starts 2 processes with mp.spawn under
    `if __name__ == "__main__"` and exits 0; two node commands started together train one model."""
    run = ws.program
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
    nodes = ws.two_nodes
    run_ok(nodes, "both node commands must finish with exit status 0")
    fingerprints = {e["sha1"] for t in nodes.traces.values() for e in t.named("parameters")}
    require(sorted(nodes.ranks()) == [0, 1] and len(fingerprints) == 1,
            f"the two nodes ran ranks {sorted(nodes.ranks())} with {len(fingerprints)} different models",
            "both nodes must join one group of 2")
    return "mp.spawn starts 2 processes and the script exits 0; 2 node commands trained one model"
