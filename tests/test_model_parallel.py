"""Model parallelism (notebook 22): demos/model_parallel.py launched for real, each split against
the unsplit computation, and the pipeline's timeline; the bubble's arithmetic and its pictures."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autograde.notebook import inside
from conftest import ROOT, run_script

SCRIPT = ROOT / inside.MODEL_PARALLEL


@pytest.mark.launch
def test_every_split_matches_the_unsplit_computation_and_the_pipeline_fills_then_drains(tmp_path: Path) -> None:
    out = tmp_path / "found.json"
    result = run_script(SCRIPT, "--world-size", "2", "--micro-batches", "4", "--batch-size", "64",
                        "--width", "64", "--json-file", out, timeout=120)
    assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
    found = json.loads(out.read_text())
    assert set(found["differences"]) == {"column", "row", "pipeline"}
    assert all(d <= 1e-5 for d in found["differences"].values()), found["differences"]
    first, second = found["stages"]["0"], found["stages"]["1"]
    for events in (first, second):
        assert [(kind, m) for kind, m, *_ in events] == [(k, m) for k in ("forward", "backward") for m in range(4)]
    # stage 1 cannot start a micro-batch before stage 0 has finished and sent it; nor stage 0 its
    # backward before stage 1 has sent the gradient back
    for m in range(4):
        assert second[m][2] >= first[m][3] - 1e-3, (first[m], second[m])
        assert first[4 + m][2] >= second[4 + m][3] - 1e-3, (first[4 + m], second[4 + m])
    assert 0 < inside.bubble(found["stages"]) < 1


@pytest.mark.launch
def test_three_processes_split_a_layer_but_not_the_two_stage_pipeline() -> None:
    result = run_script(SCRIPT, "--world-size", "3", timeout=60)
    assert result.returncode == 2 and "the pipeline has 2 stages" in result.stderr, result.output


def test_the_bubble_of_a_made_up_timeline() -> None:
    # stage 0 busy 0-1 and 3-4, stage 1 busy 1-3: 4 s of 2 x 4 s busy
    stages = {"0": [["forward", 0, 0.0, 1.0], ["backward", 0, 3.0, 4.0]], "1": [["forward", 0, 1.0, 3.0]]}
    assert inside.bubble(stages) == pytest.approx(0.5)
    assert inside.ideal_bubble(2, 1) == pytest.approx(0.5)
    assert inside.ideal_bubble(4, 8) == pytest.approx(3 / 11)
    fig = inside.pipeline_timeline(stages)
    assert len(fig.axes[0].patches) == 3
    assert len(inside.bubbles({1: 0.5, 4: 0.3}, {1: 0.5, 4: 0.2}).axes[0].lines) == 2
    assert len(inside.tensor_split(2).axes) == 2
