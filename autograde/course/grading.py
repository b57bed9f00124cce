"""Release, grade and hand back a part with nbgrader: `release` builds the source assignment and
nbgrader's student version, `grade` autogrades every submission's graded notebooks, writes
feedback, exports grades.csv and sums each learner's score (answer cells, graded by hand in the
formgrader, are reported pending until they are; `scores` writes feedback and grades.csv again
after hand grading, without autograding again), and `exchange` runs nbgrader's exchange
commands (release_assignment, collect, release_feedback) on a shared machine."""
from __future__ import annotations

import csv
import os
import re
import secrets
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from autograde.course import sandbox
from autograde.course.assignment import NOTEBOOKS, CourseError, build_source, is_answer, root, step_of
from autograde.course.nbgrader_run import LogFilter, NbgraderFailed, nbgrader
from autograde.grading import registry


def release(rev: str = "HEAD", part: str = registry.FIRST) -> Path:
    """Build the part's source assignment from `rev` and generate the student version; return its folder."""
    built = build_source(rev=rev, part=part)
    notebooks = sum(p.startswith(f"{NOTEBOOKS}/") for p in built.files)
    print(f"releasing {part} from {built.origin}: {notebooks} notebooks, {', '.join(registry.PART[part].files)}")
    for note in built.notes:
        print(note)
    nbgrader("generate_assignment", part, "--force")
    released = root() / "release" / part
    print(f"student version: {released} (hand it out, or `make release-exchange` on a shared machine)")
    return released


def grades(path: Path, part: str = registry.FIRST) -> dict[str, float]:
    """Each student's total score for the part in the exported CSV."""
    with path.open(newline="") as handle:
        return {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(handle)
                if row["assignment"] == part}


def pending_by_hand(path: Path, part: str = registry.FIRST) -> dict[str, float]:
    """Each student's points still to grade by hand (answer cells) for the part in the exported CSV."""
    with path.open(newline="") as handle:
        return {row["student_id"]: float(row[PENDING_COLUMN]) for row in csv.DictReader(handle)
                if row["assignment"] == part}


@dataclass
class Outcome:
    student: str
    score: float
    max_score: float
    lost: list[str]  # the steps with fewer points than they are worth, in step order
    pending: list[str] = field(default_factory=list)  # the answer cells not graded by hand yet, in notebook order
    pending_points: float = 0  # what they are worth: not lost, not yet given


def pending(grade: object) -> bool:
    """Whether a grade (nbgrader's Grade) awaits grading by hand: no autograder's score and no
    instructor's (an answer written, before the formgrader; nbgrader counts it 0 in the score
    meanwhile). An answer cell handed in as it was released has one: nbgrader gives it 0."""
    return getattr(grade, "auto_score", None) is None and getattr(grade, "manual_score", None) is None


def outcomes(part: str = registry.FIRST) -> list[Outcome]:
    """Each graded student's score for the part, the items lost and the answers still to grade by
    hand, from the gradebook."""
    from nbgrader.api import Gradebook  # only where grading happens

    database = root() / "gradebook.db"
    if not database.is_file():  # nbgrader would make an empty one
        raise CourseError(f"no gradebook at {database}: run `make grade` first")
    found = []
    with Gradebook(f"sqlite:///{database}") as gradebook:
        for submission in gradebook.assignment_submissions(part):
            cells = [g for nb in sorted(submission.notebooks, key=lambda n: n.name) for g in nb.grades]
            items = [g for g in cells if not is_answer(g.name)]
            lost = sorted((str(step_of(g.name)) for g in items if (g.score or 0) < g.max_score), key=registry.IDS.index)
            waiting = [g for g in cells if is_answer(g.name) and pending(g)]
            found.append(Outcome(submission.student_id, submission.score, submission.max_score, lost,
                                 [g.name for g in waiting], sum(g.max_score for g in waiting)))
    return sorted(found, key=lambda o: o.student)


PENDING_COLUMN = "pending_by_hand"  # grades.csv: the points of answers not graded by hand yet


