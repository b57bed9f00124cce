"""A real SLURM cluster on this one machine: munge, the controller and N emulated nodes.

    python -m autograde.cluster.slurm up [--folder DIR] [--nodes 2]   # prints the SLURM_CONF to export
    python -m autograde.cluster.slurm down [--folder DIR]
    (make slurm-up / make slurm-down)
    python -m autograde.cluster.slurm job [SBATCH OPTIONS] SCRIPT [ARGS]   # sbatch in the foreground

Debian's slurmctld, slurmd, slurm-client and munge packages (SLURM 22.05) are installed with
apt-get where they are missing and this runs as root. Everything the cluster writes lives in one
folder: munge's key and socket, slurm.conf, the state and spool folders, the logs, and
cluster.json (the daemons' pids). The controller runs in a UTS namespace of its own whose host
name is `ctl`, and node k in one whose host name is `nk`, at the address 127.0.0.k with a port of
its own, so that srun's tasks see their node's name and SLURM_* variables as on a real cluster; the
names resolve through lines this adds to /etc/hosts (and removes again). `up` waits until `sinfo`
shows every node idle; `down` cancels every job, waits for them to end, then stops each daemon it
started, by pid. Each node declares 32 CPUs, 64 GB and 4 GPUs (gres, whose "devices" are empty files), so
that the course's batch scripts run as written; the tasks use this machine's CPUs. What it cannot
show: real networks, real GPUs, accounting (sacct needs slurmdbd and a database) and cgroup limits.

`job` is sbatch as a command that ends with its job: it submits, follows the job's output, exits
with the job's exit status, and cancels the job if it is stopped itself (SIGTERM, Ctrl-C). It
talks to whichever SLURM sbatch finds (SLURM_CONF), a real cluster's as well as this one's; it
polls every 0.2 s where `sbatch --wait` sleeps 2, 8 then 32 s between looks.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from autograde.cluster import debian
from autograde.engine import processes

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
COMMANDS = ("slurmctld", "slurmd", "sinfo", "srun", "sbatch", "scancel", "squeue", "munged")
DEFAULT_FOLDER = Path(tempfile.gettempdir()) / "ddp-lab-slurm"
HOSTS = Path("/etc/hosts")
UP_SECONDS, DOWN_SECONDS = 60.0, 30.0
MEMORY_MB = 64_000  # each node's declared memory, for jobs that ask for some (--mem); not enforced (CR_Core)


class ClusterError(RuntimeError):
    """The cluster could not be brought up, with what to do about it."""


@dataclass
class Cluster:
    folder: Path
    nodes: list[str]
    pids: dict[str, int] = field(default_factory=dict)  # daemon name ("munged", "slurmctld", "n1", ...) -> pid
    hosts_marker: str = ""

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a command needs to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def save(self) -> None:
        data = {**asdict(self), "folder": str(self.folder)}
        (self.folder / "cluster.json").write_text(json.dumps(data))

    @classmethod
    def load(cls, folder: Path) -> Cluster:
        data = json.loads((folder / "cluster.json").read_text())
        return cls(Path(data["folder"]), data["nodes"], data["pids"], data["hosts_marker"])


def install() -> str | None:
    """Install SLURM and munge where they are missing; None when they are there, else why not."""
    return debian.install(PACKAGES, COMMANDS)


def _conf(folder: Path, nodes: list[str], cpus: int, gpus: int) -> str:
    ctl_port, node_ports = processes.free_port(), [processes.free_port() for _ in nodes]
    lines = [
        "ClusterName=ddplab",
        "SlurmctldHost=ctl(127.0.0.1)",
        f"SlurmctldPort={ctl_port}",
        "AuthType=auth/munge", f"AuthInfo=socket={folder}/munge/munge.sock", "CredType=cred/munge",
        "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool/%n",
        f"SlurmctldPidFile={folder}/run/slurmctld.pid", f"SlurmdPidFile={folder}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/log/slurmctld.log", f"SlurmdLogFile={folder}/log/slurmd-%n.log",
        "ProctrackType=proctrack/pgid", "TaskPlugin=task/none", "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2", "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "SwitchType=switch/none", "InactiveLimit=0", "KillWait=5", "MinJobAge=300", "SlurmctldTimeout=30",
        "SlurmdTimeout=30", "Waittime=0", "GresTypes=gpu", "SlurmdParameters=config_overrides",
    ]
    for k, (name, port) in enumerate(zip(nodes, node_ports)):
        lines.append(f"NodeName={name} NodeAddr=127.0.0.{k + 1} Port={port} CPUs={cpus} RealMemory={MEMORY_MB} "
                     f"Gres=gpu:{gpus} State=UNKNOWN")
    lines.append(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _add_hosts(cluster: Cluster) -> None:
    """The node names (and the controller's) resolve to their addresses, for a rendezvous by name."""
    cluster.hosts_marker = f"# ddp-lab-slurm {cluster.folder}"
    lines = [f"127.0.0.1 ctl {cluster.hosts_marker}"]
    lines += [f"127.0.0.{k + 1} {name} {cluster.hosts_marker}" for k, name in enumerate(cluster.nodes)]
    with HOSTS.open("a") as f:
        f.write("\n".join(lines) + "\n")


def _remove_hosts(cluster: Cluster) -> None:
    if cluster.hosts_marker and HOSTS.exists():
        kept = [line for line in HOSTS.read_text().splitlines(keepends=True) if cluster.hosts_marker not in line]
        HOSTS.write_text("".join(kept))


def _start(cluster: Cluster, name: str, command: list[str], hostname: str | None = None) -> None:
    """A daemon in the foreground, in a session (and, with `hostname`, a UTS namespace) of its own."""
    if hostname is not None:  # unshare execs sh, which execs the daemon: the pid stays the daemon's
        command = ["unshare", "-u", "sh", "-c", f"hostname {hostname} && exec \"$@\"", "sh", *command]
    log = (cluster.folder / "log" / f"{name}.out").open("w")
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, env=cluster.env)
    cluster.pids[name] = process.pid
    cluster.save()


