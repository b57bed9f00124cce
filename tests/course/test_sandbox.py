"""The grading sandbox (autograde/course/sandbox.py) piece by piece: what it binds, the signed verdicts,
the notebook as the course wrote it, what the summary names, and one real kernel started in it the
way nbgrader starts one, asked what it can see and do (a child process of it plays the learner's code)."""
from __future__ import annotations

import asyncio
import json
import os
import pwd
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from autograde.course import grading, sandbox
from autograde.engine.verdicts import Result
from autograde.grading import cache


def test_the_sandbox_binds_the_course_code_and_never_what_holds_an_answer(tmp_path: Path) -> None:
    args = sandbox.bwrap_args(tmp_path / "work", tmp_path / "sub", [tmp_path / "sockets"], {"A": "1"}, 2**20)
    bound = {args[i + 1] for i, a in enumerate(args) if a in ("--ro-bind", "--bind")}
    assert str(ROOT / "autograde") in bound and str(tmp_path / "sub") in bound
    for secret in ("solutions", "tests", ".git", "grading"):
        assert str(ROOT / secret) not in bound, secret
    assert not any(path == str(ROOT) or path.startswith(str(Path.home())) and "pyenv" not in path for path in bound)
    assert "--unshare-all" in args and "--clearenv" in args and "--die-with-parent" in args
    assert args[args.index("--tmpfs", args.index(str(tmp_path / "sub"))) + 1] == str(tmp_path / "work")


def test_verdicts_are_signed_in_the_sandbox_and_unsigned_ones_are_not_read(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_LAB_CACHE_DIR", str(tmp_path))
    script = tmp_path / "fashion_mnist.py"
    script.write_text("print('mine')\n")
    forged = {"1": Result("1", True, "forged")}
    cache.save(script, 2, 1, "cpu", forged)  # as a learner's process would: it has no key
    assert cache.load(script, 2, 1, "cpu") == forged  # outside the sandbox a verdict is a verdict
    monkeypatch.setattr(cache, "_key", None)
    cache.sign_with(b"the grader's key")
    try:
        assert cache.load(script, 2, 1, "cpu") == {}  # the forged one is not read
        real = {"1": Result("1", False, "no process group")}
        cache.save(script, 2, 1, "cpu", real)
        assert cache.load(script, 2, 1, "cpu") == real
        kept = next(tmp_path.glob("*.json"))
        kept.write_text(kept.read_text().replace("false", "true"))  # a signed verdict, edited
        assert cache.load(script, 2, 1, "cpu") == {}
    finally:
        cache._key = None


def test_the_summary_names_what_the_sandbox_met() -> None:
    log = "\n".join([
        "forkbomb | [SandboxedKernelManager | WARNING] sandbox: the process limit (256) refused 9 new process(es)",
        "nb | [AutogradeApp | WARNING] 03_steps_0_to_2: 1 cell(s) the learner added are not run",
        "x | [AutogradeApp | WARNING] Removing failed notebook: /c/autograded/x/ddp_lab/04_steps_3_to_5.ipynb",
        "an ordinary line"])
    assert grading.sandbox_notes(log) == ["the process limit (256) refused 9 new process(es)",
                                          "03_steps_0_to_2: 1 cell(s) the learner added are not run",
                                          "04_steps_3_to_5: grading failed, 0 points"]


def test_the_notebook_run_is_the_courses_with_the_learners_answers(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_LAB_COURSE_DIR", str(tmp_path))
    answer = {"nbgrader": {"grade": True, "grade_id": "answer_03_why", "locked": False, "points": 1,
                           "schema_version": 3, "solution": True, "task": False}}
    check = {"nbgrader": {"grade": True, "grade_id": "step_0", "locked": True, "points": 1, "schema_version": 3,
                          "solution": False, "task": False}}
    course = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import autograde"),
                                             nbformat.v4.new_markdown_cell("YOUR ANSWER HERE", metadata=answer),
                                             nbformat.v4.new_code_cell("autograde.assert_step(0)", metadata=check)])
    (tmp_path / "source" / "ddp_lab").mkdir(parents=True)
    nbformat.write(course, tmp_path / "source" / "ddp_lab" / "03.ipynb")
    handed_in = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import autograde; autograde.assert_step = print"),  # edited
        nbformat.v4.new_code_cell("autograde.assert_step = print"),  # added
        nbformat.v4.new_markdown_cell("Because the ranks wait.", metadata=answer),
        nbformat.v4.new_code_cell("pass", metadata={"nbgrader": {**check["nbgrader"], "points": 100}})])
    nb, _ = sandbox.RestoreCourseCells().preprocess(handed_in, {"nbgrader": {"assignment": "ddp_lab", "notebook": "03"}})
    assert [c.source for c in nb.cells] == ["import autograde", "Because the ranks wait.", "autograde.assert_step(0)"]
    assert nb.cells[2].metadata["nbgrader"]["points"] == 1


