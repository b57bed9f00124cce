"""The learner's JupyterLab in a real browser: `make lab` on a copy of the course, driven by Playwright in Chromium.

Each test copies the course (the checkout's files, as they are) into a temporary folder, starts JupyterLab there
with the very `make lab` a learner types (the repository's .venv, through VENV=), and works in it the way a
learner does: the file browser, the editor, notebooks run from the menu, a terminal. JupyterLab gets its own
temporary Jupyter config, data and runtime folders, so nothing of this machine's home folder is read or written.

Screenshots of every step go to $DDP_LAB_ARTIFACTS/<test>/ (default: the test's tmp_path/artifacts), with the
server's log; the test prints where, and how long each browser step took. Needs Debian's Chromium
(/usr/bin/chromium, or $DDP_LAB_CHROMIUM): `apt-get install chromium` (.ci/run does it); without it the
tests skip, saying so.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from autograde import data, processes
from conftest import ROOT

CHROMIUM = Path(os.environ.get("DDP_LAB_CHROMIUM", "/usr/bin/chromium"))
# Known to work here, as root, with no network but the package registries.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VENV = Path(processes.PYTHON).parent.parent  # the environment running the tests: the repository's .venv
VIEWPORT = {"width": 1280, "height": 800}
CHECK_TIMEOUT = 240  # s: a cold check on 2 busy cores takes seconds; importing torch alone takes ~2 s
PROGRESS_TIMEOUT = 600  # s: the welcome notebook checks every step (~20 s from the command line on 2 cores)

pytestmark = [pytest.mark.timeout(1500), pytest.mark.launch]  # every test here starts processes


@pytest.fixture(scope="module")
def chromium() -> Path:
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (.ci/run does), or set DDP_LAB_CHROMIUM")
    return CHROMIUM


@pytest.fixture(scope="module", autouse=True)
def environment_is_set_up() -> None:
    """The copies below use the repository's environment as `make setup` left it, and must not remake it:
    the environment's ddp_lab.pth names this checkout, and a copy's `make setup` would point it at the copy."""
    stamps = [f"{VENV}/.installed", f"{VENV}/.jupyter-config"]
    stale = subprocess.run(["make", "-q", f"VENV={VENV}", *stamps], cwd=ROOT, env=make_env(os.environ),
                           capture_output=True, text=True)
    if stale.returncode != 0:
        pytest.fail(f"{VENV} is older than the requirements or jupyter-config/: run `make setup` first", pytrace=False)


def make_env(base: Any) -> dict[str, str]:
    """`base` without what a calling make passes down to the makes started here."""
    return {k: v for k, v in base.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}


def copy_course(dest: Path) -> Path:
    """The checkout's files as they are now (tracked and new, not ignored), modification times kept."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the checkout is not part of it
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """GET `url`: the status and the body; status 0 when nothing answers."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


class Lab:
    """`make lab` in a copy of the course, on a loopback port with a token, in a process group of its own."""

    def __init__(self, tmp: Path, artifacts: Path) -> None:
        self.course = copy_course(tmp / "course")
        self.port, self.token = processes.free_port(), uuid.uuid4().hex
        self.url = f"http://127.0.0.1:{self.port}"
        self.marker = uuid.uuid4().hex  # in the environment of everything the server starts, to find leftovers
        self.opened = tmp / "browser-opened.txt"
        self.log_path = artifacts / "jupyterlab.log"
        self.proc: subprocess.Popen[bytes] | None = None
        jupyter = {name: tmp / "jupyter" / name for name in ("config", "data", "runtime", "ipython")}
        for folder in jupyter.values():
            folder.mkdir(parents=True)
        # xterm.js draws a terminal on a canvas; its screen-reader mode mirrors the text in the page, for the test
        settings = jupyter["config"] / "lab" / "user-settings" / "@jupyterlab" / "terminal-extension"
        settings.mkdir(parents=True)
        (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"screenReaderMode": True}))
        stand_in = tmp / "data"  # the notebooks' data: a small stand-in instead of writing the full one (25 s)
        data.write_synthetic(stand_in / "synthetic", 640, 301, seed=3)
        recorder = tmp / "record-browser"  # `make lab` "opens a browser": this writes down what it was asked to open
        recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$1" >> "{self.opened}"\n')
        recorder.chmod(0o755)
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != VENV / "bin"]
        self.env = make_env(os.environ) | {
            "PATH": os.pathsep.join(path),  # as in a learner's shell: the environment is not activated
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "JUPYTER_CONFIG_DIR": str(jupyter["config"]), "JUPYTER_DATA_DIR": str(jupyter["data"]),
            "JUPYTER_RUNTIME_DIR": str(jupyter["runtime"]), "IPYTHONDIR": str(jupyter["ipython"]),
            # in a virtual environment Jupyter reads the environment's config before the user's: this test's
            # user config (instructor mode, EXT_LEVEL=user) comes first instead
            "JUPYTER_PREFER_ENV_PATH": "0",
            "PYTHONPATH": str(self.course),  # kernels import the copy's autograde, not the checkout's
            "DDP_LAB_CACHE_DIR": str(tmp / "verdicts"), "DDP_LAB_DATA_DIR": str(stand_in),
            "BROWSER": f"{recorder} %s", "DDP_LAB_BROWSER_TEST": self.marker,
        }

    def make(self, *args: str) -> list[str]:
        # -o: never remake the shared environment from the copy (see environment_is_set_up)
        return ["make", "--no-print-directory", *args, f"VENV={VENV}", "-o", f"{VENV}/.installed",
                "-o", f"{VENV}/.jupyter-config"]

    def run_make(self, *args: str) -> str:
        done = subprocess.run(self.make(*args), cwd=self.course, env=self.env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def start(self, *lab_args: str) -> None:
        args = " ".join(["--port", str(self.port), f"--ServerApp.token={self.token}", "--ip", "127.0.0.1", *lab_args])
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.make("lab", f"LAB_ARGS={args}"), cwd=self.course, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + 180
        while self.get("/api/status")[0] != 200:
            if self.proc.poll() is not None:
                raise AssertionError(f"make lab exited ({self.proc.returncode}): {self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"JupyterLab did not answer within 180 s: {self.log_tail()}")
            time.sleep(0.5)

    def get(self, path: str) -> tuple[int, bytes]:
        return http_get(self.url + path, {"Authorization": f"token {self.token}"})

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def leftovers(self) -> list[int]:
        """Processes that carry this server's marker: the server, its kernels, terminals and their children."""
        found = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if f"DDP_LAB_BROWSER_TEST={self.marker}".encode() in environ.read_bytes().split(b"\0"):
                    found.append(int(environ.parent.name))
            except OSError:
                continue  # gone, or not ours to read
        return found

    def stop(self) -> list[int]:
        """Shut the server down (kernels and terminals with it), kill what is left; the pids that were left."""
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            request = urllib.request.Request(self.url + "/api/shutdown", method="POST",
                                             headers={"Authorization": f"token {self.token}"})
            try:
                urllib.request.urlopen(request, timeout=10).close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):  # make and anything left in its process group
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                continue
        time.sleep(1)
        left = self.leftovers()
        for pid in left:  # kernels and terminals have sessions of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None
        return left


