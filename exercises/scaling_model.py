"""Scaling: speedup and efficiency from measured epoch times, and a model of T(N) fitted to them.

Notebook 17 measures the finished script with N = 1, 2, 3, ... processes; each run writes a
JSON line per epoch (solutions/large_batch_training.py --log-file). Here you turn those logs
into numbers:

    epoch_time("runs/strong-2.jsonl")  -> 12.3       seconds per epoch, first epoch left out
    speedup({1: 20.0, 2: 12.5})        -> {1: 1.0, 2: 1.6}
    efficiency({1: 20.0, 2: 12.5})     -> {1: 1.0, 2: 0.8}
    fit_time_model({1: 20.0, ...})     -> (t_par, t_seq, t_comm)
    predict_time((t_par, t_seq, t_comm), 16)

The model of the time of one epoch with N processes:

    T(N) = t_par / N + t_seq + t_comm * (N - 1)

t_par: the work that divides among the processes; t_seq: the work that does not; t_comm: what
each extra process adds. A ring all-reduce of S bytes at bandwidth B costs 2(N - 1) latencies
plus 2(N - 1)/N x S/B: the latencies grow like N - 1 (t_comm), while the bandwidth part, which is
2S/B - 2S/(B N), ends up in t_seq and t_par when the model is fitted (notebook 17).
`make check STEP=scaling` calls these functions on measurements of its own.
"""
import json

import numpy as np


def epoch_time(log_file):
    """The mean `epoch_time` of the epochs in a JSON-lines log, leaving out the first epoch
    (it pays for start-up: memory allocation, the first data reads). A log of one epoch: that one."""
    # TODO scaling: the mean the docstring describes, for a log written by --log-file.
    raise NotImplementedError("TODO scaling")


def speedup(times):
    """{N: T(1) / T(N)} for a dict {N: seconds} that includes N = 1."""
    # TODO scaling: the speedup of each N over one process.
    raise NotImplementedError("TODO scaling")


def efficiency(times):
    """{N: speedup(N) / N}: 1.0 is perfect scaling."""
    # TODO scaling: the efficiency of each N.
    raise NotImplementedError("TODO scaling")


def fit_time_model(times):
    """(t_par, t_seq, t_comm) of T(N) = t_par / N + t_seq + t_comm * (N - 1), fitted to the
    measured {N: seconds} by least squares (no bounds: a parameter may come out negative).
    Needs at least three different N."""
    # TODO scaling: the three parameters that make the sum, over the measured N, of the squared
    # differences between the model's T(N) and the measured time smallest. Look up: np.linalg.lstsq.
    raise NotImplementedError("TODO scaling")


def predict_time(params, n):
    """T(n) of the fitted model."""
    # TODO scaling: the model's time for n processes.
    raise NotImplementedError("TODO scaling")
