"""Scaling (part 4): the speedup measurement, how the large-batch checks read a trace, the logs the
notebooks read, and demos/speed_fixes.py's counts and traces.

The verdicts of the part's checks on its exercises, their mistakes and other styles are replayed
from recordings in tests/core/test_checks_recorded.py; here what only a launch proves, and the
measuring logic on runs made by hand."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import ROOT, again_on_gloo_fault, recorded_trace

from autograde.engine import processes
from autograde.engine.run import Run
from autograde.engine.verdicts import Failed
from autograde.engine.workspace import Workspace
from autograde.grading import judge
from autograde.parts.scaling import checks_batches as batches
from autograde.parts.scaling import checks_speed as speed
from autograde.parts.scaling import checks_timed, notebook
from autograde.protocol import ProcessTrace

FINISHED = ROOT / "solutions" / "large_batch_training.py"


def _step(n: int, images: int = 16, **more: object) -> dict:
    return {"ev": "step", "n": n, "lrs": [0.1], "images": images, **more}


def _run(*traces: list[dict]) -> Run:
    made = {pid: recorded_trace(*events, pid=pid) for pid, events in enumerate(traces, start=1)}
    return Run("timed run", [], made)


def test_throughput_leaves_out_the_warm_up_and_takes_the_slowest_rank() -> None:
    fast = ProcessTrace(1, [dict(_step(k), t=float(k)) for k in range(1, 7)])     # a step a second
    slow = ProcessTrace(2, [dict(_step(k), t=2.0 * k) for k in range(1, 7)])      # one every 2 seconds
    measured = speed.throughput(Run("timed run", [], {1: fast, 2: slow}), warmup=2)
    assert (measured.steps, measured.processes) == (4, 2)
    assert measured.images == 2 * 4 * 16  # steps 3-6 of both ranks: the clock starts at the end of step 2
    assert measured.seconds == 2.0 * 6 - 2.0 * 2  # the slow rank's


def test_a_run_too_short_to_time_is_refused() -> None:
    with pytest.raises(ValueError, match="fewer than"):
        speed.throughput(_run([_step(1), _step(2)]), warmup=2)
    with pytest.raises(ValueError, match="untimed"):
        speed.throughput(_run([_step(1), _step(2)]), warmup=0)


def test_verify_finds_skipped_work() -> None:
    end = {"ev": "parameters", "when": "stopped", "sha1": "a"}
    good = [_step(1), _step(2), end]
    assert speed.verify(_run(good, good), 2, 2, 16) is None
    assert "1 of 2 processes" in str(speed.verify(_run(good), 2, 2, 16))
    assert "took 1 optimizer steps" in str(speed.verify(_run(good, [_step(1), end]), 2, 2, 16))
    assert "8 images in its step 2" in str(speed.verify(_run(good, [_step(1), _step(2, 8), end]), 2, 2, 16))
    other = [_step(1), _step(2), dict(end, sha1="b")]
    assert "different parameters" in str(speed.verify(_run(good, other), 2, 2, 16))


def test_pairs_alternate_their_order_and_the_median_is_taken() -> None:
    made: list[tuple[int, int]] = []
    rates = {1: [100.0, 100.0, 100.0], 2: [150.0, 400.0, 190.0]}

    def make(processes: int, index: int) -> Run:
        made.append((processes, index))
        seconds = 16 * processes * 3 / rates[processes][index]
        return _run(*[[dict(_step(k), t=seconds * max(0, k - 1) / 3) for k in range(1, 5)]] * processes)

    found = speed.paired(make, 2, 3, warmup=1)
    assert made == [(1, 0), (2, 0), (2, 1), (1, 1), (1, 2), (2, 2)]
    assert [round(p.ratio, 6) for p in found] == [1.5, 4.0, 1.9]
    assert speed.median_ratio(found) == pytest.approx(1.9)


def test_speedup_is_not_applicable_without_two_gpus() -> None:
    with Workspace(FINISHED) as ws:  # no run is made: the check stops before launching
        verdict = judge.check(ws, "speedup")
        assert not ws.made()
    assert verdict.passed is None and verdict.status == "n/a" and "needs GPUs" in verdict.observed


@pytest.mark.launch
def test_the_speedup_measurement_times_real_runs_and_rejects_a_rank_that_skips_work(tmp_path: Path) -> None:
    """The check's measuring code on the CPU (its threshold needs GPUs): one pair of timed runs of
    the finished script, each verified; then the same with rank 1 training on half its batch."""
    with Workspace(FINISHED) as ws:
        (pair,) = checks_timed.measure_speedup(ws, 2, 1, batch=16, widen=1, warmup=2, steps=4)
    assert (pair.one.processes, pair.many.processes) == (1, 2)
    assert (pair.one.images, pair.many.images) == (4 * 16, 2 * 4 * 16)
    assert pair.one.seconds > 0 and pair.many.seconds > 0 and math.isfinite(pair.ratio)
    cheat = tmp_path / "large_batch_training.py"
    cheat.write_text(FINISHED.read_text().replace(
        "        images, labels = images.to(device), labels.to(device)\n",
        "        images, labels = images.to(device), labels.to(device)\n"
        "        if dist.get_rank() == 1:  # half the work, and the same credit?\n"
        "            images, labels = images[:len(labels) // 2], labels[:len(labels) // 2]\n", 1))
    with Workspace(cheat) as ws, pytest.raises(Failed, match="rank 1 gave the model 8 images"):
        checks_timed.timed_run(ws, 2, 0, batch=16, widen=1, warmup=2, steps=4)  # the 2-process run of a pair


def _validation(per_image: list[list[float]]) -> list[dict]:
    return [{"ev": "loader_iter", "loader": 7, "validation": True},
            {"ev": "loader_end", "loader": 7, "samples": len(per_image), "per_image": per_image}]


def test_the_large_batch_accuracy_counts_every_ranks_validation_images_epoch_by_epoch() -> None:
    """Notebook 19's check reads accuracy from what the model answered, both ranks' shares together."""
    right, wrong = [0.1, 1.0], [2.3, 0.0]
    ranks = {0: ProcessTrace(1, [*_validation([right, wrong]), *_validation([right, right])]),
             1: ProcessTrace(2, [*_validation([wrong, wrong]), *_validation([right, wrong])])}
    assert batches._accuracies(ranks) == [0.25, 0.75]


def test_the_large_batch_verdict_says_when_the_rate_never_stopped_rising() -> None:
    assert "still rising at the last step" in batches._shape([0.01 * s + 0.01 for s in range(8)])
    assert "first at step 4 of 8" in batches._shape([0.02, 0.03, 0.04, 0.05, 0.06, 0.06, 0.06, 0.06])


def test_the_logs_the_notebooks_read_give_times_per_epoch_and_per_step(tmp_path: Path) -> None:
    log = tmp_path / "weak-2.jsonl"
    log.write_text("".join(json.dumps({"epoch": e, "steps": 10 * e, "epoch_time": t}) + "\n"
                           for e, t in [(1, 9.0), (2, 4.0), (3, 6.0)]))
    assert notebook.step_times({2: log}) == {2: pytest.approx((4.0 + 6.0) / 20)}
    assert notebook.fit({1: 66.0, 2: 34.75, 4: 20.25}) == pytest.approx((64, 2, 0.75))


@pytest.mark.launch
def test_the_finished_script_logs_a_json_line_per_epoch(stand_in: Path, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = again_on_gloo_fault(lambda: processes.run(
        [processes.PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", FINISHED,
         "--data-dir", stand_in, "--widen-factor", "1", "--batch-size", "64", "--epochs", "2",
         "--target-accuracy", "0", "--large-batch", "--seed", "0", "--log-file", log], timeout=180,
        env={"OMP_NUM_THREADS": "1"}))
    assert result.returncode == 0, result.output[-2000:]
    records = notebook.read_log(log)
    assert [r["epoch"] for r in records] == [1, 2]
    steps = math.ceil(640 / 2 / 32)  # --large-batch: the solution's LARGE_BATCH of 32 replaces --batch-size
    assert [r["steps"] for r in records] == [steps, 2 * steps]
    assert all(r["world_size"] == 2 and r["global_batch"] == 64 and r["images"] == 640 for r in records)
    assert records[-1]["lr"] == pytest.approx(0.08)  # the solution's plan after its warm-up: 4 x 0.02
    assert all(r["epoch_time"] > 0 and 0 <= r["val_accuracy"] <= 1 for r in records)


@pytest.mark.launch
def test_speed_fixes_counts_all_reduces_and_writes_a_trace(stand_in: Path, tmp_path: Path) -> None:
    """With --accumulate 2, DDP all-reduces after both backward passes, and only after the last one
    inside no_sync; --profile writes a trace per rank that a trace viewer opens (Chrome's format)."""
    def timed(*options: object) -> dict:
        result = again_on_gloo_fault(lambda: processes.run(
            [processes.PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             ROOT / "demos" / "speed_fixes.py", "--data-dir", stand_in, "--widen-factor", "1", "--batch-size", "16",
             "--steps", "3", "--warmup-steps", "1", "--accumulate", "2", *options], timeout=180,
            env={"OMP_NUM_THREADS": "1"}))
        assert result.returncode == 0, result.output[-2000:]
        return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])

    plain = timed("--profile", tmp_path)
    assert plain["all_reduces_per_step"] == 2 and plain["world_size"] == 2
    assert set(plain["phases"]) >= {"data", "forward", "optimizer", "all-reduce"}
    for rank in (0, 1):
        assert "traceEvents" in json.loads((tmp_path / f"rank{rank}.json").read_text())
    assert timed("--no-sync")["all_reduces_per_step"] == 1


def test_strong_scaling_gives_every_gpu_a_busy_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Notebook 17's strong-scaling batch: 96 on a CPU; on GPUs, BUSY_PER_GPU for each, so that a
    GPU is not left waiting on kernel launches with 12-32 images a step."""
    monkeypatch.setattr(notebook, "gpu_count", lambda: 0)
    assert notebook.strong_batch() == notebook.GLOBAL_BATCH == 96
    monkeypatch.setattr(notebook, "gpu_count", lambda: 4)
    assert notebook.strong_batch() == 4 * notebook.BUSY_PER_GPU and notebook.strong_batch() // 4 >= 64
