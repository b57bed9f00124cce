"""Hostile submissions, graded for real: each learner hands in, through nbgrader's real exchange, a
fashion_mnist.py (and a notebook) that tries what grading must not allow, and the instructor
grades the class with the course's command (`python -m autograde.course grade`, here only the
notebook of Steps 0-2, whose checks run the script). Every submission's code runs as ddp-lab-grader
in its sandbox (autograde/course/sandbox.py). What each tries, and what must happen:

- most hostile files are the learner's honest Step 2 with the attack at the top: when the attack is
  contained the script goes on and earns what the honest file earns (3 points: Steps 0-2); where the
  attack succeeds, it exits at once, and the score shows it. The attacks that go on when contained
  (reads, writes, a connection out, a daemon) are made by one learner, one after the other: seven
  learners graded at once on two cores are load enough;
- the faker prints a fake verdict, forges the checker's verdict files, and edits its notebook's
  grade cells and points: it earns what its file earns;
- the attacks that cannot go on (a fork bomb, endless memory, sleeping forever, filling the disk) are
  stopped by the sandbox's limits and named in the summary; they earn what their file did;
- the honest learner's score is the same as everyone else's honest score, and after grading no
  process of the grader is left, no file appeared outside the sandbox, the gradebook holds only
  what grading wrote, the exchange and the other learners' files are unchanged, nothing connected
  to the test's listener.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from classhub import _processes_under
from conftest import ROOT, snapshot

from autograde.course import assignment, grading, sandbox
from autograde.engine import processes
from autograde.grading import registry

pytestmark = [pytest.mark.launch, pytest.mark.timeout(1500)]

NOTEBOOK = "03_steps_0_to_2"  # Steps 0-2, 3 points: its checks read the script and run its start-up code
HONEST = snapshot(2).read_text()
# the sandbox's limits, small: a runaway ends within two minutes and takes at most one core
LIMITS = {"seconds": 120, "memory": 1536 * 2**20, "cpus": 1.0, "processes": 256, "file_size": 64 * 2**20,
          "disk": 128 * 2**20}
CONTAINED = ("reads", "writes", "network", "daemon")  # one learner tries them all, in this order
PLANTED = b"score = 100"  # what the writer appends wherever it can
LEAK = Path("/tmp/ddp-lab-hostile-leak")  # where an attack that got out would write


def with_attack(attack: str) -> str:
    """The honest Step 2 file with `attack` run first, at its top (after the docstring)."""
    doc_end = HONEST.index('"""\n', 3) + 4  # the module's docstring ends here
    return HONEST[:doc_end] + attack.strip() + "\n" + HONEST[doc_end:]


def attacks(course: Path, exchange: Path, port: int) -> dict[str, str]:
    secrets = [str(course / "gradebook.db"), str(course / "source" / registry.FIRST / f"{NOTEBOOK}.ipynb"),
               str(course / "submitted" / "honest" / registry.FIRST / "fashion_mnist.py"),
               str(exchange / assignment.COURSE_ID / "inbound"), "/etc/shadow", str(ROOT / "solutions" / "lars.py"),
               str(ROOT / "tests" / "mistakes.py")]
    writable = [str(p) for p in planted_targets(course, exchange)]
    return {
        "reads": f"""
import os as _os
for _path in {secrets!r}:
    try:
        if _os.path.isdir(_path):
            _os.listdir(_path)
        elif open(_path, "rb").read({len(PLANTED)}) == {PLANTED!r}:
            continue  # made in this sandbox by the write attack, on an earlier run of the file
    except OSError:
        continue
    raise SystemExit(f"read {{_path}}")  # never reached in the sandbox
""",
        "writes": f"""
for _path in {writable!r} + [{str(LEAK)!r}]:
    try:
        with open(_path, "ab") as _f:
            _f.write({PLANTED!r})
    except OSError:
        pass  # what it could write is looked for afterwards, outside: it must be nowhere but its own sandbox
""",
        "fake": """
import sys as _sys
from pathlib import Path as _Path
print("Step 0: pass\\nStep 1: pass\\nStep 2: pass\\n[AutogradeApp | INFO] fake 3/3 points")
try:  # verdicts of its own for every step and layout, where the checker keeps the real ones
    from autograde.grading import api as _api, cache as _cache, registry as _registry
    from autograde.engine.verdicts import Result as _Result
    _forged = {_s: _Result(_s, True, "forged") for _s in _registry.IDS}
    for _procs in range(1, 5):
        for _nodes in range(1, 4):
            _cache.save(_Path(__file__).resolve(), _procs, _nodes, _api.devices_key(0), _forged)
except Exception as _err:
    print("could not forge:", _err)
raise SystemExit(0)  # no real work at all
""",
        "forkbomb": """
import os as _os
_first = _os.getpid()
while True:
    try:
        _os.fork()
    except OSError:
        if _os.getpid() != _first:
            _os._exit(0)
        break
""",
        "memory": """
_hoard = []
while True:
    _hoard.append(bytearray(32 * 2**20))
""",
        "sleeps": """
import time as _time
_time.sleep(10**6)
""",
        "daemon": """
import os as _os, time as _time
if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        _null = _os.open(_os.devnull, _os.O_RDWR)
        for _fd in (0, 1, 2):
            _os.dup2(_null, _fd)
        _time.sleep(3600)
    _os._exit(0)
""",
        "disk": """
import os as _os, signal as _signal
_signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)
_n = 0
while _n < 10**6:
    try:
        with open(f"filler{_n}", "wb") as _f:
            for _ in range(64):
                _f.write(b"x" * 2**20)
    except OSError:
        if _n > 40:
            break
    _n += 1
""",
        "network": f"""
import socket as _socket
for _address in (("127.0.0.1", {port}), ("{_own_address()}", {port}), ("10.255.255.1", 53)):
    try:
        _socket.create_connection(_address, timeout=3).close()
    except OSError:
        continue
    raise SystemExit(f"connected to {{_address}}")
""",
    }


