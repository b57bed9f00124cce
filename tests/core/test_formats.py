"""The trace and report formats (autograde/protocol.py) are what the writers write: every recorded
run conforms to them, and every field they list is written in some recorded run (a listed field
that no run writes is dead, or its writer is broken). The recordings' being all there, and no
more, is tests/core/test_checks_recorded.py's."""
from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from record_runs import OUT

from autograde import parts
from autograde import protocol as formats
from autograde.parts.lab.reports import Child, Setup, Workers

RECORDINGS = sorted(OUT.glob("*.json.gz"))
# Events that only a run on GPUs writes: the recordings are made on CPUs (torch.cuda.set_device is
# traced, and the lab calls it, only where there is a GPU).
GPU_ONLY_EVENTS = {"set_device"}
# Every event a trace may hold: the core's, and each part's own (its reports.py)
EVENTS = dict(formats.EVENTS)
for module in parts.of_role("reports"):
    assert not set(EVENTS) & set(getattr(module, "EVENTS", {})), f"{module.__name__} names an event again"
    EVENTS.update(getattr(module, "EVENTS", {}))


def runs(path: Path) -> dict[str, Any]:
    return dict(json.loads(gzip.decompress(path.read_bytes()))["runs"])


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name.split(".")[0] for p in RECORDINGS])
def test_recorded_runs_conform_to_the_formats(path: Path) -> None:
    """What the tracer and the harness wrote in a real run has exactly the listed fields."""
    for name, run in runs(path).items():
        for events in run["traces"].values():
            for e in events:
                assert e["ev"] in EVENTS, f"{name}: an event EVENTS does not list: {e}"
                extra = set(e) - set(formats.COMMON) - set(EVENTS[e["ev"]])
                assert not extra, f"{name}: {e['ev']} has fields EVENTS does not list: {extra}"
        if name == "setup" and run["report"] is not None:
            Setup(**run["report"])
        if name == "workers" and run["report"] is not None:
            formats.decode(Workers, run["report"])
            assert set(run["report"]) <= {f.name for f in dataclasses.fields(Workers)}


def test_every_field_the_formats_list_is_written_in_some_recorded_run() -> None:
    """Every event kind, with each of its fields, and every field of the setup and workers reports
    (Setup, Workers, Child), appears in at least one recording: nothing is listed that no run writes."""
    assert RECORDINGS, f"no recordings in {OUT}"
    events: dict[str, set[str]] = {}
    reports: dict[type, set[str]] = {Setup: set(), Workers: set(), Child: set()}
    for path in RECORDINGS:
        for name, run in runs(path).items():
            for trace in run["traces"].values():
                for e in trace:
                    events.setdefault(e["ev"], set()).update(e)
            report = run["report"]
            if name == "setup" and report is not None:
                reports[Setup] |= set(report)
            if name == "workers" and report is not None:
                reports[Workers] |= set(report)
                for setup in report.get("setups", []):
                    reports[Setup] |= set(setup)
                for child in report.get("children", []):
                    reports[Child] |= set(child)
    never = sorted(set(EVENTS) - set(events) - GPU_ONLY_EVENTS)
    assert not never, f"event kinds that no recorded run wrote: {never}"
    assert not GPU_ONLY_EVENTS & set(events), "a GPU-only event was recorded: take it out of GPU_ONLY_EVENTS"
    unwritten = {ev: sorted({*formats.COMMON, *fields} - events[ev]) for ev, fields in EVENTS.items()
                 if ev in events and {*formats.COMMON, *fields} - events[ev]}
    assert not unwritten, f"fields of events that no recorded run wrote: {unwritten}"
    for kind, written in reports.items():
        unwritten_fields = sorted({f.name for f in dataclasses.fields(kind)} - written)
        assert not unwritten_fields, f"{kind.__name__} fields that no recorded run wrote: {unwritten_fields}"
