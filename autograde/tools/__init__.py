"""Commands for maintainers and instructors, each run as `python -m autograde.tools.<name>`
(the Makefile's targets call them): `make run`, `make bench`, `make gpu-check`, the notebooks
under nbval, and recording the runs the check tests replay."""
