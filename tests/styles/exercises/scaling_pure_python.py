"""Scaling functions without numpy: lists in increasing N, the least-squares fit solved
from its normal equations by hand (Cramer's rule on the 3 x 3 system), and a while loop for the
half-efficiency point."""
import json


def epoch_time(log_file):
    seconds = []
    for line in open(log_file):
        line = line.strip()
        if line:
            seconds.append(float(json.loads(line)["epoch_time"]))
    if len(seconds) > 1:
        seconds = seconds[1:]  # the first epoch pays for warming up
    return sum(seconds) / len(seconds)


def speedup(times):
    return [times[1] / times[n] for n in sorted(times)]


def efficiency(times):
    return [s / n for s, n in zip(speedup(times), sorted(times))]


def _det(m):
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def fit_time_model(times):
    rows = [(1.0 / n, 1.0, n - 1.0) for n in times]
    ys = list(times.values())
    normal = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    rhs = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]
    d = _det(normal)
    params = []
    for k in range(3):
        m = [row[:] for row in normal]
        for i in range(3):
            m[i][k] = rhs[i]
        params.append(_det(m) / d)
    return params


def predict_time(params, n):
    t_par, t_seq, t_comm = params
    return t_par / n + t_seq + (n - 1) * t_comm


def half_efficiency(params, max_n=1024):
    # efficiency below one half: N x T(N) more than twice T(1)
    n = 1
    while n <= max_n:
        if 2 * predict_time(params, 1) < n * predict_time(params, n):
            return n
        n += 1
    return None
