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
import subprocess
import time
from pathlib import Path

import pytest
from browser import (  # noqa: F401
    CHECK_TIMEOUT,
    CHROMIUM,
    CHROMIUM_FLAGS,
    PROGRESS_TIMEOUT,
    VENV,
    VIEWPORT,
    Lab,
    Steps,
    artifacts,
    browser,
    cell,
    chromium,
    copy_course,
    http_get,
    kernel_ready,
    make_env,
    menu_bar,
    menu_command,
    menu_items,
    open_in_file_browser,
    run_cell,
    session,
    tab,
    wait_for_text,
)
from conftest import ROOT

pytestmark = [pytest.mark.timeout(1500), pytest.mark.launch]  # every test here starts processes


@pytest.fixture(scope="module", autouse=True)
def environment_is_set_up() -> None:
    """The copies below use the repository's environment as `make setup` left it, and must not remake it:
    the environment's ddp_lab.pth names this checkout, and a copy's `make setup` would point it at the copy."""
    stamps = [f"{VENV}/.installed", f"{VENV}/.jupyter-config"]
    stale = subprocess.run(["make", "-q", f"VENV={VENV}", *stamps], cwd=ROOT, env=make_env(os.environ),
                           capture_output=True, text=True)
    if stale.returncode != 0:
        pytest.fail(f"{VENV} is older than the requirements or jupyter-config/: run `make setup` first", pytrace=False)


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
