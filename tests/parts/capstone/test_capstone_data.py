"""The capstone's data set: the handed-out baseline (which imports nothing of the course) and the
checker cut the same samples from the same files, and the split by file holds."""
from __future__ import annotations

import importlib.util
import zlib
from types import ModuleType

from conftest import ROOT

from autograde.parts.capstone import reports


def _script(relative: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("capstone_lm", ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_baseline_and_the_checker_cut_the_same_samples() -> None:
    for relative in ("exercises/capstone_lm.py", "solutions/capstone_lm.py"):
        lm = _script(relative)
        assert lm.CONTEXT == reports.CONTEXT and lm.SKIP == reports.SKIP
        for split, limit in (("train", 200_001), ("val", 16_385)):
            rows = lm.load_split(split, limit)
            assert [bytes(row.tolist()) for row in rows] == reports.samples(split, limit), (relative, split)


def test_a_file_is_in_one_split_and_about_one_in_twenty_is_for_validation() -> None:
    root, files = reports.sources()
    assert len(files) > 300 and not any(reports.SKIP & set(p.relative_to(root).parts) for p in files)
    val = [p for p in files if zlib.crc32(p.relative_to(root).as_posix().encode()) % reports.VAL_MODULUS == 0]
    assert 0.02 < len(val) / len(files) < 0.1
    first = val[0].read_bytes()
    assert reports.split_bytes("val", len(first)) == first  # the validation split starts with its first file
    assert first[:200] not in reports.split_bytes("train", 3_000_000)


def test_consecutive_samples_share_one_byte_and_the_key_reads_the_inputs_alone() -> None:
    rows = reports.samples("train", 10_000)
    assert len(rows) == (10_000 - 1) // reports.CONTEXT and all(len(r) == reports.CONTEXT + 1 for r in rows)
    assert all(a[-1] == b[0] for a, b in zip(rows, rows[1:]))
    assert reports.key(rows[0]) == reports.key(rows[0][:-1]) != reports.key(rows[1])
