"""Part 6's two programs (exercises/lars.py and exercises/kfac.py, solved) launched as a learner types
them, on the small stand-in: they train, log one JSON line per epoch, and refuse bad input in one
line. What the notebooks make of their logs is tested in tests/parts/optimizers/test_optimizers.py; the checks of
the LARS and KFAC classes themselves replay in tests/core/test_checks_recorded.py."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import ROOT, assert_clean_error, run_script

pytestmark = pytest.mark.launch  # every test here starts processes

LARS = ROOT / "solutions" / "lars.py"
KFAC = ROOT / "solutions" / "kfac.py"


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("model, optimizer", [("mlp", "lars"), ("mlp", "sgd"), ("wideresnet", "lars")])
def test_the_lars_program_trains_and_logs_every_epoch(stand_in: Path, tmp_path: Path, model: str, optimizer: str) -> None:
    log = tmp_path / "log.jsonl"
    result = run_script(LARS, "--model", model, "--optimizer", optimizer, "--batch-size", "128", "--epochs", "2",
                        "--lr", "2" if optimizer == "lars" else "0.1", "--warmup-epochs", "1", "--data-dir", stand_in,
                        "--log-file", log, timeout=240)
    assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
    found = _log(log)
    assert [e["epoch"] for e in found] == [1, 2] and {e["optimizer"] for e in found} == {optimizer}, found
    assert all(math.isfinite(e["loss"]) and 0 <= e["accuracy"] <= 1 for e in found), found


@pytest.mark.parametrize("optimizer", ["kfac", "sgd"])
def test_the_kfac_program_trains_on_two_processes_and_logs_every_epoch(stand_in: Path, tmp_path: Path,
                                                                       optimizer: str) -> None:
    log = tmp_path / "log.jsonl"
    result = run_script(KFAC, "--world-size", "2", "--optimizer", optimizer, "--update-freq", "2", "--batch-size",
                        "64", "--epochs", "2", "--data-dir", stand_in, "--log-file", log, timeout=240)
    assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
    found = _log(log)
    assert [e["epoch"] for e in found] == [1, 2] and found[-1]["steps"] == 2 * (640 // 64), found
    assert all(e["world_size"] == 2 and e["seconds_per_step"] > 0 and 0 <= e["accuracy"] <= 1 for e in found), found


@pytest.mark.parametrize("script, args, words", [
    (KFAC, ["--world-size", "2", "--batch-size", "63"], ["must divide by --world-size"]),
    (KFAC, ["--update-freq", "0"], ["--update-freq", "below 1"]),
    (LARS, ["--batch-size", "0"], ["--batch-size", "below 1"]),
    (LARS, ["--lr", "-1"], ["--lr must be above 0"]),
])
def test_the_programs_refuse_bad_arguments_in_one_line(stand_in: Path, script: Path, args: list[str],
                                                       words: list[str]) -> None:
    assert_clean_error(run_script(script, *args, "--data-dir", stand_in, timeout=60), *words)


@pytest.mark.parametrize("script", [LARS, KFAC])
def test_the_programs_say_what_to_do_without_the_data_offline(tmp_path: Path, script: Path) -> None:
    assert_clean_error(run_script(script, "--data-dir", tmp_path / "nothing", "--epochs", "1", timeout=60),
                       "no Fashion-MNIST", "make synthetic-data")
