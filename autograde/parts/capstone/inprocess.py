"""The capstone inside the learner's processes (and the baseline's): what went into the model, and what
the weights of each evaluation are worth by the course's own measure.

With $DDP_LAB_TRACE_LM set (to the bytes of the validation split the run uses), every call of a token
embedding of 256 rows (the model's first layer, whatever the model's code) emits "lm_rows": "eval"
when it runs in evaluation mode or without gradients, else "train", and each row's key (reports.key).
At the first row of each evaluation the weights of the model that holds the embedding are copied;
when the process ends, each copy's loss on the whole validation split is computed here, with the
model's own forward and the course's loss ("lm_recheck"): what the learner's log says is then held to
what the weights give. Building the embedding emits "lm_model" (the run's start, by the rules); the
model's first batch, its parameters' shapes ("lm_shapes": the closed division's model is the
baseline's); building an optimizer, its class ("lm_optimizer")."""
from __future__ import annotations

import atexit
import gc
import hashlib
import os
from typing import Any

from autograde.inprocess import tracer
from autograde.parts.capstone.reports import CONTEXT, key, samples
from autograde.settings import TRACE_LM

VOCAB = 256
_state: dict[str, Any] = {"mode": None, "root": None}
_copies: list[dict[str, Any]] = []  # the weights at the start of each evaluation, in order


def _root(embedding: Any) -> Any:
    """The outermost module that holds `embedding` (inside a DistributedDataParallel, its module)."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    parents: dict[int, Any] = {}
    for candidate in gc.get_objects():
        if isinstance(candidate, nn.Module):
            for child in candidate.children():
                parents.setdefault(id(child), candidate)
    top = embedding
    while id(top) in parents and not isinstance(parents[id(top)], DistributedDataParallel):
        top = parents[id(top)]
    return top


def _rows(module: Any, args: tuple[Any, ...]) -> None:
    import torch

    ids = args[0] if args else None
    if _state.get("rechecking") or module.num_embeddings != VOCAB or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return
    mode = "eval" if not module.training or not torch.is_grad_enabled() else "train"
    if _state["root"] is None:
        root = _state["root"] = _root(module)
        tracer.emit("lm_shapes", shapes=sorted(list(p.shape) for p in root.parameters()))
    model = _state["root"]
    if mode == "eval" and _state["mode"] != "eval":
        _copies.append({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
    _state["mode"] = mode
    weights = None  # the weights' digest at a training batch: the checker holds the ranks' equal (evaluation's unread)
    if mode == "train":
        digest = hashlib.sha1()
        for p in model.parameters():
            digest.update(p.detach().cpu().contiguous().numpy().tobytes())
        weights = digest.hexdigest()
    rows = ids.detach().to("cpu", torch.uint8).numpy()
    tracer.emit("lm_rows", mode=mode, keys=[key(row.tobytes()) for row in rows], weights=weights)


def _recheck() -> None:
    """Each evaluation's weights, measured on the whole validation split by the course."""
    if not _copies or _state["root"] is None:
        return
    import torch
    import torch.nn.functional as F

    _state["rechecking"] = True  # the course's own forward passes are not the learner's: untraced
    model = _state["root"]
    device = next(model.parameters()).device
    val = torch.tensor([list(s) for s in samples("val", int(os.environ[TRACE_LM]))], dtype=torch.long)
    model.eval()
    for n, weights in enumerate(_copies):
        model.load_state_dict(weights)
        total, count = 0.0, 0
        with torch.no_grad():
            for batch in val.split(256):
                batch = batch.to(device)
                logits = model(batch[:, :CONTEXT])
                logits = logits[0] if isinstance(logits, (tuple, list)) else logits  # (logits, loss), say
                total += float(F.cross_entropy(logits.reshape(-1, VOCAB).float(), batch[:, 1:].reshape(-1),
                                               reduction="sum"))
                count += batch[:, 1:].numel()
        tracer.emit("lm_recheck", evaluation=n, loss=total / count)


def install() -> None:
    """Trace the model's inputs and recheck its evaluations, when the checker asks ($DDP_LAB_TRACE_LM)."""
    if not os.environ.get(TRACE_LM):
        return
    import torch
    from torch import nn

    original_init = nn.Embedding.__init__

    def __init__(self: Any, num_embeddings: int, *args: Any, **kwargs: Any) -> None:
        original_init(self, num_embeddings, *args, **kwargs)
        if num_embeddings == VOCAB:
            tracer.emit("lm_model")
            self.register_forward_pre_hook(_rows)

    nn.Embedding.__init__ = __init__  # type: ignore[method-assign]
    optimizer_init = torch.optim.Optimizer.__init__

    def built(self: Any, *args: Any, **kwargs: Any) -> None:
        optimizer_init(self, *args, **kwargs)
        tracer.emit("lm_optimizer", name=type(self).__name__)

    torch.optim.Optimizer.__init__ = built  # type: ignore[method-assign]
    atexit.register(_recheck)
