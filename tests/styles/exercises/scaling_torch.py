# replaces: fit_time_model, half_efficiency
def fit_time_model(times):
    """torch.linalg.lstsq in double precision, the answer returned as a tensor."""
    import torch

    ns = torch.tensor(sorted(times), dtype=torch.float64)
    design = torch.stack([1 / ns, torch.ones_like(ns), ns - 1], dim=1)
    measured = torch.tensor([times[int(n)] for n in ns], dtype=torch.float64).unsqueeze(1)
    return torch.linalg.lstsq(design, measured).solution.squeeze(1)


def half_efficiency(params, max_n=1024):
    """Every N at once, as a tensor; the first one below one half, as a plain int."""
    import torch

    t_par, t_seq, t_comm = (float(p) for p in params)
    ns = torch.arange(1, max_n + 1, dtype=torch.float64)
    times = t_par / ns + t_seq + t_comm * (ns - 1)
    below = torch.nonzero((t_par + t_seq) / (ns * times) < 0.5).flatten()
    return int(ns[below[0]]) if len(below) else None
