"""Run a learner's script (or any command) as a separate process group, with a time limit.

Everything the lab launches goes through here, so that every launch gets the same
treatment: one thread per process (several processes on a few cores otherwise fight over
them), unbuffered output, a wall-clock limit, and afterwards no process of the group left
alive, whether the command finished, crashed or hung.

A launch's processes are its process group and every process that carries its mark (MARK in
the environment, which children inherit): torchrun starts each worker in a session of its own,
outside the group, and a worker whose torchrun was killed would otherwise run on. A process forked
warm (`WarmServer`; autograde/inprocess/warm_start.py) leads a group that its server
registers under the mark of the process that asked for it.
"""
from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from autograde.protocol import free_port  # noqa: F401 (the launchers' ports)
from autograde.settings import LAUNCH_MARK, STARTUP, WARM_GROUPS, WARM_LOG, WARM_SERVER, WARM_SOCKET

PYTHON = sys.executable
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MARK = LAUNCH_MARK  # in the environment of every process a launch starts, and of their children
_marks: dict[int, str] = {}  # process group (the launched command's pid) -> its mark
# Failures of gloo itself, not of the script that ran, and each a run worth making once more:
# - as a process leaves, its work done and its process group destroyed, a C++ thread still joinable
#   calls std::terminate (pytorch/pytorch#190489 and #179291). Once in a CI run of the suite, never in
#   115 runs of big_batch_equivalence.py here, 75 of them 3 at a time;
# - as a group starts, gloo's handshake between two of its processes finds the connection closed
#   (connectFullMesh; its cause not found here: gloo mended races at this stage in pytorch/gloo#429
#   and #503). Once in a CI run of the suite (notebook 10's collectives on 4 processes), never in
#   300 such runs here, 2 at a time.
TEARDOWN_ABORT = "terminate called without an active exception"
MESH_FAILURE = re.compile(r"connectFullMesh failed with .*Connection (closed|reset) by peer")
GLOO_FAULTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(re.escape(TEARDOWN_ABORT)), "gloo aborted a process as it left (pytorch/pytorch#190489)"),
    (MESH_FAILURE, "gloo lost a connection while its processes met (connectFullMesh)"),
)


def gloo_fault(output: str) -> str | None:
    """What in a failed command's `output` shows that gloo itself made it fail (GLOO_FAULTS), if
    anything does: nothing the script did, and a run worth making once more. None for any other
    failure, which is the script's."""
    return next((why for pattern, why in GLOO_FAULTS if pattern.search(output)), None)


@dataclass
class Result:
    """What a launched command did."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    leftover: bool  # processes of its group were still alive after it exited (now killed)

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def last_line(self) -> str:
        """The last line it printed that is not blank, for a one-line message."""
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1].strip() if lines else "(no output)"


def gpu_count() -> int:
    """GPUs that PyTorch can use here. Without GPU device files there are none, and the answer
    comes without importing torch (seconds, in every notebook kernel that checks a step)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "" or not (glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd")):
        return 0
    import torch  # only for the device: the checker never imports the learner's script

    return torch.cuda.device_count()


_launch_warm = False  # warm_launches(): every command this process starts asks for warm starts


def warm_launches() -> None:
    """From now on the Python processes of every command this process starts are forked warm, its
    demonstrations' as its checks' (a notebook's kernel: autograde/jupyter/runtime.py calls this)."""
    global _launch_warm
    _launch_warm = True


def child_env(extra: Mapping[str, str] | None = None, warm: bool = True) -> dict[str, str]:
    """This process's environment, set up for launching training processes on few cores (and, after
    warm_launches() and unless `warm` is False, for their Python processes to start warm)."""
    warm = warm and _launch_warm and os.environ.get(WARM_SERVER) is None  # a test run's server serves it already
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # tools started by name (nbgrader's alembic, Jupyter kernels) come from this interpreter's environment
    env["PATH"] = os.pathsep.join([str(Path(PYTHON).parent), os.environ.get("PATH", "")])
    if warm:
        env.update(warm_environment())
    env.update(extra or {})
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if warm and str(STARTUP) not in path:  # the start-up code that asks the server, last: a command's own
        env["PYTHONPATH"] = os.pathsep.join([*path, str(STARTUP)])  # sitecustomize, earlier on its path, wins
    return env


def start(cmd: Sequence[str | Path], *, cwd: str | Path | None = None,
          env: Mapping[str, str] | None = None, merge_stderr: bool = False) -> subprocess.Popen[str]:
    """Start `cmd` in a new session (its own process group), output captured as text (stderr
    into stdout with `merge_stderr`, for output read line by line as it comes).

    The command gets Ctrl-C's default disposition whatever this process inherited: started from
    a background job (`nohup make test &`), SIGINT would be ignored, and Python would then never
    raise KeyboardInterrupt in the script."""
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=_marked(child_env(env), mark), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            start_new_session=True, preexec_fn=_default_sigint)
    _marks[proc.pid] = mark
    return proc


