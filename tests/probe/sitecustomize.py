"""Test probe, loaded into every Python process whose PYTHONPATH starts with this folder.

Active only when DDP_LAB_PROBE_DIR is set. It is an extension of the checker's tracer
(autograde/inprocess/): it installs the tracer, whose traces go to the same folder,
and acts at the points the tracer reports, so that a test sees inside the lab's training
script without changing it:

- whenever a validation loop starts, the model's weights are saved to
  $DDP_LAB_PROBE_DIR/rank<global rank>.pt, so the last save is the model behind the last
  printed validation metrics;
- with DDP_LAB_PROBE_CRASH_RANK=r, the process of global rank r raises an error after its
  third optimizer step (a crash in one rank);
- with DDP_LAB_PROBE_FAKE_GPUS=n, torch.cuda claims n GPUs (for checks of the command line
  that happen before any GPU is used). This is the one thing the tracer does not do.

Like the course's own start-up, it first asks the warm-start server named in the environment (if
any) to run the process warm: the forked process runs this file again, as a file.
"""
import os

if __name__ == "sitecustomize" and os.environ.get("DDP_LAB_WARM_SERVER"):
    from autograde.inprocess import warm_start

    warm_start.proxy()  # returns only where this process must start cold

_probe_dir = os.environ.get("DDP_LAB_PROBE_DIR")
if _probe_dir:
    import runpy

    import torch

    from autograde import settings
    from autograde.inprocess import tracer

    # the course's own start-up, tracing into the probe's folder (children inherit it, as they do the probe)
    os.environ[settings.TRACE_DIR] = _probe_dir
    runpy.run_path(str(settings.STARTUP / "sitecustomize.py"))

    def _rank():
        dist = torch.distributed
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def _save_weights():
        model = tracer.model()
        if model is not None:
            weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            torch.save(weights, os.path.join(_probe_dir, f"rank{_rank()}.pt"))

    tracer.on("validation", _save_weights)

    _crash_rank = os.environ.get("DDP_LAB_PROBE_CRASH_RANK")
    if _crash_rank is not None:
        def _crash():
            if tracer.optimizer_steps() == 3 and _rank() == int(_crash_rank):
                raise RuntimeError(f"probe: simulated crash in rank {_crash_rank}")

        tracer.on("optimizer_step", _crash)

    _fake_gpus = os.environ.get("DDP_LAB_PROBE_FAKE_GPUS")
    if _fake_gpus is not None:
        torch.cuda.is_available = lambda: int(_fake_gpus) > 0
        torch.cuda.device_count = lambda: int(_fake_gpus)
