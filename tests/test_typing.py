"""The support package is typed, and mypy agrees with its annotations."""
from __future__ import annotations

from autograde import processes
from conftest import ROOT


def test_autograde_passes_mypy() -> None:
    result = processes.run([processes.PYTHON, "-m", "mypy", "--ignore-missing-imports", "autograde"], timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.output
