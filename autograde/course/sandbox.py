"""Every submission graded in a sandbox: what runs a learner's code when the course grades it.

nbgrader's autograding (`make grade`, `python -m autograde.course grade`, the formgrader's
Autograde) stays the instructor's: it reads the submissions, writes the gradebook and the
feedback. What it runs of a submission, the notebook's kernel (the check cells, which launch
the learner's files in processes of their own), it starts through SandboxedExecute below:

- as the unprivileged user GRADER (ddp-lab-grader), never as root or the instructor (root
  becomes it with setpriv; an instructor with `sudo -u ddp-lab-grader`, which the hub allows;
  where neither can be done, grading is refused with one line that says what to do);
- in bubblewrap (Debian's bubblewrap, /usr/bin/bwrap): new user, PID, network, IPC and UTS
  namespaces, so it sees no other process and no network but its own loopback; the system's
  programs, the course's code, its Python and the data read-only; the learner's own files
  (without the notebooks, whose hidden tests it must not read) copied into a private scratch
  folder in memory where the notebook ran; no home, no exchange, no gradebook, no other
  submission; everything in it ends when its kernel does (--die-with-parent, PID namespace);
- with limits: a wall clock for the whole notebook (LIMITS.seconds), and as root a cgroup with a
  memory, CPU and process limit (hub/limits.py), else resource limits on processes and memory;
  a file's size is capped either way.

The kernel talks with nbgrader over Unix sockets (ZeroMQ's ipc transport) in a folder shared with
the sandbox. Once started (`seal`, the kernel's first line) it closes them to its own user, makes
itself undumpable (no process of its user may read its memory or trace it), and reads (and
removes) the key it signs the learner's verdicts with, which are kept across the learner's
notebooks in a folder of their own: the learner's processes, which run as the same user, can
neither talk to the checker nor write a verdict it would read. What crosses back is the kernel's replies, which nbgrader scores; the
learner's notebook cells are the course's own by then (RestoreCourseCells).
"""
from __future__ import annotations

import ctypes
import json
import os
import pwd
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from nbgrader.preprocessors import Execute, NbGraderPreprocessor

from autograde import settings
from autograde.course.assignment import CourseError, is_answer, root
from autograde.course.hub import limits

GRADER = "ddp-lab-grader"  # the unprivileged user every submission is graded as
GRADING = settings.GRADING  # set inside the sandbox: the kernel sealed at its start, n/a no pass
VERDICTS = "DDP_LAB_GRADE_VERDICTS"  # the grader's: the folder one learner's verdicts are kept in
KEY = "DDP_LAB_GRADE_KEY"  # the grader's (outside the sandbox): the key a learner's verdicts are signed with
KEY_FILE = "DDP_LAB_GRADE_KEY_FILE"  # inside: where the kernel reads that key once, and removes it
BWRAP = "bwrap"
SUBMISSION = Path("/ddp-lab-submission")  # where the learner's files are, read-only, inside the sandbox
# What of the course a check needs: never solutions/, tests/ (correct programs), .git or grading/.
COURSE_PARTS = ("autograde", "demos", "exercises", "fashion_mnist.py", "jupyter-config", "notebooks", "README.md")
SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/opt")


@dataclass
class Limits:
    """What one notebook's grading may use, all its processes together."""
    seconds: int = 3600  # wall clock from the kernel's start to its end
    memory: int = 6 * 2**30
    cpus: float = 2.0
    processes: int = 512
    file_size: int = 2**30  # the largest file it may write
    disk: int = 2 * 2**30  # what its /tmp and its folder hold, each (in memory, counted in `memory` too)

    @classmethod
    def from_env(cls) -> "Limits":
        """The defaults, or DDP_LAB_GRADE_LIMITS: JSON with some of the fields (tests make them small)."""
        given = json.loads(os.environ.get("DDP_LAB_GRADE_LIMITS") or "{}")
        return cls(**given)


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


class SandboxError(CourseError):
    """Grading cannot be sandboxed here: one line that says what to do."""


def _grader() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(GRADER)
    except KeyError:
        if os.geteuid() != 0:
            raise SandboxError(f"no user {GRADER} to grade submissions as: as root, `useradd --system --no-create-home "
                               f"--shell /usr/sbin/nologin {GRADER}` (the hub makes it when it starts)") from None
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", GRADER],
                       check=True, capture_output=True)
        return pwd.getpwnam(GRADER)


