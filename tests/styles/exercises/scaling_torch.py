# replaces: fit_time_model
def fit_time_model(times):
    """torch.linalg.lstsq in double precision, the answer returned as a tensor."""
    import torch

    ns = torch.tensor(sorted(times), dtype=torch.float64)
    design = torch.stack([1 / ns, torch.ones_like(ns), ns - 1], dim=1)
    measured = torch.tensor([times[int(n)] for n in ns], dtype=torch.float64).unsqueeze(1)
    return torch.linalg.lstsq(design, measured).solution.squeeze(1)
