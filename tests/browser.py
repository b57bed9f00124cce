"""What the tests that drive JupyterLab in a real browser share (tests/notebooks/test_browser.py, a
learner's JupyterLab; tests/course/test_class_hub.py, a class on JupyterHub): Chromium, a course's
copy served by `make lab`, Playwright's steps with screenshots, and reading a notebook's cells."""
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
from conftest import ROOT

from autograde import data
from autograde.engine import processes

CHROMIUM = Path(os.environ.get("DDP_LAB_CHROMIUM", "/usr/bin/chromium"))
# Known to work here, as root, with no network but the package registries.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VENV = Path(processes.PYTHON).parent.parent  # the environment running the tests: the repository's .venv
VIEWPORT = {"width": 1280, "height": 800}
CHECK_TIMEOUT = 240  # s: a cold check on 2 busy cores takes seconds; importing torch alone takes ~2 s
PROGRESS_TIMEOUT = 600  # s: the welcome notebook checks every step (~20 s from the command line on 2 cores)



@pytest.fixture(scope="module")
def chromium() -> Path:
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (.ci/run does), or set DDP_LAB_CHROMIUM")
    return CHROMIUM




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
