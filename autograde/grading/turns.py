"""A fair line for checks on a class's node. Where the node cannot run every learner's check at once
(the class settings' [local] checks_at_once), a check waits for its turn and says so in the cell (its
place in line and the expected wait) instead of crowding everyone's runs until they time out.

The hub's local spawner gives each learner's server $DDP_LAB_CHECK_QUEUE (a folder the node's learners
share: root's, world-writable, sticky) and $DDP_LAB_CHECKS_AT_ONCE (N). Outside a class neither is set
and a check starts at once, as before.

In the folder a check's ticket is `wait-<arrival in ns>-<pid>`, owned by its learner and holding its
process's start time (so that a pid the system reused is not taken for the ticket's process); it is
renamed `run-<arrival>-<pid>` when its turn comes, and removed when the check ends. Under an exclusive
lock on `lock`, a waiting ticket starts when fewer than N live tickets run and it is among the first
(N - running) eligible ones: the earliest waiting ticket of each learner who runs no check now, in
order of arrival. So nobody runs two checks at once, and nobody is overtaken by a later arrival. A
ticket whose process is gone is ignored (and removed where the reader may). Each learner's recent
check durations are kept in `done-<uid>`; the expected wait is the node's median recent duration
times the rounds of N checks ahead.
"""
from __future__ import annotations

import fcntl
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from autograde import settings

LOCK = "lock"
POLL_S = 0.5
PATIENCE_S = 3600.0  # a check that waited this long gives up with one line (the line is stuck)
KEEP = 20  # durations kept per learner, and read from the node's learners together
_held = 0  # > 0 while this process holds a turn: a check inside a check takes no second ticket


class QueueError(RuntimeError):
    """The line cannot be used or waited in; the message is one line that says why."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this line instead of a traceback
        return [f"\x1b[1;31mthe check could not start: {self}\x1b[0m"]


@dataclass(frozen=True)
class Ticket:
    name: str
    arrival: int
    pid: int
    uid: int
    running: bool


def make_folder(folder: Path) -> None:
    """The line's folder, made by root for a class (world-writable and sticky, like /tmp: each learner may
    remove only their own tickets), with the lock file every learner opens read-only. Anything in the
    way that is not root's own folder (a learner's folder or link made beforehand) is replaced."""
    try:
        info = folder.lstat()
        if not (folder.is_dir() and not folder.is_symlink() and info.st_uid == os.getuid()):
            if folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder)
            else:
                folder.unlink()
    except FileNotFoundError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o1777)
    lock = folder / LOCK
    lock.touch()
    lock.chmod(0o644)


def start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat), or None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def parse(name: str, uid: int) -> Ticket | None:
    state, _, rest = name.partition("-")
    arrival, _, pid = rest.partition("-")
    if state not in ("wait", "run") or not arrival.isdigit() or not pid.isdigit():
        return None
    return Ticket(name, int(arrival), int(pid), uid, state == "run")


def live_tickets(folder: Path) -> list[Ticket]:
    """The tickets whose process is still there, in order of arrival; a dead one is removed where it may be."""
    found = []
    for path in folder.iterdir():
        try:
            ticket = parse(path.name, path.stat().st_uid)
            if ticket is None:
                continue
            alive = start_time(ticket.pid) == path.read_text().strip()
        except OSError:  # removed meanwhile
            continue
        if alive:
            found.append(ticket)
        else:
            try:
                path.unlink()
            except OSError:
                pass  # another learner's ticket, in the sticky folder: ignored
    return sorted(found, key=lambda t: (t.arrival, t.pid))


def line(tickets: list[Ticket]) -> tuple[int, list[Ticket]]:
    """How many checks run, and the waiting tickets that may start next, in order: the earliest waiting
    ticket of each learner who runs no check now."""
    busy = {t.uid for t in tickets if t.running}
    eligible = []
    for t in tickets:
        if not t.running and t.uid not in busy:
            eligible.append(t)
            busy.add(t.uid)
    return sum(t.running for t in tickets), eligible


def place(tickets: list[Ticket], mine: Ticket) -> int:
    """`mine`'s place in line, 1 first: the eligible tickets before it, plus one."""
    _, eligible = line(tickets)
    return 1 + sum(t.arrival < mine.arrival or (t.arrival == mine.arrival and t.pid < mine.pid)
                   for t in eligible if t.name != mine.name)


