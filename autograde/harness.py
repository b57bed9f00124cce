"""Drives the learner's script inside a launched process, for the checks that cannot wait
for the script to launch itself (Steps 1-9).

    python -m autograde.harness setup   --script S --out F.json --argv '[["--num-nodes", "3"], ...]'
    python -m autograde.harness workers --script S --out F.json --nodes '[[argv of node 0], ...]' --procs-per-node N

A command line is given as [option, value] pairs (value null for a flag); options the
script's parser does not know are left out, so that one command line fits every step.

`setup` runs the script's own `__main__` code with the given command line until it starts
real work (a process group, a data set, a data loader, mp.spawn, whichever comes first),
then reports what its argument parser made of the command line, its defaults, and the
MASTER_ADDR / MASTER_PORT it set. `workers` does the same for every node, then starts
one process per (node, local rank), as mp.spawn would, each calling the script's
`worker(local_rank, args)` with that node's args. The checker never imports the learner's
script itself: this module runs in a process of its own, and the checker only reads the
JSON it writes and the traces of the processes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator


class _Stop(Exception):
    """Raised where the script starts real work, to end the set-up run there."""


@dataclass
class Setup:
    """What the script's set-up code did with one command line."""

    stop: str | None = None          # the call that ended the set-up run
    error: str | None = None         # why it ended otherwise
    options: list[str] = field(default_factory=list)    # the options the parser knows
    dests: dict[str, str] = field(default_factory=dict)  # option -> attribute of args
    argv: list[str] = field(default_factory=list)        # the command line actually given
    values: dict[str, Any] = field(default_factory=dict)   # the parsed args, after main's changes
    types: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Any] | None = None
    env: dict[str, str | None] = field(default_factory=dict)


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


def _short_error(err: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == os.environ.get("DDP_LAB_SCRIPT")]
    where = f" (line {frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {err}{where}"[:400]


Argv = list[list[Any]]


def _known(parser: argparse.ArgumentParser, wanted: Argv) -> list[str]:
    argv: list[str] = []
    for option, value in wanted:
        if option in parser._option_string_actions:
            argv += [option] if value is None else [option, str(value)]
    return argv


@contextlib.contextmanager
def _stops() -> Iterator[None]:
    """Make the calls where real work starts raise _Stop, for as long as the block runs."""
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader
    from torchvision.datasets import FashionMNIST

    def stopper(what: str) -> Any:
        def stop(*args: Any, **kwargs: Any) -> Any:
            raise _Stop(what)
        return stop

    targets = [(dist, "init_process_group"), (mp, "spawn"), (mp, "start_processes"),
               (FashionMNIST, "__init__"), (DataLoader, "__init__")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets]
    for owner, name in targets:
        setattr(owner, name, stopper(f"{getattr(owner, '__name__', owner)}.{name}"))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def setup_run(script: str, wanted: Argv) -> tuple[Setup, Any]:
    """Run the script's main code on `wanted` until it starts real work; return what it did and its args."""
    parsers: list[argparse.ArgumentParser] = []
    namespaces: list[argparse.Namespace] = []
    original_parse = argparse.ArgumentParser.parse_args

    result = Setup()

    def parse_args(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        if args is not None:
            return original_parse(self, args, namespace)
        result.argv = _known(self, wanted)
        parsed = original_parse(self, result.argv, namespace)
        parsers.append(self)
        namespaces.append(parsed)
        return parsed

    argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]
    sys.argv = [script]
    try:
        with _stops():
            runpy.run_path(script, run_name="__main__")
        result.error = "the script ended without starting any work"
    except _Stop as stop:
        result.stop = str(stop)
    except SystemExit as exit_:
        result.error = f"the script exited ({exit_.code}) with the command line: {' '.join(result.argv)}"
    except BaseException as err:  # the learner's code may raise anything
        result.error = f"the script crashed: {_short_error(err)}"
    finally:
        argparse.ArgumentParser.parse_args = original_parse  # type: ignore[method-assign]
    result.env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    if not parsers:
        return result, None
    parser, args = parsers[0], namespaces[0]
    result.options = sorted(o for o in parser._option_string_actions if o.startswith("--"))
    result.dests = {o: a.dest for o, a in parser._option_string_actions.items() if o.startswith("--")}
    result.values = {k: _jsonable(v) for k, v in vars(args).items()}
    result.types = {k: type(v).__name__ for k, v in vars(args).items()}
    try:
        result.defaults = {k: _jsonable(v) for k, v in vars(original_parse(parser, [])).items()}
    except SystemExit:
        result.defaults = None
    return result, args


