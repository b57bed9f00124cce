"""What every part's notebooks share: running scripts and checks from a cell (runtime.py) and
the figures' style (figures.py)."""
