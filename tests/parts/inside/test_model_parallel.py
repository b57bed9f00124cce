"""Model parallelism (notebook 22): the pipeline traced by the checker for real (the solution's,
and the exercise's TODOs falling back on it), each stage's passes read from the trace; the
interleaved order's bubble counted from its trace; the learner's bubble_fraction read as the
notebook's prediction; the idle share's arithmetic on made-up passes, the formula, the ideal
schedules, and the figures."""
from __future__ import annotations

from typing import Any

import pytest

from autograde.parts.inside import notebook_model_parallel as mp
from autograde.parts.inside.notebook_model_parallel import Span, Step


def _event(ev: str, kind: str, micro: int, t: float) -> dict[str, Any]:
    return {"ev": ev, "kind": kind, "micro": micro, "t": t, "case": 1}


def _pass(kind: str, micro: int, start: float, end: float) -> list[dict[str, Any]]:
    return [_event("pass_start", kind, micro, start), _event("pass_end", kind, micro, end)]


def _assert_a_pipeline(step: Step, schedule: str) -> None:
    m = step.micro_batches
    for stage, found in step.timeline.items():
        assert [(s.kind, s.micro) for s in found] == mp.order(schedule, step.stages, stage, m), (stage, found)
        assert all(s.end > s.start >= 0 for s in found)
    first, second = ({(s.kind, s.micro): s for s in step.timeline[r]} for r in (0, 1))
    for i in range(m):  # a stage starts a micro-batch only once its neighbour has sent it
        assert second[("F", i)].start >= first[("F", i)].end - 1e-3
        assert first[("B", i)].start >= second[("B", i)].end - 1e-3
    assert all(0 < idle < 1 for idle in step.idle.values()), step.idle


@pytest.mark.launch
def test_the_exercises_todos_fall_back_on_the_solution_whose_gpipe_is_traced_pass_by_pass(
        capsys: pytest.CaptureFixture[str]) -> None:
    steps = mp.traced_steps("gpipe", (1, 4), script=mp.PIPELINE, width=64, batch_size=64, repeats=1)
    assert "measuring solutions/pipeline_parallel.py's instead" in capsys.readouterr().out
    assert [s.micro_batches for s in steps] == [1, 4]
    for step in steps:
        assert step.stages == 2 and step.schedule == "gpipe"
        _assert_a_pipeline(step, "gpipe")
        assert step.held == {0: step.micro_batches, 1: step.micro_batches}


@pytest.mark.launch
def test_1f1b_traced_holds_at_most_s_minus_r_micro_batches_and_the_table_says_so() -> None:
    steps = mp.traced_steps("1f1b", (4,), script=mp.PIPELINE_SOLUTION, fallback=None, width=64, batch_size=64,
                            repeats=2)
    assert len(steps) == 1  # the least idle of the 2 tries
    _assert_a_pipeline(steps[0], "1f1b")
    assert steps[0].held == {0: 2, 1: 1}
    text = mp.table({"1f1b": steps}, predict=lambda stages, m, chunks=1: 0.25)
    assert text.splitlines()[1].startswith("1f1b") and text.splitlines()[1].endswith("2 1")
    assert "predicted" in text.splitlines()[0] and "25.0%" in text.splitlines()[1]  # the prediction given
    assert " - " in mp.table({"1f1b": steps})  # none given: no number in its place


def test_a_batch_that_does_not_divide_is_refused_before_any_launch() -> None:
    with pytest.raises(ValueError, match="divide"):
        mp.traced_steps("gpipe", (3,), batch_size=64)


def test_the_idle_share_of_made_up_passes() -> None:
    # stage 0 busy 0-1 and 3-4, stage 1 busy 1-3: a step of 4 s, each stage idle half of it
    stage0 = mp.spans(_pass("F", 0, 10.0, 11.0) + _pass("B", 0, 13.0, 14.0), origin=10.0)
    stage1 = mp.spans(_pass("F", 0, 11.0, 13.0), origin=10.0)
    assert stage0 == [Span("F", 0, 0.0, 1.0), Span("B", 0, 3.0, 4.0)]
    assert mp.idle_fraction({0: stage0, 1: stage1}) == {0: pytest.approx(0.5), 1: pytest.approx(0.5)}
    # the step is measured over every stage: a stage that starts late is idle before it starts
    assert mp.idle_fraction({0: [Span("F", 0, 0, 1)], 1: [Span("F", 0, 3, 4)]}) == {0: 0.75, 1: 0.75}
    assert mp.spans(_pass("F", 0, 5.0, 6.0)[:1]) == []  # a pass that never ended
    with pytest.raises(ValueError):
        mp.idle_fraction({0: []})


