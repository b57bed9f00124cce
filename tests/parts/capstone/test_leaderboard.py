"""The capstone's leaderboard: what grading records from a learner's signed verdicts, and the page the hub
shows (tests/course/test_course.py grades the capstone for real and finds its row; tests/course/
test_class_hub.py opens the page on the hub as a learner and as the instructor)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autograde.engine.verdicts import Result
from autograde.grading import cache
from autograde.parts.capstone import leaderboard
from autograde.parts.capstone.leaderboard import ITEM, Entry

KEY = b"the grader's key"
NOTEBOOK = "40_capstone"  # the notebook that holds the item
FACTS = {"seconds": 6.7, "baseline": 8.7, "speedup": 1.3, "division": "closed", "processes": 2,
         "changes": "DDP, <b>batch</b> 64"}


def verdicts_of(folder: Path, script: Path, results: dict[str, Result], key: bytes | None) -> Path:
    """A learner's verdicts folder as the sandbox's kernel leaves it: the file `cache.save` writes,
    signed with `key` (None: written unsigned, as a learner's process could)."""
    script.write_text(f"# {len(list(folder.glob('*')))}\n")
    cache.sign_with(key)
    try:
        cache.save(script, 2, 1, "cpu", results)
    finally:
        cache.sign_with(None)
    return folder


@pytest.fixture
def verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "verdicts"
    monkeypatch.setenv("DDP_LAB_CACHE_DIR", str(folder))
    return folder


def test_a_signed_pass_is_recorded_with_its_numbers(tmp_path: Path, verdicts: Path) -> None:
    verdicts_of(verdicts, tmp_path / "a.py", {ITEM: Result(ITEM, True, "reached", measured=FACTS)}, KEY)
    assert leaderboard.record(tmp_path, "ada", "20_ddp_by_hand", verdicts, KEY) is None  # another part's notebook
    entry = leaderboard.record(tmp_path, "ada", NOTEBOOK, verdicts, KEY)
    assert entry is not None and entry.valid and entry.facts == FACTS
    (line,) = (tmp_path / leaderboard.LEADERBOARD).read_text().splitlines()
    assert leaderboard.read([tmp_path / leaderboard.LEADERBOARD]) == [Entry(**json.loads(line))]


def test_a_verdict_the_grader_did_not_sign_puts_no_row_on_the_board(tmp_path: Path, verdicts: Path) -> None:
    verdicts_of(verdicts, tmp_path / "a.py", {ITEM: Result(ITEM, True, "forged", measured={"speedup": 99.0})}, None)
    verdicts_of(verdicts, tmp_path / "b.py", {ITEM: Result(ITEM, True, "forged", measured={"speedup": 99.0})},
                b"a key of the learner's own")
    assert leaderboard.record(tmp_path, "mallory", NOTEBOOK, verdicts, KEY) is None
    assert not (tmp_path / leaderboard.LEADERBOARD).exists()


def test_a_failed_check_is_recorded_invalid_with_its_words_and_a_checker_error_not_at_all(
        tmp_path: Path, verdicts: Path) -> None:
    verdicts_of(verdicts, tmp_path / "a.py", {ITEM: Result(ITEM, None, "checker", checker_error=True)}, KEY)
    assert leaderboard.record(tmp_path, "bob", NOTEBOOK, verdicts, KEY) is None
    said = "rank 1 took part in 2 evaluations, while the log has 3"
    verdicts_of(verdicts, tmp_path / "b.py", {ITEM: Result(ITEM, False, said)}, KEY)
    entry = leaderboard.record(tmp_path, "bob", NOTEBOOK, verdicts, KEY)
    assert entry is not None and not entry.valid and entry.reason == said


def test_the_board_keeps_each_learners_best_valid_run_and_lists_the_latest_invalid_ones() -> None:
    entries = [Entry("ada", 1, True, {**FACTS, "speedup": 1.2}), Entry("ada", 2, True, {**FACTS, "speedup": 1.5}),
               Entry("ada", 3, True, {**FACTS, "speedup": 1.1}), Entry("bob", 4, True, {**FACTS, "speedup": 1.3}),
               Entry("bob", 5, False, {}, "shards overlap"), Entry("cy", 6, False, {}, "weights differ"),
               Entry("dan", 7, False, {}, "no log"), Entry("dan", 8, True, {**FACTS, "speedup": 0.9})]
    ranked, invalid = leaderboard.standings(entries)
    assert [(e.learner, e.speedup) for e in ranked] == [("ada", 1.5), ("bob", 1.3), ("dan", 0.9)]
    assert [(e.learner, e.reason) for e in invalid] == [("bob", "shards overlap"), ("cy", "weights differ")]


def test_the_page_marks_the_viewers_row_and_shows_reasons_to_their_learner_and_the_instructors() -> None:
    entries = [Entry("ada", 1, True, FACTS), Entry("bob", 2, True, {**FACTS, "speedup": 1.1}),
               Entry("cy", 3, False, {}, "rank 1 skipped evaluation 2")]
    ada = leaderboard.page(entries, "ada", instructor=False)
    assert re.search(r'<tr class="mine"><td>1</td><td>ada \(you\)</td><td>6\.7 s</td><td>8\.7 s</td><td>1\.30</td>', ada)
    assert ada.count('class="mine"') == 1 and "DDP, &lt;b&gt;batch&lt;/b&gt; 64" in ada  # the learner's words, escaped
    assert "<svg" in ada and "rank 1 skipped" not in ada  # the chart; cy's reason is cy's
    assert "rank 1 skipped evaluation 2" in leaderboard.page(entries, "cy", instructor=False)
    teacher = leaderboard.page(entries, "teacher", instructor=True)
    assert "rank 1 skipped evaluation 2" in teacher and 'class="mine"' not in teacher
    assert "No valid run graded yet" in leaderboard.page([], "ada", instructor=False)
