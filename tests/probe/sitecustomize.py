"""Test probe, loaded into every Python process whose PYTHONPATH starts with this folder.

Active only when DDP_LAB_PROBE_DIR is set. It lets a test see inside the lab's training
script without changing it:

- the first module the script moves to a device (`.to()`) is taken to be the model; every
  time it is switched to evaluation mode, its weights are saved to
  $DDP_LAB_PROBE_DIR/rank<global rank>.pt, so the last save is the model behind the last
  printed validation metrics;
- with DDP_LAB_PROBE_CRASH_RANK=r, the process of global rank r raises an error in its
  third optimizer step (a crash in one rank);
- with DDP_LAB_PROBE_FAKE_GPUS=n, torch.cuda claims n GPUs (for checks of the command line
  that happen before any GPU is used).
"""
import os

_probe_dir = os.environ.get("DDP_LAB_PROBE_DIR")
if _probe_dir:
    import torch
    import torch.nn as nn

    _model = []
    _original_to = nn.Module.to
    _original_train = nn.Module.train

    def _rank():
        dist = torch.distributed
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def _to(self, *args, **kwargs):
        if not _model:
            _model.append(self)
        return _original_to(self, *args, **kwargs)

    def _train(self, mode=True):
        result = _original_train(self, mode)
        if not mode and _model and self is _model[0]:
            weights = {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}
            torch.save(weights, os.path.join(_probe_dir, f"rank{_rank()}.pt"))
        return result

    nn.Module.to = _to
    nn.Module.train = _train

    _crash_rank = os.environ.get("DDP_LAB_PROBE_CRASH_RANK")
    if _crash_rank is not None:
        _original_step = torch.optim.SGD.step
        _steps = [0]

        def _step(self, *args, **kwargs):
            _steps[0] += 1
            if _steps[0] == 3 and _rank() == int(_crash_rank):
                raise RuntimeError(f"probe: simulated crash in rank {_crash_rank}")
            return _original_step(self, *args, **kwargs)

        torch.optim.SGD.step = _step

    _fake_gpus = os.environ.get("DDP_LAB_PROBE_FAKE_GPUS")
    if _fake_gpus is not None:
        torch.cuda.is_available = lambda: int(_fake_gpus) > 0
        torch.cuda.device_count = lambda: int(_fake_gpus)
