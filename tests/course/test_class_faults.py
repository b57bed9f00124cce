"""Faults during a class on the course's JupyterHub (deploy/jupyterhub/, `make hub`), for real.

The module's hub runs as root with `make hub`, with an instructor and a learner who are real Unix
users (prefix ddpf-, made and removed here). The learner works through JupyterHub's REST API: a token
asked for with their password, their server started and stopped through the hub, a kernel of theirs
run through its websocket (what JupyterLab does), and pages of the hub read with their login cookies.
A check of theirs is held in its run (the script waits while a file `hold` lies beside it) so that
the fault lands while it runs; each test says what happened and that nothing is left running.

- the hub restarted: the learner's server and the check in their kernel run on; the check gives its
  verdict afterwards, the hub keeps its state (the server, the learner's login);
- the learner's server killed mid-check: no verdict kept, nothing left running, the hub's pages say
  why (a restarted hub too), and the next check says that the earlier one was cut short;
- a SLURM node lost under a learner's server (a cluster of two emulated nodes of the test's own): the
  hub notices, tells the learner why, and their server starts again on the other node, their files kept.

In `make test` the lost node is marked down at once (as an administrator would, after killing it);
`make class-faults` (DDP_LAB_CLASS_FAULTS=full) waits for SLURM to find it lost on its own (SlurmdTimeout),
with a check under way on it that the next check, on the other node, names as cut short.
"""
from __future__ import annotations

import http.cookiejar
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websocket
from classhub import ClassHub, _processes_of, artifacts_folder, need_a_hub
from conftest import ROOT

pytestmark = pytest.mark.launch

TEACHER, ADA = "ddpf-teacher", "ddpf-ada"
FULL = os.environ.get("DDP_LAB_CLASS_FAULTS") == "full"
GATE = ('import time\nfrom pathlib import Path\n'
        'while Path(__file__).with_name("hold").exists():  # the test holds the check\'s run here\n'
        '    time.sleep(0.2)\n')
CHECK = ("from autograde.grading.api import check_steps\n"
         "verdict = check_steps(['1'], script={script!r})[0]\n"
         "print('VERDICT', verdict.status, '|', verdict.observed)")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClassHub]:
    need_a_hub("the fault test")
    artifacts = artifacts_folder(tmp_path_factory, "class_faults")
    print(f"\nfaults during a class: the hub's log in {artifacts}")
    the_hub = ClassHub(artifacts, [TEACHER], [ADA])
    with the_hub.running():
        yield the_hub


