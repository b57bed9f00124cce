"""The starter and the step checkpoints: each a small, honest diff from the last, each one trains."""
from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
import torch
from conftest import QUICK, SOLUTION, STARTER, TRAIN_SIZE, probe_env, reference_metrics, run_python, snapshot

from autograde.engine import output, processes
from autograde.grading import registry
from autograde.parts.lab import runs as lab_runs

STEPS = list(range(11))
MARKER = re.compile(r"#\s*(?:TODO\s+)?(?:Step\s+(\d+(?:\.5)?)|(Optional))\b")


def step_labels(step: int) -> set[str]:
    """The markers whose edits belong to `step`'s snapshot: the items whose checkpoint it is (the
    registry puts 6.5 with 6, Optional with 7)."""
    return {"Optional" if item.id == "optional" else item.id for item in registry.ITEMS
            if item.checkpoint == f"solutions/fashion_mnist_after_step_{step}.py"}


def paragraph_markers(lines: list[str], index: int) -> set[str]:
    """Step labels of the markers in the paragraph (run of non-blank lines) around line `index`."""
    start = end = min(max(index, 0), len(lines) - 1)
    while start > 0 and lines[start - 1].strip():
        start -= 1
    while end < len(lines) - 1 and lines[end + 1].strip():
        end += 1
    found = set()
    for line in lines[start:end + 1]:
        m = MARKER.search(line)
        if m:
            found.add(m.group(1) or m.group(2))
    return found


def changed_paragraphs(before: list[str], after: list[str]) -> list[tuple[str, set[str]]]:
    """For every changed line (on either side), the step markers of its paragraph."""
    result = []
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        for i in range(i1, i2):
            result.append((f"- {before[i]}", paragraph_markers(before, i)))
        for j in range(j1, j2):
            result.append((f"+ {after[j]}", paragraph_markers(after, j)))
    return result


def previous(step: int) -> Path:
    return STARTER if step == 0 else snapshot(step - 1)


def test_starter_marks_every_step() -> None:
    markers = {m.group(1) or m.group(2) for m in MARKER.finditer(STARTER.read_text()) if "TODO" in m.group(0)}
    assert markers == {*map(str, STEPS), "6.5", "Optional"}


@pytest.mark.parametrize("step", STEPS)
def test_snapshot_adds_exactly_its_step(step: int) -> None:
    before = previous(step).read_text().splitlines()
    after = snapshot(step).read_text().splitlines()
    changes = changed_paragraphs(before, after)
    assert changes, f"after_step_{step} is the same as the file before it"
    strays = [line for line, markers in changes if not markers & step_labels(step)]
    assert not strays, f"lines outside Step {step}'s TODO places:\n" + "\n".join(strays)
    text = "\n".join(after)
    for label in step_labels(step):  # its TODOs are done: they read "# Step N: ..." now
        assert f"# TODO {'Optional' if label == 'Optional' else 'Step ' + label}:" not in text


def test_the_finished_lab_has_no_todo_left() -> None:
    assert "# TODO" not in SOLUTION.read_text()


# The versions whose single-process training differs: the starter, training in worker()
# (Step 3), from samplers (6), through DDP (7) and with the metrics reduced over ranks (8, 9).
# Every checkpoint also trains, with 4 processes, in tests/core/test_autograde.py.
SINGLE_PROCESS = ["starter", "after_step_3", "after_step_6", "after_step_7", "after_step_8", "after_step_9"]


@pytest.mark.launch
@pytest.mark.parametrize("name", SINGLE_PROCESS)
def test_single_process_version_trains_an_epoch(name: str, stand_in: Path, tmp_path: Path) -> None:
    """These versions still train as one process, and print numbers that add up."""
    script = STARTER if name == "starter" else snapshot(int(name.rsplit("_", 1)[1]))
    args = ["--data-dir", stand_in, *QUICK]
    if "--master-port" in lab_runs.script_options(script):  # what its parser accepts (Step 2 on)
        args += ["--master-port", str(processes.free_port())]
    result = run_python(script, *args, timeout=180, env=probe_env(tmp_path))
    assert result.returncode == 0, result.output
    assert "synthetic stand-in" in result.stdout  # the stand-in is never passed off as Fashion-MNIST
    (epoch,) = output.epochs(result.stdout)
    # images/sec is the training set over the epoch's time (rounding: the time has 2 decimals)
    assert epoch.images_per_sec == pytest.approx(TRAIN_SIZE / epoch.epoch_time, rel=0.02)
    # the printed validation metrics are those of the trained model on the whole validation set
    loss, accuracy = reference_metrics(script, torch.load(tmp_path / "rank0.pt"), stand_in)
    assert epoch.val_loss == pytest.approx(loss, abs=2e-4)
    assert epoch.val_accuracy == pytest.approx(accuracy, abs=1.5e-4)
