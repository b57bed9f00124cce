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
each extra process adds, like the extra rounds of a ring all-reduce (2(N - 1) messages).
`make check STEP=scaling` calls these functions on measurements of its own.
"""
import json

import numpy as np


def epoch_time(log_file):
    """The mean `epoch_time` of the epochs in a JSON-lines log, leaving out the first epoch
    (it pays for start-up: memory allocation, the first data reads). A log of one epoch: that one."""
    # TODO scaling: read one JSON object per line; average epoch_time over epochs 2, 3, ...
    with open(log_file) as f:
        records = [json.loads(line) for line in f if line.strip()]
    times = [r["epoch_time"] for r in records]
    later = times[1:] or times
    return sum(later) / len(later)


def speedup(times):
    """{N: T(1) / T(N)} for a dict {N: seconds} that includes N = 1."""
    # TODO scaling: the speedup of each N over one process.
    return {n: times[1] / t for n, t in times.items()}


def efficiency(times):
    """{N: speedup(N) / N}: 1.0 is perfect scaling."""
    # TODO scaling: the efficiency of each N.
    return {n: s / n for n, s in speedup(times).items()}


def fit_time_model(times):
    """(t_par, t_seq, t_comm) of T(N) = t_par / N + t_seq + t_comm * (N - 1), fitted to the
    measured {N: seconds} by least squares (no bounds: a parameter may come out negative).
    Needs at least three different N."""
    # TODO scaling: one row [1/N, 1, N - 1] per measurement; solve for the three parameters.
    ns = sorted(times)
    rows = np.array([[1 / n, 1.0, n - 1.0] for n in ns])
    measured = np.array([times[n] for n in ns])
    solution, *_ = np.linalg.lstsq(rows, measured, rcond=None)
    return tuple(float(x) for x in solution)


def predict_time(params, n):
    """T(n) of the fitted model."""
    # TODO scaling: the model's time for n processes.
    t_par, t_seq, t_comm = params
    return t_par / n + t_seq + t_comm * (n - 1)
