"""The graded items' checks, a module per part of the course (`lab.py`: the core lab's steps).

Which check belongs to which item, with its points and runs, is written once, in autograde/registry.py.
"""
