"""A class on the course's JupyterHub (deploy/jupyterhub/, `make hub`), in a real browser.

The module's hub runs as root, as an instructor would run it, with `make hub` in this checkout (the
course installed once) and a settings file of the test's: an instructor and two learners who are
real Unix users with passwords, created here and removed afterwards (with their homes, processes
and cgroups), an exchange and a small stand-in of the data in a fresh folder. Each class member
logs in through the hub's login page in a browser context of their own (Playwright, Debian's
Chromium), and works as they would: the instructor releases the lab from the formgrader, each
learner fetches it from the Assignments tab, edits fashion_mnist.py in the editor, runs a check in
a notebook and submits; the instructor collects in the formgrader, autogrades the class from a
terminal (the course's `python -m autograde.course grade`), sees the scores in the formgrader and
makes and releases the feedback there; each learner fetches their own. The capstone goes the same way
to one learner and back, autograded with the formgrader's Autograde button, and its run is on the
class's leaderboard, which each member opens. Then what keeps learners apart: homes and the gradebook
are closed to them, a runaway training ends at its learner's memory limit while the other learner's
check runs, a dead server is started again from the hub with the learner's work in place; and a
login and a check with the SLURM spawner, each server a job on the course's SLURM cluster.

Screenshots of each role's view go to $DDP_LAB_ARTIFACTS/class_hub/<test>/<user>/ (default: a
temporary folder), with the hub's log in class_hub/; the test prints each step's time. Needs root (real users
and cgroups), Debian's Chromium and npm (JupyterHub's proxy); without them it skips and says why.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import (  # noqa: F401
    CHROMIUM_FLAGS,
    VENV,
    VIEWPORT,
    Steps,
    cell,
    chromium,
    http_get,
    kernel_ready,
    make_env,
    menu_command,
    menu_items,
    open_in_file_browser,
    run_cell,
    tab,
    wait_for_text,
)
from classhub import (
    ClassHub,
    Member,
    _processes_of,
    artifacts_folder,
    as_user,
    formgrader_action,
    formgrader_row,
    members,
    need_a_hub,
)
from conftest import Slurm

from autograde.course.hub import limits
from autograde.grading import registry
from autograde.parts.capstone import leaderboard
from autograde.settings import REPO

pytestmark = [pytest.mark.timeout(1500), pytest.mark.launch]

TEACHER, ADA, GRACE = "ddpl-teacher", "ddpl-ada", "ddpl-grace"
LEARNERS = (ADA, GRACE)
# each member's, in this test: a server, a kernel and a check fit, and the instructor's grading of the capstone (a
# sandboxed kernel, the baseline, torchrun and 2 workers); a runaway does not
MEMORY_LIMIT = "2500M"


@pytest.fixture(scope="module")
def hub(chromium: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClassHub]:
    need_a_hub("the class test")
    artifacts = artifacts_folder(tmp_path_factory, "class_hub")
    print(f"\nthe class on JupyterHub: screenshots and the hub's log in {artifacts}")
    the_hub = ClassHub(artifacts, [TEACHER], LEARNERS, memory=MEMORY_LIMIT)
    the_hub.chromium = chromium
    with the_hub.running():
        yield the_hub




STEP_0 = "import torch.distributed as dist"
CAPSTONE = "capstone"


def edit_script(member: Member, line: str) -> None:
    """Open ddp_lab/fashion_mnist.py in the editor, add `line` under Step 0's TODO, save."""
    page = member.page
    open_in_file_browser(page, "ddp_lab", "fashion_mnist.py")
    page.locator(".jp-FileEditor:visible .cm-line", has_text="# TODO Step 0").click()
    page.keyboard.press("End")
    page.keyboard.press("Enter")
    page.keyboard.type(line)
    page.keyboard.press("Control+s")
    script = member.home / "ddp_lab" / "fashion_mnist.py"
    deadline = time.monotonic() + 30
    while f"\n{line}\n" not in script.read_text():
        assert time.monotonic() < deadline, "the edit did not reach fashion_mnist.py on disk"
        time.sleep(0.25)


