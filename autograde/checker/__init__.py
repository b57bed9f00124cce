"""The checker's side: it launches a learner's program as separate processes (the code that runs
inside those is autograde/learner_processes/), reads what they wrote back (autograde/protocol.py)
and judges each graded item from that, for learners' check cells, `make check` and nbgrader.
The checks themselves are in autograde/checks/, a module per part; the items in autograde/registry.py.
"""