def _idle(cluster: Cluster) -> list[str]:
    result = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=cluster.env,
                            timeout=20)
    return [line.split()[0] for line in result.stdout.splitlines() if line.split()[1:] == ["idle"]]


def up(folder: Path = DEFAULT_FOLDER, nodes: int = 2, cpus: int = 32, gpus: int = 4) -> Cluster:
    """Bring the cluster up (installing what is missing) and wait until every node is idle."""
    why = install()
    if why is not None:
        raise ClusterError(why)
    if os.geteuid() != 0:
        raise ClusterError("an emulated SLURM cluster needs root (its daemons run as root, in UTS namespaces)")
    if (folder / "cluster.json").exists():
        down(folder)
    shutil.rmtree(folder, ignore_errors=True)
    for sub in ("munge", "state", "spool", "log", "run"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    # every user may reach munge's socket (a class's learners submit jobs: make hub's SLURM spawner);
    # the key in it stays root's alone (0400)
    (folder / "munge").chmod(0o711)
    cluster = Cluster(folder, [f"n{k + 1}" for k in range(nodes)])
    try:
        key = folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        _start(cluster, "munged", ["munged", "--foreground", "--force", f"--socket={folder}/munge/munge.sock",
                                   f"--key-file={key}", f"--pid-file={folder}/munge/munged.pid",
                                   f"--log-file={folder}/log/munged.log", f"--seed-file={folder}/munge/seed"])
        cluster.conf.write_text(_conf(folder, cluster.nodes, cpus, gpus))
        (folder / "dev").mkdir()
        for k in range(gpus):
            (folder / "dev" / f"gpu{k}").touch()
        (folder / "gres.conf").write_text(f"Name=gpu File={folder}/dev/gpu[0-{gpus - 1}]\n")
        _add_hosts(cluster)
        cluster.save()
        _start(cluster, "slurmctld", ["slurmctld", "-D", "-i", "-f", str(cluster.conf)], hostname="ctl")
        for name in cluster.nodes:
            _start(cluster, name, ["slurmd", "-D", "-N", name, "-f", str(cluster.conf)], hostname=name)
        deadline = time.monotonic() + UP_SECONDS
        while sorted(_idle(cluster)) != sorted(cluster.nodes):
            dead = [name for name, pid in cluster.pids.items() if not _alive(pid)]
            if dead or time.monotonic() > deadline:
                log = folder / "log"
                raise ClusterError(f"the cluster did not come up ({'daemons ' + ', '.join(dead) + ' exited' if dead else f'nodes not idle after {UP_SECONDS:.0f} s'}): "
                                   f"see {log}")
            time.sleep(0.5)
    except BaseException:
        down(folder)
        raise
    return cluster


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it if it has exited
        if waited == pid:
            return False
    except ChildProcessError:
        pass  # not our child (another process started the cluster)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def down(folder: Path = DEFAULT_FOLDER) -> None:
    """Cancel every job, then stop every daemon `up` started in `folder`, by pid, and undo /etc/hosts."""
    if not (folder / "cluster.json").exists():
        return
    cluster = Cluster.load(folder)
    if "slurmctld" in cluster.pids and _alive(cluster.pids["slurmctld"]):
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=cluster.env, timeout=20)
        deadline = time.monotonic() + DOWN_SECONDS
        while time.monotonic() < deadline:
            queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=cluster.env, timeout=20)
            if queue.returncode != 0 or not queue.stdout.strip():
                break
            time.sleep(0.5)
    for name in [*cluster.nodes, "slurmctld", "munged"]:  # the nodes first: they report to the controller
        pid = cluster.pids.get(name)
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_SECONDS
    while any(_alive(pid) for pid in cluster.pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in cluster.pids.values():
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    _remove_hosts(cluster)
    (folder / "cluster.json").unlink()


def running(folder: Path = DEFAULT_FOLDER) -> Cluster | None:
    """The cluster `up` started in `folder`, if every one of its daemons is still running."""
    try:
        cluster = Cluster.load(folder)
    except (OSError, ValueError, KeyError):
        return None
    return cluster if cluster.pids and all(_alive(pid) for pid in cluster.pids.values()) else None


def system_slurm() -> bool:
    """Whether sbatch already has a SLURM of its own to talk to (a real cluster's login node, or
    SLURM_CONF exported after `make slurm-up`), which is then used as it is."""
    return bool(os.environ.get("SLURM_CONF")) or Path("/etc/slurm/slurm.conf").exists()


@contextmanager
def available(folder: Path = DEFAULT_FOLDER) -> Iterator[dict[str, str]]:
    """The environment in which sbatch and srun reach a SLURM: the system's (as it is), the course's
    cluster already running in `folder`, or one brought up for the while and taken down after.
    Raises ClusterError, with what to do, where there can be none."""
    if system_slurm():
        yield {}
        return
    found = running(folder)
    if found is not None:
        yield {"SLURM_CONF": str(found.conf)}
        return
    cluster = up(folder)
    try:
        yield {"SLURM_CONF": str(cluster.conf)}
    finally:
        down(folder)


# --- sbatch as a command that ends with its job ------------------------------------------------

DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
        "DEADLINE", "SPECIAL_EXIT", "REVOKED"}