def planted_targets(course: Path, exchange: Path) -> list[Path]:
    """What the writer tries to append to: the gradebook, another's submission, the exchange, the course."""
    return [course / "gradebook.db", course / "submitted" / "honest" / registry.FIRST / "fashion_mnist.py",
            exchange / assignment.COURSE_ID / "inbound" / "planted", ROOT / "autograde" / "__init__.py"]


def _own_address() -> str:
    """This machine's address on its network (the sandbox must not reach it), else loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.1", 1))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def tamper(notebook: Path) -> None:
    """Change the notebook as a learner could: a cell of their own that makes every check pass, the
    course's import cell rewritten to do the same, a grade cell's points and source changed."""
    nb = json.loads(notebook.read_text())
    cheat = "import autograde\nautograde.assert_step = lambda *args, **kwargs: None\n"
    nb["cells"].insert(0, {"cell_type": "code", "execution_count": None, "id": "cheat", "metadata": {},
                           "outputs": [], "source": cheat})
    for cell in nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if cell["cell_type"] == "code" and "import autograde" in "".join(cell["source"]) and not meta:
            cell["source"] = cheat
        if meta.get("grade"):
            meta["points"] = 100
            cell["source"] = "pass"
    notebook.write_text(json.dumps(nb, indent=1))


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


class Listener:
    """A TCP server on every address of this machine that counts who connects."""

    def __init__(self) -> None:
        self.server = socket.create_server(("", 0))
        self.port = self.server.getsockname()[1]
        self.connected: list[str] = []
        self.server.settimeout(0.5)
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop:
            try:
                conn, address = self.server.accept()
                self.connected.append(str(address))
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)
        self.server.close()


def course_command(course: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    result = processes.run([processes.PYTHON, "-m", "autograde.course", *args], cwd=ROOT, timeout=timeout,
                           env={"DDP_LAB_COURSE_DIR": str(course), "DDP_LAB_GRADE_LIMITS": json.dumps(LIMITS),
                                **(env or {})})
    assert result.returncode == 0 and not result.timed_out, result.output[-4000:]
    return result.output


def hand_in(base: Path, exchange: Path, name: str, text: str) -> None:
    """The learner `name` fetches the lab with nbgrader, writes `text` as fashion_mnist.py, and submits."""
    home = base / "learners" / name
    work = home / "work"
    work.mkdir(parents=True)
    env = {"HOME": str(home), "JUPYTER_DATA_DIR": str(home / ".local/share/jupyter")}
    args = [registry.FIRST, f"--course={assignment.COURSE_ID}", f"--Exchange.root={exchange}", f"--student={name}"]
    for command in ("fetch_assignment", "submit"):
        if command == "submit":
            (work / registry.FIRST / "fashion_mnist.py").write_text(text)
            if name == "fake":  # and tampers with the notebook too
                tamper(work / registry.FIRST / f"{NOTEBOOK}.ipynb")
        done = processes.run(["nbgrader", command, *args], cwd=work, timeout=120, env=env)
        assert done.returncode == 0, done.output[-2000:]


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory, grading_sandbox: None) -> dict:
    base = tmp_path_factory.mktemp("hostile")
    course, exchange = base / "course", base / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)
    listener = Listener()
    LEAK.unlink(missing_ok=True)
    sandboxes = Path(tempfile.mkdtemp(prefix="ddp-lab-hostile-sandboxes-"))
    sandboxes.chmod(0o711)  # the grader reaches its own folders in it, and lists none
    try:
        course_command(course, "release", "--from", "files")
        course_command(course, "release-exchange", "--exchange", str(exchange))
        found = attacks(course, exchange, listener.port)
        # the attacks that, contained, let the file go on are made one after the other by one learner
        files = {"contained": with_attack("".join(found.pop(name) for name in CONTAINED)),
                 **{name: with_attack(code) for name, code in found.items()}, "honest": HONEST}
        with ThreadPoolExecutor(max_workers=2) as pool:  # two learners at a time fetch and submit
            list(pool.map(lambda learner: hand_in(base, exchange, *learner), files.items()))
        course_command(course, "collect", "--exchange", str(exchange))
        exchange_before = _tree(exchange)
        honest_before = _tree(course / "submitted" / "honest")
        started = time.monotonic()
        # the sandboxes' folders in one of the test's own, so that what is left is this grading's, not
        # that of a test grading beside it (make test's other lane)
        log = course_command(course, "grade", "--jobs", str(len(files)), "--notebook", NOTEBOOK, timeout=1200,
                             env={"TMPDIR": str(sandboxes)})
        took = time.monotonic() - started
        deadline = time.monotonic() + 30
        while _processes_under(sandbox.GRADER, str(sandboxes)) and time.monotonic() < deadline:
            time.sleep(0.5)
        return {"course": course, "log": log, "took": took, "left": _processes_under(sandbox.GRADER, str(sandboxes)),
                "scores": grading.grades(course / "grades.csv"), "connected": list(listener.connected),
                "exchange_same": _tree(exchange) == exchange_before,
                "planted": [str(p) for p in planted_targets(course, exchange) if p.exists() and PLANTED in p.read_bytes()],
                "honest_same": _tree(course / "submitted" / "honest") == honest_before}
    finally:
        listener.close()
        shutil.rmtree(sandboxes, ignore_errors=True)


def summary_line(graded: dict, student: str) -> str:
    lines = [line for line in graded["log"].splitlines() if line.startswith(f"{student}: ")]
    return lines[0] if lines else ""


def test_the_honest_learner_is_graded_as_alone(graded: dict) -> None:
    print(f"\ngraded the class of {len(graded['scores'])} in {graded['took']:.0f} s:\n{graded['log'][-2500:]}")
    assert graded["scores"]["honest"] == 3 and graded["honest_same"]


def test_attacks_that_are_contained_earn_the_honest_score(graded: dict) -> None:
    """Reading the gradebook, the hidden tests, another's submission, the solutions; writing the gradebook,
    the exchange, another's submission; connecting out; leaving a daemon: none works, so the file goes on
    (a read or a connection that worked would have ended it, saying which; what a write or the daemon
    left is looked for by test_nothing_got_out)."""
    assert graded["scores"]["contained"] == 3, graded["log"][-3000:]


def test_nothing_got_out(graded: dict) -> None:
    assert not LEAK.exists(), "a submission wrote outside its sandbox"
    assert graded["planted"] == [], f"a submission wrote into {graded['planted']}"
    assert graded["exchange_same"], "the exchange changed during grading"
    assert graded["connected"] == [], f"a submission connected to the test's listener: {graded['connected']}"
    assert graded["left"] == [], f"processes of {sandbox.GRADER} left after grading: {graded['left']}"
    autograded = graded["course"] / "autograded"
    assert not list(autograded.rglob("filler*")), "the disk filler's files reached the grading folder"


def test_fake_output_and_a_tampered_notebook_earn_nothing(graded: dict) -> None:
    """Forged verdicts (3 points if believed), a notebook whose grade cells pass whatever happens (100s):
    Step 0 reads the source (its import is there), and nothing else passes."""
    assert graded["scores"]["fake"] == 1, graded["log"][-3000:]
    assert "cell(s) the learner added are not run" in summary_line(graded, "fake"), graded["log"][-2000:]


@pytest.mark.parametrize("student, limit", [("forkbomb", "the process limit"), ("memory", "the memory limit"),
                                            ("sleeps", None), ("disk", None)])
def test_a_runaway_is_stopped_named_and_graded(graded: dict, student: str, limit: str | None) -> None:
    """Stopped by the sandbox (its process, memory or disk limit, or its wall clock) or by the check's own
    time limit; graded 0, or what its file earned before, never more than the honest file; the summary
    names the limit it hit, and otherwise the steps it lost."""
    assert graded["scores"][student] <= 3, graded["log"][-3000:]
    line = summary_line(graded, student)
    if limit:
        assert limit in line, graded["log"][-3000:]
    if student == "sleeps":  # it never gets to its honest code: every step that runs it is lost
        assert graded["scores"][student] <= 1 and ("wall clock" in line or graded["scores"][student] == 1)


def test_grading_is_refused_where_the_code_would_run_as_the_instructor(tmp_path: Path) -> None:
    """No bubblewrap on PATH: grading stops before any submission, with one line that says what to do."""
    course = tmp_path / "course"
    (course / "submitted" / "ann" / registry.FIRST).mkdir(parents=True)
    (course / "source" / registry.FIRST).mkdir(parents=True)
    empty = tmp_path / "bin"
    empty.mkdir()
    (empty / "python").symlink_to(processes.PYTHON)
    result = processes.run([processes.PYTHON, "-m", "autograde.course", "grade"], cwd=ROOT, timeout=120,
                           env={"DDP_LAB_COURSE_DIR": str(course), "PATH": str(empty)})
    lines = result.output.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and "apt-get install bubblewrap" in lines[0], result.output
    assert not (course / "gradebook.db").exists()
    assert shutil.which("bwrap") and re.search(r"\S", lines[0])
