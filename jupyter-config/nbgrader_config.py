"""nbgrader settings of the DDP Lab's environment, for the Validate button in JupyterLab.

`make setup` copies this file into .venv/etc/jupyter/, where the Validate button's server
extension reads it. A check cell runs the learner's script for real, several processes at a
time, and takes longer than nbgrader's default 30 s per cell when its verdict is not kept yet:
Validate gets the same 30 minutes per cell as grading (autograde/course/nbgrader_config.py).
"""
c = get_config()  # type: ignore[name-defined]  # noqa: F821 (nbgrader provides it)

c.Execute.timeout = 1800
