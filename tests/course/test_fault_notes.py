"""What a learner is told after a fault, without a hub: the mark a check leaves while it runs (a check
cut short is named by the next check of the same file) and the hub's note on a server that stopped by
itself. tests/course/test_class_faults.py makes the faults for real."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from autograde import settings
from autograde.course.hub import spawners
from autograde.grading import api, cache


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(settings.CACHE_DIR, str(tmp_path / "verdicts"))
    path = tmp_path / "fashion_mnist.py"
    path.write_text("print('hello')\n")
    return path


def _gone_pid() -> int:
    pid = 2**22 - 7
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        pid -= 1


def _mark(script: Path, **fields: object) -> Path:
    mark = {"script": str(script), "steps": ["1", "2"], "host": socket.gethostname(), "pid": _gone_pid(),
            "started_ticks": "12345", "at": 0.0, **fields}
    path = cache.folder() / f"running-{os.urandom(4).hex()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mark))
    return path


def _same_file(script: Path, mark: Path) -> Path:
    """The mark renamed as begin() names the marks of `script` (its name, then the host and pid)."""
    own, _ = cache.begin(script, ["0"])
    cache.end(own)
    assert own is not None
    return mark.rename(own.with_name(own.name.replace(f"{socket.gethostname()}-{os.getpid()}", "elsewhere-1")))


def test_a_check_leaves_a_mark_while_it_runs_and_none_after(script: Path) -> None:
    mark, cut = cache.begin(script, ["1"])
    assert mark is not None and mark.is_file() and cut == []
    assert json.loads(mark.read_text())["pid"] == os.getpid()
    again, cut = cache.begin(script, ["2"])  # another check of the file while the first runs: not cut short
    assert cut == [] and again == mark
    cache.end(mark)
    assert not mark.exists() and cache.begin(script, ["1"])[1] == []


def test_a_check_whose_process_is_gone_is_said_cut_short_once(script: Path) -> None:
    _same_file(script, _mark(script))
    mark, cut = cache.begin(script, ["1"])
    assert len(cut) == 1 and cut[0]["steps"] == ["1", "2"]
    said = api.cut_short(cut)
    assert "your check of Step 1, Step 2 started at" in said and "cut short before its verdict" in said, said
    assert "Nothing of it was kept" in said
    cache.end(mark)
    assert cache.begin(script, ["1"])[1] == [], "said twice"


def test_a_mark_from_another_node_is_cut_short_and_a_live_one_here_is_not(script: Path) -> None:
    _same_file(script, _mark(script, host="another-node", pid=os.getpid()))
    assert len(cache.begin(script, ["1"])[1]) == 1
    live = _same_file(script, _mark(script, pid=os.getpid(), started_ticks=cache._started(os.getpid())))
    assert cache.begin(script, ["1"])[1] == [] and live.exists()
    reused = _same_file(script, _mark(script, pid=os.getpid(), started_ticks="1"))  # the pid of a process since gone
    assert len(cache.begin(script, ["1"])[1]) == 1 and not reused.exists()


def test_another_files_marks_are_not_this_ones(script: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    _same_file(other, _mark(other))
    assert cache.begin(script, ["1"])[1] == []


@pytest.mark.parametrize("seen, words", [
    ("NODE_FAIL n1", "its SLURM job 7 ended on node n1: the node it ran on stopped answering (lost)"),
    ("TIMEOUT n2", "its SLURM job 7 ended on node n2: it reached the class's time limit"),
    ("CANCELLED+ n1", "its SLURM job 7 ended on node n1: it was cancelled"),
    ("", "its SLURM job 7 ended: it is no longer in the queue"),
    ("slurm_load_jobs error: Invalid job id specified", "its SLURM job 7 ended: it is no longer in the queue"),
])
def test_the_hub_says_why_a_job_ended(seen: str, words: str) -> None:
    assert spawners.slurm_end("7", seen) == words


def test_the_hubs_note_names_the_signal_and_is_escaped() -> None:
    assert spawners._exit_status(-9) == "it was killed (SIGKILL)"
    assert spawners._exit_status(1) == "it exited with status 1"

    class User:
        name = "ddpf-someone"

    spawners.STOPPED[User.name] = "killed <b>now</b>"
    try:
        assert spawners.announcement(User()) == '<span id="ddp-lab-stopped">killed &lt;b&gt;now&lt;/b&gt;</span>'
        assert spawners.announcement(None) == ""
    finally:
        del spawners.STOPPED[User.name]
    assert spawners.announcement(User()) == ""


def test_the_notes_outlive_the_hub_in_its_state_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawners, "STOPPED", {})
    monkeypatch.setattr(spawners, "NOTES", [])
    notes = tmp_path / "stopped-servers.json"
    spawners.keep_notes(notes)  # none there yet
    spawners._note("ddpf-a", "killed")
    spawners._note("ddpf-b", "lost")
    spawners._note("ddpf-b", None)  # started again
    monkeypatch.setattr(spawners, "STOPPED", {})  # a new hub
    spawners.keep_notes(notes)
    assert spawners.STOPPED == {"ddpf-a": "killed"}
