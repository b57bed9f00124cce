"""The lab's checks of the Optional step and Steps 7-9, the training: SyncBatchNorm, DDP, the
throughput and the validation metrics over all processes. Each reads the workers or the program run
(runs.py) and says what it observed."""
from __future__ import annotations

from dataclasses import dataclass

from autograde.engine import output
from autograde.engine.verdicts import evidence, require
from autograde.engine.workspace import Workspace
from autograde.parts.lab import runs
from autograde.parts.lab.checks import _gpu_note, _model_on_own_gpu, _setup
from autograde.parts.lab.checks_data import _iterated_loaders, _shards
from autograde.protocol import Event, ProcessTrace, where


def check_optional(ws: Workspace) -> str | None:
    """With --sync-bn on GPUs every BatchNorm is a SyncBatchNorm (not applicable on a CPU-only machine)."""
    if not runs.on_gpu(ws, "program"):
        return None
    run = runs.program(ws)
    ddp = [e for t in run.traces.values() for e in t.named("ddp")]
    require("--sync-bn" in _setup(ws).options, "the script has no --sync-bn flag", 'parser.add_argument("--sync-bn", action="store_true")')
    require(ddp and all(e["sync_batchnorms"] == e["batchnorms"] > 0 for e in ddp),
            "with --sync-bn, some BatchNorm layers are not SyncBatchNorm",
            "model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP")
    return "every BatchNorm is a SyncBatchNorm"


def check_7(ws: Workspace) -> str:
    """The model sits on the process's own device and is wrapped in DDP; after training
    the parameters are identical on every rank."""
    ranks = runs.workers(ws).ranks()
    evidence(len(ranks) == ws.world_size, runs.workers(ws), "not every process joined")
    for rank, trace in sorted(ranks.items()):
        wraps = trace.named("ddp")
        require(len(wraps) == 1, f"rank {rank} wrapped {len(wraps)} models in DistributedDataParallel",
                "model = nn.parallel.DistributedDataParallel(model, ...)")
        if not runs.on_gpu(ws, "workers"):  # on GPUs, _model_on_own_gpu below
            require(wraps[0]["parameter_device"] == "cpu",
                    f"rank {rank}'s model was on {wraps[0]['parameter_device']} when wrapped; expected cpu",
                    "move the model to its device before wrapping it")
        require(not trace.named("moved_after_wrap"), f"rank {rank} moved the model after wrapping it in DDP", "call .to(device) before DistributedDataParallel(...)")
    per_epoch = {r: [e["sha1"] for e in t.named("parameters") if e["when"] == "validation"]
                 for r, t in ranks.items()}
    epochs = min(len(v) for v in per_epoch.values())
    evidence(epochs, runs.workers(ws), "no rank finished an epoch of training")
    for epoch in range(epochs):
        models = {v[epoch] for v in per_epoch.values()}
        require(len(models) == 1, f"after epoch {epoch + 1}'s training the ranks hold {len(models)} different "
                "models", "wrap the model in DDP so that gradients are averaged")
    gpu = _gpu_note(ws, _model_on_own_gpu)
    return f"DDP on {runs.uses(ws, 'workers')}; identical parameters on all {len(ranks)} ranks after every epoch{gpu}"


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
    ranks = runs.workers(ws).ranks()
    evidence(len(ranks) == ws.world_size and all(_iterated_loaders(t).get(True) for t in ranks.values()),
             runs.workers(ws), "not every rank trained")
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
    evidence(epochs, runs.workers(ws), "rank 0 finished no epoch")
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
    ranks = runs.workers(ws).ranks()
    evidence(len(ranks) == ws.world_size, runs.workers(ws), "not every process joined")
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
