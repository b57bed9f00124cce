"""The lab's checks of Steps 5-6.5, the data: one download per node, DistributedSampler, set_epoch.
Each reads the workers run (runs.py) and says what it observed."""
from __future__ import annotations

from autograde.engine.verdicts import Failed, evidence, require
from autograde.engine.workspace import Workspace
from autograde.parts.lab import runs
from autograde.parts.lab.checks import _by_child
from autograde.parts.lab.reports import Child, Workers
from autograde.protocol import Event, ProcessTrace, decode


def check_5(ws: Workspace) -> str:
    """On each node one process downloads; the others build their data sets only after a
    barrier that the downloader reaches once its download is done. What anyone builds after
    that (the downloader may build its sets again, without download) reads complete files."""
    by_node: dict[int, list[tuple[Child, ProcessTrace]]] = {}
    for child, trace in _by_child(ws):
        by_node.setdefault(child.node, []).append((child, trace))
    setups = decode(Workers, runs.workers(ws).report or {}).setups
    before = 0
    for node, members in sorted(by_node.items()):
        for child, trace in members:
            errors = trace.named("dataset_error")
            require(not errors, f"node {node}, local rank {child.local_rank} read the data set before it was "
                    f"there ({errors[0]['error'] if errors else ''})",
                    "after the download, dist.barrier() on every process; read the files only after it")
        main = runs.workers(ws).traces.get(setups[node].pid or -1) if node < len(setups) else None
        if main is not None and any(end is not None for _, end in _downloads(main)):
            before += 1  # the node's main code downloaded before it started the processes: they all read after
            continue
        downloaders = [(c, t) for c, t in members if _downloads(t)]
        require(len(downloaders) == 1, f"{len(downloaders)} processes of node {node} asked to download",
                "only local rank 0 downloads (download=True); the others read with download=False")
        _, loader_trace = downloaders[0]
        done = [end for _, end in _downloads(loader_trace)]
        require(all(t is not None for t in done), runs.workers(ws).problem() or f"node {node}'s download never finished",
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
        raise Failed(runs.workers(ws).problem() or f"rank {rank} made no {kind} loader",
                     "the earlier steps must work first", inconclusive=True)
    return loader


def _shards(trace: ProcessTrace, sampler: int) -> list[list[int]]:
    return [e["indices"] for e in trace.named("sampler_iter") if e["sampler"] == sampler]


def check_6(ws: Workspace) -> str:
    """Both loaders draw from a DistributedSampler over the world: in every epoch the ranks'
    training indices are disjoint and cover the data set (up to the sampler's padding, or
    less the remainder a drop_last sampler leaves out), and validation is split the same way."""
    ranks = runs.workers(ws).ranks()
    evidence(len(ranks) == ws.world_size, runs.workers(ws), "not every process joined")
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
    ranks = runs.workers(ws).ranks()
    evidence(len(ranks) == ws.world_size, runs.workers(ws), "not every process joined")
    for rank, trace in sorted(ranks.items()):
        sampler = _loader(ws, rank, trace, True)["sampler"]
        orders = _shards(trace, sampler)
        evidence(len(orders) >= 2, runs.workers(ws), f"rank {rank} trained fewer than 2 epochs")
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
