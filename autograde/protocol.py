"""What crosses the process boundary and serves every part, defined once. The checker's side
(autograde/engine/, autograde/grading/, a part's checks) starts the learner's processes and reads
what they leave; the code that runs in those processes (autograde/inprocess/, a part's
inprocess*.py) writes it. Both sides import this module, autograde/settings.py (the environment)
and a part's reports.py (its tasks and reports), and nothing else of each other.

- A task: what the checker asks autograde/inprocess/runner.py to do in a run of its own, a
  `Task` dataclass that a part subclasses, sent as JSON (`encode_task`) and read back
  (`decode_task`); the runner writes each rank's report (a dataclass of the part's) to
  `<out>/<world size>-<rank>.json`, which `read_reports` gives back and `decode` turns into the
  report's dataclass again, nested dataclasses included.
- A trace is one JSON object per line and event, in `<trace dir>/trace-<pid>.jsonl`: `t`, `pid`,
  `rank`, `ev`, `line`, and the fields that EVENTS lists for its kind. `read` gives each
  process's as a `ProcessTrace`. tests/core/test_formats.py checks the recordings against EVENTS.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import socket
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, TypeVar

# The torch.distributed calls traced as "enter"/"exit" events (send and recv too, and "wait")
COLLECTIVES = ("barrier", "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter", "gather", "scatter", "all_gather_object", "broadcast_object_list",
               "gather_object", "monitored_barrier", "reduce_scatter_tensor", "reduce_scatter_single",
               "all_gather_single")
# The calls that reduce, and those that gather: "numel" in their "enter" event is the size of what they reduce (a
# reduce-scatter's whole input), or of what they gather (the whole output)
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single")
GATHERING = ("all_gather", "all_gather_into_tensor", "all_gather_single")

T = TypeVar("T")


def free_port() -> int:
    """A TCP port that nothing listens on right now (the system picks it)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


# --- Tasks: what a run asks the runner to do with the learner's file -----------------------------
@dataclass
class Task:
    """A run of autograde/inprocess/runner.py: its options, as a part's subclass declares them.

    `world_sizes`: a process group of each size in turn, every rank calling the part's function
    that `performs` this task with (rank, task, device); or, where `in_a_group` is False, the
    function called once with the task alone (it starts what processes it needs)."""

    script: str = ""                   # the learner's file, absolute
    world_sizes: list[int] = field(default_factory=lambda: [1])
    world_size: int = 0                # set by the runner for each group in turn
    in_a_group: ClassVar[bool] = True
    on_cpu: ClassVar[bool] = False     # gloo on the CPU even where there are GPUs (arithmetic judged on models on the CPU)
    runs_in: ClassVar[str] = "inprocess"  # the file of the part's folder whose function performs it


PERFORMS: dict[type, Callable[..., Any]] = {}


