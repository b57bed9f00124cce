"""Verdicts kept on disk, so that one set of runs of a script answers every step that asks.

Checking a step launches the learner's script; the next check of the same file (another
notebook's check cell, an nbgrader grade cell, the progress cell) reads the verdicts those
runs gave instead of launching it again. A verdict is keyed by the script's exact bytes, the
process layout, the devices each run used and the checker's own source: editing the script (or
the checker) means new runs. Verdicts from runs that hit the time limit are not kept, since
a machine that was only busy deserves a second try.

A check under way leaves a mark (`begin`, removed by `end`), so that one cut short before its
verdict (its kernel killed, its server or node lost) is known to the next check of the same file,
which says so: nothing of the cut run is kept, and the learner learns why it gave no verdict.

The folder is $DDP_LAB_CACHE_DIR, or ddp-lab-verdicts-<uid> in the system's temporary folder.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import tempfile
import time
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

from autograde import settings
from autograde.engine import code
from autograde.engine.verdicts import Result

_key: bytes | None = None  # sign_with(): verdicts on disk are signed, and only signed ones are read


def sign_with(key: bytes | None) -> None:
    """Sign every verdict kept from now on with `key`, and read only verdicts signed with it: in the
    grading sandbox, where the learner's processes run as the checker's user and could otherwise
    write a verdict of their own into the folder (they never see the key). None: unsigned again."""
    global _key
    _key = key


def _mac(path: Path, text: str, key: bytes) -> str:
    return hmac.new(key, f"{path.name}\n{text}".encode(), hashlib.sha256).hexdigest()


def _read(path: Path, key: bytes | None) -> dict[str, Result]:
    """The verdicts of one file, signed with `key` (None: unsigned); none where unreadable or not signed so."""
    try:
        text = path.read_text()
        if key is not None:
            mac, _, text = text.partition("\n")
            if not hmac.compare_digest(mac, _mac(path, text, key)):
                return {}
        return {step: Result(**fields) for step, fields in json.loads(text).items()}
    except (OSError, ValueError, TypeError):
        return {}


def folder() -> Path:
    default = Path(tempfile.gettempdir()) / f"ddp-lab-verdicts-{os.getuid() if hasattr(os, 'getuid') else 0}"
    return Path(os.environ.get(settings.CACHE_DIR) or default)


@lru_cache(maxsize=1)
def checker_version() -> str:
    """A digest of the code that can change a verdict: verdicts of an older checker are not reused."""
    return code.digest(code.VERDICT_CODE, code.NOT_VERDICT_CODE)


def _file(script: Path, procs_per_node: int, nodes: int, devices: str) -> Path:
    key = hashlib.sha256(script.read_bytes())
    key.update(f"{procs_per_node}x{nodes}:{devices}:{checker_version()}".encode())
    return folder() / f"{key.hexdigest()[:32]}.json"


def runs_file(script: Path, procs_per_node: int, nodes: int, devices: str) -> Path:
    """Where the runs behind the script's verdicts are recorded (Workspace.save), for a notebook
    that draws what the check saw without making the runs again."""
    return _file(script, procs_per_node, nodes, devices).with_suffix(".runs.json.gz")


def load(script: Path, procs_per_node: int, nodes: int, devices: str) -> dict[str, Result]:
    """The verdicts known for this exact script and layout (none when unreadable)."""
    try:
        path = _file(script, procs_per_node, nodes, devices)
    except OSError:
        return {}
    return _read(path, _key)


def signed(verdicts: Path, key: bytes) -> list[dict[str, Result]]:
    """Every verdict file in the folder `verdicts` that `key` signed (the grader's read of a learner's
    folder after grading: it holds the key the sandbox signed with; a file anything else wrote is left out)."""
    return [found for path in sorted(verdicts.glob("*.json")) if (found := _read(path, key))]


def save(script: Path, procs_per_node: int, nodes: int, devices: str, verdicts: dict[str, Result]) -> None:
    """Keep `verdicts` for the script (written whole, then renamed, so readers never see half a file)."""
    target = _file(script, procs_per_node, nodes, devices)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        text = json.dumps({step: asdict(r) for step, r in verdicts.items()})
        partial.write_text(f"{_mac(target, text, _key)}\n{text}" if _key is not None else text)
        partial.replace(target)
    except OSError:
        pass  # a read-only or full disk only costs new runs next time


def _started(pid: int) -> str:
    """When process `pid` started (ticks since boot), to tell it from a later process given its pid; '' if
    gone or a zombie (dead, not yet reaped), or where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    return "" if fields[0] == "Z" else fields[19]


def _alive(mark: dict[str, object]) -> bool:
    """Whether the check that left `mark` still runs (a mark from another node: its server is gone)."""
    if mark.get("host") != socket.gethostname():
        return False
    pid = int(str(mark.get("pid", 0)))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started, then = _started(pid), mark.get("started_ticks")
    if not then or not Path("/proc/self/stat").exists():
        return True  # no way to tell it from another process: assume it runs
    return started == then


def begin(script: Path, steps: list[str]) -> tuple[Path | None, list[dict[str, object]]]:
    """Mark a check of `script` under way; the mark (for `end`), and the marks of earlier checks of the
    same file that were cut short before their verdict (each removed here: said once)."""
    name = hashlib.sha256(str(script.resolve()).encode()).hexdigest()[:16]
    cut: list[dict[str, object]] = []
    for old in folder().glob(f"running-{name}-*.json"):
        try:
            mark = json.loads(old.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(mark, dict) and not _alive(mark):
            cut.append(mark)
            old.unlink(missing_ok=True)
    mine = folder() / f"running-{name}-{socket.gethostname()}-{os.getpid()}.json"
    try:
        mine.parent.mkdir(parents=True, exist_ok=True)
        mine.write_text(json.dumps({"script": str(script), "steps": steps, "host": socket.gethostname(),
                                    "pid": os.getpid(), "started_ticks": _started(os.getpid()),
                                    "at": time.time()}))
    except OSError:
        return None, cut
    return mine, sorted(cut, key=lambda m: float(str(m.get("at", 0))))


def end(mark: Path | None) -> None:
    """The check that made `mark` ended (with a verdict, an error, or stopped by its learner)."""
    if mark is not None:
        mark.unlink(missing_ok=True)
