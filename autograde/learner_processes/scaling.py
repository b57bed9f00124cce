"""Part scaling (notebooks 17-19) inside the learner's processes: the step tracing its checks read,
and the task that calls a learner's plain functions.

- With $DDP_LAB_TRACE_STEPS=1, a "step" event after every optimizer step: its number, each
  parameter group's learning rate, and the images the DDP model was given in training mode since
  the last step. With $DDP_LAB_STOP_AT_STEP=K, every process records its parameters after step K
  and ends: the runs of a speed comparison stop at the same point.
- `calls` (no process group; also part launching's slurm_env): this process imports the file and
  calls each named function with the JSON arguments given (an object whose keys are all whole
  numbers becomes a dict with int keys: {N: seconds}), in order, and writes what each returned, or
  the error it raised, as a `CallsReport` in `DIR/1-0.json`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autograde.learner_processes import tracer
from autograde.learner_processes.tracer import json_value, learner_module, short_error
from autograde.protocol import STOP_AT_STEP, TRACE_STEPS, Call, CallsReport

_images = [0]  # images given to the DDP model in training mode since the last optimizer step


def _count_images(module: Any, args: Any) -> None:
    if module.training and args and hasattr(args[0], "shape") and len(args[0].shape) > 0:
        _images[0] += int(args[0].shape[0])


def _step(optimizer: Any) -> None:
    if os.environ.get(TRACE_STEPS) == "1":
        tracer.emit("step", n=tracer.optimizer_steps(), lrs=[float(g["lr"]) for g in optimizer.param_groups],
                    images=_images[0])
        _images[0] = 0
    if os.environ.get(STOP_AT_STEP) and tracer.optimizer_steps() == int(os.environ[STOP_AT_STEP]):
        tracer.record_parameters("stopped")
        sys.stdout.flush()
        os._exit(0)  # every rank stops after the same step, with no collective left open


def install() -> None:
    """Trace every optimizer step, and stop after the one asked for, when the checker asks."""
    if os.environ.get(TRACE_STEPS) == "1":
        tracer.hook("ddp", lambda model: model.register_forward_pre_hook(_count_images))
    if os.environ.get(TRACE_STEPS) == "1" or os.environ.get(STOP_AT_STEP):
        tracer.hook("optimizer_step", _step)


def _argument(value: Any) -> Any:
    """A JSON argument as the learner's function gets it: {"1": 2.0} -> {1: 2.0}."""
    if isinstance(value, dict):
        whole = all(isinstance(k, str) and k.lstrip("-").isdigit() for k in value)
        return {(int(k) if whole else k): _argument(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_argument(v) for v in value]
    return value


def calls(options: argparse.Namespace) -> None:
    report = CallsReport(1, 0)
    try:
        module = learner_module(options.script)
    except BaseException as err:
        report.error = short_error(err, options.script)
    else:
        for name, args in json.loads(options.calls):
            call = Call(name, args)
            try:
                call.value = json_value(getattr(module, name)(*_argument(args)))
            except BaseException as err:  # one wrong function: the others are still judged
                call.error = short_error(err, options.script)
            report.calls.append(call)
    Path(options.out, "1-0.json").write_text(json.dumps(asdict(report)))
