"""What runs inside the learner's processes and serves every part: the start-up code
(_startup/sitecustomize.py), the tracer, warm starts, and the runner that performs a part's
tasks. It imports nothing of the checker's side (tests/core/test_structure.py)."""
