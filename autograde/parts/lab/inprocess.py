"""The lab inside the learner's processes: the staged download its checks read, and the driver of
the learner's script for the checks that cannot wait for the script to launch itself (Steps
1-9): the tasks `SetupTask` and `WorkersTask` (reports.py), which the runner
(autograde/inprocess/runner.py) hands to `setup` and `workers` here.

A command line is given as [option, value] pairs (value null for a flag); options the
script's parser does not know are left out, so that one command line fits every step.

`setup` runs the script's own `__main__` code with the given command line until it starts
real work (a process group, a data loader, mp.spawn, whichever comes first; data sets it may
build, and download, before starting its processes, as one download per node can be),
then reports what its argument parser made of the command line, its defaults, the
environment it set, and every place a world size may be kept. Where the main code reaches
mp.spawn, it goes on as the first spawned process would, to the first process group, so
that what the processes are told at that moment (MASTER_ADDR, the world size) is seen too.

`workers` runs each node's main code the same way, each node in a process of its own (its
environment changes stay its own), then starts one process per (node, local rank) as
mp.spawn would: the process imports the script afresh as `__mp_main__` with its node's
command line, so module-level code sees that node's arguments and nothing the
`if __name__ == "__main__":` block made, then calls the function the script's own mp.spawn
would call, with the (pickled and unpickled) arguments it would pass. Before Step 10, when
main calls `worker(0, args)` itself, each process calls `worker(local_rank, args)` with the
args that node's main code built. The checker never imports the learner's script itself:
this module runs in a process of its own, and the checker only reads the JSON it writes and
the traces of the processes.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import inspect
import json
import os
import pickle
import runpy
import signal
import sys
import time
import traceback
import types
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

from autograde.inprocess import tracer
from autograde.inprocess.learner_file import short_error
from autograde.parts.lab.reports import Argv, Child, Setup, SetupTask, Workers, WorkersTask
from autograde.protocol import performs
from autograde.settings import SCRIPT, STAGING


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


SPAWNED_SECONDS = 10  # how long the setup run follows the first spawned process towards its process group


def _known(parser: argparse.ArgumentParser, wanted: Argv) -> list[str]:
    argv: list[str] = []
    for option, value in wanted:
        if option in parser._option_string_actions:
            argv += [option] if value is None else [option, str(value)]
    return argv


class _Stop(Exception):
    """Raised where the script starts real work, to end the set-up run there."""

    def __init__(self, what: str, bound: dict[str, Any]) -> None:
        super().__init__(what)
        self.bound = bound  # the call's arguments, by parameter name
        main = sys.modules.get("__main__")
        self.module = dict(vars(main)) if main is not None else {}  # the script's globals at that moment
        self.environ = dict(os.environ)
        # mp.spawn's function and arguments travel to new processes pickled, as for real (by
        # reference to __main__, which is the script's module right now)
        self.payload: bytes | None = None
        self.payload_error: str | None = None
        if "fn" in bound:
            try:
                self.payload = pickle.dumps((bound["fn"], tuple(bound.get("args", ()))))
            except Exception as err:  # what mp.spawn itself would fail with
                self.payload_error = f"{type(err).__name__}: {err}"


@contextlib.contextmanager
def _stops() -> Iterator[None]:
    """Make the calls where real work starts raise _Stop, for as long as the block runs."""
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader

    def stopper(what: str, original: Any) -> Any:
        try:
            signature: inspect.Signature | None = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        def stop(*args: Any, **kwargs: Any) -> Any:
            bound: dict[str, Any] = {}
            if signature is not None:
                with contextlib.suppress(TypeError):
                    bound = dict(signature.bind(*args, **kwargs).arguments)
            raise _Stop(what, bound)
        return stop

    targets = [(dist, "init_process_group"), (mp, "spawn"), (mp, "start_processes"), (DataLoader, "__init__")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets]
    for owner, name, original in saved:
        setattr(owner, name, stopper(f"{getattr(owner, '__name__', owner)}.{name}", original))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def _ints(values: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in values.items() if type(v) is int and not k.startswith("__")}


def _record_stop(result: Setup, stop: _Stop) -> None:
    """What the script had done by the time it started real work."""
    result.env = {k: stop.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    result.module_ints = _ints(stop.module)
    if str(stop).endswith("init_process_group"):
        result.init = {k: _jsonable(v) for k, v in stop.bound.items() if k in ("backend", "init_method", "world_size", "rank")}


@dataclass
class _Node:
    """One node's main code, run to where it starts real work: what the processes it starts get."""

    setup: Setup
    argv: list[str]                  # the command line the script was given
    environ: dict[str, str]          # the environment the processes inherit
    payload: bytes | None = None     # pickled (function, arguments) to call in each process
    error: str | None = None