def mark_pending(export: Path) -> None:
    """Add to nbgrader's grades.csv a column with each row's points still to grade by hand, so that
    a 0 for an answer nobody has read is not taken for a wrong one."""
    from nbgrader.api import Gradebook

    waiting: dict[tuple[str, str], float] = {}
    with Gradebook(f"sqlite:///{root() / 'gradebook.db'}") as gradebook:
        for assignment in gradebook.assignments:
            for submission in gradebook.assignment_submissions(assignment.name):
                waiting[assignment.name, submission.student_id] = sum(
                    g.max_score for nb in submission.notebooks for g in nb.grades if is_answer(g.name) and pending(g))
    with export.open(newline="") as handle:
        reader = csv.DictReader(handle)
        columns, rows = [*(reader.fieldnames or []), PENDING_COLUMN], list(reader)
    for row in rows:
        row[PENDING_COLUMN] = f"{waiting.get((row['assignment'], row['student_id']), 0):g}"
    with export.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def summary(results: Sequence[Outcome], seconds: Mapping[str, float] | None = None) -> str:
    """A line per student: the score, how long grading took (when known), the steps that lost
    points (feedback/ says why) and, when some are, the answers still to grade by hand."""
    seconds = seconds or {}
    width = max([len("student"), *(len(o.student) for o in results)])
    timed = f"  {'time':>6}" if seconds else ""
    by_hand = any(o.pending for o in results)
    lost_width = max([len("steps lost"), *(len(" ".join(o.lost) or "none") for o in results)])
    lines = [f"{'student':<{width}}  {'score':>7}{timed}  " + (f"{'steps lost':<{lost_width}}  to grade by hand (pending)"
                                                            if by_hand else "steps lost")]
    for o in results:
        took = "" if not seconds else f"  {seconds[o.student]:>4.0f} s" if o.student in seconds else f"  {'':>6}"
        line = f"{o.student:<{width}}  {f'{o.score:g}/{o.max_score:g}':>7}{took}  {' '.join(o.lost) or 'none'}"
        if by_hand:
            waiting = f"{o.pending_points:g} point(s): {' '.join(o.pending)}" if o.pending else "none"
            line = f"{line:<{len(lines[0]) - len('to grade by hand (pending)')}}{waiting}"
        lines.append(line)
    if by_hand:
        lines.append("(answers to grade by hand count 0 in the score until graded: the formgrader's Manual Grading, "
                     "then `make scores`; docs/instructors.md, 'Answers graded by hand')")
    return "\n".join(lines)


def jobs(students: int, asked: int | None = None) -> int:
    """How many learners are graded at once: `asked` (make grade JOBS=N), else one per core of the
    machine (each learner's checks run a few processes of one thread each, and wait on them part of
    the time), never more than there are learners."""
    return max(1, min(students, asked or os.cpu_count() or 1))


SANDBOX_NOTE = re.compile(r"sandbox: (.*)|(\S+): (\d+ cell\(s\) the learner added are not run)|"
                          r"Removing failed notebook: .*/([^/]+)\.ipynb")


def sandbox_notes(output: str) -> list[str]:
    """What grading one learner's submission met, from nbgrader's log: the sandbox's limits, cells the
    learner added, notebooks whose grading failed (they count 0)."""
    notes = []
    for line in output.splitlines():
        match = SANDBOX_NOTE.search(line)
        if match:
            notes.append(match[1] or (f"{match[2]}: {match[3]}" if match[2] else f"{match[4]}: grading failed, 0 points"))
    return list(dict.fromkeys(notes))


def _autograde_one(part: str, student: str, log: LogFilter, prefix: str, notebooks: str) -> tuple[float, list[str]]:
    """Autograde one learner's submission, its notebooks' kernels in the sandbox (sandbox.py); the
    seconds it took and what the sandbox met. A submission whose grading fails counts 0 for the
    notebooks that failed and stops nobody else's."""
    started = time.monotonic()
    key = secrets.token_hex(32)
    with tempfile.TemporaryDirectory(prefix=f"ddp-lab-grade-{student}-") as verdicts:
        try:  # the learner's verdicts: a folder of their own, signed with a key of their own
            output = nbgrader("autograde", part, f"--student={student}", f"--notebook={notebooks}", "--force",
                              log=log, prefix=prefix, env={sandbox.VERDICTS: verdicts, sandbox.KEY: key})
        except CourseError as err:
            output = err.output if isinstance(err, NbgraderFailed) else str(err)
    return time.monotonic() - started, sandbox_notes(output)


