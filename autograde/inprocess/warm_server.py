"""Imported last by the warm server that a traced mp.spawn forks the learner's processes from
(tracer.py, _warm_start): every process it forks starts with nothing traced or counted, as a
process that a new interpreter runs does (the tracer's state, and any part's that has a
`forked_afresh`)."""
import os

from autograde import parts
from autograde.inprocess import tracer

os.register_at_fork(after_in_child=tracer.forked_afresh)
for part in parts.of_role("inprocess"):
    if hasattr(part, "forked_afresh"):
        os.register_at_fork(after_in_child=part.forked_afresh)
