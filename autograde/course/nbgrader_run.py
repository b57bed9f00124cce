"""nbgrader run as the course runs it: in autograde/course/ (the only place it reads
nbgrader_config.py from), its log filtered of the lines that are known to be harmless here."""
from __future__ import annotations

import json
import os
import re

from autograde import settings
from autograde.course.assignment import HERE, HIDDEN_GRADE_IDS, CourseError, root
from autograde.engine import processes

# Known-harmless lines of nbgrader's log, left out of what the course commands print (and counted).
HARMLESS = {
    "sqlalchemy": re.compile(r"^\S+\.py:\d+: \w*(SAWarning|SADeprecationWarning|MovedIn20Warning): "),
    "tcp": re.compile(r"Kernel is running over TCP without encryption"),
    "alt": re.compile(r"GenerateFeedbackApp \| WARNING\] Alternative text is missing on \d+ image"),
}
CHECKSUM = re.compile(r"Attribute 'checksum' for cell (\S+) has changed! \(should be: (\w+), got: (\w+)\)")
EXPLAINED = {
    "sqlalchemy": "SQLAlchemy warnings from inside nbgrader's gradebook",
    "tcp": "kernel notices that they talk over plain TCP (on this machine only)",
    "alt": "notes that a feedback page's figures (the notebooks' plots) have no alternative text",
    "hidden": "grade cells restored with their hidden tests (nbgrader calls it 'checksum changed': the student "
              "version of a cell with hidden tests differs from the source, jupyter/nbgrader#1961)",
}


def released_checksums() -> dict[str, str]:
    """grade_id -> the checksum of that grade cell in the student version (release/)."""
    sums = {}
    for notebook in (root() / "release").glob("*/*.ipynb"):  # every part's: grade ids are unique
        for cell in json.loads(notebook.read_text())["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            if meta.get("grade") and "checksum" in meta:
                sums[meta["grade_id"]] = meta["checksum"]
    return sums


class NbgraderFailed(CourseError):
    """An nbgrader command that failed; `output` is all it printed."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


class LogFilter:
    """Passes nbgrader's output through, without the lines known to be harmless, which it counts.

    A "checksum changed" warning is harmless exactly when the submitted cell is the student
    version's (its hidden tests were taken out on release and are put back now); a learner's
    edit to a locked cell gives another checksum, and that warning is shown.
    """

    def __init__(self) -> None:
        self.counts = {name: 0 for name in EXPLAINED}
        self.released = released_checksums()
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
        match = CHECKSUM.search(line)
        if match and self.released.get(match[1]) == match[3] and match[1] in HIDDEN_GRADE_IDS:
            self.counts["hidden"] += 1
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
    if proc.returncode != 0:
        last = next((line.strip() for line in reversed(seen) if line.strip() and log.keep(line)), "(no output)")
        raise NbgraderFailed(f"nbgrader {args[0]} failed (exit status {proc.returncode}): {last}", "".join(seen))
    return "".join(seen)
