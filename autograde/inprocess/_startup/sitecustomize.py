"""Python imports this at start-up when this folder is on PYTHONPATH: the checker puts it there for
every process it launches, so that the learner's processes, and the ones they start themselves, are
traced. First the core tracer and what it sees of training, then what each part adds at its points (its inprocess.py's
`install`, in the parts' order). The tests' probe (tests/probe/) runs this file too.

Where the environment names a warm-start server (settings.WARM_SERVER), the process first asks to
be forked from it, torch imported (inprocess/warm_start.py): the forked process runs this file
again (as a file, not as sitecustomize) before the program, so that it installs the same. The
test suite puts this folder on every launch's PYTHONPATH, traced or not, so that all its Python
processes start warm; without a trace folder this file does nothing more.

multiprocessing's resource tracker, which mp.spawn starts beside the learner's processes, runs no
learner code: it is left untraced and cold (it imports no torch)."""
import os
import sys

from autograde.settings import TRACE_DIR, WARM_SERVER

if "from multiprocessing.resource_tracker import main" not in " ".join(sys.orig_argv):
    if __name__ == "sitecustomize" and os.environ.get(WARM_SERVER):
        from autograde.inprocess import warm_start

        warm_start.proxy()  # returns only where this process must start cold
    if os.environ.get(TRACE_DIR):
        from autograde import parts
        from autograde.inprocess import tracer, training

        tracer.install(os.environ[TRACE_DIR])
        training.install()
        for part in parts.of_role("inprocess"):
            if hasattr(part, "install"):
                part.install()
