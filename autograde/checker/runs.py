"""The runs of a learner's script that the step checks read, each launched as separate,
traced processes with a time limit.

- setup run (Steps 1-2): the script's own start-up code, stopped where real work begins;
- workers run (Steps 3-9): 2 simulated nodes x N processes, each calling `worker`;
- program run (Step 10): `python script.py --num-gpus 2`, as a learner types it;
- two-node run (Step 10): two node commands started together;
- launched runs (the exercises of later parts): `python script.py ARGS`, as a learner types it,
  the script starting its own processes; made once per key (`launched("pi/3", ...)`).

A run whose processes neither produce trace events nor use the CPU for STALL_SECONDS is
deadlocked: it is stopped there, rather than at the time limit, and every process's
open call (the collective it was waiting in) is reported.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import json
import os
import re
import shutil
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator

from autograde import data, processes, paths
from autograde.checker import code, devices
from autograde.protocol import SCRIPT, STAGING, STARTUP, TRACE_DIR, ProcessTrace, Task, read as read_traces, read_reports, where

HEARTBEAT = 5.0  # seconds between the lines a long run prints to show it is alive
STALL_SECONDS = 12.0  # on GPUs, 30: setting up CUDA and NCCL can be slow
TIME_LIMIT = 120.0
CPU_PROGRESS = 0.5  # CPU seconds the processes must use, without a trace event, not to count as stalled
TRAIN_SIZE, VAL_SIZE = 160, 67  # 67: at batch 16, every rank of 4 gets a full batch (drop_last), and shards need padding
EPOCHS = 3  # with --target-accuracy 0 and --patience 2, a right script stops after epoch 2

Argv = list[list[Any]]


@dataclass
class Run:
    """What one run's processes printed and did."""

    name: str
    results: list[processes.Result]
    traces: dict[int, ProcessTrace]
    report: dict[str, Any] | None = None
    stalled: bool = False
    argv: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return "".join(r.output for r in self.results)

    @property
    def ok(self) -> bool:
        return not self.stalled and all(r.returncode == 0 and not r.timed_out for r in self.results)

    def ranks(self) -> dict[int, ProcessTrace]:
        """The traces of the processes that joined a process group, by global rank."""
        return {t.rank: t for t in self.traces.values() if t.rank is not None}

    def outside_cause(self) -> str | None:
        """Why this run ended for a reason outside the learner's code, if it did: a process killed
        by a signal that the checker did not send, the time limit (a busy machine), a port that
        someone else took, or gloo itself (`processes.gloo_fault`; where processes crashed, only
        when every crash is gloo's). Such a run says nothing about the script and is made again."""
        crashes = [e["error"] for t in self.traces.values() for e in t.named("crash")]
        if self.stalled or not all(processes.gloo_fault(error) for error in crashes):
            return None  # a deadlock the checker stopped, or an error in the script: the script's own
        if any(r.timed_out for r in self.results):
            return f"it ran out of time ({TIME_LIMIT:.0f} s; the machine may be busy)"
        # A process that aborted (SIGABRT) did so from C++ code it called: the script's doing (a
        # message of the wrong size, say), unless its output shows one of gloo's own faults.
        aborted_by_gloo = processes.gloo_fault(self.output)
        for r in self.results:
            if r.returncode is not None and r.returncode < 0:
                if -r.returncode == signal.SIGABRT:
                    return aborted_by_gloo
                return f"a process was killed by signal {signal_name(-r.returncode)}"
        for t in self.traces.values():
            for e in t.named("child_signal"):
                if e["signal"] == "SIGABRT":
                    return aborted_by_gloo
                return f"a process that mp.spawn started was killed by signal {e['signal']}"
        if any(text in self.output.lower() for text in ("address already in use", "eaddrinuse")) \
                and self.one_rank_twice() is None:
            return "a port it was given was taken by another program"
        return None if self.ok else processes.gloo_fault("\n".join([self.output, *crashes]))

    def one_rank_twice(self) -> int | None:
        """A rank that two of this run's processes set out to join as at the same time (given to
        init_process_group, else RANK in the environment), or None. Both then host rank 0's store, say,
        on one port: the port is taken by the run's own process, not by another program."""
        claims: dict[int, list[tuple[float, float]]] = {}
        end = max((t.events[-1]["t"] for t in self.traces.values() if t.events), default=0.0)
        for trace in self.traces.values():
            for e in trace.calls("init_process_group"):
                claimed = str(e.get("rank") if e.get("rank") is not None else e.get("env_rank"))
                if claimed.isdigit():  # a process that never got out of init_process_group held it to the run's end
                    claims.setdefault(int(claimed), []).append(
                        (e["t"], end if trace.events[-1] is e else trace.events[-1]["t"]))
        for rank, lives in claims.items():  # torchrun's restarts claim the ranks again, one life after another
            if any(a[0] <= b[1] and b[0] <= a[1] for k, a in enumerate(lives) for b in lives[k + 1:]):
                return rank
        return None

    def problem(self) -> str | None:
        """One sentence on what went wrong in this run, or None."""
        if self.stalled or any(r.timed_out for r in self.results):
            waiting = [f"{t.label()} in {where(e)}" for t in self.traces.values()
                       if (e := t.waiting_in()) is not None]
            if waiting:
                detail = f"waiting were {'; '.join(waiting)}"
            else:
                last = "; ".join(f"{t.label()}: {t.last_seen()}" for t in self.traces.values())
                detail = f"no process was in a torch.distributed call (last traced: {last})"
            how = f"nothing happened for {STALL_SECONDS:.0f} s or more" if self.stalled else "it ran out of time"
            return f"the {self.name} deadlocked ({how}): {detail}"
        crashes = [e for t in self.traces.values() for e in t.named("crash")]
        if crashes:  # the first that is not a peer's lost connection: that one follows from another's crash
            root = next((e for e in crashes if not PEER_LOST.search(e["error"])), crashes[0])
            return f"the {self.name} crashed: {root['error']}"
        aborted = ABORT_REASON.search(self.output)
        if aborted:
            return f"a process of the {self.name} was aborted by PyTorch's C++ code: {short(aborted['why'])}"
        for r in self.results:
            if r.returncode != 0:
                return f"the {self.name} failed (exit status {r.returncode}): {short(r.stderr or r.stdout)}"
        return None