def _marked(env: dict[str, str], mark: str) -> dict[str, str]:
    """`env` with `mark` added to the marks it inherited (a launch inside a launch carries both)."""
    return {**env, MARK: ":".join(filter(None, [env.get(MARK), mark]))}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _warm_groups() -> dict[int, str]:
    """The groups of the processes forked warm by the servers this process knows (its own, and the
    one its environment names), each with its launch's mark."""
    found = {}
    for folder in {*_servers, os.environ.get(WARM_SERVER, "")} - {""}:
        found.update(_registered(folder))
    return found


def _registered(folder: str) -> dict[int, str]:
    """The groups one server has registered, each with its launch's mark."""
    found = {}
    for path in Path(folder, WARM_GROUPS).glob("[0-9]*"):
        try:
            found[int(path.name)] = path.read_text()
        except (OSError, ValueError):
            continue  # its group ended while we looked
    return found


def _processes() -> list[tuple[str, int, float, int, str | None]]:
    """(state, process group, CPU seconds used, pid, launch mark) of every process, from /proc (Linux only).
    A process forked warm has its server's environment in /proc: its mark is its group's registration."""
    warm = _warm_groups()
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            environ = (stat.parent / "environ").read_bytes()
        except (OSError, IndexError):
            continue  # the process went away while we looked (or is not ours to read)
        mark = next((v.decode()[len(MARK) + 1:] for v in environ.split(b"\0") if v.startswith(MARK.encode() + b"=")), None)
        group = int(fields[2])
        found.append((fields[0], group, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
                      int(stat.parent.name), warm.get(group, mark)))
    return found


def _ours(pgid: int, group: int, mark: str | None) -> bool:
    """Whether a process belongs to the launch whose group is `pgid`: in the group, or marked by it."""
    return group == pgid or (mark is not None and _marks.get(pgid) in mark.split(":"))


def _group_alive(pgid: int) -> bool:
    """True while a process of the launch is still running (exited, unreaped zombies do not count)."""
    if not Path("/proc").is_dir():  # not Linux: ask the kernel whether the group exists at all
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return any(_ours(pgid, group, mark) and state != "Z" for state, group, _, _, mark in _processes())


def cpu_seconds(pgids: Sequence[int]) -> float:
    """CPU time used so far by the live processes of these groups (0 where /proc is missing).

    Busy processes are working, even when they say nothing: starting Python and importing
    torch takes seconds of CPU, more on a loaded machine. Processes stuck in a collective
    wait for the network and use next to none.
    """
    if not Path("/proc").is_dir():
        return 0.0
    return sum(cpu for _, group, cpu, _, mark in _processes() if any(_ours(p, group, mark) for p in pgids))


def signal_launch(pgid: int, signum: int) -> None:
    """Send `signum` to every process of the launch: its group, and the processes that carry its
    mark (torchrun's workers, SLURM's tasks: in sessions of their own). Gone already is fine."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    if pgid in _marks and Path("/proc").is_dir():
        for _, group, _, pid, mark in _processes():
            if _ours(pgid, group, mark) and pid != os.getpid():
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the launch (`signal_launch`)."""
    signal_launch(pgid, signal.SIGKILL)


