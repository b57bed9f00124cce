"""What notebook 23 (debugging hangs) calls: demos/hangs.py made to hang, then looked at from
outside three ways: where each rank's Python stack waits (`py-spy dump`, or Python's faulthandler
where py-spy is missing), what TORCH_DISTRIBUTED_DEBUG=DETAIL says, and the course checker's
deadlock report. Every launch has a time limit, and its whole process group is killed after."""
from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from autograde import processes
from autograde.checker.runs import Workspace
from autograde.notebook import lab
from autograde.notebook.launching import launch_last_line

SCRIPT = "demos/hangs.py"
BUGS = ("one_rank_collective", "uneven_batches", "early_stop_rank0")
RANK_LINE = re.compile(r"rank (\d+) \(pid (\d+)\)")
PY_SPY_FRAME = re.compile(r"^\s+(\S+) \((.+):(\d+)\)")            # "    all_reduce (torch/.../c10d.py:2950)"
FAULTHANDLER_FRAME = re.compile(r'File "(.+)", line (\d+) in (\S+)')  # faulthandler's "File "x.py", line 3 in f"


class HangError(Exception):
    """The script did not behave as the demonstration needs (it finished, or never started)."""


def _py_spy() -> str | None:
    found = Path(sys.executable).parent / "py-spy"
    return str(found) if found.exists() else shutil.which("py-spy")


def _frames_py_spy(pid: int) -> list[str]:
    """The main thread's stack of `pid`, innermost first, as "function (file:line)"."""
    spy = _py_spy()
    assert spy is not None
    result = processes.run([spy, "dump", "--pid", str(pid)], timeout=30)
    if result.returncode != 0:
        raise HangError(f"py-spy could not read process {pid}: {launch_last_line(result)}")
    frames, in_main = [], False
    for line in result.stdout.splitlines():
        if line.startswith("Thread "):
            in_main = "MainThread" in line
        elif in_main and (m := PY_SPY_FRAME.match(line)):
            frames.append(f"{m[1]} ({Path(m[2]).name}:{m[3]})")
    return frames


def _frames_faulthandler(pid: int, output: list[str], collect: Callable[[], None]) -> list[str]:
    """The stack the script's faulthandler prints on SIGUSR1 (into the run's output, which
    `collect` brings in), innermost first."""
    collect()
    seen = len(output)
    os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    collect()
    frames: list[str] = []
    for line in output[seen:]:
        if "hread 0x" in line and frames:
            break  # the next thread's stack
        if m := FAULTHANDLER_FRAME.search(line):
            frames.append(f"{m[3]} ({Path(m[1]).name}:{m[2]})")
    return frames


def where_they_wait(bug: str, world_size: int = 2, settle: float = 4.0, limit: float = 90.0) -> dict[int, list[str]]:
    """Starts the script with `bug`, waits until every rank has said its pid and nothing has been
    printed for `settle` seconds (stuck), reads each rank's stack, kills everything, and returns
    {rank: frames, innermost first}. With py-spy where it is installed, else with faulthandler."""
    command: list[str | Path] = [sys.executable, lab.course_file(SCRIPT), "--world-size", str(world_size), "--bug", bug, "--timeout", "300"]
    proc = processes.start(command, merge_stderr=True)
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline, quiet_since, ended = time.monotonic() + limit, time.monotonic(), False
    pids: dict[int, int] = {}

    def drain(wait: float) -> None:
        nonlocal quiet_since, ended
        try:
            line = lines.get(timeout=wait)
        except queue.Empty:
            return
        if line is None:
            ended = True
            return
        output.append(line)
        quiet_since = time.monotonic()
        for m in RANK_LINE.finditer(line):  # two ranks' lines can arrive as one
            pids[int(m[1])] = int(m[2])

    def collect() -> None:
        for _ in range(lines.qsize()):
            drain(0)

    try:
        while not ended and time.monotonic() < deadline:
            drain(0.2)
            if len(pids) == world_size and time.monotonic() - quiet_since >= settle:
                break
        if ended:
            raise HangError(f"hangs.py --bug {bug} ended by itself: {''.join(output[-3:]).strip()}")
        if len(pids) < world_size:
            raise HangError(f"hangs.py --bug {bug}: only {len(pids)} of {world_size} ranks started in {limit:.0f} s")
        how = "py-spy dump" if _py_spy() else "faulthandler (py-spy is not installed)"
        print(f"--bug {bug}: stuck for {settle:g} s; each rank's stack by {how}:")
        stacks = {}
        for rank, pid in sorted(pids.items()):
            if _py_spy():
                stacks[rank] = _frames_py_spy(pid)
            else:
                stacks[rank] = _frames_faulthandler(pid, output, collect)
        return stacks
    finally:
        processes.kill_group(proc.pid)
        proc.wait()


def waiting_line(frames: list[str], script: str = "hangs.py") -> str:
    """Where a stack waits, in a line: the innermost call (the collective), and the line of the
    script that made it."""
    mine = [f for f in frames if f"({script}:" in f]
    return f"in {frames[0]}, called from {mine[0]}" if frames and mine else (frames[0] if frames else "(no stack)")


def detail(bug: str, world_size: int = 2) -> str:
    """The same bug with TORCH_DISTRIBUTED_DEBUG=DETAIL, the gradients averaged by hand (--by-hand:
    with gloo, DETAIL crashes DistributedDataParallel's constructor in this PyTorch): the line
    that names the collectives the ranks disagree on."""
    result = processes.run([sys.executable, lab.course_file(SCRIPT), "--world-size", str(world_size), "--bug", bug,
                         "--by-hand", "--timeout", "20"], timeout=90, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    found = [line for line in result.output.splitlines() if "Detected mismatch" in line]
    if not found:
        return f"(no mismatch reported; exit status {result.returncode}: {launch_last_line(result)})"
    line = found[0][found[0].index("Detected mismatch"):]
    return re.sub(r"TensorDeviceTypes=TensorOptions\(.*?\)\)", "...)", line.split(".Collectives differ")[0])


def checker_report(bug: str, world_size: int = 2) -> str:
    """The course checker's verdict on a run of the script with `bug`: it traces every
    torch.distributed call, notices that nothing moves, stops the run and names the call each
    rank waits in."""
    ws = Workspace(Path(lab.course_file(SCRIPT)).resolve())
    try:
        run = ws.launched(f"hang/{bug}", f"run with --bug {bug}", ["--world-size", str(world_size), "--bug", bug,
                                                                  "--timeout", "300"])
        return run.problem() or f"the run with --bug {bug} finished"
    finally:
        ws.close()


def fixed(bug: str, world_size: int = 2) -> str:
    """The script with the bug's fix: it must finish. Its output."""
    return lab.run([sys.executable, lab.course_file(SCRIPT), "--world-size", str(world_size), "--bug", bug, "--fix",
                    "--timeout", "30"], timeout=120)
