"""A pretend SLURM cluster on this one machine, to run the course's batch scripts without SLURM.

    python -m autograde.tools.fake_slurm [--nodes N] [--ntasks-per-node M] [--gpus-per-node G] BATCH_SCRIPT [ARGS...]
    python -m autograde.tools.fake_slurm srun [-n N] [-N N] [--ntasks-per-node M] [-K[0|1]] COMMAND...   (in a job)
    python -m autograde.tools.fake_slurm scontrol show hostnames [LIST]

It plays `sbatch`: it reads the script's `#SBATCH` lines (the options given here win), sets the
variables SLURM gives a job (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_NNODES, SLURM_NTASKS, ...)
and runs `bash BATCH_SCRIPT ARGS` in this folder, its output here rather than in the --output file.
On its PATH it puts two stand-ins:

- `srun` starts the step's tasks, every one as a local process, each with the variables real
  srun gives a task (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURMD_NODENAME, ...); it waits
  for all of them, and when one fails it stops the others if it was given -K/--kill-on-bad-exit
  (as a real cluster does; without it, SLURM's KillOnBadExit setting decides, off by default,
  and so it is off here: the other tasks run on until they end by themselves);
- `scontrol show hostnames [LIST]` prints a hostlist's names, one a line.

The nodes are all this machine, each with its own loopback address: 127.0.0.1, 127.0.0.2, ...
(Linux answers on all of 127.0.0.0/8), written as the hostlist `127.0.0.[1-2]`, and each task's
SLURMD_NODENAME is its node's address. A server that listens on every address answers on all of
them, though, so a script that sends its processes to the wrong node still works here: check the
addresses themselves (the tests do). Nothing else of SLURM is faked: no time limit, no CPU or GPU
binding, and GPUs (--gres=gpu:N, --gpus-per-node) are only a number in SLURM_GPUS_ON_NODE.

The stand-ins are shell scripts in a temporary folder that run this file with this Python
(`python -I`: the job's PYTHONPATH and the like do not reach them). Like slurmstepd, they leave
nothing behind: each is a child subreaper (Linux), so that processes orphaned inside a job or
step are its own, and it kills whatever is left when the batch script or the step's tasks are
done. Stdlib only: it runs before any training code is imported.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn, Sequence

PROG = "python -m autograde.tools.fake_slurm"
KILL_WAIT = 5.0  # seconds between SIGTERM and SIGKILL (SLURM's KillWait, 30 s by default)
MAX_NODES = 254  # 127.0.0.1 to 127.0.0.254
POLL = 0.05


class FakeSlurmError(Exception):
    """A problem to report in one line (`error: ...`), with no traceback."""


# --- hostlists -------------------------------------------------------------------------------

def expand_hostlist(hostlist: str) -> list[str]:
    """The names in a SLURM hostlist, in order: `node[01-03,07]` -> node01 node02 node03 node07.

    Names are separated by commas outside brackets; each bracket holds numbers and ranges `a-b`,
    zero-padded to the width of `a`; several brackets in one name multiply (`r[1-2]n[1-2]`).
    Raises ValueError, naming the list, where it is not a hostlist.
    """
    names: list[str] = []
    for item in _split_outside_brackets(hostlist):
        names += _expand_one(item, hostlist)
    return names


def _split_outside_brackets(hostlist: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in hostlist.strip():
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"hostlist {hostlist!r}: brackets inside brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"hostlist {hostlist!r}: ']' without '['")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError(f"hostlist {hostlist!r}: '[' without ']'")
    items.append(current)
    if any(not item.strip() for item in items) and hostlist.strip():
        raise ValueError(f"hostlist {hostlist!r}: an empty name")
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str, hostlist: str) -> list[str]:
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)", item)
    if not match:
        return [item]
    prefix, ranges, rest = match.groups()
    numbers: list[str] = []
    for part in ranges.split(","):
        bounds = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not bounds:
            raise ValueError(f"hostlist {hostlist!r}: {part!r} is not a number or a range a-b")
        low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
        if int(high) < int(low):
            raise ValueError(f"hostlist {hostlist!r}: range {part!r} goes down")
        numbers += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return [prefix + number + tail for number in numbers for tail in _expand_one(rest, hostlist)]


def fake_nodelist(count: int) -> str:
    """The hostlist of the first `count` fake nodes: 127.0.0.1, or 127.0.0.[1-count]."""
    return "127.0.0.1" if count == 1 else f"127.0.0.[1-{count}]"


def node_address(node: int) -> str:
    """The loopback address standing in for node `node` (0-based)."""
    return f"127.0.0.{node + 1}"


# --- #SBATCH lines ---------------------------------------------------------------------------

# short options of sbatch that take a value, and their long names
SHORT = {"-N": "nodes", "-n": "ntasks", "-c": "cpus-per-task", "-J": "job-name", "-t": "time",
         "-o": "output", "-e": "error", "-p": "partition", "-A": "account", "-G": "gpus"}
FLAGS = {"exclusive", "requeue", "no-requeue", "overcommit", "hold", "wait", "verbose", "quiet"}


def parse_sbatch_lines(script: str) -> dict[str, str]:
    """The options of a batch script's `#SBATCH` lines, by long name: {"nodes": "2", ...}.

    Like sbatch, it reads them up to the first line that is a command (neither blank nor a
    comment); several options may share a line, and `# ...` after them is a comment. A later
    line wins over an earlier one. Flags (`--exclusive`) map to "".
    """
    options: dict[str, str] = {}
    for line in script.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if not stripped.startswith("#SBATCH"):
            continue
        try:
            words = shlex.split(stripped[len("#SBATCH"):], comments=True)
        except ValueError as err:
            raise FakeSlurmError(f"cannot read the line {stripped!r} ({err})") from None
        while words:
            word = words.pop(0)
            if word.startswith("--"):
                name, equals, value = word[2:].partition("=")
                if not equals and name not in FLAGS and words and not words[0].startswith("-"):
                    value = words.pop(0)
                options[name] = value
            elif word[:2] in SHORT:
                value = word[2:] or (words.pop(0) if words else "")
                options[SHORT[word[:2]]] = value
            else:
                raise FakeSlurmError(f"cannot read {word!r} in the line {stripped!r}")
    return options


@dataclass
class Job:
    """The shape of a job: what sbatch was asked for."""

    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    name: str = "job"

    @property
    def ntasks(self) -> int:
        return self.nodes * self.ntasks_per_node


def _count(options: dict[str, str], name: str, default: int) -> int:
    value = options.get(name)
    if value is None:
        return default
    if not value.isdigit() or int(value) < 1:
        raise FakeSlurmError(f"--{name}={value}: need a whole number, at least 1")
    return int(value)


def gpus_from(options: dict[str, str]) -> int:
    """GPUs per node from --gpus-per-node=[type:]N or --gres=gpu[:type][:N] (0 where none is asked for)."""
    if "gpus-per-node" in options:
        option, count = "--gpus-per-node", options["gpus-per-node"].rsplit(":", 1)[-1]
    else:
        gpus = [g for g in options.get("gres", "").split(",") if g.split(":")[0] == "gpu"]
        if not gpus:
            return 0
        option, count = "--gres", gpus[0].split(":")[-1] if gpus[0].count(":") else "1"
        count = count if count.isdigit() else "1"  # gpu:a100 is one GPU of type a100
    if not count.isdigit():
        raise FakeSlurmError(f"{option}: {count!r} is not a number of GPUs")
    return int(count)


def job_from(options: dict[str, str], default_name: str) -> Job:
    """The job that these sbatch options ask for (tasks spread evenly: --ntasks needs a multiple of --nodes)."""
    nodes = _count(options, "nodes", 1)
    if "ntasks-per-node" in options:
        per_node = _count(options, "ntasks-per-node", 1)
    elif "ntasks" in options:
        ntasks = _count(options, "ntasks", 1)
        if ntasks % nodes:
            raise FakeSlurmError(f"--ntasks={ntasks} on --nodes={nodes}: this fake spreads tasks evenly "
                                 "over the nodes; give --ntasks-per-node")
        per_node = ntasks // nodes
    else:
        per_node = 1
    if "ntasks" in options and _count(options, "ntasks", 1) != nodes * per_node:
        raise FakeSlurmError(f"--ntasks={options['ntasks']} does not match --nodes={nodes} "
                             f"x --ntasks-per-node={per_node}")
    if nodes > MAX_NODES:
        raise FakeSlurmError(f"--nodes={nodes}: this fake has at most {MAX_NODES} nodes")
    return Job(nodes, per_node, gpus_from(options), _count(options, "cpus-per-task", 1),
               options.get("job-name") or default_name)


# --- processes -------------------------------------------------------------------------------

def _become_subreaper() -> None:
    """Have orphaned descendants re-parented to this process (Linux's PR_SET_CHILD_SUBREAPER), so
    that the tree below stays findable and none escapes; elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _descendants(root: int) -> list[int]:
    """The live processes below `root`, from /proc (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it went away while we looked
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _in_terminal_foreground() -> bool:
    """True when this process is in the terminal's foreground group: a Ctrl-C there has reached
    every process of the group already, and must not be sent to them a second time."""
    try:
        tty = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(tty) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(tty)


class Supervisor:
    """Starts processes, waits for them, and leaves none of their descendants behind.

    With `kill_on_bad_exit`, the first process to fail has the others stopped: SIGTERM to every
    process below this one, then SIGKILL to those still there KILL_WAIT seconds later. SIGTERM and
    SIGINT sent to this process are passed on the same way (but a Ctrl-C, which the terminal sends
    to all of them already, is not sent twice). Once all the processes it started have exited,
    anything they left running is killed."""

    def __init__(self, kill_on_bad_exit: bool = True) -> None:
        _become_subreaper()
        self.kill_on_bad_exit = kill_on_bad_exit
        self.procs: list[subprocess.Popen[bytes]] = []
        self.codes: dict[int, int] = {}  # index in procs -> exit code (-N: killed by signal N)
        self.first_failure: int | None = None  # index of the first process that failed
        self.signalled: int | None = None
        self.kill_at: float | None = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def start(self, cmd: Sequence[str], env: dict[str, str]) -> None:
        self.procs.append(subprocess.Popen(list(cmd), env=env))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = self.signalled or signum
        if not (signum == signal.SIGINT and _in_terminal_foreground()):
            self._stop_others(signum)
        elif self.kill_at is None:
            self.kill_at = time.monotonic() + KILL_WAIT

    def _stop_others(self, signum: int) -> None:
        running = [p.pid for k, p in enumerate(self.procs) if k not in self.codes]
        _signal_all(_descendants(os.getpid()) or running, signum)  # no /proc: the started ones only
        if self.kill_at is None:
            self.kill_at = time.monotonic() + KILL_WAIT

    def _reap(self) -> bool:
        """Collect exited children (started ones and adopted orphans); False once there is none left."""
        by_pid = {p.pid: k for k, p in enumerate(self.procs)}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid in by_pid:
                k = by_pid[pid]
                self.procs[k].returncode = self.codes[k] = os.waitstatus_to_exitcode(status)
                if self.codes[k] != 0 and self.first_failure is None:
                    self.first_failure = k
                    if self.kill_on_bad_exit:
                        self._stop_others(signal.SIGTERM)

    def wait(self) -> dict[int, int]:
        """Wait until every started process has exited and nothing is left below this one;
        the exit codes by start order."""
        while self._reap():
            if len(self.codes) == len(self.procs) or (self.kill_at and time.monotonic() > self.kill_at):
                _signal_all(_descendants(os.getpid()), signal.SIGKILL)  # leftovers: slurmstepd's cleanup
            time.sleep(POLL)
        return self.codes


def exit_status(code: int) -> int:
    """A shell's exit status for an exit code (-N, killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


def describe(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"Exited with exit code {code}"


# --- the three commands ----------------------------------------------------------------------

class OneLineParser(argparse.ArgumentParser):
    """argparse, with its usage errors in one line and no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number, at least 1")
    return int(text)


def stub(folder: Path, name: str) -> None:
    """An executable `name` in `folder` that runs this module's `name` command with this Python."""
    path = folder / name
    path.write_text(f"#!/bin/sh\n# {name} of a fake SLURM ({PROG})\n"
                    f"exec {shlex.quote(sys.executable)} -I {shlex.quote(str(Path(__file__).resolve()))} "
                    f"{name} \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def sbatch_main(argv: list[str]) -> int:
    parser = OneLineParser(prog=PROG, allow_abbrev=False,
                           description="Run a SLURM batch script on this machine, under a fake SLURM.",
                           epilog="Inside the job, `srun ...` and `scontrol show hostnames [LIST]` are this "
                                  "module's stand-ins (`python -m autograde.tools.fake_slurm srun|scontrol ...`).")
    parser.add_argument("-N", "--nodes", type=positive, help="nodes (default: the script's #SBATCH, else 1)")
    parser.add_argument("--ntasks-per-node", type=positive, help="tasks per node (default: #SBATCH, else 1)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs each node claims to have (SLURM_GPUS_ON_NODE)")
    parser.add_argument("script", type=Path, nargs="?", help="the batch script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the batch script")
    args = parser.parse_args(argv)
    if args.script is None:
        parser.error("give a batch script to run")
    if not args.script.is_file():
        raise FakeSlurmError(f"no batch script {args.script}")
    options = parse_sbatch_lines(args.script.read_text(errors="replace"))
    if args.nodes or args.ntasks_per_node:
        options.pop("ntasks", None)  # the shape given here replaces the script's
    if args.nodes:
        options["nodes"] = str(args.nodes)
    if args.ntasks_per_node:
        options["ntasks-per-node"] = str(args.ntasks_per_node)
    if args.gpus_per_node is not None:
        if args.gpus_per_node < 0:
            parser.error(f"argument --gpus-per-node: {args.gpus_per_node} is below 0")
        options.pop("gres", None)
        options["gpus-per-node"] = str(args.gpus_per_node)
    job = job_from(options, args.script.name)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    job_id = str(os.getpid())
    nodelist = fake_nodelist(job.nodes)
    env.update(SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_JOB_NAME=job.name,
               SLURM_JOB_NODELIST=nodelist, SLURM_NODELIST=nodelist, SLURM_NNODES=str(job.nodes),
               SLURM_JOB_NUM_NODES=str(job.nodes), SLURM_NTASKS=str(job.ntasks), SLURM_NPROCS=str(job.ntasks),
               SLURM_NTASKS_PER_NODE=str(job.ntasks_per_node),
               SLURM_TASKS_PER_NODE=f"{job.ntasks_per_node}(x{job.nodes})" if job.nodes > 1
               else str(job.ntasks_per_node),
               SLURM_CPUS_PER_TASK=str(job.cpus_per_task), SLURM_SUBMIT_DIR=os.getcwd(),
               SLURM_SUBMIT_HOST=node_address(0), SLURMD_NODENAME=node_address(0), SLURM_NODEID="0",
               SLURM_PROCID="0", SLURM_LOCALID="0")  # the batch script runs as task 0 of node 0
    if job.gpus_per_node:
        env["SLURM_GPUS_ON_NODE"] = str(job.gpus_per_node)
    print(f"fake_slurm: job {job_id} ({job.name}): {job.nodes} node(s) {nodelist}, "
          f"{job.ntasks_per_node} task(s) each, {job.gpus_per_node} GPU(s) each; its output comes here",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="fake_slurm_") as bin_dir:
        for name in ("srun", "scontrol"):
            stub(Path(bin_dir), name)
        env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
        env["FAKE_SLURM_DIR"] = bin_dir  # where srun counts the job's steps
        supervisor = Supervisor(kill_on_bad_exit=False)
        supervisor.start(["bash", str(args.script), *args.args], env)
        code = supervisor.wait()[0]
    return 128 + supervisor.signalled if supervisor.signalled and code < 0 else exit_status(code)


def spread(ntasks: int, nodes: int, per_node: int | None) -> list[int]:
    """The node (0-based) of each task, filled node by node (SLURM's block distribution): `per_node`
    tasks each when given, else as evenly as can be, the first nodes taking one more."""
    if per_node is not None:
        return [task // per_node for task in range(ntasks)]
    base, extra = divmod(ntasks, nodes)
    return [node for node in range(nodes) for _ in range(base + (node < extra))]


SRUN_VALUES = {"-n": "ntasks", "--ntasks": "ntasks", "-N": "nodes", "--nodes": "nodes",
               "--ntasks-per-node": "ntasks-per-node"}
SRUN_FLAGS = {"-K": "kill-on-bad-exit", "--kill-on-bad-exit": "kill-on-bad-exit"}


def parse_srun(argv: list[str]) -> tuple[dict[str, int], list[str]]:
    """srun's options this fake knows ({"ntasks": 4, ...}) and the command after them.

    -n/--ntasks, -N/--nodes and --ntasks-per-node take a number (`-n 4`, `-n4`, `--ntasks=4`);
    -K[0|1] and --kill-on-bad-exit[=0|1] a 0 or 1 attached, 1 when none is."""
    options: dict[str, int] = {}
    words = list(argv)
    while words and words[0].startswith("-"):
        word = words.pop(0)
        if word == "--":
            break
        if word.startswith("--"):
            name, equals, value = word.partition("=")
        else:
            name, value = word[:2], word[2:]
            equals = "=" if value else ""
        if name in SRUN_FLAGS:
            if value not in ("", "0", "1"):
                raise FakeSlurmError(f"{word}: give 0 or 1, attached ({name}{equals or ''}1)")
            options[SRUN_FLAGS[name]] = int(value or 1)
        elif name in SRUN_VALUES:
            if not equals:
                if not words:
                    raise FakeSlurmError(f"{name} needs a number")
                value = words.pop(0)
            if not value.isdigit() or int(value) < 1:
                raise FakeSlurmError(f"{name} {value}: need a whole number, at least 1")
            options[SRUN_VALUES[name]] = int(value)
        else:
            raise FakeSlurmError(f"unknown option {name} (this fake knows -n/--ntasks, -N/--nodes, "
                                 "--ntasks-per-node and -K/--kill-on-bad-exit)")
    if not words:
        raise FakeSlurmError("no command to run")
    return options, words


def srun_main(argv: list[str]) -> int:
    options, command = parse_srun(argv)
    if "SLURM_JOB_ID" not in os.environ:
        raise FakeSlurmError("not inside a job: start the batch script with " + PROG)
    job_nodes = int(os.environ["SLURM_NNODES"])
    per_node = options.get("ntasks-per-node")
    asked_ntasks, asked_nodes = options.get("ntasks"), options.get("nodes")
    if per_node is None and asked_ntasks is None and asked_nodes is None:
        per_node = int(os.environ["SLURM_NTASKS_PER_NODE"])  # inside a job, srun defaults to the job's shape
    if asked_nodes:
        nodes = asked_nodes
    elif asked_ntasks and per_node:
        nodes = min(job_nodes, -(-asked_ntasks // per_node))
    else:
        nodes = min(job_nodes, asked_ntasks or job_nodes)
    ntasks = asked_ntasks or nodes * (per_node or 1)
    if nodes > job_nodes:
        raise FakeSlurmError(f"--nodes={nodes}: the job has only {job_nodes} node(s)")
    if ntasks < nodes:
        raise FakeSlurmError(f"--ntasks={ntasks} is fewer than --nodes={nodes}")
    if per_node is not None and ntasks > nodes * per_node:
        raise FakeSlurmError(f"--ntasks={ntasks} does not fit on {nodes} node(s) x --ntasks-per-node={per_node}")
    where = spread(ntasks, nodes, per_node)
    step = _next_step()

    supervisor = Supervisor(kill_on_bad_exit=bool(options.get("kill-on-bad-exit", 0)))  # KillOnBadExit=0
    counts = [where.count(node) for node in range(nodes)]
    for task, node in enumerate(where):
        env = dict(os.environ)
        env.update(SLURM_PROCID=str(task), SLURM_LOCALID=str(where[:task].count(node)), SLURM_NODEID=str(node),
                   SLURMD_NODENAME=node_address(node), SLURM_STEP_ID=step, SLURM_STEPID=step,
                   SLURM_STEP_NUM_TASKS=str(ntasks), SLURM_STEP_NUM_NODES=str(nodes),
                   SLURM_STEP_NODELIST=fake_nodelist(nodes), SLURM_NTASKS=str(ntasks), SLURM_NPROCS=str(ntasks),
                   SLURM_NNODES=str(nodes), SLURM_NODELIST=fake_nodelist(nodes),
                   SLURM_STEP_TASKS_PER_NODE=",".join(map(str, counts)),
                   SLURM_TASKS_PER_NODE=",".join(map(str, counts)), SLURM_LAUNCH_NODE_IPADDR=node_address(0))
        if len(set(counts)) == 1:
            env["SLURM_NTASKS_PER_NODE"] = str(counts[0])
        supervisor.start(command, env)
    codes = supervisor.wait()
    failure = supervisor.first_failure
    if failure is not None:
        print(f"srun: error: {node_address(where[failure])}: task {failure}: {describe(codes[failure])}",
              file=sys.stderr, flush=True)
        return exit_status(codes[failure])
    return 128 + supervisor.signalled if supervisor.signalled else 0


def _next_step() -> str:
    """This job's next step number (0, 1, ...), counted in a file of the job's fake bin folder."""
    counter = Path(os.environ.get("FAKE_SLURM_DIR", "")) / "steps"
    if not counter.parent.is_dir():
        return "0"
    step = int(counter.read_text() or 0) if counter.exists() else 0
    counter.write_text(str(step + 1))
    return str(step)


def scontrol_main(argv: list[str]) -> int:
    if argv[:2] not in (["show", "hostnames"], ["show", "hostname"]) or len(argv) > 3:
        raise FakeSlurmError(f"scontrol {' '.join(argv)}: this fake knows `scontrol show hostnames [LIST]` only")
    hostlist = argv[2] if len(argv) == 3 else os.environ.get("SLURM_JOB_NODELIST", "")
    if not hostlist:
        raise FakeSlurmError("scontrol show hostnames: no hostlist given and no SLURM_JOB_NODELIST")
    try:
        print("\n".join(expand_hostlist(hostlist)), flush=True)
    except ValueError as err:
        raise FakeSlurmError(str(err)) from None
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command, run = {"srun": ("srun", srun_main), "scontrol": ("scontrol", scontrol_main)}.get(
        argv[0] if argv else "", ("fake_slurm", sbatch_main))
    try:
        return run(argv[1:] if command != "fake_slurm" else argv)
    except FakeSlurmError as err:
        print(f"{PROG if command == 'fake_slurm' else command}: error: {err}", file=sys.stderr, flush=True)
        return 1
    except BrokenPipeError:  # `scontrol show hostnames | head -n 1` stops reading early
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