def progress(traces: dict[int, ProcessTrace]) -> str:
    """How far a run's processes have got, in a few words: how many there are, and what the one
    furthest along did last (its last printed line, or the last call it made)."""
    if not traces:
        return "starting the processes (importing torch takes a few seconds)"
    ahead = max(traces.values(), key=lambda trace: len(trace.events))
    said = [e for e in ahead.events if e["ev"] == "print" and str(e.get("text", "")).strip()]
    printed = f"printed {short(str(said[-1]['text']), 80)!r}" if said else None
    last = ahead.events[-1] if ahead.events else None
    if printed and last is said[-1]:  # its last event is the line it printed
        doing = printed
    else:  # a known stage, else its last printed line, else its last call
        doing = DOING.get(last["ev"] if last else "") or printed or ahead.last_seen()
    steps = [e for trace in traces.values() for e in trace.named("step")]
    count = f", {max(int(e.get('n') or 0) for e in steps)} optimizer steps" if steps else ""
    who = ahead.label() if ahead.rank is not None else "the first process"
    return f"{len(traces)} process{'es' if len(traces) > 1 else ''} running{count}; {who} {doing}"


DOING = {"spawn": "started the others (mp.spawn)", "worker_start": "started its worker",
         "dataset_enter": "is reading the data set", "download_start": "is downloading the data set",
         "loader_iter": "is going through a data loader", "first_optimizer_step": "made its first optimizer step",
         "case_start": "is running your code", "save_enter": "is saving a checkpoint", "load_enter": "is loading a checkpoint"}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


# What a rank's collective raises when another rank's process has died: a consequence, not a cause.
PEER_LOST = re.compile(r"Connection (reset|closed) by peer|remote process exited|Broken pipe")
# std::terminate's report of the C++ exception that aborted a process (gloo's enforce failures, say):
# "what():  [enforce fail at .../pair.cc:464] op.preamble.length <= op.nbytes. 2004 vs 2000. Received ..."
ABORT_REASON = re.compile(r"what\(\):\s+(?:\[[^\]]*\]\s*)?(?P<why>[^\n]+)")
RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")  # torchrun's workers' lines: "[rank1]: ValueError: ..."
EXCEPTION = re.compile(r"^[A-Za-z_]*(Error|Exception)\b")