def become_grader() -> list[str]:
    """The command prefix that runs what follows as GRADER; SandboxError where that cannot be done."""
    user = _grader()
    if os.geteuid() == 0:
        return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
    if os.geteuid() == user.pw_uid:
        raise SandboxError(f"grading runs as the instructor or as root, not as {GRADER} itself")
    sudo = shutil.which("sudo")
    if sudo and subprocess.run([sudo, "-n", "-u", GRADER, "--", "true"], capture_output=True).returncode == 0:
        return [sudo, "-n", "-u", GRADER, "--"]
    raise SandboxError(f"grading runs each learner's code as {GRADER}, never as you: run it as root, or let "
                       f"{pwd.getpwuid(os.geteuid()).pw_name} run commands as {GRADER} with sudo "
                       "(docs/instructors.md, 'Grading in a sandbox'; the hub sets this up for its instructors)")


def _shared_folder(path: Path, mode: int, make: bool = True) -> Path:
    """`path` (a folder, made if missing) given to GRADER's group with `mode`: the sandbox reads it,
    no other user of the machine does."""
    if make:
        path.mkdir(exist_ok=True)
    os.chown(path, -1, _grader().pw_gid)
    path.chmod(mode)
    return path


SUDOERS = Path("/etc/sudoers.d/ddp-lab-grading")


def allow_instructors(instructors: list[str]) -> str:
    """As root (the hub, when it starts): the instructors may grade from their own servers (the
    formgrader's Autograde, a terminal's `make grade`): each joins GRADER's group (to hand it a
    submission) and may run commands as GRADER, and only as GRADER, with sudo. One line on what was done."""
    user = _grader()
    if not shutil.which("sudo"):
        return "no sudo: instructors grade as root only (apt-get install sudo lets their servers grade)"
    for name in instructors:
        subprocess.run(["usermod", "--append", "--groups", GRADER, name], check=True, capture_output=True)
    rules = "".join(f"{name} ALL=({GRADER}) NOPASSWD: ALL\n" for name in instructors)
    SUDOERS.write_text(f"# made by the DDP Lab's hub: its instructors grade as {user.pw_name}\n{rules}")
    SUDOERS.chmod(0o440)
    return f"grading: {', '.join(instructors)} may grade as {GRADER} (sudo rule {SUDOERS})"


def _can(prefix: list[str], test: str, path: Path) -> bool:
    """Whether GRADER may read (-r) or pass through (-x) `path`, asked as GRADER."""
    return subprocess.run([*prefix, "test", test, str(path)], capture_output=True).returncode == 0