def check_step_0(member: Member) -> str:
    """Run Step 0's check cell in the fetched lab's notebook; its output."""
    page = member.page
    open_in_file_browser(page, "ddp_lab", "03_steps_0_to_2.ipynb")
    page.locator(".jp-NotebookPanel:visible", has_text="Steps 0-2").wait_for()
    kernel_ready(page)
    run_cell(page, cell(page, "import autograde"))
    return run_cell(page, cell(page, "autograde.assert_step(0)"))


def test_a_class_releases_works_submits_grades_and_returns_feedback(hub: ClassHub,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with members(hub, capsys, TEACHER, ADA, GRACE) as (teacher, ada, grace):
        teacher.log_in()
        with teacher.steps.step("instructor-sees-the-formgrader-and-the-course"):
            assert (teacher.home / "grading" / "source" / "ddp_lab" / "fashion_mnist.py").is_file()
            tools = menu_items(teacher.page, "Nbgrader", teacher.steps)
            assert all(t in tools for t in ("Formgrader", "Course List", "Create assignment", "Assignment List")), tools
            row = formgrader_row(teacher.page, hub)
            row.wait_for()
        with teacher.steps.step("instructor-generates-and-releases-the-lab"):
            formgrader_action(teacher.page, row.locator("td.assign a"))
            formgrader_action(teacher.page, row.locator("td.release a"))
            assert (hub.exchange / "ddp-lab" / "outbound" / "ddp_lab" / "fashion_mnist.py").is_file()

        for learner, line in ((ada, STEP_0), (grace, "import torch.multiprocessing as mp")):
            learner.log_in()
            with learner.steps.step("learner-sees-no-instructor-tools"):
                assert (learner.home / "ddp-lab-course" / "fashion_mnist.py").is_file()  # the first login's copy
                assert stat.S_IMODE(learner.home.stat().st_mode) == 0o700
                assert hub.get(f"/user/{learner.user}/formgrader")[0] != 200
                tools = menu_items(learner.page, "Nbgrader", learner.steps)
                assert "Assignment List" in tools and "Formgrader" not in tools and "Course List" not in tools, tools
            with learner.steps.step("learner-fetches-the-lab"):
                panel = learner.assignments()
                panel.locator("#released_assignments_list .list_item", has_text="ddp_lab").locator(
                    "button", has_text="Fetch").click()
                panel.locator("#fetched_assignments_list .list_item", has_text="ddp_lab").first.wait_for()
                assert (learner.home / "ddp_lab" / "fashion_mnist.py").is_file()
            with learner.steps.step("learner-edits-fashion_mnist.py"):
                edit_script(learner, line)
            with learner.steps.step("learner-runs-the-step-0-check"):
                verdict = check_step_0(learner)
                passed = re.search(r"step 0\W+pass", verdict, flags=re.IGNORECASE)
                assert bool(passed) == (line == STEP_0), verdict
                if not passed:
                    assert "hint" in verdict.lower(), verdict
            with learner.steps.step("learner-submits"):
                tab(learner.page, "Assignments")
                panel = learner.assignments()
                panel.locator("#fetched_assignments_list .list_item", has_text="ddp_lab").locator(
                    "button", has_text="Submit").first.click()
                panel.locator("#submitted_assignments_list .list_item", has_text="ddp_lab").first.wait_for()

        with teacher.steps.step("instructor-collects"):
            row = formgrader_row(teacher.page, hub)
            formgrader_action(teacher.page, row.locator("td.collect a"))
            for name in LEARNERS:
                assert (teacher.home / "grading" / "submitted" / name / "ddp_lab" / "fashion_mnist.py").is_file()
        with teacher.steps.step("instructor-autogrades-the-class-in-a-terminal"):
            # the course's grading command, every learner at once (the formgrader's Autograde button grades one
            # learner at a time and runs every notebook of the part), here the notebook of Steps 0-2 alone, whose
            # checks these scripts reach (tests/course/test_exchange.py grades every notebook of the lab)
            screen = teacher.terminal("python -m autograde.course grade --notebook 03_steps_0_to_2",
                                      r"grades: \S+grades\.csv", timeout=600)
            assert re.search(rf"{ADA} +1/20 .* 1 2\b", screen) and re.search(rf"{GRACE} +0/20 .* 0 1 2\b", screen), screen
        with teacher.steps.step("instructor-sees-the-scores-in-the-formgrader"):
            page = teacher.page
            page.goto(f"{hub.url}/user/{TEACHER}/formgrader/manage_submissions/ddp_lab")
            for name, score in ((ADA, "1 / 20"), (GRACE, "0 / 20")):
                student = page.locator("tr", has=page.locator("td.student-id", has_text=name))
                wait_for_text(student.locator("td.score"), score, 60)
        with teacher.steps.step("instructor-generates-and-releases-feedback"):
            row = formgrader_row(teacher.page, hub)
            formgrader_action(teacher.page, row.locator("td.generate-feedback a"))
            formgrader_action(teacher.page, row.locator("td.release-feedback a"))

        for learner in (ada, grace):
            with learner.steps.step("learner-fetches-their-feedback"):
                tab(learner.page, "Assignments")
                feedback = learner.home / "ddp_lab" / "feedback"
                deadline = time.monotonic() + 90
                while not fetched(feedback):  # the button is live once the list shows the release
                    assert time.monotonic() < deadline, f"no feedback in {feedback}"
                    panel = learner.assignments()
                    button = panel.locator("#submitted_assignments_list .list_item", has_text="ddp_lab").first.locator(
                        "button", has_text="Fetch Feedback")
                    if button.is_enabled():
                        button.click()
                    for _ in range(20):
                        if fetched(feedback):
                            break
                        time.sleep(0.5)
                html = "".join(p.read_text() for p in feedback.rglob("03_steps_0_to_2.html"))
                assert re.search(r"Step 0\W+pass", html, flags=re.IGNORECASE) if learner.user == ADA else \
                    "Step 0" in html and "hint" in html.lower(), html[-2000:]
                learner.page.goto(f"{hub.url}/user/{learner.user}/files/" +
                                  str(next(feedback.rglob("03_steps_0_to_2.html")).relative_to(learner.home)))
                learner.page.get_by_text("Steps 0-2").first.wait_for()
            with learner.steps.step("learner-cannot-see-the-others-work"):
                other = GRACE if learner.user == ADA else ADA
                for path in (pwd.getpwnam(other).pw_dir, f"{pwd.getpwnam(TEACHER).pw_dir}/grading/gradebook.db",
                             f"{hub.exchange}/ddp-lab/inbound"):
                    done = as_user(learner.user, "ls", path)
                    assert done.returncode != 0 and "Permission denied" in done.stderr, (path, done)

        # The capstone through the exchange: released, fetched, finished, submitted, collected, autograded with
        # the formgrader's own button (one learner's submission), and on the class's leaderboard, a service of
        # the hub, from the verdict the sandbox signed
        with teacher.steps.step("instructor-releases-the-capstone"):
            row = formgrader_row(teacher.page, hub, CAPSTONE)
            formgrader_action(teacher.page, row.locator("td.assign a"))
            formgrader_action(teacher.page, row.locator("td.release a"))
        with ada.steps.step("learner-fetches-finishes-and-submits-the-capstone"):
            ada.page.goto(f"{hub.url}/user/{ADA}/lab")  # back from the feedback's page
            ada.wait_for_lab()
            panel = ada.assignments()
            panel.locator("#released_assignments_list .list_item", has_text=CAPSTONE).locator(
                "button", has_text="Fetch").click()
            panel.locator("#fetched_assignments_list .list_item", has_text=CAPSTONE).first.wait_for()
            item = registry.item(leaderboard.ITEM)  # the editor is the lab's part: the finished file put in place
            script = ada.home / CAPSTONE / item.file
            assert "# TODO time_to_target" in script.read_text()
            script.write_text((REPO / str(item.checkpoint)).read_text())
            panel.locator("#fetched_assignments_list .list_item", has_text=CAPSTONE).locator(
                "button", has_text="Submit").first.click()
            panel.locator("#submitted_assignments_list .list_item", has_text=CAPSTONE).first.wait_for()
        with teacher.steps.step("instructor-collects-and-autogrades-the-capstone-in-the-formgrader"):
            formgrader_action(teacher.page, formgrader_row(teacher.page, hub, CAPSTONE).locator("td.collect a"))
            page = teacher.page
            page.goto(f"{hub.url}/user/{TEACHER}/formgrader/manage_submissions/{CAPSTONE}")
            submission = page.locator("tr", has=page.locator("td.student-id", has_text=ADA))
            formgrader_action(page, submission.locator("td.autograde a"), timeout=900)
            board = teacher.home / "grading" / leaderboard.LEADERBOARD
            (graded,) = leaderboard.read([board])
            assert graded.learner == ADA and graded.valid and graded.facts["division"] == "closed", graded
        with teacher.steps.step("the-class-opens-the-capstone-leaderboard"):
            # and an invalid run of grace's, as grading records one (tests/parts/capstone/ grades those)
            invalid = leaderboard.Entry(GRACE, time.time(), False, {}, "rank 1 took part in 0 evaluations")
            with open(board, "a") as rows:
                rows.write(json.dumps(dataclasses.asdict(invalid)) + "\n")
            for member in (ada, grace, teacher):
                member.page.goto(f"{hub.url}/services/leaderboard/")
                member.page.get_by_text("Capstone leaderboard").first.wait_for(timeout=60_000)
                shown = member.page.content()
                assert (f"{ADA} (you)" in shown) == (member is ada), shown[-3000:]
                assert f"{graded.speedup:.2f}" in shown and "<svg" in shown, shown[-3000:]
                assert ("rank 1 took part in 0 evaluations" in shown) == (member is not ada), shown[-3000:]


def fetched(feedback: Path) -> bool:
    """Whether the feedback of notebook 03, the one the test reads, has arrived whole: nbgrader copies
    the notebooks' feedback file by file, and a first one there says nothing of the others."""
    return any(p.read_text().rstrip().endswith("</html>") for p in feedback.rglob("03_steps_0_to_2.html"))


RUNAWAY = """\
# A training run that leaks: every step's activations stay referenced, so memory only grows.
import torch

kept = []
for step in range(100_000):
    kept.append(torch.ones(16 * 2**20))  # 64 MB a step
    print(f"step {step}: {64 * len(kept)} MB held", flush=True)
"""


def test_a_runaway_training_ends_at_its_learners_limit_and_the_other_learner_goes_on(
        hub: ClassHub, capsys: pytest.CaptureFixture[str]) -> None:
    (Path(pwd.getpwnam(ADA).pw_dir) / "runaway.py").write_text(RUNAWAY)
    shutil.chown(Path(pwd.getpwnam(ADA).pw_dir) / "runaway.py", ADA, ADA)
    with members(hub, capsys, ADA, GRACE) as (ada, grace):
        ada.log_in()
        grace.log_in()
        ada_cgroup, grace_cgroup = limits.find_cgroup(ADA), limits.find_cgroup(GRACE)
        assert ada_cgroup and grace_cgroup, "no cgroup for the learners: are cgroups writable here?"
        before = ada_cgroup.oom_kills(), grace_cgroup.oom_kills()
        with ada.steps.step("a-runaway-training-is-killed-at-the-memory-limit"):
            screen = ada.terminal("python ~/runaway.py; echo runaway ended with status $?", r"ended with status \d+")
            assert "ended with status 137" in screen, screen  # SIGKILL, from the OOM killer
            assert re.search(r"step \d+: \d+ MB held", screen), screen
        with grace.steps.step("the-other-learners-check-runs-meanwhile"):
            screen = grace.terminal("cd ~/ddp-lab-course && python -m autograde check --step 0", r"Step 0\s+FAIL")
            assert "Killed" not in screen, screen
        assert ada_cgroup.oom_kills() > before[0], "the kernel did not kill in ada's cgroup"
        assert grace_cgroup.oom_kills() == before[1], "grace's processes were killed too"
        # the terminal printed the status after the kill, and the server is still there: only the training died
        assert any("jupyterhub-singleuser" in line for line in _processes_of(ADA)), _processes_of(ADA)
        controller = ada_cgroup.folders[0].parent.parent  # <controller>/ddp-lab/<user>: its top
        done = as_user(ADA, "sh", "-c", f"echo $$ > {controller / 'cgroup.procs'}")
        assert done.returncode != 0, "a learner could move out of their cgroup"


def test_a_server_that_died_is_started_again_from_the_hub_with_the_work_kept(
        hub: ClassHub, capsys: pytest.CaptureFixture[str]) -> None:
    home = Path(pwd.getpwnam(ADA).pw_dir)
    with members(hub, capsys, ADA) as (ada,):
        ada.log_in()
        work = home / "ddp-lab-course" / "my_notes.md"
        assert as_user(ADA, "sh", "-c", f"echo 'what I found out' > {work}").returncode == 0
        with ada.steps.step("the-server-dies"):
            servers = [int(line.split()[0]) for line in _processes_of(ADA) if "jupyterhub-singleuser" in line]
            assert servers, _processes_of(ADA)
            for pid in servers:
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while True:  # the hub polls each server every 10 s (Spawner.poll_interval)
                ada.page.goto(f"{hub.url}/hub/home")
                if ada.page.locator("#stop").count() == 0:
                    break
                assert time.monotonic() < deadline, "the hub did not notice the server died"
                time.sleep(2)
        with ada.steps.step("started-again-from-the-hub"):
            ada.page.locator("#start").click()
            ada.wait_for_lab()
            open_in_file_browser(ada.page, "ddp-lab-course", "my_notes.md")
            wait_for_text(ada.page.locator(".jp-FileEditor:visible, .jp-RenderedMarkdown:visible"),
                          "what I found out", 60)
        assert work.read_text() == "what I found out\n"


def test_with_the_slurm_spawner_each_server_is_a_job_and_checks_run_in_it(
        hub: ClassHub, slurm: Slurm, capsys: pytest.CaptureFixture[str]) -> None:
    conf = slurm.env.get("SLURM_CONF", "")
    hub.stop()
    hub.start("slurm", conf)
    env = {**os.environ, **slurm.env}
    with members(hub, capsys, ADA) as (ada,):
        ada.log_in()
        with ada.steps.step("slurm-the-server-is-a-job"):
            queue = subprocess.run(["squeue", "-h", "-u", ADA, "-o", "%j %T %N %b"], capture_output=True, text=True,
                                   env=env, timeout=30).stdout
            assert re.search(rf"ddp-lab-{ADA} RUNNING n\d \S*gpu:1", queue), queue  # on a node, with its GPU
        with ada.steps.step("slurm-a-check-runs-in-the-job"):
            screen = ada.terminal("echo job $SLURM_JOB_ID on $(hostname); cd ~/ddp-lab-course && "
                                  "python -m autograde check --step 0", r"Step 0\s+(pass|FAIL)")
            assert re.search(r"job \d+ on n\d", screen), screen
        with ada.steps.step("slurm-stopping-the-server-ends-the-job"):
            ada.stop_server()
            deadline = time.monotonic() + 60
            while subprocess.run(["squeue", "-h", "-u", ADA], capture_output=True, text=True, env=env,
                                 timeout=30).stdout.strip():
                assert time.monotonic() < deadline, "the job outlived its server"
                time.sleep(1)
