"""Code that runs inside the learner's processes, never in the checker's own.

The checker (autograde/checker/) starts every process of a run with `_startup/` on PYTHONPATH, so
Python loads `_startup/sitecustomize.py` first: it installs `tracer.py` (what the learner's program
does, as the events that autograde/protocol.py lists) and what each part adds to it. A module per
part, named as in autograde/checks/: `lab.py` drives the core lab's script (`python -m
autograde.learner_processes.lab`) and stages its download; `talk.py`, `scaling.py` and `inside.py`
hold the tasks that call a learner's functions in real process groups (started by `python -m
autograde.learner_processes.tasks TASK`), and what their runs trace; `launching.py` traces
checkpoints, injects faults and runs the SLURM jobs' tasks. What they write back, and every name
both sides must agree on, is in autograde/protocol.py; nothing here imports the checker.
"""
