"""The class's two spawners, chosen by the settings' `spawner`; the hub runs as root.

Both start a class member's server as that Unix user with the course's environment (its Python is
the kernel), through `python -m autograde.course.hub.start` (the first login's copy of the course),
and give it the class's environment: its role, the shared data, nbgrader's exchange
(deploy/jupyterhub/jupyter/nbgrader_config.py reads DDP_LAB_EXCHANGE) and, for an instructor,
the course folder ~/grading and instructor mode.

- LocalClassSpawner (spawner = "local"): a process on this node. Before it becomes the learner it
  joins the learner's cgroup (limits.py: memory, CPU, processes), and it sees the learner's GPUs
  only (CUDA_VISIBLE_DEVICES, limits.gpus_for). With [local] checks_at_once > 0 its checks wait
  their turn in the node's line (autograde/grading/turns.py): N run at once, one per learner.
- SlurmClassSpawner (spawner = "slurm"): a SLURM job (batchspawner's SlurmSpawner) asking for the
  settings' [slurm] partition, time, memory, CPUs and GPUs; SLURM enforces them and sets the job's
  CUDA_VISIBLE_DEVICES. It submits as the learner with `runuser` (sudo is not needed). A job that
  loses its node ends (--no-requeue) instead of waiting to start again elsewhere under the old server.

When the hub finds a server gone that nobody stopped (killed, out of its job's time, its node lost),
the spawner keeps why (`STOPPED`); the hub's pages show it to the learner until they start again
(jupyterhub_config.py: the `announcement`). A local server that died leaves nothing running: what
is left in the learner's cgroup (a check's runs, a kernel) is killed.
"""
from __future__ import annotations

import asyncio
import functools
import html
import json
import os
import pwd
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from batchspawner import SlurmSpawner  # also registers batchspawner's API handler in the hub
from jupyterhub.spawner import LocalProcessSpawner
from traitlets import default

from autograde import settings as course_settings
from autograde.course.hub import limits
from autograde.course.hub.settings import ClassSettings, load, size_in_bytes
from autograde.grading import turns

HUB_JUPYTER = course_settings.REPO / "deploy" / "jupyterhub" / "jupyter"  # nbgrader settings every server reads
BIN = Path(sys.executable).parent  # the course's environment, which runs the hub


@functools.cache
def settings() -> ClassSettings:
    return load()


@functools.cache
def _node_gpus() -> int:
    gpus = settings().local.gpus
    return gpus if isinstance(gpus, int) else limits.node_gpus()


def start_command() -> list[str]:
    """What a server runs first, as the user: the first login's setup (start.py)."""
    return [str(BIN / "python"), "-m", f"{__package__}.start"]


def grading_folder(instructor: str) -> Path:
    """An instructor's nbgrader course folder (gradebook, submissions, the capstone's leaderboard): ~/grading."""
    return Path(pwd.getpwnam(instructor).pw_dir) / "grading"


def class_env(user: str) -> dict[str, str]:
    """The environment a class member's server gets on top of JupyterHub's own."""
    s = settings()
    home = Path(pwd.getpwnam(user).pw_dir)
    env = {
        "PATH": os.pathsep.join([str(BIN), "/usr/local/bin", "/usr/bin", "/bin"]),
        "PYTHONPATH": str(s.course),  # the settings' course is the autograde every kernel and check imports
        course_settings.ROLE: s.role(user),
        course_settings.CLASS_COURSE: str(s.course),  # what start.py copies and builds the instructor's sources from
        course_settings.DATA_DIR: str(s.data_dir),
        course_settings.EXCHANGE: str(s.exchange),
        # kept verdicts, and the marks of checks under way, in the home: the same on every node of a cluster
        course_settings.CACHE_DIR: str(home / ".cache" / "ddp-lab-verdicts"),
        course_settings.CAPSTONE_SPEEDUPS: ",".join(map(str, s.capstone.speedups)),  # the class's, for checks and grading
        "JUPYTER_CONFIG_PATH": str(HUB_JUPYTER),
    }
    if s.slurm_conf:
        env["SLURM_CONF"] = s.slurm_conf
    if s.role(user) == "instructor":
        env.update({
            course_settings.COURSE_DIR: str(grading_folder(user)),
            "JUPYTER_PREFER_ENV_PATH": "0",  # the instructor's own config (instructor mode) before the environment's
            course_settings.QUICK: "1",  # the formgrader grades in this server: quick mode, as `make grade` does
        })
    return env


