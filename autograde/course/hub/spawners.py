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
  CUDA_VISIBLE_DEVICES. It submits as the learner with `runuser` (sudo is not needed).
"""
from __future__ import annotations

import functools
import os
import pwd
import shutil
import sys
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
        "JUPYTER_CONFIG_PATH": str(HUB_JUPYTER),
    }
    if s.slurm_conf:
        env["SLURM_CONF"] = s.slurm_conf
    if s.role(user) == "instructor":
        env.update({
            course_settings.COURSE_DIR: str(home / "grading"),
            "JUPYTER_PREFER_ENV_PATH": "0",  # the instructor's own config (instructor mode) before the environment's
            course_settings.QUICK: "1",  # the formgrader grades in this server: quick mode, as `make grade` does
        })
    return env


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

    async def start(self) -> Any:
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
{% endif %}
set -euo pipefail
trap 'echo SIGTERM received' TERM
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
"""


class SlurmClassSpawner(SlurmSpawner):  # type: ignore[misc]
    """Each class member's server a SLURM job on a GPU node, asking for the settings' [slurm] resources."""

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