def _job_fields(job: str) -> dict[str, str]:
    """`scontrol show job -o`'s KEY=VALUE fields of the job (empty once SLURM forgot it)."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30)
    return dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f) if shown.returncode == 0 else {}


def _exit_status(fields: dict[str, str]) -> int:
    """The job's exit status as a shell gives it: the batch script's, or 128 + the signal that ended it."""
    code, _, signum = fields.get("ExitCode", "1:0").partition(":")
    if fields.get("JobState") in ("CANCELLED", "TIMEOUT") and code == "0" and signum in ("", "0"):
        return 128 + signal.SIGTERM
    return 128 + int(signum) if signum not in ("", "0") else int(code)


def run_job(sbatch_args: list[str], poll: float = 0.2) -> int:
    """Submit a batch job (`sbatch SBATCH_ARGS`), print its output as it comes, and return its exit
    status once it has ended; stopped by SIGTERM or SIGINT, cancel the job first and wait for it."""
    with tempfile.TemporaryDirectory(prefix="ddp-lab-job-") as folder:
        output = Path(folder, "job.out")
        submitted = subprocess.run(["sbatch", "--parsable", f"--output={output}", *sbatch_args],
                                   capture_output=True, text=True, timeout=60)
        if submitted.returncode != 0:
            sys.stderr.write(submitted.stderr or submitted.stdout or "sbatch failed\n")
            return submitted.returncode or 1
        job = submitted.stdout.strip().split(";")[0]
        print(f"Submitted batch job {job}", flush=True)
        stopped: list[int] = []

        asked = 0.0  # when the job was last asked to end

        def cancel() -> None:
            nonlocal asked
            asked = time.monotonic()
            subprocess.run(["scancel", job], capture_output=True, timeout=30)

        def stop(signum: int, frame: object) -> None:
            if not stopped:
                stopped.append(signum)
                cancel()

        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        shown = 0
        try:
            deadline = None
            while True:
                fields = _job_fields(job)
                if output.exists():
                    text = output.read_bytes()
                    sys.stdout.write(text[shown:].decode(errors="replace"))
                    sys.stdout.flush()
                    shown = len(text)
                if not fields or fields.get("JobState", "").split("+")[0] in DONE:
                    break
                if stopped:  # cancelled: give it KillWait and a little more to end
                    now = time.monotonic()
                    deadline = deadline or now + DOWN_SECONDS
                    if now > deadline:
                        break
                    if now > asked + 5:  # a busy controller may have dropped the request: ask again
                        cancel()
                time.sleep(poll)
            if output.exists():  # the last lines, written as the job ended
                sys.stdout.write(output.read_bytes()[shown:].decode(errors="replace"))
                sys.stdout.flush()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if stopped:
            return 128 + stopped[0]
        return _exit_status(fields) if fields else 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["job"]:
        if len(argv) < 2:
            sys.exit("slurm_cluster job: give sbatch's options and a batch script: job [OPTIONS] SCRIPT [ARGS]")
        sys.exit(run_job(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m autograde.cluster.slurm",
                                     description="A SLURM cluster of emulated nodes on this machine.")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER, help="where the cluster keeps everything")
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.nodes > 200:
        parser.error("--nodes must be between 1 and 200")
    try:
        if args.action == "up":
            cluster = up(args.folder.resolve(), args.nodes)
            print(f"SLURM is up: nodes {', '.join(cluster.nodes)} idle. Use it with:\n"
                  f"    export SLURM_CONF={cluster.conf}")
        else:
            down(args.folder.resolve())
            print("SLURM is down: every daemon it started has stopped.")
    except ClusterError as err:
        sys.exit(f"slurm_cluster: {err}")


if __name__ == "__main__":
    main()
