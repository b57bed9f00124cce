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
makes and releases the feedback there; each learner fetches their own. Then what keeps learners apart: homes and the gradebook are
closed to them, a runaway training ends at its learner's memory limit while the other learner's
check runs, a dead server is started again from the hub with the learner's work in place; and a
login and a check with the SLURM spawner, each server a job on the course's SLURM cluster.

Screenshots of each role's view go to $DDP_LAB_ARTIFACTS/class_hub/<test>/<user>/ (default: a
temporary folder), with the hub's log in class_hub/; the test prints each step's time. Needs root (real users
and cgroups), Debian's Chromium and npm (JupyterHub's proxy); without them it skips and says why.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
from conftest import ROOT, Slurm

from autograde import data
from autograde.course.hub import limits, settings
from autograde.engine import processes
from autograde.settings import WARM_SERVER

pytestmark = [pytest.mark.timeout(1500), pytest.mark.launch]

MARK = "ddp-lab class test"  # the users' comment (GECOS): a leftover of an earlier run is recognised by it
TEACHER, ADA, GRACE = "ddpl-teacher", "ddpl-ada", "ddpl-grace"
LEARNERS = (ADA, GRACE)
MEMORY_LIMIT = "1200M"  # each learner's, in this test: a server, a kernel and a check fit; a runaway does not
HUB_TIMEOUT = 180  # s for the hub to answer, and for a server to start


def _free_ports(count: int) -> int:
    """A port p with p..p+count-1 all free (the hub, its API and the proxy's API take three in a row)."""
    for _ in range(50):
        base = processes.free_port()
        if base + count < 65536 and all(_port_free(base + i) for i in range(count)):
            return base
    raise AssertionError("no free run of ports")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _kill_user_processes(name: str) -> list[int]:
    """SIGKILL every process of `name`; the pids that were there."""
    uid = pwd.getpwnam(name).pw_uid
    found = [int(p.name) for p in Path("/proc").glob("[0-9]*") if _owner(p) == uid]
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found


def _owner(proc: Path) -> int | None:
    try:
        return proc.stat().st_uid
    except OSError:
        return None


def _remove_user(name: str) -> None:
    if not _user_exists(name):
        return
    _kill_user_processes(name)
    deadline = time.monotonic() + 30
    while subprocess.run(["userdel", "-r", name], capture_output=True).returncode not in (0, 12):  # 12: no mail spool
        assert time.monotonic() < deadline, f"userdel {name} kept failing"
        _kill_user_processes(name)
        time.sleep(0.5)


def _processes_of(name: str) -> list[str]:
    return _all_processes(pwd.getpwnam(name).pw_uid)


def _all_processes(uid: int | None = None) -> list[str]:
    """'pid command line' of every process (of user `uid`) but this one."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) != os.getpid() and (uid is None or _owner(proc) == uid):
            try:
                args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name} {args}")
            except OSError:
                continue
    return found


def as_user(user: str, *command: str) -> subprocess.CompletedProcess[str]:
    """`command` run as `user` (runuser), as a learner's own terminal would run it."""
    return subprocess.run(["runuser", "-u", user, "--", *command], capture_output=True, text=True, timeout=60)


