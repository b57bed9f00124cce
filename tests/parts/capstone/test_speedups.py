"""The class's speedups, held to the recorded runs of the reference solution and its baseline: a
threshold just below the recorded speedup earns its point, one just above does not, and says by how
much; the leaderboard's numbers are the same runs' (tests/core/test_checks_recorded.py replays the
rest of the capstone's recordings)."""
from __future__ import annotations

import pytest
from record_runs import replay

from autograde.parts.capstone import checks
from autograde.settings import CAPSTONE_SPEEDUPS

SOLUTION = ("time_to_target_solution", "solutions/capstone_lm.py")


def verdicts(monkeypatch: pytest.MonkeyPatch, thresholds: str) -> dict:
    from conftest import ROOT

    monkeypatch.setenv(CAPSTONE_SPEEDUPS, thresholds)
    name, path = SOLUTION
    return replay(name, (ROOT / path).read_text(), ["time_to_target", "speedup_1", "speedup_2"])


def test_a_speedup_at_or_above_a_threshold_earns_its_point_and_one_below_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    facts = verdicts(monkeypatch, "0.3,0.5")["time_to_target"].measured
    assert facts is not None and facts["speedup"] == pytest.approx(facts["baseline"] / facts["seconds"], rel=0.01)
    found = facts["speedup"]
    got = verdicts(monkeypatch, f"{found - 0.01:.3f},{found + 0.01:.3f}")
    assert got["speedup_1"].passed and f"a speedup of {found:.2f} over the baseline" in got["speedup_1"].observed
    assert got["speedup_2"].passed is False
    assert f"a speedup of {found:.2f} over the baseline on this machine, below the class's {found + 0.01:.2f}" in \
        got["speedup_2"].observed
    assert facts["division"] == "closed" and facts["processes"] == 2 and facts["optimizers"] == ["AdamW"]


def test_speedups_that_are_not_two_numbers_say_what_to_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CAPSTONE_SPEEDUPS, "fast")
    with pytest.raises(ValueError, match='DDP_LAB_CAPSTONE_SPEEDUPS is two speedups, the lower first, such as "1.15,1.3"'):
        checks.speedups()
    monkeypatch.delenv(CAPSTONE_SPEEDUPS)
    assert checks.speedups() == checks.SPEEDUPS
