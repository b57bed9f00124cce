"""The class's settings: one TOML file (deploy/jupyterhub/class.toml, or $DDP_LAB_CLASS), read and
checked once when the hub starts. A wrong setting stops the hub with one line that names it.

    spawner = "local"             # "local": each server a process on this node; "slurm": a SLURM job
    instructors = ["teacher"]     # Unix users: the formgrader, the gradebook, all GPUs
    learners = ["ada", "grace"]   # Unix users, in the order the GPU policy hands GPUs out

    [local]                       # spawner = "local": each learner's share of the node
    gpus = "auto"                 # the node's GPUs ("auto": as many as nvidia-smi lists)
    gpus_per_learner = 0          # 0: the GPUs split evenly (shared when fewer GPUs than learners)
    memory = "8G"                 # per learner: everything their server starts, together
    cpus = 4.0                    # per learner: CPU time, in cores
    processes = 1024              # per learner
    checks_at_once = 0            # checks the node runs at once, the others wait in line (0: no line)

    [slurm]                       # spawner = "slurm": what each learner's job asks for
    partition = ""
    time = "08:00:00"
    memory = "16G"
    cpus = 4
    gpus = 1

    [capstone]                    # notebook 40
    speedups = [1.15, 1.3]        # the speedups over the baseline that earn a point each (measure yours)

Optional at the top: `ip`, `port` (where the hub listens: 0.0.0.0:8000), `course` (the installed
course, default this checkout), `exchange` (nbgrader's exchange), `data` (the data every learner
trains on), `state` (the hub's database and secrets), `slurm_conf` (the SLURM_CONF the hub submits
with, default the system's), `hub_connect_ip` (the address SLURM nodes call the hub back at),
`instructors_group` (the Unix group, made by the hub, whose members, the instructors, alone read
the course's solutions/, tests/ and history; default ddp-lab-instructors).
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from autograde import settings as course_settings
from autograde.course.assignment import EXCHANGE_DEFAULT
from autograde.course.withheld import GROUP
from autograde.parts.capstone.checks import SPEEDUPS

DEFAULT_FILE = course_settings.REPO / "deploy" / "jupyterhub" / "class.toml"
SPAWNERS = ("local", "slurm")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)$")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_USER = re.compile(r"^[a-z_][a-z0-9_-]*\$?$")


class SettingsError(ValueError):
    """A setting that the hub cannot start with; the message is one line that says what to change."""


def size_in_bytes(text: str) -> int:
    """'8G' -> 8 GiB in bytes; SettingsError for anything else than a number with K, M, G or T."""
    match = _SIZE.match(str(text).strip().upper())
    if not match:
        raise SettingsError(f"{text!r} is not a size such as 512M or 8G")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


@dataclass
class Local:
    gpus: int | str = "auto"
    gpus_per_learner: int = 0
    memory: str = "8G"
    cpus: float = 4.0
    processes: int = 1024
    checks_at_once: int = 0


@dataclass
class Capstone:
    speedups: list[float] = field(default_factory=lambda: list(SPEEDUPS))


@dataclass
class Slurm:
    partition: str = ""
    time: str = "08:00:00"
    memory: str = "16G"
    cpus: int = 4
    gpus: int = 1


@dataclass
class ClassSettings:
    instructors: list[str]
    learners: list[str]
    spawner: str = "local"
    ip: str = "0.0.0.0"
    port: int = 8000
    course: Path = course_settings.REPO
    exchange: Path = Path(EXCHANGE_DEFAULT)
    data: Path | None = None
    state: Path = Path("/var/lib/ddp-lab-hub")
    slurm_conf: str = ""
    hub_connect_ip: str = ""
    instructors_group: str = GROUP
    local: Local = field(default_factory=Local)
    slurm: Slurm = field(default_factory=Slurm)
    capstone: Capstone = field(default_factory=Capstone)
    source: Path = DEFAULT_FILE

    @property
    def members(self) -> list[str]:
        return [*self.instructors, *self.learners]

    @property
    def data_dir(self) -> Path:
        return self.data or self.course / "data"

    def role(self, user: str) -> str:
        return "instructor" if user in self.instructors else "learner"

    @property
    def check_queue(self) -> Path:
        """The node's line of learners' checks (autograde/grading/turns.py) when [local] checks_at_once > 0:
        a folder of the node's own, one per hub (its port), readable by the learners (the state is not)."""
        return check_queue(self.port)


def check_queue(port: int) -> Path:
    """The line of checks of the hub at `port` (ClassSettings.check_queue)."""
    return Path("/tmp") / f"ddp-lab-checks-{port}"


def _section(cls: type, values: Any, name: str) -> Any:
    if not isinstance(values, dict):
        raise SettingsError(f"[{name}] must be a table")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise SettingsError(f"[{name}] has no setting {unknown[0]!r} (known: {', '.join(known)})")
    return cls(**values)