def finish(proc: subprocess.Popen[str], timeout: float, started: float | None = None) -> Result:
    """Wait for a started command up to `timeout` seconds, then kill whatever is left of its group."""
    started = time.monotonic() if started is None else started
    pgid = proc.pid  # start_new_session makes the child the leader of its own group
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=max(0.0, timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(pgid)
        stdout, stderr = proc.communicate()
    seconds = time.monotonic() - started
    leftover = False
    if not timed_out:
        deadline = time.monotonic() + 1.0  # processes that are exiting get a moment to do so
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        leftover = _group_alive(pgid)
    kill_group(pgid)
    return Result(proc.returncode, stdout, stderr, timed_out, seconds, leftover)


def run(cmd: Sequence[str | Path], *, timeout: float, cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None) -> Result:
    """Run `cmd` to the end or to `timeout` seconds, whichever comes first."""
    started = time.monotonic()
    return finish(start(cmd, cwd=cwd, env=env), timeout, started)


def torch_import_seconds() -> float:
    """One import of torch in a new interpreter, the median of three: the unit in which the course
    states what its checks and its test suite cost, whatever the machine (`make bench`, `make test`)."""
    cold = {WARM_SERVER: "off"}  # whatever server this process's launches use
    return sorted(run([PYTHON, "-c", "import torch"], timeout=120, env=cold).seconds for _ in range(3))[1]


def run_in_terminal(cmd: Sequence[str | Path], *, cwd: str | Path | None = None,
                    env: Mapping[str, str] | None = None) -> int:
    """Run `cmd` with its output on this terminal (`make run`), to its end or to Ctrl-C (130).
    There is no time limit: the person who started it watches it; either way, nothing of its
    process group is left running afterwards."""
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=_marked(child_env(env), mark), stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_default_sigint)
    _marks[proc.pid] = mark
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        kill_group(proc.pid)


_servers: list[str] = []  # the folders of the warm-start servers this process started and runs


class WarmServer:
    """A warm-start server (autograde/inprocess/warm_start.py), owned by this process: it
    stops when `stop` is called or this process dies, and nothing it forked outlives it. Every
    Python process whose environment carries `environment()` and whose path holds the course's
    start-up folder (protocol.STARTUP) asks to be forked from it."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        import tempfile

        from autograde import settings

        self.folder = tempfile.mkdtemp(prefix="ddp-lab-warm-")
        server_env = {k: v for k, v in child_env(env, warm=False).items() if k not in (MARK, WARM_SERVER)}
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(STARTUP)]
        server_env["PYTHONPATH"] = os.pathsep.join([str(settings.REPO), *inherited])  # the server itself starts as it is
        self.proc = subprocess.Popen([PYTHON, "-m", settings.module_of(settings.WARM_START), self.folder, str(os.getpid())],
                                     env=server_env, stdin=subprocess.DEVNULL, start_new_session=True)
        _servers.append(self.folder)
        deadline = time.monotonic() + 30  # it listens at once, and answers once it has imported torch
        while not Path(self.folder, WARM_SOCKET).exists() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def environment(self) -> dict[str, str]:
        return {WARM_SERVER: self.folder}

    def requests(self) -> list[dict[str, Any]]:
        """Every request the server answered, in order: {"cold": why it said no, or None; "command": ...}."""
        import json

        log = Path(self.folder, WARM_LOG)
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def stop(self) -> None:
        """Stop the server: every process it forked is killed, and its folder removed."""
        import shutil

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid)
                self.proc.wait()
        for pgid in _registered(self.folder):
            kill_group(pgid)
        if self.folder in _servers:
            _servers.remove(self.folder)
        shutil.rmtree(self.folder, ignore_errors=True)


_shared: list[WarmServer] = []


# The server keeps the descriptors a process hands it at 1024 and up (warm_start_server.py's _dup_high),
# which fails (EINVAL) where the limit on open files is 1024: a login's or a systemd service's default.
WARM_FD_ROOM = 4096


def room_for_warm_start() -> bool:
    """Whether this process's limit on open files, raised towards WARM_FD_ROOM where its hard limit
    lets it (children, the server among them, inherit it), leaves the server room above 1024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= WARM_FD_ROOM:
        return True
    raised = WARM_FD_ROOM if hard == resource.RLIM_INFINITY else min(hard, WARM_FD_ROOM)
    if raised > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    return raised >= 2048


def warm_environment() -> dict[str, str]:
    """What a launch's environment needs for its Python processes to start warm: nothing where this
    process's own environment names a server (a test run's, or "off": every process cold), else this
    process's shared server, started on first use (it stops after 10 idle minutes, or with this process).
    Every process cold where the limit on open files leaves the server no room (room_for_warm_start)."""
    if os.environ.get(WARM_SERVER) is not None:
        return {}
    if not room_for_warm_start():
        return {WARM_SERVER: "off"}
    if not _shared or not _shared[0].running:
        _shared[:] = [WarmServer()]
    return _shared[0].environment()

