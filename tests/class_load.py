"""`make class-load`: a class of LEARNERS (24) on the course's JupyterHub, every learner running a lab
check in the same minute, as root on this node.

It starts `make hub` (tests/classhub.py's ClassHub: real Unix users named ddpq-*, the class's limits per
learner, [local] checks_at_once), then drives each learner through JupyterHub's REST API and a kernel
as a browser would: a token from their password, their server started, a kernel started through the
server's REST API and spoken to over its websocket. Each learner has a copy of the lab's file in
~/load-check: Step 3's checkpoint (the check must pass) or, for the second learner of every four, Step 2's
(Step 3 not done: the check must FAIL, naming the missing function). Step 3's check launches the learner's
script as 4 processes that train: real load. First one learner checks alone (the baseline), then every
learner checks within SPREAD seconds, while the hub's API (/hub/api/users) is polled and the node's
memory sampled. Then the servers and the hub are stopped and what is left is looked for: processes of
the class's users or of the hub, the users, their cgroups, tickets in the line of checks.

The report (text and JSON) goes to --out; the exit status is 0 when every verdict is the expected one
(none ERROR, none cut short by another learner's load) and nothing is left behind.

    python tests/class_load.py --learners 24 --checks-at-once 2 --out docs/class-load
    python tests/class_load.py --spawner slurm --learners 8      # on the course's emulated cluster
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pwd
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # classhub, browser, conftest: the tests' helpers

from classhub import ClassHub, _all_processes, _user_exists  # noqa: E402
from conftest import ROOT  # noqa: E402
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest  # noqa: E402
from tornado.websocket import websocket_connect  # noqa: E402

from autograde.course.hub import limits  # noqa: E402

PREFIX = "ddpq-"
STEP = "3"
RIGHT, WRONG = ROOT / "solutions" / "fashion_mnist_after_step_3.py", ROOT / "solutions" / "fashion_mnist_after_step_2.py"
FOLDER = "load-check"  # in each learner's home: the file checked
CHECK_CODE = f"""
import json, os, time
os.chdir(os.path.expanduser("~/{FOLDER}"))
from autograde.grading import api
_began = time.monotonic()
(_verdict,) = api.check_steps([{STEP!r}], "fashion_mnist.py", fresh=True)
print("VERDICT " + json.dumps({{"status": _verdict.status, "observed": _verdict.observed,
                               "checker_error": _verdict.checker_error, "seconds": time.monotonic() - _began}}))