def performs(task: type[Task]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a function of a part's in-process file as the one that does `task`."""
    def mark(function: Callable[..., Any]) -> Callable[..., Any]:
        PERFORMS[task] = function
        return function
    return mark


def encode_task(task: Task) -> str:
    """The task as one JSON string: its class (module and name) and its fields."""
    kind = type(task)
    return json.dumps({"task": [kind.__module__, kind.__qualname__], "options": dataclasses.asdict(task)})


def decode_task(text: str) -> Task:
    """The task `encode_task` wrote, its class imported."""
    data = json.loads(text)
    module, name = data["task"]
    kind = getattr(importlib.import_module(module), name)
    return decode(kind, data["options"])


def function_of(task: Task) -> Callable[..., Any]:
    """The function that performs `task`: its part's in-process file (`runs_in`), imported."""
    kind = type(task)
    package = kind.__module__.rpartition(".")[0]
    importlib.import_module(f"{package}.{kind.runs_in}")
    return PERFORMS[kind]


def decode(kind: type[T], data: dict[str, Any]) -> T:
    """A dataclass from its JSON (`dataclasses.asdict`'s), nested dataclasses in fields, lists and
    optionals made again; keys it does not know are left out."""
    hints = typing.get_type_hints(kind)
    values = {f.name: _value(hints[f.name], data[f.name])
              for f in dataclasses.fields(kind) if f.init and f.name in data}  # type: ignore[arg-type]
    return kind(**values)


def _value(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    if dataclasses.is_dataclass(hint):
        return decode(hint, value)  # type: ignore[arg-type]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and args:
        return [_value(args[0], v) for v in value]
    if origin is dict and len(args) == 2:
        return {k: _value(args[1], v) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _value(inner[0], value) if len(inner) == 1 else value
    return value


def read_reports(folder: Path) -> list[dict[str, Any]]:
    """What every rank of a task's run wrote in `folder` (`<world size>-<rank>.json`), as JSON."""
    return [json.loads(path.read_text()) for path in sorted(Path(folder).glob("*-*.json"))]


# A task of every part's: the learner's plain functions called with JSON arguments, in one process
@dataclass
class CallsTask(Task):
    """Call each [function name, [arguments]] of `calls` (JSON dicts with integer keys become int keys)."""

    calls: list[list[Any]] = field(default_factory=list)
    in_a_group: ClassVar[bool] = False
    runs_in: ClassVar[str] = "inprocess.calls"  # autograde/inprocess/calls.py


@dataclass
class Call:
    """One call of a learner's plain function: what it returned (as JSON), or the error it raised."""

    function: str
    args: list[Any]
    value: Any = None
    error: str | None = None


@dataclass
class CallsReport:
    """What the learner's plain functions gave for the checker's arguments (a CallsTask's run)."""

    world_size: int
    rank: int
    calls: list[Call] = field(default_factory=list)
    error: str | None = None     # the error importing the file raised, if it did


# --- Traces --------------------------------------------------------------------------------------
# Every event's own fields, by kind: those every traced process writes (the core's tracer, the
# runner); a part's own are its reports.py's EVENTS. "enter"/"exit" are torch.distributed calls
# (collectives, send and recv, init_process_group, destroy_process_group, and "wait": a request's
# wait() in the learner's code); the extra fields of init_process_group's are listed.
COMMON = ("t", "pid", "rank", "ev", "line")
EVENTS: dict[str, tuple[str, ...]] = {
    # all_reduce's: its tensor's size and dtype ("float32", "bfloat16"), async or not; the other reducing calls' (REDUCING): what they reduce, the
    # whole input (a reduce-scatter's, not its output's); the gathering calls' (GATHERING): the whole output's size;
    # any collective given a group: the group's size;
    # init_process_group's: the rank it was given (`rank`, else None) and RANK in the environment
    "enter": ("call", "backend", "world_size", "numel", "async_op", "group_size", "env_rank", "dtype"),
    # init_process_group's exit: env_rank is RANK in the environment, life how often torchrun restarted
    "exit": ("call", "rank_joined", "world_size", "backend", "env_rank", "life"),
    "set_device": ("device",),
    "parameters": ("sha1", "when", "norms", "steps"),
    "spawn": ("call", "nprocs", "fn", "caller_module"),
    "child_signal": ("signal",),
    "dataset_enter": ("train", "download"),
    "dataset_error": ("error",),
    "dataset_exit": ("dataset", "train", "size"),
    "download_start": (),
    "download_end": (),
    "sampler": ("sampler", "dataset", "num_replicas", "sampler_rank", "drop_last", "size"),
    "sampler_iter": ("sampler", "epoch", "indices"),
    "set_epoch": (),
    # train: the loader's data set is Fashion-MNIST's training set (True), its validation set (False), or
    # neither (None; absent from older recordings)
    "loader": ("loader", "dataset", "sampler", "sampler_type", "train"),
    "loader_iter": ("loader", "validation"),
    # a validation loader's: per_image, [loss, correct] of each image the model evaluated, and evaluated,
    # each one's place in the loader's order (absent from older recordings: the first len(per_image))
    "loader_end": ("loader", "samples", "per_image", "evaluated"),
    "first_optimizer_step": (),
    "ddp": ("device_ids", "parameter_device", "batchnorms", "sync_batchnorms"),
    "moved_after_wrap": (),
    "print": ("text",),
    # a point-to-point message: op is send, recv, isend or irecv; peer the other rank
    "message": ("op", "peer", "numel"),
    "crash": ("error",),
    # written by autograde/inprocess/runner.py around each call of a learner's function
    "case_start": ("case", "world_size"),
    "case_end": ("case",),
}


Event = dict[str, Any]


@dataclass
class ProcessTrace:
    """Everything one process did, in order."""

    pid: int
    events: list[Event] = field(default_factory=list)

    def joined(self) -> Event | None:
        """init_process_group's exit event: the group the process joined first (None if it never did)."""
        return next((e for e in self.events if e["ev"] == "exit" and e.get("call") == "init_process_group"), None)

    @property
    def rank(self) -> int | None:
        """The global rank the process joined the group with (None if it never joined)."""
        joined = self.joined()
        return None if joined is None else joined.get("rank_joined", joined.get("rank"))

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
    call = "the wait() of a request (async_op=True, isend or irecv)" if event.get("call") == "wait" else f"dist.{event.get('call')}()"
    return call + (f" (line {line})" if line else "")
