"""One run of a learner's file: what its processes printed, did and reported, and what went wrong
in it, in a sentence (`Run.problem`) or as a cause outside the learner's code (`Run.outside_cause`)."""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any

from autograde.engine import processes
from autograde.protocol import ProcessTrace, where

HEARTBEAT = 5.0  # seconds between the lines a long run prints to show it is alive
STALL_SECONDS = 12.0  # on GPUs, 30: setting up CUDA and NCCL can be slow
TIME_LIMIT = 120.0


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

    def by_group(self) -> dict[tuple[int, int], ProcessTrace]:
        """The traces of the processes that joined a process group, by (world size, rank): a task's
        run starts a group of each size in turn."""
        found = {}
        for trace in self.traces.values():
            if (joined := trace.joined()) is not None:
                found[joined.get("world_size") or 0, joined.get("rank_joined") or 0] = trace
        return found

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