"""
WARM_UP = "import autograde.grading.api"  # what a notebook's first cell has imported before its check cell


class LoadError(RuntimeError):
    """The class could not be driven; one line that says where."""


@dataclass
class Learner:
    name: str
    password: str
    right: bool  # the file checked has Step 3 done: the verdict must be pass (else FAIL)
    token: str = ""
    spawn_s: float = 0.0  # from the first ask to a ready server
    spawn_tries: int = 0
    kernel: str = ""
    verdict: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0  # from the execute request to its reply, as the learner waits for it
    output: str = ""
    waited: str = ""  # the first line by which the cell said it waited for a turn
    problem: str = ""

    @property
    def correct(self) -> bool:
        expected = "pass" if self.right else "FAIL"
        return not self.problem and self.verdict.get("status") == expected and not self.verdict.get("checker_error") \
            and (self.right or "worker" in str(self.verdict.get("observed", "")))


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return {"median": round(statistics.median(ordered), 3), "p95": round(p95, 3), "max": round(ordered[-1], 3),
            "count": len(ordered)}


class Client:
    """JupyterHub's REST API and the learners' servers, through the hub's proxy."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = AsyncHTTPClient(force_instance=True, max_clients=128)

    async def call(self, method: str, path: str, token: str = "", body: Any = None, timeout: float = 120) -> Any:
        headers = {"Authorization": f"token {token}"} if token else {}
        request = HTTPRequest(self.url + path, method=method, headers=headers, request_timeout=timeout,
                              body=None if body is None and method == "GET" else json.dumps(body or {}),
                              allow_nonstandard_methods=True)
        try:
            response = await self.http.fetch(request)
        except HTTPClientError as err:
            text = err.response.body.decode(errors="replace")[:300] if err.response else ""
            raise LoadError(f"{method} {path}: HTTP {err.code} {text}") from None
        return json.loads(response.body) if response.body else None

    async def token(self, learner: Learner) -> str:
        reply = await self.call("POST", f"/hub/api/users/{learner.name}/tokens",
                                body={"auth": {"username": learner.name, "password": learner.password},
                                      "note": "class-load"})
        return str(reply["token"])

    async def start_server(self, learner: Learner, timeout: float, tries: int = 3) -> None:
        """Ask for the learner's server and wait until it is ready; a start the hub gave up on (its
        http_timeout) is asked for again, as the learner would press Start again, at most `tries` times."""
        began = time.monotonic()
        await self.call("POST", f"/hub/api/users/{learner.name}/server", learner.token)
        learner.spawn_tries = 1
        while True:
            await asyncio.sleep(1)
            model = await self.call("GET", f"/hub/api/users/{learner.name}", learner.token)
            server = (model.get("servers") or {}).get("")
            if server and server.get("ready"):
                learner.spawn_s = time.monotonic() - began
                return
            if not server and not model.get("pending"):  # the hub gave up on this start
                if learner.spawn_tries >= tries:
                    raise LoadError(f"{learner.name}'s server failed to start {tries} times (the hub's log says why)")
                learner.spawn_tries += 1
                await self.call("POST", f"/hub/api/users/{learner.name}/server", learner.token)
            if time.monotonic() - began > timeout:
                raise LoadError(f"{learner.name}'s server was not ready within {timeout:.0f} s: {model.get('pending')}")

    async def execute(self, learner: Learner, code: str, timeout: float) -> tuple[str, str]:
        """Run `code` in the learner's kernel over its websocket: (its output, the reply's status)."""
        url = self.url.replace("http", "ws", 1) + f"/user/{learner.name}/api/kernels/{learner.kernel}/channels"
        try:  # the server answers once the kernel is up: that may take minutes on a loaded node
            ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {learner.token}"},
                                                     connect_timeout=timeout, request_timeout=timeout),
                                         max_message_size=64 * 2**20)
        except (HTTPClientError, OSError) as err:
            raise LoadError(f"{learner.name}'s kernel websocket: {err}") from None
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": learner.name, "session": uuid.uuid4().hex, "msg_type":
                       "execute_request", "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        output, status, deadline = [], "", time.monotonic() + timeout
        try:
            while not status:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LoadError(f"{learner.name}'s cell gave no reply within {timeout:.0f} s")
                raw = await asyncio.wait_for(ws.read_message(), left)
                if raw is None:
                    raise LoadError(f"{learner.name}'s kernel websocket closed mid-cell")
                message = json.loads(raw)
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = message["header"]["msg_type"], message["content"]
                if kind == "stream":
                    output.append(content["text"])
                elif kind == "error":
                    output.append(f"{content['ename']}: {content['evalue']}")
                elif kind == "execute_reply":
                    status = content["status"]
        except asyncio.TimeoutError:
            raise LoadError(f"{learner.name}'s cell gave no reply within {timeout:.0f} s") from None
        finally:
            ws.close()
        return "".join(output), status


class Sampler:
    """The node's memory in use (MemTotal - MemAvailable) and the class's learners' cgroups together, and
    the hub's API latency, sampled every `every` seconds while `running`."""

    def __init__(self, users: list[str], every: float = 0.5) -> None:
        self.users, self.every = users, every
        self.node: list[float] = []
        self.cgroups: list[float] = []

    def sample(self) -> None:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        kib = int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])
        self.node.append(kib / 2**20)
        total = 0
        for user in self.users:
            group = limits.find_cgroup(user)
            for folder in group.folders if group else []:
                for name in ("memory.usage_in_bytes", "memory.current"):
                    if (folder / name).is_file():
                        total += int((folder / name).read_text())
        self.cgroups.append(total / 2**30)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            try:
                await asyncio.wait_for(stop.wait(), self.every)
            except asyncio.TimeoutError:
                pass


