"""A class on the course's JupyterHub for tests: real Unix users with passwords (made here, removed
with their homes, processes and cgroups), `make hub` run as root with the test's settings file, and
class members in a browser of their own. tests/course/test_class_hub.py is the class's walk-through;
other tests make hubs of their own with their own user names (two hubs never share a user).
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
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM_FLAGS, VENV, VIEWPORT, Steps, http_get, make_env, menu_command, wait_for_text
from conftest import ROOT

from autograde import data
from autograde.course import sandbox
from autograde.course.hub import limits, settings
from autograde.engine import processes
from autograde.settings import WARM_SERVER

MARK = "ddp-lab class test"  # the users' comment (GECOS): a leftover of an earlier run is recognised by it
HUB_TIMEOUT = 180  # s for the hub to answer, and for a server to start



def _free_ports(count: int) -> int:
    """A port p with p..p+count-1 all free (the hub, its API, the proxy's API and the leaderboard take four in a row)."""
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


def _processes_under(name: str, marker: str) -> list[str]:
    """'pid command line' of every process of user `name` that is, or descends from, a process whose
    command line holds `marker` (a sandbox's folder, which its bubblewrap names): one grading's, not
    another's running beside it. A process cannot leave its sandbox's tree: bubblewrap gives each a
    PID namespace, whose end ends every process in it."""
    uid = pwd.getpwnam(name).pw_uid
    parent: dict[int, int] = {}
    line: dict[int, bytes] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            line[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError, ValueError):
            continue

    def under(pid: int) -> bool:
        seen = set()
        while pid in line and pid not in seen:
            if marker.encode() in line[pid]:
                return True
            seen.add(pid)
            pid = parent.get(pid, 0)
        return False

    return [f"{pid} {line[pid].decode(errors='replace')}" for pid in line
            if pid != os.getpid() and _owner(Path(f"/proc/{pid}")) == uid and under(pid)]


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


def need_a_hub(who: str) -> None:
    """Skip, saying why, where `make hub` cannot run: not root (`who` creates Unix users and runs the hub
    as root), or no npm for JupyterHub's proxy."""
    if os.geteuid() != 0:
        pytest.skip(f"{who} needs root: it creates Unix users and runs the hub as root, as `make hub` does")
    if not (VENV / "bin" / "configurable-http-proxy").exists() and not shutil.which("npm"):
        pytest.skip("no npm for JupyterHub's proxy: apt-get install nodejs npm (.ci/run does)")


def artifacts_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """$DDP_LAB_ARTIFACTS/<name> (default: a temporary folder), emptied: where a hub test's log and
    screenshots go."""
    base = Path(os.environ["DDP_LAB_ARTIFACTS"]) if os.environ.get("DDP_LAB_ARTIFACTS") else \
        tmp_path_factory.mktemp("artifacts")
    folder = base / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


class ClassHub:
    """`make hub` with the test's class settings, its users and folders; started and stopped here."""

    def __init__(self, artifacts: Path, instructors: Sequence[str], learners: Sequence[str],
                 memory: str = "1200M", cpus: float = 1.0, extra: Sequence[str] = (), checks_at_once: int = 0,
                 slurm_gpus: int = 1) -> None:
        self.instructors, self.learners = list(instructors), list(learners)
        self.memory, self.cpus, self.extra = memory, cpus, list(extra)  # extra: more top-level settings lines
        self.checks_at_once, self.slurm_gpus = checks_at_once, slurm_gpus  # [local] checks_at_once, [slurm] gpus
        self.folder = Path(tempfile.mkdtemp(prefix="ddp-lab-class-"))
        self.folder.chmod(0o755)
        self.exchange = self.folder / "exchange"
        self.exchange.mkdir()
        self.exchange.chmod(0o777)  # nbgrader's exchange: everyone writes, nbgrader sets each folder's mode
        self.data = self.folder / "data"
        data.write_synthetic(self.data / "synthetic", 640, 301, seed=3)
        for path in [self.data, *self.data.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        self.passwords = {user: secrets.token_urlsafe(12) for user in (*self.instructors, *self.learners)}
        self.port = _free_ports(4)
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
            f'spawner = "{spawner}"', f"instructors = {json.dumps(self.instructors)}",
            f"learners = {json.dumps(self.learners)}", *self.extra,
            'ip = "127.0.0.1"', f"port = {self.port}", f'exchange = "{self.exchange}"', f'data = "{self.data}"',
            f'state = "{self.folder / "state"}"', f'slurm_conf = "{slurm_conf}"', 'hub_connect_ip = "127.0.0.1"',
            "[local]", "gpus = 4", f'memory = "{self.memory}"', f"cpus = {self.cpus}",
            *([f"checks_at_once = {self.checks_at_once}"] if self.checks_at_once else []),
            "[slurm]", 'time = "00:30:00"', 'memory = "2G"', "cpus = 1", f"gpus = {self.slurm_gpus}", ""]))
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

    def api(self, method: str, path: str, token: str = "", body: Any = None,
            timeout: float = 30) -> tuple[int, Any]:
        """A call of the hub's REST API (/hub/api/...) or of a server's (/user/NAME/api/...) with `token`:
        the status and the JSON answer (None when empty; status 0 when nothing answers)."""
        headers = {"Authorization": f"token {token}"} if token else {}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                status, text = answer.status, answer.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        except OSError:
            return 0, None
        try:
            return status, json.loads(text) if text.strip() else None
        except ValueError:
            return status, text.decode(errors="replace")

    def token(self, user: str) -> str:
        """An API token of `user`'s, asked for with their password (as a script of theirs could)."""
        status, answer = self.api("POST", f"/hub/api/users/{user}/tokens", body={
            "auth": {"username": user, "password": self.passwords[user]}, "note": "test", "expires_in": 3600})
        assert status in (200, 201) and isinstance(answer, dict), (status, answer)
        return str(answer["token"])

    def stop_servers(self, timeout: float = 120) -> None:
        """Stop every class member's server through the API, as an instructor ends a class (the hub keeps
        them running when it stops itself: jupyterhub_config.py's cleanup_servers)."""
        if self.proc is None or self.proc.poll() is not None or self.get("/hub/api/")[0] != 200:
            return
        token = self.token(self.instructors[0])
        running = [u for u in self.passwords if self.server_of(u, token) is not None]
        for user in running:
            self.api("DELETE", f"/hub/api/users/{user}/server", token)
        deadline = time.monotonic() + timeout
        while any(self.server_of(u, token) is not None for u in running) and time.monotonic() < deadline:
            time.sleep(1)

    def server_of(self, user: str, token: str) -> dict[str, Any] | None:
        """`user`'s default server as the hub's API describes it (ready, pending, url...), None if none."""
        status, answer = self.api("GET", f"/hub/api/users/{user}", token)
        if status != 200 or not isinstance(answer, dict):
            return None
        server = (answer.get("servers") or {}).get("")
        return server if isinstance(server, dict) else None

    def stop_hub(self) -> None:
        """Stop the hub alone (Ctrl-C on `make hub`), leaving the servers running."""
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

    def stop(self) -> None:
        """Stop every server, then the hub and what is left of make's process group."""
        if self.proc is None:
            return
        try:
            self.stop_servers()
        except AssertionError:  # the hub does not answer as it should: its servers are killed with the users
            pass
        self.stop_hub()

    @contextmanager
    def running(self, spawner: str = "local") -> Iterator["ClassHub"]:
        """The hub with its users, started; afterwards stopped and removed, and AssertionError if a class
        member's process outlived it or a user was left."""
        try:
            self.add_users()
            self.open_course()
            self.start(spawner)
            yield self
        finally:
            self.stop()
            left = self.leftovers()
            self.remove()
        assert not left, f"class members' processes left after the hub stopped (killed now): {left}"
        assert not any(_user_exists(u) for u in self.passwords), "a test user was not removed"

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
        if sandbox.SUDOERS.is_file() and any(u in sandbox.SUDOERS.read_text() for u in self.instructors):
            sandbox.SUDOERS.unlink()  # the hub's rule for this test's instructors, who are gone
        shutil.rmtree(self.check_queue, ignore_errors=True)

    @property
    def check_queue(self) -> Path:
        """The node's line of checks the hub makes with checks_at_once (kept by the hub, for the expected wait)."""
        return settings.check_queue(self.port)



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

    def stop_server(self, timeout: float = 120) -> None:
        """Stop My Server on the hub's home page, until the button goes; AssertionError with the hub's log if not.

        The page binds the button's click in a script it loads after the page itself (RequireJS): a click that
        comes first does nothing, so a button still there after a while is clicked again, as a person would."""
        from playwright.sync_api import TimeoutError as PageTimeout

        self.page.goto(f"{self.hub.url}/hub/home", wait_until="networkidle")
        stop, failed = self.page.locator("#stop"), self.page.locator(".modal-dialog:visible").first
        deadline = time.monotonic() + timeout
        while stop.is_visible():
            assert not failed.is_visible(), f"stopping failed: {failed.text_content()}\n{self.hub.log_tail()}"
            assert time.monotonic() < deadline, \
                f"{self.user}'s server was not stopped in {timeout:.0f} s; the hub's log:\n{self.hub.log_tail()}"
            stop.click()
            try:
                stop.wait_for(state="hidden", timeout=20_000)
            except PageTimeout:  # look again, click again
                pass

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
    page.goto(f"{hub.url}/user/{hub.instructors[0]}/formgrader/manage_assignments")
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
