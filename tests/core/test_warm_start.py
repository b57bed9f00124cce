"""Warm starts (autograde/inprocess/warm_start.py): a Python process, traced or not, forked from a
server that has imported torch is the process that its launcher started, in everything a program
can see (command line, folder, environment, sys.path, __main__, files, exit code, signals), and it
traces the same events as a cold one: the lab's solution (the setup, workers and program runs) and
two styles (the program run) are run both ways and their traces compared, event by event. Its
stand-in's death, or its server's owner's, leaves nothing of it running."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from autograde import settings
from autograde.engine import processes
from autograde.engine.workspace import Workspace
from autograde.parts.lab import runs as lab_runs
from autograde.settings import STARTUP, TRACE_DIR, WARM_SERVER, WARM_SPAWN

STYLES = settings.REPO / "tests" / "styles"

PROGRAM = r'''
import os, signal, sys
import torch

def fingerprint():
    main = sys.modules["__main__"]
    said = {
        "name": __name__, "argv": sys.argv, "file": getattr(main, "__file__", None), "path0": sys.path[0],
        "in_path": [p for p in sys.path if "site-packages" not in p][:4], "cwd": os.getcwd(),
        "colour": os.environ.get("DDP_LAB_COLOUR"), "umask": os.umask(0o022), "spec": getattr(getattr(main, "__spec__", None), "name", None),
        "sigint": repr(signal.getsignal(signal.SIGINT)), "sigpipe": repr(signal.getsignal(signal.SIGPIPE)),
        "sigterm": repr(signal.getsignal(signal.SIGTERM)), "stdin": sys.stdin.read(),
        "stdout_buffered": type(sys.stdout.buffer).__name__, "line_buffering": sys.stdout.line_buffering,
        "torch_threads": torch.get_num_threads(), "fd3": os.path.exists("/proc/self/fd/3"),
        "debug_level": str(torch.distributed.get_debug_level()),
        "session_leader": os.getsid(0) == os.getpid(),
    }
    print(json.dumps(said, sort_keys=True), flush=True)
    print("on stderr", file=sys.stderr, flush=True)

import json
fingerprint()
what = sys.argv[1] if len(sys.argv) > 1 else ""
if what == "raise":
    raise ValueError("the program's own error")
if what == "exit":
    sys.exit(3)
if what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "wait":
    signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM reached the program", flush=True), sys.exit(7)))
    print("waiting", flush=True)
    signal.pause()
'''


@pytest.fixture(scope="module")
def server() -> Iterator[processes.WarmServer]:
    made = processes.WarmServer()
    yield made
    made.stop()


def _env(folder: Path | None, server: str, **extra: str) -> dict[str, str]:
    """Traced into `folder`; untraced where it is None (as the test suite starts every Python process)."""
    path = os.pathsep.join([str(STARTUP), str(settings.REPO)])
    traced = {TRACE_DIR: str(folder)} if folder else {}
    return {"PYTHONPATH": path, **traced, WARM_SERVER: server, "DDP_LAB_COLOUR": "green", **extra}


def _run(tmp_path: Path, server: str, *args: str, traced: bool = True, **extra: str) -> processes.Result:
    """`python ARGS` in tmp_path/work, with `hello` on its stdin, warm from `server` ("off": cold)."""
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True, exist_ok=True)
    (work / "program.py").write_text(PROGRAM)
    (work / "pkg" / "mod.py").write_text(PROGRAM)
    (tmp_path / "traces").mkdir(exist_ok=True)
    env = processes.child_env(_env(tmp_path / "traces" if traced else None, server, **extra))
    proc = subprocess.Popen([processes.PYTHON, *args], cwd=work, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    started = time.monotonic()
    out, err = proc.communicate("hello", timeout=120)
    processes.kill_group(proc.pid)
    return processes.Result(proc.returncode, out, err, False, time.monotonic() - started, False)


@pytest.mark.launch
def test_a_warm_process_is_the_process_its_launcher_started(tmp_path: Path, server: processes.WarmServer) -> None:
    cases = [("program.py", "arg"), ("-m", "pkg.mod", "arg"), ("-u", "program.py", "raise"), ("program.py", "exit"),
             ("program.py", "kill"), ("-c", PROGRAM, "arg")]
    before = len(server.requests())
    for args in cases:
        warm, cold = _run(tmp_path, server.folder, *args), _run(tmp_path, "off", *args)
        assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr), args
        assert cold.stdout.startswith("{"), cold.stderr
    # an untraced process (the test suite's own launches) is the same process warm or cold too
    untraced = [("program.py", "arg"), ("-m", "pkg.mod", "exit")]
    for args in untraced:
        warm, cold = _run(tmp_path, server.folder, *args, traced=False), _run(tmp_path, "off", *args, traced=False)
        assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr), args
    raised = _run(tmp_path, server.folder, "program.py", "raise")
    line = PROGRAM.split("\n").index('    raise ValueError("the program\'s own error")') + 1
    assert raised.returncode == 1 and raised.stderr.endswith(  # as Python says it: no frame of the server's
        f'Traceback (most recent call last):\n  File "{tmp_path / "work" / "program.py"}", line {line}, in <module>\n'
        '    raise ValueError("the program\'s own error")\nValueError: the program\'s own error\n')
    said = json.loads(_run(tmp_path, server.folder, "program.py").stdout.splitlines()[0])
    assert said["stdin"] == "hello" and said["colour"] == "green"
    requests = server.requests()[before:]
    assert len(requests) == len(cases) + len(untraced) + 2 and not any(r["cold"] for r in requests), requests


@pytest.mark.launch
def test_a_variable_that_torch_reads_as_it_loads_makes_a_cold_start(tmp_path: Path, server: processes.WarmServer) -> None:
    result = _run(tmp_path, server.folder, "program.py", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", DDP_LAB_WARM_DEBUG="1")
    assert result.returncode == 0
    assert re.search(r"warm start: a cold start: \$(OMP|MKL)_NUM_THREADS differs", result.stderr), result.stderr
    assert json.loads(result.stdout.splitlines()[0])["torch_threads"] == 2
    # c10d's debug level is set from the environment as torch.distributed loads
    result = _run(tmp_path, server.folder, "program.py", TORCH_DISTRIBUTED_DEBUG="DETAIL", DDP_LAB_WARM_DEBUG="1")
    assert "warm start: a cold start: $TORCH_DISTRIBUTED_DEBUG differs" in result.stderr, result.stderr
    assert json.loads(result.stdout.splitlines()[0])["debug_level"] == "DebugLevel.DETAIL"


def _wait(condition: Any, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.launch
def test_a_signal_to_the_stand_in_reaches_the_program_and_its_death_ends_it(tmp_path: Path,
                                                                              server: processes.WarmServer) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "program.py").write_text(PROGRAM)
    (tmp_path / "traces").mkdir()
    env = _env(tmp_path / "traces", server.folder)
    proc = processes.start([processes.PYTHON, "program.py", "wait"], cwd=tmp_path / "work", env=env, merge_stderr=True)
    try:
        assert proc.stdout is not None
        while "waiting" not in proc.stdout.readline():
            pass
        groups = processes._warm_groups()
        (group,) = [g for g, mark in groups.items() if processes._marks[proc.pid] in mark.split(":")]
        assert processes.cpu_seconds([proc.pid]) >= 0 and processes._group_alive(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)  # as torchrun stops a worker
        assert "SIGTERM reached the program" in proc.stdout.read() and proc.wait(10) == 7
        _wait(lambda: not _alive(group), "the warm process outlived its stand-in")
    finally:
        processes.kill_group(proc.pid)
    proc = processes.start([processes.PYTHON, "program.py", "wait"], cwd=tmp_path / "work", env=env, merge_stderr=True)
    assert proc.stdout is not None
    while "waiting" not in proc.stdout.readline():
        pass
    (group,) = [g for g, mark in processes._warm_groups().items() if processes._marks[proc.pid] in mark.split(":")]
    os.kill(proc.pid, signal.SIGKILL)  # the stand-in alone: its warm process must not run on
    proc.wait(10)
    _wait(lambda: not _alive(group) and group not in processes._warm_groups(), "the warm process outlived its stand-in")


OWNER = r'''
import sys, time
from autograde.engine import processes
server = processes.WarmServer()
proc = processes.start([processes.PYTHON, "program.py", "wait"], cwd=sys.argv[1], env={**ENV, **server.environment()})
while "waiting" not in proc.stdout.readline():
    pass
print(server.proc.pid, *processes._warm_groups(), flush=True)
time.sleep(600)
'''


@pytest.mark.launch
def test_nothing_that_a_server_forked_outlives_its_owner(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "program.py").write_text(PROGRAM)
    (tmp_path / "traces").mkdir()
    env = {k: v for k, v in _env(tmp_path / "traces", "").items() if k != WARM_SERVER}
    owner = OWNER.replace("ENV", repr(env))
    proc = processes.start([processes.PYTHON, "-c", owner, str(tmp_path / "work")], env={WARM_SERVER: ""})
    try:
        assert proc.stdout is not None
        server_pid, group = map(int, proc.stdout.readline().split())
        os.kill(proc.pid, signal.SIGKILL)
        _wait(lambda: not _alive(server_pid) and not _alive(group), "the server or its process outlived the owner")
    finally:
        processes.kill_group(proc.pid)


KERNEL = r'''
import json, sys
from autograde.engine import processes
from autograde.jupyter import runtime  # as every notebook does: its launches start warm from here on

runtime.run([sys.executable, "-c", "print('a demo')"])
runtime.torchrun(sys.argv[1], nproc=2)
print(json.dumps(processes._shared[0].requests()))
'''
DEMO = ("import sys, pathlib, torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "pathlib.Path(sys.argv[0]).with_name(f'rank{dist.get_rank()}').touch()\n")


@pytest.mark.launch
def test_a_notebooks_own_launches_start_warm_where_its_environment_names_no_server(tmp_path: Path) -> None:
    """A notebook's kernel in the grading sandbox, or a learner's JupyterLab: no server in its environment
    (tests and checks have one): its demonstrations' processes, torchrun's agent and workers, start warm too."""
    (tmp_path / "demo.py").write_text(DEMO)
    env = {k: v for k, v in os.environ.items() if k != WARM_SERVER}  # as in the sandbox, whose kernel's is its own
    env["PYTHONPATH"] = str(settings.REPO)
    result = subprocess.run([processes.PYTHON, "-c", KERNEL, str(tmp_path / "demo.py")], env=env, timeout=240,
                            capture_output=True, text=True, start_new_session=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    lines = result.stdout.splitlines()
    assert "a demo" in lines and (tmp_path / "rank0").exists() and (tmp_path / "rank1").exists(), result.stdout[-2000:]
    requests = json.loads(lines[-1])
    assert len(requests) == 4 and all(r["cold"] is None for r in requests), requests  # -c, the agent, 2 workers
    assert any("demo.py" in " ".join(r["command"]) for r in requests), requests


# --- The same traces, cold and warm ----------------------------------------------------------------

def _normal(value: Any, ids: dict[int, int], root: str) -> Any:
    """An event's value with what differs from run to run by nature made alike: times, pids, object
    ids (numbered in the order they appear), temporary folders, and the numbers a run computes."""
    if isinstance(value, dict):
        return {k: ("<id>" if k == "sha1" else _id(v, ids) if k in ("dataset", "sampler", "loader") else _normal(v, ids, root))
                for k, v in value.items() if k not in ("t", "pid")}
    if isinstance(value, list):
        return [_normal(v, ids, root) for v in value]
    if isinstance(value, float):
        return "<number>"
    if isinstance(value, str):
        return re.sub(r"\d+(\.\d+)?", "#", value.replace(root, "<root>"))
    return value


def _id(value: Any, ids: dict[int, int]) -> Any:
    return ids.setdefault(value, len(ids)) if isinstance(value, int) else value


def _traces(ws: Workspace, name: str) -> list[list[Any]]:
    run = getattr(lab_runs, name)(ws)
    assert run.ok, run.output[-3000:]
    found = []
    for trace in run.traces.values():
        ids: dict[int, int] = {}
        found.append([_normal(e, ids, str(ws.root)) for e in trace.events])
    return sorted(found, key=json.dumps)


def _both_ways(script: Path, runs: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
               server: processes.WarmServer) -> dict[str, tuple[list[Any], list[Any]]]:
    found: dict[str, list[list[list[Any]]]] = {name: [] for name in runs}
    for warm in (server.folder, "off"):
        monkeypatch.setenv(WARM_SERVER, warm)
        monkeypatch.setenv(WARM_SPAWN, "1" if warm != "off" else "0")  # cold: mp.spawn's processes too
        with Workspace(script) as ws:
            for name in runs:
                found[name].append(_traces(ws, name))
    return {name: (warm_traces, cold_traces) for name, (warm_traces, cold_traces) in found.items()}


@pytest.mark.launch
@pytest.mark.parametrize("script, runs", [(settings.SOLUTION, ("setup", "workers", "program")),
                                          (STYLES / "data_before_spawn.py", ("program",)),
                                          (STYLES / "trainer_class.py", ("program",))],
                         ids=["solution", "data_before_spawn", "trainer_class"])
def test_warm_and_cold_runs_trace_the_same_events(script: Path, runs: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
                                                   server: processes.WarmServer) -> None:
    before = len(server.requests())
    for name, (warm, cold) in _both_ways(script, runs, monkeypatch, server).items():
        assert len(warm) == len(cold), f"the {name} run: {len(warm)} processes warm, {len(cold)} cold"
        for w, c in zip(warm, cold):
            assert [e.get("ev") for e in w] == [e.get("ev") for e in c], name
            assert w == c, name
    requests = server.requests()[before:]
    assert requests and not any(r["cold"] for r in requests), [r for r in requests if r["cold"]]