class Steps:
    """Times each browser step, and saves a screenshot after it (or of the failure)."""

    def __init__(self, page: Any, folder: Path) -> None:
        self.page, self.folder, self.times = page, folder, []  # type: ignore[var-annotated]

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        shot = self.folder / f"{len(self.times) + 1:02d}-{name}.png"
        try:
            yield
        except BaseException:
            self.times.append((name + " (FAILED)", time.monotonic() - start))
            self.page.screenshot(path=shot.with_name(shot.stem + "-FAILED.png"))
            raise
        self.times.append((name, time.monotonic() - start))
        self.page.screenshot(path=shot)

    def shot(self, name: str) -> None:
        """A screenshot now, in the middle of a step (a menu that the step closes again)."""
        self.page.screenshot(path=self.folder / f"{len(self.times) + 1:02d}-{name}.png")

    def report(self) -> str:
        lines = [f"  {seconds:6.1f} s  {name}" for name, seconds in self.times]
        return "\n".join(lines + [f"  {sum(s for _, s in self.times):6.1f} s  all browser steps"])


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    base = Path(os.environ["DDP_LAB_ARTIFACTS"]) if os.environ.get("DDP_LAB_ARTIFACTS") else tmp_path / "artifacts"
    folder = base / request.node.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with capsys.disabled():
        print(f"\n{request.node.name}: screenshots and the server's log in {folder}")
    return folder