def run_main(script: str, wanted: Argv) -> tuple[_Node, _Stop | None]:
    """Run the script's main code on `wanted` until it starts real work; what it did, and where it stopped."""
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
    result.pid = os.getpid()
    stopped: _Stop | None = None
    try:
        with _stops():
            runpy.run_path(script, run_name="__main__")
        result.error = "the script ended without starting any work"
    except _Stop as stop:
        stopped = stop
        result.stop = str(stop)
        _record_stop(result, stop)
    except SystemExit as exit_:
        result.error = f"the script exited ({exit_.code}) with the command line: {' '.join(result.argv)}"
    except BaseException as err:  # the learner's code may raise anything
        result.error = f"the script crashed: {short_error(err)}"
    finally:
        argparse.ArgumentParser.parse_args = original_parse  # type: ignore[method-assign]
    if stopped is None:
        result.env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    node = _Node(result, result.argv, dict(stopped.environ if stopped else os.environ))
    if parsers:
        parser, args = parsers[0], namespaces[0]
        result.options = sorted(o for o in parser._option_string_actions if o.startswith("--"))
        result.dests = {o: a.dest for o, a in parser._option_string_actions.items() if o.startswith("--")}
        result.values = {k: _jsonable(v) for k, v in vars(args).items()}
        result.types = {k: type(v).__name__ for k, v in vars(args).items()}
        try:
            result.defaults = {k: _jsonable(v) for k, v in vars(original_parse(parser, [])).items()}
        except SystemExit:
            result.defaults = None
    if stopped is not None and "fn" in stopped.bound:  # Step 10 done: what mp.spawn would send
        fn, spawn_args = stopped.bound["fn"], tuple(stopped.bound.get("args", ()))
        result.spawn = {"fn": getattr(fn, "__name__", repr(fn)), "nprocs": _jsonable(stopped.bound.get("nprocs", 1)),
                        "ints": [a for a in spawn_args if type(a) is int]
                        + [v for a in spawn_args for v in _ints(getattr(a, "__dict__", {})).values()]}
        node.payload, node.error = stopped.payload, stopped.payload_error and (
            f"mp.spawn could not send its arguments to new processes: {stopped.payload_error}")
    elif stopped is not None:  # before Step 10: main calls worker(0, args) itself
        worker = stopped.module.get("worker")
        if not callable(worker):
            node.error = "there is no function worker(local_rank, args) in the script"
        elif not namespaces:
            node.error = "no command line was parsed"
        else:
            try:
                node.payload = _pickle_as_main(stopped.module, (worker, (namespaces[0],)))
            except Exception as err:
                node.error = f"the args could not be given to another process: {type(err).__name__}: {err}"
    return node, stopped


