"""The course's nbgrader runner refuses, in one line, a run that could not read the course's settings: nbgrader
itself goes on with its defaults (a gradebook in another folder, no grades), which looks like a class of zeros."""
from __future__ import annotations

from pathlib import Path

import pytest

from autograde.course import nbgrader_run

BROKEN = 'c = get_config()  # noqa: F821\nraise ValueError("a broken setting")\n'


@pytest.mark.launch
def test_settings_nbgrader_cannot_read_stop_the_run_with_their_error(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nbgrader_config.py").write_text(BROKEN)
    monkeypatch.setattr(nbgrader_run, "HERE", tmp_path)  # where nbgrader runs, and reads its config from
    monkeypatch.setenv("DDP_LAB_COURSE_DIR", str(tmp_path / "course"))
    with pytest.raises(nbgrader_run.NbgraderFailed) as refused:
        nbgrader_run.nbgrader("db", "student", "list")
    said = str(refused.value)
    assert "could not read the course's settings" in said and "ValueError: a broken setting" in said, said
    assert "\n" not in said


def test_a_run_whose_settings_were_read_is_not_refused() -> None:
    assert nbgrader_run.config_error(["[AutogradeApp | WARNING] Removing existing notebook: x.ipynb\n"]) is None
    lines = ["[App | ERROR] Exception while loading config file /c/nbgrader_config.py\n", "    Traceback ...\n",
             '      File "/c/nbgrader_config.py", line 2, in <module>\n', "    ImportError: no module named x\n"]
    assert nbgrader_run.config_error(lines) == "ImportError: no module named x"
