"""The notebooks, run top to bottom with nbval as a learner who finished the lab runs them:
the finished solution in place of fashion_mnist.py, quick mode (tiny runs) on the CPU.

The graded notebooks of the later parts are not run here: the grading test of their part
(tests/course/test_course.py) executes them top to bottom with every exercise solved, and fails on any
cell that raises. Running them twice would only cost minutes."""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from autograde.engine import processes
from autograde.grading import registry
from autograde.tools.nbval_runner import learner_copy, nbval

pytestmark = pytest.mark.launch  # every test here starts processes

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
GRADED_ELSEWHERE = {nb for part in registry.PARTS if part.id != registry.FIRST for nb in part.graded_notebooks}
RUN_HERE = [nb for nb in NOTEBOOKS if nb.stem not in GRADED_ELSEWHERE]


def test_every_notebook_runs_top_to_bottom(tmp_path: Path) -> None:
    course = learner_copy(tmp_path)  # the finished solution as fashion_mnist.py
    result = nbval(course / "notebooks", *[nb.name for nb in RUN_HERE], timeout=1200)
    assert result.returncode == 0 and not result.timed_out, result.output[-5000:]
    code_cells = sum(c["cell_type"] == "code" for nb in RUN_HERE for c in json.loads(nb.read_text())["cells"])
    assert f"{code_cells} passed" in result.stdout, result.stdout[-2000:]


def test_notebooks_are_stored_without_outputs() -> None:
    result = processes.run([Path(processes.PYTHON).parent / "nbstripout", "--verify", "--keep-id", *NOTEBOOKS], timeout=120)
    assert result.returncode == 0, f"notebooks with outputs (run nbstripout --keep-id on them): {result.output}"


def test_a_failing_or_hanging_launch_fails_its_cell(tmp_path: Path) -> None:
    """What `!cmd` would not do: a launch that fails, or runs out of time, fails the notebook."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("import sys\nfrom autograde.jupyter import runtime"),
                      nbformat.v4.new_code_cell("runtime.run([sys.executable, '-c', 'import sys; sys.exit(3)'])"),
                      nbformat.v4.new_code_cell("runtime.run(['sleep', '60'], timeout=2)"),
                      nbformat.v4.new_code_cell("print(runtime.run([sys.executable, '-c', 'print(6 * 7)']))")]
    nbformat.write(notebook, tmp_path / "launches.ipynb")
    result = nbval(tmp_path, "launches.ipynb", timeout=300)
    assert "2 failed, 2 passed" in result.stdout, result.stdout[-3000:]
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)  # nbval colours its report
    assert "LaunchError: exit status 3" in text and "LaunchError: stopped after 2 s" in text, text[-3000:]


def test_a_quiet_launch_still_says_it_is_alive(capsys: pytest.CaptureFixture[str]) -> None:
    """A cell whose launch hides its output (echo=False) prints, every few seconds, how long it has
    run and its last line so far, rather than nothing until the end."""
    from autograde.jupyter import runtime
    code = "import time; print('epoch 1 of 3', flush=True); time.sleep(beat)".replace("beat", str(runtime.HEARTBEAT + 1.5))
    text = runtime.run([processes.PYTHON, "-c", code], timeout=60, echo=False)
    shown = capsys.readouterr().out
    assert text == "epoch 1 of 3\n" and f"  ... {runtime.HEARTBEAT:.0f} s: epoch 1 of 3" in shown, shown
