"""A workspace: a temporary folder and the runs of one learner's file in it, each launched as
separate, traced processes with a time limit, made once and kept by key.

A part's checks ask for runs by kind (`RunKind`, declared in the part) and by `which` (the
options that tell runs of one kind apart: "pi/3" is the pi kind's run with 3 processes):

- `launched`: `python FILE ARGS`, as a learner types it, the file starting its own processes;
- `torchrun`: `torchrun OPTIONS FILE ARGS` for each simulated node, started together;
- `called`: the learner's functions called by autograde/inprocess/runner.py, which performs a
  part's task (a protocol.Task) and reports what each rank found;
- `once`: any other commands a check needs, made once like the others (the lab's own runs).

A run whose processes neither produce trace events nor use the CPU for STALL_SECONDS, while one of them
waits in a torch.distributed call, is deadlocked: it is stopped there, rather than at the time limit, and
every process's open call (the collective it was waiting in) is reported. Where none waits in a call, the
run is given QUIET_OUTSIDE_CALLS times as long first.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from autograde import data, settings
from autograde.engine import code, processes
from autograde.engine.run import HEARTBEAT, STALL_SECONDS, TIME_LIMIT, Run, progress
from autograde.protocol import ProcessTrace, Task, encode_task, read_reports
from autograde.protocol import read as read_traces

CPU_PROGRESS = 0.5  # CPU seconds the processes must use, without a trace event, not to count as stalled
# A quiet run where no process waits in a torch.distributed call is not deadlocked yet (every rank may have finished
# and be leaving, slowly, on a starved machine): it counts as stalled after this many times STALL_SECONDS
QUIET_OUTSIDE_CALLS = 2
GPU_STALL_SECONDS = 30.0  # setting up CUDA and NCCL can be slow
# The stand-in for Fashion-MNIST a "download" copies (settings.STAGING): 67 validation images, so
# that at batch 16 every rank of 4 gets a full batch (drop_last), and shards need padding
TRAIN_SIZE, VAL_SIZE = 160, 67


@dataclass(frozen=True)
class RunKind:
    """A kind of run a check reads, declared once by its part: an item lists the kinds its check
    reads, and a run is kept under `<name>/<which>` (`pi/3`), or `<name>` alone. A kind whose run
    is one fixed run of every file (the lab's setup run, say) names how to `make` it, and the kinds
    whose runs it `needs` first: the grader makes such runs side by side where they may be."""

    name: str
    make: Callable[["Workspace"], Run] | None = None
    needs: tuple["RunKind", ...] = ()

    def key(self, which: str = "") -> str:
        return f"{self.name}/{which}" if which else self.name


def kind_name(key: str) -> str:
    """The name of the kind of a run kept under `key` (`pi/3` -> `pi`)."""
    return key.split("/")[0]


class NotRecorded(Exception):
    """A replayed workspace was asked for a run that its recording does not hold."""


class Unmade(Exception):
    """A workspace that may make no more runs (`Workspace.only_made`) was asked for a new one."""


class Abandoned(Exception):
    """A run was not made: an earlier run of the same set ended for a reason outside the script,
    so the whole set is made again."""


class Workspace:
    """A temporary folder, and the runs of one script in it (each made once, kept in `runs`)."""

    def __init__(self, script: Path, procs_per_node: int = 2, nodes: int = 2, gpus: int = 0,
                 say: Callable[[str], None] | None = None) -> None:
        self.say = say  # told when a run starts and ends: runs take seconds, and a silent cell looks stuck
        self.script = Path(script).resolve()
        self.procs_per_node = procs_per_node  # the simulated layout a check may ask for (a grader's hidden layouts)
        self.nodes = nodes
        self.gpus = gpus  # a run sees them all, unless it says which each command gets
        self.root = Path(tempfile.mkdtemp(prefix="ddp-lab-check-"))
        self.staging = self.root / "staging"  # the stand-in data, written before the first launch
        self.runs: dict[str, Run] = {}
        self.replaying = False  # True: the runs come from a recording (replay), and none is made
        self._may_launch = True  # False: only the runs made so far may be read (only_made)
        self._locks: dict[str, threading.Lock] = {}  # a run's: at_once's threads and the check's own ask make it once
        self._making = threading.Lock()  # guards _locks

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def save(self, path: Path) -> None:
        """Record the runs made so far, with the script, in `path` (gzipped JSON): a few kB that
        `replay` turns back into a workspace, so that a check can be tested without a launch."""
        runs = {key: {"name": run.name, "results": [dataclasses.asdict(r) for r in run.results],
                      "report": run.report, "stalled": run.stalled, "argv": run.argv,
                      "traces": {str(pid): t.events for pid, t in run.traces.items()}}
                for key, run in self.made().items()}
        record = {"script": self.script.read_text(), "procs_per_node": self.procs_per_node, "nodes": self.nodes,
                  "gpus": self.gpus, "runs": runs,
                  "learner_side": code.learner_side_version(),  # the in-process code that made the runs
                  "learner_side_parts": code.parts_learner_side()}  # ... each part's share of it
        path.write_bytes(gzip.compress(json.dumps(record, sort_keys=True).encode(), mtime=0))

    @classmethod
    def replay(cls, path: Path) -> "Workspace":
        """A workspace whose runs are the ones recorded in `path` by `save`: checks read them as
        they read real runs; asking for a run that was not recorded raises NotRecorded."""
        record = json.loads(gzip.decompress(path.read_bytes()))
        ws = cls(Path("fashion_mnist.py"), record["procs_per_node"], record["nodes"], record.get("gpus", 0))
        ws.script, ws.replaying = ws.root / "fashion_mnist.py", True
        ws.script.write_text(record["script"])
        for key, run in record["runs"].items():
            traces = {int(pid): ProcessTrace(int(pid), events) for pid, events in run["traces"].items()}
            ws.runs[key] = Run(run["name"], [processes.Result(**r) for r in run["results"]], traces, run["report"],
                               run["stalled"], run["argv"])
        return ws

    @contextlib.contextmanager
    def only_made(self) -> Iterator[None]:
        """Within the block, a check reads only the runs made so far: asking for another raises
        Unmade. The checker judges in such a block the items it was not asked for, from the runs
        made for those it was: never a run more for an item not asked."""
        self._may_launch = False
        try:
            yield
        finally:
            self._may_launch = True

    def at_once(self, *makers: Callable[[], Run]) -> None:
        """Make these runs together, each in a thread of its own, where runs may be made (not from
        a recording, nor within `only_made`); a check then reads them one by one, as it would anyway
        (each run is made once, and kept). Runs that are independent of each other overlap what
        they wait on (their processes' start, a rendezvous, SLURM's scheduler); never runs that
        are timed against each other. A maker that fails here fails again, the same way, when the
        check asks for its run itself."""
        if self.replaying or not self._may_launch or len(makers) < 2:
            return
        with ThreadPoolExecutor(max_workers=len(makers)) as pool:
            for future in [pool.submit(make) for make in makers]:
                with contextlib.suppress(Exception):
                    future.result()

    def made(self) -> dict[str, Run]:
        """The runs made so far, by key."""
        return dict(self.runs)

    def once(self, kind: RunKind, which: str, label: str, commands: Callable[[Path], list[list[str]]],
             argv: list[str], env: dict[str, str] | None = None, gpus: list[str] | None = None,
             read: Callable[[Path], dict[str, Any] | None] = lambda folder: None, about: str = "") -> Run:
        """The commands that `commands(folder)` gives, started together in the run's own folder,
        traced, made once per kind and `which`. `label` names the run in verdicts ("run with 3
        processes"), `argv` is the command line a verdict shows, `about` what the run does (said
        when it starts); command i sees the GPUs `gpus[i]` (all of them where None); `read(folder)`
        gives the run's report once it has ended."""
        key = kind.key(which)
        with self._lock_of(key):
            if key not in self.runs:
                folder = self.root / key.replace("/", "-")
                if folder.exists():  # an earlier try that failed before its run was kept (at_once goes on)
                    shutil.rmtree(folder)
                folder.mkdir()
                results, stalled = self._launch(label, commands(folder), folder, gpus, env, about)
                self.runs[key] = Run(label, results, read_traces(folder), read(folder), stalled, argv)
        return self.runs[key]

    def _lock_of(self, key: str) -> threading.Lock:
        """The lock of one run: two threads that ask for the same run make it once, the second waits for it."""
        with self._making:
            return self._locks.setdefault(key, threading.Lock())

    def launched(self, kind: RunKind, which: str, label: str, argv: list[str], env: dict[str, str] | None = None) -> Run:
        """`python <script> ARGV` as the learner would type it (the script starts its own processes)."""
        return self.once(kind, which, label, lambda folder: [[processes.PYTHON, str(self.script), *argv]], argv, env)

    def torchrun(self, kind: RunKind, which: str, label: str, nodes: list[tuple[list[str], list[str]]],
                 env: dict[str, str] | None = None) -> Run:
        """`torchrun OPTIONS script ARGV` for each (OPTIONS, ARGV) of `nodes`, the commands started
        together (one per simulated node), traced: torchrun's agent and every worker it starts,
        restarts included. The workers use the CPU unless there are two GPUs or more (each node
        command then sees them all)."""
        commands = [[processes.PYTHON, "-m", "torch.distributed.run", *options, str(self.script), *argv]
                    for options, argv in nodes]
        visible = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(self.gpus))) if self.gpus >= 2 else ""}
        options, argv = nodes[0]
        return self.once(kind, which, label, lambda folder: commands, ["torchrun", *options, *argv],
                         {**visible, **(env or {})})

    def called(self, kind: RunKind, which: str, label: str, task: Task, env: dict[str, str] | None = None) -> Run:
        """The learner's functions called in real process groups: `task` (its script, where it
        names none, this workspace's) performed by autograde/inprocess/runner.py. The run's report
        is {"ranks": [each process's report]}."""
        if task.in_a_group and not task.script:
            task = dataclasses.replace(task, script=str(self.script))
        return self.once(kind, which, label, lambda folder: [task_command(task, folder)], [], env,
                         read=lambda folder: {"ranks": read_reports(folder)})

    def _env(self, trace_dir: Path, gpus: str | None) -> dict[str, str]:
        path = [str(settings.STARTUP), str(settings.REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        return {"PYTHONPATH": os.pathsep.join(path), settings.TRACE_DIR: str(trace_dir),
                settings.SCRIPT: str(self.script), settings.STAGING: str(self.staging),
                # asking how many GPUs there are must not set up CUDA: the lab's workers run forks
                "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(self.gpus))) if gpus is None else gpus,  # "": the CPU
                # every Python process of the run forked from a server that has imported torch
                **processes.warm_environment()}

    def _launch(self, name: str, commands: list[list[str]], trace_dir: Path, gpus: list[str] | None = None,
                env: dict[str, str] | None = None, about: str = "") -> tuple[list[processes.Result], bool]:
        """Start the commands together (command i sees GPUs gpus[i], all of them when None); stop
        them all at a deadlock or the time limit."""
        if self.replaying:
            raise NotRecorded(f"the {name} was not recorded: record it again (.venv/bin/python tests/record_runs.py)")
        if not self._may_launch:
            raise Unmade(f"the {name} was not made: only the runs made so far may be read")
        spoilt = [f"the {run.name}: {cause}" for run in self.made().values() if (cause := run.outside_cause())]
        if spoilt:  # these runs will all be made again: making more now would only cost time
            raise Abandoned(f"{spoilt[0]}, so the {name} was not made")
        if not self.staging.exists():
            data.write_synthetic(self.staging, TRAIN_SIZE, VAL_SIZE, seed=11)
        started = time.monotonic()
        if self.say:
            many = f"{len(commands)} commands started together" if len(commands) > 1 else "the script as a program"
            self.say(f"running the {name}: {about or many} ...")
        envs = [{**self._env(trace_dir, gpus[i] if gpus is not None else None), **(env or {})}
                for i in range(len(commands))]
        on_gpu = any(e.get("CUDA_VISIBLE_DEVICES") for e in envs)
        stall_seconds = GPU_STALL_SECONDS if on_gpu else STALL_SECONDS
        procs = [processes.start(cmd, cwd=self.root, env=envs[i]) for i, cmd in enumerate(commands)]
        size, cpu, busy, last_change, stalled, polls = 0, 0.0, 0.0, time.monotonic(), False, 0
        next_word = started + HEARTBEAT
        while any(p.poll() is None for p in procs) and time.monotonic() - started < TIME_LIMIT:
            time.sleep(0.1)
            polls += 1
            if self.say and time.monotonic() >= next_word:  # a long run shows it is alive, and how far it got
                next_word += HEARTBEAT
                self.say(f"  ... {time.monotonic() - started:.0f} s: {progress(read_traces(trace_dir))}")
            now_size = sum(f.stat().st_size for f in trace_dir.glob("trace-*.jsonl"))
            if now_size != size:
                size, last_change = now_size, time.monotonic()
            if polls % 10 == 0:  # once a second: silent, but working (say, importing torch)?
                now_cpu = processes.cpu_seconds([p.pid for p in procs])
                busy, cpu = busy + max(0.0, now_cpu - cpu), now_cpu
                if busy > CPU_PROGRESS:
                    busy, last_change = 0.0, time.monotonic()
            quiet = time.monotonic() - last_change
            if size and quiet > stall_seconds and (quiet > QUIET_OUTSIDE_CALLS * stall_seconds or (
                    polls % 10 == 0 and any(t.waiting_in() is not None for t in read_traces(trace_dir).values()))):
                stalled = True
                break
        if stalled:
            for p in procs:
                processes.kill_group(p.pid)
        results = [processes.finish(p, TIME_LIMIT, started) for p in procs]
        if self.say:
            self.say(f"  the {name} ended after {time.monotonic() - started:.0f} s")
        return results, stalled


def task_command(task: Task, out: Path) -> list[str]:
    """The command that has autograde/inprocess/runner.py perform `task`, each rank's report in `out`."""
    return [processes.PYTHON, "-m", settings.module_of(settings.RUNNER), "--task", encode_task(task), "--out", str(out)]