def test_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_LAB_GRADE_LIMITS", json.dumps({"seconds": 30, "processes": 64}))
    limits = sandbox.Limits.from_env()
    assert (limits.seconds, limits.processes, limits.memory) == (30, 64, sandbox.Limits().memory)


PROBE = r"""
import json, os, subprocess, sys
found = {"uid": os.getuid(), "cwd": os.getcwd(), "files": sorted(os.listdir("."))}
found["sees"] = {p: os.path.exists(p) for p in sys.argv[1:]}
import ctypes
found["dumpable"] = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
found["interfaces"] = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
child = subprocess.run([sys.executable, "-c", '''
import glob, json, os, socket, sys
kernel = int(sys.argv[1])
out = {}
try:
    open(f"/proc/{kernel}/mem", "rb").read(1); out["memory"] = "read"
except OSError as err:
    out["memory"] = type(err).__name__
out["sockets"] = []
for path in glob.glob(sys.argv[2] + "-*"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path); out["sockets"].append("connected")
    except OSError as err:
        out["sockets"].append(type(err).__name__)
    s.close()
try:
    socket.create_connection(("10.255.255.1", 53), timeout=2); out["network"] = "connected"
except OSError as err:
    out["network"] = type(err).__name__
print(json.dumps(out))
''', str(os.getpid()), KERNEL_IP], capture_output=True, text=True)
found["child"] = json.loads(child.stdout or "{}") if child.returncode == 0 else child.stderr
print("FOUND " + json.dumps(found))
"""


@pytest.mark.launch
def test_a_kernel_in_the_sandbox_is_the_grader_sees_only_its_files_and_is_sealed_from_its_children(
        tmp_path: Path, grading_sandbox: None) -> None:
    """Started as nbgrader starts it (the kernel manager nbgrader's Execute is given): it runs as
    ddp-lab-grader where the notebook is, with the learner's files but not the notebooks; the instructor's
    folders and the repository's solutions do not exist for it; a process it starts (as a check starts the
    learner's script) cannot read its memory, connect to its sockets or reach the network."""
    submission = tmp_path / "grading" / "autograded" / "ann" / "ddp_lab"
    submission.mkdir(parents=True)
    (submission / "fashion_mnist.py").write_text("# mine\n")
    (submission / "03_steps_0_to_2.ipynb").write_text("{}")  # the notebook with its hidden tests, put back
    secret = tmp_path / "grading" / "gradebook.db"
    secret.write_text("scores")

    async def probe() -> dict:
        manager = sandbox.SandboxedKernelManager(kernel_name="python3")
        await manager.start_kernel(cwd=str(submission))
        client = manager.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=60)
            code = PROBE.replace("KERNEL_IP", repr(manager.ip))
            reply = await client.execute_interactive(
                f"import sys; sys.argv = ['probe', {str(secret)!r}, {str(ROOT / 'solutions')!r}, '/root/.bashrc']\n"
                + code, timeout=60, output_hook=lambda msg: outputs.append(msg))
            assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            client.stop_channels()
            await manager.shutdown_kernel(now=True)
        text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
        return dict(json.loads(text.split("FOUND ", 1)[1]))

    outputs: list[dict] = []
    found = asyncio.run(probe())
    assert found["uid"] == pwd.getpwnam(sandbox.GRADER).pw_uid != os.geteuid()
    assert found["cwd"] == str(submission) and found["files"] == ["fashion_mnist.py"]
    assert not any(found["sees"].values()), found["sees"]
    assert found["dumpable"] == 0
    assert found["child"]["memory"] == "PermissionError", found["child"]
    assert found["child"]["sockets"] and set(found["child"]["sockets"]) == {"PermissionError"}, found["child"]
    assert found["child"]["network"] != "connected"
    assert found["interfaces"] in ([], ["lo"])


def test_a_check_that_cannot_apply_is_no_pass_where_grades_are_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """n/a (SLURM not reachable, say) passes a learner's check cell, which is only told; in the grading
    sandbox a graded item's n/a fails its grade cell and says the instructor grades it by hand."""
    from autograde.grading import api

    monkeypatch.setattr(api, "check_steps", lambda steps, *a, **k: [Result(str(steps[0]), None, "no SLURM here")])
    api.assert_step("slurm_env")  # the learner's own server: told, not failed
    monkeypatch.setenv(sandbox.GRADING, "1")
    with pytest.raises(api.CheckFailed, match="cannot be checked where grading runs.*by hand"):
        api.assert_step("slurm_env")
    api.assert_step("optional")  # no points: nothing to grade by hand
