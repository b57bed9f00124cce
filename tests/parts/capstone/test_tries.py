"""The capstone notebook's tries: a speedup is taken between two runs of one machine, and a try kept in
runs/capstone/ says where it ran (the mistake of a baseline timed elsewhere, caught in its own words)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autograde.parts.capstone import notebook as capstone


def a_try(label: str, seconds: float | None, machine: str) -> capstone.Try:
    log = [{"key": "run_start", "time": 100.0}]
    if seconds is not None:
        log.append({"key": "run_stop", "time": 100.0 + seconds, "status": "success"})
    return capstone.Try(label, log, Path(f"{label}.jsonl"), machine)


def test_a_speedup_is_the_baselines_time_over_yours_on_one_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert capstone.speedup(a_try("baseline", 12.0, "node1"), a_try("mine", 8.0, "node1")) == pytest.approx(1.5)
    assert "mine: 8.0 s against the baseline's 12.0 s: a speedup of 1.50" in capsys.readouterr().out


def test_a_baseline_timed_on_another_machine_is_refused() -> None:
    laptop, node = "laptop (Intel i5, 4 core(s), no GPU)", "gpu-node (AMD EPYC, 16 core(s), 1 GPU(s): H200)"
    with pytest.raises(ValueError, match=r"the baseline 'baseline' ran on laptop .*, 'mine' on gpu-node .*: a "
                                         r"speedup compares two runs on one machine; time the baseline here"):
        capstone.speedup(a_try("baseline", 40.0, laptop), a_try("mine", 2.0, node))
    with pytest.raises(ValueError, match="'mine' did not reach the target"):
        capstone.speedup(a_try("baseline", 40.0, node), a_try("mine", None, node))


def test_a_kept_try_says_the_machine_it_ran_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no try labelled 'first' in runs/capstone/"):
        capstone.kept("first")
    log = Path("runs/capstone/first-seed0.jsonl")
    log.write_text(json.dumps({"key": "run_start", "time": 1.0}) + "\n")
    log.with_suffix(".machine").write_text("elsewhere (a CPU, 2 core(s), no GPU)")
    found = capstone.kept("first")
    assert found.machine == "elsewhere (a CPU, 2 core(s), no GPU)" and found.log == [{"key": "run_start", "time": 1.0}]
    assert capstone.this_machine() != found.machine  # this one: its host name, processor and cores
