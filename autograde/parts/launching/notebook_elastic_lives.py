"""An elastic run of notebook 15 as notebook_elastic.py reads it: the group's lives (one per
rendezvous round: its world size, which node held which rank, the epochs trained and when), read
from the agents' and workers' lines as they come."""
from __future__ import annotations

import queue
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

NODES = {"A": "127.0.0.1", "B": "127.0.0.2"}  # loopback addresses: two "nodes" on one machine


LOG_PREFIX = re.compile(r"^[IWE]\d{4} [\d:.]+ +\d+ \S+\] ?")


@dataclass
class Life:
    """One life of the group: the workers one rendezvous round started, until they stopped."""

    number: int
    world_size: int
    ranks: dict[str, int]  # node -> its rank (one process per node: the node's rank is the process's)
    start: float  # when the rendezvous completed, in seconds since the scenario began
    ends: dict[str, float] = field(default_factory=dict)  # node -> when its worker stopped
    resumed_at: int | None = None  # the epoch it went on from, read from a checkpoint; None: from scratch
    loaded_at: float | None = None  # when rank 0 said it had loaded the checkpoint
    # epoch -> when rank 0 reported it done. Every rank of the life trained it: an epoch ends with an
    # all-reduce and a barrier, which no rank passes before all have finished the epoch.
    epochs: dict[int, float] = field(default_factory=dict)
    ended_by: str = ""  # "a node joined", "a worker failed", "finished" ("" while it runs)
    restart_count: int = 0  # torchrun's count of failures so far (TORCHELASTIC_RESTART_COUNT): joins do not count

    @property
    def end(self) -> float:
        return max(self.ends.values(), default=self.start)


@dataclass
class ElasticRun:
    """What a scenario did."""

    title: str
    epochs: int  # epochs the run was asked to train in all
    commands: dict[str, list[str]]  # node -> its torchrun command line
    lives: list[Life]
    events: list[tuple[float, str, str]]  # (seconds, node, what): "started", "killed", "frozen", "exit 0"
    rendezvous_waits: list[tuple[str, int, float]]  # (node, life, seconds from "Rendezvous'ing" to complete)
    exit_status: dict[str, int | None]  # node -> its torchrun's exit status (negative: killed by a signal)
    seconds: float
    folder: Path  # where its checkpoint was (removed): every process it started named it on its command line
    output: dict[str, list[tuple[float, str]]]  # node -> every line its torchrun and worker printed

    @property
    def world_sizes(self) -> list[int]:
        return [life.world_size for life in self.lives]

    @property
    def finished(self) -> bool:
        """Whether the last life trained the last epoch and the group finished."""
        return bool(self.lives) and self.epochs in self.lives[-1].epochs and self.lives[-1].ended_by == "finished"

    def table(self) -> str:
        """One line per life: world size, who held which rank, the epochs trained, how it ended."""
        rows = [f"{'life':>4}  {'world size':>10}  {'ranks':<10}  {'went on from':<16}  {'epochs trained':<14}  "
                f"{'restarts':>8}  {'seconds':>13}  ended by"]
        for life in self.lives:
            ranks = " ".join(f"{node}:{rank}" for node, rank in sorted(life.ranks.items(), key=lambda nr: nr[1]))
            source = "scratch" if life.resumed_at is None else f"checkpoint, ep {life.resumed_at}"
            done = sorted(life.epochs)
            trained = f"{done[0]}-{done[-1]}" if len(done) > 1 else (str(done[0]) if done else "none")
            rows.append(f"{life.number:>4}  {life.world_size:>10}  {ranks:<10}  {source:<16}  {trained:<14}  "
                        f"{life.restart_count:>8}  {life.start:5.1f} - {life.end:5.1f}  {life.ended_by}")
        return "\n".join(rows)


def _pump(stream: object, node: str, lines: queue.Queue[tuple[float, str, str | None]], started: float) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put((time.monotonic() - started, node, line.rstrip("\n")))
    lines.put((time.monotonic() - started, node, None))


