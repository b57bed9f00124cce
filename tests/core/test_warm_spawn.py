"""A traced mp.spawn starts the learner's processes warm (forked from multiprocessing's fork server,
which imported torch once: autograde/inprocess/tracer.py, _warm_start), and each still
starts as under spawn: the learner's file imported afresh as `__mp_main__`, with the command line,
the working folder and the environment as they are at that spawn, a second spawn after an
environment change included. The same program run cold ($DDP_LAB_WARM_SPAWN=0) prints the same."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from autograde.engine.workspace import RunKind, Workspace
from autograde.settings import WARM_SERVER, WARM_SPAWN

PROGRAM = '''
import os
import sys

import torch.multiprocessing as mp

print(f"imported as {__name__}: COLOUR={os.environ.get('COLOUR')} argv={sys.argv[1:]} here={os.getcwd()}")


def child(rank, spawn):
    forked_by_main = os.getppid() == int(os.environ["MAIN_PID"])
    print(f"{spawn} spawn, rank {rank}: COLOUR={os.environ.get('COLOUR')} started by main={forked_by_main}")


if __name__ == "__main__":
    os.environ["MAIN_PID"] = str(os.getpid())
    os.environ["COLOUR"] = "red"
    mp.spawn(child, args=("first",), nprocs=2)
    os.environ["COLOUR"] = "blue"  # the second spawn's processes must see it, module level included
    mp.spawn(child, args=("second",), nprocs=2)
'''


def _printed(tmp_path: Path, warm: str) -> list[str]:
    script = tmp_path / warm / "program.py"
    script.parent.mkdir()
    script.write_text(PROGRAM)
    with Workspace(script) as ws:
        # cold: no warm-start server either, so that each spawned process is a new interpreter
        cold = {} if warm == "1" else {WARM_SERVER: "off"}
        run = ws.launched(RunKind("spawns"), "spawns", "program", ["--flag", "x"], env={WARM_SPAWN: warm, **cold})
        assert run.ok, run.output[-2000:]
        lines = sorted(line.replace(str(ws.root), "ROOT").replace(str(script.parent), "HERE")
                       for line in run.output.splitlines())
        assert len([t for t in run.traces.values() if t.named("print")]) == 5  # main and four processes, each traced
    return lines


@pytest.mark.launch
def test_warm_processes_start_as_spawned_ones_do(tmp_path: Path) -> None:
    warm, cold = _printed(tmp_path, "1"), _printed(tmp_path, "0")
    assert [re.sub(r"started by main=\w+", "", line) for line in warm] == \
        [re.sub(r"started by main=\w+", "", line) for line in cold]
    assert warm.count("imported as __mp_main__: COLOUR=red argv=['--flag', 'x'] here=ROOT") == 2
    assert warm.count("imported as __mp_main__: COLOUR=blue argv=['--flag', 'x'] here=ROOT") == 2
    assert "second spawn, rank 1: COLOUR=blue started by main=False" in warm  # forked by the warm server
    assert "second spawn, rank 1: COLOUR=blue started by main=True" in cold  # a new interpreter each
