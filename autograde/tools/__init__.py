"""Commands for maintainers and instructors, each run as `python -m autograde.tools.<name>` (the
Makefile's targets call them): `make run`, `make bench`, `make gpu-check`, and the notebooks under
nbval. (A real SLURM, `make slurm-up`, is `python -m autograde.cluster.slurm`.) The recorder of
the runs the check tests replay is the tests' own: tests/record_runs.py."""