def test_the_formula_and_the_ideal_schedules_that_it_describes() -> None:
    assert mp.ideal_bubble(2, 1) == pytest.approx(0.5)
    assert mp.ideal_bubble(4, 8) == pytest.approx(3 / 11)
    with pytest.raises(ValueError):
        mp.ideal_bubble(2, 0)
    for schedule in ("gpipe", "1f1b"):
        for stages, m in ((2, 1), (2, 4), (3, 6), (4, 3), (4, 16)):
            step = mp.ideal_step(schedule, stages, m)
            assert step.idle == {r: pytest.approx(mp.ideal_bubble(stages, m)) for r in range(stages)}
            held = {r: m for r in range(stages)} if schedule == "gpipe" else {r: min(stages - r, m) for r in range(stages)}
            assert step.held == held, (schedule, stages, m)
    with pytest.raises(ValueError):
        mp.order("zigzag", 2, 0, 4)


def test_overlap_tells_passes_alone_from_passes_beside_another_stage() -> None:
    step = Step("gpipe", 2, 2, {0: [Span("F", 0, 0, 1), Span("F", 1, 1, 3)], 1: [Span("F", 0, 1, 3)]})
    assert mp.overlap(step) == {"F": (1.0, 2.0)}


def test_the_figures_draw_every_pass_and_rank() -> None:
    steps = [mp.ideal_step("gpipe", 3, 6), mp.ideal_step("1f1b", 3, 6)]
    fig = mp.gantt(steps, unit="")
    assert [len(ax.patches) for ax in fig.axes] == [36, 36]  # 3 stages x 6 micro-batches x 2 passes
    assert {t.get_text() for t in fig.axes[0].texts} >= {"F0", "B5"}
    found = {"gpipe": [mp.ideal_step("gpipe", 2, m) for m in (1, 4)], "1f1b": [mp.ideal_step("1f1b", 2, m) for m in (1, 4)]}
    assert len(mp.bubbles(found, mp.ideal_bubble).axes[0].lines) == 3  # each schedule measured, and the prediction
    assert len(mp.bubbles(found).axes[0].lines) == 2
    assert [len(ax.patches) for ax in mp.activations(found).axes] == [4, 4]  # 2 stages x 2 Ms each
    assert len(mp.tensor_split(2).axes) == 2
    assert len(mp.f_and_g(2).axes[0].patches) >= 10  # x, f, g, y and three boxes per rank


@pytest.mark.launch
def test_an_interleaved_order_traced_from_the_solution_has_a_smaller_bubble_than_1f1b(
        capsys: pytest.CaptureFixture[str]) -> None:
    counted = mp.interleaved_bubbles(2, (2, 4), script=mp.PIPELINE, predict=lambda stages, m, chunks=1: (stages - 1) / (chunks * m + stages - 1))
    out = capsys.readouterr().out
    assert "counting solutions/pipeline_parallel.py's instead" in out  # the exercise's TODO falls back
    assert set(counted) == {2, 4}
    for m, (mine, plain) in counted.items():  # Megatron's order: (S-1)/(vM+S-1) against (S-1)/(M+S-1)
        assert mine == pytest.approx(1 / (2 * m + 1)) and plain == pytest.approx(1 / (m + 1))
    assert f"{1 / 5:12.1%}" in out and f"{1 / 3:11.1%}" in out


def test_the_prediction_is_read_from_the_learners_file_once_it_gives_a_share(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert mp.prediction(mp.PIPELINE) is None  # the TODO returns None
    assert "no prediction yet" in capsys.readouterr().out
    predict = mp.prediction(mp.PIPELINE_SOLUTION)
    assert predict is not None and predict(2, 4) == pytest.approx(0.2) and predict(2, 4, 2) == pytest.approx(1 / 9)
    broken = tmp_path / "broken.py"
    broken.write_text("def bubble_fraction(stages, micro_batches, chunks=1):\n    return 1 / 0\n")
    assert mp.prediction(str(broken)) is None
    assert "ZeroDivisionError" in capsys.readouterr().out
