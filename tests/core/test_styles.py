"""Correct finished scripts written the ways real learners write them (tests/styles/).

The checker must accept every correct script, whatever its style: module-level arguments,
the world size kept only by the process group or in the environment, a Trainer class, a
worker with another name and signature, averaged metrics, drop_last, any epoch line; the data
downloaded once per node and then read by every process (the downloader too), built in a class, or
built by the node's main process before it starts the others; validation cut to each rank's own
share, totals gathered with all_gather, or reduced onto rank 0 that broadcasts its decision. Each
style is first shown to be correct by running it for real, as a learner would (2 gloo
processes, one small epoch; the printed numbers are recomputed here); then the checker
must pass every step of it, launched here for every style in the default layout and for one in
the graders' hidden layouts, and for all of them in every layout on recorded runs
(tests/core/test_checks_recorded.py).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from conftest import PROBE, QUICK, ROOT, TRAIN_SIZE, run_script
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor

from autograde.course import assignment
from autograde.engine import processes
from autograde.engine.verdicts import Result
from autograde.grading import api, registry

STYLES_DIR = ROOT / "tests" / "styles"
STYLES = sorted(STYLES_DIR.glob("*.py"))

# How each style words its epoch line, as a pattern with the numbers the test reads back.
NUMBER = r"(\d+(?:\.\d*)?|nan)"
EPOCH_LINES = {
    "original_lab": rf"Epoch = (?P<epoch>\d+): Cumulative Time = \d+, Epoch Time = (?P<epoch_time>{NUMBER}), "
                    rf"Images/sec = (?P<images_per_sec>{NUMBER}), Validation Loss = (?P<loss>{NUMBER}), "
                    rf"Validation Accuracy = (?P<accuracy>{NUMBER})",
    "get_world_size": rf"epoch (?P<epoch>\d+) done after [\d.]+ s \(this epoch (?P<epoch_time>{NUMBER}) s\): "
                      rf"(?P<images_per_sec>{NUMBER}) images/s, validation loss (?P<loss>{NUMBER}), "
                      rf"accuracy (?P<accuracy>{NUMBER})",
    "env_vars": rf"Epoch (?P<epoch>\d+) \| total \d+:\d\d:\d\d \| epoch (?P<epoch_time>{NUMBER}) s \| "
                rf"(?P<images_per_sec>{NUMBER}) img/s \| val_loss (?P<loss>{NUMBER}) \| val_acc (?P<accuracy>{NUMBER})",
    "tutorial_setup": rf"Epoch (?P<epoch>\d+) \| elapsed +[\d.]+s \| epoch (?P<epoch_time>{NUMBER})s \| "
                      rf"(?P<images_per_sec>{NUMBER}) images/sec \| val loss (?P<loss>{NUMBER}) \| "
                      rf"val acc (?P<accuracy>{NUMBER})",
    "trainer_class": rf"Epoch +(?P<epoch>\d+) \[\d+m\d\ds\] took (?P<epoch_time>{NUMBER})s, "
                     rf"(?P<images_per_sec>{NUMBER}) images/sec; validation: loss (?P<loss>{NUMBER}), "
                     rf"accuracy (?P<accuracy>{NUMBER})",
    "spawn_extra_args": rf"epoch=(?P<epoch>\d+) elapsed=[\d.]+s epoch_time=(?P<epoch_time>{NUMBER})s "
                        rf"throughput=(?P<images_per_sec>{NUMBER})img/s val_loss=(?P<loss>{NUMBER}) "
                        rf"val_acc=(?P<accuracy>{NUMBER})",
    "reduce_avg": rf"Epoch (?P<epoch>\d+)/\d+ - \d+s - epoch (?P<epoch_time>{NUMBER})s - "
                  rf"(?P<images_per_sec>{NUMBER}) samples/s - val_loss: (?P<loss>{NUMBER}) - "
                  rf"val_accuracy: (?P<accuracy>{NUMBER})",
    "drop_last_train": rf"Epoch (?P<epoch>\d+): [\d.]+s total, (?P<epoch_time>{NUMBER})s this epoch, "
                       rf"(?P<images_per_sec>{NUMBER}) images/s \(all ranks\), validation loss (?P<loss>{NUMBER}) "
                       rf"accuracy (?P<accuracy>{NUMBER})",
    "percent_line": rf"\[epoch (?P<epoch>\d+)/\d+\] \d\d:\d\d:\d\d elapsed \| (?P<epoch_time>{NUMBER})s \| "
                    rf"(?P<images_per_sec>{NUMBER}) img/s \| loss=(?P<loss>{NUMBER}) acc=(?P<accuracy>{NUMBER})%",
    "download_then_all_read": rf"ep (?P<epoch>\d+) \| [\d.]+s in \| (?P<epoch_time>{NUMBER})s \| "
                              rf"(?P<images_per_sec>{NUMBER}) im/s \| loss (?P<loss>{NUMBER}) \| acc (?P<accuracy>{NUMBER})",
    "gather_totals_class": rf"epoch (?P<epoch>\d+) finished after [\d.]+ s; this epoch (?P<epoch_time>{NUMBER}) s at "
                           rf"(?P<images_per_sec>{NUMBER}) images per second; validation (?P<loss>{NUMBER}) / "
                           rf"(?P<accuracy>{NUMBER})",
    "data_before_spawn": rf"Epoch (?P<epoch>\d+) :: wall +[\d.]+s :: train (?P<epoch_time>{NUMBER})s :: "
                         rf"(?P<images_per_sec>{NUMBER}) images/s :: val loss (?P<loss>{NUMBER}) :: "
                         rf"val acc (?P<accuracy>{NUMBER})",
}
PERCENT_ACCURACY = {"percent_line"}

# Loaded into every process of a real run: the course's probe (each rank's weights at its
# last evaluation, tests/probe/), and a record of who printed what, by global rank.
RECORDER = '''
import builtins, json, os, sys
exec(compile(open({probe!r}).read(), {probe!r}, "exec"))
_print = builtins.print

def _recording_print(*args, **kwargs):
    if kwargs.get("file") in (None, sys.stdout):
        import torch.distributed as dist
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else None
        text = (kwargs.get("sep") or " ").join(map(str, args))
        with open(os.path.join({prints!r}, "prints-%d.jsonl" % os.getpid()), "a") as f:
            f.write(json.dumps({{"rank": rank, "text": text}}) + "\\n")
    _print(*args, **kwargs)

builtins.print = _recording_print
'''


def style_id(path: Path) -> str:
    return path.stem


def test_the_styles_are_learner_files() -> None:
    assert len(STYLES) >= 10, [p.name for p in STYLES]
    assert {p.stem for p in STYLES} == set(EPOCH_LINES), "every style needs its epoch line here, and only they"
    for path in STYLES:
        source = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+autograde", source, re.M), f"{path.name} imports the course's code"
        assert 'if __name__ == "__main__":' in source or "if __name__ == '__main__':" in source, path.name


def load_style(path: Path) -> ModuleType:
    """The style as a module, not run as a program (a style may parse its command line at import)."""
    spec = importlib.util.spec_from_file_location(f"style_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # in sys.modules while it runs, as an imported module is (dataclasses look themselves up there)
    with mock.patch.object(sys, "argv", [str(path)]), mock.patch.dict(os.environ), \
            mock.patch.dict(sys.modules, {spec.name: module}):
        spec.loader.exec_module(module)
    return module


def validation_metrics(path: Path, weights: dict[str, torch.Tensor], root: Path,
                       world_size: int) -> dict[str, tuple[float, float]]:
    """Loss and accuracy of `weights` (the style's own model), in one process: over the whole validation
    set, each image once ("exact"), and over the shards of `world_size` DistributedSamplers, whose padding
    repeats a few images ("padded": what ranks that each evaluate their whole shard add up to)."""
    model = load_style(path).WideResNet(widen_factor=1)
    model.load_state_dict(weights)
    model.eval()
    validation = FashionMNIST(str(root), train=False, transform=ToTensor())
    losses, correct = [], []
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(validation, batch_size=100):
            outputs = model(images)
            losses += F.cross_entropy(outputs, labels, reduction="none").tolist()
            correct += (outputs.argmax(1) == labels).tolist()
    padded = [i for r in range(world_size) for i in torch.utils.data.DistributedSampler(
        validation, num_replicas=world_size, rank=r, shuffle=False)]
    return {"exact": (sum(losses) / len(losses), sum(correct) / len(correct)),
            "padded": (sum(losses[i] for i in padded) / len(padded), sum(correct[i] for i in padded) / len(padded))}


def half_unit(printed: str) -> float:
    """Half a unit of the printed number's last digit: how far printing may have moved it."""
    decimals = len(printed.split(".", 1)[1]) if "." in printed else 0
    return 0.5 * 10 ** -decimals


@pytest.mark.launch
@pytest.mark.parametrize("path", STYLES, ids=style_id)
def test_style_trains_for_real(path: Path, stand_in: Path, tmp_path: Path) -> None:
    """`python STYLE --num-gpus 2 ...` as a learner types it: exit 0, one epoch line, printed by
    global rank 0 alone, with the summed images/sec and the whole validation set's metrics."""
    site, prints, weights = tmp_path / "site", tmp_path / "prints", tmp_path / "weights"
    for folder in (site, prints, weights):
        folder.mkdir()
    (site / "sitecustomize.py").write_text(RECORDER.format(probe=str(PROBE / "sitecustomize.py"), prints=str(prints)))
    result = run_script(path, "--num-gpus", "2", *QUICK, "--data-dir", stand_in,
                        "--master-port", str(processes.free_port()), timeout=240, records=[prints, weights],
                        env={"PYTHONPATH": str(site), "DDP_LAB_PROBE_DIR": str(weights),
                             "CUDA_VISIBLE_DEVICES": ""})  # gloo on the CPU, whatever the machine has
    assert result.returncode == 0 and not result.timed_out, result.output
    assert not result.leftover, "processes were left running"

    pattern = re.compile(EPOCH_LINES[path.stem])
    assert len(pattern.findall(result.stdout)) == 1, f"expected one epoch line:\n{result.output}"
    printed = [json.loads(line) for f in sorted(prints.glob("*.jsonl")) for line in f.read_text().splitlines()]
    epoch_lines = [(p["rank"], m) for p in printed if (m := pattern.search(p["text"]))]
    assert [rank for rank, _ in epoch_lines] == [0], f"epoch lines by ranks {[r for r, _ in epoch_lines]}"
    line = epoch_lines[0][1]
    assert int(line["epoch"]) == 1, line.group(0)

    # Both ranks hold one model (parameters; BatchNorm's running statistics are each rank's own).
    rank0, rank1 = (torch.load(weights / f"rank{r}.pt") for r in (0, 1))
    parameters = [k for k in rank0 if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert all(torch.equal(rank0[k], rank1[k]) for k in parameters), "the ranks hold different models"

    # The images/sec of both ranks summed: the whole training set over the epoch time.
    epoch_time, images_per_sec = float(line["epoch_time"]), float(line["images_per_sec"])
    slack = 0.05 + half_unit(line["epoch_time"]) / epoch_time
    assert images_per_sec == pytest.approx(TRAIN_SIZE / epoch_time, rel=slack), line.group(0)

    # The metrics of the whole validation set, each image counted once (or, as Step 9 accepts, the
    # average of the ranks' equal shards, the sampler's padding included).
    scale = 100.0 if path.stem in PERCENT_ACCURACY else 1.0
    printed = float(line["loss"]), float(line["accuracy"]) / scale
    slack = half_unit(line["loss"]) + 2e-4, half_unit(line["accuracy"]) / scale + 1.5e-4
    truths = validation_metrics(path, rank0, stand_in, world_size=2)
    assert any(abs(printed[0] - loss) <= slack[0] and abs(printed[1] - accuracy) <= slack[1]
               for loss, accuracy in truths.values()), (line.group(0), truths)


def failures(results: list[Result]) -> list[str]:
    """Every verdict that is not what a correct script gets on this machine."""
    sync_bn = True if processes.gpu_count() >= 2 else None  # the Optional step needs 2 GPUs: n/a on a CPU
    return [f"Step {r.step} {r.status}: {r.observed}" for r in results
            if r.passed is not (sync_bn if r.step == "optional" else True)]


# The checker's verdicts on every style, in every layout, are replayed from recordings in
# tests/core/test_checks_recorded.py, in seconds. A replay shows what a change to the checks does, not a
# change to how the learner's processes start or what they trace: so every style is also checked here,
# launched for real, in the default layout; the graders' hidden layouts on one style, whose layouts
# differ most from the course's (a Trainer class, its own names).
LAUNCHED = [STYLES_DIR / "trainer_class.py"]


@pytest.mark.launch
@pytest.mark.parametrize("path", STYLES, ids=style_id)
def test_checker_passes_every_step(path: Path) -> None:
    results = api.check_steps(None, path, quiet=True)
    assert [r.step for r in results] == registry.FIRST_ITEMS
    if failures(results):
        pytest.fail("\n".join(failures(results)), pytrace=False)


HIDDEN = assignment.hidden_layouts()  # the graders' hidden tests, by layout


@pytest.mark.launch
@pytest.mark.parametrize("layout", list(HIDDEN))
@pytest.mark.parametrize("path", LAUNCHED, ids=style_id)
def test_checker_passes_the_hidden_layouts(path: Path, layout: str) -> None:
    steps, where = HIDDEN[layout]
    results = api.check_steps(steps, path, procs_per_node=where.procs_per_node, nodes=where.nodes, quiet=True)
    if failures(results):
        pytest.fail("\n".join(failures(results)), pytrace=False)