@contextmanager
def browser(chromium: Path, tmp: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp / "chromium-profile"), executable_path=str(chromium), headless=True, args=CHROMIUM_FLAGS,
            viewport=VIEWPORT)
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(60_000)
            yield page
        finally:
            context.close()


@contextmanager
def session(chromium: Path, tmp: Path, artifacts: Path,
            capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[Lab, Any, Steps]]:
    lab = Lab(tmp, artifacts)
    steps: Steps | None = None
    test_start = time.monotonic()
    try:
        with browser(chromium, tmp) as page:
            steps = Steps(page, artifacts)
            yield lab, page, steps
    finally:
        left = lab.stop()
        with capsys.disabled():
            if steps:
                print(f"browser steps (screenshots in {artifacts}):\n{steps.report()}")
            print(f"  {time.monotonic() - test_start:6.1f} s  the whole test, JupyterLab's starts included")
        assert not left, f"processes left running after JupyterLab shut down (killed now): {left}"


# --- what the learner sees and does -------------------------------------------------------------------------

def menu_bar(page: Any, menu: str) -> Any:
    return page.locator(f".lm-MenuBar-item:has(.lm-MenuBar-itemLabel:text-is('{menu}'))")


def menu_items(page: Any, menu: str, steps: Steps) -> str:
    """The items of a menu of the menu bar, opened (and shown in a screenshot) and closed again."""
    menu_bar(page, menu).click()
    items = page.locator(".lm-Menu").last.text_content()
    steps.shot(f"{menu}-menu")
    page.keyboard.press("Escape")
    return str(items)


def menu_command(page: Any, *path: str) -> None:
    menu_bar(page, path[0]).click()
    for label in path[1:-1]:
        page.locator(f".lm-Menu-item:has(.lm-Menu-itemLabel:text-is('{label}'))").hover()
    page.locator(f".lm-Menu-item:has(.lm-Menu-itemLabel:text-is('{path[-1]}'))").click()


def tab(page: Any, title: str) -> None:
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=title).click()


def open_in_file_browser(page: Any, *names: str) -> None:
    """From the root folder, double-click each name in turn."""
    page.locator(".jp-FileBrowser .jp-BreadCrumbs-home").click()
    for name in names:
        page.locator(".jp-FileBrowser .jp-DirListing-item", has_text=name).first.dblclick()


def kernel_ready(page: Any) -> None:
    """Wait until the current notebook's kernel is idle, as the status bar says: before, a cell run is lost
    or asks which kernel to start (the notebook's own indicator says "idle" before the kernel exists)."""
    page.locator(".jp-StatusBar-Widget").get_by_text(re.compile(r"\(ipykernel\) \| Idle")).wait_for(timeout=180_000)


def cell(page: Any, source: str) -> Any:
    """The code cell of the current notebook whose source contains `source`."""
    return page.locator(".jp-NotebookPanel:visible .jp-CodeCell", has_text=source).first


def run_cell(page: Any, code_cell: Any, timeout: float = CHECK_TIMEOUT) -> str:
    """Run the cell (Ctrl+Enter in its editor) and wait until it has run; its output's text."""
    prompt = code_cell.locator(".jp-InputPrompt")
    before = prompt.text_content()
    code_cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    deadline = time.monotonic() + timeout
    while True:
        now = prompt.text_content() or ""
        if re.search(r"\[\d+\]", now) and now != before:
            break
        assert time.monotonic() < deadline, f"the cell did not finish within {timeout} s (prompt {now!r})"
        time.sleep(0.25)
    code_cell.scroll_into_view_if_needed()
    return str(code_cell.locator(".jp-OutputArea").text_content())


