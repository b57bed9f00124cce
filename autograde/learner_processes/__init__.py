"""Code that runs inside the learner's processes, never in the checker's own.

The checker (autograde/checker/) starts every process of a run with `_startup/` on PYTHONPATH, so
Python loads `tracer.py` first: it records what the learner's program does, as the events that
autograde/protocol.py lists. The task runners call a learner's functions in real process groups
(`python -m autograde.learner_processes.tasks`), and `lab.py` drives the core lab's script
(`python -m autograde.learner_processes.lab`). What they write back, and every name both sides
must agree on, is in autograde/protocol.py; nothing here imports the checker.
"""