def _definitions(script: str) -> dict[str, Any]:
    """The script's functions, without running its main code (even a launch not under
    `if __name__ == "__main__"` stops where it starts real work)."""
    namespace: dict[str, Any] = {"__name__": "ddp_lab_learner", "__file__": script}
    with open(script) as f:
        code = compile(f.read(), script, "exec")
    with _stops():
        try:
            exec(code, namespace)
        except (_Stop, SystemExit):
            pass
    return namespace


def _child(worker: Any, local_rank: int, args: Any) -> int:
    from autograde import tracer
    tracer.emit("worker_start", local_rank=local_rank)
    try:
        worker(local_rank, args)
        tracer.record_parameters()
        tracer.emit("worker_done", optimizer_steps=tracer.optimizer_steps())
        return 0
    except BaseException as err:
        if tracer._trace_dir:
            tracer.emit("crash", error=_short_error(err))
        traceback.print_exc()
        return 1


def workers_run(script: str, node_argvs: list[Argv], procs_per_node: int,
                save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Set up every node, then run worker(local_rank, args) in one forked process per (node, local rank).

    The report is saved as soon as the processes are started, and again when they end, so
    that a run stopped for hanging still says which process was which."""
    setups, node_args = [], []
    for argv in node_argvs:
        setup, args = setup_run(script, argv)
        setups.append(asdict(setup))
        node_args.append(args)
    report: dict[str, Any] = {"setups": setups, "children": []}
    if any(a is None for a in node_args) or any(s["stop"] is None for s in setups):
        report["error"] = next(s["error"] for s in setups if s["stop"] is None) or "no command line was parsed"
        return report
    module = _definitions(script)
    worker = module.get("worker")
    if not callable(worker):
        report["error"] = "there is no function worker(local_rank, args) in the script"
        return report
    sys.stdout.flush()
    children: dict[int, dict[str, Any]] = {}
    for node, args in enumerate(node_args):
        for local_rank in range(procs_per_node):
            pid = os.fork()
            if pid == 0:
                code = _child(worker, local_rank, args)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            children[pid] = {"node": node, "local_rank": local_rank, "pid": pid, "exit": None}
    report["children"] = list(children.values())
    save(report)
    failed_at = None
    while any(c["exit"] is None for c in children.values()):
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            children[pid]["exit"] = os.waitstatus_to_exitcode(status)
            if children[pid]["exit"] != 0 and failed_at is None:
                failed_at = time.monotonic()
        elif failed_at is not None and time.monotonic() - failed_at > 3:
            for c in children.values():  # one process failed: stop the rest, as mp.spawn does
                if c["exit"] is None:
                    os.kill(c["pid"], signal.SIGKILL)
                    c["stopped"] = True
        else:
            time.sleep(0.02)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m autograde.harness")
    parser.add_argument("mode", choices=["setup", "workers"])
    parser.add_argument("--script", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--argv", default="[]", help="setup: the command line, as a JSON list")
    parser.add_argument("--nodes", default="[]", help="workers: each node's command line, as JSON")
    parser.add_argument("--procs-per-node", type=int, default=2)
    options = parser.parse_args()
    script = os.path.abspath(options.script)
    os.environ["DDP_LAB_SCRIPT"] = script
    sys.path.insert(0, os.path.dirname(script))

    def save(report: dict[str, Any]) -> None:
        with open(options.out + ".part", "w") as f:
            json.dump(report, f)
        os.replace(options.out + ".part", options.out)

    if options.mode == "setup":
        save(asdict(setup_run(script, json.loads(options.argv))[0]))
    else:
        save(workers_run(script, json.loads(options.nodes), options.procs_per_node, save))


if __name__ == "__main__":
    main()
