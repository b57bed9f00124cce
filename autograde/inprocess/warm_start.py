"""Warm starts: every Python process the checker launches (the learner's program, torchrun's agent
and workers, SLURM's tasks, multiprocessing's own helpers), and under pytest every Python process a
test launches, is forked from a server that has imported torch, torchvision and the tracer once,
instead of importing them itself (about 3 s of CPU each).

    python -m autograde.inprocess.warm_start_server FOLDER OWNER_PID   (the server; the checker starts it)

Both halves run on the learner's side of the process boundary:

- `proxy()`, called by _startup/sitecustomize.py before anything heavy is imported, in a process
  whose environment names a server (protocol.WARM_SERVER): it sends the server what makes this
  process what it is (its command line, folder, environment, sys.path, open files, signal
  dispositions, limits, CPU affinity) and then stands in for the warm process: it passes on the
  signals it gets, and exits as the warm process does (its exit code, or killed by its signal).
  Whoever started it (the checker, torchrun, slurmstepd, mpirun) keeps the process it knows. Where
  the server says no (`_cold_reason`) or none answers, it returns, and the process starts cold.
- `serve()` (warm_start_server.py): imports what every traced process imports, then forks a process per request. The
  forked process takes on the request's state, starts a session of its own (registered under the
  launch's mark in FOLDER/groups/, so the checker finds and stops it as one of the launch's), runs
  the same start-up as a cold process (the sitecustomize.py that asked: tracing installed for its
  own trace folder, if it has one) and then the program, as `__main__`, imported afresh. A warm
  process whose stand-in dies is killed; when the owner dies, or the server is told to stop, every
  process it forked is killed.

What a warm process shares with the server, and a cold one would not: the modules imported before
it (what they read from the environment as they loaded comes from the server's, which is why a
request whose environment differs in a variable of `AS_IT_LOADS` starts cold) and Python's string
hash seed. tests/core/test_warm_start.py runs the lab's solution and two styles both ways and
compares every process's trace, event by event.
"""
from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys
from typing import Any

from autograde.settings import PACKAGE, STARTUP, WARM_DEBUG, WARM_GROUPS, WARM_LOG, WARM_SERVER, WARM_SOCKET

SOCKET, GROUPS, LOG = WARM_SOCKET, WARM_GROUPS, WARM_LOG  # in the server's folder
# Variables that Python, torch, torchvision and the libraries they load may read as they load: a
# request whose environment differs from the server's in one of them starts cold (its value would
# not be the one the server's modules were loaded with). The rest are read once a program runs.
AS_IT_LOADS = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "GOMP_", "CUDA", "CUBLAS", "CUDNN", "NVIDIA",
               "NCCL_DEBUG", "LD_", "LANG", "LC_", "TZ", "TRITON", "DNNL_", "ONEDNN_", "OPENBLAS_", "NPY_", "NUMPY_",
               "MALLOC_", "GLIBC_", "KINETO", "LOGLEVEL")
