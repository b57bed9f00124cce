"""The warm-start server (warm_start.py says what a warm start is): it imports what every traced
process imports, then forks a process per request; the forked process becomes the process that
asked and runs its program.

    python -m autograde.inprocess.warm_start_server FOLDER OWNER_PID   (the checker starts it)
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from autograde.inprocess.warm_start import (
    AS_IT_LOADS,
    AT_RUN_TIME,
    GROUPS,
    IDLE_SECONDS,
    LOG,
    PRELOAD,
    SOCKET,
    _receive,
    _send,
)
from autograde.settings import LAUNCH_MARK, PACKAGE

# --- The server -------------------------------------------------------------------------------------

def _cold_reason(request: dict[str, Any], base: dict[str, str]) -> str | None:
    """Why the process that asks must start cold rather than be forked from this server, or None."""
    if (request["uid"], request["gid"]) != (os.getuid(), os.getgid()):
        return "another user"
    if (request["executable"], request["prefix"]) != (sys.executable, sys.prefix):
        return "another Python"
    if request["flags"] != list(sys.flags):
        return "other interpreter options"
    if request["package"] != str(PACKAGE):  # the server's modules are its own copy's
        return "another copy of the course's package"
    env = request["environ"]
    for name in sorted(set(env) | set(base)):
        if env.get(name) != base.get(name) and name.startswith(AS_IT_LOADS) and not name.startswith(AT_RUN_TIME):
            return f"${name} differs"
    import resource

    for name, (soft, hard) in request["limits"].items():
        have = resource.getrlimit(getattr(resource, name))[1]
        if have != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > have):
            return f"{name} above the server's"
    return None


class _Child:
    def __init__(self, pid: int, conn: socket.socket, stand_in: int | None) -> None:
        self.pid, self.conn, self.stand_in = pid, conn, stand_in


class _Server:
    """The server: its socket, the processes it forked (by pid, with their stand-ins' pidfds), and the
    groups of those that have exited while a process of theirs may be left."""

    def __init__(self, folder: Path, owner: int) -> None:
        import selectors

        self.folder, self.base = folder, dict(os.environ)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(folder / (SOCKET + ".new")))
        self.listener.listen(64)
        os.rename(folder / (SOCKET + ".new"), folder / SOCKET)  # requests wait in the backlog while we import
        (folder / GROUPS).mkdir(exist_ok=True)
        for name in PRELOAD:
            __import__(name)
        from autograde import parts
        from autograde.inprocess import tracer, training, warm_server  # noqa: F401 (each forked process starts afresh)

        parts.of_role("inprocess")
        import gc

        gc.freeze()  # the forked processes leave the modules imported here out of their collections
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner's Ctrl-C is the owner's to handle
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.owner_fd = os.pidfd_open(owner)
        self.selector.register(self.owner_fd, selectors.EVENT_READ, "owner")
        self.children: dict[int, _Child] = {}
        self.ended: set[int] = set()  # groups of children that have exited: registered while a process is left in them

    def _stop(self, *_: Any) -> None:
        self.stopping = True

    def serve(self) -> dict[str, Any] | None:
        """Serve until the owner dies, SIGTERM or IDLE_SECONDS without a process; in a forked process,
        return its request (to be run)."""
        import time

        idle_since = time.monotonic()
        while not self.stopping:
            if self.children or self.ended:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_SECONDS:
                break
            for key, _ in self.selector.select(timeout=0.5):
                if key.data == "owner":
                    self.stopping = True
                elif key.data == "wake":
                    self._reap()
                elif key.data == "listener":
                    request = self._accept()
                    if request is not None:
                        return request  # this is the forked process
                else:  # ("stand_in", pid)
                    self._stand_in_died(key.data[1])
            self._forget_ended_groups()
        self._shut_down()
        return None

    def _reap(self) -> None:
        """Tell the stand-in of every forked process that has exited how it ended."""
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            try:
                _send(child.conn, {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass
            child.conn.close()
            if child.stand_in is not None:
                self.selector.unregister(child.stand_in)
                os.close(child.stand_in)
            self.ended.add(pid)

    def _accept(self) -> dict[str, Any] | None:
        """Answer one request: cold (and why), or a process forked for it. Returns the request in
        that forked process, None in the server."""
        import selectors

        conn, _ = self.listener.accept()
        conn.settimeout(10)
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError):
            conn.close()
            return None
        stand_in = None
        try:
            reason = _cold_reason(request, self.base)
            if reason is None:
                stand_in = os.pidfd_open(request["pid"])
        except Exception as err:  # noqa: BLE001 (a request it cannot read is a cold start, never the server's end)
            reason = f"the request could not be read ({type(err).__name__}: {err})"
        _log(self.folder, request, reason)
        if reason is not None or stand_in is None:
            for fd in fds:
                os.close(fd)
            try:
                _send(conn, {"cold": reason})
            except OSError:
                pass
            conn.close()
            return None
        pid = os.fork()
        if pid == 0:  # the process that runs the request keeps none of the server's files
            for child in self.children.values():
                child.conn.close()
                if child.stand_in is not None:
                    os.close(child.stand_in)
            self._close_all()
            conn.close()
            os.close(stand_in)
            request["received"] = fds
            return request
        for fd in fds:
            os.close(fd)
        mark = request["environ"].get(LAUNCH_MARK)
        if mark:
            (self.folder / GROUPS / str(pid)).write_text(mark)
        conn.settimeout(None)
        self.children[pid] = _Child(pid, conn, stand_in)
        self.selector.register(stand_in, selectors.EVENT_READ, ("stand_in", pid))
        try:
            _send(conn, {"pid": pid})
        except OSError:
            pass
        return None

    def _stand_in_died(self, pid: int) -> None:
        """The stand-in of `pid` died, so must the warm process (and its group)."""
        child = self.children.get(pid)
        if child is not None and child.stand_in is not None:
            self.selector.unregister(child.stand_in)
            os.close(child.stand_in)
            child.stand_in = None
            _kill_group(child.pid)

    def _forget_ended_groups(self) -> None:
        """A group's registration goes when its last process has gone."""
        for pgid in list(self.ended):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                self.ended.discard(pgid)
                (self.folder / GROUPS / str(pgid)).unlink(missing_ok=True)
            except PermissionError:
                pass

    def _close_all(self) -> None:
        for fd in (self.listener.fileno(), self.wake_r, self.wake_w, self.owner_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.selector.close()

    def _shut_down(self) -> None:
        """Every process forked killed, with its group; the server's folder removed."""
        import shutil
        import time

        for pid in list(self.children) + list(self.ended):
            _kill_group(pid)
        deadline = time.monotonic() + 5
        while self.children and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            self.children.pop(pid, None)
        self._close_all()
        shutil.rmtree(self.folder, ignore_errors=True)  # nothing of the server is left, whoever stopped it


def serve(folder: Path, owner: int) -> dict[str, Any] | None:
    """Serve until the owner dies or SIGTERM; in a forked process, return its request (to be run)."""
    return _Server(folder, owner).serve()


def _log(folder: Path, request: dict[str, Any], reason: str | None) -> None:
    """A line per request in FOLDER/log: "warm" or "cold: <why>", and the command (how many start cold, and why)."""
    with open(folder / LOG, "a") as log:
        log.write(json.dumps({"cold": reason, "command": request.get("orig_argv", [])[1:4]}) + "\n")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- The forked process: become the process that asked, then run its program -----------------------

def _take_on(request: dict[str, Any]) -> None:
    """Take on the state of the process that asked (its stand-in): what a cold start would have."""
    import random
    import resource
    import tempfile

    os.setsid()
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        how = request["signals"].get(str(int(signum)))
        wanted = signal.SIG_IGN if how == "ignore" else signal.default_int_handler if how == "python" else signal.SIG_DFL
        try:
            signal.signal(signum, wanted)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
    # the stand-in's files, at the same numbers: moved out of the way first, then into place
    received = request.pop("received")
    high = [_dup_high(fd) for fd in received]
    for fd in received + [fd for fd in (0, 1, 2) if fd not in request["fds"]]:
        try:
            os.close(fd)
        except OSError:
            pass
    for number, fd in zip(request["fds"], high):
        os.dup2(fd, number, inheritable=True)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    for name, (soft, hard) in request["limits"].items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError):
            pass
    try:
        os.sched_setaffinity(0, request["affinity"])
        os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
    except OSError:
        pass
    os.environ.clear()
    os.environ.update(request["environ"])
    sys.argv[:] = request["argv"]
    sys.orig_argv[:] = request["orig_argv"]
    sys.path[:] = request["path"]
    if request["kind"] == "s":
        sys.path.insert(0, os.path.dirname(os.path.realpath(request["target"])))
    elif request["kind"] == "m":
        sys.path.insert(0, os.getcwd())
    else:
        sys.path.insert(0, "")
    _streams(request)
    random.seed()
    if "multiprocessing.process" in sys.modules:  # a key of its own, as a cold process draws at import
        sys.modules["multiprocessing.process"].current_process().authkey = os.urandom(32)
    tempfile.tempdir = None
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def _dup_high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1024)


