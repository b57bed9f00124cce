"""nbgrader run as the course runs it: in autograde/course/ (the only place it reads
nbgrader_config.py from), its log filtered of the lines that are known to be harmless here."""
from __future__ import annotations

import os
import re

from autograde import settings
from autograde.course.assignment import HERE, CourseError, root
from autograde.engine import processes

# Known-harmless lines of nbgrader's log, left out of what the course commands print (and counted).
HARMLESS = {
    "sqlalchemy": re.compile(r"^\S+\.py:\d+: \w*(SAWarning|SADeprecationWarning|MovedIn20Warning): "),
    "tcp": re.compile(r"Kernel is running over TCP without encryption"),
    "alt": re.compile(r"GenerateFeedbackApp \| WARNING\] Alternative text is missing on \d+ image"),
}
EXPLAINED = {
    "sqlalchemy": "SQLAlchemy warnings from inside nbgrader's gradebook",
    "tcp": "kernel notices that they talk over plain TCP (on this machine only)",
    "alt": "notes that a feedback page's figures (the notebooks' plots) have no alternative text",
}


class NbgraderFailed(CourseError):
    """An nbgrader command that failed; `output` is all it printed."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


class LogFilter:
    """Passes nbgrader's output through, without the lines known to be harmless, which it counts.

    nbgrader's "checksum changed" warning is never one of them: grading runs the cells the course
    wrote (sandbox.RestoreCourseCells), so nbgrader has no changed cell to warn of, and a warning
    that comes all the same is shown."""

    def __init__(self) -> None:
        self.counts = {name: 0 for name in EXPLAINED}
        self._skip_source_line = False

    def keep(self, line: str) -> bool:
        if self._skip_source_line:
            self._skip_source_line = False
            if line.startswith(" "):  # the source line that Python's warnings print under a warning
                return False
        for name, pattern in HARMLESS.items():
            if pattern.search(line):
                self.counts[name] += 1
                self._skip_source_line = name == "sqlalchemy"
                return False
        return True

    def add(self, other: "LogFilter") -> None:
        """Count what `other` left out too (commands run at once, each with a filter of its own)."""
        for name, n in other.counts.items():
            self.counts[name] += n

    def summary(self) -> str:
        parts = [f"{n} {EXPLAINED[name]}" for name, n in self.counts.items() if n]
        return f"(left out of the log above as harmless: {'; '.join(parts)})" if parts else ""


def nbgrader(*args: str, log_level: str = "WARN", log: LogFilter | None = None, prefix: str = "",
             env: dict[str, str] | None = None) -> str:
    """Run an nbgrader command in autograde/course/ (where its config is), print its output without the
    known-harmless lines, each line after `prefix`, and return the output; raise CourseError when it fails.
    Several commands at once share one `log`, which the caller then sums up; without one, the
    command's own summary is printed at its end.

    Its notebooks run in quick mode unless DDP_LAB_QUICK says otherwise. No time limit: grading a
    class takes as long as it takes.
    """
    env = {settings.COURSE_DIR: str(root()), settings.QUICK: os.environ.get(settings.QUICK, "1"), **(env or {})}
    cmd = [processes.PYTHON, "-m", "nbgrader", *args, f"--log-level={log_level}"]
    own_log = log is None
    log = log or LogFilter()
    seen: list[str] = []
    proc = processes.start(cmd, cwd=HERE, env=env, merge_stderr=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if log.keep(line):
                print(f"{prefix}{line}", end="", flush=True)
        proc.wait()
    finally:
        processes.kill_group(proc.pid)  # nothing nbgrader started (kernels, training runs) outlives it
        proc.wait()
    if own_log and log.summary():
        print(log.summary())
    unread = config_error(seen)
    if unread is not None:  # nbgrader goes on with its defaults: another gradebook, in another folder
        raise NbgraderFailed(f"nbgrader {args[0]} could not read the course's settings (autograde/course/"
                             f"nbgrader_config.py): {unread}; nothing it did counts: mend that, then run it again",
                             "".join(seen))
    if proc.returncode != 0:
        last = next((line.strip() for line in reversed(seen) if line.strip() and log.keep(line)), "(no output)")
        raise NbgraderFailed(f"nbgrader {args[0]} failed (exit status {proc.returncode}): {last}", "".join(seen))
    return "".join(seen)


CONFIG_UNREAD = "Exception while loading config file"
RAISED = re.compile(r"^\s*(\w+(?:Error|Exception)\b.*)$")


def config_error(lines: list[str]) -> str | None:
    """What made nbgrader fail to read its config file (the error its traceback ends with), where it did; else None."""
    for k, line in enumerate(lines):
        if CONFIG_UNREAD in line:
            raised = (RAISED.match(later) for later in lines[k + 1:k + 40])
            return next((m[1].strip() for m in raised if m), "an error in the file")
    return None