def typical_duration(folder: Path) -> float | None:
    """The median of the node's most recent check durations (s), None before any check has ended."""
    ended: list[tuple[float, float]] = []
    for path in folder.glob("done-*"):
        try:
            for row in path.read_text().split("\n"):
                if row.strip():
                    end, seconds = row.split()
                    ended.append((float(end), float(seconds)))
        except (OSError, ValueError):
            continue
    recent = [seconds for _, seconds in sorted(ended)[-KEEP:]]
    return statistics.median(recent) if recent else None


def waiting_message(position: int, at_once: int, typical: float | None, blocked_by_own: bool) -> str:
    """The line a waiting check shows in the cell."""
    if blocked_by_own:
        where = "after your other check, which runs now"
    else:
        where = f"{_ordinal(position)} in line"
    if typical is None:
        wait = "expected wait not known yet (no check has finished on this node)"
    else:
        wait = f"expected wait about {_duration(math.ceil(position / at_once) * typical)}"
    return (f"waiting for a turn: {at_once} check{'s' if at_once > 1 else ''} run at once on this node and "
            f"yours is {where}; {wait}")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds))} s" if seconds < 90 else f"{round(seconds / 60)} min"


def _at_once() -> int:
    text = os.environ.get(settings.CHECKS_AT_ONCE, "1")
    if not text.isdigit() or int(text) < 1:
        raise QueueError(f"${settings.CHECKS_AT_ONCE} = {text!r}: a whole number of checks, at least 1")
    return int(text)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    try:
        fd = os.open(folder / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        fd = os.open(folder / LOCK, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _take(folder: Path) -> Ticket:
    pid = os.getpid()
    me = start_time(pid)
    arrival = time.time_ns()
    ticket = Ticket(f"wait-{arrival:020d}-{pid}", arrival, pid, os.getuid(), False)
    draft = folder / f".draft-{arrival}-{pid}"
    draft.write_text(f"{me}\n")
    draft.chmod(0o644)
    draft.rename(folder / ticket.name)  # whole, with its start time, or not at all
    return ticket


def try_start(folder: Path, mine: Ticket, at_once: int) -> Ticket | None:
    """`mine` renamed as running if its turn has come, else None."""
    with _locked(folder):
        tickets = live_tickets(folder)
        running, eligible = line(tickets)
        free = at_once - running
        if free > 0 and mine.name in [t.name for t in eligible[:free]]:
            started = Ticket("run" + mine.name[len("wait"):], mine.arrival, mine.pid, mine.uid, True)
            os.rename(folder / mine.name, folder / started.name)
            return started
    return None


def _record(folder: Path, seconds: float) -> None:
    own = folder / f"done-{os.getuid()}"
    try:
        rows = own.read_text().split("\n") if own.exists() else []
        rows = [r for r in rows if r.strip()][-(KEEP - 1):] + [f"{time.time():.3f} {seconds:.3f}"]
        draft = folder / f".done-{time.time_ns()}-{os.getpid()}"
        draft.write_text("\n".join(rows) + "\n")
        draft.chmod(0o644)
        draft.rename(own)
    except OSError:
        pass  # the expected wait is a courtesy: no check fails for it


@contextmanager
def turn(say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Wait for this check's turn in the node's line ($DDP_LAB_CHECK_QUEUE), saying where it stands when
    that changes; run the body; leave the line. Outside a class, or inside a turn already, at once."""
    global _held
    where = os.environ.get(settings.CHECK_QUEUE, "")
    if not where or _held:
        yield
        return
    folder, at_once = Path(where), _at_once()
    if not folder.is_dir():
        raise QueueError(f"the node's line of checks, {folder}, is missing: ask your instructor to restart your server")
    mine = _take(folder)
    said, began = "", time.monotonic()
    try:
        while (started := try_start(folder, mine, at_once)) is None:
            tickets = live_tickets(folder)
            if mine.name not in [t.name for t in tickets]:
                raise QueueError(f"this check's ticket {folder / mine.name} was removed while it waited")
            _, eligible = line(tickets)
            message = waiting_message(place(tickets, mine), at_once, typical_duration(folder),
                                      mine.name not in [t.name for t in eligible])
            if message != said and say is not None:
                say(message)
            said = message
            if time.monotonic() - began > PATIENCE_S:
                raise QueueError(f"waited {PATIENCE_S / 60:.0f} min for a turn in {folder}: the line does not "
                                 "move; ask your instructor")
            time.sleep(POLL_S)
        mine = started
        if said and say is not None:
            say(f"your turn came after {_duration(time.monotonic() - began)}: checking now")
        _held += 1
        ran = time.monotonic()
        try:
            yield
        finally:
            _held -= 1
            _record(folder, time.monotonic() - ran)
    finally:
        try:
            (folder / mine.name).unlink()
        except OSError:
            pass
