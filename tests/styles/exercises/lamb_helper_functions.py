# replaces: LAMB
def adam_update(grad, state, beta1, beta2, eps):
    state["step"] = state.get("step", 0) + 1
    if "exp_avg" not in state:
        state["exp_avg"] = torch.zeros_like(grad)
        state["exp_avg_sq"] = torch.zeros_like(grad)
    state["exp_avg"] = beta1 * state["exp_avg"] + (1 - beta1) * grad
    state["exp_avg_sq"] = beta2 * state["exp_avg_sq"] + (1 - beta2) * grad.square()
    corrected_mean = state["exp_avg"] / (1 - beta1 ** state["step"])
    corrected_var = state["exp_avg_sq"] / (1 - beta2 ** state["step"])
    return corrected_mean / (corrected_var.sqrt() + eps)


def trust_ratio(weight, update):
    w_norm = weight.norm().item()
    u_norm = update.norm().item()
    if w_norm == 0.0 or u_norm == 0.0:
        return 1.0
    return w_norm / u_norm


class LAMB(torch.optim.Optimizer):
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                update = adam_update(param.grad, self.state[param], *group["betas"], group["eps"])
                if param.dim() == 1:  # biases and norms: plain Adam
                    param.data -= group["lr"] * update
                    continue
                update = update + group["weight_decay"] * param.data
                param.data -= group["lr"] * trust_ratio(param.data, update) * update