def ready() -> list[str]:
    """Check once, before any submission is graded, that the sandbox can be made; the identity prefix."""
    if not shutil.which(BWRAP):
        raise SandboxError("grading needs bubblewrap to sandbox each submission: apt-get install bubblewrap")
    prefix = become_grader()
    for path in (*_python_homes(), settings.PACKAGE):
        if not _can(prefix, "-r", path):
            closed = next((f for f in [*reversed(path.parents), path] if not _can(prefix, "-x", f)), path)
            raise SandboxError(f"{GRADER} cannot reach {path}: {closed} is closed to other users (chmod o+x "
                               f"{closed}, or install the course and its Python where all can read)")
    probe = subprocess.run([*prefix, BWRAP, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise SandboxError(f"bubblewrap cannot make a sandbox here ({probe.stderr.strip() or probe.returncode}): "
                           "it needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)")
    return prefix


def data_dir() -> Path:
    """The data the checks train on: $DDP_LAB_DATA_DIR, else the course's data/."""
    return Path(os.environ.get(settings.DATA_DIR) or settings.REPO / "data")


def _python_homes() -> list[Path]:
    """The folders the course's Python lives in: its environment and the interpreter it was made from."""
    homes = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent.parent}
    return sorted(homes)


def bwrap_args(work: Path, submission: Path, shared: list[Path], env: dict[str, str], disk: int) -> list[str]:
    """bubblewrap's options: the system and the course read-only, `submission` read-only at SUBMISSION,
    an empty in-memory `work` (the kernel's folder), `shared` read-write (the kernel's sockets)."""
    args = [BWRAP, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    for system in SYSTEM:
        if os.path.islink(system):
            args += ["--symlink", os.readlink(system), system]
        elif os.path.isdir(system):
            args += ["--ro-bind", system, system]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(disk), "--tmpfs", "/tmp", "--tmpfs", "/run"]
    course = settings.REPO
    readable = [*_python_homes(), *(course / name for name in COURSE_PARTS), data_dir()]
    for path in readable:
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    args += ["--ro-bind", str(submission), str(SUBMISSION), "--size", str(disk), "--tmpfs", str(work)]
    for path in shared:
        args += ["--bind", str(path), str(path)]
    for name, value in env.items():
        args += ["--setenv", name, value]
    return [*args, "--chdir", str(work)]


def sandbox_env(work: Path) -> dict[str, str]:
    """The kernel's whole environment: nothing of the instructor's."""
    keep = {name: os.environ[name] for name in (settings.QUICK, settings.QUICK_DATA, settings.DATA_DIR, "LANG",
                                                settings.CAPSTONE_RULES, settings.CAPSTONE_SPEEDUPS)
            if os.environ.get(name)}
    return {**keep, "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
            "HOME": str(work), "TMPDIR": "/tmp", "PYTHONPATH": str(settings.REPO), "OMP_NUM_THREADS": "1",
            "MPLBACKEND": "Agg", "JUPYTER_RUNTIME_DIR": "/tmp/jupyter", "IPYTHONDIR": "/tmp/ipython", "JUPYTER_PLATFORM_DIRS": "1",
            settings.DATA_DIR: str(data_dir()), GRADING: "1"}


def command(kernel: list[str], work: Path, submission: Path, shared: list[Path], cgroup: str | None,
            identity: list[str], lim: Limits, extra_env: dict[str, str] | None = None) -> list[str]:
    """The whole command that starts `kernel` in the sandbox, as GRADER, within the limits."""
    inner = [sys.executable, "-m", __name__, "inside", json.dumps(lim.__dict__), "cgroup" if cgroup else "rlimits",
             *kernel]
    boxed = [*identity, *bwrap_args(work, submission, shared, {**sandbox_env(work), **(extra_env or {})}, lim.disk), *inner]
    outer = ["timeout", "--signal=KILL", str(lim.seconds)]
    if cgroup:  # join the cgroup as root, before becoming the grader
        outer = [sys.executable, "-m", __name__, "join", cgroup, "--", *outer]
    return [*outer, *boxed]


def inside(limits_json: str, in_cgroup: bool, kernel: list[str]) -> None:
    """In the sandbox, as GRADER: the limits every process inherits, the learner's files into the
    kernel's folder, then the kernel in this process's place."""
    lim = Limits(**json.loads(limits_json))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim.file_size, lim.file_size))
    if not in_cgroup:  # the cgroup limits them all together; else each process's own limits
        resource.setrlimit(resource.RLIMIT_NPROC, (lim.processes, lim.processes))
        resource.setrlimit(resource.RLIMIT_DATA, (lim.memory, lim.memory))
    os.umask(0o007)  # the kernel's sockets: nbgrader (GRADER's group) connects to them
    shutil.copytree(SUBMISSION, Path.cwd(), dirs_exist_ok=True, symlinks=True,
                    ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints"))
    os.umask(0o022)
    os.execv(kernel[0], [*kernel, "--IPKernelApp.parent_handle=1",  # no parent to watch (nor to print for)
                         "--IPKernelApp.exec_lines=['import autograde.course.sandbox as _s; _s.seal()']"])


def seal() -> None:
    """The kernel's first line in the sandbox: no process of its user (the learner's, from here on) can
    connect to its sockets, read its memory or trace it; its verdicts stay in memory."""
    if not os.environ.get(GRADING):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    if app.transport == "ipc":
        for port in (app.shell_port, app.iopub_port, app.stdin_port, app.control_port, app.hb_port):
            socket = Path(f"{app.ip}-{port}")
            if socket.exists():
                socket.chmod(0o020)  # its group (nbgrader's user) may connect; the owner, GRADER, may not
    key_file = Path(os.environ.pop(KEY_FILE, "") or "/nonexistent")
    if key_file.is_file():
        from autograde.grading import cache

        cache.sign_with(key_file.read_bytes())
        key_file.unlink()  # read once, before any of the learner's code runs: from here on it is in no file


class SandboxedKernelManager(AsyncKernelManager):  # type: ignore[misc]
    """A kernel started in the sandbox, over Unix sockets in a folder it shares with nbgrader."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.identity = ready()
        self.limits = Limits.from_env()
        self.folder = _shared_folder(Path(tempfile.mkdtemp(prefix="ddp-lab-sandbox-")), 0o750)
        self.sockets = _shared_folder(self.folder / "sockets", 0o770)  # GRADER makes its sockets here
        self.transport = "ipc"
        self.ip = str(self.sockets / "kernel")
        self.cgroup: limits.Cgroup | None = None
        self.started = time.monotonic()
        # the learner's verdicts and the key they are signed with: SandboxedExecute's, else this kernel's own
        self.verdicts: Path = self.folder / "verdicts"
        self.key = secrets.token_hex(32)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        kernel: list[str] = super().format_kernel_cmd(extra_arguments)
        where = Path(str((self._launch_args or {}).get("cwd") or os.getcwd()))
        submission = self.folder / "submission"
        shutil.copytree(where, submission, symlinks=True, ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints"))
        for path in [submission, *submission.rglob("*")]:
            if not path.is_symlink():
                _shared_folder(path, 0o750) if path.is_dir() else _shared_folder(path, 0o640, make=False)
        connection = str(Path(self.connection_file).resolve())
        given = _shared_folder(Path(shutil.copy(connection, self.sockets / "connection.json")), 0o640, make=False)
        kernel = [str(given) if arg == connection else arg for arg in kernel]
        name = None
        if os.geteuid() == 0:
            name = f"grade-{self.folder.name}"
            self.cgroup = limits.make_cgroup(name, self.limits.memory, self.limits.cpus, self.limits.processes)
            name = name if self.cgroup else None
        verdicts = _shared_folder(self.verdicts, 0o770)
        key = self.sockets / "verdicts.key"
        key.write_text(self.key)
        _shared_folder(key, 0o660, make=False)
        shared = [self.sockets, verdicts]
        extra_env = {settings.CACHE_DIR: str(verdicts), KEY_FILE: str(key)}
        self.started = time.monotonic()
        return command(kernel, where, submission, shared, name, self.identity, self.limits, extra_env)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart)
        if not restart:
            self._remove()

    cleanup_resources = _async_cleanup_resources

    def _remove(self) -> None:
        if time.monotonic() - self.started >= self.limits.seconds:
            self.log.warning("sandbox: the wall clock (%d s) ended the notebook's kernel", self.limits.seconds)
        if self.cgroup is not None:
            if self.cgroup.oom_kills():
                self.log.warning("sandbox: the memory limit (%s) ended %d process(es)", _size(self.limits.memory),
                                 self.cgroup.oom_kills())
            if self.cgroup.refused_forks():
                self.log.warning("sandbox: the process limit (%d) refused %d new process(es)", self.limits.processes,
                                 self.cgroup.refused_forks())
            for folder in self.cgroup.folders:
                procs = folder / "cgroup.procs"
                for pid in (procs.read_text().split() if procs.exists() else []):
                    try:
                        os.kill(int(pid), 9)
                    except ProcessLookupError:
                        pass
            limits.remove_cgroup(self.cgroup)
            self.cgroup = None
        shutil.rmtree(self.folder, ignore_errors=True)


class SandboxedExecute(Execute):  # type: ignore[misc]
    """nbgrader's Execute with its kernel in the sandbox; then what the notebook's checks signed goes to
    the parts that keep a record of graded runs (the capstone's leaderboard)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["kernel_manager_class"] = SandboxedKernelManager
        super().__init__(*args, **kwargs)
        self.verdicts, self.key = Path(), ""

    def preprocess(self, nb: Any, resources: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        from autograde import parts

        info = resources["nbgrader"]
        with tempfile.TemporaryDirectory(prefix="ddp-lab-verdicts-") as own:
            # the learner's verdicts, signed: kept across their notebooks in the folder the course's grading
            # made for them (grading.py), else in this notebook's own (the formgrader's Autograde button)
            self.verdicts = Path(os.environ.get(VERDICTS) or own)
            self.key = os.environ.get(KEY) or secrets.token_hex(32)
            try:
                return super().preprocess(nb, resources)
            finally:
                for board in parts.of_role("leaderboard"):
                    board.record(root(), info["student"], info["notebook"], self.verdicts, self.key.encode())

    def create_kernel_manager(self) -> SandboxedKernelManager:
        km: SandboxedKernelManager = super().create_kernel_manager()
        km.verdicts, km.key = self.verdicts, self.key
        return km


class RestoreCourseCells(NbGraderPreprocessor):  # type: ignore[misc]
    """The notebook as the course wrote it, with the learner's answers: every cell from the source
    assignment but the answer cells (graded by hand), which are the learner's. A cell the learner
    added, or a code cell they edited (metadata included), would run in the checker's kernel and
    could change its verdicts: it is not run."""

    def preprocess(self, nb: Any, resources: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        import nbformat

        info = resources["nbgrader"]
        source = root() / "source" / info["assignment"] / f"{info['notebook']}.ipynb"
        course = nbformat.read(source, as_version=4)
        answers = {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
                   if is_answer(c.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""))
                   and c.cell_type == "markdown"}
        cells = []
        for cell in course.cells:
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
            cells.append(answers.get(grade_id, cell) if is_answer(grade_id) else cell)
        dropped = len(nb.cells) - len(cells)
        nb.cells = cells
        if dropped > 0:
            self.log.warning("%s: %d cell(s) the learner added are not run", info["notebook"], dropped)
        return nb, resources


def main(argv: list[str]) -> None:
    if argv[:1] == ["inside"]:
        inside(argv[1], argv[2] == "cgroup", argv[3:])
    elif argv[:1] == ["join"] and "--" in argv:
        name, rest = argv[1], argv[argv.index("--") + 1:]
        cgroup = limits.find_cgroup(name)
        if cgroup is not None:
            cgroup.join()
        os.execvp(rest[0], rest)
    else:
        sys.exit("usage: python -m autograde.course.sandbox inside LIMITS KERNEL... | join CGROUP -- COMMAND...")


if __name__ == "__main__":
    main(sys.argv[1:])