async def hub_latency(client: Client, token: str, stop: asyncio.Event, every: float = 0.5) -> list[float]:
    """GET /hub/api/users (an instructor's token) every `every` s until `stop`: each answer's time in ms."""
    times = []
    while not stop.is_set():
        began = time.monotonic()
        await client.call("GET", "/hub/api/users", token)
        times.append((time.monotonic() - began) * 1000)
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass
    return times


def cgroup_peak(user: str) -> float | None:
    """The most memory `user`'s cgroup has held (GiB): the server, its kernel and their checks together."""
    group = limits.find_cgroup(user)
    for folder in group.folders if group else []:
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            if (folder / name).is_file():
                return int((folder / name).read_text()) / 2**30
    return None


def place_scripts(learners: list[Learner]) -> None:
    """Each learner's file to check, in ~/load-check, theirs (the hub's root writes it as the course's set-up would)."""
    for learner in learners:
        entry = pwd.getpwnam(learner.name)
        folder = Path(entry.pw_dir) / FOLDER
        folder.mkdir(exist_ok=True)
        shutil.copy(RIGHT if learner.right else WRONG, folder / "fashion_mnist.py")
        for path in (folder, folder / "fashion_mnist.py"):
            os.chown(path, entry.pw_uid, entry.pw_gid)


async def check(client: Client, learner: Learner, timeout: float) -> None:
    began = time.monotonic()
    try:
        learner.output, status = await client.execute(learner, CHECK_CODE, timeout)
    except Exception as err:  # this learner's cell had no verdict; the others go on
        learner.problem = f"{type(err).__name__}: {err}"
        return
    learner.seconds = time.monotonic() - began
    learner.waited = next((line for line in learner.output.splitlines() if "waiting for a turn" in line), "")
    found = [line for line in learner.output.splitlines() if line.startswith("VERDICT ")]
    if status != "ok" or not found:
        learner.problem = f"the cell ended {status} without a verdict: {learner.output.strip()[-500:]}"
    else:
        learner.verdict = json.loads(found[-1][len("VERDICT "):])


