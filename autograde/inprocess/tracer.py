"""The core of the tracing inside the processes the checker launches: a per-process trace of what
the learner's script does.

`install()` wraps, without changing what they do, the calls the course is about:
torch.distributed's process group, collectives and messages, torch.multiprocessing.spawn, the
Fashion-MNIST data set, DistributedSampler, DataLoader, DDP, optimizer steps and print.
Each process appends JSON lines to `<trace dir>/trace-<pid>.jsonl`, one event per line,
flushed at once, so a trace survives a process that is killed because it hung: a
collective's "enter" with no "exit" is where that process was waiting.

While the model is in evaluation mode, the logits it produces for the validation set are turned
into per-image losses, so that a check can compute the true global metrics.

What one part needs beyond this (the lab's staged download, part talk's work counting, part
launching's checkpoints and faults, part scaling's step tracing) lives in that part's module
beside this one, and acts at the points this module offers (`hook`); _startup/sitecustomize.py
installs them all. The events and their fields are the ones autograde/protocol.py lists. Code loaded
beside the tracer can act at the points it traces (`on`, `model`): the tests' probe does.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import time
import weakref
from types import FrameType, ModuleType
from typing import Any, Callable

from autograde.protocol import COLLECTIVES, GATHERING, REDUCING
from autograde.settings import SCRIPT, WARM_SPAWN

_trace_dir = ""
_script = ""
# The DDP model(s) made in this process, held weakly: a DDP model kept alive until the
# interpreter shuts down outlives its process group, and gloo then aborts the process
# ("terminate called without an active exception"; SIGABRT in 4 of 12 runs).
_ddp: list["weakref.ref[Any]"] = []
_moved: list["weakref.ref[Any]"] = []  # the first module moved with .to(): the model, before any DDP
# What acts at the points the tracer reaches, in the order registered: a part's module (lab.py,
# talk.py, ...), then code loaded beside the tracer (the tests' probe, tests/probe). See hook() and on().
_hooks: dict[str, list[Callable[..., None]]] = {"optimizer_step": [], "validation": [], "ddp": [],
                                                "group_started": [], "group_ending": []}
_last_hooks: dict[str, list[Callable[..., None]]] = {point: [] for point in _hooks}  # after every other


def on(point: str, listener: Callable[[], None]) -> None:
    """Call `listener`, with nothing, at `point`: "validation" (a validation loop starts: the epoch's
    training is done) or "optimizer_step" (after each optimizer step; optimizer_steps() counts them)."""
    _hooks[point].append(lambda *_: listener())


def hook(point: str, action: Callable[..., None], last: bool = False) -> None:
    """Call `action` at `point`: "optimizer_step" (given the optimizer, after optimizer_steps()
    counted the step), "validation" (no argument), "ddp" (given a new DistributedDataParallel model),
    "group_started" (given the frame that called init_process_group, once the group is up) and
    "group_ending" (no argument: destroy_process_group was called, the rank is still known).
    The actions at a point are called in the order they were hooked, those hooked `last` after
    every other (a fault that ends the process, after what the other parts trace)."""
    if last:
        _last_hooks[point].append(action)
    else:
        _hooks[point].append(action)


def actions(point: str) -> list[Callable[..., None]]:
    return _hooks[point] + _last_hooks[point]


def model() -> Any:
    """The model being trained: the module DDP wraps, else the first module moved with .to()."""
    for ref in reversed(_ddp):
        if (wrapped := ref()) is not None:
            return wrapped.module
    return _moved[0]() if _moved else None


def rank() -> int | None:
    """This process's global rank, once it has joined a process group."""
    import torch.distributed as dist
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def _line() -> int | None:
    """The line of the learner's script that led to the current call, if any."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if learner_frame(frame):
            return frame.f_lineno
        frame = frame.f_back
    return None


def emit(event: str, **fields: Any) -> None:
    """Append one event to this process's trace (nothing when the process is not traced)."""
    if not _trace_dir:
        return
    record = {"t": time.time(), "pid": os.getpid(), "rank": rank(), "ev": event, "line": _line(), **fields}
    with open(os.path.join(_trace_dir, f"trace-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(record, default=repr) + "\n")


def _group_size(dist: Any, group: Any) -> int | None:
    try:
        return int(dist.get_world_size(group))
    except Exception:  # not a group: the call itself will say so
        return None


def _elements(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """How many elements a reducing call (REDUCING) reduces, a reduce-scatter's whole input, not its output; or a
    gathering call (GATHERING) gathers, its whole output."""
    if name in ("all_reduce", "reduce"):
        given = args[0] if args else kwargs.get("tensor")
    elif name in ("reduce_scatter", "all_gather"):
        parts = args[0 if name == "all_gather" else 1] if len(args) > 1 else kwargs.get(
            "tensor_list" if name == "all_gather" else "input_list")
        return sum(int(t.numel()) for t in parts) if isinstance(parts, (list, tuple)) else None
    elif name in GATHERING:
        given = args[0] if args else kwargs.get("output_tensor")
    else:
        given = args[1] if len(args) > 1 else kwargs.get("input")
    numel = getattr(given, "numel", None)
    return int(numel()) if callable(numel) else None


# torch's older names call the newer ones (reduce_scatter_tensor calls reduce_scatter_single): one call, one event
_ALIASED = ("reduce_scatter_single", "all_gather_single")
_calling = threading.local()


def _wrap_collective(module: Any, name: str) -> None:
    original = getattr(module, name, None)
    if original is None or getattr(original, "_ddp_lab", False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if name in _ALIASED and getattr(_calling, "name", None):
            return original(*args, **kwargs)
        group = kwargs.get("group", args[2] if name == "all_reduce" and len(args) > 2 else None)
        among = {"group_size": _group_size(module, group)} if group is not None else {}
        numel = _elements(name, args, kwargs) if name in REDUCING or name in GATHERING else None
        if numel is not None and name == "all_reduce":  # how much (a bucket's or a parameter's), and whether it waits
            given = args[0] if args else kwargs.get("tensor")
            emit("enter", call=name, numel=numel, async_op=bool(kwargs.get("async_op", len(args) > 3 and args[3])),
                 dtype=str(getattr(given, "dtype", "")).removeprefix("torch."), **among)
        elif numel is not None:
            emit("enter", call=name, numel=numel, **among)
        else:
            emit("enter", call=name, **among)
        outer, _calling.name = getattr(_calling, "name", None), name
        try:
            result = original(*args, **kwargs)
        finally:
            _calling.name = outer
        emit("exit", call=name)
        return result

    wrapper._ddp_lab = True  # type: ignore[attr-defined]
    setattr(module, name, wrapper)


def _patch_distributed() -> None:
    import torch.distributed as dist

    original_init = dist.init_process_group

    @functools.wraps(original_init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend", args[0] if args else None)
        emit("enter", call="init_process_group", backend=str(backend) if backend else None,
             rank=kwargs.get("rank"), world_size=kwargs.get("world_size"), env_rank=os.environ.get("RANK"))
        result = original_init(*args, **kwargs)
        emit("exit", call="init_process_group", rank_joined=dist.get_rank(), world_size=dist.get_world_size(),
             backend=str(dist.get_backend()), env_rank=os.environ.get("RANK"), life=life())
        for action in actions("group_started"):
            action(sys._getframe(1))
        return result

    dist.init_process_group = init_process_group

    import torch

    original_set_device = torch.cuda.set_device

    @functools.wraps(original_set_device)
    def set_device(device: Any) -> None:
        emit("set_device", device=str(device))
        original_set_device(device)

    torch.cuda.set_device = set_device
    original_destroy = dist.destroy_process_group

    @functools.wraps(original_destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        record_parameters()
        for action in actions("group_ending"):
            action()
        emit("enter", call="destroy_process_group")
        result = original_destroy(*args, **kwargs)
        emit("exit", call="destroy_process_group")
        return result

    dist.destroy_process_group = destroy_process_group
    for name in (*COLLECTIVES, "new_group"):  # new_group: every rank must call it, so a rank can wait in it
        _wrap_collective(dist, name)
    _patch_point_to_point(dist)


def _message(op: str, tensor: Any, peer: Any) -> None:
    emit("message", op=op, peer=peer, numel=tensor.numel() if hasattr(tensor, "numel") else None)


def _patch_point_to_point(dist: Any) -> None:
    """send/recv/isend/irecv/batch_isend_irecv: one "message" event per message (who to, how
    big), and send/recv (which block) as calls, so that a deadlock names them. The wait() of a
    request that the learner's own code makes is a call too: that is where an isend/irecv blocks."""
    for name in ("send", "recv"):  # they block: calls, traced as the collectives are
        _wrap_collective(dist, name)
    for name in ("send", "recv", "isend", "irecv"):
        original = getattr(dist, name)

        def make(original: Callable[..., Any], name: str) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                key = "dst" if "send" in name else "src"
                _message(name, tensor, kwargs.get(key, kwargs.get(f"group_{key}", args[0] if args else None)))
                return original(tensor, *args, **kwargs)
            wrapper._ddp_lab_original = original  # type: ignore[attr-defined]
            return wrapper

        setattr(dist, name, make(original, name))

    # P2POp only takes torch's own isend/irecv (batch_isend_irecv tells them apart by identity)
    unwrap = lambda op: getattr(op, "_ddp_lab_original", op)  # noqa: E731
    original_new, original_p2p_init = dist.P2POp.__new__, dist.P2POp.__init__
    dist.P2POp.__new__ = lambda cls, op, *a, **k: original_new(cls, unwrap(op), *a, **k)
    dist.P2POp.__init__ = lambda self, op, *a, **k: original_p2p_init(self, unwrap(op), *a, **k)
    original_batch = dist.batch_isend_irecv

    @functools.wraps(original_batch)
    def batch_isend_irecv(p2p_op_list: Any) -> Any:
        for op in p2p_op_list:
            _message(getattr(op.op, "__name__", "?"), op.tensor, op.peer)
        return original_batch(p2p_op_list)

    dist.batch_isend_irecv = batch_isend_irecv
    _patch_waits(dist)


def _patch_waits(dist: Any) -> None:
    """A wait made by the learner's own code is a call ("wait", one per request waited for): a
    request's wait(), and the same wait through its future (`work.get_future().wait()`,
    `torch.futures.wait_all(futures)`). Waits made inside torch (dist.send waits on its isend) are not."""
    import torch

    def traced(original: Callable[..., Any], count: Callable[..., int] = lambda *args: 1) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not learner_frame(sys._getframe(1)):
                return original(*args, **kwargs)
            waited = count(*args, **kwargs)
            for _ in range(waited):
                emit("enter", call="wait")
            result = original(*args, **kwargs)
            for _ in range(waited):
                emit("exit", call="wait")
            return result
        return wrapper

    dist.Work.wait = traced(dist.Work.wait)
    torch._C.Future.wait = traced(torch._C.Future.wait)  # type: ignore[method-assign]  # work.get_future()'s
    torch.futures.Future.wait = traced(torch.futures.Future.wait)  # type: ignore[method-assign]
    torch.futures.wait_all = functools.wraps(torch.futures.wait_all)(  # one wait per future of the list
        traced(torch.futures.wait_all, lambda futures: len(futures) if hasattr(futures, "__len__") else 1))


def record_parameters(when: str = "end") -> None:
    """A fingerprint of the DDP model's parameters (every rank must have the same one), each
    tensor's norm (to tell close from far when fingerprints differ) and the optimizer steps so far."""
    alive = [m for ref in _ddp if (m := ref()) is not None]
    if not alive:
        return
    digest, norms = hashlib.sha1(), []
    for p in alive[-1].module.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
        norms.append(float(p.detach().double().norm()))
    emit("parameters", sha1=digest.hexdigest(), when=when, norms=norms, steps=_steps[0])


def life() -> int:
    """How many times torchrun has restarted this process's group (0: the first start, or no torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _patch_spawn() -> None:
    import torch.multiprocessing as mp

    start_processes = mp.start_processes
    for name in ("spawn", "start_processes"):
        original = getattr(mp, name)

        def make(original: Callable[..., Any], name: str) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapper(fn: Any, args: Any = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
                        start_method: str = "spawn") -> Any:
                caller = sys._getframe(1)
                emit("spawn", call=name, nprocs=nprocs, fn=getattr(fn, "__name__", repr(fn)),
                     caller_module=caller.f_globals.get("__name__"))
                try:
                    if start_method == "spawn" and _warm_start():  # mp.spawn warns of any other, and spawns
                        return start_processes(fn, args, nprocs, join, daemon, "forkserver")
                    return original(fn, args, nprocs, join, daemon, start_method)
                except mp.ProcessExitedException as err:
                    if err.exit_code is not None and err.exit_code < 0:  # killed by a signal, not an error exit
                        emit("child_signal", signal=err.signal_name or str(-err.exit_code))
                    raise
            return wrapper

        setattr(mp, name, make(original, name))


# Modules the warm server imports before it forks the learner's processes: what the course's
# programs use (sitecustomize.py has installed the tracer in the server too), and last the module
# that has each forked process start with nothing traced
WARM_MODULES = ["torch", "torch.distributed", "torch.multiprocessing", "torch.nn", "torch.nn.functional",
                "torch.optim", "torch.utils.data", __name__.rpartition(".")[0] + ".warm_server"]
_server_environ: list[dict[str, str]] = []  # the environment the running server started with


def _warm_start() -> bool:
    """Whether a spawn may start its processes warm, and the server ready for it: forked from
    multiprocessing's fork server, which imported torch once, instead of each a new interpreter
    that imports it (about 1.5 s of CPU each). Each process still imports the learner's file afresh
    as `__mp_main__`, in the learner's working folder, with the learner's sys.argv and sys.path,
    as spawn does (multiprocessing sends a forked process the same preparation as a spawned one).
    A spawned process also gets the environment as it is at the spawn: the server is started again
    whenever the environment differs from the one it started with. Not with $DDP_LAB_WARM_SPAWN=0."""
    if os.environ.get(WARM_SPAWN) == "0":
        return False
    import multiprocessing
    from multiprocessing import forkserver

    now = dict(os.environ)
    if _server_environ and _server_environ[0] != now:
        forkserver._forkserver._stop()  # type: ignore[attr-defined]  # the only way to stop it (3.11's tests use it)
        _server_environ.clear()
    if not _server_environ:
        multiprocessing.get_context("forkserver").set_forkserver_preload(WARM_MODULES)
        _server_environ.append(now)
    return True


def forked_afresh() -> None:
    """What a process forked from the warm server does first: it starts with nothing traced, as a
    new interpreter would (the server has done no work, but what it counted is not the process's)."""
    _steps[0] = 0
    _ddp.clear()
    _moved.clear()
    _server_environ.clear()  # a server of its own, if it spawns in turn


def when_imported(name: str, action: Callable[[ModuleType], None]) -> None:
    """Call `action` with the module `name` once it has been imported: now if it has, else right
    after its code has run. The tracer patches torchvision's data sets this way, so that a process
    that never imports torchvision (most exercises) does not pay for its import (about 1 s)."""
    if name in sys.modules:
        action(sys.modules[name])
        return
    if not _after_import:
        sys.meta_path.insert(0, _AfterImport())
    _after_import.setdefault(name, []).append(action)


_after_import: dict[str, list[Callable[[ModuleType], None]]] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules that `when_imported` waits for with the other finders, and has their
    loader call the actions once the module's code has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _after_import:
            return None
        for finder in sys.meta_path:
            found = finder.find_spec(fullname, path, target) if finder is not self and hasattr(finder, "find_spec") else None
            if found is not None and found.loader is not None and hasattr(found.loader, "exec_module"):
                run_code = found.loader.exec_module

                def exec_module(module: ModuleType) -> None:
                    run_code(module)
                    for action in _after_import.pop(fullname, []):
                        action(module)

                found.loader.exec_module = exec_module  # type: ignore[method-assign]
                return found
        return None


_steps = [0]


def count_step(optimizer: Any) -> None:
    _steps[0] += 1
    if _steps[0] == 1:
        emit("first_optimizer_step")
    for action in actions("optimizer_step"):
        action(optimizer)


def optimizer_steps() -> int:
    return _steps[0]


def install(trace_dir: str) -> None:
    """Start tracing this process (and, through the environment, the processes it starts)."""
    global _trace_dir, _script
    _trace_dir = trace_dir
    _script = script_path()
    _patch_distributed()
    _patch_spawn()


def script_path() -> str:
    """The learner's file, as an absolute path ("" when the checker did not say)."""
    return os.path.abspath(os.environ[SCRIPT]) if os.environ.get(SCRIPT) else ""


def learner_frame(frame: FrameType) -> bool:
    """Whether `frame` runs code of the learner's file."""
    return bool(_script) and os.path.abspath(frame.f_code.co_filename) == _script
