"""Inside DDP (part 5): the demonstrations notebooks 20 and 21 run and the model-parallel programs
of notebook 22, launched for real, and the memory accounting of the ZeRO stages.

The verdicts of the part's checks on its exercises, their mistakes and other styles are replayed
from recordings in tests/core/test_checks_recorded.py; the grading test of the part
(tests/course/test_course.py) runs the notebooks themselves. Here: what each demonstration must show."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, run_script

from autograde.jupyter import runtime
from autograde.parts.inside import notebook as inside


def _launched(script: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "found.json"
    result = run_script(ROOT / script, *args, "--json-file", out, timeout=180)
    assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
    found: dict = json.loads(out.read_text())
    return found


@pytest.mark.launch
def test_no_sync_sends_one_all_reduce_per_step_and_trains_the_big_batch(tmp_path: Path) -> None:
    found = _launched(inside.NO_SYNC, tmp_path, "--world-size", "2", "--accumulate", "3")
    assert found["no_sync"]["all_reduces_per_step"] == 1
    assert found["every_backward"]["all_reduces_per_step"] == 3
    for way in ("no_sync", "every_backward"):
        assert found[way]["difference"] < 1e-6, found


@pytest.mark.launch
def test_fsdp_holds_half_of_everything_on_two_processes_and_trains_as_ddp(tmp_path: Path) -> None:
    found = _launched(inside.FSDP, tmp_path, "--world-size", "2")
    assert found["difference"] < 1e-6, found
    for rank in found["ranks"]:
        for kind in ("parameters", "gradients", "optimizer"):
            whole, shard = rank["DDP"][kind], rank["FSDP"][kind]
            assert whole > 0 and abs(shard - whole / 2) <= 0.01 * whole, (rank["rank"], kind, whole, shard)


@pytest.mark.launch
def test_the_sharded_optimizers_program_weighs_each_ranks_state(tmp_path: Path) -> None:
    """The solution's own program (notebook 21's measurement): 3 ranks share plain AdamW's state
    between them, each well under all of it, and train AdamW's weights."""
    found = _launched("solutions/sharded_optimizer.py", tmp_path, "--world-size", "3", "--steps", "2")
    shares = [rank["state_bytes"] / found["plain_state_bytes"] for rank in found["ranks"]]
    assert len(shares) == 3 and abs(sum(shares) - 1) < 0.01 and max(shares) < 0.5, shares
    assert all(rank["difference"] < 1e-6 for rank in found["ranks"]), found
    # notebook 21's prediction (the solution of zero_memory) beside the measurement: equal to the byte
    mine = runtime.exercise("solutions/sharded_optimizer.py")
    numels = [p.numel() for p in mine.make_model().parameters()]
    beside = inside.predicted_beside_measured({3: found}, mine.zero1_bytes, numels)
    assert [(n, rank) for n, rank, _, _ in beside] == [(3, 0), (3, 1), (3, 2)]
    assert all(entry["optimizer_state"] == measured for _, _, entry, measured in beside), beside
    assert all(entry["parameters"] == found["param_bytes"] for _, _, entry, _ in beside), beside


def test_the_prediction_table_goes_on_when_the_learners_function_fails(capsys: pytest.CaptureFixture[str]) -> None:
    run = {"param_bytes": 40, "ranks": [{"rank": 0, "state_bytes": 44}, {"rank": 1, "state_bytes": 36}]}
    beside = inside.predicted_beside_measured({1: {"param_bytes": 40, "ranks": [{"rank": 0, "state_bytes": 80}]}, 2: run},
                                              lambda numels, n: None if n == 1 else [(40, 40, 44), (40, 40, 36)], [10])
    assert beside == [(2, 0, (40, 40, 44), 44), (2, 1, (40, 40, 36), 36)]
    assert "TypeError" in capsys.readouterr().out


def _differences(result_output: str) -> dict[str, float]:
    """The "largest ... difference ... N" lines a model-parallel program prints, by what they measure."""
    found = {}
    for line in result_output.splitlines():
        match = re.match(r"(.+?): largest (?:gradient )?difference from the unsplit model (\S+?),?( |$)", line)
        if match:
            found[match[1]] = float(match[2])
    return found


@pytest.mark.launch
def test_the_tensor_parallel_program_matches_the_unsplit_layers_and_trains_2d_as_one_process() -> None:
    """The solution's own program, as notebook 22 has it typed: 4 processes, the MLP block cut 4 ways,
    then tensor parallel in pairs and data parallel across them, against one process."""
    result = run_script(ROOT / "solutions/tensor_parallel.py", "--world-size", "4", "--tensor-parallel", "2",
                        timeout=180)
    assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
    found = _differences(result.stdout)
    assert set(found) == {"output", "input gradient", "2-D training, output after 3 steps"}, result.stdout
    assert all(d <= 1e-6 for d in found.values()), found


@pytest.mark.launch
@pytest.mark.parametrize("schedule, micro_batches", [("gpipe", "4"), ("1f1b", "4"), ("interleaved", "6")])
def test_the_pipeline_program_gives_every_stage_the_unsplit_gradients(schedule: str, micro_batches: str) -> None:
    result = run_script(ROOT / "solutions/pipeline_parallel.py", "--stages", "3", "--micro-batches", micro_batches,
                        "--schedule", schedule, timeout=180)
    assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
    found = _differences(result.stdout)
    assert set(found) == {"stage 0", "stage 1", "stage 2"}, result.stdout
    assert all(d <= 1e-6 for d in found.values()), found


@pytest.mark.launch
@pytest.mark.parametrize("script, args", [("tensor_parallel.py", ["--world-size", "3"]),
                                          ("pipeline_parallel.py", ["--batch-size", "10", "--micro-batches", "4"]),
                                          ("pipeline_parallel.py", ["--schedule", "interleaved", "--micro-batches", "3"])])
def test_the_model_parallel_programs_refuse_a_layout_that_does_not_divide(script: str, args: list[str]) -> None:
    result = run_script(ROOT / "solutions" / script, *args, timeout=60)
    assert result.returncode == 2 and "must divide by" in result.stderr and "Traceback" not in result.stderr, result.output


def test_zero_memory_divides_what_each_stage_shards() -> None:
    memory = inside.zero_memory(1_000_000, world_size=4)
    assert memory["DDP"] == {"parameters": 4e6, "gradients": 4e6, "optimizer": 8e6}
    assert memory["ZeRO-1"] == {"parameters": 4e6, "gradients": 4e6, "optimizer": 2e6}
    assert memory["ZeRO-2"] == {"parameters": 4e6, "gradients": 1e6, "optimizer": 2e6}
    assert memory["ZeRO-3 (FSDP)"] == {"parameters": 1e6, "gradients": 1e6, "optimizer": 2e6}
    mixed = inside.zero_memory(10, world_size=1, precision="mixed")["DDP"]
    assert sum(mixed.values()) == 160  # the ZeRO paper's 16 bytes a parameter
    with pytest.raises(ValueError):
        inside.zero_memory(10, world_size=0)


def test_the_sharding_pictures_draw_every_stage_and_rank() -> None:
    fig = inside.zero_stages(inside.zero_memory(17_000_000, world_size=4), "a model")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 (FSDP)"]
    assert len(ax.patches) == 12  # 4 stages x (parameters, gradients, optimizer state)
    fig = inside.state_shares({1: [1.0], 2: [0.52, 0.48], 3: [0.46, 0.29, 0.25]})
    (ax,) = fig.axes
    assert sum(len(c.get_offsets()) for c in ax.collections) == 6
