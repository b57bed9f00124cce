"""Shared set-up: small stand-in data, and launching the lab's scripts the way a learner does."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autograde import data, processes  # noqa: E402
from autograde import protocol as formats  # noqa: E402

SOLUTIONS = ROOT / "solutions"
STARTER = ROOT / "fashion_mnist.py"
SOLUTION = SOLUTIONS / "fashion_mnist_after_step_10.py"  # the finished lab
PROBE = Path(__file__).resolve().parent / "probe"
TRAIN_SIZE, VAL_SIZE = 640, 301  # 301: two processes' validation shards need the sampler's padding
# Small and quick: the narrow model, one thread per process, big enough batches.
QUICK = ["--widen-factor", "1", "--batch-size", "64", "--epochs", "1"]


@pytest.fixture(scope="session", autouse=True)
def fresh_verdicts(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Check verdicts are cached on disk (autograde/checker/cache.py): every test session starts empty,
    so that no verdict comes from an earlier session's runs."""
    os.environ["DDP_LAB_CACHE_DIR"] = str(tmp_path_factory.mktemp("verdicts"))


def snapshot(step: int) -> Path:
    return SOLUTIONS / f"fashion_mnist_after_step_{step}.py"


def recorded_trace(*events: dict, pid: int = 1) -> formats.ProcessTrace:
    """A process's trace made by hand, events timed 0, 1, 2, ...: checks' logic without a launch."""
    return formats.ProcessTrace(pid, [{"t": k, **e} for k, e in enumerate(events)])


@pytest.fixture(scope="session")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic stand-in in Fashion-MNIST's format (clearly not the real data set)."""
    root = tmp_path_factory.mktemp("stand_in")
    data.write_synthetic(root, TRAIN_SIZE, VAL_SIZE, seed=3)
    return root


def probe_env(probe_dir: Path, **extra: str) -> dict[str, str]:
    """Environment that loads tests/probe/sitecustomize.py into every launched process."""
    return {"PYTHONPATH": str(PROBE), "DDP_LAB_PROBE_DIR": str(probe_dir), **extra}


def load_module(path: Path) -> ModuleType:
    """The lab script as a module (its main() is not run), to build its model in a test."""
    spec = importlib.util.spec_from_file_location(f"lab_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_metrics(script: Path, weights: dict[str, torch.Tensor], root: Path,
                      widen_factor: int = 1) -> tuple[float, float]:
    """Validation loss and accuracy of `weights` over the whole validation set, in one process."""
    model = load_module(script).WideResNet(widen_factor)
    model.load_state_dict(weights)
    model.eval()
    val_set = FashionMNIST(str(root), train=False, transform=ToTensor())
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(val_set, batch_size=100):
            outputs = model(images)
            loss_sum += F.cross_entropy(outputs, labels, reduction="sum").item()
            correct += int((outputs.argmax(1) == labels).sum())
    return loss_sum / len(val_set), correct / len(val_set)


def run_script(script: str | Path, *args: str | Path, timeout: float, env: dict[str, str] | None = None,
               records: Sequence[Path] = ()) -> processes.Result:
    """Launch one of the course's multi-process scripts, as `processes.run_python` does, made once
    more on a fault of gloo's (`again_on_gloo_fault`)."""
    return again_on_gloo_fault(lambda: processes.run_python(script, *args, timeout=timeout, env=env), records)


def again_on_gloo_fault(run: Callable[[], processes.Result], records: Sequence[Path] = ()) -> processes.Result:
    """`run()`, and once more if, and only if, gloo itself made it fail (`processes.gloo_fault`: a
    process aborted as it left, a connection lost as the processes met): the script's doing is
    judged by what its run printed, which such a failure takes away. Any other failure stands.
    (The notebooks' `lab.run` does the same, and the checker for learners' runs.) `records`:
    folders the run's processes write into, emptied before it is made again."""
    result = run()
    if result.returncode != 0 and processes.gloo_fault(result.output):
        for folder in records:
            for path in folder.iterdir():
                path.unlink()
        result = run()
    return result


def assert_clean_error(result: processes.Result, *words: str) -> None:
    """A non-zero exit with one error line that mentions `words`, no traceback, nothing left running."""
    assert not result.timed_out, f"hung instead of failing:\n{result.output}"
    assert result.returncode != 0, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.output
    for word in words:
        assert word in errors[0], errors[0]
    assert not result.leftover, "processes were left running"
