"""The task every part may ask for (protocol.CallsTask), with no process group: this process
imports the learner's file and calls each named function with the JSON arguments given (an object
whose keys are all whole numbers becomes a dict with int keys: {N: seconds}), in order, and writes
what each returned, or the error it raised, as a `CallsReport` in `DIR/1-0.json`."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autograde.inprocess.learner_file import json_value, learner_module, short_error
from autograde.protocol import Call, CallsReport, CallsTask, performs


def _argument(value: Any) -> Any:
    """A JSON argument as the learner's function gets it: {"1": 2.0} -> {1: 2.0}."""
    if isinstance(value, dict):
        whole = all(isinstance(k, str) and k.lstrip("-").isdigit() for k in value)
        return {(int(k) if whole else k): _argument(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_argument(v) for v in value]
    return value


@performs(CallsTask)
def calls(options: CallsTask, out: str) -> None:
    report = CallsReport(1, 0)
    try:
        module = learner_module(options.script)
    except BaseException as err:
        report.error = short_error(err, options.script)
    else:
        for name, args in options.calls:
            call = Call(name, args)
            try:
                call.value = json_value(getattr(module, name)(*_argument(args)))
            except BaseException as err:  # one wrong function: the others are still judged
                call.error = short_error(err, options.script)
            report.calls.append(call)
    Path(out, "1-0.json").write_text(json.dumps(asdict(report)))
