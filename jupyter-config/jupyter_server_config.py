"""Jupyter Server settings of the DDP Lab's environment.

`make setup` copies this file into .venv/etc/jupyter/, so it applies to every JupyterLab that the
course's environment starts (`make lab`, or `.venv/bin/jupyter lab`), and never to other
environments or to your home folder's settings.

Kernels and terminals get the course's Python first on their PATH: `python -m autograde check`,
`python fashion_mnist.py` and `jupyter`/`nbgrader` are the environment's, not the system's.
"""
import os
import shutil
import sys

c = get_config()  # type: ignore[name-defined]  # noqa: F821 (Jupyter provides it)

BIN = os.path.join(sys.prefix, "bin")
# Kernels inherit the server's environment.
if os.environ.get("PATH", "").split(os.pathsep)[0] != BIN:
    os.environ["PATH"] = os.pathsep.join([BIN, os.environ.get("PATH", "")])

# Terminals: started without a terminal of its own (an editor, a service, a test), Jupyter runs a
# login shell, and a login shell's /etc/profile sets PATH afresh. This bash reads the usual login
# files, then puts the environment's bin/ first again (ddp-lab-terminal.bashrc, next to this file).
BASH = shutil.which("bash")
if BASH:
    c.ServerApp.terminado_settings = {
        "shell_command": [BASH, "--rcfile", os.path.join(sys.prefix, "etc", "jupyter", "ddp-lab-terminal.bashrc"), "-i"]
    }
