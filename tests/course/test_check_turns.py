"""The node's line of checks (autograde/grading/turns.py): its order, one running check per learner,
dead tickets, and what a waiting cell says, with real processes (cheap ones: no torch, no check)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

from autograde import settings
from autograde.course.hub import settings as hub_settings
from autograde.grading import turns

# A check stand-in: waits its turn, writes when it started and ended, holds the turn HOLD seconds.
HOLDER = """
import json, sys, time
from autograde.grading import turns
name, hold, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
with turns.turn(lambda line: print(line, flush=True)):
    start = time.time()
    time.sleep(hold)
    end = time.time()
with open(f"{out}/ran-{name}.json", "w") as f:
    f.write(json.dumps({"name": name, "start": start, "end": end}))
"""


@pytest.fixture
def line_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ddp-lab-turns-"))  # in /tmp: other uids pass (pytest's tmp_path is closed)
    folder.chmod(0o1777)  # where each holder, whoever it runs as, writes when it ran
    queue = folder / "queue"
    turns.make_folder(queue)
    yield queue
    shutil.rmtree(folder, ignore_errors=True)


def holder(queue: Path, name: str, hold: float, at_once: int, user: int | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), settings.CHECK_QUEUE: str(queue),
           settings.CHECKS_AT_ONCE: str(at_once)}
    return subprocess.Popen([python_for(user), "-c", HOLDER, name, str(hold), str(queue.parent)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/",
                            **({} if user is None else {"user": user, "group": user, "extra_groups": []}))


def arrive_in_order(queue: Path, count: int) -> None:
    """Until `count` holders have taken a ticket (each is started once the one before has one): tickets in
    the line, or their holders ended."""
    deadline = time.monotonic() + 60
    while len(turns.live_tickets(queue)) + len(list(queue.parent.glob("ran-*.json"))) < count:
        assert time.monotonic() < deadline, "a holder never took its ticket"
        time.sleep(0.05)


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        outputs.append(out)
    return outputs


def ran(queue: Path) -> dict[str, dict[str, float]]:
    rows = [json.loads(path.read_text()) for path in queue.parent.glob("ran-*.json")]
    return {row["name"]: row for row in rows}


def most_at_once(runs: dict[str, dict[str, float]]) -> int:
    return max(sum(r["start"] <= other["start"] < r["end"] for r in runs.values()) for other in runs.values())


def ticket(name: str, uid: int, running: bool = False) -> turns.Ticket:
    return turns.Ticket(name, int(name), 100 + int(name), uid, running)


def test_the_line_lets_each_learner_run_one_check_in_order_of_arrival() -> None:
    a1, a2, b1, c1 = ticket("1", 1, running=True), ticket("2", 1), ticket("3", 2), ticket("4", 3)
    running, eligible = turns.line([a1, a2, b1, c1])
    assert running == 1 and eligible == [b1, c1]  # a's second check waits for a's first
    assert [turns.place([a1, a2, b1, c1], t) for t in (b1, c1)] == [1, 2]
    running, eligible = turns.line([a2, b1, c1])  # a's first is done: its second is the earliest
    assert running == 0 and eligible == [a2, b1, c1]


def test_the_waiting_line_names_the_place_and_the_expected_wait() -> None:
    assert turns.waiting_message(3, 2, 20.0, False) == (
        "waiting for a turn: 2 checks run at once on this node and yours is 3rd in line; expected wait about 40 s")
    assert "11th in line" in turns.waiting_message(11, 1, None, False)
    assert "not known yet" in turns.waiting_message(1, 1, None, False)
    assert "about 5 min" in turns.waiting_message(10, 2, 60.0, False)
    assert "after your other check" in turns.waiting_message(1, 3, 10.0, True)


def python_for(user: int | None) -> str:
    """An interpreter `user` may run: this one, else the system's (the holder needs the standard library
    alone); the folders on the way to ours are left as they are (a class's hub test may be opening them)."""
    if user is None or not hub_settings.closed_folders(Path(sys.executable)):
        return sys.executable
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None or hub_settings.closed_folders(Path(system)) or hub_settings.closed_folders(ROOT / "autograde"):
        pytest.skip("no Python that another uid may run")
    return system


@pytest.mark.launch
def test_checks_beyond_the_limit_wait_their_turn_in_order_and_say_so(line_folder: Path) -> None:
    other = 65534  # nobody: a second learner (their own uid), whose checks run beside root's
    if os.getuid() != 0:
        pytest.skip("needs root, to run a second learner's checks as another uid")
    (line_folder / f"done-{os.getuid()}").write_text("1.0 3.0\n2.0 5.0\n3.0 4.0\n")  # recent checks: 4 s typical
    procs = [holder(line_folder, "root-1", 2.0, 2)]
    arrive_in_order(line_folder, 1)
    for i, (name, user) in enumerate([("nobody-1", other), ("root-2", None), ("nobody-2", other)], start=2):
        procs.append(holder(line_folder, name, 1.0, 2, user))
        arrive_in_order(line_folder, i)
    outputs = dict(zip(["root-1", "nobody-1", "root-2", "nobody-2"], finish(procs)))
    runs = ran(line_folder)
    assert most_at_once(runs) == 2
    assert runs["root-1"]["start"] < runs["nobody-1"]["end"]  # two learners side by side
    # each learner one check at a time: each second check starts once the first has ended
    assert runs["root-2"]["start"] >= runs["root-1"]["end"] and runs["nobody-2"]["start"] >= runs["nobody-1"]["end"]
    assert outputs["root-1"] == outputs["nobody-1"] == ""  # a free place: no word of a line
    assert "yours is after your other check, which runs now" in outputs["root-2"], outputs["root-2"]
    assert "your turn came after" in outputs["root-2"]
    assert "expected wait about 4 s" in outputs["root-2"]  # the median of the node's recent durations
    assert list(line_folder.glob("wait-*")) == list(line_folder.glob("run-*")) == []
    assert len((line_folder / f"done-{os.getuid()}").read_text().split()) == 2 * 5  # two durations added


@pytest.mark.launch
def test_a_full_line_keeps_the_order_of_arrival(line_folder: Path) -> None:
    """One at a time, five checks of one learner: each starts after the one that arrived before it ended."""
    procs = []
    for i in range(5):
        procs.append(holder(line_folder, f"c{i}", 0.3, 1))
        arrive_in_order(line_folder, i + 1)
    outputs = finish(procs)
    runs = ran(line_folder)
    starts = [runs[f"c{i}"]["start"] for i in range(5)]
    assert starts == sorted(starts) and most_at_once(runs) == 1
    assert all(runs[f"c{i + 1}"]["start"] >= runs[f"c{i}"]["end"] for i in range(4))
    assert "waiting for a turn: 1 check run at once" in outputs[4]


@pytest.mark.launch
def test_a_dead_check_s_ticket_holds_no_place(line_folder: Path) -> None:
    """A running ticket of a process that is gone, and one whose pid now names another process, are
    ignored and removed: the next check starts at once."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid(), open(f'/proc/{os.getpid()}/stat')"
                           ".read().rpartition(')')[2].split()[19])"], capture_output=True, text=True, check=True)
    pid, started = gone.stdout.split()
    (line_folder / f"run-{time.time_ns():020d}-{pid}").write_text(started + "\n")
    (line_folder / f"run-{time.time_ns():020d}-{os.getpid()}").write_text("1\n")  # this pid, another start time
    begun = time.monotonic()
    (out,) = finish([holder(line_folder, "next", 0.1, 1)])
    assert out == "" and time.monotonic() - begun < 30
    assert not list(line_folder.glob("run-*"))


@pytest.mark.launch
def test_a_killed_waiting_check_leaves_the_line(line_folder: Path) -> None:
    first = holder(line_folder, "first", 3.0, 1)
    arrive_in_order(line_folder, 1)
    killed = holder(line_folder, "killed", 0.1, 1)
    arrive_in_order(line_folder, 2)
    last = holder(line_folder, "last", 0.1, 1)
    arrive_in_order(line_folder, 3)
    killed.kill()
    killed.communicate(timeout=30)
    finish([first, last])
    assert set(ran(line_folder)) == {"first", "last"}
    assert not list(line_folder.glob("wait-*")) and not list(line_folder.glob("run-*"))


def test_outside_a_class_a_check_starts_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.CHECK_QUEUE, raising=False)
    said: list[str] = []
    with turns.turn(said.append):
        pass
    assert said == []


@pytest.mark.parametrize("at_once, folder, words", [("two", True, "a whole number"), ("0", True, "at least 1"),
                                                     ("2", False, "is missing")])
def test_a_broken_line_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, at_once: str, folder: bool,
                                   words: str) -> None:
    monkeypatch.setenv(settings.CHECK_QUEUE, str(tmp_path if folder else tmp_path / "missing"))
    monkeypatch.setenv(settings.CHECKS_AT_ONCE, at_once)
    with pytest.raises(turns.QueueError, match=words) as caught:
        with turns.turn():
            pass
    assert "\n" not in str(caught.value)


def test_the_folder_is_root_s_and_sticky_whatever_was_in_the_way(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.symlink_to(tmp_path)  # a link someone left where the line goes
    turns.make_folder(queue)
    assert queue.is_dir() and not queue.is_symlink() and (queue.stat().st_mode & 0o7777) == 0o1777
    assert (queue / turns.LOCK).stat().st_mode & 0o777 == 0o644
