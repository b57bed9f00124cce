"""Support code of the DDP Lab: the step checks, stand-in data, and launching scripts.

Nothing here is imported by the learner's script: the lab's scripts are plain PyTorch, and
this package only ever runs them as separate processes.

    import autograde
    autograde.assert_step(4)            # raises autograde.CheckFailed with what is wrong
    autograde.progress()                # every step at once

The names below are loaded on first use, not when the package is imported: `python -m
autograde.data` (or any other module run as a program) must not find itself imported already.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["assert_step", "check_steps", "progress", "CheckFailed"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.grading.api"), name)
    raise AttributeError(f"module 'autograde' has no attribute {name!r}")
