"""Reads the per-process traces that autograde/checker/tracer.py writes."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Event = dict[str, Any]


@dataclass
class ProcessTrace:
    """Everything one process did, in order."""

    pid: int
    events: list[Event] = field(default_factory=list)

    @property
    def rank(self) -> int | None:
        """The global rank the process joined the group with (None if it never joined)."""
        for e in self.events:
            if e["ev"] == "exit" and e.get("call") == "init_process_group":
                return e.get("rank_joined", e.get("rank"))
        return None

    def named(self, *names: str) -> list[Event]:
        return [e for e in self.events if e["ev"] in names]

    def calls(self, call: str) -> list[Event]:
        """The times the process entered a torch.distributed call."""
        return [e for e in self.events if e["ev"] == "enter" and e.get("call") == call]

    def waiting_in(self) -> Event | None:
        """The call the process entered and never left (where it hung or died), if any."""
        open_calls: list[Event] = []
        for e in self.events:
            if e["ev"] == "enter":
                open_calls.append(e)
            elif e["ev"] == "exit" and open_calls and open_calls[-1].get("call") == e.get("call"):
                open_calls.pop()
        return open_calls[-1] if open_calls else None

    def last_seen(self) -> str:
        """What the process did last, for a stall outside any collective: `dist.barrier() returned`."""
        if not self.events:
            return "nothing traced"
        e = self.events[-1]
        if e["ev"] in ("enter", "exit"):
            return f"{where(e)} {'entered' if e['ev'] == 'enter' else 'returned'}"
        return e["ev"].replace("_", " ")

    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"process {self.pid}"


def read(trace_dir: Path) -> dict[int, ProcessTrace]:
    """Every process's trace in `trace_dir`, by pid. A line cut short by a kill is skipped."""
    traces: dict[int, ProcessTrace] = {}
    for path in sorted(Path(trace_dir).glob("trace-*.jsonl")):
        pid = int(path.stem.split("-")[1])
        trace = ProcessTrace(pid)
        for line in path.read_text().splitlines():
            try:
                trace.events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        traces[pid] = trace
    return traces


def where(event: Event) -> str:
    """`dist.barrier()` at line 170, or without the line where it is not known."""
    line = event.get("line")
    return f"dist.{event.get('call')}()" + (f" (line {line})" if line else "")
