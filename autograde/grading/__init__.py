"""The grading front end, which knows no part by name: the registry of every part's items
(registry.py), what `python -m autograde check` and `autograde.assert_step` call (api.py), one
check run and its verdict (judge.py) and kept verdicts (cache.py)."""
