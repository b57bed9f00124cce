"""Shared set-up: small stand-in data, launching the lab's scripts the way a learner does, and the
`launch` mark's guard: a test that starts a process must say so (`@pytest.mark.launch`), so that
`make test-fast` (pytest -m "not launch") holds only tests that start none."""
from __future__ import annotations

import _posixsubprocess
import collections
import contextlib
import importlib.util
import multiprocessing.process
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Generator, Iterator, Mapping, NoReturn, Sequence

import pytest
import torch
import torch.nn.functional as F
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autograde import data
from autograde import protocol as formats
from autograde.engine import processes
from autograde.settings import CAPSTONE_RULES, CAPSTONE_SPEEDUPS, STARTUP, WARM_SERVER

SOLUTIONS = ROOT / "solutions"
STARTER = ROOT / "fashion_mnist.py"
SOLUTION = SOLUTIONS / "fashion_mnist_after_step_10.py"  # the finished lab
PROBE = Path(__file__).resolve().parent / "probe"
TRAIN_SIZE, VAL_SIZE = 640, 301  # 301: two processes' validation shards need the sampler's padding
# Small and quick: the narrow model, one thread per process, big enough batches.
QUICK = ["--widen-factor", "1", "--batch-size", "64", "--epochs", "1"]
# The capstone's reduced rules (a lower target, one seed): its runs take seconds, here and in the recordings
os.environ[CAPSTONE_RULES] = "reduced"
# The class's speedups are measured on a quiet node; here the grading of the capstone times its runs beside
# other tests on two loaded cores, where any ratio may sag: low ones, so that a solved capstone gets every
# point. tests/parts/capstone/test_speedups.py holds the thresholds to recorded times.
os.environ[CAPSTONE_SPEEDUPS] = "0.3,0.5"


# --- Two lanes -----------------------------------------------------------------------------------
# `make test` runs the suite in two lanes (pytest-xdist, `-n 2`, with the scheduler below): one test waiting on a
# hub, a SLURM time limit or a hang's timeout leaves a core to the other lane. A test file is a lane's
# unit of work, whole (its module fixtures are made once: test_course.py grades the later parts once);
# the files that change or count what the whole machine shares (the hub's users, modes and sudo rule,
# the course's SLURM cluster, the notebooks that bring it up) are one unit, one test after another as
# they would run alone. The longest units go first: the machine's (which mostly waits), then the
# later parts' grading (which computes); the other files fill in around them.
MACHINE_WIDE = ("course/test_class_hub.py", "course/test_class_faults.py", "course/test_class_load.py",
                "course/test_withheld_users.py", "course/test_withheld.py", "core/test_slurm_cluster.py",
                "parts/launching/test_slurm_demos.py", "parts/launching/test_slurm_env.py",
                "parts/launching/test_slurm_job.py", "parts/launching/test_slurm_signal.py",
                "notebooks/test_notebooks.py", "notebooks/test_browser.py")
FIRST = ("machine", "course/test_course.py")
_IN_A_LANE = os.environ.get("PYTEST_XDIST_WORKER") is not None
if _IN_A_LANE:  # every process a lane launches carries the lane's mark first (each launch adds its own)
    os.environ[processes.MARK] = ":".join(filter(None, [os.environ.get(processes.MARK),
                                                        f"lane-{os.environ['PYTEST_XDIST_WORKER']}-{os.getpid()}"]))


def launched_here(mark: str | None) -> bool:
    """Whether a process with this launch mark (processes._processes()) was launched by this session,
    in lanes by this lane: a test that looks for its leftovers must not count the other lane's runs."""
    own = os.environ.get(processes.MARK)
    if not mark or mark == own:
        return False
    return own is None or mark.startswith(own + ":")


def left_running(*names: str, deadline: float = 30.0) -> list[int]:
    """Live processes this session launched (in lanes, this lane) whose command line holds one of `names`,
    once they have had up to `deadline` seconds to end: a test's own leftovers, never another test's (a loaded
    machine can take a while to reap what a launch killed)."""
    wanted = [name.encode() for name in names]
    give_up = time.monotonic() + deadline
    while True:
        left = [pid for state, _, _, pid, mark in processes._processes()
                if state != "Z" and launched_here(mark) and any(name in _cmdline(pid) for name in wanted)]
        if not left or time.monotonic() > give_up:
            return left
        time.sleep(0.2)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone while we looked


def _lanes(config: pytest.Config) -> bool:
    """True in the main process of a run in lanes (the one that starts them and reports)."""
    return bool(getattr(config.option, "numprocesses", None)) and not _IN_A_LANE


