"""Scaling: speedup and efficiency from measured epoch times, a model of T(N) fitted to them, and
what the model predicts where nobody measured.

Notebook 17 measures the finished script with N = 1, 2, 3, ... processes; each run writes a
JSON line per epoch (solutions/large_batch_training.py --log-file). Here you turn those logs
into numbers, and the numbers into predictions:

    epoch_time("runs/strong-2.jsonl")  -> 12.3       seconds per epoch, in steady state
    speedup({1: 20.0, 2: 12.5})        -> {1: 1.0, 2: 1.6}
    efficiency({1: 20.0, 2: 12.5})     -> {1: 1.0, 2: 0.8}
    fit_time_model({1: 20.0, ...})     -> (t_par, t_seq, t_comm)
    predict_time((t_par, t_seq, t_comm), 16)
    half_efficiency((t_par, t_seq, t_comm))

The model, its three parameters and what each stands for are notebook 17's first cell.
`make check STEP=scaling` calls these functions on measurements whose answers it knows.
"""
import json

import numpy as np


def epoch_time(log_file):
    """The seconds one epoch takes once the run is going, from a log written by --log-file (one
    JSON object per line, each with the field `epoch_time`). The first epoch pays for start-up
    (memory allocation, the first data reads) and must not count, unless it is the only one."""
    # TODO scaling: the steady-state epoch time this docstring promises.
    with open(log_file) as f:
        records = [json.loads(line) for line in f if line.strip()]
    times = [r["epoch_time"] for r in records]
    later = times[1:] or times
    return sum(later) / len(later)


def speedup(times):
    """`times` maps a number of processes N to the seconds of one epoch with N processes, N = 1
    among them. Returns {N: how many times faster N processes are than one}."""
    # TODO scaling: the speedup of each N.
    return {n: times[1] / t for n, t in times.items()}


def efficiency(times):
    """{N: the share of the perfect speedup that N processes reach}, for `times` as speedup's:
    1.0 for N = 1, and for every N that scales perfectly."""
    # TODO scaling: the efficiency of each N.
    return {n: s / n for n, s in speedup(times).items()}


def fit_time_model(times):
    """(t_par, t_seq, t_comm): the parameters of notebook 17's model of T(N) that fit the measured
    {N: seconds} best in the least-squares sense (no bounds: a parameter may come out negative).
    Needs at least three different N."""
    # TODO scaling: the three parameters that make the model miss the measurements the least.
    ns = sorted(times)
    rows = np.array([[1 / n, 1.0, n - 1.0] for n in ns])
    measured = np.array([times[n] for n in ns])
    solution, *_ = np.linalg.lstsq(rows, measured, rcond=None)
    return tuple(float(x) for x in solution)


def predict_time(params, n):
    """The seconds of one epoch with n processes that the model with these parameters predicts
    (params as fit_time_model returns them)."""
    # TODO scaling: the model's prediction for n processes.
    t_par, t_seq, t_comm = params
    return t_par / n + t_seq + t_comm * (n - 1)


def half_efficiency(params, max_n=1024):
    """The fewest processes with which the model with these parameters predicts an efficiency
    below one half (its own one-process time being the reference), or None if it predicts one
    half or more for every N from 1 to max_n."""
    # TODO scaling: where adding processes starts to waste more than half of them.
    one = predict_time(params, 1)
    for n in range(1, max_n + 1):
        if one / (n * predict_time(params, n)) < 0.5:
            return n
    return None
