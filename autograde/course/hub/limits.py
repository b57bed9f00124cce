"""Each learner's share of one node: which GPUs their processes see, and a cgroup that caps what all
of them use together (memory, CPU time, number of processes).

The GPU policy, in one place: learner i of n (their place in the settings' `learners`) gets k
consecutive GPUs starting at i*k, wrapping around the node's G GPUs, where k is `gpus_per_learner`,
or else G // n (at least 1). So with G >= n the GPUs are split evenly and nobody shares; with fewer
GPUs than learners, learners i, i+G, i+2G... share GPU i. Instructors see every GPU. No GPU: an
empty CUDA_VISIBLE_DEVICES, so nothing sees one.

The cgroup is ddp-lab/<user> under each controller (cgroup v1: memory, cpu, pids; v2: one folder
with memory.max, cpu.max, pids.max). The hub (root) makes it before the learner's server starts; the
server's first process joins it before it becomes the learner, and everything it starts stays in
it. When the learner's processes together pass the memory limit, the kernel's OOM killer ends the
largest of them (their runaway training), in that cgroup only.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
NAME = "ddp-lab"
V1_CONTROLLERS = ("memory", "cpu", "pids")


def gpus_for(index: int, learners: int, gpus: int, per_learner: int = 0) -> list[int]:
    """The GPU numbers learner `index` (0-based, of `learners`) sees on a node with `gpus` GPUs."""
    if gpus <= 0:
        return []
    k = per_learner or max(1, gpus // max(1, learners))
    return sorted({(index * k + j) % gpus for j in range(min(k, gpus))})


def node_gpus() -> int:
    """How many GPUs nvidia-smi lists on this node (0 without it)."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def visible_devices(gpus: list[int]) -> str:
    return ",".join(map(str, gpus))


@dataclass
class Cgroup:
    """A learner's cgroup: the folders their processes join (one per v1 controller, one in v2)."""
    folders: list[Path]

    def join(self, pid: int = 0) -> None:
        """Put process `pid` (0: the caller) into the cgroup; its children follow."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(pid or os.getpid()))

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        found: set[int] = set()
        for folder in self.folders:
            try:
                found.update(int(line) for line in (folder / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return sorted(found)

    def kill_all(self, seconds: float = 10.0) -> list[int]:
        """SIGKILL every process in the cgroup (a dead server's kernels and runs) until none is left or
        `seconds` pass; the pids that were killed."""
        killed: list[int] = []
        deadline = time.monotonic() + seconds
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        return sorted(set(killed))

    def oom_kills(self) -> int:
        """How many times the kernel killed a process here for the memory limit."""
        for folder in self.folders:
            for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                path = folder / name
                if path.is_file():
                    for line in path.read_text().splitlines():
                        if line.split()[:1] == [key]:
                            return int(line.split()[1])
        return 0


    def refused_forks(self) -> int:
        """How many times a new process was refused here for the process limit."""
        for folder in self.folders:
            path = folder / "pids.events"
            if path.is_file():
                for line in path.read_text().splitlines():
                    if line.split()[:1] == ["max"]:
                        return int(line.split()[1])
        return 0


def cgroup_version() -> int:
    """2 for the unified hierarchy, 1 for v1's memory/cpu/pids, 0 when neither can be written here."""
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        return 2 if os.access(CGROUP_ROOT, os.W_OK) else 0
    if all(os.access(CGROUP_ROOT / c, os.W_OK) for c in V1_CONTROLLERS):
        return 1
    return 0


def _folders(user: str, version: int) -> list[Path]:
    """Where `user`'s cgroup lives: ddp-lab/<user> in the v2 hierarchy, or under each v1 controller."""
    if version == 2:
        return [CGROUP_ROOT / NAME / user]
    return [CGROUP_ROOT / c / NAME / user for c in V1_CONTROLLERS]


def find_cgroup(user: str) -> Cgroup | None:
    """`user`'s cgroup as make_cgroup left it; None where there is none."""
    folders = [f for f in _folders(user, cgroup_version()) if f.is_dir()]
    return Cgroup(folders) if folders else None


def make_cgroup(user: str, memory: int, cpus: float, processes: int) -> Cgroup | None:
    """Create (or update) `user`'s cgroup with these limits; None where cgroups cannot be written."""
    quota = max(1000, int(cpus * CPU_PERIOD_US))
    version = cgroup_version()
    if version == 2:
        parent = CGROUP_ROOT / NAME
        parent.mkdir(exist_ok=True)
        for folder in (CGROUP_ROOT, parent):  # let the children use these controllers
            (folder / "cgroup.subtree_control").write_text("+memory +cpu +pids")
        (leaf,) = _folders(user, 2)
        leaf.mkdir(exist_ok=True)
        (leaf / "memory.max").write_text(str(memory))
        if (leaf / "memory.swap.max").exists():
            (leaf / "memory.swap.max").write_text("0")
        (leaf / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        (leaf / "pids.max").write_text(str(processes))
        return Cgroup([leaf])
    if version == 1:
        folders = dict(zip(V1_CONTROLLERS, _folders(user, 1)))
        for folder in folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        (folders["memory"] / "memory.limit_in_bytes").write_text(str(memory))
        swap = folders["memory"] / "memory.memsw.limit_in_bytes"
        if swap.exists():  # no swapping past the limit either (only where the kernel accounts swap)
            try:
                swap.write_text(str(memory))
            except OSError:
                pass
        (folders["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (folders["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
        (folders["pids"] / "pids.max").write_text(str(processes))
        return Cgroup(list(folders.values()))
    return None


def remove_cgroup(cgroup: Cgroup) -> None:
    """Remove an emptied cgroup's folders, and ddp-lab/ above them once no learner's is left (the kernel
    refuses either while a process or a child group is in it)."""
    for folder in cgroup.folders:
        for empty in (folder, folder.parent):
            try:
                empty.rmdir()
            except OSError:
                pass
