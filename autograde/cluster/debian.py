"""Debian packages the course's tests and tools need beyond Python's (SLURM, munge, Open MPI),
installed with apt-get where they are missing and this runs as root, as `.ci/run` does for Chromium."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

SBIN = (Path("/usr/sbin"), Path("/sbin"))  # daemons live here, off an ordinary user's PATH


def missing(commands: Sequence[str]) -> list[str]:
    """The commands of `commands` found neither on PATH nor among the daemons."""
    return [c for c in commands if shutil.which(c) is None and not any((d / c).exists() for d in SBIN)]


def _apt_get(packages: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def install(packages: Sequence[str], commands: Sequence[str]) -> str | None:
    """Install `packages` unless every one of `commands` is already there; None when they are
    there afterwards, else one line that says why not and what to run."""
    if not missing(commands):
        return None
    wanted = f"apt-get install {' '.join(packages)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{', '.join(missing(commands))} not installed, and this is not root with apt-get: {wanted}"
    result = _apt_get(packages)
    if result.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=900)
        result = _apt_get(packages)
    if result.returncode != 0 or missing(commands):
        last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"{wanted} failed: {last[0]}"
    return None