def _pickle_as_main(module: dict[str, Any], value: Any) -> bytes:
    """Pickle `value`, with the script's globals standing as __main__ (as they did while main ran)."""
    saved = sys.modules.get("__main__")
    stand_in = types.ModuleType("__main__")
    stand_in.__dict__.update(module)
    sys.modules["__main__"] = stand_in
    try:
        return pickle.dumps(value)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _import_as_mp_main(script: str, argv: list[str]) -> None:
    """Import the script afresh as a spawned process does: as __mp_main__ (also standing as
    __main__), with its node's command line. Starting processes while being imported fails, as it
    does for real."""
    import torch.multiprocessing as mp

    def too_early(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the script started processes while a new process was importing it: "
                           "put the launch under `if __name__ == \"__main__\":`")

    sys.argv = [script, *argv]
    saved = mp.spawn, mp.start_processes
    mp.spawn = mp.start_processes = too_early  # type: ignore[assignment]
    try:
        content = runpy.run_path(script, run_name="__mp_main__")
    finally:
        mp.spawn, mp.start_processes = saved  # type: ignore[assignment]
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(content)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def setup_run(script: str, wanted: Argv) -> Setup:
    """The script's main code on `wanted`, to where it starts real work; when that is mp.spawn, on
    into the first spawned process (local rank 0) up to its first process group."""
    node, stopped = run_main(script, wanted)
    setup = node.setup
    if stopped is None or node.payload is None or setup.spawn is None:
        return setup
    def too_long(*_: Any) -> None:
        raise _TooLong()

    signal.signal(signal.SIGALRM, too_long)
    signal.alarm(SPAWNED_SECONDS)  # a worker that never gets to a process group must not hold up Steps 1-2
    try:
        os.environ.clear()
        os.environ.update(node.environ)
        _import_as_mp_main(script, node.argv)
        fn, args = pickle.loads(node.payload)
        with _stops():
            fn(0, *args)
    except _Stop as stop:
        _record_stop(setup, stop)
        setup.module_ints.update(_ints(stop.module))
    except _TooLong:
        pass  # what the main code did is all there is to see
    except BaseException as err:  # the main code's part (Steps 1-2) stands; the workers run shows this
        setup.spawned_error = f"the first spawned process crashed: {short_error(err)}"
    finally:
        signal.alarm(0)
    return setup


class _TooLong(BaseException):
    """The first spawned process took too long to reach a process group."""


def _child(node: _Node, script: str, local_rank: int) -> int:
    """One simulated process of mp.spawn: a fresh import of the script, then its function."""
    os.environ.clear()
    os.environ.update(node.environ)
    try:
        _import_as_mp_main(script, node.argv)
        assert node.payload is not None
        fn, args = pickle.loads(node.payload)
        tracer.emit("worker_start", fn=getattr(fn, "__qualname__", repr(fn)),
                    visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))  # each node's own GPUs
        fn(local_rank, *args)
        tracer.record_parameters()
        tracer.emit("worker_done", optimizer_steps=tracer.optimizer_steps())
        return 0
    except BaseException as err:
        if tracer._trace_dir:
            tracer.emit("crash", error=short_error(err))
        traceback.print_exc()
        return 1


