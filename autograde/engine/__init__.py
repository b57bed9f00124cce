"""The checker's engine, which knows no part: a workspace that launches a learner's file as
separate, traced processes and keeps each run (workspace.py, run.py), the processes themselves
(processes.py), what a check raises and how a verdict reads (verdicts.py), and digests of the
course's code (code.py)."""