async def drive(hub: ClassHub, learners: list[Learner], instructor: str, spread: float, logins: float,
                timeout: float, say: Callable[[str], None], baseline: bool = True) -> dict[str, Any]:
    client = Client(hub.url)
    for learner in learners:  # one after another: the hub's PAM
        learner.token = await client.token(learner)
    admin = await client.token(Learner(instructor, hub.passwords[instructor], True))
    sampler = Sampler([learner.name for learner in learners])
    sampler.sample()
    idle_memory = sampler.node[-1]
    stop_sampling = asyncio.Event()
    sampling = asyncio.ensure_future(sampler.run(stop_sampling))
    say(f"{len(learners)} learners log in within {logins:.0f} s")

    async def log_in(learner: Learner) -> None:
        """The learner logs in, opens a notebook (a kernel) and runs its first cell (the imports)."""
        await asyncio.sleep(random.uniform(0, logins))
        await client.start_server(learner, timeout)
        learner.kernel = str((await client.call("POST", f"/user/{learner.name}/api/kernels", learner.token,
                                                body={"name": "python3"}, timeout=timeout))["id"])
        await client.execute(learner, WARM_UP, timeout)

    began = time.monotonic()
    await asyncio.gather(*(log_in(learner) for learner in learners))
    servers_s = time.monotonic() - began
    sampler.sample()
    idle_class_memory, idle_cgroups = sampler.node[-1], sampler.cgroups[-1]
    stop = asyncio.Event()
    idle_latency_task = asyncio.ensure_future(hub_latency(client, admin, stop))
    say(f"the servers are up after {servers_s:.0f} s; {learners[0].name} checks alone (the baseline)")
    alone = Learner(learners[0].name, learners[0].password, learners[0].right, learners[0].token,
                    kernel=learners[0].kernel)
    if baseline:
        await check(client, alone, timeout)
    stop.set()
    idle_latency = await idle_latency_task
    say(f"alone: {alone.verdict.get('status')} in {alone.seconds:.1f} s; now every learner within {spread:.0f} s")
    stop = asyncio.Event()
    storm_latency_task = asyncio.ensure_future(hub_latency(client, admin, stop))
    memory_before_storm = len(sampler.node)

    async def one(learner: Learner) -> None:
        await asyncio.sleep(random.uniform(0, spread))
        await check(client, learner, timeout)

    began = time.monotonic()
    await asyncio.gather(*(one(learner) for learner in learners))
    storm_s = time.monotonic() - began
    sampler.sample()  # every learner has checked, none checks now: each kernel keeps its warm-start server
    after_cgroups = sampler.cgroups[-1]
    stop.set()
    storm_latency = await storm_latency_task
    stop_sampling.set()
    await sampling
    say(f"the storm took {storm_s:.0f} s; stopping the servers")
    peaks = [peak for learner in learners if (peak := cgroup_peak(learner.name)) is not None]
    for learner in learners:
        try:
            await client.call("DELETE", f"/user/{learner.name}/api/kernels/{learner.kernel}", learner.token)
            await client.call("DELETE", f"/hub/api/users/{learner.name}/server", learner.token)
        except LoadError as err:
            learner.problem = learner.problem or f"stopping the server: {err}"
    client.http.close()
    seconds = [learner.seconds for learner in learners if learner.verdict]
    return {
        "alone": {"status": alone.verdict.get("status"), "seconds": round(alone.seconds, 3),
                  "problem": alone.problem},
        "servers": {"all_ready_s": round(servers_s, 1), "logins_s": logins,
                    "spawn_s": summary([x.spawn_s for x in learners]),
                    "asked_again": sum(x.spawn_tries > 1 for x in learners)},
        "verdict_s": summary(seconds),
        "ratio_to_alone": summary([s / alone.seconds for s in seconds]) if alone.seconds else {},
        "storm_s": round(storm_s, 1),
        "waited": sum(bool(x.waited) for x in learners),
        "hub_api_ms": {"idle": summary(idle_latency), "storm": summary(storm_latency)},
        "memory_gib": {"node_before_hub": None, "node_idle_class": round(idle_class_memory, 2),
                       "node_at_start": round(idle_memory, 2), "node_peak": round(max(sampler.node), 2),
                       "node_peak_storm": round(max(sampler.node[memory_before_storm:] or [0]), 2),
                       "class_cgroups_idle": round(idle_cgroups, 2), "class_cgroups_peak": round(max(sampler.cgroups), 2),
                       "learner_idle": round(idle_cgroups / len(learners), 3),
                       "class_cgroups_after": round(after_cgroups, 2),
                       "learner_after_check": round(after_cgroups / len(learners), 3),
                       "learner_peak": summary(peaks)},
        "learners": [{k: v for k, v in asdict(x).items() if k not in ("password", "token", "output")}
                     | {"correct": x.correct, "output_tail": x.output[-600:]} for x in learners],
    }