class _Watch:
    """Reads the agents' and workers' lines as they come: the lives of the group, and a short
    account of them in the cell (echo)."""

    EPOCH = re.compile(r"epoch (\d+) \| train loss")
    RESUMED = re.compile(r"resuming from .* at epoch (\d+)")
    FIELD = re.compile(r"^\s+(restart_count|master_port|group_rank|group_world_size)=(\d+)\s*$")

    def __init__(self, title: str, epochs: int, echo: bool) -> None:
        self.title, self.epochs, self.echo = title, epochs, echo
        self.output: dict[str, list[tuple[float, str]]] = {node: [] for node in NODES}
        self.events: list[tuple[float, str, str]] = []
        self.lives: dict[int, Life] = {}  # master port -> life: one port per rendezvous round
        self.current: dict[str, Life | None] = {node: None for node in NODES}
        self.pending: dict[str, dict[str, int]] = {node: {} for node in NODES}
        self.completed: dict[str, float] = {}
        self.joining: dict[str, float] = {}  # node -> when it began its rendezvous
        self.waits: list[tuple[str, int, float]] = []
        self.last_seen = 0.0

    def say(self, t: float, text: str) -> None:
        if self.echo:
            print(f"[{t:5.1f} s] {text}", flush=True)

    def event(self, t: float, node: str, what: str) -> None:
        self.events.append((t, node, what))
        if what in ("killed", "frozen"):
            self.end_life(node, t, None)
        self.say(t, {"started": f"node {node}: torchrun starts",
                     "killed": f"node {node}: every process killed (SIGKILL)",
                     "frozen": f"node {node}: every process frozen (SIGSTOP)"}.get(what, f"node {node}: {what}"))

    def end_life(self, node: str, t: float, why: str | None) -> None:
        life = self.current[node]
        if life is not None:
            life.ends.setdefault(node, t)
            if why and not life.ended_by:
                life.ended_by = why
        self.current[node] = None

    def done_epoch(self, epoch: int) -> bool:
        return any(epoch in life.epochs for life in self.lives.values())

    def last_line(self, node: str | None = None) -> str:
        lines = [(t, line) for n, seen in self.output.items() if node in (None, n) for t, line in seen if line.strip()]
        return max(lines)[1].strip()[:300] if lines else "(no output)"

    def line(self, t: float, node: str, raw: str) -> None:
        self.output[node].append((t, raw))
        self.last_seen = t
        text = LOG_PREFIX.sub("", raw)
        life = self.current[node]
        if "Rendezvous'ing worker group" in text:
            self.joining[node] = t
        elif "Rendezvous complete for workers" in text:
            self.completed[node], self.pending[node] = t, {}
        elif (match := self.FIELD.match(text)) and node in self.completed:
            self.pending[node][match.group(1)] = int(match.group(2))
        elif "Starting worker group" in text and node in self.completed:
            self.start_life(node, self.completed.pop(node))
        elif "new nodes" in text and "will restart worker group" in text:
            self.end_life(node, t, "a node joined")
            self.say(t, f"node {node}: a new node waits to join: torchrun stops this node's worker to start "
                        "the group again")
        elif "Worker group FAILED" in text:
            self.end_life(node, t, "a worker failed")
            self.say(t, f"node {node}: its worker failed: torchrun starts the group again ({text.split('. ', 1)[-1]})")
        elif "worker group successfully finished" in text:
            self.end_life(node, t, "finished")
            self.say(t, f"node {node}: worker finished")
        elif "Stopping worker group" in text:
            self.end_life(node, t, None)
        elif life is not None and (match := self.EPOCH.search(text)):
            life.epochs[int(match.group(1))] = t
            self.say(t, f"rank 0 (node {node}, life {life.number}): {match.group(0).split(' |')[0]} done")
        elif life is not None and (match := self.RESUMED.search(text)):
            life.resumed_at, life.loaded_at = int(match.group(1)), t
            self.say(t, f"rank 0 (node {node}, life {life.number}): found the checkpoint, goes on at epoch "
                        f"{life.resumed_at}")
        elif re.search(r"RuntimeError: .*(reset by peer|closed by peer|Timed out)", text):
            self.say(t, f"node {node}'s worker: {text.split('RuntimeError: ', 1)[1].split('] ', 1)[-1][:110]}")

    def start_life(self, node: str, t: float) -> None:
        fields = self.pending[node]
        port = fields.get("master_port", -len(self.lives) - 1)
        life = self.lives.get(port)
        if life is None:
            life = self.lives[port] = Life(len(self.lives) + 1, fields.get("group_world_size", 0), {}, t)
        life.start = min(life.start, t)
        life.restart_count = max(life.restart_count, fields.get("restart_count", 0))
        life.ranks[node] = fields.get("group_rank", -1)
        self.current[node] = life
        if node in self.joining:
            self.waits.append((node, life.number, t - self.joining.pop(node)))
        self.say(t, f"node {node}: rendezvous complete: life {life.number}, rank {life.ranks[node]} of a group "
                    f"of {life.world_size}")

    def result(self, commands: dict[str, list[str]], status: dict[str, int | None], seconds: float,
               folder: Path) -> ElasticRun:
        for node, code in status.items():
            self.end_life(node, seconds, None)
            self.events.append((seconds, node, f"exit {code}"))
        lives = sorted(self.lives.values(), key=lambda life: life.number)
        return ElasticRun(self.title, self.epochs, commands, lives, sorted(self.events), self.waits, status,
                          seconds, folder, self.output)
