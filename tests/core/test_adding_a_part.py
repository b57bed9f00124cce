"""Adding a part is a folder and one line: a small part, written into a copy of the package (its
own items, check, task, report, in-process code and trace event), is registered by one line in
autograde/parts/__init__.py and checked for real by `python -m autograde check`, with nothing else
of the package changed. docs/checker.md walks through the same steps."""
from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from autograde.engine import processes

FILES = {
    "__init__.py": '"""Part echo: a part made by tests/core/test_adding_a_part.py."""\n',
    "items.py": '''from autograde.grading.items import Part, exercise
from autograde.parts.echo import checks

PART_ID = "echo_part"
ITEMS = [exercise("echo", "say hello from every rank", 1, PART_ID, "99_echo", "echo.py", (checks.ECHO_RUNS,),
                  checks.check_echo)]
PART = Part(PART_ID, "Echo", "99_*.ipynb", "99_*", (), tuple(ITEMS))
''',
    "reports.py": '''from dataclasses import dataclass

from autograde.protocol import Task

EVENTS = {"echo_installed": ()}


@dataclass
class EchoTask(Task):
    greeting: str = "hello"


@dataclass
class EchoReport:
    world_size: int
    rank: int
    said: str = ""
    error: str | None = None
''',
    "inprocess.py": '''from typing import Any

from autograde.inprocess import tracer
from autograde.inprocess.learner_file import learner_module, short_error
from autograde.parts.echo.reports import EchoReport, EchoTask
from autograde.protocol import performs


def install() -> None:
    tracer.emit("echo_installed")


@performs(EchoTask)
def echo(rank: int, task: EchoTask, device: Any) -> EchoReport:
    report = EchoReport(task.world_size, rank)
    try:
        report.said = str(learner_module(task.script).say(task.greeting, rank))
    except Exception as err:
        report.error = short_error(err, task.script)
    return report
''',
    "checks.py": '''from autograde.engine.verdicts import rank_reports, require
from autograde.engine.workspace import RunKind, Workspace
from autograde.parts.echo.reports import EchoReport, EchoTask

ECHO_RUNS = RunKind("echo")


def check_echo(ws: Workspace) -> str:
    """Every rank of 2 says hello with its rank."""
    run = ws.called(ECHO_RUNS, "2", "echo on 2 processes", EchoTask(world_sizes=[2]))
    require(any(t.named("echo_installed") for t in run.traces.values()), "the part's tracing was not installed",
            "see inprocess.py")
    for r in rank_reports(run, EchoReport, "say() must take a greeting and a rank"):
        require(r.said == f"hello from {r.rank}", f"rank {r.rank} said {r.said!r}", "say the greeting with the rank")
    return "both ranks said hello with their rank"
''',
}
RIGHT = 'def say(greeting, rank):\n    return f"{greeting} from {rank}"\n'
WRONG = 'def say(greeting, rank):\n    return f"{greeting} from 0"\n'


@pytest.mark.launch
def test_a_part_is_a_folder_and_one_line(tmp_path: Path) -> None:
    copy = tmp_path / "course" / "autograde"
    shutil.copytree(ROOT / "autograde", copy, ignore=shutil.ignore_patterns("__pycache__"))
    folder = copy / "parts" / "echo"
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(text)
    listing = copy / "parts" / "__init__.py"
    listing.write_text(listing.read_text().replace('    "optimizers",\n', '    "optimizers",\n    "echo",\n'))
    changed = [line for line in difflib.unified_diff((ROOT / "autograde/parts/__init__.py").read_text().splitlines(),
                                                     listing.read_text().splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ['+    "echo",'], changed
    for name, text in (("right.py", RIGHT), ("wrong.py", WRONG)):
        (tmp_path / "course" / name).write_text(text)
    env = {"PYTHONPATH": str(tmp_path / "course"), "DDP_LAB_CACHE_DIR": str(tmp_path / "verdicts")}
    verdicts = {}
    for name in ("right.py", "wrong.py"):
        result = processes.run([processes.PYTHON, "-m", "autograde", "check", "--step", "echo", "--script", name],
                               timeout=300, cwd=tmp_path / "course", env=env)
        verdicts[name] = next((line for line in result.stdout.splitlines() if line.startswith("echo ")), result.output)
    assert verdicts["right.py"].split()[:2] == ["echo", "pass"], verdicts
    assert "both ranks said hello with their rank" in verdicts["right.py"], verdicts
    assert verdicts["wrong.py"].split()[:2] == ["echo", "FAIL"] and "rank 1 said 'hello from 0'" in verdicts["wrong.py"], verdicts
