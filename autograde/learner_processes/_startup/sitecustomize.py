"""Python imports this at start-up when this folder is on PYTHONPATH: the checker puts it there for
every process it launches, so that the learner's processes, and the ones they start themselves, are
traced. First the core tracer, then what each part adds at its points (the lab's staged download,
part talk's work counting, part scaling's step tracing, part launching's checkpoints and faults, in
that order: a step is traced before a fault ends it). The tests' probe (tests/probe/) runs this file too."""
import os

from autograde.protocol import TRACE_DIR

if os.environ.get(TRACE_DIR):
    from autograde.learner_processes import lab, launching, scaling, talk, tracer

    tracer.install(os.environ[TRACE_DIR])
    for part in (lab, talk, scaling, launching):
        part.install()
