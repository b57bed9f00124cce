"""Python imports this at start-up when this folder is on PYTHONPATH: the checker puts it
there for every process it launches, so that the learner's processes, and the ones they
start themselves, are traced (see autograde/learner_processes/tracer.py)."""
import os

if os.environ.get("DDP_LAB_TRACE_DIR"):
    from autograde.learner_processes.tracer import install

    install(os.environ["DDP_LAB_TRACE_DIR"])