def _unit(nodeid: str) -> str:
    """The lane's unit of work the test `nodeid` (or its file, from the repository's root) belongs to."""
    path = nodeid.split("::")[0].removeprefix("tests/")
    return "machine" if path in MACHINE_WIDE else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: the main process's scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):  # type: ignore[misc]
        """Each unit (`_unit`) whole to one lane, in the order collected; a lane takes the next unit when
        it has two tests or fewer left."""
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return Units(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _IN_A_LANE:  # the lanes collect, the main process schedules in their order: the units of FIRST first
        first = {unit: n for n, unit in enumerate(FIRST)}
        items.sort(key=lambda item: first.get(_unit(item.nodeid), len(FIRST)))  # stable


# --- The launch mark, enforced ---------------------------------------------------------------------
# Every way a test could start a process, each replaced, in a test not marked `launch`, by a refusal:
# subprocess (and os.popen, asyncio's subprocesses) through Popen; multiprocessing's processes, whatever
# their start method; fork and its relatives (os.spawn*, pty.fork); posix_spawn; os.system; and the
# fork-exec that subprocess and multiprocessing's spawn share underneath.
LAUNCHERS: tuple[tuple[Any, str, str], ...] = (
    (subprocess.Popen, "__init__", "subprocess.Popen"),
    (multiprocessing.process.BaseProcess, "start", "multiprocessing's Process.start"),
    (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec"),
    *((os, name, f"os.{name}") for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
      if hasattr(os, name)),
)


class LaunchInUnmarkedTest(RuntimeError):
    """A test not marked `launch` tried to start a process."""


@contextlib.contextmanager
def launches_refused(item: pytest.Item) -> Iterator[list[str]]:
    """While a phase of `item` runs: if it is not marked `launch`, every launcher refuses, and what
    was tried is listed (the test may catch the refusal; the list still tells)."""
    tried: list[str] = []
    if item.get_closest_marker("launch") is not None:
        yield tried
        return

    def refusal(what: str) -> Callable[..., NoReturn]:
        def refuse(*args: Any, **kwargs: Any) -> NoReturn:
            tried.append(what)
            raise LaunchInUnmarkedTest(f"{item.nodeid} started a process ({what}) but is not marked "
                                       "@pytest.mark.launch: mark it, so that `make test-fast` leaves it out")
        return refuse

    with pytest.MonkeyPatch.context() as patch:
        for owner, name, what in LAUNCHERS:
            patch.setattr(owner, name, refusal(what))
        yield tried


def _guarded_phase(item: pytest.Item) -> Generator[None, None, None]:
    """One phase of a test (its fixtures' set-up, the test, their tear-down, wider-scoped fixtures'
    included), under the guard; a launch it tried fails that phase even if the test caught the refusal."""
    with launches_refused(item) as tried:
        yield
    if tried:
        pytest.fail(f"{item.nodeid} tried to start processes ({', '.join(sorted(set(tried)))}) but is not marked "
                    "@pytest.mark.launch", pytrace=False)


# The guard wraps each phase's hook rather than living in an autouse fixture: a module- or session-scoped
# fixture is set up before any function-scoped one, and a launch of its counts too.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded_phase(item))


@pytest.fixture(scope="session", autouse=True)
def fresh_verdicts(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Check verdicts are cached on disk (autograde/grading/cache.py): every test session starts empty,
    so that no verdict comes from an earlier session's runs."""
    os.environ["DDP_LAB_CACHE_DIR"] = str(tmp_path_factory.mktemp("verdicts"))


def _opened_for_the_grader() -> list[tuple[Path, int]]:
    """Grading runs each submission as ddp-lab-grader in bubblewrap (autograde/course/sandbox.py), which
    must reach the course and its Python: the folders on the way that are closed to other users (here
    /root, where pyenv keeps Python) are opened (o+x). Each with the mode it had, to close it again."""
    import stat

    from autograde.course.hub.settings import closed_folders

    opened: list[tuple[Path, int]] = []
    if os.geteuid() == 0:
        for path in (ROOT / "autograde", Path(sys.executable).resolve(), Path(sys.base_prefix)):
            for folder in closed_folders(path):
                opened.append((folder, stat.S_IMODE(folder.stat().st_mode)))
                folder.chmod(stat.S_IMODE(folder.stat().st_mode) | 0o001)
    return opened


def _close(opened: list[tuple[Path, int]]) -> None:
    for folder, mode in reversed(opened):
        folder.chmod(mode)


@pytest.fixture(scope="session")
def grading_sandbox() -> Iterator[None]:
    """The folders the grader must reach, open for the session (in lanes, the main process holds
    them open until both lanes are done: one lane must not close them under the other's grading).
    Skips, saying why, where the sandbox cannot be made (not root and no sudo rule, no bubblewrap)."""
    from autograde.course import sandbox

    opened = [] if _IN_A_LANE else _opened_for_the_grader()
    try:
        try:
            sandbox.ready()
        except sandbox.SandboxError as err:
            pytest.skip(f"no grading sandbox here: {err}")
        yield
    finally:
        _close(opened)


def snapshot(step: int) -> Path:
    return SOLUTIONS / f"fashion_mnist_after_step_{step}.py"


def recorded_trace(*events: dict, pid: int = 1) -> formats.ProcessTrace:
    """A process's trace made by hand, events timed 0, 1, 2, ...: checks' logic without a launch."""
    return formats.ProcessTrace(pid, [{"t": k, **e} for k, e in enumerate(events)])


@pytest.fixture(scope="session")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic stand-in in Fashion-MNIST's format (clearly not the real data set)."""
    root = tmp_path_factory.mktemp("stand_in")
    data.write_synthetic(root, TRAIN_SIZE, VAL_SIZE, seed=3)
    return root


@pytest.fixture
def probe(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """The test module's PROBE (a launcher's $TRAIN_SCRIPT that writes down what each process was
    given) as a file, with an empty folder `out` beside it for what it writes."""
    (tmp_path / "out").mkdir()
    path = tmp_path / "probe.py"
    path.write_text(request.module.PROBE)
    return path


def probe_env(probe_dir: Path, **extra: str) -> dict[str, str]:
    """Environment that loads tests/probe/sitecustomize.py into every launched process."""
    return {"PYTHONPATH": str(PROBE), "DDP_LAB_PROBE_DIR": str(probe_dir), **extra}


def load_module(path: Path) -> ModuleType:
    """The lab script as a module (its main() is not run), to build its model in a test."""
    spec = importlib.util.spec_from_file_location(f"lab_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_metrics(script: Path, weights: dict[str, torch.Tensor], root: Path,
                      widen_factor: int = 1) -> tuple[float, float]:
    """Validation loss and accuracy of `weights` over the whole validation set, in one process."""
    model = load_module(script).WideResNet(widen_factor)
    model.load_state_dict(weights)
    model.eval()
    val_set = FashionMNIST(str(root), train=False, transform=ToTensor())
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(val_set, batch_size=100):
            outputs = model(images)
            loss_sum += F.cross_entropy(outputs, labels, reduction="sum").item()
            correct += int((outputs.argmax(1) == labels).sum())
    return loss_sum / len(val_set), correct / len(val_set)


def run_python(script: str | Path, *args: str | Path, timeout: float, cwd: str | Path | None = None,
               env: Mapping[str, str] | None = None) -> processes.Result:
    """Run a Python script with this interpreter, as `processes.run` runs any command."""
    return processes.run([processes.PYTHON, script, *args], timeout=timeout, cwd=cwd, env=env)


def run_script(script: str | Path, *args: str | Path, timeout: float, env: dict[str, str] | None = None,
               records: Sequence[Path] = ()) -> processes.Result:
    """Launch one of the course's multi-process scripts, as `run_python` does, made once more on a
    fault of gloo's (`again_on_gloo_fault`)."""
    return again_on_gloo_fault(lambda: run_python(script, *args, timeout=timeout, env=env), records)


def again_on_gloo_fault(run: Callable[[], processes.Result], records: Sequence[Path] = ()) -> processes.Result:
    """`run()`, and once more if, and only if, gloo itself made it fail (`processes.gloo_fault`: a
    process aborted as it left, a connection lost as the processes met): the script's doing is
    judged by what its run printed, which such a failure takes away. Any other failure stands.
    (The notebooks' `runtime.run` does the same, and the checker for learners' runs.) `records`:
    folders the run's processes write into, emptied before it is made again."""
    result = run()
    if result.returncode != 0 and processes.gloo_fault(result.output):
        for folder in records:
            for path in folder.iterdir():
                path.unlink()
        result = run()
    return result


def assert_clean_error(result: processes.Result, *words: str) -> None:
    """A non-zero exit with one error line that mentions `words`, no traceback, nothing left running."""
    assert not result.timed_out, f"hung instead of failing:\n{result.output}"
    assert result.returncode != 0, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.output
    for word in words:
        assert word in errors[0], errors[0]
    assert not result.leftover, "processes were left running"


# --- A real SLURM -------------------------------------------------------------------------------------

class Slurm:
    """A SLURM for the session's tests: the system's where sbatch has one, else the course's cluster
    (autograde/cluster/slurm.py, 2 emulated nodes n1 and n2), reused where it is already up
    and otherwise brought up on first use (again after a test brought it down). `env` is what
    sbatch, srun and the course's `job` runner need to reach it."""

    def __init__(self) -> None:
        self.started = False

    @property
    def env(self) -> dict[str, str]:
        from autograde.cluster import slurm as slurm_cluster

        if slurm_cluster.system_slurm():
            return {}
        found = slurm_cluster.running()
        if found is None:
            try:
                found = slurm_cluster.up()
            except slurm_cluster.ClusterError as err:
                pytest.skip(f"no SLURM here: {err}")
            self.started = True
        return {"SLURM_CONF": str(found.conf)}

    def job(self, *args: str | Path, env: Mapping[str, str] | None = None, timeout: float = 120,
            cwd: Path = ROOT) -> processes.Result:
        """`sbatch ARGS` to the end of its job (the course's `job` runner): the job's output, its exit status."""
        return processes.run([processes.PYTHON, "-m", "autograde.cluster.slurm", "job", *args],
                             timeout=timeout, cwd=cwd, env={**self.env, **(env or {})})


_SLURM = Slurm()


@pytest.fixture(scope="session")
def slurm() -> Slurm:
    """The session's SLURM (see `Slurm`); a test that uses it skips, with the reason, where there
    can be none (not root, SLURM not installable): the only reason a SLURM test may skip."""
    return _SLURM


def _course_cluster_running() -> bool:
    from autograde.cluster import slurm as slurm_cluster

    return slurm_cluster.running() is not None


_CLUSTER_BEFORE = _course_cluster_running()  # one of the developer's own (make slurm-up) is left running


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A course cluster that came up during the session is taken down at its end (outside any test,
    whose `launch` guard would refuse the commands that stop it), leaving no daemon behind: the one
    the tests brought up, or one a notebook or a check brought up and, failing, left running. In lanes,
    a lane takes down only the one it brought up; the main process, once both are done, any other."""
    if _SLURM.started or (not _IN_A_LANE and not _CLUSTER_BEFORE and _course_cluster_running()):
        from autograde.cluster import slurm as slurm_cluster

        slurm_cluster.down()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's warm-start server stops after the summary (which counts its warm starts), and the
    folders opened for the lanes' grading close again."""
    for server in _WARM:
        server.stop()
    _close(_OPENED)


# --- The suite's cost, in imports of torch -----------------------------------------------------
# Machines differ (CI's may import torch in 1.3 s or in 3.5 s): the suite's time means something only
# against one import of torch measured in the same session. A session that launches processes measures
# it once collected, and ends with its wall time in that unit and each test file's share.
_COST: dict[str, float] = {}


_WARM: list[processes.WarmServer] = []


_OPENED: list[tuple[Path, int]] = []


def _measure_and_warm() -> None:
    """The unit of the suite's cost, measured here, then one warm-start server for the whole run (the
    lanes' too: they inherit its address): the course's start-up on every launch's path, traced or not,
    so that every Python process starts warm; one thread per launched process, whether a test's launch
    goes through processes.child_env or not (which also lets the server serve them: it loaded torch
    with these)."""
    _COST["torch_import"] = processes.torch_import_seconds()
    _COST["start"] = time.monotonic()
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if os.environ.get(WARM_SERVER) is None:
        _WARM.append(processes.WarmServer())
        os.environ.update(_WARM[0].environment())
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STARTUP), os.environ.get("PYTHONPATH")]))


