"""Save a checkpoint when SLURM says the time is nearly up, then end cleanly.

`#SBATCH --signal=USR1@120` asks SLURM to send SIGUSR1 to the job's tasks about 120 seconds before
its time limit. That signal only helps a task that handles it: Python's default action for SIGUSR1,
as for any process, is to terminate at once, with nothing saved. This file is the pattern: the
handler only sets a flag, and the training loop, between two steps, saves and exits.

Here the "training" is a counter and a sleep, so that the pattern is all there is to read (and so
that the course's test, tests/parts/launching/test_slurm_signal.py, runs it in a second).

    sbatch demos/slurm/save_on_usr1.sbatch --checkpoint ckpt.json
    scancel --signal=USR1 JOBID       (or let its #SBATCH --signal=USR1@120 send it before the limit)

--no-handler runs the same loop without the handler: the signal then ends the task.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

stop_requested = False


def request_stop(signum: int, frame: object) -> None:
    # Only a flag: a handler runs between two bytecodes of whatever the loop was doing, so saving
    # here could write a half-updated model. The loop looks at the flag where the state is whole.
    global stop_requested
    stop_requested = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--no-handler", action="store_true", help="leave SIGUSR1 to its default action")
    args = parser.parse_args()
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))  # torchrun's, else srun's
    checkpoint = args.checkpoint.with_name(f"{args.checkpoint.stem}-{rank}{args.checkpoint.suffix}")

    if not args.no_handler:
        signal.signal(signal.SIGUSR1, request_stop)
    step = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else 0
    print(f"task {rank}: starting at step {step}", flush=True)

    while step < args.steps:
        time.sleep(args.step_seconds)  # one training step
        step += 1
        if stop_requested:
            checkpoint.write_text(json.dumps({"step": step}))  # torch.save(model and optimizer state, ...)
            print(f"task {rank}: SIGUSR1, saved step {step} to {checkpoint.name}, exiting", flush=True)
            return
    print(f"task {rank}: finished all {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