def _node_in_own_process(script: str, argv: Argv, gpus: str) -> _Node:
    """run_main in a forked process, so that each node's changes to the environment stay its own.
    The node sees the GPUs `gpus` (CUDA_VISIBLE_DEVICES; "" for none), and so do its processes."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus  # before anything starts CUDA
        try:
            node, _ = run_main(script, argv)
            message = {"setup": asdict(node.setup), "argv": node.argv, "environ": node.environ,
                       "payload": base64.b64encode(node.payload).decode() if node.payload else None, "error": node.error}
            data = json.dumps(message, default=repr).encode()
        except BaseException as err:  # noqa: BLE001 (the parent must hear about anything)
            data = json.dumps({"crash": short_error(err)}).encode()
        with os.fdopen(write, "wb") as pipe:
            pipe.write(data)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = json.loads(pipe.read() or b'{"crash": "the node process died"}')
    os.waitpid(pid, 0)
    if "crash" in message:
        return _Node(Setup(error=f"the script crashed: {message['crash']}"), [], {}, None, None)
    return _Node(Setup(**message["setup"]), message["argv"], message["environ"],
                 base64.b64decode(message["payload"]) if message["payload"] else None, message["error"])


def workers_run(script: str, node_argvs: list[Argv], procs_per_node: int,
                save: Callable[[Workers], None], node_gpus: list[str] | None = None) -> Workers:
    """Set up every node, then run, in one forked process per (node, local rank), what that node's
    mp.spawn would run (before Step 10: worker(local_rank, args)).

    The report is saved as soon as the processes are started, and again when they end, so
    that a run stopped for hanging still says which process was which."""
    gpus = node_gpus or [""] * len(node_argvs)
    nodes = [_node_in_own_process(script, argv, gpus[k]) for k, argv in enumerate(node_argvs)]
    report = Workers([n.setup for n in nodes])
    failed = next((n for n in nodes if n.setup.stop is None or n.error or n.payload is None), None)
    if failed is not None:
        report.error = failed.setup.error or failed.error or "no command line was parsed"
        return report
    sys.stdout.flush()
    children: dict[int, Child] = {}
    for index, node in enumerate(nodes):
        for local_rank in range(procs_per_node):
            pid = os.fork()
            if pid == 0:
                code = _child(node, script, local_rank)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            children[pid] = Child(node=index, local_rank=local_rank, pid=pid)
    report.children = list(children.values())
    save(report)
    failed_at = None
    running = set(children)
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            running.discard(pid)
            if os.waitstatus_to_exitcode(status) != 0 and failed_at is None:
                failed_at = time.monotonic()
        elif failed_at is not None and time.monotonic() - failed_at > 3:
            for pid in running:  # one process failed: stop the rest, as mp.spawn does
                os.kill(pid, signal.SIGKILL)
        else:
            time.sleep(0.02)
    return report


DOWNLOAD_SECONDS = 1.0  # how long the staged "download" takes: a reader that does not wait loses the race


def install() -> None:
    """With $DDP_LAB_STAGING set (the checker runs offline), a "download" of Fashion-MNIST copies the
    stand-in's files from that folder after a short delay, each file appearing whole (Step 5)."""
    if not os.environ.get(STAGING):
        return
    tracer.when_imported("torchvision.datasets.mnist", _stage_download)


def _stage_download(mnist: types.ModuleType) -> None:
    import shutil

    FashionMNIST = mnist.FashionMNIST
    original_download = FashionMNIST.download

    def download(self: Any) -> None:
        staging = os.environ[STAGING]
        if self._check_exists():
            return original_download(self)
        tracer.emit("download_start")
        time.sleep(DOWNLOAD_SECONDS)
        os.makedirs(self.raw_folder, exist_ok=True)
        raw = os.path.join(staging, "FashionMNIST", "raw")
        for name in sorted(os.listdir(raw)):
            partial = os.path.join(self.raw_folder, f"{name}.{os.getpid()}.part")
            shutil.copyfile(os.path.join(raw, name), partial)
            os.replace(partial, os.path.join(self.raw_folder, name))
        tracer.emit("download_end")

    FashionMNIST.download = download  # type: ignore[method-assign]


REPORT = "report.json"  # in the run's folder: the setup run's Setup, or the workers run's Workers


def _start(script: str, out: str) -> Callable[[Setup | Workers], None]:
    """Ready the learner's file to run as the lab's driver; the function that saves a report, whole."""
    os.environ[SCRIPT] = script
    sys.path.insert(0, os.path.dirname(script))
    path = os.path.join(out, REPORT)

    def save(report: Setup | Workers) -> None:
        with open(path + ".part", "w") as f:
            json.dump(asdict(report), f)
        os.replace(path + ".part", path)

    return save


@performs(SetupTask)
def setup(task: SetupTask, out: str) -> None:
    save = _start(task.script, out)
    save(setup_run(task.script, task.argv))


@performs(WorkersTask)
def workers(task: WorkersTask, out: str) -> None:
    save = _start(task.script, out)
    save(workers_run(task.script, task.nodes, task.procs_per_node, save, task.node_gpus))
