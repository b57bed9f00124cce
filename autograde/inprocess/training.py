"""What the tracer sees of training, installed beside it (tracer.py) in every traced process: the
data sets (Fashion-MNIST's, patched only once torchvision's module is imported), samplers and data
loaders (with what a validation loop evaluated, image by image), the models moved and wrapped in
DistributedDataParallel, each optimizer step, and the lines the learner's code prints. The events
and their fields are the ones autograde/protocol.py lists."""
from __future__ import annotations

import builtins
import sys
import weakref
from types import ModuleType
from typing import Any

from autograde.inprocess import tracer

# While a validation loader runs: the batch it gave last (its images, labels and place in the loader's
# order), and what the model made of each evaluated image (logits, label, place).
_eval_capture: dict[str, Any] = {"active": False, "batch": None, "logits": [], "labels": [], "positions": []}


def _patch_dataset(mnist: ModuleType) -> None:
    FashionMNIST = mnist.FashionMNIST
    original_init = FashionMNIST.__init__

    def __init__(self: Any, root: Any, train: bool = True, *args: Any, **kwargs: Any) -> None:
        download = kwargs.get("download", args[2] if len(args) > 2 else False)
        tracer.emit("dataset_enter", train=bool(train), download=bool(download))
        try:
            original_init(self, root, train, *args, **kwargs)
        except Exception as err:
            tracer.emit("dataset_error", error=f"{type(err).__name__}: {err}"[:300])
            raise
        tracer.emit("dataset_exit", dataset=id(self), train=bool(train), size=len(self))

    FashionMNIST.__init__ = __init__  # type: ignore[method-assign]