# ... less these, read only once a program runs (by torch.distributed, the launchers, CUDA's set-up),
# or set up again for the warm process (PYTHONPATH: its sys.path is sent whole; PYTHONUNBUFFERED: its
# streams are made again). Not TORCH_DISTRIBUTED_DEBUG: importing torch.distributed sets c10d's debug
# level from it (set_debug_level_from_env), so a DETAIL run forked from a server without it would
# check nothing.
AT_RUN_TIME = ("PYTHONPATH", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES", "PYTORCH_NVML_BASED_CUDA_CHECK",
               "TORCHELASTIC_", "TORCH_NCCL_", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
# Signals the stand-in passes on to the warm process's group, as a launcher's killpg reaches a cold one's
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# What the server imports before it forks: torch, torchvision and torchrun's agent, then what a traced
# process imports (the tracer and each part's in-process file, as sitecustomize.py installs them)
PRELOAD = ("torch", "torch.distributed", "torch.multiprocessing", "torch.nn", "torch.optim", "torch.utils.data",
           "torchvision", "torch.distributed.run")
# Interpreter options that take no value and that sys.flags shows (-u: the streams are made again)
FLAG_OPTIONS = {"-u", "-B", "-s", "-E", "-I", "-P", "-O", "-OO", "-b", "-bb", "-q", "-d", "-R", "-v"}
IDLE_SECONDS = 600  # a server that forked nothing for this long stops (its owner may start another)
_FD_LIMIT = 200  # a process with more open files than this starts cold (one message carries at most 253)


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] = []) -> None:
    data = json.dumps(message).encode()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([struct.pack("!I", len(data)) + data], ancillary)


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One message and the files that came with it ({} when the other side has gone)."""
    fds: list[int] = []
    head, ancillary, _, _ = sock.recvmsg(4, socket.CMSG_SPACE(_FD_LIMIT * 4))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", data[: len(data) - len(data) % 4]).tolist()
    if len(head) < 4:
        return {}, fds
    size = struct.unpack("!I", head)[0]
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return {}, fds
        body += chunk
    return json.loads(body), fds


# --- The stand-in: the process its launcher started -----------------------------------------------

def _program() -> dict[str, Any] | None:
    """How this interpreter was asked to run (a script, -m or -c), or None where a warm start could
    not be the same (options that sys.flags does not show, a folder or zip file as the script, stdin)."""
    args = list(sys.orig_argv[1:])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    while args and args[0] in FLAG_OPTIONS:  # as sys.flags shows them: the server's must be the same
        unbuffered, args = unbuffered or args[0] == "-u", args[1:]
    if not args:
        return None
    if args[0] in ("-m", "-c") and len(args) >= 2:
        kind, target = args[0][1], args[1]
    elif not args[0].startswith("-") and os.path.isfile(args[0]):
        kind, target = "s", os.path.abspath(args[0])
    else:
        return None
    return {"kind": kind, "target": target, "unbuffered": unbuffered}


def _open_fds() -> list[int]:
    """This process's open files (the listing's own, gone once listed, left out)."""
    import fcntl

    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            fcntl.fcntl(int(name), fcntl.F_GETFD)
        except OSError:
            continue
        found.append(int(name))
    return sorted(found)


def _signals() -> dict[str, str]:
    """Each signal's disposition: ignored, or Python's own handler (the rest are the default)."""
    found = {}
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if handler is signal.SIG_IGN:
            found[str(int(signum))] = "ignore"
        elif handler is signal.default_int_handler:
            found[str(int(signum))] = "python"
    return found


def proxy() -> None:
    """Run this process warm and exit as it exits; return where it must start cold."""
    folder = os.environ.get(WARM_SERVER, "")
    if folder in ("", "off") or not os.path.isdir("/proc/self/fd"):
        return
    program = _program()
    if program is None:
        if os.environ.get(WARM_DEBUG):
            print(f"warm start: a cold start: the command line {sys.orig_argv[1:]}", file=sys.stderr, flush=True)
        return
    fds = _open_fds()
    if len(fds) > _FD_LIMIT:
        return
    import resource

    request = {
        **program, "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path, "cwd": os.getcwd(),
        "environ": dict(os.environ), "fds": fds, "pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid(),
        "executable": sys.executable, "prefix": sys.prefix, "flags": list(sys.flags), "umask": _umask(),
        "signals": _signals(), "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "limits": {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")},
        "affinity": sorted(os.sched_getaffinity(0)), "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "encoding": [getattr(s, "encoding", None) for s in (sys.stdin, sys.stdout, sys.stderr)],
        "errors": [getattr(s, "errors", None) for s in (sys.stdin, sys.stdout, sys.stderr)],
        "startup": getattr(sys.modules.get("sitecustomize"), "__file__", None) or str(STARTUP / "sitecustomize.py"),
        "package": str(PACKAGE),  # the course's package this process imports (another checkout's, say)
    }
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(os.path.join(folder, SOCKET))
        _send(sock, request, fds)
        answer, _ = _receive(sock)
    except OSError as err:
        if os.environ.get(WARM_DEBUG):
            print(f"warm start: a cold start: no server ({err})", file=sys.stderr, flush=True)
        return  # no server (gone, or not ours to reach): a cold start
    if "pid" not in answer:
        sock.close()
        if os.environ.get(WARM_DEBUG):
            print(f"warm start: a cold start: {answer.get('cold', 'no answer')}", file=sys.stderr, flush=True)
        return
    pid = answer["pid"]

    def relay(signum: int, _: Any) -> None:
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    for signum in RELAYED:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, relay)
    try:
        ended, _ = _receive(sock)
    except OSError:
        ended = {}
    code = ended.get("exit")
    if code is None:
        os.write(2, b"warm start: the server stopped before the program ended\n")
        os._exit(1)
    if code >= 0:
        os._exit(code)
    for signum in RELAYED:
        signal.signal(signum, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
    os.kill(os.getpid(), -code)  # dies as the warm process died
    os._exit(128 - code)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