class Learner:
    """A learner of the hub without a browser: their login cookies, an API token, their server and kernels."""

    def __init__(self, hub: ClassHub, user: str) -> None:
        self.hub, self.user = hub, user
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        self.token = hub.token(user)
        self.home = Path(pwd.getpwnam(user).pw_dir)

    def page(self, path: str, form: dict[str, str] | None = None) -> tuple[int, str, str]:
        """A page of the hub (or of the server) with the learner's cookies: status, final URL, text."""
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            with self.opener.open(urllib.request.Request(self.hub.url + path, data=data), timeout=60) as answer:
                return answer.status, answer.url, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.url, e.read().decode(errors="replace")

    def log_in(self) -> None:
        self.page("/hub/login")
        xsrf = next(c.value for c in self.jar if c.name == "_xsrf")
        status, url, _ = self.page("/hub/login?next=%2Fhub%2Fhome", {
            "username": self.user, "password": self.hub.passwords[self.user], "_xsrf": str(xsrf)})
        assert status == 200 and url.endswith("/hub/home"), (status, url)

    def server(self) -> dict[str, Any] | None:
        return self.hub.server_of(self.user, self.token)

    def start_server(self, timeout: float = 300) -> None:
        status, answer = self.hub.api("POST", f"/hub/api/users/{self.user}/server", self.token)
        assert status in (201, 202), (status, answer, self.hub.log_tail())
        deadline = time.monotonic() + timeout
        while not (self.server() or {}).get("ready"):
            assert time.monotonic() < deadline, f"{self.user}'s server did not start: {self.hub.log_tail()}"
            time.sleep(1)

    def stop_server(self, timeout: float = 120) -> None:
        self.hub.api("DELETE", f"/hub/api/users/{self.user}/server", self.token)
        self.wait_no_server(timeout, "did not stop")

    def wait_no_server(self, timeout: float, why: str) -> None:
        deadline = time.monotonic() + timeout
        while self.server() is not None:
            assert time.monotonic() < deadline, f"{self.user}'s server {why}: {self.hub.log_tail()}"
            time.sleep(1)

    def kernel(self) -> Kernel:
        status, answer = self.hub.api("POST", f"/user/{self.user}/api/kernels", self.token, {"name": "python3"})
        assert status == 201 and isinstance(answer, dict), (status, answer)
        return Kernel(self, str(answer["id"]))

    def write(self, relative: str, text: str) -> Path:
        """A file of the learner's, written as they would (owned by them)."""
        path = self.home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for made in (path, *[p for p in path.parents if self.home in p.parents]):
            shutil.chown(made, self.user, self.user)
        return path

    def processes(self) -> list[str]:
        return _processes_of(self.user)

    def no_processes_left(self, timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def verdict_files(self) -> set[str]:
        return {p.name for p in (self.home / ".cache" / "ddp-lab-verdicts").glob("*.json")
                if not p.name.startswith("running-")}

    def marks(self) -> list[Path]:
        return sorted((self.home / ".cache" / "ddp-lab-verdicts").glob("running-*.json"))


class Kernel:
    """One of the learner's kernels, through its websocket on their server (as JupyterLab talks to it)."""

    def __init__(self, learner: Learner, kernel_id: str) -> None:
        self.learner, self.id = learner, kernel_id
        self.session = uuid.uuid4().hex
        self.ws: websocket.WebSocket | None = None

    def connect(self) -> None:
        url = self.learner.hub.url.replace("http://", "ws://") + \
            f"/user/{self.learner.user}/api/kernels/{self.id}/channels?session_id={self.session}"
        self.ws = websocket.create_connection(url, header=[f"Authorization: token {self.learner.token}"], timeout=10)

    def send(self, code: str) -> str:
        """Start running `code`; its message id."""
        if self.ws is None:
            self.connect()
        assert self.ws is not None
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": self.learner.user, "session": self.session,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        return msg_id

    def read(self, msg_id: str, until: str | None = None, timeout: float = 240) -> str:
        """The text `msg_id` printed, until it is done (or until `until` shows in it)."""
        assert self.ws is not None
        out, deadline = "", time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                message = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                out += content["text"]
            elif kind == "error":
                out += f"{content['ename']}: {content['evalue']}\n"
            elif kind == "status" and content["execution_state"] == "idle":
                return out
            if until is not None and re.search(until, out):
                return out
        raise AssertionError(f"the kernel's cell did not end within {timeout:.0f} s: {out}")

    def run(self, code: str, timeout: float = 240) -> str:
        return self.read(self.send(code), timeout=timeout)

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
            self.ws = None

    def shut_down(self) -> None:
        self.close()
        self.learner.hub.api("DELETE", f"/user/{self.learner.user}/api/kernels/{self.id}", self.learner.token)


def slow_script(learner: Learner, folder: str, note: str) -> Path:
    """The lab's script as it is after Step 1 (its check passes), whose run waits while `hold` lies beside it."""
    text = (ROOT / "solutions" / "fashion_mnist_after_step_1.py").read_text()
    text = text.replace("import argparse\n", GATE + "import argparse\n", 1) + f"# {note}\n"
    learner.write(f"{folder}/hold", "")
    return learner.write(f"{folder}/fashion_mnist.py", text)


def server_pids(learner: Learner, name: str = "jupyterhub-singleuser") -> list[int]:
    """The learner's processes whose program (in the command line's first three words) is `name`."""
    return [int(line.split()[0]) for line in learner.processes() if name in " ".join(line.split()[1:4])]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_hub_restarted_keeps_servers_checks_and_logins(hub: ClassHub) -> None:
    ada = Learner(hub, ADA)
    ada.log_in()
    ada.start_server()
    script = slow_script(ada, "restart", "the hub restarted")
    kernel = ada.kernel()
    cell = kernel.send(CHECK.format(script=str(script)))
    said = kernel.read(cell, until="running the setup run")  # the check's run has started, and waits
    servers, kernels = server_pids(ada), server_pids(ada, "ipykernel_launcher")
    assert len(servers) == 1 and kernels, ada.processes()  # the kernel (and a child it forked)
    (server,) = servers
    started = time.monotonic()
    hub.stop_hub()
    assert hub.get("/hub/api/")[0] == 0, "the hub still answers"
    assert alive(server) and all(map(alive, kernels)), ("the server or the kernel stopped with the hub", ada.processes())
    assert ada.marks(), "the check ended with the hub"
    hub.start()
    print(f"\nthe hub restarted in {time.monotonic() - started:.1f} s, the check's run waiting meanwhile")
    assert (ada.server() or {}).get("ready"), ("the restarted hub lost the server", ada.server())
    assert server_pids(ada) == [server] and all(map(alive, kernels)), ada.processes()
    assert ada.marks(), "the check is no longer running"
    status, url, _ = ada.page("/hub/home")  # the login cookie of before the restart still holds
    assert status == 200 and url.endswith("/hub/home"), (status, url)
    status, url, text = ada.page(f"/user/{ADA}/lab")  # and the server is reached through the new proxy
    assert status == 200 and f"/user/{ADA}/lab" in url and "jupyter-config-data" in text, (status, url, text[:300])

    (script.parent / "hold").unlink()  # the check goes on, and ends with its verdict, while nobody listens
    deadline = time.monotonic() + 180
    while ada.marks():
        assert time.monotonic() < deadline, "the check did not end"
        time.sleep(0.5)
    assert ada.verdict_files(), "the check's verdict was not kept"
    # the websocket died with the proxy: a new one in the same session, as JupyterLab reconnects, and the
    # server hands over what the kernel printed meanwhile, the verdict with it
    kernel.close()
    kernel.connect()
    replayed = kernel.read(cell, timeout=60)
    print(f"the cell's output, after the page reconnected:\n{said}{replayed}")
    assert re.search(r"VERDICT pass \|", replayed), (said, replayed)
    after = kernel.run("print('AFTER', verdict.status, '|', verdict.observed)")
    assert after.startswith("AFTER pass |"), (said, after)
    kernel.shut_down()
    ada.stop_server()
    assert "ddp-lab-stopped" not in ada.page("/hub/home")[2], "a server stopped from the hub is said to have died"
    assert not ada.no_processes_left(), ada.processes()


def test_a_server_killed_mid_check_keeps_no_verdict_and_the_learner_is_told(hub: ClassHub) -> None:
    ada = Learner(hub, ADA)
    ada.log_in()
    ada.start_server()
    script = slow_script(ada, "killed", "the server killed mid-check")
    kept_before = ada.verdict_files()
    kernel = ada.kernel()
    kernel.read(kernel.send(CHECK.format(script=str(script))), until="running the setup run")
    runs = [line for line in ada.processes() if "ipykernel" not in line and "singleuser" not in line]
    assert runs, ada.processes()  # the check's run (and the kernel's warm-start server) under way
    kernel.close()
    (server,) = server_pids(ada)  # the server alone is killed: its kernel, and the kernel's runs, are its children
    os.kill(server, signal.SIGKILL)
    ada.wait_no_server(60, "was not noticed dead")  # the hub polls every server every 10 s
    left = ada.no_processes_left()
    assert not left, f"the dead server left processes running: {left}"
    assert ada.verdict_files() == kept_before, "a verdict was kept from a check cut short"
    assert ada.marks(), "the check left no mark of being cut short"
    noted = [line for line in hub.log_path.read_text(errors="replace").splitlines()
             if ADA in line and ("dead server" in line or "stopped by itself" in line)]
    print("\nthe hub's log says:\n" + "\n".join(noted))
    assert any(f"{ADA}'s server stopped by itself (status -9)" in line for line in noted), noted

    status, _, home = ada.page("/hub/home")
    told = re.search(r'id="ddp-lab-stopped">([^<]*)<', home)
    assert status == 200 and told, home[-2000:]
    print(f"\nthe hub's page says: {told.group(1)}")
    assert "stopped by itself" in told.group(1) and "SIGKILL" in told.group(1) and \
        "no verdict" in told.group(1), told.group(1)
    status, _, not_running = ada.page(f"/user/{ADA}/lab")
    assert status == 424 and "ddp-lab-stopped" in not_running, (status, not_running[-1500:])
    hub.stop_hub()  # a hub restarted meanwhile still says it (the note is kept in its state folder)
    hub.start()
    status, _, home = ada.page("/hub/home")
    assert status == 200 and told.group(0) in home, home[-2000:]

    (script.parent / "hold").unlink()
    ada.start_server()
    status, _, home = ada.page("/hub/home")
    assert "ddp-lab-stopped" not in home, "the note stays after the server started again"
    kernel = ada.kernel()
    again = kernel.run(CHECK.format(script=str(script)))
    print(f"the next check says:\n{again}")
    assert re.search(r"your check of Step 1 started at [\d:]+ was cut short before its verdict", again), again
    assert "VERDICT pass" in again, again
    assert not ada.marks() and ada.verdict_files() != kept_before
    kernel.shut_down()
    ada.stop_server()
    assert not ada.no_processes_left(), ada.processes()


def _uts(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return ""


def lose_node(cluster: Any, node: str) -> list[int]:
    """The node stops at once, as on a power cut: its slurmd, the job steps and the servers it ran (every
    process in its UTS namespace); the pids killed."""
    namespace = _uts(cluster.pids[node])
    assert namespace and namespace != _uts(os.getpid()), "the emulated node has no namespace of its own"
    killed = []
    for proc in Path("/proc").glob("[0-9]*"):
        if _uts(int(proc.name)) == namespace:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
            except ProcessLookupError:
                pass
    return killed


def test_a_slurm_node_lost_under_a_server_the_learner_is_told_and_starts_on_the_other_node(hub: ClassHub) -> None:
    from autograde.cluster import slurm as slurm_cluster

    folder = hub.folder / "slurm"
    try:
        cluster = slurm_cluster.up(folder)
    except slurm_cluster.ClusterError as err:
        pytest.skip(f"no SLURM here: {err}")
    env = {**os.environ, "SLURM_CONF": str(cluster.conf)}

    def queue() -> list[str]:
        return subprocess.run(["squeue", "-h", "-u", ADA, "-o", "%i %T %N"], capture_output=True, text=True,
                              env=env, timeout=30).stdout.split("\n")[:-1]

    try:
        hub.stop()
        hub.start("slurm", str(cluster.conf))
        ada = Learner(hub, ADA)
        ada.log_in()
        ada.start_server()
        ((job, state, node),) = [line.split() for line in queue()]
        assert state == "RUNNING", queue()
        work = ada.write("ddp-lab-course/my_notes.md", "what I found out\n")
        if FULL:  # a check under way on the node when it goes
            script = slow_script(ada, "lost-node", "a node lost")
            kernel = ada.kernel()
            kernel.read(kernel.send(CHECK.format(script=str(script))), until="running the setup run")
            kernel.close()
        killed = lose_node(cluster, node)
        assert killed and not ada.no_processes_left(15), ada.processes()  # the server went with its node
        lost = time.monotonic()
        if not FULL:  # SLURM would find it lost after SlurmdTimeout (30 s here); an administrator says so at once
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=lost in a test"],
                           env=env, check=True, timeout=30)
        ada.wait_no_server(150, "on the lost node was not noticed gone")
        print(f"\nthe hub noticed the lost node {time.monotonic() - lost:.0f} s after it went")
        status, _, home = ada.page("/hub/home")
        told = re.search(r'id="ddp-lab-stopped">([^<]*)<', home)
        assert status == 200 and told, home[-2000:]
        print(f"the hub's page says: {told.group(1)}")
        assert f"SLURM job {job} ended on node {node}" in told.group(1) and "lost" in told.group(1), told.group(1)

        ada.start_server()
        ((job2, state2, node2),) = [line.split() for line in queue()]
        assert state2 == "RUNNING" and job2 != job and node2 != node, (job, node, queue())
        status, answer = hub.api("GET", f"/user/{ADA}/api/contents/ddp-lab-course/my_notes.md", ada.token)
        assert status == 200 and isinstance(answer, dict) and answer["content"] == work.read_text(), (status, answer)
        if FULL:  # the check cut short on the lost node is named by the next one, on the other node
            (script.parent / "hold").unlink()
            kernel = ada.kernel()
            again = kernel.run(CHECK.format(script=str(script)))
            print(f"the next check, on {node2}, says:\n{again}")
            assert "was cut short before its verdict" in again and "VERDICT pass" in again, again
            kernel.shut_down()
        ada.stop_server()
        deadline = time.monotonic() + 60
        while queue():
            assert time.monotonic() < deadline, f"the job outlived its server: {queue()}"
            time.sleep(1)
    finally:
        hub.stop()
        slurm_cluster.down(folder)
    left = [line for line in _processes_of(ADA)]
    assert not left, left
