"""The capstone's class leaderboard: each learner's best valid run, and each learner whose latest graded
run broke a rule, with the reason.

Grading writes it (the sandbox's Execute calls `record` after each notebook it grades, for the course's
grading command and the formgrader's Autograde button alike): the verdict on time_to_target as the check
in the sandbox signed it, read from the learner's verdicts folder with the key only the grader held, so nothing the learner's code wrote can put a row on the board. One
JSON line per graded run, in LEADERBOARD beside the gradebook. The hub's leaderboard service
(leaderboard_service.py) reads every instructor's and shows `page`: the table, a chart of the speedups,
the viewer's own row marked; the reasons of invalid runs to the instructors and to their own learner.
"""
from __future__ import annotations

import html
import io
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from autograde.grading import cache

LEADERBOARD = "leaderboard.jsonl"  # in the course folder (DDP_LAB_COURSE_DIR), beside gradebook.db
ITEM = "time_to_target"


@dataclass(frozen=True)
class Entry:
    """One graded run of a learner's capstone."""

    learner: str
    graded: float                 # when it was graded (seconds since the epoch)
    valid: bool
    facts: dict[str, Any] = field(default_factory=dict)  # the check's numbers: seconds, baseline, speedup, ...
    reason: str = ""              # why it is not valid: the verdict's words

    @property
    def speedup(self) -> float:
        return float(self.facts.get("speedup") or 0.0)


def record(course: Path, learner: str, notebook: str, verdicts: Path, key: bytes) -> Entry | None:
    """Once `notebook` has been graded: where it is the capstone's, add the learner's graded run to the
    course's leaderboard, from the verdicts `key` signed; None where grading gave none (another notebook,
    one that did not run, a verdict of the checker's own failure, or one that cannot apply here)."""
    from autograde.grading import registry

    if notebook != registry.item(ITEM).notebook:
        return None
    found = [results[ITEM] for results in cache.signed(verdicts, key) if ITEM in results]
    judged = [r for r in found if r.passed is not None and not r.checker_error]
    if not judged:
        return None
    verdict = next((r for r in judged if r.passed), judged[0])
    entry = Entry(learner, time.time(), bool(verdict.passed), dict(verdict.measured or {}),
                  "" if verdict.passed else verdict.observed)
    with open(course / LEADERBOARD, "a") as out:
        out.write(json.dumps(asdict(entry)) + "\n")
    return entry


def read(files: Iterable[Path]) -> list[Entry]:
    """The entries of these leaderboard files (missing files and unreadable lines left out), oldest first."""
    entries = []
    for path in files:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                entries.append(Entry(**json.loads(line)))
            except (ValueError, TypeError):
                continue
    return sorted(entries, key=lambda e: e.graded)


def standings(entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """Each learner's best valid run, fastest speedup first; and the latest run of each learner whose
    latest is invalid."""
    best: dict[str, Entry] = {}
    latest: dict[str, Entry] = {}
    for e in entries:
        latest[e.learner] = e
        if e.valid and (e.learner not in best or e.speedup > best[e.learner].speedup):
            best[e.learner] = e
    ranked = sorted(best.values(), key=lambda e: (-e.speedup, e.graded))
    invalid = sorted((e for e in latest.values() if not e.valid), key=lambda e: e.learner)
    return ranked, invalid


def chart(ranked: list[Entry], viewer: str) -> str:
    """The speedups as horizontal bars, the viewer's own in another colour: an SVG element."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.4 * max(1, len(ranked))))
    names = [e.learner for e in ranked][::-1]
    ax.barh(names, [e.speedup for e in ranked][::-1],
            color=["tab:orange" if n == viewer else "tab:blue" for n in names])
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)  # the baseline's own time
    ax.set_xlabel("speedup over the baseline (its time to the target / yours)")
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    text = out.getvalue()
    return text[text.index("<svg"):]


def page(entries: list[Entry], viewer: str, instructor: bool) -> str:
    """The leaderboard as an HTML page for `viewer`: their own row marked; the reasons of invalid runs
    shown to an instructor and to the learner whose run it was."""
    ranked, invalid = standings(entries)
    esc = html.escape
    rows = []
    for place, e in enumerate(ranked, 1):
        f = e.facts
        mine = ' class="mine"' if e.learner == viewer else ""
        rows.append(f"<tr{mine}><td>{place}</td><td>{esc(e.learner)}{' (you)' if mine else ''}</td>"
                    f"<td>{float(f.get('seconds', 0)):.1f} s</td><td>{float(f.get('baseline', 0)):.1f} s</td>"
                    f"<td>{e.speedup:.2f}</td><td>{esc(str(f.get('division', '')))}</td>"
                    f"<td>{f.get('processes', '')}</td><td>{esc(str(f.get('changes', '')))}</td>"
                    f"<td>{time.strftime('%Y-%m-%d %H:%M', time.localtime(e.graded))}</td></tr>")
    bad = []
    for e in invalid:
        mine = ' class="mine"' if e.learner == viewer else ""
        reason = esc(e.reason) if instructor or e.learner == viewer else "(shown to them and to the instructors)"
        bad.append(f"<tr{mine}><td>{esc(e.learner)}{' (you)' if mine else ''}</td><td>{reason}</td></tr>")
    table = ("<table><tr><th>#</th><th>learner</th><th>time to target</th><th>baseline</th><th>speedup</th>"
             "<th>division</th><th>processes</th><th>what they changed</th><th>graded</th></tr>"
             + "".join(rows) + "</table>") if rows else "<p>No valid run graded yet.</p>"
    invalid_part = ("<h2>Invalid runs</h2><p>The latest graded run broke a rule of the capstone:</p>"
                    "<table><tr><th>learner</th><th>why</th></tr>" + "".join(bad) + "</table>") if bad else ""
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Capstone leaderboard</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px 8px;text-align:left}tr.mine{background:#fde9c8;font-weight:bold}</style></head><body>"
            "<h1>Capstone leaderboard</h1><p>Each learner's best valid run as graded: the time to the target "
            "and the handed-out baseline's, timed on the same machine in the same grading.</p>"
            + table + (chart(ranked, viewer) if rows else "") + invalid_part + "</body></html>")
