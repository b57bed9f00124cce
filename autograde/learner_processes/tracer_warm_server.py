"""Imported last by the warm server that a traced mp.spawn forks the learner's processes from
(tracer.py, _warm_start): every process it forks starts with nothing traced or counted, as a
process that a new interpreter runs does."""
import os

from autograde.learner_processes import talk, tracer

os.register_at_fork(after_in_child=tracer.forked_afresh)
os.register_at_fork(after_in_child=talk.forked_afresh)
