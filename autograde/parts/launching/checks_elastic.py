"""The check of the item "elastic" (notebook 15, exercises/elastic_predictions.py): the learner's
predictions of what elastic torchrun does when a node joins and when one is lost, called in a
process of their own (CallsTask) for several scenarios and compared with `outcome`: what the
course's real runs of those scenarios measured. tests/parts/launching/test_elastic.py runs the
scenarios for real (autograde/parts/launching/notebook_elastic.py) and asserts that they did what
`outcome` says, so the two cannot drift apart."""
from __future__ import annotations

from typing import Any, Literal

from autograde.engine.verdicts import function_calls, require
from autograde.engine.workspace import RunKind, Workspace
from autograde.protocol import Call, CallsTask

ELASTIC_RUNS = RunKind("elastic")

Scenario = Literal["node_joins", "node_lost"]
# (epochs, after_epoch): notebook 15's runs (6 epochs; B joins after epoch 1, is lost after epoch 2) and others
SCENARIOS: list[tuple[Scenario, int, int]] = [("node_joins", 6, 1), ("node_joins", 9, 4), ("node_lost", 6, 2),
                                              ("node_lost", 5, 1), ("node_lost", 10, 7)]
# What each key means, in the words of the failing verdict
WHY = {
    ("node_joins", "world_sizes"): "a node that arrives waits for the next round: torchrun stops A's worker and "
                                   "starts a group of both, so two lives, of 1 and then 2",
    ("node_joins", "restarts"): "a node that joins is no failure: torchrun's count of failures stays 0 in both lives",
    ("node_joins", "resumes_at"): "the new group loads the last complete checkpoint and trains the epoch after it: "
                                  "at the earliest, the one after the epoch rank 0 had finished when B started",
    ("node_joins", "rank_of_b"): "each round hands out the ranks in the order of the nodes' addresses, and B's "
                                 "(127.0.0.2) comes after A's",
    ("node_lost", "world_sizes"): "the rendezvous lets B's seat go once it misses its heartbeats, and closes the "
                                  "round with A alone (one node is enough): lives of 2, then 1",
    ("node_lost", "restarts"): "A's worker fails in its next collective with B: a failure, which torchrun counts "
                               "(1 in the second life)",
    ("node_lost", "resumes_at"): "the checkpoint of epoch after_epoch was complete when B was killed: the "
                                 "survivor loads it and goes on with the epoch after it",
    ("node_lost", "rank_of_a"): "alone in its group, A's worker is rank 0",
}


def outcome(scenario: Scenario, epochs: int, after_epoch: int) -> dict[str, Any]:
    """What the course's runs of a scenario did (the join's resumes_at: the earliest it can be)."""
    if scenario == "node_joins":
        return {"world_sizes": [1, 2], "restarts": [0, 0], "resumes_at": after_epoch + 1, "rank_of_b": 1}
    return {"world_sizes": [2, 1], "restarts": [0, 1], "resumes_at": after_epoch + 1, "rank_of_a": 0}


def _plain(value: Any) -> Any:
    """A returned int, float equal to an int, or list of them, as ints; anything else as it came."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _calls(ws: Workspace) -> list[Call]:
    calls = [[scenario, [epochs, after_epoch]] for scenario, epochs, after_epoch in SCENARIOS]
    run = ws.called(ELASTIC_RUNS, "calls", "calls of node_joins and node_lost",
                    CallsTask(script=str(ws.script), calls=calls))
    return function_calls(run)


def check_elastic(ws: Workspace) -> str:
    """node_joins(epochs, after_epoch) and node_lost(epochs, after_epoch), for notebook 15's two
    scenarios and three others, each return a dict whose world_sizes, restarts, resumes_at and
    rank_of_b (a join) or rank_of_a (a loss) are what the course's real runs did (`outcome`).
    Lists or tuples, ints or whole floats; other keys are ignored."""
    for (scenario, epochs, after_epoch), call in zip(SCENARIOS, _calls(ws)):
        shown = f"{scenario}({epochs}, {after_epoch})"
        require(call.error is None, f"{shown} raised {call.error}",
                f"{scenario} returns a dict of its prediction for any scenario")
        require(isinstance(call.value, dict), f"{shown} returned {call.value!r}, not a dict",
                f"{scenario} returns a dict with the keys the file's docstring names")
        want = outcome(scenario, epochs, after_epoch)
        for key, expected in want.items():
            require(key in call.value, f"{shown} has no {key!r} (it has {sorted(call.value)})",
                    f"{scenario} returns a dict with the keys the file's docstring names")
            got = _plain(call.value[key])
            require(got == expected, f"{shown} predicted {key} = {got!r}; the course's runs measured {expected!r}: "
                    f"{WHY[scenario, key]}", "reread notebook 15's section on how torchrun rebuilds the group, "
                    "then predict again")
    return ("the predictions match the real runs: a node that joins gives lives of 1 then 2, no failure counted, "
            "going on after the last checkpoint with B as rank 1; a lost node leaves A alone as rank 0, one "
            f"failure counted, going on after the last checkpoint ({len(SCENARIOS)} scenarios)")
