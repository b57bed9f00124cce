"""A small class under load (`make class-load` at full size: 24 learners, tests/class_load.py): three
learners on the hub check Step 3 at once, the node runs one check at a time, so the others wait their
turn in the line and their cells say so; every verdict is the expected one, and nothing is left behind.
Needs root (real users, cgroups) and JupyterHub's proxy (npm), as tests/course/test_class_hub.py does."""
from __future__ import annotations

import json
import re
from pathlib import Path

import class_load
import pytest
from classhub import need_a_hub

pytestmark = [pytest.mark.launch, pytest.mark.timeout(900)]


def test_three_learners_checking_at_once_wait_their_turn_and_get_their_own_verdicts(tmp_path: Path) -> None:
    need_a_hub("the class's load test")
    status = class_load.main(["--learners", "3", "--checks-at-once", "1", "--spread", "1", "--logins", "2", "--timeout", "600",
                              "--no-alone", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "local-3.json").read_text())
    report = (tmp_path / "local-3.txt").read_text()
    assert status == 0, report
    assert result["left_behind"] == {}, report
    learners = result["learners"]
    assert [x["verdict"]["status"] for x in learners] == ["pass", "FAIL", "pass"], report
    assert all(x["correct"] for x in learners), report
    waiting = [x["waited"] for x in learners if x["waited"]]
    assert len(waiting) >= 2, f"with 3 learners and one check at a time, not two cells said they waited:\n{report}"
    assert all(re.fullmatch(r"waiting for a turn: 1 check run at once on this node and yours is \d(st|nd|rd|th) "
                            r"in line; expected wait (about \d+ s|not known yet .*)", line) for line in waiting), waiting
    assert result["hub_api_ms"]["storm"]["count"] > 0