class ClassHub:
    """`make hub` with the test's class settings, its users and folders; started and stopped here."""

    def __init__(self, artifacts: Path) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="ddp-lab-class-"))
        self.folder.chmod(0o755)
        self.exchange = self.folder / "exchange"
        self.exchange.mkdir()
        self.exchange.chmod(0o777)  # nbgrader's exchange: everyone writes, nbgrader sets each folder's mode
        self.data = self.folder / "data"
        data.write_synthetic(self.data / "synthetic", 640, 301, seed=3)
        for path in [self.data, *self.data.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        self.passwords = {user: secrets.token_urlsafe(12) for user in (TEACHER, *LEARNERS)}
        self.port = _free_ports(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = artifacts / "jupyterhub.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.opened: list[tuple[Path, int]] = []  # folders this test opened to other users, with their modes
        self.chromium = Path("/usr/bin/chromium")

    def add_users(self) -> None:
        for user in self.passwords:
            if _user_exists(user):
                assert pwd.getpwnam(user).pw_gecos == MARK, f"a user {user} exists and is not this test's"
                _remove_user(user)  # left by an earlier run that was killed
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--comment", MARK, user], check=True)
        subprocess.run(["chpasswd"], input="".join(f"{u}:{p}\n" for u, p in self.passwords.items()), text=True,
                       check=True)
        for user in self.passwords:  # xterm.js mirrors a terminal's text in the page only in screen-reader mode
            home = Path(pwd.getpwnam(user).pw_dir)
            settings_file = home / ".jupyter/lab/user-settings/@jupyterlab/terminal-extension"
            settings_file = settings_file / "plugin.jupyterlab-settings"
            settings_file.parent.mkdir(parents=True)
            settings_file.write_text(json.dumps({"screenReaderMode": True}))
            subprocess.run(["chown", "-R", f"{user}:{user}", str(home / ".jupyter")], check=True)

    def open_course(self) -> None:
        """Let class members reach the course and its Python (here /root is on the way to pyenv's Python)."""
        for path in (ROOT / "autograde", Path(processes.PYTHON)):
            for folder in settings.closed_folders(path):
                self.opened.append((folder, stat.S_IMODE(folder.stat().st_mode)))
                folder.chmod(stat.S_IMODE(folder.stat().st_mode) | 0o001)

    def write_settings(self, spawner: str, slurm_conf: str = "") -> Path:
        path = self.folder / f"class-{spawner}.toml"
        path.write_text("\n".join([
            f'spawner = "{spawner}"', f'instructors = ["{TEACHER}"]', f'learners = ["{ADA}", "{GRACE}"]',
            'ip = "127.0.0.1"', f"port = {self.port}", f'exchange = "{self.exchange}"', f'data = "{self.data}"',
            f'state = "{self.folder / "state"}"', f'slurm_conf = "{slurm_conf}"', 'hub_connect_ip = "127.0.0.1"',
            "[local]", "gpus = 4", f'memory = "{MEMORY_LIMIT}"', "cpus = 1.0",
            "[slurm]", 'time = "00:30:00"', 'memory = "2G"', "cpus = 1", "gpus = 1", ""]))
        return path

    def start(self, spawner: str = "local", slurm_conf: str = "") -> None:
        class_file = self.write_settings(spawner, slurm_conf)
        command = ["make", "--no-print-directory", "hub", f"CLASS={class_file}", f"VENV={VENV}",
                   "-o", f"{VENV}/.installed", "-o", f"{VENV}/.jupyter-config"]
        with open(self.log_path, "ab") as log:
            # the hub, a root service that imports no torch, starts cold: it runs its own process tree
            # (its proxy, the learners' servers as their users), which stopping it must end as a class's would
            hub_env = make_env(os.environ) | {WARM_SERVER: "off"}
            self.proc = subprocess.Popen(command, cwd=ROOT, env=hub_env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + HUB_TIMEOUT
        while self.get("/hub/api/")[0] != 200:
            if self.proc.poll() is not None:
                raise AssertionError(f"make hub exited ({self.proc.returncode}): {self.log_tail()}")
            assert time.monotonic() < deadline, f"the hub did not answer within {HUB_TIMEOUT} s: {self.log_tail()}"
            time.sleep(0.5)

    def get(self, path: str) -> tuple[int, bytes]:
        return http_get(self.url + path)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """Stop the hub (it stops every server it started) and what is left of make's process group."""
        if self.proc is None:
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=45)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None

    def leftovers(self) -> list[str]:
        """Processes of the class's users, and the hub's or its proxy's (whose command lines name this test's
        folder or port), waited for a while (servers end after the hub stops them)."""
        deadline = time.monotonic() + 30
        while True:
            left = [line for user in self.passwords if _user_exists(user) for line in _processes_of(user)]
            left += [line for line in _all_processes() if str(self.folder) in line or f"--port {self.port}" in line]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def remove(self) -> None:
        for user in self.passwords:
            cgroup = limits.find_cgroup(user)
            _remove_user(user)
            if cgroup:
                limits.remove_cgroup(cgroup)
        for folder, mode in reversed(self.opened):
            folder.chmod(mode)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def hub(chromium: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClassHub]:
    if os.geteuid() != 0:
        pytest.skip("the class test needs root: it creates Unix users and runs the hub as root, as `make hub` does")
    if not (VENV / "bin" / "configurable-http-proxy").exists() and not shutil.which("npm"):
        pytest.skip("no npm for JupyterHub's proxy: apt-get install nodejs npm (.ci/run does)")
    base = Path(os.environ["DDP_LAB_ARTIFACTS"]) if os.environ.get("DDP_LAB_ARTIFACTS") else \
        tmp_path_factory.mktemp("artifacts")
    artifacts = base / "class_hub"
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    print(f"\nthe class on JupyterHub: screenshots and the hub's log in {artifacts}")
    the_hub = ClassHub(artifacts)
    the_hub.chromium = chromium
    try:
        the_hub.add_users()
        the_hub.open_course()
        the_hub.start()
        yield the_hub
    finally:
        the_hub.stop()
        left = the_hub.leftovers()
        the_hub.remove()
    assert not left, f"class members' processes left after the hub stopped (killed now): {left}"
    assert not any(_user_exists(u) for u in the_hub.passwords), "a test user was not removed"


class Member:
    """A class member in a browser context of their own, with their screenshots and step times."""

    def __init__(self, browser: Any, hub: ClassHub, user: str, artifacts: Path) -> None:
        self.user, self.hub = user, hub
        self.context = browser.new_context(viewport=VIEWPORT)
        self.page = self.context.new_page()
        self.page.set_default_timeout(120_000)
        test = os.environ.get("PYTEST_CURRENT_TEST", "test").split("::")[-1].split(" ")[0]
        folder = artifacts / test / user  # one folder per test and member: no test's screenshots replace another's
        folder.mkdir(parents=True, exist_ok=True)
        self.steps = Steps(self.page, folder)

    @property
    def home(self) -> Path:
        return Path(pwd.getpwnam(self.user).pw_dir)

    def log_in(self) -> None:
        with self.steps.step("log-in"):
            self.page.goto(f"{self.hub.url}/hub/login")
            self.page.fill("#username_input", self.user)
            self.page.fill("#password_input", self.hub.passwords[self.user])
            self.page.click("#login_submit")
            self.wait_for_lab()
            # a fresh layout: JupyterLab would restore the tabs of an earlier login (dead terminals among them)
            self.page.goto(f"{self.hub.url}/user/{self.user}/lab?reset")
            self.wait_for_lab()

    def wait_for_lab(self) -> None:
        """Until JupyterLab shows the home folder; AssertionError with the hub's message if the spawn failed."""
        lab = self.page.locator(".jp-FileBrowser .jp-DirListing-item").first
        failed = self.page.locator("div.error, .progress-bar-danger").first
        lab.or_(failed).wait_for(timeout=HUB_TIMEOUT * 1000)
        assert not failed.is_visible(), \
            f"{self.user}'s server did not start: {failed.text_content()}\nthe hub's log:\n{self.hub.log_tail()}"

    def assignments(self) -> Any:
        """The Assignments tab (nbgrader's assignment list), opened from the Nbgrader menu, refreshed."""
        menu_command(self.page, "Nbgrader", "Assignment List")
        panel = self.page.locator(".lm-DockPanel-widget:visible", has=self.page.locator("#released_assignments_list"))
        panel.locator("#refresh_assignments_list").click()
        for listing in ("released", "fetched", "submitted"):  # each list says "Loading" until it has been redrawn
            panel.locator(f"#{listing}_assignments_list_loading").wait_for(state="hidden")
        return panel

    def terminal(self, command: str, expect: str, timeout: float = 240) -> str:
        """Type `command` into a new terminal; its screen once `expect` shows."""
        if "/lab" not in self.page.url:  # back from the formgrader's pages
            self.page.goto(f"{self.hub.url}/user/{self.user}/lab")
            self.wait_for_lab()
        menu_command(self.page, "File", "New", "Terminal")
        screen = self.page.locator(".jp-Terminal:visible .xterm-accessibility-tree")
        wait_for_text(screen, r"[#$]\s*$", 60)
        self.page.locator(".jp-Terminal:visible .xterm").click()
        self.page.keyboard.type(command + "\n")
        return wait_for_text(screen, expect, timeout)

    def close(self) -> None:
        self.context.close()


@contextmanager
def members(hub: ClassHub, capsys: pytest.CaptureFixture[str], *users: str) -> Iterator[list[Member]]:
    """The users logged in to nothing yet, each in a context of their own; each one's step times are printed
    (and added to steps.txt beside their screenshots) at the end."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(hub.chromium), headless=True, args=CHROMIUM_FLAGS)
        people = [Member(browser, hub, user, hub.log_path.parent) for user in users]
        try:
            yield people
        finally:
            for person in people:
                report = person.steps.report()
                with open(person.steps.folder / "steps.txt", "a") as times:
                    times.write(report + "\n")
                with capsys.disabled():
                    print(f"\n{person.user}'s steps (screenshots in {person.steps.folder}):\n{report}")
            browser.close()


def formgrader_row(page: Any, hub: ClassHub, assignment: str = "ddp_lab") -> Any:
    page.goto(f"{hub.url}/user/{TEACHER}/formgrader/manage_assignments")
    return page.locator("tr", has=page.locator("td.name", has_text=re.compile(f"^{assignment}$")))


def formgrader_action(page: Any, button: Any, timeout: float = 300) -> str:
    """Click a formgrader button and wait for its Success dialog (AssertionError with the log on Error)."""
    button.click()
    dialog = page.locator("#success-modal, #error-modal").first
    dialog.wait_for(timeout=timeout * 1000)
    text = str(dialog.text_content())
    assert dialog.get_attribute("id") == "success-modal", text[-3000:]
    dialog.locator("button.close").first.click()
    dialog.wait_for(state="hidden")
    return text


STEP_0 = "import torch.distributed as dist"


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
            # the course's grading command, every learner at once and only the graded notebooks (the formgrader's
            # Autograde button grades one learner at a time and runs every notebook of the part: twice as long)
            screen = teacher.terminal("python -m autograde.course grade", r"grades: \S+grades\.csv", timeout=600)
            assert re.search(rf"{ADA} +1/20 .* 1 2 3", screen) and re.search(rf"{GRACE} +0/20 .* 0 1 2", screen), screen
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
            ada.page.goto(f"{hub.url}/hub/home")
            ada.page.locator("#stop").click()
            ada.page.locator("#stop").wait_for(state="hidden", timeout=120_000)
            deadline = time.monotonic() + 60
            while subprocess.run(["squeue", "-h", "-u", ADA], capture_output=True, text=True, env=env,
                                 timeout=30).stdout.strip():
                assert time.monotonic() < deadline, "the job outlived its server"
                time.sleep(1)