def grade(part: str = registry.FIRST, at_once: int | None = None, notebooks: str | None = None) -> Path:
    """Autograde every submission of the part, several learners at once (`jobs`), write feedback,
    export grades.csv, print the scores and each learner's grading time; return the CSV. `notebooks`:
    only these graded notebooks (nbgrader's --notebook pattern; default every one that holds grade cells)."""
    submitted = root() / "submitted"
    students = sorted(p.parent.name for p in submitted.glob(f"*/{part}"))
    if not students:
        raise CourseError(f"no submissions: put each in {submitted}/<student>/{part}/ "
                          f"(`make collect` does from the exchange)")
    if not (root() / "source" / part).is_dir():
        raise CourseError("no source assignment: run `make release` first")
    sandbox.ready()  # refused here, with one line, where a learner's code would run as you
    at_once = jobs(len(students), at_once)
    # Only the step notebooks hold grade cells; running the others (training runs, plots) adds
    # minutes per learner and no points.
    print(f"autograding {len(students)} submission(s), {at_once} at a time: {', '.join(students)} "
          "(a minute or more each: every check runs the script)", flush=True)
    _open_gradebook()  # made (or upgraded) once, before learners are graded into it at once
    logs = {student: LogFilter() for student in students}
    width = max(len(s) for s in students)
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        took = {student: pool.submit(_autograde_one, part, student, logs[student],
                                     f"{student:<{width}} | " if at_once > 1 else "",
                                     notebooks or registry.PART[part].graded)
                for student in students}
        done = {student: future.result() for student, future in took.items()}
    seconds = {student: took_s for student, (took_s, _) in done.items()}
    notes = {student: found for student, (_, found) in done.items() if found}
    log = LogFilter()
    for each in logs.values():
        log.add(each)
    if log.summary():
        print(log.summary())
    return scores(part, seconds, notes)


def scores(part: str = registry.FIRST, seconds: Mapping[str, float] | None = None,
           notes: Mapping[str, list[str]] | None = None) -> Path:
    """Write the feedback, export grades.csv (with the points still to grade by hand) and print the
    scores from the gradebook as it is: after `grade`, and again after grading answers by hand."""
    if not (root() / "gradebook.db").is_file():
        raise CourseError(f"no gradebook at {root() / 'gradebook.db'}: run `make grade` first")
    nbgrader("generate_feedback", part, "--force")
    export = root() / "grades.csv"
    nbgrader("export", f"--to={export}")
    mark_pending(export)
    print(summary(outcomes(part), seconds))
    for student, found in sorted((notes or {}).items()):
        print(f"{student}: {'; '.join(found)}")
    print(f"grades: {export}; feedback: {root() / 'feedback'}/<student>/{part}/ "
          f"(`make return-feedback` hands it back through the exchange)")
    return export


def _open_gradebook() -> None:
    """Create the gradebook, or bring an older one up to date, before it is written from several
    processes (nbgrader does either on opening it; two doing it at once could collide)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root() / 'gradebook.db'}"):
        pass


def exchange_root(path: str) -> str:
    folder = Path(path)
    if not folder.is_dir():
        raise CourseError(f"no exchange folder {folder}: create it, writable by everyone "
                          f"(sudo mkdir -p {folder} && sudo chmod 777 {folder}), or choose another: EXCHANGE=/path")
    return str(folder.resolve())


def exchange(command: str, exchange_dir: str, extra: Sequence[str] = (), part: str = registry.FIRST) -> None:
    """release_assignment, collect or release_feedback through nbgrader's exchange at `exchange_dir`."""
    where = exchange_root(exchange_dir)
    if command == "release_assignment" and not (root() / "release" / part).is_dir():
        raise CourseError("no student version to hand out: run `make release` first")
    if command == "release_feedback" and not any((root() / "feedback").glob(f"*/{part}/*.html")):
        raise CourseError("no feedback to hand back: run `make grade` first")
    nbgrader(command, part, f"--Exchange.root={where}", *extra, log_level="INFO")
    if command == "collect":
        print(f"submissions: {root() / 'submitted'}/<student>/{part}/ (next: `make grade`)")


EXCHANGE_COMMANDS = {"release-exchange": "release_assignment", "collect": "collect", "return-feedback": "release_feedback"}