def load(path: str | Path | None = None) -> ClassSettings:
    """The settings in `path` (default $DDP_LAB_CLASS, else deploy/jupyterhub/class.toml), checked."""
    source = Path(path or os.environ.get(course_settings.CLASS) or DEFAULT_FILE)
    try:
        raw = tomllib.loads(source.read_text())
    except FileNotFoundError:
        raise SettingsError(f"no class settings at {source}: copy deploy/jupyterhub/class.toml and name your "
                            "users (DDP_LAB_CLASS=path)") from None
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"{source} is not valid TOML: {err}") from None
    top = {f.name for f in fields(ClassSettings)} - {"source"}
    unknown = sorted(set(raw) - top)
    if unknown:
        raise SettingsError(f"{source}: no setting {unknown[0]!r} (known: {', '.join(sorted(top))})")
    for name in ("instructors", "learners"):
        if not isinstance(raw.get(name), list) or not all(isinstance(u, str) for u in raw[name]):
            raise SettingsError(f"{source}: {name} must be a list of Unix user names, e.g. {name} = [\"ada\"]")
    for key in ("course", "exchange", "data", "state"):
        if key in raw:
            raw[key] = Path(raw[key])
    raw["local"] = _section(Local, raw.get("local", {}), "local")
    raw["slurm"] = _section(Slurm, raw.get("slurm", {}), "slurm")
    raw["capstone"] = _section(Capstone, raw.get("capstone", {}), "capstone")
    settings = ClassSettings(**raw, source=source)
    _check(settings)
    return settings


def closed_folders(path: Path) -> list[Path]:
    """The folders on the way to `path` (links followed) that other users may not pass through (no o+x)."""
    real = Path(os.path.realpath(path))
    return [folder for folder in [*reversed(real.parents), real][:-1] if not os.stat(folder).st_mode & 0o001]


def check_open_to_class(*needed: Path) -> None:
    """SettingsError unless every class member can reach these files (the course, its Python)."""
    for path in needed:
        closed = closed_folders(path)
        if closed:
            raise SettingsError(f"class members cannot reach {os.path.realpath(path)}: {closed[0]} is closed to "
                                f"other users (chmod o+x {closed[0]}, or install the course and its Python where "
                                "all can read)")


def _check(s: ClassSettings) -> None:
    where = f"{s.source}:"
    if s.spawner not in SPAWNERS:
        raise SettingsError(f"{where} spawner = {s.spawner!r}: choose one of {', '.join(SPAWNERS)}")
    if not s.instructors:
        raise SettingsError(f"{where} name at least one instructor (instructors = [\"you\"])")
    for user in s.members:
        if not _USER.match(user):
            raise SettingsError(f"{where} {user!r} is not a Unix user name")
    if not _USER.match(s.instructors_group):
        raise SettingsError(f"{where} instructors_group = {s.instructors_group!r} is not a Unix group name")
    both = sorted(set(s.instructors) & set(s.learners))
    if both:
        raise SettingsError(f"{where} {both[0]!r} is both an instructor and a learner: name them once")
    if len(set(s.learners)) != len(s.learners):
        raise SettingsError(f"{where} a learner is named twice")
    if not (s.course / "autograde" / "course" / "nbgrader_config.py").is_file():
        raise SettingsError(f"{where} course = {str(s.course)!r} is not the course's folder (no autograde/ in it)")
    gpus = s.local.gpus
    if not (gpus == "auto" or (isinstance(gpus, int) and gpus >= 0)):
        raise SettingsError(f"{where} [local] gpus = {gpus!r}: a number of GPUs, or \"auto\"")
    at_once = s.local.checks_at_once
    if not isinstance(at_once, int) or isinstance(at_once, bool) or at_once < 0:
        raise SettingsError(f"{where} [local] checks_at_once = {at_once!r}: a whole number of checks the node runs "
                            "at once (0: no line, every check starts at once)")
    speedups = s.capstone.speedups
    if not (isinstance(speedups, list) and len(speedups) == 2 and all(isinstance(x, (int, float)) for x in speedups)
            and 0 < speedups[0] <= speedups[1]):
        raise SettingsError(f"{where} [capstone] speedups = {speedups!r}: two speedups over the baseline, the lower "
                            f"first, such as {list(SPEEDUPS)}")
    if s.local.gpus_per_learner < 0 or s.local.cpus <= 0 or s.local.processes < 16:
        raise SettingsError(f"{where} [local] gpus_per_learner >= 0, cpus > 0 and processes >= 16, please")
    for section, memory in (("local", s.local.memory), ("slurm", s.slurm.memory)):
        try:
            size_in_bytes(memory)
        except SettingsError as err:
            raise SettingsError(f"{where} [{section}] memory: {err}") from None
