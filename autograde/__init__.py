"""Support code of the DDP Lab: stand-in data, launching learner scripts, and (later) the step checks.

Nothing here is imported by the learner's script: the lab's scripts are plain PyTorch, and
this package only ever runs them as separate processes.
"""
