"""The trace and report formats (autograde/protocol.py) are what the writers write and
what the readers read: every recorded run conforms to them, and every field in them is read."""
from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path

import pytest

from autograde import paths
from autograde import protocol as formats
from autograde.tools.record_runs import OUT

RECORDINGS = sorted(OUT.glob("*.json.gz"))
# The code that reads traces and reports: the checks, and the tests that prove something with a
# field (visible_devices: each simulated node's GPUs, on a machine without any). The writers,
# tracer and harness, are not readers.
READERS = [p for p in (paths.REPO / "autograde").glob("check*/**/*.py")
           if p.name not in ("tracer.py", "harness.py", "formats.py")] + \
          [p for p in (paths.REPO / "tests").glob("test_*.py") if p.name != "test_formats.py"]


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name.split(".")[0] for p in RECORDINGS])
def test_recorded_runs_conform_to_the_formats(path: Path) -> None:
    """What the tracer and the harness wrote in a real run has exactly the listed fields."""
    runs = json.loads(gzip.decompress(path.read_bytes()))["runs"]
    for name, run in runs.items():
        for events in run["traces"].values():
            for e in events:
                assert e["ev"] in formats.EVENTS, f"{name}: an event formats.EVENTS does not list: {e}"
                extra = set(e) - set(formats.COMMON) - set(formats.EVENTS[e["ev"]])
                assert not extra, f"{name}: {e['ev']} has fields formats.EVENTS does not list: {extra}"
        if name == "setup" and run["report"] is not None:
            formats.Setup(**run["report"])
        if name == "workers" and run["report"] is not None:
            formats.Workers.from_json(run["report"])
            assert set(run["report"]) <= {f.name for f in dataclasses.fields(formats.Workers)}


def test_every_field_of_the_formats_is_read() -> None:
    """Nothing is traced or reported that no check reads (an unread field is only cost)."""
    code = "\n".join(p.read_text() for p in READERS)
    trace_fields = {f for fields in formats.EVENTS.values() for f in fields}
    unread = sorted(f for f in trace_fields if not re.search(rf"[\"']{f}[\"']", code))
    assert not unread, f"trace fields nothing reads: {unread}"
    for kind in (formats.Setup, formats.Child):
        unread = [f.name for f in dataclasses.fields(kind) if not re.search(rf"\.{f.name}\b", code)]
        assert not unread, f"{kind.__name__} fields nothing reads: {unread}"


def test_the_recordings_are_there() -> None:
    assert len(RECORDINGS) > 20, "record them: python -m autograde.tools.record_runs"
