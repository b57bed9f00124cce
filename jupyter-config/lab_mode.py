"""Learner or instructor mode of the course environment's JupyterLab (`make learner-mode`, `make instructor-mode`).

    python jupyter-config/lab_mode.py learner|instructor [--level sys_prefix|user]
    python jupyter-config/lab_mode.py setup      # what `make setup` runs: the mode chosen before, else learner

Learner mode, the default, hides nbgrader's instructor tools: the Formgrader, Create Assignment and
Course List plugins are disabled and their server extensions off. The assignment list and the Validate
button stay. Instructor mode turns the tools on. Restart JupyterLab after switching.

The default level is the environment's own config (`sys_prefix`: <env>/etc/jupyter), which also remembers
the choice in <env>/etc/jupyter/ddp-lab-mode for `make setup`. `user` writes your own Jupyter config
($JUPYTER_CONFIG_DIR, else ~/.jupyter) instead; Jupyter running in a virtual environment reads it only
after the environment's config, unless JUPYTER_PREFER_ENV_PATH=0 (as the tests do).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from jupyter_core import paths
from jupyter_server.extension.config import ExtensionConfigManager
from jupyterlab_server.config import get_static_page_config, write_page_config

INSTRUCTOR_PLUGINS = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:course-list"]
INSTRUCTOR_SERVER_EXTENSIONS = ["nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list"]
MODE_FILE = Path(sys.prefix, "etc", "jupyter", "ddp-lab-mode")
MODES = ("learner", "instructor")


def config_dir(level: str) -> str:
    return paths.ENV_CONFIG_PATH[0] if level == "sys_prefix" else paths.jupyter_config_dir()


def switch(mode: str, level: str) -> None:
    on = mode == "instructor"
    # What `jupyter labextension enable/disable --level=...` writes, but stated at this level whatever the
    # other levels say, and never locked: `disable` locks plugins that were disabled before (JupyterLab
    # 4.1+), and a lock in the environment would stop `--level user` from switching them.
    page_config = get_static_page_config(level=level)
    for plugin in INSTRUCTOR_PLUGINS:
        page_config.setdefault("disabledExtensions", {})[plugin] = not on
        page_config.setdefault("lockedExtensions", {})[plugin] = False
    write_page_config(page_config, level=level)
    # What `jupyter server extension enable/disable` writes; that command refuses (and exits 0) at a level
    # whose config does not list the extension yet, such as a fresh user config.
    folder = config_dir(level)
    manager = ExtensionConfigManager(read_config_path=[folder],
                                     write_config_dir=os.path.join(folder, "jupyter_server_config.d"))
    for name in INSTRUCTOR_SERVER_EXTENSIONS:
        (manager.enable if on else manager.disable)(name)
    if level == "sys_prefix":
        MODE_FILE.parent.mkdir(parents=True, exist_ok=True)
        MODE_FILE.write_text(mode + "\n")
    tools = "formgrader, create assignment and course list are on" if on else "nbgrader's instructor tools are off"
    print(f"{mode} mode ({folder}): {tools}; restart JupyterLab to see it")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Learner or instructor mode of the course's JupyterLab.")
    parser.add_argument("mode", choices=[*MODES, "setup"])
    parser.add_argument("--level", choices=["sys_prefix", "user"], default="sys_prefix")
    args = parser.parse_args(argv)
    mode, level = args.mode, args.level
    if mode == "setup":
        chosen = MODE_FILE.read_text().strip() if MODE_FILE.is_file() else ""
        mode, level = (chosen if chosen in MODES else "learner"), "sys_prefix"
    switch(mode, level)


if __name__ == "__main__":
    main()