def wait_for_text(locator: Any, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = " ".join(str(t) for t in locator.all_text_contents())
        if re.search(pattern, text, flags=re.IGNORECASE | re.DOTALL):
            return text
        assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s in: {text[-2000:]!r}"
        time.sleep(0.5)


def test_a_learner_finds_the_course_and_does_step_0_in_jupyterlab(chromium: Path, tmp_path: Path, artifacts: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with session(chromium, tmp_path, artifacts, capsys) as (lab, page, steps):
        lab.start()  # no --no-browser: `make lab` asks for a browser, and the recorder notes the address
        script = lab.course / "fashion_mnist.py"

        with steps.step("make-lab-opens-the-welcome-notebook"):
            deadline = time.monotonic() + 60
            while not lab.opened.exists():
                assert time.monotonic() < deadline, f"make lab opened no browser: {lab.log_tail()}"
                time.sleep(0.5)
            address = lab.opened.read_text().split()[0]
            page.goto(address)  # jupyter's redirect page, with the token
            page.wait_for_url(re.compile(r"/lab/tree/notebooks/00_welcome\.ipynb"))
            wait_for_text(page.locator(".jp-NotebookPanel:visible"), r"DDP Lab: welcome", 60)

        with steps.step("learner-view-has-no-instructor-tools"):
            nbgrader = menu_items(page, "Nbgrader", steps)
            assert "Assignment List" in nbgrader, nbgrader
            for tool in ("Formgrader", "Course List", "Create assignment"):
                assert tool not in nbgrader, nbgrader
            assert page.locator("#nbgrader-create_assignemnt").count() == 0  # its side panel (nbgrader's id, sic)
            assert lab.get("/formgrader")[0] == 404
            status, body = lab.get("/lab/api/settings/@jupyterlab/apputils-extension:notification")
            # the environment's overrides.d/ddp-lab.json becomes the default: never ask, never fetch
            defaults = {k: v.get("default") for k, v in json.loads(body)["schema"]["properties"].items()}
            assert status == 200 and defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, defaults

        with steps.step("file-browser-shows-the-course-and-opens-the-script"):
            open_in_file_browser(page)
            listing = page.locator(".jp-FileBrowser .jp-DirListing-content")
            for name in ("fashion_mnist.py", "solutions", "exercises", "notebooks", "Makefile"):
                listing.locator(".jp-DirListing-item", has_text=name).first.wait_for()
            open_in_file_browser(page, "fashion_mnist.py")
            editor = page.locator(".jp-FileEditor:visible .cm-content")
            wait_for_text(editor, r"# TODO Step 0: import the distributed package", 60)
            assert "fashion_mnist.py" in str(page.locator(".lm-DockPanel-tabBar .lm-mod-current").text_content())

        with steps.step("welcome-notebook-shows-the-progress"):
            tab(page, "00_welcome.ipynb")
            kernel_ready(page)
            menu_command(page, "Run", "Run All Cells")
            progress = cell(page, "autograde.progress()")
            report = wait_for_text(progress.locator(".jp-OutputArea"), r"steps pass", PROGRESS_TIMEOUT)
            progress.scroll_into_view_if_needed()
            assert re.search(r"Step 0", report) and "FAIL" in report, report
            assert re.search(r"(?<!\d)0 of 12 steps pass", report), report  # text_content runs cells together

        with steps.step("step-0-check-fails-on-the-starter"):
            open_in_file_browser(page, "notebooks", "03_steps_0_to_2.ipynb")
            page.locator(".jp-NotebookPanel:visible", has_text="Steps 0-2").wait_for()
            kernel_ready(page)
            run_cell(page, cell(page, "import autograde"))
            verdict = run_cell(page, cell(page, "autograde.assert_step(0)"))
            for words in ("step 0", "hint", "import torch.distributed"):
                assert words in verdict.lower(), verdict
            assert not re.search(r"step 0\W+pass", verdict, flags=re.IGNORECASE), verdict

        with steps.step("learner-adds-the-import-in-the-editor"):
            tab(page, "fashion_mnist.py")
            page.locator(".jp-FileEditor:visible .cm-line", has_text="# TODO Step 0").click()
            page.keyboard.press("End")
            page.keyboard.press("Enter")
            page.keyboard.type("import torch.distributed as dist")
            page.keyboard.press("Control+s")
            deadline = time.monotonic() + 30
            while "\nimport torch.distributed as dist\n" not in script.read_text():
                assert time.monotonic() < deadline, "the edit did not reach fashion_mnist.py on disk"
                time.sleep(0.25)
            lines = script.read_text().splitlines()
            at = lines.index("import torch.distributed as dist")
            assert lines[at - 1].startswith("# TODO Step 0"), lines[at - 3:at + 2]

        with steps.step("step-0-check-passes-after-the-edit"):
            tab(page, "03_steps_0_to_2.ipynb")
            verdict = run_cell(page, cell(page, "autograde.assert_step(0)"))
            assert re.search(r"step 0\W+pass", verdict, flags=re.IGNORECASE), verdict
            assert "fail" not in verdict.lower() and "hint" not in verdict.lower(), verdict

        with steps.step("terminal-runs-the-course-commands"):
            menu_command(page, "File", "New", "Terminal")
            screen = page.locator(".jp-Terminal:visible .xterm-accessibility-tree")
            wait_for_text(screen, r"[#$]\s*$", 60)  # the prompt
            page.locator(".jp-Terminal:visible .xterm").click()
            page.keyboard.type("command -v python; diff fashion_mnist.py solutions/fashion_mnist_after_step_0.py;"
                               " python -m autograde check --step 0\n")
            text = wait_for_text(screen, r"Step 0\s+pass", CHECK_TIMEOUT)
            assert f"{VENV}/bin/python" in text, text  # the course's python, not the system's
            assert "> # Step 0: import the distributed package" in text, text  # diff found solutions/
            assert "ModuleNotFoundError" not in text and "No such file" not in text, text

        assert page.get_by_text("notified about official Jupyter news").count() == 0  # minutes after the start
        assert lab.stop() == []


def test_instructor_mode_shows_the_formgrader(chromium: Path, tmp_path: Path, artifacts: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with session(chromium, tmp_path, artifacts, capsys) as (lab, page, steps):
        # in this test's own Jupyter config (EXT_LEVEL=user), not the environment's
        assert "instructor mode" in lab.run_make("instructor-mode", "EXT_LEVEL=user")
        lab.start("--no-browser")

        with steps.step("instructor-view-has-the-formgrader"):
            page.goto(f"{lab.url}/lab?token={lab.token}")
            page.locator(".jp-FileBrowser .jp-DirListing-item", has_text="fashion_mnist.py").first.wait_for()
            nbgrader = menu_items(page, "Nbgrader", steps)
            for tool in ("Formgrader", "Course List", "Create assignment", "Assignment List"):
                assert tool in nbgrader, nbgrader
            assert page.locator("#nbgrader-create_assignemnt").count() == 1
            assert lab.get("/formgrader")[0] == 200
            menu_command(page, "Nbgrader", "Formgrader")
            page.frame_locator(".jp-MainAreaWidget:visible iframe").get_by_text("Manage Assignments").first.wait_for()

        assert "learner mode" in lab.run_make("learner-mode", "EXT_LEVEL=user")
        assert lab.stop() == []
        lab.start("--no-browser")

        with steps.step("learner-mode-again-hides-it"):
            page.goto(f"{lab.url}/lab?reset&token={lab.token}")
            page.locator(".jp-FileBrowser .jp-DirListing-item", has_text="fashion_mnist.py").first.wait_for()
            nbgrader = menu_items(page, "Nbgrader", steps)
            assert "Formgrader" not in nbgrader and "Create assignment" not in nbgrader, nbgrader
            assert "Assignment List" in nbgrader, nbgrader
            assert lab.get("/formgrader")[0] == 404
