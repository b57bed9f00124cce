"""The learner's file, for the functions that perform a part's tasks: imported as a module, its
errors said in one line, its values as JSON."""
from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from types import ModuleType
from typing import Any

from autograde.settings import SCRIPT


def learner_module(script: str) -> ModuleType:
    """The learner's file imported as a module (its `if __name__ == "__main__":` block does not run)."""
    spec = importlib.util.spec_from_file_location("learner_exercise", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def short_error(err: BaseException, script: str | None = None) -> str:
    """`TypeError: ... (line 40)`: the error, at the last line of the learner's script (default:
    $DDP_LAB_SCRIPT) that it passed through."""
    script = script or os.environ.get(SCRIPT)
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if script and os.path.abspath(f.filename) == os.path.abspath(script)]
    where = f" (line {frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {err}{where}"[:400]


def json_value(value: Any) -> Any:
    """A learner's value (a prediction, what a function returned) as JSON: numbers (numpy and 0-d
    tensors too), lists (tuples, arrays, tensors), dicts with string keys; anything else as its repr."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k.item() if hasattr(k, "item") else k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