def _streams(request: dict[str, Any]) -> None:
    """sys.stdin, sys.stdout and sys.stderr made again for the stand-in's files, as Python makes them."""
    import io

    unbuffered = request["unbuffered"]
    made: list[Any] = []
    for fd, mode in ((0, "rb"), (1, "wb"), (2, "wb")):
        try:
            os.fstat(fd)
        except OSError:
            made.append(None)
            continue
        raw = io.FileIO(fd, mode, closefd=False)
        buffered: Any = raw if (unbuffered and fd) else (io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw))
        made.append(io.TextIOWrapper(buffered, encoding=request["encoding"][fd] or "utf-8",
                                     errors=request["errors"][fd] or "strict",
                                     line_buffering=fd == 2 or (fd == 1 and raw.isatty()),
                                     write_through=unbuffered and fd > 0))
    for old in (sys.stdout, sys.stderr):
        try:
            old.flush()
        except (OSError, ValueError, AttributeError):
            pass
    sys.stdin, sys.stdout, sys.stderr = made  # type: ignore[assignment]
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = made  # type: ignore[misc]


def run(request: dict[str, Any]) -> None:
    """Become the process that asked, install the course's start-up for it, and run its program."""
    import runpy
    import types

    _take_on(request)
    runpy.run_path(request["startup"])  # the start-up that asked (the tracing), as it runs in a cold process
    kind, target = request["kind"], request["target"]
    main = types.ModuleType("__main__")  # a new __main__: the server's own module is not the program's
    main.__dict__["__builtins__"] = sys.modules["builtins"]
    sys.modules["__main__"] = main
    try:
        if kind == "m":
            runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]  # as `python -m` does
            return
        if kind == "s":
            from importlib.machinery import SourceFileLoader

            main.__file__ = target
            main.__dict__.update(__cached__=None, __loader__=SourceFileLoader("__main__", target))
            with open(target, "rb") as source:
                code = compile(source.read(), target, "exec", dont_inherit=True)
        else:
            code = compile(target, "<string>", "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as err:  # as the interpreter reports it, without this module's frames
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        sys.excepthook(type(err), err.with_traceback(tb), tb)
        if isinstance(err, KeyboardInterrupt):
            import atexit

            atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m autograde.inprocess.warm_start_server FOLDER OWNER_PID")
    job = serve(Path(sys.argv[1]), int(sys.argv[2]))
    if job is not None:
        run(job)
