# replaces: speedup, efficiency, predict_time, half_efficiency
def speedup(times):
    """numpy arrays in increasing N, returned as a list."""
    ns = np.array(sorted(times))
    seconds = np.array([times[n] for n in ns])
    return list(seconds[0] / seconds)


def efficiency(times):
    ns = np.array(sorted(times), dtype=float)
    return list(np.array(speedup(times)) / ns)


def predict_time(params, n):
    coefficients = np.array([1 / n, 1, n - 1])
    return float(coefficients @ np.asarray(params, dtype=float))


def half_efficiency(params, max_n=1024):
    """Closed form: efficiency < 1/2 when N T(N) > 2 T(1), a quadratic in N when t_comm > 0."""
    t_par, t_seq, t_comm = (float(p) for p in params)
    a, b, c = t_comm, t_seq - t_comm, -t_par - 2 * t_seq  # a N^2 + b N + c > 0
    if a > 0:
        root = (-b + np.sqrt(b * b - 4 * a * c)) / (2 * a)
    elif a == 0 and b > 0:
        root = -c / b
    elif a == 0:
        return None  # nothing grows with N: the efficiency never falls that far
    else:  # a time that shrinks as N grows: no closed form worth having, just look
        return next((n for n in range(1, max_n + 1) if n * predict_time(params, n) > 2 * predict_time(params, 1)), None)
    first = max(1, int(np.floor(root)) + 1)
    return first if first <= max_n else None
