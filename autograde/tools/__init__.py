"""Commands for maintainers and instructors, each run as `python -m autograde.tools.<name>`
(the Makefile's targets call them): `make run`, `make bench`, `make gpu-check`, the notebooks
under nbval, a real SLURM of emulated nodes (`slurm_cluster`: make slurm-up), the Debian packages
they need (`debian`, `open_mpi`). The recorder of the runs the check tests
replay is the tests' own: tests/record_runs.py."""