AFTER_STOP = ("Your files are all kept in your home folder. A check that was running then gave no verdict "
              "and none was kept: start your server again and run the check again.")


# Why each user's server stopped by itself, until they start one again: kept here, since the hub drops a
# stopped server's Spawner object (and with it anything the Spawner knew), and in NOTES (the hub's state
# folder, set by jupyterhub_config.py), so that a restarted hub still says it.
STOPPED: dict[str, str] = {}
NOTES: list[Path] = []


def keep_notes(path: Path) -> None:
    """Keep the notes in `path` from now on, starting from those a hub before this one left there."""
    NOTES[:] = [path]
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(found, dict):
        STOPPED.update({str(user): str(why) for user, why in found.items()})


def _note(user: str, why: str | None) -> None:
    """Note why `user`'s server stopped by itself (None: it started again, nothing to say)."""
    if why is None:
        if STOPPED.pop(user, None) is None:
            return
    else:
        STOPPED[user] = why
    for path in NOTES:
        try:
            path.write_text(json.dumps(STOPPED))
        except OSError:
            pass  # the note is then lost with the hub only


def announcement(user: Any) -> str:
    """The hub's announcement for `user` (c.JupyterHub.template_vars): why their server stopped, as HTML."""
    why = STOPPED.get(str(getattr(user, "name", "")), "") if user is not None else ""
    return f'<span id="ddp-lab-stopped">{html.escape(why)}</span>' if why else ""


def _command(pid: int) -> str:
    """The start of process `pid`'s command line, for the hub's log."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80].strip()
    except OSError:
        return ""


def _now() -> str:
    return time.strftime("%H:%M:%S %Z")


def _exit_status(status: int) -> str:
    if status < 0:
        try:
            return f"it was killed ({signal.Signals(-status).name})"
        except ValueError:
            return f"it was killed (signal {-status})"
    return f"it exited with status {status}" if status else "it is no longer running"


def queue_env(s: ClassSettings, user: str) -> dict[str, str]:
    """A learner's line of checks on a local node (grading/turns.py), where [local] checks_at_once > 0."""
    if user not in s.learners or not s.local.checks_at_once:
        return {}
    return {course_settings.CHECK_QUEUE: str(s.check_queue), course_settings.CHECKS_AT_ONCE: str(s.local.checks_at_once)}


class LocalClassSpawner(LocalProcessSpawner):  # type: ignore[misc]
    """A local process per class member, in the member's cgroup, seeing the member's GPUs."""

    cgroup: limits.Cgroup | None = None

    @default("cmd")
    def _cmd(self) -> list[str]:
        return [*start_command(), str(BIN / "jupyterhub-singleuser")]

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        user = self.user.name
        env.update(class_env(user))
        s = settings()
        env["OMP_NUM_THREADS"] = str(max(1, int(s.local.cpus)))
        if user in s.learners:
            env["CUDA_VISIBLE_DEVICES"] = limits.visible_devices(
                limits.gpus_for(s.learners.index(user), len(s.learners), _node_gpus(), s.local.gpus_per_learner))
        env.update(queue_env(s, user))
        return env

    def make_preexec_fn(self, name: str) -> Callable[[], None]:
        become_user = super().make_preexec_fn(name)
        cgroup = self.cgroup

        def preexec() -> None:
            if cgroup is not None:
                cgroup.join()  # while still root: a learner may not move itself between cgroups
            become_user()

        return preexec

    async def poll(self) -> int | None:
        """None while the server runs; once it is found dead, the hub's note of why, and nothing of it left."""
        was_running = bool(self.pid) and not self._stop_pending  # not while the hub stops it
        status: int | None = await super().poll()
        if status is not None and was_running:
            _note(self.user.name, f"Your server stopped by itself at {_now()}: {_exit_status(status)}, without "
                                  f"being stopped from the hub. {AFTER_STOP}")
            self.log.warning("%s's server stopped by itself (status %s)", self.user.name, status)
            cgroup = limits.find_cgroup(self.user.name)
            if cgroup is not None:
                commands = {pid: _command(pid) for pid in cgroup.pids()}
                left = await asyncio.to_thread(cgroup.kill_all)
                if left:
                    self.log.warning("killed %d process(es) %s's dead server left: %s", len(left), self.user.name,
                                     "; ".join(f"{pid} {commands.get(pid, '')}" for pid in left))
        return status

    async def start(self) -> Any:
        _note(self.user.name, None)
        s, user = settings(), self.user.name
        if user in s.learners and s.local.checks_at_once:
            turns.make_folder(s.check_queue)  # root's, sticky: each learner removes only their own tickets
        if user in s.learners:
            self.cgroup = limits.make_cgroup(user, size_in_bytes(s.local.memory), s.local.cpus, s.local.processes)
            if self.cgroup is None:
                self.log.warning("no limits for %s: this machine's cgroups cannot be written (run the hub as root "
                                 "on a host with cgroup v1 or v2)", user)
        return await super().start()


