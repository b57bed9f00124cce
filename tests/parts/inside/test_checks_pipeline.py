"""The pipelines' checks' own arithmetic (autograde/parts/inside/checks_pipeline.py), on made-up
orders: 1F1B's three requirements leave exactly one order per stage, the idle count of an order,
and what it says of interleaved orders. The checks themselves are replayed on recorded runs
(tests/core/test_checks_recorded.py)."""
from __future__ import annotations

import itertools

import pytest

from autograde.engine.verdicts import Failed
from autograde.parts.inside import checks_pipeline as cp
from autograde.parts.inside import notebook_model_parallel as mp


def _orders(m: int) -> list[list[cp.Pass]]:
    """Every order of m forward and m backward passes, each kind in micro-batch order, no backward
    pass before its forward pass."""
    found = []
    for forwards in itertools.combinations(range(2 * m), m):
        order, f, b = [], 0, 0
        for k in range(2 * m):
            if k in forwards:
                order.append(("F", 0, f))
                f += 1
            elif b < f:
                order.append(("B", 0, b))
                b += 1
            else:
                break
        if len(order) == 2 * m:
            found.append(order)
    return found


@pytest.mark.parametrize("stages,m", [(2, 1), (2, 4), (3, 3), (3, 6), (4, 5)])
def test_1f1bs_requirements_leave_exactly_its_order_on_every_stage(stages: int, m: int) -> None:
    for stage in range(stages):
        passing = []
        for order in _orders(m):
            try:
                cp._judge_1f1b_order("here", order, stages, stage, m)
                passing.append(order)
            except Failed:
                pass
        assert passing == [[(k, 0, i) for k, i in cp.one_f_one_b_order(stages, stage, m)]]


def test_the_requirement_broken_is_the_one_named() -> None:
    with pytest.raises(Failed, match="that is GPipe's order"):
        cp._judge_1f1b_order("here", [("F", 0, i) for i in range(4)] + [("B", 0, i) for i in range(4)], 2, 0, 4)
    with pytest.raises(Failed, match="started F2 while holding 2"):
        cp._judge_1f1b_order("here", [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("B", 0, 0), ("B", 0, 1), ("F", 0, 3),
                                      ("B", 0, 2), ("B", 0, 3)], 2, 0, 4)
    with pytest.raises(Failed, match="waits, idle"):
        cp._judge_1f1b_order("here", [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)], 2, 0, 2)


def test_the_idle_count_of_the_ideal_orders_is_the_notebooks_and_shrinks_by_the_chunks() -> None:
    for stages, m in ((2, 1), (2, 4), (3, 6), (4, 16)):
        plain = {s: [(k, 0, i) for k, i in cp.one_f_one_b_order(stages, s, m)] for s in range(stages)}
        assert cp.idle_slots(plain) == pytest.approx(mp.ideal_step("1f1b", stages, m).mean_idle)
        assert cp.idle_slots(plain) == pytest.approx(mp.ideal_bubble(stages, m))
    for stages, m, v in ((2, 4, 2), (3, 6, 2), (4, 8, 2), (3, 6, 3), (4, 8, 4)):
        assert cp.ideal_bubble(stages, m, v) == pytest.approx((stages - 1) / (v * m + stages - 1))
        for s in range(stages):  # every chunk's passes once, in order
            order = cp.interleaved_order(stages, s, m, v)
            for c in range(v):
                assert [i for k, j, i in order if k == "F" and j == c] == list(range(m))
                assert [i for k, j, i in order if k == "B" and j == c] == list(range(m))


def test_an_interleaved_order_without_pipelining_counts_a_larger_bubble_and_a_cycle_is_refused() -> None:
    stages, m = 2, 4
    plain = cp.idle_slots({s: [(k, 0, i) for k, i in cp.one_f_one_b_order(stages, s, m)] for s in range(stages)})
    # one micro-batch at a time, forward through both chunks and back: valid, and slower than 1F1B
    one_by_one = [p for i in range(m) for p in (("F", 0, i), ("F", 1, i), ("B", 1, i), ("B", 0, i))]
    assert cp.idle_slots({0: one_by_one, 1: one_by_one}, cp.CHUNKS) > plain
    # the backward passes through the chunks first to last: each rank waits for the other
    wrong = [p for i in range(m) for p in (("F", 0, i), ("F", 1, i), ("B", 0, i), ("B", 1, i))]
    with pytest.raises(ValueError, match="wait on each other"):
        cp.idle_slots({0: wrong, 1: wrong}, cp.CHUNKS)
