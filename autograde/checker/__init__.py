"""The checker: it launches a learner's script as separate processes, traces what they do, and
judges each graded item from that (for learners' check cells, `make check` and nbgrader).
The checks themselves are in autograde/checks/; the graded items in autograde/registry.py."""
