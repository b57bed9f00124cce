"""Python imports this at start-up when this folder is on PYTHONPATH: the checker puts it there for
every process it launches, so that the learner's processes, and the ones they start themselves, are
traced. First the core tracer, then what each part adds at its points (the lab's staged download,
part talk's work counting, part scaling's step tracing, part launching's checkpoints and faults, in
that order: a step is traced before a fault ends it). The tests' probe (tests/probe/) runs this file too.

multiprocessing's resource tracker, which mp.spawn starts beside the learner's processes, runs no
learner code: it is left untraced, and so spared an import of torch."""
import os
import sys

from autograde.protocol import TRACE_DIR

if os.environ.get(TRACE_DIR) and "from multiprocessing.resource_tracker import main" not in " ".join(sys.orig_argv):
    from autograde.learner_processes import lab, launching, scaling, talk, tracer

    tracer.install(os.environ[TRACE_DIR])
    for part in (lab, talk, scaling, launching):
        part.install()