def pytest_configure(config: pytest.Config) -> None:
    """In lanes, the main process does before they start what a session does once collected."""
    if _lanes(config) and not config.option.collectonly:
        config.option.loadscopereorder = False  # the units in FIRST's order, not by their number of tests
        _measure_and_warm()
        _OPENED.extend(_opened_for_the_grader())


def pytest_collection_finish(session: pytest.Session) -> None:
    if _IN_A_LANE or _lanes(session.config) or session.config.option.collectonly:
        return
    if any(item.get_closest_marker("launch") for item in session.items):
        _measure_and_warm()


def _warm_starts() -> str:
    """How many of the session's Python processes started warm, and why the others did not."""
    lines = _WARM[0].requests() if _WARM else []
    reasons = collections.Counter(line["cold"] for line in lines if line["cold"])
    said = "; ".join(f"{n} for {why}" for why, n in reasons.most_common(5))
    return f"{len(lines) - sum(reasons.values())} of {len(lines)} Python processes started warm" + \
        (f" (cold: {said})" if said else "")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if "start" not in _COST:
        return
    unit, wall = _COST["torch_import"], time.monotonic() - _COST["start"]
    by_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                path = report.nodeid.split("::")[0]
                by_file[path] = by_file.get(path, 0.0) + report.duration
    write = terminalreporter.write_line
    terminalreporter.section("cost in imports of torch")
    for path, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:20]:
        write(f"{seconds:8.1f} s {seconds / unit:7.0f} imports  {path}")
    lanes = getattr(config.option, "numprocesses", None)
    write(f"the session: {wall / 60:.1f} min of tests = {wall / unit:.0f} imports of torch "
          f"(one import took {unit:.2f} s here, measured at the start)"
          + (f"; in {lanes} lanes, a file's seconds above are those of the lane that ran it" if lanes else ""))
    write(_warm_starts())
