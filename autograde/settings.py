"""The course's settings, each written once: where its files are, and every environment variable
the course reads or sets ($DDP_LAB_*), with what it means. Both sides of the process boundary
import this module (the checker sets a variable, the learner's processes read it); it imports
nothing of the course.

A part's own variables are here too, under its heading: a variable is a name shared by every
process that reads or sets it, and a name spelled in two places drifts."""
from __future__ import annotations

import os
from pathlib import Path

# --- Where the course's files are -------------------------------------------------------------
PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parent
SOLUTIONS = REPO / "solutions"
SOLUTION = SOLUTIONS / "fashion_mnist_after_step_10.py"  # the finished lab
STARTER = REPO / "fashion_mnist.py"
NOTEBOOKS = REPO / "notebooks"
# The folder the checker puts first on PYTHONPATH: its sitecustomize.py starts the tracing
STARTUP = PACKAGE / "inprocess" / "_startup"
# What the checker runs in a process of its own to call a learner's functions (a part's task)
RUNNER = PACKAGE / "inprocess" / "runner.py"
# The warm-start server a launch's Python processes are forked from (inprocess/warm_start.py)
WARM_START = PACKAGE / "inprocess" / "warm_start_server.py"

# --- Set by whoever runs the course (a learner, a grader, CI, the class hub) ---------------------
QUICK = "DDP_LAB_QUICK"  # not "" or "0": every notebook run is tiny (`make test`, `make grade`)
QUICK_DATA = "DDP_LAB_QUICK_DATA"  # where quick mode's small stand-in data set is kept
DATA_DIR = "DDP_LAB_DATA_DIR"  # where real Fashion-MNIST is (else the course's data/)
COURSE_DIR = "DDP_LAB_COURSE_DIR"  # nbgrader's course folder (default: grading/ in the repository)
CACHE_DIR = "DDP_LAB_CACHE_DIR"  # where kept verdicts are (default: ddp-lab-verdicts-<uid> in the temporary folder)
FRESH = "DDP_LAB_FRESH"  # set to 1: every check runs the script again (for graders and notebooks alike)
EXCHANGE = "DDP_LAB_EXCHANGE"  # nbgrader's exchange folder, shared by a class
CLASS = "DDP_LAB_CLASS"  # the class hub's settings file (default deploy/jupyterhub/class.toml)
CLASS_COURSE = "DDP_LAB_CLASS_COURSE"  # set by the hub's spawner: the course a user's server copies
GRADING = "DDP_LAB_GRADING"  # set in the grading sandbox (autograde/course/sandbox.py): a verdict that cannot apply there is no pass
ROLE = "DDP_LAB_ROLE"  # set by the hub's spawner: "learner" or "instructor"
HOST = "DDP_LAB_HOST"  # set by mpirun's ssh stand-in: the emulated host a process runs on
# Set by the hub's local spawner for a learner's server when the class's [local] checks_at_once > 0:
# the node's line of checks (autograde/grading/turns.py), a folder its learners share, and how many
# checks run at once; unset, a check starts at once
CHECK_QUEUE = "DDP_LAB_CHECK_QUEUE"
CHECKS_AT_ONCE = "DDP_LAB_CHECKS_AT_ONCE"

# --- The environment the checker gives every process it launches --------------------------------
TRACE_DIR = "DDP_LAB_TRACE_DIR"  # set: trace this process (and its children) into this folder
SCRIPT = "DDP_LAB_SCRIPT"  # the learner's file: lines are reported in it, errors at its last line
STAGING = "DDP_LAB_STAGING"  # set: a Fashion-MNIST "download" copies the stand-in from this folder
# In the environment of every process a launch starts, and of their children: the launch's mark
# (marks of launches inside launches, joined with ":")
LAUNCH_MARK = "DDP_LAB_LAUNCH"
# "0": the learner's mp.spawn starts each process cold (a new interpreter that imports torch), as
# untraced; otherwise each is forked from a server that has imported it (tracer.py, _warm_start)
WARM_SPAWN = "DDP_LAB_WARM_SPAWN"
# The folder of a warm-start server (inprocess/warm_start.py): a traced Python process whose
# environment names one is forked from it, torch imported, instead of importing torch itself. Each
# process it forks leads a process group of its own, registered in <folder>/groups/<group>, the file
# holding the launch's mark (LAUNCH_MARK), while a process of the group is left. "off": none.
WARM_SERVER = "DDP_LAB_WARM_SERVER"
# In a server's folder: its socket, the groups it registered, and a JSON line per request it answered
# ({"cold": why or null, "command": the first arguments})
WARM_SOCKET, WARM_GROUPS, WARM_LOG = "socket", "groups", "log"
WARM_DEBUG = "DDP_LAB_WARM_DEBUG"  # set: a process that starts cold says why on stderr