def _patch_data_loading() -> None:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    original_sampler_init = DistributedSampler.__init__
    original_sampler_iter = DistributedSampler.__iter__
    original_set_epoch = DistributedSampler.set_epoch

    def sampler_init(self: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
        original_sampler_init(self, dataset, *args, **kwargs)
        tracer.emit("sampler", sampler=id(self), dataset=id(dataset), num_replicas=self.num_replicas,
             sampler_rank=self.rank, drop_last=self.drop_last, size=len(dataset))

    def sampler_iter(self: Any) -> Any:
        indices = list(original_sampler_iter(self))
        tracer.emit("sampler_iter", sampler=id(self), epoch=self.epoch, indices=indices)
        return iter(indices)

    def set_epoch(self: Any, epoch: int) -> None:
        tracer.emit("set_epoch")  # the epoch it sets shows in the next sampler_iter
        original_set_epoch(self, epoch)

    DistributedSampler.__init__ = sampler_init  # type: ignore[method-assign]
    DistributedSampler.__iter__ = sampler_iter  # type: ignore[method-assign]
    DistributedSampler.set_epoch = set_epoch  # type: ignore[method-assign]

    original_loader_init = DataLoader.__init__
    original_loader_iter = DataLoader.__iter__

    def loader_init(self: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
        original_loader_init(self, dataset, *args, **kwargs)
        tracer.emit("loader", loader=id(self), dataset=id(dataset), sampler=id(self.sampler),
             sampler_type=type(self.sampler).__name__, train=training_set(dataset))

    def loader_iter(self: Any) -> Any:
        validation = training_set(self.dataset) is False
        tracer.emit("loader_iter", loader=id(self), validation=validation)
        if validation:
            tracer.record_parameters("validation")  # after an epoch's training, before evaluating
            for action in tracer.actions("validation"):
                action()
            _eval_capture.update(active=True, batch=None, logits=[], labels=[], positions=[])
        samples = 0
        exhausted = False
        try:
            for batch in original_loader_iter(self):
                if isinstance(batch, (list, tuple)) and len(batch) == 2:
                    if validation:
                        _eval_capture["batch"] = (batch[0], batch[1].detach().cpu(), samples)
                    samples += len(batch[1])
                yield batch
            exhausted = True
        finally:
            # A validation loop may also end early (a break past the padded images): what it
            # evaluated is still its output. A training loop left early (an error, say) did not end.
            if exhausted or validation:
                _loader_end(self, validation, samples)

    def _loader_end(self: Any, validation: bool, samples: int) -> None:
        fields: dict[str, Any] = {}
        if validation:
            _eval_capture["active"] = False
            fields["per_image"] = _per_image(_eval_capture["logits"], _eval_capture["labels"])
            fields["evaluated"] = _eval_capture["positions"] if fields["per_image"] is not None else None
            _eval_capture["batch"] = None
        tracer.emit("loader_end", loader=id(self), samples=samples, **fields)

    DataLoader.__init__ = loader_init  # type: ignore[method-assign]
    DataLoader.__iter__ = loader_iter  # type: ignore[method-assign]

    original_optimizer_init = torch.optim.Optimizer.__init__

    def optimizer_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_optimizer_init(self, *args, **kwargs)
        self.register_step_post_hook(lambda optimizer, *_: tracer.count_step(optimizer))

    torch.optim.Optimizer.__init__ = optimizer_init  # type: ignore[method-assign]


def training_set(dataset: Any) -> bool | None:
    """Whether `dataset` is Fashion-MNIST's training set (True) or its validation set (False), read from
    the data set itself (torchvision's `train`), through wrappers that keep theirs in `.dataset`
    (Subset, say); None for any other data set. An object's own flag, never its id: a data set made and
    dropped (a download before the real one) may leave its id to the next."""
    for _ in range(8):
        mnist = sys.modules.get("torchvision.datasets.mnist")
        if mnist is not None and isinstance(dataset, mnist.MNIST):
            return bool(dataset.train)
        dataset = getattr(dataset, "dataset", None)
        if dataset is None:
            return None
    return None


def _evaluated_rows(images: Any, inputs: Any, count: int) -> list[int]:
    """Which rows of the loader's last batch a forward pass of `count` outputs evaluated: all of them,
    else each input found among the batch's images, else the first `count` (a batch cut short)."""
    if count == len(images):
        return list(range(count))
    try:
        given = inputs.detach().to("cpu", images.dtype).reshape(len(inputs), -1)
        batch = images.detach().to("cpu").reshape(len(images), -1)
        rows = [int(match[0]) for x in given if len(match := (batch == x).all(dim=1).nonzero().flatten()) == 1]
        if len(rows) == count and len(given) == count:
            return rows
    except (AttributeError, RuntimeError, TypeError):  # not a tensor of the batch's shape: no match
        pass
    return list(range(min(count, len(images))))


def _per_image(logits: list[Any], labels: list[Any]) -> list[list[float]] | None:
    """[loss, correct] of every evaluated validation image (None if logits and labels disagree)."""
    import torch
    import torch.nn.functional as F
    if not logits or sum(len(x) for x in logits) != sum(len(y) for y in labels):
        return None
    outputs, targets = torch.cat(logits), torch.cat(labels)
    losses = F.cross_entropy(outputs.double(), targets, reduction="none")
    correct = (outputs.argmax(dim=1) == targets).double()
    return torch.stack([losses, correct], dim=1).tolist()


def _patch_models() -> None:
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    original_init = DistributedDataParallel.__init__

    def ddp_init(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        parameter = next(module.parameters(), None)
        tracer.emit("ddp", device_ids=kwargs.get("device_ids", args[0] if args else None),
             parameter_device=str(parameter.device) if parameter is not None else None,
             batchnorms=sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()),
             sync_batchnorms=sum(isinstance(m, nn.SyncBatchNorm) for m in module.modules()))
        original_init(self, module, *args, **kwargs)
        tracer._ddp.append(weakref.ref(self))
        for action in tracer.actions("ddp"):
            action(self)
        module.register_forward_hook(_capture_logits)

    DistributedDataParallel.__init__ = ddp_init  # type: ignore[method-assign]

    original_to = nn.Module.to

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not tracer._moved:
            tracer._moved.append(weakref.ref(self))
        if any(d is not None and (self is d or self is d.module) for d in (ref() for ref in tracer._ddp)):
            tracer.emit("moved_after_wrap")
        return original_to(self, *args, **kwargs)

    nn.Module.to = to  # type: ignore[method-assign]


def _capture_logits(module: Any, inputs: Any, output: Any) -> None:
    """The model's outputs for the validation images it was given, with those images' labels and
    places in the loader's order (a loop may evaluate part of a batch: the sampler's padding left out)."""
    if not (_eval_capture["active"] and not module.training and _eval_capture["batch"] is not None):
        return
    images, labels, start = _eval_capture["batch"]
    logits = output.detach().cpu()
    rows = _evaluated_rows(images, inputs[0] if inputs else None, len(logits))
    if len(rows) != len(logits):
        return
    _eval_capture["logits"].append(logits)
    _eval_capture["labels"].append(labels[rows])
    _eval_capture["positions"].extend(start + r for r in rows)


def _patch_print() -> None:
    original_print = builtins.print

    def traced_print(*args: Any, **kwargs: Any) -> None:
        if kwargs.get("file") in (None, sys.stdout):
            tracer.emit("print", text=kwargs.get("sep", " ").join(map(str, args))[:300])
        original_print(*args, **kwargs)

    builtins.print = traced_print


def install() -> None:
    """Trace training in this process (after tracer.install)."""
    tracer.when_imported("torchvision.datasets.mnist", _patch_dataset)
    _patch_data_loading()
    _patch_models()
    _patch_print()