def short(text: str, limit: int = 300) -> str:
    """The part of an error output that matters: its last line, or a one-line 'error: ...'. Under
    torchrun, whose own report ends the output, the first exception a worker raised."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    raised = [RANK_PREFIX.sub("", line) for line in lines if RANK_PREFIX.match(line)]
    raised = [line for line in raised if EXCEPTION.match(line) or line.lower().startswith("error")]
    if raised:
        return raised[0][:limit]
    errors = [line for line in lines if line.lower().startswith(("error", "runtimeerror", "valueerror"))
              or ": error: " in line]
    return (errors[-1] if errors else lines[-1])[:limit]


class Abandoned(Exception):
    """A run was not made: an earlier run of the same set ended for a reason outside the script,
    so the whole set is made again."""


class Family(StrEnum):
    """The kinds of run a check reads, each named here once: an item's `runs` (autograde/registry.py)
    lists the families its check reads, and a run made for a check is kept under `<family>/<which>`
    (`pi/3`: the pi family's run with 3 processes). The lab's four are made by the properties below."""

    SETUP = "setup"
    WORKERS = "workers"
    PROGRAM = "program"
    TWO_NODES = "two_nodes"
    COLLECTIVES = "collectives"
    PI = "pi"
    SAMPLER = "sampler"
    RING = "ring"
    TORCHRUN = "torchrun"
    CHECKPOINT = "checkpoint"
    RESTART = "restart"
    SLURM_ENV = "slurm_env"
    SLURM_JOB = "slurm_job"
    SCALING = "scaling"
    WARMUP = "warmup"
    LR = "lr"
    SPEED = "speed"
    PIPELINE = "pipeline"
    DDP = "ddp"
    ZERO = "zero"
    TENSOR_PARALLEL = "tensor_parallel"
    TWO_D = "two_d"
    STAGES = "stages"
    LARS = "lars"
    KFAC = "kfac"
    HANG = "hang"


def run_key(family: Family, which: str) -> str:
    """The key a run is kept under: `<family>/<which>` (`pi/3`)."""
    return f"{family}/{which}"


def family(key: str) -> Family:
    """The family of a run made (`pi/3` -> `pi`)."""
    return Family(key.split("/")[0])


RUN_NAMES = {Family.SETUP: "setup run", Family.WORKERS: "workers run", Family.PROGRAM: "program run",
             Family.TWO_NODES: "two-node run"}


class NotRecorded(Exception):
    """A replayed workspace was asked for a run that its recording does not hold."""


class Unmade(Exception):
    """A workspace that may make no more runs (`Workspace.only_made`) was asked for a new one."""


class Workspace:
    """A temporary folder with stand-in data, and the runs of one script in it (each made once)."""

    def __init__(self, script: Path, procs_per_node: int = 2, nodes: int = 2, gpus: int = 0,
                 say: Callable[[str], None] | None = None) -> None:
        self.say = say  # told when a run starts and ends: runs take seconds, and a silent cell looks stuck
        self.script = Path(script).resolve()
        self.procs_per_node = procs_per_node
        self.nodes = nodes
        self.devices = devices.plan(gpus, procs_per_node, nodes)  # each run's GPUs, or None: the CPU
        self.gpus = gpus  # a launched run sees them all (it starts one process per GPU if it can)
        self.root = Path(tempfile.mkdtemp(prefix="ddp-lab-check-"))
        self.staging = self.root / "staging"
        self.replaying = False  # True: the runs come from a recording (replay), and none is made
        self._may_launch = True  # False: only the runs made so far may be read (only_made)
        data.write_synthetic(self.staging, TRAIN_SIZE, VAL_SIZE, seed=11)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def save(self, path: Path) -> None:
        """Record the runs made so far, with the script, in `path` (gzipped JSON): a few kB that
        `replay` turns back into a workspace, so that a check can be tested without a launch."""
        runs = {name: {"name": run.name, "results": [dataclasses.asdict(r) for r in run.results],
                       "report": run.report, "stalled": run.stalled, "argv": run.argv,
                       "traces": {str(pid): t.events for pid, t in run.traces.items()}}
                for name, run in self.made().items()}
        record = {"script": self.script.read_text(), "procs_per_node": self.procs_per_node, "nodes": self.nodes,
                  "devices": self.devices, "gpus": self.gpus, "runs": runs,
                  "learner_side": code.learner_side_version()}  # the in-process code that made the runs
        path.write_bytes(gzip.compress(json.dumps(record, sort_keys=True).encode(), mtime=0))

    @classmethod
    def replay(cls, path: Path) -> "Workspace":
        """A workspace whose runs are the ones recorded in `path` by `save`: checks read them as
        they read real runs; asking for a run that was not recorded raises NotRecorded."""
        record = json.loads(gzip.decompress(path.read_bytes()))
        ws = cls.__new__(cls)
        ws.say, ws.procs_per_node, ws.nodes, ws.devices = None, record["procs_per_node"], record["nodes"], record["devices"]
        ws.gpus = record.get("gpus", 0)
        ws.root = Path(tempfile.mkdtemp(prefix="ddp-lab-replay-"))
        ws.staging, ws.script, ws.replaying = ws.root / "staging", ws.root / "fashion_mnist.py", True
        ws._may_launch = True
        ws.script.write_text(record["script"])
        for name, run in record["runs"].items():
            traces = {int(pid): ProcessTrace(int(pid), events) for pid, events in run["traces"].items()}
            ws.__dict__[name] = Run(run.get("name") or RUN_NAMES[name], [processes.Result(**r) for r in run["results"]],
                                    traces, run["report"], run["stalled"], run["argv"])
        return ws

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def only_made(self) -> Iterator[None]:
        """Within the block, a check reads only the runs made so far: asking for another raises
        Unmade. The checker judges in such a block the items it was not
        asked for, from the runs made for those it was: never a run more for an item not asked."""
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

    def make_lab_runs(self, families: set[Family]) -> None:
        """The lab's runs that checks reading `families` will read, made two at a time where they are
        independent: the setup run (whose options the program and two-node runs pass on) beside the
        workers run, then the program run beside the two-node run. A lab check alone makes its runs
        one after another; `check --all`, or a grade, reads all four."""
        first = ([Family.SETUP] if families & {Family.SETUP, Family.PROGRAM, Family.TWO_NODES} else []) + \
            ([Family.WORKERS] if Family.WORKERS in families else [])
        then = [f for f in (Family.PROGRAM, Family.TWO_NODES) if f in families]
        for together in (first, then):
            self.at_once(*(functools.partial(getattr, self, str(f)) for f in together))

    def made(self) -> dict[str, Run]:
        """The runs made so far, by key (setup, workers, program, two_nodes; "pi/3" for launched runs)."""
        return {name: run for name, run in vars(self).items() if isinstance(run, Run)}

    def launched(self, family: Family, which: str, label: str, argv: list[str], env: dict[str, str] | None = None) -> Run:
        """`python <script> ARGV` as the learner would type it (the script starts its own
        processes), traced, made once per family and `which` (kept as "<family>/<which>"; the family
        is what an item's `runs` names in autograde/registry.py). `label` names it in verdicts
        ("run with 3 processes")."""
        return self.once(family, which, label, [str(self.script), *argv], argv, env)

    def torchrun(self, family: Family, which: str, label: str, nodes: list[tuple[list[str], list[str]]],
                 env: dict[str, str] | None = None) -> Run:
        """`torchrun OPTIONS script ARGV` for each (OPTIONS, ARGV) of `nodes`, the commands started
        together (one per simulated node), traced: torchrun's agent and every worker it starts,
        restarts included. Made once per family and `which`, like `launched`. The workers use the CPU unless
        there are two GPUs or more (each node command then sees them all)."""
        key = run_key(family, which)
        if key not in self.__dict__:
            folder = self._folder(key.replace("/", "-"))
            commands = [[processes.PYTHON, "-m", "torch.distributed.run", *options, str(self.script), *argv]
                        for options, argv in nodes]
            visible = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(self.gpus))) if self.gpus >= 2 else ""}
            results, stalled = self._launch(label, commands, folder, env={**visible, **(env or {})})
            options, argv = nodes[0]
            self.__dict__[key] = Run(label, results, read_traces(folder), None, stalled, ["torchrun", *options, *argv])
        run = self.__dict__[key]
        assert isinstance(run, Run)
        return run

    def called(self, family: Family, which: str, label: str, task: Task, options: list[str],
               env: dict[str, str] | None = None) -> Run:
        """The learner's functions called in real process groups by autograde/learner_processes/tasks.py
        (`task`: what it calls; `options`: its command line, with the world sizes), traced, made
        once per family and `which` like `launched`. The run's report is {"ranks": [each process's report]}."""
        command = ["-m", "autograde.learner_processes.tasks", str(task), "--script", str(self.script), *options]
        return self.once(family, which, label, command, options, env, reports=True)

    def once(self, family: Family, which: str, label: str, command: list[str], argv: list[str],
             env: dict[str, str] | None, reports: bool = False) -> Run:
        """`python COMMAND` (the run's `argv` is what a verdict shows), made once per family and
        `which`: what `launched` and `called` make, and any other command a check needs (the SLURM stand-in's
        job, say). With `reports`, COMMAND takes `--out DIR` and the run's report is {"ranks": ...}."""
        key = run_key(family, which)
        if key not in self.__dict__:
            folder = self._folder(key.replace("/", "-"))
            out = ["--out", str(folder)] if reports else []
            visible = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(self.gpus)))}
            results, stalled = self._launch(label, [[processes.PYTHON, *command, *out]], folder,
                                            env={**visible, **(env or {})})
            report = {"ranks": read_reports(folder)} if reports else None
            self.__dict__[key] = Run(label, results, read_traces(folder), report, stalled, argv)
        run = self.__dict__[key]
        assert isinstance(run, Run)
        return run

    def on_gpu(self, run: str) -> bool:
        """Whether the run (workers, program, two_nodes) uses GPUs (else the CPU, with gloo)."""
        return self.devices.get(run) is not None

    def uses(self, run: str) -> str:
        """The devices of a run, for a verdict."""
        return devices.describe(self.devices.get(run))

    @property
    def stall_seconds(self) -> float:
        return 30.0 if any(self.devices.values()) else STALL_SECONDS  # setting up CUDA and NCCL can be slow

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def _folder(self, name: str) -> Path:
        folder = self.root / name
        folder.mkdir()
        return folder

    def _env(self, trace_dir: Path, gpus: str) -> dict[str, str]:
        path = [str(STARTUP), str(paths.REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        env = {"PYTHONPATH": os.pathsep.join(path), TRACE_DIR: str(trace_dir),
               SCRIPT: str(self.script), STAGING: str(self.staging),
               # asking how many GPUs there are must not set up CUDA: the workers run forks
               "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
               "CUDA_VISIBLE_DEVICES": gpus,  # "": the CPU
               # every Python process of the run forked from a server that has imported torch
               **processes.warm_environment()}
        return env

    def _common(self, data_dir: Path, epochs: int = EPOCHS, port: int | None = None) -> Argv:
        return [["--widen-factor", 1], ["--batch-size", 16], ["--epochs", epochs], ["--target-accuracy", 0],
                ["--patience", 2], ["--data-dir", data_dir], ["--master-port", port or processes.free_port()]]

    def _launch(self, name: str, commands: list[list[str]], trace_dir: Path,
                gpus: list[str] | None = None, env: dict[str, str] | None = None) -> tuple[list[processes.Result], bool]:
        """Start the commands together (command i sees GPUs gpus[i], all of them the CPU when None);
        stop them all at a deadlock or the time limit."""
        if self.replaying:
            raise NotRecorded(f"the {name} was not recorded: record it again (.venv/bin/python tests/record_runs.py)")
        if not self._may_launch:
            raise Unmade(f"the {name} was not made: only the runs made so far may be read")
        spoilt = [f"the {run.name}: {cause}" for run in self.made().values() if (cause := run.outside_cause())]
        if spoilt:  # these runs will all be made again: making more now would only cost time
            raise Abandoned(f"{spoilt[0]}, so the {name} was not made")
        started = time.monotonic()
        if self.say:
            self.say(f"running the {name}: {self._describe(name, len(commands))} ...")
        procs = [processes.start(cmd, cwd=self.root, env={**self._env(trace_dir, gpus[i] if gpus else ""), **(env or {})})
                 for i, cmd in enumerate(commands)]
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
            if size and time.monotonic() - last_change > self.stall_seconds:
                stalled = True
                break
        if stalled:
            for p in procs:
                processes.kill_group(p.pid)
        results = [processes.finish(p, TIME_LIMIT, started) for p in procs]
        if self.say:
            self.say(f"  the {name} ended after {time.monotonic() - started:.0f} s")
        return results, stalled

    def _describe(self, name: str, commands: int) -> str:
        if name == "workers run":
            return f"worker() in {self.world_size} processes ({self.nodes} simulated nodes x {self.procs_per_node})"
        if name == "setup run":
            return "the start-up code, as node 2 of 3"
        return f"{commands} command{'s' if commands > 1 else ''} started together" if commands > 1 else "the script as a program"

    def _harness(self, name: str, mode: str, **options: Any) -> Run:
        folder = self._folder(name)
        out = folder / "report.json"
        cmd = [processes.PYTHON, "-m", "autograde.learner_processes.lab", mode, "--script", str(self.script), "--out", str(out)]
        for key, value in options.items():
            cmd += [f"--{key.replace('_', '-')}", value if isinstance(value, str) else json.dumps(value, default=str)]
        results, stalled = self._launch(name, [cmd], folder)
        report = json.loads(out.read_text()) if out.exists() else None
        return Run(name, results, read_traces(folder), report, stalled)

    @cached_property
    def setup(self) -> Run:
        """The script's start-up code for node 2 of 3 with 2 processes each (world size 6)."""
        argv = [["--num-nodes", 3], ["--node-id", 2], ["--num-gpus", 2]] + self._common(self.root / "unused")
        return self._harness("setup run", "setup", argv=argv)

    @cached_property
    def workers(self) -> Run:
        """worker(local_rank, args) in every process of `nodes` simulated nodes, each with its own disk."""
        port = processes.free_port()
        nodes = [[["--num-nodes", self.nodes], ["--node-id", k], ["--num-gpus", self.procs_per_node]]
                 + self._common(self.root / f"node{k}-disk", port=port) for k in range(self.nodes)]
        # the harness process itself never starts CUDA; each node's processes see only the node's GPUs
        return self._harness("workers run", "workers", nodes=nodes, procs_per_node=str(self.procs_per_node),
                             node_gpus=self.devices["workers"] or [""] * self.nodes)

    @property
    def options(self) -> frozenset[str]:
        """The command-line options the script's parser knows, as the setup run saw them."""
        return frozenset((self.setup.report or {}).get("options", []))

    def _argv(self, pairs: Argv) -> list[str]:
        """`pairs` as a command line, without the options the script does not know (from the setup run)."""
        known = self.options
        argv: list[str] = []
        for option, value in pairs:
            if option in known:
                argv += [option] if value is None else [option, str(value)]
        return argv

    @cached_property
    def program(self) -> Run:
        """`python script.py --num-gpus 2 ...`: the script launching its own processes."""
        folder = self._folder("program run")
        sync_bn: Argv = [["--sync-bn", None]] if self.on_gpu("program") else []  # the Optional step's check reads this run
        argv = self._argv([["--num-gpus", 2]] + sync_bn + self._common(folder / "data", epochs=1))
        results, stalled = self._launch("program run", [[processes.PYTHON, str(self.script), *argv]], folder,
                                        self.devices["program"])
        return Run("program run", results, read_traces(folder), None, stalled, argv)

    @cached_property
    def two_nodes(self) -> Run:
        """Two node commands (--num-nodes 2 --node-id 0|1 --num-gpus 1) started together on this machine."""
        folder = self._folder("two-node run")
        port = processes.free_port()
        commands = []
        for k in (0, 1):  # each node with a disk of its own
            layout: Argv = [["--num-nodes", 2], ["--node-id", k], ["--num-gpus", 1]]
            argv = self._argv(layout + self._common(folder / f"node{k}-disk", epochs=1, port=port))
            commands.append([processes.PYTHON, str(self.script), *argv])
        # on GPUs each "node" gets a GPU of its own: NCCL refuses two ranks on one device
        results, stalled = self._launch("two-node run", commands, folder, self.devices["two_nodes"])
        return Run("two-node run", results, read_traces(folder), None, stalled, commands[0][2:])