# --- What a part's checks ask of the learner's processes -----------------------------------------
COUNT_WORK = "DDP_LAB_COUNT_WORK"  # talk: set to 1, count the elements every PyTorch operation computes
# launching: faults injected into the first life of a torchrun group
KILL_AT_STEP = "DDP_LAB_KILL_AT_STEP"  # "<rank>:<n>": SIGKILL that rank right after its n-th optimizer step
# "<rank>:<n>:<checkpoint>": that rank's first torch.save once n - 1 checkpoints are complete (written
# straight into the file <checkpoint>, or renamed onto it) writes half its file, then SIGKILL: a kill during
# the n-th checkpoint, however many files a checkpoint takes
TEAR_SAVE = "DDP_LAB_TEAR_SAVE"
SLOW_SAVE = "DDP_LAB_SLOW_SAVE"  # seconds every torch.save waits before writing: a window in which to be caught
SLURM_FAIL = "DDP_LAB_SLURM_FAIL"  # launching: set, the last task of the checker's SLURM job fails at its start
# scaling: a "step" event per optimizer step (its time, learning rates and the images the model was
# given for it), and a run that ends itself after a number of steps
TRACE_STEPS = "DDP_LAB_TRACE_STEPS"  # set to 1
STOP_AT_STEP = "DDP_LAB_STOP_AT_STEP"  # "<n>": after its n-th optimizer step, record the parameters and exit 0
# capstone: "<bytes>": trace what goes into a byte-level model, and measure each evaluation's weights on the
# first <bytes> of the validation split
TRACE_LM = "DDP_LAB_TRACE_LM"
# capstone: "reduced" (a lower target, one seed: `make test`, and quick mode's default) or "full" (else the default)
CAPSTONE_RULES = "DDP_LAB_CAPSTONE_RULES"
# capstone: the two speedups over the baseline that earn a point each, "1.15,1.3" (the class's [capstone] speedups)
CAPSTONE_SPEEDUPS = "DDP_LAB_CAPSTONE_SPEEDUPS"


def module_of(path: Path) -> str:
    """The dotted name of the course's module at `path` (for `python -m`)."""
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def course_dir() -> Path:
    """nbgrader's course folder: $DDP_LAB_COURSE_DIR, else grading/ in the repository (git-ignored)."""
    return Path(os.environ.get(COURSE_DIR) or REPO / "grading").resolve()


def quick() -> bool:
    """Whether quick mode is on (tiny notebook runs)."""
    return os.environ.get(QUICK, "") not in ("", "0")


# --- Finding a course file -----------------------------------------------------------------------
def course_file(relative: str | Path) -> Path:
    """A file of the course as a learner's folder holds it: here, else one folder up (a notebook
    runs in notebooks/, a terminal in the course folder). FileNotFoundError when in neither."""
    for folder in (Path.cwd(), Path.cwd().parent):
        if (folder / relative).exists():
            return folder / relative
    raise FileNotFoundError(f"{relative} is neither here ({Path.cwd()}) nor one folder up")


def learner_script(path: str | Path | None = None, default: str = "fashion_mnist.py") -> Path:
    """The learner's script: `path`, else `default` (a path in the course folder, such as
    exercises/compute_pi.py) found by `course_file` (else that path here)."""
    if path is not None:
        return Path(path)
    try:
        return course_file(default)
    except FileNotFoundError:
        return Path(default)