def left_behind(hub: ClassHub, users: list[str], spawner: str, slurm_env: dict[str, str]) -> dict[str, list[str]]:
    """What is left once the hub has stopped and its users are removed: processes, users, cgroups, tickets, jobs."""
    left: dict[str, list[str]] = {"processes": hub.leftovers()}
    hub.remove()
    left["users"] = [u for u in users if _user_exists(u)]
    left["cgroups"] = [u for u in users if limits.find_cgroup(u)]
    left["line_of_checks"] = [str(p) for p in hub.check_queue.glob("*")] if hub.check_queue.exists() else []
    left["processes"] += [line for line in _all_processes() if PREFIX in line and "class_load" not in line]
    if spawner == "slurm":
        jobs = subprocess.run(["squeue", "-h", "-o", "%u %j"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **slurm_env}).stdout.split("\n")
        left["jobs"] = [job for job in jobs if PREFIX in job]
    return {k: v for k, v in left.items() if v}


def report_text(result: dict[str, Any]) -> str:
    c, m, lat = result["config"], result["memory_gib"], result["hub_api_ms"]
    wrong = [x for x in result["learners"] if not x["correct"]]

    def fig(s: dict[str, float], unit: str) -> str:
        return f"median {s.get('median')} {unit}, p95 {s.get('p95')} {unit}, max {s.get('max')} {unit}" if s else "none"

    where = (f"one node, spawner local: a line of {c['checks_at_once']} checks at once" if c["checks_at_once"] else
             "one node, spawner local: no line of checks") if c["spawner"] == "local" else \
        "the course's SLURM of 2 emulated nodes on this machine, spawner slurm: no line (each job its own share)"
    lines = [
        f"A class of {c['learners']} on {where}; each learner {c['memory'] + ' and' if c['spawner'] == 'local' else 'a job of'} "
        f"{c['cpus']} CPU; this machine: {c['cores']} cores, {c['memory_gib']} GiB",
        f"command: {c['command']}",
        f"each learner: Step {STEP}'s check of their own fashion_mnist.py (4 processes train), every learner within "
        f"{c['spread_s']} s; one in four has Step 3 not done (expected FAIL), the others pass",
        f"verdicts: {len(result['learners']) - len(wrong)} of {len(result['learners'])} as expected "
        f"(ERROR: {sum(x['verdict'].get('status') == 'ERROR' for x in result['learners'])}, no verdict: "
        f"{sum(not x['verdict'] for x in result['learners'])})",
        f"one learner alone: {result['alone']['status']} in {result['alone']['seconds']} s" if result["alone"]["status"]
        else "one learner alone: not measured (--no-alone)",
        f"time to each verdict in the storm: {fig(result['verdict_s'], 's')}",
        f"  as a multiple of alone: {fig(result['ratio_to_alone'], 'x')}",
        f"  cells that said they waited for a turn: {result['waited']} of {len(result['learners'])}; the storm took "
        f"{result['storm_s']} s",
        f"servers: the learners logged in within {result['servers']['logins_s']:.0f} s, all {c['learners']} servers, kernels "
        "and first cells ready after "
        f"{result['servers']['all_ready_s']} s (each from its ask: {fig(result['servers']['spawn_s'], 's')}; "
        f"started again after the hub gave up on a start: {result['servers']['asked_again']})",
        f"hub API (GET /hub/api/users): idle {fig(lat['idle'], 'ms')}; during the checks {fig(lat['storm'], 'ms')}",
        f"memory: node in use before the hub {m['node_before_hub']} GiB, with the class's servers and kernels idle "
        f"{m['node_idle_class']} GiB, peak {m['node_peak']} GiB (other programs of this machine included)"
        + ("" if c["spawner"] != "local" else f"; the class's cgroups together {m['class_cgroups_idle']} GiB idle (a server and its kernel: "
        f"{m['learner_idle']} GiB a learner), at most {m['class_cgroups_peak']} GiB, {m.get('class_cgroups_after')} GiB once "
        f"all had checked ({m.get('learner_after_check')} GiB a learner: the kernel keeps its warm-start server, torch "
        f"imported, for 10 idle minutes); a learner's own peak (server, kernel and check): {fig(m['learner_peak'], 'GiB')}"),
        f"left behind: {result['left_behind'] or 'nothing (no process, user, cgroup, ticket' + (', job' if c['spawner'] == 'slurm' else '') + ')'}",
    ]
    lines += [f"  {x['name']}: {x['problem'] or x['verdict']}" for x in wrong]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=24)
    parser.add_argument("--checks-at-once", type=int, default=2, help="[local] checks_at_once (0: no line)")
    parser.add_argument("--spawner", choices=("local", "slurm"), default="local")
    parser.add_argument("--memory", default="1500M", help="each learner's memory limit ([local] memory)")
    parser.add_argument("--cpus", type=float, default=1.0, help="each learner's CPU limit ([local] cpus)")
    parser.add_argument("--spread", type=float, default=20.0, help="seconds over which the learners press their cell")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for a server, or a cell, at most")
    parser.add_argument("--logins", type=float, default=None,
                        help="seconds over which the learners log in, each starting their server (default 8 a learner)")
    parser.add_argument("--no-alone", action="store_true", help="no baseline of one learner checking alone")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "ddp-lab-class-load")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: run it as root: it creates Unix users and runs the hub as root", file=sys.stderr)
        return 2
    if args.learners < 1 or args.checks_at_once < 0:
        print("error: --learners >= 1 and --checks-at-once >= 0, please", file=sys.stderr)
        return 2
    name = f"{args.spawner}-{args.learners}"
    args.out.mkdir(parents=True, exist_ok=True)
    artifacts = Path(tempfile.mkdtemp(prefix="ddp-lab-class-load-"))
    users = [f"{PREFIX}{i:02d}" for i in range(1, args.learners + 1)]
    instructor = f"{PREFIX}teacher"
    slurm_env: dict[str, str] = {}
    hub = ClassHub(artifacts, [instructor], users, memory=args.memory, cpus=args.cpus,
                   checks_at_once=args.checks_at_once if args.spawner == "local" else 0, slurm_gpus=0)
    learners = [Learner(u, hub.passwords[u], right=i % 4 != 1) for i, u in enumerate(users)]

    def say(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    memory_before = Sampler([])
    memory_before.sample()
    result: dict[str, Any] = {}
    failure = ""
    try:
        hub.add_users()
        hub.open_course()
        place_scripts(learners)
        if args.spawner == "slurm":
            from conftest import Slurm

            slurm_env = Slurm().env
        hub.start(args.spawner, slurm_env.get("SLURM_CONF", ""))
        say(f"the hub is up at {hub.url} (its log: {hub.log_path})")
        logins = 8.0 * args.learners if args.logins is None else args.logins
        result = asyncio.run(drive(hub, learners, instructor, args.spread, logins, args.timeout, say, not args.no_alone))
    except Exception as err:  # one line, whatever stopped the class (the hub is stopped and its users removed below)
        failure = str(err).splitlines()[0] if str(err) else type(err).__name__
    finally:
        hub.stop()
        left = left_behind(hub, [*users, instructor], args.spawner, slurm_env)
    if failure:
        print(f"error: {failure} (the hub's log: {hub.log_path})", file=sys.stderr)
        return 1
    result["memory_gib"]["node_before_hub"] = round(memory_before.node[0], 2)
    result["left_behind"] = left
    result["config"] = {"learners": args.learners, "spawner": args.spawner, "checks_at_once": args.checks_at_once
                        if args.spawner == "local" else 0, "memory": args.memory, "cpus": args.cpus,
                        "spread_s": args.spread, "cores": os.cpu_count(),
                        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                        "command": f"make class-load LEARNERS={args.learners} "
                                   + (f"CHECKS_AT_ONCE={args.checks_at_once} " if args.spawner == "local" else "")
                                   + f"SPAWNER={args.spawner} (tests/class_load.py {' '.join(argv or sys.argv[1:])})",
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    text = report_text(result)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{name}.txt").write_text(text)
    print(text + f"(written to {args.out / name}.txt and .json)")
    ok = all(x["correct"] for x in result["learners"]) and not left
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