SLURM_SCRIPT = """#!/bin/bash
#SBATCH --output={{homedir}}/jupyterhub_slurmspawner_%j.log
#SBATCH --job-name=ddp-lab-{{username}}
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if gres %}#SBATCH --gres={{gres}}
{% endif %}{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}#SBATCH --no-requeue

set -euo pipefail
trap 'echo SIGTERM received' TERM
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
"""


SLURM_ENDS = {  # squeue's state of a job that ended, as a learner is told it
    "NODE_FAIL": "the node it ran on stopped answering (lost)",
    "TIMEOUT": "it reached the class's time limit",
    "CANCELLED": "it was cancelled",
    "PREEMPTED": "it was preempted",
    "OUT_OF_MEMORY": "it ran out of memory",
    "FAILED": "it failed",
    "COMPLETED": "the server in it exited",
}


def slurm_end(job: str, seen: str) -> str:
    """Why a learner's job `job` is gone, from squeue's last line for it ('NODE_FAIL n1'; '' once forgotten)."""
    state, _, node = seen.strip().partition(" ")
    state = re.sub(r"\W.*", "", state)  # CANCELLED+ -> CANCELLED
    if not re.fullmatch(r"[A-Z_]+", state):  # squeue's error (the job forgotten), not a state
        state, node = "", ""
    where = f" on node {node.strip()}" if node.strip() else ""
    return f"its SLURM job {job} ended{where}: {SLURM_ENDS.get(state, state.lower() or 'it is no longer in the queue')}"


class SlurmClassSpawner(SlurmSpawner):  # type: ignore[misc]
    """Each class member's server a SLURM job on a GPU node, asking for the settings' [slurm] resources."""

    last_seen = ""  # squeue's last line on the job, kept past batchspawner's clear_state

    @default("batch_query_cmd")
    def _query(self) -> str:  # every state: a job that ended (NODE_FAIL, TIMEOUT) is shown a while, and why
        return "squeue -h -t all -j {job_id} -o '%T %B'"

    async def query_job_status(self) -> Any:
        status = await super().query_job_status()
        self.last_seen = str(self.job_status or "")
        return status

    async def poll(self) -> int | None:
        job = self.job_id if not self._stop_pending else ""  # not while the hub stops it
        status: int | None = await super().poll()
        if status is not None and job:
            _note(self.user.name, f"Your server stopped by itself at {_now()}: {slurm_end(job, self.last_seen)}. "
                                  f"{AFTER_STOP} A new job starts on a node that is up.")
            self.log.warning("%s's server stopped by itself: job %s, %r", self.user.name, job, self.last_seen)
        return status

    async def start(self) -> Any:
        _note(self.user.name, None)
        return await super().start()

    @default("cmd")
    def _cmd(self) -> list[str]:
        return [str(BIN / "jupyterhub-singleuser")]

    @default("exec_prefix")
    def _exec_prefix(self) -> str:
        return f"{shutil.which('runuser') or '/usr/sbin/runuser'} -u {{username}} --"

    @default("batch_script")
    def _batch_script(self) -> str:
        return SLURM_SCRIPT

    @default("batchspawner_singleuser_cmd")
    def _singleuser(self) -> str:
        return str(BIN / "batchspawner-singleuser")

    @default("req_prologue")
    def _prologue(self) -> str:
        return " ".join(start_command())  # the first login's copy, on the node, as the user

    @default("req_partition")
    def _partition(self) -> str:
        return settings().slurm.partition

    @default("req_runtime")
    def _runtime(self) -> str:
        return settings().slurm.time

    @default("req_memory")
    def _memory(self) -> str:
        return settings().slurm.memory

    @default("req_nprocs")
    def _nprocs(self) -> str:
        return str(settings().slurm.cpus)

    @default("req_gres")
    def _gres(self) -> str:
        gpus = settings().slurm.gpus
        return f"gpu:{gpus}" if gpus else ""

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        env.update(class_env(self.user.name))
        env["OMP_NUM_THREADS"] = str(settings().slurm.cpus)
        return env


def spawner_class(s: ClassSettings) -> type:
    return SlurmClassSpawner if s.spawner == "slurm" else LocalClassSpawner
